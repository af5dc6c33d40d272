/* tbucket_config.c -- mod_tbucket's directives.
 *
 * The directive table and its handlers. The handlers validate every value
 * with the core's parsers at config time, so the request path never
 * parses; a bad value is refused with a message naming the directive and
 * the value. The records they fill, with their create and merge
 * functions, are tbucket_records.c's; what can only be judged once scopes
 * are merged is checked in tbucket_check.c. Every section that sets
 * TBucketLimit is also a rule, named by the sections around it as a
 * local scope is, so that the status page can count each rule's
 * decisions; the rules of the configuration being read are listed here
 * and given their records in the segment in post_config.
 *
 * docs/reference.txt is the manual of every directive (the man page
 * mod_tbucket(5) is made from it); the help string of each entry below
 * is its one-line summary, with an example.
 */
#include "apr_hash.h"
#include "apr_lib.h"
#include "apr_strings.h"

#include "httpd.h"
#include "http_config.h"
#include "http_core.h"
#include "http_log.h"

#include "mod_tbucket.h"

APLOG_USE_MODULE(tbucket);

/* The rules of the configuration being read (pconf). */
static apr_array_header_t *rules;

static tbucket_srv_conf *srv_conf(const server_rec *s)
{
    return ap_get_module_config(s->module_config, &tbucket_module);
}

/* ---- Sections: names of local scopes and rules ---------------------- */

const char *tbucket_section_name(cmd_parms *cmd,
                                 const apr_array_header_t *taken)
{
    const ap_directive_t *d;
    const char *name = NULL, *unique;
    int i, dup = 1;

    for (d = cmd->directive ? cmd->directive->parent : NULL; d;
         d = d->parent) {
        const char *sec = apr_pstrcat(cmd->temp_pool, d->directive, " ",
                                      d->args ? d->args : "", NULL);

        name = name ? apr_pstrcat(cmd->temp_pool, sec, " ", name, NULL)
                    : sec;
    }
    name = name ? name : "server";
    if (strlen(name) > TBUCKET_NAME_LEN - 8) {
        name = apr_pstrmemdup(cmd->temp_pool, name, TBUCKET_NAME_LEN - 8);
    }
    unique = name;
    for (i = 0; taken && i < taken->nelts; i++) {
        if (!strcmp(*APR_ARRAY_IDX(taken, i, const char *const *), unique)) {
            unique = apr_psprintf(cmd->temp_pool, "%s #%d", name, ++dup);
            i = -1;
        }
    }
    return unique;
}

void tbucket_scopes_pre_config(apr_pool_t *pconf)
{
    rules = apr_array_make(pconf, 8, sizeof(tbucket_scope_counter *));
}

const tbucket_scope_counter *tbucket_scope_record(cmd_parms *cmd,
                                         const tbucket_dir_conf *dc)
{
    tbucket_scope_counter *ru;

    if (ap_check_cmd_context(cmd, NOT_IN_HTACCESS) || !rules) {
        return NULL;
    }
    if (dc->rule) {
        return dc->rule;
    }
    ru = apr_pcalloc(cmd->pool, sizeof(*ru));
    ru->name = apr_pstrdup(cmd->pool, tbucket_section_name(cmd, rules));
    ru->slot = -1;
    APR_ARRAY_PUSH(rules, tbucket_scope_counter *) = ru;
    return ru;
}

void tbucket_scopes_setup(server_rec *main_s)
{
    int i;

    for (i = 0; rules && i < rules->nelts; i++) {
        tbucket_scope_counter *ru = APR_ARRAY_IDX(rules, i,
                                                  tbucket_scope_counter *);

        ru->slot = tbucket_shm_scope_slot(ru->name);
        if (ru->slot < 0) {
            ap_log_error(APLOG_MARK, APLOG_WARNING, 0, main_s, TBLOGNO(00161)
                         "TBucketLimit in %s: no record left for its "
                         "counts on the status page (256 rules at most)",
                         ru->name);
        }
    }
}

/* ---- Directive handlers --------------------------------------------- */

/* Lookups made by the parse tbucket_expr_constant runs. Static: the
 * configuration is read by one thread, and ap_expr's lookup function
 * takes no context of its own. */
static int expr_lookups;

