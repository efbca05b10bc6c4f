/* The agent's serve session (see serve.h): replies, the handshake, dispatch by message type,
 * the session's lifecycle and the frame loop over file descriptors. The handlers live in
 * serve_put.c, serve_ops.c, serve_query.c and serve_check.c (serve_int.h). */
/* POSIX.1-2008 with XSI; _GNU_SOURCE from the top-level build is fine too. */
#ifndef _XOPEN_SOURCE
#define _XOPEN_SOURCE 700
#endif
#include "resident.h"
#include "serve_int.h"
#include "sync_id.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define READ_CHUNK     (256u << 10)
#define FLUSH_MS       5 /* longest a reply waits while input keeps coming */
#define EXIT_PROTOCOL  2
#define EXIT_IO        1
#define EXIT_ROOT_GONE 3

/* ---- replies ----------------------------------------------------------------------------- */

/* Appends a reply; a failure to encode one (out of memory) ends the session. */
void ga_serve_emit(struct ga_serve *s, const struct gs_proto_msg *m)
{
    if (gs_proto_encode(&s->out, m) < 0)
        s->fatal = EXIT_IO;
    else if (s->out.len >= GA_SERVE_FLUSH_AT)
        ga_serve_flush(s);
}

void ga_serve_reply_error(struct ga_serve *s, uint32_t id, int err, const char *fmt, ...)
{
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    struct gs_proto_msg m = {0};
    m.type = GS_MSG_ERROR;
    m.id = id;
    m.err = err;
    m.text = gs_proto_cstr(msg);
    ga_serve_emit(s, &m);
}

/* Why a wire path was refused. Said only where gs_proto_check_path refused it: the wire code is
 * EPERM (proto/sync.h), which the file system also returns (an immutable file, a folder the
 * server's user may not write), and that must read as what it is. */
#define PATH_REFUSED                                                                               \
    "path refused: it must be relative and stay inside the root "                                  \
    "(no absolute path, '..', '.' or empty component, no NUL)"

/* Explains an errno from path handling in the words a user needs. */
const char *ga_serve_why(int err)
{
    switch (err) {
    case ELOOP:
        return "a path component is a symlink; the agent never follows symlinks";
    default:
        return strerror(err);
    }
}

/* Replies ERROR for a failed op on path; err is a negative errno. An ENOENT may mean the root
 * itself was removed: then the session ends instead (ga_serve_end_if_root_gone). */
void ga_serve_reply_op_error(struct ga_serve *s, uint32_t id, int err, const char *op,
                             const char *path)
{
    if (err == -ENOENT && ga_serve_end_if_root_gone(s))
        return;
    ga_serve_reply_error(s, id, -err, "%s %s: %s", op, path, ga_serve_why(-err));
}

int ga_serve_end_if_root_gone(struct ga_serve *s)
{
    struct stat st, named;
    if (s->rootfd < 0 || fstat(s->rootfd, &st) < 0)
        return 0;
    /* A removed directory keeps its inode while rootfd is open, with no link left to it; a moved
     * one keeps its links, but the root's path names another folder, or none (`mv proj old;
     * mkdir proj`): writes through rootfd would land where no run looks. */
    int removed = st.st_nlink == 0, moved = 0;
    if (!removed && stat(s->root, &named) == 0)
        moved = named.st_dev != st.st_dev || named.st_ino != st.st_ino;
    else if (!removed)
        moved = errno == ENOENT || errno == ENOTDIR; /* EACCES: cannot tell; carry on */
    if (!removed && !moved)
        return 0;
    ga_serve_reply_error(s, 0, ENOENT,
                         "the project folder %s was %s on the server while this session used "
                         "it; connect again to use what is there now",
                         s->root, removed ? "removed" : "moved or replaced");
    s->fatal = EXIT_ROOT_GONE;
    return 1;
}

