/* test_duration.c -- unit tests for the duration grammar every host
 * reads (tb_parse_duration, tb_format_duration in tb_parse.c): units ms,
 * s, m, h and d on a plain decimal, rounded up to a whole ms, a range per
 * option, bare numbers as ms only where asked, one refusal message.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "tb.h"

#define DAY_MS 86400000LL
#define BAN_MAX (30 * DAY_MS)

typedef struct dcase {
    const char *s;
    int64_t min, max;
    unsigned flags;
    int64_t want;                     /* -1: refused. */
} dcase;

static void run_cases(const dcase *t, size_t n)
{
    size_t k;
    int bad = 0;

    for (k = 0; k < n; k++) {
        int64_t ms = -7;
        char err[160] = "";
        int rc = tb_parse_duration(t[k].s, t[k].min, t[k].max, t[k].flags,
                                   &ms, err, sizeof(err));

        if (t[k].want < 0 ? rc != TB_ERR || ms != -7 || !err[0]
                          : rc != TB_OK || ms != t[k].want) {
            print_error("'%s' [%lld..%lld]: rc %d ms %lld err '%s'\n",
                        t[k].s ? t[k].s : "(null)", (long long)t[k].min,
                        (long long)t[k].max, rc, (long long)ms, err);
            bad++;
        }
    }
    if (bad) {
        fail_msg("%d cases failed", bad);
    }
}

/* Every unit, decimals, the range's ends, bare numbers where asked. */
static void test_duration_good(void **state)
{
    static const dcase t[] = {
        {"500ms", 1, 60000, 0, 500},
        {"30s", 1000, BAN_MAX, 0, 30000},
        {"15m", 1000, BAN_MAX, 0, 900000},
        {"1h", 1000, BAN_MAX, 0, 3600000},
        {"1d", 1000, BAN_MAX, 0, DAY_MS},
        {"30d", 1000, BAN_MAX, 0, BAN_MAX},
        {"1.5h", 1000, BAN_MAX, 0, 5400000},
        {"0.5s", 1, 60000, 0, 500},
        {".25s", 1, 60000, 0, 250},
        {"1500ms", 1000, BAN_MAX, 0, 1500},
        {"0.0001s", 1, 60000, 0, 1},  /* rounded up, never to 0 */
        {"1s", 1000, BAN_MAX, 0, 1000},
        {"50", 1, 60000, TB_DURATION_BARE_MS, 50},
        {"60000", 1, 60000, TB_DURATION_BARE_MS, 60000},
        {"0", 0, DAY_MS, TB_DURATION_BARE_MS, 0},
    };

    (void)state;
    run_cases(t, sizeof(t) / sizeof(t[0]));
}

/* Out of range at either end, bare numbers where not asked, other
 * units, spaces, signs, exponents, hex, words. */
static void test_duration_bad(void **state)
{
    static const dcase t[] = {
        {"31d", 1000, BAN_MAX, 0, -1},
        {"720.001h", 1000, BAN_MAX, 0, -1},
        {"999ms", 1000, BAN_MAX, 0, -1},
        {"0s", 1000, BAN_MAX, 0, -1},
        {"0", 1, 60000, TB_DURATION_BARE_MS, -1},
        {"60001", 1, 60000, TB_DURATION_BARE_MS, -1},
        {"2m", 1, 60000, TB_DURATION_BARE_MS, -1},
        {"30", 1000, BAN_MAX, 0, -1},
        {"3x", 1000, BAN_MAX, 0, -1},
        {"1w", 1000, BAN_MAX, 0, -1},
        {"-1s", 1, BAN_MAX, 0, -1},
        {"+1s", 1, BAN_MAX, 0, -1},
        {"1e3s", 1, BAN_MAX, 0, -1},
        {"0x10s", 1, BAN_MAX, 0, -1},
        {" 1s", 1, BAN_MAX, 0, -1},
        {"1s ", 1, BAN_MAX, 0, -1},
        {"1 s", 1, BAN_MAX, 0, -1},
        {"1S", 1, BAN_MAX, 0, -1},
        {"1sms", 1, BAN_MAX, 0, -1},
        {"s", 1, BAN_MAX, 0, -1},
        {".s", 1, BAN_MAX, 0, -1},
        {"", 1, BAN_MAX, TB_DURATION_BARE_MS, -1},
        {"nan", 1, BAN_MAX, 0, -1},
        {"inf", 1, BAN_MAX, TB_DURATION_BARE_MS, -1},
        {"99999999999999999999d", 1, BAN_MAX, 0, -1},
        {NULL, 1, BAN_MAX, 0, -1},
    };

    (void)state;
    run_cases(t, sizeof(t) / sizeof(t[0]));
}

