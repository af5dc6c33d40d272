/* tb_driver.c -- a line-oriented test driver over libtb, for pytest.
 *
 * One long-lived tb_client_t per process, so the integration tests can
 * exercise what only a living client has: its connection pool, script
 * cache, circuit breaker and counters. Options come from argv; commands
 * come on stdin, one per line, and each gets exactly one line on stdout
 * (flushed), starting "ok " or "error ". Numbers are printed as key=value
 * pairs so the Python side can parse them without caring about order.
 *
 *   tb_driver [--url URL] [--timeout MS] [--connect-timeout MS] [--pool N]
 *             [--policy open|closed|local] [--replicas N]
 *             [--breaker-threshold N] [--breaker-cooldown MS]
 *             [--prefix P] [--tls-ca FILE] [--tls-cert FILE]
 *             [--tls-key FILE] [--tls-server-name NAME] [--tls-verify on|off]
 *             [--engine auto|script|module]
 *
 * It prints "ok ready pid=N" once the client exists, or "error create:
 * MESSAGE" and exits 2 when the options are refused. Commands:
 *
 *   take KEY CAP RATE COST [ROUTE CAP RATE COST ...]
 *       One decision: the main bucket, then route buckets. Prints
 *       allowed remaining retry_ms source err elapsed_us (wall time of the
 *       call) plus rc, binding, limit and redis_us.
 *   take_at NOW_MS KEY CAP RATE COST [...]
 *       The same with Redis's clock replaced by NOW_MS (tests only).
 *   hammer KEY CAP RATE COST DURATION_MS
 *       Decide in a loop for DURATION_MS of monotonic time; prints allowed,
 *       total, redis (decided by Redis) and first_us / last_us, the
 *       CLOCK_REALTIME microseconds just before the first call and just
 *       after the last, so that several drivers' windows can be combined.
 *   lease K SHARD KEY CAP RATE COST WANT [BACK]
 *   lease_at NOW_MS K SHARD KEY CAP RATE COST WANT [BACK]
 *       A decision with a lease on shard SHARD of a key split in K (K 0:
 *       the plain key), giving BACK tokens back first: granted= and then
 *       what take prints.
 *   run ALGO K SHARD NOW KEY CAP RATE COST [ROUTE CAP RATE COST ...]
 *       A decision with algorithm ALGO (a TBucketAlgorithm name) on shard
 *       SHARD of K; NOW is a clock in ms, or "-" for Redis's. Prints what
 *       take prints.
 *   settle ALGO K SHARD NOW REAL KEY CAP RATE COST [ROUTE CAP RATE COST ...]
 *       tb_client_settle() of the request run would make, each COST being
 *       what the bucket was charged and REAL the real cost: what take
 *       prints (allowed=0 when a bucket is left in debt).
 *   give_back RKEY CAP RATE TOKENS
 *       tb_client_give_back() to the full Redis key RKEY: what take prints.
 *   take_shard K SHARD KEY CAP RATE COST [ROUTE CAP RATE COST ...]
 *       take on shard SHARD of a key split in K; the limits are the whole
 *       key's (the core divides them by K).
 *   conc N TTL_MS KEY [CAP RATE COST [ROUTE CAP RATE COST ...]]
 *   conc_at NOW_MS N TTL_MS KEY [...]
 *       A decision with a concurrency limit of N slots (ttl TTL_MS, 0 for
 *       the default) on KEY, with the buckets when given: handle= (a
 *       number for `release`, -1 when no slot was taken), slot_kind=,
 *       slot_id=, in_flight=, refused_by= and then what take prints.
 *   release HANDLE    tb_client_release() of that slot: rc= err=
 *   rules, charge, ban, unban, bans: rule buckets (driver_rules.h)
 *   key KEY [ROUTE]   the Redis key the client uses, hex-encoded
 *   slot KEY          tb_key_slot() of the raw bytes of KEY
 *   stats             every counter of tb_stats_t (module_calls: the
 *                     calls made to the Redis module's commands)
 *   breaker           the breaker state
 *   pool              pool size, open and in-use connections
 *   engine            the engine the connections use now: engine= (auto
 *                     while none has said) mixed=
 *   lasterr           the client's last error: kind= then its message
 *   locale NAME       setlocale(LC_ALL, NAME), as a host may do at any
 *                     time: point= the decimal point it brings. The
 *                     driver keeps reading its commands in the C locale.
 *   quit              exit 0 (so does end of input)
 *
 * KEY is binary-safe: %XX escapes are decoded (so NUL, CR, LF, space and
 * '%' itself can be sent), and a lone "%" is the empty key. The driver is
 * test code: it trusts its input's shape only as far as it checks it, and
 * answers "error ..." to anything else rather than exiting.
 */
