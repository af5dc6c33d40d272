/* tb_algo_int.h -- the algorithms' side of the core that hosts never
 * call: the embedded Lua scripts and their C twins (tb_bucket.c,
 * tb_gcra.c, tb_fwindow.c, tb_swindow.c, tb_slog.c), and the fold the
 * twins share. Internal: the library, its unit tests and the Redis module
 * (redismod/, which runs the twins inside Redis) include it; hosts
 * include tb.h only.
 *
 * algo/ is pure: no clock, I/O or allocation, and no call to anything of
 * libtb outside algo/ but base/ (docs/hacking.md, "Layers";
 * algo/README.md).
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

/* ---- The embedded scripts (generated into tb_script.c) ------------ */

/* The script text of an algorithm and its SHA-1 (40 hex digits), made at
 * build time from shared/algo/tb_*.lua (each after tb_prelude.lua); NULL
 * for an unknown algorithm. */
const char *tb_algo_script_source(tb_algo_t a);
const char *tb_algo_script_sha1(tb_algo_t a);
/* The Redis module's command for each script (redismod/), in tb_algo_t
 * order: the same keys, arguments and reply. */
extern const char *const tb_algo_module_commands[TB_ALGO_COUNT];

/* ---- The C twins of the scripts ------------------------------------ */

/* A lease call's amounts (tb_bucket_lease): the request's cost, the most
 * tokens it may take (want >= cost), and what the call granted. */
typedef struct tb_bucket_grant {
    double cost;
    double want;
    int64_t granted;  /* Out: tokens deducted, cost included; 0 when
                       * refused.                                    */
} tb_bucket_grant_t;

/* tb_bucket_take() (tb.h) for one bucket that also grants a lease, the C
 * twin of tb_bucket.lua called with its optional last argument `want`.
 * When allowed (tokens >= g->cost after the refill), min(floor(tokens),
 * g->want), raised to g->cost if below it, is deducted instead of the
 * cost and returned in g->granted (0 when refused); v->remaining is the
 * floor of what is left. With whole cost and want, the grant is whole and
 * cost <= granted <= tokens. TB_ERR for bad arguments as tb_bucket_take,
 * or want < cost. */
int tb_bucket_lease(const tb_bucket_t *in, const tb_limit_t *lim,
                    tb_bucket_grant_t *g, int64_t now_ms, tb_bucket_t *out,
                    tb_verdict_t *v);

/* The first step of tb_bucket.lua's lease call with its argument `back`:
 * refill to now_ms, then add back (unspent tokens of an expired lease)
 * up to the capacity. tb_bucket_lease() on the result is the rest of the
 * call (its own refill then adds nothing). TB_ERR for a bad limit or
 * back outside 0..TB_MAX_CAPACITY. */
int tb_bucket_give_back(const tb_bucket_t *in, const tb_limit_t *lim,
                        double back, int64_t now_ms, tb_bucket_t *out);

/* Settlement, the C twin of tb_bucket.lua's 'settle' mode: refill each
 * bucket to now_ms, deduct delta[i] (what requests really cost less what
 * they were charged; negative gives tokens back), keep the result within
 * -capacity .. capacity. out[] always receives the new states (the
 * script always writes them, with the TTL tb_bucket_refill_ttl_ms).
 * v->allowed is 0 when a bucket is left in debt (below 0 tokens), and
 * v->retry_ms is then the largest time until one is out of it;
 * v->remaining is the smallest floor of what is left (0 in debt). TB_ERR
 * for bad arguments (as tb__settle_args_ok). */
int tb_bucket_settle(const tb_bucket_t *in, const tb_limit_t *lim,
                     const double *delta, int n, int64_t now_ms,
                     tb_bucket_t *out, tb_verdict_t *v);

/* The TTL the scripts give a bucket holding `tokens` when that may be a
 * debt (a settlement, a refused call that gave tokens back): the time to
 * refill to capacity, ceil((capacity - tokens) / rate * 1000) ms, plus a
 * second. */
int64_t tb_bucket_refill_ttl_ms(const tb_limit_t *lim, double tokens);

/* The pure C twins: no clock, I/O or allocation; same arguments, checks
 * and verdict as tb_bucket_take() (out may alias in; out receives what
 * the script stores: on refusal a copy of in, as the script writes
 * nothing). Each performs the double operations of its Lua script in the
 * same order. */

/* GCRA state: the theoretical arrival time in ms (exists == 0: no key). */
typedef struct tb_gcra {
    double tat_ms;
    int exists;
} tb_gcra_t;

int tb_gcra_take(const tb_gcra_t *in, const tb_limit_t *lim,
                 const double *cost, int n, int64_t now_ms, tb_gcra_t *out,
                 tb_verdict_t *v);

