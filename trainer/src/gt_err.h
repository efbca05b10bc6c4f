/* gt_err.h: the trainer's one error convention. Library functions return -1 (or NULL) and fill a
 * gt_err with a message that names the file, rank or peer involved; only main.c prints it. */
#ifndef GT_ERR_H
#define GT_ERR_H

#include <stdarg.h>
#include <stdio.h>

typedef struct gt_err {
    char msg[512];
} gt_err;

/* Formats the message into err (when non-NULL) and returns -1, so callers write
 * `return gt_errf(err, "%s: truncated", path);`. */
static inline int gt_errf(gt_err *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static inline int gt_errf(gt_err *err, const char *fmt, ...)
{
    if (err) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err->msg, sizeof(err->msg), fmt, ap);
        va_end(ap);
    }
    return -1;
}

#endif
