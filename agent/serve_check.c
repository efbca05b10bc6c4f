/* The agent's CHECK handler (proto/sync.h): the paths where the server holds something other than
 * the client believes, the beliefs a session keeps between checks (GS_CHECK_KEEP, re-examined only
 * where dirwatch.h saw a change), and the set it saves for the next session (GS_CHECK_SAVED). */
/* POSIX.1-2008 with XSI; _GNU_SOURCE from the top-level build is fine too. */
#ifndef _XOPEN_SOURCE
#define _XOPEN_SOURCE 700
#endif
#include "dirwatch.h"
#include "serve_int.h"
#include "wrapper.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* Set-id bits are never mirrored (the agent clears them), so they are not compared. */
#define COMPARED_MODE_BITS (07777u & ~06000u)

/* What the client believes one path holds. `path` and `link` share one allocation. */
struct belief {
    char *path;
    const char *link; /* a symlink's target, "" otherwise */
    uint8_t kind;
    uint32_t mode;
    uint64_t size;
    int64_t mtime_sec;
    uint8_t settled; /* found as believed in a watched folder, and no change seen there since */
};

struct ga_check_set {
    struct belief *v;
    size_t n, cap;
    int changed; /* since it was loaded from the saved set: save it again */
};

static void set_clear(struct ga_check_set *set)
{
    for (size_t i = 0; i < set->n; i++)
        free(set->v[i].path);
    free(set->v);
    memset(set, 0, sizeof(*set));
}

static int set_push(struct ga_check_set *set, struct belief b)
{
    if (set->n == set->cap) {
        size_t cap = set->cap ? set->cap * 2 : 256;
        struct belief *v = realloc(set->v, cap * sizeof(*v));
        if (!v)
            return -ENOMEM;
        set->v = v;
        set->cap = cap;
    }
    set->v[set->n++] = b;
    return 0;
}

/* Orders paths as unsigned bytes, a prefix first (the client's index order). */
static int path_cmp(const char *a, const char *b)
{
    return strcmp(a, b);
}

static int belief_from_entry(const struct gs_proto_entry *e, struct belief *b)
{
    if (gs_proto_check_path(e->path.p, e->path.len, 0) < 0 || e->has_hash ||
        (e->link.len && memchr(e->link.p, '\0', e->link.len)))
        return -EBADMSG;
    b->path = malloc((size_t)e->path.len + e->link.len + 2);
    if (!b->path)
        return -ENOMEM;
    memcpy(b->path, e->path.p, e->path.len);
    b->path[e->path.len] = '\0';
    char *link = b->path + e->path.len + 1;
    if (e->link.len)
        memcpy(link, e->link.p, e->link.len);
    link[e->link.len] = '\0';
    b->link = link;
    b->kind = e->kind;
    b->mode = e->meta.mode;
    b->size = e->size;
    b->mtime_sec = e->meta.mtime_sec;
    b->settled = 0;
    return 0;
}

/* Decodes a CHECK's entries into `out`, refusing any out of order. */
static int read_beliefs(const struct gs_proto_msg *m, struct ga_check_set *out)
{
    size_t pos = 0;
    struct gs_proto_entry e;
    int r, rc = 0;
    while (rc == 0 && (r = gs_proto_list_next(m, &pos, &e)) == 1) {
        struct belief b;
        rc = belief_from_entry(&e, &b);
        if (rc == 0 && out->n && path_cmp(out->v[out->n - 1].path, b.path) >= 0) {
            free(b.path);
            rc = -EBADMSG;
        }
        if (rc == 0 && (rc = set_push(out, b)) < 0)
            free(b.path);
    }
    if (rc == 0 && (r < 0 || out->n != m->count))
        rc = -EBADMSG;
    return rc;
}

/* Merges `news` (consumed) into the kept set, both in path order: a belief replaces the kept one
 * for its path, and one of kind NONE removes it. */
