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
    double wins[TB_MAX_BUCKETS], counts[TB_MAX_BUCKETS];
    double now = (double)now_ms;
    int i;

    if (!in || !tb__algo_args_ok(lim, cost, n, out, v)) {
        return TB_ERR;
    }
    tb__fold_init(v);
    for (i = 0; i < n; i++) {
        double cap = lim[i].capacity;
        double win = cap * 1000 / lim[i].rate_per_sec;
        double idx = floor(now / win);
        int64_t wait = 0;

        wins[i] = in[i].w;
        counts[i] = in[i].cur;
        if (!in[i].exists || idx > wins[i]) {
            wins[i] = idx;
            counts[i] = 0;
        }
        if (cost[i] > cap) {
            wait = -1;
        }
        else if (counts[i] + cost[i] > cap) {
            wait = (int64_t)ceil((wins[i] + 1) * win - now);
            if (wait < 1) {
                wait = 1;
            }
        }
        tb__fold_wait(v, i, wait);
    }
    tb__fold_room(v, lim, cost, counts, n);
    for (i = 0; i < n; i++) {
        if (v->allowed) {
            out[i].w = wins[i];
            out[i].cur = counts[i] + cost[i];
            out[i].prev = 0;
            out[i].exists = 1;
        }
        else {
            out[i] = in[i];
        }
    }
    return TB_OK;
}
