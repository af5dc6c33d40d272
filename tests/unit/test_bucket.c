/* test_bucket.c -- unit tests for tb_bucket.c, the pure token-bucket math.
 *
 * Two kinds of test. test_bucket_vectors runs every vector of
 * tests/vectors/token_bucket.tsv (directory from $TB_TEST_VECTORS) through
 * tb_bucket_take() and compares the verdict, the new state and the TTL
 * exactly: the same table runs against the Lua script in a real Redis
 * (tests/integration/core/test_core_vectors.py), so C and Lua cannot drift. The
 * named tests then check behaviours over sequences of calls with injected
 * time (never a sleep) and the argument checks. The settlement twin
 * tb_bucket_settle() runs tests/vectors/token_bucket_settle.tsv the same
 * way (and test_core_settle.py runs it against the script), and the
 * lease twin runs tests/vectors/lease.tsv.
 */
#include <errno.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "tb_int.h"

/* ---- The vector table ------------------------------------------------ */

#define VEC_COLS 16
#define VEC_MAX 256

typedef struct vec {
    char id[64];
    int n;
    int line;
    int64_t now_ms;
    tb_bucket_t in[TB_MAX_BUCKETS];
    tb_limit_t lim[TB_MAX_BUCKETS];
    double cost[TB_MAX_BUCKETS];
    tb_verdict_t want;
    tb_bucket_t want_out[TB_MAX_BUCKETS];
    int64_t want_ttl[TB_MAX_BUCKETS];
} vec_t;

/* A table of vectors: the decisions or the settlements. */
typedef struct table {
    const char *file;
    vec_t v[VEC_MAX];
    int n;
} table_t;

static table_t takes_tab, settles_tab;

static double num(const char *s, int line)
{
    char *end;
    double d;

    if (strcmp(s, "-") == 0) {
        return 0;
    }
    errno = 0;
    d = strtod(s, &end);
    if (*end || end == s || errno) {
        fail_msg("vectors:%d: bad number '%s'", line, s);
    }
    return d;
}

static int64_t inum(const char *s, int line)
{
    char *end;
    long long v;

    if (strcmp(s, "-") == 0) {
        return 0;
    }
    errno = 0;
    v = strtoll(s, &end, 10);
    if (*end || end == s || errno) {
        fail_msg("vectors:%d: bad integer '%s'", line, s);
    }
    return v;
}

/* tb_bucket_lease() with its amounts as arguments; granted NULL passes
 * no grant at all. */
static int lease(const tb_bucket_t *in, const tb_limit_t *lim, double cost,
                 double want, int64_t now_ms, tb_bucket_t *out,
                 tb_verdict_t *v, int64_t *granted)
{
    tb_bucket_grant_t g;
    int rc;

    g.cost = cost;
    g.want = want;
    g.granted = -1;
    rc = tb_bucket_lease(in, lim, granted ? &g : NULL, now_ms, out, v);
    if (granted) {
        *granted = g.granted;
    }
    return rc;
}

/* Read a table once; rows with the same id in a run form one vector.
 * Any malformed row fails the test that asked. */
static void load_vectors(table_t *tab, const char *file)
{
    const char *dir = getenv("TB_TEST_VECTORS");
    char path[4096], buf[1024];
    vec_t *vecs = tab->v;
    FILE *f;
    int line = 0, nvecs = tab->n;

    if (nvecs) {
        return;
    }
    tab->file = file;
    snprintf(path, sizeof(path), "%s/%s", dir ? dir : "tests/vectors",
             tab->file);
    f = fopen(path, "r");
    if (!f) {
        fail_msg("cannot open %s (set TB_TEST_VECTORS): %s", path,
                 strerror(errno));
    }
    while (fgets(buf, sizeof(buf), f)) {
        char *col[VEC_COLS], *save = NULL, *tok;
        int ncol = 0, i;
        vec_t *v;

        line++;
        buf[strcspn(buf, "\r\n")] = '\0';
        if (buf[0] == '#' || buf[0] == '\0') {
            continue;
        }
        for (tok = strtok_r(buf, "\t", &save); tok && ncol < VEC_COLS;
             tok = strtok_r(NULL, "\t", &save)) {
            col[ncol++] = tok;
        }
        if (ncol != VEC_COLS || tok) {
            fail_msg("%s:%d: want %d columns", tab->file, line, VEC_COLS);
        }
        i = (int)inum(col[1], line);
        if (i == 0) {
            assert_true(nvecs < VEC_MAX);
            v = &vecs[nvecs++];
            memset(v, 0, sizeof(*v));
            snprintf(v->id, sizeof(v->id), "%s", col[0]);
            v->line = line;
            v->now_ms = inum(col[5], line);
            v->want.allowed = (int)inum(col[9], line);
            v->want.remaining = inum(col[10], line);
            v->want.retry_ms = inum(col[11], line);
            v->want.binding = (int)inum(col[12], line);
        }
        else {
            v = &vecs[nvecs - 1];
            if (nvecs == 0 || strcmp(v->id, col[0]) != 0 || i != v->n
                || i >= TB_MAX_BUCKETS || inum(col[5], line) != v->now_ms
                || inum(col[9], line) != v->want.allowed
                || inum(col[10], line) != v->want.remaining
                || inum(col[11], line) != v->want.retry_ms
                || inum(col[12], line) != v->want.binding) {
                fail_msg("%s:%d: row does not continue vector '%s'",
                         tab->file, line, col[0]);
            }
        }
        v->in[i].exists = (int)inum(col[2], line);
        v->in[i].tokens = num(col[3], line);
        v->in[i].ts_ms = inum(col[4], line);
        v->lim[i].capacity = num(col[6], line);
        v->lim[i].rate_per_sec = num(col[7], line);
        v->cost[i] = num(col[8], line);
        v->want_out[i].tokens = num(col[13], line);
        v->want_out[i].ts_ms = inum(col[14], line);
        v->want_out[i].exists = 1;
        v->want_ttl[i] = inum(col[15], line);
        v->n = i + 1;
    }
    fclose(f);
    tab->n = nvecs;
}

