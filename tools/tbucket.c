/* tbucket.c -- the command-line tool on libtb: take, inspect and reset the
 * buckets that mod_tbucket and the LD_PRELOAD shim keep in Redis.
 *
 * A cron job or a legacy shell script shares a limit with the module by
 * taking from the same bucket:
 *
 *   tbucket take nightly-export --capacity 1 --rate 1/h || exit 0
 *
 * Usage:
 *
 *   tbucket take KEY --capacity N --rate R [--cost C] [--route NAME]
 *                    [--policy fail|open|closed] [-q]
 *   tbucket inspect KEY [--capacity N --rate R [--cost C]] [--route NAME]
 *   tbucket reset KEY [--route NAME]
 *
 * Common options: --url URL (redis://[user:password@]host[:port][/db],
 * rediss://... for TLS, unix:/path, redis-sentinel://... or
 * redis-cluster://..., those two with ?tls=on for TLS), --config FILE (a
 * shim configuration, read by the shim's own loader, shim/shim_conf.c, so
 * a file the shim refuses is refused here too: its redis_url, timeout_ms,
 * connect_timeout_ms and tls_* settings are used unless a flag says
 * otherwise; $TBUCKET_CONFIG names the file when --config is not given),
 * --tls-ca FILE, --tls-cert FILE, --tls-key FILE, --tls-server-name NAME,
 * --tls-verify on|off (TLS, as the module's tls_* options; off is warned
 * about on stderr), --prefix STRING (default "rl:", the module's TBucketPrefix
 * default), --timeout DURATION (default 1s: a one-shot tool can afford to
 * wait longer than a request path), --rule [in:|out:]NAME (with a config:
 * take the prefix, capacity, rate, cost and fixed key of that shim rule,
 * so the tool shares the shim's bucket), --algorithm NAME (the module's
 * TBucketAlgorithm: token-bucket, the default, gcra, sliding-window,
 * fixed-window or sliding-log; take and reset only).
 *
 * KEY is the client key as the module sees it (the TBucketKey value, for
 * example an API key or a client IP). The Redis key is built by
 * tb_key_build() exactly as the module builds it: "<prefix>{KEY}", or
 * "<prefix>{KEY}:route:NAME" with --route. A KEY that is long or odd is
 * hashed the same way, so both reach the same bucket.
 *
 * Exit status (sysexits.h values, so a shell can tell them apart):
 *
 *    0  allowed (take), done (inspect, reset)
 *   64  EX_USAGE: bad command line
 *   65  EX_DATAERR: the cost exceeds the capacity; waiting never helps
 *   69  EX_UNAVAILABLE: Redis could not decide (policy fail), or inspect
 *       and reset could not reach Redis
 *   75  EX_TEMPFAIL: rejected; try again after retry_after seconds (also
 *       policy closed when Redis could not decide)
 *   78  EX_CONFIG: the config file is unreadable or invalid
 *
 * The failure policy of `take` (--policy) says what an unreachable Redis
 * means: `fail` (default) exits 69, `open` allows (exit 0), `closed`
 * rejects (exit 75). The module's `local` policy needs memory that lives
 * longer than one process, so the tool refuses it.
 *
 * `inspect` reads the stored state without changing it (HMGET and PTTL)
 * and, given the limit, refills it to now with the pure tb_bucket_take()
 * arithmetic the module's script shares. "Now" is this host's wall clock
 * in milliseconds, while the script stamps buckets with Redis's TIME: on
 * another host, clock skew shows as age and refill.
 */
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "tb.h"
#include "tb_shim.h"

#define EXIT_USAGE 64
#define EXIT_DATAERR 65
#define EXIT_UNAVAILABLE 69
#define EXIT_TEMPFAIL 75
#define EXIT_CONFIG 78

#define URL_MAX 512
#define DEFAULT_TIMEOUT_MS 1000

typedef enum { POLICY_FAIL = 0, POLICY_OPEN, POLICY_CLOSED } tool_policy_t;

