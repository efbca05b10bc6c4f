/* common/wrapper.c: allocation that aborts with one message on failure, and write-until-done
 * (see wrapper.h). The only place in the client that decides what running out of memory does. */
#include "common/wrapper.h"

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

void gs_out_of_memory(size_t size)
{
    if (size)
        fprintf(stderr, "gpusync: out of memory (%zu bytes)\n", size);
    else
        fprintf(stderr, "gpusync: out of memory\n");
    abort();
}

void *gs_xmalloc(size_t size)
{
    void *p = malloc(size ? size : 1);
    if (!p)
        gs_out_of_memory(size);
    return p;
}

void *gs_xcalloc(size_t nmemb, size_t size)
{
    if (size && nmemb > SIZE_MAX / size)
        gs_out_of_memory(SIZE_MAX);
    void *p = calloc(nmemb ? nmemb : 1, size ? size : 1);
    if (!p)
        gs_out_of_memory(nmemb * size);
    return p;
}

void *gs_xrealloc(void *p, size_t size)
{
    void *q = realloc(p, size ? size : 1);
    if (!q)
        gs_out_of_memory(size);
    return q;
}

void *gs_xreallocarray(void *p, size_t nmemb, size_t size)
{
    if (size && nmemb > SIZE_MAX / size)
        gs_out_of_memory(SIZE_MAX);
    return gs_xrealloc(p, nmemb * size);
}

char *gs_xstrdup(const char *s)
{
    size_t n = strlen(s) + 1;
    return memcpy(gs_xmalloc(n), s, n);
}

char *gs_xstrndup(const char *s, size_t n)
{
    size_t len = strnlen(s, n);
    char *copy = gs_xmalloc(len + 1);
    memcpy(copy, s, len);
    copy[len] = '\0';
    return copy;
}

int gs_write_all(int fd, const void *buf, size_t n)
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
