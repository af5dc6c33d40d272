/* test_url.c -- unit tests for tb_url.c: Redis addresses.
 *
 * Table-driven: each good URL with the address it must parse to, each bad
 * URL with the assurance that it is refused with a message (and without a
 * crash or an overrun of the caller's error buffer). tb_url_redact must
 * never print the password, however the output is truncated.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "tb.h"

static const struct good {
    const char *url;
    const char *host;
    int port;
    const char *path;
    const char *user;
    const char *password;
    int db;
} good[] = {
    {"redis://127.0.0.1:6380", "127.0.0.1", 6380, "", "", "", 0},
    {"redis://localhost", "localhost", 6379, "", "", "", 0},
    {"redis://localhost/", "localhost", 6379, "", "", "", 0},
    {"redis://redis.example.com:1/15", "redis.example.com", 1, "", "", "",
     15},
    {"redis://h:65535/0", "h", 65535, "", "", "", 0},
    {"redis://:secret@h:7000/2", "h", 7000, "", "", "secret", 2},
    {"redis://alice:wonder@h", "h", 6379, "", "alice", "wonder", 0},
    {"redis://alice:s3cr%40t%3a%2F@h/3", "h", 6379, "", "alice", "s3cr@t:/",
     3},
    {"redis://%61l%69ce:p%25w@h:1", "h", 1, "", "alice", "p%w", 0},
    {"redis://[::1]:6390", "::1", 6390, "", "", "", 0},
    {"redis://[::1]", "::1", 6379, "", "", "", 0},
    {"redis://[2001:db8::7]:1/4", "2001:db8::7", 1, "", "", "", 4},
    {"redis://u:p@[::1]:7/1", "::1", 7, "", "u", "p", 1},
    {"unix:/tmp/redis.sock", "", 6379, "/tmp/redis.sock", "", "", 0},
    {"unix:/var/run/redis/r.sock?db=4", "", 6379, "/var/run/redis/r.sock",
     "", "", 4},
};

/* Runs check on entries 0..n-1 of a table: every entry it finds wrong
 * (check returns 1, having printed why) is reported, then the test fails
 * once, with their count. */
static void check_table(size_t n, int (*check)(size_t k))
{
    size_t k;
    int nbad = 0;

    for (k = 0; k < n; k++) {
        nbad += check(k);
    }
    if (nbad) {
        fail_msg("%d table entries failed", nbad);
    }
}

/* good[k] parses to its address. */
static int good_entry_wrong(size_t k)
{
    tb_redis_addr_t a;
    char err[128] = "";
    const struct good *g = &good[k];

    memset(&a, 0x5a, sizeof(a));
    if (tb_url_parse(g->url, &a, err, sizeof(err)) != TB_OK) {
        print_error("%s refused: %s\n", g->url, err);
        return 1;
    }
    if (strcmp(a.host, g->host) || strcmp(a.path, g->path)
        || strcmp(a.user, g->user) || strcmp(a.password, g->password)
        || a.db != g->db || (!g->path[0] && a.port != g->port)) {
        print_error("%s: host '%s' port %d path '%s' user '%s' "
                    "password '%s' db %d\n", g->url, a.host, a.port,
                    a.path, a.user, a.password, a.db);
        return 1;
    }
    return 0;
}

static void test_url_parse_good(void **state)
{
    (void)state;
    check_table(sizeof(good) / sizeof(good[0]), good_entry_wrong);
}

static const char *bad[] = {
    "",
    "localhost:6379",
    "http://localhost",
    "redis:/localhost",
    "redis://",
    "redis://:6379",
    "redis://h:",
    "redis://h:0",
    "redis://h:65536",
    "redis://h:-1",
    "redis://h:12ab",
    "redis://h:99999999999999999999",
    "redis://h/abc",
    "redis://h/-1",
    "redis://h/1x",
    "redis://h/99999999999999999999",
    "redis://[::1",
    "redis://[::1]x",
    "redis://[::1]:",
    "redis://u:p%zz@h",
    "redis://u:p%4@h",
    "redis://u:p%@h",
    "redis://u:p%00@h",
    "redis://h h",
    "redis://h\r\n",
    "unix:",
    "unix:relative/path",
    "unix:/tmp/s?db=x",
    "unix:/tmp/s?foo=1",
};

/* bad[k] is refused with a message; the error buffer is never overrun,
 * even when it is tiny (an overrun fails the test at once). */
