/* tbucket_local.c -- local protection: shedding by priority
 * (TBucketShed) and local concurrency limits (TBucketLocalConcurrency),
 * decided on this server without Redis.
 *
 * The shared limit decides per client; this file protects the server
 * itself from a flood made of many clients, each within its own limit.
 * Both are decided before any Redis call, so they cost no round trip and
 * work with Redis down under every failure policy. How busy is counted
 * and how places come back (tbucket_release.c, the child_status hook,
 * each configuration load): docs/design.md, "File notes".
 */
#include "apr_strings.h"

#include <errno.h>
#include <signal.h>
#include <unistd.h>

#include "httpd.h"
#include "http_config.h"
#include "http_log.h"
#include "http_protocol.h"
#include "util_filter.h"
#include "ap_mpm.h"
#include "scoreboard.h"

#include "mod_tbucket.h"

APLOG_USE_MODULE(tbucket);

/* How old the shared busy count may be, in microseconds. */
#define BUSY_MAX_AGE 1000

/* The scopes of the configuration being read (pconf). */
static apr_array_header_t *scopes;

/* The MPM's sizes, read in post_config; children inherit them. */
static int max_workers = 1;           /* MaxRequestWorkers.             */
static int sb_daemons;                /* Scoreboard rows: ServerLimit.  */
static int sb_threads;                /* Columns: ThreadLimit (1).      */

/* This process's owner tag in the in-flight tables: its pid. */
static uint32_t owner_tag;

static void register_body_wait(void);


/* ---- Configuration time --------------------------------------------- */

void tbucket_local_pre_config(apr_pool_t *pconf)
{
    scopes = apr_array_make(pconf, 4, sizeof(tbucket_local_scope *));
}

tbucket_local_scope *tbucket_local_scope_add(cmd_parms *cmd, int limit,
                                             int auto_min)
{
    tbucket_local_scope *sc = apr_pcalloc(cmd->pool, sizeof(*sc));

    /* Two sections written alike (two <Location /x> blocks) are two
     * scopes: the later ones are numbered. */
    sc->name = apr_pstrdup(cmd->pool, tbucket_section_name(cmd, scopes));
    sc->limit = limit;
    sc->auto_min = auto_min;
    sc->slot = -1;
    APR_ARRAY_PUSH(scopes, tbucket_local_scope *) = sc;
    return sc;
}

static int mpm_value(int code, int dflt)
{
    int v = 0;

    return ap_mpm_query(code, &v) == APR_SUCCESS && v > 0 ? v : dflt;
}

int tbucket_local_setup(apr_pool_t *pconf, server_rec *main_s)
{
    int i;

    (void)pconf;
    max_workers = mpm_value(AP_MPMQ_MAX_DAEMONS, 1)
                  * mpm_value(AP_MPMQ_MAX_THREADS, 1);
    sb_daemons = mpm_value(AP_MPMQ_HARD_LIMIT_DAEMONS, 1);
    sb_threads = mpm_value(AP_MPMQ_HARD_LIMIT_THREADS, 1);
    /* Owners that died while no parent was watching (a parent that was
     * restarted by a signal reaps its children, but not those of a
     * generation it never saw exit). */
    tbucket_shm_local_reap(0, tb_inflight_pid_alive);
    for (i = 0; scopes && i < scopes->nelts; i++) {
        tbucket_local_scope *sc = APR_ARRAY_IDX(scopes, i,
                                                tbucket_local_scope *);
        const char *why;

        /* auto's max defaults to every worker: no cap beyond them could
         * ever bind. A min above it is lowered to it. */
        if (sc->auto_min > 0 && sc->limit == 0) {
            sc->limit = max_workers;
        }
        if (sc->auto_min > sc->limit) {
            sc->auto_min = sc->limit;
        }
        sc->slot = tbucket_shm_local_slot(sc->name, sc->limit, sc->auto_min,
                                          &why);
        if (sc->slot < 0) {
            ap_log_error(APLOG_MARK, APLOG_EMERG, 0, main_s, TBLOGNO(00140)
                         "TBucketLocalConcurrency %s%d in %s: %s",
                         sc->auto_min ? "auto max=" : "", sc->limit,
                         sc->name, why);
            return HTTP_INTERNAL_SERVER_ERROR;
        }
    }
    return OK;
}

void tbucket_local_child_init(void)
{
    owner_tag = (uint32_t)getpid();
}

/* The parent frees the places of a child it reaped: one killed outright
 * (SIGKILL, a crash) could not give them back itself. */
static void child_status(server_rec *s, pid_t pid, ap_generation_t gen,
                         int slot, mpm_child_status state)
{
    (void)s;
    (void)gen;
    (void)slot;
    if (state == MPM_CHILD_EXITED && pid > 0) {
        tbucket_shm_local_reap((uint32_t)pid, NULL);
    }
}

