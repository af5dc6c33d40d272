/* tb_swindow.c -- the sliding-window counter, pure.
 *
 * The C twin of shared/tb_swindow.lua: the same double operations in the
 * same order, checked against it by tests/vectors/sliding_window.tsv. It
 * keeps the cost spent in the current epoch-aligned window (cur) and in
 * the previous one (prev), and estimates the count over the last
 * W = CAPACITY*1000/RATE ms as prev * (W - (now - w*W)) / W + cur: an
 * approximation that assumes the previous window's requests were spread
 * evenly (its error against the exact log is measured by the tests). No
 * clock, I/O or allocation.
 */
#include <math.h>

#include "tb_algo_int.h"

int tb_swindow_take(const tb_window_t *in, const tb_limit_t *lim,
                    const double *cost, int n, int64_t now_ms,
                    tb_window_t *out, tb_verdict_t *v)
{
    tb_window_t st[TB_MAX_BUCKETS];
    double ests[TB_MAX_BUCKETS];
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
        double into;
        int64_t wait = 0;

        st[i] = in[i];
        if (!in[i].exists || idx > in[i].w + 1) {
            st[i].w = idx;
            st[i].cur = 0;
            st[i].prev = 0;
        }
        else if (idx == in[i].w + 1) {
            st[i].w = idx;
            st[i].prev = in[i].cur;
            st[i].cur = 0;
        }
        /* A clock that went backwards stays at the start of the stored
         * window, where the previous window weighs the most. */
        into = now - st[i].w * win;
        if (into < 0) {
            into = 0;
        }
        ests[i] = st[i].prev * ((win - into) / win) + st[i].cur;
        if (cost[i] > cap) {
            wait = -1;
        }
        else if (ests[i] + cost[i] > cap) {
            double at;

            if (st[i].cur + cost[i] <= cap) {
                at = st[i].w * win
                     + win * (1 - (cap - st[i].cur - cost[i]) / st[i].prev);
            }
            else {
                at = (st[i].w + 1) * win
                     + win * (1 - (cap - cost[i]) / st[i].cur);
            }
            wait = tb__wait_ms(at - now);
        }
        tb__fold_wait(v, i, wait);
    }
    tb__fold_room(v, lim, cost, ests, n);
    tb__window_store(in, st, cost, n, v, out);
    return TB_OK;
}