/* Everything the command line and the config file say. Strings point
 * into argv or into the buffers here, never into libconfig's memory. */
typedef struct tool {
    const char *cmd;
    const char *key;
    char url[URL_MAX];
    char prefix[TB_PREFIX_MAX + 1];
    char rule_key[TB_KEY_RAW_MAX + 1];
    const char *route;
    const char *config;
    const char *rule;
    int url_set, prefix_set, timeout_set, connect_timeout_set;
    tb_tls_options_t tls;      /* Flags, then the config file's.     */
    char tls_buf[4][SHIM_PATH_MAX]; /* The file's TLS strings.       */
    int verify_set;
    int timeout_ms;            /* Command timeout, ms.               */
    int connect_timeout_ms;    /* 0: the same as timeout_ms.         */
    int have_cap, have_rate, have_cost;
    tb_limit_t limit;          /* Capacity (tokens), tokens/second.  */
    double cost;               /* Tokens, default 1.                 */
    tool_policy_t policy;
    tb_algo_t algo;            /* TB_ALGO_TOKEN_BUCKET unless set.    */
    int quiet;
} tool_t;

static void usage(FILE *f)
{
    fputs("usage: tbucket take KEY --capacity N --rate R [--cost C]\n"
          "                        [--route NAME] [--policy fail|open|"
          "closed] [-q]\n"
          "       tbucket inspect KEY [--capacity N --rate R [--cost C]]"
          " [--route NAME]\n"
          "       tbucket reset KEY [--route NAME]\n"
          "options: --url URL  --config FILE  --prefix STRING (rl:)\n"
          "         --timeout DURATION (1s)  --rule [in:|out:]NAME\n"
          "         --algorithm NAME (token-bucket)\n"
          "         --tls-ca FILE  --tls-cert FILE  --tls-key FILE\n"
          "         --tls-server-name NAME  --tls-verify on|off\n"
          "exit: 0 allowed/done, 64 usage, 65 cost > capacity,\n"
          "      69 Redis unavailable, 75 rejected (retry later), "
          "78 config\n", f);
}

static int usage_error(const char *what, const char *detail)
{
    fprintf(stderr, "tbucket: %s%s%s\n", what, detail ? ": " : "",
            detail ? detail : "");
    usage(stderr);
    return EXIT_USAGE;
}

