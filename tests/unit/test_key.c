/* test_key.c -- unit tests for tb_key.c and tb_sha256()
 * (base/tb_digest.c): Redis key names from untrusted client keys.
 *
 * The client key is hostile: braces would move the Redis Cluster hash tag,
 * CR/LF and NUL are protocol and C-string hazards, and a megabyte key is a
 * memory hazard. These tests check that such keys are replaced by a stable
 * '#' + 32 hex digest, that a raw key can never equal another key's digest
 * form, and that prefixes and route names are validated.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <sys/socket.h>

#include "tb_int.h"

/* The documented digest form: '#' + the first 16 bytes of SHA-256 as 32
 * lowercase hex digits. */
static void digest_form(const void *key, size_t len, char out[34])
{
    unsigned char d[32];
    int i;

    tb_sha256(key, len, d);
    out[0] = '#';
    for (i = 0; i < 16; i++) {
        snprintf(out + 1 + 2 * i, 3, "%02x", d[i]);
    }
    out[33] = '\0';
}

static void hex(const unsigned char *d, size_t n, char *out)
{
    size_t i;

    for (i = 0; i < n; i++) {
        snprintf(out + 2 * i, 3, "%02x", d[i]);
    }
}

/* FIPS 180-2 examples and the empty string. */
static void test_key_sha256_known_answers(void **state)
{
    static const struct {
        const char *in;
        const char *want;
    } t[] = {
        {"", "e3b0c44298fc1c149afbf4c8996fb924"
             "27ae41e4649b934ca495991b7852b855"},
        {"abc", "ba7816bf8f01cfea414140de5dae2223"
                "b00361a396177a9cb410ff61f20015ad"},
        {"abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq",
         "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1"},
    };
    unsigned char d[32];
    char got[65];
    char *million;
    size_t k;

    (void)state;
    for (k = 0; k < sizeof(t) / sizeof(t[0]); k++) {
        tb_sha256(t[k].in, strlen(t[k].in), d);
        hex(d, 32, got);
        assert_string_equal(got, t[k].want);
    }
    million = malloc(1000000);
    assert_non_null(million);
    memset(million, 'a', 1000000);
    tb_sha256(million, 1000000, d);
    hex(d, 32, got);
    assert_string_equal(got, "cdc76e5c9914fb9281a1c7e284d73e67"
                             "f1809a48a497200e046d39ccc7112cd0");
    free(million);
}

/* Keys that stay as they are: printable ASCII without braces, not
 * starting with '#', at most TB_KEY_RAW_MAX bytes. */
static void test_key_sanitize_keeps_plain_keys(void **state)
{
    static const char *keep[] = {
        "a", "192.0.2.7", "2001:db8::1", "user:42", "API-KEY_x.y~z!",
        "a#b", "[::1]:80", "x:route:admin", "~!@$%^&*()=+[]|;'\",<.>/?`",
    };
    char buf[TB_KEY_RAW_MAX + 1], out[TB_KEY_RAW_MAX + 1];
    size_t k;

    (void)state;
    for (k = 0; k < sizeof(keep) / sizeof(keep[0]); k++) {
        size_t n = strlen(keep[k]);

        memset(out, 0x5a, sizeof(out));
        assert_int_equal(tb_key_sanitize(keep[k], n, out), n);
        assert_memory_equal(out, keep[k], n);
        assert_int_equal(out[n], '\0');
    }
    /* Exactly the limit is kept. */
    memset(buf, 'k', TB_KEY_RAW_MAX);
    assert_int_equal(tb_key_sanitize(buf, TB_KEY_RAW_MAX, out),
                     TB_KEY_RAW_MAX);
    assert_memory_equal(out, buf, TB_KEY_RAW_MAX);
    assert_int_equal(out[TB_KEY_RAW_MAX], '\0');
    /* The empty key stays empty (the caller substitutes the peer IP). */
    out[0] = 'x';
    assert_int_equal(tb_key_sanitize("", 0, out), 0);
    assert_int_equal(out[0], '\0');
}

/* Keys that are hashed: braces, control bytes, CR/LF, NUL, space, DEL,
 * high bytes, '#' first, one byte over the limit, a megabyte. */
