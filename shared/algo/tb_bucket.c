/* tb_bucket.c -- the token-bucket arithmetic, pure.
 *
 * State, limits and the time come in; a decision and the new state go out.
 * No clock, no I/O, no allocation: the local fallback table calls it, and
 * the unit tests drive it with any time they like. It is the C twin of
 * tb_bucket.lua and must perform the same double operations in the
 * same order, so that the two agree to the last bit on every vector in
 * tests/vectors/token_bucket.tsv (decisions), lease.tsv (leases and the
 * tokens they give back) and token_bucket_settle.tsv (settlements, which
 * may leave a bucket in debt down to -capacity).
 */
#include <math.h>
#include <stdio.h>

#include "algo/tb_algo_int.h"

int tb_limit_check(const tb_limit_t *l, char *err, size_t errlen)
{
    const char *why = NULL;

    if (!l) {
        why = "no limit";
    }
    else if (!(l->capacity >= 1.0) || l->capacity > TB_MAX_CAPACITY) {
        why = "capacity must be 1..1e9 tokens";
    }
    else if (!(l->rate_per_sec >= 1e-6) || l->rate_per_sec > 1e9) {
        why = "rate must be 1e-6..1e9 tokens per second";
    }
    else if (l->capacity / l->rate_per_sec * 1000 > TB_MAX_FILL_MS) {
        why = "capacity / rate is too long a refill (over 1e15 ms)";
    }
    if (why && err && errlen) {
        snprintf(err, errlen, "%s", why);
    }
    return why ? TB_ERR : TB_OK;
}

static int limit_valid(const tb_limit_t *l, double cost)
{
    return tb_limit_check(l, NULL, 0) == TB_OK && cost >= 0.0
           && cost <= TB_MAX_CAPACITY;
}

/* Refill one bucket to now_ms. A clock that went backwards refills nothing
 * and keeps the later stamp, so the interval is never credited twice; the
 * elapsed time is capped at the time to fill so the product stays exact.
 * A bucket in debt (tokens below 0 after a settlement) takes its debt
 * longer to fill. */
static void refill(const tb_bucket_t *in, const tb_limit_t *l,
                   int64_t now_ms, tb_bucket_t *out)
{
    double cap = l->capacity;
    double rate = l->rate_per_sec;
    double tokens = in->exists ? in->tokens : cap;
    int64_t ts = in->exists ? in->ts_ms : now_ms;
    double elapsed = (double)now_ms - (double)ts;
    double fill_ms = cap / rate * 1000;

    if (tokens < 0) {
        fill_ms = (cap - tokens) / rate * 1000;
    }
    if (elapsed < 0) {
        elapsed = 0;
    }
    else {
        ts = now_ms;
    }
    if (elapsed >= fill_ms) {
        tokens = cap;
    }
    else {
        tokens = tokens + elapsed * rate / 1000;
        if (tokens > cap) {
            tokens = cap;
        }
    }
    out->tokens = tokens;
    out->ts_ms = ts;
    out->exists = 1;
}

/* The steps of tb_bucket.lua over a->n buckets: a->settle selects its
 * 'settle' mode, where the cost is the difference to settle and every
 * bucket keeps its new level, within -capacity .. capacity; a->hold
 * selects its 'rules' mode's buckets that are checked, not charged.
 * TB_ERR for bad arguments of that mode. */
