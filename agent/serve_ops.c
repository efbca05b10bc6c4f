/* Tree-changing handlers of the agent (serve_int.h): mkdir -p, chmod (v10: with the mtime, on
 * the content the client names), delete (recursive on request) and rename, with the conflict check
 * on what gets replaced or deleted. */
/* POSIX.1-2008 with XSI; _GNU_SOURCE from the top-level build is fine too. */
#ifndef _XOPEN_SOURCE
#define _XOPEN_SOURCE 700
#endif
#include "serve_int.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---- directory and metadata ops ---------------------------------------------------------- */

/* Opens the parent of a checked path without creating anything, or replies ERROR. */
int ga_serve_parent(struct ga_serve *s, const struct gs_proto_msg *m, const char *op,
                    const char *path, int create, int *dirfd, char *name)
{
    int rc = ga_fs_open_parent(s->rootfd, path, create, dirfd, name);
    if (rc < 0)
        ga_serve_reply_op_error(s, m->id, rc, op, path);
    return rc;
}

/* Makes dirfd/name a directory. One already there is a no-op (GS_DONE_NOOP in *flags); anything
 * else there (a job's output file, a symlink) is kept aside as a conflict copy, named in `kept`,
 * as a put keeps what it replaces: failing instead would fail every sync of the folder, for good.
 */
static int make_dir(int dirfd, const char *name, uint32_t *flags, char kept[GA_FS_NAME_MAX + 1])
{
    if (mkdirat(dirfd, name, 0700) == 0)
        return 0;
    if (errno != EEXIST)
        return -errno;
    struct gs_proto_expect dir = {.kind = GS_EXPECT_DIR};
    int rc = ga_fs_check_expect(dirfd, name, &dir, NULL, kept);
    if (rc == 0) { /* a directory */
        *flags = GS_DONE_NOOP;
        return 0;
    }
    if (rc < 0)
        return rc;
    return mkdirat(dirfd, name, 0700) < 0 ? -errno : 0;
}

void ga_serve_mkdir(struct ga_serve *s, const struct gs_proto_msg *m)
{
    char *path, name[GA_FS_NAME_MAX + 1];
    int dirfd;
    if (ga_serve_take_path(s, m, m->path, 0, &path) < 0)
        return;
    if (ga_serve_parent(s, m, "mkdir", path, 1, &dirfd, name) == 0) {
        uint32_t flags = 0;
        char kept[GA_FS_NAME_MAX + 1] = "";
        int rc = make_dir(dirfd, name, &flags, kept);
        if (rc == 0)
            rc = ga_fs_chmod_entry(dirfd, name, m->meta.mode);
        if (rc == 0 && s->fsync)
            fsync(dirfd);
        if (rc < 0)
            ga_serve_reply_op_error(s, m->id, rc, "mkdir", path);
        else
            ga_serve_reply_done(s, m->id, flags, path, kept);
        close(dirfd);
    }
    free(path);
}

void ga_serve_chmod(struct ga_serve *s, const struct gs_proto_msg *m)
{
    char *path, name[GA_FS_NAME_MAX + 1];
    int dirfd;
    if (ga_serve_take_path(s, m, m->path, 0, &path) < 0)
        return;
    if (ga_serve_parent(s, m, "chmod", path, 0, &dirfd, name) == 0) {
        /* v10: mode and mtime, only on the content the client believes is there */
        int rc = m->has_hash ? ga_fs_stamp_entry(dirfd, name, &m->meta, m->hash)
                             : ga_fs_chmod_entry(dirfd, name, m->meta.mode);
        if (rc == -ESTALE)
            ga_serve_reply_error(s, m->id, ESTALE,
                                 "chmod %s: the server holds other content than the client "
                                 "named; mode and mtime left as they were",
                                 path);
        else if (rc < 0)
            ga_serve_reply_op_error(s, m->id, rc, "chmod", path);
        else
            ga_serve_reply_done(s, m->id, 0, path, NULL);
        close(dirfd);
    }
    free(path);
}