/* Check one vector, a decision or (settle) a settlement; out may be the
 * same array as the input. Prints each difference and returns how many
 * there were. */
static int check_vector(const vec_t *v, const char *how, int alias,
                        int settle)
{
    tb_bucket_t work[TB_MAX_BUCKETS], sep[TB_MAX_BUCKETS], *out;
    tb_verdict_t got;
    int i, bad = 0, rc;

    memcpy(work, v->in, sizeof(work));
    memset(sep, 0x5a, sizeof(sep));
    out = alias ? work : sep;
    memset(&got, 0x5a, sizeof(got));
    rc = settle ? tb_bucket_settle(work, v->lim, v->cost, v->n, v->now_ms,
                                   out, &got)
                : tb_bucket_take(work, v->lim, v->cost, v->n, v->now_ms,
                                 out, &got);
    if (rc != TB_OK) {
        print_error("%s (line %d, %s): returned %d\n", v->id, v->line, how,
                    rc);
        return 1;
    }
    if (got.allowed != v->want.allowed
        || got.remaining != v->want.remaining
        || got.retry_ms != v->want.retry_ms
        || got.binding != v->want.binding) {
        print_error("%s (line %d, %s): verdict allowed=%d remaining=%lld "
                    "retry_ms=%lld binding=%d, want %d %lld %lld %d\n",
                    v->id, v->line, how, got.allowed,
                    (long long)got.remaining, (long long)got.retry_ms,
                    got.binding, v->want.allowed,
                    (long long)v->want.remaining,
                    (long long)v->want.retry_ms, v->want.binding);
        bad++;
    }
    for (i = 0; i < v->n; i++) {
        int64_t ttl = settle ? tb_bucket_refill_ttl_ms(&v->lim[i],
                                                       out[i].tokens)
                             : tb_bucket_ttl_ms(&v->lim[i]);

        /* Exact comparison: C and Lua must agree to the last bit. */
        if (out[i].tokens != v->want_out[i].tokens
            || out[i].ts_ms != v->want_out[i].ts_ms || !out[i].exists) {
            print_error("%s (line %d, %s): bucket %d tokens=%.17g ts=%lld "
                        "exists=%d, want %.17g %lld 1\n", v->id, v->line,
                        how, i, out[i].tokens, (long long)out[i].ts_ms,
                        out[i].exists, v->want_out[i].tokens,
                        (long long)v->want_out[i].ts_ms);
            bad++;
        }
        if (ttl != v->want_ttl[i]) {
            print_error("%s (line %d): bucket %d ttl %lld, want %lld\n",
                        v->id, v->line, i, (long long)ttl,
                        (long long)v->want_ttl[i]);
            bad++;
        }
    }
    return bad;
}

/* Every vector of a table, with a separate out[] and with out == in;
 * returns how many of them take several buckets. */
static int run_table(table_t *tab, const char *file, int settle)
{
    int k, bad = 0, multi = 0;

    load_vectors(tab, file);
    for (k = 0; k < tab->n; k++) {
        bad += check_vector(&tab->v[k], "separate out", 0, settle);
        bad += check_vector(&tab->v[k], "out aliases in", 1, settle);
        multi += tab->v[k].n > 1;
    }
    if (bad) {
        fail_msg("%s: %d mismatches over %d vectors", tab->file, bad,
                 tab->n);
    }
    return multi;
}

