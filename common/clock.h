/* common/clock.h: monotonic and wall clocks in milliseconds, for timeouts, latency figures and
 * detecting a laptop suspend (the wall clock jumps while the monotonic one does not); and file
 * times as nanoseconds. */
#ifndef GS_CLOCK_H
#define GS_CLOCK_H

#include <stdint.h>

int64_t gs_clock_mono_ms(void);
int64_t gs_clock_mono_us(void);
int64_t gs_clock_wall_ms(void);

/* A time of `sec` seconds and `nsec` nanoseconds since the epoch as nanoseconds, the form the
 * index and the plan keep file times in. 64 bits of nanoseconds reach from 1677-09-21 to
 * 2262-04-11: a time outside is the nearest end (a file dated 2300 is 2262-04-11T23:47:16.85 on
 * the server), never a wrapped one (which put such a file in 1901, and made every check find it
 * changed there). */
int64_t gs_time_ns(int64_t sec, long nsec);

/* The inverse: the whole seconds of a time of `ns` nanoseconds, rounded down (0.5 s before the
 * epoch is second -1), with the nanoseconds past them (0 to 999,999,999) in *nsec unless NULL. */
int64_t gs_time_sec(int64_t ns, long *nsec);

#endif
