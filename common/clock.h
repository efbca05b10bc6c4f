/* common/clock.h: monotonic and wall clocks in milliseconds, for timeouts, latency figures and
 * detecting a laptop suspend (the wall clock jumps while the monotonic one does not). */
#ifndef GS_CLOCK_H
#define GS_CLOCK_H

#include <stdint.h>

int64_t gs_clock_mono_ms(void);
int64_t gs_clock_mono_us(void);
int64_t gs_clock_wall_ms(void);

#endif
