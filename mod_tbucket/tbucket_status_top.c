/* tbucket_status_top.c -- who is limited, on the status page: the top
 * keys, each scope's decisions and each named limit's events.
 *
 * The top keys are read once per page from the segment's heavy hitters
 * (tb_topk_t, tbucket_shm.c; the figures' promises are in shared/tb.h),
 * for two windows, the last minute and the last fifteen, each ranked by
 * refusals and by decisions. The rankings go into the table beside its
 * families (tbucket_metrics.top), since an entry carries more than a
 * sample can: the 1-minute refusals also become the family
 * tbucket_top_key_refusals, at most TBucketTopKeys series, so that
 * Prometheus sees the same figures the HTML shows. Each scope (a section
 * that sets TBucketLimit) gets its decisions by outcome, shadow-rejected
 * beside rejected, which is what an operator reads before enforcing a
 * shadow scope. Keys come from clients: every view escapes them (label
 * values here, JSON strings below, HTML in tbucket_status_html.c).
 */
#include "apr_strings.h"

#include <stdlib.h>
#include <sys/mman.h>

#include "httpd.h"
#include "http_config.h"
#include "http_main.h"
#include "http_protocol.h"

#include "mod_tbucket.h"
#include "tbucket_status.h"

static const int top_minutes[TBUCKET_TOP_WINDOWS] = { 1, 15 };

/* The K this configuration shows: its TBucketTopKeys, at most the K the
 * table was made with; 0 when off. */
static int shown_k(tb_topk_t *table)
{
    const tbucket_srv_conf *sc = ap_get_module_config(
        ap_server_conf->module_config, &tbucket_module);
    int k = sc->top_k;

    return k < tb_topk_k(table) ? k : tb_topk_k(table);
}

/* The scratch of one read, n bytes (tb_topk_scratch_size: 285 KB for
 * the last minute and 1.7 MB for the last fifteen at K = 20, 2.8 and
 * 16.9 MB at K = 200), mapped for the read alone; NULL on failure.
 * Neither the request's pool, which would keep it for the child's next
 * requests, nor malloc: once glibc has freed a mapped block it raises
 * its mmap threshold to that size, so every later scratch comes from the
 * arena of the thread that reads and stays there when freed. Under the
 * event MPM, with the page read every 10 s, that grew each child by
 * about 1 MB for every thread that had served the page (3.5 to 8 MB in
 * 12 minutes); unmapped, the pages go back to the system at once. */
static void *scratch_map(size_t n)
{
    void *p;

    if (n == 0) {
        return NULL;
    }
    p = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
             -1, 0);
    return p == MAP_FAILED ? NULL : p;
}

/* Read both windows into t->top; NULL when off or on a failed read. */
static tbucket_top *read_top(apr_pool_t *p, apr_time_t now)
{
    tb_topk_t *table = tbucket_top_table();
    int k = shown_k(table), i, rc;
    tbucket_top *top;

    if (k <= 0) {
        return NULL;
    }
    top = apr_pcalloc(p, sizeof(*top));
    top->k = k;
    top->counters = tb_topk_counters(table);
    top->bytes = tbucket_top_bytes();
    for (i = 0; i < TBUCKET_TOP_WINDOWS; i++) {
        tbucket_top_window *w = &top->w[i];
        tb_topk_query_t q;
        size_t n;

        memset(&q, 0, sizeof(q));
        q.minutes = w->minutes = top_minutes[i];
        q.now_ms = (int64_t)apr_time_as_msec(now);
        q.n = k;
        q.by_refusals = w->by_refusals =
            apr_palloc(p, k * sizeof(tb_topk_entry_t));
        q.by_decisions = w->by_decisions =
            apr_palloc(p, k * sizeof(tb_topk_entry_t));
        n = tb_topk_scratch_size(table, q.minutes);
        q.scratch = scratch_map(n);
        rc = q.scratch ? tb_topk_read(table, &q, &w->res) : TB_ERR;
        if (q.scratch) {
            munmap(q.scratch, n);
        }
        if (rc != TB_OK) {
            return NULL;
        }
    }
    return top;
}