static int merge_kept(struct ga_serve *s, struct ga_check_set *news)
{
    struct ga_check_set *kept = s->kept, out = {0};
    size_t i = 0, j = 0;
    int rc = 0;
    while (rc == 0 && (i < kept->n || j < news->n)) {
        int c = i == kept->n ? 1 : j == news->n ? -1 : path_cmp(kept->v[i].path, news->v[j].path);
        struct belief *take = c < 0 ? &kept->v[i] : &news->v[j];
        if (c == 0)
            free(kept->v[i].path); /* replaced */
        i += c <= 0;
        j += c >= 0;
        if (take->kind == GS_KIND_NONE) {
            free(take->path);
            continue;
        }
        if (out.n == GS_PROTO_CHECK_KEEP_MAX)
            rc = -E2BIG;
        else
            rc = set_push(&out, *take);
        if (rc < 0)
            free(take->path);
    }
    for (; i < kept->n; i++) /* after a failure: what was not moved yet */
        free(kept->v[i].path);
    for (; j < news->n; j++)
        free(news->v[j].path);
    free(kept->v);
    free(news->v);
    out.changed = kept->changed || news->n > 0;
    memset(news, 0, sizeof(*news));
    *kept = out;
    if (rc < 0)
        set_clear(kept);
    return rc;
}

/* The directory that holds the paths being examined: consecutive paths mostly share it, so it is
 * opened once for them (without following symlinks, as every request resolves paths). */
struct parent {
    char *dir; /* its path, NULL before the first */
    size_t len;
    int fd;                    /* open, or -1 */
    int err;                   /* why it could not be opened (a negative errno), or 0 */
    struct ga_dirwatch *watch; /* watches each folder opened (kept sets), or NULL */
    int watched;               /* any change of its entries will be seen */
};

static void parent_close(struct parent *p)
{
    if (p->fd >= 0)
        close(p->fd);
    free(p->dir);
    p->dir = NULL;
    p->fd = -1;
}

/* Points `p` at path's parent and returns the final name's offset in path. */
static size_t parent_of(struct ga_serve *s, struct parent *p, const char *path)
{
    const char *slash = strrchr(path, '/');
    size_t len = slash ? (size_t)(slash - path) : 0;
    if (p->dir && p->len == len && memcmp(p->dir, path, len) == 0)
        return slash ? len + 1 : 0;
    parent_close(p);
    char name[GA_FS_NAME_MAX + 1];
    p->err = ga_fs_open_parent(s->rootfd, path, 0, &p->fd, name);
    if (p->err < 0)
        p->fd = -1;
    p->dir = malloc(len + 1);
    if (p->dir) {
        memcpy(p->dir, path, len);
        p->dir[len] = '\0';
        p->len = len;
    }
    /* watched before its entries are examined, so no change after that goes unseen */
    p->watched = p->dir && p->fd >= 0 && ga_dirwatch_add(p->watch, p->dir, p->fd);
    return slash ? len + 1 : 0;
}

/* 1 when what `st` describes (dirfd/name) is not what `b` believes; -1 when it cannot be told. */
static int differs(const struct belief *b, int dirfd, const char *name, const struct stat *st,
                   char **link)
{
    uint8_t kind = ga_fs_kind(st->st_mode);
    if (kind != b->kind)
        return 1;
    if (kind == GS_KIND_SYMLINK) {
        if (ga_fs_readlink(dirfd, name, link) < 0)
            return -1;
        return strcmp(*link, b->link) != 0;
    }
    if (kind == GS_KIND_FILE &&
        ((uint64_t)st->st_size != b->size || (int64_t)st->st_mtime != b->mtime_sec))
        return 1;
    return ((st->st_mode ^ b->mode) & COMPARED_MODE_BITS) != 0;
}

