/* tb_algo_int.h -- helpers shared by the C twins of the algorithm scripts
 * (tb_gcra.c, tb_fwindow.c, tb_swindow.c, tb_slog.c). Internal.
 *
 * Every script folds its buckets into one verdict the same way as
 * tb_bucket.lua: the largest wait decides (-1, "never", beats any wait),
 * and remaining is the smallest floor of what is left. These helpers are
 * that fold, written once, in the scripts' operation order.
 */
#ifndef TB_ALGO_INT_H
#define TB_ALGO_INT_H

#include <math.h>

#include "tb.h"

/* Arguments every twin checks, as tb_bucket_take() does. */
static inline int tb__algo_args_ok(const tb_limit_t *lim, const double *cost,
                                   int n, const void *out,
                                   const tb_verdict_t *v)
{
    int i;

    if (n < 1 || n > TB_MAX_BUCKETS || !lim || !cost || !out || !v) {
        return 0;
    }
    for (i = 0; i < n; i++) {
        if (tb_limit_check(&lim[i], NULL, 0) != TB_OK || !(cost[i] >= 0.0)
            || cost[i] > TB_MAX_CAPACITY) {
            return 0;
        }
    }
    return 1;
}

/* Start a verdict: allowed, nothing remaining yet. */
static inline void tb__fold_init(tb_verdict_t *v)
{
    v->allowed = 1;
    v->remaining = -1;
    v->retry_ms = 0;
    v->binding = 0;
}

/* Fold bucket i's wait (0 fits, -1 never, else ms) into the verdict. */
static inline void tb__fold_wait(tb_verdict_t *v, int i, int64_t wait)
{
    if (wait != 0) {
        if (v->allowed
            || (v->retry_ms != -1 && (wait == -1 || wait > v->retry_ms))) {
            v->retry_ms = wait;
            v->binding = i;
        }
        v->allowed = 0;
    }
}

/* Fold bucket i's room left (after the deduction when allowed). */
static inline void tb__fold_left(tb_verdict_t *v, int i, double left)
{
    int64_t whole;

    if (left < 0) {
        left = 0;
    }
    whole = (int64_t)floor(left);
    if (v->remaining < 0 || whole < v->remaining) {
        v->remaining = whole;
        if (v->allowed) {
            v->binding = i;
        }
    }
}

/* Fold the room left in every window-style bucket: capacity - used[i],
 * less the cost when the request is allowed. */
static inline void tb__fold_room(tb_verdict_t *v, const tb_limit_t *lim,
                                 const double *cost, const double *used,
                                 int n)
{
    int i;

    for (i = 0; i < n; i++) {
        double left = lim[i].capacity - used[i];

        if (v->allowed) {
            left = left - cost[i];
        }
        tb__fold_left(v, i, left);
    }
}

#endif /* TB_ALGO_INT_H */
