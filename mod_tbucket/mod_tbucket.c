/* mod_tbucket.c -- shared Redis token-bucket rate limits for Apache httpd:
 * the module record, the hooks and the request path.
 *
 * check_access and fixups decide each request, first by local protection
 * (tbucket_local.c, no Redis), then by the shared limit: its key, the
 * buckets it takes, shard and lease, one decision through libtb
 * (shared/tb.h). The answer (429/403, the headers, the refusal line) is
 * tbucket_answer.c's. A limited request is counted once, however many
 * sub-requests and internal redirects it makes. mod_tbucket/README.md
 * lists the other files; the longer story is in docs/design.md ("File
 * notes"), the directives' manual in docs/reference.txt.
 */
#include "apr_atomic.h"
#include "apr_general.h"
#include "apr_hash.h"
#include "apr_strings.h"

#include <signal.h>
#include <unistd.h>

#include "httpd.h"
#include "http_config.h"
#include "http_connection.h"
#include "http_core.h"
#include "http_log.h"
#include "http_protocol.h"
#include "http_request.h"
#include "mod_core.h"

#include "mod_tbucket.h"


/* Per-process state of the shard choice (see pick_shard). */
static apr_uint64_t shard_seed;
static volatile apr_uint32_t shard_seq;

/* A concurrency slot held by a request chain, released when its response
 * ends (tbucket_release.c). The request is copied: the release needs its
 * prefix, key and ttl after the request's own data is gone. */
typedef struct tbucket_held {
    tbucket_srv_conf *sc;
    tb_request_t q;
    tb_slot_t slot;
} tbucket_held;

static tbucket_srv_conf *srv_conf(const server_rec *s)
{
    return ap_get_module_config(s->module_config, &tbucket_module);
}

/* ---- Startup: shared memory (parent) and clients (children) --------- */

static int post_config(apr_pool_t *pconf, apr_pool_t *plog,
                       apr_pool_t *ptemp, server_rec *main_s)
{
    /* The first of the two startup passes only checks the config. */
    if (ap_state_query(AP_SQ_MAIN_STATE) == AP_SQ_MS_CREATE_PRE_CONFIG) {
        return OK;
    }
    tbucket_clients_post_config(pconf, ptemp, main_s);
    if (tbucket_coalesce_post_config(pconf, main_s) != OK
        || tbucket_shm_setup(pconf, plog, main_s) != OK
        || tbucket_local_setup(pconf, main_s) != OK) {
        return HTTP_INTERNAL_SERVER_ERROR;
    }
    tbucket_scopes_setup(main_s);
    tbucket_limits_setup(main_s);
    tbucket_lease_setup(pconf, main_s);
    return tbucket_cpu_post_config(main_s);
}

static int pre_config(apr_pool_t *pconf, apr_pool_t *plog,
                      apr_pool_t *ptemp)
{
    (void)plog;
    (void)ptemp;
    tbucket_local_pre_config(pconf);
    tbucket_cpu_pre_config();
    tbucket_scopes_pre_config(pconf);
    tbucket_limits_pre_config(pconf);
    return OK;
}

static void child_init(apr_pool_t *pchild, server_rec *main_s)
{
    /* Each child its own shard sequence. */
    if (apr_generate_random_bytes((unsigned char *)&shard_seed,
                                  sizeof(shard_seed)) != APR_SUCCESS) {
        shard_seed = (apr_uint64_t)getpid() * 0x2545f4914f6cdd1dULL
                     ^ (apr_uint64_t)apr_time_now();
    }
    tbucket_local_child_init();
    tbucket_cpu_child_init();
    tbucket_clients_child_init(pchild, main_s);
}

/* ---- The request path ------------------------------------------------ */

/* The first request of r's chain: internal redirects point back through
 * r->prev, sub-requests up through r->main. Bounded like httpd's own
 * redirect limit. */
request_rec *tbucket_chain_root(request_rec *r)
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
    if (rq->rule) {
        apr_table_setn(r->subprocess_env, "TBUCKET_LIMIT", rq->rule);
        apr_table_setn(r->subprocess_env, "TBUCKET_RULE", rq->rule);
    }
}

