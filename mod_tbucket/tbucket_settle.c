/* tbucket_settle.c -- what a request really cost (TBucketCostHeader NAME).
 *
 * A fixed TBucketCost is a guess; the application knows better afterwards
 * and reports the real cost (0 to 1e9) in the response header NAME or the
 * request note "tbucket-cost". The decision records what settling needs
 * (tbucket_settle_note); an output filter just before HTTP_HEADER takes
 * the header out of the final response, so it never reaches the client;
 * log_transaction, after the last byte went, settles the difference once
 * for the whole chain (tb_client_settle): in the server's lease when that
 * covers it, else in one script call, into debt down to -capacity. A
 * refused request, a failure-policy answer and the window algorithms
 * settle nothing. docs/design.md ("File notes") says why log_transaction
 * is the place. */
#include "apr_lib.h"
#include "apr_strings.h"

#include "httpd.h"
#include "http_config.h"
#include "http_core.h"
#include "http_log.h"
#include "http_protocol.h"
#include "http_request.h"
#include "util_filter.h"

#include "mod_tbucket.h"

APLOG_USE_MODULE(tbucket);

#define COST_NOTE "tbucket-cost"
#define COST_FILTER "TBUCKET_COST"

struct tbucket_settle {
    const char *header;        /* TBucketCostHeader's NAME.            */
    const char *value;         /* Its value in the final response.     */
    tbucket_srv_conf *sc;      /* The deciding server's.               */
    const char *skip;          /* Why nothing can be settled, or NULL. */
    double charged;            /* The cost each bucket was charged.    */
    tb_request_t q;            /* The decision's request, copied.      */
    tb_take_t takes[TB_MAX_BUCKETS];
};

static ap_filter_rec_t *cost_filter_handle;

tbucket_settle *tbucket_settle_note(request_rec *root,
                                    const tbucket_dir_conf *dc,
                                    tbucket_srv_conf *sc,
                                    const tb_request_t *q,
                                    const tb_result_t *res)
{
    tbucket_settle *st;

    if (!dc->cost_header || !*dc->cost_header) {
        return NULL;
    }
    st = apr_pcalloc(root->pool, sizeof(*st));
    st->header = dc->cost_header;
    st->sc = sc;
    st->charged = q->takes[0].cost;
    st->q = *q;
    memcpy(st->takes, q->takes, (size_t)q->ntakes * sizeof(*q->takes));
    st->q.takes = st->takes;
    st->q.key = apr_pstrmemdup(root->pool, q->key, q->key_len);
    /* The lease size stays: the settlement may be made in the lease. */
    st->q.lease_back = 0;
    st->q.now_ms = NULL;
    if (!res->allowed) {
        st->skip = "the request was refused";
    }
    else if (res->source != TB_SRC_REDIS && res->source != TB_SRC_LEASE) {
        st->skip = "the failure policy decided it";
    }
    else if (q->algo != TB_ALGO_TOKEN_BUCKET && q->algo != TB_ALGO_GCRA) {
        st->skip = apr_pstrcat(root->pool, "TBucketAlgorithm ",
                               tb_algo_name(q->algo), " keeps what it "
                               "charged", NULL);
    }
    return st;
}

/* The cost a response reported: a decimal from 0 to 1e9 ("12", "0.25"),
 * spaces or tabs around it allowed; -1 for anything else (a sign, an
 * exponent, a list, hex, inf). */
static double parse_cost(const char *s)
{
    const char *p, *start;
    double v;
    char *end;

    while (*s == ' ' || *s == '\t') {
        s++;
    }
    start = p = s;
    while (apr_isdigit(*p)) {
        p++;
    }
    if (p == start || p - start > 10) {
        return -1;
    }
    if (*p == '.') {
        const char *frac = ++p;

        while (apr_isdigit(*p)) {
            p++;
        }
        if (p == frac) {
            return -1;
        }
    }
    while (*p == ' ' || *p == '\t') {
        p++;
    }
    if (*p) {
        return -1;
    }
    v = tb_strtod_c(start, &end);
    return v >= 0 && v <= TB_MAX_CAPACITY ? v : -1;
}

/* The record of r's chain, or NULL. r is never a sub-request here. */
static tbucket_settle *chain_settle(request_rec *r)
{
    const tbucket_req *rq;
    int hops;

    for (hops = 0; r->prev && hops < 64; hops++) {
        r = r->prev;
    }
    rq = ap_get_module_config(r->request_config, &tbucket_module);
    return rq ? rq->settle : NULL;
}

/* Take the header out of the response before the HTTP header filter
 * sends it, keeping its value for the settlement; then step aside. */
static apr_status_t cost_filter(ap_filter_t *f, apr_bucket_brigade *bb)
{
    request_rec *r = f->r;
    const char *name = f->ctx;
    const char *v = apr_table_get(r->headers_out, name);
    tbucket_settle *st = chain_settle(r);

    if (!v) {
        v = apr_table_get(r->err_headers_out, name);
    }
    apr_table_unset(r->headers_out, name);
    apr_table_unset(r->err_headers_out, name);
    if (st && v) {
        st->value = apr_pstrdup(r->pool, v);
    }
    ap_remove_output_filter(f);
    return ap_pass_brigade(f->next, bb);
}