/* Removes dirfd/name (file, symlink, empty dir, or a tree if recursive). */
static int remove_entry(int dirfd, const char *name, int recursive)
{
    struct stat st;
    if (fstatat(dirfd, name, &st, AT_SYMLINK_NOFOLLOW) < 0)
        return -errno;
    if (!S_ISDIR(st.st_mode))
        return unlinkat(dirfd, name, 0) < 0 ? -errno : 0;
    if (recursive)
        return ga_fs_remove_tree(dirfd, name);
    return unlinkat(dirfd, name, AT_REMOVEDIR) < 0 ? -errno : 0;
}

void ga_serve_delete(struct ga_serve *s, const struct gs_proto_msg *m)
{
    char *path, name[GA_FS_NAME_MAX + 1], kept[GA_FS_NAME_MAX + 1];
    int dirfd;
    if (ga_serve_take_path(s, m, m->path, 0, &path) < 0)
        return;
    int rc = ga_fs_open_parent(s->rootfd, path, 0, &dirfd, name);
    if (rc == -ENOENT) {
        ga_serve_reply_done(s, m->id, GS_DONE_NOOP, path, NULL);
    } else if (rc < 0) {
        ga_serve_reply_op_error(s, m->id, rc, "delete", path);
    } else {
        struct stat st;
        uint32_t flags = 0;
        rc = ga_fs_check_expect(dirfd, name, &m->expect, NULL, kept);
        if (rc == 0 && fstatat(dirfd, name, &st, AT_SYMLINK_NOFOLLOW) < 0) {
            rc = errno == ENOENT ? 1 : -errno; /* already gone: nothing to do */
            flags = GS_DONE_NOOP;
        } else if (rc == 0) {
            rc = remove_entry(dirfd, name, m->flags & GS_DEL_RECURSIVE);
        }
        if (rc == 0 && s->fsync)
            fsync(dirfd);
        if (rc < 0)
            ga_serve_reply_op_error(s, m->id, rc, "delete", path);
        else
            ga_serve_reply_done(s, m->id, flags, path, kept);
        close(dirfd);
    }
    free(path);
}

void ga_serve_rename(struct ga_serve *s, const struct gs_proto_msg *m)
{
    char *from = NULL, *to = NULL, fname[GA_FS_NAME_MAX + 1], tname[GA_FS_NAME_MAX + 1];
    char kept[GA_FS_NAME_MAX + 1] = "";
    int fdir = -1, tdir = -1;
    struct stat st;
    if (ga_serve_take_path(s, m, m->path, 0, &from) < 0 ||
        ga_serve_take_path(s, m, m->path2, 0, &to) < 0)
        goto out;
    if (strcmp(from, to) == 0) { /* else `to` would look like a conflict with itself */
        ga_serve_reply_done(s, m->id, GS_DONE_NOOP, to, NULL);
        goto out;
    }
    if (ga_serve_parent(s, m, "rename", from, 0, &fdir, fname) < 0 ||
        ga_serve_parent(s, m, "rename", to, 1, &tdir, tname) < 0)
        goto out;
    int rc = fstatat(fdir, fname, &st, AT_SYMLINK_NOFOLLOW) < 0 ? -errno : 0;
    /* A source edited on the server is not the file the client means to move: keep it aside. */
    if (rc == 0 && ga_fs_check_expect(fdir, fname, &m->expect2, NULL, kept) == 1) {
        ga_serve_reply_done(s, m->id, GS_DONE_KEPT | GS_DONE_MOVED_ASIDE, from, kept);
        goto out;
    }
    if (rc == 0)
        rc = ga_fs_check_expect(tdir, tname, &m->expect, NULL, kept);
    if (rc >= 0 && renameat(fdir, fname, tdir, tname) < 0)
        rc = -errno;
    if (rc < 0 && kept[0]) {
        ga_serve_reply_error(s, m->id, -rc, "rename %s: %s (what was at %s is kept as %s)", from,
                             ga_serve_why(-rc), to, kept);
        goto out;
    }
    if (rc < 0) {
        ga_serve_reply_op_error(s, m->id, rc, "rename", from);
        goto out;
    }
    if (s->fsync)
        fsync(fdir), fsync(tdir);
    ga_serve_reply_done(s, m->id, 0, to, kept);
out:
    if (fdir >= 0)
        close(fdir);
    if (tdir >= 0)
        close(tdir);
    free(from);
    free(to);
}
