/* tbucket_check.c -- mod_tbucket's check_config hook.
 *
 * The directive handlers (tbucket_config.c) validate each value alone;
 * what only shows once scopes are merged is checked here, after the
 * virtual hosts are merged and also under `apache2 -t`, before the error
 * log is open, so the messages reach the administrator's terminal. What
 * cannot work is refused: a client configuration the core would refuse,
 * a lease with route buckets or another algorithm, shards too small to
 * keep one token and a valid rate each, a concurrency limit with shards
 * or a lease, TBucketRule with another algorithm or with shards. What works but is likely a mistake draws one warning each:
 * a cost that never fits its bucket, TBucketEnable without a limit,
 * TBucketShed where nothing is enabled, more local scopes or
 * route buckets than a request can take, a lease smaller than the cost,
 * sliding-log beyond its capacity, a cost header where the algorithm
 * cannot settle it, a concurrency slot's ttl shorter than the server's
 * Timeout, a TBucketKey that spells out the client address.
 * The main server, every virtual host and each of their <Directory> and
 * <Location> sections (merged with the server's defaults) are checked;
 * .htaccess files are not read at this point.
 */
#include "apr_hash.h"
#include "apr_strings.h"

#include "httpd.h"
#include "http_config.h"
#include "http_core.h"
#include "http_log.h"

#include "mod_tbucket.h"

APLOG_USE_MODULE(tbucket);

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

/* A ban on a name clients choose, without known=, lets anyone lock the
 * name's owner out. */
static void check_lockout(apr_pool_t *p, apr_hash_t *seen, server_rec *s,
                          const char *where, const tbucket_dir_conf *dc)
{
    int i;

    for (i = 0; i < dc->nrules; i++) {
        const tbucket_named_rule *ru = dc->rules[i];

        if (ru->ban_ms && ru->key_user && !ru->known_ms) {
            warn_once(seen, s, apr_psprintf(p, "TBucketRule %s in %s bans "
                      "a name clients choose (a form field, a header, the "
                      "user) without known=: anyone can lock its owner "
                      "out; add known=30d to keep clients that logged in "
                      "as it on a budget of their own", ru->name, where));
        }
    }
}