static int count_lookup(ap_expr_lookup_parms *parms)
{
    expr_lookups++;
    return ap_expr_lookup_default(parms);
}

/* Every variable and function of a string expression (%{REMOTE_ADDR},
 * %{md5:...}, %{FORM:log}) is resolved through the lookup function when
 * it is parsed: none resolved means nothing of the request is read. */
int tbucket_expr_constant(cmd_parms *cmd, const char *expr)
{
    ap_expr_info_t *info = apr_pcalloc(cmd->temp_pool, sizeof(*info));
    const char *err;

    /* An empty key stands for the client's address. */
    if (!*expr) {
        return 0;
    }
    info->filename = cmd->directive ? cmd->directive->filename : "";
    info->line_number = cmd->directive ? cmd->directive->line_num : 0;
    info->flags = AP_EXPR_FLAG_STRING_RESULT;
    info->module_index = APLOG_MODULE_INDEX;
    expr_lookups = 0;
    err = ap_expr_parse(cmd->temp_pool, cmd->temp_pool, info, expr,
                        count_lookup);
    return !err && expr_lookups == 0;
}

/* "N | Off" with N in 1..max: *n is 0 for Off. */
static const char *int_or_off(cmd_parms *cmd, const char *what,
                              const char *arg, int64_t max, int64_t *n)
{
    const char *msg;

    *n = 0;
    if (!strcasecmp(arg, "off")) {
        return NULL;
    }
    msg = tbucket_int_value(cmd, what, arg, 1, max, n);
    return msg ? apr_pstrcat(cmd->pool, msg, " (or Off)", NULL) : NULL;
}

/* ---- Scalars: one value, one field --------------------------------- */

/* A directive that sets one field of a record from one word, as
 * httpd's ap_set_int_slot does: the table entry's cmd->info is a
 * tbucket_value (tbucket_options.c reads it), its name what the value is
 * called in messages. */
static const char *const mode_names[] = { "enforce", "shadow" };
static const char *const header_names[] = { "legacy", "ietf", "both",
                                            "off" };

#define SRV(f) APR_OFFSETOF(tbucket_srv_conf, f)
#define DIR(f) APR_OFFSETOF(tbucket_dir_conf, f)

static const tbucket_value sc_policy = {
    "policy", TBUCKET_V_NAME, TBUCKET_AT_INT, SRV(policy),
    TBUCKET_SET_POLICY, 0, TB_POLICY_COUNT, 0, tb_policy_names, NULL,
    NULL, NULL
};
static const tbucket_value sc_replicas = {
    "replica count", TBUCKET_V_INT, TBUCKET_AT_INT, SRV(replicas),
    TBUCKET_SET_REPLICAS, 1, 100000, 0, NULL, NULL, NULL, NULL
};
static const tbucket_value sc_ipv6 = {
    "IPv6 prefix length", TBUCKET_V_INT, TBUCKET_AT_INT, SRV(ipv6_bits),
    TBUCKET_SET_IPV6, 1, 128, 0, NULL, NULL, NULL, NULL
};

const char *const tbucket_refusal_log_names[TBUCKET_REFUSAL_LOGS] = {
    "off", "notice", "info", "debug"
};

static const tbucket_value sc_refusal_log = {
    "level", TBUCKET_V_NAME, TBUCKET_AT_INT, SRV(refusal_log),
    TBUCKET_SET_REFUSAL_LOG, 0, TBUCKET_REFUSAL_LOGS, 0,
    tbucket_refusal_log_names, NULL, NULL, NULL
};
static const tbucket_value sc_shed_retry = {
    "seconds", TBUCKET_V_INT, TBUCKET_AT_INT, SRV(shed_retry_s),
    TBUCKET_SET_SHED_RETRY, 1, 86400, 0, NULL, NULL, NULL, NULL
};
static const tbucket_value sc_mode = {
    "mode", TBUCKET_V_NAME, TBUCKET_AT_INT, DIR(shadow), 0, 0, 2, 0,
    mode_names, NULL, NULL, NULL
};
static const tbucket_value sc_algorithm = {
    "algorithm", TBUCKET_V_NAME, TBUCKET_AT_INT, DIR(algo), 0, 0,
    TB_ALGO_COUNT, 0, tb_algo_names, NULL, NULL, NULL
};
static const tbucket_value sc_headers = {
    "header style", TBUCKET_V_NAME, TBUCKET_AT_INT, DIR(headers), 0, 0, 4,
    0, header_names, NULL, NULL, NULL
};
static const tbucket_value sc_shards = {
    "shard count", TBUCKET_V_INT, TBUCKET_AT_INT, DIR(shards), 0, 1,
    TB_MAX_SHARDS, 0, NULL, NULL, NULL, NULL
};
static const tbucket_value sc_priority = {
    "priority", TBUCKET_V_NAME, TBUCKET_AT_INT, DIR(priority), 0, 0,
    TBUCKET_PRIOS, 0, tbucket_priority_names, NULL,
    "expected critical, high, normal or low", NULL
};