static int bad_entry_wrong(size_t k)
{
    tb_redis_addr_t a;
    char err[128 + 8];
    char tiny[8 + 8];
    size_t i;
    int wrong = 0;

    memset(err, 0, sizeof(err));
    if (tb_url_parse(bad[k], &a, err, 128) != TB_ERR) {
        print_error("bad url %zu '%s' accepted\n", k, bad[k]);
        return 1;
    }
    if (err[0] == '\0') {
        print_error("bad url '%s' refused without a message\n", bad[k]);
        wrong = 1;
    }
    memset(tiny, 0x5a, sizeof(tiny));
    assert_int_equal(tb_url_parse(bad[k], &a, tiny, 8), TB_ERR);
    assert_non_null(memchr(tiny, '\0', 8));
    for (i = 8; i < sizeof(tiny); i++) {
        assert_int_equal((unsigned char)tiny[i], 0x5a);
    }
    return wrong;
}

/* Every bad URL is refused with a message; the error buffer is never
 * overrun, even when it is tiny. */
static void test_url_parse_bad(void **state)
{
    (void)state;
    check_table(sizeof(bad) / sizeof(bad[0]), bad_entry_wrong);
}

/* Parts too long for their fields are refused, not truncated: each URL
 * is head, len bytes of fill (the part), then tail. */
static void test_url_parse_overlong_parts(void **state)
{
    static const struct {
        const char *head;
        char fill;
        size_t len;
        const char *tail;
    } parts[] = {
        {"redis://", 'h', 300, ":1"},          /* host */
        {"unix:/", 'p', 200, ""},              /* socket path */
        {"redis://:", 'w', 400, "@h"},         /* password */
        {"redis://", 'u', 200, ":p@h"},        /* user */
    };
    char url[2048], err[128];
    tb_redis_addr_t a;
    size_t k, n;

    (void)state;
    for (k = 0; k < sizeof(parts) / sizeof(parts[0]); k++) {
        n = (size_t)snprintf(url, sizeof(url), "%s", parts[k].head);
        memset(url + n, parts[k].fill, parts[k].len);
        n += parts[k].len;
        snprintf(url + n, sizeof(url) - n, "%s", parts[k].tail);
        assert_int_equal(tb_url_parse(url, &a, err, sizeof(err)), TB_ERR);
    }
}

static void test_url_parse_null_arguments(void **state)
{
    tb_redis_addr_t a;
    char err[128];

    (void)state;
    assert_int_equal(tb_url_parse(NULL, &a, err, sizeof(err)), TB_ERR);
    assert_int_equal(tb_url_parse("redis://h", NULL, err, sizeof(err)),
                     TB_ERR);
    /* No error buffer: still refused, still no crash. */
    assert_int_equal(tb_url_parse("nope", &a, NULL, 0), TB_ERR);
}

/* Redacting into any buffer of 1..63 bytes ends in a NUL within it,
 * writes nothing past it and shows no part of a "hunter2" password. */
static void assert_redact_truncates(const tb_redis_addr_t *a)
{
    size_t len;

    for (len = 1; len < 64; len++) {
        char small[64 + 8];

        memset(small, 0x5a, sizeof(small));
        tb_url_redact(a, small, len);
        assert_non_null(memchr(small, '\0', len));
        assert_null(strstr(small, "hun"));
        assert_int_equal((unsigned char)small[len], 0x5a);
    }
}

/* The redacted form never shows the password (raw or escaped), shows the
 * rest, and survives any output length. */
static void test_url_redact_hides_password(void **state)
{
    static const char *urls[] = {
        "redis://alice:hunter2@h:7000/3",
        "redis://:hunter2@[::1]:7000",
        "redis://bob:hun%74er2@h",
        "unix:/tmp/r.sock",
    };
    size_t k;

    (void)state;
    for (k = 0; k < sizeof(urls) / sizeof(urls[0]); k++) {
        tb_redis_addr_t a;
        char out[512 + 8], err[128];

        assert_int_equal(tb_url_parse(urls[k], &a, err, sizeof(err)), TB_OK);
        tb_url_redact(&a, out, 512);
        assert_null(strstr(out, "hunter"));
        assert_null(strstr(out, "hun%74"));
        if (a.password[0]) {
            assert_non_null(strstr(out, "***"));
        }
        else {
            assert_null(strstr(out, "***"));
        }
        if (a.user[0]) {
            assert_non_null(strstr(out, a.user));
        }
        if (a.host[0]) {
            assert_non_null(strstr(out, a.host));
            if (a.port != 6379) {
                assert_non_null(strstr(out, "7000"));
            }
        }
        else {
            assert_non_null(strstr(out, a.path));
        }
        assert_redact_truncates(&a);
    }
}

