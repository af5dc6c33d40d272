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
 *   tbucket top URL [--once] [--interval DURATION]
 *   tbucket bans
 *   tbucket ban RULE KEY DURATION
 *   tbucket unban RULE KEY
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
 * fixed-window or sliding-log; take and reset only), --engine
 * auto|script|module (how a take asks Redis: the scripts, or the Redis
 * module tbucket_redis.so where it is loaded; the config file's engine
 * unless given, else auto).
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
 * `top` shows who is limited right now, as top(1) shows processes: the
 * top keys of a server's status page (its JSON view, fetched over plain
 * HTTP from URL, the page's address, every --interval) by refusals and by
 * decisions over the last minute and the last fifteen, redrawn in place
 * until `q` or Ctrl-C; --once prints one frame without escape codes and
 * exits, for scripts. --timeout bounds each fetch. Every string from the
 * server is shown with its control characters replaced, so a key cannot
 * drive the terminal.
 *
 * `bans` lists the bans the module's TBucketRule ban= set (or `ban` made),
 * one line each: rule, key and seconds left, from the index Redis keeps
 * beside them ("<prefix>bans"), not a scan of the keyspace. `ban` bans
 * KEY by RULE for DURATION (30s, 15m, 1h, 1d; at most 30d) on every
 * replica, as a refusal would; `unban` lifts such a ban (exit 0 whether
 * or not there was one; it says which). KEY is the rule's key as the
 * module computes it (an address, a user name), RULE the TBucketRule
 * NAME; --prefix is the module's TBucketPrefix.
 *
 * `inspect` reads the stored state without changing it (HMGET and PTTL)
 * and, given the limit, refills it to now with the pure tb_bucket_take()
 * arithmetic the module's script shares. "Now" is this host's wall clock
 * in milliseconds, while the script stamps buckets with Redis's TIME: on
 * another host, clock skew shows as age and refill.
 */
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <math.h>
#include <netdb.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <termios.h>
#include <time.h>
#include <unistd.h>

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
    const char *arg2, *arg3;   /* ban RULE KEY DURATION: KEY, DURATION. */
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
    int engine;                /* A tb_engine_t; -1 until set.       */
    int quiet;
    int once;                  /* top: one frame, then exit.         */
    int interval_ms;           /* top: between frames, default 1000. */
} tool_t;

static void usage(FILE *f)
{
    fputs("usage: tbucket take KEY --capacity N --rate R [--cost C]\n"
          "                        [--route NAME] [--policy fail|open|"
          "closed] [-q]\n"
          "       tbucket inspect KEY [--capacity N --rate R [--cost C]]"
          " [--route NAME]\n"
          "       tbucket reset KEY [--route NAME]\n"
          "       tbucket top URL [--once] [--interval DURATION]\n"
          "       tbucket bans | ban RULE KEY DURATION | unban RULE KEY\n"
          "options: --url URL  --config FILE  --prefix STRING (rl:)\n"
          "         --timeout DURATION (1s)  --rule [in:|out:]NAME\n"
          "         --algorithm NAME (token-bucket)\n"
          "         --engine auto|script|module (auto)\n"
          "         --tls-ca FILE  --tls-cert FILE  --tls-key FILE\n"
          "         --tls-server-name NAME  --tls-verify on|off\n"
          "exit: 0 allowed/done, 64 usage, 65 cost > capacity,\n"
          "      69 Redis (top: the status page) unavailable,\n"
          "      75 rejected (retry later), 78 config\n", f);
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
    if (t->engine < 0) {
        t->engine = (int)conf->opts.engine;
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
    OPT_TLS_SERVER_NAME, OPT_TLS_VERIFY, OPT_ONCE, OPT_INTERVAL,
    OPT_ENGINE
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
    { "engine", required_argument, NULL, OPT_ENGINE },
    { "tls-ca", required_argument, NULL, OPT_TLS_CA },
    { "tls-cert", required_argument, NULL, OPT_TLS_CERT },
    { "tls-key", required_argument, NULL, OPT_TLS_KEY },
    { "tls-server-name", required_argument, NULL, OPT_TLS_SERVER_NAME },
    { "tls-verify", required_argument, NULL, OPT_TLS_VERIFY },
    { "once", no_argument, NULL, OPT_ONCE },
    { "interval", required_argument, NULL, OPT_INTERVAL },
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
    case OPT_ENGINE:
        t->engine = tb_name_index(tb_engine_names, TB_ENGINE_COUNT, arg, 0);
        if (t->engine < 0) {
            return usage_error("--engine", "auto, script or module");
        }
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
    case OPT_ONCE:
        t->once = 1;
        return 0;
    case OPT_INTERVAL:
        if (tb_parse_duration_ms(arg, &v, err, sizeof(err)) != TB_OK
            || v < 100 || v > 3600000) {
            return usage_error("--interval", "100ms..1h");
        }
        t->interval_ms = (int)v;
        return 0;
    case 'q':
        t->quiet = 1;
        return 0;
    default:
        return usage_error("unknown option", NULL);
    }
}