static const char *set_srv_scalar(cmd_parms *cmd, void *dummy,
                                  const char *arg)
{
    const tbucket_value *d = cmd->info;
    tbucket_srv_conf *sc = srv_conf(cmd->server);
    const char *msg = tbucket_value_store(cmd, d, sc, arg);

    (void)dummy;
    if (!msg) {
        sc->set |= d->set;
    }
    return msg;
}

static const char *set_dir_scalar(cmd_parms *cmd, void *dcv,
                                  const char *arg)
{
    TBUCKET_HTACCESS_CHECK(cmd);
    return tbucket_value_store(cmd, cmd->info, dcv, arg);
}

static const char *set_prefix(cmd_parms *cmd, void *dummy, const char *arg)
{
    tbucket_srv_conf *sc = srv_conf(cmd->server);

    (void)dummy;
    /* Room is kept for the "ip:" of fallback keys. */
    if (!tb_prefix_valid(arg) || strlen(arg) > TB_PREFIX_MAX - 3) {
        return tbucket_bad_value(cmd, "prefix", arg,
                         "1..61 printable characters without spaces or "
                         "braces");
    }
    sc->prefix = apr_pstrdup(cmd->pool, arg);
    sc->ip_prefix = apr_pstrcat(cmd->pool, arg, "ip:", NULL);
    sc->set |= TBUCKET_SET_PREFIX;
    return NULL;
}

const char *tbucket_parse_limit(cmd_parms *cmd, const char *cap,
                                const char *rate, tb_limit_t *lim)
{
    int64_t n;
    const char *msg = tbucket_int_value(cmd, "capacity", cap, 1,
                                (int64_t)TB_MAX_CAPACITY, &n);
    char err[128];

    if (msg) {
        return msg;
    }
    lim->capacity = (double)n;
    if (tb_parse_rate(rate, &lim->rate_per_sec, err, sizeof(err)) != TB_OK) {
        return tbucket_bad_value(cmd, "rate", rate, err);
    }
    if (tb_limit_check(lim, err, sizeof(err)) != TB_OK) {
        return tbucket_bad_value(cmd, "limit",
                         apr_pstrcat(cmd->temp_pool, cap, " ", rate, NULL),
                         err);
    }
    return NULL;
}

/* httpd's ap_expr scanner (2.4) calls exit() -- "flex scanner jammed" --
 * on a quote inside the argument of %{NAME:arg}, taking `apache2 -t` down
 * without naming the line. Refuse that form ourselves, with the directive
 * named, before the scanner sees it. */
const char *tbucket_quote_in_var_arg(const char *arg)
{
    const char *p = arg;

    while ((p = strstr(p, "%{")) != NULL) {
        const char *end = strchr(p, '}');
        const char *colon = strchr(p, ':');

        if (!end) {
            break;
        }
        if (colon && colon < end
            && (memchr(colon, '\'', (size_t)(end - colon))
                || memchr(colon, '"', (size_t)(end - colon)))) {
            return p;
        }
        p = end + 1;
    }
    return NULL;
}

static const char *set_enable(cmd_parms *cmd, void *dcv, int on)
{
    TBUCKET_HTACCESS_CHECK(cmd);
    ((tbucket_dir_conf *)dcv)->enable = on;
    return NULL;
}

