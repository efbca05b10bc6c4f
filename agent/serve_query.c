/* Read-only handlers of the agent (serve_int.h): stat, hash, get (a file streamed back in
 * chunks, for gpusync pull), list (a subtree walk for verification and recovery) and the
 * LIST_ENTRIES replies that list and check (serve_check.c) fill. */
/* POSIX.1-2008 with XSI; _GNU_SOURCE from the top-level build is fine too. */
#ifndef _XOPEN_SOURCE
#define _XOPEN_SOURCE 700
#endif
#include "serve_int.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "writers.h"

#define LIST_FRAME (64u << 10) /* payload bytes per LIST_ENTRIES frame */

/* ---- queries ----------------------------------------------------------------------------- */

void ga_serve_stat(struct ga_serve *s, const struct gs_proto_msg *m)
{
    char *path, *link = NULL, name[GA_FS_NAME_MAX + 1];
    int dirfd;
    struct stat st;
    if (ga_serve_take_path(s, m, m->path, 0, &path) < 0)
        return;
    struct gs_proto_msg r = {0};
    r.type = GS_MSG_STAT_R;
    r.id = m->id;
    r.path2 = gs_proto_cstr("");
    int rc = ga_fs_open_parent(s->rootfd, path, 0, &dirfd, name);
    if (rc == 0) {
        if (fstatat(dirfd, name, &st, AT_SYMLINK_NOFOLLOW) < 0)
            rc = -errno;
        else if (S_ISLNK(st.st_mode))
            rc = ga_fs_readlink(dirfd, name, &link);
        close(dirfd);
    }
    if (rc == -ENOENT || rc == -ENOTDIR) {
        ga_serve_emit(s, &r); /* kind NONE */
    } else if (rc < 0) {
        ga_serve_reply_op_error(s, m->id, rc, "stat", path);
    } else {
        r.kind = ga_fs_kind(st.st_mode);
        ga_fs_meta_from_stat(&st, &r.meta);
        r.size = (uint64_t)st.st_size;
        if (link)
            r.path2 = gs_proto_cstr(link);
        ga_serve_emit(s, &r);
    }
    free(link);
    free(path);
}

void ga_serve_hash(struct ga_serve *s, const struct gs_proto_msg *m)
{
    char *path, name[GA_FS_NAME_MAX + 1];
    int dirfd;
    struct stat st;
    if (ga_serve_take_path(s, m, m->path, 0, &path) < 0)
        return;
    struct gs_proto_msg r = {0};
    r.type = GS_MSG_HASH_R;
    r.id = m->id;
    int rc = ga_fs_open_parent(s->rootfd, path, 0, &dirfd, name);
    if (rc == 0) {
        rc = fstatat(dirfd, name, &st, AT_SYMLINK_NOFOLLOW) < 0 ? -errno : 0;
        if (rc == 0)
            rc = ga_fs_hash_entry(dirfd, name, &st, r.hash, &r.size);
        close(dirfd);
    }
    if (rc < 0)
        ga_serve_reply_op_error(s, m->id, rc, "hash", path);
    else
        ga_serve_emit(s, &r);
    free(path);
}

/* Streams fd's first `limit` bytes (its size at open: a file that grows meanwhile is sent as it
 * was) as GET_DATA frames, hashing what is sent. *size < limit when it ended sooner. Returns 0 or
 * a negative errno. */
static int send_file(struct ga_serve *s, uint32_t id, int fd, uint64_t limit, uint8_t *hash,
                     uint64_t *size)
{
    XXH3_state_t hs;
    XXH3_128bits_reset(&hs);
    *size = 0;
    while (*size < limit) {
        if (gs_proto_buf_reserve(&s->out, GS_PROTO_HDR + GS_PROTO_CHUNK) < 0)
            return -ENOMEM;
        uint8_t *dst = s->out.data + s->out.len + GS_PROTO_HDR;
        uint64_t left = limit - *size;
        ssize_t n = read(fd, dst, left < GS_PROTO_CHUNK ? (size_t)left : GS_PROTO_CHUNK);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            return -errno;
        if (n == 0)
            break;
        XXH3_128bits_update(&hs, dst, (size_t)n);
        gs_proto_encode_header(&s->out, GS_MSG_GET_DATA, id, (uint32_t)n);
        s->out.len += (size_t)n;
        *size += (uint64_t)n;
        if (s->out.len >= GA_SERVE_FLUSH_AT && ga_serve_flush(s) < 0)
            return -EPIPE;
    }
    XXH128_canonical_t c;
    XXH128_canonicalFromHash(&c, XXH3_128bits_digest(&hs));
    memcpy(hash, c.digest, GS_PROTO_HASH_LEN);
    return 0;
}

