/* mod_tbucket.c -- shared Redis token-bucket rate limits for Apache httpd.
 *
 * Every replica of a server checks and deducts the same buckets in Redis,
 * through libtb (shared/tb.h), in one round trip per request, so a
 * client's limit does not depend on how many replicas there are. This file
 * holds the directives, the configuration records and their merges, and
 * the hooks; the counters and the status page are in tbucket_status.c.
 *
 * Server and virtual-host scope (a virtual host inherits what it does not
 * set):
 *
 *   TBucketRedis URL [timeout=MS] [connect_timeout=MS] [pool=N]
 *       redis://[user:password@]host[:port][/db] or unix:/path[?db=N].
 *       Default redis://127.0.0.1:6379, timeout 50 ms, connect timeout the
 *       same, pool 1 connection per child under prefork and 4 per child
 *       under threaded MPMs.
 *   TBucketFailurePolicy open|closed|local     (default open)
 *       What answers when Redis cannot: allow, refuse with 429, or decide
 *       on a bucket of capacity/N and rate/N kept in shared memory.
 *   TBucketReplicas N                          (default 1; the N above)
 *   TBucketBreaker threshold=N cooldown=DURATION  (default 5 and 10s)
 *   TBucketPrefix STRING                       (default "rl:")
 *
 * Directory scope (<VirtualHost>, <Location>, <Directory>, <If>, and
 * .htaccess under AllowOverride Limit), merged from outer to inner:
 *
 *   TBucketEnable On|Off                       (default Off)
 *   TBucketKey EXPR
 *       An ap_expr string, e.g. "%{HTTP:X-API-Key}". Default and fallback
 *       for an empty result: the client IP (r->useragent_ip, so
 *       mod_remoteip applies). A fallback IP is kept in its own key space
 *       ("<prefix>ip:{IP}") so that no client can name another client's
 *       IP bucket through the key header. A key that mentions REMOTE_USER
 *       or AUTH_TYPE is evaluated after authentication.
 *   TBucketLimit CAPACITY RATE                 RATE: N/s, N/m, N/h or N
 *   TBucketCost N                              (default 1)
 *       Tokens each request takes from every bucket it passes.
 *   TBucketTenant KEY CAPACITY RATE            (repeatable)
 *       The main bucket's limit for the client whose key is KEY.
 *   TBucketRouteLimit NAME CAPACITY RATE       (repeatable)
 *       An extra bucket "<prefix>{key}:route:NAME", decided with the main
 *       bucket in the same Redis call: all are deducted or none is.
 *   TBucketMode enforce|shadow                 (default enforce)
 *   TBucketHeaders legacy|ietf|both|off        (default legacy)
 *
 *   SetHandler tbucket-status                  Prometheus counters.
 *
 * A limited request is counted once, however many sub-requests, internal
 * redirects (PHP through mod_actions) or ErrorDocument redirects it makes.
 * Rejected requests get 429, Retry-After in whole seconds (at least 1) and
 * {"error":"rate limited","retry_after":N} unless ErrorDocument 429 is
 * set. A cost that can never fit a bucket gets 403 with a body saying so.
 * TBUCKET_DECISION and TBUCKET_REMAINING are set in the environment of the
 * final request, for CGI, PHP and LogFormat %{...}e.
 */
#include "apr_atomic.h"
#include "apr_hash.h"
#include "apr_strings.h"

#include "ap_mpm.h"
#include "httpd.h"
#include "http_config.h"
#include "http_core.h"
#include "http_log.h"
#include "http_protocol.h"
#include "http_request.h"
#include "mod_core.h"

#include "mod_tbucket.h"

#define TBUCKET_DEFAULT_URL "redis://127.0.0.1:6379"
#define TBUCKET_DEFAULT_PREFIX "rl:"
#define MAX_ROUTES (TB_MAX_BUCKETS - 1)

/* What the first limited request of a chain decided; kept in the
 * request_config of the chain's root so that later requests of the chain
 * (internal redirects, ErrorDocument) copy it instead of counting again. */
typedef struct tbucket_req {
    tbucket_outcome outcome;
    const char *remaining;   /* TBUCKET_REMAINING, as text. */
} tbucket_req;

static tbucket_srv_conf *srv_conf(const server_rec *s)
{
    return ap_get_module_config(s->module_config, &tbucket_module);
}

/* ---- Configuration records ------------------------------------------ */

static void *create_srv_conf(apr_pool_t *p, server_rec *s)
{
    tbucket_srv_conf *sc = apr_pcalloc(p, sizeof(*sc));

    (void)s;
    sc->timeout_ms = 50;
    sc->policy = TB_POLICY_OPEN;
    sc->replicas = 1;
    sc->breaker_threshold = 5;
    sc->breaker_cooldown_ms = 10000;
    sc->prefix = TBUCKET_DEFAULT_PREFIX;
    sc->vhost_slot = -1;
    sc->client_slot = -1;
    return sc;
}

/* A virtual host takes what it sets and inherits the rest from the main
 * server; field by field, so "TBucketRedis URL" in a vhost keeps the main
 * server's timeout. Allocates a new record; base and add are untouched. */
static void *merge_srv_conf(apr_pool_t *p, void *basev, void *addv)
{
    const tbucket_srv_conf *base = basev, *add = addv;
    tbucket_srv_conf *m = apr_pcalloc(p, sizeof(*m));

#define TAKE(field, flag)                                    \
    do {                                                     \
        m->field = add->flag ? add->field : base->field;     \
        m->flag = add->flag | base->flag;                    \
    } while (0)
    TAKE(url, url_set);
    TAKE(timeout_ms, timeout_set);
    TAKE(connect_timeout_ms, connect_timeout_set);
    TAKE(pool_size, pool_set);
    TAKE(policy, policy_set);
    TAKE(replicas, replicas_set);
    TAKE(breaker_threshold, threshold_set);
    TAKE(breaker_cooldown_ms, cooldown_set);
    TAKE(prefix, prefix_set);
#undef TAKE
    m->vhost_slot = -1;
    m->client_slot = -1;
    return m;
}

