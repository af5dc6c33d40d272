/* tb_clock.c -- the monotonic clock: the only reader of CLOCK_MONOTONIC,
 * the deadlines every bounded wait is measured against, and condition
 * variables that wait on the same clock.
 *
 * Everything else takes `now` as an argument or calls through
 * tb_clock_now_us, a function pointer that tests replace to move time
 * without sleeping (as redis's getMonotonicUs). Deadlines are always on
 * the real clock (tb_clock_monotonic_us): a test that moves
 * tb_clock_now_us must not turn a socket's 50 ms into an hour.
 */
#include <time.h>

#include "base/tb_base.h"

tb_monotime_us tb_clock_monotonic_us(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (tb_monotime_us)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

tb_monotime_us (*tb_clock_now_us)(void) = tb_clock_monotonic_us;

tb_monotime_us tb__deadline_ms(int ms)
{
    return tb_clock_monotonic_us() + (tb_monotime_us)ms * 1000;
}

struct timespec tb__timespec_at(tb_monotime_us t)
{
    struct timespec ts;

    ts.tv_sec = (time_t)(t / 1000000);
    ts.tv_nsec = (long)(t % 1000000) * 1000L;
    return ts;
}

void tb__cond_init(pthread_cond_t *cv)
{
    pthread_condattr_t ca;

    /* Wait against the monotonic clock: a wall-clock step must not turn
     * a 50 ms wait into minutes. */
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(cv, &ca);
    pthread_condattr_destroy(&ca);
}
