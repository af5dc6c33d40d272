/* tbucket_status_chart.c -- the last 15 minutes on the status page: the
 * ring's series (tbucket_ring.c) drawn as inline SVG charts in the HTML
 * view, and given as numbers in the JSON view's "series" member.
 *
 * The charts are plain SVG elements inside the page: no script, no
 * external resource, no inline event attribute, so the page's strict
 * Content-Security-Policy holds. Each bar carries a <title> (a browser
 * shows it on hover) and each chart a data-series attribute naming the
 * series it draws, for the tests. The moments that explain an incident
 * are marked on every chart: the slot in which a breaker opened after a
 * slot without, and the slot in which named limits began to set bans
 * after a slot without (a ban wave). Marks are found once
 * (tbucket_series_marks) for both views. The JSON view's refused_named
 * is also served as refused_rule, its deprecated alias, until 0.3.0.
 */
#include "apr_strings.h"

#include "httpd.h"
#include "http_protocol.h"

#include "mod_tbucket.h"
#include "tbucket_status.h"

#define CHART_W 900                   /* viewBox units: 10 per slot.    */
#define CHART_H 80
#define SLOT_W (CHART_W / TBUCKET_RING_SLOTS)

/* The refusal kinds stacked in the refusals chart, bottom up, with
 * their colours and legend names. */
static const struct refusal_kind {
    tbucket_ring_count which;
    const char *colour;
    const char *name;
} refusal_kinds[] = {
    { TBUCKET_RS_LIMIT, "#cf222e", "limit" },
    { TBUCKET_RS_NAMED, "#bc4c00", "named limit" },
    { TBUCKET_RS_BAN, "#8250df", "ban" },
    { TBUCKET_RS_SHED, "#bf8700", "shed" },
    { TBUCKET_RS_LOCAL, "#0969da", "local cap" }
};
#define REFUSAL_KINDS (int)(sizeof(refusal_kinds) / sizeof(refusal_kinds[0]))

/* The charts' own rules, beside the page's (an inline style element:
 * the Content-Security-Policy allows inline styles only). */
static const char chart_css[] =
    "<style>svg.chart{display:block;width:100%;height:80px;"
    "border:1px solid #d0d7de;border-radius:4px;margin:0 0 4px}"
    ".legend span{margin-right:14px;white-space:nowrap}"
    ".legend i{display:inline-block;width:10px;height:10px;"
    "margin-right:4px;border-radius:2px}"
    ".axis{display:flex;justify-content:space-between;color:#57606a;"
    "font-size:12px;margin:0}.m0{color:#cf222e}.m1{color:#8250df}"
    "</style>";

static const char *const mark_names[TBUCKET_MARK_KINDS] = {
    "breaker opened", "ban wave"
};

const tbucket_ring_series *tbucket_series_read(apr_pool_t *p,
                                               apr_time_t now)
{
    tbucket_ring_series *s = apr_palloc(p, sizeof(*s));

    return tbucket_ring_read(now, s) ? s : NULL;
}

/* The series' refusals of every kind in slot i. */
uint64_t tbucket_series_refused(const tbucket_ring_series *s, int i)
{
    uint64_t n = 0;
    int k;

    for (k = 0; k < REFUSAL_KINDS; k++) {
        n += s->v[refusal_kinds[k].which][i];
    }
    return n;
}

int tbucket_series_marks(const tbucket_ring_series *s, tbucket_mark *m,
                         int max)
{
    int i, n = 0;

    for (i = 0; i < TBUCKET_RING_SLOTS && n < max; i++) {
        if (s->v[TBUCKET_RS_OPENS][i] && (i == 0 || !s->breaker[i - 1])) {
            m[n].slot = i;
            m[n++].kind = TBUCKET_MARK_BREAKER;
        }
        if (n < max && s->v[TBUCKET_RS_BANS_SET][i]
            && (i == 0 || !s->v[TBUCKET_RS_BANS_SET][i - 1])) {
            m[n].slot = i;
            m[n++].kind = TBUCKET_MARK_BAN_WAVE;
        }
    }
    return n;
}

