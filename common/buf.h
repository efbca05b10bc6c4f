/* common/buf.h: a growable byte buffer, always NUL-terminated, in the manner of git's strbuf.
 *
 * `struct gs_buf b = GS_BUF_INIT;` is a valid empty buffer. Allocation failure aborts the process:
 * gpusync cannot do anything useful without memory, and checking every append would hide the logic.
 */
#ifndef GS_BUF_H
#define GS_BUF_H

#include <stdarg.h>
#include <stddef.h>

struct gs_buf {
    char *data; /* NUL-terminated; never NULL after gs_buf_grow or any append */
    size_t len;
    size_t cap;
};

#define GS_BUF_INIT                                                                                \
    {                                                                                              \
        NULL, 0, 0                                                                                 \
    }

void gs_buf_init(struct gs_buf *b);
/* Frees the contents; the buffer is empty and reusable afterwards. */
void gs_buf_release(struct gs_buf *b);
/* Ensures room for `extra` more bytes plus the terminating NUL. */
void gs_buf_grow(struct gs_buf *b, size_t extra);
void gs_buf_reset(struct gs_buf *b);
void gs_buf_add(struct gs_buf *b, const void *data, size_t len);
void gs_buf_adds(struct gs_buf *b, const char *s);
void gs_buf_addc(struct gs_buf *b, char c);
void gs_buf_addf(struct gs_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void gs_buf_vaddf(struct gs_buf *b, const char *fmt, va_list ap);
/* Removes the first `n` bytes (all of them if n >= len). */
void gs_buf_consume(struct gs_buf *b, size_t n);
/* Hands the storage to the caller ("you now own it") and leaves `b` empty. Never NULL. */
char *gs_buf_detach(struct gs_buf *b, size_t *len);

#endif