/* Whether `now` (fstat of the open file, or fstatat of its name) is still the file `was` describes
 * (at open): same inode, size, mtime and ctime. Any write, truncation or chmod moves the ctime; a
 * save by rename, or a removal, leaves the name to another inode or none. */
static int same_file(const struct stat *was, const struct stat *now)
{
    return was->st_dev == now->st_dev && was->st_ino == now->st_ino &&
           was->st_size == now->st_size && was->st_mtim.tv_sec == now->st_mtim.tv_sec &&
           was->st_mtim.tv_nsec == now->st_mtim.tv_nsec &&
           was->st_ctim.tv_sec == now->st_ctim.tv_sec &&
           was->st_ctim.tv_nsec == now->st_ctim.tv_nsec;
}

/* Whether fd's first `len` bytes, read again now, hash to `hash` (1), or not (0); or a negative
 * errno. */
static int begins_with(int fd, uint64_t len, const uint8_t *hash)
{
    uint8_t now[GS_PROTO_HASH_LEN];
    uint64_t got = 0;
    if (lseek(fd, 0, SEEK_SET) < 0)
        return -errno;
    int rc = ga_fs_hash_fd_upto(fd, len, now, &got);
    return rc < 0 ? rc : got == len && memcmp(now, hash, GS_PROTO_HASH_LEN) == 0;
}

/* After the last byte was read: 0 when the bytes sent (`sent` of them, hashing to `hash`) are one
 * version of the file, -ENOENT when its name was removed meanwhile, else -EAGAIN (written,
 * truncated or replaced while read). A file that was only appended to (a log, TensorBoard's
 * event files) is one version: still the same inode under its name, its first bytes, read
 * again, still those sent, which were its whole content at open. */
static int check_unchanged(int dirfd, const char *name, int fd, const struct stat *was,
                           uint64_t sent, const uint8_t *hash)
{
    struct stat now, named;
    if (fstat(fd, &now) < 0)
        return -errno;
    if (fstatat(dirfd, name, &named, AT_SYMLINK_NOFOLLOW) < 0)
        return errno == ENOENT ? -ENOENT : -errno;
    if (sent != (uint64_t)was->st_size) /* it shrank before it was read to the end */
        return -EAGAIN;
    if (same_file(was, &now) && same_file(was, &named))
        return 0;
    if (named.st_dev != was->st_dev || named.st_ino != was->st_ino || (uint64_t)now.st_size < sent)
        return -EAGAIN;
    int same = begins_with(fd, sent, hash);
    return same < 0 ? same : same ? 0 : -EAGAIN;
}

static long long ms_of(struct timespec t)
{
    return (long long)t.tv_sec * 1000 + t.tv_nsec / 1000000;
}

/* The process that holds the file `st` open for writing, not appending (a job in the middle of
 * saving it, maybe paused between two writes: its bytes so far look like a whole file; or one
 * writing a log opened with 'w'), or NULL.
 * /proc is read again when the last look is a second old, or not after the file's last change
 * (its writer may have opened it since; ctime comes from the kernel's coarse clock, a tick or so
 * behind this one); a writer that opened it after that, and has not written yet, has changed
 * nothing of what was read. */
static const struct ga_writer *writer_of(const struct stat *st)
{
    static struct ga_writers writers;
    static long long scanned_ms = -1; /* CLOCK_REALTIME, as st_ctim */
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    if (scanned_ms < 0 || ms_of(now) - scanned_ms > 1000 || ms_of(st->st_ctim) >= scanned_ms - 50) {
        ga_writers_scan(&writers);
        scanned_ms = ms_of(now);
    }
    return ga_writers_find(&writers, st->st_dev, st->st_ino);
}