static void test_bucket_vectors(void **state)
{
    int multi, k, debt = 0;

    (void)state;
    multi = run_table(&takes_tab, "token_bucket.tsv", 0);
    assert_true(takes_tab.n >= 40);
    assert_true(multi >= 5);
    /* Buckets in debt (below 0 tokens) are among the states decided. */
    for (k = 0; k < takes_tab.n; k++) {
        debt += takes_tab.v[k].in[0].exists && takes_tab.v[k].in[0].tokens < 0;
    }
    assert_true(debt >= 5);
}

/* The settlement vectors: debits, refunds, debt and its floor. */
static void test_bucket_settle_vectors(void **state)
{
    (void)state;
    assert_true(run_table(&settles_tab, "token_bucket_settle.tsv", 1) >= 3);
    assert_true(settles_tab.n >= 15);
}

/* ---- Leases: tests/vectors/lease.tsv ---------------------------------- */

#define LEASE_COLS 17   /* The last, back, is optional. */

/* One row: the call and what it must give. Fails the test on any
 * difference. Returns 1 when the row was checked. */
static int check_lease_row(char **col, int ncol, int line)
{
    tb_bucket_t in, out, mid;
    tb_limit_t lim;
    tb_verdict_t v;
    int64_t granted = -7, ttl, now;
    double cost, want, back;

    in.exists = (int)inum(col[1], line);
    in.tokens = num(col[2], line);
    in.ts_ms = inum(col[3], line);
    now = inum(col[4], line);
    lim.capacity = num(col[5], line);
    lim.rate_per_sec = num(col[6], line);
    cost = num(col[7], line);
    want = num(col[8], line);
    back = ncol > 16 ? num(col[16], line) : 0;
    memset(&out, 0x5a, sizeof(out));
    /* The script's call with back: the give-back, then the lease. */
    assert_int_equal(tb_bucket_give_back(&in, &lim, back, now, &mid), TB_OK);
    assert_int_equal(lease(back > 0 ? &mid : &in, &lim, cost, want,
                                     now, &out, &v, &granted), TB_OK);
    ttl = v.allowed || back == 0 ? tb_bucket_ttl_ms(&lim)
                                 : tb_bucket_refill_ttl_ms(&lim, out.tokens);
    if (v.allowed != inum(col[9], line) || v.remaining != inum(col[10], line)
        || v.retry_ms != inum(col[11], line) || v.binding != 0
        || granted != inum(col[12], line)
        || out.tokens != num(col[13], line)
        || out.ts_ms != inum(col[14], line)
        || ttl != inum(col[15], line)) {
        fail_msg("lease.tsv:%d %s: allowed=%d remaining=%lld retry=%lld "
                 "granted=%lld tokens=%.17g ts=%lld", line, col[0],
                 v.allowed, (long long)v.remaining, (long long)v.retry_ms,
                 (long long)granted, out.tokens, (long long)out.ts_ms);
    }
    /* out may alias in. */
    if (back > 0) {
        assert_int_equal(tb_bucket_give_back(&in, &lim, back, now, &in),
                         TB_OK);
    }
    assert_int_equal(lease(&in, &lim, cost, want, now, &in, &v,
                                     &granted), TB_OK);
    assert_true(in.tokens == out.tokens && in.ts_ms == out.ts_ms);
    return 1;
}

static void test_bucket_lease_vectors(void **state)
{
    const char *dir = getenv("TB_TEST_VECTORS");
    char path[4096], buf[1024];
    FILE *f;
    int line = 0, rows = 0, backs = 0;

    (void)state;
    snprintf(path, sizeof(path), "%s/lease.tsv", dir ? dir : "tests/vectors");
    f = fopen(path, "r");
    if (!f) {
        fail_msg("cannot open %s: %s", path, strerror(errno));
    }
    while (fgets(buf, sizeof(buf), f)) {
        char *col[LEASE_COLS], *save = NULL, *tok;
        int ncol = 0;

        line++;
        buf[strcspn(buf, "\r\n")] = '\0';
        if (buf[0] == '#' || buf[0] == '\0') {
            continue;
        }
        for (tok = strtok_r(buf, "\t", &save); tok && ncol < LEASE_COLS;
             tok = strtok_r(NULL, "\t", &save)) {
            col[ncol++] = tok;
        }
        if (ncol < LEASE_COLS - 1 || tok) {
            fail_msg("lease.tsv:%d: want %d or %d columns", line,
                     LEASE_COLS - 1, LEASE_COLS);
        }
        backs += ncol == LEASE_COLS;
        rows += check_lease_row(col, ncol, line);
    }
    fclose(f);
    assert_true(rows >= 15);
    assert_true(backs >= 5);
}

