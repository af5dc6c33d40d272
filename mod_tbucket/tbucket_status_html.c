/* tbucket_status_html.c -- the HTML view of the status page.
 *
 * A page for a person at a browser (`?view=html`): the table of metrics
 * that tbucket_status.c builds, laid out by topic. Self-contained (inline
 * CSS, no script, no external resource; the Content-Security-Policy
 * header that tbucket_status.c sends says so to the browser too). Every
 * figure that comes from the table is printed in an element carrying
 * data-metric and data-labels (the sample's name and its Prometheus
 * labels), so a test can match each one to a line of the text view.
 * Everything that comes from configuration or from clients (the keys
 * of the top-keys tables) goes through ap_escape_html, and attributes
 * are always double-quoted. This file reads no counter itself: every
 * figure comes from the table, the top keys from its rankings.
 */
#include "apr_strings.h"

#include <unistd.h>

#include "httpd.h"
#include "http_protocol.h"

#include "mod_tbucket.h"
#include "tbucket_status.h"

static const char html_css[] =
    "body{font:14px/1.45 system-ui,-apple-system,\"Segoe UI\",Roboto,"
    "sans-serif;color:#1f2328;background:#f6f8fa;margin:0;padding:20px}"
    "main{max-width:1180px;margin:0 auto}"
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
    "table.topkeys td.k{max-width:300px}"
    /* A site's name on one line; a wide table scrolls inside the page. */
    "td.site code{white-space:nowrap;word-break:normal}"
    ".wide{overflow-x:auto}"
    ".fail{margin:2px 0 4px}.fail code.reason{color:#cf222e}"
    "details{margin-top:22px}summary{cursor:pointer;font-weight:600}"
    "footer{margin-top:18px;color:#57606a;font-size:12px}";

const tbucket_family *tbucket_html_family(const tbucket_metrics *t,
                                          const char *name)
{
    int i;

    for (i = 0; i < t->families->nelts; i++) {
        const tbucket_family *f = APR_ARRAY_IDX(t->families, i,
                                                tbucket_family *);

        if (!strcmp(f->name, name)) {
            return f;
        }
    }
    return NULL;
}

const char *tbucket_html_label(const tbucket_labels *l, const char *name)
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
static int labels_include(const tbucket_labels *have,
                          const tbucket_labels *want)
{
    int k;

    for (k = 0; k < want->n; k++) {
        const char *v = tbucket_html_label(have, want->name[k]);

        if (!v || strcmp(v, want->value[k])) {
            return 0;
        }
    }
    return 1;
}

/* The first sample of f with this suffix that carries every label of
 * want (and perhaps more), or NULL. Linear: the HTML view asks a few
 * questions per Redis configuration or vhost, of small families. */
