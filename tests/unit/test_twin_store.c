/* test_twin_store.c -- unit tests of the twins' functions for hosts that
 * keep the state in a store of their own (tbucket_redis.so keeps it in
 * Redis, as the scripts do): the sliding log decided from a count and one
 * entry (tb_slog_cut_ms, tb_slog_need, tb_slog_decide) over the shared
 * vectors and against tb_slog_take() on a random trace; the TTLs the
 * scripts set (tb_gcra_ttl_ms, tb_fwindow_ttl_ms, tb_swindow_ttl_ms,
 * tb_slog_ttl_ms). Time is injected.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "algo_vectors.h"

/* The store: one sorted log per bucket, as a sorted set holds it. */
static int64_t av_mem[TB_MAX_BUCKETS][256];
static size_t av_len[TB_MAX_BUCKETS];

static void av_reset(int n)
{
    (void)n;
    memset(av_len, 0, sizeof(av_len));
}

/* What tbucket_redis.so does: trim at the cut, count, read the entry
 * tb_slog_need() names, decide, append when allowed. */
static int av_take(const av_row_t *r, tb_verdict_t *v)
{
    tb_slog_count_t c[TB_MAX_BUCKETS];
    int i;
    size_t j;

    if (r->settle) {
        return TB_ERR;
    }
    for (i = 0; i < r->n; i++) {
        double cut = tb_slog_cut_ms(&r->lim[i], r->now_ms);
        size_t k = 0;
        int64_t need;

        while (k < av_len[i] && (double)av_mem[i][k] <= cut) {
            k++;
        }
        memmove(av_mem[i], av_mem[i] + k, (av_len[i] - k) * sizeof(int64_t));
        av_len[i] -= k;
        c[i].count = (double)av_len[i];
        need = tb_slog_need(&r->lim[i], r->cost[i], c[i].count);
        assert_true(need < (int64_t)av_len[i]);
        c[i].nth_ms = need >= 0 ? (double)av_mem[i][need] : 0;
    }
    if (tb_slog_decide(c, r->lim, r->cost, r->n, r->now_ms, v) != TB_OK) {
        return TB_ERR;
    }
    for (i = 0; v->allowed && i < r->n; i++) {
        for (j = 0; j < (size_t)r->cost[i]; j++) {
            av_mem[i][av_len[i]++] = r->now_ms;
        }
    }
    return TB_OK;
}

static int av_state_ok(int i, const char *text)
{
    char buf[4096], *p = buf;
    size_t k = 0;

    if (strcmp(text, "-") == 0) {
        return av_len[i] == 0;
    }
    snprintf(buf, sizeof(buf), "%s", text);
    while (p && *p) {
        if (k >= av_len[i] || av_mem[i][k] != strtoll(p, NULL, 10)) {
            return 0;
        }
        k++;
        p = strchr(p, ',');
        p = p ? p + 1 : NULL;
    }
    return k == av_len[i];
}

/* sliding_log.tsv through the count-and-entry steps. */
static void test_twin_store_slog_vectors(void **unused)
{
    (void)unused;
    av_check("sliding_log.tsv", 40);
}

/* tb_slog_need: nothing when the cost fits or can never fit; else the
 * d-th oldest entry, d = ceil(count + cost - capacity). */
static void test_twin_store_slog_need(void **unused)
{
    tb_limit_t l = { 5, 1 };

    (void)unused;
    assert_int_equal(tb_slog_need(&l, 1, 4), -1);
    assert_int_equal(tb_slog_need(&l, 6, 0), -1);
    assert_int_equal(tb_slog_need(&l, 1, 5), 0);
    assert_int_equal(tb_slog_need(&l, 3, 5), 2);
    assert_int_equal(tb_slog_need(&l, 0, 7), 1);
    assert_true(tb_slog_cut_ms(&l, 10000) == 5000.0);
}

/* Two buckets on a random trace: the steps decide as tb_slog_take() on
 * the same logs, retries included. */
static void test_twin_store_slog_matches_take(void **unused)
{
    static int64_t mem[2][64];
    tb_slog_t logs[2] = { { mem[0], 0, 64 }, { mem[1], 0, 64 } };
    tb_limit_t l[2] = { { 25, 25 }, { 10, 4 } };
    uint32_t x = 99;
    int64_t t = 0;
    int step, i;

    (void)unused;
    for (step = 0; step < 3000; step++) {
        tb_slog_count_t c[2];
        tb_verdict_t v1, v2;
        double cost[2];

        x = x * 1103515245u + 12345u;
        t += (x >> 8) % 80;
        for (i = 0; i < 2; i++) {
            x = x * 1103515245u + 12345u;
            cost[i] = (double)((x >> 8) % 4);
        }
        for (i = 0; i < 2; i++) {
            double cut = tb_slog_cut_ms(&l[i], t);
            size_t k = 0;
            int64_t need;

            while (k < logs[i].len && (double)logs[i].ts_ms[k] <= cut) {
                k++;
            }
            c[i].count = (double)(logs[i].len - k);
            need = tb_slog_need(&l[i], cost[i], c[i].count);
            c[i].nth_ms = need >= 0 ? (double)logs[i].ts_ms[k + need] : 0;
        }
        assert_int_equal(tb_slog_decide(c, l, cost, 2, t, &v1), TB_OK);
        assert_int_equal(tb_slog_take(logs, l, cost, 2, t, &v2), TB_OK);
        assert_int_equal(v1.allowed, v2.allowed);
        assert_int_equal(v1.remaining, v2.remaining);
        assert_int_equal(v1.retry_ms, v2.retry_ms);
        assert_int_equal(v1.binding, v2.binding);
    }
}

