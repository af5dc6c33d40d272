/* tb_clock.c -- the only reader of CLOCK_MONOTONIC.
 *
 * Everything else takes `now` as an argument or calls through
 * tb_clock_now_us, a function pointer that tests replace to move time
 * without sleeping (as redis's getMonotonicUs).
 */
#include <time.h>

#include "tb.h"

tb_monotime_us tb_clock_monotonic_us(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (tb_monotime_us)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

tb_monotime_us (*tb_clock_now_us)(void) = tb_clock_monotonic_us;