static void test_key_sanitize_hashes_hostile_keys(void **state)
{
    static const struct {
        const char *key;
        size_t len;
    } t[] = {
        {"{", 1},          {"}", 1},           {"a{b}c", 5},
        {"victim}", 7},    {"{victim}", 8},    {"a\r\nb", 4},
        {"a\nFLUSHALL", 10}, {"a\0b", 3},      {"\0", 1},
        {"a b", 3},        {"\x7f", 1},        {"caf\xc3\xa9", 5},
        {"\x01", 1},       {"\t", 1},          {"#", 1},
        {"#0123456789abcdef0123456789abcdef", 33},
    };
    char out[TB_KEY_RAW_MAX + 1], want[34];
    char *big;
    size_t k, n;

    (void)state;
    for (k = 0; k < sizeof(t) / sizeof(t[0]); k++) {
        memset(out, 0x5a, sizeof(out));
        n = tb_key_sanitize(t[k].key, t[k].len, out);
        digest_form(t[k].key, t[k].len, want);
        if (n != 33 || strcmp(out, want) != 0) {
            fail_msg("key %zu not hashed: got %zu bytes", k, n);
        }
    }
    big = malloc(1 << 20);
    assert_non_null(big);
    memset(big, 'b', 1 << 20);
    for (n = TB_KEY_RAW_MAX + 1; n <= (1 << 20); n = n * 2 + 1) {
        assert_int_equal(tb_key_sanitize(big, n, out), 33);
        digest_form(big, n, want);
        assert_string_equal(out, want);
    }
    assert_int_equal(tb_key_sanitize(big, 1 << 20, out), 33);
    digest_form(big, 1 << 20, want);
    assert_string_equal(out, want);
    free(big);
}

/* A raw key that looks like a digest is itself hashed, so a client cannot
 * name (forge) the hashed bucket of another client. */
static void test_key_sanitize_digest_cannot_be_forged(void **state)
{
    static const char *victims[] = {"a{b}", "x\r\ny", "lots of spaces"};
    char h[TB_KEY_RAW_MAX + 1], again[TB_KEY_RAW_MAX + 1];
    size_t k, n;

    (void)state;
    for (k = 0; k < sizeof(victims) / sizeof(victims[0]); k++) {
        n = tb_key_sanitize(victims[k], strlen(victims[k]), h);
        assert_int_equal(n, 33);
        assert_int_equal(h[0], '#');
        assert_int_equal(tb_key_sanitize(h, n, again), 33);
        assert_string_not_equal(again, h);
    }
}

/* The same input gives the same output every time; different inputs give
 * different outputs (including ones differing only after a NUL). */
static void test_key_sanitize_is_stable(void **state)
{
    char a[TB_KEY_RAW_MAX + 1], b[TB_KEY_RAW_MAX + 1];
    int k;

    (void)state;
    for (k = 0; k < 100; k++) {
        tb_key_sanitize("a\0b", 3, a);
        tb_key_sanitize("a\0b", 3, b);
        assert_string_equal(a, b);
    }
    tb_key_sanitize("a\0c", 3, b);
    assert_string_not_equal(a, b);
    tb_key_sanitize("a", 1, b);
    assert_string_not_equal(a, b);
    tb_key_sanitize("a\0", 2, b);
    assert_string_not_equal(a, b);
    /* Pinned value: the digest of "{" must never change between
     * releases, or every hashed bucket would reset on upgrade. */
    tb_key_sanitize("{", 1, a);
    assert_string_equal(a, "#021fb596db81e6d02bf3d2586ee3981f");
}

static void test_key_build_routes(void **state)
{
    char out[TB_KEY_BUF], want[TB_KEY_BUF], d[34];
    size_t n;

    (void)state;
    n = tb_key_build("tb:", "1.2.3.4", 7, NULL, out);
    assert_int_equal(n, strlen("tb:{1.2.3.4}"));
    assert_string_equal(out, "tb:{1.2.3.4}");
    n = tb_key_build("tb:", "1.2.3.4", 7, "search", out);
    assert_string_equal(out, "tb:{1.2.3.4}:route:search");
    assert_int_equal(n, strlen(out));
    /* Binary-safe: the length, not a NUL, ends the key. */
    n = tb_key_build("rl:", "ab\0cd", 5, "r_1.x-y", out);
    digest_form("ab\0cd", 5, d);
    snprintf(want, sizeof(want), "rl:{%s}:route:r_1.x-y", d);
    assert_string_equal(out, want);
    assert_int_equal(n, strlen(want));
    /* The empty key gives empty braces. */
    assert_int_equal(tb_key_build("tb:", "", 0, NULL, out), 5);
    assert_string_equal(out, "tb:{}");
}

/* The longest prefix, key and route name fit TB_KEY_BUF exactly as
 * documented, with nothing written past the end. */
