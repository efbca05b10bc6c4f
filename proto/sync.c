/* proto/sync.c: encoding and decoding of the sync protocol defined in proto/sync.h. Pure functions
 * over byte buffers (no I/O, no globals) so the client and the agent share exactly one
 * implementation. */
#include "proto/sync.h"
#include <errno.h>

#include <stdlib.h>
#include <string.h>

/* ---- output buffer ---------------------------------------------------------------------- */

void gs_proto_buf_init(struct gs_proto_buf *b)
{
    memset(b, 0, sizeof(*b));
}

void gs_proto_buf_release(struct gs_proto_buf *b)
{
    free(b->data);
    gs_proto_buf_init(b);
}

void gs_proto_buf_consume(struct gs_proto_buf *b, size_t n)
{
    if (n >= b->len) {
        b->len = 0;
        return;
    }
    memmove(b->data, b->data + n, b->len - n);
    b->len -= n;
}

int gs_proto_buf_reserve(struct gs_proto_buf *b, size_t n)
{
    if (b->cap - b->len >= n)
        return 0;
    size_t cap = b->cap ? b->cap : 4096;
    while (cap - b->len < n) {
        if (cap > ((size_t)-1) / 2)
            return -1;
        cap *= 2;
    }
    uint8_t *d = realloc(b->data, cap);
    if (!d)
        return -1;
    b->data = d;
    b->cap = cap;
    return 0;
}

/* ---- writer: appends fields, remembers the first failure --------------------------------- */

struct writer {
    struct gs_proto_buf *b;
    int failed;
};

static void w_bytes(struct writer *w, const void *p, size_t n)
{
    if (w->failed || gs_proto_buf_reserve(w->b, n) < 0) {
        w->failed = 1;
        return;
    }
    if (n)
        memcpy(w->b->data + w->b->len, p, n);
    w->b->len += n;
}

static void be32(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)(v >> 24);
    p[1] = (uint8_t)(v >> 16);
    p[2] = (uint8_t)(v >> 8);
    p[3] = (uint8_t)v;
}

static uint32_t rd32(const uint8_t *p)
{
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | p[3];
}

static void w_u8(struct writer *w, uint8_t v)
{
    w_bytes(w, &v, 1);
}

static void w_u32(struct writer *w, uint32_t v)
{
    uint8_t p[4];
    be32(p, v);
    w_bytes(w, p, 4);
}

static void w_u64(struct writer *w, uint64_t v)
{
    w_u32(w, (uint32_t)(v >> 32));
    w_u32(w, (uint32_t)v);
}

static void w_str(struct writer *w, struct gs_proto_str s)
{
    w_u32(w, s.len);
    w_bytes(w, s.p, s.len);
}

static void w_meta(struct writer *w, const struct gs_proto_meta *m)
{
    w_u32(w, m->mode);
    w_u64(w, (uint64_t)m->mtime_sec);
    w_u32(w, m->mtime_nsec);
}

static void w_expect(struct writer *w, const struct gs_proto_expect *e)
{
    w_u8(w, e->kind);
    if (e->kind == GS_EXPECT_HASH)
        w_bytes(w, e->hash, GS_PROTO_HASH_LEN);
}

/* ---- reader: consumes fields, remembers the first failure -------------------------------- */

struct reader {
    const uint8_t *p;
    size_t n;
    int failed;
};

static const uint8_t *r_take(struct reader *r, size_t n)
{
    if (r->failed || r->n < n) {
        r->failed = 1;
        return NULL;
    }
    const uint8_t *p = r->p;
    r->p += n;
    r->n -= n;
    return p;
}

static uint8_t r_u8(struct reader *r)
{
    const uint8_t *p = r_take(r, 1);
    return p ? p[0] : 0;
}

static uint32_t r_u32(struct reader *r)
{
    const uint8_t *p = r_take(r, 4);
    return p ? rd32(p) : 0;
}

