/* tbucket_lease.c -- mod_tbucket's token leases (TBucketLease N ttl=T).
 *
 * A server takes tokens from a key's shared bucket in one script call
 * and its children spend them from the lease table in shared memory
 * (tbucket_shm.c) without asking Redis. This file owns what a lease does
 * for a request and what happens to its unspent tokens:
 *
 *  - A request is paid from the key's lease when that holds the cost.
 *    Otherwise one call decides it, takes the next lease and gives back
 *    the unspent tokens of the key's expired lease (tb_lease_plan,
 *    tb_request_t.lease_back): tokens of an expired lease go back at the
 *    latest with the next decision of that key on this server, at no
 *    extra call.
 *  - The lease's size follows the key's traffic on this server: about one
 *    ttl of it (tb_lease_plan), at most N, at least the cost, so a key
 *    seen once a minute does not lock up N tokens and a hot one reaches N
 *    within a few refills (each at most doubles it).
 *  - When the configuration ends (a stop, or a restart, graceful or not)
 *    the parent drains the table in a cleanup of the configuration pool
 *    and returns every lease's tokens to Redis, one call each
 *    (tb_client_give_back), so the next generation starts with no leases
 *    and its limits apply at once. Children of the ending generation see
 *    the drain (tb_lease_epoch) and decide without leases from then on;
 *    a grant one of them took just before is given back by it
 *    (tb_lease_store answers 0).
 *
 * The parent drains because the table outlives every child and only the
 * parent sees both ends of a generation. It makes its own short-lived
 * client per Redis configuration for that, as check_config does.
 */
#include "apr_hash.h"
#include "apr_strings.h"

#include <unistd.h>

#include "httpd.h"
#include "http_config.h"
#include "http_log.h"

#include "mod_tbucket.h"

APLOG_USE_MODULE(tbucket);

/* The drain count this child may take leases at (child_init). */
static uint64_t child_epoch;

/* The process that registered the drain: only it drains, never a child
 * that inherited the configuration pool. */
static pid_t drain_pid;

void tbucket_lease_child_init(void)
{
    child_epoch = tb_lease_epoch(tbucket_lease_table());
}

/* The lease table, or NULL when this process must not use it: none, or
 * drained since this child started (its server is stopping). */
static tb_lease_t *lease_table(void)
{
    tb_lease_t *lt = tbucket_lease_table();

    return lt && tb_lease_epoch(lt) == child_epoch ? lt : NULL;
}

/* A request paid from the lease: the verdict the core would give. */
static void lease_hit(const tb_request_t *q, double left, tb_result_t *res)
{
    memset(res, 0, sizeof(*res));
    res->allowed = 1;
    res->remaining = (int64_t)left;
    res->limit = q->takes[0].limit.capacity
                 / (q->shards > 1 ? q->shards : 1);
    res->source = TB_SRC_REDIS;
}

/* Keep a grant's tokens beyond the cost as the lease; give them back at
 * once when the table was drained since the plan. 1 when kept. */
static int keep_grant(tbucket_srv_conf *sc, tb_lease_t *lt,
                      const tb_lease_info_t *info,
                      const tb_lease_plan_t *plan, double extra,
                      int64_t now_ms)
{
    tb_result_t gb;

    if (tb_lease_store(lt, info, plan, extra, now_ms) == 1) {
        return 1;
    }
    if (tb_client_give_back(sc->client->tb, info->key, &info->limit, extra,
                            &gb) == TB_OK) {
        tbucket_count_returned(extra);
    }
    return 0;
}

void tbucket_lease_decide(apr_pool_t *p, const tbucket_dir_conf *dc,
                          tbucket_srv_conf *sc, tb_request_t *q,
                          tb_result_t *res, const char **lease_key)
{
    tb_lease_t *lt = lease_table();
    const tb_take_t *take = &q->takes[0];
    int k = q->shards > 1 ? q->shards : 1;
    int64_t now_ms = tb_clock_now_us() / 1000;
    tb_lease_info_t info;
    tb_lease_plan_t plan;
    char rkey[TB_KEY_BUF];
    double left;

    *lease_key = NULL;
    /* A key the core would refuse, or a server that is stopping:
     * decide without a lease. */
    if (!lt || !tb_key_build_shard(q->prefix, q->key, q->key_len,
                                   k > 1 ? q->shard : -1, NULL, rkey)) {
        tb_client_run(sc->client->tb, q, res);
        return;
    }
    if (tb_lease_spend(lt, rkey, take->cost, now_ms, &left) == 1) {
        lease_hit(q, left, res);
        tbucket_count_lease(sc, 1, 0);
        *lease_key = apr_pstrdup(p, rkey);
        return;
    }
    info.key = rkey;
    info.limit.capacity = take->limit.capacity / k;
    info.limit.rate_per_sec = take->limit.rate_per_sec / k;
    info.ttl_ms = dc->lease_ttl_ms;
    info.owner = sc->client_slot;
    if (tb_lease_plan(lt, &info, take->cost,
                      dc->lease > take->cost ? dc->lease : take->cost,
                      now_ms, &plan) != TB_OK) {
        tb_client_run(sc->client->tb, q, res);
        return;
    }
    q->lease = plan.want;
    q->lease_back = plan.back;
    tb_client_run(sc->client->tb, q, res);
    q->lease = 0;
    q->lease_back = 0;
    if (res->source != TB_SRC_REDIS) {
        /* Redis took nothing back: the tokens stay this server's. */
        if (plan.back > 0) {
            keep_grant(sc, lt, &info, &plan, plan.back, now_ms);
        }
        return;
    }
    if (plan.back > 0) {
        tbucket_count_returned(plan.back);
    }
    if (res->granted > 0) {
        double extra = (double)res->granted - take->cost;

        tbucket_count_lease(sc, 0, res->granted);
        if (extra > 0 && keep_grant(sc, lt, &info, &plan, extra, now_ms)) {
            /* What this server may still spend: the shared bucket's
             * remainder and its own. */
            res->remaining += (int64_t)extra;
            *lease_key = apr_pstrdup(p, rkey);
        }
    }
}