/* want == cost is tb_bucket_take() to the last bit, over a sweep of
 * states, times and limits; and a lease never grants more than the
 * bucket holds nor fewer than the cost. */
static void test_bucket_lease_matches_take(void **state)
{
    static const double caps[] = { 1, 3, 10, 1000 };
    static const double rates[] = { 0.1, 1, 3.3, 1000 };
    int a, b, k;

    (void)state;
    for (a = 0; a < 4; a++) {
        for (b = 0; b < 4; b++) {
            for (k = 0; k < 200; k++) {
                tb_bucket_t in, o1, o2;
                tb_limit_t lim;
                tb_verdict_t v1, v2;
                double cost = (double)(k % 3);
                int64_t g;

                lim.capacity = caps[a];
                lim.rate_per_sec = rates[b];
                in.exists = k % 7 != 0;
                in.tokens = (k * 0.37) - floor(k * 0.37 / caps[a]) * caps[a];
                in.ts_ms = 1000;
                assert_int_equal(tb_bucket_take(&in, &lim, &cost, 1,
                                                 1000 + k * 13, &o1, &v1),
                                 TB_OK);
                assert_int_equal(lease(&in, &lim, cost, cost,
                                                 1000 + k * 13, &o2, &v2,
                                                 &g), TB_OK);
                assert_true(o1.tokens == o2.tokens && o1.ts_ms == o2.ts_ms);
                assert_true(v1.allowed == v2.allowed
                            && v1.remaining == v2.remaining
                            && v1.retry_ms == v2.retry_ms
                            && v1.binding == v2.binding);
                assert_true(g == (v1.allowed ? (int64_t)cost : 0));
                assert_int_equal(lease(&in, &lim, cost, 50,
                                                 1000 + k * 13, &o2, &v2,
                                                 &g), TB_OK);
                assert_int_equal(v2.allowed, v1.allowed);
                if (v2.allowed) {
                    assert_true(g >= cost && g <= 50 && o2.tokens >= 0);
                }
                else {
                    assert_int_equal(g, 0);
                }
            }
        }
    }
}

static void test_bucket_lease_bad_arguments(void **state)
{
    tb_bucket_t in = { 5, 0, 1 }, out;
    tb_limit_t lim = { 10, 1 };
    tb_verdict_t v;
    int64_t g;

    (void)state;
    /* want below cost, NaN, too large; bad limit; NULLs. */
    assert_int_equal(lease(&in, &lim, 2, 1, 0, &out, &v, &g),
                     TB_ERR);
    assert_int_equal(lease(&in, &lim, 1, NAN, 0, &out, &v, &g),
                     TB_ERR);
    assert_int_equal(lease(&in, &lim, 1, 2e9, 0, &out, &v, &g),
                     TB_ERR);
    lim.capacity = 0.5;
    assert_int_equal(lease(&in, &lim, 1, 2, 0, &out, &v, &g),
                     TB_ERR);
    lim.capacity = 10;
    assert_int_equal(lease(NULL, &lim, 1, 2, 0, &out, &v, &g),
                     TB_ERR);
    assert_int_equal(lease(&in, &lim, 1, 2, 0, &out, &v, NULL),
                     TB_ERR);
}

/* ---- Named behaviours, with injected time ----------------------------- */

/* One bucket, one call: a small helper for the sequences below. */
static tb_verdict_t take1(tb_bucket_t *b, double cap, double rate,
                          double cost, int64_t now_ms)
{
    tb_limit_t lim;
    tb_verdict_t v;

    lim.capacity = cap;
    lim.rate_per_sec = rate;
    assert_int_equal(tb_bucket_take(b, &lim, &cost, 1, now_ms, b, &v),
                     TB_OK);
    return v;
}

static void test_bucket_missing_key_is_full(void **state)
{
    tb_bucket_t b = {0, 0, 0};
    tb_verdict_t v;
    int k;

    (void)state;
    b.tokens = -123; /* Ignored: the key does not exist. */
    b.ts_ms = 999999;
    v = take1(&b, 5, 1, 1, 1000);
    assert_int_equal(v.allowed, 1);
    assert_int_equal(v.remaining, 4);
    assert_true(b.exists);
    assert_int_equal(b.ts_ms, 1000);
    for (k = 0; k < 4; k++) {
        assert_int_equal(take1(&b, 5, 1, 1, 1000).allowed, 1);
    }
    v = take1(&b, 5, 1, 1, 1000);
    assert_int_equal(v.allowed, 0);
    assert_int_equal(v.retry_ms, 1000);
}

