/* tbucket_shm.c -- mod_tbucket's shared memory segment.
 *
 * One anonymous segment per parent holds what must be the same whichever
 * child answers: every virtual host's counters, each Redis configuration's
 * core counters and last failure, the local-policy and lease tables, local
 * protection's records (an in-flight table per local scope, the busy
 * count), the rules' records and the top keys. It is made in the first
 * post_config and hangs off the process pool, so a graceful restart keeps
 * it: counters never go backwards and an old generation's children keep
 * writing to valid memory. Only this file sees the layout; others reach it
 * through functions. The last-failure record is a seqlock whose writers
 * take the slot's robust mutex without waiting (docs/design.md, "File
 * notes", says why). */
#include "apr_shm.h"
#include "apr_strings.h"

#include <math.h>
#include <sched.h>

#include "httpd.h"
#include "http_config.h"
#include "http_log.h"

#include "mod_tbucket.h"
#include "tbucket_shm_int.h"

APLOG_USE_MODULE(tbucket);

/* This parent's segment, or NULL before the first post_config. Set in
 * the parent before any child of the generation exists, so children
 * inherit it and only read it. */
tbucket_shm *tbucket_shm_seg = NULL;

const char *const tbucket_outcome_names[TBUCKET_OUTCOMES] = {
    "allowed", "rejected", "shadow-rejected", "fallback-open",
    "fallback-closed", "fallback-local", "shed", "banned"
};

const char *const tbucket_limit_event_names[TBUCKET_LIMIT_EVENTS] = {
    "applied", "refused", "banned", "ban", "charged", "known", "marked",
    "spared"
};

const char *const tbucket_priority_names[TBUCKET_PRIOS] = {
    "low", "normal", "high", "critical"
};

const char *const tbucket_limit_names[TBUCKET_LIMIT_KINDS] = {
    "rate", "concurrency"
};

const char *const tbucket_slot_event_names[TBUCKET_SLOT_EVENTS] = {
    "taken", "refused", "released", "release-failed"
};

/* Bytes before the local table: the header rounded up to a cache line. */
static apr_size_t local_offset(void)
{
    return APR_ALIGN(sizeof(tbucket_shm), 64);
}

/* The K of the main server's TBucketTopKeys: 0 for Off. */
static int top_k_of(server_rec *s)
{
    const tbucket_srv_conf *sc = ap_get_module_config(s->module_config,
                                                      &tbucket_module);

    return sc->top_k;
}

/* The segment made by an earlier load keeps its heavy hitters: say so
 * when this configuration asks for more than they hold. */
static void top_kept(tbucket_shm *seg, server_rec *s)
{
    tb_topk_t *t = seg->top_off ? (tb_topk_t *)((char *)seg + seg->top_off)
                                : NULL;
    int k = top_k_of(s);

    if (k > tb_topk_k(t)) {
        ap_log_error(APLOG_MARK, APLOG_NOTICE, 0, s, TBLOGNO(00202)
                     "TBucketTopKeys %d: the top keys keep the size of the "
                     "configuration Apache started with (%d keys%s) until "
                     "it is stopped and started", k, tb_topk_k(t),
                     t ? "" : ": off");
    }
}

/* Make the segment, or find the one made by an earlier config load of
 * this same parent. The userdata lives in the process pool, which
 * survives restarts; the module's DSO does not, so no function of ours
 * may be registered as a cleanup there. */