#include <errno.h>
#include <getopt.h>
#include <locale.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "driver_common.h"
#include "tb.h"

#define MAX_ARGS (4 + 7 * TB_MAX_BUCKETS)

static const char *prefix = "tb:";

/* Slots taken by `conc`, for `release`: the request's key and ttl and
 * the slot. */
#define MAX_HELD 4096

typedef struct held {
    char key[512];
    size_t key_len;
    int64_t ttl_ms;
    tb_slot_t slot;
} held_t;

static held_t held[MAX_HELD];
static int nheld;

static int64_t realtime_us(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

static int hexval(int c)
{
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* Decode %XX in place; returns the decoded length or -1 on a bad escape.
 * A lone "%" is the empty key. */
static long unescape(char *s)
{
    char *o = s, *p = s;

    if (strcmp(s, "%") == 0) {
        *s = '\0';
        return 0;
    }
    while (*p) {
        if (*p == '%') {
            int hi = hexval((unsigned char)p[1]), lo;

            lo = hi < 0 ? -1 : hexval((unsigned char)p[2]);
            if (lo < 0) {
                return -1;
            }
            *o++ = (char)(hi * 16 + lo);
            p += 3;
        }
        else {
            *o++ = *p++;
        }
    }
    return (long)(o - s);
}

static int to_double(const char *s, double *d)
{
    char *end;

    errno = 0;
    *d = tb_strtod_c(s, &end);
    return *s && !*end && !errno ? 0 : -1;
}

static int to_i64(const char *s, int64_t *v)
{
    char *end;

    errno = 0;
    *v = strtoll(s, &end, 10);
    return *s && !*end && !errno ? 0 : -1;
}

/* Parse "KEY CAP RATE COST [ROUTE CAP RATE COST ...]" from av[0..ac). */
static int parse_takes(char **av, int ac, long *klen, tb_take_t *t, int *n)
{
    int i;

    if (ac < 4 || (ac - 4) % 4 != 0 || (ac - 4) / 4 + 1 > TB_MAX_BUCKETS) {
        return -1;
    }
    if ((*klen = unescape(av[0])) < 0) {
        return -1;
    }
    *n = 0;
    /* av[i] is a CAP; the ROUTE of every bucket but the first precedes it. */
    for (i = 1; i < ac; i += 4) {
        tb_take_t *x = &t[(*n)++];

        memset(x, 0, sizeof(*x));
        x->name = i == 1 ? NULL : av[i - 1];
        x->kind = x->name ? TB_TAKE_NAMED : TB_TAKE_MAIN;
        if (to_double(av[i], &x->limit.capacity)
            || to_double(av[i + 1], &x->limit.rate_per_sec)
            || to_double(av[i + 2], &x->cost)) {
            return -1;
        }
    }
    return 0;
}

static void print_result(int rc, const tb_result_t *r, int64_t elapsed_us)
{
    printf("ok allowed=%d remaining=%lld retry_ms=%lld source=%s err=%s "
           "elapsed_us=%lld rc=%d binding=%d limit=%.17g redis_us=%lld\n",
           r->allowed, (long long)r->remaining, (long long)r->retry_ms,
           tb_source_name(r->source),
           r->err ? tb_err_name(r->err) : "none", (long long)elapsed_us,
           rc, r->binding, r->limit, (long long)r->redis_us);
}

/* One decision as the commands make it: the takes and the request over
 * them, its injected clock (the _at forms) and its result. */
typedef struct call {
    tb_take_t t[TB_MAX_BUCKETS];
    tb_request_t q;
    tb_result_t r;
    int64_t now;
    long klen;
    int n;
} call_t;

/* Run k's request (its clock injected when with_now); rc and the wall
 * time of the call in *us. */
static int run_timed(tb_client_t *c, call_t *k, int with_now, int64_t *us)
{
    int64_t t0 = tb_clock_monotonic_us();
    int rc;

    k->q.now_ms = with_now ? &k->now : NULL;
    rc = tb_client_run(c, &k->q, &k->r);
    *us = tb_clock_monotonic_us() - t0;
    return rc;
}

static void cmd_take(tb_client_t *c, char **av, int ac, int with_now)
{
    call_t k = { .now = 0 };
    int64_t us;
    int rc;

    if (with_now && (ac < 1 || to_i64(av[0], &k.now))) {
        printf("error usage: take_at NOW_MS KEY CAP RATE COST ...\n");
        return;
    }
    if (parse_takes(av + with_now, ac - with_now, &k.klen, k.t, &k.n)) {
        printf("error usage: take KEY CAP RATE COST [ROUTE CAP RATE COST]"
               "...\n");
        return;
    }
    request_init(&k.q, prefix, av[with_now], (size_t)k.klen, k.t, k.n);
    rc = run_timed(c, &k, with_now, &us);
    print_result(rc, &k.r, us);
}

static const char *limit_kind_name(tb_limit_kind_t k)
{
    return k == TB_LIMIT_RATE ? "rate"
           : k == TB_LIMIT_CONCURRENCY ? "concurrency" : "none";
}

/* conc[_at NOW_MS] N TTL_MS KEY [CAP RATE COST [ROUTE CAP RATE COST]...] */
static void cmd_conc(tb_client_t *c, char **av, int ac, int with_now)
{
    tb_take_t t[TB_MAX_BUCKETS];
    tb_request_t q;
    tb_result_t r;
    int64_t now = 0, lim, ttl;
    long klen;
    int n = 0, rc, h = -1;

    if (with_now && (ac < 1 || to_i64(av[0], &now))) {
        printf("error usage: conc_at NOW_MS N TTL_MS KEY ...\n");
        return;
    }
    av += with_now;
    ac -= with_now;
    if (ac < 3 || to_i64(av[0], &lim) || to_i64(av[1], &ttl)
        || (ac == 3 && (klen = unescape(av[2])) < 0)
        || (ac > 3 && parse_takes(av + 2, ac - 2, &klen, t, &n))
        || (size_t)klen >= sizeof(held[0].key)) {
        printf("error usage: conc N TTL_MS KEY [CAP RATE COST ...]\n");
        return;
    }
    request_init(&q, prefix, av[2], (size_t)klen, t, n);
    q.now_ms = with_now ? &now : NULL;
    q.concurrency = (int)lim;
    q.concurrency_ttl_ms = ttl;
    rc = tb_client_run(c, &q, &r);
    if (r.slot.kind != TB_SLOT_NONE && nheld < MAX_HELD) {
        h = nheld++;
        memcpy(held[h].key, av[2], (size_t)klen);
        held[h].key_len = (size_t)klen;
        held[h].ttl_ms = ttl;
        held[h].slot = r.slot;
    }
    printf("ok handle=%d slot_kind=%d slot_id=%s in_flight=%lld "
           "refused_by=%s ", h, (int)r.slot.kind,
           r.slot.id[0] ? r.slot.id : "-", (long long)r.in_flight,
           limit_kind_name(r.refused_by));
    print_result(rc, &r, 0);
}

#include "driver_rules.h"

static void cmd_release(tb_client_t *c, char **av, int ac)
{
    tb_request_t q;
    int64_t h;
    int rc;

    if (ac != 1 || to_i64(av[0], &h) || h < 0 || h >= nheld) {
        printf("error usage: release HANDLE\n");
        return;
    }
    request_init(&q, prefix, held[h].key, held[h].key_len, NULL, 0);
    q.concurrency_ttl_ms = held[h].ttl_ms;
    rc = tb_client_release(c, &q, &held[h].slot);
    printf("ok rc=%d err=%s\n", rc,
           rc == TB_OK ? "none" : tb_err_name(c->err));
}

static void cmd_hammer(tb_client_t *c, char **av, int ac)
{
    tb_take_t t[TB_MAX_BUCKETS];
    tb_result_t r;
    int64_t dur_ms, first, last, end, allowed = 0, total = 0, redis = 0;
    long klen;
    int n;

    if (ac != 5 || to_i64(av[4], &dur_ms) || dur_ms < 0 || dur_ms > 600000
        || parse_takes(av, 4, &klen, t, &n)) {
        printf("error usage: hammer KEY CAP RATE COST DURATION_MS\n");
        return;
    }
    end = tb_clock_monotonic_us() + dur_ms * 1000;
    first = realtime_us();
    do {
        tb_client_decide(c, prefix, av[0], (size_t)klen, t, n, &r);
        allowed += r.allowed;
        redis += r.source == TB_SRC_REDIS;
        total++;
    } while (tb_clock_monotonic_us() < end);
    last = realtime_us();
    printf("ok allowed=%lld total=%lld redis=%lld first_us=%lld "
           "last_us=%lld\n", (long long)allowed, (long long)total,
           (long long)redis, (long long)first, (long long)last);
}

/* Read "K SHARD" into the request: K 0 or 1 is the plain key. */
static int parse_shard(char **av, tb_request_t *q)
{
    int64_t k, shard;

    if (to_i64(av[0], &k) || to_i64(av[1], &shard)) {
        return 1;
    }
    q->shards = (int)k;
    q->shard = (int)shard;
    return 0;
}

/* lease[_at NOW_MS] K SHARD KEY CAP RATE COST WANT */
static void cmd_lease(tb_client_t *c, char **av, int ac, int with_now)
{
    call_t k = { .now = 0 };
    double want, back = 0;
    int64_t us;
    int rc;

    if (ac == 8 + with_now && to_double(av[--ac], &back)) {
        ac = -1;
    }
    if ((with_now && (ac < 1 || to_i64(av[0], &k.now)))
        || ac != 7 + with_now || to_double(av[ac - 1], &want)
        || parse_takes(av + with_now + 2, 4, &k.klen, k.t, &k.n)) {
        printf("error usage: lease[_at NOW_MS] K SHARD KEY CAP RATE COST "
               "WANT [BACK]\n");
        return;
    }
    request_init(&k.q, prefix, av[with_now + 2], (size_t)k.klen, k.t, k.n);
    if (parse_shard(av + with_now, &k.q)) {
        printf("error usage: lease[_at NOW_MS] K SHARD ...\n");
        return;
    }
    k.q.lease = want;
    k.q.lease_back = back;
    rc = run_timed(c, &k, with_now, &us);
    printf("ok granted=%lld ", (long long)k.r.granted);
    print_result(rc, &k.r, us);
}

/* "ALGO K SHARD NOW KEY CAP RATE COST [...]" into k (the clock "-":
 * Redis's). 0 on success. */
static int parse_run(char **av, int ac, call_t *k)
{
    tb_algo_t algo;

    if (ac < 4 || tb_algo_parse(av[0], &algo) != TB_OK
        || (strcmp(av[3], "-") != 0 && to_i64(av[3], &k->now))
        || parse_takes(av + 4, ac - 4, &k->klen, k->t, &k->n)) {
        return -1;
    }
    request_init(&k->q, prefix, av[4], (size_t)k->klen, k->t, k->n);
    k->q.algo = algo;
    k->q.now_ms = strcmp(av[3], "-") != 0 ? &k->now : NULL;
    return parse_shard(av + 1, &k->q);
}

/* run ALGO K SHARD NOW KEY CAP RATE COST [...] */
static void cmd_run(tb_client_t *c, char **av, int ac)
{
    call_t k = { .now = 0 };
    int rc;

    if (parse_run(av, ac, &k)) {
        printf("error usage: run ALGO K SHARD NOW KEY CAP RATE COST ...\n");
        return;
    }
    rc = tb_client_run(c, &k.q, &k.r);
    print_result(rc, &k.r, 0);
}

/* settle ALGO K SHARD NOW REAL KEY CAP RATE COST [...] */
static void cmd_settle(tb_client_t *c, char **av, int ac)
{
    call_t k = { .now = 0 };
    double real;
    char *rest[MAX_ARGS];
    int i, rc;

    if (ac < 5 || to_double(av[4], &real)) {
        ac = 0;
    }
    /* The request is what run takes: everything but REAL. */
    for (i = 0; i + 1 < ac; i++) {
        rest[i] = i < 4 ? av[i] : av[i + 1];
    }
    if (ac == 0 || parse_run(rest, ac - 1, &k)) {
        printf("error usage: settle ALGO K SHARD NOW REAL KEY CAP RATE "
               "COST ...\n");
        return;
    }
    rc = tb_client_settle(c, &k.q, real, &k.r);
    print_result(rc, &k.r, 0);
}

/* give_back RKEY CAP RATE TOKENS */
static void cmd_give_back(tb_client_t *c, char **av, int ac)
{
    tb_limit_t lim;
    tb_result_t r;
    double tokens;
    long klen;
    int rc;

    if (ac != 4 || (klen = unescape(av[0])) < 0
        || to_double(av[1], &lim.capacity)
        || to_double(av[2], &lim.rate_per_sec) || to_double(av[3], &tokens)) {
        printf("error usage: give_back RKEY CAP RATE TOKENS\n");
        return;
    }
    av[0][klen] = '\0';
    rc = tb_client_give_back(c, av[0], &lim, tokens, &r);
    print_result(rc, &r, 0);
}

/* take_shard K SHARD KEY CAP RATE COST [ROUTE CAP RATE COST ...] */
static void cmd_take_shard(tb_client_t *c, char **av, int ac)
{
    call_t k;
    int rc;

    if (ac < 2 || parse_takes(av + 2, ac - 2, &k.klen, k.t, &k.n)) {
        printf("error usage: take_shard K SHARD KEY CAP RATE COST ...\n");
        return;
    }
    request_init(&k.q, prefix, av[2], (size_t)k.klen, k.t, k.n);
    if (parse_shard(av, &k.q)) {
        printf("error usage: take_shard K SHARD ...\n");
        return;
    }
    rc = tb_client_run(c, &k.q, &k.r);
    print_result(rc, &k.r, 0);
}

static void cmd_key(char **av, int ac)
{
    char out[TB_KEY_BUF];
    long klen;
    size_t n, i;

    if (ac < 1 || ac > 2 || (klen = unescape(av[0])) < 0) {
        printf("error usage: key KEY [ROUTE]\n");
        return;
    }
    n = tb_key_build(prefix, av[0], (size_t)klen, ac == 2 ? av[1] : NULL,
                     out);
    if (n == 0) {
        printf("error bad prefix or route\n");
        return;
    }
    printf("ok key=");
    for (i = 0; i < n; i++) {
        printf("%02x", (unsigned char)out[i]);
    }
    printf("\n");
}

static void cmd_slot(char **av, int ac)
{
    long klen;

    if (ac != 1 || (klen = unescape(av[0])) < 0) {
        printf("error usage: slot KEY\n");
        return;
    }
    printf("ok slot=%u\n", tb_key_slot(av[0], (size_t)klen));
}

static void cmd_stats(tb_client_t *c)
{
    const tb_stats_t *s = tb_client_stats(c);
    int k;

#define S(f) (unsigned long long)tb_stats_get(&s->f)
    printf("ok decisions=%llu allowed=%llu rejected=%llu redis_calls=%llu "
           "batches=%llu redis_errors=%llu noscript_reloads=%llu connects=%llu "
           "breaker_opens=%llu breaker_closes=%llu breaker_skips=%llu "
           "fallback_open=%llu fallback_closed=%llu fallback_local=%llu "
           "lat_sum_us=%llu module_calls=%llu",
           S(decisions), S(allowed), S(rejected), S(redis_calls),
           S(batches), S(redis_errors), S(noscript_reloads), S(connects),
           S(breaker_opens), S(breaker_closes), S(breaker_skips),
           S(fallback_open), S(fallback_closed), S(fallback_local),
           S(lat_sum_us), S(module_calls));
    for (k = 1; k < TB_ERR_KINDS; k++) {
        printf(" err_%s=%llu", tb_err_name(k), S(errors[k]));
    }
    for (k = 0; k < TB_LAT_BUCKETS; k++) {
        printf(" lat_%d=%llu", k, S(lat_count[k]));
    }
    printf("\n");
#undef S
}

/* The commands that read their arguments: each is called with those
 * past its name, and with flag when it takes one (with_now for the _at
 * forms, lift for unban). */
typedef void plain_cmd_t(tb_client_t *c, char **av, int ac);
typedef void flag_cmd_t(tb_client_t *c, char **av, int ac, int flag);

static const struct command {
    const char *name;
    plain_cmd_t *plain;
    flag_cmd_t *with_flag;
    int flag;
} commands[] = {
    {"take", NULL, cmd_take, 0},
    {"take_at", NULL, cmd_take, 1},
    {"lease", NULL, cmd_lease, 0},
    {"lease_at", NULL, cmd_lease, 1},
    {"run", cmd_run, NULL, 0},
    {"settle", cmd_settle, NULL, 0},
    {"give_back", cmd_give_back, NULL, 0},
    {"take_shard", cmd_take_shard, NULL, 0},
    {"conc", NULL, cmd_conc, 0},
    {"conc_at", NULL, cmd_conc, 1},
    {"rules", cmd_rules, NULL, 0},
    {"charge", cmd_charge, NULL, 0},
    {"ban", NULL, cmd_ban, 0},
    {"unban", NULL, cmd_ban, 1},
    {"bans", cmd_bans, NULL, 0},
    {"release", cmd_release, NULL, 0},
    {"hammer", cmd_hammer, NULL, 0},
};

/* Runs av[0] when commands[] has it; 1 when it did, else 0. */
static int run_command(tb_client_t *c, char **av, int ac)
{
    size_t i;

    for (i = 0; i < sizeof(commands) / sizeof(commands[0]); i++) {
        const struct command *k = &commands[i];

        if (strcmp(av[0], k->name) != 0) {
            continue;
        }
        if (k->with_flag) {
            k->with_flag(c, av + 1, ac - 1, k->flag);
        }
        else {
            k->plain(c, av + 1, ac - 1);
        }
        return 1;
    }
    return 0;
}

/* Runs av[0] when it is one of the commands that print what the client
 * or libtb says of a key, the client's state, or the locale; 1 when it
 * did, else 0. */
static int run_query(tb_client_t *c, char **av, int ac)
{
    if (strcmp(av[0], "key") == 0) {
        cmd_key(av + 1, ac - 1);
    }
    else if (strcmp(av[0], "slot") == 0) {
        cmd_slot(av + 1, ac - 1);
    }
    else if (strcmp(av[0], "stats") == 0) {
        cmd_stats(c);
    }
    else if (strcmp(av[0], "engine") == 0) {
        int mixed;
        tb_engine_t e = tb_client_engine(c, &mixed);

        printf("ok engine=%s mixed=%d\n", tb_engine_names[e], mixed);
    }
    else if (strcmp(av[0], "breaker") == 0) {
        printf("ok state=%s\n",
               tb_breaker_state_name(tb_client_breaker_state(c)));
    }
    else if (strcmp(av[0], "pool") == 0) {
        int size, open, in_use;

        tb_client_pool_usage(c, &size, &open, &in_use);
        printf("ok size=%d open=%d in_use=%d\n", size, open, in_use);
    }
    else if (strcmp(av[0], "lasterr") == 0) {
        printf("ok kind=%s %s\n", tb_err_name(c->err), c->errstr);
    }
    else if (strcmp(av[0], "locale") == 0 && ac == 2) {
        if (!setlocale(LC_ALL, av[1])) {
            printf("error locale %s is not installed\n", av[1]);
        }
        else {
            printf("ok locale=%s point=%s\n", av[1],
                   localeconv()->decimal_point);
        }
    }
    else {
        return 0;
    }
    return 1;
}

/* Split a line on spaces into av[]; returns the count (at most max). */
static int split(char *line, char **av, int max)
{
    int ac = 0;
    char *save = NULL, *tok;

    for (tok = strtok_r(line, " \t\r\n", &save); tok && ac < max;
         tok = strtok_r(NULL, " \t\r\n", &save)) {
        av[ac++] = tok;
    }
    return tok ? -1 : ac;
}

static void usage(void)
{
    fprintf(stderr, "usage: tb_driver [--url URL] [--timeout MS] "
            "[--connect-timeout MS] [--pool N] [--policy open|closed|local] "
            "[--replicas N] [--breaker-threshold N] [--breaker-cooldown MS] "
            "[--prefix P] [--tls-ca FILE] [--tls-cert FILE] "
            "[--tls-key FILE] [--tls-server-name NAME] "
            "[--tls-verify on|off] [--engine auto|script|module]\n");
    exit(2);
}

int main(int argc, char **argv)
{
    static const struct option opts[] = {
        {"url", required_argument, NULL, 'u'},
        {"timeout", required_argument, NULL, 't'},
        {"connect-timeout", required_argument, NULL, 'c'},
        {"pool", required_argument, NULL, 'p'},
        {"policy", required_argument, NULL, 'P'},
        {"replicas", required_argument, NULL, 'r'},
        {"breaker-threshold", required_argument, NULL, 'b'},
        {"breaker-cooldown", required_argument, NULL, 'B'},
        {"prefix", required_argument, NULL, 'x'},
        {"tls-ca", required_argument, NULL, 'A'},
        {"tls-cert", required_argument, NULL, 'C'},
        {"tls-key", required_argument, NULL, 'K'},
        {"tls-server-name", required_argument, NULL, 'N'},
        {"tls-verify", required_argument, NULL, 'V'},
        {"engine", required_argument, NULL, 'E'},
        {NULL, 0, NULL, 0},
    };
    tb_options_t o;
    tb_client_t *c;
    char err[256], *line = NULL;
    size_t cap = 0;
    int ch;

    setvbuf(stdout, NULL, _IOLBF, 0);
    tb_options_init(&o);
    while ((ch = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        if (ch == 'x') {
            prefix = optarg;
        }
        else if (client_option(&o, ch, optarg) != 1) {
            usage();
        }
    }
    c = tb_client_create(&o, err, sizeof(err));
    if (!c) {
        printf("error create: %s\n", err);
        return 2;
    }
    printf("ok ready pid=%ld\n", (long)getpid());
    while (getline(&line, &cap, stdin) > 0) {
        char *av[MAX_ARGS];
        int ac = split(line, av, MAX_ARGS);

        if (ac < 0) {
            printf("error too many arguments\n");
        }
        else if (ac == 0) {
            printf("error empty command\n");
        }
        else if (strcmp(av[0], "quit") == 0) {
            printf("ok bye\n");
            break;
        }
        else if (!run_command(c, av, ac) && !run_query(c, av, ac)) {
            printf("error unknown command '%s'\n", av[0]);
        }
    }
    free(line);
    tb_client_free(c);
    return 0;
}
