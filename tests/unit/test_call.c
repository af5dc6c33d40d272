/* test_call.c -- unit tests for tb_call.c, a request turned into a script
 * call and a reply turned into a result.
 *
 * The argument vector is the contract with the Lua scripts, so its layout
 * is pinned here argument by argument, for a decision (several buckets, a
 * lease, a concurrency limit) and for a settlement. Numbers must read back
 * in Lua as the doubles C holds: the fast path for whole numbers must
 * print exactly what "%.17g" prints. Malformed requests are refused before
 * any key is built.
 */
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
#include "unit_common.h"

/* tb__fmt_num(v) against snprintf("%.17g", v), and read back. */
static void check_num(double v)
{
    char got[32], want[32];
    size_t n = tb__fmt_num(got, sizeof(got), v);

    snprintf(want, sizeof(want), "%.17g", v);
    assert_string_equal(got, want);
    assert_int_equal(n, strlen(want));
    assert_true(strtod(got, NULL) == v);
}

static void test_fmt_num_is_17g(void **unused)
{
    static const double fixed[] = {
        0, 1, 9, 10, 11, 99, 100, 101, 999, 1000, 12345, 65536,
        999999999999999.0, 1e15, 1e15 + 2, 1e17, 1e300, 4503599627370496.0,
        0.5, 0.1, 1.0 / 3, 1e-6, 2.5e-7, 123.456, -1, -0.5, -1e15,
        -999999999999999.0, 5e-324, 1.7976931348623157e308,
        -0.0, -7, -42, -123456789, -99999999999999.0,
    };
    uint64_t x = 0x9e3779b97f4a7c15ull;
    size_t i;

    (void)unused;
    for (i = 0; i < sizeof(fixed) / sizeof(fixed[0]); i++) {
        check_num(fixed[i]);
    }
    /* Whole numbers of every length, and fractions, from a fixed LCG. */
    for (i = 0; i < 200000; i++) {
        double v;

        x = x * 6364136223846793005ull + 1442695040888963407ull;
        v = (double)(x >> (11 + (i % 50)));
        check_num(i % 3 ? v : v / 7.0);
    }
    for (i = 0; i < 100000; i++) {
        check_num((double)i);
        check_num(-(double)i);   /* -0 first: "%.17g" prints "-0" */
    }
}

static void test_fmt_num_short_buffer(void **unused)
{
    char buf[8];

    (void)unused;
    /* The fast path needs 18 bytes; a short buffer still gets a
     * terminated prefix from snprintf, never an overflow. */
    tb__fmt_num(buf, sizeof(buf), 123456789012.0);
    assert_int_equal(strlen(buf), 7);
    assert_memory_equal(buf, "1234567", 7);
}

/* A request over one main bucket and, with route, one route bucket. */
static void fill(tb_request_t *q, tb_take_t *t, int n)
{
    unit_take(&t[0], 100, 2.5, 1);
    if (n > 1) {
        unit_take(&t[1], 10, 0.5, 3);
        t[1].name = "export";
        t[1].kind = TB_TAKE_NAMED;
    }
    unit_request(q, "rl:", "client-1", t, n);
}

/* The argv as one string, arguments joined by '|'. */
static void joined(int argc, const char **argv, const size_t *len,
                   char *out, size_t size)
{
    size_t o = 0;
    int i;

    for (i = 0; i < argc; i++) {
        assert_true(o + len[i] + 2 < size);
        memcpy(out + o, argv[i], len[i]);
        o += len[i];
        out[o++] = i + 1 < argc ? '|' : '\0';
    }
}

