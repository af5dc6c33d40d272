/* test_fwindow.c -- unit tests of tb_fwindow_take(), the C twin of
 * shared/algo/tb_fwindow.lua: the shared vectors, then the documented double
 * burst at a window boundary, exact retries and all or nothing. Time is
 * injected; nothing sleeps.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#define AV_STATE tb_window_t
#define AV_TAKE tb_fwindow_take
#define AV_WINDOW
#include "algo_vectors.h"

static void test_fwindow_vectors(void **unused)
{
    (void)unused;
    av_check("fixed_window.tsv", 40);
}

/* The documented edge: 100 per 1 s lets 100 through at 999 ms and 100 more
 * at 1000 ms, so 2 * CAPACITY pass within 2 ms. */
static void test_fwindow_boundary_double_burst(void **unused)
{
    tb_window_t st = { 0, 0, 0, 0 };
    tb_verdict_t v;
    int i, allowed = 0;

    (void)unused;
    for (i = 0; i < 150; i++) {
        allowed += take1(&st, 100, 100, 1, 999, &v);
    }
    assert_int_equal(allowed, 100);
    assert_int_equal(v.retry_ms, 1);
    for (i = 0; i < 150; i++) {
        allowed += take1(&st, 100, 100, 1, 1000, &v);
    }
    assert_int_equal(allowed, 200);
    assert_int_equal(v.retry_ms, 1000);
}

/* Never more than CAPACITY within one window, and a refusal's retry lands
 * exactly on the next window's first millisecond. */
static void test_fwindow_per_window_and_retry(void **unused)
{
    tb_window_t st = { 0, 0, 0, 0 };
    tb_verdict_t v;
    int64_t t;
    int per[10] = { 0 };

    (void)unused;
    for (t = 0; t < 10000; t += 7) {
        if (take1(&st, 30, 30, 1, t, &v)) {
            per[t / 1000]++;
        }
        else {
            tb_window_t probe = st;

            assert_true(v.retry_ms >= 1);
            assert_int_equal((t + v.retry_ms) % 1000, 0);
            assert_false(take1(&probe, 30, 30, 1, t + v.retry_ms - 1, &v));
        }
    }
    for (t = 0; t < 10; t++) {
        assert_int_equal(per[t], 30);
    }
}

static void test_fwindow_all_or_nothing(void **unused)
{
    tb_window_t st[2];
    tb_limit_t l[2] = { { 3, 3 }, { 10, 1 } };
    double c[2] = { 1, 1 };
    tb_verdict_t v;
    int i;

    (void)unused;
    memset(st, 0, sizeof(st));
    for (i = 0; i < 3; i++) {
        assert_int_equal(tb_fwindow_take(st, l, c, 2, 0, st, &v), TB_OK);
        assert_true(v.allowed);
    }
    assert_int_equal(tb_fwindow_take(st, l, c, 2, 0, st, &v), TB_OK);
    assert_false(v.allowed);
    assert_int_equal(v.binding, 0);
    assert_true(st[1].cur == 3.0); /* Not charged for the refused call. */
}

static void test_fwindow_bad_args(void **unused)
{
    tb_window_t st = { 0, 0, 0, 0 };
    tb_limit_t l = { 1, -1 };
    double c = 1;
    tb_verdict_t v;

    (void)unused;
    assert_int_equal(tb_fwindow_take(&st, &l, &c, 1, 0, &st, &v), TB_ERR);
    l.rate_per_sec = 1;
    /* More buckets than the core takes in one call: refused before a
     * limit past the first is read. */
    assert_int_equal(tb_fwindow_take(&st, &l, &c, TB_MAX_BUCKETS + 1, 0,
                                     &st, &v), TB_ERR);
    assert_int_equal(tb_fwindow_take(&st, &l, &c, 1, 0, NULL, &v), TB_ERR);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fwindow_vectors),
        cmocka_unit_test(test_fwindow_boundary_double_burst),
        cmocka_unit_test(test_fwindow_per_window_and_retry),
        cmocka_unit_test(test_fwindow_all_or_nothing),
        cmocka_unit_test(test_fwindow_bad_args),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
