/* test_slog.c -- unit tests of tb_slog_take(), the C twin of
 * shared/algo/tb_slog.lua: the shared vectors, then its exactness: on a
 * random trace every decision equals a brute-force count over the full
 * history, and every retry is exact to the millisecond. Time is injected.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "algo_vectors.h"
#include "unit_common.h"

#define SLOTS 256

static int64_t av_mem[TB_MAX_BUCKETS][SLOTS];
static tb_slog_t av_st[TB_MAX_BUCKETS];

static void av_reset(int n)
{
    int i;

    (void)n;
    for (i = 0; i < TB_MAX_BUCKETS; i++) {
        av_st[i].ts_ms = av_mem[i];
        av_st[i].len = 0;
        av_st[i].slots = SLOTS;
    }
}

static int av_take(const av_row_t *r, tb_verdict_t *v)
{
    if (r->settle) {
        return TB_ERR; /* The window scripts have no settle mode. */
    }
    return tb_slog_take(av_st, r->lim, r->cost, r->n, r->now_ms, v);
}

static int av_state_ok(int i, const char *text)
{
    char buf[4096], *p = buf;
    size_t k = 0;

    if (strcmp(text, "-") == 0) {
        return av_st[i].len == 0;
    }
    snprintf(buf, sizeof(buf), "%s", text);
    while (p && *p) {
        if (k >= av_st[i].len || av_st[i].ts_ms[k] != strtoll(p, NULL, 10)) {
            return 0;
        }
        k++;
        p = strchr(p, ',');
        p = p ? p + 1 : NULL;
    }
    return k == av_st[i].len;
}

static void test_slog_vectors(void **unused)
{
    (void)unused;
    av_check("sliding_log.tsv", 40);
}

/* Random trace, costs 1..3, 25 per 1000 ms: each decision matches a
 * brute-force count of admitted units in (now - 1000, now]; each refusal's
 * retry is the first millisecond at which it would pass. */
static void test_slog_exact(void **unused)
{
    static int64_t hist[20000], mem[64], probe_mem[64];
    tb_slog_t log = { mem, 0, 64 };
    tb_limit_t l = { 25, 25 };
    tb_verdict_t v;
    uint32_t x = 777;
    int64_t t = 0;
    size_t nh = 0, i;
    int step;

    (void)unused;
    for (step = 0; step < 5000; step++) {
        double cost;
        int64_t inwin = 0;

        x = x * 1103515245u + 12345u;
        t += (x >> 8) % 60;
        x = x * 1103515245u + 12345u;
        cost = 1 + (double)((x >> 8) % 3);
        for (i = 0; i < nh; i++) {
            inwin += hist[i] > t - 1000;
        }
        assert_int_equal(tb_slog_take(&log, &l, &cost, 1, t, &v), TB_OK);
        assert_int_equal(v.allowed, inwin + cost <= 25);
        assert_int_equal((int64_t)log.len, inwin + (v.allowed ? cost : 0));
        if (v.allowed) {
            for (i = 0; i < (size_t)cost && nh < 20000; i++) {
                hist[nh++] = t;
            }
        }
        else {
            tb_slog_t probe = { probe_mem, log.len, 64 };
            tb_verdict_t pv;

            memcpy(probe_mem, mem, log.len * sizeof(int64_t));
            assert_int_equal(tb_slog_take(&probe, &l, &cost, 1,
                                          t + v.retry_ms - 1, &pv), TB_OK);
            assert_false(pv.allowed);
            probe.len = log.len;
            memcpy(probe_mem, mem, log.len * sizeof(int64_t));
            assert_int_equal(tb_slog_take(&probe, &l, &cost, 1,
                                          t + v.retry_ms, &pv), TB_OK);
            assert_true(pv.allowed);
        }
    }
}

static void test_slog_bad_args(void **unused)
{
    int64_t mem[4];
    tb_slog_t log = { mem, 0, 4 };
    tb_limit_t l = { 4, 1 };
    double c = 1.5;
    tb_verdict_t v;

    (void)unused;
    assert_int_equal(tb_slog_take(&log, &l, &c, 1, 0, &v), TB_ERR);
    c = 1;
    l.capacity = 5; /* More than the slots. */
    assert_int_equal(tb_slog_take(&log, &l, &c, 1, 0, &v), TB_ERR);
    l.capacity = 4;
    assert_int_equal(tb_slog_take(&log, &l, &c, 1, 0, &v), TB_OK);
    log.ts_ms = NULL;
    assert_int_equal(tb_slog_take(&log, &l, &c, 1, 0, &v), TB_ERR);
}

/* The client refuses, before any I/O, what the log cannot store: a
 * fractional cost, a capacity over TB_SLOG_MAX_CAPACITY, or an unknown
 * algorithm. */
static void test_slog_client_checks(void **unused)
{
    tb_options_t o;
    tb_client_t *c;
    tb_take_t t;
    tb_request_t q;
    tb_result_t res;
    char err[128];

    (void)unused;
    tb_options_init(&o);
    o.url = "redis://127.0.0.1:1";
    c = tb_client_create(&o, err, sizeof(err));
    assert_non_null(c);
    unit_take(&t, 10, 1, 1.5);
    unit_request(&q, "p:", "k", &t, 1);
    q.algo = TB_ALGO_SLIDING_LOG;
    assert_int_equal(tb_client_run(c, &q, &res), TB_ERR);
    assert_int_equal(res.err, TB_ERR_ARG);
    t.cost = 1;
    t.limit.capacity = TB_SLOG_MAX_CAPACITY + 1;
    assert_int_equal(tb_client_run(c, &q, &res), TB_ERR);
    assert_int_equal(res.err, TB_ERR_ARG);
    t.limit.capacity = 10;
    q.algo = (tb_algo_t)99;
    assert_int_equal(tb_client_run(c, &q, &res), TB_ERR);
    assert_int_equal(res.err, TB_ERR_ARG);
    assert_int_equal(tb_client_stats(c)->decisions, 0);
    tb_client_free(c);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_slog_vectors),
        cmocka_unit_test(test_slog_exact),
        cmocka_unit_test(test_slog_bad_args),
        cmocka_unit_test(test_slog_client_checks),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