int tbucket_lease_settle(const char *key, double delta)
{
    tb_lease_t *lt = lease_table();
    int64_t now_ms = tb_clock_now_us() / 1000;
    double left;

    if (!lt || !key) {
        return 0;
    }
    if (delta > 0) {
        return tb_lease_spend(lt, key, delta, now_ms, &left) == 1;
    }
    return tb_lease_credit(lt, key, -delta, now_ms) == 1;
}

/* ---- Draining the table when a configuration ends --------------------- */

typedef struct drain_ctx {
    server_rec *main_s;
    apr_pool_t *p;
    apr_hash_t *clients;   /* Owner (client slot) -> tb_client_t *.  */
    apr_size_t leases;     /* Leases whose tokens went back.         */
    double tokens;         /* Those tokens.                          */
    apr_size_t lost;       /* Leases whose give-back failed.         */
    int last_err;
} drain_ctx;

/* A client for the Redis configuration whose slot is owner, made on
 * first use; NULL when no server has that slot or it cannot be made. */
static tb_client_t *drain_client(drain_ctx *d, int owner)
{
    tb_client_t **c = apr_hash_get(d->clients, &owner, sizeof(owner));
    server_rec *s;

    if (c) {
        return *c;
    }
    c = apr_pcalloc(d->p, sizeof(*c));
    for (s = d->main_s; s; s = s->next) {
        const tbucket_srv_conf *sc = ap_get_module_config(s->module_config,
                                                          &tbucket_module);
        tb_options_t o;
        char err[TB_ERRSTR_LEN];

        if (sc->client_slot != owner) {
            continue;
        }
        tbucket_client_options(sc, &o);
        /* One connection; a failing Redis answers by breaker, not by a
         * policy. */
        o.pool_size = 1;
        o.policy = TB_POLICY_OPEN;
        *c = tb_client_create(&o, err, sizeof(err));
        break;
    }
    apr_hash_set(d->clients, apr_pmemdup(d->p, &owner, sizeof(owner)),
                 sizeof(owner), c);
    return *c;
}

static void drain_give(void *arg, const tb_lease_info_t *info, double tokens)
{
    drain_ctx *d = arg;
    tb_client_t *c = drain_client(d, info->owner);
    tb_result_t res;

    if (c && tb_client_give_back(c, info->key, &info->limit, tokens, &res)
             == TB_OK) {
        d->leases++;
        d->tokens += tokens;
        tbucket_count_returned(tokens);
        return;
    }
    d->lost++;
    d->last_err = c ? res.err : TB_ERR_ARG;
}

static apr_status_t lease_drain(void *data)
{
    tb_lease_t *lt = tbucket_lease_table();
    apr_hash_index_t *hi;
    drain_ctx d;

    if (!lt || getpid() != drain_pid) {
        return APR_SUCCESS;
    }
    memset(&d, 0, sizeof(d));
    d.main_s = data;
    if (apr_pool_create(&d.p, NULL) != APR_SUCCESS) {
        return APR_SUCCESS;
    }
    d.clients = apr_hash_make(d.p);
    tb_lease_drain(lt, drain_give, &d);
    for (hi = apr_hash_first(d.p, d.clients); hi; hi = apr_hash_next(hi)) {
        void *v;

        apr_hash_this(hi, NULL, NULL, &v);
        tb_client_free(*(tb_client_t **)v);
    }
    if (d.leases) {
        ap_log_error(APLOG_MARK, APLOG_INFO, 0, d.main_s, TBLOGNO(00501)
                     "leases drained: %" APR_SIZE_T_FMT " leases gave %.0f "
                     "unspent tokens back to Redis", d.leases, d.tokens);
    }
    if (d.lost) {
        ap_log_error(APLOG_MARK, APLOG_WARNING, 0, d.main_s, TBLOGNO(00502)
                     "leases drained: the tokens of %" APR_SIZE_T_FMT
                     " leases could not be given back (%s); their buckets "
                     "refill on their own", d.lost,
                     tb_err_name(d.last_err));
    }
    apr_pool_destroy(d.p);
    return APR_SUCCESS;
}

void tbucket_lease_setup(apr_pool_t *pconf, server_rec *main_s)
{
    /* The configuration pool is cleared on every restart and destroyed
     * at a stop, in the parent, before the next generation's children
     * exist; its cleanups run before mod_so unloads this module (those
     * were registered earlier, at LoadModule). */
    drain_pid = getpid();
    apr_pool_cleanup_register(pconf, main_s, lease_drain,
                              apr_pool_cleanup_null);
}
