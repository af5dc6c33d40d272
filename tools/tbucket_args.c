/* tbucket_args.c -- the tool's command line and config file into tool_t.
 *
 * Options are a table (name, kind, bounds, where the value goes), as the
 * module's directives are, so each is parsed and checked in one place and
 * the usage and getopt's list cannot drift apart. A shim configuration
 * (--config or $TBUCKET_CONFIG) is read by the shim's own loader
 * (shim/shim_conf.c, linked as libtbshimconf.a), so the tool accepts
 * exactly the files the shim accepts; flags win over the file. */
#include <getopt.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "tbucket_tool.h"

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

/* ---- The options ---------------------------------------------------- */

typedef enum {
    K_URL, K_PREFIX, K_DURATION, K_STRING, K_INT, K_RATE, K_ROUTE,
    K_NAMED, K_TLS_PATH, K_VERIFY, K_FLAG
} opt_kind;

/* One option: its name, how its value is read and where it goes
 * (offsets into tool_t), the bounds of a number, the names of a choice,
 * and what a bad value is told. */
typedef struct opt_def {
    const char *name;
    opt_kind kind;
    size_t field;              /* Where the value goes.              */
    size_t seen;               /* An int set to 1, or (size_t)-1.    */
    int64_t min, max;
    const char *const *names;  /* K_NAMED: the values, in enum order. */
    int nnames;
    const char *why;           /* Said of a bad value.               */
} opt_def;

#define F(m) offsetof(tool_t, m)
#define NONE ((size_t)-1)

static const char *const policy_names[] = { "fail", "open", "closed" };

static const opt_def opt_table[] = {
    { "url", K_URL, F(url), F(url_set), 0, 0, NULL, 0, "too long" },
    { "prefix", K_PREFIX, F(prefix), F(prefix_set), 0, 0, NULL, 0,
      "1..64 printable bytes without braces or spaces" },
    { "timeout", K_DURATION, F(timeout_ms), F(timeout_set), 1, 60000, NULL,
      0, "1ms..60s" },
    { "connect-timeout", K_DURATION, F(connect_timeout_ms),
      F(connect_timeout_set), 1, 60000, NULL, 0, "1ms..60s" },
    { "config", K_STRING, F(config), NONE, 0, 0, NULL, 0, NULL },
    { "capacity", K_INT, F(limit.capacity), F(have_cap), 1,
      (int64_t)TB_MAX_CAPACITY, NULL, 0, NULL },
    { "rate", K_RATE, F(limit.rate_per_sec), F(have_rate), 0, 0, NULL, 0,
      NULL },
    { "cost", K_INT, F(cost), F(have_cost), 0, (int64_t)TB_MAX_CAPACITY,
      NULL, 0, NULL },
    { "route", K_ROUTE, F(route), NONE, 0, 0, NULL, 0,
      "1..64 of [A-Za-z0-9_.-]" },
    { "policy", K_NAMED, F(policy), NONE, 0, 0, policy_names, 3,
      "fail, open or closed (local needs a long-lived process)" },
    { "rule", K_STRING, F(rule), NONE, 0, 0, NULL, 0, NULL },
    { "algorithm", K_NAMED, F(algo), NONE, 0, 0, tb_algo_names,
      TB_ALGO_COUNT, "token-bucket, gcra, sliding-window, fixed-window or "
      "sliding-log" },
    { "engine", K_NAMED, F(engine), NONE, 0, 0, tb_engine_names,
      TB_ENGINE_COUNT, "auto, script or module" },
    { "tls-ca", K_TLS_PATH, F(tls.ca_file), NONE, 0, 0, NULL, 0, NULL },
    { "tls-cert", K_TLS_PATH, F(tls.cert_file), NONE, 0, 0, NULL, 0, NULL },
    { "tls-key", K_TLS_PATH, F(tls.key_file), NONE, 0, 0, NULL, 0, NULL },
    { "tls-server-name", K_TLS_PATH, F(tls.server_name), NONE, 0, 0, NULL,
      0, NULL },
    { "tls-verify", K_VERIFY, F(tls.no_verify), F(verify_set), 0, 0, NULL,
      0, "on or off" },
    { "once", K_FLAG, F(once), NONE, 0, 0, NULL, 0, NULL },
    { "interval", K_DURATION, F(interval_ms), NONE, 100, 3600000, NULL, 0,
      "100ms..1h" },
    { "quiet", K_FLAG, F(quiet), NONE, 0, 0, NULL, 0, NULL },
    { "keep-bucket", K_FLAG, F(keep_bucket), NONE, 0, 0, NULL, 0, NULL },
    { "key", K_STRING, F(ban_key), NONE, 0, 0, NULL, 0, NULL },
    { "limit", K_INT, F(ban_limit), NONE, 1, TOOL_BANS_MAX, NULL, 0,
      NULL },
};

