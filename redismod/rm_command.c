/* rm_command.c -- a tbucket.* command's arguments, stored state and
 * decision, without Redis.
 *
 * The arguments are the scripts' own (shared/algo/tb_prelude.lua): numkeys
 * as EVAL reads it, KEYS the buckets and the optional slot set, ARGV the
 * clock, capacity, rate and cost per bucket, the token bucket's 'settle'
 * or lease size and give-back, GCRA's 'settle', and 'conc' N ttl id.
 * Numbers are read as Lua's tonumber() reads them and written as Redis
 * writes a Lua number ("%.17g"), so both engines store the same bytes.
 * The decision is one call of a C twin; a full slot set is folded in
 * first, as the prelude folds it before any bucket, which needs a second,
 * zero-cost run of the twin when the buckets alone would have allowed
 * (the remaining count is then that of nothing deducted).
 */
#include <ctype.h>
#include <stdarg.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rm_command.h"

/* Decoded numbers larger than this (2^54) come from a hand-written key:
 * the scripts never store them, and the twins' waits and TTLs stay
 * within int64 only below it. */
#define STORED_MAX 18014398509481984.0
/* The farthest window start (ms, 2^62) the twins' waits and TTLs reach
 * without leaving int64. */
#define WINDOW_MAX 4611686018427387904.0

/* The names the client calls (algo/tb_algo.c), so the two cannot drift. */
const char *rm_command_name(tb_algo_t algo)
{
    return (unsigned)algo < TB_ALGO_COUNT ? tb_algo_module_commands[algo]
                                          : "tbucket";
}

/* ---- Numbers ------------------------------------------------------------ */

int rm_lua_number(const char *p, size_t len, double *out)
{
    char buf[512], *end;
    size_t i = 0, digits = 0;
    int neg = 0;
    double v;

    if (!p || len == 0 || len >= sizeof(buf) || memchr(p, '\0', len)) {
        return 0;
    }
    /* Whole numbers of up to 15 digits, the common case, are exact in a
     * double: the value strtod() would give, without its cost. */
    if (p[0] == '-') {
        neg = 1;
        i = 1;
    }
    if (len - i >= 1 && len - i <= 15) {
        uint64_t u = 0;

        for (; i < len && p[i] >= '0' && p[i] <= '9'; i++) {
            u = u * 10 + (uint64_t)(p[i] - '0');
            digits++;
        }
        if (i == len && digits) {
            *out = neg ? -(double)u : (double)u;
            return 1;
        }
    }
    /* Lua 5.1's luaO_str2d(): strtod, a hexadecimal retry, then only
     * white space may follow. */
    memcpy(buf, p, len);
    buf[len] = '\0';
    v = tb_strtod_c(buf, &end);
    if (end == buf) {
        return 0;
    }
    if (*end == 'x' || *end == 'X') {
        v = (double)strtoul(buf, &end, 16);
    }
    while (isspace((unsigned char)*end)) {
        end++;
    }
    if (*end != '\0') {
        return 0;
    }
    *out = v;
    return 1;
}

/* A stored field as a finite number within STORED_MAX, or 0. */
static int stored_number(const rm_arg_t *a, double *v)
{
    return a && a->p && rm_lua_number(a->p, a->len, v) && isfinite(*v)
           && fabs(*v) <= STORED_MAX;
}

/* ---- Stored state ------------------------------------------------------- */

void rm_decode_bucket(const rm_arg_t *tokens,
                           const rm_arg_t *ts, tb_bucket_t *b)
{
    double t, s;

    memset(b, 0, sizeof(*b));
    /* Tokens below -TB_MAX_CAPACITY are no debt a settlement leaves
     * (it stops at -capacity), and would take the waits past int64. */
    if (stored_number(tokens, &t) && stored_number(ts, &s)
        && t >= -TB_MAX_CAPACITY && s == floor(s)
        && fabs(s) <= RM_MAX_CLOCK_MS) {
        b->tokens = t;
        b->ts_ms = (int64_t)s;
        b->exists = 1;
    }
}

double rm_decode_ban(const rm_arg_t *ban)
{
    double v;

    return stored_number(ban, &v) ? v : -1;
}