static tbucket_shm *shm_attach(apr_pool_t *pconf, server_rec *s)
{
    apr_pool_t *pproc = s->process->pool;
    apr_shm_t *shm = NULL;
    apr_size_t size, top;
    apr_status_t rv;
    tbucket_shm *seg;
    char key[64];
    int i;

    /* Keyed by the layout's size and the tables' (their entries are the
     * core's): a graceful restart onto a module built with another
     * layout makes a fresh segment. The heavy hitters are in the key by
     * their layout (the size of the smallest block), not by their K, so
     * a restart with another TBucketTopKeys keeps the counters. The key
     * is copied by apr_pool_userdata_set. */
    size = local_offset() + tb_local_size(LOCAL_ENTRIES)
           + tb_lease_size(LEASE_ENTRIES) + 8 + INFLIGHT_POOL;
    apr_snprintf(key, sizeof(key), "%s-%" APR_SIZE_T_FMT "-%"
                 APR_SIZE_T_FMT "-%" APR_SIZE_T_FMT, SHM_USERDATA_KEY,
                 sizeof(tbucket_shm), size, tb_topk_size(1));
    apr_pool_userdata_get((void **)&shm, key, pproc);
    if (shm) {
        seg = apr_shm_baseaddr_get(shm);
        top_kept(seg, s);
        return seg;
    }
    top = top_k_of(s) ? tb_topk_size(top_k_of(s)) : 0;
    size += top + 8;
    rv = apr_shm_create(&shm, size, NULL, pproc);
    if (rv == APR_ENOTIMPL) {
        /* No anonymous shared memory here: fall back to a file. */
        const char *fname = ap_runtime_dir_relative(pconf, "tbucket.shm");

        apr_shm_remove(fname, pconf);
        rv = apr_shm_create(&shm, size, fname, pproc);
    }
    if (rv != APR_SUCCESS) {
        ap_log_error(APLOG_MARK, APLOG_EMERG, rv, s, TBLOGNO(00201)
                     "cannot create %" APR_SIZE_T_FMT " bytes of shared "
                     "memory for the counters and the local table", size);
        return NULL;
    }
    seg = apr_shm_baseaddr_get(shm);
    memset(seg, 0, size);
    /* The locks are made here, once, with the segment: a restart that
     * finds the segment above leaves them alone, since a child of the
     * old generation may hold one. */
    for (i = 0; i < MAX_CLIENTS; i++) {
        tb_shlock_init(&seg->clients[i].failure.lock);
    }
    seg->magic = SHM_MAGIC;
    seg->local_entries = LOCAL_ENTRIES;
    seg->local_off = local_offset();
    tb_local_init((char *)seg + seg->local_off, LOCAL_ENTRIES);
    /* Both tables are blocks of 8-byte fields: the lease table follows
     * the local one directly. */
    seg->lease_entries = LEASE_ENTRIES;
    seg->lease_off = seg->local_off + tb_local_size(LOCAL_ENTRIES);
    tb_lease_init((char *)seg + seg->lease_off, LEASE_ENTRIES);
    /* The in-flight tables follow, each 8-byte aligned. */
    seg->pool_off = APR_ALIGN(seg->lease_off + tb_lease_size(LEASE_ENTRIES),
                              8);
    seg->pool_used = 0;
    seg->refusing_off = tbucket_shm_pool_table(seg, REFUSING_PLACES);
    /* The heavy hitters after the in-flight pool, 8-byte aligned. */
    if (top) {
        seg->top_off = APR_ALIGN(seg->pool_off + INFLIGHT_POOL, 8);
        seg->top_bytes = top;
        tb_topk_init((char *)seg + seg->top_off, top_k_of(s));
    }
    apr_pool_userdata_set(shm, key, apr_pool_cleanup_null, pproc);
    return seg;
}

/* The slot of a virtual host, by its name; new names take a free slot,
 * and when none is left they share the last one. Parent only. */
static int vhost_slot(tbucket_shm *seg, const char *name)
{
    uint32_t i;

    for (i = 0; i < seg->nvhosts; i++) {
        if (!strcmp(seg->vhosts[i].name, name)) {
            return (int)i;
        }
    }
    if (seg->nvhosts == MAX_VHOSTS - 1) {
        apr_cpystrn(seg->vhosts[i].name, "other", TBUCKET_NAME_LEN);
        return MAX_VHOSTS - 1;
    }
    if (seg->nvhosts >= MAX_VHOSTS) {
        return MAX_VHOSTS - 1;
    }
    apr_cpystrn(seg->vhosts[i].name, name, TBUCKET_NAME_LEN);
    seg->nvhosts++;
    return (int)i;
}

