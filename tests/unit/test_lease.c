/* test_lease.c -- unit tests for tb_lease.c, a decision made with the
 * host's lease table: paid from it, or sized, asked for and kept.
 *
 * tb_lease.c is pure table logic: the tests play the part of the client
 * (and of Redis's answer) between tb__lease_begin and tb__lease_end, with
 * the clock injected through tb_clock_now_us; nothing sleeps and no Redis
 * runs. What the client does with the steps is tested end to end by the
 * module's and the shim's lease tests.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "tb_int.h"
#include "unit_common.h"

static tb_monotime_us fake_now_us;

static tb_monotime_us fake_clock(void)
{
    return fake_now_us;
}

typedef struct fixture {
    void *mem;
    tb__leases_t ls;
    tb_take_t take;
    tb_request_t q;
} fixture_t;

static int setup(void **state)
{
    fixture_t *f = calloc(1, sizeof(*f));

    f->mem = malloc(tb_lease_size(64));
    f->ls.table = tb_lease_init(f->mem, 64);
    f->ls.epoch = tb_lease_epoch(f->ls.table);
    f->ls.owner = 7;
    unit_take(&f->take, 100, 10, 1);
    unit_request(&f->q, "rl:", "alice", &f->take, 1);
    f->q.lease = 20;
    f->q.lease_ttl_ms = 1000;
    fake_now_us = 1000000000;
    tb_clock_now_us = fake_clock;
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    fixture_t *f = *state;

    free(f->mem);
    free(f);
    return 0;
}

/* Redis's answer to the call of a plan: allowed, granted tokens. */
static void redis_grants(tb_result_t *res, int64_t granted)
{
    memset(res, 0, sizeof(*res));
    res->allowed = 1;
    res->granted = granted;
    res->remaining = 50;
    res->source = TB_SRC_REDIS;
}

/* Take a lease of `granted`, then spend it: every request it holds is
 * paid without a call, the next one asks again. */
static void test_lease_grant_then_spend(void **state)
{
    fixture_t *f = *state;
    tb__lease_step_t st;
    tb_result_t res;
    int i;

    assert_int_equal(tb__lease_begin(&f->ls, &f->q, &st, &res),
                     TB__LEASE_CALL);
    assert_true(st.plan.want >= 1 && st.plan.want <= 20);
    assert_string_equal(st.rkey, "rl:{alice}");
    assert_int_equal(st.info.owner, 7);
    redis_grants(&res, 5);
    assert_true(tb__lease_end(&f->ls, &f->q, &st, &res) == 0);
    /* The bucket's remainder and the four kept. */
    assert_int_equal(res.remaining, 54);
    for (i = 0; i < 4; i++) {
        assert_int_equal(tb__lease_begin(&f->ls, &f->q, &st, &res),
                         TB__LEASE_PAID);
        assert_int_equal(res.source, TB_SRC_LEASE);
        assert_int_equal(res.allowed, 1);
        assert_int_equal(res.remaining, 3 - i);
        assert_true(res.limit == 100);
    }
    assert_int_equal(tb__lease_begin(&f->ls, &f->q, &st, &res),
                     TB__LEASE_CALL);
}

/* A busy key's leases grow toward N: the plan follows its traffic. */
static void test_lease_size_follows_traffic(void **state)
{
    fixture_t *f = *state;
    tb__lease_step_t st;
    tb_result_t res;
    double first = 0, last = 0;
    int i, r;

    for (i = 0; i < 200; i++) {
        fake_now_us += 5000;
        r = tb__lease_begin(&f->ls, &f->q, &st, &res);
        if (r == TB__LEASE_CALL) {
            first = first ? first : st.plan.want;
            last = st.plan.want;
            redis_grants(&res, (int64_t)st.plan.want);
            tb__lease_end(&f->ls, &f->q, &st, &res);
        }
    }
    assert_true(first < 20);
    assert_true(last == 20);
}

/* An expired lease's tokens go back in the next call (plan.back, noted
 * in lease_returned); if the failure policy answers instead, they stay
 * the host's and granted is cleared. */
static void test_lease_expired_tokens_back(void **state)
{
    fixture_t *f = *state;
    tb__lease_step_t st;
    tb_result_t res;

    tb__lease_begin(&f->ls, &f->q, &st, &res);
    redis_grants(&res, 10);
    tb__lease_end(&f->ls, &f->q, &st, &res);
    fake_now_us += 2000000;
    assert_int_equal(tb__lease_begin(&f->ls, &f->q, &st, &res),
                     TB__LEASE_CALL);
    assert_true(st.plan.back == 9);
    memset(&res, 0, sizeof(res));
    res.allowed = 1;
    res.granted = 3;
    res.source = TB_SRC_OPEN;
    assert_true(tb__lease_end(&f->ls, &f->q, &st, &res) == 0);
    assert_int_equal(res.granted, 0);
    assert_true(res.lease_returned == 0);
    /* Kept again: the next plan offers them back once more. */
    fake_now_us += 2000000;
    tb__lease_begin(&f->ls, &f->q, &st, &res);
    assert_true(st.plan.back == 9);
    redis_grants(&res, 1);
    tb__lease_end(&f->ls, &f->q, &st, &res);
    assert_true(res.lease_returned == 9);
}