void rm_decode_gcra(const rm_arg_t *tat, tb_gcra_t *g)
{
    double t;

    memset(g, 0, sizeof(*g));
    if (stored_number(tat, &t)) {
        g->tat_ms = t;
        g->exists = 1;
    }
}

void rm_decode_window(const rm_arg_t *w, const rm_arg_t *cur,
                           const rm_arg_t *prev, tb_window_t *st)
{
    double a, b, c = 0;

    memset(st, 0, sizeof(*st));
    if (stored_number(w, &a) && stored_number(cur, &b)
        && (!prev || stored_number(prev, &c))) {
        st->w = a;
        st->cur = b;
        st->prev = c;
        st->exists = 1;
    }
}

/* ---- Arguments ---------------------------------------------------------- */

static int arg_is(const rm_arg_t *a, const char *s)
{
    size_t n = strlen(s);

    return a->len == n && memcmp(a->p, s, n) == 0;
}

/* A whole number as Redis's string2ll() reads it (EVAL's numkeys): an
 * optional '-', no leading zero, no white space, at most 18 digits. */
static int strict_ll(const rm_arg_t *a, long long *v)
{
    size_t i = 0;
    long long u = 0;

    if (a->len == 1 && a->p[0] == '0') {
        *v = 0;
        return 1;
    }
    if (a->len > 0 && a->p[0] == '-') {
        i = 1;
    }
    if (a->len - i < 1 || a->len - i > 18 || a->p[i] < '1' || a->p[i] > '9') {
        return 0;
    }
    for (; i < a->len; i++) {
        if (a->p[i] < '0' || a->p[i] > '9') {
            return 0;
        }
        u = u * 10 + (a->p[i] - '0');
    }
    *v = a->p[0] == '-' ? -u : u;
    return 1;
}

int rm_numkeys(int argc, const rm_arg_t *argv)
{
    long long v;

    if (argc < 2 || !strict_ll(&argv[1], &v) || v < 0 || v > argc - 2) {
        return -1;
    }
    return (int)v;
}

/* A finite number argument, or 0 with err set. */
static int number_arg(const rm_arg_t *a, double *v)
{
    return rm_lua_number(a->p, a->len, v) && isfinite(*v);
}

/* "ERR NAME: " and the message fmt makes, into err; TB_ERR, for the
 * parsers to return. */
