/* test_breaker.c -- unit tests for tb_breaker.c, the circuit breaker.
 *
 * The breaker takes `now` as an argument, so every test walks it through
 * closed -> open -> half-open -> closed (or back to open) with injected
 * microseconds and never sleeps.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "tb_int.h"

#define MS 1000 /* Microseconds per millisecond. */

static void test_breaker_starts_closed(void **state)
{
    tb_breaker_t b;

    (void)state;
    memset(&b, 0x5a, sizeof(b));
    tb_breaker_init(&b, 3, 1000);
    assert_int_equal(b.state, TB_BREAKER_CLOSED);
    assert_int_equal(b.failures, 0);
    assert_int_equal(b.threshold, 3);
    assert_int_equal(b.cooldown_us, 1000 * MS);
    assert_int_equal(tb_breaker_allow(&b, 0), 1);
    assert_int_equal(tb_breaker_wait_ms(&b, 0), 0);
}

/* Fewer than threshold consecutive failures keep it closed; a success
 * resets the count, so only consecutive failures add up. */
static void test_breaker_counts_consecutive_failures(void **state)
{
    tb_breaker_t b;
    int k;

    (void)state;
    tb_breaker_init(&b, 3, 1000);
    for (k = 0; k < 10; k++) {
        assert_int_equal(tb_breaker_allow(&b, k * MS), 1);
        assert_int_equal(tb_breaker_failure(&b, k * MS), 0);
        assert_int_equal(tb_breaker_allow(&b, k * MS), 1);
        assert_int_equal(tb_breaker_failure(&b, k * MS), 0);
        assert_int_equal(tb_breaker_allow(&b, k * MS), 1);
        assert_int_equal(tb_breaker_success(&b, k * MS), 0);
        assert_int_equal(b.state, TB_BREAKER_CLOSED);
        assert_int_equal(b.failures, 0);
    }
}

/* The threshold-th failure opens it (reported once); while open nothing
 * is allowed and the wait counts down to the end of the cooldown. */
static void test_breaker_opens_at_threshold(void **state)
{
    tb_breaker_t b;
    tb_monotime_us t0 = 5000 * MS;

    (void)state;
    tb_breaker_init(&b, 3, 1000);
    assert_int_equal(tb_breaker_failure(&b, t0), 0);
    assert_int_equal(tb_breaker_failure(&b, t0), 0);
    assert_int_equal(tb_breaker_failure(&b, t0), 1);
    assert_int_equal(b.state, TB_BREAKER_OPEN);
    assert_int_equal(tb_breaker_allow(&b, t0), 0);
    assert_int_equal(tb_breaker_wait_ms(&b, t0), 1000);
    assert_int_equal(tb_breaker_allow(&b, t0 + 400 * MS), 0);
    assert_int_equal(tb_breaker_wait_ms(&b, t0 + 400 * MS), 600);
    assert_int_equal(tb_breaker_allow(&b, t0 + 999 * MS), 0);
    assert_true(tb_breaker_wait_ms(&b, t0 + 999 * MS) >= 1);
    assert_int_equal(b.state, TB_BREAKER_OPEN);
    /* A late failure report while open is not a second transition. */
    assert_int_equal(tb_breaker_failure(&b, t0 + 10 * MS), 0);
}

/* After the cooldown exactly one probe goes through (half-open); its
 * success closes the breaker and the close is reported once. */
static void test_breaker_probe_success_closes(void **state)
{
    tb_breaker_t b;
    tb_monotime_us t0 = 1 * MS;
    int k;

    (void)state;
    tb_breaker_init(&b, 2, 500);
    tb_breaker_failure(&b, t0);
    assert_int_equal(tb_breaker_failure(&b, t0), 1);
    assert_int_equal(tb_breaker_allow(&b, t0 + 500 * MS), 1);
    assert_int_equal(b.state, TB_BREAKER_HALF_OPEN);
    for (k = 0; k < 5; k++) {
        /* The probe is in flight: nobody else goes. */
        assert_int_equal(tb_breaker_allow(&b, t0 + (501 + k) * MS), 0);
    }
    assert_int_equal(tb_breaker_success(&b, t0 + 510 * MS), 1);
    assert_int_equal(b.state, TB_BREAKER_CLOSED);
    assert_int_equal(b.failures, 0);
    assert_int_equal(tb_breaker_allow(&b, t0 + 511 * MS), 1);
    assert_int_equal(tb_breaker_allow(&b, t0 + 511 * MS), 1);
    assert_int_equal(tb_breaker_wait_ms(&b, t0 + 511 * MS), 0);
    /* Closed again: it takes the full threshold to reopen. */
    assert_int_equal(tb_breaker_failure(&b, t0 + 520 * MS), 0);
    assert_int_equal(b.state, TB_BREAKER_CLOSED);
}

