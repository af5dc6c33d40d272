/* tbucket_status.c -- the tbucket-status handler and its Prometheus text.
 *
 * The `tbucket-status` handler renders mod_tbucket's figures in the
 * Prometheus text exposition format (version 0.0.4), with `?view=html`
 * as a page for a browser (tbucket_status_html.c), or with `?view=json`
 * (or `?json`) as JSON for programs (tbucket top reads it). Every view is
 * printed from one table of metrics built per request (collect, here,
 * from a read-only view of the shared memory segment that tbucket_shm.c
 * owns; the top keys and rules by tbucket_status_top.c), so their
 * figures cannot drift apart; the HTML view adds layout and nothing
 * else. Counters are server-wide; the breaker state and the pool
 * figures are those of the process that answers, since each child has
 * its own breaker and connections. Nothing here prints a Redis password:
 * URLs are redacted by tb_url_redact before they are stored.
 */
#include "apr_hash.h"
#include "apr_strings.h"

#include "httpd.h"
#include "http_config.h"
#include "http_main.h"
#include "http_protocol.h"

#include "mod_tbucket.h"
#include "tbucket_status.h"

/* ---- The table of metrics ------------------------------------------ */

/* A counter kept once per virtual host (in tbucket_vhost_stats) or once
 * per Redis configuration (in tb_stats_t): its family, and the offset of
 * the counter in that struct. */
typedef struct counter_def {
    const char *name;
    const char *help;
    apr_size_t field;
} counter_def;

/* The counter at offset field of the struct at base. */
static uint64_t counter_at(const void *base, apr_size_t field)
{
    return tb_stats_get((const uint64_t *)((const char *)base + field));
}

/* The n counters of d, a family each, a sample per virtual host. */
static void collect_vhost_counters(tbucket_metrics *t,
                                   const tbucket_shm_view *seg,
                                   const counter_def *d, int n)
{
    tbucket_family *f;
    tbucket_labels l;
    uint32_t i;
    int k;

    for (k = 0; k < n; k++) {
        f = tbucket_family_add(t, d[k].name, "counter", d[k].help);
        for (i = 0; i < seg->nvhosts; i++) {
            l = tbucket_labels_with(NULL, "vhost", seg->vhosts[i].name);
            tbucket_sample_add(f, "", &l,
                               counter_at(&seg->vhosts[i], d[k].field));
        }
    }
}

#define VHOST_FIELD(m) APR_OFFSETOF(tbucket_vhost_stats, m)

/* A counter family made of one array of tbucket_vhost_stats. */
typedef struct vhost_array {
    const char *name;
    const char *help;
    const char *label;                /* The label naming an element.   */
    const char *const *names;         /* Its values, in element order.  */
    int n;
    apr_size_t field;                 /* The array's offset.            */
} vhost_array;

/* The n families of a, a sample per virtual host and element, labelled
 * label=names[element]. */
static void collect_vhost_arrays(tbucket_metrics *t,
                                 const tbucket_shm_view *seg,
                                 const vhost_array *a, int n)
{
    tbucket_family *f;
    tbucket_labels l, vh;
    uint32_t i;
    int j, k;

    for (j = 0; j < n; j++) {
        f = tbucket_family_add(t, a[j].name, "counter", a[j].help);
        for (i = 0; i < seg->nvhosts; i++) {
            const uint64_t *c = (const uint64_t *)
                ((const char *)&seg->vhosts[i] + a[j].field);

            vh = tbucket_labels_with(NULL, "vhost", seg->vhosts[i].name);
            for (k = 0; k < a[j].n; k++) {
                l = tbucket_labels_with(&vh, a[j].label, a[j].names[k]);
                tbucket_sample_add(f, "", &l, tb_stats_get(&c[k]));
            }
        }
    }
}

/* Refusals by the kind of limit, and concurrency slots by what became
 * of them, per virtual host; the slots held now are those taken and not
 * yet given back. */
