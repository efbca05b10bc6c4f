/* cli/progress.c: the progress line (see progress.h). */
#include "cli/progress.h"

#include <stdio.h>
#include <unistd.h>

#include "common/clock.h"

const char *gs_format_bytes(uint64_t bytes, char buf[32])
{
    static const char *units[] = {"B", "KB", "MB", "GB", "TB"};
    double v = (double)bytes;
    int u = 0;
    while (v >= 1000 && u < 4) {
        v /= 1000;
        u++;
    }
    snprintf(buf, 32, u ? "%.1f %s" : "%.0f %s", v, units[u]);
    return buf;
}

void gs_progress_init(struct gs_progress *p)
{
    p->label = NULL;
    p->quiet_ms = 0;
    p->enabled = isatty(STDERR_FILENO);
    p->start_ms = gs_clock_mono_ms();
    p->last_draw_ms = 0;
    p->base_bytes = 0;
    p->drawn = 0;
}

void gs_progress_restart(struct gs_progress *p, uint64_t bytes_done)
{
    p->start_ms = gs_clock_mono_ms();
    p->base_bytes = bytes_done;
}

void gs_progress_update(struct gs_progress *p, uint64_t files_done, uint64_t files_total,
                        uint64_t bytes_done, uint64_t bytes_total)
{
    int64_t now = gs_clock_mono_ms();
    if (!p->enabled || (now - p->last_draw_ms < 100 && files_done < files_total) ||
        now - p->start_ms < p->quiet_ms)
        return;
    p->last_draw_ms = now;
    double secs = (double)(now - p->start_ms) / 1000.0;
    uint64_t moved = bytes_done > p->base_bytes ? bytes_done - p->base_bytes : 0;
    double rate = secs > 0 ? (double)moved / secs : 0;
    double eta =
        rate > 0 && bytes_total > bytes_done ? (double)(bytes_total - bytes_done) / rate : 0;
    /* by bytes where there are any to send: one large file fills the bar as it goes */
    uint64_t done = bytes_total ? bytes_done : files_done;
    uint64_t total = bytes_total ? bytes_total : files_total;
    int width = 24, fill = total ? (int)(width * (done < total ? done : total) / total) : width;
    char bar[32], a[32], b[32], r[32];
    for (int i = 0; i < width; i++)
        bar[i] = i < fill ? '=' : ' ';
    bar[width] = '\0';
    fprintf(stderr, "\r%s%s[%s] %llu/%llu  %s/%s  %s/s  ETA %.0fs \033[K", p->label ? p->label : "",
            p->label ? " " : "", bar, (unsigned long long)files_done,
            (unsigned long long)files_total, gs_format_bytes(bytes_done, a),
            gs_format_bytes(bytes_total, b), gs_format_bytes((uint64_t)rate, r), eta);
    p->drawn = 1;
}

void gs_progress_end(struct gs_progress *p)
{
    if (p->drawn)
        fputs("\r\033[K", stderr);
    p->drawn = 0;
}
