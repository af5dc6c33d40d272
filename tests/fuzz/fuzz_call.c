/* fuzz_call.c -- tb_call.c on hostile requests: every field of a
 * tb_request_t, and the script's reply, taken from the input.
 *
 * Input layout: a byte each for the prefix (from a table, one of them
 * invalid), the number of takes (0..9, one past TB_MAX_BUCKETS), the
 * algorithm (two past the last), the shard count and the shard; then the
 * lease, what it gives back, the concurrency limit and its ttl, a clock
 * flag; per take a route (from a table, one invalid) and its capacity, rate
 * and cost; then six reply values; the rest is the client key (NULs
 * allowed). A number is one selector byte: even, a pick from a table of
 * edge values (index byte/2); odd, the next 8 bytes as a raw double
 * (NaN, infinities, negatives, subnormals).
 *
 * Invariants, for a request tb__call_prepare() accepts:
 *  - its shape is legal: 1..TB_MAX_BUCKETS takes, or none with a
 *    concurrency limit; a lease (a number, not NaN) only on one
 *    token-bucket take;
 *  - every take passes tb_limit_check() with its cost in 0..capacity
 *    bounds, and a split key's limits are the caller's divided by K;
 *  - every key is terminated within TB_KEY_BUF, starts with the prefix and
 *    ends with the algorithm's suffix; the slot set's key is refused only
 *    for a bad prefix (which no bucket key checked yet);
 *  - the argument vector fits TB__CALL_ARGS, starts EVALSHA <digest>
 *    <numkeys>, carries the keys, and each capacity, rate and cost reads
 *    back with strtod() as exactly the double the take holds; a settle
 *    vector ends with "settle";
 *  - the reply read as a result, whatever its values, binds a take that
 *    exists, waits -1 (never) or more, holds no negative slot count,
 *    grants within the lease and leaves 0..N slots of a concurrency
 *    limit alone.
 * A request with more than TB_MAX_BUCKETS takes is refused. The takes and
 * the key are heap copies of their exact size, so any read past them is
 * an ASan report.
 */
#include <math.h>

#include "fuzz_common.h"
#include "tb_int.h"

static const char *const prefixes[] = { "rl:", "x", "bad prefix",
                                        "tb:shim:in:web:" };
static const char *const routes[] = {
    NULL, "export", "a", "no spaces",
    "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.",
};
static const double edges[] = {
    0, 1, 0.5, 3, 100, 2.5, 1e-6, 1e-7, 1e9, 1e9 + 1, 1e15, -1,
    100000, 100001, 64, 1.0 / 3,
};

static uint64_t bytes8(rd_t *r)
{
    uint64_t u = 0;
    int i;

    for (i = 0; i < 8; i++) {
        u = u << 8 | byte(r);
    }
    return u;
}

static double number(rd_t *r)
{
    uint8_t s = byte(r);
    uint64_t u;
    double d;

    if (s & 1) {
        u = bytes8(r);
        memcpy(&d, &u, sizeof(d));
        return d;
    }
    return edges[(s >> 1) % (sizeof(edges) / sizeof(edges[0]))];
}

/* The argument at *i as a number: it must read back as exactly v. */
static void check_arg_num(const char **argv, const size_t *len, int *i,
                          double v)
{
    char buf[64];

    FUZZ_CHECK(len[*i] > 0 && len[*i] < sizeof(buf), "arg %d length %zu",
               *i, len[*i]);
    memcpy(buf, argv[*i], len[*i]);
    buf[len[*i]] = '\0';
    FUZZ_CHECK(strtod(buf, NULL) == v, "arg %d '%s' is not %.17g", *i, buf,
               v);
    (*i)++;
}