/* The words after the command each command takes: KEY for most, none
 * for bans, RULE KEY [DURATION] for unban and ban. */
static int check_positionals(const tool_t *t)
{
    int want = 1, n = !!t->key + !!t->arg2 + !!t->arg3;

    if (strcmp(t->cmd, "bans") == 0) {
        want = 0;
    }
    else if (strcmp(t->cmd, "ban") == 0) {
        want = 3;
    }
    else if (strcmp(t->cmd, "unban") == 0) {
        want = 2;
    }
    if (n > want || (want > 1 && n != want)) {
        return usage_error(want == 3 ? "ban takes RULE KEY DURATION"
                           : want == 2 ? "unban takes RULE KEY"
                           : "unexpected argument",
                           n > want ? (t->arg3 ? t->arg3 : t->arg2
                                       ? t->arg2 : t->key) : NULL);
    }
    return 0;
}

static int parse_args(tool_t *t, int argc, char **argv)
{
    const char *env;
    int c, rc;

    memset(t, 0, sizeof(*t));
    strcpy(t->url, TB_DEFAULT_URL);
    strcpy(t->prefix, "rl:");
    t->timeout_ms = DEFAULT_TIMEOUT_MS;
    t->interval_ms = 1000;
    t->engine = -1;
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
            else if (!t->arg2) {
                t->arg2 = argv[optind];
            }
            else if (!t->arg3) {
                t->arg3 = argv[optind];
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
    if ((rc = check_positionals(t)) != 0) {
        return rc;
    }
    if (strcmp(t->cmd, "bans") == 0) {
        return 0;
    }
    if (!t->key || !*t->key) {
        return usage_error(strcmp(t->cmd, "top") == 0
                           ? "top needs the status page's URL"
                           : "a KEY is required", NULL);
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
    memset(&take, 0, sizeof(take));
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

/* ---- bans ------------------------------------------------------------ */

/* A ban's DURATION: a whole number of s, m, h or d, 1s .. 30d. */
static int parse_ban_ms(const char *s, int64_t *ms)
{
    static const char units[] = "smhd";
    static const int64_t unit_ms[] = { 1000, 60000, 3600000, 86400000 };
    const char *u;
    char *end;
    long long n;

    if (!isdigit((unsigned char)s[0])) {
        return -1;
    }
    errno = 0;
    n = strtoll(s, &end, 10);
    if (errno || !*end || end[1] || !(u = strchr(units, *end)) || n < 1
        || n > TB_MAX_BAN_MS / unit_ms[u - units]) {
        return -1;
    }
    *ms = n * unit_ms[u - units];
    return 0;
}

static int cmd_ban(const tool_t *t, int lift)
{
    tb_client_t *c;
    int64_t ms = 0;
    int found = 0, rc;

    if (!lift && parse_ban_ms(t->arg3, &ms) != 0) {
        return usage_error("bad DURATION (30s, 15m, 1h, 1d; 1s to 30d)",
                           t->arg3);
    }
    if (!tb_name_valid(t->key)) {
        return usage_error("bad RULE", t->key);
    }
    if (!(c = connect_client(t, TB_POLICY_OPEN))) {
        return EXIT_USAGE;
    }
    rc = lift ? tb_client_unban(c, t->prefix, t->key, t->arg2,
                                strlen(t->arg2), &found)
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
            printf("%s %s: %s\n", t->key, t->arg2,
                   found ? "unbanned" : "was not banned");
        }
        else {
            printf("%s %s: banned for %llds\n", t->key, t->arg2,
                   (long long)(ms / 1000));
        }
    }
    return 0;
}

#define BANS_MAX 10000

static int cmd_bans(const tool_t *t)
{
    tb_ban_t *b = calloc(BANS_MAX, sizeof(*b));
    tb_client_t *c;
    int i, n = 0;

    if (!b) {
        fprintf(stderr, "tbucket: out of memory\n");
        return EXIT_UNAVAILABLE;
    }
    if (!(c = connect_client(t, TB_POLICY_OPEN))) {
        free(b);
        return EXIT_USAGE;
    }
    if (tb_client_bans(c, t->prefix, b, BANS_MAX, &n) != TB_OK) {
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
    free(b);
    return 0;
}

/* ---- top: who is limited right now ---------------------------------- */

#define TOP_BODY_MAX (16 * 1024 * 1024) /* Bytes of a status page, at most. */
#define JSON_DEPTH 32

/* An http:// URL taken apart: what connect and the request need. */
typedef struct http_url {
    char host[256];            /* For getaddrinfo: no brackets.       */
    char hostport[300];        /* For the Host header, as written.    */
    char port[8];
    char path[1024];           /* Path and query, view=json added.    */
} http_url_t;

/* Parse "http://host[:port][/path][?query]" (an IPv6 host in brackets)
 * and ask for the JSON view. 0, or -1 when it is not such a URL. */
static int http_url_parse(const char *url, http_url_t *u)
{
    const char *p, *end, *slash, *colon;
    size_t hl;

    memset(u, 0, sizeof(*u));
    if (strncmp(url, "http://", 7) != 0) {
        return -1;
    }
    p = url + 7;
    slash = strchr(p, '/');
    end = slash ? slash : p + strlen(p);
    if (end == p || (size_t)(end - p) >= sizeof(u->hostport)) {
        return -1;
    }
    memcpy(u->hostport, p, (size_t)(end - p));
    if (*p == '[') {
        const char *rb = memchr(p, ']', (size_t)(end - p));

        if (!rb) {
            return -1;
        }
        hl = (size_t)(rb - p - 1);
        memcpy(u->host, p + 1, hl < sizeof(u->host) ? hl : 0);
        colon = rb + 1 < end && rb[1] == ':' ? rb + 1 : NULL;
    }
    else {
        colon = memchr(p, ':', (size_t)(end - p));
        hl = (size_t)((colon ? colon : end) - p);
        if (hl >= sizeof(u->host)) {
            return -1;
        }
        memcpy(u->host, p, hl);
    }
    if (!u->host[0]) {
        return -1;
    }
    if (colon) {
        size_t pl = (size_t)(end - colon - 1);

        if (pl < 1 || pl >= sizeof(u->port)
            || strspn(colon + 1, "0123456789") < pl) {
            return -1;
        }
        memcpy(u->port, colon + 1, pl);
    }
    else {
        strcpy(u->port, "80");
    }
    snprintf(u->path, sizeof(u->path), "%s%sview=json",
             slash ? slash : "/", slash && strchr(slash, '?') ? "&" : "?");
    /* Request bytes: no space, control character or non-ASCII. */
    for (p = u->path; *p; p++) {
        if ((unsigned char)*p <= 0x20 || (unsigned char)*p >= 0x7f) {
            return -1;
        }
    }
    return 0;
}

static int64_t mono_ms(void)
{
    return tb_clock_monotonic_us() / 1000;
}

/* Wait until fd is ready for events or the deadline passes: 1, 0 on
 * timeout, -1 on error. */
static int wait_fd(int fd, short events, int64_t deadline_ms)
{
    struct pollfd pfd;
    int rc;

    for (;;) {
        int64_t left = deadline_ms - mono_ms();

        if (left <= 0) {
            return 0;
        }
        pfd.fd = fd;
        pfd.events = events;
        rc = poll(&pfd, 1, (int)left);
        if (rc >= 0 || errno != EINTR) {
            return rc > 0 ? 1 : rc;
        }
    }
}

/* A connected socket to u, or -1 with a message in err. */
static int http_connect(const http_url_t *u, int64_t deadline_ms, char *err,
                        size_t errlen)
{
    struct addrinfo hints, *ai = NULL, *a;
    int fd = -1, rc, soerr;
    socklen_t sl = sizeof(soerr);

    memset(&hints, 0, sizeof(hints));
    hints.ai_socktype = SOCK_STREAM;
    if ((rc = getaddrinfo(u->host, u->port, &hints, &ai)) != 0) {
        snprintf(err, errlen, "%.100s: %s", u->host, gai_strerror(rc));
        return -1;
    }
    snprintf(err, errlen, "%.100s:%s: no address", u->host, u->port);
    for (a = ai; a && fd < 0; a = a->ai_next) {
        fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC,
                    a->ai_protocol);
        if (fd < 0) {
            continue;
        }
        fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
        if (connect(fd, a->ai_addr, a->ai_addrlen) == 0
            || (errno == EINPROGRESS && wait_fd(fd, POLLOUT, deadline_ms) > 0
                && getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &sl) == 0
                && (errno = soerr) == 0)) {
            break;
        }
        snprintf(err, errlen, "connect %.100s:%s: %s", u->host, u->port,
                 errno == EINPROGRESS ? "timed out" : strerror(errno));
        close(fd);
        fd = -1;
    }
    freeaddrinfo(ai);
    return fd;
}