static apr_time_t slot_time(const tbucket_ring_series *s, int i)
{
    return s->start + apr_time_from_sec((apr_time_t)i * TBUCKET_RING_SLOT_S);
}

/* The bar height of v against max, in viewBox units (at least 1 for a
 * value above zero, so that one refusal shows). */
static int bar_h(uint64_t v, uint64_t max)
{
    int hgt;

    if (!v || !max) {
        return 0;
    }
    hgt = (int)((v * (CHART_H - 4) + max - 1) / max);
    return hgt < 1 ? 1 : hgt;
}

/* One bar of slot i from y0 up, hgt high, with its hover text. */
static void bar(request_rec *r, const tbucket_ring_series *s, int i,
                int y0, int hgt, const char *colour, const char *title)
{
    ap_rprintf(r, "<rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" "
               "fill=\"%s\"><title>%s %s</title></rect>", i * SLOT_W + 1,
               y0 - hgt, SLOT_W - 2, hgt, colour,
               ap_ht_time(r->pool, slot_time(s, i), "%H:%M:%S", 1), title);
}

/* The chart's frame: the svg element, the shade of the slots in which a
 * breaker was open, the unknown slots greyed, and the marks. */
static void chart_open(request_rec *r, const tbucket_ring_series *s,
                       const tbucket_mark *m, int nm, const char *series)
{
    int i;

    ap_rprintf(r, "<svg class=\"chart\" data-series=\"%s\" viewBox=\"0 0 "
               "%d %d\" preserveAspectRatio=\"none\" role=\"img\">"
               "<rect width=\"%d\" height=\"%d\" fill=\"#fff\"/>", series,
               CHART_W, CHART_H, CHART_W, CHART_H);
    for (i = 0; i < TBUCKET_RING_SLOTS; i++) {
        if (!s->known[i] || s->breaker[i]) {
            ap_rprintf(r, "<rect class=\"%s\" x=\"%d\" y=\"0\" width=\"%d\""
                       " height=\"%d\" fill=\"%s\"/>",
                       s->known[i] ? "open" : "unknown", i * SLOT_W, SLOT_W,
                       CHART_H, s->known[i] ? "#ffebe9" : "#eaeef2");
        }
    }
    for (i = 0; i < nm; i++) {
        ap_rprintf(r, "<line class=\"mark %s\" x1=\"%d\" x2=\"%d\" y1=\"0\""
                   " y2=\"%d\" stroke=\"%s\" stroke-width=\"2\">"
                   "<title>%s at %s</title></line>",
                   m[i].kind == TBUCKET_MARK_BREAKER ? "breaker" : "banwave",
                   m[i].slot * SLOT_W, m[i].slot * SLOT_W, CHART_H,
                   m[i].kind == TBUCKET_MARK_BREAKER ? "#cf222e" : "#8250df",
                   mark_names[m[i].kind],
                   ap_ht_time(r->pool, slot_time(s, m[i].slot), "%H:%M:%S",
                              1));
    }
}

/* A chart of one series as bars, with its largest value as a caption. */
static void chart_one(request_rec *r, const tbucket_ring_series *s,
                      const tbucket_mark *m, int nm, tbucket_ring_count c,
                      const char *title, const char *colour)
{
    uint64_t max = 0;
    int i;

    for (i = 0; i < TBUCKET_RING_SLOTS; i++) {
        max = s->v[c][i] > max ? s->v[c][i] : max;
    }
    ap_rprintf(r, "<h3>%s <span class=\"zero\">(most in a slot: %"
               APR_UINT64_T_FMT ")</span></h3>", title, (apr_uint64_t)max);
    chart_open(r, s, m, nm, tbucket_ring_names[c]);
    for (i = 0; i < TBUCKET_RING_SLOTS; i++) {
        if (s->v[c][i]) {
            bar(r, s, i, CHART_H, bar_h(s->v[c][i], max), colour,
                apr_psprintf(r->pool, "%" APR_UINT64_T_FMT " %s",
                             (apr_uint64_t)s->v[c][i], title));
        }
    }
    ap_rputs("</svg>", r);
}