static void collect_limits(tbucket_metrics *t, const tbucket_shm_view *seg)
{
    static const vhost_array arrays[2] = {
        { "tbucket_refusals_total",
          "Requests refused (or, in shadow mode, that would have been) "
          "by a limit, by the kind of limit that refused; the closed "
          "policy's refusals are not counted here.", "limit",
          tbucket_limit_names, TBUCKET_LIMIT_KINDS, VHOST_FIELD(refused) },
        { "tbucket_concurrency_slots_total",
          "Concurrency slots (TBucketConcurrency): taken, refused, "
          "released when the request ended, and releases Redis did not "
          "get (those slots expire by their ttl).", "event",
          tbucket_slot_event_names, TBUCKET_SLOT_EVENTS,
          VHOST_FIELD(slot_event) }
    };
    tbucket_family *f;
    tbucket_labels l;
    uint32_t i;

    collect_vhost_arrays(t, seg, arrays, 2);
    f = tbucket_family_add(t, "tbucket_concurrency_in_flight", "gauge",
                           "Concurrency slots this server holds now: "
                           "requests in flight that took one.");
    for (i = 0; i < seg->nvhosts; i++) {
        const uint64_t *ev = seg->vhosts[i].slot_event;
        uint64_t taken = tb_stats_get(&ev[TBUCKET_SLOT_TAKEN]);
        uint64_t back = tb_stats_get(&ev[TBUCKET_SLOT_RELEASED]);

        l = tbucket_labels_with(NULL, "vhost", seg->vhosts[i].name);
        tbucket_sample_add(f, "", &l, taken > back ? taken - back : 0);
    }
}

static void collect_decisions(tbucket_metrics *t, const tbucket_shm_view *seg)
{
    static const counter_def cost_exceeded = {
        "tbucket_cost_exceeded_total",
        "Requests refused because their cost exceeds a bucket's capacity.",
        VHOST_FIELD(cost_exceeded)
    };
    static const counter_def counters[] = {
        { "tbucket_lease_hits_total",
          "Requests allowed from a token lease, without asking Redis "
          "(TBucketLease).", VHOST_FIELD(lease_hits) },
        { "tbucket_lease_refills_total",
          "Leases taken from Redis (one script call each).",
          VHOST_FIELD(lease_refills) },
        { "tbucket_lease_tokens_granted_total",
          "Tokens granted by those leases; unspent ones go back to Redis.",
          VHOST_FIELD(lease_tokens) },
        { "tbucket_cost_reports_total",
          "Real costs reported by responses (TBucketCostHeader).",
          VHOST_FIELD(cost_reports) },
        { "tbucket_cost_settled_total",
          "Reported costs settled on the buckets the request was charged "
          "to.", VHOST_FIELD(cost_settled) },
        { "tbucket_cost_unsettled_total",
          "Reported costs that differed from the charge but were not "
          "settled (refused, failure policy, window algorithm, Redis "
          "error).", VHOST_FIELD(cost_unsettled) },
        { "tbucket_cost_invalid_total",
          "Reported costs ignored: not a number from 0 to 1e9.",
          VHOST_FIELD(cost_invalid) },
        { "tbucket_cost_tokens_debited_total",
          "Tokens settlements took beyond the charge.",
          VHOST_FIELD(cost_debited) },
        { "tbucket_cost_tokens_refunded_total",
          "Tokens settlements gave back.", VHOST_FIELD(cost_refunded) }
    };
    uint64_t total[TBUCKET_OUTCOMES] = { 0 };
    tbucket_family *f;
    tbucket_labels l;
    uint32_t i;
    int o;

    for (i = 0; i < seg->nvhosts; i++) {
        for (o = 0; o < TBUCKET_OUTCOMES; o++) {
            total[o] += tb_stats_get(&seg->vhosts[i].outcome[o]);
        }
    }
    f = tbucket_family_add(t, "tbucket_decisions_total", "counter",
                           "Requests limited by mod_tbucket, by outcome "
                           "(all children).");
    for (o = 0; o < TBUCKET_OUTCOMES; o++) {
        l = tbucket_labels_with(NULL, "outcome", tbucket_outcome_names[o]);
        tbucket_sample_add(f, "", &l, total[o]);
    }
    {
        static const vhost_array outcomes = {
            "tbucket_vhost_decisions_total",
            "Requests limited by mod_tbucket, by virtual host and "
            "outcome.", "outcome", tbucket_outcome_names,
            TBUCKET_OUTCOMES, VHOST_FIELD(outcome)
        };

        collect_vhost_arrays(t, seg, &outcomes, 1);
    }
    collect_vhost_counters(t, seg, &cost_exceeded, 1);
    collect_limits(t, seg);
    collect_vhost_counters(t, seg, counters,
                           (int)(sizeof(counters) / sizeof(counters[0])));
}

