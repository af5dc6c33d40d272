/* fuzz_rmcall.c -- tbucket_redis.so's command parser and decision
 * (redismod/rm_command.c) on hostile arguments and hostile stored state,
 * without Redis.
 *
 * Input layout: a byte for the algorithm (the command), a byte of flags
 * (bit 0: the slot set is full), then the arguments after the command
 * name, each a length byte and that many bytes (NULs allowed), up to a
 * zero length byte followed by 0xff or the end; the rest feeds the stored
 * state: per bucket up to three length-prefixed fields (tokens/ts, the
 * TAT, w/cur/prev), the sliding log's count (a byte) and the raw doubles
 * its entry reads answer (NaN and infinities included).
 *
 * Invariants, for a call rm_parse() accepts:
 *  - numkeys as the getkeys callback reads it; n buckets within
 *    TB_MAX_BUCKETS and the slot set only with 'conc';
 *  - every limit passes tb_limit_check(), every cost its mode's range;
 *    a lease only on one token bucket, with cost <= want; 'settle' only
 *    for the token bucket and GCRA; the sliding log's costs whole;
 *  - every number read formats ("%.17g", tb__fmt_num) to text that
 *    reads back as the same double;
 *  - decoded states are finite, stamps whole;
 *  - rm_decide() succeeds with a verdict the reply can carry:
 *    allowed 0 or 1 (0 when the set is full), retry -1 or more (0 when
 *    allowed), binding a bucket or, for a full set, n; remaining -1 only
 *    without buckets; a grant between cost and want when a lease is
 *    allowed, else 0; a TTL above 0 for every key it stores.
 * A refused call carries an error reply starting "ERR " (EVAL's own
 * texts for numkeys and the script's "ERR bad lease" included).
 */
#include <math.h>

#include "fuzz_common.h"
#include "rm_command.h"

/* A length-prefixed field as a heap copy of its exact size (so that a
 * read past it is an ASan report); p NULL for a missing field. */
static rm_arg_t field(rd_t *r, int *missing)
{
    rm_arg_t a = { NULL, 0 };
    uint8_t len = byte(r);
    char *copy;

    *missing = len == 0xff;
    if (*missing) {
        return a;
    }
    if (len > r->n) {
        len = (uint8_t)r->n;
    }
    copy = malloc(len ? len : 1);
    FUZZ_CHECK(copy != NULL, "oom");
    if (len) {
        memcpy(copy, r->p, len);
    }
    r->p += len;
    r->n -= len;
    a.p = copy;
    a.len = len;
    return a;
}

static rd_t nth_input;

static double nth(void *ctx, int i, int64_t k)
{
    double d = 0;
    size_t j;
    uint64_t u = 0;

    (void)ctx;
    FUZZ_CHECK(i >= 0 && i < TB_MAX_BUCKETS && k >= 0, "nth(%d, %lld)", i,
               (long long)k);
    for (j = 0; j < 8; j++) {
        u = u << 8 | byte(&nth_input);
    }
    memcpy(&d, &u, sizeof(d));
    return d;
}

static void check_roundtrip(double v)
{
    char buf[40];
    double back;
    size_t n = tb__fmt_num(buf, sizeof(buf), v);

    FUZZ_CHECK(n > 0 && n < sizeof(buf), "format of %g", v);
    FUZZ_CHECK(rm_lua_number(buf, n, &back) && back == v,
               "%.17g formats as %s", v, buf);
}

static void check_call(const rm_call_t *c, int argc,
                       const rm_arg_t *argv)
{
    int i;

    FUZZ_CHECK(rm_numkeys(argc, argv) == c->numkeys, "numkeys");
    FUZZ_CHECK(c->n >= 0 && c->n <= TB_MAX_BUCKETS
               && c->numkeys == c->n + c->conc, "n %d numkeys %d", c->n,
               c->numkeys);
    FUZZ_CHECK(!c->has_now || fabs((double)c->now_ms)
               <= RM_MAX_CLOCK_MS, "clock");
    for (i = 0; i < c->n; i++) {
        FUZZ_CHECK(tb_limit_check(&c->lim[i], NULL, 0) == TB_OK, "limit");
        FUZZ_CHECK(c->settle ? fabs(c->cost[i]) <= TB_MAX_CAPACITY
                             : c->cost[i] >= 0
                               && c->cost[i] <= TB_MAX_CAPACITY, "cost");
        FUZZ_CHECK(c->algo != TB_ALGO_SLIDING_LOG
                   || c->cost[i] == floor(c->cost[i]), "slog cost");
        check_roundtrip(c->lim[i].capacity);
        check_roundtrip(c->lim[i].rate_per_sec);
        check_roundtrip(c->cost[i]);
    }
    FUZZ_CHECK(!c->lease || (c->algo == TB_ALGO_TOKEN_BUCKET && c->n == 1
                             && c->want >= c->cost[0] && c->back >= 0
                             && c->back <= TB_MAX_CAPACITY), "lease");
    FUZZ_CHECK(!c->settle || c->algo == TB_ALGO_TOKEN_BUCKET
               || c->algo == TB_ALGO_GCRA, "settle");
    FUZZ_CHECK(!c->conc || (c->conc_ttl_ms >= 1
                            && c->conc_ttl_ms <= TB_MAX_CONCURRENCY_TTL_MS
                            && c->slot_id.len <= RM_MAX_SLOT_ID
                            && isfinite(c->conc_limit)), "conc");
}