/* The stats slot of a Redis configuration, by redacted URL and policy. */
static int client_slot(tbucket_shm *seg, const char *redis,
                       const char *policy)
{
    uint32_t i;

    for (i = 0; i < seg->nclients; i++) {
        if (!strcmp(seg->clients[i].redis, redis)
            && !strcmp(seg->clients[i].policy, policy)) {
            return (int)i;
        }
    }
    if (seg->nclients >= MAX_CLIENTS) {
        return MAX_CLIENTS - 1;
    }
    apr_cpystrn(seg->clients[i].redis, redis, TBUCKET_NAME_LEN);
    apr_cpystrn(seg->clients[i].policy, policy, sizeof(seg->clients[i].policy));
    seg->nclients++;
    return (int)i;
}

/* Add a server's name to the list of where a Redis configuration is
 * configured, once; "..." when the list is full. */
static void add_server(tbucket_client_stats *cs, const char *name)
{
    size_t len = strlen(cs->servers), n = strlen(name);
    const char *p = cs->servers;

    while ((p = strstr(p, name)) != NULL) {
        if ((p == cs->servers || p[-1] == ' ') && (p[n] == ',' || !p[n])) {
            return;
        }
        p += n;
    }
    if (len + n + 2 < sizeof(cs->servers)) {
        apr_snprintf(cs->servers + len, sizeof(cs->servers) - len, "%s%s",
                     len ? ", " : "", name);
    }
    else if (len + 4 < sizeof(cs->servers)
             && strcmp(cs->servers + len - 3, "...")) {
        apr_cpystrn(cs->servers + len, ", ...", sizeof(cs->servers) - len);
    }
}

static const char *vhost_name(apr_pool_t *p, const server_rec *s)
{
    apr_port_t port = s->port;

    if (!port && s->addrs) {
        port = s->addrs->host_port;
    }
    if (!port) {
        return s->server_hostname ? s->server_hostname : "-";
    }
    return apr_psprintf(p, "%s:%u",
                        s->server_hostname ? s->server_hostname : "-",
                        (unsigned)port);
}

/* Attach the segment and give each server its vhost and client slots.
 * Runs in the parent during post_config, before any child of this
 * generation exists, so plain writes to the slot names are safe. */
int tbucket_shm_setup(apr_pool_t *pconf, apr_pool_t *plog, server_rec *s)
{
    tbucket_shm *seg = shm_attach(pconf, s);
    uint32_t i;

    (void)plog;
    if (!seg) {
        return HTTP_INTERNAL_SERVER_ERROR;
    }
    tbucket_shm_seg = seg;
    seg->generation++;
    for (i = 0; i < seg->nclients; i++) {
        seg->clients[i].servers[0] = '\0';
    }
    for (; s; s = s->next) {
        tbucket_srv_conf *sc = ap_get_module_config(s->module_config,
                                                    &tbucket_module);
        tb_redis_addr_t addr;
        char redacted[TBUCKET_NAME_LEN];
        char err[160];

        sc->vhost_slot = vhost_slot(seg, vhost_name(pconf, s));
        sc->vhost_name = seg->vhosts[sc->vhost_slot].name;
        if (tb_url_parse(sc->url ? sc->url : TB_DEFAULT_URL,
                         &addr, err, sizeof(err)) != TB_OK) {
            /* Refused at config time already; keep a slot anyway. */
            apr_cpystrn(redacted, "invalid", sizeof(redacted));
        }
        else {
            tb_url_redact(&addr, redacted, sizeof(redacted));
        }
        sc->client_slot = client_slot(seg, redacted,
                                      tb_policy_name((tb_policy_t)sc->policy));
        add_server(&seg->clients[sc->client_slot],
                   s->is_virtual ? sc->vhost_name : "main server");
    }
    return OK;
}