/* GET u's JSON view within timeout_ms: its body (malloc'd, NUL-ended),
 * or NULL with a message in err. HTTP/1.0, so the body ends with the
 * connection and is never chunked. */
static char *http_get_json(const http_url_t *u, int timeout_ms, char *err,
                           size_t errlen)
{
    int64_t deadline = mono_ms() + timeout_ms;
    char req[1600], *buf = NULL, *body;
    size_t len = 0, cap = 0, sent = 0, reqlen;
    int fd = http_connect(u, deadline, err, errlen);
    ssize_t n;

    if (fd < 0) {
        return NULL;
    }
    reqlen = (size_t)snprintf(req, sizeof(req), "GET %s HTTP/1.0\r\nHost: "
                              "%s\r\nAccept: application/json\r\n"
                              "User-Agent: tbucket-top\r\n\r\n", u->path,
                              u->hostport);
    while (sent < reqlen) {
        if (wait_fd(fd, POLLOUT, deadline) <= 0) {
            snprintf(err, errlen, "sending the request timed out");
            goto fail;
        }
        n = send(fd, req + sent, reqlen - sent, MSG_NOSIGNAL);
        if (n < 0 && errno != EAGAIN && errno != EINTR) {
            snprintf(err, errlen, "send: %s", strerror(errno));
            goto fail;
        }
        sent += n > 0 ? (size_t)n : 0;
    }
    for (;;) {
        if (len + 65536 + 1 > cap) {
            char *nb;

            if (cap >= TOP_BODY_MAX) {
                snprintf(err, errlen, "the page is larger than %d bytes",
                         TOP_BODY_MAX);
                goto fail;
            }
            cap = cap ? 2 * cap : 131072;
            if (!(nb = realloc(buf, cap))) {
                snprintf(err, errlen, "out of memory");
                goto fail;
            }
            buf = nb;
        }
        if (wait_fd(fd, POLLIN, deadline) <= 0) {
            snprintf(err, errlen, "no full answer within %d ms", timeout_ms);
            goto fail;
        }
        n = recv(fd, buf + len, cap - len - 1, 0);
        if (n == 0) {
            break;
        }
        if (n < 0 && errno != EAGAIN && errno != EINTR) {
            snprintf(err, errlen, "recv: %s", strerror(errno));
            goto fail;
        }
        len += n > 0 ? (size_t)n : 0;
    }
    close(fd);
    buf[len] = '\0';
    if (strncmp(buf, "HTTP/1.", 7) != 0 || len < 12
        || strncmp(buf + 9, "200", 3) != 0) {
        snprintf(err, errlen, "the server answered %.40s",
                 len ? strtok(buf, "\r\n") : "nothing");
        free(buf);
        return NULL;
    }
    if (!(body = strstr(buf, "\r\n\r\n"))) {
        snprintf(err, errlen, "no end to the response's header");
        free(buf);
        return NULL;
    }
    memmove(buf, body + 4, len - (size_t)(body + 4 - buf) + 1);
    return buf;

fail:
    close(fd);
    free(buf);
    return NULL;
}

