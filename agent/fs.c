/* Path-safe file system helpers for the agent (see fs.h): resolution without following
 * symlinks, temporary names, conflict copies, hashing and tree removal. */
/* GNU for O_PATH (Linux, as the rest of the agent); the top-level build defines it too. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "fs.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define XXH_INLINE_ALL
#include "wrapper.h"
#include "xxhash.h"

#define DIR_FLAGS        (O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)
#define REMOVE_MAX_DEPTH 512

/* Counter making temporary names unique within this process (the pid makes them unique
 * between agents). */
static unsigned long tmp_counter;

/* Opens (creating it if asked) one directory component below dfd. */
static int open_component(int dfd, const char *comp, int create)
{
    int fd = openat(dfd, comp, DIR_FLAGS);
    if (fd < 0 && errno == ENOENT && create) {
        if (mkdirat(dfd, comp, 0777) < 0 && errno != EEXIST)
            return -errno;
        fd = openat(dfd, comp, DIR_FLAGS);
    }
    if (fd < 0 && errno == ENOTDIR) { /* O_DIRECTORY reports a symlink as ENOTDIR: tell why */
        struct stat st;
        if (fstatat(dfd, comp, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISLNK(st.st_mode))
            return -ELOOP;
        errno = ENOTDIR;
    }
    return fd < 0 ? -errno : fd;
}

int ga_fs_open_parent(int rootfd, const char *path, int create_parents, int *dirfd,
                      char name[GA_FS_NAME_MAX + 1])
{
    int dfd = fcntl(rootfd, F_DUPFD_CLOEXEC, 0);
    if (dfd < 0)
        return -errno;
    const char *p = path;
    for (;;) {
        const char *slash = strchr(p, '/');
        size_t n = slash ? (size_t)(slash - p) : strlen(p);
        if (n > GA_FS_NAME_MAX) {
            close(dfd);
            return -ENAMETOOLONG;
        }
        memcpy(name, p, n);
        name[n] = '\0';
        if (!slash)
            break;
        int fd = open_component(dfd, name, create_parents);
        close(dfd);
        if (fd < 0)
            return fd;
        dfd = fd;
        p = slash + 1;
    }
    *dirfd = dfd;
    return 0;
}

int ga_fs_open_dir(int rootfd, const char *path)
{
    if (path[0] == '\0') { /* a new open, not a dup: a dup would share the read position */
        int fd = openat(rootfd, ".", DIR_FLAGS);
        return fd < 0 ? -errno : fd;
    }
    char name[GA_FS_NAME_MAX + 1];
    int dfd;
    int rc = ga_fs_open_parent(rootfd, path, 0, &dfd, name);
    if (rc < 0)
        return rc;
    rc = open_component(dfd, name, 0);
    close(dfd);
    return rc;
}

uint8_t ga_fs_kind(mode_t mode)
{
    if (S_ISREG(mode))
        return GS_KIND_FILE;
    if (S_ISDIR(mode))
        return GS_KIND_DIR;
    if (S_ISLNK(mode))
        return GS_KIND_SYMLINK;
    return GS_KIND_OTHER;
}

static void hash_out(XXH128_hash_t h, uint8_t hash[GS_PROTO_HASH_LEN])
{
    XXH128_canonical_t c;
    XXH128_canonicalFromHash(&c, h);
    memcpy(hash, c.digest, GS_PROTO_HASH_LEN);
}

int ga_fs_hash_fd(int fd, uint8_t hash[GS_PROTO_HASH_LEN], uint64_t *size)
{
    return ga_fs_hash_fd_upto(fd, UINT64_MAX, hash, size);
}

int ga_fs_hash_fd_upto(int fd, uint64_t limit, uint8_t hash[GS_PROTO_HASH_LEN], uint64_t *size)
{
    enum { BUFSZ = 1 << 18 };
    XXH3_state_t st;
    uint8_t *buf = malloc(BUFSZ);
    if (!buf)
        return -ENOMEM;
    XXH3_128bits_reset(&st);
    uint64_t total = 0;
    int rc = 0;
    while (total < limit) {
        ssize_t n = read(fd, buf, limit - total < BUFSZ ? (size_t)(limit - total) : BUFSZ);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0) {
            rc = -errno;
            break;
        }
        if (n == 0)
            break;
        XXH3_128bits_update(&st, buf, (size_t)n);
        total += (uint64_t)n;
    }
    free(buf);
    if (rc == 0) {
        hash_out(XXH3_128bits_digest(&st), hash);
        *size = total;
    }
    return rc;
}

