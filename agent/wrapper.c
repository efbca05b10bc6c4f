/* wrapper: allocation that aborts with one message on failure, and write-until-done (see
 * wrapper.h). The only place in the agent that decides what running out of memory does. */
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