static const char *set_key(cmd_parms *cmd, void *dcv, const char *arg)
{
    tbucket_dir_conf *dc = dcv;
    const char *err = NULL;

    TBUCKET_HTACCESS_CHECK(cmd);

    if (tbucket_quote_in_var_arg(arg)) {
        return apr_psprintf(cmd->pool, "TBucketKey: cannot parse "
                            "expression '%s': a quote inside %%{NAME:arg} "
                            "(httpd's expression scanner cannot take it)",
                            arg);
    }

    /* DONT_VARY: the key must not add "Vary: X-API-Key" to responses. */
    dc->key = ap_expr_parse_cmd(cmd, arg, AP_EXPR_FLAG_STRING_RESULT
                                | AP_EXPR_FLAG_DONT_VARY, &err, NULL);
    if (err || !dc->key) {
        return apr_psprintf(cmd->pool, "TBucketKey: cannot parse "
                            "expression '%s': %s", arg,
                            err ? err : "unknown error");
    }
    dc->key_late = tbucket_key_is_late(arg);
    dc->key_is_addr = !strcasecmp(arg, "%{REMOTE_ADDR}")
                      || !strcasecmp(arg, "%{CONN_REMOTE_ADDR}");
    dc->key_const = tbucket_expr_constant(cmd, arg);
    dc->key_set = 1;
    return NULL;
}

static const char *set_cost(cmd_parms *cmd, void *dcv, const char *arg)
{
    tbucket_dir_conf *dc = dcv;
    int64_t n;
    const char *msg = tbucket_int_value(cmd, "cost", arg, 0,
                                (int64_t)TB_MAX_CAPACITY, &n);

    TBUCKET_HTACCESS_CHECK(cmd);

    if (msg) {
        return msg;
    }
    dc->cost = (double)n;
    dc->cost_set = 1;
    return NULL;
}

static const char *set_tenant(cmd_parms *cmd, void *dcv, const char *key,
                              const char *cap, const char *rate)
{
    tbucket_dir_conf *dc = dcv;
    tb_limit_t *lim = apr_palloc(cmd->pool, sizeof(*lim));
    const char *msg;

    TBUCKET_HTACCESS_CHECK(cmd);

    if (!*key) {
        return "TBucketTenant: the tenant key must not be empty";
    }
    if ((msg = tbucket_parse_limit(cmd, cap, rate, lim))) {
        return msg;
    }
    if (!dc->tenants) {
        dc->tenants = apr_hash_make(cmd->pool);
    }
    if (apr_hash_get(dc->tenants, key, APR_HASH_KEY_STRING)) {
        return apr_psprintf(cmd->pool, "TBucketTenant: tenant '%s' is "
                            "already set in this scope", key);
    }
    apr_hash_set(dc->tenants, apr_pstrdup(cmd->pool, key),
                 APR_HASH_KEY_STRING, lim);
    return NULL;
}

/* "N [ttl=DURATION] | Off", the form TBucketLease and TBucketConcurrency
 * share: N in 1..max_n, the ttl in 1..max_ttl_ms, stored in the two int
 * fields of tbucket_dir_conf at n_field and ttl_field. */
typedef struct tbucket_n_ttl {
    const char *usage;                /* The answer to an empty line.   */
    const char *what;                 /* N, in messages.                */
    int64_t max_n;
    int dflt_ttl_ms;
    apr_size_t n_field;
    const tbucket_value *opts;        /* ttl=, into its field.          */
} tbucket_n_ttl;

/* The handler of both: cmd->info is the directive's tbucket_n_ttl. N
 * gets 0 for Off, else N; the ttl the one given, or the default. */
static const char *set_n_ttl(cmd_parms *cmd, void *dcv, const char *args)
{
    const tbucket_n_ttl *f = cmd->info;
    int *n = (int *)((char *)dcv + f->n_field);
    int *ttl_ms = (int *)((char *)dcv + f->opts[0].off);
    const char *n_arg = ap_getword_conf(cmd->temp_pool, &args);
    const char *msg;
    int64_t v;

    TBUCKET_HTACCESS_CHECK(cmd);

    if (!*n_arg) {
        return f->usage;
    }
    *ttl_ms = f->dflt_ttl_ms;
    if (!strcasecmp(n_arg, "off")) {
        *n = 0;
        return *args ? apr_psprintf(cmd->pool, "%s: Off takes no options",
                                    cmd->cmd->name) : NULL;
    }
    if ((msg = tbucket_int_value(cmd, f->what, n_arg, 1, f->max_n, &v))) {
        return msg;
    }
    *n = (int)v;
    return tbucket_options(cmd, f->opts, dcv, NULL, args, NULL);
}

