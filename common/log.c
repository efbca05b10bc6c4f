/* common/log.c: leveled diagnostic logging with timestamps (see log.h). */
#include "common/log.h"

#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static int log_level = -1;

static int level_from_env(void)
{
    const char *s = getenv("GPUSYNC_LOG");
    static const char *names[] = {"error", "warn", "info", "debug"};
    for (int i = 0; s && i < 4; i++)
        if (strcmp(s, names[i]) == 0)
            return i;
    return GS_LOG_WARN;
}

void gs_log_set_level(enum gs_log_level level)
{
    log_level = (int)level;
}

int gs_log_enabled(enum gs_log_level level)
{
    if (log_level < 0)
        log_level = level_from_env();
    return (int)level <= log_level;
}

void gs_log(enum gs_log_level level, const char *fmt, ...)
{
    static const char *tags[] = {"error", "warning", "info", "debug"};
    if (!gs_log_enabled(level))
        return;
    FILE *out = stderr;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    struct tm tm;
    localtime_r(&ts.tv_sec, &tm);
    fprintf(out, "%02d:%02d:%02d.%03ld gpusync %s: ", tm.tm_hour, tm.tm_min, tm.tm_sec,
            ts.tv_nsec / 1000000, tags[level]);
    va_list ap;
    va_start(ap, fmt);
    vfprintf(out, fmt, ap);
    va_end(ap);
    fputc('\n', out);
    fflush(out);
}