static void test_key_build_longest_fits(void **state)
{
    char prefix[TB_PREFIX_MAX + 1], key[TB_KEY_RAW_MAX], name[TB_NAME_MAX + 1];
    char out[TB_KEY_BUF + 16];
    size_t n, want;

    (void)state;
    memset(prefix, 'p', TB_PREFIX_MAX);
    prefix[TB_PREFIX_MAX] = '\0';
    memset(key, 'k', TB_KEY_RAW_MAX);
    memset(name, 'n', TB_NAME_MAX);
    name[TB_NAME_MAX] = '\0';
    memset(out, 0x5a, sizeof(out));
    n = tb_key_build(prefix, key, TB_KEY_RAW_MAX, name, out);
    want = TB_PREFIX_MAX + 1 + TB_KEY_RAW_MAX + 1 + 7 + TB_NAME_MAX;
    assert_int_equal(n, want);
    assert_true(n < TB_KEY_BUF);
    assert_int_equal(out[n], '\0');
    for (n = TB_KEY_BUF; n < sizeof(out); n++) {
        assert_int_equal((unsigned char)out[n], 0x5a);
    }
}

/* No client key, however crafted, builds the key of another client's main
 * or route bucket, and every key keeps exactly one {...} hash tag. */
static void test_key_build_hostile_keys_stay_apart(void **state)
{
    static const struct {
        const char *key;
        size_t len;
    } t[] = {
        {"victim", 6},           {"victim}", 7},
        {"victim}:route:admin", 19}, {"{victim}", 8},
        {"victim\0", 7},         {"victim\r\n", 8},
        {"victim:route:admin", 18}, {"victim}{x", 9},
        {"}", 1},                {"", 0},
        {"#", 1},                {"victim ", 7},
    };
    enum { N = sizeof(t) / sizeof(t[0]) };
    char keys[N * 2][TB_KEY_BUF];
    size_t i, j;

    (void)state;
    for (i = 0; i < N; i++) {
        assert_true(tb_key_build("tb:", t[i].key, t[i].len, NULL,
                                 keys[2 * i]) > 0);
        assert_true(tb_key_build("tb:", t[i].key, t[i].len, "admin",
                                 keys[2 * i + 1]) > 0);
    }
    for (i = 0; i < 2 * N; i++) {
        const char *open = strchr(keys[i], '{');
        const char *close = strchr(keys[i], '}');

        assert_non_null(open);
        assert_non_null(close);
        assert_null(strchr(open + 1, '{'));
        assert_null(strchr(close + 1, '}'));
        assert_null(strpbrk(keys[i], " \r\n"));
        for (j = 0; j < i; j++) {
            if (strcmp(keys[i], keys[j]) == 0) {
                fail_msg("keys %zu and %zu collide: %s", i, j, keys[i]);
            }
        }
    }
}

/* Shard i of a key is "<prefix>{<key> s<i>}", each shard has
 * its own slot, and a negative shard is the plain key. */
static void test_key_build_shard_form(void **state)
{
    char out[TB_KEY_BUF], plain[TB_KEY_BUF], d[34], want[TB_KEY_BUF];
    unsigned slots[8];
    size_t n;
    int i, j;

    (void)state;
    n = tb_key_build_shard("tb:", "alice", 5, 3, NULL, out);
    assert_string_equal(out, "tb:{alice s3}");
    assert_int_equal(n, strlen(out));
    tb_key_build_shard("tb:", "alice", 5, 63, "export", out);
    assert_string_equal(out, "tb:{alice s63}:route:export");
    tb_key_build_shard("tb:", "alice", 5, 0, NULL, out);
    assert_string_equal(out, "tb:{alice s0}");
    tb_key_build_shard("tb:", "alice", 5, -1, "r", out);
    tb_key_build("tb:", "alice", 5, "r", plain);
    assert_string_equal(out, plain);
    /* A hashed key is sharded in its digest form. */
    tb_key_build_shard("tb:", "a b", 3, 7, NULL, out);
    digest_form("a b", 3, d);
    snprintf(want, sizeof(want), "tb:{%s s7}", d);
    assert_string_equal(out, want);
    assert_int_equal(tb_key_build_shard("tb:", "x", 1, TB_MAX_SHARDS, NULL,
                                        out), 0);
    assert_int_equal(tb_key_build_shard("t b", "x", 1, 1, NULL, out), 0);
    /* The slot is CRC16 of "alice s<i>": eight different slots here. */
    for (i = 0; i < 8; i++) {
        n = tb_key_build_shard("tb:", "alice", 5, i, NULL, out);
        slots[i] = tb_key_slot(out, n);
        snprintf(want, sizeof(want), "alice s%d", i);
        assert_int_equal(slots[i], tb_key_slot(want, strlen(want)));
        for (j = 0; j < i; j++) {
            assert_int_not_equal(slots[i], slots[j]);
        }
    }
}

