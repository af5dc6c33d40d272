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

    for (i = 0; i < dc->nlimits; i++) {
        const tbucket_limit *ru = dc->limits[i];

        if (ru->ban_ms && ru->key_user && !ru->known_ms) {
            warn_once(seen, s, apr_psprintf(p, "TBucketRule %s in %s bans "
                      "a name clients choose (a form field, a header, the "
                      "user) without known=: anyone can lock its owner "
                      "out; add known=30d to keep clients that logged in "
                      "as it on a budget of their own", ru->name, where));
        }
    }
}

/* Whether a scope limits anything (a bucket, a concurrency limit, a
 * local scope) for sc's server. */
static int limits_something(const tbucket_dir_conf *dc,
                            const tbucket_srv_conf *sc)
{
    return dc->limit_set || dc->concurrency > 0 || dc->nlocal > 0
           || sc->shed_min || dc->nlimits;
}

/* Whether an <If>, <ElseIf> or <Else> inside a section limits: the
 * guide puts a login's limits in a POST-only <If> inside the section
 * that enables them, and check_config cannot merge those. */
static int ifs_limit(const core_dir_config *cd, const tbucket_srv_conf *sc)
{
    int i;

    for (i = 0; cd && cd->sec_if && i < cd->sec_if->nelts; i++) {
        ap_conf_vector_t *sec = APR_ARRAY_IDX(cd->sec_if, i,
                                              ap_conf_vector_t *);
        const tbucket_dir_conf *dc = ap_get_module_config(sec,
                                                          &tbucket_module);

        if (dc && limits_something(dc, sc)) {
            return 1;
        }
    }
    return 0;
}

/* TBucketEnable On where nothing limits, neither the scope nor an <If>
 * inside its section. */