/* A URL that comes back from redaction (password replaced) still parses
 * to the same place, so logs can be pasted back into a config. */
static void test_url_redact_round_trip(void **state)
{
    tb_redis_addr_t a, b;
    char out[512], err[128];

    (void)state;
    assert_int_equal(tb_url_parse("redis://alice:pw@[::1]:7001/5", &a, err,
                                  sizeof(err)), TB_OK);
    tb_url_redact(&a, out, sizeof(out));
    assert_int_equal(tb_url_parse(out, &b, err, sizeof(err)), TB_OK);
    assert_string_equal(b.host, "::1");
    assert_int_equal(b.port, 7001);
    assert_int_equal(b.db, 5);
    assert_string_equal(b.user, "alice");
    assert_string_equal(b.password, "***");
}

/* The URL is refused with a message. */
static void assert_refused(const char *url)
{
    tb_redis_addr_t a;
    char err[160] = "";

    if (tb_url_parse(url, &a, err, sizeof(err)) != TB_ERR || !err[0]) {
        fail_msg("'%s' accepted or refused without a message", url);
    }
}

/* Sentinel and Cluster URLs fill the endpoint list, the master
 * name and the kind; the first endpoint is also host and port. */
static void test_url_parse_sentinel_cluster(void **state)
{
    tb_redis_addr_t a;
    char err[160];
    int i;

    (void)state;
    assert_int_equal(tb_url_parse("redis-sentinel://u:p%40w@10.0.0.1,"
                                  "[::1]:26380,s3:7/mymaster/2", &a, err,
                                  sizeof(err)), TB_OK);
    assert_int_equal(a.kind, TB_REDIS_SENTINEL);
    assert_int_equal(a.nseeds, 3);
    assert_string_equal(a.seeds[0].host, "10.0.0.1");
    assert_int_equal(a.seeds[0].port, 26379);
    assert_string_equal(a.seeds[1].host, "::1");
    assert_int_equal(a.seeds[1].port, 26380);
    assert_string_equal(a.seeds[2].host, "s3");
    assert_int_equal(a.seeds[2].port, 7);
    assert_string_equal(a.host, "10.0.0.1");
    assert_int_equal(a.port, 26379);
    assert_string_equal(a.master, "mymaster");
    assert_string_equal(a.user, "u");
    assert_string_equal(a.password, "p@w");
    assert_int_equal(a.db, 2);

    assert_int_equal(tb_url_parse("redis-cluster://h1,h2:7001/", &a, err,
                                  sizeof(err)), TB_OK);
    assert_int_equal(a.kind, TB_REDIS_CLUSTER);
    assert_int_equal(a.nseeds, 2);
    assert_int_equal(a.seeds[0].port, 6379);
    assert_int_equal(a.seeds[1].port, 7001);
    assert_int_equal(a.db, 0);
    assert_string_equal(a.master, "");

    /* Plain URLs keep kind 0 and no seeds. */
    assert_int_equal(tb_url_parse("redis://h:1", &a, err, sizeof(err)),
                     TB_OK);
    assert_int_equal(a.kind, TB_REDIS_SINGLE);
    assert_int_equal(a.nseeds, 0);

    {
        static const char *bad_ha[] = {
            "redis-sentinel://h1,h2",          /* no master name */
            "redis-sentinel://h1/",
            "redis-sentinel://h1/na me",
            "redis-sentinel://h1/m/x",
            "redis-sentinel://,h1/m",
            "redis-sentinel://h1,/m",
            "redis-sentinel://h1:0/m",
            "redis-cluster://h1/3",            /* Cluster has db 0 only */
            "redis-cluster://",
            "redis-cluster://h1,,h2",
            "redis-cluster://h:1,h:2,h:3,h:4,h:5,h:6,h:7,h:8,h:9",
        };
        size_t k;

        for (k = 0; k < sizeof(bad_ha) / sizeof(bad_ha[0]); k++) {
            assert_refused(bad_ha[k]);
        }
    }
    /* Eight endpoints is the most. */
    assert_int_equal(tb_url_parse("redis-cluster://h:1,h:2,h:3,h:4,h:5,h:6,"
                                  "h:7,h:8", &a, err, sizeof(err)), TB_OK);
    for (i = 0; i < 8; i++) {
        assert_int_equal(a.seeds[i].port, i + 1);
    }
}