/* Examines one path; lists it in `o` when the server holds something else there. */
static int examine(struct ga_serve *s, struct parent *p, struct belief *b, struct ga_entries_out *o)
{
    if (b->settled)
        return 0;
    const char *name = b->path + parent_of(s, p, b->path);
    struct gs_proto_entry e;
    memset(&e, 0, sizeof(e));
    e.path = gs_proto_cstr(b->path);
    e.link = gs_proto_cstr("");
    int rc = p->err;
    struct stat st;
    if (rc == 0 && fstatat(p->fd, name, &st, AT_SYMLINK_NOFOLLOW) < 0)
        rc = -errno;
    if (rc == -ENOENT || rc == -ENOTDIR)
        return ga_entries_add(o, &e); /* kind NONE */
    if (rc < 0)
        return 0; /* cannot be told: not listed */
    char *link = NULL;
    int d = differs(b, p->fd, name, &st, &link);
    /* A file with other links can change through a folder that is not watched. */
    b->settled = d == 0 && p->watched && (b->kind != GS_KIND_FILE || st.st_nlink == 1);
    if (d == 1) {
        e.kind = ga_fs_kind(st.st_mode);
        ga_fs_meta_from_stat(&st, &e.meta);
        e.size = (uint64_t)st.st_size;
        if (link)
            e.link = gs_proto_cstr(link);
        rc = ga_entries_add(o, &e);
    }
    free(link);
    return rc;
}

