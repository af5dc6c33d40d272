/* tbucket_cmds.c -- the tool's commands that speak to Redis: take,
 * inspect and reset a bucket, and list, set and lift the bans of
 * TBucketRule, each through one short-lived libtb client. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "tbucket_tool.h"

/* Wall-clock milliseconds, the unit and epoch of the script's `ts`. */
static int64_t wall_ms(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static tb_client_t *connect_client(const tool_t *t, tb_policy_t pol)
{
    tb_options_t o;
    tb_client_t *c;
    char err[256];

    tb_options_init(&o);
    o.url = t->url;
    o.timeout_ms = t->timeout_ms;
    o.connect_timeout_ms = t->connect_timeout_ms;
    o.pool_size = 1;
    o.policy = pol;
    o.local_entries = 64;
    o.tls = t->tls;
    o.engine = t->engine < 0 ? TB_ENGINE_AUTO : (tb_engine_t)t->engine;
    c = tb_client_create(&o, err, sizeof(err));
    if (!c) {
        fprintf(stderr, "tbucket: --url: %s\n", err);
    }
    else if (t->tls.no_verify) {
        fprintf(stderr, "tbucket: warning: --tls-verify off: the Redis "
                        "server's certificate is not checked\n");
    }
    return c;
}

/* The Redis URL for messages: passwords never reach a terminal or log. */
static void redacted(const tool_t *t, char *out, size_t outlen)
{
    tb_redis_addr_t a;
    char err[160];

    if (tb_url_parse(t->url, &a, err, sizeof(err)) == TB_OK) {
        tb_url_redact(&a, out, outlen);
    }
    else {
        snprintf(out, outlen, "(bad url)");
    }
}

/* One line on stderr naming the (redacted) Redis and the problem. */
static void redis_error(const tool_t *t, const char *msg, const char *note)
{
    char where[URL_MAX];

    redacted(t, where, sizeof(where));
    fprintf(stderr, "tbucket: %s: %s%s\n", where, msg, note);
}

static int64_t retry_seconds(int64_t retry_ms)
{
    /* Whole seconds, rounded up, at least 1: the module's Retry-After. */
    int64_t s = (retry_ms + 999) / 1000;

    return s < 1 ? 1 : s;
}

int tool_cmd_take(const tool_t *t)
{
    tb_take_t take;
    tb_request_t q;
    tb_result_t res;
    tb_client_t *c;
    int rc;

    if (!t->have_cap || !t->have_rate) {
        return tool_usage_error("take needs --capacity and --rate", NULL);
    }
    if (t->cost > t->limit.capacity) {
        fprintf(stderr, "tbucket: cost %.0f exceeds capacity %.0f: never "
                        "allowed\n", t->cost, t->limit.capacity);
        return EXIT_DATAERR;
    }
    memset(&take, 0, sizeof(take));
    take.limit = t->limit;
    take.cost = t->cost;
    take.name = t->route;
    take.kind = t->route ? TB_TAKE_NAMED : TB_TAKE_MAIN;
    c = connect_client(t, t->policy == POLICY_CLOSED ? TB_POLICY_CLOSED
                                                     : TB_POLICY_OPEN);
    if (!c) {
        return EXIT_USAGE;
    }
    memset(&q, 0, sizeof(q));
    q.prefix = t->prefix;
    q.key = t->key;
    q.key_len = strlen(t->key);
    q.takes = &take;
    q.ntakes = 1;
    q.algo = t->algo;
    rc = tb_client_run(c, &q, &res);
    if (rc != TB_OK) {
        redis_error(t, res.err == TB_ERR_ARG ? "bad key or prefix"
                                             : c->errstr,
                    t->policy == POLICY_FAIL  ? ""
                    : t->policy == POLICY_OPEN ? " (policy open: allowed)"
                                               : " (policy closed: "
                                                 "rejected)");
        if (t->policy == POLICY_FAIL || res.err == TB_ERR_ARG) {
            tb_client_free(c);
            return res.err == TB_ERR_ARG ? EXIT_USAGE : EXIT_UNAVAILABLE;
        }
    }
    tb_client_free(c);
    if (res.allowed) {
        if (!t->quiet) {
            printf("allowed remaining=%lld limit=%.0f source=%s\n",
                   (long long)res.remaining, res.limit,
                   tb_source_name(res.source));
        }
        return 0;
    }
    if (res.retry_ms < 0) {
        fprintf(stderr, "tbucket: cost exceeds capacity: never allowed\n");
        return EXIT_DATAERR;
    }
    if (!t->quiet) {
        printf("rejected retry_after=%lld retry_after_ms=%lld "
               "remaining=%lld limit=%.0f source=%s\n",
               (long long)retry_seconds(res.retry_ms),
               (long long)res.retry_ms, (long long)res.remaining, res.limit,
               tb_source_name(res.source));
    }
    return EXIT_TEMPFAIL;
}

/* The bucket's Redis key, as tb_client_decide_algo() builds it: the
 * module's key plus the algorithm's suffix (none for the token bucket). */
static int build_key(const tool_t *t, char *rkey)
{
    const char *sfx = tb_algo_key_suffix(t->algo);
    size_t n = tb_key_build(t->prefix, t->key, strlen(t->key), t->route,
                            rkey);

    if (n == 0 || n + strlen(sfx) >= TB_KEY_BUF) {
        return tool_usage_error("bad key, prefix or route", NULL);
    }
    memcpy(rkey + n, sfx, strlen(sfx) + 1);
    return 0;
}

/* Print the stored state and, given the limit, the state refilled to now
 * as the next decision would see it. One "name=value" per line. */
int tool_cmd_inspect(const tool_t *t)
{
    char rkey[TB_KEY_BUF];
    tb_bucket_t b, now_b;
    tb_verdict_t v;
    tb_client_t *c;
    int64_t ttl_ms, now_ms;
    int rc;

    if ((rc = build_key(t, rkey)) != 0) {
        return rc;
    }
    if (t->have_cap != t->have_rate) {
        return tool_usage_error("inspect needs both --capacity and --rate, or "
                           "neither", NULL);
    }
    if (t->algo != TB_ALGO_TOKEN_BUCKET) {
        return tool_usage_error("inspect reads token buckets only",
                           tb_algo_name(t->algo));
    }
    if (!(c = connect_client(t, TB_POLICY_OPEN))) {
        return EXIT_USAGE;
    }
    if (tb_client_inspect(c, rkey, &b, &ttl_ms) != TB_OK) {
        redis_error(t, c->errstr, "");
        tb_client_free(c);
        return EXIT_UNAVAILABLE;
    }
    tb_client_free(c);
    now_ms = wall_ms();
    printf("key=%s\nexists=%s\n", rkey, b.exists ? "yes" : "no");
    if (b.exists) {
        printf("tokens=%.6f\nts_ms=%lld\nage_ms=%lld\n", b.tokens,
               (long long)b.ts_ms, (long long)(now_ms - b.ts_ms));
    }
    printf("ttl_ms=%lld\n", (long long)ttl_ms);
    if (t->have_cap) {
        double zero = 0, cost = t->cost;
        tb_bucket_t after;

        /* A take of nothing is the refill alone: the state the next
         * decision starts from. A second, with the cost, answers
         * "would it be allowed now" without writing anything. */
        if (cost > t->limit.capacity) {
            cost = 0;
        }
        if (tb_bucket_take(&b, &t->limit, &zero, 1, now_ms, &now_b, &v)
                != TB_OK
            || tb_bucket_take(&b, &t->limit, &cost, 1, now_ms, &after, &v)
                   != TB_OK) {
            return tool_usage_error("bad limit", NULL);
        }
        printf("capacity=%.0f\nrate_per_sec=%.6g\n", t->limit.capacity,
               t->limit.rate_per_sec);
        printf("tokens_now=%.6f\nremaining_now=%lld\n", now_b.tokens,
               (long long)floor(now_b.tokens));
        printf("full_in_ms=%lld\n",
               (long long)ceil((t->limit.capacity - now_b.tokens) * 1000
                               / t->limit.rate_per_sec));
        printf("ttl_after_take_ms=%lld\n",
               (long long)tb_bucket_ttl_ms(&t->limit));
        if (t->cost > t->limit.capacity) {
            printf("take_cost=%.0f\nwould_allow=never\n", t->cost);
        }
        else {
            printf("take_cost=%.0f\nwould_allow=%s\nretry_after_ms=%lld\n",
                   t->cost, v.allowed ? "yes" : "no",
                   (long long)v.retry_ms);
        }
    }
    return 0;
}

int tool_cmd_reset(const tool_t *t)
{
    char rkey[TB_KEY_BUF];
    tb_client_t *c;
    int rc;

    if ((rc = build_key(t, rkey)) != 0) {
        return rc;
    }
    if (!(c = connect_client(t, TB_POLICY_OPEN))) {
        return EXIT_USAGE;
    }
    if (tb_client_reset(c, rkey) != TB_OK) {
        redis_error(t, c->errstr, "");
        tb_client_free(c);
        return EXIT_UNAVAILABLE;
    }
    tb_client_free(c);
    if (!t->quiet) {
        printf("reset %s\n", rkey);
    }
    return 0;
}

/* ---- bans ------------------------------------------------------------ */

/* A ban's DURATION: the core's grammar, 1s .. 30d, as TBucketRule's
 * ban= reads it. */
static int parse_ban_ms(const char *s, int64_t *ms)
{
    return tb_parse_duration(s, 1000, TB_MAX_BAN_MS, 0, ms, NULL, 0)
           == TB_OK ? 0 : -1;
}

static int ban_or_lift(const tool_t *t, int lift)
{
    tb_client_t *c;
    int64_t ms = 0;
    int found = 0, rc;

    if (!lift && parse_ban_ms(t->arg3, &ms) != 0) {
        return tool_usage_error("bad DURATION (30s, 15m, 1h, 1d; 1s to 30d)",
                           t->arg3);
    }
    if (!tb_name_valid(t->key)) {
        return tool_usage_error("bad RULE", t->key);
    }
    if (!(c = connect_client(t, TB_POLICY_OPEN))) {
        return EXIT_USAGE;
    }
    rc = lift ? tb_client_unban(c, t->prefix, t->key, t->arg2,
                                strlen(t->arg2), t->keep_bucket
                                ? TB_UNBAN_KEEP_BUCKET : 0, &found)
              : tb_client_ban(c, t->prefix, t->key, t->arg2,
                              strlen(t->arg2), ms);
    if (rc != TB_OK) {
        redis_error(t, c->errstr, "");
        tb_client_free(c);
        return EXIT_UNAVAILABLE;
    }
    tb_client_free(c);
    if (!t->quiet) {
        if (lift) {
            printf("%s %s: %s; %s\n", t->key, t->arg2,
                   found ? "unbanned" : "was not banned", t->keep_bucket
                   ? "its bucket kept as it is (refused until it refills; "
                     "unban without --keep-bucket refills it)"
                   : "its bucket refilled");
        }
        else {
            printf("%s %s: banned for %llds\n", t->key, t->arg2,
                   (long long)(ms / 1000));
        }
    }
    return 0;
}

/* The bans listing's last line: how many there are, and how many more
 * than were shown (--limit). */
static void bans_summary(const tool_t *t, const tb_bans_query_t *q, int n)
{
    long long more = (long long)q->matched - n;

    printf("%lld ban%s%s%s, newest first; %d shown", (long long)q->matched,
           q->matched == 1 ? "" : "s", q->rule || q->key ? " matching" : "",
           q->rule || q->key ? "" : " in all", n);
    if (more > 0) {
        printf(", %lld more not shown (--limit %.0f)", more, t->ban_limit);
    }
    printf("\n");
}

int tool_cmd_bans(const tool_t *t)
{
    int max = (int)t->ban_limit, i, n = 0;
    tb_ban_t *b = calloc((size_t)max, sizeof(*b));
    tb_bans_query_t q;
    tb_client_t *c;

    if (!b) {
        fprintf(stderr, "tbucket: out of memory\n");
        return EXIT_UNAVAILABLE;
    }
    memset(&q, 0, sizeof(q));
    q.rule = t->ban_rule;
    q.key = t->ban_key;
    q.key_len = t->ban_key ? strlen(t->ban_key) : 0;
    if (!(c = connect_client(t, TB_POLICY_OPEN))) {
        free(b);
        return EXIT_USAGE;
    }
    if (tb_client_bans_query(c, t->prefix, &q, b, max, &n) != TB_OK) {
        redis_error(t, c->errstr, "");
        tb_client_free(c);
        free(b);
        return EXIT_UNAVAILABLE;
    }
    tb_client_free(c);
    if (!t->quiet) {
        printf("%-32s %-40s %s\n", "RULE", "KEY", "SECONDS LEFT");
    }
    for (i = 0; i < n; i++) {
        /* Stored keys are sanitised: printable, no spaces. */
        printf("%-32s %-40s %lld\n", b[i].rule, b[i].key,
               (long long)((b[i].left_ms + 999) / 1000));
    }
    if (!t->quiet) {
        bans_summary(t, &q, n);
    }
    free(b);
    return 0;
}

int tool_cmd_ban(const tool_t *t)
{
    return ban_or_lift(t, 0);
}

int tool_cmd_unban(const tool_t *t)
{
    return ban_or_lift(t, 1);
}