/* ---- A small JSON reader: enough for the status page ---------------- */

typedef enum { J_NULL, J_BOOL, J_NUM, J_STR, J_ARR, J_OBJ } jtype_t;

typedef struct jval {
    jtype_t type;
    double num;                /* J_NUM, J_BOOL (0 or 1).              */
    char *str;                 /* J_STR: decoded; non-ASCII as '?'.    */
    struct jval *items;        /* J_ARR and J_OBJ: n values.           */
    char **keys;               /* J_OBJ: the n member names.           */
    size_t n;
} jval_t;

typedef struct jparse {
    const char *p;
    int depth;
} jparse_t;

static void jfree(jval_t *v)
{
    size_t i;

    for (i = 0; i < v->n; i++) {
        jfree(&v->items[i]);
        if (v->keys) {
            free(v->keys[i]);
        }
    }
    free(v->items);
    free(v->keys);
    free(v->str);
    memset(v, 0, sizeof(*v));
}

static void jspace(jparse_t *j)
{
    while (*j->p == ' ' || *j->p == '\t' || *j->p == '\n' || *j->p == '\r') {
        j->p++;
    }
}

static int jvalue(jparse_t *j, jval_t *v);

/* A string at j->p (after its opening quote) into *out. */
static int jstring(jparse_t *j, char **out)
{
    const char *p = j->p;
    size_t n = 0;
    char *s;

    /* Decoded, a string is never longer than its text. */
    while (*p && *p != '"') {
        p += *p == '\\' && p[1] ? 2 : 1;
    }
    if (*p != '"' || !(s = malloc((size_t)(p - j->p) + 1))) {
        return -1;
    }
    for (p = j->p; *p != '"'; p++) {
        if (*p != '\\') {
            s[n++] = (unsigned char)*p < 0x80 ? *p : '?';
            continue;
        }
        p++;
        switch (*p) {
        case 'n': s[n++] = '\n'; break;
        case 't': s[n++] = '\t'; break;
        case 'r': s[n++] = '\r'; break;
        case 'b': s[n++] = '\b'; break;
        case 'f': s[n++] = '\f'; break;
        case 'u': {
            unsigned c = 0;
            int i;

            for (i = 1; i <= 4 && isxdigit((unsigned char)p[i]); i++) {
                c = c * 16 + (unsigned)(isdigit((unsigned char)p[i])
                                        ? p[i] - '0'
                                        : (tolower((unsigned char)p[i])
                                           - 'a' + 10));
            }
            if (i != 5) {
                free(s);
                return -1;
            }
            s[n++] = c < 0x80 ? (char)c : '?';
            p += 4;
            break;
        }
        default: s[n++] = *p; break;
        }
    }
    s[n] = '\0';
    j->p = p + 1;
    *out = s;
    return 0;
}

