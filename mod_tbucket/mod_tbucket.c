/* mod_tbucket.c -- shared Redis token-bucket rate limits for Apache httpd.
 *
 * Every replica of a server checks and deducts the same buckets in Redis,
 * through libtb (shared/tb.h), in one round trip per request, so a
 * client's limit does not depend on how many replicas there are. This file
 * holds the module record, the hooks and the request path: post_config
 * and child_init make the shared memory slots and each child's clients;
 * check_access and fixups decide each request (its key, the buckets it
 * takes, shard and lease, the decision) and answer it. The directives,
 * their manual and the configuration records are in tbucket_config.c, the
 * checks across scopes in tbucket_check.c, the shared memory segment in
 * tbucket_shm.c, and the status page in tbucket_status.c and
 * tbucket_status_html.c.
 *
 * A limited request is counted once, however many sub-requests, internal
 * redirects (PHP through mod_actions) or ErrorDocument redirects it makes.
 * Rejected requests get 429, Retry-After in whole seconds (at least 1) and
 * {"error":"rate limited","retry_after":N} unless ErrorDocument 429 is
 * set. A cost that can never fit a bucket gets 403 with a body saying so.
 * TBUCKET_DECISION and TBUCKET_REMAINING are set in the environment of the
 * final request, for CGI, PHP and LogFormat %{...}e. Leases are
 * tbucket_lease.c's, and settling the cost a response reports
 * (TBucketCostHeader) is tbucket_settle.c's: a decision here records
 * what both need.
 *
 * A concurrency limit (TBucketConcurrency) takes a slot in the same call
 * and gives it back once, when the chain's first request's pool is
 * destroyed: that pool is shared by the chain's internal redirects, and
 * httpd destroys it once, after the response is written (the EOR bucket),
 * whatever the end: success, error status, ErrorDocument, an aborted
 * client or a handler that timed out. log_transaction would run at the
 * same moment, but a pool cleanup cannot be skipped or run twice. A
 * refusal by concurrency gets 429, Retry-After: 1 and
 * {"error":"too many concurrent requests","limit":N}.
 */
#include "apr_atomic.h"
#include "apr_general.h"
#include "apr_hash.h"
#include "apr_strings.h"

#include <signal.h>
#include <unistd.h>

#include "httpd.h"
#include "http_config.h"
#include "http_core.h"
#include "http_log.h"
#include "http_protocol.h"
#include "http_request.h"
#include "mod_core.h"

#include "mod_tbucket.h"


/* Per-process state of the shard choice (see pick_shard). */
static apr_uint64_t shard_seed;
static volatile apr_uint32_t shard_seq;

/* A concurrency slot held by a request chain, released by a cleanup on
 * the chain's first request's pool. The request is copied: the release
 * needs its prefix, key and ttl after the request's own data is gone. */
typedef struct tbucket_held {
    tbucket_srv_conf *sc;
    tb_request_t q;
    tb_slot_t slot;
} tbucket_held;

/* Set by a pre-cleanup of the child's pool, which runs before the pools
 * under it (connections, requests) are destroyed: a request's cleanup
 * then knows that the child is going away (prefork does it from a signal
 * handler) and leaves the slot to expire instead of talking to Redis. */
static volatile sig_atomic_t child_exiting;

static tbucket_srv_conf *srv_conf(const server_rec *s)
{
    return ap_get_module_config(s->module_config, &tbucket_module);
}

/* ---- Startup: shared memory (parent) and clients (children) --------- */