/* Warn about what can be seen to be wrong in one effective scope. */
static void check_scope(apr_pool_t *p, apr_hash_t *seen, server_rec *s,
                        const char *where, const tbucket_dir_conf *dc)
{
    const tbucket_dir_conf *t;
    apr_hash_index_t *hi;
    double shards = dc->shards > 1 ? dc->shards : 1;
    int i;

    const tbucket_srv_conf *sc = ap_get_module_config(s->module_config,
                                                      &tbucket_module);

    if (dc->enable == 1 && !dc->limit_set && dc->concurrency <= 0
        && dc->nlocal <= 0 && !sc->shed_min && !dc->nrules) {
        warn_once(seen, s, apr_psprintf(p, "TBucketEnable On without a "
                  "TBucketLimit, TBucketRule, TBucketConcurrency, "
                  "TBucketLocalConcurrency or TBucketShed in %s: requests "
                  "there are not limited", where));
    }
    check_lockout(p, seen, s, where, dc);
    if (dc->enable == 1 && dc->key_is_addr) {
        warn_once(seen, s, apr_psprintf(p, "TBucketKey %%{REMOTE_ADDR} in "
                  "%s keeps IP buckets among the keys clients send (a key "
                  "equal to an IP reaches that IP's bucket) and gives each "
                  "IPv6 address its own: leave TBucketKey unset to key by "
                  "IP in a key space of its own, IPv6 by network "
                  "(TBucketIPv6Prefix)", where));
    }
    if (dc->concurrency > 0
        && (apr_interval_time_t)dc->concurrency_ttl_ms * 1000 < s->timeout) {
        warn_once(seen, s, apr_psprintf(p, "TBucketConcurrency ttl=%dms in "
                  "%s is shorter than Timeout %" APR_TIME_T_FMT "s: a slow "
                  "request may lose its slot while it still runs",
                  dc->concurrency_ttl_ms, where,
                  apr_time_sec(s->timeout)));
    }
    if (dc->limit_set) {
        check_cost(p, seen, s, where, "TBucketLimit", dc->cost,
                   dc->limit.capacity / shards);
    }
    if (dc->lease > 0 && dc->lease < dc->cost) {
        warn_once(seen, s, apr_psprintf(p, "TBucketLease %d is below "
                  "TBucketCost %.0f in %s: each lease covers one request",
                  dc->lease, dc->cost, where));
    }
    if (dc->algo == TB_ALGO_SLIDING_LOG
        && ((dc->limit_set && dc->limit.capacity > TB_SLOG_MAX_CAPACITY)
            || dc->cost != (double)(apr_int64_t)dc->cost)) {
        warn_once(seen, s, apr_psprintf(p, "TBucketAlgorithm sliding-log in "
                  "%s needs a capacity up to %d and a whole cost: requests "
                  "there are not limited", where,
                  (int)TB_SLOG_MAX_CAPACITY));
    }
    if (dc->cost_header && *dc->cost_header && dc->algo != -1
        && dc->algo != TB_ALGO_TOKEN_BUCKET && dc->algo != TB_ALGO_GCRA) {
        warn_once(seen, s, apr_psprintf(p, "TBucketCostHeader %s in %s: "
                  "TBucketAlgorithm %s keeps the cost charged up front; "
                  "reported costs are not settled there", dc->cost_header,
                  where, tb_algo_name((tb_algo_t)dc->algo)));
    }
    for (t = dc; t; t = t->tenants_up) {
        for (hi = t->tenants ? apr_hash_first(p, t->tenants) : NULL; hi;
             hi = apr_hash_next(hi)) {
            const void *k;
            void *v;

            apr_hash_this(hi, &k, NULL, &v);
            check_cost(p, seen, s, where,
                       apr_psprintf(p, "TBucketTenant %s", (const char *)k),
                       dc->cost, ((tb_limit_t *)v)->capacity / shards);
        }
    }
    for (i = 0; dc->routes && i < dc->routes->nelts; i++) {
        const tbucket_route *rt = &APR_ARRAY_IDX(dc->routes, i,
                                                 tbucket_route);

        check_cost(p, seen, s, where,
                   apr_psprintf(p, "TBucketRouteLimit %s", rt->name),
                   dc->cost, rt->limit.capacity / shards);
    }
}

/* Non-NULL when one of k shards of l is no valid limit: a shard must
 * keep at least one token of every bucket it splits (capacity / K >= 1)
 * and a valid rate. */
static const char *shard_limit_bad(const tb_limit_t *l, int k)
{
    tb_limit_t d;

    d.capacity = l->capacity / k;
    d.rate_per_sec = l->rate_per_sec / k;
    return tb_limit_check(&d, NULL, 0) == TB_OK ? NULL : "";
}

/* What one effective scope asks that cannot work, as a message naming
 * the directive and the scope, or NULL. A lease takes one token bucket;
 * a concurrency limit needs a Redis call per request and one hash tag
 * per key; shards must each keep a valid limit (shard_limit_bad). */