/* A failed probe reopens it for a whole new cooldown from the failure. */
static void test_breaker_probe_failure_reopens(void **state)
{
    tb_breaker_t b;
    tb_monotime_us t1;

    (void)state;
    tb_breaker_init(&b, 1, 1000);
    assert_int_equal(tb_breaker_failure(&b, 0), 1);
    assert_int_equal(tb_breaker_allow(&b, 1000 * MS), 1);
    t1 = 1200 * MS;
    tb_breaker_failure(&b, t1);
    assert_int_equal(b.state, TB_BREAKER_OPEN);
    assert_int_equal(tb_breaker_allow(&b, t1), 0);
    assert_int_equal(tb_breaker_wait_ms(&b, t1), 1000);
    assert_int_equal(tb_breaker_allow(&b, t1 + 999 * MS), 0);
    assert_int_equal(tb_breaker_allow(&b, t1 + 1000 * MS), 1);
    assert_int_equal(b.state, TB_BREAKER_HALF_OPEN);
}

/* Many cycles: every opening is reported exactly once and every probe
 * that succeeds is reported exactly once. */
static void test_breaker_transitions_reported_once(void **state)
{
    tb_breaker_t b;
    tb_monotime_us now = 0;
    int k, opens = 0, closes = 0, f;

    (void)state;
    tb_breaker_init(&b, 4, 100);
    for (k = 0; k < 50; k++) {
        for (f = 0; f < 4; f++) {
            if (tb_breaker_allow(&b, now)) {
                opens += tb_breaker_failure(&b, now);
            }
            now += MS;
        }
        assert_int_equal(b.state, TB_BREAKER_OPEN);
        now += 100 * MS;
        assert_int_equal(tb_breaker_allow(&b, now), 1);
        closes += tb_breaker_success(&b, now);
    }
    assert_int_equal(opens, 50);
    assert_int_equal(closes, 50);
}

/* A clock that reads earlier than the opening (a caller bug, since the
 * clock is monotonic) does not open the gate early. */
static void test_breaker_clock_backwards(void **state)
{
    tb_breaker_t b;
    tb_monotime_us t0 = 100000 * MS;

    (void)state;
    tb_breaker_init(&b, 1, 1000);
    tb_breaker_failure(&b, t0);
    assert_int_equal(tb_breaker_allow(&b, t0 - 5000 * MS), 0);
    assert_true(tb_breaker_wait_ms(&b, t0 - 5000 * MS) >= 1000);
    assert_int_equal(tb_breaker_allow(&b, t0 + 1000 * MS), 1);
}

static void test_breaker_state_names(void **state)
{
    const char *c = tb_breaker_state_name(TB_BREAKER_CLOSED);
    const char *o = tb_breaker_state_name(TB_BREAKER_OPEN);
    const char *h = tb_breaker_state_name(TB_BREAKER_HALF_OPEN);

    (void)state;
    assert_non_null(c);
    assert_non_null(o);
    assert_non_null(h);
    assert_string_equal(c, "closed");
    assert_string_equal(o, "open");
    assert_true(strcmp(h, c) != 0 && strcmp(h, o) != 0);
    /* An out-of-range value still names something. */
    assert_non_null(tb_breaker_state_name((tb_breaker_state_t)42));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_breaker_starts_closed),
        cmocka_unit_test(test_breaker_counts_consecutive_failures),
        cmocka_unit_test(test_breaker_opens_at_threshold),
        cmocka_unit_test(test_breaker_probe_success_closes),
        cmocka_unit_test(test_breaker_probe_failure_reopens),
        cmocka_unit_test(test_breaker_transitions_reported_once),
        cmocka_unit_test(test_breaker_clock_backwards),
        cmocka_unit_test(test_breaker_state_names),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
