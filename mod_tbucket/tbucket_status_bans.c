/* tbucket_status_bans.c -- the active bans on the status page: who is
 * locked out now, by which named limit, for how long, and how often
 * they were refused in the last 15 minutes.
 *
 * Bans live in Redis (shared/tb_rules.c keeps them in the bucket and an
 * index), so the page asks for them, when a named limit of the
 * configuration bans (ban=), with the answering child's clients:
 * once per distinct Redis client and key prefix among the servers, at
 * most BANS_ASKED bans each, and never while that client's breaker is
 * open (the page must not wait on a Redis that is known to be failing;
 * it says so instead). Only the HTML and JSON views ask; the Prometheus
 * text, which is scraped, never calls Redis. The refusals come from the
 * top keys of the last 15 minutes (a named limit's refusals are counted
 * under its name and key), so they need TBucketTopKeys. The JSON view
 * names the limit twice, as "limit" and as its deprecated alias "rule",
 * until 0.3.0.
 */
#include "apr_strings.h"

#include <stdlib.h>

#include "httpd.h"
#include "http_config.h"
#include "http_main.h"
#include "http_protocol.h"

#include "mod_tbucket.h"
#include "tbucket_status.h"

#define BANS_ASKED 64                 /* Per client and prefix.         */
#define BANS_SHOWN 20                 /* On the page, newest first.     */
#define BANS_PAIRS 8                  /* Clients and prefixes asked.    */

/* Refusals of key under its limit in the last 15 minutes' top keys: the
 * count, or -1 when the key is not among them (or they are off). */
static int64_t refused_of(const tbucket_metrics *t, const tb_ban_t *b)
{
    const tbucket_top_window *w;
    int i;

    if (!t->top) {
        return -1;
    }
    w = &t->top->w[TBUCKET_TOP_WINDOWS - 1];
    for (i = 0; i < w->res.n_refusals; i++) {
        if (!strcmp(w->by_refusals[i].limit, b->rule)
            && !strcmp(w->by_refusals[i].key, b->key)) {
            return (int64_t)w->by_refusals[i].refusals;
        }
    }
    return -1;
}

/* Newest first: for one limit, the most time left is the latest set. */
static int by_left_desc(const void *a, const void *b)
{
    const tbucket_ban_note *x = a, *y = b;

    return x->ban.left_ms < y->ban.left_ms ? 1
           : x->ban.left_ms > y->ban.left_ms ? -1 : 0;
}

/* Ask one client for the bans under prefix, into t. */
static void ask(tbucket_metrics *t, const tbucket_client *c,
                const char *prefix)
{
    tb_ban_t *got = apr_palloc(t->p, BANS_ASKED * sizeof(*got));
    int n = 0, i;

    if (tb_client_breaker_state(c->tb) == TB_BREAKER_OPEN) {
        t->bans_note = apr_psprintf(t->p, "not asked of %s: its breaker "
                                    "is open", c->label);
        return;
    }
    if (tb_client_bans(c->tb, prefix, got, BANS_ASKED, &n) != TB_OK) {
        t->bans_note = apr_psprintf(t->p, "%s did not answer: %s",
                                    c->label, c->tb->errstr);
        return;
    }
    t->bans_more |= n == BANS_ASKED;
    for (i = 0; i < n; i++) {
        tbucket_ban_note *b = apr_array_push(t->bans);

        b->redis = c->label;
        b->prefix = prefix;
        b->ban = got[i];
        b->refused = -1;
    }
}

void tbucket_bans_refused(tbucket_metrics *t)
{
    int i;

    for (i = 0; t->bans && i < t->bans->nelts; i++) {
        tbucket_ban_note *b = &APR_ARRAY_IDX(t->bans, i, tbucket_ban_note);

        b->refused = refused_of(t, &b->ban);
    }
}

