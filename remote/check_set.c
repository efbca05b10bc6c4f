/* remote/check_set.c: the beliefs an agent keeps for CHECK, and the frames that update them (see
 * check_set.h). */
#include "remote/check_set.h"

#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "common/buf.h"
#include "common/path.h"
#include "common/wrapper.h"

#define XXH_INLINE_ALL
#include <xxhash.h>

/* Entry bytes per CHECK frame (about 1,300 paths): a frame goes whole, and only the first 64 KiB
 * of a session go before the agent has agreed to compress (agent_client.c). */
#define CHECK_FRAME (64u << 10)

/* Frames being filled: a new one starts when the current one is full. */
struct frames {
    struct gs_proto_buf *out;
    uint32_t next_id, flags;
    size_t mark;
    uint32_t n;
};

static void frame_begin(struct frames *f)
{
    if (gs_proto_list_begin(f->out, GS_MSG_CHECK, f->next_id++, f->flags, &f->mark) < 0)
        gs_out_of_memory(0);
    f->n++;
}

static void frame_end(struct frames *f, uint32_t flags)
{
    /* the flags word comes first in a CHECK's payload (gs_proto_list_begin) */
    uint8_t *p = f->out->data + f->mark + GS_PROTO_HDR;
    p[0] = (uint8_t)(flags >> 24), p[1] = (uint8_t)(flags >> 16);
    p[2] = (uint8_t)(flags >> 8), p[3] = (uint8_t)flags;
    gs_proto_list_end(f->out, f->mark);
}

static void to_entry(const struct gs_fop_belief *b, struct gs_proto_entry *e)
{
    memset(e, 0, sizeof(*e));
    e->path = gs_proto_cstr(b->path);
    e->kind = (uint8_t)b->kind;
    e->meta.mode = b->mode & 07777;
    long nsec;
    e->meta.mtime_sec = gs_time_sec(b->mtime_ns, &nsec);
    e->meta.mtime_nsec = (uint32_t)nsec;
    e->size = b->size;
    e->link = gs_proto_cstr(b->link && b->kind == GS_FOP_KIND_SYMLINK ? b->link : "");
}

static void add(struct frames *f, const struct gs_proto_entry *e)
{
    if (gs_proto_list_add(f->out, f->mark, CHECK_FRAME, e) == 0)
        return;
    frame_end(f, f->flags | GS_CHECK_DEFER * ((f->flags & GS_CHECK_KEEP) != 0));
    frame_begin(f);
    if (gs_proto_list_add(f->out, f->mark, GS_PROTO_MAX_PAYLOAD, e) < 0)
        gs_out_of_memory(0); /* an entry (a path and a link target) is far below a frame */
}

static void add_belief(struct frames *f, const struct gs_fop_belief *b)
{
    struct gs_proto_entry e;
    to_entry(b, &e);
    add(f, &e);
}

static void add_removal(struct frames *f, const char *path)
{
    struct gs_proto_entry e;
    memset(&e, 0, sizeof(e));
    e.path = gs_proto_cstr(path); /* kind NONE: no longer believed */
    e.link = gs_proto_cstr("");
    add(f, &e);
}

static int same_belief(const struct gs_fop_belief *a, const struct gs_fop_belief *b)
{
    return a->kind == b->kind && a->mode == b->mode && a->size == b->size &&
           a->mtime_ns == b->mtime_ns &&
           strcmp(a->link ? a->link : "", b->link ? b->link : "") == 0;
}

/* The differences between what the agent keeps and beliefs[0..n), both in path order. */
static void add_changes(struct frames *f, const struct gs_check_set *kept,
                        const struct gs_fop_belief *b, size_t n)
{
    size_t i = 0, j = 0;
    while (i < kept->n || j < n) {
        int c = i == kept->n ? 1 : j == n ? -1 : strcmp(kept->v[i].path, b[j].path);
        if (c < 0)
            add_removal(f, kept->v[i].path);
        else if (c > 0 || !same_belief(&kept->v[i], &b[j]))
            add_belief(f, &b[j]);
        i += c <= 0;
        j += c >= 0;
    }
}

int gs_check_keeps(size_t n)
{
    return n <= GS_PROTO_CHECK_KEEP_MAX;
}

/* Marks the first frame (at `first`) as starting from the saved set with this digest. */
static void from_saved(struct gs_proto_buf *out, size_t first, const struct gs_check_set *kept)
{
    uint8_t *p = out->data + first + GS_PROTO_HDR;
    p[3] |= GS_CHECK_SAVED; /* the flags word, big-endian: the flag is in its last byte */
    gs_check_set_digest(kept, p + 4);
}

uint32_t gs_check_encode(const struct gs_check_set *kept, const struct gs_fop_belief *b, size_t n,
                         uint32_t first_id, struct gs_proto_buf *out)
{
    struct frames f = {.out = out, .next_id = first_id};
    f.flags = gs_check_keeps(n) ? GS_CHECK_KEEP : 0;
    size_t first = out->len;
    frame_begin(&f);
    if (f.flags & GS_CHECK_KEEP)
        add_changes(&f, kept, b, n);
    else
        for (size_t i = 0; i < n; i++)
            add_belief(&f, &b[i]);
    frame_end(&f, f.flags);
    if ((f.flags & GS_CHECK_KEEP) && kept->saved)
        from_saved(out, first, kept);
    return f.n;
}

/* ---- the set the agent saved at the end of the last session ---- */

#define SAVED_MAGIC     "gpusync check-kept 1\n" /* as the agent's file (agent/serve_check.c) */
#define SAVED_MAGIC_LEN (sizeof(SAVED_MAGIC) - 1)