static void test_bucket_full_after_idle(void **state)
{
    tb_bucket_t b = {0, 0, 0};
    tb_verdict_t v;

    (void)state;
    v = take1(&b, 10, 2, 10, 0);
    assert_int_equal(v.allowed, 1);
    assert_true(b.tokens == 0);
    /* An idle hour refills to capacity, not to 7200 tokens. */
    v = take1(&b, 10, 2, 0, 3600000);
    assert_true(b.tokens == 10);
    assert_int_equal(v.remaining, 10);
}

static void test_bucket_partial_refill(void **state)
{
    tb_bucket_t b = {0, 0, 0};
    tb_verdict_t v;

    (void)state;
    take1(&b, 8, 4, 8, 1000);
    v = take1(&b, 8, 4, 0, 1250); /* 250 ms at 4/s: one token. */
    assert_true(b.tokens == 1);
    v = take1(&b, 8, 4, 0, 1375); /* 125 ms more: half a token. */
    assert_true(b.tokens == 1.5);
    assert_int_equal(v.remaining, 1);
    v = take1(&b, 8, 4, 2, 1375);
    assert_int_equal(v.allowed, 0);
    assert_int_equal(v.retry_ms, 125);
    v = take1(&b, 8, 4, 2, 1500);
    assert_int_equal(v.allowed, 1);
    assert_true(b.tokens == 0);
}

/* Random-looking calls (a fixed LCG, so reproducible): the stored level
 * never leaves [0, capacity]. */
static void test_bucket_never_above_capacity(void **state)
{
    tb_bucket_t b = {0, 0, 0};
    uint32_t x = 12345;
    int64_t now = 0;
    int k;

    (void)state;
    for (k = 0; k < 100000; k++) {
        double cost;

        x = x * 1103515245u + 12345u;
        now += (x >> 16) % 700;
        cost = (double)((x >> 8) % 5) / 2;
        take1(&b, 7, 3.5, cost, now);
        assert_true(b.tokens >= 0);
        assert_true(b.tokens <= 7);
    }
}

/* A clock that steps back refills nothing and keeps the later stamp, so
 * the same interval is never credited twice. */
static void test_bucket_clock_backwards(void **state)
{
    tb_bucket_t b = {0, 0, 0};
    tb_verdict_t v;

    (void)state;
    take1(&b, 10, 1, 10, 10000);
    v = take1(&b, 10, 1, 0, 4000);
    assert_true(b.tokens == 0);
    assert_int_equal(b.ts_ms, 10000);
    v = take1(&b, 10, 1, 1, 5000);
    assert_int_equal(v.allowed, 0);
    assert_int_equal(v.retry_ms, 1000);
    /* Forward again: only the time after 10000 counts. */
    v = take1(&b, 10, 1, 0, 12000);
    assert_true(b.tokens == 2);
    assert_int_equal(b.ts_ms, 12000);
}

static void test_bucket_cost_over_capacity(void **state)
{
    tb_bucket_t b = {0, 0, 0};
    tb_verdict_t v;

    (void)state;
    v = take1(&b, 3, 1, 3.5, 0);
    assert_int_equal(v.allowed, 0);
    assert_int_equal(v.retry_ms, -1);
    assert_int_equal(v.remaining, 3);
    /* Still never, however long we wait; nothing is taken. */
    v = take1(&b, 3, 1, 4, 1000000);
    assert_int_equal(v.retry_ms, -1);
    assert_true(b.tokens == 3);
}

static void test_bucket_fractional_rate(void **state)
{
    tb_bucket_t b = {0, 0, 0}, c;
    tb_verdict_t v;

    (void)state;
    v = take1(&b, 1, 0.5, 1, 0);
    assert_int_equal(v.allowed, 1);
    c = b;
    v = take1(&c, 1, 0.5, 1, 1000);
    assert_int_equal(v.allowed, 0);
    assert_int_equal(v.retry_ms, 1000);
    assert_true(c.tokens == 0.5);
    c = b;
    v = take1(&c, 1, 0.5, 1, 1999);
    assert_int_equal(v.allowed, 0);
    assert_int_equal(v.retry_ms, 1);
    c = b;
    v = take1(&c, 1, 0.5, 1, 2000);
    assert_int_equal(v.allowed, 1);
    assert_int_equal(tb_bucket_ttl_ms(&(tb_limit_t){1, 0.5}), 3000);
}