/* The refusals, stacked by kind, and their legend. */
static void chart_refusals(request_rec *r, const tbucket_ring_series *s,
                           const tbucket_mark *m, int nm)
{
    uint64_t max = 0, n;
    int i, k, y;

    for (i = 0; i < TBUCKET_RING_SLOTS; i++) {
        n = tbucket_series_refused(s, i);
        max = n > max ? n : max;
    }
    ap_rprintf(r, "<h3>refusals, by kind <span class=\"zero\">(most in a "
               "slot: %" APR_UINT64_T_FMT ")</span></h3><p class=\"legend\">",
               (apr_uint64_t)max);
    for (k = 0; k < REFUSAL_KINDS; k++) {
        ap_rprintf(r, "<span><i style=\"background:%s\"></i>%s</span>",
                   refusal_kinds[k].colour, refusal_kinds[k].name);
    }
    ap_rputs("</p>", r);
    chart_open(r, s, m, nm, "refused");
    for (i = 0; i < TBUCKET_RING_SLOTS; i++) {
        n = tbucket_series_refused(s, i);
        for (k = 0, y = CHART_H; n && k < REFUSAL_KINDS; k++) {
            uint64_t v = s->v[refusal_kinds[k].which][i];
            /* Stacked in proportion, so the column's top is the total. */
            int hgt = bar_h(n, max) * (int)((v * 1000) / n) / 1000;

            if (v) {
                hgt = hgt < 1 ? 1 : hgt;
                bar(r, s, i, y, hgt, refusal_kinds[k].colour,
                    apr_psprintf(r->pool, "%" APR_UINT64_T_FMT " refused: %s",
                                 (apr_uint64_t)v, refusal_kinds[k].name));
                y -= hgt;
            }
        }
    }
    ap_rputs("</svg>", r);
}

/* The 99th percentile of Redis calls, slot by slot. */
static void chart_p99(request_rec *r, const tbucket_ring_series *s,
                      const tbucket_mark *m, int nm)
{
    int64_t max = 0, v;
    int i;

    for (i = 0; i < TBUCKET_RING_SLOTS; i++) {
        v = s->p99_us[i] ? s->p99_us[i] : 500000;
        max = s->p99_us[i] >= 0 && v > max ? v : max;
    }
    ap_rprintf(r, "<h3>Redis call latency, 99th percentile <span "
               "class=\"zero\">(highest: %s)</span></h3>",
               max ? apr_psprintf(r->pool, "&le; %d ms",
                                  (int)((max + 999) / 1000)) : "no call");
    chart_open(r, s, m, nm, "p99_us");
    for (i = 0; i < TBUCKET_RING_SLOTS; i++) {
        if (s->p99_us[i] < 0) {
            continue;
        }
        v = s->p99_us[i] ? s->p99_us[i] : 500000;
        bar(r, s, i, CHART_H, bar_h((uint64_t)v, (uint64_t)max), "#1a7f37",
            s->p99_us[i] ? apr_psprintf(r->pool, "p99 &le; %d &micro;s",
                                        (int)v)
                         : "p99 above 250 ms");
    }
    ap_rputs("</svg>", r);
}