static const char *refuse_scope(apr_pool_t *p, const char *where,
                                const tbucket_dir_conf *dc)
{
    const tbucket_dir_conf *t;
    apr_hash_index_t *hi;
    int i, k = dc->shards > 1 ? dc->shards : 1;
    const char *bad = NULL;

    if (dc->lease > 0 && dc->routes && dc->routes->nelts) {
        return apr_psprintf(p, "TBucketLease in %s: a lease takes one "
                            "bucket, and TBucketRouteLimit applies there",
                            where);
    }
    if (dc->lease > 0 && dc->algo > 0) {
        return apr_psprintf(p, "TBucketLease in %s: leases need "
                            "TBucketAlgorithm token-bucket, not %s", where,
                            tb_algo_name((tb_algo_t)dc->algo));
    }
    if (dc->concurrency > 0 && dc->lease > 0) {
        return apr_psprintf(p, "TBucketConcurrency in %s: every request "
                            "must ask Redis for its slot, and TBucketLease "
                            "applies there", where);
    }
    if (dc->concurrency > 0 && k > 1) {
        return apr_psprintf(p, "TBucketConcurrency in %s: a key's slots are "
                            "one set, and TBucketShards %d splits the key",
                            where, k);
    }
    if (dc->nrules && dc->algo > 0) {
        return apr_psprintf(p, "TBucketRule %s in %s: rules are token "
                            "buckets, decided with the scope's limit, and "
                            "TBucketAlgorithm %s applies there",
                            dc->rules[0]->name, where,
                            tb_algo_name((tb_algo_t)dc->algo));
    }
    if (dc->nrules && k > 1) {
        return apr_psprintf(p, "TBucketRule %s in %s: a rule's key is its "
                            "own, never split, and TBucketShards %d "
                            "applies there", dc->rules[0]->name, where, k);
    }
    if (k == 1) {
        return NULL;
    }
    if (dc->limit_set && shard_limit_bad(&dc->limit, k)) {
        bad = "TBucketLimit";
    }
    for (t = dc; !bad && t; t = t->tenants_up) {
        for (hi = t->tenants ? apr_hash_first(p, t->tenants) : NULL;
             hi && !bad; hi = apr_hash_next(hi)) {
            const void *key;
            void *v;

            apr_hash_this(hi, &key, NULL, &v);
            if (shard_limit_bad(v, k)) {
                bad = apr_psprintf(p, "TBucketTenant %s",
                                   (const char *)key);
            }
        }
    }
    for (i = 0; !bad && dc->routes && i < dc->routes->nelts; i++) {
        const tbucket_route *rt = &APR_ARRAY_IDX(dc->routes, i,
                                                 tbucket_route);

        if (shard_limit_bad(&rt->limit, k)) {
            bad = apr_psprintf(p, "TBucketRouteLimit %s", rt->name);
        }
    }
    return bad ? apr_psprintf(p, "TBucketShards %d in %s: %s split %d ways "
                              "leaves less than one token (or too slow a "
                              "rate) per shard", k, where, bad, k)
               : NULL;
}

/* A rule that recognises known clients by cookie needs the key that
 * signs them. */
static const char *refuse_known(apr_pool_t *p, const char *where,
                                const tbucket_dir_conf *dc, server_rec *s)
{
    const tbucket_srv_conf *sc = ap_get_module_config(s->module_config,
                                                      &tbucket_module);
    int i;

    for (i = 0; i < dc->nrules; i++) {
        if ((dc->rules[i]->known_by & TBUCKET_KNOWN_COOKIE) && !sc->secret) {
            return apr_psprintf(p, "TBucketRule %s in %s: known= signs "
                                "its cookies with TBucketSecret, which is "
                                "not set for this server",
                                dc->rules[i]->name, where);
        }
    }
    return NULL;
}

/* Log a refusal at startup and under apache2 -t. */
static int refused(server_rec *s, const char *msg)
{
    ap_log_error(APLOG_MARK, APLOG_EMERG | APLOG_STARTUP, 0, s,
                 TBLOGNO(00113) "%s", msg);
    return !OK;
}

/* Routes after merging add into base, before any is dropped. */
static int route_count(const apr_array_header_t *base,
                       const apr_array_header_t *add)
{
    int i, j, n = add ? add->nelts : 0, dup;

    for (i = 0; base && i < base->nelts; i++) {
        for (dup = 0, j = 0; add && j < add->nelts && !dup; j++) {
            dup = !strcmp(APR_ARRAY_IDX(base, i, tbucket_route).name,
                          APR_ARRAY_IDX(add, j, tbucket_route).name);
        }
        n += !dup;
    }
    return n;
}