static uint64_t r_u64(struct reader *r)
{
    uint64_t hi = r_u32(r);
    return (hi << 32) | r_u32(r);
}

static struct gs_proto_str r_str(struct reader *r)
{
    struct gs_proto_str s = {"", 0};
    uint32_t len = r_u32(r);
    const uint8_t *p = r_take(r, len);
    if (p) {
        s.p = (const char *)p;
        s.len = len;
    }
    return s;
}

static void r_hash(struct reader *r, uint8_t *hash)
{
    const uint8_t *p = r_take(r, GS_PROTO_HASH_LEN);
    if (p)
        memcpy(hash, p, GS_PROTO_HASH_LEN);
}

static void r_meta(struct reader *r, struct gs_proto_meta *m)
{
    m->mode = r_u32(r);
    m->mtime_sec = (int64_t)r_u64(r);
    m->mtime_nsec = r_u32(r);
    if (m->mtime_nsec >= 1000000000u || (m->mode & ~07777u))
        r->failed = 1;
}

static void r_expect(struct reader *r, struct gs_proto_expect *e)
{
    e->kind = r_u8(r);
    memset(e->hash, 0, GS_PROTO_HASH_LEN);
    if (e->kind == GS_EXPECT_HASH)
        r_hash(r, e->hash);
    if (e->kind > GS_EXPECT_DIR)
        r->failed = 1;
}

/* ---- frames ------------------------------------------------------------------------------ */

int gs_proto_encode_header(struct gs_proto_buf *b, uint8_t type, uint32_t id, uint32_t payload_len)
{
    if (payload_len > GS_PROTO_MAX_PAYLOAD || gs_proto_buf_reserve(b, GS_PROTO_HDR) < 0)
        return -1;
    uint8_t *p = b->data + b->len;
    be32(p, payload_len + 5);
    p[4] = type;
    be32(p + 5, id);
    b->len += GS_PROTO_HDR;
    return 0;
}

