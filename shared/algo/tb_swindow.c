/* tb_swindow.c -- the sliding-window counter, pure.
 *
 * The C twin of algo/tb_swindow.lua: the same double operations in the
 * same order, checked against it by tests/vectors/sliding_window.tsv. It
 * keeps the cost spent in the current epoch-aligned window (cur) and in
 * the previous one (prev), and estimates the count over the last
 * W = CAPACITY*1000/RATE ms as prev * (W - (now - w*W)) / W + cur: an
 * approximation that assumes the previous window's requests were spread
 * evenly (its error against the exact log is measured by the tests). No
 * clock, I/O or allocation.
 */
#include <math.h>

#include "algo/tb_algo_int.h"

static int64_t swindow_step(const tb_window_t *in, double cap, double cost,
                            double win, double now, tb_window_t *st,
                            double *used)
{
    double idx = floor(now / win);
    double into, at;

    *st = *in;
    if (!in->exists || idx > in->w + 1) {
        st->w = idx;
        st->cur = 0;
        st->prev = 0;
    }
    else if (idx == in->w + 1) {
        st->w = idx;
        st->prev = in->cur;
        st->cur = 0;
    }
    /* A clock that went backwards stays at the start of the stored
     * window, where the previous window weighs the most. */
    into = now - st->w * win;
    if (into < 0) {
        into = 0;
    }
    *used = st->prev * ((win - into) / win) + st->cur;
    if (cost > cap) {
        return -1;
    }
    if (*used + cost > cap) {
        if (st->cur + cost <= cap) {
            at = st->w * win + win * (1 - (cap - st->cur - cost) / st->prev);
        }
        else {
            at = (st->w + 1) * win + win * (1 - (cap - cost) / st->cur);
        }
        return tb__wait_ms(at - now);
    }
    return 0;
}

int tb_swindow_take(const tb_window_t *in, const tb_limit_t *lim,
                    const double *cost, int n, int64_t now_ms,
                    tb_window_t *out, tb_verdict_t *v)
{
    return tb__window_take(swindow_step,
                           &(tb__twin_args_t){ lim, cost, n, now_ms, 0, 0 },
                           in, out, v);
}

int64_t tb_swindow_ttl_ms(const tb_window_t *st, const tb_limit_t *lim,
                          int64_t now_ms)
{
    return tb__window_ttl_ms(st, lim, now_ms, 2);
}