/* No client key names a shard: a key holding the separator is hashed,
 * so "alice s3" never reaches alice's shard 3 (nor anything in the braces
 * of a shard key); and distinct (key, shard) pairs give distinct keys. */
static void test_key_shard_cannot_be_forged(void **state)
{
    static const char *const hostile[] = {
        "alice s3", "alice s3}", "alice\ts3", "alice s03", "alice s",
        "alice  s3", " s3", "alice s3 ", "alice}{alice s3", "alice_s3",
        "alices3", "alice", "#alice s3",
    };
    enum { N = sizeof(hostile) / sizeof(hostile[0]), K = 12 };
    char keys[N * (K + 1)][TB_KEY_BUF];
    size_t i, j, m = 0;
    int k;

    (void)state;
    for (i = 0; i < N; i++) {
        const char *h = hostile[i];

        for (k = -1; k < K; k++) {
            const char *open, *close, *sp;

            assert_true(tb_key_build_shard("tb:", h, strlen(h), k, NULL,
                                           keys[m]) > 0);
            open = strchr(keys[m], '{');
            close = strchr(keys[m], '}');
            sp = strchr(keys[m], ' ');
            /* One hash tag; a space only for a shard, once, inside it. */
            assert_null(strchr(open + 1, '{'));
            assert_null(strchr(close + 1, '}'));
            if (k < 0) {
                assert_null(sp);
            }
            else {
                assert_true(sp > open && sp < close);
                assert_null(strchr(sp + 1, ' '));
            }
            for (j = 0; j < m; j++) {
                if (strcmp(keys[m], keys[j]) == 0) {
                    fail_msg("'%s' shard %d collides: %s", h, k, keys[m]);
                }
            }
            m++;
        }
    }
}

/* valid() takes a string of max characters of fill and refuses one of
 * max + 1, which buf (max + 2 bytes) holds afterwards. */
static void check_max_len(int (*valid)(const char *), char *buf,
                          size_t max, char fill)
{
    memset(buf, fill, max + 2);
    buf[max] = '\0';
    assert_int_equal(valid(buf), 1);
    buf[max] = fill;
    buf[max + 1] = '\0';
    assert_int_equal(valid(buf), 0);
}

static void test_key_prefix_and_name_validation(void **state)
{
    static const char *good_prefix[] = {"tb:", "a", "rl:v2:", "x-y_z.0#"};
    static const char *bad_prefix[] = {
        "", "a b", "a{", "}", "a\r", "a\n", "\t", "caf\xc3\xa9", "\x7f",
    };
    static const char *good_name[] = {"search", "a", "A-z_0.9", "v1.2"};
    static const char *bad_name[] = {
        "", "a b", "a:b", "a{", "a}", "a/b", "a\n", "\xc3\xa9", "a*",
    };
    char long_prefix[TB_PREFIX_MAX + 2], long_name[TB_NAME_MAX + 2];
    char out[TB_KEY_BUF];
    size_t k;

    (void)state;
    for (k = 0; k < sizeof(good_prefix) / sizeof(good_prefix[0]); k++) {
        assert_int_equal(tb_prefix_valid(good_prefix[k]), 1);
    }
    for (k = 0; k < sizeof(bad_prefix) / sizeof(bad_prefix[0]); k++) {
        if (tb_prefix_valid(bad_prefix[k])) {
            fail_msg("bad prefix %zu accepted", k);
        }
        assert_int_equal(tb_key_build(bad_prefix[k], "k", 1, NULL, out), 0);
    }
    for (k = 0; k < sizeof(good_name) / sizeof(good_name[0]); k++) {
        assert_int_equal(tb_name_valid(good_name[k]), 1);
    }
    for (k = 0; k < sizeof(bad_name) / sizeof(bad_name[0]); k++) {
        if (tb_name_valid(bad_name[k])) {
            fail_msg("bad name %zu accepted", k);
        }
        assert_int_equal(tb_key_build("tb:", "k", 1, bad_name[k], out), 0);
    }
    check_max_len(tb_prefix_valid, long_prefix, TB_PREFIX_MAX, 'p');
    check_max_len(tb_name_valid, long_name, TB_NAME_MAX, 'n');
    assert_int_equal(tb_key_build("tb:", "k", 1, long_name, out), 0);
    /* NULL is a bad argument, not a crash. */
    assert_int_equal(tb_prefix_valid(NULL), 0);
    assert_int_equal(tb_name_valid(NULL), 0);
    assert_int_equal(tb_key_build(NULL, "k", 1, NULL, out), 0);
    assert_int_equal(tb_key_build("tb:", NULL, 5, NULL, out), 0);
}

