/* Put handlers of the agent (serve_int.h): whole-file PUT, streamed PUT_BEGIN/DATA/END, and
 * SYMLINK, all written under a temporary name in the target's directory and renamed into
 * place after the conflict check, so a reader never sees a partial file. */
/* POSIX.1-2008 with XSI; _GNU_SOURCE from the top-level build is fine too. */
#ifndef _XOPEN_SOURCE
#define _XOPEN_SOURCE 700
#endif
#include "serve_int.h"
#include "wrapper.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ---- shared steps ------------------------------------------------------------------------ */

/* Writes all n bytes. Returns 0 or a negative errno. */
static int write_all(int fd, const void *p, size_t n)
{
    return ga_write_all(fd, p, n) < 0 ? -errno : 0;
}

void ga_serve_commit(struct ga_serve *s, uint32_t id, const char *op, const char *path, int dirfd,
                     const char *tmp, const char *name, const struct gs_proto_expect *expect,
                     const uint8_t *new_hash)
{
    char kept[GA_FS_NAME_MAX + 1];
    int rc = ga_fs_check_expect(dirfd, name, expect, new_hash, kept);
    if (rc >= 0 && renameat(dirfd, tmp, dirfd, name) < 0)
        rc = -errno;
    if (rc < 0) {
        unlinkat(dirfd, tmp, 0);
        if (kept[0])
            ga_serve_reply_error(s, id, -rc, "%s %s: %s (the server's copy was kept as %s)", op,
                                 path, ga_serve_why(-rc), kept);
        else
            ga_serve_reply_op_error(s, id, rc, op, path);
        return;
    }
    if (s->fsync)
        fsync(dirfd);
    ga_serve_reply_done(s, id, 0, path, kept);
}

int ga_serve_finish_tmp(struct ga_serve *s, int fd, const struct gs_proto_meta *meta)
{
    int rc = ga_fs_set_meta(fd, meta);
    if (rc == 0 && s->fsync && fsync(fd) < 0)
        rc = -errno;
    if (close(fd) < 0 && rc == 0)
        rc = -errno;
    return rc;
}

/* ---- put --------------------------------------------------------------------------------- */

void ga_serve_put(struct ga_serve *s, const struct gs_proto_msg *m)
{
    char *path, name[GA_FS_NAME_MAX + 1], tmp[64];
    int dirfd;
    if (ga_serve_take_path(s, m, m->path, 0, &path) < 0)
        return;
    int rc = ga_fs_open_parent(s->rootfd, path, 1, &dirfd, name);
    if (rc < 0) {
        ga_serve_reply_op_error(s, m->id, rc, "put", path);
        free(path);
        return;
    }
    int fd = ga_fs_tmp_create(dirfd, tmp);
    rc = fd < 0 ? fd : write_all(fd, m->data.p, m->data.len);
    if (fd >= 0) {
        int r = ga_serve_finish_tmp(s, fd, &m->meta);
        rc = rc < 0 ? rc : r;
    }
    if (rc < 0) {
        if (fd >= 0)
            unlinkat(dirfd, tmp, 0);
        ga_serve_reply_op_error(s, m->id, rc, "put", path);
    } else {
        uint8_t hash[GS_PROTO_HASH_LEN];
        ga_fs_hash_mem(m->data.p, m->data.len, hash);
        ga_serve_commit(s, m->id, "put", path, dirfd, tmp, name, &m->expect, hash);
    }
    close(dirfd);
    free(path);
}

static struct ga_serve_stream *find_stream(struct ga_serve *s, uint32_t id)
{
    for (int i = 0; i < GS_PROTO_MAX_STREAMS; i++)
        if (s->streams[i].used && s->streams[i].id == id)
            return &s->streams[i];
    return NULL;
}

/* Drops a stream's temporary file and descriptors; the slot stays used (failed) until END. */
static void stream_fail(struct ga_serve_stream *st)
{
    if (st->fd >= 0) {
        close(st->fd);
        unlinkat(st->dirfd, st->tmp, 0);
    }
    if (st->dirfd >= 0)
        close(st->dirfd);
    st->fd = st->dirfd = -1;
    st->failed = 1;
}

void ga_serve_stream_free(struct ga_serve_stream *st)
{
    stream_fail(st);
    free(st->path);
    memset(st, 0, sizeof(*st));
    st->fd = st->dirfd = -1;
}

void ga_serve_put_begin(struct ga_serve *s, const struct gs_proto_msg *m)
{
    struct ga_serve_stream *st = find_stream(s, m->id);
    if (st) {
        ga_serve_reply_error(s, m->id, EBUSY, "put: a stream with id %u is already open", m->id);
        return;
    }
    for (int i = 0; i < GS_PROTO_MAX_STREAMS && !st; i++)
        if (!s->streams[i].used)
            st = &s->streams[i];
    if (!st) {
        ga_serve_reply_error(s, m->id, EMFILE, "put: more than %d streams open",
                             GS_PROTO_MAX_STREAMS);
        return;
    }
    st->used = 1;
    st->id = m->id;
    if (ga_serve_take_path(s, m, m->path, 0, &st->path) < 0) {
        st->failed = 1;
        return;
    }
    st->meta = m->meta;
    st->size = m->size;
    st->expect = m->expect;
    XXH3_128bits_reset(&st->hs);
    int rc = ga_fs_open_parent(s->rootfd, st->path, 1, &st->dirfd, st->name);
    if (rc >= 0) {
        st->fd = ga_fs_tmp_create(st->dirfd, st->tmp);
        rc = st->fd < 0 ? st->fd : 0;
    }
    if (rc < 0) {
        st->fd = -1;
        ga_serve_reply_op_error(s, m->id, rc, "put", st->path);
        stream_fail(st);
    }
}

