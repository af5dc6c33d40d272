/* test_resp.c -- unit tests for tb_resp.c, the RESP writer and framer.
 *
 * The writer must produce exactly the bytes hiredis's own formatter
 * (redisFormatCommandArgv) produces for the same argv: binary bytes, NULs,
 * empty arguments and lengths across digit boundaries included, and
 * several commands appended to one buffer must be their concatenation.
 * Growth keeps what was written and a failed encode leaves the buffer as
 * it was. The framer (tb__resp_span) finds where each whole value ends
 * in what was read so far: at every cut of a command or a reply it says
 * "more", whole it gives the exact length, and bytes that are not RESP
 * are refused rather than waited for.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "tb_int.h"

/* Encode argv with both writers and compare. */
static void check_same(int argc, const char **argv, const size_t *len)
{
    tb__buf_t b = { NULL, 0, 0 };
    char *ref = NULL;
    int n;

    n = redisFormatCommandArgv(&ref, argc, argv, len);
    assert_true(n > 0);
    assert_int_equal(tb__buf_argv(&b, argc, argv, len), TB_OK);
    assert_int_equal(b.len, (size_t)n);
    assert_memory_equal(b.p, ref, (size_t)n);
    free(ref);
    tb__buf_free(&b);
}

static void test_resp_matches_hiredis(void **unused)
{
    static const char bin[] = { 'a', '\0', '\r', '\n', (char)0xff, '{', '}' };
    const char *av[4];
    size_t len[4];
    char big[100001];
    size_t sizes[] = { 0, 1, 9, 10, 99, 100, 999, 1000, 65536, 100000 };
    size_t i;

    (void)unused;
    av[0] = "EVALSHA";
    len[0] = 7;
    av[1] = bin;
    len[1] = sizeof(bin);
    av[2] = "";
    len[2] = 0;
    check_same(3, av, len);

    memset(big, 'x', sizeof(big));
    for (i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
        av[0] = "SET";
        len[0] = 3;
        av[1] = big;
        len[1] = sizes[i];
        check_same(2, av, len);
    }
}

/* Every argc from 1 to 40 (the script's widest call is under 40). */
static void test_resp_argc_range(void **unused)
{
    const char *av[40];
    size_t len[40];
    int argc, i;

    (void)unused;
    for (i = 0; i < 40; i++) {
        av[i] = "rl:{k}:route:r";
        len[i] = (size_t)(i % 15);
    }
    for (argc = 1; argc <= 40; argc++) {
        check_same(argc, av, len);
    }
}

/* Appending: the buffer holds the commands one after the other, across
 * the growth of the buffer. */
static void test_resp_append_and_grow(void **unused)
{
    tb__buf_t b = { NULL, 0, 0 };
    const char *av[2] = { "PING", "hello" };
    size_t len[2] = { 4, 5 };
    const char *one = "*2\r\n$4\r\nPING\r\n$5\r\nhello\r\n";
    size_t ol = strlen(one);
    int i;

    (void)unused;
    for (i = 0; i < 200; i++) {
        assert_int_equal(tb__buf_argv(&b, 2, av, len), TB_OK);
    }
    assert_int_equal(b.len, 200 * ol);
    assert_true(b.cap >= b.len);
    for (i = 0; i < 200; i++) {
        assert_memory_equal(b.p + (size_t)i * ol, one, ol);
    }
    tb__buf_free(&b);
    assert_null(b.p);
    assert_int_equal(b.len, 0);
    tb__buf_free(&b);
}

/* No command is no command: argc 0 is refused and nothing is written. */
static void test_resp_refuses_empty(void **unused)
{
    tb__buf_t b = { NULL, 0, 0 };

    (void)unused;
    assert_int_equal(tb__buf_argv(&b, 0, NULL, NULL), TB_ERR);
    assert_int_equal(b.len, 0);
    tb__buf_free(&b);
}

/* The length of every prefix of s is 0 (more needed), the whole is
 * strlen(s), and with a second value after it still strlen(s). */
static void check_span(const char *s)
{
    size_t n = strlen(s), i;
    char two[512];

    for (i = 0; i < n; i++) {
        assert_int_equal(tb__resp_span(s, i), 0);
    }
    assert_int_equal(tb__resp_span(s, n), (long long)n);
    assert_true(2 * n < sizeof(two));
    memcpy(two, s, n);
    memcpy(two + n, s, n);
    assert_int_equal(tb__resp_span(two, 2 * n), (long long)n);
}

static void test_resp_span_whole_values(void **unused)
{
    tb__buf_t b = { NULL, 0, 0 };
    const char *av[3] = { "EVALSHA", "ab\r\n", "" };
    size_t len[3] = { 7, 4, 0 };

    (void)unused;
    check_span("+OK\r\n");
    check_span("-NOSCRIPT No matching script\r\n");
    check_span(":-12\r\n");
    check_span("$-1\r\n");
    check_span("*-1\r\n");
    check_span("$0\r\n\r\n");
    check_span("*4\r\n:1\r\n:0\r\n:-5\r\n$3\r\na\r\n\r\n");
    check_span("*2\r\n*1\r\n*0\r\n+x\r\n");
    /* A command as the writer makes it, binary bytes in an argument. */
    assert_int_equal(tb__buf_argv(&b, 3, av, len), TB_OK);
    assert_int_equal(tb__resp_span(b.p, b.len), (long long)b.len);
    assert_int_equal(tb__resp_span(b.p, b.len - 1), 0);
    tb__buf_free(&b);
}

static void test_resp_span_refuses(void **unused)
{
    static const char *const bad[] = {
        "PING\r\n",              /* an inline command */
        "$3\r\nabcd\r\n",       /* longer than said */
        ":1x\r\n",               /* not a number */
        "*1\r\n?\r\n",          /* an unknown type inside */
        "$\r\n",                 /* no length */
        "*2\r\n:1\n:2\r\n",     /* a line without its \r */
        NULL
    };
    char deep[72];
    int i;

    (void)unused;
    for (i = 0; bad[i]; i++) {
        assert_int_equal(tb__resp_span(bad[i], strlen(bad[i])), -1);
    }
    /* A number line that never ends is refused once it cannot be one. */
    memset(deep, '1', sizeof(deep));
    deep[0] = ':';
    assert_int_equal(tb__resp_span(deep, sizeof(deep)), -1);
    /* Arrays nested 17 deep wait for more; 18 deep are refused. */
    for (i = 0; i < 18; i++) {
        memcpy(deep + 4 * i, "*1\r\n", 4);
    }
    assert_int_equal(tb__resp_span(deep, 68), 0);
    assert_int_equal(tb__resp_span(deep, 72), -1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_resp_matches_hiredis),
        cmocka_unit_test(test_resp_argc_range),
        cmocka_unit_test(test_resp_append_and_grow),
        cmocka_unit_test(test_resp_refuses_empty),
        cmocka_unit_test(test_resp_span_whole_values),
        cmocka_unit_test(test_resp_span_refuses),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
