/* common/buf.c: growable byte buffer (see buf.h). */
#include "common/buf.h"
#include "common/wrapper.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static char empty_string[1];

void gs_buf_init(struct gs_buf *b)
{
    b->data = NULL;
    b->len = 0;
    b->cap = 0;
}

void gs_buf_release(struct gs_buf *b)
{
    free(b->data);
    gs_buf_init(b);
}

void gs_buf_grow(struct gs_buf *b, size_t extra)
{
    size_t need = b->len + extra + 1;
    if (need <= b->cap)
        return;
    GS_ALLOC_GROW(b->data, need, b->cap);
    b->data[b->len] = '\0'; /* a buffer that had no storage now holds "" */
}

void gs_buf_reset(struct gs_buf *b)
{
    b->len = 0;
    if (b->data)
        b->data[0] = '\0';
}

void gs_buf_add(struct gs_buf *b, const void *data, size_t len)
{
    gs_buf_grow(b, len);
    if (len) /* data may be NULL then (an empty buffer's), which memcpy may not be given */
        memcpy(b->data + b->len, data, len);
    b->len += len;
    b->data[b->len] = '\0';
}

void gs_buf_adds(struct gs_buf *b, const char *s)
{
    gs_buf_add(b, s, strlen(s));
}

void gs_buf_addc(struct gs_buf *b, char c)
{
    gs_buf_add(b, &c, 1);
}

void gs_buf_vaddf(struct gs_buf *b, const char *fmt, va_list ap)
{
    va_list copy;
    va_copy(copy, ap);
    int n = vsnprintf(NULL, 0, fmt, copy);
    va_end(copy);
    if (n < 0)
        return;
    gs_buf_grow(b, (size_t)n);
    vsnprintf(b->data + b->len, (size_t)n + 1, fmt, ap);
    b->len += (size_t)n;
}

void gs_buf_addf(struct gs_buf *b, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    gs_buf_vaddf(b, fmt, ap);
    va_end(ap);
}

void gs_buf_consume(struct gs_buf *b, size_t n)
{
    if (n >= b->len) {
        gs_buf_reset(b);
        return;
    }
    memmove(b->data, b->data + n, b->len - n);
    b->len -= n;
    b->data[b->len] = '\0';
}

char *gs_buf_detach(struct gs_buf *b, size_t *len)
{
    if (!b->data)
        gs_buf_grow(b, 0);
    char *p = b->data;
    if (len)
        *len = b->len;
    gs_buf_init(b);
    return p ? p : empty_string;
}