static void *create_dir_conf(apr_pool_t *p, char *dir)
{
    tbucket_dir_conf *dc = apr_pcalloc(p, sizeof(*dc));

    (void)dir;
    dc->enable = -1;
    dc->shadow = -1;
    dc->headers = -1;
    dc->cost = 1;
    return dc;
}

/* Outer routes first, an inner route of the same name replacing the outer
 * one; past MAX_ROUTES the outermost are dropped (check_config warns). */
static apr_array_header_t *merge_routes(apr_pool_t *p,
                                        apr_array_header_t *base,
                                        apr_array_header_t *add)
{
    apr_array_header_t *m;
    int i, j, skip;

    if (!add || !add->nelts) {
        return base;
    }
    if (!base || !base->nelts) {
        return add;
    }
    m = apr_array_make(p, base->nelts + add->nelts, sizeof(tbucket_route));
    for (i = 0; i < base->nelts; i++) {
        const tbucket_route *b = &APR_ARRAY_IDX(base, i, tbucket_route);

        for (skip = 0, j = 0; j < add->nelts && !skip; j++) {
            skip = !strcmp(b->name,
                           APR_ARRAY_IDX(add, j, tbucket_route).name);
        }
        if (!skip) {
            APR_ARRAY_PUSH(m, tbucket_route) = *b;
        }
    }
    for (j = 0; j < add->nelts; j++) {
        APR_ARRAY_PUSH(m, tbucket_route) = APR_ARRAY_IDX(add, j,
                                                         tbucket_route);
    }
    if (m->nelts > MAX_ROUTES) {
        memmove(m->elts, m->elts + (m->nelts - MAX_ROUTES) * m->elt_size,
                MAX_ROUTES * m->elt_size);
        m->nelts = MAX_ROUTES;
    }
    return m;
}

/* Runs per request (server/request.c merges sections as it walks), so it
 * copies scalars and pointers only: the tenant tables are chained, not
 * copied, and routes are rebuilt only when both sides have some. */
static void *merge_dir_conf(apr_pool_t *p, void *basev, void *addv)
{
    const tbucket_dir_conf *base = basev, *add = addv;
    tbucket_dir_conf *m = apr_palloc(p, sizeof(*m));

    m->enable = add->enable != -1 ? add->enable : base->enable;
    m->shadow = add->shadow != -1 ? add->shadow : base->shadow;
    m->headers = add->headers != -1 ? add->headers : base->headers;
    m->key_set = add->key_set | base->key_set;
    m->key = add->key_set ? add->key : base->key;
    m->key_late = add->key_set ? add->key_late : base->key_late;
    m->limit_set = add->limit_set | base->limit_set;
    m->limit = add->limit_set ? add->limit : base->limit;
    m->cost_set = add->cost_set | base->cost_set;
    m->cost = add->cost_set ? add->cost : base->cost;
    if (add->tenants) {
        m->tenants = add->tenants;
        m->tenants_up = base;
    }
    else {
        m->tenants = base->tenants;
        m->tenants_up = base->tenants_up;
    }
    m->routes = merge_routes(p, base->routes, add->routes);
    return m;
}

/* ---- Directive handlers --------------------------------------------- */

/* A URL for a message, with any user:password replaced by "***". */
static const char *redact_raw(apr_pool_t *p, const char *url)
{
    const char *scheme = strstr(url, "://");
    const char *at;

    if (!scheme || !(at = strrchr(scheme + 3, '@'))) {
        return url;
    }
    return apr_pstrcat(p, apr_pstrmemdup(p, url, scheme + 3 - url), "***",
                       at, NULL);
}

static const char *bad_value(cmd_parms *cmd, const char *what,
                             const char *value, const char *why)
{
    return apr_psprintf(cmd->pool, "%s: bad %s '%s': %s", cmd->cmd->name,
                        what, value, why);
}

/* "name=value" into its two halves; NULL when there is no '='. */
static const char *split_opt(apr_pool_t *p, const char *word,
                             const char **value)
{
    const char *eq = strchr(word, '=');

    if (!eq) {
        return NULL;
    }
    *value = eq + 1;
    return apr_pstrmemdup(p, word, eq - word);
}

static const char *parse_ms(cmd_parms *cmd, const char *what,
                            const char *value, int *out)
{
    int64_t ms;
    char err[128];

    if (tb_parse_duration_ms(value, &ms, err, sizeof(err)) != TB_OK) {
        return bad_value(cmd, what, value, err);
    }
    if (ms < 1 || ms > 60000) {
        return bad_value(cmd, what, value, "must be 1ms..60s");
    }
    *out = (int)ms;
    return NULL;
}

static const char *set_redis(cmd_parms *cmd, void *dummy, const char *args)
{
    tbucket_srv_conf *sc = srv_conf(cmd->server);
    const char *url = ap_getword_conf(cmd->temp_pool, &args);
    const char *word, *name, *value, *msg;
    tb_redis_addr_t addr;
    char err[160];
    int64_t n;

    (void)dummy;
    if (!*url) {
        return "TBucketRedis: a URL is required, e.g. "
               "TBucketRedis redis://127.0.0.1:6379 timeout=50";
    }
    if (tb_url_parse(url, &addr, err, sizeof(err)) != TB_OK) {
        return bad_value(cmd, "URL", redact_raw(cmd->temp_pool, url), err);
    }
    sc->url = apr_pstrdup(cmd->pool, url);
    sc->url_set = 1;
    while (*(word = ap_getword_conf(cmd->temp_pool, &args))) {
        name = split_opt(cmd->temp_pool, word, &value);
        if (name && !strcmp(name, "timeout")) {
            if ((msg = parse_ms(cmd, "timeout", value, &sc->timeout_ms))) {
                return msg;
            }
            sc->timeout_set = 1;
        }
        else if (name && !strcmp(name, "connect_timeout")) {
            if ((msg = parse_ms(cmd, "connect_timeout", value,
                                &sc->connect_timeout_ms))) {
                return msg;
            }
            sc->connect_timeout_set = 1;
        }
        else if (name && !strcmp(name, "pool")) {
            if (tb_parse_int(value, 1, 1024, &n, err, sizeof(err))
                != TB_OK) {
                return bad_value(cmd, "pool", value, err);
            }
            sc->pool_size = (int)n;
            sc->pool_set = 1;
        }
        else {
            return apr_psprintf(cmd->pool, "TBucketRedis: unknown option "
                                "'%s' (expected timeout=MS, "
                                "connect_timeout=MS or pool=N)", word);
        }
    }
    return NULL;
}

