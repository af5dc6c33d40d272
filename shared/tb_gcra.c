/* tb_gcra.c -- GCRA (generic cell rate algorithm) arithmetic, pure.
 *
 * The C twin of shared/tb_gcra.lua: the same double operations in the same
 * order, so both agree to the last bit on tests/vectors/gcra.tsv. The
 * state is one number, the theoretical arrival time (TAT) in ms. With a
 * limit CAPACITY RATE the emission interval is T = 1000 / RATE ms and the
 * burst tolerance CAPACITY requests: a request of cost k passes when
 * max(TAT - now, 0) + k * T <= CAPACITY * T (+ EPS_MS, the slack that
 * absorbs the rounding of a stored TAT near today's clock). No clock, I/O
 * or allocation.
 */
#include <math.h>

#include "tb_algo_int.h"

#define EPS_MS 0.001

int tb_gcra_take(const tb_gcra_t *in, const tb_limit_t *lim,
                 const double *cost, int n, int64_t now_ms, tb_gcra_t *out,
                 tb_verdict_t *v)
{
    double debt[TB_MAX_BUCKETS], after[TB_MAX_BUCKETS];
    double now = (double)now_ms;
    int i;

    if (!in || !tb__algo_args_ok(lim, cost, n, out, v)) {
        return TB_ERR;
    }
    tb__fold_init(v);
    for (i = 0; i < n; i++) {
        double interval = 1000 / lim[i].rate_per_sec;
        double limit = lim[i].capacity * interval;
        int64_t wait = 0;

        /* A TAT in the past is no debt; a clock that went backwards keeps
         * the whole (larger) debt, so nothing is credited twice. */
        debt[i] = 0;
        if (in[i].exists && in[i].tat_ms > now) {
            debt[i] = in[i].tat_ms - now;
        }
        after[i] = debt[i] + cost[i] * interval;
        if (cost[i] > lim[i].capacity) {
            wait = -1;
        }
        else if (after[i] > limit + EPS_MS) {
            wait = (int64_t)ceil(after[i] - limit - EPS_MS);
            if (wait < 1) {
                wait = 1;
            }
        }
        tb__fold_wait(v, i, wait);
    }
    for (i = 0; i < n; i++) {
        double interval = 1000 / lim[i].rate_per_sec;
        double limit = lim[i].capacity * interval;
        double used = v->allowed ? after[i] : debt[i];

        tb__fold_left(v, i, (limit - used + EPS_MS) / interval);
    }
    for (i = 0; i < n; i++) {
        /* On refusal the script writes nothing: out keeps the input. */
        if (v->allowed) {
            out[i].tat_ms = now + after[i];
            out[i].exists = 1;
        }
        else {
            out[i] = in[i];
        }
    }
    return TB_OK;
}