/* A list of values (arr) or of "name": value members, after its opening
 * bracket. */
static int jlist(jparse_t *j, jval_t *v, int obj)
{
    char close = obj ? '}' : ']';
    size_t cap = 0;

    v->type = obj ? J_OBJ : J_ARR;
    jspace(j);
    if (*j->p == close) {
        j->p++;
        return 0;
    }
    for (;;) {
        if (v->n == cap) {
            jval_t *ni;
            char **nk = NULL;

            cap = cap ? 2 * cap : 8;
            ni = realloc(v->items, cap * sizeof(*ni));
            if (ni) {
                v->items = ni;
            }
            if (obj && ni) {
                nk = realloc(v->keys, cap * sizeof(*nk));
                if (nk) {
                    v->keys = nk;
                }
            }
            if (!ni || (obj && !nk)) {
                return -1;
            }
        }
        memset(&v->items[v->n], 0, sizeof(v->items[0]));
        if (obj) {
            jspace(j);
            if (*j->p != '"') {
                return -1;
            }
            j->p++;
            if (jstring(j, &v->keys[v->n]) != 0) {
                return -1;
            }
            jspace(j);
            if (*j->p++ != ':') {
                free(v->keys[v->n]);
                return -1;
            }
        }
        if (jvalue(j, &v->items[v->n]) != 0) {
            if (obj) {
                free(v->keys[v->n]);
            }
            jfree(&v->items[v->n]);
            return -1;
        }
        v->n++;
        jspace(j);
        if (*j->p == ',') {
            j->p++;
            continue;
        }
        if (*j->p++ != close) {
            return -1;
        }
        return 0;
    }
}