static void test_bucket_huge_rate(void **state)
{
    tb_bucket_t b = {0, 0, 0};
    tb_verdict_t v;

    (void)state;
    take1(&b, 1e6, 1e6, 1e6, 0);
    assert_true(b.tokens == 0);
    v = take1(&b, 1e6, 1e6, 0, 1);
    assert_true(b.tokens == 1000);
    v = take1(&b, 1e6, 1e6, 1001, 1);
    assert_int_equal(v.allowed, 0);
    assert_int_equal(v.retry_ms, 1);
    v = take1(&b, 1e6, 1e6, 0, 86400000);
    assert_true(b.tokens == 1e6);
    /* The largest accepted capacity and rate stay finite and exact. */
    b.exists = 0;
    v = take1(&b, TB_MAX_CAPACITY, 1e9, TB_MAX_CAPACITY, 0);
    assert_int_equal(v.allowed, 1);
    v = take1(&b, TB_MAX_CAPACITY, 1e9, 0, 1);
    assert_true(b.tokens == 1e6);
}

/* Drain a bucket one token per injected millisecond for 10 s: what is let
 * through is exactly capacity + rate * elapsed (0.125 tokens per ms is
 * exact in binary). */
static void test_bucket_steady_drain(void **state)
{
    tb_bucket_t b = {0, 0, 0};
    int64_t t, allowed = 0;

    (void)state;
    for (t = 0; t < 10000; t++) {
        allowed += take1(&b, 10, 125, 1, t).allowed;
    }
    assert_int_equal(allowed, 10 + 1249); /* floor(10 + 0.125 * 9999) */
}

/* retry_ms is the shortest wait that works: at now + retry the same
 * request is allowed, at now + retry - 1 it is not. */
static void test_bucket_retry_is_the_shortest_wait(void **state)
{
    static const struct {
        double cap, rate, tokens, cost;
    } t[] = {
        {10, 1, 0, 1},   {10, 3, 0, 1},     {10, 7, 0, 1},
        {10, 0.5, 0, 1}, {10, 0.25, 0.5, 2}, {10, 1000, 0, 3},
        {1e6, 1e6, 0, 2500}, {10, 2, 0.75, 3}, {5, 4, 1.5, 5},
    };
    size_t k;

    (void)state;
    for (k = 0; k < sizeof(t) / sizeof(t[0]); k++) {
        tb_bucket_t b = {0, 0, 1}, c;
        tb_verdict_t v;

        b.tokens = t[k].tokens;
        c = b;
        v = take1(&c, t[k].cap, t[k].rate, t[k].cost, 0);
        assert_int_equal(v.allowed, 0);
        assert_true(v.retry_ms > 0);
        c = b;
        assert_int_equal(take1(&c, t[k].cap, t[k].rate, t[k].cost,
                               v.retry_ms).allowed, 1);
        c = b;
        assert_int_equal(take1(&c, t[k].cap, t[k].rate, t[k].cost,
                               v.retry_ms - 1).allowed, 0);
    }
}

static void test_bucket_cost_zero(void **state)
{
    tb_bucket_t b = {0, 0, 1};
    tb_verdict_t v;

    (void)state;
    v = take1(&b, 4, 1, 0, 0);
    assert_int_equal(v.allowed, 1);
    assert_int_equal(v.retry_ms, 0);
    assert_int_equal(v.remaining, 0);
    assert_true(b.tokens == 0);
}

static void test_bucket_exact_boundary(void **state)
{
    const tb_bucket_t b = {2.5, 0, 1};
    tb_bucket_t c;
    tb_verdict_t v;

    (void)state;
    c = b;
    v = take1(&c, 10, 1, 3, 499);
    assert_int_equal(v.allowed, 0);
    assert_int_equal(v.retry_ms, 1);
    c = b;
    v = take1(&c, 10, 1, 3, 500); /* tokens == cost: allowed. */
    assert_int_equal(v.allowed, 1);
    assert_int_equal(v.remaining, 0);
    assert_true(c.tokens == 0);
}

/* All or nothing: a refusal by one bucket leaves every bucket undeducted
 * (refilled only); the largest wait and the smallest remainder win. */
static void test_bucket_all_or_nothing(void **state)
{
    tb_bucket_t in[3] = {{5, 0, 1}, {0.5, 0, 1}, {9, 0, 1}}, out[3];
    tb_limit_t lim[3] = {{10, 1}, {2, 0.5}, {10, 1}};
    double cost[3] = {1, 1, 1};
    tb_verdict_t v;

    (void)state;
    assert_int_equal(tb_bucket_take(in, lim, cost, 3, 0, out, &v), TB_OK);
    assert_int_equal(v.allowed, 0);
    assert_int_equal(v.retry_ms, 1000);
    assert_int_equal(v.binding, 1);
    assert_true(out[0].tokens == 5 && out[1].tokens == 0.5
                && out[2].tokens == 9);
    /* Half a second later bucket 1 has 0.75: still refused, less wait. */
    assert_int_equal(tb_bucket_take(out, lim, cost, 3, 500, out, &v),
                     TB_OK);
    assert_int_equal(v.retry_ms, 500);
    assert_true(out[0].tokens == 5.5 && out[1].tokens == 0.75);
    assert_int_equal(tb_bucket_take(out, lim, cost, 3, 1000, out, &v),
                     TB_OK);
    assert_int_equal(v.allowed, 1);
    assert_int_equal(v.remaining, 0);
    assert_int_equal(v.binding, 1);
    assert_true(out[0].tokens == 5 && out[1].tokens == 0
                && out[2].tokens == 9);
}

