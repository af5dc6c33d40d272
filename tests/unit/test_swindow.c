/* test_swindow.c -- unit tests of tb_swindow_take(), the C twin of
 * shared/algo/tb_swindow.lua: the shared vectors, the exact weighting of
 * the previous window, and the documented approximation: its worst case
 * against the exact sliding log (tb_slog_take) on a crafted trace, and its
 * error on a bursty trace. Time is injected; nothing sleeps.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#define AV_STATE tb_window_t
#define AV_TAKE tb_swindow_take
#define AV_WINDOW
#include "algo_vectors.h"

static void test_swindow_vectors(void **unused)
{
    (void)unused;
    av_check("sliding_window.tsv", 40);
}

/* A full previous window (10 of 10) weighs 1 - f at a fraction f into the
 * current one: 0, 2, 5 and 7 more pass at f = 0, .25, .5, .75. */
static void test_swindow_weighting(void **unused)
{
    static const int64_t at[4] = { 1000, 1250, 1500, 1750 };
    static const int want[4] = { 0, 2, 5, 7 };
    int k;

    (void)unused;
    for (k = 0; k < 4; k++) {
        tb_window_t st = { 0, 0, 0, 0 };
        tb_verdict_t v;
        int i, allowed = 0;

        for (i = 0; i < 10; i++) {
            assert_true(take1(&st, 10, 10, 1, 500, &v));
        }
        for (i = 0; i < 20; i++) {
            allowed += take1(&st, 10, 10, 1, at[k], &v);
        }
        assert_int_equal(allowed, want[k]);
    }
}

/* The approximation's worst case, documented: a full burst at the very end
 * of one window is weighted as if spread evenly, so while it is still
 * inside the true sliding window 9 more pass: 19 within 1000 ms for a
 * limit of 10 (the exact log admits 10). */
static void test_swindow_overshoot_vs_log(void **unused)
{
    tb_window_t st = { 0, 0, 0, 0 };
    int64_t slots[16];
    tb_slog_t log = { slots, 0, 16 };
    tb_limit_t l = { 10, 10 };
    double one = 1;
    tb_verdict_t v;
    int64_t t;
    int sw = 0, lg = 0;

    (void)unused;
    for (t = 999; t <= 1998; t++) {
        int i, burst = t == 999 ? 10 : 1;

        for (i = 0; i < burst; i++) {
            sw += take1(&st, 10, 10, 1, t, &v);
            assert_int_equal(tb_slog_take(&log, &l, &one, 1, t, &v), TB_OK);
            lg += v.allowed;
        }
    }
    assert_int_equal(lg, 10);
    assert_int_equal(sw, 19);
}

/* A bursty trace (deterministic LCG): bursts of 1..40 every 0..600 ms
 * against 20 per 1 s. The counter's admissions stay close to the exact
 * log's: reported, and bounded at 10%. */
static void test_swindow_error_on_bursty_trace(void **unused)
{
    static int64_t slots[64];
    tb_window_t st = { 0, 0, 0, 0 };
    tb_slog_t log = { slots, 0, 64 };
    tb_limit_t l = { 20, 20 };
    double one = 1;
    tb_verdict_t v;
    uint32_t x = 12345;
    int64_t t = 0;
    int sw = 0, lg = 0, bursts;

    (void)unused;
    for (bursts = 0; bursts < 2000; bursts++) {
        int i, size;

        x = x * 1103515245u + 12345u;
        t += (x >> 8) % 601;
        x = x * 1103515245u + 12345u;
        size = 1 + (int)((x >> 8) % 40);
        for (i = 0; i < size; i++) {
            sw += take1(&st, 20, 20, 1, t, &v);
            assert_int_equal(tb_slog_take(&log, &l, &one, 1, t, &v), TB_OK);
            lg += v.allowed;
        }
    }
    print_message("sliding window %d vs exact log %d admitted (%+.2f%%)\n",
                  sw, lg, 100.0 * (sw - lg) / lg);
    assert_true(sw <= lg * 1.10 && sw >= lg * 0.90);
}

static void test_swindow_bad_args(void **unused)
{
    tb_window_t st = { 0, 0, 0, 0 };
    tb_limit_t l = { 2e9, 1 };
    double c = 1;
    tb_verdict_t v;

    (void)unused;
    assert_int_equal(tb_swindow_take(&st, &l, &c, 1, 0, &st, &v), TB_ERR);
    assert_int_equal(tb_swindow_take(NULL, &l, &c, 1, 0, &st, &v), TB_ERR);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_swindow_vectors),
        cmocka_unit_test(test_swindow_weighting),
        cmocka_unit_test(test_swindow_overshoot_vs_log),
        cmocka_unit_test(test_swindow_error_on_bursty_trace),
        cmocka_unit_test(test_swindow_bad_args),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