static const tbucket_value lease_opts[] = {
    { "ttl", TBUCKET_V_DURATION, TBUCKET_AT_INT, DIR(lease_ttl_ms), 0, 1,
      60000, TB_DURATION_BARE_MS, NULL, "DURATION", NULL, NULL },
    { NULL }
};

static const tbucket_value concurrency_opts[] = {
    { "ttl", TBUCKET_V_DURATION, TBUCKET_AT_INT, DIR(concurrency_ttl_ms), 0,
      1, TB_MAX_CONCURRENCY_TTL_MS, TB_DURATION_BARE_MS, NULL, "DURATION",
      NULL, NULL },
    { NULL }
};

/* TBucketLease N [ttl=DURATION] | Off. */
static const tbucket_n_ttl lease_form = {
    "TBucketLease: expected the tokens per lease, e.g. TBucketLease 20 "
    "ttl=1s (or Off)", "lease size", 1000000, 1000, DIR(lease), lease_opts
};


/* TBucketCostHeader NAME | Off: NAME is an HTTP field name (a token). */
static const char *set_cost_header(cmd_parms *cmd, void *dcv,
                                   const char *arg)
{
    tbucket_dir_conf *dc = dcv;
    const char *p;

    TBUCKET_HTACCESS_CHECK(cmd);

    if (!strcasecmp(arg, "off")) {
        dc->cost_header = "";
        return NULL;
    }
    for (p = arg; *p; p++) {
        if (!apr_isalnum(*p) && !strchr("!#$%&'*+-.^_`|~", *p)) {
            break;
        }
    }
    if (!*arg || *p || p - arg > 64) {
        return tbucket_bad_value(cmd, "header name", arg,
                         "expected a response header name of 1..64 "
                         "letters, digits or !#$%&'*+-.^_`|~, or Off");
    }
    dc->cost_header = apr_pstrdup(cmd->pool, arg);
    return NULL;
}

/* TBucketConcurrency N [ttl=DURATION] | Off. */
static const tbucket_n_ttl concurrency_form = {
    "TBucketConcurrency: expected the requests in flight per key, e.g. "
    "TBucketConcurrency 4 ttl=60s (or Off)", "limit", TB_MAX_CONCURRENCY,
    TB_CONCURRENCY_TTL_MS, DIR(concurrency), concurrency_opts
};

/* ---- Local protection ----------------------------------------------- */

/* TBucketLocalConcurrency auto [min=N] [max=N]: the cap sets itself
 * from latency (shared/tables/tb_adapt.c); max 0 stands for the
 * server's MaxRequestWorkers, known in post_config. */
typedef struct local_bounds {
    int lo, hi;
} local_bounds;

static const tbucket_value local_auto_opts[] = {
    { "min", TBUCKET_V_INT, TBUCKET_AT_INT, APR_OFFSETOF(local_bounds, lo),
      0, 1, TBUCKET_MAX_LOCAL_LIMIT, 0, NULL, "N", NULL, NULL },
    { "max", TBUCKET_V_INT, TBUCKET_AT_INT, APR_OFFSETOF(local_bounds, hi),
      0, 1, TBUCKET_MAX_LOCAL_LIMIT, 0, NULL, "N", NULL, NULL },
    { NULL }
};

static const char *local_auto(cmd_parms *cmd, tbucket_dir_conf *dc,
                              const char *args)
{
    local_bounds b = { 1, 0 };
    const char *msg = tbucket_options(cmd, local_auto_opts, &b, NULL, args,
                                      NULL);

    if (msg) {
        return msg;
    }
    if (b.hi && b.lo > b.hi) {
        return apr_psprintf(cmd->pool, "TBucketLocalConcurrency auto: "
                            "min=%d is more than max=%d", b.lo, b.hi);
    }
    dc->local_state = 1;
    dc->nlocal = 1;
    dc->local[0] = tbucket_local_scope_add(cmd, b.hi, b.lo);
    return NULL;
}

/* TBucketLocalConcurrency N | auto [min=N] [max=N] | Off. Not in
 * .htaccess: a scope's places are made in shared memory when the server
 * starts, and an .htaccess file is read per request, long after. */
