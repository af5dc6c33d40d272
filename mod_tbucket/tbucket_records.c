/* tbucket_records.c -- mod_tbucket's configuration records.
 *
 * The server and directory records with their create and merge functions,
 * and the client options a server's record stands for. They follow
 * httpd's conventions: every scalar is unset until a directive sets it
 * (mod_proxy's _set flags, nginx's -1), and a merge makes a new record,
 * taking what the inner scope set and the outer scope's value otherwise,
 * never changing either (mod_headers). Merges run per request, so they
 * only copy: tenant tables are chained, not merged.
 */
#include "apr_hash.h"
#include "apr_strings.h"
#include "apr_tables.h"

#include "httpd.h"
#include "http_config.h"

#include "mod_tbucket.h"

/* ---- Configuration records ------------------------------------------ */

void *tbucket_create_srv_conf(apr_pool_t *p, server_rec *s)
{
    tbucket_srv_conf *sc = apr_pcalloc(p, sizeof(*sc));

    (void)s;
    sc->timeout_ms = 50;
    sc->policy = TB_POLICY_OPEN;
    sc->replicas = 1;
    sc->breaker_threshold = 5;
    sc->breaker_cooldown_ms = 10000;
    sc->prefix = TBUCKET_DEFAULT_PREFIX;
    sc->ip_prefix = TBUCKET_DEFAULT_PREFIX "ip:";
    sc->ipv6_bits = TB_DEFAULT_IPV6_BITS;
    sc->shed_retry_s = 1;
    sc->refusal_log = TBUCKET_REFUSAL_LOG_INFO;
    sc->top_k = TBUCKET_DEFAULT_TOP_K;   /* GLOBAL_ONLY: never unset */
    sc->vhost_slot = -1;
    sc->client_slot = -1;
    return sc;
}

/* A virtual host takes what it sets and inherits the rest from the main
 * server; field by field, so "TBucketRedis URL" in a vhost keeps the main
 * server's timeout. Allocates a new record; base and add are untouched. */
void *tbucket_merge_srv_conf(apr_pool_t *p, void *basev, void *addv)
{
    const tbucket_srv_conf *base = basev, *add = addv;
    tbucket_srv_conf *m = apr_pcalloc(p, sizeof(*m));

#define TAKE(field, bit) \
    (m->field = (add->set & (bit)) ? add->field : base->field)
    TAKE(url, TBUCKET_SET_URL);
    TAKE(timeout_ms, TBUCKET_SET_TIMEOUT);
    TAKE(connect_timeout_ms, TBUCKET_SET_CONNECT_TIMEOUT);
    TAKE(pool_size, TBUCKET_SET_POOL);
    TAKE(policy, TBUCKET_SET_POLICY);
    TAKE(replicas, TBUCKET_SET_REPLICAS);
    TAKE(breaker_threshold, TBUCKET_SET_THRESHOLD);
    TAKE(breaker_cooldown_ms, TBUCKET_SET_COOLDOWN);
    TAKE(prefix, TBUCKET_SET_PREFIX);
    TAKE(ip_prefix, TBUCKET_SET_PREFIX);
    TAKE(ipv6_bits, TBUCKET_SET_IPV6);
    TAKE(tls, TBUCKET_SET_URL);
    TAKE(tls_ctx, TBUCKET_SET_URL);
    TAKE(engine, TBUCKET_SET_URL);
    TAKE(coalesce, TBUCKET_SET_URL);
    TAKE(shed_min, TBUCKET_SET_SHED);
    TAKE(shed_retry_s, TBUCKET_SET_SHED_RETRY);
    TAKE(refusal_log, TBUCKET_SET_REFUSAL_LOG);
    TAKE(secret, TBUCKET_SET_SECRET);
#undef TAKE
    m->top_k = base->top_k;
    m->cpu_on = base->cpu_on;
    memcpy(m->cpu_step, base->cpu_step, sizeof(m->cpu_step));
    m->set = add->set | base->set;
    memcpy(m->shed_pct, (add->set & TBUCKET_SET_SHED) ? add->shed_pct
                                                      : base->shed_pct,
           sizeof(m->shed_pct));
    m->vhost_slot = -1;
    m->client_slot = -1;
    return m;
}