static int jvalue(jparse_t *j, jval_t *v)
{
    char *end;
    int rc;

    jspace(j);
    memset(v, 0, sizeof(*v));
    switch (*j->p) {
    case '{':
    case '[':
        if (++j->depth > JSON_DEPTH) {
            return -1;
        }
        j->p++;
        rc = jlist(j, v, j->p[-1] == '{');
        j->depth--;
        return rc;
    case '"':
        j->p++;
        v->type = J_STR;
        return jstring(j, &v->str);
    case 't':
    case 'f':
    case 'n':
        if (!strncmp(j->p, "true", 4) || !strncmp(j->p, "null", 4)) {
            v->type = *j->p == 't' ? J_BOOL : J_NULL;
            v->num = *j->p == 't';
            j->p += 4;
            return 0;
        }
        if (!strncmp(j->p, "false", 5)) {
            v->type = J_BOOL;
            j->p += 5;
            return 0;
        }
        return -1;
    default:
        v->num = tb_strtod_c(j->p, &end);
        if (end == j->p) {
            return -1;
        }
        v->type = J_NUM;
        j->p = end;
        return 0;
    }
}

/* Member name of object o, or NULL. */
static const jval_t *jget(const jval_t *o, const char *name)
{
    size_t i;

    for (i = 0; o && o->type == J_OBJ && i < o->n; i++) {
        if (strcmp(o->keys[i], name) == 0) {
            return &o->items[i];
        }
    }
    return NULL;
}

static double jnum(const jval_t *o, const char *name)
{
    const jval_t *v = jget(o, name);

    return v && v->type == J_NUM ? v->num : 0;
}

/* A string member with every control character shown as '?', so that
 * nothing the server sends can drive the terminal; "-" when absent. */
static const char *jtext(const jval_t *o, const char *name, char *buf,
                         size_t len)
{
    const jval_t *v = jget(o, name);
    size_t i;

    if (!v || v->type != J_STR) {
        return "-";
    }
    for (i = 0; v->str[i] && i + 1 < len; i++) {
        unsigned char c = (unsigned char)v->str[i];

        buf[i] = c < 0x20 || c == 0x7f ? '?' : (char)c;
    }
    buf[i] = '\0';
    return buf;
}

/* ---- Frames ----------------------------------------------------------- */

/* The sum of tbucket_decisions_total's sample of outcome o. */
static double outcome_total(const jval_t *page, const char *o)
{
    const jval_t *m = jget(page, "metrics");
    size_t i, k;

    for (i = 0; m && m->type == J_ARR && i < m->n; i++) {
        const jval_t *f = &m->items[i];
        const jval_t *name = jget(f, "name"), *s = jget(f, "samples");

        if (!name || name->type != J_STR
            || strcmp(name->str, "tbucket_decisions_total") != 0) {
            continue;
        }
        for (k = 0; s && s->type == J_ARR && k < s->n; k++) {
            const jval_t *l = jget(&s->items[k], "labels");
            const jval_t *lo = jget(l, "outcome");

            if (lo && lo->type == J_STR && strcmp(lo->str, o) == 0) {
                return jnum(&s->items[k], "value");
            }
        }
    }
    return 0;
}

static void frame_time(double unix_s, char *buf, size_t len)
{
    time_t t = (time_t)unix_s;
    struct tm tm;

    if (unix_s <= 0 || !gmtime_r(&t, &tm)) {
        snprintf(buf, len, "-");
        return;
    }
    strftime(buf, len, "%H:%M:%S", &tm);
}