static void read_states(rd_t *r, const rm_call_t *c,
                        rm_state_t *in, rm_arg_t *held, int *nh)
{
    int i, j, missing[3];

    for (i = 0; i < c->n; i++) {
        rm_arg_t f[3];

        for (j = 0; j < 3; j++) {
            f[j] = field(r, &missing[j]);
            held[(*nh)++] = f[j];
        }
        memset(&in[i], 0, sizeof(in[i]));
        rm_decode_bucket(&f[0], &f[1], &in[i].bucket);
        rm_decode_gcra(&f[0], &in[i].gcra);
        rm_decode_window(&f[0], &f[1], missing[2] ? NULL : &f[2],
                              &in[i].window);
        in[i].count = byte(r);
        FUZZ_CHECK(!in[i].bucket.exists
                   || (isfinite(in[i].bucket.tokens)
                       && in[i].bucket.tokens >= -TB_MAX_CAPACITY),
                   "tokens");
        FUZZ_CHECK(!in[i].gcra.exists || isfinite(in[i].gcra.tat_ms), "tat");
        FUZZ_CHECK(!in[i].window.exists
                   || (isfinite(in[i].window.w) && isfinite(in[i].window.cur)
                       && isfinite(in[i].window.prev)), "window");
    }
}

static void check_outcome(const rm_call_t *c, int full,
                          const rm_outcome_t *o)
{
    const tb_verdict_t *v = &o->v;
    int i;

    FUZZ_CHECK(v->allowed == 0 || v->allowed == 1, "allowed");
    FUZZ_CHECK(!full || !v->allowed, "a full set allowed");
    FUZZ_CHECK(v->retry_ms >= -1 && (!v->allowed || v->retry_ms == 0),
               "retry %lld", (long long)v->retry_ms);
    FUZZ_CHECK(v->binding >= 0 && (v->binding < c->n
                                   || (full && v->binding == c->n)
                                   || (c->n == 0 && v->binding == 0)),
               "binding %d of %d", v->binding, c->n);
    FUZZ_CHECK(c->n == 0 ? v->remaining == -1 : v->remaining >= 0,
               "remaining %lld", (long long)v->remaining);
    if (c->lease && v->allowed) {
        FUZZ_CHECK((double)o->granted >= floor(c->cost[0])
                   && (double)o->granted <= c->want, "grant");
    }
    else {
        FUZZ_CHECK(o->granted == 0, "grant when refused");
    }
    for (i = 0; i < c->n; i++) {
        FUZZ_CHECK(!o->store[i] || o->ttl_ms[i] > 0, "ttl %lld",
                   (long long)o->ttl_ms[i]);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    rd_t r = { data, size };
    rm_arg_t argv[RM_MAX_ARGS + 8];
    rm_arg_t held[3 * TB_MAX_BUCKETS];
    rm_state_t in[TB_MAX_BUCKETS];
    rm_outcome_t o;
    rm_call_t c;
    char err[256];
    tb_algo_t algo = (tb_algo_t)(byte(&r) % TB_ALGO_COUNT);
    int full = byte(&r) & 1, argc = 1, nh = 0, i, missing, rc;

    argv[0].p = rm_command_name(algo);
    argv[0].len = strlen(argv[0].p);
    while (r.n && argc < RM_MAX_ARGS + 8) {
        if (r.p[0] == 0 && r.n > 1 && r.p[1] == 0xff) {
            r.p += 2;
            r.n -= 2;
            break;
        }
        argv[argc] = field(&r, &missing);
        if (missing) {
            break;
        }
        argc++;
    }
    err[0] = '\0';
    rc = rm_parse(algo, argc, argv, &c, err, sizeof(err));
    if (rc != TB_OK) {
        FUZZ_CHECK(strncmp(err, "ERR ", 4) == 0, "error reply '%s'", err);
    }
    else {
        check_call(&c, argc, argv);
        read_states(&r, &c, in, held, &nh);
        nth_input = r;
        FUZZ_CHECK(rm_decide(&c, in, c.has_now ? c.now_ms
                                                    : 1700000000000LL,
                                  full, nth, NULL, &o) == TB_OK,
                   "a parsed call was refused by its twin");
        check_outcome(&c, full, &o);
    }
    for (i = 1; i < argc; i++) {
        free((void *)argv[i].p);
    }
    for (i = 0; i < nh; i++) {
        free((void *)held[i].p);
    }
    return 0;
}