/* Every request that runs a handler (internal redirects and
 * ErrorDocument requests too) gets the filter where a cost header
 * applies: the deciding scope's, else this request's own. */
static void insert_filter(request_rec *r)
{
    const tbucket_settle *st;
    const tbucket_dir_conf *dc;
    const char *name;

    if (r->main) {
        return;
    }
    st = chain_settle(r);
    dc = ap_get_module_config(r->per_dir_config, &tbucket_module);
    name = st ? st->header : dc->cost_header;
    if (name && *name) {
        ap_add_output_filter_handle(cost_filter_handle, (void *)name, r,
                                    r->connection);
    }
}

/* Settle st for the chain of r (its first request) by delta tokens. */
static void settle(request_rec *r, tbucket_settle *st, double cost,
                   double delta)
{
    tbucket_srv_conf *sc = st->sc;
    tb_result_t res;

    if (tb_client_settle(sc->client->tb, &st->q, cost, &res) != TB_OK) {
        tbucket_note_breaker(r, sc->client, &res, sc);
        tbucket_count_cost(sc, TBUCKET_COST_UNSETTLED, 0);
        ap_log_rerror(APLOG_MARK, APLOG_DEBUG, 0, r, TBLOGNO(00404)
                      "cost %g reported for %s, %g charged: not settled "
                      "(%s)", cost, r->uri, st->charged,
                      tb_err_name(res.err));
        return;
    }
    tbucket_count_cost(sc, TBUCKET_COST_SETTLED, delta);
    if (res.source == TB_SRC_LEASE) {
        ap_log_rerror(APLOG_MARK, APLOG_DEBUG, 0, r, TBLOGNO(00403)
                      "cost %g reported for %s, %g charged: settled in "
                      "the server's lease", cost, r->uri, st->charged);
        return;
    }
    tbucket_note_breaker(r, sc->client, &res, sc);
    ap_log_rerror(APLOG_MARK, APLOG_DEBUG, 0, r, TBLOGNO(00405)
                  "cost %g reported for %s, %g charged: settled on %d "
                  "bucket(s), %s (%" APR_INT64_T_FMT " ms to pay)", cost,
                  r->uri, st->charged, st->q.ntakes,
                  res.allowed ? "no debt" : "in debt", res.retry_ms);
}

/* log_transaction: r is the first request of its chain. */
static int settle_chain(request_rec *r)
{
    const tbucket_req *rq = ap_get_module_config(r->request_config,
                                                 &tbucket_module);
    tbucket_settle *st = rq ? rq->settle : NULL;
    request_rec *last = r;
    const char *text, *from = COST_NOTE;
    double cost, delta;
    int hops;

    if (r->main || !st) {
        return DECLINED;
    }
    for (hops = 0; last->next && hops < 64; hops++) {
        last = last->next;
    }
    /* The note wins: it may be set after the headers went out. */
    text = apr_table_get(last->notes, COST_NOTE);
    if (!text) {
        text = st->value;
        from = st->header;
    }
    if (!text) {
        return DECLINED;
    }
    cost = parse_cost(text);
    if (cost < 0) {
        tbucket_count_cost(st->sc, TBUCKET_COST_INVALID, 0);
        ap_log_rerror(APLOG_MARK, APLOG_DEBUG, 0, r, TBLOGNO(00401)
                      "%s: ignored the cost '%.40s' reported for %s: not "
                      "a number from 0 to 1e9", from,
                      ap_escape_logitem(r->pool, text), r->uri);
        return DECLINED;
    }
    tbucket_count_cost(st->sc, TBUCKET_COST_REPORTED, 0);
    delta = cost - st->charged;
    if (delta == 0) {
        return DECLINED;
    }
    if (st->skip) {
        tbucket_count_cost(st->sc, TBUCKET_COST_UNSETTLED, 0);
        ap_log_rerror(APLOG_MARK, APLOG_DEBUG, 0, r, TBLOGNO(00402)
                      "cost %g reported for %s, %g charged: not settled, "
                      "%s", cost, r->uri, st->charged, st->skip);
        return DECLINED;
    }
    settle(r, st, cost, delta);
    return DECLINED;
}

void tbucket_settle_register(void)
{
    /* Just before HTTP_HEADER (AP_FTYPE_PROTOCOL): after every content
     * filter that may read or set headers (mod_headers included), so
     * the header is there to take and nothing adds it back. */
    cost_filter_handle = ap_register_output_filter(
        COST_FILTER, cost_filter, NULL, (ap_filter_type)(AP_FTYPE_PROTOCOL
                                                         - 1));
    ap_hook_insert_filter(insert_filter, NULL, NULL, APR_HOOK_MIDDLE);
    /* Before mod_log_config's (MIDDLE): the settlement is made by the
     * time the access log line is written. */
    ap_hook_log_transaction(settle_chain, NULL, NULL, APR_HOOK_FIRST);
}
