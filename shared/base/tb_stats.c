/* tb_stats.c -- decision and Redis counters that may live in shared memory.
 *
 * Plain uint64_t fields updated with atomic adds, so a tb_stats_t can sit
 * in memory shared by all children of a server (the module does this) and
 * never goes backwards between two reads, whichever process reads it.
 */
#include "base/tb_base.h"

const int64_t tb_lat_bounds_us[TB_LAT_BUCKETS - 1] = {
    100, 250, 500, 1000, 2500, 5000, 10000, 25000, 50000, 100000, 250000
};

void tb_stats_add(uint64_t *counter, uint64_t n)
{
    __atomic_fetch_add(counter, n, __ATOMIC_RELAXED);
}

uint64_t tb_stats_get(const uint64_t *counter)
{
    return __atomic_load_n(counter, __ATOMIC_RELAXED);
}

void tb_stats_latency(tb_stats_t *s, int64_t us)
{
    int i = 0;

    if (us < 0) {
        us = 0;
    }
    while (i < TB_LAT_BUCKETS - 1 && us > tb_lat_bounds_us[i]) {
        i++;
    }
    tb_stats_add(&s->lat_count[i], 1);
    tb_stats_add(&s->lat_sum_us, (uint64_t)us);
}