void tbucket_local_register(void)
{
    ap_hook_child_status(child_status, NULL, NULL, APR_HOOK_MIDDLE);
    register_body_wait();
}

/* ---- Shedding --------------------------------------------------------- */

/* Workers busy with a request, from the scoreboard. */
static uint32_t scan_busy(void)
{
    uint32_t busy = 0;
    int i, j;

    if (!ap_scoreboard_image) {
        return 0;
    }
    for (i = 0; i < sb_daemons; i++) {
        process_score *ps = ap_get_scoreboard_process(i);

        /* A row whose process is gone holds stale statuses. */
        if (!ps || !ps->pid) {
            continue;
        }
        for (j = 0; j < sb_threads; j++) {
            worker_score *ws = ap_get_scoreboard_worker_from_indexes(i, j);

            switch (ws ? ws->status : SERVER_DEAD) {
            case SERVER_BUSY_READ:
            case SERVER_BUSY_WRITE:
            case SERVER_BUSY_LOG:
            case SERVER_BUSY_DNS:
            case SERVER_GRACEFUL:
                busy++;
                break;
            default:
                break;
            }
        }
    }
    return busy;
}

void tbucket_local_busy(apr_time_t now, uint32_t *busy, uint32_t *workers)
{
    uint32_t b, r;

    *workers = (uint32_t)max_workers;
    if (tbucket_shm_busy_get(now, BUSY_MAX_AGE, &b)) {
        *busy = b;
        return;
    }
    b = scan_busy();
    r = tb_inflight_count(tbucket_shm_refusing());
    b = b > r ? b - r : 0;
    tbucket_shm_busy_put(now, b);
    *busy = b;
}

/* busy / workers >= pct / 100, in integers. */
static int at_share(apr_time_t now, int pct)
{
    uint32_t busy, workers;

    tbucket_local_busy(now, &busy, &workers);
    return (uint64_t)busy * 100 >= (uint64_t)pct * workers;
}

int tbucket_local_shed(const tbucket_srv_conf *sc, tbucket_priority prio,
                       apr_time_t now)
{
    int pct = prio < TBUCKET_PRIOS ? sc->shed_pct[prio] : 0;

    return pct > 0 && at_share(now, pct);
}

int tbucket_local_crowded(const tbucket_srv_conf *sc, apr_time_t now)
{
    return sc->shed_min > 0 && at_share(now, sc->shed_min);
}

/* A refused request's place in the refusing table, given back when its
 * pool goes; kept in the same kind of table as the scopes' so that a
 * child killed while answering one leaves nothing behind either. */
typedef struct tbucket_refusal {
    tb_inflight_t *table;
    int index;
    uint32_t tag;
} tbucket_refusal;

static apr_status_t refusal_done(void *data)
{
    tbucket_refusal *f = data;

    tb_inflight_give(f->table, f->index, f->tag);
    return APR_SUCCESS;
}

void tbucket_local_refusing(request_rec *root)
{
    tbucket_refusal *f = apr_palloc(root->pool, sizeof(*f));

    f->table = tbucket_shm_refusing();
    f->tag = owner_tag ? owner_tag : (uint32_t)getpid();
    f->index = tb_inflight_take(f->table, tb_inflight_cap(f->table), f->tag,
                                NULL);
    /* A full table only makes the busy count a little high. */
    if (f->index >= 0) {
        apr_pool_pre_cleanup_register(root->pool, f, refusal_done);
    }
}

tbucket_priority tbucket_dir_priority(const tbucket_dir_conf *dc)
{
    return dc->priority < 0 ? TBUCKET_PRIO_NORMAL
                            : (tbucket_priority)dc->priority;
}

/* ---- Local concurrency ------------------------------------------------ */

/* The places a chain holds, given back when its response ends; an auto
 * scope's cap learns the latency of each when the shared limit, if any,
 * let the chain through: from taking to giving back, less the time its
 * reads of the request body waited for the client (waited_us). */
typedef struct tbucket_places {
    int n;
    tb_inflight_t *table[TBUCKET_MAX_LOCAL];
    int index[TBUCKET_MAX_LOCAL];
    tb_adapt_t *adapt[TBUCKET_MAX_LOCAL];
    uint64_t started_us;
    uint64_t waited_us;
    uint32_t tag;
    request_rec *root;
} tbucket_places;

static ap_filter_rec_t *body_wait_filter;

/* Microseconds of the monotonic clock: async-signal-safe, as a give
 * from a prefork child's signal handler needs. */
static uint64_t mono_us(void)
{
    return (uint64_t)tb_clock_monotonic_us();
}