void ga_serve_get(struct ga_serve *s, const struct gs_proto_msg *m)
{
    char *path, name[GA_FS_NAME_MAX + 1];
    int dirfd = -1, fd = -1;
    struct stat st;
    if (ga_serve_take_path(s, m, m->path, 0, &path) < 0)
        return;
    struct gs_proto_msg r = {0};
    r.type = GS_MSG_GET_END;
    r.id = m->id;
    int rc = ga_fs_open_parent(s->rootfd, path, 0, &dirfd, name);
    if (rc == 0) {
        fd = openat(dirfd, name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
        rc = fd < 0 ? -errno : fstat(fd, &st) < 0 ? -errno : 0;
        if (rc == 0 && !S_ISREG(st.st_mode))
            rc = S_ISDIR(st.st_mode) ? -EISDIR : -EINVAL;
    }
    if (rc == 0) {
        ga_fs_meta_from_stat(&st, &r.meta);
        rc = send_file(s, m->id, fd, (uint64_t)st.st_size, r.hash, &r.size);
    }
    if (rc == 0)
        rc = check_unchanged(dirfd, name, fd, &st, r.size, r.hash);
    /* A process holding it open for writing may be half way through saving it, or may be
     * writing a log with 'w': the bytes are the file as it was either way, and pull says so. */
    const struct ga_writer *w = rc == 0 ? writer_of(&st) : NULL;
    char writer[64];
    if (w) {
        snprintf(writer, sizeof(writer), "pid %ld (%s)", w->pid, w->name[0] ? w->name : "?");
        r.text = gs_proto_cstr(writer);
    }
    if (rc == -EAGAIN)
        ga_serve_reply_error(s, m->id, EAGAIN,
                             "get %s: it changed while it was read (written, truncated or "
                             "replaced)",
                             path);
    else if (rc < 0)
        ga_serve_reply_op_error(s, m->id, rc, "get", path);
    else
        ga_serve_emit(s, &r);
    if (fd >= 0)
        close(fd);
    if (dirfd >= 0)
        close(dirfd);
    free(path);
}

int ga_entries_begin(struct ga_entries_out *o, struct ga_serve *s, uint32_t id)
{
    o->s = s;
    o->id = id;
    return gs_proto_list_begin(&s->out, GS_MSG_LIST_ENTRIES, id, 0, &o->mark) < 0 ? -ENOMEM : 0;
}

int ga_entries_add(struct ga_entries_out *o, const struct gs_proto_entry *e)
{
    if (gs_proto_list_add(&o->s->out, o->mark, LIST_FRAME, e) == 0)
        return 0;
    ga_entries_end(o);
    if (o->s->out.len >= GA_SERVE_FLUSH_AT && ga_serve_flush(o->s) < 0)
        return -EPIPE;
    if (ga_entries_begin(o, o->s, o->id) < 0)
        return -ENOMEM;
    return gs_proto_list_add(&o->s->out, o->mark, GS_PROTO_MAX_PAYLOAD, e) < 0 ? -ENOMEM : 0;
}

void ga_entries_end(struct ga_entries_out *o)
{
    gs_proto_list_end(&o->s->out, o->mark);
}

/* State of one LIST walk. */
struct lister {
    struct ga_entries_out out;
    uint32_t flags;
    uint64_t count;
    char rel[GS_PROTO_MAX_PATH + GA_FS_NAME_MAX + 2];
};

/* What a GS_KIND_OTHER entry is, as LIST names it in the link field (proto/sync.h). */
static const char *other_type(mode_t mode)
{
    if (S_ISFIFO(mode))
        return "fifo";
    if (S_ISSOCK(mode))
        return "socket";
    if (S_ISCHR(mode))
        return "char-device";
    return S_ISBLK(mode) ? "block-device" : "other";
}

/* Describes dirfd/name (path l->rel) and sends it. */
static int list_one(struct lister *l, int dirfd, const char *name, const struct stat *st)
{
    struct gs_proto_entry e;
    char *link = NULL;
    memset(&e, 0, sizeof(e));
    e.path = gs_proto_cstr(l->rel);
    e.kind = ga_fs_kind(st->st_mode);
    ga_fs_meta_from_stat(st, &e.meta);
    e.size = (uint64_t)st->st_size;
    e.link = gs_proto_cstr("");
    if (S_ISLNK(st->st_mode) && ga_fs_readlink(dirfd, name, &link) == 0)
        e.link = gs_proto_cstr(link);
    else if (e.kind == GS_KIND_OTHER) /* so that a pull can say what it left out */
        e.link = gs_proto_cstr(other_type(st->st_mode));
    if ((l->flags & GS_LIST_HASH) && S_ISREG(st->st_mode)) {
        uint64_t size;
        e.has_hash = ga_fs_hash_entry(dirfd, name, st, e.hash, &size) == 0;
    }
    int rc = ga_entries_add(&l->out, &e);
    free(link);
    l->count++;
    return rc;
}

/* Reports what the walk leaves out (LIST_SKIPPED with err for the path in l->rel) between two
 * LIST_ENTRIES frames, so one odd entry costs its report instead of the whole listing. */
static int list_skip(struct lister *l, int err)
{
    struct gs_proto_msg r = {0};
    r.type = GS_MSG_LIST_SKIPPED;
    r.id = l->out.id;
    r.err = err;
    r.path = gs_proto_cstr(l->rel);
    ga_entries_end(&l->out);
    ga_serve_emit(l->out.s, &r);
    return ga_entries_begin(&l->out, l->out.s, l->out.id);
}

static int list_dir(struct lister *l, int fd, size_t len, int depth);

/* Walks into directory dirfd/name (path l->rel) unless it lies too deep or cannot be opened;
 * either is reported as skipped. */
static int list_descend(struct lister *l, int dirfd, const char *name, int depth)
{
    if (depth + 1 > (int)GS_PROTO_LIST_DEPTH)
        return list_skip(l, ELOOP);
    int sub = openat(dirfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (sub < 0)
        return errno == ENOENT ? 0 : list_skip(l, errno); /* ENOENT: removed meanwhile */
    return list_dir(l, sub, strlen(l->rel), depth + 1);
}

/* Lists the directory open as fd (closed here); l->rel holds its path (prefix) of len bytes. */
static int list_dir(struct lister *l, int fd, size_t len, int depth)
{
    DIR *d = fdopendir(fd);
    if (!d) {
        int e = -errno;
        close(fd);
        return e;
    }
    int rc = 0;
    struct dirent *de;
    while (rc == 0 && (de = readdir(d)) != NULL) {
        struct stat st;
        const char *n = de->d_name;
        if (!strcmp(n, ".") || !strcmp(n, "..") || (ga_fs_is_tmp(n) && !(l->flags & GS_LIST_TMP)))
            continue;
        if (fstatat(dirfd(d), n, &st, AT_SYMLINK_NOFOLLOW) < 0)
            continue; /* vanished meanwhile */
        /* l->rel has room for any directory path LIST reaches plus one name */
        snprintf(l->rel + len, sizeof(l->rel) - len, "%s%s", len ? "/" : "", n);
        if (strlen(l->rel) > GS_PROTO_MAX_PATH)
            rc = list_skip(l, ENAMETOOLONG);
        else if ((rc = list_one(l, dirfd(d), n, &st)) == 0 && S_ISDIR(st.st_mode))
            rc = list_descend(l, dirfd(d), n, depth);
        l->rel[len] = '\0';
    }
    closedir(d);
    return rc;
}

/* LIST of a path that is itself a symlink (every folder above it a real one): that one entry,
 * so that `pull LINK` makes the link as a pull of its folder does, where the walk refused it.
 * Returns 1 when listed, 0 when path is no symlink, or a negative errno. */
static int list_link_itself(struct lister *l, struct ga_serve *s, const char *path, uint32_t id)
{
    int dirfd;
    char name[GA_FS_NAME_MAX + 1];
    struct stat st;
    int rc = ga_fs_open_parent(s->rootfd, path, 0, &dirfd, name);
    if (rc < 0)
        return rc;
    if (fstatat(dirfd, name, &st, AT_SYMLINK_NOFOLLOW) < 0 || !S_ISLNK(st.st_mode)) {
        close(dirfd);
        return 0;
    }
    snprintf(l->rel, sizeof(l->rel), "%s", path);
    rc = ga_entries_begin(&l->out, s, id);
    if (rc == 0) {
        rc = list_one(l, dirfd, name, &st);
        ga_entries_end(&l->out);
    }
    close(dirfd);
    return rc < 0 ? rc : 1;
}

void ga_serve_list(struct ga_serve *s, const struct gs_proto_msg *m)
{
    char *path;
    if (ga_serve_take_path(s, m, m->path, 1, &path) < 0)
        return;
    struct lister l = {.flags = m->flags};
    int fd = ga_fs_open_dir(s->rootfd, path);
    int rc = fd;
    if (fd == -ELOOP && path[0]) {
        int one = list_link_itself(&l, s, path, m->id);
        rc = one == 0 ? fd : one < 0 ? one : 0;
    }
    if (fd >= 0) {
        snprintf(l.rel, sizeof(l.rel), "%s", path);
        rc = ga_entries_begin(&l.out, s, m->id);
        if (rc == 0) {
            rc = list_dir(&l, fd, strlen(path), 0);
            ga_entries_end(&l.out);
        } else {
            close(fd);
        }
    }
    if (rc < 0) {
        ga_serve_reply_op_error(s, m->id, rc, "list", path[0] ? path : ".");
    } else {
        struct gs_proto_msg r = {0};
        r.type = GS_MSG_LIST_END;
        r.id = m->id;
        r.size = l.count;
        ga_serve_emit(s, &r);
    }
    free(path);
}