/* The first belief whose path is not below `key` in path order. */
static size_t lower_bound(const struct ga_check_set *set, const char *key)
{
    size_t lo = 0, hi = set->n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (path_cmp(set->v[mid].path, key) < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

/* dirwatch.h's report: `path` (and with subtree, all below it) must be examined again. */
static void unsettle(void *ctx, const char *path, int subtree)
{
    struct ga_check_set *set = ctx;
    size_t i = lower_bound(set, path), len = strlen(path);
    if (i < set->n && strcmp(set->v[i].path, path) == 0)
        set->v[i++].settled = 0;
    if (!subtree)
        return;
    if (len == 0) {
        for (i = 0; i < set->n; i++)
            set->v[i].settled = 0;
        return;
    }
    /* paths below it follow it in path order, those of "path/" ('/' sorts after some bytes) */
    char *below = malloc(len + 2);
    if (!below) { /* cannot tell which: all of them */
        unsettle(ctx, "", 1);
        return;
    }
    memcpy(below, path, len);
    memcpy(below + len, "/", 2);
    for (i = lower_bound(set, below); i < set->n && strncmp(set->v[i].path, below, len + 1) == 0;
         i++)
        set->v[i].settled = 0;
    free(below);
}

/* Replies LIST_ENTRIES (what differs) and LIST_END for the beliefs in `set`; `watch`, for a kept
 * set, first names what changed since the last check and then watches what is examined. */
static int examine_all(struct ga_serve *s, uint32_t id, struct ga_check_set *set,
                       struct ga_dirwatch *watch)
{
    struct ga_entries_out o;
    struct parent p = {.fd = -1, .watch = watch};
    if (watch)
        ga_dirwatch_drain(watch, unsettle, set);
    int rc = ga_entries_begin(&o, s, id);
    if (rc < 0)
        return rc;
    for (size_t i = 0; rc == 0 && i < set->n; i++)
        rc = examine(s, &p, &set->v[i], &o);
    parent_close(&p);
    ga_entries_end(&o);
    if (rc < 0)
        return rc;
    struct gs_proto_msg r = {0};
    r.type = GS_MSG_LIST_END;
    r.id = id;
    r.size = set->n;
    ga_serve_emit(s, &r);
    return 0;
}

/* ---- the set saved for the next session ---- */

#define SAVED_MAGIC     "gpusync check-kept 1\n"
#define SAVED_MAGIC_LEN (sizeof(SAVED_MAGIC) - 1)
#define SAVED_MAX       (512u << 20) /* bytes: far more than GS_PROTO_CHECK_KEEP_MAX entries */

/* The set's entries as the digest covers them (proto/sync.h: mtime_nsec 0), appended to `out`. */
static int encode_set(const struct ga_check_set *set, struct gs_proto_buf *out)
{
    for (size_t i = 0; i < set->n; i++) {
        const struct belief *b = &set->v[i];
        struct gs_proto_entry e;
        memset(&e, 0, sizeof(e));
        e.path = gs_proto_cstr(b->path);
        e.kind = b->kind;
        e.meta.mode = b->mode;
        e.meta.mtime_sec = b->mtime_sec;
        e.size = b->size;
        e.link = gs_proto_cstr(b->link);
        if (gs_proto_entry_append(out, &e) < 0)
            return -ENOMEM;
    }
    return 0;
}

static int write_saved(int dirfd, const char *name, size_t count, const struct gs_proto_buf *b)
{
    char tmp[64];
    int fd = ga_fs_tmp_create(dirfd, tmp);
    if (fd < 0)
        return fd;
    uint8_t n[4] = {(uint8_t)(count >> 24), (uint8_t)(count >> 16), (uint8_t)(count >> 8),
                    (uint8_t)count};
    int rc = ga_write_all(fd, SAVED_MAGIC, SAVED_MAGIC_LEN) < 0 || ga_write_all(fd, n, 4) < 0 ||
                     ga_write_all(fd, b->data, b->len) < 0
                 ? -errno
                 : 0;
    if (close(fd) < 0 && rc == 0)
        rc = -errno;
    if (rc == 0 && renameat(dirfd, tmp, dirfd, name) < 0)
        rc = -errno;
    if (rc < 0)
        unlinkat(dirfd, tmp, 0);
    return rc;
}

void ga_serve_check_save(struct ga_serve *s)
{
    if (!s->kept || !s->kept->changed || s->fence.fd < 0) /* only the root's one writer saves */
        return;
    struct gs_proto_buf b;
    gs_proto_buf_init(&b);
    char name[GA_FS_NAME_MAX + 1];
    int dirfd = -1;
    int rc = encode_set(s->kept, &b);
    if (rc == 0)
        rc = ga_fs_open_parent(s->rootfd, GS_PROTO_CHECK_SAVED, 1, &dirfd, name);
    if (rc == 0)
        rc = write_saved(dirfd, name, s->kept->n, &b);
    if (dirfd >= 0)
        close(dirfd);
    if (rc < 0) /* the next session sends its whole set: slower, no less true */
        fprintf(stderr, "gpusync-agent: cannot save the checked paths for the next session: %s\n",
                strerror(-rc));
    gs_proto_buf_release(&b);
}

/* Reads the saved set's file whole into `b`. */
static int read_saved(struct ga_serve *s, struct gs_proto_buf *b)
{
    char name[GA_FS_NAME_MAX + 1];
    int dirfd, rc = ga_fs_open_parent(s->rootfd, GS_PROTO_CHECK_SAVED, 0, &dirfd, name);
    if (rc < 0)
        return rc;
    int fd = openat(dirfd, name, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    close(dirfd);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) < 0) {
        rc = -errno;
        if (fd >= 0)
            close(fd);
        return rc;
    }
    if (!S_ISREG(st.st_mode) || st.st_size > (off_t)SAVED_MAX) {
        close(fd);
        return -EINVAL;
    }
    rc = gs_proto_buf_reserve(b, (size_t)st.st_size) < 0 ? -ENOMEM : 0;
    while (rc == 0 && b->len < (size_t)st.st_size) {
        ssize_t got = read(fd, b->data + b->len, (size_t)st.st_size - b->len);
        if (got < 0 && errno == EINTR)
            continue;
        rc = got < 0 ? -errno : got == 0 ? -EINVAL : 0;
        b->len += got > 0 ? (size_t)got : 0;
    }
    close(fd);
    return rc;
}

/* Starts the kept set from the saved one, if `digest` names it; -ESTALE if none does. */
static int start_from_saved(struct ga_serve *s, const uint8_t digest[GS_PROTO_HASH_LEN])
{
    struct gs_proto_buf b;
    gs_proto_buf_init(&b);
    struct ga_check_set saved = {0};
    int rc = read_saved(s, &b);
    size_t head = SAVED_MAGIC_LEN + 4;
    if (rc < 0 || b.len < head || memcmp(b.data, SAVED_MAGIC, SAVED_MAGIC_LEN) != 0 ||
        b.len - head > UINT32_MAX)
        rc = -ESTALE;
    uint8_t got[GS_PROTO_HASH_LEN];
    if (rc == 0) {
        ga_fs_hash_mem(b.data + head, b.len - head, got);
        rc = memcmp(got, digest, sizeof(got)) == 0 ? 0 : -ESTALE;
    }
    if (rc == 0) {
        const uint8_t *n = b.data + SAVED_MAGIC_LEN;
        struct gs_proto_msg m = {.count = (uint32_t)n[0] << 24 | (uint32_t)n[1] << 16 |
                                          (uint32_t)n[2] << 8 | n[3]};
        m.entries.p = (const char *)b.data + head;
        m.entries.len = (uint32_t)(b.len - head);
        rc = read_beliefs(&m, &saved) < 0 ? -ESTALE : 0;
    }
    if (rc == 0 && saved.n > GS_PROTO_CHECK_KEEP_MAX)
        rc = -ESTALE;
    if (rc == 0) {
        ga_serve_check_release(s);
        s->kept = calloc(1, sizeof(*s->kept));
        rc = s->kept ? 0 : -ENOMEM;
    }
    if (rc == 0)
        *s->kept = saved; /* changed 0: as saved */
    else
        set_clear(&saved);
    gs_proto_buf_release(&b);
    return rc;
}

static int keep(struct ga_serve *s, struct ga_check_set *news)
{
    if (!s->kept && !(s->kept = calloc(1, sizeof(*s->kept))))
        return -ENOMEM;
    return merge_kept(s, news);
}

void ga_serve_check(struct ga_serve *s, const struct gs_proto_msg *m)
{
    /* A removed root reads as empty: the client would send everything into a folder that
     * cannot hold it again. */
    if (ga_serve_end_if_root_gone(s))
        return;
    struct ga_check_set got = {0};
    int keeping = (m->flags & GS_CHECK_KEEP) != 0;
    int rc = m->flags & ~(uint32_t)(GS_CHECK_KEEP | GS_CHECK_DEFER | GS_CHECK_SAVED) ? -EBADMSG : 0;
    if (rc == 0)
        rc = read_beliefs(m, &got);
    if (rc == 0 && keeping && (m->flags & GS_CHECK_SAVED))
        rc = start_from_saved(s, m->hash);
    if (rc == 0 && keeping)
        rc = keep(s, &got);
    if (rc == 0 && keeping && (m->flags & GS_CHECK_DEFER)) {
        struct gs_proto_msg r = {.type = GS_MSG_LIST_END, .id = m->id};
        ga_serve_emit(s, &r);
    } else if (rc == 0 && keeping) {
        if (!s->dirwatch)
            s->dirwatch = ga_dirwatch_new(); /* NULL: every path is examined each time */
        rc = examine_all(s, m->id, s->kept, s->dirwatch);
    } else if (rc == 0) {
        rc = examine_all(s, m->id, &got, NULL);
    }
    set_clear(&got);
    if (rc < 0) {
        ga_serve_check_release(s);
        ga_serve_reply_error(s, m->id, -rc, "CHECK: %s",
                             rc == -E2BIG    ? "more paths than an agent keeps"
                             : rc == -ESTALE ? "no saved set has that digest"
                                             : strerror(-rc));
    }
}

void ga_serve_check_release(struct ga_serve *s)
{
    if (s->kept)
        set_clear(s->kept);
    free(s->kept);
    s->kept = NULL;
    ga_dirwatch_free(s->dirwatch);
    s->dirwatch = NULL;
}