/* Options of the client a server will make in each child. */
void tbucket_client_options(const tbucket_srv_conf *sc, tb_options_t *o)
{
    tb_options_init(o);
    o->url = sc->url ? sc->url : TB_DEFAULT_URL;
    o->timeout_ms = sc->timeout_ms;
    o->connect_timeout_ms = sc->connect_timeout_ms;
    if (sc->pool_size > 0) {
        o->pool_size = sc->pool_size;
    }
    o->breaker_threshold = sc->breaker_threshold;
    o->breaker_cooldown_ms = sc->breaker_cooldown_ms;
    o->policy = (tb_policy_t)sc->policy;
    o->replicas = sc->replicas;
    o->tls = sc->tls;
    o->engine = (tb_engine_t)sc->engine;
    o->tls_ctx = sc->tls_ctx;
}

void *tbucket_create_dir_conf(apr_pool_t *p, char *dir)
{
    tbucket_dir_conf *dc = apr_pcalloc(p, sizeof(*dc));

    (void)dir;
    dc->enable = -1;
    dc->shadow = -1;
    dc->headers = -1;
    dc->algo = -1;
    dc->cost = 1;
    dc->lease = -1;
    dc->shards = -1;
    dc->concurrency = -1;
    dc->priority = -1;
    dc->local_state = -1;
    dc->form_limit = -1;
    dc->form_timeout_ms = -1;
    return dc;
}

/* The local scopes of add after base's, outer first and each once; past
 * TBUCKET_MAX_LOCAL the outermost are dropped (check_config warns). Off
 * in add ends the outer ones. */
static void merge_local(tbucket_dir_conf *m, const tbucket_dir_conf *base,
                        const tbucket_dir_conf *add)
{
    const tbucket_local_scope *all[2 * TBUCKET_MAX_LOCAL];
    int i, j, n = 0;

    if (add->local_state == -1) {
        m->local_state = base->local_state;
        m->nlocal = base->nlocal;
        memcpy(m->local, base->local, sizeof(m->local));
        return;
    }
    m->local_state = add->local_state;
    if (add->local_state == 1) {
        for (i = 0; i < base->nlocal; i++) {
            all[n++] = base->local[i];
        }
    }
    for (i = 0; i < add->nlocal; i++) {
        for (j = 0; j < n && all[j] != add->local[i]; j++) {
        }
        if (j == n) {
            all[n++] = add->local[i];
        }
    }
    i = n > TBUCKET_MAX_LOCAL ? n - TBUCKET_MAX_LOCAL : 0;
    m->nlocal = n - i;
    memcpy(m->local, all + i, (size_t)m->nlocal * sizeof(all[0]));
}

/* Runs per request (server/request.c merges sections as it walks), so it
 * copies scalars and pointers only: the tenant tables are chained, not
 * copied, and the named limits are an array of pointers. */
void *tbucket_merge_dir_conf(apr_pool_t *p, void *basev, void *addv)
{
    const tbucket_dir_conf *base = basev, *add = addv, *from;
    tbucket_dir_conf *m = apr_palloc(p, sizeof(*m));

    m->enable = add->enable != -1 ? add->enable : base->enable;
    m->shadow = add->shadow != -1 ? add->shadow : base->shadow;
    m->headers = add->headers != -1 ? add->headers : base->headers;
    m->algo = add->algo != -1 ? add->algo : base->algo;
    m->key_set = add->key_set | base->key_set;
    m->key = add->key_set ? add->key : base->key;
    m->key_late = add->key_set ? add->key_late : base->key_late;
    m->key_is_addr = add->key_set ? add->key_is_addr : base->key_is_addr;
    m->key_const = add->key_set ? add->key_const : base->key_const;
    m->limit_set = add->limit_set | base->limit_set;
    m->limit = add->limit_set ? add->limit : base->limit;
    m->rule = add->limit_set ? add->rule : base->rule;
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
    /* A lease and a concurrency limit each come with their ttl. */
    from = add->lease != -1 ? add : base;
    m->lease = from->lease;
    m->lease_ttl_ms = from->lease_ttl_ms;
    m->shards = add->shards != -1 ? add->shards : base->shards;
    m->cost_header = add->cost_header ? add->cost_header : base->cost_header;
    from = add->concurrency != -1 ? add : base;
    m->concurrency = from->concurrency;
    m->concurrency_ttl_ms = from->concurrency_ttl_ms;
    m->priority = add->priority != -1 ? add->priority : base->priority;
    m->prio_lowered = 0;
    if (add->priority != -1 && add->prio_lowered) {
        /* .htaccess lowers, never raises (tbucket_config.c). */
        int outer = base->priority != -1 ? base->priority
                                         : TBUCKET_PRIO_NORMAL;

        m->priority = add->priority < outer ? add->priority : outer;
    }
    merge_local(m, base, add);
    tbucket_limits_merge(m, base, add);
    return m;
}