/* Once the host drains the table, its clients stop leasing, and a grant
 * planned before the drain is handed back for the caller to return. */
static void test_lease_drained_table(void **state)
{
    fixture_t *f = *state;
    tb__lease_step_t st;
    tb_result_t res;

    assert_int_equal(tb__lease_begin(&f->ls, &f->q, &st, &res),
                     TB__LEASE_CALL);
    tb_lease_drain(f->ls.table, NULL, NULL);
    redis_grants(&res, 8);
    assert_true(tb__lease_end(&f->ls, &f->q, &st, &res) == 7);
    assert_int_equal(tb__lease_begin(&f->ls, &f->q, &st, &res),
                     TB__LEASE_NONE);
}

/* Requests a lease cannot serve are decided without one. */
static void test_lease_not_applicable(void **state)
{
    fixture_t *f = *state;
    tb_take_t two[2];
    tb__lease_step_t st;
    tb_result_t res;
    tb_request_t q;

    q = f->q;
    q.algo = TB_ALGO_GCRA;
    assert_int_equal(tb__lease_begin(&f->ls, &q, &st, &res), TB__LEASE_NONE);
    q = f->q;
    q.concurrency = 2;
    assert_int_equal(tb__lease_begin(&f->ls, &q, &st, &res), TB__LEASE_NONE);
    q = f->q;
    two[0] = two[1] = f->take;
    q.takes = two;
    q.ntakes = 2;
    assert_int_equal(tb__lease_begin(&f->ls, &q, &st, &res), TB__LEASE_NONE);
    q = f->q;
    two[0].cost = 0.5;
    q.takes = two;
    q.ntakes = 1;
    assert_int_equal(tb__lease_begin(&f->ls, &q, &st, &res), TB__LEASE_NONE);
    q = f->q;
    q.lease = 2.5;
    assert_int_equal(tb__lease_begin(&f->ls, &q, &st, &res), TB__LEASE_NONE);
    q = f->q;
    q.prefix = "bad prefix";
    assert_int_equal(tb__lease_begin(&f->ls, &q, &st, &res), TB__LEASE_NONE);
}

/* A shard's lease is the shard's bucket, with its share of the limit. */
static void test_lease_shard_key(void **state)
{
    fixture_t *f = *state;
    tb__lease_step_t st;
    tb_result_t res;

    f->q.shards = 4;
    f->q.shard = 2;
    assert_int_equal(tb__lease_begin(&f->ls, &f->q, &st, &res),
                     TB__LEASE_CALL);
    assert_string_equal(st.rkey, "rl:{alice s2}");
    assert_true(st.info.limit.capacity == 25);
    assert_true(st.info.limit.rate_per_sec == 2.5);
}

/* A reported cost is settled in the key's lease when it covers it: more
 * spends from it, less gives to it; with no lease, Redis settles. */
static void test_lease_settle(void **state)
{
    fixture_t *f = *state;
    tb__lease_step_t st;
    tb_result_t res;

    assert_int_equal(tb__lease_settle(&f->ls, &f->q, 3, &res), 0);
    tb__lease_begin(&f->ls, &f->q, &st, &res);
    redis_grants(&res, 6);
    tb__lease_end(&f->ls, &f->q, &st, &res);
    assert_int_equal(tb__lease_settle(&f->ls, &f->q, 3, &res), 1);
    assert_int_equal(res.source, TB_SRC_LEASE);
    /* 5 kept, 2 more spent: 3 left; a cost 0 gives 1 back: 4. */
    assert_int_equal(tb__lease_settle(&f->ls, &f->q, 0, &res), 1);
    assert_int_equal(tb__lease_begin(&f->ls, &f->q, &st, &res),
                     TB__LEASE_PAID);
    assert_int_equal(res.remaining, 3);
    assert_int_equal(tb__lease_settle(&f->ls, &f->q, 50, &res), 0);
}

/* Without a table nothing is leased. */
static void test_lease_no_table(void **state)
{
    fixture_t *f = *state;
    tb__leases_t none = { NULL, 0, 0 };
    tb__lease_step_t st;
    tb_result_t res;

    assert_int_equal(tb__lease_begin(&none, &f->q, &st, &res),
                     TB__LEASE_NONE);
    assert_int_equal(tb__lease_settle(&none, &f->q, 2, &res), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_lease_grant_then_spend, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_lease_size_follows_traffic,
                                        setup, teardown),
        cmocka_unit_test_setup_teardown(test_lease_expired_tokens_back,
                                        setup, teardown),
        cmocka_unit_test_setup_teardown(test_lease_drained_table, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_lease_not_applicable, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_lease_shard_key, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_lease_settle, setup, teardown),
        cmocka_unit_test_setup_teardown(test_lease_no_table, setup,
                                        teardown),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