/* Settlement, the C twin of tb_gcra.lua's 'settle' mode: each TAT moves
 * by delta[i] emission intervals, never behind now_ms nor more than
 * 2 * capacity intervals ahead, and out[] always receives it. The verdict
 * is as tb_bucket_settle()'s. */
int tb_gcra_settle(const tb_gcra_t *in, const tb_limit_t *lim,
                   const double *delta, int n, int64_t now_ms,
                   tb_gcra_t *out, tb_verdict_t *v);

/* The PX tb_gcra.lua sets with each TAT it stores: ceil(after) + 1000 ms,
 * where after is the debt the call leaves (the TAT less now, before the
 * rounding of their sum, so it cannot be had back from the stored TAT).
 * ttl_ms[i] for each of the n buckets, by the operations of
 * tb_gcra_take() (settle 0) or tb_gcra_settle() (settle 1) on the same
 * arguments; the call stores TATs when it allows, or settles. TB_ERR for
 * bad arguments as those. */
int tb_gcra_ttl_ms(const tb_gcra_t *in, const tb_limit_t *lim,
                   const double *cost, int n, int64_t now_ms, int settle,
                   int64_t *ttl_ms);

/* Window state: window number (floor(now_ms / window_ms)), cost spent in
 * it (cur) and in the one before (prev, sliding window only). */
typedef struct tb_window {
    double w;
    double cur;
    double prev;
    int exists;
} tb_window_t;

int tb_fwindow_take(const tb_window_t *in, const tb_limit_t *lim,
                    const double *cost, int n, int64_t now_ms,
                    tb_window_t *out, tb_verdict_t *v);
int tb_swindow_take(const tb_window_t *in, const tb_limit_t *lim,
                    const double *cost, int n, int64_t now_ms,
                    tb_window_t *out, tb_verdict_t *v);

/* The PEXPIRE the window scripts set when they store window st at now_ms:
 * ceil((w + 1) * W - now) + 1000 ms for the fixed window, whose count
 * lasts to the end of window w; ceil((w + 2) * W - now) + 1000 for the
 * sliding one, whose count weighs into the next window too. */
int64_t tb_fwindow_ttl_ms(const tb_window_t *st, const tb_limit_t *lim,
                          int64_t now_ms);
int64_t tb_swindow_ttl_ms(const tb_window_t *st, const tb_limit_t *lim,
                          int64_t now_ms);

/* Sliding-log state: the times (ms) of admitted units, ascending, in
 * caller storage of `slots` entries (slots >= capacity). Updated in place:
 * expired entries are always trimmed, cost entries are appended when
 * allowed. TB_ERR also for a fractional cost or too few slots. */
typedef struct tb_slog {
    int64_t *ts_ms;
    size_t len;
    size_t slots;
} tb_slog_t;

int tb_slog_take(tb_slog_t *logs, const tb_limit_t *lim, const double *cost,
                 int n, int64_t now_ms, tb_verdict_t *v);

/* The steps of tb_slog_take() for a log kept in a store of the host's
 * (tb_slog.lua's sorted set; tbucket_redis.so). Per bucket the host drops
 * the entries at or before tb_slog_cut_ms() (now - W: ZREMRANGEBYSCORE
 * -inf cut), counts the rest, and reads the time of the entry
 * tb_slog_need() names, if any: an index, 0-based from the oldest (ZRANGE
 * k k WITHSCORES), or -1 when none is needed (the cost fits, or exceeds
 * the capacity). tb_slog_decide() folds the verdict of n buckets from
 * that, with tb_slog_take()'s checks; when it allows, the host appends
 * cost entries at now_ms to each log and gives it tb_slog_ttl_ms()
 * (ceil(W) + 1000 ms). */
typedef struct tb_slog_count {
    double count;  /* Entries left after the trim.                     */
    double nth_ms; /* The time of entry tb_slog_need(), when it named
                    * one (a sorted set's score: a double).           */
} tb_slog_count_t;

double tb_slog_cut_ms(const tb_limit_t *lim, int64_t now_ms);
int64_t tb_slog_need(const tb_limit_t *lim, double cost, double count);
int tb_slog_decide(const tb_slog_count_t *c, const tb_limit_t *lim,
                   const double *cost, int n, int64_t now_ms,
                   tb_verdict_t *v);
int64_t tb_slog_ttl_ms(const tb_limit_t *lim);

/* ---- What the twins share ----------------------------------------- */

/* The arguments of one twin call, as tb_bucket_take() takes them: n
 * buckets' limits and costs at now_ms; with settle, a settlement (the
 * script's 'settle' mode: cost holds the differences to settle). The
 * twins' public functions fill it and hand it to their steps. */
typedef struct tb__twin_args {
    const tb_limit_t *lim;
    const double *cost;
    int n;
    int64_t now_ms;
    int settle;
    unsigned hold;        /* Token bucket, 'rules' mode: bit i set when
                           * bucket i must hold its cost but is not
                           * charged (TBucketRule count=).           */
} tb__twin_args_t;