/* The n counters of d (offsets in tb_stats_t), a family each, a sample
 * for every Redis configuration, labelled cl[i]. */
static void collect_stats(tbucket_metrics *t, const tbucket_shm_view *seg,
                          const tbucket_labels *cl, const counter_def *d,
                          int n)
{
    tbucket_family *f;
    uint32_t i;
    int k;

    for (k = 0; k < n; k++) {
        f = tbucket_family_add(t, d[k].name, "counter", d[k].help);
        for (i = 0; i < seg->nclients; i++) {
            tbucket_sample_add(f, "", &cl[i],
                               counter_at(&seg->clients[i].stats,
                                          d[k].field));
        }
    }
}

/* The histogram's buckets are cumulative, as Prometheus wants; the sum
 * is kept in microseconds and shown in seconds. */
static void collect_latency(tbucket_metrics *t, const tbucket_shm_view *seg,
                            const tbucket_labels *cl)
{
    tbucket_family *f = tbucket_family_add(t,
        "tbucket_redis_latency_seconds", "histogram",
        "Time of one script call to Redis, pool wait included.");
    uint32_t i;
    int b;

    for (i = 0; i < seg->nclients; i++) {
        const tb_stats_t *st = &seg->clients[i].stats;
        uint64_t cum = 0;
        tbucket_labels l;

        for (b = 0; b < TB_LAT_BUCKETS; b++) {
            const char *le = b < TB_LAT_BUCKETS - 1
                ? apr_psprintf(t->p, "%d.%06d",
                               (int)(tb_lat_bounds_us[b] / 1000000),
                               (int)(tb_lat_bounds_us[b] % 1000000))
                : "+Inf";

            cum += tb_stats_get(&st->lat_count[b]);
            l = tbucket_labels_with(&cl[i], "le", le);
            tbucket_sample_add(f, "_bucket", &l, cum);
        }
        tbucket_sample_add(f, "_sum", &cl[i],
                           tb_stats_get(&st->lat_sum_us))->micro = 1;
        tbucket_sample_add(f, "_count", &cl[i], cum);
    }
}

static void collect_errors(tbucket_metrics *t, const tbucket_shm_view *seg,
                           const tbucket_labels *cl)
{
    static const char *const fb[3] = { "open", "closed", "local" };
    tbucket_family *f;
    tbucket_labels l;
    uint32_t i;
    int k;

    f = tbucket_family_add(t, "tbucket_redis_errors_total", "counter",
                           "Failed Redis calls, by kind.");
    for (i = 0; i < seg->nclients; i++) {
        for (k = 1; k < TB_ERR_KINDS; k++) {
            l = tbucket_labels_with(&cl[i], "kind", tb_err_name(k));
            tbucket_sample_add(f, "", &l,
                               tb_stats_get(&seg->clients[i].stats.errors[k]));
        }
    }
    f = tbucket_family_add(t, "tbucket_fallback_decisions_total", "counter",
                           "Decisions made by the failure policy because "
                           "Redis could not decide.");
    for (i = 0; i < seg->nclients; i++) {
        const tb_stats_t *st = &seg->clients[i].stats;
        const uint64_t *c[3];

        c[0] = &st->fallback_open;
        c[1] = &st->fallback_closed;
        c[2] = &st->fallback_local;
        for (k = 0; k < 3; k++) {
            l = tbucket_labels_with(&cl[i], "fallback", fb[k]);
            tbucket_sample_add(f, "", &l, tb_stats_get(c[k]));
        }
    }
}

/* When and with what kind of error each Redis configuration's breaker
 * last opened, in any child; the reason goes to t->failures only. */