const tbucket_sample *tbucket_html_sample(const tbucket_family *f,
                                          const char *suffix,
                                          const tbucket_labels *want)
{
    int i;

    for (i = 0; f && i < f->samples->nelts; i++) {
        const tbucket_sample *s = &APR_ARRAY_IDX(f->samples, i,
                                                 tbucket_sample);

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
void tbucket_html_value(request_rec *r, const tbucket_family *f,
                        const tbucket_sample *s, int cell)
{
    const char *tag = cell ? "td" : "span";

    if (!f || !s) {
        ap_rprintf(r, "<%s class=\"n zero\">&ndash;</%s>", tag, tag);
        return;
    }
    ap_rprintf(r, "<%s class=\"n%s\" data-metric=\"%s%s\" "
               "data-labels=\"%s\">%s</%s>", tag, s->value ? "" : " zero",
               f->name, s->suffix,
               h(r, tbucket_prom_labels(r->pool, &s->labels)),
               tbucket_sample_text(r->pool, s), tag);
}

/* A bar cell, n out of max, as a percentage width. */
void tbucket_html_bar(request_rec *r, uint64_t n, uint64_t max)
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
static void html_by_label(request_rec *r, const tbucket_family *f,
                          const tbucket_labels *want, const char *label,
                          int bars)
{
    uint64_t max = 0;
    int i, pass;

    ap_rprintf(r, "<table><tr><th>%s</th><th class=\"n\">count</th>%s"
               "</tr>", h(r, label), bars ? "<th></th>" : "");
    for (pass = 0; f && pass < 2; pass++) {
        for (i = 0; i < f->samples->nelts; i++) {
            const tbucket_sample *s = &APR_ARRAY_IDX(f->samples, i,
                                                     tbucket_sample);
            const char *v = tbucket_html_label(&s->labels, label);

            if (!v || !labels_include(&s->labels, want)) {
                continue;
            }
            if (pass == 0) {
                max = s->value > max ? s->value : max;
                continue;
            }
            ap_rprintf(r, "<tr><td>%s</td>", h(r, v));
            tbucket_html_value(r, f, s, 1);
            if (bars) {
                tbucket_html_bar(r, s->value, max);
            }
            ap_rputs("</tr>", r);
        }
    }
    ap_rputs("</table>", r);
}

/* Decisions by virtual host: one row per vhost, one column per outcome.
 * collect_decisions writes each vhost's outcomes together and in
 * tbucket_outcome_names order, which is the order of the columns. */
static void html_vhosts(request_rec *r, const tbucket_metrics *t)
{
    const tbucket_family *f = tbucket_html_family(t, "tbucket_vhost_decisions_total");
    const tbucket_family *ce = tbucket_html_family(t, "tbucket_cost_exceeded_total");
    const char *row = NULL;
    tbucket_labels want;
    int i, o;

    ap_rputs("<h2>Decisions by virtual host</h2><div class=\"wide\"><table><tr>"
             "<th>virtual host</th>", r);
    for (o = 0; o < TBUCKET_OUTCOMES; o++) {
        ap_rprintf(r, "<th class=\"n\">%s</th>",
                   h(r, tbucket_outcome_names[o]));
    }
    ap_rputs("<th class=\"n\">cost exceeded</th></tr>", r);
    for (i = 0; f && i <= f->samples->nelts; i++) {
        const tbucket_sample *s = i < f->samples->nelts
            ? &APR_ARRAY_IDX(f->samples, i, tbucket_sample) : NULL;
        const char *outcome = s ? tbucket_html_label(&s->labels, "outcome") : NULL;

        if (row && (!s || !strcmp(outcome, tbucket_outcome_names[0]))) {
            want = tbucket_labels_with(NULL, "vhost", row);
            tbucket_html_value(r, ce, tbucket_html_sample(ce, "", &want), 1);
            ap_rputs("</tr>", r);
            row = NULL;
        }
        if (!s) {
            break;
        }
        if (!row) {
            row = tbucket_html_label(&s->labels, "vhost");
            ap_rprintf(r, "<tr><td class=\"site\"><code>%s</code></td>",
                       h(r, row));
        }
        tbucket_html_value(r, f, s, 1);
    }
    ap_rputs("</table></div>", r);
}

/* A row of a figures table: a name and one sample of a family. */
static void html_fig(request_rec *r, const tbucket_metrics *t,
                     const char *title, const char *name,
                     const char *suffix, const tbucket_labels *want)
{
    const tbucket_family *f = tbucket_html_family(t, name);

    ap_rprintf(r, "<tr><th>%s</th>", h(r, title));
    tbucket_html_value(r, f, tbucket_html_sample(f, suffix, want), 1);
    ap_rputs("</tr>", r);
}

/* A row of html_fig(): its title, and the family and suffix of its
 * sample. */
typedef struct fig_def {
    const char *title;
    const char *name;
    const char *suffix;
} fig_def;

/* html_fig() for each of the n rows of d. */
static void html_figs(request_rec *r, const tbucket_metrics *t,
                      const fig_def *d, int n, const tbucket_labels *want)
{
    int i;

    for (i = 0; i < n; i++) {
        html_fig(r, t, d[i].title, d[i].name, d[i].suffix, want);
    }
}

/* The breaker of the answering process, as a coloured badge beside its
 * number. */
static void html_breaker(request_rec *r, const tbucket_metrics *t,
                         const tbucket_labels *want)
{
    const tbucket_family *f = tbucket_html_family(t, "tbucket_breaker_state");
    const tbucket_sample *s = tbucket_html_sample(f, "", want);

    ap_rputs("<tr><th>breaker state</th><td class=\"n\">", r);
    if (s && s->value <= TB_BREAKER_HALF_OPEN) {
        ap_rprintf(r, "<span class=\"badge s%u\">%s</span> ",
                   (unsigned)s->value,
                   tb_breaker_state_name((tb_breaker_state_t)s->value));
    }
    tbucket_html_value(r, f, s, 0);
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
static void html_latency(request_rec *r, const tbucket_metrics *t,
                         const tbucket_labels *want)
{
    const tbucket_family *f = tbucket_html_family(t, "tbucket_redis_latency_seconds");
    uint64_t max = 0;
    int64_t prev_us = 0;
    int i, pass;

    ap_rputs("<h3>Redis latency (pool wait included)</h3><table><tr>"
             "<th>latency</th><th class=\"n\">calls</th>"
             "<th class=\"n\">cumulative</th><th></th></tr>", r);
    for (pass = 0; f && pass < 2; pass++) {
        uint64_t prev = 0;

        for (i = 0; i < f->samples->nelts; i++) {
            const tbucket_sample *s = &APR_ARRAY_IDX(f->samples, i,
                                                     tbucket_sample);
            const char *le = tbucket_html_label(&s->labels, "le");
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
            tbucket_html_value(r, f, s, 1);
            tbucket_html_bar(r, n, max);
            ap_rputs("</tr>", r);
        }
    }
    ap_rputs("</table>", r);
}

/* The mean of a histogram, in microseconds, or "-" with no calls. */
static const char *mean_text(request_rec *r, const tbucket_metrics *t,
                             const tbucket_labels *want)
{
    const tbucket_family *f = tbucket_html_family(t, "tbucket_redis_latency_seconds");
    const tbucket_sample *sum = tbucket_html_sample(f, "_sum", want);
    const tbucket_sample *count = tbucket_html_sample(f, "_count", want);

    if (!sum || !count || !count->value) {
        return "&ndash;";
    }
    return us_text(r->pool, (int64_t)(sum->value / count->value));
}

/* Why the breaker of one Redis configuration last opened, in any child:
 * the time for people and as the figure the text view has (Unix
 * seconds), the error kind and the reason. The reason comes from Redis
 * or the network as much as from the core, so it is escaped like
 * everything else. */
static void html_last_failure(request_rec *r, const tbucket_metrics *t,
                              const tbucket_labels *cl)
{
    const tbucket_family *f =
        tbucket_html_family(t, "tbucket_redis_last_failure_timestamp_seconds");
    const tbucket_failure_note *n = NULL;
    tbucket_labels want;
    int i;

    for (i = 0; !n && i < t->failures->nelts; i++) {
        n = &APR_ARRAY_IDX(t->failures, i, tbucket_failure_note);
        n = labels_include(&n->labels, cl) ? n : NULL;
    }
    ap_rputs("<p class=\"fail\"><b>Last failure</b> (a breaker opened, "
             "any child): ", r);
    if (!n) {
        ap_rputs("<span class=\"zero\">none recorded</span></p>", r);
        return;
    }
    want = tbucket_labels_with(cl, "kind", n->kind);
    ap_rprintf(r, "%s &middot; kind <code class=\"kind\">%s</code> "
               "&middot; <code class=\"reason\">%s</code> &middot; Unix "
               "time ", ap_ht_time(r->pool, n->time,
                                   "%Y-%m-%d %H:%M:%S UTC", 1),
               h(r, n->kind), h(r, n->reason));
    tbucket_html_value(r, f, tbucket_html_sample(f, "", &want), 0);
    ap_rputs("</p>", r);
}

/* Everything about one Redis configuration (redacted URL and policy). */
/* The engine: what the calls of every child went to (the module, or
 * scripts), then the answering process's own connections, which say
 * "unknown" until this process has made a call. */
static void html_engine(request_rec *r, const tbucket_metrics *t,
                        const tbucket_labels *cl)
{
    const tbucket_family *f = tbucket_html_family(t, "tbucket_redis_engine");
    const tbucket_family *mc = tbucket_html_family(t,
        "tbucket_redis_module_calls_total");
    const tbucket_family *all = tbucket_html_family(t,
                                                    "tbucket_redis_calls_total");
    const tbucket_sample *s = tbucket_html_sample(f, "", cl);
    const tbucket_sample *m = tbucket_html_sample(mc, "", cl);
    const tbucket_sample *n = tbucket_html_sample(all, "", cl);
    const char *e = s ? tbucket_html_label(&s->labels, "engine") : NULL;
    const char *by = "no call yet";

    if (m && n && n->value) {
        by = m->value == n->value ? "module" : m->value ? "module and script"
                                                        : "script";
    }
    ap_rprintf(r, "<tr><th>engine (calls of every child)</th>"
               "<td class=\"n\" data-engine-calls=\"%s\">%s: ", by, by);
    tbucket_html_value(r, mc, m, 0);
    ap_rputs(" of ", r);
    tbucket_html_value(r, all, n, 0);
    ap_rprintf(r, " calls to the module</td></tr><tr><th>engine (answering "
               "process)</th><td class=\"n\" data-engine=\"%s\">%s</td>"
               "</tr>", h(r, e ? e : "-"),
               h(r, e && !strcmp(e, "unknown") ? "unknown (no call from "
                                                 "this process yet)"
                                               : e ? e : "-"));
}

static void html_client(request_rec *r, const tbucket_metrics *t,
                        const tbucket_labels *cl)
{
    static const fig_def process[] = {
        { "breaker opened", "tbucket_breaker_opens_total", "" },
        { "breaker closed", "tbucket_breaker_closes_total", "" },
        { "decided without asking Redis (breaker open)",
          "tbucket_breaker_skips_total", "" },
        { "pool size", "tbucket_pool_size", "" },
        { "connections open", "tbucket_pool_connections_open", "" },
        { "connections in use", "tbucket_pool_connections_in_use", "" }
    };
    static const fig_def calls[] = {
        { "calls", "tbucket_redis_calls_total", "" },
        { "of which to the Redis module", "tbucket_redis_module_calls_total",
          "" }
    };
    static const fig_def costs[] = {
        { "failed calls", "tbucket_redis_failures_total", "" },
        { "connections opened", "tbucket_redis_connects_total", "" },
        { "NOSCRIPT reloads", "tbucket_redis_noscript_reloads_total", "" },
        { "latency, total seconds", "tbucket_redis_latency_seconds",
          "_sum" }
    };

    const tbucket_family *info = tbucket_html_family(t, "tbucket_redis_info");
    const tbucket_sample *where = NULL;
    int i;

    for (i = 0; info && i < info->samples->nelts && !where; i++) {
        const tbucket_sample *s = &APR_ARRAY_IDX(info->samples, i,
                                                 tbucket_sample);

        if (labels_include(&s->labels, cl)) {
            where = s;
        }
    }
    ap_rprintf(r, "<h2>Redis <code>%s</code></h2><div class=\"card\">"
               "<p>failure policy <b>%s</b> &middot; configured in %s</p>",
               h(r, tbucket_html_label(cl, "redis")), h(r, tbucket_html_label(cl, "policy")),
               where ? h(r, tbucket_html_label(&where->labels, "servers")) : "-");
    html_last_failure(r, t, cl);
    ap_rputs("<div class=\"grid\"><div>"
             "<h3>Breaker and pool (answering process)</h3>"
             "<table class=\"kv\">", r);
    html_breaker(r, t, cl);
    html_figs(r, t, process, (int)(sizeof(process) / sizeof(process[0])),
              cl);
    ap_rputs("</table></div><div><h3>Calls (all children)</h3>"
             "<table class=\"kv\">", r);
    html_figs(r, t, calls, (int)(sizeof(calls) / sizeof(calls[0])), cl);
    html_engine(r, t, cl);
    html_figs(r, t, costs, (int)(sizeof(costs) / sizeof(costs[0])), cl);
    ap_rprintf(r, "<tr><th>latency, mean</th><td class=\"n\">%s</td></tr>"
               "</table></div></div><div class=\"grid\"><div>"
               "<h3>Errors by kind</h3>", mean_text(r, t, cl));
    html_by_label(r, tbucket_html_family(t, "tbucket_redis_errors_total"), cl, "kind",
                  0);
    ap_rputs("</div><div><h3>Fallback decisions (Redis could not "
             "decide)</h3>", r);
    html_by_label(r, tbucket_html_family(t, "tbucket_fallback_decisions_total"), cl,
                  "fallback", 0);
    ap_rputs("</div></div>", r);
    html_latency(r, t, cl);
    ap_rputs("</div>", r);
}

/* One card per Redis configuration, found through the family that has
 * a sample for each of them. */
static void html_clients(request_rec *r, const tbucket_metrics *t)
{
    const tbucket_family *f = tbucket_html_family(t, "tbucket_redis_calls_total");
    int i;

    for (i = 0; f && i < f->samples->nelts; i++) {
        html_client(r, t, &APR_ARRAY_IDX(f->samples, i,
                                         tbucket_sample).labels);
    }
    if (!f || !f->samples->nelts) {
        ap_rputs("<h2>Redis</h2><p class=\"meta\">No Redis configuration "
                 "yet.</p>", r);
    }
}

/* A wall-clock time in ms as the page shows times, or a dash. */
static const char *ms_text(request_rec *r, int64_t ms)
{
    if (ms <= 0) {
        return "&ndash;";
    }
    return ap_ht_time(r->pool, (apr_time_t)ms * 1000, "%H:%M:%S UTC", 1);
}

/* An estimate and its error, "123" or "123 &plusmn;4". */
static const char *est_text(request_rec *r, uint64_t v, uint64_t err)
{
    if (!err) {
        return apr_psprintf(r->pool, "%" APR_UINT64_T_FMT, (apr_uint64_t)v);
    }
    return apr_psprintf(r->pool, "%" APR_UINT64_T_FMT " <span class=\"zero\">"
                        "&plusmn;%" APR_UINT64_T_FMT "</span>",
                        (apr_uint64_t)v, (apr_uint64_t)err);
}

/* One ranking of one window. The last minute's refusals are the samples
 * of tbucket_top_key_refusals, and tagged as such. */
static void html_ranking(request_rec *r, const tbucket_metrics *t,
                         const tbucket_top_window *w, int by_refusals)
{
    const tbucket_family *f = tbucket_html_family(t, "tbucket_top_key_refusals");
    const tb_topk_entry_t *e = by_refusals ? w->by_refusals
                                           : w->by_decisions;
    int n = by_refusals ? w->res.n_refusals : w->res.n_decisions, i;

    ap_rprintf(r, "<h3>by %s</h3><table class=\"topkeys\" "
               "data-minutes=\"%d\" data-ranking=\"%s\"><tr><th "
               "class=\"n\">#</th><th>key</th><th>virtual host</th>"
               "<th>limit</th><th class=\"n\">refusals</th><th class=\"n\">"
               "decisions</th><th class=\"n\">allowed</th><th class=\"n\">"
               "last refusal</th></tr>", by_refusals ? "refusals"
               : "decisions", w->minutes, by_refusals ? "refusals"
               : "decisions");
    for (i = 0; i < n; i++) {
        const char *vhost = tbucket_vhost_of(t, e[i].vhost);

        ap_rprintf(r, "<tr><td class=\"n\">%d</td><td class=\"k\"><code>%s"
                   "</code></td><td><code>%s</code></td><td>%s</td>", i + 1,
                   h(r, e[i].key), h(r, vhost), h(r, e[i].limit));
        if (by_refusals && w->minutes == 1 && f
            && i < f->samples->nelts) {
            /* collect_keys added one sample per row of this ranking, in
             * its order: row i is sample i. */
            tbucket_html_value(r, f, &APR_ARRAY_IDX(f->samples, i, tbucket_sample),
                       1);
        }
        else {
            ap_rprintf(r, "<td class=\"n\">%s</td>",
                       est_text(r, e[i].refusals, e[i].refusals_err));
        }
        ap_rprintf(r, "<td class=\"n\">%s</td><td class=\"n\">%"
                   APR_UINT64_T_FMT "</td><td class=\"n\">%s</td></tr>",
                   est_text(r, e[i].decisions, e[i].decisions_err),
                   (apr_uint64_t)e[i].allowed,
                   ms_text(r, e[i].last_refusal_ms));
    }
    if (!n) {
        ap_rputs("<tr><td colspan=\"8\" class=\"zero\">none</td></tr>", r);
    }
    ap_rputs("</table>", r);
}

/* Who is limited right now: the top keys of both windows, each by
 * refusals and by decisions. */
static void html_top(request_rec *r, const tbucket_metrics *t)
{
    int i;

    ap_rputs("<h2 id=\"top-keys\">Top keys</h2>", r);
    if (!t->top) {
        ap_rputs("<p class=\"meta\">Off (TBucketTopKeys Off).</p>", r);
        return;
    }
    ap_rprintf(r, "<p class=\"meta\">The %d keys with the most refusals "
               "and the most decisions of the shared limit, all children "
               "(%d counters a sketch, %" APR_SIZE_T_FMT " bytes of shared "
               "memory). Counts are estimates: never below the true "
               "count, and at most &plusmn; above it. The last minute is "
               "this minute and the one before.</p>", t->top->k,
               t->top->counters, t->top->bytes);
    for (i = 0; i < TBUCKET_TOP_WINDOWS; i++) {
        const tbucket_top_window *w = &t->top->w[i];

        ap_rprintf(r, "<div class=\"card\"><h3>last %s</h3><p class=\"meta\">"
                   "%" APR_UINT64_T_FMT " decisions, %" APR_UINT64_T_FMT
                   " refusals; a count is over by at most %" APR_UINT64_T_FMT
                   " (decisions) and %" APR_UINT64_T_FMT " (refusals)</p>",
                   w->minutes == 1 ? "minute"
                   : apr_psprintf(r->pool, "%d minutes", w->minutes),
                   (apr_uint64_t)w->res.decisions,
                   (apr_uint64_t)w->res.refusals,
                   (apr_uint64_t)w->res.decisions_bound,
                   (apr_uint64_t)w->res.refusals_bound);
        html_ranking(r, t, w, 1);
        html_ranking(r, t, w, 0);
        ap_rputs("</div>", r);
    }
}

/* One row per value of the label row, one column per label value of
 * cols (but skip): a table, or the sentence none when f has no sample
 * (no empty table, and no "none" above rows listed elsewhere). */
static void html_view_table(request_rec *r, const tbucket_family *f,
                            const char *row, const char *const *cols,
                            int ncols, int skip, const char *none)
{
    const char *prev = NULL;
    int i, c;

    if (!f || !f->samples->nelts) {
        ap_rprintf(r, "<p class=\"zero none\">%s</p>", none);
        return;
    }
    ap_rprintf(r, "<table><tr><th>%s</th>", row);
    for (c = 0; c < ncols; c++) {
        if (c != skip) {
            ap_rprintf(r, "<th class=\"n\">%s</th>", h(r, cols[c]));
        }
    }
    ap_rputs("</tr>", r);
    for (i = 0; i < f->samples->nelts; i++) {
        const tbucket_sample *s = &APR_ARRAY_IDX(f->samples, i,
                                                 tbucket_sample);
        const char *name = tbucket_html_label(&s->labels, row);

        if (!prev || strcmp(prev, name)) {
            ap_rprintf(r, "%s<tr><td><code>%s</code></td>", prev ? "</tr>"
                       : "", h(r, name));
            prev = name;
        }
        tbucket_html_value(r, f, s, 1);
    }
    ap_rputs("</tr></table>", r);
}

/* The named limits, each with its events side by side, then the scopes
 * that set TBucketLimit by outcome (local protection's sheds are not a
 * limit's doing). The deprecated aliases of both families are listed
 * under "Every figure" only. */
static void html_limits(request_rec *r, const tbucket_metrics *t)
{
    ap_rputs("<h2 id=\"limits\">Limits</h2>", r);
    html_view_table(r, tbucket_html_family(t, "tbucket_limit_events_total"),
                    "limit", tbucket_limit_event_names, TBUCKET_LIMIT_EVENTS,
                    -1, "No named limit.");
    ap_rputs("<h2 id=\"scopes\">Scopes</h2>", r);
    html_view_table(r, tbucket_html_family(t,
                                           "tbucket_scope_decisions_total"),
                    "scope", tbucket_outcome_names, TBUCKET_OUTCOMES,
                    TBUCKET_OUT_SHED, "No scope sets TBucketLimit.");
}

/* Every sample, as the text view lists them, folded away by default. */
static void html_all(request_rec *r, const tbucket_metrics *t)
{
    int i, j;

    ap_rputs("<details><summary>Every figure, as in the Prometheus "
             "text</summary><table><tr><th>metric</th><th>labels</th>"
             "<th class=\"n\">value</th></tr>", r);
    for (i = 0; i < t->families->nelts; i++) {
        const tbucket_family *f = APR_ARRAY_IDX(t->families, i,
                                                tbucket_family *);

        ap_rprintf(r, "<tr><th colspan=\"3\"><code>%s</code> (%s): %s"
                   "</th></tr>", h(r, f->name), h(r, f->type),
                   h(r, f->help));
        for (j = 0; j < f->samples->nelts; j++) {
            const tbucket_sample *s = &APR_ARRAY_IDX(f->samples, j,
                                                     tbucket_sample);

            ap_rprintf(r, "<tr><td><code>%s%s</code></td>"
                       "<td><code>%s</code></td>", h(r, f->name), s->suffix,
                       h(r, tbucket_prom_labels(r->pool, &s->labels)));
            tbucket_html_value(r, f, s, 1);
            ap_rputs("</tr>", r);
        }
    }
    ap_rputs("</table></details>", r);
}

void tbucket_status_html(request_rec *r, const tbucket_metrics *t)
{
    const tbucket_family *gen = tbucket_html_family(t, "tbucket_config_generation");
    tbucket_labels none, limit_rate, limit_conc;

    memset(&none, 0, sizeof(none));
    limit_rate = tbucket_labels_with(NULL, "limit", "rate");
    limit_conc = tbucket_labels_with(NULL, "limit", "concurrency");
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
    tbucket_html_value(r, gen, tbucket_html_sample(gen, "", &none), 0);
    ap_rprintf(r, "</p><p class=\"meta\">Counters cover every child; "
               "breaker state and pool figures are those of the process "
               "that answered. Prometheus text: <a href=\"%s\">%s</a></p>",
               h(r, ap_escape_uri(r->pool, r->uri)),
               h(r, ap_escape_uri(r->pool, r->uri)));
    tbucket_series_html(r, t);
    tbucket_bans_html(r, t);
    ap_rputs("<h2>Decisions by outcome</h2>", r);
    html_by_label(r, tbucket_html_family(t, "tbucket_decisions_total"), &none,
                  "outcome", 1);
    html_vhosts(r, t);
    html_top(r, t);
    html_limits(r, t);
    tbucket_html_local(r, t);
    html_clients(r, t);
    ap_rputs("<h2>Local fallback table</h2><table class=\"kv\">", r);
    html_fig(r, t, "buckets held", "tbucket_local_entries_used", "", &none);
    html_fig(r, t, "buckets at most", "tbucket_local_entries_max", "",
             &none);
    ap_rputs("</table>", r);
    ap_rputs("<h2>Token leases</h2><div class=\"grid\"><div>"
             "<h3>requests from a lease</h3>", r);
    html_by_label(r, tbucket_html_family(t, "tbucket_lease_hits_total"), &none,
                  "vhost", 0);
    ap_rputs("</div><div><h3>leases taken</h3>", r);
    html_by_label(r, tbucket_html_family(t, "tbucket_lease_refills_total"), &none,
                  "vhost", 0);
    ap_rputs("</div><div><h3>tokens granted</h3>", r);
    html_by_label(r, tbucket_html_family(t, "tbucket_lease_tokens_granted_total"),
                  &none, "vhost", 0);
    ap_rputs("</div></div><table class=\"kv\">", r);
    html_fig(r, t, "leases held", "tbucket_lease_entries_used", "", &none);
    html_fig(r, t, "tokens given back", "tbucket_lease_tokens_returned_total",
             "", &none);
    ap_rputs("</table>", r);
    ap_rputs("<h2>Refusals and concurrency slots</h2><div class=\"grid\">"
             "<div><h3>refused by a rate limit</h3>", r);
    html_by_label(r, tbucket_html_family(t, "tbucket_refusals_total"),
                  &limit_rate, "vhost", 0);
    ap_rputs("</div><div><h3>refused by a concurrency limit</h3>", r);
    html_by_label(r, tbucket_html_family(t, "tbucket_refusals_total"),
                  &limit_conc, "vhost", 0);
    ap_rputs("</div><div><h3>slots held now</h3>", r);
    html_by_label(r, tbucket_html_family(t, "tbucket_concurrency_in_flight"), &none,
                  "vhost", 0);
    ap_rputs("</div></div>", r);
    html_all(r, t);
    ap_rputs("<footer>mod_tbucket &middot; no script, no external "
             "resource; reload to refresh.</footer></main></body></html>\n",
             r);
}
