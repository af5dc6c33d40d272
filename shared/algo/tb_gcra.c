/* tb_gcra.c -- GCRA (generic cell rate algorithm) arithmetic, pure.
 *
 * The C twin of tb_gcra.lua: the same double operations in the same
 * order, so both agree to the last bit on tests/vectors/gcra.tsv. The
 * state is one number, the theoretical arrival time (TAT) in ms. With a
 * limit CAPACITY RATE the emission interval is T = 1000 / RATE ms and the
 * burst tolerance CAPACITY requests: a request of cost k passes when
 * max(TAT - now, 0) + k * T <= CAPACITY * T (+ EPS_MS, the slack that
 * absorbs the rounding of a stored TAT near today's clock). No clock, I/O
 * or allocation. A settlement (tb_gcra_settle) moves the TAT by the
 * difference between what requests really cost and what they were
 * charged, and may leave it up to 2 * CAPACITY * T ahead: a debt that
 * later requests wait out.
 */
#include <math.h>

#include "algo/tb_algo_int.h"

#define EPS_MS 0.001

/* The steps of tb_gcra.lua: a->settle selects its 'settle' mode, where
 * the cost is the difference to settle and the new TAT is always stored.
 * ttl_ms, when not NULL, receives each bucket's PX (tb_gcra_ttl_ms).
 * TB_ERR for bad arguments of that mode. */
static int gcra_run(const tb__twin_args_t *a, const tb_gcra_t *in,
                    tb_gcra_t *out, tb_verdict_t *v, int64_t *ttl_ms)
{
    const tb_limit_t *lim = a->lim;
    const double *cost = a->cost;
    int n = a->n, settle = a->settle;
    double debt[TB_MAX_BUCKETS], after[TB_MAX_BUCKETS];
    double now = (double)a->now_ms;
    int i;

    if (!tb__mode_args_ok(a, in, out, v)) {
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
        if (settle) {
            /* Never behind now (a full bucket), never a debt beyond one
             * capacity. */
            if (after[i] < 0) {
                after[i] = 0;
            }
            if (after[i] > 2 * limit) {
                after[i] = 2 * limit;
            }
        }
        if (cost[i] > lim[i].capacity && !settle) {
            wait = -1;
        }
        else if (after[i] > limit + EPS_MS) {
            wait = tb__wait_ms(after[i] - limit - EPS_MS);
        }
        tb__fold_wait(v, i, wait);
    }
    for (i = 0; i < n; i++) {
        double interval = 1000 / lim[i].rate_per_sec;
        double limit = lim[i].capacity * interval;
        double used = v->allowed || settle ? after[i] : debt[i];

        tb__fold_left(v, i, (limit - used + EPS_MS) / interval);
    }
    for (i = 0; i < n; i++) {
        if (ttl_ms) {
            ttl_ms[i] = (int64_t)ceil(after[i]) + 1000;
        }
        /* On refusal the script writes nothing: out keeps the input. */
        if (v->allowed || settle) {
            out[i].tat_ms = now + after[i];
            out[i].exists = 1;
        }
        else {
            out[i] = in[i];
        }
    }
    return TB_OK;
}

int tb_gcra_take(const tb_gcra_t *in, const tb_limit_t *lim,
                 const double *cost, int n, int64_t now_ms, tb_gcra_t *out,
                 tb_verdict_t *v)
{
    return gcra_run(&(tb__twin_args_t){ lim, cost, n, now_ms, 0, 0 },
                    in, out, v, NULL);
}

int tb_gcra_settle(const tb_gcra_t *in, const tb_limit_t *lim,
                   const double *delta, int n, int64_t now_ms,
                   tb_gcra_t *out, tb_verdict_t *v)
{
    return gcra_run(&(tb__twin_args_t){ lim, delta, n, now_ms, 1, 0 },
                    in, out, v, NULL);
}

int tb_gcra_ttl_ms(const tb_gcra_t *in, const tb_limit_t *lim,
                   const double *cost, int n, int64_t now_ms, int settle,
                   int64_t *ttl_ms)
{
    tb__twin_args_t a = { lim, cost, n, now_ms, settle, 0 };
    tb_gcra_t out[TB_MAX_BUCKETS];
    tb_verdict_t v;

    if (!ttl_ms || n < 1 || n > TB_MAX_BUCKETS) {
        return TB_ERR;
    }
    return gcra_run(&a, in, out, &v, ttl_ms);
}
