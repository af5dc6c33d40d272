/* tb_fwindow.c -- the fixed-window counter, pure.
 *
 * The C twin of algo/tb_fwindow.lua: the same double operations in the
 * same order, checked against it by tests/vectors/fixed_window.tsv. A
 * limit CAPACITY RATE allows CAPACITY per window of CAPACITY*1000/RATE ms;
 * windows are aligned to the epoch of the clock. The known edge: CAPACITY
 * at the end of one window and CAPACITY more at the start of the next, so
 * up to 2 * CAPACITY within one short interval around a boundary. A clock
 * that went backwards stays in the later, stored window. No clock, I/O or
 * allocation.
 */
#include <math.h>

#include "algo/tb_algo_int.h"

static int64_t fwindow_step(const tb_window_t *in, double cap, double cost,
                            double win, double now, tb_window_t *st,
                            double *used)
{
    double idx = floor(now / win);

    *st = *in;
    st->prev = 0;
    if (!in->exists || idx > in->w) {
        st->w = idx;
        st->cur = 0;
    }
    *used = st->cur;
    if (cost > cap) {
        return -1;
    }
    if (st->cur + cost > cap) {
        return tb__wait_ms((st->w + 1) * win - now);
    }
    return 0;
}

int tb_fwindow_take(const tb_window_t *in, const tb_limit_t *lim,
                    const double *cost, int n, int64_t now_ms,
                    tb_window_t *out, tb_verdict_t *v)
{
    return tb__window_take(fwindow_step,
                           &(tb__twin_args_t){ lim, cost, n, now_ms, 0, 0 },
                           in, out, v);
}

int64_t tb_fwindow_ttl_ms(const tb_window_t *st, const tb_limit_t *lim,
                          int64_t now_ms)
{
    return tb__window_ttl_ms(st, lim, now_ms, 1);
}