static apr_status_t give_places(void *data)
{
    tbucket_places *h = data;
    uint64_t now = 0;
    int i, learn = h->root && tbucket_chain_admitted(h->root);

    for (i = 0; i < h->n; i++) {
        tb_inflight_give(h->table[i], h->index[i], h->tag);
        /* A chain the shared limit refused took a few microseconds: a
         * flood of refusals would teach the cap a floor no page has. */
        if (h->adapt[i] && learn) {
            now = now ? now : mono_us();
            tb_adapt_sample(h->adapt[i], h->started_us + h->waited_us, now);
        }
    }
    h->n = 0;
    return APR_SUCCESS;
}

/* A place in sc's table for h: 1, or 0 when the scope is full. */
static int take_place(tbucket_places *h, const tbucket_local_scope *sc,
                      tb_inflight_t *t)
{
    tb_adapt_t *a = sc->auto_min > 0 ? tbucket_shm_local_adapt(sc->slot)
                                     : NULL;
    uint32_t cap = a ? tb_adapt_cap(a) : (uint32_t)sc->limit;
    int k;

    if (cap > tb_inflight_cap(t)) {
        cap = tb_inflight_cap(t);
    }
    k = tb_inflight_take(t, cap, h->tag, NULL);
    if (k < 0) {
        return 0;
    }
    if (a) {
        tb_adapt_taken(a, tb_inflight_count(t));
        h->started_us = h->started_us ? h->started_us : mono_us();
    }
    h->table[h->n] = t;
    h->index[h->n] = k;
    h->adapt[h->n] = a;
    h->n++;
    return 1;
}

const tbucket_local_scope *tbucket_local_take(request_rec *r,
                                              request_rec *root,
                                              const tbucket_dir_conf *dc)
{
    tbucket_places *h;
    int i;

    if (dc->nlocal <= 0) {
        return NULL;
    }
    h = apr_pcalloc(root->pool, sizeof(*h));
    h->tag = owner_tag ? owner_tag : (uint32_t)getpid();
    h->root = root;
    for (i = 0; i < dc->nlocal; i++) {
        const tbucket_local_scope *sc = dc->local[i];
        tb_inflight_t *t = tbucket_shm_local_table(sc->slot);

        if (!t) {
            /* Read after post_config (.htaccess cannot set it): a scope
             * without a record limits nothing. */
            continue;
        }
        if (!take_place(h, sc, t)) {
            tbucket_count_local(sc->slot, 1);
            h->root = NULL;
            give_places(h);
            return sc;
        }
        tbucket_count_local(sc->slot, 0);
    }
    if (h->n) {
        tbucket_release_at_end(r, root, give_places, h);
        /* Only an auto scope learns, and only a body can be waited on. */
        if (h->started_us && ap_request_has_body(r)) {
            ap_add_input_filter_handle(body_wait_filter, h, r, r->connection);
        }
    }
    return NULL;
}

/* The request body's reads, timed: a client sets the pace of its upload
 * (a byte every 0.15 s is within mod_reqtimeout's defaults), and counted
 * as latency, a few slow uploads to a lightly used auto scope read as a
 * queue and cut its cap to min. What a read waits for is the client's;
 * the rest of the request's time (a handler's start, its work, a
 * backend's queue) is the server's, and is what the cap learns. A
 * protocol filter below HTTP_IN, so that it times every read of the body
 * (the handler's, a form field's, a request after an internal redirect,
 * which keeps the protocol filters) and only the waits on the
 * connection: chunk headers included, the kept bytes of a form excluded.
 * Added only to requests with a body in an auto scope: one filter record
 * each, two clock reads per blocking read. Non-blocking reads do not
 * wait. Reads after the places went back (the discarded rest of a body)
 * are not timed. */
static apr_status_t body_wait(ap_filter_t *f, apr_bucket_brigade *bb,
                              ap_input_mode_t mode, apr_read_type_e block,
                              apr_off_t readbytes)
{
    tbucket_places *h = f->ctx;
    uint64_t t0;
    apr_status_t rv;

    if (!h->n) {
        ap_remove_input_filter(f);
        return ap_get_brigade(f->next, bb, mode, block, readbytes);
    }
    if (block == APR_NONBLOCK_READ) {
        return ap_get_brigade(f->next, bb, mode, block, readbytes);
    }
    t0 = mono_us();
    rv = ap_get_brigade(f->next, bb, mode, block, readbytes);
    h->waited_us += mono_us() - t0;
    return rv;
}

static void register_body_wait(void)
{
    body_wait_filter = ap_register_input_filter("TBUCKET_BODY_WAIT",
                                                body_wait, NULL,
                                                AP_FTYPE_PROTOCOL);
}