/* Writes the payload fields of m; the header is written and patched by gs_proto_encode. */
static int encode_payload(struct writer *w, const struct gs_proto_msg *m)
{
    switch (m->type) {
    case GS_MSG_HELLO:
        w_u32(w, m->magic), w_u32(w, m->version), w_u32(w, m->flags);
        break;
    case GS_MSG_OPEN:
        w_str(w, m->data);
        break;
    case GS_MSG_PUT:
    case GS_MSG_PUT_BEGIN:
        w_str(w, m->path), w_meta(w, &m->meta), w_expect(w, &m->expect);
        if (m->type == GS_MSG_PUT)
            w_str(w, m->data);
        else
            w_u64(w, m->size);
        break;
    case GS_MSG_PUT_DELTA:
        w_str(w, m->path), w_meta(w, &m->meta), w_expect(w, &m->expect);
        w_bytes(w, m->hash, GS_PROTO_HASH_LEN), w_str(w, m->data);
        break;
    case GS_MSG_PUT_DATA:
    case GS_MSG_GET_DATA:
        w_bytes(w, m->data.p, m->data.len);
        break;
    case GS_MSG_PUT_END:
        w_u8(w, (uint8_t)m->flags), w_bytes(w, m->hash, GS_PROTO_HASH_LEN);
        break;
    case GS_MSG_MKDIR:
        w_str(w, m->path), w_u32(w, m->meta.mode);
        break;
    case GS_MSG_CHMOD: /* v10: with a hash, the mtime and that hash follow the mode */
        if (m->has_hash)
            w_str(w, m->path), w_meta(w, &m->meta), w_bytes(w, m->hash, GS_PROTO_HASH_LEN);
        else
            w_str(w, m->path), w_u32(w, m->meta.mode);
        break;
    case GS_MSG_DELETE:
        w_str(w, m->path), w_u32(w, m->flags), w_expect(w, &m->expect);
        break;
    case GS_MSG_RENAME:
        w_str(w, m->path), w_str(w, m->path2), w_expect(w, &m->expect), w_expect(w, &m->expect2);
        break;
    case GS_MSG_SYMLINK:
        w_str(w, m->path), w_str(w, m->path2), w_expect(w, &m->expect);
        break;
    case GS_MSG_STAT:
    case GS_MSG_HASH:
    case GS_MSG_GET:
        w_str(w, m->path);
        break;
    case GS_MSG_LIST:
        w_str(w, m->path), w_u32(w, m->flags);
        break;
    case GS_MSG_CHECK:
        w_u32(w, m->flags), w_bytes(w, m->hash, GS_PROTO_HASH_LEN), w_u32(w, m->count);
        w_bytes(w, m->entries.p, m->entries.len);
        break;
    case GS_MSG_HELLO_OK:
        w_u32(w, m->magic), w_u32(w, m->version), w_str(w, m->text), w_str(w, m->path2);
        w_str(w, m->path), w_u32(w, m->flags), w_str(w, m->data);
        break;
    case GS_MSG_ZFRAMES:
    case GS_MSG_ZFRAMES_R:
        w_u32(w, (uint32_t)m->size), w_bytes(w, m->data.p, m->data.len);
        break;
    case GS_MSG_DONE:
        w_u32(w, m->flags), w_str(w, m->path2);
        break;
    case GS_MSG_ERROR:
        w_u32(w, (uint32_t)m->err), w_str(w, m->text);
        break;
    case GS_MSG_STAT_R:
        w_u8(w, m->kind), w_meta(w, &m->meta), w_u64(w, m->size), w_str(w, m->path2);
        break;
    case GS_MSG_HASH_R:
        w_u64(w, m->size), w_bytes(w, m->hash, GS_PROTO_HASH_LEN);
        break;
    case GS_MSG_GET_END:
        w_u64(w, m->size), w_bytes(w, m->hash, GS_PROTO_HASH_LEN), w_meta(w, &m->meta);
        if (m->text.len)
            w_str(w, m->text);
        break;
    case GS_MSG_LIST_ENTRIES:
        w_u32(w, m->count), w_bytes(w, m->entries.p, m->entries.len);
        break;
    case GS_MSG_LIST_END:
        w_u64(w, m->size);
        break;
    case GS_MSG_LIST_SKIPPED:
        w_u32(w, (uint32_t)m->err), w_str(w, m->path);
        break;
    default:
        return -1;
    }
    return w->failed ? -1 : 0;
}

int gs_proto_encode(struct gs_proto_buf *b, const struct gs_proto_msg *m)
{
    size_t start = b->len;
    struct writer w = {b, 0};
    if (gs_proto_encode_header(b, m->type, m->id, 0) < 0)
        return -1;
    if (encode_payload(&w, m) < 0 || b->len - start - 4 > GS_PROTO_MAX_FRAME) {
        b->len = start;
        return -1;
    }
    be32(b->data + start, (uint32_t)(b->len - start - 4));
    return 0;
}

long gs_proto_parse_frame(const uint8_t *p, size_t n, struct gs_proto_frame *f)
{
    memset(f, 0, sizeof(*f));
    if (n < 4)
        return 0;
    uint32_t len = rd32(p);
    if (n >= GS_PROTO_HDR) {
        f->type = p[4];
        f->id = rd32(p + 5);
    }
    if (len < 5 || len > GS_PROTO_MAX_FRAME)
        return -1;
    if (n < (size_t)len + 4)
        return 0;
    f->payload = p + GS_PROTO_HDR;
    f->len = len - 5;
    return (long)len + 4;
}

