/* common/log.h: diagnostic logging to stderr (a background daemon's stderr is its log file).
 *
 * Logging is for people debugging gpusync, not for results: library code reports failures through
 * return codes and struct gs_error. Verbosity comes from GPUSYNC_LOG=error|warn|info|debug (default
 * warn) or gs_log_set_level. */
#ifndef GS_LOG_H
#define GS_LOG_H

#include <stdio.h>

enum gs_log_level { GS_LOG_ERROR, GS_LOG_WARN, GS_LOG_INFO, GS_LOG_DEBUG };

void gs_log_set_level(enum gs_log_level level);
/* Sends log lines to `fp` (not owned) instead of stderr; NULL restores stderr. */
int gs_log_enabled(enum gs_log_level level);
void gs_log(enum gs_log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#define gs_debug(...) gs_log(GS_LOG_DEBUG, __VA_ARGS__)
#define gs_info(...)  gs_log(GS_LOG_INFO, __VA_ARGS__)
#define gs_warn(...)  gs_log(GS_LOG_WARN, __VA_ARGS__)

#endif