/* Replies DONE; kept is the conflict copy's name in the directory of path ("" if none). */
void ga_serve_reply_done(struct ga_serve *s, uint32_t id, uint32_t flags, const char *path,
                         const char *kept)
{
    char rel[GS_PROTO_MAX_PATH + GA_FS_NAME_MAX + 2] = "";
    if (kept && kept[0]) {
        const char *slash = strrchr(path, '/');
        int dirlen = slash ? (int)(slash - path + 1) : 0;
        snprintf(rel, sizeof(rel), "%.*s%s", dirlen, path, kept);
        flags |= GS_DONE_KEPT;
    }
    struct gs_proto_msg m = {0};
    m.type = GS_MSG_DONE;
    m.id = id;
    m.flags = flags;
    m.path2 = gs_proto_cstr(rel);
    ga_serve_emit(s, &m);
}

/* Checks a wire path and returns it NUL-terminated in *out (caller frees), or replies ERROR
 * and returns -1. */
int ga_serve_take_path(struct ga_serve *s, const struct gs_proto_msg *m, struct gs_proto_str p,
                       int allow_empty, char **out)
{
    int rc = gs_proto_check_path(p.p, p.len, allow_empty);
    if (rc < 0) {
        ga_serve_reply_error(s, m->id, -rc, "%s %.*s: %s", gs_proto_type_name(m->type),
                             (int)(p.len > 512 ? 512 : p.len), p.p,
                             rc == -EPERM ? PATH_REFUSED : ga_serve_why(-rc));
        return -1;
    }
    *out = malloc(p.len + 1);
    if (!*out) {
        ga_serve_reply_error(s, m->id, ENOMEM, "%s: out of memory", gs_proto_type_name(m->type));
        return -1;
    }
    memcpy(*out, p.p, p.len);
    (*out)[p.len] = '\0';
    return 0;
}

/* ---- dispatch ---------------------------------------------------------------------------- */

typedef void (*handler_fn)(struct ga_serve *, const struct gs_proto_msg *);

static handler_fn handler_for(uint8_t type)
{
    switch (type) {
    case GS_MSG_PUT:
        return ga_serve_put;
    case GS_MSG_PUT_BEGIN:
        return ga_serve_put_begin;
    case GS_MSG_PUT_DATA:
        return ga_serve_put_data;
    case GS_MSG_PUT_END:
        return ga_serve_put_end;
    case GS_MSG_PUT_DELTA:
        return ga_serve_put_delta;
    case GS_MSG_MKDIR:
        return ga_serve_mkdir;
    case GS_MSG_DELETE:
        return ga_serve_delete;
    case GS_MSG_RENAME:
        return ga_serve_rename;
    case GS_MSG_SYMLINK:
        return ga_serve_symlink;
    case GS_MSG_CHMOD:
        return ga_serve_chmod;
    case GS_MSG_STAT:
        return ga_serve_stat;
    case GS_MSG_HASH:
        return ga_serve_hash;
    case GS_MSG_GET:
        return ga_serve_get;
    case GS_MSG_LIST:
        return ga_serve_list;
    case GS_MSG_CHECK:
        return ga_serve_check;
    default:
        return NULL;
    }
}

/* Makes this session the root's only writer (fence.h) before any request is executed. A holder
 * that may not be killed ends the session (-1, after an ERROR reply). Where no lock can be taken
 * at all (a symlink as .gpusync, a read-only root, no lock support), the session goes on unfenced,
 * as agents before v4 did, and says so on stderr. Returns 0 or -1. */
static int take_writer_lock(struct ga_serve *s, uint32_t id)
{
    char why[900];
    int rc = ga_fence_acquire(&s->fence, s->rootfd, s->root, why, sizeof(why));
    if (rc == -EBUSY) {
        ga_serve_reply_error(s, id, EBUSY, "%s", why);
        s->fatal = EXIT_PROTOCOL;
        return -1;
    }
    if (rc < 0)
        fprintf(stderr, "gpusync-agent: %s; serving without the writer lock\n", why);
    else if (s->fence.killed || s->fence.swept)
        fprintf(stderr,
                "gpusync-agent: took over %s (stopped agent %ld, removed %ld stale temporary "
                "files)\n",
                s->root, s->fence.killed, s->fence.swept);
    return 0;
}