void ga_serve_put_data(struct ga_serve *s, const struct gs_proto_msg *m)
{
    struct ga_serve_stream *st = find_stream(s, m->id);
    if (!st) {
        ga_serve_reply_error(s, m->id, EBADF, "put data: no open stream with id %u", m->id);
        return;
    }
    if (st->failed)
        return;
    int rc = ga_write_sparse(st->fd, m->data.p, m->data.len) < 0 ? -errno : 0;
    if (rc < 0) {
        ga_serve_reply_op_error(s, m->id, rc, "put", st->path);
        stream_fail(st);
        return;
    }
    XXH3_128bits_update(&st->hs, m->data.p, m->data.len);
    st->received += m->data.len;
}

/* What differs in the bytes a stream received, which must then not be committed: "its length"
 * (other than announced) or, with GS_PUTEND_VERIFY, "its content" (another hash than the client
 * planned); NULL when nothing does. Over SSH neither is a transport fault: the client's file
 * changed while it was read (still being written). */
static const char *stream_mismatch(const struct ga_serve_stream *st, const struct gs_proto_msg *m,
                                   const uint8_t *hash)
{
    if (st->size != GS_PROTO_SIZE_UNKNOWN && st->size != st->received)
        return "its length";
    if ((m->flags & GS_PUTEND_VERIFY) && memcmp(hash, m->hash, GS_PROTO_HASH_LEN) != 0)
        return "its content";
    return NULL;
}

void ga_serve_put_end(struct ga_serve *s, const struct gs_proto_msg *m)
{
    struct ga_serve_stream *st = find_stream(s, m->id);
    if (!st) {
        ga_serve_reply_error(s, m->id, EBADF, "put end: no open stream with id %u", m->id);
        return;
    }
    if (!st->failed) {
        uint8_t hash[GS_PROTO_HASH_LEN];
        XXH128_canonical_t c;
        XXH128_canonicalFromHash(&c, XXH3_128bits_digest(&st->hs));
        memcpy(hash, c.digest, sizeof(hash));
        /* its size, where it ends in a hole that ga_write_sparse left unwritten */
        int rc = ftruncate(st->fd, (off_t)st->received) < 0 ? -errno : 0;
        int r = ga_serve_finish_tmp(s, st->fd, &st->meta);
        rc = rc < 0 ? rc : r;
        st->fd = -1;
        const char *mismatch = rc == 0 ? stream_mismatch(st, m, hash) : NULL;
        if (rc < 0 || mismatch)
            unlinkat(st->dirfd, st->tmp, 0);
        if (mismatch) /* EBADMSG on the wire (proto/sync.h); the text says what it means */
            ga_serve_reply_error(s, m->id, EBADMSG,
                                 "put %s: changed during sync (%s changed while it was sent); the "
                                 "server's copy was left as it was",
                                 st->path, mismatch);
        else if (rc < 0)
            ga_serve_reply_op_error(s, m->id, rc, "put", st->path);
        else
            ga_serve_commit(s, m->id, "put", st->path, st->dirfd, st->tmp, st->name, &st->expect,
                            hash);
    }
    ga_serve_stream_free(st);
}

void ga_serve_symlink(struct ga_serve *s, const struct gs_proto_msg *m)
{
    char *path, *target = NULL, name[GA_FS_NAME_MAX + 1], tmp[64];
    int dirfd;
    if (ga_serve_take_path(s, m, m->path, 0, &path) < 0)
        return;
    if (memchr(m->path2.p, '\0', m->path2.len) || m->path2.len == 0 ||
        m->path2.len > GS_PROTO_MAX_PATH) {
        ga_serve_reply_error(s, m->id, EINVAL,
                             "symlink %s: the target is empty, too long or has NUL", path);
    } else if ((target = malloc(m->path2.len + 1)) == NULL) {
        ga_serve_reply_error(s, m->id, ENOMEM, "symlink %s: out of memory", path);
    } else if (ga_serve_parent(s, m, "symlink", path, 1, &dirfd, name) == 0) {
        memcpy(target, m->path2.p, m->path2.len);
        target[m->path2.len] = '\0';
        int rc = ga_fs_tmp_symlink(dirfd, target, tmp);
        if (rc < 0) {
            ga_serve_reply_op_error(s, m->id, rc, "symlink", path);
        } else {
            uint8_t hash[GS_PROTO_HASH_LEN];
            ga_fs_hash_mem(target, m->path2.len, hash);
            ga_serve_commit(s, m->id, "symlink", path, dirfd, tmp, name, &m->expect, hash);
        }
        close(dirfd);
    }
    free(target);
    free(path);
}
