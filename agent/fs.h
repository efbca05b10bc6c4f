/* Path-safe file system helpers for the agent: every path is resolved component by component
 * from the root's directory fd with O_NOFOLLOW|O_DIRECTORY, so no symlink is ever followed and
 * nothing outside the root can be reached. All functions return 0 (or a count) on success and
 * a negative errno on failure; they never print and never exit. C99 + POSIX. */
#ifndef GA_FS_H
#define GA_FS_H

#include <stddef.h>
#include <stdint.h>
#include <sys/stat.h>

#include "proto/sync.h"

#define GA_FS_NAME_MAX GS_PROTO_NAME_MAX

/* Opens the directory that holds the last component of `path` (a NUL-terminated path that
 * passed gs_proto_check_path and is not empty) and copies that component into name. With
 * create_parents, missing directories are created (mode 0777 & ~umask). On success *dirfd is
 * a new descriptor the caller closes. Errors: -ELOOP (a component is a symlink), -ENOTDIR,
 * -ENOENT, or the errno of openat/mkdirat; nothing is left open. */
int ga_fs_open_parent(int rootfd, const char *path, int create_parents, int *dirfd,
                      char name[GA_FS_NAME_MAX + 1]);

/* Opens a directory below the root (path "" is the root itself), never following symlinks.
 * Returns a new descriptor or a negative errno. */
int ga_fs_open_dir(int rootfd, const char *path);

/* Maps st_mode to GS_KIND_*. */
uint8_t ga_fs_kind(mode_t mode);

/* Hashes the rest of fd's content (XXH3-128, canonical bytes) and counts it. Returns 0 or
 * a negative errno. */
int ga_fs_hash_fd(int fd, uint8_t hash[GS_PROTO_HASH_LEN], uint64_t *size);
/* The same for at most `limit` bytes from fd's offset. */
int ga_fs_hash_fd_upto(int fd, uint64_t limit, uint8_t hash[GS_PROTO_HASH_LEN], uint64_t *size);

/* Hashes a byte string the same way. */
void ga_fs_hash_mem(const void *p, size_t n, uint8_t hash[GS_PROTO_HASH_LEN]);

/* Hashes the entry dirfd/name whose lstat is *st: a regular file's content or a symlink's
 * target string. Returns 0, -EISDIR/-EINVAL for other kinds, or the errno of reading. */
int ga_fs_hash_entry(int dirfd, const char *name, const struct stat *st,
                     uint8_t hash[GS_PROTO_HASH_LEN], uint64_t *size);

/* Reads a symlink's target into a malloc'd NUL-terminated string (*out, caller frees). */
int ga_fs_readlink(int dirfd, const char *name, char **out);

/* Creates an empty temporary file `.gpusync-tmp-*` in dirfd, mode 0600, name in tmp (64
 * bytes). Returns the open fd or a negative errno. */
int ga_fs_tmp_create(int dirfd, char tmp[64]);

/* Creates a symlink to target under a temporary name in dirfd (name in tmp). Returns 0 or a
 * negative errno. */
int ga_fs_tmp_symlink(int dirfd, const char *target, char tmp[64]);

/* Checks dirfd/name against an expectation before it is replaced or deleted. new_hash, if not
 * NULL, is the hash of the content about to be written (equal content is never a conflict).
 * GS_EXPECT_DIR matches a directory only (anything else in its place is kept).
 * If the entry does not match, it is renamed to NAME.gpusync-conflict-YYYYmmdd-HHMMSS[-N] and
 * that name is stored in kept (256 bytes) and 1 returned. Returns 0 if nothing had to be kept
 * (missing, forced, or matching), or a negative errno (the entry is then untouched). */
int ga_fs_check_expect(int dirfd, const char *name, const struct gs_proto_expect *expect,
                       const uint8_t *new_hash, char kept[GA_FS_NAME_MAX + 1]);

/* Removes dirfd/name and, if it is a directory, everything below it, never following a
 * symlink. Returns 0 or the first negative errno (what could be removed is removed). */
int ga_fs_remove_tree(int dirfd, const char *name);

/* The permission bits the agent applies for a requested mode: mode & 07777 without setuid and
 * setgid. Those are never mirrored: where the agent runs as root they would make a root-owned
 * set-id program out of any uploaded file. The sticky bit is kept. */
mode_t ga_fs_safe_mode(uint32_t mode);

/* Applies ga_fs_safe_mode(mode) to dirfd/name, never through a symlink: the entry is opened with
 * O_NOFOLLOW and changed through that descriptor, so a symlink swapped in at any moment is
 * refused, not followed. Returns 0, -ELOOP for a symlink, or another negative errno. */
int ga_fs_chmod_entry(int dirfd, const char *name, uint32_t mode);

/* Applies ga_fs_safe_mode(meta->mode) and mtime to an open file. Returns 0 or a negative
 * errno. */
int ga_fs_set_meta(int fd, const struct gs_proto_meta *meta);

/* CHMOD with a hash (v10, proto/sync.h): opens dirfd/name (never through a symlink), hashes it,
 * and only if it is a regular file holding `hash` sets ga_fs_safe_mode(meta->mode) and the
 * mtime through that descriptor. A file the agent may not read gets the mode first and is then
 * hashed; if it still cannot be read its mtime is set unchecked. Returns 0, -ESTALE (other
 * content, or no regular file: nothing changed but, for an unreadable file, its mode), -ELOOP
 * for a symlink, -ENOENT, or another negative errno. */
int ga_fs_stamp_entry(int dirfd, const char *name, const struct gs_proto_meta *meta,
                      const uint8_t hash[GS_PROTO_HASH_LEN]);

/* Fills a meta from a stat. */
void ga_fs_meta_from_stat(const struct stat *st, struct gs_proto_meta *meta);

/* True if name starts with GS_PROTO_TMP_PREFIX. */
int ga_fs_is_tmp(const char *name);

#endif
