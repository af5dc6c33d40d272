/* tbucket_lease.c -- the end of a generation's token leases.
 *
 * Leases (TBucketLease N ttl=T) are the core's (tb_client_run with the
 * lease table of tbucket_shm.c): a child spends a key's lease without
 * asking Redis and takes the next one in the call that decides. What
 * the module keeps is the drain: when the configuration ends (a stop,
 * or a restart, graceful or not) the parent drains the table in a
 * cleanup of the configuration pool and returns every lease's tokens to
 * Redis, one call each (tb_client_give_back), so the next generation
 * starts with no leases and its limits apply at once. Clients of the
 * ending generation see the drain (the table's epoch) and decide
 * without leases from then on; a grant one of them took just before is
 * given back by it.
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

/* The process that registered the drain: only it drains, never a child
 * that inherited the configuration pool. */
static pid_t drain_pid;

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