/* Wall-clock milliseconds, the unit and epoch of the script's `ts`. */
static int64_t wall_ms(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* ---- The config file (a shim config, read by the shim's loader) ----- */

/* Take one shim rule's prefix, limit, cost and fixed key, where no flag
 * gave them. A key of $peer or $program names no one bucket: then KEY is
 * required. The fixed key is the loader's, hashed as the shim hashes it,
 * so the tool reaches the shim's bucket. */
static void use_rule(tool_t *t, const shim_rule_t *r)
{
    if (!t->prefix_set) {
        strcpy(t->prefix, r->prefix);
    }
    /* A rule with a concurrency limit alone has no bucket to give. */
    if (!t->have_cap && r->take.limit.capacity > 0) {
        t->limit.capacity = r->take.limit.capacity;
        t->have_cap = 1;
    }
    if (!t->have_rate && r->take.limit.capacity > 0) {
        t->limit.rate_per_sec = r->take.limit.rate_per_sec;
        t->have_rate = 1;
    }
    if (!t->have_cost) {
        t->cost = r->take.cost;
        t->have_cost = 1;
    }
    if (r->key_kind == SHIM_KEY_FIXED) {
        memcpy(t->rule_key, r->key, r->key_len);
        t->rule_key[r->key_len] = '\0';
    }
}

/* The file's TLS settings where no flag gave them, copied: conf is
 * freed after loading. */
static void config_tls(tool_t *t, const shim_conf_t *conf)
{
    const char **mine[4] = { &t->tls.ca_file, &t->tls.cert_file,
                             &t->tls.key_file, &t->tls.server_name };
    const char *theirs[4] = { conf->opts.tls.ca_file,
                              conf->opts.tls.cert_file,
                              conf->opts.tls.key_file,
                              conf->opts.tls.server_name };
    int i;

    for (i = 0; i < 4; i++) {
        if (!*mine[i] && theirs[i]) {
            snprintf(t->tls_buf[i], sizeof(t->tls_buf[i]), "%s", theirs[i]);
            *mine[i] = t->tls_buf[i];
        }
    }
    if (!t->verify_set) {
        t->tls.no_verify = conf->opts.tls.no_verify;
    }
}

/* Read the Redis address and timeouts (and a rule) from a shim config
 * with shim_conf_load(), so the tool accepts exactly the files the shim
 * accepts. Flags given on the command line win; a timeout the file does
 * not set keeps the tool's default. Returns 0 or EXIT_CONFIG. */
static int load_config(tool_t *t)
{
    shim_conf_t *conf;
    const shim_rule_t *r = NULL;
    char err[SHIM_ERR_LEN];
    int rc = EXIT_CONFIG;

    /* Two full rule tables: too large for a comfortable stack frame. */
    if ((conf = malloc(sizeof(*conf))) == NULL) {
        fprintf(stderr, "tbucket: %s: out of memory\n", t->config);
        return EXIT_CONFIG;
    }
    if (shim_conf_load(t->config, conf, err, sizeof(err)) != TB_OK) {
        fprintf(stderr, "tbucket: %s\n", err);
        goto done;
    }
    if (t->rule && (r = shim_conf_rule(conf, t->rule)) == NULL) {
        fprintf(stderr, "tbucket: %s: no inbound or outbound rule named "
                        "\"%s\"\n", t->config, t->rule);
        goto done;
    }
    if (!t->url_set) {
        snprintf(t->url, sizeof(t->url), "%s", conf->url);
    }
    if (!t->timeout_set && conf->timeout_set) {
        t->timeout_ms = conf->opts.timeout_ms;
    }
    if (!t->connect_timeout_set && conf->connect_timeout_set) {
        t->connect_timeout_ms = conf->opts.connect_timeout_ms;
    }
    config_tls(t, conf);
    if (r != NULL) {
        use_rule(t, r);
    }
    rc = 0;
done:
    free(conf);
    return rc;
}

/* ---- The command line ---------------------------------------------- */

enum {
    OPT_URL = 256, OPT_PREFIX, OPT_TIMEOUT, OPT_CONNECT_TIMEOUT, OPT_CONFIG,
    OPT_CAPACITY, OPT_RATE, OPT_COST, OPT_ROUTE, OPT_POLICY, OPT_RULE,
    OPT_ALGORITHM, OPT_TLS_CA, OPT_TLS_CERT, OPT_TLS_KEY,
    OPT_TLS_SERVER_NAME, OPT_TLS_VERIFY
};

static const struct option long_opts[] = {
    { "url", required_argument, NULL, OPT_URL },
    { "prefix", required_argument, NULL, OPT_PREFIX },
    { "timeout", required_argument, NULL, OPT_TIMEOUT },
    { "connect-timeout", required_argument, NULL, OPT_CONNECT_TIMEOUT },
    { "config", required_argument, NULL, OPT_CONFIG },
    { "capacity", required_argument, NULL, OPT_CAPACITY },
    { "rate", required_argument, NULL, OPT_RATE },
    { "cost", required_argument, NULL, OPT_COST },
    { "route", required_argument, NULL, OPT_ROUTE },
    { "policy", required_argument, NULL, OPT_POLICY },
    { "rule", required_argument, NULL, OPT_RULE },
    { "algorithm", required_argument, NULL, OPT_ALGORITHM },
    { "tls-ca", required_argument, NULL, OPT_TLS_CA },
    { "tls-cert", required_argument, NULL, OPT_TLS_CERT },
    { "tls-key", required_argument, NULL, OPT_TLS_KEY },
    { "tls-server-name", required_argument, NULL, OPT_TLS_SERVER_NAME },
    { "tls-verify", required_argument, NULL, OPT_TLS_VERIFY },
    { "quiet", no_argument, NULL, 'q' },
    { "help", no_argument, NULL, 'h' },
    { NULL, 0, NULL, 0 }
};

/* One option's value into *t. Returns 0 or EXIT_USAGE. */
static int set_option(tool_t *t, int c, const char *arg)
{
    char err[160];
    int64_t v;

    switch (c) {
    case OPT_URL:
        if (strlen(arg) >= sizeof(t->url)) {
            return usage_error("--url", "too long");
        }
        strcpy(t->url, arg);
        t->url_set = 1;
        return 0;
    case OPT_PREFIX:
        if (strlen(arg) > TB_PREFIX_MAX || !tb_prefix_valid(arg)) {
            return usage_error("--prefix", "1..64 printable bytes without "
                                           "braces or spaces");
        }
        strcpy(t->prefix, arg);
        t->prefix_set = 1;
        return 0;
    case OPT_TIMEOUT:
    case OPT_CONNECT_TIMEOUT:
        if (tb_parse_duration_ms(arg, &v, err, sizeof(err)) != TB_OK
            || v < 1 || v > 60000) {
            return usage_error("--timeout", "1ms..60s");
        }
        if (c == OPT_TIMEOUT) {
            t->timeout_ms = (int)v;
            t->timeout_set = 1;
        }
        else {
            t->connect_timeout_ms = (int)v;
            t->connect_timeout_set = 1;
        }
        return 0;
    case OPT_CONFIG:
        t->config = arg;
        return 0;
    case OPT_CAPACITY:
        if (tb_parse_int(arg, 1, (int64_t)TB_MAX_CAPACITY, &v, err,
                         sizeof(err)) != TB_OK) {
            return usage_error("--capacity", err);
        }
        t->limit.capacity = (double)v;
        t->have_cap = 1;
        return 0;
    case OPT_RATE:
        if (tb_parse_rate(arg, &t->limit.rate_per_sec, err, sizeof(err))
            != TB_OK) {
            return usage_error("--rate", err);
        }
        t->have_rate = 1;
        return 0;
    case OPT_COST:
        if (tb_parse_int(arg, 0, (int64_t)TB_MAX_CAPACITY, &v, err,
                         sizeof(err)) != TB_OK) {
            return usage_error("--cost", err);
        }
        t->cost = (double)v;
        t->have_cost = 1;
        return 0;
    case OPT_ROUTE:
        if (strlen(arg) > TB_NAME_MAX || !tb_name_valid(arg)) {
            return usage_error("--route", "1..64 of [A-Za-z0-9_.-]");
        }
        t->route = arg;
        return 0;
    case OPT_POLICY:
        if (strcmp(arg, "fail") == 0) {
            t->policy = POLICY_FAIL;
        }
        else if (strcmp(arg, "open") == 0) {
            t->policy = POLICY_OPEN;
        }
        else if (strcmp(arg, "closed") == 0) {
            t->policy = POLICY_CLOSED;
        }
        else {
            return usage_error("--policy", "fail, open or closed (local "
                                           "needs a long-lived process)");
        }
        return 0;
    case OPT_RULE:
        t->rule = arg;
        return 0;
    case OPT_ALGORITHM:
        if (tb_algo_parse(arg, &t->algo) != TB_OK) {
            return usage_error("--algorithm", "token-bucket, gcra, "
                               "sliding-window, fixed-window or "
                               "sliding-log");
        }
        return 0;
    case OPT_TLS_CA:
    case OPT_TLS_CERT:
    case OPT_TLS_KEY:
    case OPT_TLS_SERVER_NAME:
        *(c == OPT_TLS_CA     ? &t->tls.ca_file
          : c == OPT_TLS_CERT ? &t->tls.cert_file
          : c == OPT_TLS_KEY  ? &t->tls.key_file
                              : &t->tls.server_name) = arg;
        return 0;
    case OPT_TLS_VERIFY:
        if (strcmp(arg, "on") != 0 && strcmp(arg, "off") != 0) {
            return usage_error("--tls-verify", "on or off");
        }
        t->tls.no_verify = strcmp(arg, "off") == 0;
        t->verify_set = 1;
        return 0;
    case 'q':
        t->quiet = 1;
        return 0;
    default:
        return usage_error("unknown option", NULL);
    }
}

static int parse_args(tool_t *t, int argc, char **argv)
{
    const char *env;
    int c, rc;

    memset(t, 0, sizeof(*t));
    strcpy(t->url, TB_DEFAULT_URL);
    strcpy(t->prefix, "rl:");
    t->timeout_ms = DEFAULT_TIMEOUT_MS;
    t->cost = 1;
    opterr = 0;
    while ((c = getopt_long(argc, argv, "+qh", long_opts, NULL)) != -1
           || optind < argc) {
        if (c == -1) {
            /* A positional argument; options may follow it. */
            if (!t->cmd) {
                t->cmd = argv[optind];
            }
            else if (!t->key) {
                t->key = argv[optind];
            }
            else {
                return usage_error("unexpected argument", argv[optind]);
            }
            optind++;
            continue;
        }
        if (c == 'h') {
            usage(stdout);
            exit(0);
        }
        if (c == '?' || c == ':') {
            return usage_error("bad option", argv[optind - 1]);
        }
        if ((rc = set_option(t, c, optarg)) != 0) {
            return rc;
        }
    }
    if (!t->cmd) {
        return usage_error("no command", NULL);
    }
    if (!t->config && (env = getenv("TBUCKET_CONFIG")) != NULL && *env) {
        t->config = env;
    }
    if (t->rule && !t->config) {
        return usage_error("--rule", "needs --config or $TBUCKET_CONFIG");
    }
    if (t->config && (rc = load_config(t)) != 0) {
        return rc;
    }
    if (!t->key && t->rule_key[0]) {
        t->key = t->rule_key;
    }
    if (!t->key || !*t->key) {
        return usage_error("a KEY is required", NULL);
    }
    return 0;
}

/* ---- Commands -------------------------------------------------------- */

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

static int cmd_take(const tool_t *t)
{
    tb_take_t take;
    tb_request_t q;
    tb_result_t res;
    tb_client_t *c;
    int rc;

    if (!t->have_cap || !t->have_rate) {
        return usage_error("take needs --capacity and --rate", NULL);
    }
    if (t->cost > t->limit.capacity) {
        fprintf(stderr, "tbucket: cost %.0f exceeds capacity %.0f: never "
                        "allowed\n", t->cost, t->limit.capacity);
        return EXIT_DATAERR;
    }
    take.limit = t->limit;
    take.cost = t->cost;
    take.route = t->route;
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
        return usage_error("bad key, prefix or route", NULL);
    }
    memcpy(rkey + n, sfx, strlen(sfx) + 1);
    return 0;
}

/* Print the stored state and, given the limit, the state refilled to now
 * as the next decision would see it. One "name=value" per line. */
static int cmd_inspect(const tool_t *t)
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
        return usage_error("inspect needs both --capacity and --rate, or "
                           "neither", NULL);
    }
    if (t->algo != TB_ALGO_TOKEN_BUCKET) {
        return usage_error("inspect reads token buckets only",
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
            return usage_error("bad limit", NULL);
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

static int cmd_reset(const tool_t *t)
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

int main(int argc, char **argv)
{
    tool_t t;
    int rc;

    if ((rc = parse_args(&t, argc, argv)) != 0) {
        return rc;
    }
    if (strcmp(t.cmd, "take") == 0) {
        return cmd_take(&t);
    }
    if (strcmp(t.cmd, "inspect") == 0) {
        return cmd_inspect(&t);
    }
    if (strcmp(t.cmd, "reset") == 0) {
        return cmd_reset(&t);
    }
    return usage_error("unknown command", t.cmd);
}
