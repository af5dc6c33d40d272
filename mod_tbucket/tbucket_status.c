/* tbucket_status.c -- mod_tbucket's shared memory and its status page.
 *
 * One anonymous shared memory segment per parent process holds everything
 * that must be the same whichever child answers: the decision counters of
 * every virtual host, the core's counters (tb_stats_t) of every distinct
 * Redis configuration, and the table of local buckets behind the `local`
 * failure policy. The segment is made in the first real post_config and
 * hangs off the process pool, so a graceful restart keeps it: counters do
 * not go backwards, and children of the old generation that are still
 * finishing requests keep writing to valid memory.
 *
 * The `tbucket-status` handler renders the counters in the Prometheus text
 * exposition format (version 0.0.4). Counters are server-wide; the breaker
 * state and the pool figures are those of the process that answers, since
 * each child has its own breaker and connections. Nothing here prints a
 * Redis password: URLs are redacted by tb_url_redact before they are stored.
 */
#include "apr_shm.h"
#include "apr_strings.h"

#include "httpd.h"
#include "http_config.h"
#include "http_log.h"
#include "http_main.h"
#include "http_protocol.h"

#include "mod_tbucket.h"

APLOG_USE_MODULE(tbucket);

#define SHM_USERDATA_KEY "mod_tbucket_shm"

tbucket_shm *tbucket_shm_seg = NULL;

const char *const tbucket_outcome_names[TBUCKET_OUTCOMES] = {
    "allowed", "rejected", "shadow-rejected", "fallback-open",
    "fallback-closed", "fallback-local"
};

/* Bytes before the local table: the header rounded up to a cache line. */
static apr_size_t local_offset(void)
{
    return APR_ALIGN(sizeof(tbucket_shm), 64);
}

/* Make the segment, or find the one made by an earlier config load of
 * this same parent. The userdata lives in the process pool, which
 * survives restarts; the module's DSO does not, so no function of ours
 * may be registered as a cleanup there. */