/* One message for every refusal: what is expected and the option's
 * range, written with whole units; a short buffer is not overrun. */
static void test_duration_message(void **state)
{
    char err[160], tiny[8];
    int64_t ms;

    (void)state;
    assert_int_equal(tb_parse_duration("3x", 1000, BAN_MAX, 0, &ms, err,
                                       sizeof(err)), TB_ERR);
    assert_string_equal(err, "expected a duration such as 500ms, 30s, 15m, "
                        "1h or 1d, from 1s to 30d");
    assert_int_equal(tb_parse_duration("0", 1, 60000, TB_DURATION_BARE_MS,
                                       &ms, err, sizeof(err)), TB_ERR);
    assert_string_equal(err, "expected a duration such as 500ms, 30s, 15m, "
                        "1h or 1d (a bare number is ms), from 1ms to 1m");
    memset(tiny, 0x5a, sizeof(tiny));
    assert_int_equal(tb_parse_duration("x", 1, 2, 0, &ms, tiny, 4), TB_ERR);
    assert_int_equal(tiny[3], '\0');
    assert_int_equal(tiny[4], 0x5a);
    assert_int_equal(tb_parse_duration("x", 1, 2, 0, &ms, NULL, 0), TB_ERR);
}

/* The shim's and the tool's reader: the same grammar up to h, bare ms,
 * 0..24h. */
static void test_duration_ms_compat(void **state)
{
    int64_t ms = 0;
    char err[160];

    (void)state;
    assert_int_equal(tb_parse_duration_ms("1.5s", &ms, err, sizeof(err)),
                     TB_OK);
    assert_int_equal(ms, 1500);
    assert_int_equal(tb_parse_duration_ms("250", &ms, err, sizeof(err)),
                     TB_OK);
    assert_int_equal(ms, 250);
    assert_int_equal(tb_parse_duration_ms("24h", &ms, err, sizeof(err)),
                     TB_OK);
    assert_int_equal(ms, DAY_MS);
    assert_int_equal(tb_parse_duration_ms("1d", &ms, err, sizeof(err)),
                     TB_ERR);
    assert_non_null(strstr(err, "from 0ms to 1d"));
}

static void test_duration_format(void **state)
{
    static const struct { int64_t ms; const char *want; } t[] = {
        {0, "0ms"}, {1, "1ms"}, {999, "999ms"}, {1000, "1s"},
        {1500, "1500ms"}, {90000, "90s"}, {60000, "1m"},
        {3600000, "1h"}, {5400000, "90m"}, {DAY_MS, "1d"},
        {BAN_MAX, "30d"}, {DAY_MS + 1000, "86401s"},
    };
    char buf[32];
    size_t k;

    (void)state;
    for (k = 0; k < sizeof(t) / sizeof(t[0]); k++) {
        assert_int_equal(tb_format_duration(t[k].ms, buf, sizeof(buf)),
                         strlen(t[k].want));
        assert_string_equal(buf, t[k].want);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_duration_good),
        cmocka_unit_test(test_duration_bad),
        cmocka_unit_test(test_duration_message),
        cmocka_unit_test(test_duration_ms_compat),
        cmocka_unit_test(test_duration_format),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