tbucket_client_stats *tbucket_shm_client(const tbucket_srv_conf *sc)
{
    if (!tbucket_shm_seg || sc->client_slot < 0
        || sc->client_slot >= MAX_CLIENTS) {
        return NULL;
    }
    return &tbucket_shm_seg->clients[sc->client_slot];
}

/* This vhost's counters in shared memory, or NULL before there is any. */
static tbucket_vhost_stats *vhost_stats(const tbucket_srv_conf *sc)
{
    if (!tbucket_shm_seg || sc->vhost_slot < 0 || sc->vhost_slot >= MAX_VHOSTS) {
        return NULL;
    }
    return &tbucket_shm_seg->vhosts[sc->vhost_slot];
}

void tbucket_count(const tbucket_srv_conf *sc, tbucket_outcome o,
                   int cost_exceeded)
{
    tbucket_vhost_stats *v = vhost_stats(sc);

    if (!v) {
        return;
    }
    /* Before counting: the first decision of a slot belongs to it. */
    tbucket_ring_tick();
    tb_stats_add(&v->outcome[o], 1);
    if (cost_exceeded) {
        tb_stats_add(&v->cost_exceeded, 1);
    }
}

void tbucket_count_lease(const tbucket_srv_conf *sc, const tb_result_t *res)
{
    tbucket_vhost_stats *v = vhost_stats(sc);

    if (v && res->source == TB_SRC_LEASE) {
        tb_stats_add(&v->lease_hits, 1);
    }
    else if (v && res->granted > 0) {
        tb_stats_add(&v->lease_refills, 1);
        tb_stats_add(&v->lease_tokens, (uint64_t)res->granted);
    }
    tbucket_count_returned(res->lease_returned);
}

void tbucket_count_cost(const tbucket_srv_conf *sc, tbucket_cost_event ev,
                        double delta)
{
    tbucket_vhost_stats *v = vhost_stats(sc);
    double whole = floor(fabs(delta) + 0.5);

    if (!v) {
        return;
    }
    switch (ev) {
    case TBUCKET_COST_REPORTED:
        tb_stats_add(&v->cost_reports, 1);
        break;
    case TBUCKET_COST_SETTLED:
        tb_stats_add(&v->cost_settled, 1);
        tb_stats_add(delta > 0 ? &v->cost_debited : &v->cost_refunded,
                     (uint64_t)whole);
        break;
    case TBUCKET_COST_UNSETTLED:
        tb_stats_add(&v->cost_unsettled, 1);
        break;
    default:
        tb_stats_add(&v->cost_invalid, 1);
        break;
    }
}

void tbucket_count_returned(double tokens)
{
    if (tbucket_shm_seg && tokens > 0) {
        tb_stats_add(&tbucket_shm_seg->lease_returned,
                     (uint64_t)floor(tokens + 0.5));
    }
}

void tbucket_count_cpu(tbucket_priority prio, int failed)
{
    if (tbucket_shm_seg && prio < TBUCKET_PRIOS) {
        tb_stats_add(failed ? &tbucket_shm_seg->cpu_failed : &tbucket_shm_seg->cpu_set[prio],
                     1);
    }
}

void tbucket_count_refusal(const tbucket_srv_conf *sc, tbucket_limit_kind k)
{
    tbucket_vhost_stats *v = vhost_stats(sc);

    if (v && k < TBUCKET_LIMIT_KINDS) {
        tb_stats_add(&v->refused[k], 1);
    }
}

void tbucket_count_slot(const tbucket_srv_conf *sc, tbucket_slot_event e)
{
    tbucket_vhost_stats *v = vhost_stats(sc);

    if (v && e < TBUCKET_SLOT_EVENTS) {
        tb_stats_add(&v->slot_event[e], 1);
    }
}