/* Answers the first frame, which must be a HELLO of our version. */
static int handshake(struct ga_serve *s, const struct gs_proto_frame *f)
{
    struct gs_proto_msg m;
    if (f->type != GS_MSG_HELLO || gs_proto_decode(f, &m) < 0 || m.magic != GS_PROTO_MAGIC) {
        ga_serve_reply_error(s, f->id, EPROTO, "expected a gpusync HELLO as the first frame");
        s->fatal = EXIT_PROTOCOL;
        return -1;
    }
    if (m.version != GS_PROTO_VERSION) {
        ga_serve_reply_error(s, f->id, EPROTONOSUPPORT,
                             "protocol version mismatch: client speaks %u, agent %s speaks %u; "
                             "reinstall the agent",
                             m.version, GA_AGENT_VERSION, GS_PROTO_VERSION);
        s->fatal = EXIT_PROTOCOL;
        return -1;
    }
    if (s->writer && take_writer_lock(s, f->id) < 0)
        return -1;
    s->fsync = s->fsync || (m.flags & GS_HELLO_FSYNC);
    s->greeted = 1;
    /* level 1: fast enough not to slow a LAN; the replies it packs are mostly small (zframes.h) */
    if (m.flags & GS_HELLO_ZSTD)
        s->z = gs_zframes_new(1);
#ifdef GS_RSYNC
    s->delta = (m.flags & GS_HELLO_DELTA) != 0;
#endif
    struct gs_proto_msg r = {0};
    r.type = GS_MSG_HELLO_OK;
    r.id = f->id;
    r.magic = GS_PROTO_MAGIC;
    r.version = GS_PROTO_VERSION;
    r.text = gs_proto_cstr(GA_AGENT_VERSION);
    r.path2 = gs_proto_cstr(s->root);
    char sync_id[GS_SYNC_ID_MAX + 1] = "";
    if ((m.flags & GS_HELLO_SYNC_ID) && ga_sync_id_get(s->rootfd, sync_id) < 0)
        sync_id[0] = '\0'; /* the client then records none, and asks again next time */
    r.path = gs_proto_cstr(sync_id);
    r.flags = (s->z ? GS_HELLO_ZSTD : 0) | (s->delta ? GS_HELLO_DELTA : 0);
    char resident[GA_RESIDENT_PATH_MAX] = "";
    if ((m.flags & GS_HELLO_RESIDENT) && s->writer &&
        ga_resident_offer(resident, sizeof(resident)) == 1) /* "" when there can be none */
        r.flags |= GS_HELLO_RESIDENT;
    r.data = gs_proto_cstr(resident);
    ga_serve_emit(s, &r);
    return s->fatal ? -1 : 0;
}

/* Handles the frames a ZFRAMES carries, in order, as if they had come one by one. */
static void zframes(struct ga_serve *s, const struct gs_proto_frame *f)
{
    struct gs_proto_msg m;
    if (!s->z) {
        ga_serve_reply_error(s, f->id, ENOSYS, "ZFRAMES without GS_HELLO_ZSTD agreed");
        return;
    }
    if (gs_proto_decode(f, &m) < 0 || gs_zframes_unpack(s->z, &m, &s->zin) < 0) {
        ga_serve_reply_error(s, f->id, EBADMSG, "malformed ZFRAMES frame; closing");
        s->fatal = EXIT_PROTOCOL; /* the frames it held are lost: the stream cannot go on */
        return;
    }
    struct gs_proto_buf inner = s->zin; /* a ZFRAMES inside is refused, so zin is not reused */
    for (size_t at = 0; at < inner.len && !s->fatal;) {
        struct gs_proto_frame g;
        long len = gs_proto_parse_frame(inner.data + at, inner.len - at, &g);
        if (len <= 0 || g.type == GS_MSG_ZFRAMES) {
            ga_serve_reply_error(s, f->id, EBADMSG, "malformed frame inside ZFRAMES; closing");
            s->fatal = EXIT_PROTOCOL;
            return;
        }
        at += (size_t)len;
        ga_serve_frame(s, &g);
    }
}