static const char *set_policy(cmd_parms *cmd, void *dummy, const char *arg)
{
    tbucket_srv_conf *sc = srv_conf(cmd->server);

    (void)dummy;
    if (tb_policy_parse(arg, &sc->policy) != TB_OK) {
        return bad_value(cmd, "policy", arg,
                         "expected open, closed or local");
    }
    sc->policy_set = 1;
    return NULL;
}

static const char *set_replicas(cmd_parms *cmd, void *dummy,
                                const char *arg)
{
    tbucket_srv_conf *sc = srv_conf(cmd->server);
    char err[128];
    int64_t n;

    (void)dummy;
    if (tb_parse_int(arg, 1, 100000, &n, err, sizeof(err)) != TB_OK) {
        return bad_value(cmd, "replica count", arg, err);
    }
    sc->replicas = (int)n;
    sc->replicas_set = 1;
    return NULL;
}

static const char *set_breaker(cmd_parms *cmd, void *dummy,
                               const char *args)
{
    tbucket_srv_conf *sc = srv_conf(cmd->server);
    const char *word, *name, *value;
    char err[128];
    int64_t n;
    int seen = 0;

    (void)dummy;
    while (*(word = ap_getword_conf(cmd->temp_pool, &args))) {
        name = split_opt(cmd->temp_pool, word, &value);
        if (name && !strcmp(name, "threshold")) {
            if (tb_parse_int(value, 1, 1000000, &n, err, sizeof(err))
                != TB_OK) {
                return bad_value(cmd, "threshold", value, err);
            }
            sc->breaker_threshold = (int)n;
            sc->threshold_set = 1;
        }
        else if (name && !strcmp(name, "cooldown")) {
            if (tb_parse_duration_ms(value, &n, err, sizeof(err)) != TB_OK) {
                return bad_value(cmd, "cooldown", value, err);
            }
            if (n < 1) {
                return bad_value(cmd, "cooldown", value, "must be > 0");
            }
            sc->breaker_cooldown_ms = n;
            sc->cooldown_set = 1;
        }
        else {
            return apr_psprintf(cmd->pool, "TBucketBreaker: unknown option "
                                "'%s' (expected threshold=N "
                                "cooldown=DURATION)", word);
        }
        seen++;
    }
    if (!seen) {
        return "TBucketBreaker: expected threshold=N and/or "
               "cooldown=DURATION, e.g. TBucketBreaker threshold=5 "
               "cooldown=10s";
    }
    return NULL;
}

static const char *set_prefix(cmd_parms *cmd, void *dummy, const char *arg)
{
    tbucket_srv_conf *sc = srv_conf(cmd->server);

    (void)dummy;
    /* Room is kept for the "ip:" of fallback keys. */
    if (!tb_prefix_valid(arg) || strlen(arg) > TB_PREFIX_MAX - 3) {
        return bad_value(cmd, "prefix", arg,
                         "1..61 printable characters without spaces or "
                         "braces");
    }
    sc->prefix = apr_pstrdup(cmd->pool, arg);
    sc->prefix_set = 1;
    return NULL;
}

static const char *parse_limit(cmd_parms *cmd, const char *cap,
                               const char *rate, tb_limit_t *lim)
{
    char err[128];
    int64_t n;

    if (tb_parse_int(cap, 1, (int64_t)TB_MAX_CAPACITY, &n, err, sizeof(err))
        != TB_OK) {
        return bad_value(cmd, "capacity", cap, err);
    }
    lim->capacity = (double)n;
    if (tb_parse_rate(rate, &lim->rate_per_sec, err, sizeof(err)) != TB_OK) {
        return bad_value(cmd, "rate", rate, err);
    }
    return NULL;
}

static const char *set_key(cmd_parms *cmd, void *dcv, const char *arg)
{
    tbucket_dir_conf *dc = dcv;
    const char *err = NULL;

    /* DONT_VARY: the key must not add "Vary: X-API-Key" to responses. */
    dc->key = ap_expr_parse_cmd(cmd, arg, AP_EXPR_FLAG_STRING_RESULT
                                | AP_EXPR_FLAG_DONT_VARY, &err, NULL);
    if (err || !dc->key) {
        return apr_psprintf(cmd->pool, "TBucketKey: cannot parse "
                            "expression '%s': %s", arg,
                            err ? err : "unknown error");
    }
    dc->key_late = ap_strcasestr(arg, "REMOTE_USER") != NULL
                   || ap_strcasestr(arg, "AUTH_TYPE") != NULL;
    dc->key_set = 1;
    return NULL;
}

static const char *set_limit(cmd_parms *cmd, void *dcv, const char *cap,
                             const char *rate)
{
    tbucket_dir_conf *dc = dcv;
    const char *msg = parse_limit(cmd, cap, rate, &dc->limit);

    if (!msg) {
        dc->limit_set = 1;
    }
    return msg;
}