/* A client address as a key: IPv4 as it is, IPv4-mapped as IPv4, IPv6
 * cut to its network, the same key for every address of that network,
 * and anything that is not an address copied unchanged. */
static void test_key_ip(void **unused)
{
    static const struct {
        const char *ip;
        int bits;
        const char *want;
    } cases[] = {
        {"203.0.113.5", 64, "203.0.113.5"},
        {"::ffff:203.0.113.5", 64, "203.0.113.5"},
        {"2001:db8:1:2:3:4:5:6", 64, "2001:db8:1:2::/64"},
        {"2001:db8:1:2::b", 64, "2001:db8:1:2::/64"},
        {"2001:DB8:1:2:ffff::", 64, "2001:db8:1:2::/64"},
        {"2001:db8:1:2ff::1", 56, "2001:db8:1:200::/56"},
        {"2001:db8:1:2ff::1", 60, "2001:db8:1:2f0::/60"},
        {"2001:db8:1:2ff::1", 61, "2001:db8:1:2f8::/61"},
        {"2001:db8::7", 128, "2001:db8::7"},
        {"2001:0db8:0000::0007", 128, "2001:db8::7"},
        {"ffff:ffff::1", 1, "8000::/1"},
        {"::1", 64, "::/64"},
        {"fe80::1%eth0", 64, "fe80::1%eth0"},
        {"not:an:address", 64, "not:an:address"},
        {"2001:db8::7", 0, "2001:db8::7"},
        {"2001:db8::7", 129, "2001:db8::7"},
    };
    char out[TB_IP_KEY_LEN], small[8];
    size_t i;

    (void)unused;
    for (i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        size_t n = tb_ip_key(cases[i].ip, cases[i].bits, out, sizeof(out));

        assert_string_equal(out, cases[i].want);
        assert_int_equal(n, strlen(cases[i].want));
    }
    /* The longest IPv6 text with its prefix fits TB_IP_KEY_LEN. */
    assert_true(tb_ip_key("ffff:ffff:ffff:ffff:ffff:ffff:255.255.255.255",
                          127, out, sizeof(out)) > 0);
    assert_int_equal(tb_ip_key("2001:db8::7", 64, small, sizeof(small)), 0);
    assert_int_equal(tb_ip_key(NULL, 64, out, sizeof(out)), 0);

    /* The same from the bytes a socket address holds. */
    {
        static const unsigned char v4[4] = {203, 0, 113, 5};
        static const unsigned char mapped[16] = {0, 0, 0, 0, 0, 0, 0, 0,
                                                 0, 0, 0xff, 0xff, 10, 0, 0, 9};
        static const unsigned char v6[16] = {0x20, 0x01, 0x0d, 0xb8, 0, 1,
                                             0, 2, 0, 0, 0, 0, 0, 0, 0, 7};

        assert_int_equal(tb_ip_key_addr(AF_INET, v4, 64, out, sizeof(out)),
                         11);
        assert_string_equal(out, "203.0.113.5");
        tb_ip_key_addr(AF_INET6, mapped, 64, out, sizeof(out));
        assert_string_equal(out, "10.0.0.9");
        tb_ip_key_addr(AF_INET6, v6, 64, out, sizeof(out));
        assert_string_equal(out, "2001:db8:1:2::/64");
        tb_ip_key_addr(AF_INET6, v6, 200, out, sizeof(out));
        assert_string_equal(out, "2001:db8:1:2::7");
        assert_int_equal(tb_ip_key_addr(AF_UNIX, v6, 64, out, sizeof(out)),
                         0);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_key_sha256_known_answers),
        cmocka_unit_test(test_key_sanitize_keeps_plain_keys),
        cmocka_unit_test(test_key_sanitize_hashes_hostile_keys),
        cmocka_unit_test(test_key_sanitize_digest_cannot_be_forged),
        cmocka_unit_test(test_key_sanitize_is_stable),
        cmocka_unit_test(test_key_build_routes),
        cmocka_unit_test(test_key_build_longest_fits),
        cmocka_unit_test(test_key_build_hostile_keys_stay_apart),
        cmocka_unit_test(test_key_build_shard_form),
        cmocka_unit_test(test_key_shard_cannot_be_forged),
        cmocka_unit_test(test_key_prefix_and_name_validation),
        cmocka_unit_test(test_key_ip),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
