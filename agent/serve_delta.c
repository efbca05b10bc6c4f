/* PUT_DELTA handler of the agent (proto/sync.h, DELTA): rebuilds a file from the copy the server
 * holds (the basis) and an rdiff delta with librsync's patch job, into a temporary name beside
 * the target, checks the result's hash, and renames it into place like every other write. Built
 * only with GS_RSYNC (static librsync); without it the agent never offers deltas and answers a
 * stray PUT_DELTA with ENOSYS. */
#ifndef _XOPEN_SOURCE
#define _XOPEN_SOURCE 700
#endif
#include "serve_int.h"
#include "wrapper.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#ifdef GS_RSYNC
#include <librsync.h>

#define PATCH_OUT (256u << 10) /* bytes of rebuilt file written per step */

/* The basis as librsync's copy callback reads it: by offset, straight from the server's copy. */
static rs_result read_basis(void *arg, rs_long_t pos, size_t *len, void **buf)
{
    int fd = *(int *)arg;
    ssize_t n;
    do
        n = pread(fd, *buf, *len, (off_t)pos);
    while (n < 0 && errno == EINTR);
    if (n < 0)
        return RS_IO_ERROR;
    if (n == 0)
        return RS_INPUT_ENDED; /* a delta that copies past the basis's end is corrupt */
    *len = (size_t)n;
    return RS_DONE;
}

/* Opens dirfd/name as the basis and checks that it is the file the client built the delta
 * against. Returns the fd, or -ESTALE when the server holds anything else (missing, not a
 * regular file, other content), or another negative errno. */
static int open_basis(int dirfd, const char *name, const uint8_t *want)
{
    int fd = openat(dirfd, name, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0)
        return errno == ENOENT || errno == ELOOP ? -ESTALE : -errno;
    struct stat st;
    uint8_t have[GS_PROTO_HASH_LEN];
    uint64_t size;
    int rc = fstat(fd, &st) < 0 ? -errno : !S_ISREG(st.st_mode) ? -ESTALE : 0;
    if (rc == 0)
        rc = ga_fs_hash_fd(fd, have, &size);
    if (rc == 0 && memcmp(have, want, sizeof(have)) != 0)
        rc = -ESTALE;
    if (rc < 0) {
        close(fd);
        return rc;
    }
    return fd;
}

/* Runs the patch job over the whole delta, writing the rebuilt file to out_fd and its hash to
 * hash. Returns 0, -EBADMSG for a delta that does not apply, or a write's negative errno. */
static int apply_delta(int basis_fd, struct gs_proto_str delta, int out_fd,
                       uint8_t hash[GS_PROTO_HASH_LEN])
{
    static char out[PATCH_OUT];
    XXH3_state_t hs;
    XXH3_128bits_reset(&hs);
    rs_job_t *job = rs_patch_begin(read_basis, &basis_fd);
    rs_buffers_t b = {.next_in = (char *)delta.p, .avail_in = delta.len, .eof_in = 1};
    rs_result r;
    int rc = 0;
    do {
        b.next_out = out, b.avail_out = sizeof(out);
        r = rs_job_iter(job, &b);
        size_t n = sizeof(out) - b.avail_out;
        if (n && ga_write_all(out_fd, out, n) < 0)
            rc = -errno;
        XXH3_128bits_update(&hs, out, n);
    } while (rc == 0 && r == RS_BLOCKED);
    rs_job_free(job);
    if (rc == 0 && r != RS_DONE)
        rc = r == RS_IO_ERROR ? -EIO : -EBADMSG;
    XXH128_canonical_t c;
    XXH128_canonicalFromHash(&c, XXH3_128bits_digest(&hs));
    memcpy(hash, c.digest, GS_PROTO_HASH_LEN);
    return rc;
}

/* Rebuilds into a new temporary file of dirfd and checks the result. Returns 0 with the name in
 * tmp, or a negative errno with no temporary left behind. */
static int rebuild(struct ga_serve *s, const struct gs_proto_msg *m, int dirfd, int basis_fd,
                   char *tmp)
{
    uint8_t got[GS_PROTO_HASH_LEN];
    int fd = ga_fs_tmp_create(dirfd, tmp);
    if (fd < 0)
        return fd;
    int rc = apply_delta(basis_fd, m->data, fd, got);
    if (rc == 0 && memcmp(got, m->hash, sizeof(got)) != 0)
        rc = -EBADMSG; /* the client's basis or delta was not what it thought: never commit */
    int r = ga_serve_finish_tmp(s, fd, &m->meta);
    rc = rc < 0 ? rc : r;
    if (rc < 0)
        unlinkat(dirfd, tmp, 0);
    return rc;
}

/* Replies for a delta that could not be committed (rc < 0). */
static void reply_failed(struct ga_serve *s, uint32_t id, int rc, const char *path)
{
    if (rc == -ESTALE)
        ga_serve_reply_error(s, id, ESTALE,
                             "put %s: the server's copy is not the basis of the delta; "
                             "send the whole file",
                             path);
    else if (rc == -EBADMSG)
        ga_serve_reply_error(s, id, EBADMSG,
                             "put %s: the file rebuilt from the delta is not the one sent; "
                             "nothing changed",
                             path);
    else
        ga_serve_reply_op_error(s, id, rc, "put", path);
}

void ga_serve_put_delta(struct ga_serve *s, const struct gs_proto_msg *m)
{
    char *path, name[GA_FS_NAME_MAX + 1], tmp[64];
    int dirfd = -1;
    if (!s->delta) {
        ga_serve_reply_error(s, m->id, ENOSYS, "PUT_DELTA without GS_HELLO_DELTA agreed");
        return;
    }
    if (ga_serve_take_path(s, m, m->path, 0, &path) < 0)
        return;
    int rc = ga_fs_open_parent(s->rootfd, path, 0, &dirfd, name);
    if (rc == -ENOENT || rc == -ENOTDIR)
        rc = -ESTALE; /* no parent, so no basis: the client sends the whole file */
    int basis = rc < 0 ? rc : open_basis(dirfd, name, m->expect.hash);
    rc = basis < 0 ? basis : rebuild(s, m, dirfd, basis, tmp);
    if (basis >= 0)
        close(basis);
    if (rc < 0)
        reply_failed(s, m->id, rc, path);
    else
        ga_serve_commit(s, m->id, "put", path, dirfd, tmp, name, &m->expect, m->hash);
    if (dirfd >= 0)
        close(dirfd);
    free(path);
}

#else

void ga_serve_put_delta(struct ga_serve *s, const struct gs_proto_msg *m)
{
    ga_serve_reply_error(s, m->id, ENOSYS, "this agent was built without librsync: no deltas");
}

#endif