static tbucket_shm *shm_attach(apr_pool_t *pconf, server_rec *s)
{
    apr_pool_t *pproc = s->process->pool;
    apr_shm_t *shm = NULL;
    apr_size_t size;
    apr_status_t rv;
    tbucket_shm *seg;
    char key[64];

    /* Keyed by the layout's size: a graceful restart onto a module
     * built with another layout makes a fresh segment. The key is
     * copied by apr_pool_userdata_set. */
    apr_snprintf(key, sizeof(key), "%s-%" APR_SIZE_T_FMT, SHM_USERDATA_KEY,
                 sizeof(tbucket_shm));
    apr_pool_userdata_get((void **)&shm, key, pproc);
    if (shm) {
        return apr_shm_baseaddr_get(shm);
    }
    size = local_offset() + tb_local_size(TBUCKET_LOCAL_ENTRIES);
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
    seg->magic = TBUCKET_SHM_MAGIC;
    seg->local_entries = TBUCKET_LOCAL_ENTRIES;
    seg->local_off = local_offset();
    tb_local_init((char *)seg + seg->local_off, TBUCKET_LOCAL_ENTRIES);
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
    if (seg->nvhosts == TBUCKET_MAX_VHOSTS - 1) {
        apr_cpystrn(seg->vhosts[i].name, "other", TBUCKET_NAME_LEN);
        return TBUCKET_MAX_VHOSTS - 1;
    }
    if (seg->nvhosts >= TBUCKET_MAX_VHOSTS) {
        return TBUCKET_MAX_VHOSTS - 1;
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
    if (seg->nclients >= TBUCKET_MAX_CLIENTS) {
        return TBUCKET_MAX_CLIENTS - 1;
    }
    apr_cpystrn(seg->clients[i].redis, redis, TBUCKET_NAME_LEN);
    apr_cpystrn(seg->clients[i].policy, policy, sizeof(seg->clients[i].policy));
    seg->nclients++;
    return (int)i;
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

    (void)plog;
    if (!seg) {
        return HTTP_INTERNAL_SERVER_ERROR;
    }
    tbucket_shm_seg = seg;
    seg->generation++;
    for (; s; s = s->next) {
        tbucket_srv_conf *sc = ap_get_module_config(s->module_config,
                                                    &tbucket_module);
        tb_redis_addr_t addr;
        char redacted[TBUCKET_NAME_LEN];
        char err[160];

        sc->vhost_slot = vhost_slot(seg, vhost_name(pconf, s));
        if (tb_url_parse(sc->url ? sc->url : "redis://127.0.0.1:6379",
                         &addr, err, sizeof(err)) != TB_OK) {
            /* Refused at config time already; keep a slot anyway. */
            apr_cpystrn(redacted, "invalid", sizeof(redacted));
        }
        else {
            tb_url_redact(&addr, redacted, sizeof(redacted));
        }
        sc->client_slot = client_slot(seg, redacted,
                                      tb_policy_name(sc->policy));
    }
    return OK;
}

void tbucket_count(const tbucket_srv_conf *sc, tbucket_outcome o,
                   int cost_exceeded)
{
    tbucket_vhost_stats *v;

    if (!tbucket_shm_seg || sc->vhost_slot < 0
        || sc->vhost_slot >= TBUCKET_MAX_VHOSTS) {
        return;
    }
    v = &tbucket_shm_seg->vhosts[sc->vhost_slot];
    tb_stats_add(&v->outcome[o], 1);
    if (cost_exceeded) {
        tb_stats_add(&v->cost_exceeded, 1);
    }
}

tb_local_t *tbucket_local_table(void)
{
    if (!tbucket_shm_seg) {
        return NULL;
    }
    return (tb_local_t *)((char *)tbucket_shm_seg
                          + tbucket_shm_seg->local_off);
}

/* ---- The Prometheus page ------------------------------------------- */

/* A label value with \, " and newline escaped as the format requires. */
static const char *esc(apr_pool_t *p, const char *s)
{
    apr_size_t n = 0;
    const char *q;
    char *out, *o;

    for (q = s; *q; q++) {
        n += (*q == '\\' || *q == '"' || *q == '\n') ? 2 : 1;
    }
    o = out = apr_palloc(p, n + 1);
    for (q = s; *q; q++) {
        if (*q == '\\' || *q == '"') {
            *o++ = '\\';
            *o++ = *q;
        }
        else if (*q == '\n') {
            *o++ = '\\';
            *o++ = 'n';
        }
        else {
            *o++ = *q;
        }
    }
    *o = '\0';
    return out;
}

static void family(request_rec *r, const char *name, const char *type,
                   const char *help)
{
    ap_rprintf(r, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

static void sample(request_rec *r, const char *name, const char *labels,
                   uint64_t v)
{
    ap_rprintf(r, "%s%s%s%s %" APR_UINT64_T_FMT "\n", name,
               labels ? "{" : "", labels ? labels : "", labels ? "}" : "",
               (apr_uint64_t)v);
}

static void render_decisions(request_rec *r, const tbucket_shm *seg)
{
    uint64_t total[TBUCKET_OUTCOMES] = { 0 };
    uint32_t i;
    int o;

    for (i = 0; i < seg->nvhosts; i++) {
        for (o = 0; o < TBUCKET_OUTCOMES; o++) {
            total[o] += tb_stats_get(&seg->vhosts[i].outcome[o]);
        }
    }
    family(r, "tbucket_decisions_total", "counter",
           "Requests limited by mod_tbucket, by outcome (all children).");
    for (o = 0; o < TBUCKET_OUTCOMES; o++) {
        sample(r, "tbucket_decisions_total",
               apr_psprintf(r->pool, "outcome=\"%s\"",
                            tbucket_outcome_names[o]), total[o]);
    }
    family(r, "tbucket_vhost_decisions_total", "counter",
           "Requests limited by mod_tbucket, by virtual host and outcome.");
    for (i = 0; i < seg->nvhosts; i++) {
        const char *vh = esc(r->pool, seg->vhosts[i].name);

        for (o = 0; o < TBUCKET_OUTCOMES; o++) {
            sample(r, "tbucket_vhost_decisions_total",
                   apr_psprintf(r->pool, "vhost=\"%s\",outcome=\"%s\"", vh,
                                tbucket_outcome_names[o]),
                   tb_stats_get(&seg->vhosts[i].outcome[o]));
        }
    }
    family(r, "tbucket_cost_exceeded_total", "counter",
           "Requests refused because their cost exceeds a bucket's "
           "capacity.");
    for (i = 0; i < seg->nvhosts; i++) {
        sample(r, "tbucket_cost_exceeded_total",
               apr_psprintf(r->pool, "vhost=\"%s\"",
                            esc(r->pool, seg->vhosts[i].name)),
               tb_stats_get(&seg->vhosts[i].cost_exceeded));
    }
}

/* One counter of tb_stats_t for every Redis configuration. */
static void render_stat(request_rec *r, const tbucket_shm *seg,
                        const char *const *labels, const char *name,
                        const char *help, apr_size_t field)
{
    uint32_t i;

    family(r, name, "counter", help);
    for (i = 0; i < seg->nclients; i++) {
        const uint64_t *c = (const uint64_t *)
            ((const char *)&seg->clients[i].stats + field);

        sample(r, name, labels[i], tb_stats_get(c));
    }
}

static void render_latency(request_rec *r, const tbucket_shm *seg,
                           const char *const *labels)
{
    const char *name = "tbucket_redis_latency_seconds";
    uint32_t i;
    int b;

    family(r, name, "histogram",
           "Time of one script call to Redis, pool wait included.");
    for (i = 0; i < seg->nclients; i++) {
        const tb_stats_t *st = &seg->clients[i].stats;
        uint64_t cum = 0;

        for (b = 0; b < TB_LAT_BUCKETS; b++) {
            const char *le = b < TB_LAT_BUCKETS - 1
                ? apr_psprintf(r->pool, "%d.%06d",
                               (int)(tb_lat_bounds_us[b] / 1000000),
                               (int)(tb_lat_bounds_us[b] % 1000000))
                : "+Inf";

            cum += tb_stats_get(&st->lat_count[b]);
            sample(r, "tbucket_redis_latency_seconds_bucket",
                   apr_psprintf(r->pool, "%s,le=\"%s\"", labels[i], le),
                   cum);
        }
        ap_rprintf(r, "%s_sum{%s} %" APR_UINT64_T_FMT ".%06u\n", name,
                   labels[i],
                   (apr_uint64_t)(tb_stats_get(&st->lat_sum_us) / 1000000),
                   (unsigned)(tb_stats_get(&st->lat_sum_us) % 1000000));
        sample(r, "tbucket_redis_latency_seconds_count", labels[i], cum);
    }
}

static void render_errors(request_rec *r, const tbucket_shm *seg,
                          const char *const *labels)
{
    uint32_t i;
    int k;

    family(r, "tbucket_redis_errors_total", "counter",
           "Failed Redis calls, by kind.");
    for (i = 0; i < seg->nclients; i++) {
        for (k = 1; k < TB_ERR_KINDS; k++) {
            sample(r, "tbucket_redis_errors_total",
                   apr_psprintf(r->pool, "%s,kind=\"%s\"", labels[i],
                                tb_err_name(k)),
                   tb_stats_get(&seg->clients[i].stats.errors[k]));
        }
    }
    family(r, "tbucket_fallback_decisions_total", "counter",
           "Decisions made by the failure policy because Redis could not "
           "decide.");
    for (i = 0; i < seg->nclients; i++) {
        const tb_stats_t *st = &seg->clients[i].stats;

        sample(r, "tbucket_fallback_decisions_total",
               apr_psprintf(r->pool, "%s,fallback=\"open\"", labels[i]),
               tb_stats_get(&st->fallback_open));
        sample(r, "tbucket_fallback_decisions_total",
               apr_psprintf(r->pool, "%s,fallback=\"closed\"", labels[i]),
               tb_stats_get(&st->fallback_closed));
        sample(r, "tbucket_fallback_decisions_total",
               apr_psprintf(r->pool, "%s,fallback=\"local\"", labels[i]),
               tb_stats_get(&st->fallback_local));
    }
}

/* The clients of this process, each once, with their labels. */
static void render_process(request_rec *r, const tbucket_shm *seg,
                           const char *const *labels)
{
    apr_hash_t *seen = apr_hash_make(r->pool);
    apr_array_header_t *list = apr_array_make(r->pool, 4,
                                              sizeof(tbucket_client *));
    server_rec *s;
    int i, size, open, in_use;

    for (s = ap_server_conf; s; s = s->next) {
        tbucket_srv_conf *sc = ap_get_module_config(s->module_config,
                                                    &tbucket_module);

        if (sc->client && sc->client->tb
            && !apr_hash_get(seen, &sc->client, sizeof(sc->client))) {
            apr_hash_set(seen, &sc->client, sizeof(sc->client), "");
            APR_ARRAY_PUSH(list, tbucket_client *) = sc->client;
        }
    }
    family(r, "tbucket_breaker_state", "gauge",
           "Circuit breaker of the answering process: 0 closed, 1 open, "
           "2 half-open.");
    for (i = 0; i < list->nelts; i++) {
        tbucket_client *c = APR_ARRAY_IDX(list, i, tbucket_client *);

        sample(r, "tbucket_breaker_state",
               labels[c->slot - seg->clients],
               (uint64_t)tb_client_breaker_state(c->tb));
    }
    family(r, "tbucket_pool_size", "gauge",
           "Most Redis connections per process (answering process).");
    for (i = 0; i < list->nelts; i++) {
        tbucket_client *c = APR_ARRAY_IDX(list, i, tbucket_client *);

        tb_client_pool_usage(c->tb, &size, &open, &in_use);
        sample(r, "tbucket_pool_size", labels[c->slot - seg->clients],
               (uint64_t)size);
    }
    family(r, "tbucket_pool_connections_open", "gauge",
           "Redis connections open in the answering process.");
    for (i = 0; i < list->nelts; i++) {
        tbucket_client *c = APR_ARRAY_IDX(list, i, tbucket_client *);

        tb_client_pool_usage(c->tb, &size, &open, &in_use);
        sample(r, "tbucket_pool_connections_open",
               labels[c->slot - seg->clients], (uint64_t)open);
    }
    family(r, "tbucket_pool_connections_in_use", "gauge",
           "Redis connections borrowed right now in the answering process.");
    for (i = 0; i < list->nelts; i++) {
        tbucket_client *c = APR_ARRAY_IDX(list, i, tbucket_client *);

        tb_client_pool_usage(c->tb, &size, &open, &in_use);
        sample(r, "tbucket_pool_connections_in_use",
               labels[c->slot - seg->clients], (uint64_t)in_use);
    }
}

static void render_clients(request_rec *r, const tbucket_shm *seg)
{
    const char **labels = apr_pcalloc(r->pool,
                                      (seg->nclients + 1) * sizeof(char *));
    uint32_t i;

    for (i = 0; i < seg->nclients; i++) {
        labels[i] = apr_psprintf(r->pool, "redis=\"%s\",policy=\"%s\"",
                                 esc(r->pool, seg->clients[i].redis),
                                 esc(r->pool, seg->clients[i].policy));
    }
    render_stat(r, seg, labels, "tbucket_redis_calls_total",
                "Script calls sent to Redis.",
                APR_OFFSETOF(tb_stats_t, redis_calls));
    render_stat(r, seg, labels, "tbucket_redis_failures_total",
                "Failed Redis calls, all kinds.",
                APR_OFFSETOF(tb_stats_t, redis_errors));
    render_errors(r, seg, labels);
    render_latency(r, seg, labels);
    render_stat(r, seg, labels, "tbucket_redis_connects_total",
                "Redis connections opened.",
                APR_OFFSETOF(tb_stats_t, connects));
    render_stat(r, seg, labels, "tbucket_redis_noscript_reloads_total",
                "NOSCRIPT answers retried with EVAL.",
                APR_OFFSETOF(tb_stats_t, noscript_reloads));
    render_stat(r, seg, labels, "tbucket_breaker_opens_total",
                "Breaker transitions from closed to open.",
                APR_OFFSETOF(tb_stats_t, breaker_opens));
    render_stat(r, seg, labels, "tbucket_breaker_closes_total",
                "Breaker transitions back to closed.",
                APR_OFFSETOF(tb_stats_t, breaker_closes));
    render_stat(r, seg, labels, "tbucket_breaker_skips_total",
                "Decisions made without asking Redis (breaker open).",
                APR_OFFSETOF(tb_stats_t, breaker_skips));
    render_process(r, seg, labels);
}

/* The tbucket-status handler (SetHandler tbucket-status). GET and HEAD
 * only; protect it with Require like server-status. */
int tbucket_status_handler(request_rec *r)
{
    const tbucket_shm *seg = tbucket_shm_seg;

    if (!r->handler || strcmp(r->handler, "tbucket-status")) {
        return DECLINED;
    }
    r->allowed |= (AP_METHOD_BIT << M_GET);
    if (r->method_number != M_GET) {
        return HTTP_METHOD_NOT_ALLOWED;
    }
    if (!seg) {
        return HTTP_SERVICE_UNAVAILABLE;
    }
    ap_set_content_type(r, "text/plain; version=0.0.4; charset=utf-8");
    apr_table_setn(r->headers_out, "Cache-Control", "no-store");
    if (r->header_only) {
        return OK;
    }
    render_decisions(r, seg);
    render_clients(r, seg);
    family(r, "tbucket_local_entries_used", "gauge",
           "Buckets held in the shared local-policy table.");
    sample(r, "tbucket_local_entries_used", NULL,
           (uint64_t)tb_local_used(tbucket_local_table()));
    family(r, "tbucket_local_entries_max", "gauge",
           "Size of the shared local-policy table.");
    sample(r, "tbucket_local_entries_max", NULL,
           (uint64_t)seg->local_entries);
    family(r, "tbucket_config_generation", "gauge",
           "Configuration loads since the server started.");
    sample(r, "tbucket_config_generation", NULL, seg->generation);
    return OK;
}