/* Reads the payload fields of a request type into m. */
static int decode_request(struct reader *r, struct gs_proto_msg *m)
{
    switch (m->type) {
    case GS_MSG_HELLO:
        m->magic = r_u32(r), m->version = r_u32(r), m->flags = r_u32(r);
        break;
    case GS_MSG_OPEN:
        m->data = r_str(r);
        break;
    case GS_MSG_ZFRAMES:
        m->size = r_u32(r);
        m->data.p = (const char *)r->p, m->data.len = (uint32_t)r->n;
        r_take(r, r->n);
        break;
    case GS_MSG_PUT:
    case GS_MSG_PUT_BEGIN:
        m->path = r_str(r), r_meta(r, &m->meta), r_expect(r, &m->expect);
        if (m->type == GS_MSG_PUT)
            m->data = r_str(r);
        else
            m->size = r_u64(r);
        break;
    case GS_MSG_PUT_DELTA:
        m->path = r_str(r), r_meta(r, &m->meta), r_expect(r, &m->expect);
        r_hash(r, m->hash), m->has_hash = 1, m->data = r_str(r);
        if (m->expect.kind != GS_EXPECT_HASH) /* a delta needs a known basis */
            r->failed = 1;
        break;
    case GS_MSG_PUT_DATA:
        m->data.p = (const char *)r->p, m->data.len = (uint32_t)r->n;
        r_take(r, r->n);
        break;
    case GS_MSG_PUT_END:
        m->flags = r_u8(r), r_hash(r, m->hash), m->has_hash = 1;
        break;
    case GS_MSG_MKDIR:
        m->path = r_str(r), m->meta.mode = r_u32(r);
        if (m->meta.mode & ~07777u)
            r->failed = 1;
        break;
    case GS_MSG_CHMOD: /* the v9 form is the v10 one cut after the mode */
        m->path = r_str(r);
        if (r->n > 4)
            r_meta(r, &m->meta), r_hash(r, m->hash), m->has_hash = 1;
        else if ((m->meta.mode = r_u32(r)) & ~07777u)
            r->failed = 1;
        break;
    case GS_MSG_DELETE:
        m->path = r_str(r), m->flags = r_u32(r), r_expect(r, &m->expect);
        break;
    case GS_MSG_RENAME:
        m->path = r_str(r), m->path2 = r_str(r), r_expect(r, &m->expect), r_expect(r, &m->expect2);
        break;
    case GS_MSG_SYMLINK:
        m->path = r_str(r), m->path2 = r_str(r), r_expect(r, &m->expect);
        break;
    case GS_MSG_STAT:
    case GS_MSG_HASH:
    case GS_MSG_GET:
        m->path = r_str(r);
        break;
    case GS_MSG_LIST:
        m->path = r_str(r), m->flags = r_u32(r);
        break;
    case GS_MSG_CHECK:
        m->flags = r_u32(r), r_hash(r, m->hash), m->count = r_u32(r);
        m->entries.p = (const char *)r->p, m->entries.len = (uint32_t)r->n;
        r_take(r, r->n);
        break;
    default:
        return -2;
    }
    return 0;
}

/* Reads the payload fields of a reply type into m. */
static int decode_reply(struct reader *r, struct gs_proto_msg *m)
{
    switch (m->type) {
    case GS_MSG_HELLO_OK:
        m->magic = r_u32(r), m->version = r_u32(r), m->text = r_str(r), m->path2 = r_str(r);
        m->path = r_str(r), m->flags = r_u32(r), m->data = r_str(r);
        break;
    case GS_MSG_ZFRAMES_R:
        m->size = r_u32(r);
        m->data.p = (const char *)r->p, m->data.len = (uint32_t)r->n;
        r_take(r, r->n);
        break;
    case GS_MSG_DONE:
        m->flags = r_u32(r), m->path2 = r_str(r);
        break;
    case GS_MSG_ERROR:
        m->err = (int32_t)r_u32(r), m->text = r_str(r);
        break;
    case GS_MSG_STAT_R:
        m->kind = r_u8(r), r_meta(r, &m->meta), m->size = r_u64(r), m->path2 = r_str(r);
        if (m->kind > GS_KIND_OTHER)
            r->failed = 1;
        break;
    case GS_MSG_HASH_R:
        m->size = r_u64(r), r_hash(r, m->hash), m->has_hash = 1;
        break;
    case GS_MSG_GET_DATA:
        m->data.p = (const char *)r->p, m->data.len = (uint32_t)r->n;
        r_take(r, r->n);
        break;
    case GS_MSG_GET_END:
        m->size = r_u64(r), r_hash(r, m->hash), r_meta(r, &m->meta), m->has_hash = 1;
        if (r->n)
            m->text = r_str(r);
        break;
    case GS_MSG_LIST_ENTRIES:
        m->count = r_u32(r);
        m->entries.p = (const char *)r->p, m->entries.len = (uint32_t)r->n;
        r_take(r, r->n);
        break;
    case GS_MSG_LIST_END:
        m->size = r_u64(r);
        break;
    case GS_MSG_LIST_SKIPPED:
        m->err = (int32_t)r_u32(r), m->path = r_str(r);
        break;
    default:
        return -2;
    }
    return 0;
}

