/* wrapper: allocation that aborts with one message on failure, and write-until-done, holes
 * left where it may (see wrapper.h). The only place in the agent that decides what running out of
 * memory does. */
/* POSIX.1-2008 (lseek, off_t); _GNU_SOURCE from the top-level build is fine too. */
#ifndef _XOPEN_SOURCE
#define _XOPEN_SOURCE 700
#endif
#include "wrapper.h"

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* The one reaction to a failed allocation. */
static void alloc_failed(size_t size)
{
    fprintf(stderr, "gpusync-agent: out of memory (%zu bytes)\n", size);
    abort();
}

void *ga_xmalloc(size_t size)
{
    void *p = malloc(size ? size : 1);
    if (!p)
        alloc_failed(size);
    return p;
}

void *ga_xcalloc(size_t nmemb, size_t size)
{
    if (size && nmemb > SIZE_MAX / size)
        alloc_failed(SIZE_MAX);
    void *p = calloc(nmemb ? nmemb : 1, size ? size : 1);
    if (!p)
        alloc_failed(nmemb * size);
    return p;
}

void *ga_xrealloc(void *p, size_t size)
{
    void *q = realloc(p, size ? size : 1);
    if (!q)
        alloc_failed(size);
    return q;
}

void *ga_xreallocarray(void *p, size_t nmemb, size_t size)
{
    if (size && nmemb > SIZE_MAX / size)
        alloc_failed(SIZE_MAX);
    return ga_xrealloc(p, nmemb * size);
}

char *ga_xstrdup(const char *s)
{
    size_t n = strlen(s) + 1;
    return memcpy(ga_xmalloc(n), s, n);
}

static int all_zero(const unsigned char *p, size_t n)
{
    return n == 0 || (p[0] == 0 && memcmp(p, p + 1, n - 1) == 0);
}

int ga_write_sparse(int fd, const void *buf, size_t n)
{
    const unsigned char *p = buf;
    off_t at = lseek(fd, 0, SEEK_CUR);
    if (at < 0)
        return ga_write_all(fd, buf, n); /* not seekable: plain writes */
    while (n > 0) {
        /* up to the next block boundary of the file, so holes line up with its blocks */
        size_t len = GA_HOLE_BLOCK - (size_t)(at % GA_HOLE_BLOCK);
        len = len < n ? len : n;
        if (len == GA_HOLE_BLOCK && all_zero(p, len)) {
            if (lseek(fd, (off_t)len, SEEK_CUR) < 0)
                return -1;
        } else if (ga_write_all(fd, p, len) < 0) {
            return -1;
        }
        p += len, n -= len, at += (off_t)len;
    }
    return 0;
}

int ga_write_all(int fd, const void *buf, size_t n)
{
    const char *p = buf;
    while (n > 0) {
        ssize_t w = write(fd, p, n);
        if (w < 0 && errno == EINTR)
            continue;
        if (w < 0)
            return -1;
        if (w == 0) {
            errno = ENOSPC;
            return -1;
        }
        p += w;
        n -= (size_t)w;
    }
    return 0;
}
