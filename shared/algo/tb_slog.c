/* tb_slog.c -- the sliding log, pure.
 *
 * The C twin of tb_slog.lua, checked against it by
 * tests/vectors/sliding_log.tsv. The log holds the time of every admitted
 * unit of cost in the last W = CAPACITY*1000/RATE ms, so the decision is
 * exact: a request passes when the entries newer than now - W plus its cost
 * fit within CAPACITY. The caller owns the storage (at least CAPACITY
 * slots); this is the one twin whose work is not O(1) but O(CAPACITY). No
 * clock, I/O or allocation.
 *
 * A host that keeps the log in a store of its own, as tb_slog.lua keeps it
 * in a sorted set (tbucket_redis.so), decides with the three steps
 * tb_slog_take() is made of: drop the entries at or before
 * tb_slog_cut_ms(), count the rest, read the one entry tb_slog_need()
 * names, and let tb_slog_decide() fold the verdict.
 */
#include <math.h>
#include <string.h>

#include "algo/tb_algo_int.h"

/* Drop the entries at or before now - win (ZREMRANGEBYSCORE -inf cut). */
static void trim(tb_slog_t *l, double cut)
{
    size_t k = 0;

    while (k < l->len && (double)l->ts_ms[k] <= cut) {
        k++;
    }
    if (k > 0) {
        memmove(l->ts_ms, l->ts_ms + k, (l->len - k) * sizeof(int64_t));
        l->len -= k;
    }
}

/* Insert `count` entries at now, keeping the order (after equal times). */
static void append(tb_slog_t *l, int64_t now_ms, size_t count)
{
    size_t pos = l->len, j;

    while (pos > 0 && l->ts_ms[pos - 1] > now_ms) {
        pos--;
    }
    memmove(l->ts_ms + pos + count, l->ts_ms + pos,
            (l->len - pos) * sizeof(int64_t));
    for (j = 0; j < count; j++) {
        l->ts_ms[pos + j] = now_ms;
    }
    l->len += count;
}

double tb_slog_cut_ms(const tb_limit_t *lim, int64_t now_ms)
{
    return (double)now_ms - tb__window_ms(lim);
}

int64_t tb_slog_need(const tb_limit_t *lim, double cost, double count)
{
    if (cost > lim->capacity || !(count + cost > lim->capacity)) {
        return -1;
    }
    /* The d-th oldest entry, d = ceil(count + cost - capacity): 1 <= d
     * <= count, as cost <= capacity. */
    return (int64_t)ceil(count + cost - lim->capacity) - 1;
}

int tb_slog_decide(const tb_slog_count_t *c, const tb_limit_t *lim,
                   const double *cost, int n, int64_t now_ms,
                   tb_verdict_t *v)
{
    double counts[TB_MAX_BUCKETS];
    double now = (double)now_ms;
    int i;

    if (!c || !tb__algo_args_ok(lim, cost, n, c, v)) {
        return TB_ERR;
    }
    for (i = 0; i < n; i++) {
        if (cost[i] != floor(cost[i]) || !(c[i].count >= 0)) {
            return TB_ERR;
        }
    }
    tb__fold_init(v);
    for (i = 0; i < n; i++) {
        double cap = lim[i].capacity;
        int64_t wait = 0;

        counts[i] = c[i].count;
        if (cost[i] > cap) {
            wait = -1;
        }
        else if (counts[i] + cost[i] > cap) {
            /* Wait until the entry tb_slog_need() named leaves the
             * window. */
            wait = tb__wait_ms(c[i].nth_ms + tb__window_ms(&lim[i]) - now);
        }
        tb__fold_wait(v, i, wait);
    }
    tb__fold_room(v, lim, cost, counts, n);
    return TB_OK;
}

int64_t tb_slog_ttl_ms(const tb_limit_t *lim)
{
    return (int64_t)ceil(tb__window_ms(lim)) + 1000;
}

int tb_slog_take(tb_slog_t *logs, const tb_limit_t *lim, const double *cost,
                 int n, int64_t now_ms, tb_verdict_t *v)
{
    tb_slog_count_t c[TB_MAX_BUCKETS];
    int i;

    if (!logs || !tb__algo_args_ok(lim, cost, n, logs, v)) {
        return TB_ERR;
    }
    for (i = 0; i < n; i++) {
        if (cost[i] != floor(cost[i]) || !logs[i].ts_ms
            || logs[i].len > logs[i].slots
            || (double)logs[i].slots < lim[i].capacity) {
            return TB_ERR;
        }
    }
    for (i = 0; i < n; i++) {
        int64_t k;

        trim(&logs[i], tb_slog_cut_ms(&lim[i], now_ms));
        c[i].count = (double)logs[i].len;
        k = tb_slog_need(&lim[i], cost[i], c[i].count);
        c[i].nth_ms = k >= 0 ? (double)logs[i].ts_ms[k] : 0;
    }
    if (tb_slog_decide(c, lim, cost, n, now_ms, v) != TB_OK) {
        return TB_ERR;
    }
    if (v->allowed) {
        for (i = 0; i < n; i++) {
            if (logs[i].len + (size_t)cost[i] > logs[i].slots) {
                /* Cannot happen: len + cost <= capacity <= slots. */
                return TB_ERR;
            }
            append(&logs[i], now_ms, (size_t)cost[i]);
        }
    }
    return TB_OK;
}