#define NOPTS (int)(sizeof(opt_table) / sizeof(opt_table[0]))

/* A number or a duration, within the option's bounds, into *v. */
static int read_number(const opt_def *d, const char *arg, int64_t *v,
                       char *err, size_t errlen)
{
    if (d->kind == K_DURATION) {
        return tb_parse_duration_ms(arg, v, err, errlen) == TB_OK
               && *v >= d->min && *v <= d->max ? 0 : -1;
    }
    return tb_parse_int(arg, d->min, d->max, v, err, errlen) == TB_OK ? 0
                                                                       : -1;
}

/* Set option d of t from arg: 0, or EXIT_USAGE naming the option. */
static int set_value(tool_t *t, const opt_def *d, const char *arg)
{
    char *at = (char *)t + d->field, err[160], flag[40];
    int64_t v;
    int i;

    snprintf(flag, sizeof(flag), "--%s", d->name);
    err[0] = '\0';
    switch (d->kind) {
    case K_URL:
    case K_PREFIX:
        if (strlen(arg) >= (d->kind == K_URL ? URL_MAX : TB_PREFIX_MAX + 1)
            || (d->kind == K_PREFIX && !tb_prefix_valid(arg))) {
            return tool_usage_error(flag, d->why);
        }
        strcpy(at, arg);
        break;
    case K_DURATION:
    case K_INT:
        if (read_number(d, arg, &v, err, sizeof(err)) != 0) {
            return tool_usage_error(flag, d->why ? d->why : err);
        }
        if (d->kind == K_INT) {
            *(double *)at = (double)v;
        }
        else {
            *(int *)at = (int)v;
        }
        break;
    case K_RATE:
        if (tb_parse_rate(arg, (double *)at, err, sizeof(err)) != TB_OK) {
            return tool_usage_error(flag, err);
        }
        break;
    case K_ROUTE:
        if (strlen(arg) > TB_NAME_MAX || !tb_name_valid(arg)) {
            return tool_usage_error(flag, d->why);
        }
        /* fall through */
    case K_STRING:
    case K_TLS_PATH:
        *(const char **)at = arg;
        break;
    case K_NAMED:
        if ((i = tb_name_index(d->names, d->nnames, arg, 0)) < 0) {
            return tool_usage_error(flag, d->why);
        }
        *(int *)at = i;
        break;
    case K_VERIFY:
        if (strcmp(arg, "on") != 0 && strcmp(arg, "off") != 0) {
            return tool_usage_error(flag, d->why);
        }
        *(int *)at = strcmp(arg, "off") == 0;
        break;
    case K_FLAG:
        *(int *)at = 1;
        break;
    }
    if (d->seen != NONE) {
        *(int *)((char *)t + d->seen) = 1;
    }
    return 0;
}

/* getopt_long's list, made from the table once: each option's val is
 * its index in the table plus 256. */