void ga_fs_hash_mem(const void *p, size_t n, uint8_t hash[GS_PROTO_HASH_LEN])
{
    hash_out(XXH3_128bits(p, n), hash);
}

int ga_fs_readlink(int dirfd, const char *name, char **out)
{
    size_t cap = 0;
    char *buf = NULL;
    for (;;) {
        GA_ALLOC_GROW(buf, cap + 256, cap); /* a target that filled buf may be longer */
        ssize_t n = readlinkat(dirfd, name, buf, cap);
        if (n < 0) {
            int e = errno;
            free(buf);
            return -e;
        }
        if ((size_t)n < cap) {
            buf[n] = '\0';
            *out = buf;
            return 0;
        }
    }
}

int ga_fs_hash_entry(int dirfd, const char *name, const struct stat *st,
                     uint8_t hash[GS_PROTO_HASH_LEN], uint64_t *size)
{
    if (S_ISLNK(st->st_mode)) {
        char *target;
        int rc = ga_fs_readlink(dirfd, name, &target);
        if (rc < 0)
            return rc;
        *size = strlen(target);
        ga_fs_hash_mem(target, *size, hash);
        free(target);
        return 0;
    }
    if (!S_ISREG(st->st_mode))
        return S_ISDIR(st->st_mode) ? -EISDIR : -EINVAL;
    /* O_NONBLOCK: should the file be swapped for a FIFO meanwhile, do not hang on it. */
    int fd = openat(dirfd, name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0)
        return -errno;
    int rc = ga_fs_hash_fd(fd, hash, size);
    close(fd);
    return rc;
}

/* Writes the next candidate temporary name into tmp. */
static void tmp_name(char tmp[64])
{
    snprintf(tmp, 64, "%s%ld-%lu", GS_PROTO_TMP_PREFIX, (long)getpid(), ++tmp_counter);
}