static void test_twin_store_slog_bad_args(void **unused)
{
    tb_slog_count_t c = { 1, 0 };
    tb_limit_t l = { 4, 1 };
    tb_verdict_t v;
    double cost = 1.5;

    (void)unused;
    assert_int_equal(tb_slog_decide(&c, &l, &cost, 1, 0, &v), TB_ERR);
    cost = 1;
    c.count = -1;
    assert_int_equal(tb_slog_decide(&c, &l, &cost, 1, 0, &v), TB_ERR);
    c.count = 0;
    assert_int_equal(tb_slog_decide(NULL, &l, &cost, 1, 0, &v), TB_ERR);
    assert_int_equal(tb_slog_decide(&c, &l, &cost, 0, 0, &v), TB_ERR);
    assert_int_equal(tb_slog_decide(&c, &l, &cost, 1, 0, &v), TB_OK);
    /* ceil(capacity * 1000 / rate) + 1000, in the script's order. */
    l.capacity = 10;
    l.rate_per_sec = 3;
    assert_int_equal(tb_slog_ttl_ms(&l), 4334);
}

/* GCRA's PX: ceil(after) + 1000, after the debt the call leaves, taken
 * before the TAT's rounding (at today's clock the stored TAT less now is
 * rounded to 2^-12 ms, and can fall on the integer after has passed). */
static void test_twin_store_gcra_ttl(void **unused)
{
    tb_gcra_t in = { 0, 0 }, out;
    tb_limit_t l = { 10, 7 };
    tb_verdict_t v;
    int64_t ttl[1], now = 1700000000000LL;
    double cost = 1, after = 0, interval = 1000 / 7.0;
    int i;

    (void)unused;
    for (i = 0; i < 10; i++) {
        double debt = in.exists && in.tat_ms > (double)now
                      ? in.tat_ms - (double)now : 0;

        after = debt + cost * interval;
        assert_int_equal(tb_gcra_ttl_ms(&in, &l, &cost, 1, now, 0, ttl),
                         TB_OK);
        assert_int_equal(tb_gcra_take(&in, &l, &cost, 1, now, &out, &v),
                         TB_OK);
        assert_true(v.allowed);
        assert_int_equal(ttl[0], (int64_t)ceil(after) + 1000);
        in = out;
    }
    /* A settlement's TAT is held at 2 * capacity intervals. */
    cost = 1000;
    assert_int_equal(tb_gcra_ttl_ms(&in, &l, &cost, 1, now, 1, ttl), TB_OK);
    assert_int_equal(ttl[0], (int64_t)ceil(2 * 10 * interval) + 1000);
    assert_int_equal(tb_gcra_ttl_ms(&in, &l, &cost, 0, now, 1, ttl), TB_ERR);
    assert_int_equal(tb_gcra_ttl_ms(&in, &l, &cost, 1, now, 0, NULL),
                     TB_ERR);
}

/* The windows' PEXPIRE: to the end of window w (fixed) or of the one
 * after (sliding), plus a second. */
static void test_twin_store_window_ttl(void **unused)
{
    tb_limit_t l = { 10, 4 }; /* W = 2500 ms. */
    tb_window_t st = { 4, 1, 0, 1 };

    (void)unused;
    assert_int_equal(tb_fwindow_ttl_ms(&st, &l, 10100), 2400 + 1000);
    assert_int_equal(tb_swindow_ttl_ms(&st, &l, 10100), 4900 + 1000);
    l.rate_per_sec = 3; /* W = 3333.33... ms: rounded up. */
    st.w = 3;
    assert_int_equal(tb_fwindow_ttl_ms(&st, &l, 10000), 3334 + 1000);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_twin_store_slog_vectors),
        cmocka_unit_test(test_twin_store_slog_need),
        cmocka_unit_test(test_twin_store_slog_matches_take),
        cmocka_unit_test(test_twin_store_slog_bad_args),
        cmocka_unit_test(test_twin_store_gcra_ttl),
        cmocka_unit_test(test_twin_store_window_ttl),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