/* One ranking of one window, at most rows lines of entries. */
static void frame_ranking(FILE *out, const jval_t *w, const char *which,
                          int minutes, long rows)
{
    const jval_t *list = jget(w, which);
    int by_ref = strcmp(which, "by_refusals") == 0;
    size_t i;

    fprintf(out, "\nLAST %d MINUTE%s, BY %s\n", minutes,
            minutes == 1 ? "" : "S", by_ref ? "REFUSALS" : "DECISIONS");
    fprintf(out, "%3s %9s %9s %9s %8s  %-12s %-20s %s\n", "#", "REFUSED",
            "DECISIONS", "ALLOWED", "LAST", "LIMIT", "VHOST", "KEY");
    for (i = 0; list && list->type == J_ARR && i < list->n
                && (rows < 0 || (long)i < rows); i++) {
        const jval_t *e = &list->items[i];
        char key[TB_KEY_RAW_MAX + 8], lim[TB_NAME_MAX + 1], vh[200], at[16];

        frame_time(jnum(e, "last_refusal"), at, sizeof(at));
        fprintf(out, "%3zu %9.0f %9.0f %9.0f %8s  %-12s %-20s %s\n", i + 1,
                jnum(e, "refusals"), jnum(e, "decisions"),
                jnum(e, "allowed"), at, jtext(e, "limit", lim, sizeof(lim)),
                jtext(e, "vhost", vh, sizeof(vh)),
                jtext(e, "key", key, sizeof(key)));
    }
    if (!list || !list->n) {
        fprintf(out, "    (none)\n");
    }
}

/* One frame of `tbucket top` from a status page's JSON, into out. rows
 * bounds each ranking's lines (-1: all of them). */
static void frame(FILE *out, const char *url, const jval_t *page,
                  const tool_t *t, long rows)
{
    static const char *const outcomes[] = {
        "allowed", "rejected", "shadow-rejected", "fallback-open",
        "fallback-closed", "fallback-local", "shed"
    };
    const jval_t *top = jget(page, "top"), *ws = jget(top, "windows");
    char now[16];
    size_t i, w;

    frame_time((double)time(NULL), now, sizeof(now));
    fprintf(out, "tbucket top - %s - %s UTC, every %d ms (q quits)\n", url,
            now, t->interval_ms);
    fprintf(out, "decisions since start:");
    for (i = 0; i < sizeof(outcomes) / sizeof(outcomes[0]); i++) {
        fprintf(out, " %s %.0f", outcomes[i], outcome_total(page, outcomes[i]));
    }
    fputc('\n', out);
    if (!top || top->type != J_OBJ) {
        fprintf(out, "top keys: off (TBucketTopKeys Off, or not a status "
                     "page of mod_tbucket)\n");
        return;
    }
    fprintf(out, "top keys: %.0f per ranking, %.0f counters, %.0f bytes; "
                 "counts never below the truth\n", jnum(top, "k"),
            jnum(top, "counters"), jnum(top, "memory_bytes"));
    for (w = 0; ws && ws->type == J_ARR && w < ws->n; w++) {
        const jval_t *win = &ws->items[w];
        int minutes = (int)jnum(win, "minutes");

        fprintf(out, "\nlast %d minute%s: %.0f decisions, %.0f refused; a "
                     "count is over by at most %.0f (decisions), %.0f "
                     "(refusals)\n", minutes, minutes == 1 ? "" : "s",
                jnum(win, "decisions"), jnum(win, "refusals"),
                jnum(win, "decisions_bound"), jnum(win, "refusals_bound"));
        frame_ranking(out, win, "by_refusals", minutes, rows);
        frame_ranking(out, win, "by_decisions", minutes, rows);
    }
}

/* ---- The terminal ----------------------------------------------------- */

static struct termios saved_tty;
static int tty_raw;
static volatile sig_atomic_t top_stop;

static void on_signal(int sig)
{
    (void)sig;
    top_stop = 1;
}

static void tty_restore(void)
{
    if (tty_raw) {
        tcsetattr(STDIN_FILENO, TCSANOW, &saved_tty);
        tty_raw = 0;
    }
}

/* Keys one at a time, unechoed, while top runs on a terminal. */
static void tty_keys(void)
{
    struct termios raw;

    if (!isatty(STDIN_FILENO) || tcgetattr(STDIN_FILENO, &saved_tty) != 0) {
        return;
    }
    raw = saved_tty;
    raw.c_lflag &= ~(tcflag_t)(ICANON | ECHO);
    raw.c_cc[VMIN] = 0;
    raw.c_cc[VTIME] = 0;
    if (tcsetattr(STDIN_FILENO, TCSANOW, &raw) == 0) {
        tty_raw = 1;
        atexit(tty_restore);
    }
}

/* Wait up to ms for a key: 1 when it was q (or the input ended), else
 * 0; Ctrl-C ends the wait through top_stop. */
