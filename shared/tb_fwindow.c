/* tb_fwindow.c -- the fixed-window counter, pure.
 *
 * The C twin of shared/tb_fwindow.lua: the same double operations in the
 * same order, checked against it by tests/vectors/fixed_window.tsv. A
 * limit CAPACITY RATE allows CAPACITY per window of CAPACITY*1000/RATE ms;
 * windows are aligned to the epoch of the clock. The known edge: CAPACITY
 * at the end of one window and CAPACITY more at the start of the next, so
 * up to 2 * CAPACITY within one short interval around a boundary. A clock
 * that went backwards stays in the later, stored window. No clock, I/O or
 * allocation.
 */
#include <math.h>

#include "tb_algo_int.h"

int tb_fwindow_take(const tb_window_t *in, const tb_limit_t *lim,
                    const double *cost, int n, int64_t now_ms,
                    tb_window_t *out, tb_verdict_t *v)
{
    tb_window_t st[TB_MAX_BUCKETS];
    double counts[TB_MAX_BUCKETS];
    double now = (double)now_ms;
    int i;

    if (!in || !tb__algo_args_ok(lim, cost, n, out, v)) {
        return TB_ERR;
    }
    tb__fold_init(v);
    for (i = 0; i < n; i++) {
        double cap = lim[i].capacity;
        double win = tb__window_ms(&lim[i]);
        double idx = floor(now / win);
        int64_t wait = 0;

        st[i] = in[i];
        st[i].prev = 0;
        if (!in[i].exists || idx > in[i].w) {
            st[i].w = idx;
            st[i].cur = 0;
        }
        counts[i] = st[i].cur;
        if (cost[i] > cap) {
            wait = -1;
        }
        else if (counts[i] + cost[i] > cap) {
            wait = tb__wait_ms((st[i].w + 1) * win - now);
        }
        tb__fold_wait(v, i, wait);
    }
    tb__fold_room(v, lim, cost, counts, n);
    tb__window_store(in, st, cost, n, v, out);
    return TB_OK;
}
