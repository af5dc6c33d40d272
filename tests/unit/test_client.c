/* test_client.c -- unit tests for tb_client.c without a Redis server.
 *
 * What can be checked with Redis unreachable: option validation (a bad
 * option is a clear error, never a crash), each failure policy's answer,
 * and the circuit breaker, which must open after the threshold and then
 * stop calling Redis until the cooldown ends. The clock is the swappable
 * tb_clock_now_us, driven by hand, so nothing sleeps. "Unreachable" is a
 * closed loopback port (refused at once), or a listening socket that never
 * accepts (the connect succeeds in the kernel and the command times out);
 * the latter also lets the test count every connection the client makes.
 * Concurrency limits are checked here for their arguments and for the
 * policies' slots (the local count, its release and its expiry).
 * Decisions against a real Redis are in tests/integration/core/.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmocka.h>

#include "tb_int.h"
#include "unit_common.h"

/* ---- Fixtures ----------------------------------------------------------- */

static tb_monotime_us fake_now_us = 1000000000;

static tb_monotime_us fake_clock(void)
{
    return fake_now_us;
}

/* A loopback port with nothing listening: bound, then closed. */
static int closed_port(void)
{
    struct sockaddr_in sa;
    socklen_t len = sizeof(sa);
    int fd = socket(AF_INET, SOCK_STREAM, 0), port;

    assert_true(fd >= 0);
    memset(&sa, 0, sizeof(sa));
    sa.sin_family = AF_INET;
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    assert_int_equal(bind(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
    assert_int_equal(getsockname(fd, (struct sockaddr *)&sa, &len), 0);
    port = ntohs(sa.sin_port);
    close(fd);
    return port;
}

/* A listening socket that never accepts on its own; *port gets its port.
 * The kernel completes each connect, so a client's command just waits. */
static int silent_listener(int *port)
{
    struct sockaddr_in sa;
    socklen_t len = sizeof(sa);
    int fd = socket(AF_INET, SOCK_STREAM, 0);

    assert_true(fd >= 0);
    memset(&sa, 0, sizeof(sa));
    sa.sin_family = AF_INET;
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    assert_int_equal(bind(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
    assert_int_equal(listen(fd, 64), 0);
    assert_int_equal(getsockname(fd, (struct sockaddr *)&sa, &len), 0);
    assert_int_equal(fcntl(fd, F_SETFL, O_NONBLOCK), 0);
    *port = ntohs(sa.sin_port);
    return fd;
}

/* Connections the client has made to the listener since the last call. */
static int drain_accepts(int lfd)
{
    int n = 0, fd;

    while ((fd = accept(lfd, NULL, NULL)) >= 0) {
        close(fd);
        n++;
    }
    assert_true(errno == EAGAIN || errno == EWOULDBLOCK);
    return n;
}

/* o: the defaults, with Redis at port on loopback (its URL written to
 * url, URL_LEN bytes), policy and stats. */
#define URL_LEN 64
static void options_at(tb_options_t *o, char *url, int port,
                       tb_policy_t policy, tb_stats_t *stats)
{
    tb_options_init(o);
    snprintf(url, URL_LEN, "redis://127.0.0.1:%d", port);
    o->url = url;
    o->policy = policy;
    o->stats = stats;
}

/* tb_client_create(o), which must succeed. */
static tb_client_t *create(const tb_options_t *o)
{
    char err[128] = "";
    tb_client_t *c = tb_client_create(o, err, sizeof(err));

    if (!c) {
        fail_msg("tb_client_create: %s", err);
    }
    return c;
}

static tb_client_t *client_at(int port, tb_policy_t policy, int threshold,
                              int64_t cooldown_ms, tb_stats_t *stats)
{
    tb_options_t o;
    char url[URL_LEN];

    options_at(&o, url, port, policy, stats);
    o.timeout_ms = 30;
    o.pool_size = 2;
    o.breaker_threshold = threshold;
    o.breaker_cooldown_ms = cooldown_ms;
    return create(&o);
}

/* client_at() a closed port: Redis unreachable, refused at once; *stats
 * zeroed first. */
static tb_client_t *unreachable(tb_policy_t policy, int threshold,
                                int64_t cooldown_ms, tb_stats_t *stats)
{
    memset(stats, 0, sizeof(*stats));
    return client_at(closed_port(), policy, threshold, cooldown_ms, stats);
}

/* A decision that Redis did not make: who made it, and its answer. */
static void assert_answer(const tb_result_t *res, tb_source_t source,
                          int allowed)
{
    assert_int_equal(res->source, source);
    assert_int_equal(res->allowed, allowed);
}

static int decide1(tb_client_t *c, double cap, double rate, double cost,
                   tb_result_t *res)
{
    tb_take_t t;

    unit_take(&t, cap, rate, cost);
    return tb_client_decide(c, "tb:", "client-1", 8, &t, 1, res);
}

/* ---- Options ------------------------------------------------------------ */

static void test_client_options_defaults(void **state)
{
    tb_options_t o;

    (void)state;
    memset(&o, 0x5a, sizeof(o));
    tb_options_init(&o);
    assert_int_equal(o.timeout_ms, 50);
    assert_int_equal(o.pool_size, 2);
    assert_int_equal(o.breaker_threshold, 5);
    assert_int_equal(o.breaker_cooldown_ms, 10000);
    assert_int_equal(o.policy, TB_POLICY_OPEN);
    assert_int_equal(o.replicas, 1);
    assert_int_equal(o.local_entries, 4096);
    assert_null(o.local);
    assert_null(o.stats);
    assert_int_equal(o.closed_retry_ms, 1000);
}

/* The defaults make a client without any other setting. */
static void test_client_create_with_defaults(void **state)
{
    tb_options_t o;
    tb_client_t *c;
    char err[128] = "";
    int size = -1, open = -1, in_use = -1;

    (void)state;
    tb_options_init(&o);
    c = tb_client_create(&o, err, sizeof(err));
    assert_non_null(c);
    tb_client_pool_usage(c, &size, &open, &in_use);
    assert_int_equal(size, 2);
    assert_int_equal(open, 0); /* Creating does not connect. */
    assert_int_equal(in_use, 0);
    assert_int_equal(tb_client_breaker_state(c), TB_BREAKER_CLOSED);
    assert_non_null(tb_client_stats(c));
    assert_int_equal(tb_client_stats(c)->decisions, 0);
    tb_client_free(c);
}

/* Each bad option is refused with a message; the message fits the
 * caller's buffer, even a tiny one; no buffer at all is no crash. */
static void test_client_create_bad_options(void **state)
{
    enum { URL, TIMEOUT0, TIMEOUTNEG, CTIMEOUTNEG, POOL0, POOLNEG, THRESH0,
           COOLNEG, POLICY, REPLICAS0, REPLICASNEG, TLS_PLAIN, TLS_NO_CA,
           TLS_CERT_ALONE, TLS_NAME, NBAD };
    static const char *urls[] = {"http://x", "redis://h:0", "unix:", "", "x"};
    int k, u;

    (void)state;
    for (k = 0; k < NBAD; k++) {
        for (u = 0; u < (k == URL ? 5 : 1); u++) {
            tb_options_t o;
            char err[128 + 8], tiny[6 + 8];
            size_t i;

            tb_options_init(&o);
            o.url = "redis://127.0.0.1:6379";
            switch (k) {
            case URL: o.url = urls[u]; break;
            case TIMEOUT0: o.timeout_ms = 0; break;
            case TIMEOUTNEG: o.timeout_ms = -5; break;
            case CTIMEOUTNEG: o.connect_timeout_ms = -5; break;
            case POOL0: o.pool_size = 0; break;
            case POOLNEG: o.pool_size = -1; break;
            case THRESH0: o.breaker_threshold = 0; break;
            case COOLNEG: o.breaker_cooldown_ms = -1; break;
            case POLICY: o.policy = (tb_policy_t)7; break;
            case REPLICAS0: o.policy = TB_POLICY_LOCAL; o.replicas = 0; break;
            case REPLICASNEG: o.replicas = -2; break;
            /* TLS settings with a plaintext URL are a mistake, not a
             * silent plaintext connection. */
            case TLS_PLAIN: o.tls.no_verify = 1; break;
            case TLS_NO_CA:
                o.url = "rediss://127.0.0.1:6380";
                o.tls.ca_file = "/nonexistent/ca.pem";
                break;
            case TLS_CERT_ALONE:
                o.url = "redis-cluster://h:1?tls=on";
                o.tls.cert_file = "/etc/hostname";
                break;
            case TLS_NAME:
                o.url = "rediss://127.0.0.1:6380";
                o.tls.server_name = "bad name";
                break;
            }
            memset(err, 0x5a, sizeof(err));
            if (tb_client_create(&o, err, 128) != NULL) {
                fail_msg("bad option %d/%d accepted", k, u);
            }
            if (err[0] == '\0' || err[0] == 0x5a || !memchr(err, '\0', 128)) {
                fail_msg("bad option %d/%d: no clear message", k, u);
            }
            for (i = 128; i < sizeof(err); i++) {
                assert_int_equal((unsigned char)err[i], 0x5a);
            }
            memset(tiny, 0x5a, sizeof(tiny));
            assert_null(tb_client_create(&o, tiny, 6));
            assert_non_null(memchr(tiny, '\0', 6));
            for (i = 6; i < sizeof(tiny); i++) {
                assert_int_equal((unsigned char)tiny[i], 0x5a);
            }
            assert_null(tb_client_create(&o, NULL, 0));
        }
    }
    assert_null(tb_client_create(NULL, NULL, 0));
}

static void test_client_free_null(void **state)
{
    tb_stats_t st;
    tb_client_t *c;
    tb_result_t res;

    (void)state;
    tb_client_free(NULL);
    tb_client_after_fork(NULL);
    tb_tls_free(NULL);
    /* NULL is no client: every call that takes one refuses it rather
     * than reading through it. */
    assert_int_equal(tb_client_decide(NULL, "tb:", "k", 1, NULL, 0, &res),
                     TB_ERR);
    assert_int_equal(res.source, TB_SRC_ERROR);
    assert_int_equal(res.err, TB_ERR_ARG);
    assert_int_equal(tb_client_release(NULL, NULL, NULL), TB_ERR);
    assert_int_equal(tb_client_failing(NULL), 0);
    /* And a client freed right after its creation, never used, leaves
     * nothing behind (ASan's leak check, in make asan). */
    c = unreachable(TB_POLICY_OPEN, 5, 1000, &st);
    assert_non_null(c);
    tb_client_free(c);
    assert_int_equal(st.decisions, 0);
}

/* A TLS context can be made any number of times in one process (a server
 * makes them at every configuration load), and a client with TLS on
 * makes its own when none is given. */
static void test_client_tls_contexts(void **state)
{
    tb_tls_options_t t;
    tb_options_t o;
    tb_client_t *c;
    char err[256];
    int i;

    (void)state;
    memset(&t, 0, sizeof(t));
    for (i = 0; i < 300; i++) {
        tb_tls_t *ctx = tb_tls_create(&t, err, sizeof(err));

        if (!ctx) {
            fail_msg("context %d refused: %s", i, err);
        }
        tb_tls_free(ctx);
    }
    tb_options_init(&o);
    o.url = "redis-sentinel://a:1,b:2/m?tls=on";
    o.tls.server_name = "redis.example";
    c = tb_client_create(&o, err, sizeof(err));
    assert_non_null(c);
    tb_client_free(c);
}

/* ---- Decisions with Redis unreachable ---------------------------------- */

/* Bad decide arguments: TB_ERR with TB_ERR_ARG, and Redis is not asked. */
static void test_client_decide_bad_arguments(void **state)
{
    tb_stats_t st;
    tb_client_t *c;
    tb_take_t t[TB_MAX_BUCKETS + 1];
    tb_result_t res;
    int k;

    (void)state;
    c = unreachable(TB_POLICY_OPEN, 5, 1000, &st);
    memset(t, 0, sizeof(t));
    for (k = 0; k <= TB_MAX_BUCKETS; k++) {
        t[k].limit.capacity = 10;
        t[k].limit.rate_per_sec = 1;
        t[k].cost = 1;
        t[k].name = "r";
        t[k].kind = TB_TAKE_NAMED;
    }
    t[0].name = NULL;
    t[0].kind = TB_TAKE_MAIN;
#define BAD(call)                                                           \
    do {                                                                    \
        memset(&res, 0x5a, sizeof(res));                                    \
        assert_int_equal((call), TB_ERR);                                   \
        assert_int_equal(res.err, TB_ERR_ARG);                              \
    } while (0)
    BAD(tb_client_decide(c, "tb:", "k", 1, t, 0, &res));
    BAD(tb_client_decide(c, "tb:", "k", 1, t, TB_MAX_BUCKETS + 1, &res));
    BAD(tb_client_decide(c, "tb:", "k", 1, NULL, 1, &res));
    BAD(tb_client_decide(c, "bad prefix", "k", 1, t, 1, &res));
    BAD(tb_client_decide(c, "", "k", 1, t, 1, &res));
    BAD(tb_client_decide(c, NULL, "k", 1, t, 1, &res));
    BAD(tb_client_decide(c, "tb:", NULL, 3, t, 1, &res));
    BAD(tb_client_decide(NULL, "tb:", "k", 1, t, 1, &res));
    t[1].name = "bad route!";
    BAD(tb_client_decide(c, "tb:", "k", 1, t, 2, &res));
    t[1].name = NULL;                       /* Named without a name. */
    BAD(tb_client_decide(c, "tb:", "k", 1, t, 2, &res));
    t[1].name = "r";
    t[1].kind = TB_TAKE_KEYED;              /* Keyed without a key. */
    BAD(tb_client_decide(c, "tb:", "k", 1, t, 2, &res));
    t[1].kind = TB_TAKE_NAMED;
    t[0].limit.capacity = 0;
    BAD(tb_client_decide(c, "tb:", "k", 1, t, 1, &res));
    t[0].limit.capacity = 10;
    t[0].limit.rate_per_sec = -1;
    BAD(tb_client_decide(c, "tb:", "k", 1, t, 1, &res));
    t[0].limit.rate_per_sec = 1;
    t[0].cost = -1;
    BAD(tb_client_decide(c, "tb:", "k", 1, t, 1, &res));
#undef BAD
    assert_int_equal(st.redis_calls, 0);
    assert_int_equal(st.connects, 0);
    tb_client_free(c);
}

/* open: allowed, source open, the I/O error reported; counted. */
static void test_client_policy_open_when_unreachable(void **state)
{
    tb_stats_t st;
    tb_client_t *c;
    tb_result_t res;

    (void)state;
    c = unreachable(TB_POLICY_OPEN, 5, 1000, &st);
    assert_int_equal(decide1(c, 10, 1, 1, &res), TB_ERR);
    assert_answer(&res, TB_SRC_OPEN, 1);
    assert_int_equal(res.err, TB_ERR_IO);
    assert_int_equal(res.retry_ms, 0);
    assert_true(res.limit == 10);
    assert_int_equal(st.decisions, 1);
    assert_int_equal(st.allowed, 1);
    assert_int_equal(st.redis_errors, 1);
    assert_int_equal(st.errors[TB_ERR_IO], 1);
    assert_int_equal(st.fallback_open, 1);
    assert_int_equal(c->err, TB_ERR_IO);
    assert_true(c->errstr[0] != '\0');
    tb_client_free(c);
}

/* closed: rejected, with a retry-after to give the client. */
static void test_client_policy_closed_when_unreachable(void **state)
{
    tb_stats_t st;
    tb_options_t o;
    tb_client_t *c;
    tb_result_t res;
    char url[URL_LEN];

    (void)state;
    memset(&st, 0, sizeof(st));
    options_at(&o, url, closed_port(), TB_POLICY_CLOSED, &st);
    o.closed_retry_ms = 1234;
    c = create(&o);
    assert_int_equal(decide1(c, 10, 1, 1, &res), TB_ERR);
    assert_answer(&res, TB_SRC_CLOSED, 0);
    assert_int_equal(res.err, TB_ERR_IO);
    assert_int_equal(res.retry_ms, 1234);
    assert_int_equal(st.rejected, 1);
    assert_int_equal(st.fallback_closed, 1);
    tb_client_free(c);
}

/* local: a local bucket of capacity/replicas and rate/replicas, in a
 * caller-supplied table, driven by the injected clock. */
static void test_client_policy_local_when_unreachable(void **state)
{
    tb_stats_t st;
    tb_options_t o;
    tb_client_t *c;
    tb_result_t res;
    void *mem;
    tb_local_t *table;
    char url[URL_LEN];
    int k, allowed = 0;

    (void)state;
    memset(&st, 0, sizeof(st));
    mem = malloc(tb_local_size(64));
    assert_non_null(mem);
    table = tb_local_init(mem, 64);
    options_at(&o, url, closed_port(), TB_POLICY_LOCAL, &st);
    o.replicas = 3;
    o.local = table;
    o.breaker_threshold = 1000;
    c = create(&o);
    for (k = 0; k < 10; k++) {
        assert_int_equal(decide1(c, 9, 3, 1, &res), TB_ERR);
        assert_int_equal(res.source, TB_SRC_LOCAL);
        assert_int_equal(res.err, TB_ERR_IO);
        allowed += res.allowed;
    }
    assert_int_equal(allowed, 3); /* 9 / 3 replicas. */
    assert_int_equal(res.retry_ms, 1000); /* 1 token/s locally. */
    assert_int_equal(tb_local_used(table), 1);
    assert_int_equal(st.fallback_local, 10);
    fake_now_us += 1000000;
    assert_int_equal(decide1(c, 9, 3, 1, &res), TB_ERR);
    assert_answer(&res, TB_SRC_LOCAL, 1);
    tb_client_free(c);
    free(mem);
}

/* local with the client's own table (none supplied). */
static void test_client_policy_local_own_table(void **state)
{
    tb_stats_t st;
    tb_client_t *c;
    tb_result_t res;
    int k, allowed = 0;

    (void)state;
    c = unreachable(TB_POLICY_LOCAL, 1000, 1000, &st);
    for (k = 0; k < 5; k++) {
        decide1(c, 2, 1, 1, &res);
        assert_int_equal(res.source, TB_SRC_LOCAL);
        allowed += res.allowed;
    }
    assert_int_equal(allowed, 2);
    tb_client_free(c);
}

/* A decision over TB_MAX_BUCKETS buckets keeps every bucket's key: after
 * an 8-bucket local decision took the main bucket's only token, the main
 * bucket alone is empty. (Also run under make asan: the argument vector
 * for the script is built before Redis is found unreachable.) */
static void test_client_decide_max_buckets(void **state)
{
    char routes[TB_MAX_BUCKETS][8];
    tb_stats_t st;
    tb_client_t *c;
    tb_take_t t[TB_MAX_BUCKETS];
    tb_result_t res;
    int k;

    (void)state;
    c = unreachable(TB_POLICY_LOCAL, 1000, 1000, &st);
    memset(t, 0, sizeof(t));
    for (k = 0; k < TB_MAX_BUCKETS; k++) {
        t[k].limit.capacity = k == 0 ? 1 : 10;
        t[k].limit.rate_per_sec = 0.001;
        t[k].cost = 1;
        snprintf(routes[k], sizeof(routes[k]), "r%d", k);
        t[k].name = k == 0 ? NULL : routes[k];
        t[k].kind = k == 0 ? TB_TAKE_MAIN : TB_TAKE_NAMED;
    }
    assert_int_equal(tb_client_decide(c, "tb:", "max", 3, t, TB_MAX_BUCKETS,
                                      &res), TB_ERR);
    assert_answer(&res, TB_SRC_LOCAL, 1);
    assert_int_equal(res.remaining, 0);
    assert_int_equal(res.binding, 0);
    assert_int_equal(tb_client_decide(c, "tb:", "max", 3, t, 1, &res),
                     TB_ERR);
    assert_int_equal(res.allowed, 0);
    assert_int_equal(tb_client_decide(c, "tb:", "max", 3,
                                      t + TB_MAX_BUCKETS - 1, 1, &res),
                     TB_ERR);
    assert_int_equal(res.allowed, 1);
    tb_client_free(c);
}

/* The breaker opens after `threshold` consecutive failures, answers by the
 * policy without calling Redis while open, lets one probe through after
 * the cooldown and reopens when that probe fails. */
static void test_client_breaker_opens_and_stops_calling(void **state)
{
    tb_stats_t st;
    tb_client_t *c;
    tb_result_t res;
    int k;

    (void)state;
    c = unreachable(TB_POLICY_CLOSED, 3, 1000, &st);
    for (k = 0; k < 3; k++) {
        assert_int_equal(tb_client_breaker_state(c), TB_BREAKER_CLOSED);
        decide1(c, 10, 1, 1, &res);
        assert_int_equal(res.err, TB_ERR_IO);
    }
    assert_int_equal(tb_client_breaker_state(c), TB_BREAKER_OPEN);
    assert_int_equal(st.breaker_opens, 1);
    assert_int_equal(st.redis_calls, 3);
    for (k = 0; k < 20; k++) {
        fake_now_us += 49000;
        assert_int_equal(decide1(c, 10, 1, 1, &res), TB_ERR);
        assert_int_equal(res.err, TB_ERR_BREAKER);
        assert_answer(&res, TB_SRC_CLOSED, 0);
        /* Closed policy + open breaker: retry when the probe is due. */
        assert_true(res.retry_ms > 0 && res.retry_ms <= 1000);
        assert_int_equal(res.redis_us, 0);
    }
    assert_int_equal(st.redis_calls, 3);
    assert_int_equal(st.breaker_skips, 20);
    assert_int_equal(st.decisions, 23);
    /* 20 x 49 ms = 980 ms: 20 ms to go. */
    fake_now_us += 19000;
    decide1(c, 10, 1, 1, &res);
    assert_int_equal(res.err, TB_ERR_BREAKER);
    fake_now_us += 1000;
    decide1(c, 10, 1, 1, &res); /* The probe: it fails. */
    assert_int_equal(res.err, TB_ERR_IO);
    assert_int_equal(st.redis_calls, 4);
    assert_int_equal(tb_client_breaker_state(c), TB_BREAKER_OPEN);
    decide1(c, 10, 1, 1, &res);
    assert_int_equal(res.err, TB_ERR_BREAKER);
    assert_int_equal(st.redis_calls, 4);
    fake_now_us += 1000000;
    decide1(c, 10, 1, 1, &res);
    assert_int_equal(st.redis_calls, 5);
    tb_client_free(c);
}

/* The same, counted at the socket: a listener that never answers sees one
 * connection per attempt until the breaker opens, none while it is open,
 * and the probe after the cooldown. Each attempt times out (30 ms), and
 * the call returns within the timeout plus a margin. */
static void test_client_breaker_counts_connections(void **state)
{
    tb_stats_t st;
    tb_client_t *c;
    tb_result_t res;
    int lfd, port, k, seen = 0;

    (void)state;
    memset(&st, 0, sizeof(st));
    lfd = silent_listener(&port);
    c = client_at(port, TB_POLICY_OPEN, 2, 500, &st);
    for (k = 0; k < 2; k++) {
        tb_monotime_us t0 = tb_clock_monotonic_us(), dt;

        decide1(c, 10, 1, 1, &res);
        dt = tb_clock_monotonic_us() - t0;
        assert_int_equal(res.err, TB_ERR_TIMEOUT);
        assert_answer(&res, TB_SRC_OPEN, 1);
        if (dt < 25000 || dt > 30000 + 100000) {
            fail_msg("a 30 ms timeout took %lld us", (long long)dt);
        }
        seen += drain_accepts(lfd);
    }
    assert_true(seen >= 2);
    assert_int_equal(st.errors[TB_ERR_TIMEOUT], 2);
    assert_int_equal(tb_client_breaker_state(c), TB_BREAKER_OPEN);
    for (k = 0; k < 50; k++) {
        decide1(c, 10, 1, 1, &res);
        assert_int_equal(res.err, TB_ERR_BREAKER);
    }
    assert_int_equal(drain_accepts(lfd), 0);
    fake_now_us += 500000;
    decide1(c, 10, 1, 1, &res);
    assert_int_equal(res.err, TB_ERR_TIMEOUT);
    assert_int_equal(drain_accepts(lfd), 1);
    tb_client_free(c);
    close(lfd);
}

/* Statistics helpers: a latency lands in the first bucket whose bound
 * holds it, the last bucket takes everything larger. */
static void test_client_stats_latency_histogram(void **state)
{
    tb_stats_t s;
    uint64_t total = 0;
    int k;

    (void)state;
    memset(&s, 0, sizeof(s));
    for (k = 1; k < TB_LAT_BUCKETS - 1; k++) {
        assert_true(tb_lat_bounds_us[k] > tb_lat_bounds_us[k - 1]);
    }
    tb_stats_latency(&s, 0);
    assert_int_equal(s.lat_count[0], 1);
    tb_stats_latency(&s, tb_lat_bounds_us[0]);
    assert_int_equal(s.lat_count[0], 2);
    tb_stats_latency(&s, tb_lat_bounds_us[0] + 1);
    assert_int_equal(s.lat_count[1], 1);
    tb_stats_latency(&s, tb_lat_bounds_us[TB_LAT_BUCKETS - 2] + 1);
    tb_stats_latency(&s, INT64_MAX / 2);
    assert_int_equal(s.lat_count[TB_LAT_BUCKETS - 1], 2);
    for (k = 0; k < TB_LAT_BUCKETS; k++) {
        total += s.lat_count[k];
    }
    assert_int_equal(total, 5);
    tb_stats_add(&s.decisions, 3);
    tb_stats_add(&s.decisions, 4);
    assert_int_equal(tb_stats_get(&s.decisions), 7);
}

/* ---- Concurrency limits without Redis ----------------------------------- */

/* A request with a concurrency limit on "client-1", with one bucket
 * (cap > 0) or none (cap 0). */
static int decide_conc(tb_client_t *c, int limit, int64_t ttl_ms, double cap,
                       tb_result_t *res)
{
    tb_take_t t;
    tb_request_t q;

    unit_take(&t, cap, 1, 1);
    unit_request(&q, "tb:", "client-1", &t, cap > 0 ? 1 : 0);
    q.concurrency = limit;
    q.concurrency_ttl_ms = ttl_ms;
    return tb_client_run(c, &q, res);
}

static void release_conc(tb_client_t *c, const tb_slot_t *slot,
                         int64_t ttl_ms)
{
    tb_request_t q;

    unit_request(&q, "tb:", "client-1", NULL, 0);
    q.concurrency_ttl_ms = ttl_ms;
    assert_int_equal(tb_client_release(c, &q, slot), TB_OK);
}

/* Out-of-range limits and ttls, shards, and no limit at all are
 * refused before anything is sent; releasing no slot is a no-op. */
static void test_client_concurrency_bad_arguments(void **state)
{
    tb_stats_t st;
    tb_client_t *c;
    tb_request_t q;
    tb_result_t res;
    tb_take_t t;
    tb_slot_t none;

    (void)state;
    c = unreachable(TB_POLICY_OPEN, 5, 1000, &st);
    unit_take(&t, 10, 1, 1);
    unit_request(&q, "tb:", "k", &t, 0);
#define BAD()                                                               \
    do {                                                                    \
        assert_int_equal(tb_client_run(c, &q, &res), TB_ERR);               \
        assert_int_equal(res.err, TB_ERR_ARG);                              \
        assert_int_equal(res.slot.kind, TB_SLOT_NONE);                      \
    } while (0)
    q.ntakes = 0;
    BAD();                              /* Neither buckets nor slots.   */
    q.concurrency = -1;
    BAD();
    q.concurrency = TB_MAX_CONCURRENCY + 1;
    BAD();
    q.concurrency = 2;
    q.concurrency_ttl_ms = -5;
    BAD();
    q.concurrency_ttl_ms = TB_MAX_CONCURRENCY_TTL_MS + 1;
    BAD();
    q.concurrency_ttl_ms = 0;
    q.ntakes = 1;
    q.shards = 4;
    BAD();                              /* A split key has no one set.  */
    q.shards = 0;
    q.prefix = "bad prefix";
    BAD();
#undef BAD
    assert_int_equal(st.redis_calls, 0);
    memset(&none, 0, sizeof(none));
    assert_int_equal(tb_client_release(c, &q, &none), TB_OK);
    assert_int_equal(tb_client_release(NULL, &q, &none), TB_ERR);
    tb_client_free(c);
}

/* open admits without a slot; closed refuses, blaming concurrency when
 * the request has no bucket. */
static void test_client_concurrency_open_and_closed(void **state)
{
    tb_stats_t st;
    tb_client_t *c;
    tb_result_t res;

    (void)state;
    c = unreachable(TB_POLICY_OPEN, 1000, 1000, &st);
    assert_int_equal(decide_conc(c, 3, 0, 0, &res), TB_ERR);
    assert_answer(&res, TB_SRC_OPEN, 1);
    assert_int_equal(res.slot.kind, TB_SLOT_NONE);
    assert_int_equal(res.remaining, 3);
    tb_client_free(c);
    c = client_at(closed_port(), TB_POLICY_CLOSED, 1000, 1000, &st);
    assert_int_equal(decide_conc(c, 3, 0, 0, &res), TB_ERR);
    assert_answer(&res, TB_SRC_CLOSED, 0);
    assert_int_equal(res.refused_by, TB_LIMIT_CONCURRENCY);
    assert_int_equal(decide_conc(c, 3, 0, 10, &res), TB_ERR);
    assert_int_equal(res.refused_by, TB_LIMIT_RATE);
    tb_client_free(c);
}

/* local: ceil(N / replicas) slots on this server; a release frees one;
 * a bucket that refuses takes no slot, and a full slot count takes no
 * token; slots never released are forgotten within the ttl. */
static void test_client_concurrency_local(void **state)
{
    tb_stats_t st;
    tb_options_t o;
    tb_client_t *c;
    tb_result_t res, held[3];
    char url[URL_LEN];
    int k;

    (void)state;
    memset(&st, 0, sizeof(st));
    options_at(&o, url, closed_port(), TB_POLICY_LOCAL, &st);
    o.replicas = 2;
    o.breaker_threshold = 1000;
    c = create(&o);
    for (k = 0; k < 3; k++) {       /* ceil(5 / 2) = 3 slots here. */
        assert_int_equal(decide_conc(c, 5, 10000, 0, &held[k]), TB_ERR);
        assert_answer(&held[k], TB_SRC_LOCAL, 1);
        assert_int_equal(held[k].slot.kind, TB_SLOT_LOCAL);
        assert_int_equal(held[k].in_flight, k + 1);
    }
    decide_conc(c, 5, 10000, 0, &res);
    assert_int_equal(res.allowed, 0);
    assert_int_equal(res.refused_by, TB_LIMIT_CONCURRENCY);
    assert_int_equal(res.retry_ms, TB_CONCURRENCY_RETRY_MS);
    assert_int_equal(res.slot.kind, TB_SLOT_NONE);
    release_conc(c, &held[0].slot, 10000);
    decide_conc(c, 5, 10000, 0, &held[0]);
    assert_int_equal(held[0].allowed, 1);

    /* Full: a bucket with tokens keeps them. */
    decide_conc(c, 5, 10000, 4, &res);
    assert_int_equal(res.refused_by, TB_LIMIT_CONCURRENCY);
    for (k = 0; k < 3; k++) {
        release_conc(c, &held[k].slot, 10000);
    }
    /* The bucket of 4 / 2 replicas = 2 tokens is whole: two pass, and
     * the third, refused by the bucket, holds no slot. */
    decide_conc(c, 5, 10000, 4, &held[0]);
    decide_conc(c, 5, 10000, 4, &held[1]);
    assert_int_equal(held[0].allowed + held[1].allowed, 2);
    decide_conc(c, 5, 10000, 4, &res);
    assert_int_equal(res.allowed, 0);
    assert_int_equal(res.refused_by, TB_LIMIT_RATE);
    assert_int_equal(res.in_flight, 2);
    decide_conc(c, 5, 10000, 0, &held[2]);
    assert_int_equal(held[2].allowed, 1);
    assert_int_equal(held[2].in_flight, 3);

    /* Never released: forgotten once a whole ttl has passed. */
    decide_conc(c, 5, 10000, 0, &res);
    assert_int_equal(res.allowed, 0);
    fake_now_us += 10000 * 1000;
    decide_conc(c, 5, 10000, 0, &res);
    assert_int_equal(res.allowed, 1);
    assert_int_equal(res.in_flight, 1);
    /* A release of a forgotten slot gives nothing back twice. */
    release_conc(c, &held[2].slot, 10000);
    decide_conc(c, 5, 10000, 0, &res);
    assert_int_equal(res.in_flight, 2);
    tb_client_free(c);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_client_options_defaults),
        cmocka_unit_test(test_client_create_with_defaults),
        cmocka_unit_test(test_client_create_bad_options),
        cmocka_unit_test(test_client_free_null),
        cmocka_unit_test(test_client_tls_contexts),
        cmocka_unit_test(test_client_decide_bad_arguments),
        cmocka_unit_test(test_client_policy_open_when_unreachable),
        cmocka_unit_test(test_client_policy_closed_when_unreachable),
        cmocka_unit_test(test_client_policy_local_when_unreachable),
        cmocka_unit_test(test_client_policy_local_own_table),
        cmocka_unit_test(test_client_decide_max_buckets),
        cmocka_unit_test(test_client_breaker_opens_and_stops_calling),
        cmocka_unit_test(test_client_breaker_counts_connections),
        cmocka_unit_test(test_client_stats_latency_histogram),
        cmocka_unit_test(test_client_concurrency_bad_arguments),
        cmocka_unit_test(test_client_concurrency_open_and_closed),
        cmocka_unit_test(test_client_concurrency_local),
    };

    /* Before any object exists, as tb.h asks. */
    tb_clock_now_us = fake_clock;
    return cmocka_run_group_tests(tests, NULL, NULL);
}
