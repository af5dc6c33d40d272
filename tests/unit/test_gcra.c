/* test_gcra.c -- unit tests of tb_gcra_take() and tb_gcra_settle(), the C
 * twins of shared/algo/tb_gcra.lua: the shared vectors (settlements and the
 * debts they leave included), then exact edge cases (spacing, burst
 * tolerance, rounding near today's clock, all or nothing, a debt's floor).
 * Time is injected; nothing sleeps.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#define AV_STATE tb_gcra_t
#define AV_TAKE tb_gcra_take
#define AV_SETTLE tb_gcra_settle
#include "algo_vectors.h"

/* The text is the TAT ("-": no key). */
static int av_state_ok(int i, const char *text)
{
    if (strcmp(text, "-") == 0) {
        return !av_st[i].exists;
    }
    return av_st[i].exists && av_st[i].tat_ms == strtod(text, NULL);
}

static void test_gcra_vectors(void **unused)
{
    (void)unused;
    av_check("gcra.tsv", 50);
}

/* CAPACITY 1: exactly one request per emission interval, and the retry
 * says to the millisecond when the next one passes. */
static void test_gcra_spacing(void **unused)
{
    tb_gcra_t st = { 0, 0 };
    tb_verdict_t v;
    int64_t t;
    int allowed = 0;

    (void)unused;
    assert_true(take1(&st, 1, 10, 1, 0, &v));
    for (t = 1; t < 100; t++) {
        assert_false(take1(&st, 1, 10, 1, t, &v));
        assert_int_equal(v.retry_ms, 100 - t);
    }
    assert_true(take1(&st, 1, 10, 1, 100, &v));
    /* One attempt per ms for 10 s after that: one pass per 100 ms. */
    for (t = 101; t <= 10100; t++) {
        allowed += take1(&st, 1, 10, 1, t, &v);
    }
    assert_int_equal(allowed, 100);
}

/* Burst tolerance CAPACITY: a full burst at once, then the long-run rate:
 * over T ms at most CAPACITY + RATE * T. */
static void test_gcra_burst_tolerance(void **unused)
{
    tb_gcra_t st = { 0, 0 };
    tb_verdict_t v;
    int64_t t;
    int i, allowed = 0;

    (void)unused;
    for (i = 0; i < 5; i++) {
        assert_true(take1(&st, 5, 2, 1, 0, &v));
        assert_int_equal(v.remaining, 4 - i);
    }
    assert_false(take1(&st, 5, 2, 1, 0, &v));
    assert_int_equal(v.retry_ms, 500);
    for (t = 1; t <= 10000; t++) {
        allowed += take1(&st, 5, 2, 1, t, &v);
    }
    assert_int_equal(allowed, 20); /* 5 at t=0 + 2/s * 10 s = 25 total. */
    /* Idle for the whole tolerance: a full burst again. */
    for (i = 0; i < 5; i++) {
        assert_true(take1(&st, 5, 2, 1, 20000, &v));
    }
    assert_false(take1(&st, 5, 2, 1, 20000, &v));
}

/* Near today's clock a stored TAT is rounded to ~0.24 us; EPS absorbs it,
 * so a burst of CAPACITY at 1/3 ms intervals is never cut short. */
static void test_gcra_big_clock_rounding(void **unused)
{
    const int64_t big = 1764000000000LL;
    tb_gcra_t st = { 0, 0 };
    tb_verdict_t v;
    int i, allowed = 0;

    (void)unused;
    for (i = 0; i < 100; i++) {
        allowed += take1(&st, 30, 3, 1, big, &v);
    }
    assert_int_equal(allowed, 30);
    assert_int_equal(v.retry_ms, 334);
}

static void test_gcra_all_or_nothing(void **unused)
{
    tb_gcra_t st[2] = { { 0, 0 }, { 0, 0 } };
    tb_limit_t l[2] = { { 5, 1 }, { 2, 10 } };
    double c[2] = { 1, 1 };
    tb_verdict_t v;

    (void)unused;
    assert_int_equal(tb_gcra_take(st, l, c, 2, 0, st, &v), TB_OK);
    assert_int_equal(tb_gcra_take(st, l, c, 2, 0, st, &v), TB_OK);
    assert_true(v.allowed);
    assert_int_equal(v.binding, 1);
    assert_int_equal(tb_gcra_take(st, l, c, 2, 0, st, &v), TB_OK);
    assert_false(v.allowed);
    assert_int_equal(v.binding, 1);
    assert_int_equal(v.retry_ms, 100);
    /* The first bucket was not charged for the refused call. */
    assert_true(st[0].tat_ms == 2000.0);
    c[1] = 3; /* More than capacity: never, whatever else waits. */
    assert_int_equal(tb_gcra_take(st, l, c, 2, 0, st, &v), TB_OK);
    assert_int_equal(v.retry_ms, -1);
}