/* Appends the entries of `kept`; with `as_digested`, as the digest covers them (mtime_nsec 0). */
static void encode_set(const struct gs_check_set *kept, int as_digested, struct gs_proto_buf *b)
{
    for (size_t i = 0; i < kept->n; i++) {
        struct gs_proto_entry e;
        to_entry(&kept->v[i], &e);
        if (as_digested)
            e.meta.mtime_nsec = 0;
        if (gs_proto_entry_append(b, &e) < 0)
            gs_out_of_memory(0);
    }
}

void gs_check_set_digest(const struct gs_check_set *kept, uint8_t out[GS_PROTO_HASH_LEN])
{
    struct gs_proto_buf b;
    gs_proto_buf_init(&b);
    encode_set(kept, 1, &b);
    XXH128_canonical_t c;
    XXH128_canonicalFromHash(&c, XXH3_128bits(b.data ? (const void *)b.data : "", b.len));
    memcpy(out, c.digest, GS_PROTO_HASH_LEN);
    gs_proto_buf_release(&b);
}

int gs_check_set_save(const struct gs_check_set *kept, const char *path)
{
    struct gs_proto_buf b;
    gs_proto_buf_init(&b);
    uint8_t n[4] = {(uint8_t)(kept->n >> 24), (uint8_t)(kept->n >> 16), (uint8_t)(kept->n >> 8),
                    (uint8_t)kept->n};
    if (gs_proto_buf_reserve(&b, SAVED_MAGIC_LEN + 4) < 0)
        gs_out_of_memory(0);
    memcpy(b.data, SAVED_MAGIC, SAVED_MAGIC_LEN);
    memcpy(b.data + SAVED_MAGIC_LEN, n, 4);
    b.len = SAVED_MAGIC_LEN + 4;
    encode_set(kept, 0, &b);
    int rc = gs_path_write_atomic(path, b.data, b.len);
    gs_proto_buf_release(&b);
    return rc;
}

/* Takes the beliefs a saved file lists (what LIST_ENTRIES' decoder reads). */
static int read_entries(struct gs_check_set *kept, const uint8_t *p, size_t len, uint32_t count)
{
    struct gs_proto_msg m = {.count = count};
    m.entries.p = (const char *)p;
    m.entries.len = (uint32_t)len;
    kept->v = gs_xcalloc(count ? count : 1, sizeof(*kept->v));
    size_t pos = 0;
    struct gs_proto_entry e;
    int more;
    while (kept->n < count && (more = gs_proto_list_next(&m, &pos, &e)) == 1) {
        struct gs_fop_belief *b = &kept->v[kept->n++];
        b->path = gs_xstrndup(e.path.p, e.path.len);
        b->kind = (enum gs_fop_kind)e.kind;
        b->mode = e.meta.mode;
        b->size = e.size;
        b->mtime_ns = gs_time_ns(e.meta.mtime_sec, (long)e.meta.mtime_nsec);
        b->link = e.kind == GS_KIND_SYMLINK ? gs_xstrndup(e.link.p, e.link.len) : NULL;
        if (kept->n > 1 && strcmp(kept->v[kept->n - 2].path, b->path) >= 0)
            return -1;
    }
    return kept->n == count && pos == len ? 0 : -1;
}

int gs_check_set_load(struct gs_check_set *kept, const char *path)
{
    gs_check_set_clear(kept);
    struct gs_buf data = GS_BUF_INIT;
    int rc = gs_path_read_file(path, &data) < 0 ? -1 : 0;
    const uint8_t *p = (const uint8_t *)data.data;
    size_t head = SAVED_MAGIC_LEN + 4;
    if (rc == 0 && (data.len < head || memcmp(p, SAVED_MAGIC, SAVED_MAGIC_LEN) != 0 ||
                    data.len - head > UINT32_MAX))
        rc = -1;
    if (rc == 0) {
        const uint8_t *n = p + SAVED_MAGIC_LEN;
        uint32_t count = (uint32_t)n[0] << 24 | (uint32_t)n[1] << 16 | (uint32_t)n[2] << 8 | n[3];
        rc = count <= GS_PROTO_CHECK_KEEP_MAX ? read_entries(kept, p + head, data.len - head, count)
                                              : -1;
    }
    if (rc < 0)
        gs_check_set_clear(kept);
    else
        kept->saved = 1;
    gs_buf_release(&data);
    return rc;
}

void gs_check_set_clear(struct gs_check_set *kept)
{
    for (size_t i = 0; i < kept->n; i++) {
        free((char *)kept->v[i].path);
        free((char *)kept->v[i].link);
    }
    free(kept->v);
    kept->v = NULL;
    kept->n = 0;
    kept->saved = 0;
}

void gs_check_set_assign(struct gs_check_set *kept, const struct gs_fop_belief *b, size_t n)
{
    gs_check_set_clear(kept);
    kept->v = gs_xcalloc(n ? n : 1, sizeof(*kept->v));
    for (size_t i = 0; i < n; i++) {
        kept->v[i] = b[i];
        kept->v[i].path = gs_xstrdup(b[i].path);
        kept->v[i].link = b[i].link ? gs_xstrdup(b[i].link) : NULL;
    }
    kept->n = n;
}

long gs_check_find(const struct gs_fop_belief *b, size_t n, const char *p, size_t len)
{
    size_t lo = 0, hi = n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        const char *q = b[mid].path;
        size_t qlen = strlen(q);
        int c = memcmp(q, p, qlen < len ? qlen : len);
        if (c == 0)
            c = qlen < len ? -1 : qlen > len;
        if (c == 0)
            return (long)mid;
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return -1;
}