/* The client key, and the prefix its bucket lives under. A client keyed
 * by its IP, with no TBucketKey or an empty one, always lives under
 * "<prefix>ip:": were an IP bucket "<prefix>{IP}", a client sending
 * "X-API-Key: <victim's IP>" to a Location keyed by that header could
 * drain the victim's bucket of a Location keyed by IP. */
const char *tbucket_ip_key(request_rec *r, const tbucket_srv_conf *sc)
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
        return tbucket_ip_key(r, sc);
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
        return tbucket_ip_key(r, sc);
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
    if (shadow) {
        return TBUCKET_OUT_SHADOW_REJECTED;
    }
    return res->banned ? TBUCKET_OUT_BANNED : TBUCKET_OUT_REJECTED;
}

/* ---- Concurrency slots ------------------------------------------------ */

/* Give the chain's slot back (one ZREM), once, at the end of its
 * response (tbucket_release_at_end). A child on its way out leaves the
 * slot to expire. */
static apr_status_t release_slot(void *data)
{
    tbucket_held *h = data;
    tbucket_client *c = h->sc->client;

    tbucket_count_slot(h->sc, TBUCKET_SLOT_RELEASED);
    if (tbucket_child_exiting() || !c || !c->tb) {
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

/* Keep the slot a decision of r took until r's chain, whose first
 * request is root, ends. */
static void hold_slot(request_rec *r, request_rec *root,
                      tbucket_srv_conf *sc, const tb_request_t *q,
                      const tb_slot_t *slot)
{
    tbucket_held *h = apr_pcalloc(root->pool, sizeof(*h));

    h->sc = sc;
    h->q.prefix = q->prefix;
    h->q.key = apr_pmemdup(root->pool, q->key, q->key_len);
    h->q.key_len = q->key_len;
    h->q.concurrency_ttl_ms = q->concurrency_ttl_ms;
    h->slot = *slot;
    tbucket_release_at_end(r, root, release_slot, h);
    tbucket_count_slot(sc, TBUCKET_SLOT_TAKEN);
}

/* The request's decision: one script call (or a lease, or a shard of the
 * key) for the buckets and the concurrency slot together. Without the
 * main bucket (main 0: rules only) it is a plain token-bucket call. */
static void decide(const tbucket_dir_conf *dc, tbucket_srv_conf *sc,
                   tb_request_t *q, tb_result_t *res, int main)
{
    int k = dc->shards > 1 ? dc->shards : 1;

    if (!main) {
        tb_client_run(sc->client->tb, q, res);
        return;
    }
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
    /* The core pays from the server's lease, or takes the next one in
     * the call; a request that cannot have one (routes, another
     * algorithm, a cost under one token) is decided without. */
    if (dc->lease > 0) {
        q->lease = dc->lease;
        q->lease_ttl_ms = dc->lease_ttl_ms;
    }
    tb_client_run(sc->client->tb, q, res);
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
    tbucket_refusing_body(r, root);
    apr_table_setn(r->err_headers_out, "Retry-After",
                   apr_itoa(r->pool, sc->shed_retry_s));
    if (full) {
        ap_log_rerror(APLOG_MARK, APLOG_DEBUG, 0, r, TBLOGNO(00141)
                      "refused %s: %d requests of %s in flight already",
                      r->uri, full->limit, full->name);
        return tbucket_respond(r, HTTP_SERVICE_UNAVAILABLE, apr_psprintf(r->pool,
                       "{\"error\":\"too many requests in flight here\","
                       "\"limit\":%d,\"retry_after\":%d}\n", full->limit,
                       sc->shed_retry_s));
    }
    ap_log_rerror(APLOG_MARK, APLOG_DEBUG, 0, r, TBLOGNO(00142)
                  "shed %s (priority %s): the server is busy", r->uri,
                  tbucket_priority_names[prio]);
    return tbucket_respond(r, HTTP_SERVICE_UNAVAILABLE, apr_psprintf(r->pool,
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
    if (!dc->limit_set && dc->concurrency <= 0 && !dc->nlimits) {
        set_env(r, rq);
        tbucket_count(sc, TBUCKET_OUT_ALLOWED, 0);
    }
    return DECLINED;
}

void tbucket_note_call(request_rec *r, tbucket_srv_conf *sc,
                      const tb_result_t *res)
{
    tbucket_note_breaker(r, sc->client, res, sc);
    if (res->err != TB_ERR_NONE) {
        ap_log_rerror(APLOG_MARK, APLOG_DEBUG, 0, r, TBLOGNO(00109)
                      "Redis did not decide (%s: %s): %s policy answered",
                      tb_err_name(res->err), sc->client->tb->errstr,
                      tb_policy_name((tb_policy_t)sc->policy));
    }
}

/* The answer's figures from d->res. */
static void read_answer(tbucket_decision *d)
{
    const tb_result_t *res = &d->res;

    d->by_conc = !res->allowed && res->refused_by == TB_LIMIT_CONCURRENCY;
    d->cost_exceeded = !res->allowed && res->retry_ms < 0;
    d->retry_s = 0;
    if (!res->allowed && !d->cost_exceeded) {
        d->retry_s = (res->retry_ms + 999) / 1000;
        d->retry_s = d->retry_s < 1 ? 1 : d->retry_s;
    }
}

/* Ask the shared limit about the parts of r's limits (TBUCKET_PART_*):
 * 1 when it decided (d->res), 0 when nothing applied or r is not
 * limited (no client in this process, arguments refused). What needs no
 * body is decided first, in one call, and the body's rules only when
 * that allowed: a banned address never has its upload read. */
static int ask_shared(request_rec *r, const tbucket_dir_conf *dc,
                      tbucket_srv_conf *sc, tbucket_decision *d, int parts)
{
    const char *key, *prefix;
    int main = tbucket_main_in(dc, parts), decided = 0;

    if (!sc->client || !sc->client->tb) {
        ap_log_rerror(APLOG_MARK, APLOG_DEBUG, 0, r, TBLOGNO(00107)
                      "no Redis client in this process: not limited");
        return 0;
    }
    key = request_key(r, dc, sc, &prefix);
    memset(&d->q, 0, sizeof(d->q));
    memset(d->which, 0, sizeof(d->which));
    memset(d->base_key, 0, sizeof(d->base_key));
    d->known = 0;
    d->q.prefix = prefix;
    d->q.key = key;
    d->q.key_len = strlen(key);
    d->q.takes = d->takes;
    d->q.ntakes = 0;
    tbucket_limits_takes(r, dc, sc, d, parts & ~TBUCKET_PART_BODY, main,
                         main && dc->limit_set ? tenant_limit(dc, key)
                                               : NULL);
    d->q.algo = dc->algo == -1 ? TB_ALGO_TOKEN_BUCKET : (tb_algo_t)dc->algo;
    if (d->q.ntakes || (main && dc->concurrency > 0)) {
        decide(dc, sc, &d->q, &d->res, main);
        if (d->res.err == TB_ERR_ARG) {
            ap_log_rerror(APLOG_MARK, APLOG_ERR, 0, r, TBLOGNO(00108)
                          "the limiter refused its arguments: not limited");
            return 0;
        }
        tbucket_note_call(r, sc, &d->res);
        decided = 1;
    }
    if ((parts & TBUCKET_PART_BODY) && dc->limits_body
        && (!decided || d->res.allowed)) {
        decided |= tbucket_decide_body(r, dc, sc, d);
    }
    if (decided) {
        read_answer(d);
    }
    return decided;
}

/* Keep what d decided for r's chain (its record, a slot to give back,
 * what settling needs), tell the application and the client (the
 * environment, the limit headers) and count it. more: a later part of
 * the chain's limits is still to be decided (in fixups). */
static tbucket_req *note_shared(request_rec *r, const tbucket_dir_conf *dc,
                                tbucket_srv_conf *sc, request_rec *root,
                                tbucket_decision *d, int more)
{
    tbucket_req *rq = chain_record(root);
    const tb_result_t *res = &d->res;
    apr_int64_t left = res->remaining > 0 ? res->remaining : 0;
    int later = rq->taken != NULL;
    const tbucket_limit *named;

    if (res->slot.kind != TB_SLOT_NONE) {
        hold_slot(r, root, sc, &d->q, &res->slot);
    }
    /* A sharded key's figure is an estimate (decide): never above the
     * capacity. */
    if (d->q.ntakes && d->q.shards > 1
        && left > (apr_int64_t)d->takes[res->binding].limit.capacity) {
        left = (apr_int64_t)d->takes[res->binding].limit.capacity;
    }
    rq->decided = !more || !res->allowed;
    if (!later) {
        rq->settle = tbucket_settle_note(root, dc, sc, &d->q, res);
    }
    rq->outcome = outcome_of(res, dc->shadow == 1);
    if ((named = tbucket_refusing_rule(d)) != NULL) {
        rq->rule = named->name;
    }
    if (dc->nlimits && res->allowed && res->source == TB_SRC_REDIS) {
        rq->charge = tbucket_charge_reserve(root, sc, d, rq->charge);
        if (d->known) {
            tbucket_known_spared(sc, d);
        }
    }
    if (later && !res->allowed) {
        /* Refused by a later part: what the earlier took goes back. */
        tbucket_undo_taken(sc, &rq->taken->q, &rq->taken->res);
        tbucket_charge_cancel(rq->charge);
    }
    else if (more && res->allowed) {
        tbucket_keep_taken(root, rq, d);
    }
    rq->remaining = apr_psprintf(root->pool, "%" APR_INT64_T_FMT, left);
    set_env(r, rq);
    if (d->q.ntakes) {
        tbucket_limit_headers(r, dc, d->takes, res, d->retry_s);
    }
    /* A chain is counted once: a later part only for its refusal. */
    tbucket_tally(r, dc, sc, d, rq->outcome, !later || !res->allowed);
    return rq;
}

/* The shared limit's decision for the parts (TBUCKET_PART_*) of r: one
 * call for the buckets and the concurrency slot (or a lease, or a
 * shard), and one more for the form body's rules. DECLINED to let it
 * through, or the response status. */
static int limit_shared(request_rec *r, const tbucket_dir_conf *dc,
                        tbucket_srv_conf *sc, request_rec *root, int parts)
{
    tbucket_decision d;
    tbucket_req *rq;

    if (dc->limits_counted) {
        tbucket_charge_no_ranges(r, dc);
    }
    if (!ask_shared(r, dc, sc, &d, parts)) {
        return DECLINED;
    }
    rq = note_shared(r, dc, sc, root, &d,
                     !(parts & TBUCKET_PART_LATE) && tbucket_late_parts(dc));
    if (d.res.allowed) {
        return DECLINED;
    }
    if (dc->shadow == 1) {
        ap_log_rerror(APLOG_MARK, APLOG_INFO, 0, r, TBLOGNO(00110)
                      "shadow mode: would refuse %s (%s, retry after %"
                      APR_INT64_T_FMT " s)", r->uri,
                      d.cost_exceeded ? "cost exceeds capacity"
                      : d.by_conc ? "too many concurrent requests"
                                  : "over the limit", d.retry_s);
        return DECLINED;
    }
    rq->refused = 1;
    tbucket_refusing_body(r, root);
    return tbucket_refuse_shared(r, dc, sc, rq, &d);
}

int tbucket_chain_admitted(request_rec *root)
{
    const tbucket_req *rq = ap_get_module_config(root->request_config,
                                                 &tbucket_module);

    return !rq || !rq->refused;
}

/* Decide the parts (TBUCKET_PART_*) of request r's limits (r is not a
 * sub-request; root the first request of its chain): local protection,
 * unless an earlier request of the chain passed it, then the shared
 * limit. Returns DECLINED to let it through, or the response status. */
static int limit_request(request_rec *r, const tbucket_dir_conf *dc,
                         request_rec *root, int parts)
{
    tbucket_srv_conf *sc = srv_conf(r->server);
    int rc;

    /* First: a low request that is shed or refused is answered at low's
     * CPU step too, and the flood of them is what a critical page
     * competes with. */
    tbucket_cpu_enter(r, root, dc);
    if (!ap_get_module_config(root->request_config, &tbucket_module)
        && (rc = protect_locally(r, dc, sc, root)) != DECLINED) {
        return rc;
    }
    if (!dc->limit_set && dc->concurrency <= 0 && !dc->nlimits) {
        return DECLINED;
    }
    if (parts & TBUCKET_PART_EARLY) {
        chain_record(root)->early = 1;
    }
    return limit_shared(r, dc, sc, root, parts);
}

/* check_access: the normal place to decide. It runs before authentication
 * and the handler, so an over-limit client costs neither, and after the
 * <If>/<Location> walk, so the merged config is final. Only a chain's
 * first request decides here; later ones are handled in fixups. Limits
 * on keys that need REMOTE_USER wait for fixups (after authn); the
 * others are decided here, so that a failed authentication is refused
 * and counted by them. "Satisfy Any", where a refusal here would not end
 * the request, waits for fixups whole. */
static int check_access(request_rec *r)
{
    const tbucket_dir_conf *dc = ap_get_module_config(r->per_dir_config,
                                                      &tbucket_module);

    if (dc->enable != 1 || r->main || r->prev
        || ap_satisfies(r) == SATISFY_ANY) {
        return DECLINED;
    }
    return limit_request(r, dc, r, TBUCKET_PART_EARLY | TBUCKET_PART_BODY);
}

/* fixups run for every request of a chain, even when httpd skips the
 * access phase of an internal redirect whose config did not change. The
 * chain's first request decides here what check_access left (the late
 * parts). A later request of a chain gets the decision of the first
 * under the exact variable names (httpd only copies them as
 * REDIRECT_TBUCKET_*); a chain whose first request was not limited is
 * decided by the first request in it that is; sub-requests never
 * count. */
static int fixups(request_rec *r)
{
    const tbucket_dir_conf *dc;
    request_rec *root = tbucket_chain_root(r);
    const tbucket_req *rq = ap_get_module_config(root->request_config,
                                                 &tbucket_module);
    int parts = TBUCKET_PART_EARLY | TBUCKET_PART_BODY | TBUCKET_PART_LATE;

    if (rq) {
        if (r != root) {
            set_env(r, rq);
        }
        if (rq->decided) {
            return DECLINED;
        }
        if (rq->early && r == root) {
            parts = TBUCKET_PART_LATE;
        }
    }
    dc = ap_get_module_config(r->per_dir_config, &tbucket_module);
    if (dc->enable != 1 || r->main) {
        return DECLINED;
    }
    return limit_request(r, dc, root, parts);
}

/* After the response: a refused request whose body was never read gives
 * its connection up at once, without httpd's lingering close reading
 * what a slow client still sends (prefork would hold a worker for it). */
static int log_transaction(request_rec *r)
{
    const tbucket_req *rq = ap_get_module_config(
        tbucket_chain_root(r)->request_config, &tbucket_module);

    if (rq && rq->drop) {
        apr_socket_t *sock = ap_get_conn_socket(r->connection);

        if (sock && !r->connection->master) {
            ap_flush_conn(r->connection);
            apr_socket_shutdown(sock, APR_SHUTDOWN_WRITE);
        }
        r->connection->aborted = 1;
    }
    return DECLINED;
}

void tbucket_refusing_body(request_rec *r, request_rec *root)
{
    /* httpd reads and discards a body before it answers unless the
     * connection closes: a paced upload would hold the worker. */
    if (tbucket_form_unread(r)) {
        r->connection->keepalive = AP_CONN_CLOSE;
        chain_record(root)->drop = 1;
    }
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
    ap_hook_log_transaction(log_transaction, NULL, NULL,
                            APR_HOOK_REALLY_LAST);
    ap_hook_handler(tbucket_status_handler, NULL, NULL, APR_HOOK_MIDDLE);
    tbucket_settle_register();
    tbucket_local_register();
    tbucket_charge_register();
    tbucket_release_register();
    tbucket_cpu_register();
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