static void check_enable(apr_pool_t *p, apr_hash_t *seen, server_rec *s,
                         const char *where, const tbucket_dir_conf *dc,
                         const core_dir_config *cd)
{
    const tbucket_srv_conf *sc = ap_get_module_config(s->module_config,
                                                      &tbucket_module);

    if (dc->enable == 1 && !limits_something(dc, sc) && !ifs_limit(cd, sc)) {
        warn_once(seen, s, apr_psprintf(p, "TBucketEnable On without a "
                  "TBucketLimit, TBucketRule, TBucketConcurrency, "
                  "TBucketLocalConcurrency or TBucketShed in %s: requests "
                  "there are not limited", where));
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

    (void)sc;
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
    for (i = 0; i < dc->nlimits; i++) {
        const tbucket_limit *l = dc->limits[i];

        check_cost(p, seen, s, where,
                   apr_psprintf(p, "%s %s", l->directive, l->name),
                   l->cost_set ? l->cost : dc->cost,
                   l->limit.capacity / (l->own_key ? 1 : shards));
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

/* Shards that must each keep a valid limit: a message naming the
 * directive and the scope, or NULL. */
static const char *refuse_shards(apr_pool_t *p, const char *where,
                                 const tbucket_dir_conf *dc)
{
    const tbucket_dir_conf *t;
    apr_hash_index_t *hi;
    int i, k = dc->shards > 1 ? dc->shards : 1;
    const char *bad = NULL;

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
    for (i = 0; !bad && i < dc->nlimits; i++) {
        const tbucket_limit *l = dc->limits[i];

        if (!l->own_key && shard_limit_bad(&l->limit, k)) {
            bad = apr_psprintf(p, "%s %s", l->directive, l->name);
        }
    }
    return bad ? apr_psprintf(p, "TBucketShards %d in %s: %s split %d ways "
                              "leaves less than one token (or too slow a "
                              "rate) per shard", k, where, bad, k)
               : NULL;
}

/* ---- What cannot go together ------------------------------------------ */

/* A record's own name as messages give it: "TBucketRule user". */
static const char *named_as(apr_pool_t *p, const tbucket_limit *l)
{
    return l->name ? apr_psprintf(p, "%s %s", l->directive, l->name)
                   : l->directive;
}

/* The first named limit of dc with (own 1) or without a key of its own. */
static const tbucket_limit *first_limit(const tbucket_dir_conf *dc, int own)
{
    int i;

    for (i = 0; i < dc->nlimits; i++) {
        if (!dc->limits[i]->off && dc->limits[i]->own_key == own) {
            return dc->limits[i];
        }
    }
    return NULL;
}

/* The rows' tests. A scope's: B as the message names it, or NULL when
 * dc (of server sc) does not have both; *a gets A's name when it is a
 * limit's. A record's: non-NULL when l has both. */
static const char *lease_scoped(apr_pool_t *p, const tbucket_dir_conf *dc,
                                const tbucket_srv_conf *sc, const char **a)
{
    const tbucket_limit *l = first_limit(dc, 0);

    (void)sc;
    (void)a;
    return dc->lease > 0 && l ? named_as(p, l) : NULL;
}

static const char *algo_b(apr_pool_t *p, const tbucket_dir_conf *dc)
{
    return dc->algo > 0 ? apr_psprintf(p, "TBucketAlgorithm %s",
                                       tb_algo_name((tb_algo_t)dc->algo))
                        : NULL;
}

static const char *shards_b(apr_pool_t *p, const tbucket_dir_conf *dc)
{
    return dc->shards > 1 ? apr_psprintf(p, "TBucketShards %d", dc->shards)
                          : NULL;
}

static const char *lease_algo(apr_pool_t *p, const tbucket_dir_conf *dc,
                              const tbucket_srv_conf *sc, const char **a)
{
    (void)sc;
    (void)a;
    return dc->lease > 0 ? algo_b(p, dc) : NULL;
}

static const char *conc_lease(apr_pool_t *p, const tbucket_dir_conf *dc,
                              const tbucket_srv_conf *sc, const char **a)
{
    (void)p;
    (void)sc;
    (void)a;
    return dc->concurrency > 0 && dc->lease > 0 ? "TBucketLease" : NULL;
}

static const char *conc_shards(apr_pool_t *p, const tbucket_dir_conf *dc,
                               const tbucket_srv_conf *sc, const char **a)
{
    (void)sc;
    (void)a;
    return dc->concurrency > 0 ? shards_b(p, dc) : NULL;
}

static const char *own_algo(apr_pool_t *p, const tbucket_dir_conf *dc,
                            const tbucket_srv_conf *sc, const char **a)
{
    const tbucket_limit *l = first_limit(dc, 1);

    (void)sc;
    *a = l ? named_as(p, l) : NULL;
    return l ? algo_b(p, dc) : NULL;
}

static const char *own_shards(apr_pool_t *p, const tbucket_dir_conf *dc,
                              const tbucket_srv_conf *sc, const char **a)
{
    const tbucket_limit *l = first_limit(dc, 1);

    (void)sc;
    *a = l ? named_as(p, l) : NULL;
    return l ? shards_b(p, dc) : NULL;
}

static const char *cookie_secret(apr_pool_t *p, const tbucket_dir_conf *dc,
                                 const tbucket_srv_conf *sc, const char **a)
{
    int i;

    for (i = 0; i < dc->nlimits && !sc->secret; i++) {
        if (dc->limits[i]->known_by & TBUCKET_KNOWN_COOKIE) {
            *a = named_as(p, dc->limits[i]);
            return "no TBucketSecret for this server";
        }
    }
    return NULL;
}

static int user_options(const tbucket_limit *l)
{
    return l->counted || l->ban_ms || l->known_ms;
}

static int opts_scoped(const tbucket_limit *l)
{
    return l->name && !l->own_key && user_options(l);
}

static int opts_unnamed(const tbucket_limit *l)
{
    return !l->name && (l->own_key || user_options(l));
}

static int known_uncounted(const tbucket_limit *l)
{
    return l->known_ms && !l->counted;
}

static int named_algo(const tbucket_limit *l)
{
    return l->name && l->algo != -1;
}

typedef struct tbucket_combo {
    const char *a, *b, *why;          /* As the reference prints them.  */
    const char *(*scope)(apr_pool_t *p, const tbucket_dir_conf *dc,
                         const tbucket_srv_conf *sc, const char **a);
    int (*record)(const tbucket_limit *l);
} tbucket_combo;

/* Every pair that cannot work, and why; docs/reference.txt prints this
 * table ("What cannot go together") and a test holds the two equal.
 * Everything not here goes together. */
static const tbucket_combo combos[] = {
    { "TBucketLease", "a named limit without key=",
      "a lease takes one bucket", lease_scoped, NULL },
    { "TBucketLease", "TBucketAlgorithm other than token-bucket",
      "a lease is a token bucket's tokens", lease_algo, NULL },
    { "TBucketConcurrency", "TBucketLease",
      "every request must ask Redis for its slot", conc_lease, NULL },
    { "TBucketConcurrency", "TBucketShards",
      "a key's slots are one set, never split", conc_shards, NULL },
    { "key=", "TBucketAlgorithm other than token-bucket",
      "a limit with a key of its own is a token bucket (it holds count= "
      "reservations and bans)", own_algo, NULL },
    { "key=", "TBucketShards",
      "a limit with a key of its own is never split", own_shards, NULL },
    { "known-by=cookie", "a server without TBucketSecret",
      "known= signs its cookies with TBucketSecret", cookie_secret, NULL },
    { "count=, ban= or known=", "a named limit without key=",
      "they act on a bucket with a key of its own (key=%{REMOTE_ADDR} "
      "for the client's address)", NULL, opts_scoped },
    { "key=, count=, ban= or known=", "the unnamed TBucketLimit",
      "the unnamed limit is the scope's own bucket, keyed by TBucketKey: "
      "give the limit a NAME", NULL, opts_unnamed },
    { "known=", "a limit without count=",
      "a client becomes known by a status the limit does not count",
      NULL, known_uncounted },
    { "algorithm=", "a named limit",
      "a named limit is decided in the scope's call, by the scope's "
      "algorithm (TBucketAlgorithm, or algorithm= on the unnamed "
      "TBucketLimit)", NULL, named_algo },
    { NULL }
};

const char *tbucket_refuse_options(cmd_parms *cmd, const tbucket_limit *l)
{
    const tbucket_combo *c;

    for (c = combos; c->a; c++) {
        if (c->record && c->record(l)) {
            return apr_psprintf(cmd->pool, "%s: %s with %s: %s",
                                named_as(cmd->temp_pool, l), c->a, c->b,
                                c->why);
        }
    }
    return NULL;
}

/* What one effective scope asks that cannot work, as a message naming
 * the directive and the scope, or NULL: the table's scope rows, then
 * shards that must each keep a valid limit (shard_limit_bad). */
static const char *refuse_scope(apr_pool_t *p, const char *where,
                                const tbucket_dir_conf *dc, server_rec *s)
{
    const tbucket_srv_conf *sc = ap_get_module_config(s->module_config,
                                                      &tbucket_module);
    const tbucket_combo *c;

    for (c = combos; c->a; c++) {
        const char *a = NULL, *b = c->scope ? c->scope(p, dc, sc, &a)
                                            : NULL;

        if (b) {
            return apr_psprintf(p, "%s in %s: %s, and %s applies there",
                                a ? a : c->a, where, c->why, b);
        }
    }
    return refuse_shards(p, where, dc);
}

/* Log a refusal at startup and under apache2 -t. */
static int refused(server_rec *s, const char *msg)
{
    ap_log_error(APLOG_MARK, APLOG_EMERG | APLOG_STARTUP, 0, s,
                 TBLOGNO(00113) "%s", msg);
    return !OK;
}

/* The first named limit a section of s declares (its own, not merged),
 * as "DIRECTIVE NAME in WHERE", into *declared when still NULL. */
static void note_declared(apr_pool_t *p, const tbucket_dir_conf *dc,
                          const char *where, const char **declared)
{
    if (!*declared && dc->nlimits && !dc->limits[0]->off) {
        *declared = apr_psprintf(p, "%s %s in %s", dc->limits[0]->directive,
                                 dc->limits[0]->name, where);
    }
}

static int check_sections(apr_pool_t *p, apr_hash_t *seen, server_rec *s,
                          const char *kind, apr_array_header_t *secs,
                          int *enabled, const char **declared)
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
        const char *dropped;

        if (tbucket_limits_dropped(base, dc, &dropped, p)) {
            warn_once(seen, s, apr_psprintf(p, "more than %d named limits "
                      "apply in <%s %s>: the outermost (%s) are dropped "
                      "there", TBUCKET_MAX_LIMITS, kind,
                      cd && cd->d ? cd->d : "?", dropped));
        }
        const char *where = apr_psprintf(p, "<%s %s> of %s", kind,
                                         cd && cd->d ? cd->d : "?",
                                         s->defn_name ? s->defn_name
                                                      : "the main server");
        const tbucket_dir_conf *m = tbucket_merge_dir_conf(p, base, dc);
        const char *msg = refuse_scope(p, where, m, s);

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
        note_declared(p, dc, where, declared);
        check_enable(p, seen, s, where, m, cd);
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
    const char *msg, *declared;

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
        if ((msg = refuse_scope(ptemp, where, dc, s))) {
            return refused(s, msg);
        }
        check_enable(ptemp, seen, s, where, dc, NULL);
        check_scope(ptemp, seen, s, where, dc);
        enabled = dc->enable == 1;
        declared = NULL;
        note_declared(ptemp, dc, where, &declared);
        if (check_sections(ptemp, seen, s, "Directory", core->sec_dir,
                           &enabled, &declared) != OK
            || check_sections(ptemp, seen, s, "Location", core->sec_url,
                              &enabled, &declared) != OK) {
            return !OK;
        }
        if (declared && !enabled) {
            warn_once(seen, s, apr_psprintf(ptemp, "%s, but TBucketEnable "
                      "On nowhere in %s: it never applies (an <If> or "
                      ".htaccess that turns it on cannot be seen here)",
                      declared, where));
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