void tbucket_series_html(request_rec *r, const tbucket_metrics *t)
{
    const tbucket_ring_series *s = t->series;
    tbucket_mark m[TBUCKET_MAX_MARKS];
    int nm, i;

    if (!s) {
        return;
    }
    nm = tbucket_series_marks(s, m, TBUCKET_MAX_MARKS);
    ap_rputs(chart_css, r);
    ap_rprintf(r, "<h2>The last 15 minutes</h2><p class=\"meta\">Whole "
               "server, 10-second slots from %s to now (UTC); a red band: "
               "a breaker was open; grey: before the counts began.",
               ap_ht_time(r->pool, s->start, "%H:%M:%S", 1));
    for (i = 0; i < nm; i++) {
        ap_rprintf(r, " <b class=\"m%d\">%s at %s</b>.", m[i].kind,
                   mark_names[m[i].kind],
                   ap_ht_time(r->pool, slot_time(s, m[i].slot), "%H:%M:%S",
                              1));
    }
    ap_rputs("</p><div class=\"charts\">", r);
    chart_one(r, s, m, nm, TBUCKET_RS_DECISIONS, "decisions", "#54aeff");
    chart_refusals(r, s, m, nm);
    chart_one(r, s, m, nm, TBUCKET_RS_FALLBACK,
              "decisions by the fallback policy", "#bf8700");
    chart_one(r, s, m, nm, TBUCKET_RS_ERRORS, "Redis errors", "#cf222e");
    chart_p99(r, s, m, nm);
    ap_rputs("<p class=\"axis\"><span>&minus;15 min</span><span>&minus;10 "
             "min</span><span>&minus;5 min</span><span>now</span></p>"
             "</div>", r);
}

/* One series as a JSON array member, with a leading comma. */
static void json_array(request_rec *r, const char *name, const uint64_t *v)
{
    int i;

    ap_rprintf(r, ",\"%s\":[", name);
    for (i = 0; i < TBUCKET_RING_SLOTS; i++) {
        ap_rprintf(r, "%s%" APR_UINT64_T_FMT, i ? "," : "",
                   (apr_uint64_t)v[i]);
    }
    ap_rputs("]", r);
}

void tbucket_series_json(request_rec *r, const tbucket_metrics *t)
{
    const tbucket_ring_series *s = t->series;
    uint64_t v[TBUCKET_RING_SLOTS];
    tbucket_mark m[TBUCKET_MAX_MARKS];
    int nm, i, k;

    if (!s) {
        ap_rputs(",\"series\":null", r);
        return;
    }
    ap_rprintf(r, ",\"series\":{\"slot_seconds\":%d,\"slots\":%d,"
               "\"start\":%" APR_TIME_T_FMT, TBUCKET_RING_SLOT_S,
               TBUCKET_RING_SLOTS, apr_time_sec(s->start));
    for (k = 0; k < TBUCKET_RS_COUNTS; k++) {
        json_array(r, tbucket_ring_names[k], s->v[k]);
    }
    for (i = 0; i < TBUCKET_RING_SLOTS; i++) {
        v[i] = tbucket_series_refused(s, i);
    }
    json_array(r, "refused", v);
    /* Deprecated alias of refused_named, served until 0.3.0. */
    json_array(r, "refused_rule", s->v[TBUCKET_RS_NAMED]);
    ap_rputs(",\"p99_us\":[", r);
    for (i = 0; i < TBUCKET_RING_SLOTS; i++) {
        ap_rprintf(r, "%s%" APR_INT64_T_FMT, i ? "," : "", s->p99_us[i]);
    }
    ap_rputs("]", r);
    for (i = 0; i < TBUCKET_RING_SLOTS; i++) {
        v[i] = s->breaker[i];
    }
    json_array(r, "breaker_open", v);
    for (i = 0; i < TBUCKET_RING_SLOTS; i++) {
        v[i] = s->known[i];
    }
    json_array(r, "known", v);
    nm = tbucket_series_marks(s, m, TBUCKET_MAX_MARKS);
    ap_rputs(",\"marks\":[", r);
    for (i = 0; i < nm; i++) {
        ap_rprintf(r, "%s{\"slot\":%d,\"time\":%" APR_TIME_T_FMT
                   ",\"kind\":\"%s\"}", i ? "," : "", m[i].slot,
                   apr_time_sec(slot_time(s, m[i].slot)),
                   m[i].kind == TBUCKET_MARK_BREAKER ? "breaker"
                                                     : "ban-wave");
    }
    ap_rputs("]}", r);
}