int ga_fs_tmp_create(int dirfd, char tmp[64])
{
    for (int tries = 0; tries < 100; tries++) {
        tmp_name(tmp);
        int fd = openat(dirfd, tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
        if (fd >= 0)
            return fd;
        if (errno != EEXIST)
            return -errno;
    }
    return -EEXIST;
}

int ga_fs_tmp_symlink(int dirfd, const char *target, char tmp[64])
{
    for (int tries = 0; tries < 100; tries++) {
        tmp_name(tmp);
        if (symlinkat(target, dirfd, tmp) == 0)
            return 0;
        if (errno != EEXIST)
            return -errno;
    }
    return -EEXIST;
}

/* Renames dirfd/name to a free NAME.gpusync-conflict-YYYYmmdd-HHMMSS[-N], stored in kept. */
static int keep_conflict(int dirfd, const char *name, char kept[GA_FS_NAME_MAX + 1])
{
    char stamp[32];
    time_t now = time(NULL);
    struct tm tm;
    if (!localtime_r(&now, &tm) || !strftime(stamp, sizeof(stamp), "%Y%m%d-%H%M%S", &tm))
        return -EINVAL;
    /* Room for the tag, the stamp and "-NNN": shorten NAME rather than fail on long names. */
    int base = GA_FS_NAME_MAX - (int)(strlen(GS_PROTO_CONFLICT_TAG) + strlen(stamp) + 4);
    for (int n = 0; n < 1000; n++) {
        if (n == 0)
            snprintf(kept, GA_FS_NAME_MAX + 1, "%.*s%s%s", base, name, GS_PROTO_CONFLICT_TAG,
                     stamp);
        else
            snprintf(kept, GA_FS_NAME_MAX + 1, "%.*s%s%s-%d", base, name, GS_PROTO_CONFLICT_TAG,
                     stamp, n);
        struct stat st;
        if (fstatat(dirfd, kept, &st, AT_SYMLINK_NOFOLLOW) == 0)
            continue;
        if (errno != ENOENT)
            return -errno;
        if (renameat(dirfd, name, dirfd, kept) < 0)
            return -errno;
        return 1;
    }
    return -EEXIST;
}

/* True if the existing entry matches what the client expects or what is about to be written. */
static int entry_matches(int dirfd, const char *name, const struct stat *st,
                         const struct gs_proto_expect *expect, const uint8_t *new_hash)
{
    uint8_t have[GS_PROTO_HASH_LEN];
    uint64_t size;
    if (expect->kind == GS_EXPECT_DIR)
        return S_ISDIR(st->st_mode);
    if (!S_ISREG(st->st_mode) && !S_ISLNK(st->st_mode))
        return 0;
    if (expect->kind != GS_EXPECT_HASH && !new_hash)
        return 0;
    if (ga_fs_hash_entry(dirfd, name, st, have, &size) < 0)
        return 0;
    if (expect->kind == GS_EXPECT_HASH && memcmp(have, expect->hash, sizeof(have)) == 0)
        return 1;
    return new_hash && memcmp(have, new_hash, sizeof(have)) == 0;
}

int ga_fs_check_expect(int dirfd, const char *name, const struct gs_proto_expect *expect,
                       const uint8_t *new_hash, char kept[GA_FS_NAME_MAX + 1])
{
    struct stat st;
    kept[0] = '\0';
    if (expect->kind == GS_EXPECT_FORCE)
        return 0;
    if (fstatat(dirfd, name, &st, AT_SYMLINK_NOFOLLOW) < 0)
        return errno == ENOENT ? 0 : -errno;
    if (entry_matches(dirfd, name, &st, expect, new_hash))
        return 0;
    return keep_conflict(dirfd, name, kept);
}

/* Empties the directory open as fd (closed here), depth levels below the start. */
static int remove_contents(int fd, int depth)
{
    DIR *d = fdopendir(fd);
    if (!d) {
        int e = errno;
        close(fd);
        return -e;
    }
    int rc = 0;
    struct dirent *de;
    while ((de = readdir(d)) != NULL) {
        if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, ".."))
            continue;
        int r = depth > REMOVE_MAX_DEPTH ? -ELOOP : 0;
        if (r == 0 && unlinkat(dirfd(d), de->d_name, 0) < 0) {
            r = -errno;
            if (errno == EISDIR || errno == EPERM) {
                int sub = openat(dirfd(d), de->d_name, DIR_FLAGS);
                r = sub < 0 ? -errno : remove_contents(sub, depth + 1);
                if (r == 0 && unlinkat(dirfd(d), de->d_name, AT_REMOVEDIR) < 0)
                    r = -errno;
            }
        }
        if (r < 0 && rc == 0)
            rc = r;
    }
    closedir(d);
    return rc;
}

int ga_fs_remove_tree(int dirfd, const char *name)
{
    struct stat st;
    if (fstatat(dirfd, name, &st, AT_SYMLINK_NOFOLLOW) < 0)
        return -errno;
    if (!S_ISDIR(st.st_mode))
        return unlinkat(dirfd, name, 0) < 0 ? -errno : 0;
    int fd = openat(dirfd, name, DIR_FLAGS);
    if (fd < 0)
        return -errno;
    int rc = remove_contents(fd, 1);
    if (rc == 0 && unlinkat(dirfd, name, AT_REMOVEDIR) < 0)
        rc = -errno;
    return rc;
}

mode_t ga_fs_safe_mode(uint32_t mode)
{
    return (mode_t)(mode & 07777 & ~(uint32_t)(S_ISUID | S_ISGID));
}

/* Sets the mode of the inode that fd (an O_PATH descriptor) refers to. fchmod refuses O_PATH
 * descriptors, so go through /proc/self/fd: that link names the inode itself, and resolving it
 * walks no directory of the tree, so no symlink there can redirect it. */
static int chmod_opath(int fd, mode_t mode)
{
    char proc[64];
    snprintf(proc, sizeof(proc), "/proc/self/fd/%d", fd);
    return chmod(proc, mode) < 0 ? -errno : 0;
}