static const struct option *long_opts(void)
{
    static struct option opts[NOPTS + 2];
    int i;

    if (!opts[0].name) {
        for (i = 0; i < NOPTS; i++) {
            opts[i].name = opt_table[i].name;
            opts[i].has_arg = opt_table[i].kind == K_FLAG ? no_argument
                                                          : required_argument;
            opts[i].val = 256 + i;
        }
        opts[NOPTS].name = "help";
        opts[NOPTS].val = 'h';
    }
    return opts;
}

/* ---- The words --------------------------------------------------------- */

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
        return tool_usage_error(want == 3 ? "ban takes RULE KEY DURATION"
                                : want == 2 ? "unban takes RULE KEY"
                                : "unexpected argument",
                                n > want ? (t->arg3 ? t->arg3 : t->arg2
                                            ? t->arg2 : t->key) : NULL);
    }
    return 0;
}

/* A positional word: the command, then KEY and two more. */
static int positional(tool_t *t, const char *w)
{
    const char **slot[4] = { &t->cmd, &t->key, &t->arg2, &t->arg3 };
    int i;

    for (i = 0; i < 4; i++) {
        if (!*slot[i]) {
            *slot[i] = w;
            return 0;
        }
    }
    return tool_usage_error("unexpected argument", w);
}

static void defaults(tool_t *t)
{
    memset(t, 0, sizeof(*t));
    strcpy(t->url, TB_DEFAULT_URL);
    strcpy(t->prefix, "rl:");
    t->timeout_ms = DEFAULT_TIMEOUT_MS;
    t->interval_ms = 1000;
    t->engine = -1;
    t->cost = 1;
    t->ban_limit = TOOL_BANS_LIMIT;
}

/* What the words say, once the options are read. */
static int finish(tool_t *t)
{
    const char *env;
    int rc;

    if (!t->cmd) {
        return tool_usage_error("no command", NULL);
    }
    /* For bans, --rule names a TBucketRule to list, not a shim rule. */
    if (strcmp(t->cmd, "bans") == 0 && t->rule) {
        if (!tb_name_valid(t->rule)) {
            return tool_usage_error("--rule", "bad rule name");
        }
        t->ban_rule = t->rule;
        t->rule = NULL;
    }
    if (t->ban_key && !*t->ban_key) {
        return tool_usage_error("--key", "empty");
    }
    if (!t->config && (env = getenv("TBUCKET_CONFIG")) != NULL && *env) {
        t->config = env;
    }
    if (t->rule && !t->config) {
        return tool_usage_error("--rule", "needs --config or "
                                "$TBUCKET_CONFIG");
    }
    if (t->config && (rc = load_config(t)) != 0) {
        return rc;
    }
    if (!t->key && t->rule_key[0]) {
        t->key = t->rule_key;
    }
    if ((rc = check_positionals(t)) != 0 || strcmp(t->cmd, "bans") == 0) {
        return rc;
    }
    if (!t->key || !*t->key) {
        return tool_usage_error(strcmp(t->cmd, "top") == 0
                                ? "top needs the status page's URL"
                                : "a KEY is required", NULL);
    }
    return 0;
}

int tool_parse_args(tool_t *t, int argc, char **argv)
{
    int c, rc;

    defaults(t);
    opterr = 0;
    while ((c = getopt_long(argc, argv, "+qh", long_opts(), NULL)) != -1
           || optind < argc) {
        if (c == -1) {
            /* A positional word; options may follow it. */
            if ((rc = positional(t, argv[optind++])) != 0) {
                return rc;
            }
            continue;
        }
        if (c == 'h') {
            tool_usage(stdout);
            exit(0);
        }
        if (c == 'q') {
            t->quiet = 1;
            continue;
        }
        if (c < 256 || c >= 256 + NOPTS) {
            return tool_usage_error("bad option", argv[optind - 1]);
        }
        if ((rc = set_value(t, &opt_table[c - 256], optarg)) != 0) {
            return rc;
        }
    }
    return finish(t);
}