/* Redacted Sentinel and Cluster URLs hide the password, keep every
 * endpoint and the master name, and parse back to the same place. */
static void test_url_redact_sentinel_cluster(void **state)
{
    static const char *urls[] = {
        "redis-sentinel://alice:hunter2@a:1,[::1]:2/mymaster/3",
        "redis-cluster://:hunter2@a:1,b:2,c:3",
        "redis-cluster://a:1",
    };
    size_t k;

    (void)state;
    for (k = 0; k < sizeof(urls) / sizeof(urls[0]); k++) {
        tb_redis_addr_t a, b;
        char out[1024], err[160];
        int i;

        assert_int_equal(tb_url_parse(urls[k], &a, err, sizeof(err)), TB_OK);
        tb_url_redact(&a, out, sizeof(out));
        assert_null(strstr(out, "hunter"));
        assert_int_equal(tb_url_parse(out, &b, err, sizeof(err)), TB_OK);
        assert_int_equal(b.kind, a.kind);
        assert_int_equal(b.nseeds, a.nseeds);
        for (i = 0; i < a.nseeds; i++) {
            assert_string_equal(b.seeds[i].host, a.seeds[i].host);
            assert_int_equal(b.seeds[i].port, a.seeds[i].port);
        }
        assert_string_equal(b.master, a.master);
        assert_int_equal(b.db, a.db);
        assert_redact_truncates(&a);
    }
}

/* TLS: rediss:// and ?tls=on (any TCP kind) set tls; ?tls=off and the
 * plain schemes leave it off; anything else in a query is refused, as is
 * a rediss:// URL that says tls=off. Redaction keeps TLS on. */
static void test_url_parse_tls(void **state)
{
    static const struct {
        const char *url;
        int tls, kind, port, db;
    } ok[] = {
        {"rediss://h:6380", 1, TB_REDIS_SINGLE, 6380, 0},
        {"rediss://:p%3Fw@h/2", 1, TB_REDIS_SINGLE, 6379, 2},
        {"rediss://u:p?w@h:1/3?tls=on", 1, TB_REDIS_SINGLE, 1, 3},
        {"redis://h:1/4?tls=on", 1, TB_REDIS_SINGLE, 1, 4},
        {"redis://h:1?tls=off", 0, TB_REDIS_SINGLE, 1, 0},
        {"redis-sentinel://a,b:2/m/5?tls=on", 1, TB_REDIS_SENTINEL, 26379, 5},
        {"redis-sentinel://a/m?tls=off", 0, TB_REDIS_SENTINEL, 26379, 0},
        {"redis-cluster://a:1,b:2?tls=on", 1, TB_REDIS_CLUSTER, 1, 0},
        {"redis-cluster://a:1/?tls=on", 1, TB_REDIS_CLUSTER, 1, 0},
    };
    static const char *refused[] = {
        "rediss://h?tls=off", "redis://h?tls=yes", "redis://h?db=1",
        "redis-cluster://a?", "unix:/tmp/s?tls=on", "rediss://",
        "rediss:/h", "redis-sentinel://a?tls=on",
    };
    size_t k;

    (void)state;
    for (k = 0; k < sizeof(ok) / sizeof(ok[0]); k++) {
        tb_redis_addr_t a, b;
        char err[160] = "", out[512];

        if (tb_url_parse(ok[k].url, &a, err, sizeof(err)) != TB_OK) {
            fail_msg("%s refused: %s", ok[k].url, err);
        }
        assert_int_equal(a.tls, ok[k].tls);
        assert_int_equal(a.kind, ok[k].kind);
        assert_int_equal(a.port, ok[k].port);
        assert_int_equal(a.db, ok[k].db);
        tb_url_redact(&a, out, sizeof(out));
        assert_int_equal(tb_url_parse(out, &b, err, sizeof(err)), TB_OK);
        assert_int_equal(b.tls, a.tls);
    }
    for (k = 0; k < sizeof(refused) / sizeof(refused[0]); k++) {
        assert_refused(refused[k]);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_url_parse_good),
        cmocka_unit_test(test_url_parse_bad),
        cmocka_unit_test(test_url_parse_overlong_parts),
        cmocka_unit_test(test_url_parse_null_arguments),
        cmocka_unit_test(test_url_redact_hides_password),
        cmocka_unit_test(test_url_redact_round_trip),
        cmocka_unit_test(test_url_parse_sentinel_cluster),
        cmocka_unit_test(test_url_redact_sentinel_cluster),
        cmocka_unit_test(test_url_parse_tls),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