int ga_serve_frame(struct ga_serve *s, const struct gs_proto_frame *f)
{
    if (!s->greeted)
        return handshake(s, f);
    if (f->type == GS_MSG_ZFRAMES) {
        zframes(s, f);
        return s->fatal ? -1 : 0;
    }
    struct gs_proto_msg m;
    handler_fn h = (f->type & 0x80) ? NULL : handler_for(f->type);
    if (!h) {
        ga_serve_reply_error(s, f->id, ENOSYS, "unknown request type 0x%02x", f->type);
    } else if (gs_proto_decode(f, &m) < 0) {
        ga_serve_reply_error(s, f->id, EBADMSG, "malformed %s frame", gs_proto_type_name(f->type));
    } else {
        h(s, &m);
    }
    return s->fatal ? -1 : 0;
}

long ga_serve_feed(struct ga_serve *s, const uint8_t *p, size_t n)
{
    size_t used = 0;
    if (n == 0) /* p may be NULL then: no pointer arithmetic on it */
        return s->fatal ? -1 : 0;
    while (!s->fatal) {
        struct gs_proto_frame f;
        long len = gs_proto_parse_frame(p + used, n - used, &f);
        if (len == 0)
            return (long)used;
        if (len < 0) {
            ga_serve_reply_error(s, f.id, EMSGSIZE, "frame length out of range (5..%u); closing",
                                 GS_PROTO_MAX_FRAME);
            s->fatal = EXIT_PROTOCOL;
            break;
        }
        used += (size_t)len;
        ga_serve_frame(s, &f);
    }
    return -1;
}

/* Packs the queued replies into s->zout (compressed where it pays). Returns 0 or -1. */
static int pack_out(struct ga_serve *s)
{
    s->zout.len = 0;
    for (size_t at = 0; at < s->out.len;) {
        long used =
            gs_zframes_pack(s->z, GS_MSG_ZFRAMES_R, s->out.data + at, s->out.len - at, &s->zout);
        if (used < 0)
            return -1;
        at += (size_t)used;
    }
    return 0;
}

int ga_serve_flush(struct ga_serve *s)
{
    if (s->out.len == 0)
        return 0;
    struct gs_proto_buf *wire = &s->out;
    if (s->z && pack_out(s) == 0)
        wire = &s->zout;
    if (s->write(s->write_ctx, wire->data, wire->len) < 0) {
        s->out.len = 0;
        if (!s->fatal)
            s->fatal = EXIT_IO;
        return -1;
    }
    s->out.len = 0;
    return 0;
}

/* ---- lifecycle and the loop -------------------------------------------------------------- */

/* Creates root and its missing parents. */
static int mkdir_p(const char *root)
{
    char *p = strdup(root);
    if (!p)
        return -ENOMEM;
    int rc = 0;
    for (char *c = p + 1; rc == 0; c++) {
        if (*c != '/' && *c != '\0')
            continue;
        char save = *c;
        *c = '\0';
        if (mkdir(p, 0777) < 0 && errno != EEXIST)
            rc = -errno;
        *c = save;
        if (save == '\0')
            break;
    }
    free(p);
    return rc;
}