static const char *set_local_concurrency(cmd_parms *cmd, void *dcv,
                                         const char *args)
{
    tbucket_dir_conf *dc = dcv;
    const char *first = ap_getword_white(cmd->temp_pool, &args), *msg;
    int64_t n;

    if (!strcasecmp(first, "auto")) {
        return local_auto(cmd, dc, args);
    }
    if (*args) {
        return apr_psprintf(cmd->pool, "TBucketLocalConcurrency: expected "
                            "N, auto [min=N] [max=N] or Off, not '%s %s'",
                            first, args);
    }
    msg = int_or_off(cmd, "limit", first, TBUCKET_MAX_LOCAL_LIMIT, &n);
    if (msg) {
        return apr_pstrcat(cmd->pool, msg, "; or auto [min=N] [max=N]",
                           NULL);
    }
    dc->local_state = n > 0;
    dc->nlocal = n > 0;
    if (n > 0) {
        dc->local[0] = tbucket_local_scope_add(cmd, (int)n, 0);
    }
    return NULL;
}


/* TBucketPriority critical|high|normal|low. In .htaccess it may only
 * lower a request's priority: whoever writes an .htaccess file (a
 * shared-hosting customer) must not be able to put their own site ahead
 * of everyone else's when the server sheds, which high and critical
 * would. The merge takes the lower of the two (tbucket_records.c). */
static const char *set_priority(cmd_parms *cmd, void *dcv, const char *arg)
{
    tbucket_dir_conf *dc = dcv;
    const char *msg = tbucket_value_store(cmd, &sc_priority, dc, arg);

    TBUCKET_HTACCESS_CHECK(cmd);

    dc->prio_lowered = ap_check_cmd_context(cmd, NOT_IN_HTACCESS) != NULL;
    return msg;
}

static const char *shed_critical(cmd_parms *cmd, void *rec,
                                 const char *value)
{
    (void)cmd;
    (void)rec;
    (void)value;
    return "TBucketShed: critical requests are never shed; set low=, "
           "normal= and/or high=";
}

/* TBucketShed low=P normal=P high=P | Off: P the busy share, 1..100 %,
 * at which that level is shed. */
static const tbucket_value shed_opts[] = {
    { "low", TBUCKET_V_INT, TBUCKET_AT_INT,
      SRV(shed_pct) + TBUCKET_PRIO_LOW * sizeof(int), 0, 1, 100, 0, NULL,
      "P", "a percentage of busy workers, 1..100", NULL },
    { "normal", TBUCKET_V_INT, TBUCKET_AT_INT,
      SRV(shed_pct) + TBUCKET_PRIO_NORMAL * sizeof(int), 0, 1, 100, 0, NULL,
      "P", "a percentage of busy workers, 1..100", NULL },
    { "high", TBUCKET_V_INT, TBUCKET_AT_INT,
      SRV(shed_pct) + TBUCKET_PRIO_HIGH * sizeof(int), 0, 1, 100, 0, NULL,
      "P", "a percentage of busy workers, 1..100", NULL },
    { "critical", TBUCKET_V_FN, TBUCKET_AT_INT, 0, 0, 0, 0, 0, NULL, NULL,
      NULL, shed_critical },
    { NULL }
};

static const char *set_shed(cmd_parms *cmd, void *dummy, const char *args)
{
    tbucket_srv_conf *sc = srv_conf(cmd->server);
    const char *rest = args, *msg;
    int i, seen = 0;

    (void)dummy;
    memset(sc->shed_pct, 0, sizeof(sc->shed_pct));
    sc->shed_min = 0;
    if (!strcasecmp(ap_getword_conf(cmd->temp_pool, &rest), "off")
        && !*rest) {
        sc->set |= TBUCKET_SET_SHED;
        return NULL;
    }
    if ((msg = tbucket_options(cmd, shed_opts, sc, NULL, args, &seen))) {
        return msg;
    }
    if (!seen) {
        return "TBucketShed: expected low=P normal=P high=P (percent of "
               "busy workers), e.g. TBucketShed low=50 normal=80 high=95, "
               "or Off";
    }
    for (i = 0; i < TBUCKET_PRIOS; i++) {
        if (sc->shed_pct[i] && (!sc->shed_min
                                || sc->shed_pct[i] < sc->shed_min)) {
            sc->shed_min = sc->shed_pct[i];
        }
    }
    sc->set |= TBUCKET_SET_SHED;
    return NULL;
}

