/* test_token.c -- unit tests for tb_token.c: the signed entries of a
 * known-client cookie.
 *
 * What an attacker can send is any cookie: these tests check that only
 * an entry the site's secret signed, for this rule and this key and not
 * yet expired, is found; that the previous secret still verifies while
 * new entries are signed by the current one; and that an update keeps
 * the other names' valid entries, drops expired and malformed ones, and
 * never holds more than TB_TOKEN_MAX.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "tb.h"

static tb_token_keys_t keys_of(const char *cur, const char *prev)
{
    tb_token_keys_t k;

    memset(&k, 0, sizeof(k));
    tb_token_keys_add(&k, cur, strlen(cur));
    if (prev) {
        tb_token_keys_add(&k, prev, strlen(prev));
    }
    return k;
}

static tb_token_about_t about(const tb_token_keys_t *k, const char *rule,
                              const char *key, int64_t now)
{
    tb_token_about_t a;

    a.keys = k;
    a.rule = rule;
    a.key = key;
    a.klen = strlen(key);
    a.now_s = now;
    return a;
}

static void test_found_only_when_signed(void **state)
{
    tb_token_keys_t k = keys_of("0123456789abcdef0123456789abcdef", NULL);
    tb_token_keys_t other = keys_of("fedcba9876543210fedcba9876543210", NULL);
    tb_token_about_t a = about(&k, "user", "alice", 1000);
    tb_token_about_t b = about(&k, "user", "bob", 1000);
    tb_token_about_t r = about(&k, "ip", "alice", 1000);
    tb_token_about_t o = about(&other, "user", "alice", 1000);
    char c[TB_TOKEN_COOKIE_LEN], id[TB_TOKEN_ID_LEN];
    size_t n = tb_token_update(&a, 2000, "", 0, c);

    (void)state;
    assert_true(n > 0);
    assert_int_equal(tb_token_find(&a, c, n, id), 1);
    assert_int_equal(strlen(id), 16);
    assert_int_equal(tb_token_find(&b, c, n, id), 0);
    assert_int_equal(tb_token_find(&r, c, n, id), 0);
    assert_int_equal(tb_token_find(&o, c, n, id), 0);
    /* Expired: the clock past its end. */
    a.now_s = 2000;
    assert_int_equal(tb_token_find(&a, c, n, id), 0);
    a.now_s = 1000;
    /* One digit of the mac changed, or of the end time. */
    c[n - 1] = c[n - 1] == '0' ? '1' : '0';
    assert_int_equal(tb_token_find(&a, c, n, id), 0);
    c[n - 1] = c[n - 1] == '0' ? '1' : '0';
    c[10] = c[10] == '9' ? '8' : '9';
    assert_int_equal(tb_token_find(&a, c, n, id), 0);
}

static void test_rotation(void **state)
{
    tb_token_keys_t old = keys_of("old-secret-old-secret-old-secret", NULL);
    tb_token_keys_t both = keys_of("new-secret-new-secret-new-secret",
                                   "old-secret-old-secret-old-secret");
    tb_token_keys_t fresh = keys_of("new-secret-new-secret-new-secret", NULL);
    tb_token_about_t a = about(&old, "user", "alice", 100);
    char c[TB_TOKEN_COOKIE_LEN], d[TB_TOKEN_COOKIE_LEN];
    char id[TB_TOKEN_ID_LEN];
    size_t n = tb_token_update(&a, 500, "", 0, c), m;

    (void)state;
    a.keys = &both;
    assert_int_equal(tb_token_find(&a, c, n, id), 1);
    m = tb_token_update(&a, 600, c, n, d);
    a.keys = &fresh;
    assert_int_equal(tb_token_find(&a, d, m, id), 1);
    a.keys = &old;
    assert_int_equal(tb_token_find(&a, d, m, id), 0);
}

static void test_update_keeps_others(void **state)
{
    tb_token_keys_t k = keys_of("0123456789abcdef0123456789abcdef", NULL);
    char c[TB_TOKEN_COOKIE_LEN], d[TB_TOKEN_COOKIE_LEN];
    char id[TB_TOKEN_ID_LEN], name[16];
    size_t n = 0;
    int i;

    (void)state;
    c[0] = '\0';
    for (i = 0; i < 12; i++) {
        tb_token_about_t a;

        snprintf(name, sizeof(name), "user%d", i);
        a = about(&k, "user", name, 100);
        n = tb_token_update(&a, i == 3 ? 150 : 1000, c, n, d);
        memcpy(c, d, n + 1);
    }
    /* The newest TB_TOKEN_MAX names are kept, the oldest dropped. */
    for (i = 0; i < 12; i++) {
        tb_token_about_t a;

        snprintf(name, sizeof(name), "user%d", i);
        a = about(&k, "user", name, 200);
        assert_int_equal(tb_token_find(&a, c, n, id),
                         i >= 12 - TB_TOKEN_MAX);
    }
    /* Garbage and expired entries are dropped by the next update. */
    {
        const char *junk = "zz.12345678-9999999999-nothex.x";
        tb_token_about_t a = about(&k, "user", "alice", 5000);

        n = tb_token_update(&a, 9000, junk, strlen(junk), d);
        assert_null(strchr(d, 'z'));
        assert_null(strstr(d, "nothex"));
        assert_int_equal(tb_token_find(&a, d, n, id), 1);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_found_only_when_signed),
        cmocka_unit_test(test_rotation),
        cmocka_unit_test(test_update_keeps_others),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
