/* cli/progress.h: a one-line progress bar on stderr (files, bytes, rate, ETA), redrawn at most ten
 * times a second and only when stderr is a terminal, so logs and pipes stay clean. */
#ifndef GS_PROGRESS_H
#define GS_PROGRESS_H

#include <stdint.h>

struct gs_progress {
    const char *label; /* drawn before the bar ("reading"); NULL: none. gs_progress_init clears */
    int64_t quiet_ms;  /* nothing drawn before this long after the start (init: 0) */
    int enabled;
    int64_t start_ms, last_draw_ms;
    uint64_t base_bytes; /* bytes already done when the rate began to be measured */
    int drawn;
};

/* The quiet_ms of a bar for reading the changed files: a push or status over a few saved files
 * does not flash one. */
#define GS_PROGRESS_READING_QUIET_MS 250

void gs_progress_init(struct gs_progress *p);
/* Measures the rate from now and `bytes_done` on: the work shown changed (another batch), or was
 * under way before we watched it. */
void gs_progress_restart(struct gs_progress *p, uint64_t bytes_done);
/* Redraws with `files_done` of `files_total` and `bytes_done` of `bytes_total`; the bar fills by
 * bytes when there are any, else by files. */
void gs_progress_update(struct gs_progress *p, uint64_t files_done, uint64_t files_total,
                        uint64_t bytes_done, uint64_t bytes_total);
/* Clears the line. */
void gs_progress_end(struct gs_progress *p);

/* Formats a byte count as "12.3 MB" into buf. */
const char *gs_format_bytes(uint64_t bytes, char buf[32]);

#endif