int gs_proto_decode(const struct gs_proto_frame *f, struct gs_proto_msg *m)
{
    memset(m, 0, sizeof(*m));
    m->type = f->type;
    m->id = f->id;
    struct reader r = {f->payload, f->len, 0};
    int rc = (f->type & 0x80) ? decode_reply(&r, m) : decode_request(&r, m);
    if (rc == -2)
        return -2;
    if (r.failed || r.n != 0)
        return -1;
    return 0;
}

/* ---- LIST entries ------------------------------------------------------------------------ */

/* Where a LIST_ENTRIES or CHECK frame that starts at `mark` keeps its count. */
static uint8_t *entry_count(struct gs_proto_buf *b, size_t mark)
{
    uint8_t *payload = b->data + mark + GS_PROTO_HDR;
    return b->data[mark + 4] == GS_MSG_CHECK ? payload + 4 + GS_PROTO_HASH_LEN : payload;
}

int gs_proto_list_begin(struct gs_proto_buf *b, uint8_t type, uint32_t id, uint32_t flags,
                        size_t *mark)
{
    *mark = b->len;
    if (gs_proto_encode_header(b, type, id, 0) < 0)
        return -1;
    struct writer w = {b, 0};
    static const uint8_t no_hash[GS_PROTO_HASH_LEN];
    if (type == GS_MSG_CHECK)
        w_u32(&w, flags), w_bytes(&w, no_hash, sizeof(no_hash));
    w_u32(&w, 0);
    if (w.failed) {
        b->len = *mark;
        return -1;
    }
    return 0;
}

int gs_proto_entry_append(struct gs_proto_buf *b, const struct gs_proto_entry *e)
{
    size_t start = b->len;
    struct writer w = {b, 0};
    w_str(&w, e->path), w_u8(&w, e->kind), w_meta(&w, &e->meta), w_u64(&w, e->size);
    w_u8(&w, e->has_hash ? 1 : 0);
    if (e->has_hash)
        w_bytes(&w, e->hash, GS_PROTO_HASH_LEN);
    w_str(&w, e->link);
    if (w.failed)
        b->len = start;
    return w.failed ? -1 : 0;
}

int gs_proto_list_add(struct gs_proto_buf *b, size_t mark, size_t limit,
                      const struct gs_proto_entry *e)
{
    size_t start = b->len;
    struct writer w = {b, gs_proto_entry_append(b, e) < 0};
    if (limit > GS_PROTO_MAX_PAYLOAD)
        limit = GS_PROTO_MAX_PAYLOAD;
    if (w.failed || b->len - mark - GS_PROTO_HDR > limit) {
        b->len = start;
        return -1;
    }
    uint8_t *count = entry_count(b, mark);
    be32(count, rd32(count) + 1);
    return 0;
}

void gs_proto_list_end(struct gs_proto_buf *b, size_t mark)
{
    be32(b->data + mark, (uint32_t)(b->len - mark - 4));
}