/* A settlement into debt: nothing passes until the debt and the cost are
 * paid, the debt never exceeds one capacity, a refund never goes past a
 * full bucket. */
static void test_gcra_settle_debt(void **unused)
{
    tb_gcra_t st = { 0, 0 };
    tb_limit_t l = { 10, 2 };
    double d = 1e9;
    tb_verdict_t v;

    (void)unused;
    assert_true(take1(&st, 10, 2, 1, 0, &v));
    assert_int_equal(tb_gcra_settle(&st, &l, &d, 1, 0, &st, &v), TB_OK);
    /* Floor: a TAT two capacities (10 s) ahead. */
    assert_true(st.tat_ms == 10000.0);
    assert_int_equal(v.allowed, 0);
    assert_int_equal(v.retry_ms, 5000);
    assert_false(take1(&st, 10, 2, 1, 0, &v));
    assert_int_equal(v.retry_ms, 5500);
    assert_false(take1(&st, 10, 2, 1, 5499, &v));
    assert_true(take1(&st, 10, 2, 1, 5500, &v));
    d = -1e9;
    assert_int_equal(tb_gcra_settle(&st, &l, &d, 1, 6000, &st, &v), TB_OK);
    assert_true(st.tat_ms == 6000.0);
    assert_int_equal(v.remaining, 10);
    d = NAN;
    assert_int_equal(tb_gcra_settle(&st, &l, &d, 1, 6000, &st, &v), TB_ERR);
}

/* Refused: a capacity below one, no rate, no bucket, a negative cost, no
 * input state. */
static void test_gcra_bad_args(void **unused)
{
    static const struct {
        tb_limit_t l;
        double cost;
        int n;
    } bad[] = {
        { { 0.5, 1 }, 1, 1 },
        { { 1, 0 }, 1, 1 },
        { { 1, 1 }, 1, 0 },
        { { 1, 1 }, -1, 1 },
    };
    const tb_limit_t ok = { 1, 1 };
    const double one = 1;
    tb_gcra_t st = { 0, 0 };
    tb_verdict_t v;
    size_t k;

    (void)unused;
    for (k = 0; k < sizeof(bad) / sizeof(bad[0]); k++) {
        assert_int_equal(tb_gcra_take(&st, &bad[k].l, &bad[k].cost, bad[k].n,
                                      0, &st, &v), TB_ERR);
    }
    assert_int_equal(tb_gcra_take(NULL, &ok, &one, 1, 0, &st, &v), TB_ERR);
}

static void test_gcra_algo_names(void **unused)
{
    tb_algo_t a;
    int i;

    (void)unused;
    for (i = 0; i < TB_ALGO_COUNT; i++) {
        assert_int_equal(tb_algo_parse(tb_algo_name((tb_algo_t)i), &a),
                         TB_OK);
        assert_int_equal(a, i);
        assert_non_null(tb_algo_script_source((tb_algo_t)i));
        assert_int_equal(strlen(tb_algo_script_sha1((tb_algo_t)i)), 40);
    }
    assert_int_equal(tb_algo_parse("leaky", &a), TB_ERR);
    assert_int_equal(tb_algo_parse(NULL, &a), TB_ERR);
    assert_string_equal(tb_algo_name((tb_algo_t)99), "unknown");
    assert_null(tb_algo_script_sha1((tb_algo_t)99));
    assert_string_equal(tb_algo_key_suffix(TB_ALGO_TOKEN_BUCKET), "");
    assert_string_equal(tb_algo_key_suffix(TB_ALGO_GCRA), ":gcra");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gcra_vectors),
        cmocka_unit_test(test_gcra_spacing),
        cmocka_unit_test(test_gcra_burst_tolerance),
        cmocka_unit_test(test_gcra_big_clock_rounding),
        cmocka_unit_test(test_gcra_all_or_nothing),
        cmocka_unit_test(test_gcra_settle_debt),
        cmocka_unit_test(test_gcra_bad_args),
        cmocka_unit_test(test_gcra_algo_names),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
