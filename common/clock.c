/* common/clock.c: clock readings (see clock.h). */
#include "common/clock.h"

#include <time.h>

static int64_t read_us(clockid_t id)
{
    struct timespec ts;
    clock_gettime(id, &ts);
    return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

int64_t gs_clock_mono_us(void)
{
    return read_us(CLOCK_MONOTONIC);
}

int64_t gs_clock_mono_ms(void)
{
    return read_us(CLOCK_MONOTONIC) / 1000;
}

int64_t gs_clock_wall_ms(void)
{
    return read_us(CLOCK_REALTIME) / 1000;
}

int64_t gs_time_ns(int64_t sec, long nsec)
{
    const int64_t ns_per_s = 1000000000;
    if (sec > (INT64_MAX - nsec) / ns_per_s)
        return INT64_MAX;
    if (sec < (INT64_MIN + ns_per_s) / ns_per_s)
        return INT64_MIN;
    return sec * ns_per_s + nsec;
}

int64_t gs_time_sec(int64_t ns, long *nsec)
{
    int64_t sec = ns / 1000000000, rest = ns % 1000000000;
    if (rest < 0) { /* C's division rounds toward zero */
        sec--;
        rest += 1000000000;
    }
    if (nsec)
        *nsec = (long)rest;
    return sec;
}