int ga_serve_init(struct ga_serve *s, const char *root, int create, ga_serve_write_fn write,
                  void *ctx, char *err, size_t errlen)
{
    memset(s, 0, sizeof(*s));
    s->rootfd = -1;
    ga_fence_init(&s->fence);
    s->write = write;
    s->write_ctx = ctx;
    int rc = create ? mkdir_p(root) : 0;
    if (rc == 0 && (s->root = realpath(root, NULL)) == NULL)
        rc = -errno;
    if (rc == 0 && (s->rootfd = open(s->root, O_RDONLY | O_DIRECTORY | O_CLOEXEC)) < 0)
        rc = -errno;
    if (rc == 0 && (s->streams = calloc(GS_PROTO_MAX_STREAMS, sizeof(*s->streams))) == NULL)
        rc = -ENOMEM;
    if (rc < 0) {
        snprintf(err, errlen, "cannot use root %s: %s", root, strerror(-rc));
        ga_serve_release(s);
        return rc;
    }
    for (int i = 0; i < GS_PROTO_MAX_STREAMS; i++)
        s->streams[i].fd = s->streams[i].dirfd = -1;
    gs_proto_buf_init(&s->out);
    return 0;
}

void ga_serve_release(struct ga_serve *s)
{
    for (int i = 0; s->streams && i < GS_PROTO_MAX_STREAMS; i++)
        if (s->streams[i].used)
            ga_serve_stream_free(&s->streams[i]);
    free(s->streams);
    ga_serve_check_save(s);                    /* while this session is still the root's writer */
    ga_fence_release(&s->fence, s->clean_end); /* after the streams' temporaries are gone */
    if (s->rootfd >= 0)
        close(s->rootfd);
    free(s->root);
    gs_proto_buf_release(&s->out);
    gs_proto_buf_release(&s->zin);
    gs_proto_buf_release(&s->zout);
    gs_zframes_free(s->z);
    ga_serve_check_release(s);
    memset(s, 0, sizeof(*s));
    s->rootfd = -1;
    ga_fence_init(&s->fence);
}

/* Milliseconds on a monotonic clock. */
static int64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* True if fd has input ready right now. */
static int input_ready(int fd)
{
    struct pollfd p = {fd, POLLIN, 0};
    return poll(&p, 1, 0) > 0;
}

/* Reads more input into in; returns bytes read, 0 at end of input, -1 on error. */
static ssize_t read_more(int fd, struct gs_proto_buf *in)
{
    if (gs_proto_buf_reserve(in, READ_CHUNK) < 0)
        return -1;
    for (;;) {
        ssize_t n = read(fd, in->data + in->len, in->cap - in->len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n > 0)
            in->len += (size_t)n;
        return n;
    }
}

int ga_serve_run(struct ga_serve *s, int infd)
{
    struct gs_proto_buf in;
    gs_proto_buf_init(&in);
    int status = 0;
    int64_t last_flush = now_ms();
    for (;;) {
        long used = ga_serve_feed(s, in.data, in.len);
        if (used < 0)
            break;
        gs_proto_buf_consume(&in, (size_t)used);
        /* Flush when the input pauses; during a long burst (a big file streaming in after
         * small requests) also every FLUSH_MS, so earlier replies are not held back. */
        if (s->out.len && (!input_ready(infd) || now_ms() - last_flush >= FLUSH_MS)) {
            if (ga_serve_flush(s) < 0)
                break;
            last_flush = now_ms();
        }
        ssize_t n = read_more(infd, &in);
        if (n < 0) {
            fprintf(stderr, "gpusync-agent: reading requests: %s\n", strerror(errno));
            status = EXIT_IO;
            break;
        }
        if (n == 0) {
            if (in.len) {
                fprintf(stderr, "gpusync-agent: input ended inside a frame (%zu bytes)\n", in.len);
                status = EXIT_PROTOCOL;
            }
            break;
        }
    }
    ga_serve_flush(s);
    if (s->fatal) {
        fprintf(stderr, "gpusync-agent: %s; closing the session\n",
                s->fatal == EXIT_PROTOCOL    ? "protocol error"
                : s->fatal == EXIT_ROOT_GONE ? "the root was removed"
                                             : "cannot write replies");
        status = s->fatal;
    }
    s->clean_end = status == 0;
    gs_proto_buf_release(&in);
    return status;
}