/* The labels of an entry: its virtual host, limit and key. */
static tbucket_labels entry_labels(const tbucket_metrics *t,
                                   const tb_topk_entry_t *e)
{
    tbucket_labels l = tbucket_labels_with(NULL, "vhost",
                                           tbucket_vhost_of(t, e->vhost));

    l = tbucket_labels_with(&l, "limit", e->limit);
    return tbucket_labels_with(&l, "key", e->key);
}

static void collect_keys(tbucket_metrics *t, apr_time_t now)
{
    tbucket_family *f;
    const tbucket_top_window *w;
    int i;

    t->top = read_top(t->p, now);
    tbucket_family_single(t, "tbucket_top_keys_max", "gauge",
                          "TBucketTopKeys: keys ranked by refusals and by "
                          "decisions (0: off).",
                          t->top ? (uint64_t)t->top->k : 0);
    tbucket_family_single(t, "tbucket_top_keys_counters", "gauge",
                          "Counters of each top-keys sketch (8 per key "
                          "shown, at least 64): a key's count is over by "
                          "at most the decisions of its window divided by "
                          "this.", t->top ? (uint64_t)t->top->counters : 0);
    tbucket_family_single(t, "tbucket_top_keys_memory_bytes", "gauge",
                          "Shared memory of the top keys: 16 minutes of "
                          "sketches.",
                          t->top ? (uint64_t)t->top->bytes : 0);
    f = tbucket_family_add(t, "tbucket_top_key_refusals", "gauge",
                           "Refusals of a key in the last minute (this "
                           "minute and the one before), the keys with the "
                           "most: an estimate, never below the true "
                           "count.");
    if (!t->top) {
        return;
    }
    w = &t->top->w[0];
    for (i = 0; i < w->res.n_refusals; i++) {
        tbucket_labels l = entry_labels(t, &w->by_refusals[i]);

        tbucket_sample_add(f, "", &l, w->by_refusals[i].refusals);
    }
}

/* A family made of views (the scopes' or the named limits'), and the
 * deprecated name it is served under too, its row label then "rule". */
typedef struct view_family {
    const char *name;
    const char *help;
    const char *row;                  /* The label naming a view.       */
    const char *label;                /* The label naming a column.     */
    const char *const *names;         /* Its values, in column order.   */
    int n;
    int skip;                         /* A column left out, or -1.      */
    const char *old_name;
} view_family;

/* Each scope's decisions by outcome (local protection's sheds are not a
 * limit's doing and are left out), each named limit's events. */
static const view_family scope_decisions = {
    "tbucket_scope_decisions_total", "Decisions of each scope (a section "
    "that sets TBucketLimit, named by the sections around it) by "
    "outcome: shadow-rejected are the refusals a shadow scope would make "
    "if enforced.", "scope", "outcome", tbucket_outcome_names,
    TBUCKET_OUTCOMES, TBUCKET_OUT_SHED, "tbucket_rule_decisions_total"
};
static const view_family limit_events = {
    "tbucket_limit_events_total", "What happened to each named limit (by "
    "NAME): applied, refused, banned (refused under its ban), ban (bans "
    "set), charged (count= charges after the response), known, marked, "
    "spared (known clients).", "limit", "event", tbucket_limit_event_names,
    TBUCKET_LIMIT_EVENTS, -1, "tbucket_rule_events_total"
};

/* d's family from views: for each view, labelled row=its name, one
 * sample per name of d->names but d->skip, labelled label=name; then
 * its deprecated alias. */
static void collect_views(tbucket_metrics *t, const view_family *d,
                          const apr_array_header_t *views)
{
    tbucket_family *f = tbucket_family_add(t, d->name, "counter", d->help);
    int i, o;

    for (i = 0; i < views->nelts; i++) {
        const tbucket_count_view *v = &APR_ARRAY_IDX(views, i,
                                                    tbucket_count_view);
        tbucket_labels r = tbucket_labels_with(NULL, d->row, v->name), l;

        for (o = 0; o < d->n; o++) {
            if (o != d->skip) {
                l = tbucket_labels_with(&r, d->label, d->names[o]);
                tbucket_sample_add(f, "", &l, v->outcome[o]);
            }
        }
    }
    tbucket_family_alias(t, f, d->old_name, d->row, "rule");
}