int gs_proto_list_next(const struct gs_proto_msg *m, size_t *pos, struct gs_proto_entry *e)
{
    if (*pos >= m->entries.len)
        return 0;
    struct reader r = {(const uint8_t *)m->entries.p + *pos, m->entries.len - *pos, 0};
    memset(e, 0, sizeof(*e));
    e->path = r_str(&r), e->kind = r_u8(&r), r_meta(&r, &e->meta), e->size = r_u64(&r);
    e->has_hash = r_u8(&r);
    if (e->has_hash)
        r_hash(&r, e->hash);
    e->link = r_str(&r);
    if (r.failed || e->has_hash > 1 || e->kind > GS_KIND_OTHER)
        return -1;
    *pos = m->entries.len - r.n;
    return 1;
}

/* ---- names ------------------------------------------------------------------------------- */

const char *gs_proto_type_name(uint8_t type)
{
    switch (type) {
    case GS_MSG_HELLO:
        return "HELLO";
    case GS_MSG_OPEN:
        return "OPEN";
    case GS_MSG_PUT:
        return "PUT";
    case GS_MSG_PUT_BEGIN:
        return "PUT_BEGIN";
    case GS_MSG_PUT_DATA:
        return "PUT_DATA";
    case GS_MSG_PUT_END:
        return "PUT_END";
    case GS_MSG_PUT_DELTA:
        return "PUT_DELTA";
    case GS_MSG_MKDIR:
        return "MKDIR";
    case GS_MSG_DELETE:
        return "DELETE";
    case GS_MSG_RENAME:
        return "RENAME";
    case GS_MSG_SYMLINK:
        return "SYMLINK";
    case GS_MSG_CHMOD:
        return "CHMOD";
    case GS_MSG_STAT:
        return "STAT";
    case GS_MSG_HASH:
        return "HASH";
    case GS_MSG_GET:
        return "GET";
    case GS_MSG_LIST:
        return "LIST";
    case GS_MSG_CHECK:
        return "CHECK";
    case GS_MSG_HELLO_OK:
        return "HELLO_OK";
    case GS_MSG_ZFRAMES:
        return "ZFRAMES";
    case GS_MSG_ZFRAMES_R:
        return "ZFRAMES_R";
    case GS_MSG_DONE:
        return "DONE";
    case GS_MSG_ERROR:
        return "ERROR";
    case GS_MSG_STAT_R:
        return "STAT_R";
    case GS_MSG_HASH_R:
        return "HASH_R";
    case GS_MSG_GET_DATA:
        return "GET_DATA";
    case GS_MSG_GET_END:
        return "GET_END";
    case GS_MSG_LIST_ENTRIES:
        return "LIST_ENTRIES";
    case GS_MSG_LIST_END:
        return "LIST_END";
    case GS_MSG_LIST_SKIPPED:
        return "LIST_SKIPPED";
    default:
        return "UNKNOWN";
    }
}

struct gs_proto_str gs_proto_cstr(const char *s)
{
    struct gs_proto_str r = {s, (uint32_t)strlen(s)};
    return r;
}

int gs_proto_check_path(const char *p, size_t len, int allow_empty)
{
    if (len == 0)
        return allow_empty ? 0 : -EPERM;
    if (len > GS_PROTO_MAX_PATH)
        return -ENAMETOOLONG;
    if (memchr(p, '\0', len) || p[0] == '/')
        return -EPERM;
    size_t start = 0;
    for (size_t i = 0; i <= len; i++) {
        if (i < len && p[i] != '/')
            continue;
        size_t n = i - start;
        if (n == 0 || (n == 1 && p[start] == '.') ||
            (n == 2 && p[start] == '.' && p[start + 1] == '.'))
            return -EPERM;
        if (n > GS_PROTO_NAME_MAX)
            return -ENAMETOOLONG;
        start = i + 1;
    }
    return 0;
}
