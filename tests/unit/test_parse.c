/* test_parse.c -- unit tests for tb_parse.c and the small name tables:
 * rates, durations, whole numbers, policies, sources and error kinds.
 *
 * These parsers run at configuration time for the module and the shim, so
 * every bad value must come back as TB_ERR with a message (never a crash,
 * never a silently clamped value), and a short error buffer must not be
 * overrun.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "tb.h"

/* Failures in the current table test: every bad entry is printed, then
 * the test fails once. */
static int nbad;

/* The error buffer contract: a message, NUL-terminated inside errlen, and
 * nothing written beyond it. */
#define GUARD 8
static void check_err_buffer(const char *buf, size_t errlen, const char *in)
{
    size_t i;

    if (errlen && buf[0] == '\0') {
        fail_msg("'%s' refused without a message", in);
    }
    if (errlen && !memchr(buf, '\0', errlen)) {
        fail_msg("'%s': message not terminated", in);
    }
    for (i = errlen; i < errlen + GUARD; i++) {
        if ((unsigned char)buf[i] != 0x5a) {
            fail_msg("'%s': error buffer overrun", in);
        }
    }
}

/* Ends a table test: fails once if any entry failed (each printed). */
static void table_done(void)
{
    if (nbad) {
        fail_msg("%d table entries failed", nbad);
    }
}

/* A parser under test: s refused or not, err as the parser's; what it
 * parsed in *got (a duration's milliseconds are exact as a double). */
typedef int (*parse_fn)(const char *s, double *got, char *err,
                        size_t errlen);

static int rate_value(const char *s, double *got, char *err, size_t errlen)
{
    return tb_parse_rate(s, got, err, errlen);
}

static int duration_value(const char *s, double *got, char *err,
                          size_t errlen)
{
    int64_t ms = (int64_t)*got;
    int rc = tb_parse_duration_ms(s, &ms, err, errlen);

    *got = (double)ms;
    return rc;
}

/* A good value and what it parses to. */
typedef struct good {
    const char *s;
    double want;
} good_t;

/* Every one of the n good values t parses to its value, within a
 * relative error of tolerance. */
static void check_good_table(const char *what, const good_t *t, size_t n,
                             parse_fn parse, double tolerance)
{
    size_t k;

    nbad = 0;
    for (k = 0; k < n; k++) {
        double got = -1;
        char err[128] = "";

        if (parse(t[k].s, &got, err, sizeof(err)) != TB_OK) {
            nbad++;
            print_error("%s '%s' refused: %s\n", what, t[k].s, err);
        }
        else if (fabs(got - t[k].want) > t[k].want * tolerance) {
            nbad++;
            print_error("%s '%s' = %.17g, want %.17g\n", what, t[k].s, got,
                        t[k].want);
        }
    }
    table_done();
}

/* Every one of the n bad values t is refused by parse, with a message
 * kept inside a 128-byte buffer and inside a 4-byte one. */
static void check_bad_table(const char *what, const char *const *t,
                            size_t n, parse_fn parse)
{
    size_t k;

    nbad = 0;
    for (k = 0; k < n; k++) {
        char err[128 + GUARD], tiny[4 + GUARD];
        double got = 42;

        memset(err, 0x5a, sizeof(err));
        if (parse(t[k], &got, err, 128) != TB_ERR) {
            nbad++;
            print_error("bad %s '%s' accepted as %.17g\n", what, t[k], got);
            continue;
        }
        check_err_buffer(err, 128, t[k]);
        memset(tiny, 0x5a, sizeof(tiny));
        assert_int_equal(parse(t[k], &got, tiny, 4), TB_ERR);
        check_err_buffer(tiny, 4, t[k]);
    }
    table_done();
}

static void test_parse_rate_good(void **state)
{
    static const good_t t[] = {
        {"10/s", 10},       {"10", 10},          {"1/s", 1},
        {"0.5/s", 0.5},     {"0.5", 0.5},        {"60/m", 1},
        {"1/m", 1.0 / 60},  {"3600/h", 1},       {"1/h", 1.0 / 3600},
        {"1000000/s", 1e6}, {"1000000000/s", 1e9}, {"2.5/m", 2.5 / 60},
        {"0.001/s", 0.001},
    };

    (void)state;
    check_good_table("rate", t, sizeof(t) / sizeof(t[0]), rate_value,
                     1e-12);
}

static void test_parse_rate_bad(void **state)
{
    static const char *t[] = {
        "",       "0",       "0/s",    "-1",     "-1/s",   "abc",
        "/s",     "10/",     "10/x",   "10/ss",  "10/s ",
        "10s",    "10/s/s",  "nan",    "inf",    "-inf",   "1e400",
        "2e9/s",  "1000000001/s", "1e308/s", "10//s", "1/0",
        "10 /s",  "10/s\n",  "0.0000000000/s",
    };

    (void)state;
    check_bad_table("rate", t, sizeof(t) / sizeof(t[0]), rate_value);
    assert_int_equal(tb_parse_rate(NULL, NULL, NULL, 0), TB_ERR);
}

static void test_parse_duration_good(void **state)
{
    static const good_t t[] = {
        {"250ms", 250}, {"10s", 10000},    {"2m", 120000},
        {"1h", 3600000}, {"100", 100},     {"0", 0},
        {"0ms", 0},     {"24h", 86400000}, {"86400000", 86400000},
        {"1440m", 86400000}, {"86400s", 86400000}, {"1ms", 1},
    };

    (void)state;
    check_good_table("duration", t, sizeof(t) / sizeof(t[0]),
                     duration_value, 0);
}

