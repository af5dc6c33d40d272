/* tbucket_client.c -- each child's Redis clients.
 *
 * One libtb client per distinct Redis configuration (URL, timeouts,
 * pool, policy, breaker, TLS) per child process, made in child_init so
 * that no connection is ever shared across fork and each generation of
 * children has its own, and freed with the child's pool. post_config
 * gives each server the identity of its configuration and warns once
 * about TLS without verification. The breaker's transitions, which any
 * decision or settlement may report, are logged here once each, with why
 * the breaker opened kept for the status page.
 */
#include "apr_hash.h"
#include "apr_strings.h"

#include <signal.h>

#include "httpd.h"
#include "http_config.h"
#include "http_log.h"

#include "mod_tbucket.h"

APLOG_USE_MODULE(tbucket);

/* Set by a pre-cleanup of the child's pool, which runs before the pools
 * under it (connections, requests) are destroyed: a request's cleanup
 * then knows that the child is going away (prefork does it from a signal
 * handler) and leaves its slot to expire instead of talking to Redis. */
static volatile sig_atomic_t child_exiting;

static tbucket_srv_conf *srv_conf(const server_rec *s)
{
    return ap_get_module_config(s->module_config, &tbucket_module);
}

int tbucket_child_exiting(void)
{
    return child_exiting;
}

static const char *signature(apr_pool_t *p, const tbucket_srv_conf *sc)
{
    const tb_tls_options_t *t = &sc->tls;

    return apr_psprintf(p, "%s|%d|%d|%d|%d|%d|%d|%" APR_INT64_T_FMT
                        "|%s|%s|%s|%s|%d|%d|%d",
                        sc->url ? sc->url : TB_DEFAULT_URL, sc->timeout_ms,
                        sc->connect_timeout_ms, sc->pool_size,
                        (int)sc->policy, sc->replicas,
                        sc->breaker_threshold, sc->breaker_cooldown_ms,
                        t->ca_file ? t->ca_file : "",
                        t->cert_file ? t->cert_file : "",
                        t->key_file ? t->key_file : "",
                        t->server_name ? t->server_name : "",
                        t->no_verify, sc->engine, sc->coalesce);
}

/* tls_verify=off, once per Redis configuration and (re)start. */
static void warn_no_verify(apr_hash_t *warned, server_rec *s,
                           const tbucket_srv_conf *sc)
{
    tb_redis_addr_t a;
    char label[TBUCKET_NAME_LEN], err[160];

    if (!sc->tls_ctx || !sc->tls.no_verify
        || apr_hash_get(warned, sc->signature, APR_HASH_KEY_STRING)) {
        return;
    }
    apr_hash_set(warned, sc->signature, APR_HASH_KEY_STRING, "");
    if (tb_url_parse(sc->url, &a, err, sizeof(err)) == TB_OK) {
        tb_url_redact(&a, label, sizeof(label));
    }
    else {
        apr_cpystrn(label, "?", sizeof(label));
    }
    ap_log_error(APLOG_MARK, APLOG_WARNING, 0, s, TBLOGNO(00131)
                 "TBucketRedis %s has tls_verify=off: the server's "
                 "certificate is not checked, so anyone on the path can "
                 "pose as Redis", label);
}

/* One connection per child, whatever the MPM. Under prefork a child
 * serves one request at a time: there is nothing to batch. Under a
 * threaded MPM the threads of a child that decide at the same moment
 * share that connection's next write and read, and every further
 * connection splits them into smaller batches that cost CPU per request.
 * Measured with Apache event CPU-bound beside Redis (make bench, floor
 * part, medians of three runs): pool 1 1.18x the one-round-trip floor's
 * req/s, 2 1.07x, 4 1.03x, 8 0.99x; p99 best at 1. What one connection
 * gives up is overlap: Redis idles while a batch's replies are handed
 * out, so a child's ceiling is one batch per round trip (the core alone,
 * 32 threads on loopback: about 60k decisions/s with 1, 100k with 2),
 * far above what one child serves. pool= on TBucketRedis overrides it. */
static int default_pool_size(void)
{
    return 1;
}

void tbucket_clients_post_config(apr_pool_t *pconf, apr_pool_t *ptemp,
                                 server_rec *main_s)
{
    apr_hash_t *warned = apr_hash_make(ptemp);
    server_rec *s;
    int pool = default_pool_size();

    for (s = main_s; s; s = s->next) {
        tbucket_srv_conf *sc = srv_conf(s);

        if (!(sc->set & TBUCKET_SET_POOL)) {
            sc->pool_size = pool;
        }
        sc->signature = signature(pconf, sc);
        warn_no_verify(warned, s, sc);
    }
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
    tb_redis_addr_t a;
    char err[TB_ERRSTR_LEN];

    tbucket_client_options(sc, &o);
    if (sc->coalesce_url) {
        /* The coalescer is Redis to the children: TLS, AUTH and SELECT
         * are its own connection's. The parent's own clients (the lease
         * drain, check_config) go to Redis itself: at a stop the
         * coalescer may already be gone. */
        o.url = sc->coalesce_url;
        memset(&o.tls, 0, sizeof(o.tls));
        o.tls_ctx = NULL;
        /* Behind it a Cluster: calls still go one slot at a time. */
        o.cluster_keys = sc->url
            && tb_url_parse(sc->url, &a, err, sizeof(err)) == TB_OK
            && a.kind == TB_REDIS_CLUSTER;
    }
    o.local = tbucket_local_table();
    /* Leases live in the segment, shared by every child; each keeps
     * the slot of its Redis configuration, for the drain. */
    o.leases = tbucket_lease_table();
    o.lease_owner = sc->client_slot;
    c->slot = tbucket_shm_client(sc);
    if (c->slot) {
        o.stats = &c->slot->stats;
    }
    c->s = s;
    c->label = c->slot ? c->slot->redis : "?";
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

static apr_status_t note_child_exit(void *data)
{
    (void)data;
    child_exiting = 1;
    return APR_SUCCESS;
}

void tbucket_clients_child_init(apr_pool_t *pchild, server_rec *main_s)
{
    apr_hash_t *made = apr_hash_make(pchild);
    server_rec *s;

    child_exiting = 0;
    apr_pool_pre_cleanup_register(pchild, NULL, note_child_exit);
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

/* The core says which call opened or closed the breaker: log that once,
 * not once per request while it lasts, and keep why it opened for the
 * status page. */
void tbucket_note_breaker(request_rec *r, const tbucket_client *c,
                          const tb_result_t *res, const tbucket_srv_conf *sc)
{
    if (res->breaker_change > 0) {
        char why[TB_ERRSTR_LEN];

        /* Other threads of this child may be writing errstr (the core
         * keeps it for diagnostics, unlocked): one bounded copy, so the
         * log line and the status page tell the same reason. */
        apr_cpystrn(why, c->tb->errstr, sizeof(why));
        ap_log_error(APLOG_MARK, APLOG_WARNING, 0, r->server, TBLOGNO(00105)
                     "Redis %s is failing (%s: %s): breaker open, the "
                     "%s policy decides for %" APR_INT64_T_FMT " ms",
                     c->label, tb_err_name(res->err), why,
                     tb_policy_name((tb_policy_t)sc->policy), sc->breaker_cooldown_ms);
        tbucket_shm_note_failure(c->slot, res->err, why, apr_time_now());
    }
    else if (res->breaker_change < 0) {
        ap_log_error(APLOG_MARK, APLOG_NOTICE, 0, r->server, TBLOGNO(00106)
                     "Redis %s answers again: breaker closed", c->label);
    }
}