void tbucket_collect_bans(tbucket_metrics *t)
{
    const tbucket_client *seen_c[BANS_PAIRS];
    const char *seen_p[BANS_PAIRS];
    int nseen = 0, i;
    server_rec *s;

    t->bans = apr_array_make(t->p, 8, sizeof(tbucket_ban_note));
    if (!tbucket_limits_ban()) {
        /* No limit bans: no call (which would move the pool's figures). */
        return;
    }
    for (s = ap_server_conf; s && nseen < BANS_PAIRS; s = s->next) {
        const tbucket_srv_conf *sc = ap_get_module_config(s->module_config,
                                                          &tbucket_module);
        const char *prefix = sc->prefix ? sc->prefix : TBUCKET_DEFAULT_PREFIX;

        if (!sc->client || !sc->client->tb) {
            continue;
        }
        for (i = 0; i < nseen; i++) {
            if (seen_c[i]->tb == sc->client->tb && !strcmp(seen_p[i], prefix)) {
                break;
            }
        }
        if (i < nseen) {
            continue;
        }
        seen_c[nseen] = sc->client;
        seen_p[nseen++] = prefix;
        ask(t, sc->client, prefix);
    }
    qsort(t->bans->elts, (size_t)t->bans->nelts, sizeof(tbucket_ban_note),
          by_left_desc);
    if (t->bans->nelts > BANS_SHOWN) {
        t->bans->nelts = BANS_SHOWN;
        t->bans_more = 1;
    }
}

/* "1 h 2 min", "3 min 4 s", "5 s". */
static const char *left_text(apr_pool_t *p, int64_t ms)
{
    int64_t s = (ms + 999) / 1000;

    if (s >= 3600) {
        return apr_psprintf(p, "%d h %d min", (int)(s / 3600),
                            (int)(s % 3600 / 60));
    }
    if (s >= 60) {
        return apr_psprintf(p, "%d min %d s", (int)(s / 60), (int)(s % 60));
    }
    return apr_psprintf(p, "%d s", (int)s);
}

void tbucket_bans_html(request_rec *r, const tbucket_metrics *t)
{
    int i;

    ap_rputs("<h2>Active bans</h2>", r);
    if (t->bans_note) {
        ap_rprintf(r, "<p class=\"meta\">Bans %s.</p>",
                   ap_escape_html(r->pool, t->bans_note));
    }
    if (!t->bans || !t->bans->nelts) {
        ap_rputs("<p class=\"meta bans-none\">No active ban.</p>", r);
        return;
    }
    ap_rputs("<table class=\"bans\"><tr><th>limit</th><th>key</th>"
             "<th class=\"n\">time left</th><th class=\"n\">refused, last "
             "15 min</th></tr>", r);
    for (i = 0; i < t->bans->nelts; i++) {
        const tbucket_ban_note *b = &APR_ARRAY_IDX(t->bans, i,
                                                   tbucket_ban_note);

        ap_rprintf(r, "<tr><td><code>%s</code></td><td class=\"k\"><code>"
                   "%s</code></td><td class=\"n\">%s</td><td class=\"n\">",
                   ap_escape_html(r->pool, b->ban.rule),
                   ap_escape_html(r->pool, b->ban.key),
                   left_text(r->pool, b->ban.left_ms));
        if (b->refused >= 0) {
            ap_rprintf(r, "%" APR_INT64_T_FMT, (apr_int64_t)b->refused);
        }
        else {
            ap_rputs("<span class=\"zero\">&ndash;</span>", r);
        }
        ap_rputs("</td></tr>", r);
    }
    ap_rprintf(r, "</table><p class=\"meta\">Newest first (for one limit: "
               "the most time left)%s. <code>tbucket bans</code> lists them "
               "all, <code>tbucket unban</code> lifts one.</p>",
               t->bans_more ? "; more are active than shown" : "");
}

void tbucket_bans_json(request_rec *r, const tbucket_metrics *t)
{
    int i;

    if (!t->bans) {
        return;
    }
    ap_rprintf(r, ",\"bans_more\":%s,\"bans_note\":", t->bans_more
               ? "true" : "false");
    if (t->bans_note) {
        ap_rprintf(r, "\"%s\"", tbucket_json_esc(r->pool, t->bans_note));
    }
    else {
        ap_rputs("null", r);
    }
    ap_rputs(",\"bans\":[", r);
    for (i = 0; i < t->bans->nelts; i++) {
        const tbucket_ban_note *b = &APR_ARRAY_IDX(t->bans, i,
                                                   tbucket_ban_note);
        const char *limit = tbucket_json_esc(r->pool, b->ban.rule);

        ap_rprintf(r, "%s{\"limit\":\"%s\",\"rule\":\"%s\",\"key\":\"%s\","
                   "\"left_ms\":%" APR_INT64_T_FMT ",\"prefix\":\"%s\","
                   "\"refused_15m\":%" APR_INT64_T_FMT "}", i ? "," : "",
                   limit, limit,
                   tbucket_json_esc(r->pool, b->ban.key),
                   (apr_int64_t)b->ban.left_ms,
                   tbucket_json_esc(r->pool, b->prefix),
                   (apr_int64_t)b->refused);
    }
    ap_rputs("]", r);
}