/* TBucketTopKeys K | Off: one table for the whole server (its entries
 * name their virtual host), so the main server's configuration only. */
static const char *set_top_keys(cmd_parms *cmd, void *dummy,
                                const char *arg)
{
    const char *msg = ap_check_cmd_context(cmd, GLOBAL_ONLY);
    int64_t n;

    (void)dummy;
    if (!msg && !(msg = int_or_off(cmd, "key count", arg, TB_TOPK_MAX_K,
                                   &n))) {
        srv_conf(cmd->server)->top_k = (int)n;
    }
    return msg;
}

/* In .htaccess the scope directives need AllowOverride Limit (or an
 * AllowOverrideList naming them). They are registered for every
 * AllowOverride class and say so themselves (TBUCKET_HTACCESS_CHECK):
 * httpd's own refusal, "not allowed here", names neither. */
#define DIR_SCOPE (RSRC_CONF | ACCESS_CONF | OR_ALL)

const command_rec tbucket_cmds[] = {
    AP_INIT_RAW_ARGS("TBucketRedis", tbucket_set_redis, NULL, RSRC_CONF,
                     "Redis URL and options, e.g. redis://127.0.0.1:6379 "
                     "timeout=50 connect_timeout=100 pool=4 engine=auto, or "
                     "rediss://redis.example:6380 tls_ca=/etc/ssl/ca.pem"),
    AP_INIT_TAKE1("TBucketFailurePolicy", set_srv_scalar, (void *)&sc_policy, RSRC_CONF,
                  "What decides when Redis cannot: open, closed or local"),
    AP_INIT_TAKE1("TBucketReplicas", set_srv_scalar, (void *)&sc_replicas, RSRC_CONF,
                  "Replicas sharing the limit, for the local policy, e.g. 3"),
    AP_INIT_RAW_ARGS("TBucketBreaker", tbucket_set_breaker, NULL, RSRC_CONF,
                     "Circuit breaker, e.g. threshold=5 cooldown=10s"),
    AP_INIT_TAKE1("TBucketPrefix", set_prefix, NULL, RSRC_CONF,
                  "Redis key prefix, e.g. rl:"),
    AP_INIT_TAKE1("TBucketIPv6Prefix", set_srv_scalar, (void *)&sc_ipv6, RSRC_CONF,
                  "Bits of an IPv6 client address that key its bucket, "
                  "1..128 (default 64: one subscriber's network)"),
    AP_INIT_FLAG("TBucketEnable", set_enable, NULL, DIR_SCOPE,
                 "On to limit requests in this scope"),
    AP_INIT_TAKE1("TBucketKey", set_key, NULL, DIR_SCOPE,
                  "Client key expression, e.g. \"%{HTTP:X-API-Key}\""),
    AP_INIT_RAW_ARGS("TBucketLimit", tbucket_set_limit, NULL, DIR_SCOPE,
                     "A bucket of this scope: CAPACITY RATE (keyed by "
                     "TBucketKey), or NAME CAPACITY RATE [key=EXPR] "
                     "[cost=N] [count=STATUS,...] [ban=DURATION] "
                     "[known=DURATION] [known-by=cookie|address] for one "
                     "more, e.g. user 5 1/m key=%{FORMLOGIN:log} "
                     "count=200 ban=15m; NAME Off removes an outer one"),
    AP_INIT_RAW_ARGS("TBucketRule", tbucket_set_rule, NULL, DIR_SCOPE,
                     "Alias of TBucketLimit NAME CAPACITY RATE key=KEY "
                     "[options]: NAME KEY CAPACITY RATE [cost=N] "
                     "[count=STATUS,...] [ban=DURATION], or NAME Off"),
    AP_INIT_TAKE1("TBucketFormLimit", tbucket_set_form_limit, NULL,
                  DIR_SCOPE, "Bytes of a form body %{FORM:field} reads at "
                  "most, e.g. 8192 (the default)"),
    AP_INIT_TAKE1("TBucketFormTimeout", tbucket_set_form_timeout, NULL,
                  DIR_SCOPE, "How long %{FORM:field} waits for the body "
                  "before its fields share one key, e.g. 2s (the "
                  "default)"),
    AP_INIT_TAKE1("TBucketCost", set_cost, NULL, DIR_SCOPE,
                  "Tokens per request in this scope, e.g. 10"),
    AP_INIT_TAKE3("TBucketTenant", set_tenant, NULL, DIR_SCOPE,
                  "A tenant's own limit, e.g. key-123 1000 100/s"),
    AP_INIT_TAKE3("TBucketRouteLimit", tbucket_set_route, NULL, DIR_SCOPE,
                  "Alias of TBucketLimit NAME CAPACITY RATE, e.g. export "
                  "5 1/m"),
    AP_INIT_TAKE1("TBucketMode", set_dir_scalar, (void *)&sc_mode, DIR_SCOPE,
                  "enforce, or shadow to decide and count without "
                  "rejecting"),
    AP_INIT_TAKE1("TBucketAlgorithm", set_dir_scalar, (void *)&sc_algorithm, DIR_SCOPE,
                  "token-bucket (default), gcra, sliding-window, "
                  "fixed-window or sliding-log"),
    AP_INIT_TAKE1("TBucketHeaders", set_dir_scalar, (void *)&sc_headers, DIR_SCOPE,
                  "Response headers: legacy, ietf, both or off"),
    AP_INIT_RAW_ARGS("TBucketLease", set_n_ttl, (void *)&lease_form,
                     DIR_SCOPE,
                     "Tokens taken per Redis call and spent locally, e.g. "
                     "20 ttl=1s, or Off"),
    AP_INIT_TAKE1("TBucketCostHeader", set_cost_header, NULL, DIR_SCOPE,
                  "Response header carrying the real cost to settle, e.g. "
                  "X-Request-Cost, or Off"),
    AP_INIT_TAKE1("TBucketShards", set_dir_scalar, (void *)&sc_shards, DIR_SCOPE,
                  "Split each key's buckets into K sub-buckets, e.g. 8"),
    AP_INIT_RAW_ARGS("TBucketConcurrency", set_n_ttl,
                     (void *)&concurrency_form, DIR_SCOPE,
                     "Requests of one key in flight at once, e.g. 4 "
                     "ttl=60s, or Off"),
    AP_INIT_RAW_ARGS("TBucketLocalConcurrency", set_local_concurrency,
                     NULL, RSRC_CONF | ACCESS_CONF,
                     "Requests of this scope in flight on this server at "
                     "once, all children together, e.g. 8, auto (set "
                     "from latency) [min=N] [max=N], or Off"),
    AP_INIT_RAW_ARGS("TBucketCPUPriority", tbucket_cpu_set, NULL, RSRC_CONF,
                     "Run a request's worker thread at its priority's nice "
                     "step while it serves it: On [low=N] [normal=N] "
                     "[high=N] [critical=N] (N from -20 to 19; low=10 "
                     "unless given), or Off (default)"),
    AP_INIT_TAKE1("TBucketPriority", set_priority, NULL, DIR_SCOPE,
                  "critical, high, normal (default) or low: which requests "
                  "TBucketShed sheds first"),
    AP_INIT_RAW_ARGS("TBucketShed", set_shed, NULL, RSRC_CONF,
                     "Shed requests by priority at these shares of busy "
                     "workers, e.g. low=50 normal=80 high=95, or Off"),
    AP_INIT_TAKE1("TBucketShedRetryAfter", set_srv_scalar,
                  (void *)&sc_shed_retry, RSRC_CONF,
                  "Retry-After of a shed or locally refused request, in "
                  "seconds, e.g. 2 (default 1)"),
    AP_INIT_TAKE1("TBucketTopKeys", set_top_keys, NULL, RSRC_CONF,
                  "Keys shown on the status page by refusals and by "
                  "decisions, 1..1000 (default 20), or Off"),
    AP_INIT_TAKE12("TBucketSecret", tbucket_set_secret, NULL, RSRC_CONF,
                   "The file of the key that signs known clients' cookies "
                   "(at least 32 bytes, not readable by others), and the "
                   "previous one while it is rotated out"),
    AP_INIT_TAKE1("TBucketRefusalLog", set_srv_scalar,
                  (void *)&sc_refusal_log, RSRC_CONF,
                  "Level of the line logged for each refusal: off, notice, "
                  "info (default) or debug"),
    { NULL }
};