void tbucket_collect_top(tbucket_metrics *t, apr_time_t now)
{
    collect_keys(t, now);
    collect_views(t, &scope_decisions, tbucket_shm_scope_views(t->p));
    collect_views(t, &limit_events, tbucket_shm_named_views(t->p));
}

/* ---- The JSON view's "top" ------------------------------------------- */

/* Milliseconds of the wall clock as Unix seconds with three decimals, or
 * null for none. */
static const char *json_time(apr_pool_t *p, int64_t ms)
{
    if (ms <= 0) {
        return "null";
    }
    return apr_psprintf(p, "%" APR_INT64_T_FMT ".%03d", ms / 1000,
                        (int)(ms % 1000));
}

static void json_entries(request_rec *r, const tbucket_metrics *t,
                         const char *name, const tb_topk_entry_t *e, int n)
{
    int i;

    ap_rprintf(r, ",\"%s\":[", name);
    for (i = 0; i < n; i++) {
        ap_rprintf(r, "%s{\"key\":\"%s\",\"vhost\":\"%s\",\"limit\":\"%s\","
                   "\"decisions\":%" APR_UINT64_T_FMT ",\"decisions_err\":%"
                   APR_UINT64_T_FMT ",\"refusals\":%" APR_UINT64_T_FMT
                   ",\"refusals_err\":%" APR_UINT64_T_FMT ",\"allowed\":%"
                   APR_UINT64_T_FMT ",\"refused\":%" APR_UINT64_T_FMT
                   ",\"last_refusal\":%s}", i ? "," : "",
                   tbucket_json_esc(r->pool, e[i].key),
                   tbucket_json_esc(r->pool, tbucket_vhost_of(t, e[i].vhost)),
                   tbucket_json_esc(r->pool, e[i].limit),
                   (apr_uint64_t)e[i].decisions,
                   (apr_uint64_t)e[i].decisions_err,
                   (apr_uint64_t)e[i].refusals,
                   (apr_uint64_t)e[i].refusals_err,
                   (apr_uint64_t)e[i].allowed, (apr_uint64_t)e[i].refused,
                   json_time(r->pool, e[i].last_refusal_ms));
    }
    ap_rputs("]", r);
}

void tbucket_top_json(request_rec *r, const tbucket_metrics *t)
{
    const tbucket_top *top = t->top;
    int i;

    if (!top) {
        ap_rputs(",\"top\":null", r);
        return;
    }
    ap_rprintf(r, ",\"top\":{\"k\":%d,\"counters\":%d,\"memory_bytes\":%"
               APR_SIZE_T_FMT ",\"windows\":[", top->k, top->counters,
               top->bytes);
    for (i = 0; i < TBUCKET_TOP_WINDOWS; i++) {
        const tbucket_top_window *w = &top->w[i];

        ap_rprintf(r, "%s{\"minutes\":%d,\"decisions\":%" APR_UINT64_T_FMT
                   ",\"refusals\":%" APR_UINT64_T_FMT ",\"decisions_bound\":%"
                   APR_UINT64_T_FMT ",\"refusals_bound\":%" APR_UINT64_T_FMT,
                   i ? "," : "", w->minutes,
                   (apr_uint64_t)w->res.decisions,
                   (apr_uint64_t)w->res.refusals,
                   (apr_uint64_t)w->res.decisions_bound,
                   (apr_uint64_t)w->res.refusals_bound);
        json_entries(r, t, "by_refusals", w->by_refusals, w->res.n_refusals);
        json_entries(r, t, "by_decisions", w->by_decisions,
                     w->res.n_decisions);
        ap_rputs("}", r);
    }
    ap_rputs("]}", r);
}