/* tb_bucket_take() with all of a's arguments: tb_bucket.lua's 'rules'
 * mode when a->hold is not 0 (bans are the caller's: they need the key's
 * fields and TTL). On refusal out[i] holds bucket i refilled, so bucket i
 * refused when its cost fits its capacity but not out[i].tokens. */
int tb__bucket_run(const tb__twin_args_t *a, const tb_bucket_t *in,
                   tb_bucket_t *out, tb_verdict_t *v);

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

/* Arguments of a settlement: limits as tb__algo_args_ok, and each delta
 * (real cost - cost charged) finite within +-TB_MAX_CAPACITY. */
static inline int tb__settle_args_ok(const tb_limit_t *lim,
                                     const double *delta, int n,
                                     const void *out, const tb_verdict_t *v)
{
    int i;

    if (n < 1 || n > TB_MAX_BUCKETS || !lim || !delta || !out || !v) {
        return 0;
    }
    for (i = 0; i < n; i++) {
        if (tb_limit_check(&lim[i], NULL, 0) != TB_OK
            || !(delta[i] >= -TB_MAX_CAPACITY)
            || !(delta[i] <= TB_MAX_CAPACITY)) {
            return 0;
        }
    }
    return 1;
}

/* The window of a limit in ms, the time its rate takes to refill its
 * capacity: capacity * 1000 / rate, in the window scripts' order. */
static inline double tb__window_ms(const tb_limit_t *lim)
{
    return lim->capacity * 1000 / lim->rate_per_sec;
}

/* A wait of ms milliseconds as every script rounds it: up to a whole ms,
 * and at least 1 (a refusal never says "now"). */
static inline int64_t tb__wait_ms(double ms)
{
    int64_t wait = (int64_t)ceil(ms);

    return wait < 1 ? 1 : wait;
}

/* The arguments of a twin's call in either mode: a state in, and those of
 * a take (tb__algo_args_ok) or, with a->settle, of a settlement. */
static inline int tb__mode_args_ok(const tb__twin_args_t *a, const void *in,
                                   const void *out, const tb_verdict_t *v)
{
    if (!in) {
        return 0;
    }
    return a->settle ? tb__settle_args_ok(a->lim, a->cost, a->n, out, v)
                     : tb__algo_args_ok(a->lim, a->cost, a->n, out, v);
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

/* One bucket's step of a window counter's script: from the stored window
 * *in (exists or not), the bucket's capacity, the request's cost, the
 * window length win (ms) and now (ms), set *st to the current window (what
 * is stored, cost not yet added, if the request is allowed) and *used to
 * the cost it counts; return the bucket's wait (0 fits, -1 never, else
 * ms). */
typedef int64_t tb__window_step_t(const tb_window_t *in, double cap,
                                  double cost, double win, double now,
                                  tb_window_t *st, double *used);

/* A window counter's take (tb_fwindow_take, tb_swindow_take) by its
 * step: step each bucket, fold the waits and the room left, and store,
 * when allowed, each current window with its cost added to cur; on
 * refusal nothing, so out keeps in. */
static inline int tb__window_take(tb__window_step_t *step,
                                  const tb__twin_args_t *a,
                                  const tb_window_t *in, tb_window_t *out,
                                  tb_verdict_t *v)
{
    tb_window_t st[TB_MAX_BUCKETS];
    double used[TB_MAX_BUCKETS];
    int i;

    if (!in || !tb__algo_args_ok(a->lim, a->cost, a->n, out, v)) {
        return TB_ERR;
    }
    tb__fold_init(v);
    for (i = 0; i < a->n; i++) {
        tb__fold_wait(v, i, step(&in[i], a->lim[i].capacity, a->cost[i],
                                 tb__window_ms(&a->lim[i]),
                                 (double)a->now_ms, &st[i], &used[i]));
    }
    tb__fold_room(v, a->lim, a->cost, used, a->n);
    for (i = 0; i < a->n; i++) {
        if (v->allowed) {
            out[i] = st[i];
            out[i].cur = st[i].cur + a->cost[i];
            out[i].exists = 1;
        }
        else {
            out[i] = in[i];
        }
    }
    return TB_OK;
}

/* The PEXPIRE a window script sets when it stores window st at now_ms:
 * ceil((w + ahead) * W - now) + 1000 ms, ahead being the windows the
 * count still weighs in (1 fixed, 2 sliding). */
static inline int64_t tb__window_ttl_ms(const tb_window_t *st,
                                        const tb_limit_t *lim,
                                        int64_t now_ms, double ahead)
{
    return (int64_t)ceil((st->w + ahead) * tb__window_ms(lim)
                         - (double)now_ms)
           + 1000;
}

#endif /* TB_ALGO_INT_H */