static void test_parse_duration_bad(void **state)
{
    static const char *t[] = {
        "",        "ms",       "s",       "-1",      "-1s",     "1x",
        "10 s",     "10s ",    "25h",     "86400001", "86401s",
        "1441m",   "1d",       "abc",     "99999999999999999999",
        "10sms",    "0x10",    "nan",
    };

    (void)state;
    check_bad_table("duration", t, sizeof(t) / sizeof(t[0]),
                    duration_value);
    assert_int_equal(tb_parse_duration_ms(NULL, NULL, NULL, 0), TB_ERR);
}

static void test_parse_int(void **state)
{
    static const struct {
        const char *s;
        int64_t min, max;
        int ok;
        int64_t want;
    } t[] = {
        {"42", 0, 100, 1, 42},
        {"0", 0, 100, 1, 0},
        {"100", 0, 100, 1, 100},
        {"-5", -10, 10, 1, -5},
        {"101", 0, 100, 0, 0},
        {"-1", 0, 100, 0, 0},
        {"9223372036854775807", 0, INT64_MAX, 1, INT64_MAX},
        {"9223372036854775808", 0, INT64_MAX, 0, 0},
        {"-9223372036854775809", INT64_MIN, 0, 0, 0},
        {"99999999999999999999999", 0, INT64_MAX, 0, 0},
        {"", 0, 100, 0, 0},
        {"4x", 0, 100, 0, 0},
        {"4 ", 0, 100, 0, 0},
        {"4.0", 0, 100, 0, 0},
        {"0x10", 0, 100, 0, 0},
        {"-", -10, 10, 0, 0},
        {"1e2", 0, 1000, 0, 0},
    };
    size_t k;

    (void)state;
    nbad = 0;
    for (k = 0; k < sizeof(t) / sizeof(t[0]); k++) {
        int64_t v = 12345;
        char err[128 + GUARD];
        int rc;

        memset(err, 0x5a, sizeof(err));
        rc = tb_parse_int(t[k].s, t[k].min, t[k].max, &v, err, 128);
        if (t[k].ok) {
            if (rc != TB_OK || v != t[k].want) {
                nbad++;
                print_error("int '%s' in [%lld, %lld]: rc %d value %lld\n",
                         t[k].s, (long long)t[k].min, (long long)t[k].max,
                         rc, (long long)v);
            }
        }
        else {
            if (rc != TB_ERR) {
                nbad++;
                print_error("bad int '%s' in [%lld, %lld] accepted as "
                            "%lld\n",
                         t[k].s, (long long)t[k].min, (long long)t[k].max,
                         (long long)v);
            }
            check_err_buffer(err, 128, t[k].s);
        }
    }
    assert_int_equal(tb_parse_int(NULL, 0, 1, NULL, NULL, 0), TB_ERR);
    table_done();
}

static void test_parse_policy_names(void **state)
{
    static const struct {
        const char *s;
        tb_policy_t p;
    } t[] = {
        {"open", TB_POLICY_OPEN},
        {"closed", TB_POLICY_CLOSED},
        {"local", TB_POLICY_LOCAL},
    };
    static const char *bad[] = {"", "opened", "close", "LOCALx", "o", " open"};
    size_t k;

    (void)state;
    nbad = 0;
    for (k = 0; k < sizeof(t) / sizeof(t[0]); k++) {
        tb_policy_t p = (tb_policy_t)99;

        assert_int_equal(tb_policy_parse(t[k].s, &p), TB_OK);
        assert_int_equal(p, t[k].p);
        assert_string_equal(tb_policy_name(t[k].p), t[k].s);
    }
    for (k = 0; k < sizeof(bad) / sizeof(bad[0]); k++) {
        tb_policy_t p;

        if (tb_policy_parse(bad[k], &p) != TB_ERR) {
            nbad++;
            print_error("bad policy '%s' accepted\n", bad[k]);
        }
    }
    assert_int_equal(tb_policy_parse(NULL, NULL), TB_ERR);
    assert_non_null(tb_policy_name((tb_policy_t)99));
    table_done();
}

static void test_parse_source_and_error_names(void **state)
{
    int k, j;

    (void)state;
    assert_string_equal(tb_source_name(TB_SRC_REDIS), "redis");
    assert_string_equal(tb_source_name(TB_SRC_OPEN), "open");
    assert_string_equal(tb_source_name(TB_SRC_CLOSED), "closed");
    assert_string_equal(tb_source_name(TB_SRC_LOCAL), "local");
    assert_non_null(tb_source_name((tb_source_t)99));
    assert_string_equal(tb_err_name(TB_ERR_IO), "io");
    assert_string_equal(tb_err_name(TB_ERR_TIMEOUT), "timeout");
    assert_string_equal(tb_err_name(TB_ERR_AUTH), "auth");
    assert_string_equal(tb_err_name(TB_ERR_TLS), "tls");
    assert_string_equal(tb_err_name(TB_ERR_KINDS), "unknown");
    /* Every kind has a distinct, non-empty name without spaces (they end
     * up in metric labels); unknown kinds still get a string. */
    for (k = 0; k < TB_ERR_KINDS; k++) {
        const char *n = tb_err_name(k);

        assert_non_null(n);
        assert_true(n[0] != '\0');
        assert_null(strchr(n, ' '));
        for (j = 0; j < k; j++) {
            assert_string_not_equal(n, tb_err_name(j));
        }
    }
    assert_non_null(tb_err_name(-1));
    assert_non_null(tb_err_name(TB_ERR_KINDS));
    assert_non_null(tb_err_name(1000));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_parse_rate_good),
        cmocka_unit_test(test_parse_rate_bad),
        cmocka_unit_test(test_parse_duration_good),
        cmocka_unit_test(test_parse_duration_bad),
        cmocka_unit_test(test_parse_int),
        cmocka_unit_test(test_parse_policy_names),
        cmocka_unit_test(test_parse_source_and_error_names),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