int ga_fs_chmod_entry(int dirfd, const char *name, uint32_t mode)
{
    mode_t safe = ga_fs_safe_mode(mode);
    int fd = openat(dirfd, name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    if (fd >= 0) {
        int rc = fchmod(fd, safe) < 0 ? -errno : 0;
        close(fd);
        return rc;
    }
    if (errno == ELOOP)
        return -ELOOP;
    /* Unreadable (a file mode 0200, a socket): pin the entry itself, then check what it is. */
    fd = openat(dirfd, name, O_PATH | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0)
        return -errno;
    struct stat st;
    int rc = fstat(fd, &st) < 0 ? -errno : S_ISLNK(st.st_mode) ? -ELOOP : chmod_opath(fd, safe);
    close(fd);
    return rc;
}

/* atime and mtime, both the meta's mtime. */
static void meta_times(const struct gs_proto_meta *meta, struct timespec ts[2])
{
    ts[0].tv_sec = (time_t)meta->mtime_sec;
    ts[0].tv_nsec = (long)meta->mtime_nsec;
    ts[1] = ts[0];
}

int ga_fs_set_meta(int fd, const struct gs_proto_meta *meta)
{
    struct timespec ts[2];
    meta_times(meta, ts);
    if (fchmod(fd, ga_fs_safe_mode(meta->mode)) < 0 || futimens(fd, ts) < 0)
        return -errno;
    return 0;
}

/* Hashes the file open as fd and, only when it is a regular file holding `hash`, sets the meta
 * through that same descriptor. */
static int stamp_fd(int fd, const struct gs_proto_meta *meta, const uint8_t *hash)
{
    struct stat st;
    uint8_t have[GS_PROTO_HASH_LEN];
    uint64_t size;
    if (fstat(fd, &st) < 0)
        return -errno;
    if (!S_ISREG(st.st_mode))
        return -ESTALE;
    int rc = ga_fs_hash_fd(fd, have, &size);
    if (rc < 0)
        return rc;
    return memcmp(have, hash, sizeof(have)) == 0 ? ga_fs_set_meta(fd, meta) : -ESTALE;
}

/* stamp_fd for an entry that could not be opened for reading, pinned as the O_PATH descriptor
 * pfd: a regular file gets the mode first, which may make it readable (reopened through /proc,
 * which names the inode itself); if it still is not, its mtime is set unchecked. */
static int stamp_unreadable(int pfd, const struct gs_proto_meta *meta, const uint8_t *hash)
{
    struct stat st;
    char proc[64];
    if (fstat(pfd, &st) < 0)
        return -errno;
    if (S_ISLNK(st.st_mode))
        return -ELOOP;
    if (!S_ISREG(st.st_mode))
        return -ESTALE;
    int rc = chmod_opath(pfd, ga_fs_safe_mode(meta->mode));
    if (rc < 0)
        return rc;
    snprintf(proc, sizeof(proc), "/proc/self/fd/%d", pfd);
    int fd = open(proc, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd >= 0) {
        rc = stamp_fd(fd, meta, hash);
        close(fd);
        return rc;
    }
    if (errno != EACCES)
        return -errno;
    struct timespec ts[2];
    meta_times(meta, ts);
    return utimensat(AT_FDCWD, proc, ts, 0) < 0 ? -errno : 0;
}

int ga_fs_stamp_entry(int dirfd, const char *name, const struct gs_proto_meta *meta,
                      const uint8_t hash[GS_PROTO_HASH_LEN])
{
    int fd = openat(dirfd, name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    if (fd >= 0) {
        int rc = stamp_fd(fd, meta, hash);
        close(fd);
        return rc;
    }
    if (errno == ELOOP || errno == ENOENT || errno == ENOTDIR)
        return -errno;
    /* unreadable (mode 0200), or no file to read at all (a socket): pin it, then see */
    fd = openat(dirfd, name, O_PATH | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0)
        return -errno;
    int rc = stamp_unreadable(fd, meta, hash);
    close(fd);
    return rc;
}

void ga_fs_meta_from_stat(const struct stat *st, struct gs_proto_meta *meta)
{
    meta->mode = (uint32_t)(st->st_mode & 07777);
    meta->mtime_sec = (int64_t)st->st_mtim.tv_sec;
    meta->mtime_nsec = (uint32_t)st->st_mtim.tv_nsec;
}

int ga_fs_is_tmp(const char *name)
{
    return strncmp(name, GS_PROTO_TMP_PREFIX, strlen(GS_PROTO_TMP_PREFIX)) == 0;
}