static void test_bucket_ttl_ms(void **state)
{
    static const struct {
        double cap, rate;
        int64_t ttl;
    } t[] = {
        {10, 1, 11000},      {2, 0.5, 5000},    {1, 1, 2000},
        {10, 3, 4334},       {1000, 1e6, 1001}, {1e6, 1e6, 2000},
        {1, 1.0 / 60, 61000}, {100, 1000, 1100}, {1, 1e9, 1001},
        {TB_MAX_CAPACITY, 1, 1000000001000LL},
    };
    size_t k;

    (void)state;
    for (k = 0; k < sizeof(t) / sizeof(t[0]); k++) {
        tb_limit_t lim;

        lim.capacity = t[k].cap;
        lim.rate_per_sec = t[k].rate;
        assert_int_equal(tb_bucket_ttl_ms(&lim), t[k].ttl);
    }
}

/* Bad arguments are TB_ERR, never a crash or a silent decision. */
static void test_bucket_bad_arguments(void **state)
{
    static const struct {
        double cap, rate, cost;
    } bad[] = {
        {0, 1, 1},     {0.5, 1, 0},      {-1, 1, 1},    {NAN, 1, 1},
        {INFINITY, 1, 1}, {TB_MAX_CAPACITY * 2, 1, 1},
        {10, 0, 1},    {10, -1, 1},      {10, NAN, 1},  {10, INFINITY, 1},
        {10, 1, -1},   {10, 1, NAN},     {10, 1, -0.5},
        {10, 1, INFINITY},
    };
    tb_bucket_t in[TB_MAX_BUCKETS + 1], out[TB_MAX_BUCKETS + 1];
    tb_limit_t lim[TB_MAX_BUCKETS + 1];
    double cost[TB_MAX_BUCKETS + 1];
    tb_verdict_t v;
    size_t k;

    (void)state;
    memset(in, 0, sizeof(in));
    for (k = 0; k <= TB_MAX_BUCKETS; k++) {
        lim[k].capacity = 10;
        lim[k].rate_per_sec = 1;
        cost[k] = 1;
    }
    assert_int_equal(tb_bucket_take(in, lim, cost, 0, 0, out, &v), TB_ERR);
    assert_int_equal(tb_bucket_take(in, lim, cost, -1, 0, out, &v), TB_ERR);
    assert_int_equal(tb_bucket_take(in, lim, cost, TB_MAX_BUCKETS + 1, 0,
                                    out, &v), TB_ERR);
    assert_int_equal(tb_bucket_take(in, lim, cost, TB_MAX_BUCKETS, 0, out,
                                    &v), TB_OK);
    assert_int_equal(tb_bucket_take(NULL, lim, cost, 1, 0, out, &v), TB_ERR);
    assert_int_equal(tb_bucket_take(in, NULL, cost, 1, 0, out, &v), TB_ERR);
    assert_int_equal(tb_bucket_take(in, lim, NULL, 1, 0, out, &v), TB_ERR);
    assert_int_equal(tb_bucket_take(in, lim, cost, 1, 0, NULL, &v), TB_ERR);
    assert_int_equal(tb_bucket_take(in, lim, cost, 1, 0, out, NULL), TB_ERR);
    for (k = 0; k < sizeof(bad) / sizeof(bad[0]); k++) {
        tb_limit_t l[2] = {{10, 1}, {10, 1}};
        double c[2] = {1, 1};

        /* The bad bucket second, so a check of only the first is caught. */
        l[1].capacity = bad[k].cap;
        l[1].rate_per_sec = bad[k].rate;
        c[1] = bad[k].cost;
        if (tb_bucket_take(in, l, c, 2, 0, out, &v) != TB_ERR) {
            fail_msg("bad limit %zu (cap %g rate %g cost %g) accepted", k,
                     bad[k].cap, bad[k].rate, bad[k].cost);
        }
    }
}

/* A debt is paid before anything passes: settle a bucket of 10 at 1/s
 * from 4 tokens to the floor, then decide once a second. */
