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
 * exposition format (version 0.0.4), or with `?view=html` as a page for a
 * browser. Both views are printed from one table of metrics built per
 * request (collect), so their figures cannot drift apart; the HTML view
 * adds layout (tables by topic, bars) and nothing else. Counters are
 * server-wide; the breaker state and the pool figures are those of the
 * process that answers, since each child has its own breaker and
 * connections. Nothing here prints a Redis password: URLs are redacted by
 * tb_url_redact before they are stored.
 */
#include "apr_shm.h"
#include "apr_strings.h"

#include <unistd.h>

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
    size = local_offset() + tb_local_size(TBUCKET_LOCAL_ENTRIES)
           + tb_lease_size(TBUCKET_LEASE_ENTRIES);
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
    /* Both tables are blocks of 8-byte fields: the lease table follows
     * the local one directly. */
    seg->lease_entries = TBUCKET_LEASE_ENTRIES;
    seg->lease_off = seg->local_off + tb_local_size(TBUCKET_LOCAL_ENTRIES);
    tb_lease_init((char *)seg + seg->lease_off, TBUCKET_LEASE_ENTRIES);
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

/* This vhost's counters in shared memory, or NULL before there is any. */
static tbucket_vhost_stats *vhost_stats(const tbucket_srv_conf *sc)
{
    if (!tbucket_shm_seg || sc->vhost_slot < 0
        || sc->vhost_slot >= TBUCKET_MAX_VHOSTS) {
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
    tb_stats_add(&v->outcome[o], 1);
    if (cost_exceeded) {
        tb_stats_add(&v->cost_exceeded, 1);
    }
}

void tbucket_count_lease(const tbucket_srv_conf *sc, int hit,
                         int64_t granted)
{
    tbucket_vhost_stats *v = vhost_stats(sc);

    if (!v) {
        return;
    }
    if (hit) {
        tb_stats_add(&v->lease_hits, 1);
    }
    else {
        tb_stats_add(&v->lease_refills, 1);
        tb_stats_add(&v->lease_tokens, (uint64_t)granted);
    }
}

tb_lease_t *tbucket_lease_table(void)
{
    if (!tbucket_shm_seg || !tbucket_shm_seg->lease_off) {
        return NULL;
    }
    return (tb_lease_t *)((char *)tbucket_shm_seg
                          + tbucket_shm_seg->lease_off);
}

tb_local_t *tbucket_local_table(void)
{
    if (!tbucket_shm_seg) {
        return NULL;
    }
    return (tb_local_t *)((char *)tbucket_shm_seg
                          + tbucket_shm_seg->local_off);
}

/* ---- The table of metrics ------------------------------------------ */

/* Both views of the page are rendered from one table, built once per
 * request: a list of families (name, type, help), each with its samples
 * (a suffix, labels and a value). Label values are stored raw; each
 * renderer escapes them for its own format, so a vhost name is escaped
 * once for Prometheus and once for HTML and never twice. The figures of
 * the two views cannot drift because neither reads the segment. */

#define METRIC_MAX_LABELS 4

typedef struct metric_labels {
    int n;
    const char *name[METRIC_MAX_LABELS];
    const char *value[METRIC_MAX_LABELS];  /* Raw, unescaped. */
} metric_labels;

typedef struct metric_sample {
    const char *suffix;               /* "" or "_bucket", "_sum", "_count". */
    metric_labels labels;
    uint64_t value;                   /* In millionths when micro is 1.   */
    int micro;
} metric_sample;

typedef struct metric_family {
    const char *name;
    const char *type;                 /* "counter", "gauge", "histogram". */
    const char *help;
    apr_array_header_t *samples;      /* metric_sample, in output order. */
} metric_family;

typedef struct metric_table {
    apr_pool_t *p;
    apr_array_header_t *families;     /* metric_family *, in output order. */
} metric_table;

static metric_family *fam_add(metric_table *t, const char *name,
                              const char *type, const char *help)
{
    metric_family *f = apr_pcalloc(t->p, sizeof(*f));

    f->name = name;
    f->type = type;
    f->help = help;
    f->samples = apr_array_make(t->p, 8, sizeof(metric_sample));
    APR_ARRAY_PUSH(t->families, metric_family *) = f;
    return f;
}

/* A copy of base with one more label (base may be NULL). */
static metric_labels with(const metric_labels *base, const char *name,
                          const char *value)
{
    metric_labels l;

    if (base) {
        l = *base;
    }
    else {
        memset(&l, 0, sizeof(l));
    }
    if (l.n < METRIC_MAX_LABELS) {
        l.name[l.n] = name;
        l.value[l.n] = value;
        l.n++;
    }
    return l;
}

static void add(metric_family *f, const char *suffix,
                const metric_labels *l, uint64_t v)
{
    metric_sample *s = apr_array_push(f->samples);

    s->suffix = suffix;
    if (l) {
        s->labels = *l;
    }
    else {
        memset(&s->labels, 0, sizeof(s->labels));
    }
    s->value = v;
    s->micro = 0;
}

/* One counter of tbucket_vhost_stats per virtual host; field is its
 * offset. */
static void collect_vhost_counter(metric_table *t, const tbucket_shm *seg,
                                  const char *name, const char *help,
                                  apr_size_t field)
{
    metric_family *f = fam_add(t, name, "counter", help);
    metric_labels l;
    uint32_t i;

    for (i = 0; i < seg->nvhosts; i++) {
        l = with(NULL, "vhost", seg->vhosts[i].name);
        add(f, "", &l, tb_stats_get((const uint64_t *)
            ((const char *)&seg->vhosts[i] + field)));
    }
}

static void collect_decisions(metric_table *t, const tbucket_shm *seg)
{
    uint64_t total[TBUCKET_OUTCOMES] = { 0 };
    metric_family *f;
    metric_labels l;
    uint32_t i;
    int o;

    for (i = 0; i < seg->nvhosts; i++) {
        for (o = 0; o < TBUCKET_OUTCOMES; o++) {
            total[o] += tb_stats_get(&seg->vhosts[i].outcome[o]);
        }
    }
    f = fam_add(t, "tbucket_decisions_total", "counter",
                "Requests limited by mod_tbucket, by outcome (all children).");
    for (o = 0; o < TBUCKET_OUTCOMES; o++) {
        l = with(NULL, "outcome", tbucket_outcome_names[o]);
        add(f, "", &l, total[o]);
    }
    f = fam_add(t, "tbucket_vhost_decisions_total", "counter",
                "Requests limited by mod_tbucket, by virtual host and "
                "outcome.");
    for (i = 0; i < seg->nvhosts; i++) {
        metric_labels vh = with(NULL, "vhost", seg->vhosts[i].name);

        for (o = 0; o < TBUCKET_OUTCOMES; o++) {
            l = with(&vh, "outcome", tbucket_outcome_names[o]);
            add(f, "", &l, tb_stats_get(&seg->vhosts[i].outcome[o]));
        }
    }
    f = fam_add(t, "tbucket_cost_exceeded_total", "counter",
                "Requests refused because their cost exceeds a bucket's "
                "capacity.");
    for (i = 0; i < seg->nvhosts; i++) {
        l = with(NULL, "vhost", seg->vhosts[i].name);
        add(f, "", &l, tb_stats_get(&seg->vhosts[i].cost_exceeded));
    }
    collect_vhost_counter(t, seg, "tbucket_lease_hits_total",
                          "Requests allowed from a token lease, without "
                          "asking Redis (TBucketLease).",
                          APR_OFFSETOF(tbucket_vhost_stats, lease_hits));
    collect_vhost_counter(t, seg, "tbucket_lease_refills_total",
                          "Leases taken from Redis (one script call each).",
                          APR_OFFSETOF(tbucket_vhost_stats, lease_refills));
    collect_vhost_counter(t, seg, "tbucket_lease_tokens_granted_total",
                          "Tokens granted by those leases; unspent ones "
                          "expire.",
                          APR_OFFSETOF(tbucket_vhost_stats, lease_tokens));
}

/* One counter of tb_stats_t for every Redis configuration; field is the
 * counter's offset in tb_stats_t. */
static void collect_stat(metric_table *t, const tbucket_shm *seg,
                         const metric_labels *cl, const char *name,
                         const char *help, apr_size_t field)
{
    metric_family *f = fam_add(t, name, "counter", help);
    uint32_t i;

    for (i = 0; i < seg->nclients; i++) {
        const uint64_t *c = (const uint64_t *)
            ((const char *)&seg->clients[i].stats + field);

        add(f, "", &cl[i], tb_stats_get(c));
    }
}

/* The histogram's buckets are cumulative, as Prometheus wants; the sum
 * is kept in microseconds and shown in seconds. */
static void collect_latency(metric_table *t, const tbucket_shm *seg,
                            const metric_labels *cl)
{
    metric_family *f = fam_add(t, "tbucket_redis_latency_seconds",
                               "histogram", "Time of one script call to "
                               "Redis, pool wait included.");
    uint32_t i;
    int b;

    for (i = 0; i < seg->nclients; i++) {
        const tb_stats_t *st = &seg->clients[i].stats;
        uint64_t cum = 0;
        metric_labels l;

        for (b = 0; b < TB_LAT_BUCKETS; b++) {
            const char *le = b < TB_LAT_BUCKETS - 1
                ? apr_psprintf(t->p, "%d.%06d",
                               (int)(tb_lat_bounds_us[b] / 1000000),
                               (int)(tb_lat_bounds_us[b] % 1000000))
                : "+Inf";

            cum += tb_stats_get(&st->lat_count[b]);
            l = with(&cl[i], "le", le);
            add(f, "_bucket", &l, cum);
        }
        add(f, "_sum", &cl[i], tb_stats_get(&st->lat_sum_us));
        APR_ARRAY_IDX(f->samples, f->samples->nelts - 1,
                      metric_sample).micro = 1;
        add(f, "_count", &cl[i], cum);
    }
}

static void collect_errors(metric_table *t, const tbucket_shm *seg,
                           const metric_labels *cl)
{
    static const char *const fb[3] = { "open", "closed", "local" };
    metric_family *f;
    metric_labels l;
    uint32_t i;
    int k;

    f = fam_add(t, "tbucket_redis_errors_total", "counter",
                "Failed Redis calls, by kind.");
    for (i = 0; i < seg->nclients; i++) {
        for (k = 1; k < TB_ERR_KINDS; k++) {
            l = with(&cl[i], "kind", tb_err_name(k));
            add(f, "", &l, tb_stats_get(&seg->clients[i].stats.errors[k]));
        }
    }
    f = fam_add(t, "tbucket_fallback_decisions_total", "counter",
                "Decisions made by the failure policy because Redis could "
                "not decide.");
    for (i = 0; i < seg->nclients; i++) {
        const tb_stats_t *st = &seg->clients[i].stats;
        const uint64_t *c[3];

        c[0] = &st->fallback_open;
        c[1] = &st->fallback_closed;
        c[2] = &st->fallback_local;
        for (k = 0; k < 3; k++) {
            l = with(&cl[i], "fallback", fb[k]);
            add(f, "", &l, tb_stats_get(c[k]));
        }
    }
}

/* The clients of this process, each once. */
static apr_array_header_t *process_clients(apr_pool_t *p)
{
    apr_hash_t *seen = apr_hash_make(p);
    apr_array_header_t *list = apr_array_make(p, 4,
                                              sizeof(tbucket_client *));
    server_rec *s;

    for (s = ap_server_conf; s; s = s->next) {
        tbucket_srv_conf *sc = ap_get_module_config(s->module_config,
                                                    &tbucket_module);

        if (sc->client && sc->client->tb
            && !apr_hash_get(seen, &sc->client, sizeof(sc->client))) {
            apr_hash_set(seen, &sc->client, sizeof(sc->client), "");
            APR_ARRAY_PUSH(list, tbucket_client *) = sc->client;
        }
    }
    return list;
}

/* The breaker and pool of the answering process. Each child has its own,
 * so these are gauges of whichever child serves the scrape. */
static void collect_process(metric_table *t, const tbucket_shm *seg,
                            const metric_labels *cl)
{
    apr_array_header_t *list = process_clients(t->p);
    metric_family *f[4];
    int i, size, open, in_use;

    f[0] = fam_add(t, "tbucket_breaker_state", "gauge",
                   "Circuit breaker of the answering process: 0 closed, "
                   "1 open, 2 half-open.");
    f[1] = fam_add(t, "tbucket_pool_size", "gauge",
                   "Most Redis connections per process (answering "
                   "process).");
    f[2] = fam_add(t, "tbucket_pool_connections_open", "gauge",
                   "Redis connections open in the answering process.");
    f[3] = fam_add(t, "tbucket_pool_connections_in_use", "gauge",
                   "Redis connections borrowed right now in the answering "
                   "process.");
    for (i = 0; i < list->nelts; i++) {
        tbucket_client *c = APR_ARRAY_IDX(list, i, tbucket_client *);
        const metric_labels *l = &cl[c->slot - seg->clients];

        tb_client_pool_usage(c->tb, &size, &open, &in_use);
        add(f[0], "", l, (uint64_t)tb_client_breaker_state(c->tb));
        add(f[1], "", l, (uint64_t)size);
        add(f[2], "", l, (uint64_t)open);
        add(f[3], "", l, (uint64_t)in_use);
    }
}

static void collect_clients(metric_table *t, const tbucket_shm *seg)
{
    metric_labels *cl = apr_pcalloc(t->p,
                                    (seg->nclients + 1) * sizeof(*cl));
    uint32_t i;

    for (i = 0; i < seg->nclients; i++) {
        cl[i] = with(NULL, "redis", seg->clients[i].redis);
        cl[i] = with(&cl[i], "policy", seg->clients[i].policy);
    }
    collect_stat(t, seg, cl, "tbucket_redis_calls_total",
                 "Script calls sent to Redis.",
                 APR_OFFSETOF(tb_stats_t, redis_calls));
    collect_stat(t, seg, cl, "tbucket_redis_failures_total",
                 "Failed Redis calls, all kinds.",
                 APR_OFFSETOF(tb_stats_t, redis_errors));
    collect_errors(t, seg, cl);
    collect_latency(t, seg, cl);
    collect_stat(t, seg, cl, "tbucket_redis_connects_total",
                 "Redis connections opened.",
                 APR_OFFSETOF(tb_stats_t, connects));
    collect_stat(t, seg, cl, "tbucket_redis_noscript_reloads_total",
                 "NOSCRIPT answers retried with EVAL.",
                 APR_OFFSETOF(tb_stats_t, noscript_reloads));
    collect_stat(t, seg, cl, "tbucket_breaker_opens_total",
                 "Breaker transitions from closed to open.",
                 APR_OFFSETOF(tb_stats_t, breaker_opens));
    collect_stat(t, seg, cl, "tbucket_breaker_closes_total",
                 "Breaker transitions back to closed.",
                 APR_OFFSETOF(tb_stats_t, breaker_closes));
    collect_stat(t, seg, cl, "tbucket_breaker_skips_total",
                 "Decisions made without asking Redis (breaker open).",
                 APR_OFFSETOF(tb_stats_t, breaker_skips));
    collect_process(t, seg, cl);
}

/* Every figure of the page, in the Prometheus output order. Allocates
 * from p; reads the segment with atomic loads only. */
static metric_table *collect(apr_pool_t *p, const tbucket_shm *seg)
{
    metric_table *t = apr_pcalloc(p, sizeof(*t));
    metric_family *f;

    t->p = p;
    t->families = apr_array_make(p, 32, sizeof(metric_family *));
    collect_decisions(t, seg);
    collect_clients(t, seg);
    f = fam_add(t, "tbucket_local_entries_used", "gauge",
                "Buckets held in the shared local-policy table.");
    add(f, "", NULL, (uint64_t)tb_local_used(tbucket_local_table()));
    f = fam_add(t, "tbucket_local_entries_max", "gauge",
                "Size of the shared local-policy table.");
    add(f, "", NULL, (uint64_t)seg->local_entries);
    f = fam_add(t, "tbucket_lease_entries_used", "gauge",
                "Leases held in the shared lease table (TBucketLease).");
    add(f, "", NULL, (uint64_t)tb_lease_used(tbucket_lease_table()));
    f = fam_add(t, "tbucket_config_generation", "gauge",
                "Configuration loads since the server started.");
    add(f, "", NULL, seg->generation);
    return t;
}

/* ---- The Prometheus text view -------------------------------------- */

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

/* The labels in Prometheus syntax, without the braces ("" when none). */
static const char *prom_labels(apr_pool_t *p, const metric_labels *l)
{
    const char *out = "";
    int i;

    for (i = 0; i < l->n; i++) {
        out = apr_pstrcat(p, out, i ? "," : "", l->name[i], "=\"",
                          esc(p, l->value[i]), "\"", NULL);
    }
    return out;
}

/* A sample's value as both views print it: an integer, or seconds with
 * six decimals for values kept in microseconds. */
static const char *value_str(apr_pool_t *p, const metric_sample *s)
{
    if (s->micro) {
        return apr_psprintf(p, "%" APR_UINT64_T_FMT ".%06u",
                            (apr_uint64_t)(s->value / 1000000),
                            (unsigned)(s->value % 1000000));
    }
    return apr_psprintf(p, "%" APR_UINT64_T_FMT, (apr_uint64_t)s->value);
}

static void render_text(request_rec *r, const metric_table *t)
{
    int i, j;

    for (i = 0; i < t->families->nelts; i++) {
        const metric_family *f = APR_ARRAY_IDX(t->families, i,
                                               metric_family *);

        ap_rprintf(r, "# HELP %s %s\n# TYPE %s %s\n", f->name, f->help,
                   f->name, f->type);
        for (j = 0; j < f->samples->nelts; j++) {
            const metric_sample *s = &APR_ARRAY_IDX(f->samples, j,
                                                    metric_sample);

            ap_rprintf(r, "%s%s%s%s%s %s\n", f->name, s->suffix,
                       s->labels.n ? "{" : "",
                       prom_labels(r->pool, &s->labels),
                       s->labels.n ? "}" : "", value_str(r->pool, s));
        }
    }
}

/* ---- The HTML view --------------------------------------------------- */

/* A page for a person at a browser: the same table, laid out by topic.
 * Self-contained (inline CSS, no script, no external resource; the
 * Content-Security-Policy header says so to the browser too). Every
 * figure that comes from the table is printed in an element carrying
 * data-metric and data-labels (the sample's name and its Prometheus
 * labels), so a test can match each one to a line of the text view.
 * Everything that comes from configuration goes through
 * ap_escape_html, and attributes are always double-quoted. */

static const char html_css[] =
    "body{font:14px/1.45 system-ui,-apple-system,\"Segoe UI\",Roboto,"
    "sans-serif;color:#1f2328;background:#f6f8fa;margin:0;padding:20px}"
    "main{max-width:940px;margin:0 auto}"
    "h1{font-size:22px;margin:0 0 4px}"
    "h2{font-size:17px;margin:22px 0 8px;padding-bottom:4px;"
    "border-bottom:1px solid #d0d7de}"
    "h3{font-size:14px;margin:14px 0 6px;color:#57606a}"
    ".meta{color:#57606a;margin:0 0 8px}"
    ".card{background:#fff;border:1px solid #d0d7de;border-radius:6px;"
    "padding:10px 14px;margin:10px 0}"
    ".grid{display:flex;flex-wrap:wrap;gap:0 28px}"
    ".grid>div{flex:1 1 260px}"
    "table{border-collapse:collapse;width:100%;background:#fff}"
    "th,td{padding:3px 8px;border-bottom:1px solid #eaeef2;"
    "text-align:left;vertical-align:top}"
    "th{background:#f6f8fa;font-weight:600}"
    "td.n,th.n{text-align:right;font-variant-numeric:tabular-nums;"
    "white-space:nowrap}"
    "td.bar{width:45%}"
    ".kv th{background:none;font-weight:normal;color:#424a53}"
    ".bar span{display:block;height:12px;background:#54aeff;"
    "border-radius:2px;min-width:1px}"
    "code{font:12px ui-monospace,SFMono-Regular,Menlo,monospace;"
    "word-break:break-all}"
    ".badge{display:inline-block;padding:0 8px;border-radius:10px;"
    "font-weight:600;color:#fff}"
    ".s0{background:#1a7f37}.s1{background:#cf222e}.s2{background:#bf8700}"
    ".zero{color:#8c959f}"
    "details{margin-top:22px}summary{cursor:pointer;font-weight:600}"
    "footer{margin-top:18px;color:#57606a;font-size:12px}";

static const metric_family *fam_find(const metric_table *t,
                                     const char *name)
{
    int i;

    for (i = 0; i < t->families->nelts; i++) {
        const metric_family *f = APR_ARRAY_IDX(t->families, i,
                                               metric_family *);

        if (!strcmp(f->name, name)) {
            return f;
        }
    }
    return NULL;
}

static const char *label_get(const metric_labels *l, const char *name)
{
    int i;

    for (i = 0; i < l->n; i++) {
        if (!strcmp(l->name[i], name)) {
            return l->value[i];
        }
    }
    return NULL;
}

/* 1 when have carries every label of want with the same value. */
static int labels_include(const metric_labels *have,
                          const metric_labels *want)
{
    int k;

    for (k = 0; k < want->n; k++) {
        const char *v = label_get(have, want->name[k]);

        if (!v || strcmp(v, want->value[k])) {
            return 0;
        }
    }
    return 1;
}

/* The first sample of f with this suffix that carries every label of
 * want (and perhaps more), or NULL. Linear: the HTML view asks a few
 * questions per Redis configuration or vhost, of small families. */
static const metric_sample *sample_find(const metric_family *f,
                                        const char *suffix,
                                        const metric_labels *want)
{
    int i;

    for (i = 0; f && i < f->samples->nelts; i++) {
        const metric_sample *s = &APR_ARRAY_IDX(f->samples, i,
                                                metric_sample);

        if (!strcmp(s->suffix, suffix) && labels_include(&s->labels, want)) {
            return s;
        }
    }
    return NULL;
}

static const char *h(request_rec *r, const char *s)
{
    return ap_escape_html(r->pool, s);
}

/* One figure, in a <td> (cell) or a <span>, tagged for the tests; a
 * dash when the table has no such sample (a Redis configuration that
 * the answering process has no client for). */
static void html_value(request_rec *r, const metric_family *f,
                       const metric_sample *s, int cell)
{
    const char *tag = cell ? "td" : "span";

    if (!f || !s) {
        ap_rprintf(r, "<%s class=\"n zero\">&ndash;</%s>", tag, tag);
        return;
    }
    ap_rprintf(r, "<%s class=\"n%s\" data-metric=\"%s%s\" "
               "data-labels=\"%s\">%s</%s>", tag, s->value ? "" : " zero",
               f->name, s->suffix, h(r, prom_labels(r->pool, &s->labels)),
               value_str(r->pool, s), tag);
}

/* A bar cell, n out of max, as a percentage width. */
static void html_bar(request_rec *r, uint64_t n, uint64_t max)
{
    unsigned pct = max ? (unsigned)((n * 100 + max - 1) / max) : 0;

    if (!n) {
        ap_rputs("<td class=\"bar\"></td>", r);
        return;
    }
    ap_rprintf(r, "<td class=\"bar\"><span style=\"width:%u%%\"></span>"
               "</td>", pct > 100 ? 100 : pct);
}

/* A table of one family's samples that carry the labels of want: the
 * value of one label, the figure and, with bars, a bar against the
 * largest figure of the table. */
static void html_by_label(request_rec *r, const metric_family *f,
                          const metric_labels *want, const char *label,
                          int bars)
{
    uint64_t max = 0;
    int i, pass;

    ap_rprintf(r, "<table><tr><th>%s</th><th class=\"n\">count</th>%s"
               "</tr>", h(r, label), bars ? "<th></th>" : "");
    for (pass = 0; f && pass < 2; pass++) {
        for (i = 0; i < f->samples->nelts; i++) {
            const metric_sample *s = &APR_ARRAY_IDX(f->samples, i,
                                                    metric_sample);
            const char *v = label_get(&s->labels, label);

            if (!v || !labels_include(&s->labels, want)) {
                continue;
            }
            if (pass == 0) {
                max = s->value > max ? s->value : max;
                continue;
            }
            ap_rprintf(r, "<tr><td>%s</td>", h(r, v));
            html_value(r, f, s, 1);
            if (bars) {
                html_bar(r, s->value, max);
            }
            ap_rputs("</tr>", r);
        }
    }
    ap_rputs("</table>", r);
}

/* Decisions by virtual host: one row per vhost, one column per outcome.
 * collect_decisions writes each vhost's outcomes together and in
 * tbucket_outcome_names order, which is the order of the columns. */
static void html_vhosts(request_rec *r, const metric_table *t)
{
    const metric_family *f = fam_find(t, "tbucket_vhost_decisions_total");
    const metric_family *ce = fam_find(t, "tbucket_cost_exceeded_total");
    const char *row = NULL;
    metric_labels want;
    int i, o;

    ap_rputs("<h2>Decisions by virtual host</h2><table><tr>"
             "<th>virtual host</th>", r);
    for (o = 0; o < TBUCKET_OUTCOMES; o++) {
        ap_rprintf(r, "<th class=\"n\">%s</th>",
                   h(r, tbucket_outcome_names[o]));
    }
    ap_rputs("<th class=\"n\">cost exceeded</th></tr>", r);
    for (i = 0; f && i <= f->samples->nelts; i++) {
        const metric_sample *s = i < f->samples->nelts
            ? &APR_ARRAY_IDX(f->samples, i, metric_sample) : NULL;
        const char *outcome = s ? label_get(&s->labels, "outcome") : NULL;

        if (row && (!s || !strcmp(outcome, tbucket_outcome_names[0]))) {
            want = with(NULL, "vhost", row);
            html_value(r, ce, sample_find(ce, "", &want), 1);
            ap_rputs("</tr>", r);
            row = NULL;
        }
        if (!s) {
            break;
        }
        if (!row) {
            row = label_get(&s->labels, "vhost");
            ap_rprintf(r, "<tr><td><code>%s</code></td>", h(r, row));
        }
        html_value(r, f, s, 1);
    }
    ap_rputs("</table>", r);
}

/* A row of a figures table: a name and one sample of a family. */
static void html_fig(request_rec *r, const metric_table *t,
                     const char *title, const char *name,
                     const char *suffix, const metric_labels *want)
{
    const metric_family *f = fam_find(t, name);

    ap_rprintf(r, "<tr><th>%s</th>", h(r, title));
    html_value(r, f, sample_find(f, suffix, want), 1);
    ap_rputs("</tr>", r);
}

/* The breaker of the answering process, as a coloured badge beside its
 * number. */
static void html_breaker(request_rec *r, const metric_table *t,
                         const metric_labels *want)
{
    const metric_family *f = fam_find(t, "tbucket_breaker_state");
    const metric_sample *s = sample_find(f, "", want);

    ap_rputs("<tr><th>breaker state</th><td class=\"n\">", r);
    if (s && s->value <= TB_BREAKER_HALF_OPEN) {
        ap_rprintf(r, "<span class=\"badge s%u\">%s</span> ",
                   (unsigned)s->value,
                   tb_breaker_state_name((tb_breaker_state_t)s->value));
    }
    html_value(r, f, s, 0);
    ap_rputs("</td></tr>", r);
}

/* A bound in microseconds for people: "250 &micro;s", "2.5 ms". */
static const char *us_text(apr_pool_t *p, int64_t us)
{
    if (us < 1000) {
        return apr_psprintf(p, "%d &micro;s", (int)us);
    }
    if (us % 1000) {
        return apr_psprintf(p, "%d.%d ms", (int)(us / 1000),
                            (int)(us % 1000 / 100));
    }
    return apr_psprintf(p, "%d ms", (int)(us / 1000));
}

/* The row title of a histogram bucket, from its le label ("0.000250",
 * six decimals as collect_latency writes it, or "+Inf"); *prev_us keeps
 * the last finite bound for the +Inf row. HTML, already escaped. */
static const char *le_text(apr_pool_t *p, const char *le, int64_t *prev_us)
{
    const char *dot = strchr(le, '.');

    if (!dot) {
        return apr_pstrcat(p, "&gt; ", us_text(p, *prev_us), NULL);
    }
    *prev_us = apr_atoi64(le) * 1000000 + apr_atoi64(dot + 1);
    return apr_pstrcat(p, "&le; ", us_text(p, *prev_us), NULL);
}

/* The latency histogram of one Redis configuration as a bar table: the
 * calls in each bucket (the difference of two cumulative figures), the
 * cumulative figure itself as Prometheus has it, and a bar. */
static void html_latency(request_rec *r, const metric_table *t,
                         const metric_labels *want)
{
    const metric_family *f = fam_find(t, "tbucket_redis_latency_seconds");
    uint64_t max = 0;
    int64_t prev_us = 0;
    int i, pass;

    ap_rputs("<h3>Redis latency (pool wait included)</h3><table><tr>"
             "<th>latency</th><th class=\"n\">calls</th>"
             "<th class=\"n\">cumulative</th><th></th></tr>", r);
    for (pass = 0; f && pass < 2; pass++) {
        uint64_t prev = 0;

        for (i = 0; i < f->samples->nelts; i++) {
            const metric_sample *s = &APR_ARRAY_IDX(f->samples, i,
                                                    metric_sample);
            const char *le = label_get(&s->labels, "le");
            uint64_t n;

            if (strcmp(s->suffix, "_bucket") || !le
                || !labels_include(&s->labels, want)) {
                continue;
            }
            n = s->value >= prev ? s->value - prev : 0;
            prev = s->value;
            if (pass == 0) {
                max = n > max ? n : max;
                continue;
            }
            ap_rprintf(r, "<tr><td>%s</td><td class=\"n%s\">%"
                       APR_UINT64_T_FMT "</td>",
                       le_text(r->pool, le, &prev_us), n ? "" : " zero",
                       (apr_uint64_t)n);
            html_value(r, f, s, 1);
            html_bar(r, n, max);
            ap_rputs("</tr>", r);
        }
    }
    ap_rputs("</table>", r);
}

/* The mean of a histogram, in microseconds, or "-" with no calls. */
static const char *mean_text(request_rec *r, const metric_table *t,
                             const metric_labels *want)
{
    const metric_family *f = fam_find(t, "tbucket_redis_latency_seconds");
    const metric_sample *sum = sample_find(f, "_sum", want);
    const metric_sample *count = sample_find(f, "_count", want);

    if (!sum || !count || !count->value) {
        return "&ndash;";
    }
    return us_text(r->pool, (int64_t)(sum->value / count->value));
}

/* Everything about one Redis configuration (redacted URL and policy). */
static void html_client(request_rec *r, const metric_table *t,
                        const metric_labels *cl)
{
    ap_rprintf(r, "<h2>Redis <code>%s</code> &middot; policy %s</h2>"
               "<div class=\"card\"><div class=\"grid\"><div>"
               "<h3>Breaker and pool (answering process)</h3>"
               "<table class=\"kv\">",
               h(r, label_get(cl, "redis")), h(r, label_get(cl, "policy")));
    html_breaker(r, t, cl);
    html_fig(r, t, "breaker opened", "tbucket_breaker_opens_total", "", cl);
    html_fig(r, t, "breaker closed", "tbucket_breaker_closes_total", "",
             cl);
    html_fig(r, t, "decided without Redis (open)",
             "tbucket_breaker_skips_total", "", cl);
    html_fig(r, t, "pool size", "tbucket_pool_size", "", cl);
    html_fig(r, t, "connections open", "tbucket_pool_connections_open", "",
             cl);
    html_fig(r, t, "connections in use", "tbucket_pool_connections_in_use",
             "", cl);
    ap_rputs("</table></div><div><h3>Calls (all children)</h3>"
             "<table class=\"kv\">", r);
    html_fig(r, t, "script calls", "tbucket_redis_calls_total", "", cl);
    html_fig(r, t, "failed calls", "tbucket_redis_failures_total", "", cl);
    html_fig(r, t, "connections opened", "tbucket_redis_connects_total", "",
             cl);
    html_fig(r, t, "NOSCRIPT reloads",
             "tbucket_redis_noscript_reloads_total", "", cl);
    html_fig(r, t, "latency, total seconds",
             "tbucket_redis_latency_seconds", "_sum", cl);
    ap_rprintf(r, "<tr><th>latency, mean</th><td class=\"n\">%s</td></tr>"
               "</table></div></div><div class=\"grid\"><div>"
               "<h3>Errors by kind</h3>", mean_text(r, t, cl));
    html_by_label(r, fam_find(t, "tbucket_redis_errors_total"), cl, "kind",
                  0);
    ap_rputs("</div><div><h3>Fallback decisions (Redis could not "
             "decide)</h3>", r);
    html_by_label(r, fam_find(t, "tbucket_fallback_decisions_total"), cl,
                  "fallback", 0);
    ap_rputs("</div></div>", r);
    html_latency(r, t, cl);
    ap_rputs("</div>", r);
}

/* One card per Redis configuration, found through the family that has
 * a sample for each of them. */
static void html_clients(request_rec *r, const metric_table *t)
{
    const metric_family *f = fam_find(t, "tbucket_redis_calls_total");
    int i;

    for (i = 0; f && i < f->samples->nelts; i++) {
        html_client(r, t, &APR_ARRAY_IDX(f->samples, i,
                                         metric_sample).labels);
    }
    if (!f || !f->samples->nelts) {
        ap_rputs("<h2>Redis</h2><p class=\"meta\">No Redis configuration "
                 "yet.</p>", r);
    }
}

/* Every sample, as the text view lists them, folded away by default. */
static void html_all(request_rec *r, const metric_table *t)
{
    int i, j;

    ap_rputs("<details><summary>Every figure, as in the Prometheus "
             "text</summary><table><tr><th>metric</th><th>labels</th>"
             "<th class=\"n\">value</th></tr>", r);
    for (i = 0; i < t->families->nelts; i++) {
        const metric_family *f = APR_ARRAY_IDX(t->families, i,
                                               metric_family *);

        ap_rprintf(r, "<tr><th colspan=\"3\"><code>%s</code> (%s): %s"
                   "</th></tr>", h(r, f->name), h(r, f->type),
                   h(r, f->help));
        for (j = 0; j < f->samples->nelts; j++) {
            const metric_sample *s = &APR_ARRAY_IDX(f->samples, j,
                                                    metric_sample);

            ap_rprintf(r, "<tr><td><code>%s%s</code></td>"
                       "<td><code>%s</code></td>", h(r, f->name), s->suffix,
                       h(r, prom_labels(r->pool, &s->labels)));
            html_value(r, f, s, 1);
            ap_rputs("</tr>", r);
        }
    }
    ap_rputs("</table></details>", r);
}

static void render_html(request_rec *r, const metric_table *t)
{
    const metric_family *gen = fam_find(t, "tbucket_config_generation");
    metric_labels none;

    memset(&none, 0, sizeof(none));
    ap_rprintf(r, "<!DOCTYPE html>\n<html lang=\"en\"><head>"
               "<meta charset=\"utf-8\">"
               "<meta name=\"viewport\" content=\"width=device-width\">"
               "<title>mod_tbucket status</title><style>%s</style></head>"
               "<body><main><h1>mod_tbucket status</h1>"
               "<p class=\"meta\">%s &middot; answered by process %"
               APR_PID_T_FMT " &middot; %s &middot; configuration "
               "generation ", html_css, h(r, r->server->server_hostname
                                             ? r->server->server_hostname
                                             : "-"),
               getpid(), ap_ht_time(r->pool, r->request_time,
                                    "%Y-%m-%d %H:%M:%S UTC", 1));
    html_value(r, gen, sample_find(gen, "", &none), 0);
    ap_rprintf(r, "</p><p class=\"meta\">Counters cover every child; "
               "breaker state and pool figures are those of the process "
               "that answered. Prometheus text: <a href=\"%s\">%s</a></p>"
               "<h2>Decisions by outcome</h2>",
               h(r, ap_escape_uri(r->pool, r->uri)),
               h(r, ap_escape_uri(r->pool, r->uri)));
    html_by_label(r, fam_find(t, "tbucket_decisions_total"), &none,
                  "outcome", 1);
    html_vhosts(r, t);
    html_clients(r, t);
    ap_rputs("<h2>Local fallback table</h2><table class=\"kv\">", r);
    html_fig(r, t, "buckets held", "tbucket_local_entries_used", "", &none);
    html_fig(r, t, "buckets at most", "tbucket_local_entries_max", "",
             &none);
    ap_rputs("</table>", r);
    ap_rputs("<h2>Token leases</h2><div class=\"grid\"><div>"
             "<h3>requests from a lease</h3>", r);
    html_by_label(r, fam_find(t, "tbucket_lease_hits_total"), &none,
                  "vhost", 0);
    ap_rputs("</div><div><h3>leases taken</h3>", r);
    html_by_label(r, fam_find(t, "tbucket_lease_refills_total"), &none,
                  "vhost", 0);
    ap_rputs("</div><div><h3>tokens granted</h3>", r);
    html_by_label(r, fam_find(t, "tbucket_lease_tokens_granted_total"),
                  &none, "vhost", 0);
    ap_rputs("</div></div><table class=\"kv\">", r);
    html_fig(r, t, "leases held", "tbucket_lease_entries_used", "", &none);
    ap_rputs("</table>", r);
    html_all(r, t);
    ap_rputs("<footer>mod_tbucket &middot; no script, no external "
             "resource; reload to refresh.</footer></main></body></html>\n",
             r);
}

/* ---- The handler ---------------------------------------------------- */

/* The view the query string asks for: 1 HTML, 0 text (no view, or
 * view=text or view=prometheus), -1 anything else. */
static int wants_html(request_rec *r)
{
    char *args, *tok, *last;
    int html = 0;

    if (!r->args) {
        return 0;
    }
    args = apr_pstrdup(r->pool, r->args);
    for (tok = apr_strtok(args, "&", &last); tok;
         tok = apr_strtok(NULL, "&", &last)) {
        if (strncmp(tok, "view=", 5)) {
            continue;
        }
        if (!strcmp(tok + 5, "html")) {
            html = 1;
        }
        else if (!strcmp(tok + 5, "text") || !strcmp(tok + 5, "prometheus")) {
            html = 0;
        }
        else {
            return -1;
        }
    }
    return html;
}

/* The tbucket-status handler (SetHandler tbucket-status). GET and HEAD
 * only; protect it with Require like server-status. Prometheus text by
 * default, HTML with ?view=html; both from one metric_table. */
int tbucket_status_handler(request_rec *r)
{
    const tbucket_shm *seg = tbucket_shm_seg;
    int html;

    if (!r->handler || strcmp(r->handler, "tbucket-status")) {
        return DECLINED;
    }
    r->allowed |= (AP_METHOD_BIT << M_GET);
    if (r->method_number != M_GET) {
        return HTTP_METHOD_NOT_ALLOWED;
    }
    html = wants_html(r);
    if (html < 0) {
        return HTTP_BAD_REQUEST;
    }
    if (!seg) {
        return HTTP_SERVICE_UNAVAILABLE;
    }
    apr_table_setn(r->headers_out, "Cache-Control", "no-store");
    apr_table_setn(r->headers_out, "X-Content-Type-Options", "nosniff");
    if (html) {
        ap_set_content_type(r, "text/html; charset=utf-8");
        /* Inline CSS only: the page needs nothing else, so say so. */
        apr_table_setn(r->headers_out, "Content-Security-Policy",
                       "default-src 'none'; style-src 'unsafe-inline'; "
                       "frame-ancestors 'none'");
    }
    else {
        ap_set_content_type(r, "text/plain; version=0.0.4; charset=utf-8");
    }
    if (r->header_only) {
        return OK;
    }
    if (html) {
        render_html(r, collect(r->pool, seg));
    }
    else {
        render_text(r, collect(r->pool, seg));
    }
    return OK;
}