int tb__bucket_run(const tb__twin_args_t *a, const tb_bucket_t *in,
                   tb_bucket_t *out, tb_verdict_t *v)
{
    const tb_limit_t *lim = a->lim;
    const double *cost = a->cost;
    int i;

    if (!tb__mode_args_ok(a, in, out, v)) {
        return TB_ERR;
    }
    tb__fold_init(v);
    for (i = 0; i < a->n; i++) {
        double cap = lim[i].capacity;
        int64_t wait = 0;

        refill(&in[i], &lim[i], a->now_ms, &out[i]);
        if (a->settle) {
            out[i].tokens = out[i].tokens - cost[i];
            if (out[i].tokens > cap) {
                out[i].tokens = cap;
            }
            if (out[i].tokens < -cap) {
                out[i].tokens = -cap;
            }
            if (out[i].tokens < 0) {
                wait = (int64_t)ceil(-out[i].tokens * 1000
                                     / lim[i].rate_per_sec);
            }
        }
        else if (cost[i] > cap) {
            wait = -1;
        }
        else if (out[i].tokens < cost[i]) {
            wait = (int64_t)ceil((cost[i] - out[i].tokens) * 1000
                                 / lim[i].rate_per_sec);
        }
        /* The largest wait decides; "never" beats any wait. */
        tb__fold_wait(v, i, wait);
    }
    for (i = 0; i < a->n; i++) {
        if (v->allowed && !a->settle && !(a->hold & (1u << i))) {
            out[i].tokens = out[i].tokens - cost[i];
        }
        tb__fold_left(v, i, out[i].tokens);
    }
    return TB_OK;
}

int tb_bucket_take(const tb_bucket_t *in, const tb_limit_t *lim,
                   const double *cost, int n, int64_t now_ms,
                   tb_bucket_t *out, tb_verdict_t *v)
{
    return tb__bucket_run(&(tb__twin_args_t){ lim, cost, n, now_ms, 0, 0 },
                      in, out, v);
}

/* The same steps as tb_bucket_take() for one bucket, then the lease of
 * tb_bucket.lua's optional last argument: floor(tokens), capped at want,
 * raised to cost, deducted instead of cost. */
int tb_bucket_lease(const tb_bucket_t *in, const tb_limit_t *lim,
                    tb_bucket_grant_t *g, int64_t now_ms, tb_bucket_t *out,
                    tb_verdict_t *v)
{
    double grant = 0;
    int64_t wait = 0;

    if (!in || !lim || !out || !v || !g || !limit_valid(lim, g->cost)
        || !(g->want >= g->cost) || g->want > TB_MAX_CAPACITY) {
        return TB_ERR;
    }
    refill(in, lim, now_ms, out);
    if (g->cost > lim->capacity) {
        wait = -1;
    }
    else if (out->tokens < g->cost) {
        wait = (int64_t)ceil((g->cost - out->tokens) * 1000
                             / lim->rate_per_sec);
    }
    if (wait == 0) {
        grant = floor(out->tokens);
        if (grant > g->want) {
            grant = g->want;
        }
        if (grant < g->cost) {
            grant = g->cost;
        }
        out->tokens = out->tokens - grant;
    }
    v->allowed = wait == 0;
    v->remaining = out->tokens < 0 ? 0 : (int64_t)floor(out->tokens);
    v->retry_ms = wait;
    v->binding = 0;
    g->granted = (int64_t)grant;
    return TB_OK;
}

int tb_bucket_give_back(const tb_bucket_t *in, const tb_limit_t *lim,
                        double back, int64_t now_ms, tb_bucket_t *out)
{
    if (!in || !out || !limit_valid(lim, 0) || !(back >= 0)
        || back > TB_MAX_CAPACITY) {
        return TB_ERR;
    }
    refill(in, lim, now_ms, out);
    if (back > 0) {
        out->tokens = out->tokens + back;
        if (out->tokens > lim->capacity) {
            out->tokens = lim->capacity;
        }
    }
    return TB_OK;
}

int tb_bucket_settle(const tb_bucket_t *in, const tb_limit_t *lim,
                     const double *delta, int n, int64_t now_ms,
                     tb_bucket_t *out, tb_verdict_t *v)
{
    return tb__bucket_run(&(tb__twin_args_t){ lim, delta, n, now_ms, 1, 0 },
                      in, out, v);
}

int64_t tb_bucket_ttl_ms(const tb_limit_t *lim)
{
    return (int64_t)ceil(lim->capacity / lim->rate_per_sec * 1000) + 1000;
}

int64_t tb_bucket_refill_ttl_ms(const tb_limit_t *lim, double tokens)
{
    return (int64_t)ceil((lim->capacity - tokens) / lim->rate_per_sec * 1000)
           + 1000;
}