static void test_bucket_settle_then_debt(void **state)
{
    tb_bucket_t b = { 4, 0, 1 };
    tb_limit_t lim = { 10, 1 };
    double delta = 1e6;
    tb_verdict_t v;
    int64_t t;

    (void)state;
    assert_int_equal(tb_bucket_settle(&b, &lim, &delta, 1, 0, &b, &v),
                     TB_OK);
    assert_true(b.tokens == -10);
    assert_int_equal(v.allowed, 0);
    assert_int_equal(v.retry_ms, 10000);
    assert_int_equal(tb_bucket_refill_ttl_ms(&lim, b.tokens), 21000);
    /* The wait covers the debt and the cost: 11 s for one token. */
    for (t = 0; t < 11000; t += 1000) {
        assert_int_equal(take1(&b, 10, 1, 1, t).allowed, 0);
        assert_int_equal(take1(&b, 10, 1, 1, t).retry_ms, 11000 - t);
    }
    assert_int_equal(take1(&b, 10, 1, 1, 11000).allowed, 1);
    /* A refund never lifts a bucket above its capacity. */
    delta = -50;
    assert_int_equal(tb_bucket_settle(&b, &lim, &delta, 1, 11000, &b, &v),
                     TB_OK);
    assert_true(b.tokens == 10);
    assert_int_equal(v.allowed, 1);
    assert_int_equal(v.remaining, 10);
    /* A settlement of 0 refills only. */
    delta = 0;
    b.tokens = 2;
    assert_int_equal(tb_bucket_settle(&b, &lim, &delta, 1, 12000, &b, &v),
                     TB_OK);
    assert_true(b.tokens == 3);
}

static void test_bucket_settle_bad_arguments(void **state)
{
    tb_bucket_t in[2] = { { 5, 0, 1 }, { 5, 0, 1 } }, out[2];
    tb_limit_t lim[2] = { { 10, 1 }, { 10, 1 } };
    double d[2] = { 1, 1 };
    tb_verdict_t v;

    (void)state;
    assert_int_equal(tb_bucket_settle(in, lim, d, 2, 0, out, &v), TB_OK);
    d[1] = NAN;
    assert_int_equal(tb_bucket_settle(in, lim, d, 2, 0, out, &v), TB_ERR);
    d[1] = -2e9;
    assert_int_equal(tb_bucket_settle(in, lim, d, 2, 0, out, &v), TB_ERR);
    d[1] = 1;
    lim[1].rate_per_sec = 0;
    assert_int_equal(tb_bucket_settle(in, lim, d, 2, 0, out, &v), TB_ERR);
    lim[1].rate_per_sec = 1;
    assert_int_equal(tb_bucket_settle(in, lim, d, 0, 0, out, &v), TB_ERR);
    assert_int_equal(tb_bucket_settle(NULL, lim, d, 1, 0, out, &v), TB_ERR);
    assert_int_equal(tb_bucket_settle(in, lim, d, 1, 0, out, NULL), TB_ERR);
    assert_int_equal(tb_bucket_give_back(in, lim, -1, 0, out), TB_ERR);
    assert_int_equal(tb_bucket_give_back(in, lim, NAN, 0, out), TB_ERR);
    assert_int_equal(tb_bucket_give_back(in, NULL, 1, 0, out), TB_ERR);
    assert_int_equal(tb_bucket_give_back(in, lim, 100, 0, out), TB_OK);
    assert_true(out[0].tokens == 10);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bucket_vectors),
        cmocka_unit_test(test_bucket_settle_vectors),
        cmocka_unit_test(test_bucket_settle_then_debt),
        cmocka_unit_test(test_bucket_settle_bad_arguments),
        cmocka_unit_test(test_bucket_lease_vectors),
        cmocka_unit_test(test_bucket_lease_matches_take),
        cmocka_unit_test(test_bucket_lease_bad_arguments),
        cmocka_unit_test(test_bucket_missing_key_is_full),
        cmocka_unit_test(test_bucket_full_after_idle),
        cmocka_unit_test(test_bucket_partial_refill),
        cmocka_unit_test(test_bucket_never_above_capacity),
        cmocka_unit_test(test_bucket_clock_backwards),
        cmocka_unit_test(test_bucket_cost_over_capacity),
        cmocka_unit_test(test_bucket_fractional_rate),
        cmocka_unit_test(test_bucket_huge_rate),
        cmocka_unit_test(test_bucket_steady_drain),
        cmocka_unit_test(test_bucket_retry_is_the_shortest_wait),
        cmocka_unit_test(test_bucket_cost_zero),
        cmocka_unit_test(test_bucket_exact_boundary),
        cmocka_unit_test(test_bucket_all_or_nothing),
        cmocka_unit_test(test_bucket_ttl_ms),
        cmocka_unit_test(test_bucket_bad_arguments),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