static void test_argv_decision_layout(void **unused)
{
    tb_request_t q;
    tb_take_t t[2];
    tb__call_t k;
    char ckey[TB_KEY_BUF], want[1024], got[1024];
    tb__conc_t conc;
    int argc;

    (void)unused;
    fill(&q, t, 2);
    q.algo = TB_ALGO_TOKEN_BUCKET;
    q.concurrency = 4;
    assert_true(tb__call_prepare(&q, k.takes, k.keys));
    assert_true(tb__call_conc(&q, ckey, &conc));
    assert_int_equal(conc.limit, 4);
    assert_int_equal(conc.ttl_ms, TB_CONCURRENCY_TTL_MS);
    assert_non_null(strstr(ckey, ":conc"));
    k.what = TB__CALL_DECIDE;
    k.conc = &conc;
    k.slot_id = "s.1.2";
    argc = tb__call_argv(&q, &k);
    joined(argc, k.argv, k.argvlen, got, sizeof(got));
    /* digest, 3 keys, Redis's clock, 2 x (capacity rate cost), then the
     * concurrency limit, its ttl and the slot id. */
    snprintf(want, sizeof(want),
             "EVALSHA|%s|3|%s|%s|%s||100|2.5|1|10|0.5|3|conc|4|%lld|s.1.2",
             tb_algo_script_sha1(TB_ALGO_TOKEN_BUCKET), k.keys[0], k.keys[1],
             ckey, (long long)TB_CONCURRENCY_TTL_MS);
    assert_string_equal(got, want);
}

static void test_argv_lease_clock_and_settle(void **unused)
{
    tb_request_t q;
    tb_take_t t[1];
    tb__call_t k;
    char want[1024], got[1024];
    int64_t now = 1700000000123;
    const char *sha = tb_algo_script_sha1(TB_ALGO_TOKEN_BUCKET);
    int argc;

    (void)unused;
    fill(&q, t, 1);
    q.lease = 20;
    q.lease_back = 7;
    q.now_ms = &now;
    assert_true(tb__call_prepare(&q, k.takes, k.keys));
    k.what = TB__CALL_DECIDE;
    k.conc = NULL;
    k.slot_id = NULL;
    argc = tb__call_argv(&q, &k);
    joined(argc, k.argv, k.argvlen, got, sizeof(got));
    snprintf(want, sizeof(want),
             "EVALSHA|%s|1|%s|1700000000123|100|2.5|1|20|7", sha, k.keys[0]);
    assert_string_equal(got, want);

    /* A settlement never carries the lease: 'settle' ends the call. */
    q.now_ms = NULL;
    k.takes[0].cost = -4.5;
    k.what = TB__CALL_SETTLE;
    argc = tb__call_argv(&q, &k);
    joined(argc, k.argv, k.argvlen, got, sizeof(got));
    snprintf(want, sizeof(want), "EVALSHA|%s|1|%s||100|2.5|-4.5|settle", sha,
             k.keys[0]);
    assert_string_equal(got, want);
}

static void test_prepare_shards_and_suffix(void **unused)
{
    tb_request_t q;
    tb_take_t t[1], takes[TB_MAX_BUCKETS];
    char keys[TB_MAX_BUCKETS][TB_KEY_BUF], base[TB_KEY_BUF];

    (void)unused;
    fill(&q, t, 1);
    q.algo = TB_ALGO_GCRA;
    q.shards = 4;
    q.shard = 3;
    assert_true(tb__call_prepare(&q, takes, keys));
    /* Each of K sub-buckets holds capacity/K and refills at rate/K. */
    assert_true(takes[0].limit.capacity == 25);
    assert_true(takes[0].limit.rate_per_sec == 2.5 / 4);
    assert_true(q.takes[0].limit.capacity == 100); /* Caller's untouched. */
    assert_true(tb_key_build_shard("rl:", "client-1", 8, 3, NULL, base) > 0);
    strcat(base, tb_algo_key_suffix(TB_ALGO_GCRA));
    assert_string_equal(keys[0], base);
}