void tbucket_shm_note_failure(tbucket_client_stats *cs, int kind,
                              const char *reason, apr_time_t now)
{
    tbucket_failure_slot *f;
    uint64_t words[TBUCKET_REASON_LEN / 8];
    uint64_t seq;
    char *w = (char *)words;
    apr_size_t i;
    int rc;

    if (!cs || now <= 0) {
        return;
    }
    f = &cs->failure;
    /* Busy: another child is writing the same news. Recovered: a writer
     * died in the middle, and this one writes every field again. */
    rc = tb_shlock_try(&f->lock);
    if (rc != TB_OK && rc != TB_SHLOCK_RECOVERED) {
        return;
    }
    memset(words, 0, sizeof(words));
    for (i = 0; reason && reason[i] && i < sizeof(words) - 1; i++) {
        unsigned char ch = (unsigned char)reason[i];

        /* One line, whatever a server put in its error reply. */
        w[i] = ch < 0x20 || ch == 0x7f ? '?' : (char)ch;
    }
    /* A dead writer may have left seq odd: it stays odd while copying. */
    seq = __atomic_load_n(&f->seq, __ATOMIC_RELAXED) | 1;
    __atomic_store_n(&f->seq, seq, __ATOMIC_RELAXED);
    __atomic_thread_fence(__ATOMIC_RELEASE);
    __atomic_store_n(&f->kind, (uint64_t)kind, __ATOMIC_RELAXED);
    __atomic_store_n(&f->time_us, (uint64_t)now, __ATOMIC_RELAXED);
    for (i = 0; i < TBUCKET_REASON_LEN / 8; i++) {
        __atomic_store_n(&f->reason[i], words[i], __ATOMIC_RELAXED);
    }
    __atomic_store_n(&f->seq, seq + 1, __ATOMIC_RELEASE);
    tb_shlock_release(&f->lock);
}

int tbucket_shm_failure_get(const tbucket_client_stats *cs,
                            tbucket_failure *out)
{
    const tbucket_failure_slot *f = &cs->failure;
    uint64_t words[TBUCKET_REASON_LEN / 8];
    uint64_t seq, kind, time_us;
    int tries, i;

    for (tries = 0; tries < FAILURE_READ_TRIES; tries++) {
        seq = __atomic_load_n(&f->seq, __ATOMIC_ACQUIRE);
        if (seq & 1) {
            /* A writer is copying: a few hundred nanoseconds, unless it
             * was preempted. */
            sched_yield();
            continue;
        }
        kind = __atomic_load_n(&f->kind, __ATOMIC_RELAXED);
        time_us = __atomic_load_n(&f->time_us, __ATOMIC_RELAXED);
        for (i = 0; i < TBUCKET_REASON_LEN / 8; i++) {
            words[i] = __atomic_load_n(&f->reason[i], __ATOMIC_RELAXED);
        }
        __atomic_thread_fence(__ATOMIC_ACQUIRE);
        if (__atomic_load_n(&f->seq, __ATOMIC_RELAXED) != seq) {
            continue;
        }
        if (!time_us) {
            return 0;
        }
        out->kind = kind < TB_ERR_KINDS ? (int)kind : TB_ERR_NONE;
        out->time = (apr_time_t)time_us;
        memcpy(out->reason, words, sizeof(out->reason));
        out->reason[sizeof(out->reason) - 1] = '\0';
        return 1;
    }
    return 0;
}

tb_lease_t *tbucket_lease_table(void)
{
    if (!tbucket_shm_seg || !tbucket_shm_seg->lease_off) {
        return NULL;
    }
    return (tb_lease_t *)((char *)tbucket_shm_seg + tbucket_shm_seg->lease_off);
}

tb_local_t *tbucket_local_table(void)
{
    if (!tbucket_shm_seg) {
        return NULL;
    }
    return (tb_local_t *)((char *)tbucket_shm_seg + tbucket_shm_seg->local_off);
}