static int fail(char *err, size_t errlen, const char *name,
                const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static int fail(char *err, size_t errlen, const char *name,
                const char *fmt, ...)
{
    size_t n;
    va_list ap;

    snprintf(err, errlen, "ERR %s: ", name);
    n = strlen(err);
    va_start(ap, fmt);
    vsnprintf(err + n, errlen - n, fmt, ap);
    va_end(ap);
    return TB_ERR;
}

/* numkeys as EVAL checks it, with EVAL's messages. */
static int parse_numkeys(int argc, const rm_arg_t *argv, int *numkeys,
                         char *err, size_t errlen)
{
    long long v;

    if (!strict_ll(&argv[1], &v)) {
        snprintf(err, errlen, "ERR value is not an integer or out of range");
        return TB_ERR;
    }
    if (v < 0) {
        snprintf(err, errlen, "ERR Number of keys can't be negative");
        return TB_ERR;
    }
    if (v > argc - 2) {
        snprintf(err, errlen,
                 "ERR Number of keys can't be greater than number of args");
        return TB_ERR;
    }
    *numkeys = (int)v;
    return TB_OK;
}

/* The clock, ARGV[1]: "" for Redis's, or whole ms within +-2^53. */
static int parse_clock(const char *name, const rm_arg_t *a,
                       rm_call_t *c, char *err, size_t errlen)
{
    double v;

    if (a->len == 0) {
        return TB_OK;
    }
    if (!number_arg(a, &v) || v != floor(v)
        || fabs(v) > RM_MAX_CLOCK_MS) {
        return fail(err, errlen, name,
                    "ARGV[1] must be empty (Redis's clock) or whole ms");
    }
    c->has_now = 1;
    c->now_ms = (int64_t)v;
    return TB_OK;
}

/* Capacity, rate and cost of every bucket, checked as the twins check
 * them (tb_limit_check, the cost range of the mode). */
static int parse_buckets(const char *name, const rm_arg_t *a,
                         rm_call_t *c, char *err, size_t errlen)
{
    static const char *const what[3] = { "capacity", "rate", "cost" };
    char why[128];
    int i, k;

    for (i = 0; i < c->n; i++) {
        double v[3];

        for (k = 0; k < 3; k++) {
            if (!number_arg(&a[1 + 3 * i + k], &v[k])) {
                return fail(err, errlen, name,
                            "bucket %d: the %s is not a finite number", i,
                            what[k]);
            }
        }
        c->lim[i].capacity = v[0];
        c->lim[i].rate_per_sec = v[1];
        c->cost[i] = v[2];
        if (tb_limit_check(&c->lim[i], why, sizeof(why)) != TB_OK) {
            return fail(err, errlen, name, "bucket %d: %s", i, why);
        }
        if (c->settle ? !(fabs(v[2]) <= TB_MAX_CAPACITY)
                      : !(v[2] >= 0 && v[2] <= TB_MAX_CAPACITY)) {
            return fail(err, errlen, name, "bucket %d: the %s must be %s", i,
                        c->settle ? "difference to settle" : "cost",
                        c->settle ? "within -1e9 .. 1e9" : "0 .. 1e9");
        }
        if (c->algo == TB_ALGO_SLIDING_LOG
            && (v[2] != floor(v[2])
                || c->lim[i].capacity > TB_SLOG_MAX_CAPACITY)) {
            return fail(err, errlen, name,
                        "bucket %d: the sliding log takes whole costs and a "
                        "capacity of at most 100000", i);
        }
    }
    return TB_OK;
}

/* 'rules': two per bucket, held ("1" or "0") and the ban in whole ms;
 * the script fails (ERR bad rules) on a count or a ban it cannot use. */
static int parse_rules(const char *name, const rm_arg_t *a, int extra,
                       rm_call_t *c, char *err, size_t errlen)
{
    int i;

    if (extra != 2 * c->n) {
        snprintf(err, errlen, "ERR bad rules");
        return TB_ERR;
    }
    for (i = 0; i < c->n; i++) {
        double ban;

        if (!arg_is(&a[2 * i], "0") && !arg_is(&a[2 * i], "1")) {
            return fail(err, errlen, name, "bucket %d: held is 0 or 1", i);
        }
        if (!number_arg(&a[2 * i + 1], &ban) || !(ban >= 0)) {
            snprintf(err, errlen, "ERR bad rules");
            return TB_ERR;
        }
        if (ban != floor(ban) || ban > (double)TB_MAX_BAN_MS) {
            return fail(err, errlen, name,
                        "bucket %d: a ban is whole ms, 0 .. %lld", i,
                        (long long)TB_MAX_BAN_MS);
        }
        c->hold |= arg_is(&a[2 * i], "1") ? 1u << i : 0;
        c->ban_ms[i] = ban;
    }
    c->rules = 1;
    return TB_OK;
}

/* The optional arguments after the buckets: `extra` of them at a[0..].
 * 'settle' (token bucket, GCRA); the token bucket's lease size and what
 * it gives back. The script ignores arguments past those; we refuse
 * them. */
static int parse_mode(const char *name, const rm_arg_t *a, int extra,
                      rm_call_t *c, char *err, size_t errlen)
{
    int settle_ok = c->algo == TB_ALGO_TOKEN_BUCKET
                    || c->algo == TB_ALGO_GCRA;

    if (extra == 0) {
        return TB_OK;
    }
    if (settle_ok && arg_is(&a[0], "settle")) {
        if (extra > 1) {
            return fail(err, errlen, name,
                        "nothing may follow 'settle' but the concurrency "
                        "arguments");
        }
        c->settle = 1;
        return TB_OK;
    }
    if (c->algo != TB_ALGO_TOKEN_BUCKET) {
        return fail(err, errlen, name,
                    "%d argument(s) after the buckets' (it takes %s)", extra,
                    settle_ok ? "'settle' or nothing" : "nothing");
    }
    if (arg_is(&a[0], "rules")) {
        return parse_rules(name, a + 1, extra - 1, c, err, errlen);
    }
    /* The lease: refused with the script's own message. */
    if (extra > 2 || c->n != 1 || !number_arg(&a[0], &c->want)
        || (extra == 2 && !number_arg(&a[1], &c->back)) || !(c->back >= 0)
        || c->back > TB_MAX_CAPACITY || c->want > TB_MAX_CAPACITY) {
        snprintf(err, errlen, "ERR bad lease");
        return TB_ERR;
    }
    c->lease = 1;
    return TB_OK;
}

/* 'conc' N ttl id, the last four arguments. */
static int parse_conc(const char *name, const rm_arg_t *a,
                      rm_call_t *c, char *err, size_t errlen)
{
    double ttl;

    if (!number_arg(&a[1], &c->conc_limit)) {
        return fail(err, errlen, name,
                    "the concurrency limit is not a finite number");
    }
    if (!number_arg(&a[2], &ttl) || ttl != floor(ttl) || ttl < 1
        || ttl > TB_MAX_CONCURRENCY_TTL_MS) {
        return fail(err, errlen, name,
                    "a slot's ttl must be whole ms, 1 .. 86400000");
    }
    if (a[3].len > RM_MAX_SLOT_ID) {
        return fail(err, errlen, name,
                    "a slot id is at most %d bytes", RM_MAX_SLOT_ID);
    }
    c->conc = 1;
    c->conc_ttl_ms = (int64_t)ttl;
    c->slot_id = a[3];
    return TB_OK;
}

int rm_parse(tb_algo_t algo, int argc, const rm_arg_t *argv,
                  rm_call_t *c, char *err, size_t errlen)
{
    const char *name = rm_command_name(algo);
    const rm_arg_t *a;
    int nargv, extra;

    memset(c, 0, sizeof(*c));
    c->algo = algo;
    if ((unsigned)algo >= TB_ALGO_COUNT || argc < 2) {
        return fail(err, errlen, name, "wrong number of arguments");
    }
    if (argc > RM_MAX_ARGS) {
        return fail(err, errlen, name, "at most %d arguments", RM_MAX_ARGS);
    }
    if (parse_numkeys(argc, argv, &c->numkeys, err, errlen) != TB_OK) {
        return TB_ERR;
    }
    if (c->numkeys > RM_MAX_KEYS) {
        return fail(err, errlen, name,
                    "at most %d keys: %d buckets and a slot set", RM_MAX_KEYS,
                    TB_MAX_BUCKETS);
    }
    a = argv + 2 + c->numkeys;
    nargv = argc - 2 - c->numkeys;
    if (nargv < 1) {
        return fail(err, errlen, name,
                    "ARGV[1], the clock, is missing (\"\" for Redis's)");
    }
    c->n = c->numkeys;
    /* The prelude's test, to the letter: 'conc' fourth from the end. */
    if (nargv >= 5 && arg_is(&a[nargv - 4], "conc")) {
        if (parse_conc(name, a + nargv - 4, c, err, errlen) != TB_OK) {
            return TB_ERR;
        }
        nargv -= 4;
        c->n = c->numkeys - 1;
        if (c->n < 0) {
            return fail(err, errlen, name,
                        "'conc' needs the slot set as the last key");
        }
    }
    if (c->n > TB_MAX_BUCKETS) {
        return fail(err, errlen, name, "at most %d buckets", TB_MAX_BUCKETS);
    }
    if (parse_clock(name, &a[0], c, err, errlen) != TB_OK) {
        return TB_ERR;
    }
    extra = nargv - (1 + 3 * c->n);
    if (extra < 0) {
        return fail(err, errlen, name,
                    "%d bucket(s) take %d arguments after the clock, not %d",
                    c->n, 3 * c->n, nargv - 1);
    }
    if (parse_mode(name, a + 1 + 3 * c->n, extra, c, err, errlen) != TB_OK
        || parse_buckets(name, a, c, err, errlen) != TB_OK) {
        return TB_ERR;
    }
    if (c->lease && !(c->want >= c->cost[0])) {
        snprintf(err, errlen, "ERR bad lease");
        return TB_ERR;
    }
    return TB_OK;
}

/* ---- The decision ------------------------------------------------------- */

/* What a twin runs on: the call, the states read, the clock and, for the
 * sliding log, the reader of its entries. */
typedef struct rm_input {
    const rm_call_t *c;
    const rm_state_t *in;
    int64_t now_ms;
    rm_nth_fn *nth;
    void *nth_ctx;
} rm_input_t;

/* Sliding log: counts and the entries the twin asks for, for costs cost. */
static int slog_run(const rm_input_t *x, const double *cost, tb_verdict_t *v)
{
    const rm_call_t *c = x->c;
    const rm_state_t *in = x->in;
    tb_slog_count_t cnt[TB_MAX_BUCKETS] = { { 0, 0 } };
    int i;

    for (i = 0; i < c->n; i++) {
        int64_t k = tb_slog_need(&c->lim[i], cost[i], in[i].count);

        cnt[i].count = in[i].count;
        cnt[i].nth_ms = 0;
        if (k >= 0) {
            double t = x->nth(x->nth_ctx, i, k);

            /* A score no script writes (another client's member) is held
             * within the range that keeps the wait an int64. */
            cnt[i].nth_ms = isfinite(t) ? fmax(-STORED_MAX,
                                               fmin(t, STORED_MAX))
                                        : (t > 0 ? STORED_MAX : -STORED_MAX);
        }
    }
    return tb_slog_decide(cnt, c->lim, cost, c->n, x->now_ms, v);
}

/* Windows: the window a key stores is read under the limit of the call,
 * which may not be the one it was stored with: a window of a far smaller
 * limit then lies far ahead, for the script too. Past |w * W| = 2^62 ms
 * the twin's waits would leave int64, so w is held there: still as far
 * beyond (or behind) any window of the clock, so every comparison the
 * script makes comes out the same, and the TTL of a write is past what
 * the script could set (tbucket_redis.c refuses it as the script fails). */
static void window_in(const rm_call_t *c, const rm_state_t *in,
                      tb_window_t *w)
{
    int i;

    for (i = 0; i < c->n; i++) {
        double far = floor(WINDOW_MAX / tb__window_ms(&c->lim[i]));

        w[i] = in[i].window;
        if (w[i].exists && fabs(w[i].w) > far) {
            w[i].w = copysign(far, w[i].w);
        }
    }
}

/* A settled bucket's TTL: the refill from its level, or what is left of
 * a ban when longer (a settlement never ends a ban early). */
static int64_t settle_ttl_ms(const tb_limit_t *lim, const tb_bucket_t *b,
                             const rm_state_t *in, int64_t now_ms)
{
    int64_t ttl = tb_bucket_refill_ttl_ms(lim, b->tokens);

    if (in->ban_until >= 0 && in->ban_until - (double)now_ms > (double)ttl) {
        ttl = (int64_t)(in->ban_until - (double)now_ms);
    }
    return ttl;
}

/* The twin of c's algorithm on costs `cost`: the verdict, and in o the new
 * states and their TTLs (not yet which are stored). */
static int run_twin(const rm_input_t *x, const double *cost,
                    tb_verdict_t *v, rm_outcome_t *o)
{
    const rm_call_t *c = x->c;
    const rm_state_t *in = x->in;
    int64_t now_ms = x->now_ms;
    tb_bucket_t b[TB_MAX_BUCKETS] = { { 0, 0, 0 } };
    tb_gcra_t g[TB_MAX_BUCKETS], gout[TB_MAX_BUCKETS];
    tb_window_t w[TB_MAX_BUCKETS], wout[TB_MAX_BUCKETS];
    int i, rc = TB_ERR, n = c->n;

    switch (c->algo) {
    case TB_ALGO_TOKEN_BUCKET:
        for (i = 0; i < n; i++) {
            b[i] = in[i].bucket;
        }
        rc = tb__bucket_run(&(tb__twin_args_t){ c->lim, cost, n, now_ms,
                                                c->settle, c->hold },
                            b, b, v);
        for (i = 0; i < n && rc == TB_OK; i++) {
            o->st[i].bucket = b[i];
            o->ttl_ms[i] = c->settle
                           ? settle_ttl_ms(&c->lim[i], &b[i], &in[i], now_ms)
                           : tb_bucket_ttl_ms(&c->lim[i]);
        }
        break;
    case TB_ALGO_GCRA:
        for (i = 0; i < n; i++) {
            g[i] = in[i].gcra;
        }
        rc = c->settle ? tb_gcra_settle(g, c->lim, cost, n, now_ms, gout, v)
                       : tb_gcra_take(g, c->lim, cost, n, now_ms, gout, v);
        if (rc == TB_OK) {
            rc = tb_gcra_ttl_ms(g, c->lim, cost, n, now_ms, c->settle,
                                o->ttl_ms);
        }
        for (i = 0; i < n && rc == TB_OK; i++) {
            o->st[i].gcra = gout[i];
        }
        break;
    case TB_ALGO_FIXED_WINDOW:
    case TB_ALGO_SLIDING_WINDOW:
        window_in(c, in, w);
        rc = c->algo == TB_ALGO_FIXED_WINDOW
             ? tb_fwindow_take(w, c->lim, cost, n, now_ms, wout, v)
             : tb_swindow_take(w, c->lim, cost, n, now_ms, wout, v);
        for (i = 0; i < n && rc == TB_OK; i++) {
            o->st[i].window = wout[i];
            o->ttl_ms[i] = c->algo == TB_ALGO_FIXED_WINDOW
                           ? tb_fwindow_ttl_ms(&wout[i], &c->lim[i], now_ms)
                           : tb_swindow_ttl_ms(&wout[i], &c->lim[i], now_ms);
        }
        break;
    case TB_ALGO_SLIDING_LOG:
        rc = slog_run(x, cost, v);
        for (i = 0; i < n && rc == TB_OK; i++) {
            o->st[i].count = in[i].count;
            o->ttl_ms[i] = tb_slog_ttl_ms(&c->lim[i]);
        }
        break;
    }
    return rc;
}

/* The token bucket's lease: give back, then lease. *held receives the
 * bucket before the grant (what a refused call that gave tokens back
 * writes). */
static int run_lease(const rm_call_t *c, const rm_state_t *in,
                     int64_t now_ms, tb_verdict_t *v, tb_bucket_t *held,
                     rm_outcome_t *o)
{
    tb_bucket_grant_t g;
    tb_bucket_t out;

    *held = in[0].bucket;
    if (c->back > 0 && tb_bucket_give_back(&in[0].bucket, &c->lim[0],
                                           c->back, now_ms, held) != TB_OK) {
        return TB_ERR;
    }
    g.cost = c->cost[0];
    g.want = c->want;
    if (tb_bucket_lease(held, &c->lim[0], &g, now_ms, &out, v) != TB_OK) {
        return TB_ERR;
    }
    o->granted = g.granted;
    o->st[0].bucket = out;
    o->ttl_ms[0] = tb_bucket_ttl_ms(&c->lim[0]);
    return TB_OK;
}

/* The remaining count of a call refused by its slot set: that of the
 * buckets with nothing deducted. A refused verdict has it already, and so
 * has a settlement, which deducts whatever the verdict; an allowed take
 * runs again at zero cost, which deducts nothing and keeps every state. */
static int refused_remaining(const rm_input_t *x, const tb_verdict_t *v,
                             const tb_bucket_t *held, int64_t *remaining)
{
    static const double zero[TB_MAX_BUCKETS];
    const rm_call_t *c = x->c;
    rm_outcome_t scratch;
    rm_state_t base[TB_MAX_BUCKETS];
    rm_input_t y = *x;
    tb_verdict_t z;
    int i;

    if (!v->allowed || c->settle) {
        *remaining = v->remaining;
        return TB_OK;
    }
    for (i = 0; i < c->n; i++) {
        base[i] = x->in[i];
    }
    if (c->lease) {
        base[0].bucket = *held; /* After the give-back. */
    }
    y.in = base;
    if (run_twin(&y, zero, &z, &scratch) != TB_OK) {
        return TB_ERR;
    }
    *remaining = z.remaining;
    return TB_OK;
}

/* 'rules': 1 when a bucket is banned at now_ms; o then holds the
 * script's early refusal (the longest ban binds, its time left the
 * wait, nothing stored). */
static int rules_banned(const rm_call_t *c, const rm_state_t *in,
                        int64_t now_ms, rm_outcome_t *o)
{
    double left = 0;
    int i;

    for (i = 0; i < c->n; i++) {
        if (in[i].ban_until > (double)now_ms) {
            o->banned |= 1u << i;
            if (in[i].ban_until - (double)now_ms > left) {
                left = in[i].ban_until - (double)now_ms;
                o->v.binding = i;
            }
        }
    }
    if (!o->banned) {
        return 0;
    }
    o->v.allowed = 0;
    o->v.remaining = 0;
    o->v.retry_ms = (int64_t)left;
    return 1;
}

/* 'rules', after a refusal: each bucket that itself lacked its cost (as
 * refilled in o->st) and has a ban is banned; the longest ban is the
 * wait, unless waiting can never help. */
static void rules_ban(const rm_call_t *c, rm_outcome_t *o)
{
    int i;

    for (i = 0; i < c->n; i++) {
        if (c->ban_ms[i] > 0 && c->cost[i] <= c->lim[i].capacity
            && o->st[i].bucket.tokens < c->cost[i]) {
            o->ban_set |= 1u << i;
            if (o->v.retry_ms != -1 && c->ban_ms[i] > (double)o->v.retry_ms) {
                o->v.retry_ms = (int64_t)c->ban_ms[i];
                o->v.binding = i;
            }
        }
    }
}

int rm_decide(const rm_call_t *c, const rm_state_t *in,
                   int64_t now_ms, int conc_full, rm_nth_fn *nth,
                   void *nth_ctx, rm_outcome_t *o)
{
    rm_input_t x = { c, in, now_ms, nth, nth_ctx };
    tb_verdict_t v;
    tb_bucket_t held;
    int64_t remaining;
    int i, allowed, rc;

    memset(o, 0, sizeof(*o));
    memset(&held, 0, sizeof(held));
    tb__fold_init(&v);
    if (c->rules && rules_banned(c, in, now_ms, o)) {
        return TB_OK;
    }
    if (c->n > 0) {
        rc = c->lease ? run_lease(c, in, now_ms, &v, &held, o)
                      : run_twin(&x, c->cost, &v, o);
        if (rc != TB_OK) {
            return TB_ERR;
        }
    }
    allowed = v.allowed && !conc_full;
    o->v = v;
    if (conc_full) {
        /* The prelude folds the full set (index n, the constant wait)
         * before any bucket; the buckets' own fold then adds the largest
         * wait, first index first, which is v's. */
        tb__fold_init(&o->v);
        tb__fold_wait(&o->v, c->n, TB_CONCURRENCY_RETRY_MS);
        if (c->n > 0) {
            tb__fold_wait(&o->v, v.binding, v.retry_ms);
            if (refused_remaining(&x, &v, &held, &remaining) != TB_OK) {
                return TB_ERR;
            }
            o->v.remaining = remaining;
        }
        o->granted = 0;
    }
    if (c->rules && !v.allowed) {
        /* The buckets' own refusal: o->st holds them refilled. */
        rules_ban(c, o);
    }
    for (i = 0; i < c->n; i++) {
        if (c->settle
            || (c->algo == TB_ALGO_SLIDING_LOG ? allowed && c->cost[i] > 0
                                               : allowed
                                                 && !(c->hold & (1u << i)))) {
            o->store[i] = 1;
        }
        else if (c->lease && c->back > 0) {
            /* A refused lease that gave tokens back still writes them,
             * with the TTL of the refill. */
            o->store[i] = 1;
            o->st[i].bucket = held;
            o->ttl_ms[i] = tb_bucket_refill_ttl_ms(&c->lim[i], held.tokens);
        }
    }
    return TB_OK;
}