static void test_prepare_refuses_malformed(void **unused)
{
    tb_request_t q;
    tb_take_t t[2], takes[TB_MAX_BUCKETS];
    char keys[TB_MAX_BUCKETS][TB_KEY_BUF];

    (void)unused;
#define REFUSED(change)                                                      \
    do {                                                                     \
        fill(&q, t, 2);                                                      \
        change;                                                              \
        assert_false(tb__call_prepare(&q, takes, keys));                     \
    } while (0)
    fill(&q, t, 2);
    assert_true(tb__call_prepare(&q, takes, keys));
    REFUSED(q.ntakes = 0);                     /* Nothing to decide. */
    REFUSED(q.ntakes = TB_MAX_BUCKETS + 1);
    REFUSED(q.takes = NULL);
    REFUSED(q.key = NULL);
    REFUSED(q.prefix = "bad prefix");
    REFUSED(t[0].cost = -1);
    REFUSED(t[0].limit.capacity = 0);
    REFUSED(t[1].name = "no spaces");
    REFUSED(t[1].kind = TB_TAKE_MAIN);         /* A name, kind main.   */
    REFUSED(t[1].kind = TB_TAKE_KEYED);        /* Keyed, no key.       */
    REFUSED(q.algo = (tb_algo_t)99);
    REFUSED((q.shards = 4, q.shard = 4));
    REFUSED(q.shards = TB_MAX_SHARDS + 1);
    REFUSED(q.lease_back = 3);                 /* Give back without lease. */
    REFUSED(q.lease = 20);                     /* Lease over two buckets. */
    REFUSED((q.ntakes = 1, q.algo = TB_ALGO_GCRA, q.lease = 20));
    REFUSED((q.ntakes = 1, q.lease = 0.5));    /* Lease below the cost. */
    REFUSED((q.ntakes = 1, q.lease = NAN));    /* Not "no lease". */
    REFUSED((q.algo = TB_ALGO_SLIDING_LOG, t[0].cost = 1.5));
    REFUSED((q.concurrency = 2, q.shards = 2, q.shard = 0));
    REFUSED(q.concurrency = -1);
    REFUSED((q.concurrency = 2, q.concurrency_ttl_ms = -5));
#undef REFUSED
    /* A concurrency limit alone has no bucket. */
    fill(&q, t, 2);
    q.ntakes = 0;
    q.concurrency = 2;
    assert_true(tb__call_prepare(&q, takes, keys));
}

static void test_result_from_reply(void **unused)
{
    tb_request_t q;
    tb_take_t t[2];
    tb_result_t res;
    tb__script_reply_t conc_refused = { { 0, 0, 1000, 2, 0, 4 } };
    tb__script_reply_t route_refused = { { 0, 0, 6000, 1, 0, 1 } };
    tb__script_reply_t allowed = { { 1, 41, 0, 0, 0, 2 } };

    (void)unused;
    fill(&q, t, 2);
    q.concurrency = 4;
    /* Binding index n (past the buckets) is the concurrency limit. */
    memset(&res, 0, sizeof(res));
    tb__call_result(&conc_refused, &q, t, "s.1.1", &res);
    assert_false(res.allowed);
    assert_int_equal(res.refused_by, TB_LIMIT_CONCURRENCY);
    assert_int_equal(res.limit, 4);
    assert_int_equal(res.slot.kind, TB_SLOT_NONE);
    memset(&res, 0, sizeof(res));
    tb__call_result(&route_refused, &q, t, "s.1.2", &res);
    assert_int_equal(res.refused_by, TB_LIMIT_RATE);
    assert_int_equal(res.binding, 1);
    assert_int_equal(res.limit, 10);
    assert_int_equal(res.retry_ms, 6000);
    memset(&res, 0, sizeof(res));
    tb__call_result(&allowed, &q, t, "s.1.3", &res);
    assert_true(res.allowed);
    assert_int_equal(res.remaining, 41);
    assert_int_equal(res.in_flight, 2);
    assert_int_equal(res.slot.kind, TB_SLOT_REDIS);
    assert_string_equal(res.slot.id, "s.1.3");
    assert_int_equal(res.source, TB_SRC_REDIS);

    /* A lease reply without a grant took the cost only. */
    fill(&q, t, 1);
    q.lease = 20;
    memset(&res, 0, sizeof(res));
    tb__call_result(&allowed, &q, t, NULL, &res);
    assert_int_equal(res.granted, 1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fmt_num_is_17g),
        cmocka_unit_test(test_fmt_num_short_buffer),
        cmocka_unit_test(test_argv_decision_layout),
        cmocka_unit_test(test_argv_lease_clock_and_settle),
        cmocka_unit_test(test_prepare_shards_and_suffix),
        cmocka_unit_test(test_prepare_refuses_malformed),
        cmocka_unit_test(test_result_from_reply),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