tb_topk_t *tbucket_top_table(void)
{
    if (!tbucket_shm_seg || !tbucket_shm_seg->top_off) {
        return NULL;
    }
    return (tb_topk_t *)((char *)tbucket_shm_seg + tbucket_shm_seg->top_off);
}

apr_size_t tbucket_top_bytes(void)
{
    return tbucket_shm_seg ? (apr_size_t)tbucket_shm_seg->top_bytes : 0;
}

void tbucket_count_key(const tb_topk_item_t *item, int refused,
                       apr_time_t when)
{
    if (tbucket_shm_seg && tbucket_shm_seg->top_off) {
        tb_topk_note((tb_topk_t *)((char *)tbucket_shm_seg + tbucket_shm_seg->top_off),
                     item, refused, (int64_t)apr_time_as_msec(when));
    }
}

int tbucket_shm_view_get(tbucket_shm_view *v)
{
    int i;

    if (!tbucket_shm_seg) {
        return 0;
    }
    v->nvhosts = tbucket_shm_seg->nvhosts;
    v->nclients = tbucket_shm_seg->nclients;
    v->vhosts = tbucket_shm_seg->vhosts;
    v->clients = tbucket_shm_seg->clients;
    v->local_entries = tbucket_shm_seg->local_entries;
    v->generation = tbucket_shm_seg->generation;
    v->lease_returned = tb_stats_get(&tbucket_shm_seg->lease_returned);
    for (i = 0; i < TBUCKET_PRIOS; i++) {
        v->cpu_set[i] = tb_stats_get(&tbucket_shm_seg->cpu_set[i]);
    }
    v->cpu_failed = tb_stats_get(&tbucket_shm_seg->cpu_failed);
    return 1;
}

void tbucket_count_shed(const tbucket_srv_conf *sc, tbucket_priority prio,
                        int local)
{
    tbucket_vhost_stats *v = vhost_stats(sc);

    if (v && prio < TBUCKET_PRIOS) {
        tb_stats_add(local ? &v->local_refused[prio] : &v->shed[prio], 1);
    }
}

int tbucket_shm_busy_get(apr_time_t now, apr_time_t max_age, uint32_t *busy)
{
    uint64_t stamp;

    if (!tbucket_shm_seg) {
        return 0;
    }
    stamp = __atomic_load_n(&tbucket_shm_seg->busy_stamp, __ATOMIC_ACQUIRE);
    /* A stamp from the future (the clock went back) is stale too. */
    if (!stamp || (uint64_t)now < stamp
        || (uint64_t)now - stamp > (uint64_t)max_age) {
        return 0;
    }
    *busy = (uint32_t)__atomic_load_n(&tbucket_shm_seg->busy, __ATOMIC_RELAXED);
    return 1;
}

void tbucket_shm_busy_put(apr_time_t now, uint32_t busy)
{
    if (tbucket_shm_seg) {
        __atomic_store_n(&tbucket_shm_seg->busy, (uint64_t)busy, __ATOMIC_RELAXED);
        __atomic_store_n(&tbucket_shm_seg->busy_stamp, (uint64_t)now,
                         __ATOMIC_RELEASE);
    }
}

/* ---- The pool of the records' tables ------------------------------- */

/* size bytes from the pool: their offset, or 0 when the pool is spent.
 * Parent only. */
uint64_t tbucket_shm_pool_take(tbucket_shm *seg, size_t size)
{
    uint64_t need = APR_ALIGN(size, 8), off;

    if (!need || seg->pool_used + need > INFLIGHT_POOL) {
        return 0;
    }
    off = seg->pool_off + seg->pool_used;
    seg->pool_used += need;
    return off;
}

/* A table of cap places from the pool: its offset, or 0. */
uint64_t tbucket_shm_pool_table(tbucket_shm *seg, uint32_t cap)
{
    uint64_t off = tbucket_shm_pool_take(seg, tb_inflight_size(cap));

    if (off) {
        tb_inflight_init((char *)seg + off, cap);
    }
    return off;
}
