/* tbucket_status_local.c -- local protection on the status page's HTML
 * view: the busy share, what each site sheds and at which busy share,
 * what its local limits refused, each local scope's places and each
 * auto scope's cap.
 *
 * The per-priority figures are kept per site (virtual host) and per
 * priority: they are drawn as one row per site and one column per
 * priority, so that no priority is listed twice without its site, and a
 * table with no figure at all is a sentence saying why.
 */
#include "apr_strings.h"

#include "httpd.h"
#include "http_protocol.h"

#include "mod_tbucket.h"
#include "tbucket_status.h"

static const char *h(request_rec *r, const char *s)
{
    return ap_escape_html(r->pool, s);
}

/* A row of a figures table: a title and the family's sample without
 * labels. */
static void fig_row(request_rec *r, const tbucket_metrics *t,
                    const char *title, const char *name)
{
    const tbucket_family *f = tbucket_html_family(t, name);
    tbucket_labels none;

    memset(&none, 0, sizeof(none));
    ap_rprintf(r, "<tr><th>%s</th>", h(r, title));
    tbucket_html_value(r, f, tbucket_html_sample(f, "", &none), 1);
    ap_rputs("</tr>", r);
}

/* The cells of an auto scope's row: each of the n families' samples
 * with the scope's labels and label=values[i] (one family, or one each). */
static void html_auto_cells(request_rec *r, const tbucket_family *f,
                            const tbucket_labels *scope, const char *label,
                            const char *const *values, int n)
{
    tbucket_labels k;
    int i;

    for (i = 0; i < n; i++) {
        k = tbucket_labels_with(scope, label, values[i]);
        tbucket_html_value(r, f, tbucket_html_sample(f, "", &k), 1);
    }
}

/* Each auto scope's cap as it sets itself (tbucket_local_limit is the
 * cap now): bounds, the latency it reads, how often it moved. */
static void html_auto(request_rec *r, const tbucket_metrics *t)
{
    static const char *const bounds[2] = { "min", "max" };
    static const char *const kinds[2] = { "floor", "window" };
    static const char *const moves[3] = { "up", "down", "probe" };
    const tbucket_family *b = tbucket_html_family(t, "tbucket_local_auto_bounds");
    const tbucket_family *lat = tbucket_html_family(t,
                                         "tbucket_local_auto_latency_seconds");
    const tbucket_family *mv = tbucket_html_family(t, "tbucket_local_auto_changes_total");
    const tbucket_family *lim = tbucket_html_family(t, "tbucket_local_limit");
    const char *last = NULL;
    int i;

    for (i = 0; b && i < b->samples->nelts; i++) {
        const tbucket_sample *s = &APR_ARRAY_IDX(b->samples, i,
                                                 tbucket_sample);
        const char *scope = tbucket_html_label(&s->labels, "scope");
        tbucket_labels l = tbucket_labels_with(NULL, "scope", scope);

        if (last && !strcmp(last, scope)) {
            continue;
        }
        if (!last) {
            ap_rputs("<h3>auto scopes: the cap sets itself</h3><table><tr>"
                     "<th>scope</th><th class=\"n\">cap</th><th class=\"n\">"
                     "min</th><th class=\"n\">max</th><th class=\"n\">floor "
                     "(s)</th><th class=\"n\">last window (s)</th><th "
                     "class=\"n\">up</th><th class=\"n\">down</th><th "
                     "class=\"n\">probes</th></tr>", r);
        }
        last = scope;
        ap_rprintf(r, "<tr><td><code>%s</code></td>", h(r, scope));
        tbucket_html_value(r, lim, tbucket_html_sample(lim, "", &l), 1);
        html_auto_cells(r, b, &l, "bound", bounds, 2);
        html_auto_cells(r, lat, &l, "kind", kinds, 2);
        html_auto_cells(r, mv, &l, "direction", moves, 3);
        ap_rputs("</tr>", r);
    }
    if (last) {
        ap_rputs("</table>", r);
    }
}

/* f's samples as a table of one row per site (label vhost, in the
 * order they come) and one column per priority; a row per site is
 * printed once. none is said instead when f has no sample. */