static const char *set_cost(cmd_parms *cmd, void *dcv, const char *arg)
{
    tbucket_dir_conf *dc = dcv;
    char err[128];
    int64_t n;

    if (tb_parse_int(arg, 0, (int64_t)TB_MAX_CAPACITY, &n, err, sizeof(err))
        != TB_OK) {
        return bad_value(cmd, "cost", arg, err);
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

    if (!*key) {
        return "TBucketTenant: the tenant key must not be empty";
    }
    if ((msg = parse_limit(cmd, cap, rate, lim))) {
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

static const char *set_route(cmd_parms *cmd, void *dcv, const char *name,
                             const char *cap, const char *rate)
{
    tbucket_dir_conf *dc = dcv;
    tbucket_route rt;
    const char *msg;
    int i;

    if (!tb_name_valid(name)) {
        return bad_value(cmd, "route name", name,
                         "use 1..64 of A-Z a-z 0-9 _ . -");
    }
    if ((msg = parse_limit(cmd, cap, rate, &rt.limit))) {
        return msg;
    }
    if (!dc->routes) {
        dc->routes = apr_array_make(cmd->pool, 2, sizeof(tbucket_route));
    }
    for (i = 0; i < dc->routes->nelts; i++) {
        if (!strcmp(APR_ARRAY_IDX(dc->routes, i, tbucket_route).name,
                    name)) {
            return apr_psprintf(cmd->pool, "TBucketRouteLimit: route '%s' "
                                "is already set in this scope", name);
        }
    }
    if (dc->routes->nelts >= MAX_ROUTES) {
        return apr_psprintf(cmd->pool, "TBucketRouteLimit: at most %d "
                            "routes per scope", MAX_ROUTES);
    }
    rt.name = apr_pstrdup(cmd->pool, name);
    APR_ARRAY_PUSH(dc->routes, tbucket_route) = rt;
    return NULL;
}

static const char *set_mode(cmd_parms *cmd, void *dcv, const char *arg)
{
    tbucket_dir_conf *dc = dcv;

    if (!strcasecmp(arg, "enforce")) {
        dc->shadow = 0;
    }
    else if (!strcasecmp(arg, "shadow")) {
        dc->shadow = 1;
    }
    else {
        return bad_value(cmd, "mode", arg, "expected enforce or shadow");
    }
    return NULL;
}

static const char *set_header_style(cmd_parms *cmd, void *dcv,
                                    const char *arg)
{
    static const char *const names[] = { "legacy", "ietf", "both", "off" };
    tbucket_dir_conf *dc = dcv;
    int i;

    for (i = 0; i < 4; i++) {
        if (!strcasecmp(arg, names[i])) {
            dc->headers = i;
            return NULL;
        }
    }
    return bad_value(cmd, "header style", arg,
                     "expected legacy, ietf, both or off");
}

#define DIR_SCOPE (RSRC_CONF | ACCESS_CONF | OR_LIMIT)

static const command_rec tbucket_cmds[] = {
    AP_INIT_RAW_ARGS("TBucketRedis", set_redis, NULL, RSRC_CONF,
                     "Redis URL and options, e.g. redis://127.0.0.1:6379 "
                     "timeout=50 connect_timeout=100 pool=4"),
    AP_INIT_TAKE1("TBucketFailurePolicy", set_policy, NULL, RSRC_CONF,
                  "What decides when Redis cannot: open, closed or local"),
    AP_INIT_TAKE1("TBucketReplicas", set_replicas, NULL, RSRC_CONF,
                  "Replicas sharing the limit, for the local policy, e.g. 3"),
    AP_INIT_RAW_ARGS("TBucketBreaker", set_breaker, NULL, RSRC_CONF,
                     "Circuit breaker, e.g. threshold=5 cooldown=10s"),
    AP_INIT_TAKE1("TBucketPrefix", set_prefix, NULL, RSRC_CONF,
                  "Redis key prefix, e.g. rl:"),
    AP_INIT_FLAG("TBucketEnable", ap_set_flag_slot,
                 (void *)APR_OFFSETOF(tbucket_dir_conf, enable), DIR_SCOPE,
                 "On to limit requests in this scope"),
    AP_INIT_TAKE1("TBucketKey", set_key, NULL, DIR_SCOPE,
                  "Client key expression, e.g. \"%{HTTP:X-API-Key}\""),
    AP_INIT_TAKE2("TBucketLimit", set_limit, NULL, DIR_SCOPE,
                  "Capacity and rate, e.g. 100 10/s"),
    AP_INIT_TAKE1("TBucketCost", set_cost, NULL, DIR_SCOPE,
                  "Tokens per request in this scope, e.g. 10"),
    AP_INIT_TAKE3("TBucketTenant", set_tenant, NULL, DIR_SCOPE,
                  "A tenant's own limit, e.g. key-123 1000 100/s"),
    AP_INIT_TAKE3("TBucketRouteLimit", set_route, NULL, DIR_SCOPE,
                  "An extra bucket for this scope, e.g. export 5 1/m"),
    AP_INIT_TAKE1("TBucketMode", set_mode, NULL, DIR_SCOPE,
                  "enforce, or shadow to decide and count without "
                  "rejecting"),
    AP_INIT_TAKE1("TBucketHeaders", set_header_style, NULL, DIR_SCOPE,
                  "Response headers: legacy, ietf, both or off"),
    { NULL }
};

/* ---- Configuration checks (apache2 -t shows these) ------------------ */

static void warn_once(apr_hash_t *seen, server_rec *s, const char *msg)
{
    if (!apr_hash_get(seen, msg, APR_HASH_KEY_STRING)) {
        apr_hash_set(seen, msg, APR_HASH_KEY_STRING, msg);
        ap_log_error(APLOG_MARK, APLOG_WARNING | APLOG_STARTUP, 0, s,
                     TBLOGNO(00101) "%s", msg);
    }
}

static void check_cost(apr_pool_t *p, apr_hash_t *seen, server_rec *s,
                       const char *where, const char *what, double cost,
                       double capacity)
{
    if (cost > capacity) {
        warn_once(seen, s, apr_psprintf(p, "TBucketCost %.0f exceeds the "
                  "capacity %.0f of %s in %s: such requests are always "
                  "refused with 403", cost, capacity, what, where));
    }
}

/* Warn about what can be seen to be wrong in one effective scope. */
static void check_scope(apr_pool_t *p, apr_hash_t *seen, server_rec *s,
                        const char *where, const tbucket_dir_conf *dc)
{
    const tbucket_dir_conf *t;
    apr_hash_index_t *hi;
    int i;

    if (dc->enable == 1 && !dc->limit_set) {
        warn_once(seen, s, apr_psprintf(p, "TBucketEnable On without a "
                  "TBucketLimit in %s: requests there are not limited",
                  where));
    }
    if (dc->limit_set) {
        check_cost(p, seen, s, where, "TBucketLimit", dc->cost,
                   dc->limit.capacity);
    }
    for (t = dc; t; t = t->tenants_up) {
        for (hi = t->tenants ? apr_hash_first(p, t->tenants) : NULL; hi;
             hi = apr_hash_next(hi)) {
            const void *k;
            void *v;

            apr_hash_this(hi, &k, NULL, &v);
            check_cost(p, seen, s, where,
                       apr_psprintf(p, "TBucketTenant %s", (const char *)k),
                       dc->cost, ((tb_limit_t *)v)->capacity);
        }
    }
    for (i = 0; dc->routes && i < dc->routes->nelts; i++) {
        const tbucket_route *rt = &APR_ARRAY_IDX(dc->routes, i,
                                                 tbucket_route);

        check_cost(p, seen, s, where,
                   apr_psprintf(p, "TBucketRouteLimit %s", rt->name),
                   dc->cost, rt->limit.capacity);
    }
}

static void check_sections(apr_pool_t *p, apr_hash_t *seen, server_rec *s,
                           const char *kind, apr_array_header_t *secs)
{
    int i;

    for (i = 0; secs && i < secs->nelts; i++) {
        ap_conf_vector_t *sec = APR_ARRAY_IDX(secs, i, ap_conf_vector_t *);
        core_dir_config *cd = ap_get_core_module_config(sec);
        tbucket_dir_conf *dc = ap_get_module_config(sec, &tbucket_module);
        tbucket_dir_conf *base = ap_get_module_config(s->lookup_defaults,
                                                      &tbucket_module);

        if (!dc) {
            continue;
        }
        check_scope(p, seen, s,
                    apr_psprintf(p, "<%s %s> of %s", kind,
                                 cd && cd->d ? cd->d : "?",
                                 s->defn_name ? s->defn_name
                                              : "the main server"),
                    merge_dir_conf(p, base, dc));
    }
}

/* Options of the client a server will make in each child. */
static void client_options(const tbucket_srv_conf *sc, tb_options_t *o)
{
    tb_options_init(o);
    o->url = sc->url ? sc->url : TBUCKET_DEFAULT_URL;
    o->timeout_ms = sc->timeout_ms;
    o->connect_timeout_ms = sc->connect_timeout_ms;
    if (sc->pool_size > 0) {
        o->pool_size = sc->pool_size;
    }
    o->breaker_threshold = sc->breaker_threshold;
    o->breaker_cooldown_ms = sc->breaker_cooldown_ms;
    o->policy = sc->policy;
    o->replicas = sc->replicas;
}

/* check_config runs after the vhosts are merged and also under
 * `apache2 -t`, before the error log is open, so its warnings reach the
 * administrator's terminal. It refuses a client configuration the core
 * would refuse (creating a client does not connect) and warns about
 * costs that can never fit the buckets they are charged to. */
static int check_config(apr_pool_t *pconf, apr_pool_t *plog,
                        apr_pool_t *ptemp, server_rec *main_s)
{
    apr_hash_t *seen = apr_hash_make(ptemp);
    server_rec *s;

    (void)pconf;
    (void)plog;
    for (s = main_s; s; s = s->next) {
        core_server_config *core = ap_get_core_module_config(
            s->module_config);
        tbucket_srv_conf *sc = srv_conf(s);
        tb_options_t o;
        tb_client_t *c;
        char err[TB_ERRSTR_LEN];

        client_options(sc, &o);
        o.local_entries = 64;
        if (!(c = tb_client_create(&o, err, sizeof(err)))) {
            ap_log_error(APLOG_MARK, APLOG_EMERG | APLOG_STARTUP, 0, s,
                         TBLOGNO(00102) "TBucketRedis in %s: %s",
                         s->defn_name ? s->defn_name : "the main server",
                         err);
            return !OK;
        }
        tb_client_free(c);
        check_scope(ptemp, seen, s,
                    s->defn_name ? apr_psprintf(ptemp, "<VirtualHost> at "
                                                "%s:%d", s->defn_name,
                                                s->defn_line_number)
                                 : "the main server",
                    ap_get_module_config(s->lookup_defaults,
                                         &tbucket_module));
        check_sections(ptemp, seen, s, "Directory", core->sec_dir);
        check_sections(ptemp, seen, s, "Location", core->sec_url);
    }
    return OK;
}

/* ---- Startup: shared memory (parent) and clients (children) --------- */

static const char *signature(apr_pool_t *p, const tbucket_srv_conf *sc)
{
    return apr_psprintf(p, "%s|%d|%d|%d|%d|%d|%d|%" APR_INT64_T_FMT,
                        sc->url ? sc->url : TBUCKET_DEFAULT_URL, sc->timeout_ms,
                        sc->connect_timeout_ms, sc->pool_size,
                        (int)sc->policy, sc->replicas,
                        sc->breaker_threshold, sc->breaker_cooldown_ms);
}

/* One connection per child suits prefork, which serves one request at a
 * time; threaded MPMs get the core's default. */
static int default_pool_size(void)
{
    int threaded = 0;

    if (ap_mpm_query(AP_MPMQ_IS_THREADED, &threaded) != APR_SUCCESS
        || threaded == AP_MPMQ_NOT_SUPPORTED) {
        return 1;
    }
    return 4;
}

static int post_config(apr_pool_t *pconf, apr_pool_t *plog,
                       apr_pool_t *ptemp, server_rec *main_s)
{
    server_rec *s;
    int pool = default_pool_size();

    (void)ptemp;
    /* The first of the two startup passes only checks the config. */
    if (ap_state_query(AP_SQ_MAIN_STATE) == AP_SQ_MS_CREATE_PRE_CONFIG) {
        return OK;
    }
    for (s = main_s; s; s = s->next) {
        tbucket_srv_conf *sc = srv_conf(s);

        if (!sc->pool_set) {
            sc->pool_size = pool;
        }
        sc->signature = signature(pconf, sc);
    }
    return tbucket_shm_setup(pconf, plog, main_s);
}

static apr_status_t client_cleanup(void *data)
{
    tbucket_client *c = data;

    /* Closes this child's connections: a graceful restart leaks none. */
    tb_client_free(c->tb);
    c->tb = NULL;
    return APR_SUCCESS;
}

static tbucket_client *make_client(apr_pool_t *pchild, server_rec *s,
                                   const tbucket_srv_conf *sc)
{
    tbucket_client *c = apr_pcalloc(pchild, sizeof(*c));
    tb_options_t o;
    char err[TB_ERRSTR_LEN];

    client_options(sc, &o);
    o.local = tbucket_local_table();
    if (tbucket_shm_seg && sc->client_slot >= 0) {
        c->slot = &tbucket_shm_seg->clients[sc->client_slot];
        o.stats = &c->slot->stats;
    }
    c->s = s;
    c->label = c->slot ? c->slot->redis : "?";
    c->breaker_closed = 1;
    c->tb = tb_client_create(&o, err, sizeof(err));
    if (!c->tb) {
        ap_log_error(APLOG_MARK, APLOG_ERR, 0, s, TBLOGNO(00103)
                     "cannot make the Redis client for %s: %s; requests "
                     "here are not limited", c->label, err);
        return c;
    }
    apr_pool_cleanup_register(pchild, c, client_cleanup,
                              apr_pool_cleanup_null);
    return c;
}

/* One client per distinct Redis configuration per child, made here so
 * that no connection is ever shared across fork and each generation of
 * children has its own. */
static void child_init(apr_pool_t *pchild, server_rec *main_s)
{
    apr_hash_t *made = apr_hash_make(pchild);
    server_rec *s;

    for (s = main_s; s; s = s->next) {
        tbucket_srv_conf *sc = srv_conf(s);
        tbucket_client *c;

        if (!sc->signature) {
            continue;
        }
        c = apr_hash_get(made, sc->signature, APR_HASH_KEY_STRING);
        if (!c) {
            c = make_client(pchild, s, sc);
            apr_hash_set(made, sc->signature, APR_HASH_KEY_STRING, c);
        }
        sc->client = c;
    }
}

/* ---- The request path ------------------------------------------------ */

/* The first request of r's chain: internal redirects point back through
 * r->prev, sub-requests up through r->main. Bounded like httpd's own
 * redirect limit. */
static request_rec *chain_root(request_rec *r)
{
    int hops;

    for (hops = 0; hops < 64; hops++) {
        if (r->prev) {
            r = r->prev;
        }
        else if (r->main) {
            r = r->main;
        }
        else {
            break;
        }
    }
    return r;
}

static void set_env(request_rec *r, const tbucket_req *rq)
{
    apr_table_setn(r->subprocess_env, "TBUCKET_DECISION",
                   tbucket_outcome_names[rq->outcome]);
    apr_table_setn(r->subprocess_env, "TBUCKET_REMAINING", rq->remaining);
}

/* The client key, and the prefix its bucket lives under. */
static const char *request_key(request_rec *r, const tbucket_dir_conf *dc,
                               const tbucket_srv_conf *sc,
                               const char **prefix)
{
    const char *key = NULL, *err = NULL;

    *prefix = sc->prefix;
    if (!dc->key) {
        return r->useragent_ip;
    }
    key = ap_expr_str_exec(r, dc->key, &err);
    if (err) {
        ap_log_rerror(APLOG_MARK, APLOG_DEBUG, 0, r, TBLOGNO(00104)
                      "TBucketKey could not be evaluated (%s): keyed by "
                      "the client IP", err);
        key = NULL;
    }
    if (!key || !*key) {
        *prefix = apr_pstrcat(r->pool, sc->prefix, "ip:", NULL);
        return r->useragent_ip;
    }
    return key;
}

static const tb_limit_t *tenant_limit(const tbucket_dir_conf *dc,
                                      const char *key)
{
    const tbucket_dir_conf *t;
    const tb_limit_t *lim;
    int hops = 0;

    for (t = dc; t && hops < 64; t = t->tenants_up, hops++) {
        if (t->tenants
            && (lim = apr_hash_get(t->tenants, key, APR_HASH_KEY_STRING))) {
            return lim;
        }
    }
    return &dc->limit;
}

static int build_takes(const tbucket_dir_conf *dc, const char *key,
                       tb_take_t *takes)
{
    int i, n = 1;

    takes[0].limit = *tenant_limit(dc, key);
    takes[0].cost = dc->cost;
    takes[0].route = NULL;
    for (i = 0; dc->routes && i < dc->routes->nelts && n < TB_MAX_BUCKETS;
         i++) {
        const tbucket_route *rt = &APR_ARRAY_IDX(dc->routes, i,
                                                 tbucket_route);

        takes[n].limit = rt->limit;
        takes[n].cost = dc->cost;
        takes[n].route = rt->name;
        n++;
    }
    return n;
}

/* Log breaker transitions once per client per process, not once per
 * request: whichever thread first sees the new state logs it. */
static void note_breaker(request_rec *r, tbucket_client *c,
                         const tb_result_t *res, const tbucket_srv_conf *sc)
{
    apr_uint32_t closed = tb_client_breaker_state(c->tb) == TB_BREAKER_CLOSED;

    if (apr_atomic_read32(&c->breaker_closed) == closed
        || apr_atomic_cas32(&c->breaker_closed, closed, !closed) != !closed) {
        return;
    }
    if (!closed) {
        ap_log_error(APLOG_MARK, APLOG_WARNING, 0, r->server, TBLOGNO(00105)
                     "Redis %s is failing (%s): breaker open, the %s "
                     "policy decides for %" APR_INT64_T_FMT " ms",
                     c->label, tb_err_name(res->err),
                     tb_policy_name(sc->policy), sc->breaker_cooldown_ms);
    }
    else {
        ap_log_error(APLOG_MARK, APLOG_NOTICE, 0, r->server, TBLOGNO(00106)
                     "Redis %s answers again: breaker closed", c->label);
    }
}

static tbucket_outcome outcome_of(const tb_result_t *res, int shadow)
{
    switch (res->source) {
    case TB_SRC_OPEN:
        return TBUCKET_OUT_FALLBACK_OPEN;
    case TB_SRC_CLOSED:
        return TBUCKET_OUT_FALLBACK_CLOSED;
    case TB_SRC_LOCAL:
        return TBUCKET_OUT_FALLBACK_LOCAL;
    default:
        break;
    }
    if (res->allowed) {
        return TBUCKET_OUT_ALLOWED;
    }
    return shadow ? TBUCKET_OUT_SHADOW_REJECTED : TBUCKET_OUT_REJECTED;
}

static apr_int64_t ceil_div(double a, double b)
{
    double q = a / b;
    apr_int64_t n = (apr_int64_t)q;

    return (double)n < q ? n + 1 : n;
}

/* X-RateLimit-* and/or the IETF draft's RateLimit-Policy / RateLimit, in
 * err_headers_out so they survive error responses, CGI output and
 * internal redirects (which share err_headers_out). */
static void add_limit_headers(request_rec *r, const tbucket_dir_conf *dc,
                        const tb_take_t *takes, const tb_result_t *res,
                        apr_int64_t retry_s)
{
    int mode = dc->headers == -1 ? TBUCKET_HDR_LEGACY : dc->headers;
    const tb_take_t *b = &takes[res->binding];
    apr_int64_t cap = (apr_int64_t)b->limit.capacity;
    apr_int64_t left = res->remaining > 0 ? res->remaining : 0;
    apr_int64_t t;

    if (left > cap) {
        left = cap;
    }
    if (mode == TBUCKET_HDR_LEGACY || mode == TBUCKET_HDR_BOTH) {
        apr_table_setn(r->err_headers_out, "X-RateLimit-Limit",
                       apr_psprintf(r->pool, "%" APR_INT64_T_FMT, cap));
        apr_table_setn(r->err_headers_out, "X-RateLimit-Remaining",
                       apr_psprintf(r->pool, "%" APR_INT64_T_FMT, left));
    }
    if (mode == TBUCKET_HDR_IETF || mode == TBUCKET_HDR_BOTH) {
        const char *name = b->route ? b->route : "default";

        /* t: seconds until the bucket is full again, or the wait. */
        t = retry_s > 0 ? retry_s
                        : ceil_div((double)(cap - left), b->limit.rate_per_sec);
        apr_table_setn(r->err_headers_out, "RateLimit-Policy",
                       apr_psprintf(r->pool, "\"%s\";q=%" APR_INT64_T_FMT
                                    ";w=%" APR_INT64_T_FMT, name, cap,
                                    ceil_div(b->limit.capacity,
                                             b->limit.rate_per_sec)));
        apr_table_setn(r->err_headers_out, "RateLimit",
                       apr_psprintf(r->pool, "\"%s\";r=%" APR_INT64_T_FMT
                                    ";t=%" APR_INT64_T_FMT, name, left, t));
    }
}

/* Answer the request here with a small JSON body, unless an ErrorDocument
 * is set for the status, in which case httpd's error path serves it. */
static int respond(request_rec *r, int status, const char *body)
{
    if (ap_response_code_string(r, ap_index_of_response(status))) {
        return status;
    }
    /* Status first: the input filter then sends no 100-continue. */
    r->status = status;
    ap_discard_request_body(r);
    ap_set_content_type(r, "application/json");
    ap_set_content_length(r, (apr_off_t)strlen(body));
    if (!r->header_only) {
        ap_rputs(body, r);
    }
    return DONE;
}

/* Decide request r (not a sub-request) for the first time in its chain.
 * Returns DECLINED to let it through, or the response status. */
static int limit_request(request_rec *r, const tbucket_dir_conf *dc,
                         request_rec *root)
{
    tbucket_srv_conf *sc = srv_conf(r->server);
    tb_take_t takes[TB_MAX_BUCKETS];
    tb_result_t res;
    tbucket_req *rq;
    const char *key, *prefix;
    apr_int64_t retry_s = 0;
    int n, shadow = dc->shadow == 1, cost_exceeded;

    if (!dc->limit_set) {
        return DECLINED;
    }
    if (!sc->client || !sc->client->tb) {
        ap_log_rerror(APLOG_MARK, APLOG_DEBUG, 0, r, TBLOGNO(00107)
                      "no Redis client in this process: not limited");
        return DECLINED;
    }
    key = request_key(r, dc, sc, &prefix);
    n = build_takes(dc, key, takes);
    tb_client_decide(sc->client->tb, prefix, key, strlen(key), takes, n,
                     &res);
    if (res.err == TB_ERR_ARG) {
        ap_log_rerror(APLOG_MARK, APLOG_ERR, 0, r, TBLOGNO(00108)
                      "the limiter refused its arguments: not limited");
        return DECLINED;
    }
    note_breaker(r, sc->client, &res, sc);
    if (res.err != TB_ERR_NONE) {
        ap_log_rerror(APLOG_MARK, APLOG_DEBUG, 0, r, TBLOGNO(00109)
                      "Redis did not decide (%s): %s policy answered",
                      tb_err_name(res.err), tb_policy_name(sc->policy));
    }
    cost_exceeded = !res.allowed && res.retry_ms < 0;
    if (!res.allowed && !cost_exceeded) {
        retry_s = (res.retry_ms + 999) / 1000;
        if (retry_s < 1) {
            retry_s = 1;
        }
    }
    rq = apr_palloc(root->pool, sizeof(*rq));
    rq->outcome = outcome_of(&res, shadow);
    rq->remaining = apr_psprintf(root->pool, "%" APR_INT64_T_FMT,
                                 res.remaining > 0 ? res.remaining : 0);
    ap_set_module_config(root->request_config, &tbucket_module, rq);
    set_env(r, rq);
    add_limit_headers(r, dc, takes, &res, retry_s);
    tbucket_count(sc, rq->outcome, cost_exceeded);

    if (res.allowed) {
        return DECLINED;
    }
    if (shadow) {
        ap_log_rerror(APLOG_MARK, APLOG_INFO, 0, r, TBLOGNO(00110)
                      "shadow mode: would refuse %s (%s, retry after %"
                      APR_INT64_T_FMT " s)", r->uri,
                      cost_exceeded ? "cost exceeds capacity"
                                    : "over the limit", retry_s);
        return DECLINED;
    }
    if (cost_exceeded) {
        ap_log_rerror(APLOG_MARK, APLOG_INFO, 0, r, TBLOGNO(00111)
                      "refused %s: its cost %.0f exceeds the capacity %.0f "
                      "of a bucket it is charged to", r->uri, dc->cost,
                      res.limit);
        return respond(r, HTTP_FORBIDDEN, apr_psprintf(r->pool,
                       "{\"error\":\"request cost exceeds the rate limit "
                       "capacity\",\"cost\":%.0f,\"capacity\":%.0f}\n",
                       dc->cost, res.limit));
    }
    apr_table_setn(r->err_headers_out, "Retry-After",
                   apr_psprintf(r->pool, "%" APR_INT64_T_FMT, retry_s));
    ap_log_rerror(APLOG_MARK, APLOG_DEBUG, 0, r, TBLOGNO(00112)
                  "rate limited %s (%s), retry after %" APR_INT64_T_FMT " s",
                  r->uri, tbucket_outcome_names[rq->outcome], retry_s);
    return respond(r, HTTP_TOO_MANY_REQUESTS, apr_psprintf(r->pool,
                   "{\"error\":\"rate limited\",\"retry_after\":%"
                   APR_INT64_T_FMT "}\n", retry_s));
}

/* check_access: the normal place to decide. It runs before authentication
 * and the handler, so an over-limit client costs neither, and after the
 * <If>/<Location> walk, so the merged config is final. Only a chain's
 * first request decides here; later ones are handled in fixups. A key
 * that needs REMOTE_USER waits for fixups (after authn), and so does
 * "Satisfy Any", where a refusal here would not end the request. */
static int check_access(request_rec *r)
{
    const tbucket_dir_conf *dc = ap_get_module_config(r->per_dir_config,
                                                      &tbucket_module);

    if (dc->enable != 1 || r->main || r->prev || dc->key_late
        || ap_satisfies(r) == SATISFY_ANY) {
        return DECLINED;
    }
    return limit_request(r, dc, r);
}

/* fixups run for every request of a chain, even when httpd skips the
 * access phase of an internal redirect whose config did not change. A
 * later request of a chain gets the decision of the first under the exact
 * variable names (httpd only copies them as REDIRECT_TBUCKET_*); a chain
 * whose first request was not limited is decided by the first request in
 * it that is; sub-requests never count. */
static int fixups(request_rec *r)
{
    const tbucket_dir_conf *dc;
    request_rec *root = chain_root(r);
    const tbucket_req *rq = ap_get_module_config(root->request_config,
                                                 &tbucket_module);

    if (rq) {
        if (r != root) {
            set_env(r, rq);
        }
        return DECLINED;
    }
    dc = ap_get_module_config(r->per_dir_config, &tbucket_module);
    if (dc->enable != 1 || r->main) {
        return DECLINED;
    }
    return limit_request(r, dc, root);
}

static void register_hooks(apr_pool_t *p)
{
    (void)p;
    ap_hook_check_config(check_config, NULL, NULL, APR_HOOK_MIDDLE);
    ap_hook_post_config(post_config, NULL, NULL, APR_HOOK_MIDDLE);
    ap_hook_child_init(child_init, NULL, NULL, APR_HOOK_MIDDLE);
    /* First among access checkers: refuse before others spend work.
     * PER_CONF keeps httpd free to skip the phase for sub-requests. */
    ap_hook_check_access(check_access, NULL, NULL, APR_HOOK_FIRST,
                         AP_AUTH_INTERNAL_PER_CONF);
    /* After mod_rewrite's fixup (FIRST) and before mod_env's copies are
     * read by the handler; the order among MIDDLE fixups does not matter
     * since handlers read subprocess_env only after all fixups. */
    ap_hook_fixups(fixups, NULL, NULL, APR_HOOK_MIDDLE);
    ap_hook_handler(tbucket_status_handler, NULL, NULL, APR_HOOK_MIDDLE);
}

AP_DECLARE_MODULE(tbucket) = {
    STANDARD20_MODULE_STUFF,
    create_dir_conf,
    merge_dir_conf,
    create_srv_conf,
    merge_srv_conf,
    tbucket_cmds,
    register_hooks,
    0
};