static int check_sections(apr_pool_t *p, apr_hash_t *seen, server_rec *s,
                          const char *kind, apr_array_header_t *secs,
                          int *enabled)
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
        if (route_count(base->routes, dc->routes) > MAX_ROUTES) {
            warn_once(seen, s, apr_psprintf(p, "more than %d "
                      "TBucketRouteLimit buckets apply in <%s %s>: the "
                      "outermost are ignored", MAX_ROUTES, kind,
                      cd && cd->d ? cd->d : "?"));
        }
        const char *where = apr_psprintf(p, "<%s %s> of %s", kind,
                                         cd && cd->d ? cd->d : "?",
                                         s->defn_name ? s->defn_name
                                                      : "the main server");
        const tbucket_dir_conf *m = tbucket_merge_dir_conf(p, base, dc);
        const char *msg = refuse_scope(p, where, m);

        if (!msg) {
            msg = refuse_known(p, where, m, s);
        }
        if (msg) {
            return refused(s, msg);
        }
        if (dc->local_state == 1 && base->local_state == 1
            && base->nlocal + dc->nlocal > TBUCKET_MAX_LOCAL) {
            warn_once(seen, s, apr_psprintf(p, "more than %d "
                      "TBucketLocalConcurrency scopes apply in %s: the "
                      "outermost are ignored", TBUCKET_MAX_LOCAL, where));
        }
        *enabled |= m->enable == 1;
        check_scope(p, seen, s, where, m);
    }
    return OK;
}

/* Every server and each of its sections, in configuration order; the
 * first refusal stops the check (and the start) with !OK. A client is
 * created and freed for each server to let the core judge its options:
 * creating a client does not connect. */
int tbucket_check_config(apr_pool_t *pconf, apr_pool_t *plog,
                         apr_pool_t *ptemp, server_rec *main_s)
{
    apr_hash_t *seen = apr_hash_make(ptemp);
    server_rec *s;
    const char *msg;

    (void)pconf;
    (void)plog;
    for (s = main_s; s; s = s->next) {
        core_server_config *core = ap_get_core_module_config(
            s->module_config);
        tbucket_srv_conf *sc = ap_get_module_config(s->module_config,
                                                    &tbucket_module);
        const tbucket_dir_conf *dc;
        const char *where;
        tb_options_t o;
        tb_client_t *c;
        char err[TB_ERRSTR_LEN];
        int enabled;

        tbucket_client_options(sc, &o);
        o.local_entries = 64;
        if (!(c = tb_client_create(&o, err, sizeof(err)))) {
            ap_log_error(APLOG_MARK, APLOG_EMERG | APLOG_STARTUP, 0, s,
                         TBLOGNO(00102) "TBucketRedis in %s: %s",
                         s->defn_name ? s->defn_name : "the main server",
                         err);
            return !OK;
        }
        tb_client_free(c);
        where = s->defn_name ? apr_psprintf(ptemp, "<VirtualHost> at %s:%d",
                                            s->defn_name,
                                            s->defn_line_number)
                             : "the main server";
        dc = ap_get_module_config(s->lookup_defaults, &tbucket_module);
        if ((msg = refuse_scope(ptemp, where, dc))
            || (msg = refuse_known(ptemp, where, dc, s))) {
            return refused(s, msg);
        }
        check_scope(ptemp, seen, s, where, dc);
        enabled = dc->enable == 1;
        if (check_sections(ptemp, seen, s, "Directory", core->sec_dir,
                           &enabled) != OK
            || check_sections(ptemp, seen, s, "Location", core->sec_url,
                              &enabled) != OK) {
            return !OK;
        }
        if (sc->shed_min && !enabled) {
            warn_once(seen, s, apr_psprintf(ptemp, "TBucketShed in %s, but "
                      "TBucketEnable On nowhere there: no request is shed "
                      "(in <If> or .htaccess it cannot be seen here)",
                      where));
        }
    }
    if ((msg = tbucket_cpu_check(ptemp, main_s))) {
        return refused(main_s, msg);
    }
    return OK;
}