static void html_site_prios(request_rec *r, const tbucket_family *f,
                            const char *none)
{
    apr_hash_t *seen = apr_hash_make(r->pool);
    tbucket_labels want;
    int i, k;

    if (!f || !f->samples->nelts) {
        ap_rprintf(r, "<p class=\"zero none\">%s</p>", none);
        return;
    }
    ap_rputs("<table class=\"prios\"><tr><th>site</th>", r);
    for (k = 0; k < TBUCKET_PRIOS; k++) {
        ap_rprintf(r, "<th class=\"n\">%s</th>", tbucket_priority_names[k]);
    }
    ap_rputs("</tr>", r);
    for (i = 0; i < f->samples->nelts; i++) {
        const tbucket_sample *s = &APR_ARRAY_IDX(f->samples, i,
                                                 tbucket_sample);
        const char *site = tbucket_html_label(&s->labels, "vhost");

        if (!site || apr_hash_get(seen, site, APR_HASH_KEY_STRING)) {
            continue;
        }
        apr_hash_set(seen, site, APR_HASH_KEY_STRING, site);
        ap_rprintf(r, "<tr><td class=\"site\"><code>%s</code></td>",
                   h(r, site));
        for (k = 0; k < TBUCKET_PRIOS; k++) {
            want = tbucket_labels_with(NULL, "vhost", site);
            want = tbucket_labels_with(&want, "priority",
                                       tbucket_priority_names[k]);
            if (tbucket_html_sample(f, "", &want)) {
                tbucket_html_value(r, f, tbucket_html_sample(f, "", &want), 1);
            }
            else {
                ap_rputs("<td class=\"n zero\">&ndash;</td>", r);
            }
        }
        ap_rputs("</tr>", r);
    }
    ap_rputs("</table>", r);
}

/* Local protection: the busy share against the thresholds, what was
 * shed by priority, and each local scope's places in flight. */
void tbucket_html_local(request_rec *r, const tbucket_metrics *t)
{
    const tbucket_family *in = tbucket_html_family(t,
                                                   "tbucket_local_in_flight");
    const tbucket_family *lim = tbucket_html_family(t, "tbucket_local_limit");
    const tbucket_family *ref = tbucket_html_family(t,
                                                    "tbucket_local_refused_total");
    int i;

    ap_rputs("<h2>Local protection</h2><table class=\"kv\">", r);
    fig_row(r, t, "workers busy with a request", "tbucket_workers_busy");
    fig_row(r, t, "workers at most", "tbucket_workers_max");
    ap_rputs("</table><h3>shed at busy %</h3>", r);
    html_site_prios(r, tbucket_html_family(t,
                                           "tbucket_shed_threshold_percent"),
                    "No site sheds (TBucketShed is not set).");
    ap_rputs("<h3>shed, by site and priority</h3>", r);
    html_site_prios(r, tbucket_html_family(t, "tbucket_shed_total"),
                    "Nothing shed.");
    ap_rputs("<h3>refused by a local limit, by site and priority</h3>", r);
    html_site_prios(r, tbucket_html_family(t,
                                           "tbucket_local_refusals_total"),
                    "Nothing refused by a local limit.");
    ap_rputs("<h3>local scopes</h3><table><tr><th>scope</th>"
             "<th class=\"n\">in flight</th><th class=\"n\">limit</th>"
             "<th></th><th class=\"n\">refused</th></tr>", r);
    for (i = 0; in && lim && ref && i < in->samples->nelts; i++) {
        const tbucket_sample *s = &APR_ARRAY_IDX(in->samples, i,
                                                 tbucket_sample);
        const tbucket_sample *n = tbucket_html_sample(lim, "", &s->labels);

        ap_rprintf(r, "<tr><td><code>%s</code></td>",
                   h(r, tbucket_html_label(&s->labels, "scope")));
        tbucket_html_value(r, in, s, 1);
        tbucket_html_value(r, lim, n, 1);
        tbucket_html_bar(r, s->value, n ? n->value : 0);
        tbucket_html_value(r, ref, tbucket_html_sample(ref, "", &s->labels),
                           1);
        ap_rputs("</tr>", r);
    }
    ap_rputs("</table>", r);
    html_auto(r, t);
}