static void collect_last_failure(tbucket_metrics *t,
                                 const tbucket_shm_view *seg,
                                 const tbucket_labels *cl)
{
    tbucket_family *f = tbucket_family_add(t,
        "tbucket_redis_last_failure_timestamp_seconds", "gauge",
        "Unix time at which a breaker last opened (any child), labelled "
        "with the error kind of the call that opened it; the HTML view "
        "also gives the reason.");
    tbucket_failure fl;
    uint32_t i;

    for (i = 0; i < seg->nclients; i++) {
        tbucket_failure_note *n;
        tbucket_labels l;

        if (!tbucket_shm_failure_get(&seg->clients[i], &fl)) {
            continue;
        }
        l = tbucket_labels_with(&cl[i], "kind", tb_err_name(fl.kind));
        tbucket_sample_add(f, "", &l, (uint64_t)fl.time)->micro = 1;
        n = apr_array_push(t->failures);
        n->labels = cl[i];
        n->kind = tb_err_name(fl.kind);
        n->time = fl.time;
        n->reason = apr_pstrdup(t->p, fl.reason);
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
static void collect_process(tbucket_metrics *t, const tbucket_shm_view *seg,
                            const tbucket_labels *cl)
{
    apr_array_header_t *list = process_clients(t->p);
    tbucket_family *f[5];
    int i, size, open, in_use, mixed;

    f[0] = tbucket_family_add(t, "tbucket_breaker_state", "gauge",
                   "Circuit breaker of the answering process: 0 closed, "
                   "1 open, 2 half-open.");
    f[1] = tbucket_family_add(t, "tbucket_pool_size", "gauge",
                   "Most Redis connections per process (answering "
                   "process).");
    f[2] = tbucket_family_add(t, "tbucket_pool_connections_open", "gauge",
                   "Redis connections open in the answering process.");
    f[3] = tbucket_family_add(t, "tbucket_pool_connections_in_use", "gauge",
                   "Redis connections borrowed right now in the answering "
                   "process.");
    f[4] = tbucket_family_add(t, "tbucket_redis_engine", "gauge",
                   "How the answering process's connections ask Redis: "
                   "engine=\"module\" (tbucket_redis.so) or \"script\" "
                   "(EVALSHA), \"unknown\" before a connection says, "
                   "\"mixed\" for a cluster whose nodes differ, "
                   "\"failing\" while its last call failed or its "
                   "breaker is open; always 1.");
    for (i = 0; i < list->nelts; i++) {
        tbucket_client *c = APR_ARRAY_IDX(list, i, tbucket_client *);
        const tbucket_labels *l = &cl[c->slot - seg->clients];

        tb_client_pool_usage(c->tb, &size, &open, &in_use);
        tbucket_sample_add(f[0], "", l,
                           (uint64_t)tb_client_breaker_state(c->tb));
        tbucket_sample_add(f[1], "", l, (uint64_t)size);
        tbucket_sample_add(f[2], "", l, (uint64_t)open);
        tbucket_sample_add(f[3], "", l, (uint64_t)in_use);
        {
            tb_engine_t e = tb_client_engine(c->tb, &mixed);
            tbucket_labels el = tbucket_labels_with(
                l, "engine", tb_client_failing(c->tb) ? "failing"
                             : mixed ? "mixed"
                             : e == TB_ENGINE_AUTO ? "unknown"
                                                   : tb_engine_names[e]);

            tbucket_sample_add(f[4], "", &el, 1);
        }
    }
}

/* Where each Redis configuration is configured: the servers that use
 * it, so that two entries for one Redis say why they are two. */
static void collect_info(tbucket_metrics *t, const tbucket_shm_view *seg,
                         const tbucket_labels *cl)
{
    tbucket_family *f = tbucket_family_add(t, "tbucket_redis_info", "gauge",
                   "One per Redis configuration (URL and failure policy; "
                   "every server with the same ones shares it): servers "
                   "names where it is configured (main server, virtual "
                   "hosts); always 1.");
    uint32_t i;

    for (i = 0; i < seg->nclients; i++) {
        tbucket_labels l = tbucket_labels_with(&cl[i], "servers",
                                               seg->clients[i].servers);

        tbucket_sample_add(f, "", &l, 1);
    }
}

#define STATS_FIELD(m) APR_OFFSETOF(tb_stats_t, m)

static void collect_clients(tbucket_metrics *t, const tbucket_shm_view *seg)
{
    static const counter_def calls[] = {
        { "tbucket_redis_calls_total", "Script calls sent to Redis.",
          STATS_FIELD(redis_calls) },
        { "tbucket_redis_module_calls_total",
          "Of the calls, those made to the Redis module (tbucket.*) "
          "instead of a script.", STATS_FIELD(module_calls) },
        { "tbucket_redis_batches_total",
          "Writes to Redis: each carries one batch of script calls "
          "(calls / batches is the mean batch size).",
          STATS_FIELD(batches) },
        { "tbucket_redis_failures_total", "Failed Redis calls, all kinds.",
          STATS_FIELD(redis_errors) }
    };
    static const counter_def connections[] = {
        { "tbucket_redis_connects_total", "Redis connections opened.",
          STATS_FIELD(connects) },
        { "tbucket_redis_noscript_reloads_total",
          "NOSCRIPT answers retried with EVAL.",
          STATS_FIELD(noscript_reloads) },
        { "tbucket_breaker_opens_total",
          "Breaker transitions from closed to open.",
          STATS_FIELD(breaker_opens) },
        { "tbucket_breaker_closes_total",
          "Breaker transitions back to closed.",
          STATS_FIELD(breaker_closes) },
        { "tbucket_breaker_skips_total",
          "Decisions made without asking Redis (breaker open).",
          STATS_FIELD(breaker_skips) }
    };
    tbucket_labels *cl = apr_pcalloc(t->p,
                                     (seg->nclients + 1) * sizeof(*cl));
    uint32_t i;

    for (i = 0; i < seg->nclients; i++) {
        cl[i] = tbucket_labels_with(NULL, "redis", seg->clients[i].redis);
        cl[i] = tbucket_labels_with(&cl[i], "policy", seg->clients[i].policy);
    }
    collect_info(t, seg, cl);
    collect_stats(t, seg, cl, calls, (int)(sizeof(calls) / sizeof(calls[0])));
    collect_errors(t, seg, cl);
    collect_last_failure(t, seg, cl);
    collect_latency(t, seg, cl);
    collect_stats(t, seg, cl, connections,
                  (int)(sizeof(connections) / sizeof(connections[0])));
    collect_process(t, seg, cl);
}

/* TBucketShed's thresholds of every server that sets them. */
static void collect_thresholds(tbucket_metrics *t,
                               const tbucket_shm_view *seg)
{
    tbucket_family *f = tbucket_family_add(t,
        "tbucket_shed_threshold_percent", "gauge", "TBucketShed: the busy "
        "share, in percent, at which a priority is shed (levels never shed "
        "are not listed).");
    tbucket_labels l, vh;
    server_rec *s;
    int k;

    for (s = ap_server_conf; s; s = s->next) {
        tbucket_srv_conf *sc = ap_get_module_config(s->module_config,
                                                    &tbucket_module);

        if (sc->vhost_slot < 0 || (uint32_t)sc->vhost_slot >= seg->nvhosts
            || !sc->shed_min
            || (s != ap_server_conf && !(sc->set & TBUCKET_SET_SHED))) {
            continue;
        }
        vh = tbucket_labels_with(NULL, "vhost",
                                 seg->vhosts[sc->vhost_slot].name);
        for (k = 0; k < TBUCKET_PRIOS; k++) {
            if (sc->shed_pct[k]) {
                l = tbucket_labels_with(&vh, "priority",
                                        tbucket_priority_names[k]);
                tbucket_sample_add(f, "", &l, (uint64_t)sc->shed_pct[k]);
            }
        }
    }
}

/* TBucketCPUPriority: worker threads moved to each priority's nice step
 * (normal's is usually 0, and then never moved), and moves refused. */
static void collect_cpu(tbucket_metrics *t, const tbucket_shm_view *seg)
{
    tbucket_family *f = tbucket_family_add(
        t, "tbucket_cpu_priority_changes_total", "counter",
        "Worker threads given a request's CPU priority "
        "(TBucketCPUPriority), by the request's priority.");
    tbucket_labels l;
    int k;

    for (k = 0; k < TBUCKET_PRIOS; k++) {
        l = tbucket_labels_with(NULL, "priority", tbucket_priority_names[k]);
        tbucket_sample_add(f, "", &l, seg->cpu_set[k]);
    }
    tbucket_family_single(t, "tbucket_cpu_priority_failures_total",
                          "counter", "Priority changes the kernel "
                          "refused (the worker kept its priority).",
                          seg->cpu_failed);
}

/* Each auto scope's cap as it sets itself: its bounds, the latency it
 * sees (the floor without a queue and the last window's median) and how
 * often it moved. tbucket_local_limit is the cap itself. */
static void collect_auto(tbucket_metrics *t, const apr_array_header_t *views)
{
    tbucket_family *lat = tbucket_family_add(
        t, "tbucket_local_auto_latency_seconds", "gauge",
        "Latency an auto local scope's cap reads: floor, the lowest seen "
        "without a queue; window, the median of the last window.");
    tbucket_family *bounds = tbucket_family_add(
        t, "tbucket_local_auto_bounds", "gauge",
        "The min and max of an auto local scope's cap.");
    tbucket_family *moves = tbucket_family_add(
        t, "tbucket_local_auto_changes_total", "counter",
        "Changes of an auto local scope's cap: up, down, and probes (one "
        "window at min to measure the floor again).");
    tbucket_sample *x;
    tbucket_labels l, k;
    int i;

    for (i = 0; i < views->nelts; i++) {
        const tbucket_local_view *v = &APR_ARRAY_IDX(views, i,
                                                     tbucket_local_view);

        if (!v->adaptive) {
            continue;
        }
        l = tbucket_labels_with(NULL, "scope", v->name);
        k = tbucket_labels_with(&l, "kind", "floor");
        x = tbucket_sample_add(lat, "", &k, v->adapt.floor_us);
        x->micro = 1;
        k = tbucket_labels_with(&l, "kind", "window");
        x = tbucket_sample_add(lat, "", &k, v->adapt.last_us);
        x->micro = 1;
        k = tbucket_labels_with(&l, "bound", "min");
        tbucket_sample_add(bounds, "", &k, v->adapt.min);
        k = tbucket_labels_with(&l, "bound", "max");
        tbucket_sample_add(bounds, "", &k, v->adapt.max);
        k = tbucket_labels_with(&l, "direction", "up");
        tbucket_sample_add(moves, "", &k, v->adapt.ups);
        k = tbucket_labels_with(&l, "direction", "down");
        tbucket_sample_add(moves, "", &k, v->adapt.downs);
        k = tbucket_labels_with(&l, "direction", "probe");
        tbucket_sample_add(moves, "", &k, v->adapt.probes);
    }
}

/* Each local scope's places: in flight, its limit, taken and refused. */
static void collect_scopes(tbucket_metrics *t)
{
    static const char *const names[4] = {
        "tbucket_local_in_flight", "tbucket_local_limit",
        "tbucket_local_taken_total", "tbucket_local_refused_total"
    };
    static const char *const types[4] = {
        "gauge", "gauge", "counter", "counter"
    };
    static const char *const helps[4] = {
        "Requests of a local scope in flight now, all children.",
        "TBucketLocalConcurrency of a local scope: its N, or with auto "
        "the cap now.",
        "Places taken in a local scope.",
        "Requests a local scope refused: no place left."
    };
    apr_array_header_t *views = tbucket_shm_local_views(t->p);
    tbucket_family *fl[4];
    tbucket_labels l;
    int i, k;

    for (k = 0; k < 4; k++) {
        fl[k] = tbucket_family_add(t, names[k], types[k], helps[k]);
    }
    for (i = 0; i < views->nelts; i++) {
        const tbucket_local_view *v = &APR_ARRAY_IDX(views, i,
                                                     tbucket_local_view);

        l = tbucket_labels_with(NULL, "scope", v->name);
        tbucket_sample_add(fl[0], "", &l, v->in_flight);
        tbucket_sample_add(fl[1], "", &l, v->limit);
        tbucket_sample_add(fl[2], "", &l, v->taken);
        tbucket_sample_add(fl[3], "", &l, v->refused);
    }
    collect_auto(t, views);
}

/* Local protection: the busy share as shedding reads it, each server's
 * thresholds, what was shed or refused, and each local scope's places. */
static void collect_local(tbucket_metrics *t, const tbucket_shm_view *seg)
{
    static const vhost_array refusals[2] = {
        { "tbucket_shed_total",
          "Requests shed (503) because the server was busy, by their "
          "priority.", "priority", tbucket_priority_names, TBUCKET_PRIOS,
          VHOST_FIELD(shed) },
        { "tbucket_local_refusals_total",
          "Requests refused (503) because a local scope had no place "
          "left, by their priority.", "priority", tbucket_priority_names,
          TBUCKET_PRIOS, VHOST_FIELD(local_refused) }
    };
    uint32_t busy, workers;

    tbucket_local_busy(apr_time_now(), &busy, &workers);
    tbucket_family_single(t, "tbucket_workers_busy", "gauge",
                          "Workers busy with a request (scoreboard, at "
                          "most 1 ms old), less those answering a request "
                          "local protection refused: what TBucketShed "
                          "compares.", busy);
    tbucket_family_single(t, "tbucket_workers_max", "gauge",
                          "Workers the server runs at most "
                          "(MaxRequestWorkers).", workers);
    collect_thresholds(t, seg);
    collect_vhost_arrays(t, seg, refusals, 2);
    collect_scopes(t);
}

/* Every figure of the page, in the Prometheus output order, at now.
 * Allocates from p; reads the segment's counters with atomic loads only
 * (the top keys under their slots' locks, to copy them). */
static tbucket_metrics *collect(apr_pool_t *p, const tbucket_shm_view *seg,
                                apr_time_t now)
{
    tbucket_metrics *t = apr_pcalloc(p, sizeof(*t));
    const char **names = apr_palloc(p, (seg->nvhosts + 1) * sizeof(*names));
    uint32_t i;

    t->p = p;
    t->families = apr_array_make(p, 32, sizeof(tbucket_family *));
    t->failures = apr_array_make(p, 2, sizeof(tbucket_failure_note));
    for (i = 0; i < seg->nvhosts; i++) {
        names[i] = seg->vhosts[i].name;
    }
    t->vhost_names = names;
    t->nvhosts = seg->nvhosts;
    collect_decisions(t, seg);
    t->series = tbucket_series_read(p, now);
    tbucket_collect_top(t, now);
    collect_local(t, seg);
    collect_clients(t, seg);
    tbucket_family_single(t, "tbucket_local_entries_used", "gauge",
                          "Buckets held in the shared local-policy table.",
                          (uint64_t)tb_local_used(tbucket_local_table()));
    tbucket_family_single(t, "tbucket_local_entries_max", "gauge",
                          "Size of the shared local-policy table.",
                          (uint64_t)seg->local_entries);
    tbucket_family_single(t, "tbucket_lease_entries_used", "gauge",
                          "Leases held in the shared lease table "
                          "(TBucketLease).",
                          (uint64_t)tb_lease_used(tbucket_lease_table()));
    tbucket_family_single(t, "tbucket_lease_tokens_returned_total",
                          "counter", "Unspent lease tokens given back to "
                          "Redis: when a lease expired, and when the "
                          "server stopped or restarted.",
                          seg->lease_returned);
    collect_cpu(t, seg);
    tbucket_family_single(t, "tbucket_config_generation", "gauge",
                          "Configuration loads since the server started.",
                          seg->generation);
    return t;
}

/* ---- The Prometheus text view -------------------------------------- */

static void render_text(request_rec *r, const tbucket_metrics *t)
{
    int i, j;

    for (i = 0; i < t->families->nelts; i++) {
        const tbucket_family *f = APR_ARRAY_IDX(t->families, i,
                                                tbucket_family *);

        ap_rprintf(r, "# HELP %s %s\n# TYPE %s %s\n", f->name, f->help,
                   f->name, f->type);
        for (j = 0; j < f->samples->nelts; j++) {
            const tbucket_sample *s = &APR_ARRAY_IDX(f->samples, j,
                                                     tbucket_sample);

            ap_rprintf(r, "%s%s%s%s%s %s\n", f->name, s->suffix,
                       s->labels.n ? "{" : "",
                       tbucket_prom_labels(r->pool, &s->labels),
                       s->labels.n ? "}" : "", tbucket_sample_text(r->pool, s));
        }
    }
}

/* ---- The JSON view --------------------------------------------------- */

/* {"metrics":[{"name":..,"type":..,"help":..,"samples":[{"suffix":..,
 * "labels":{..},"value":N}]}],"top":{..}}: the same table as the text
 * view, for programs that would rather not parse Prometheus text, and
 * the top keys with all their fields (tbucket_top_json), which tbucket
 * top shows. Values are numbers: integers, or seconds with six
 * decimals. */
static void render_json(request_rec *r, const tbucket_metrics *t)
{
    int i, j, k;

    ap_rputs("{\"metrics\":[", r);
    for (i = 0; i < t->families->nelts; i++) {
        const tbucket_family *f = APR_ARRAY_IDX(t->families, i,
                                                tbucket_family *);

        ap_rprintf(r, "%s{\"name\":\"%s\",\"type\":\"%s\",\"help\":\"%s\","
                   "\"samples\":[", i ? "," : "", f->name, f->type,
                   tbucket_json_esc(r->pool, f->help));
        for (j = 0; j < f->samples->nelts; j++) {
            const tbucket_sample *s = &APR_ARRAY_IDX(f->samples, j,
                                                     tbucket_sample);

            ap_rprintf(r, "%s{\"suffix\":\"%s\",\"labels\":{", j ? "," : "",
                       s->suffix);
            for (k = 0; k < s->labels.n; k++) {
                ap_rprintf(r, "%s\"%s\":\"%s\"", k ? "," : "",
                           s->labels.name[k],
                           tbucket_json_esc(r->pool, s->labels.value[k]));
            }
            ap_rprintf(r, "},\"value\":%s}",
                       tbucket_sample_text(r->pool, s));
        }
        ap_rputs("]}", r);
    }
    ap_rputs("]", r);
    tbucket_top_json(r, t);
    tbucket_series_json(r, t);
    tbucket_bans_json(r, t);
    ap_rputs("}\n", r);
}

/* ---- The handler ---------------------------------------------------- */

#define VIEW_TEXT 0
#define VIEW_HTML 1
#define VIEW_JSON 2

/* The view the query string asks for: VIEW_HTML (view=html), VIEW_JSON
 * (view=json, or a bare "json"), VIEW_TEXT (none, view=text or
 * view=prometheus), -1 for any other view. */
static int wanted_view(request_rec *r)
{
    char *args, *tok, *last;
    int view = VIEW_TEXT;

    if (!r->args) {
        return VIEW_TEXT;
    }
    args = apr_pstrdup(r->pool, r->args);
    for (tok = apr_strtok(args, "&", &last); tok;
         tok = apr_strtok(NULL, "&", &last)) {
        if (!strcmp(tok, "json")) {
            view = VIEW_JSON;
            continue;
        }
        if (strncmp(tok, "view=", 5)) {
            continue;
        }
        if (!strcmp(tok + 5, "html")) {
            view = VIEW_HTML;
        }
        else if (!strcmp(tok + 5, "json")) {
            view = VIEW_JSON;
        }
        else if (!strcmp(tok + 5, "text") || !strcmp(tok + 5, "prometheus")) {
            view = VIEW_TEXT;
        }
        else {
            return -1;
        }
    }
    return view;
}

/* The tbucket-status handler (SetHandler tbucket-status). GET and HEAD
 * only; protect it with Require like server-status. Prometheus text by
 * default, HTML with ?view=html; both from one table of metrics. */
int tbucket_status_handler(request_rec *r)
{
    tbucket_metrics *t, bans;
    tbucket_shm_view seg;
    int view;

    if (!r->handler || strcmp(r->handler, "tbucket-status")) {
        return DECLINED;
    }
    r->allowed |= (AP_METHOD_BIT << M_GET);
    if (r->method_number != M_GET) {
        return HTTP_METHOD_NOT_ALLOWED;
    }
    view = wanted_view(r);
    if (view < 0) {
        return HTTP_BAD_REQUEST;
    }
    if (!tbucket_shm_view_get(&seg)) {
        return HTTP_SERVICE_UNAVAILABLE;
    }
    apr_table_setn(r->headers_out, "Cache-Control", "no-store");
    apr_table_setn(r->headers_out, "X-Content-Type-Options", "nosniff");
    if (view == VIEW_HTML) {
        ap_set_content_type(r, "text/html; charset=utf-8");
        /* Inline CSS only: the page needs nothing else, so say so. */
        apr_table_setn(r->headers_out, "Content-Security-Policy",
                       "default-src 'none'; style-src 'unsafe-inline'; "
                       "frame-ancestors 'none'");
    }
    else if (view == VIEW_JSON) {
        ap_set_content_type(r, "application/json");
    }
    else {
        ap_set_content_type(r, "text/plain; version=0.0.4; charset=utf-8");
    }
    if (r->header_only) {
        return OK;
    }
    if (view == VIEW_TEXT) {
        render_text(r, collect(r->pool, &seg, apr_time_now()));
        return OK;
    }
    /* A person or a program looking: worth a call to Redis for bans,
     * made first so that the pool figures read next include it. */
    memset(&bans, 0, sizeof(bans));
    bans.p = r->pool;
    tbucket_collect_bans(&bans);
    t = collect(r->pool, &seg, apr_time_now());
    t->bans = bans.bans;
    t->bans_note = bans.bans_note;
    t->bans_more = bans.bans_more;
    tbucket_bans_refused(t);
    if (view == VIEW_HTML) {
        tbucket_status_html(r, t);
    }
    else {
        render_json(r, t);
    }
    return OK;
}
