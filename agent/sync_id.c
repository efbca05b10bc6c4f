/* agent/sync_id.c: reading, or creating once, the root's sync id (see sync_id.h). */
/* POSIX.1-2008 (openat, linkat); _GNU_SOURCE from the top-level build is fine too. */
#ifndef _XOPEN_SOURCE
#define _XOPEN_SOURCE 700
#endif
#include "sync_id.h"

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "fs.h"

static void random_token(char out[33])
{
    unsigned char raw[16] = {0};
    int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
    if (fd < 0 || read(fd, raw, sizeof(raw)) != (ssize_t)sizeof(raw)) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        uint64_t mix[2] = {(uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec,
                           (uint64_t)getpid()};
        memcpy(raw, mix, sizeof(raw));
    }
    if (fd >= 0)
        close(fd);
    for (int i = 0; i < 16; i++)
        snprintf(out + 2 * i, 3, "%02x", raw[i]);
}

/* Reads the token in dirfd/name. Returns 0, or a negative errno (-ENOENT: there is none). */
static int read_token(int dirfd, const char *name, char out[GS_SYNC_ID_MAX + 1])
{
    int fd = openat(dirfd, name, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0)
        return -errno;
    ssize_t n = read(fd, out, GS_SYNC_ID_MAX);
    int rc = n < 0 ? -errno : 0;
    close(fd);
    if (rc < 0)
        return rc;
    out[n] = '\0';
    out[strcspn(out, "\r\n")] = '\0';
    return 0;
}

/* Writes a new token to a temporary file and links it into place: link fails if another agent
 * got there first, and then that token wins. */
static int create_token(int dirfd, const char *name)
{
    char tmp[64], token[33];
    random_token(token);
    int fd = ga_fs_tmp_create(dirfd, tmp);
    if (fd < 0)
        return fd;
    size_t len = strlen(token);
    token[len++] = '\n';
    int rc = write(fd, token, len) == (ssize_t)len ? 0 : -EIO;
    if (close(fd) < 0 && rc == 0)
        rc = -errno;
    if (rc == 0 && linkat(dirfd, tmp, dirfd, name, 0) < 0 && errno != EEXIST)
        rc = -errno;
    unlinkat(dirfd, tmp, 0);
    return rc;
}

int ga_sync_id_get(int rootfd, char out[GS_SYNC_ID_MAX + 1])
{
    char name[GA_FS_NAME_MAX + 1];
    int dirfd, rc = ga_fs_open_parent(rootfd, GA_SYNC_ID_PATH, 1, &dirfd, name);
    if (rc < 0)
        return rc;
    rc = read_token(dirfd, name, out);
    if (rc == -ENOENT && (rc = create_token(dirfd, name)) == 0)
        rc = read_token(dirfd, name, out);
    close(dirfd);
    return rc;
}