static const char *signature(apr_pool_t *p, const tbucket_srv_conf *sc)
{
    const tb_tls_options_t *t = &sc->tls;

    return apr_psprintf(p, "%s|%d|%d|%d|%d|%d|%d|%" APR_INT64_T_FMT
                        "|%s|%s|%s|%s|%d",
                        sc->url ? sc->url : TB_DEFAULT_URL, sc->timeout_ms,
                        sc->connect_timeout_ms, sc->pool_size,
                        (int)sc->policy, sc->replicas,
                        sc->breaker_threshold, sc->breaker_cooldown_ms,
                        t->ca_file ? t->ca_file : "",
                        t->cert_file ? t->cert_file : "",
                        t->key_file ? t->key_file : "",
                        t->server_name ? t->server_name : "",
                        t->no_verify);
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

static int post_config(apr_pool_t *pconf, apr_pool_t *plog,
                       apr_pool_t *ptemp, server_rec *main_s)
{
    apr_hash_t *warned = apr_hash_make(ptemp);
    server_rec *s;
    int pool = default_pool_size();

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
        warn_no_verify(warned, s, sc);
    }
    if (tbucket_shm_setup(pconf, plog, main_s) != OK
        || tbucket_local_setup(pconf, main_s) != OK) {
        return HTTP_INTERNAL_SERVER_ERROR;
    }
    tbucket_lease_setup(pconf, main_s);
    return OK;
}