static void check_argv(const tb_request_t *q, const tb_take_t *takes,
                       char keys[][TB_KEY_BUF], const tb__conc_t *conc,
                       int what)
{
    tb__call_t call;
    const char **argv = call.argv;
    const size_t *argvlen = call.argvlen;
    int argc, i, k, n = q->ntakes;

    memcpy(call.takes, takes, (size_t)n * sizeof(*takes));
    memcpy(call.keys, keys, (size_t)n * sizeof(call.keys[0]));
    call.what = what;
    call.conc = conc;
    call.slot_id = "s.1.1";
    argc = tb__call_argv(q, &call);
    FUZZ_CHECK(argc >= 4 && argc <= TB__CALL_ARGS, "argc %d", argc);
    for (i = 0; i < argc; i++) {
        FUZZ_CHECK(argv[i] != NULL, "argv[%d] NULL", i);
    }
    FUZZ_CHECK(argvlen[0] == 7 && !memcmp(argv[0], "EVALSHA", 7), "verb");
    FUZZ_CHECK(argvlen[1] == 40, "digest length %zu", argvlen[1]);
    i = 2;
    check_arg_num(argv, argvlen, &i, n + (conc ? 1 : 0));
    for (k = 0; k < n; k++, i++) {
        FUZZ_CHECK(argv[i] == call.keys[k]
                       && argvlen[i] == strlen(call.keys[k]),
                   "key %d", k);
    }
    if (conc) {
        FUZZ_CHECK(argvlen[i] == strlen(conc->key), "slot set key");
        i++;
    }
    i++; /* The clock. */
    for (k = 0; k < n; k++) {
        check_arg_num(argv, argvlen, &i, takes[k].limit.capacity);
        check_arg_num(argv, argvlen, &i, takes[k].limit.rate_per_sec);
        check_arg_num(argv, argvlen, &i, takes[k].cost);
    }
    if (what == TB__CALL_SETTLE) {
        FUZZ_CHECK(i + 1 == argc && argvlen[i] == 6
                       && !memcmp(argv[i], "settle", 6),
                   "settle is not last");
        i++;
    }
    else if (q->lease > 0) {
        check_arg_num(argv, argvlen, &i, q->lease);
        if (q->lease_back > 0) {
            check_arg_num(argv, argvlen, &i, q->lease_back);
        }
    }
    FUZZ_CHECK(i + (conc ? 4 : 0) == argc, "argc %d, expected %d", argc,
               i + (conc ? 4 : 0));
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    rd_t r = { data, size };
    tb_request_t q;
    tb_take_t *in, takes[TB_MAX_BUCKETS];
    char keys[TB_MAX_BUCKETS][TB_KEY_BUF], ckey[TB_KEY_BUF];
    tb__script_reply_t rep;
    tb__conc_t conc;
    tb_result_t res;
    int64_t now = 1700000000000;
    char *key;
    int i, ok, n;

    memset(&q, 0, sizeof(q));
    q.prefix = prefixes[byte(&r) % 4];
    n = byte(&r) % (TB_MAX_BUCKETS + 2);
    q.algo = (tb_algo_t)(byte(&r) % (TB_ALGO_COUNT + 2));
    q.shards = byte(&r) % (TB_MAX_SHARDS + 6);
    q.shard = (int8_t)byte(&r);
    q.lease = number(&r);
    q.lease_back = number(&r);
    q.concurrency = (int)(bytes8(&r) >> 40) - (1 << 22);
    q.concurrency_ttl_ms = (int64_t)(bytes8(&r) >> 30) - 1000;
    if (byte(&r) & 1) {
        q.now_ms = &now;
    }
    in = calloc((size_t)(n ? n : 1), sizeof(*in));
    for (i = 0; i < n; i++) {
        in[i].name = routes[byte(&r) % 5];
        in[i].kind = in[i].name ? TB_TAKE_NAMED : TB_TAKE_MAIN;
        in[i].limit.capacity = number(&r);
        in[i].limit.rate_per_sec = number(&r);
        in[i].cost = number(&r);
    }
    for (i = 0; i < 6; i++) {
        rep.v[i] = (int64_t)bytes8(&r) >> (byte(&r) % 64);
    }
    key = malloc(r.n ? r.n : 1);
    memcpy(key, r.p, r.n);
    q.key = key;
    q.key_len = r.n;
    q.takes = n ? in : NULL;
    q.ntakes = n;

    ok = tb__call_prepare(&q, takes, keys);
    if (n > TB_MAX_BUCKETS) {
        FUZZ_CHECK(!ok, "%d takes accepted", n);
    }
    if (ok && q.concurrency) {
        ok = tb__call_conc(&q, ckey, &conc);
        /* Without takes no key was built yet: only a bad prefix fails. */
        FUZZ_CHECK(ok || (n == 0 && !tb_prefix_valid(q.prefix)),
                   "a valid request's slot set key was refused");
    }
    if (ok && q.concurrency) {
        FUZZ_CHECK(strlen(ckey) < TB_KEY_BUF && conc.limit == q.concurrency
                       && conc.ttl_ms >= 1,
                   "slot set");
    }
    if (ok) {
        const char *sfx = tb_algo_key_suffix(q.algo);
        size_t pl = strlen(q.prefix), sl = strlen(sfx);

        FUZZ_CHECK(n >= 1 || q.concurrency >= 1, "nothing to decide");
        FUZZ_CHECK(q.lease >= 0 && q.lease_back >= 0, "lease %g back %g",
                   q.lease, q.lease_back);
        FUZZ_CHECK(q.lease <= 0
                       || (q.algo == TB_ALGO_TOKEN_BUCKET && n == 1),
                   "lease on %d takes, algorithm %d", n, q.algo);
        for (i = 0; i < n; i++) {
            size_t kl = strnlen(keys[i], TB_KEY_BUF);
            double k = q.shards > 1 ? q.shards : 1;

            FUZZ_CHECK(kl < TB_KEY_BUF, "key %d unterminated", i);
            FUZZ_CHECK(!strncmp(keys[i], q.prefix, pl) && kl >= pl + sl
                           && !strcmp(keys[i] + kl - sl, sfx),
                       "key %d '%s'", i, keys[i]);
            FUZZ_CHECK(tb_limit_check(&takes[i].limit, NULL, 0) == TB_OK,
                       "take %d limit", i);
            FUZZ_CHECK(takes[i].limit.capacity == in[i].limit.capacity / k
                           && takes[i].limit.rate_per_sec
                                  == in[i].limit.rate_per_sec / k,
                       "take %d not divided by %g", i, k);
            FUZZ_CHECK(takes[i].cost >= 0 && takes[i].cost <= TB_MAX_CAPACITY
                           && takes[i].cost == in[i].cost,
                       "take %d cost %.17g", i, takes[i].cost);
        }
        check_argv(&q, takes, keys, q.concurrency ? &conc : NULL,
                   TB__CALL_DECIDE);
        if (n > 0) {
            tb_request_t plain = q;

            plain.lease = plain.lease_back = 0;
            check_argv(&plain, takes, keys, NULL, TB__CALL_SETTLE);
        }
        memset(&res, 0, sizeof(res));
        tb__call_result(&rep, &q, takes, "s.1.1", &res);
        FUZZ_CHECK(res.binding >= 0 && (n == 0 || res.binding < n),
                   "binding %d of %d", res.binding, n);
        FUZZ_CHECK(res.allowed || res.refused_by != TB_LIMIT_NONE,
                   "a refusal without its limit");
        FUZZ_CHECK(res.retry_ms >= -1 && res.in_flight >= 0, "wait %lld"
                   " or slots %lld", (long long)res.retry_ms,
                   (long long)res.in_flight);
        FUZZ_CHECK(q.lease <= 0 || !res.allowed
                       || (res.granted >= takes[0].cost
                           && res.granted <= q.lease),
                   "granted %lld of a lease of %g", (long long)res.granted,
                   q.lease);
        FUZZ_CHECK(n > 0 || (res.remaining >= 0
                             && res.remaining <= q.concurrency),
                   "remaining %lld of %d slots", (long long)res.remaining,
                   q.concurrency);
    }
    free(key);
    free(in);
    return 0;
}
