/* common/error.c: formatting of error messages and the table from codes to names and exit codes. */
#include "common/error.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

struct error_info {
    const char *text;
    int exit_code;
};

static const struct error_info error_table[] = {
#define GS_X_INFO(name, exit, text) {text, exit},
    GS_ERROR_LIST(GS_X_INFO)
#undef GS_X_INFO
};

static const struct error_info *error_lookup(int code)
{
    int pos = code == 0 ? 0 : -code - GS_E_BASE;
    if (pos < 0 || pos >= GS_E__COUNT)
        return NULL;
    return &error_table[pos];
}

const char *gs_error_name(int code)
{
    const struct error_info *info = error_lookup(code);
    return info ? info->text : "unknown error";
}

int gs_error_exit_code(int code)
{
    const struct error_info *info = error_lookup(code);
    return info ? info->exit_code : 1;
}

void gs_error_clear(struct gs_error *err)
{
    if (err) {
        err->code = GS_E_OK;
        err->msg[0] = '\0';
    }
}

int gs_error_set(struct gs_error *err, int code, const char *fmt, ...)
{
    if (err) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err->msg, sizeof(err->msg), fmt, ap);
        va_end(ap);
        err->code = code;
    }
    return code;
}

int gs_error_errno(struct gs_error *err, int code, const char *fmt, ...)
{
    int saved = errno;
    if (err) {
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(err->msg, sizeof(err->msg), fmt, ap);
        va_end(ap);
        if (n >= 0 && (size_t)n < sizeof(err->msg))
            snprintf(err->msg + n, sizeof(err->msg) - n, ": %s", strerror(saved));
        err->code = code;
    }
    errno = saved;
    return code;
}

int gs_error_wrap(struct gs_error *err, const char *fmt, ...)
{
    if (!err)
        return GS_E_ERR;
    char old[GS_ERROR_MSG_MAX];
    memcpy(old, err->msg, sizeof(old));
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(err->msg, sizeof(err->msg), fmt, ap);
    va_end(ap);
    /* Append ": old" by hand: snprintf("%s: %s") cannot prove the result fits and -Werror objects.
     */
    size_t used = n < 0 ? 0 : (size_t)n < sizeof(err->msg) ? (size_t)n : sizeof(err->msg) - 1;
    size_t room = sizeof(err->msg) - used - 1;
    size_t olen = strnlen(old, sizeof(old) - 1);
    if (room >= 2) {
        memcpy(err->msg + used, ": ", 2);
        used += 2;
        room -= 2;
        memcpy(err->msg + used, old, olen < room ? olen : room);
        used += olen < room ? olen : room;
    }
    err->msg[used] = '\0';
    return err->code;
}