static int pre_config(apr_pool_t *pconf, apr_pool_t *plog,
                      apr_pool_t *ptemp)
{
    (void)plog;
    (void)ptemp;
    tbucket_local_pre_config(pconf);
    return OK;
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

    tbucket_client_options(sc, &o);
    o.local = tbucket_local_table();
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

/* One client per distinct Redis configuration per child, made here so
 * that no connection is ever shared across fork and each generation of
 * children has its own. */
static apr_status_t note_child_exit(void *data)
{
    (void)data;
    child_exiting = 1;
    return APR_SUCCESS;
}

static void child_init(apr_pool_t *pchild, server_rec *main_s)
{
    apr_hash_t *made = apr_hash_make(pchild);
    server_rec *s;

    child_exiting = 0;
    apr_pool_pre_cleanup_register(pchild, NULL, note_child_exit);

    /* Each child its own shard sequence. */
    if (apr_generate_random_bytes((unsigned char *)&shard_seed,
                                  sizeof(shard_seed)) != APR_SUCCESS) {
        shard_seed = (apr_uint64_t)getpid() * 0x2545f4914f6cdd1dULL
                     ^ (apr_uint64_t)apr_time_now();
    }

    tbucket_lease_child_init();
    tbucket_local_child_init();
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
    if (rq->remaining) {
        apr_table_setn(r->subprocess_env, "TBUCKET_REMAINING",
                       rq->remaining);
    }
}

/* The client key, and the prefix its bucket lives under. A client keyed
 * by its IP, with no TBucketKey or an empty one, always lives under
 * "<prefix>ip:": were an IP bucket "<prefix>{IP}", a client sending
 * "X-API-Key: <victim's IP>" to a Location keyed by that header could
 * drain the victim's bucket of a Location keyed by IP. */
static const char *ip_key(request_rec *r, const tbucket_srv_conf *sc)
{
    const char *ip = r->useragent_ip;
    char *out;

    /* IPv4, the common case, is its own key: no copy. An IPv6 client is
     * keyed by its network (TBucketIPv6Prefix). */
    if (!ip || !strchr(ip, ':')) {
        return ip;
    }
    out = apr_palloc(r->pool, TB_IP_KEY_LEN);
    return tb_ip_key(ip, sc->ipv6_bits, out, TB_IP_KEY_LEN) ? out : ip;
}

static const char *request_key(request_rec *r, const tbucket_dir_conf *dc,
                               const tbucket_srv_conf *sc,
                               const char **prefix)
{
    const char *key = NULL, *err = NULL;

    *prefix = sc->prefix;
    if (!dc->key) {
        *prefix = sc->ip_prefix;
        return ip_key(r, sc);
    }
    key = ap_expr_str_exec(r, dc->key, &err);
    if (err) {
        ap_log_rerror(APLOG_MARK, APLOG_DEBUG, 0, r, TBLOGNO(00104)
                      "TBucketKey could not be evaluated (%s): keyed by "
                      "the client IP", err);
        key = NULL;
    }
    if (!key || !*key) {
        *prefix = sc->ip_prefix;
        return ip_key(r, sc);
    }
    return key;
}

static const tb_limit_t *tenant_limit(const tbucket_dir_conf *dc,
                                      const char *key)
{
    const tbucket_dir_conf *t;
    int hops = 0;

    for (t = dc; t && hops < 64; t = t->tenants_up, hops++) {
        const tb_limit_t *lim = t->tenants
            ? apr_hash_get(t->tenants, key, APR_HASH_KEY_STRING) : NULL;

        if (lim) {
            return lim;
        }
    }
    return &dc->limit;
}

static int build_takes(const tbucket_dir_conf *dc, const char *key,
                       tb_take_t *takes)
{
    int i, n = 1;

    /* Zeroed first: fields the core may add later default to 0. */
    memset(takes, 0, TB_MAX_BUCKETS * sizeof(*takes));
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

/* ---- Hot-tenant shards ---------------------------------------------- */

/* The shard of a request: uniform at random, from a per-process seed and
 * an atomic sequence through splitmix64, so threads need no lock and
 * children no shared state. Random rather than round-robin: a counter
 * shared by every key aliases with interleaved clients (two tenants
 * taking turns under K = 2 would each see one shard only), and a
 * counter per key would need a shared table and a lock per request.
 * Whatever the choice, K shards of capacity/K and rate/K never admit
 * more than the whole bucket; random only costs some early refusals of
 * a client close to its limit (the README measures it). */
static int pick_shard(int k)
{
    apr_uint64_t z = shard_seed
                     + 0x9e3779b97f4a7c15ULL
                       * ((apr_uint64_t)apr_atomic_inc32(&shard_seq) + 1);

    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    z ^= z >> 31;
    return (int)(z % (apr_uint64_t)k);
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
                     tb_policy_name(sc->policy), sc->breaker_cooldown_ms);
        tbucket_shm_note_failure(c->slot, res->err, why, apr_time_now());
    }
    else if (res->breaker_change < 0) {
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
    /* We answer outside httpd's error path, so add what it would add:
     * the filters of "Header always" (CORS, HSTS) and friends. */
    ap_run_insert_error_filter(r);
    ap_set_content_type(r, "application/json");
    ap_set_content_length(r, (apr_off_t)strlen(body));
    if (!r->header_only) {
        ap_rputs(body, r);
    }
    return DONE;
}

/* ---- Concurrency slots ------------------------------------------------ */

/* Give the chain's slot back: a pre-cleanup of the first request's
 * pool, which httpd destroys once, after the response is written (when
 * the EOR bucket goes), however the chain ended. A child on its way out
 * leaves the slot to expire. */
static apr_status_t release_slot(void *data)
{
    tbucket_held *h = data;
    tbucket_client *c = h->sc->client;

    tbucket_count_slot(h->sc, TBUCKET_SLOT_RELEASED);
    if (child_exiting || !c || !c->tb) {
        tbucket_count_slot(h->sc, TBUCKET_SLOT_RELEASE_FAILED);
        return APR_SUCCESS;
    }
    if (tb_client_release(c->tb, &h->q, &h->slot) != TB_OK) {
        tbucket_count_slot(h->sc, TBUCKET_SLOT_RELEASE_FAILED);
        ap_log_error(APLOG_MARK, APLOG_DEBUG, 0, c->s, TBLOGNO(00121)
                     "could not release a concurrency slot (%s: %s): it "
                     "expires in %" APR_INT64_T_FMT " ms",
                     tb_err_name(c->tb->err), c->tb->errstr,
                     h->q.concurrency_ttl_ms);
    }
    return APR_SUCCESS;
}

/* Keep the slot a decision took until the chain ends. */
static void hold_slot(request_rec *root, tbucket_srv_conf *sc,
                      const tb_request_t *q, const tb_slot_t *slot)
{
    tbucket_held *h = apr_pcalloc(root->pool, sizeof(*h));

    h->sc = sc;
    h->q.prefix = q->prefix;
    h->q.key = apr_pmemdup(root->pool, q->key, q->key_len);
    h->q.key_len = q->key_len;
    h->q.concurrency_ttl_ms = q->concurrency_ttl_ms;
    h->slot = *slot;
    /* A pre-cleanup: it runs first when the pool is destroyed, before
     * the cleanups other modules registered later (mod_cgid's waits up
     * to 10 ms for the script's process to be gone), so the slot is free
     * by the time the client can send its next request. */
    apr_pool_pre_cleanup_register(root->pool, h, release_slot);
    tbucket_count_slot(sc, TBUCKET_SLOT_TAKEN);
}

/* Count a refusal by the limit that made it; the closed policy's
 * refusals are fallback decisions, counted as such only. */
static void count_refusal(const tbucket_srv_conf *sc, const tb_result_t *res)
{
    if (res->allowed || res->source == TB_SRC_CLOSED) {
        return;
    }
    if (res->refused_by == TB_LIMIT_CONCURRENCY) {
        tbucket_count_refusal(sc, TBUCKET_LIMIT_CONCURRENCY);
        tbucket_count_slot(sc, TBUCKET_SLOT_REFUSED);
    }
    else {
        tbucket_count_refusal(sc, TBUCKET_LIMIT_RATE);
    }
}

/* The request's decision: one script call (or a lease, or a shard of the
 * key) for the buckets and the concurrency slot together. *lease_key gets
 * the lease's key when the lease decided (tbucket_settle.c needs it). */
static void decide(apr_pool_t *pool, const tbucket_dir_conf *dc,
                   tbucket_srv_conf *sc, tb_request_t *q, tb_result_t *res,
                   const char **lease_key)
{
    int k = dc->shards > 1 ? dc->shards : 1;

    if (dc->concurrency > 0) {
        /* check_config refuses shards and leases with concurrency where
         * it can see them; in .htaccess they are ignored here. */
        q->concurrency = dc->concurrency;
        q->concurrency_ttl_ms = dc->concurrency_ttl_ms;
        tb_client_run(sc->client->tb, q, res);
        return;
    }
    if (k > 1) {
        q->shards = k;
        q->shard = pick_shard(k);
    }
    /* A lease needs one token bucket and a cost of at least one token;
     * check_config refuses the rest where it can see them (not in
     * .htaccess), and here they decide without. */
    if (dc->lease > 0 && q->ntakes == 1 && q->algo == TB_ALGO_TOKEN_BUCKET
        && q->takes[0].cost >= 1) {
        tbucket_lease_decide(pool, dc, sc, q, res, lease_key);
    }
    else {
        tb_client_run(sc->client->tb, q, res);
    }
    if (k > 1) {
        /* The headers and TBUCKET_REMAINING speak for the whole bucket:
         * the shard's figure times K, an estimate (add_limit_headers
         * caps it at the capacity). */
        res->remaining *= k;
    }
}

/* The chain's record, made on first need in root's pool. */
static tbucket_req *chain_record(request_rec *root)
{
    tbucket_req *rq = ap_get_module_config(root->request_config,
                                           &tbucket_module);

    if (!rq) {
        rq = apr_pcalloc(root->pool, sizeof(*rq));
        ap_set_module_config(root->request_config, &tbucket_module, rq);
    }
    return rq;
}

/* Refuse r's chain for local protection: 503, Retry-After, the
 * connection closed (a refused client must not keep a prefork worker),
 * decision shed. full is the local scope that had no place, or NULL for
 * a request shed by priority. */
static int refuse_locally(request_rec *r, const tbucket_srv_conf *sc,
                          request_rec *root, tbucket_priority prio,
                          const tbucket_local_scope *full)
{
    tbucket_req *rq = chain_record(root);

    tbucket_local_refusing(root);
    rq->decided = 1;
    rq->outcome = TBUCKET_OUT_SHED;
    rq->remaining = "0";
    set_env(r, rq);
    tbucket_count(sc, TBUCKET_OUT_SHED, 0);
    tbucket_count_shed(sc, prio, full != NULL);
    r->connection->keepalive = AP_CONN_CLOSE;
    apr_table_setn(r->err_headers_out, "Retry-After",
                   apr_itoa(r->pool, sc->shed_retry_s));
    if (full) {
        ap_log_rerror(APLOG_MARK, APLOG_DEBUG, 0, r, TBLOGNO(00141)
                      "refused %s: %d requests of %s in flight already",
                      r->uri, full->limit, full->name);
        return respond(r, HTTP_SERVICE_UNAVAILABLE, apr_psprintf(r->pool,
                       "{\"error\":\"too many requests in flight here\","
                       "\"limit\":%d,\"retry_after\":%d}\n", full->limit,
                       sc->shed_retry_s));
    }
    ap_log_rerror(APLOG_MARK, APLOG_DEBUG, 0, r, TBLOGNO(00142)
                  "shed %s (priority %s): the server is busy", r->uri,
                  tbucket_priority_names[prio]);
    return respond(r, HTTP_SERVICE_UNAVAILABLE, apr_psprintf(r->pool,
                   "{\"error\":\"server busy\",\"retry_after\":%d}\n",
                   sc->shed_retry_s));
}

/* Local protection for r's chain, before any Redis call: shed by
 * priority, then a place in each local scope of dc. DECLINED to go on,
 * else the response. An admitted chain gets a record, so that its later
 * requests take no second place; its decision is "allowed" until the
 * shared limit, if any, decides. */
static int protect_locally(request_rec *r, const tbucket_dir_conf *dc,
                           const tbucket_srv_conf *sc, request_rec *root)
{
    tbucket_priority prio = tbucket_dir_priority(dc);
    const tbucket_local_scope *full;
    tbucket_req *rq;

    if (!sc->shed_min && dc->nlocal <= 0) {
        return DECLINED;
    }
    /* Shedding first: it holds nothing, and a shed request should not
     * take a place it would give back at once. */
    if (prio != TBUCKET_PRIO_CRITICAL
        && tbucket_local_shed(sc, prio, apr_time_now())) {
        return refuse_locally(r, sc, root, prio, NULL);
    }
    if ((full = tbucket_local_take(r, root, dc)) != NULL) {
        return refuse_locally(r, sc, root, prio, full);
    }
    rq = chain_record(root);
    rq->outcome = TBUCKET_OUT_ALLOWED;
    if (!dc->limit_set && dc->concurrency <= 0) {
        set_env(r, rq);
        tbucket_count(sc, TBUCKET_OUT_ALLOWED, 0);
    }
    return DECLINED;
}

/* The shared limit's decision for r: one call for the buckets and the
 * concurrency slot (or a lease, or a shard). DECLINED to let it through,
 * or the response status. */
static int limit_shared(request_rec *r, const tbucket_dir_conf *dc,
                        tbucket_srv_conf *sc, request_rec *root)
{
    tb_take_t takes[TB_MAX_BUCKETS];
    tb_request_t q;
    tb_result_t res;
    tbucket_req *rq;
    const char *key, *prefix, *lease_key = NULL;
    apr_int64_t retry_s = 0;
    int n, shadow = dc->shadow == 1, cost_exceeded, by_conc;

    if (!sc->client || !sc->client->tb) {
        ap_log_rerror(APLOG_MARK, APLOG_DEBUG, 0, r, TBLOGNO(00107)
                      "no Redis client in this process: not limited");
        return DECLINED;
    }
    key = request_key(r, dc, sc, &prefix);
    n = dc->limit_set ? build_takes(dc, key, takes) : 0;
    memset(&q, 0, sizeof(q));
    q.prefix = prefix;
    q.key = key;
    q.key_len = strlen(key);
    q.takes = takes;
    q.ntakes = n;
    q.algo = dc->algo == -1 ? TB_ALGO_TOKEN_BUCKET : (tb_algo_t)dc->algo;
    decide(root->pool, dc, sc, &q, &res, &lease_key);
    if (res.err == TB_ERR_ARG) {
        ap_log_rerror(APLOG_MARK, APLOG_ERR, 0, r, TBLOGNO(00108)
                      "the limiter refused its arguments: not limited");
        return DECLINED;
    }
    tbucket_note_breaker(r, sc->client, &res, sc);
    if (res.err != TB_ERR_NONE) {
        ap_log_rerror(APLOG_MARK, APLOG_DEBUG, 0, r, TBLOGNO(00109)
                      "Redis did not decide (%s: %s): %s policy answered",
                      tb_err_name(res.err), sc->client->tb->errstr,
                      tb_policy_name(sc->policy));
    }
    if (res.slot.kind != TB_SLOT_NONE) {
        hold_slot(root, sc, &q, &res.slot);
    }
    by_conc = !res.allowed && res.refused_by == TB_LIMIT_CONCURRENCY;
    cost_exceeded = !res.allowed && res.retry_ms < 0;
    if (!res.allowed && !cost_exceeded) {
        retry_s = (res.retry_ms + 999) / 1000;
        if (retry_s < 1) {
            retry_s = 1;
        }
    }
    rq = chain_record(root);
    rq->decided = 1;
    rq->settle = tbucket_settle_note(root, dc, sc, &q, &res, lease_key);
    rq->outcome = outcome_of(&res, shadow);
    rq->remaining = apr_psprintf(root->pool, "%" APR_INT64_T_FMT,
                                 res.remaining > 0 ? res.remaining : 0);
    if (n && q.shards > 1
        && res.remaining > (apr_int64_t)takes[res.binding].limit.capacity) {
        rq->remaining = apr_psprintf(root->pool, "%" APR_INT64_T_FMT,
                (apr_int64_t)takes[res.binding].limit.capacity);
    }
    set_env(r, rq);
    if (n) {
        add_limit_headers(r, dc, takes, &res, retry_s);
    }
    tbucket_count(sc, rq->outcome, cost_exceeded);
    count_refusal(sc, &res);

    if (res.allowed) {
        return DECLINED;
    }
    if (shadow) {
        ap_log_rerror(APLOG_MARK, APLOG_INFO, 0, r, TBLOGNO(00110)
                      "shadow mode: would refuse %s (%s, retry after %"
                      APR_INT64_T_FMT " s)", r->uri,
                      cost_exceeded ? "cost exceeds capacity"
                      : by_conc ? "too many concurrent requests"
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
    /* While the server is crowded, a refused client gives its worker
     * back (under prefork a kept-alive 429 holds a whole process). */
    if (tbucket_local_crowded(sc, apr_time_now())) {
        r->connection->keepalive = AP_CONN_CLOSE;
    }
    if (by_conc) {
        ap_log_rerror(APLOG_MARK, APLOG_DEBUG, 0, r, TBLOGNO(00120)
                      "refused %s: %" APR_INT64_T_FMT " of %d requests of "
                      "its key in flight (%s)", r->uri, res.in_flight,
                      dc->concurrency, tbucket_outcome_names[rq->outcome]);
        return respond(r, HTTP_TOO_MANY_REQUESTS, apr_psprintf(r->pool,
                       "{\"error\":\"too many concurrent requests\","
                       "\"limit\":%d}\n", dc->concurrency));
    }
    ap_log_rerror(APLOG_MARK, APLOG_DEBUG, 0, r, TBLOGNO(00112)
                  "rate limited %s (%s), retry after %" APR_INT64_T_FMT " s",
                  r->uri, tbucket_outcome_names[rq->outcome], retry_s);
    return respond(r, HTTP_TOO_MANY_REQUESTS, apr_psprintf(r->pool,
                   "{\"error\":\"rate limited\",\"retry_after\":%"
                   APR_INT64_T_FMT "}\n", retry_s));
}

/* Decide request r (not a sub-request) for the first time in its chain:
 * local protection, unless an earlier request of the chain passed it,
 * then the shared limit. Returns DECLINED to let it through, or the
 * response status. */
static int limit_request(request_rec *r, const tbucket_dir_conf *dc,
                         request_rec *root)
{
    tbucket_srv_conf *sc = srv_conf(r->server);
    int rc;

    if (!ap_get_module_config(root->request_config, &tbucket_module)
        && (rc = protect_locally(r, dc, sc, root)) != DECLINED) {
        return rc;
    }
    if (!dc->limit_set && dc->concurrency <= 0) {
        return DECLINED;
    }
    return limit_shared(r, dc, sc, root);
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
        if (rq->decided) {
            return DECLINED;
        }
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
    ap_hook_pre_config(pre_config, NULL, NULL, APR_HOOK_MIDDLE);
    ap_hook_check_config(tbucket_check_config, NULL, NULL, APR_HOOK_MIDDLE);
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
    tbucket_settle_register();
    tbucket_local_register();
}

AP_DECLARE_MODULE(tbucket) = {
    STANDARD20_MODULE_STUFF,
    tbucket_create_dir_conf,
    tbucket_merge_dir_conf,
    tbucket_create_srv_conf,
    tbucket_merge_srv_conf,
    tbucket_cmds,
    register_hooks,
    0
};