static int wait_quit(int ms)
{
    int64_t deadline = mono_ms() + ms;
    struct pollfd pfd;
    char c;

    while (!top_stop) {
        int64_t left = deadline - mono_ms();

        if (left <= 0) {
            return 0;
        }
        pfd.fd = STDIN_FILENO;
        pfd.events = POLLIN;
        if (poll(&pfd, 1, (int)left) > 0) {
            ssize_t n = read(STDIN_FILENO, &c, 1);

            if (n == 0 && !isatty(STDIN_FILENO)) {
                /* No more input (stdin at end of file): just wait. */
                usleep((useconds_t)(left > 0 ? left : 0) * 1000);
                return 0;
            }
            if (n == 1 && (c == 'q' || c == 'Q')) {
                return 1;
            }
        }
    }
    return 1;
}

/* The rows of the terminal, or -1 when it is not one. */
static long tty_rows(void)
{
    struct winsize ws;

    if (!isatty(STDOUT_FILENO) || ioctl(STDOUT_FILENO, TIOCGWINSZ, &ws) != 0
        || ws.ws_row == 0) {
        return -1;
    }
    return ws.ws_row;
}

/* Fetch and parse one page: 0, or EXIT_UNAVAILABLE with the reason in
 * err. */
static int fetch_page(const tool_t *t, const http_url_t *u, jval_t *page,
                      char *err, size_t errlen)
{
    char *body = http_get_json(u, t->timeout_ms, err, errlen);
    jparse_t j;
    int rc;

    if (!body) {
        return EXIT_UNAVAILABLE;
    }
    j.p = body;
    j.depth = 0;
    rc = jvalue(&j, page);
    if (rc == 0) {
        jspace(&j);
    }
    if (rc != 0 || *j.p || page->type != J_OBJ || !jget(page, "metrics")) {
        snprintf(err, errlen, "not the JSON view of a tbucket-status page");
        jfree(page);
        free(body);
        return EXIT_UNAVAILABLE;
    }
    free(body);
    return 0;
}

/* tbucket top URL: one frame with --once (exit 0, or 69 when the page
 * cannot be read), else a frame every interval until q or Ctrl-C. */
static int cmd_top(const tool_t *t)
{
    http_url_t u;
    char err[256];
    jval_t page;
    int rc;

    if (http_url_parse(t->key, &u) != 0) {
        return usage_error("top: expected http://HOST[:PORT]/PATH of a "
                           "tbucket-status page", t->key);
    }
    if (t->once) {
        if ((rc = fetch_page(t, &u, &page, err, sizeof(err))) != 0) {
            fprintf(stderr, "tbucket: %s: %s\n", t->key, err);
            return rc;
        }
        frame(stdout, t->key, &page, t, -1);
        jfree(&page);
        return 0;
    }
    signal(SIGINT, on_signal);
    signal(SIGTERM, on_signal);
    tty_keys();
    while (!top_stop) {
        long rows = tty_rows();
        char *text = NULL;
        size_t len = 0;
        FILE *out = open_memstream(&text, &len);

        if (!out) {
            return EXIT_UNAVAILABLE;
        }
        if (fetch_page(t, &u, &page, err, sizeof(err)) == 0) {
            /* Four rankings share the screen below seven lines of totals
             * and four of headings each. */
            frame(out, t->key, &page, t,
                  rows < 0 ? -1 : rows > 40 ? (rows - 23) / 4 : 4);
            jfree(&page);
        }
        else {
            fprintf(out, "tbucket top - %s\n\nno page: %s (retrying every "
                         "%d ms; q quits)\n", t->key, err, t->interval_ms);
        }
        fclose(out);
        /* Home and clear, then the frame in one write. */
        fputs("\033[H\033[2J", stdout);
        fwrite(text, 1, len, stdout);
        fflush(stdout);
        free(text);
        if (wait_quit(t->interval_ms)) {
            break;
        }
    }
    tty_restore();
    fputc('\n', stdout);
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
    if (strcmp(t.cmd, "top") == 0) {
        return cmd_top(&t);
    }
    if (strcmp(t.cmd, "bans") == 0) {
        return cmd_bans(&t);
    }
    if (strcmp(t.cmd, "ban") == 0 || strcmp(t.cmd, "unban") == 0) {
        return cmd_ban(&t, t.cmd[0] == 'u');
    }
    return usage_error("unknown command", t.cmd);
}
