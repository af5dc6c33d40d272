/* tbucket_answer.c -- how a request is told what the shared limit
 * decided: the X-RateLimit-* and IETF fields of the bucket that bound the
 * decision, the refusal (429 with Retry-After and a JSON body naming a
 * refusing TBucketRule, 403 for a cost that never fits, each with httpd's
 * error filters), and the refusal line TB00160 that fail2ban reads (or
 * TB00162 and TB00163 for refusals that are not the client's doing). */
#include "apr_strings.h"

#include "httpd.h"
#include "http_config.h"
#include "http_core.h"
#include "http_log.h"
#include "http_protocol.h"
#include "http_request.h"
#include "mod_core.h"

#include "mod_tbucket.h"

APLOG_USE_MODULE(tbucket);

static apr_int64_t ceil_div(double a, double b)
{
    double q = a / b;
    apr_int64_t n = (apr_int64_t)q;

    return (double)n < q ? n + 1 : n;
}

/* X-RateLimit-* and/or the IETF draft's RateLimit-Policy / RateLimit, in
 * err_headers_out so they survive error responses, CGI output and
 * internal redirects (which share err_headers_out). */
void tbucket_limit_headers(request_rec *r, const tbucket_dir_conf *dc,
                        const tb_take_t *takes, const tb_result_t *res,
                        apr_int64_t retry_s)
{
    int mode = dc->headers == -1 ? TBUCKET_HDR_LEGACY : dc->headers;
    const tb_take_t *b = &takes[res->binding];
    /* While the local failure policy decides, it decides on this
     * server's share of the bucket: the headers describe that one. */
    double share = res->source == TB_SRC_LOCAL && res->limit > 0
                   && res->limit < b->limit.capacity
                   ? res->limit / b->limit.capacity : 1;
    tb_limit_t lim = { b->limit.capacity * share,
                       b->limit.rate_per_sec * share };
    apr_int64_t cap = (apr_int64_t)lim.capacity;
    apr_int64_t left = res->remaining > 0 ? res->remaining : 0;
    apr_int64_t t;

    if (left > cap) {
        left = cap;
    }
    if (mode == TBUCKET_HDR_LEGACY || mode == TBUCKET_HDR_BOTH) {
        apr_table_setn(r->err_headers_out, "X-RateLimit-Limit",
                       apr_psprintf(r->pool, "%" APR_INT64_T_FMT, cap));
        apr_table_setn(r->err_headers_out, "X-RateLimit-Remaining",
                       apr_psprintf(r->pool, "%" APR_INT64_T_FMT, left));
    }
    if (mode == TBUCKET_HDR_IETF || mode == TBUCKET_HDR_BOTH) {
        const char *name = b->name ? b->name : "default";

        /* t: seconds until the bucket is full again, or the wait. */
        t = retry_s > 0 ? retry_s
                        : ceil_div((double)(cap - left), lim.rate_per_sec);
        apr_table_setn(r->err_headers_out, "RateLimit-Policy",
                       apr_psprintf(r->pool, "\"%s\";q=%" APR_INT64_T_FMT
                                    ";w=%" APR_INT64_T_FMT, name, cap,
                                    ceil_div(lim.capacity,
                                             lim.rate_per_sec)));
        apr_table_setn(r->err_headers_out, "RateLimit",
                       apr_psprintf(r->pool, "\"%s\";r=%" APR_INT64_T_FMT
                                    ";t=%" APR_INT64_T_FMT, name, left, t));
    }
}

/* Answer the request here with a small JSON body, unless an ErrorDocument
 * is set for the status, in which case httpd's error path serves it. */
int tbucket_respond(request_rec *r, int status, const char *body)
{
    if (ap_response_code_string(r, ap_index_of_response(status))) {
        return status;
    }
    /* Status first: the input filter then sends no 100-continue. */
    r->status = status;
    ap_discard_request_body(r);
    /* We answer outside httpd's error path, so add what it would add:
     * the filters of "Header always" (CORS, HSTS) and friends. */
    ap_run_insert_error_filter(r);
    ap_set_content_type(r, "application/json");
    ap_set_content_length(r, (apr_off_t)strlen(body));
    if (!r->header_only) {
        ap_rputs(body, r);
    }
    return DONE;
}

/* The TBucketRule that bound a refusal of d, or NULL. */
const tbucket_limit *tbucket_refusing_rule(const tbucket_decision *d)
{
    if (d->res.allowed || d->by_conc || !d->q.ntakes
        || d->res.binding < 0 || d->res.binding >= d->q.ntakes) {
        return NULL;
    }
    /* A limit keyed by TBucketKey refuses as the scope's own bucket
     * does: the key is the request's, the answer a plain 429. */
    return d->which[d->res.binding] && d->which[d->res.binding]->own_key
           ? d->which[d->res.binding] : NULL;
}

/* The key d's refusal is about, as the status page and the log show it:
 * the refusing rule's key, else the request's (ip: it is the client's
 * address under the IP prefix). */
size_t tbucket_shown_key(const tbucket_srv_conf *sc, const tbucket_decision *d,
                        char *out)
{
    const tbucket_limit *ru = tbucket_refusing_rule(d);

    if (ru) {
        const tb_take_t *t = &d->takes[d->res.binding];

        return tb_key_show(t->key, t->key_len, 0, out);
    }
    return tb_key_show(d->q.key, d->q.key_len, d->q.prefix == sc->ip_prefix,
                       out);
}

/* The name of the limit that decided d: the binding bucket's route,
 * NULL for the main bucket, or "concurrency" when the key's slots did. */
const char *tbucket_binding_name(const tbucket_decision *d)
{
    if (!d->q.ntakes || d->by_conc) {
        return "concurrency";
    }
    return d->takes[d->res.binding].name;
}

/* d's key as the status page shows it, for a log line: sanitised, so
 * it holds no control byte or space; its '"', '\\' and '%' are written
 * %22, %5C and %25, since httpd doubles every backslash of a message:
 * nothing a client sends can end the field or forge another one. */
static const char *quoted_key(request_rec *r, const tbucket_srv_conf *sc,
                              const tbucket_decision *d)
{
    char key[TB_TOPK_KEY_LEN], *quoted = apr_palloc(r->pool,
                                                     3 * TB_TOPK_KEY_LEN);
    size_t i, n = tbucket_shown_key(sc, d, key), q = 0;

    for (i = 0; i < n; i++) {
        if (key[i] == '"' || key[i] == '\\' || key[i] == '%') {
            q += apr_snprintf(quoted + q, 4, "%%%02X", (unsigned)key[i]);
        }
        else {
            quoted[q++] = key[i];
        }
    }
    quoted[q] = '\0';
    return quoted;
}

/* The refusal line (TB00160), at TBucketRefusalLog's level, for tools
 * such as fail2ban: a stable format, documented in docs/reference.txt,
 * whose values are the client's address (r->useragent_ip: the real
 * client behind a trusted proxy, with mod_remoteip), the network its
 * limit counts (net=: the address, or an IPv6 client's TBucketIPv6Prefix
 * network, which a client rotating addresses inside it shares, so a
 * ban must be of the network), the key as the status page shows it,
 * quoted, the limit, the virtual host and the wait, then the refusing
 * TBucketRule and whether its ban refused. The failure policy's
 * refusals (Redis could not decide) are not the client's doing: the
 * local policy's are logged as TB00163, which the fail2ban filter does
 * not match, and the closed policy's not at all. Nor are refusals by a
 * TBucketRule or a TBucketKey whose key is a constant (every client
 * shares the bucket, so one client can empty it for all): TB00162, not
 * matched either. */
static void log_refusal(request_rec *r, const tbucket_srv_conf *sc,
                        const tbucket_dir_conf *dc,
                        const tbucket_decision *d)
{
    static const int level[TBUCKET_REFUSAL_LOGS] = {
        0, APLOG_NOTICE, APLOG_INFO, APLOG_DEBUG
    };
    const char *limit = tbucket_binding_name(d), *ip = r->useragent_ip;
    const tbucket_limit *ru = tbucket_refusing_rule(d);
    char net[TB_IP_KEY_LEN];

    if (sc->refusal_log <= TBUCKET_REFUSAL_LOG_OFF
        || sc->refusal_log >= TBUCKET_REFUSAL_LOGS
        || d->res.source == TB_SRC_CLOSED) {
        return;
    }
    /* httpd writes every notice whatever LogLevel says. */
    if (level[sc->refusal_log] != APLOG_NOTICE
        && !APLOG_R_IS_LEVEL(r, level[sc->refusal_log])) {
        return;
    }
    if (d->res.source == TB_SRC_LOCAL) {
        ap_log_rerror(APLOG_MARK, level[sc->refusal_log], 0, r,
                      TBLOGNO(00163) "fallback refused client=%s key=\"%s\" "
                      "(Redis could not decide: the local failure policy's "
                      "share of the limit, not the client's own doing)", ip,
                      quoted_key(r, sc, d));
        return;
    }
    if (ru ? ru->key_const : dc->key_const) {
        /* One bucket shared by every client is empty: whoever emptied
         * it, this client only came after. */
        ap_log_rerror(APLOG_MARK, level[sc->refusal_log], 0, r,
                      TBLOGNO(00162) "shared refused client=%s key=\"%s\" "
                      "vhost=\"%s\" retry_after=%" APR_INT64_T_FMT
                      "%s%s%s (a limit whose key is the same for every "
                      "client, not this client's own doing)", ip,
                      quoted_key(r, sc, d),
                      sc->vhost_name ? sc->vhost_name : "-", d->retry_s,
                      ru ? " rule=" : "", ru ? ru->name : "",
                      d->res.banned ? " banned" : "");
        return;
    }
    if (!ip || !tb_ip_key(ip, sc->ipv6_bits, net, sizeof(net))) {
        apr_cpystrn(net, ip ? ip : "-", sizeof(net));
    }
    ap_log_rerror(APLOG_MARK, level[sc->refusal_log], 0, r, TBLOGNO(00160)
                  "refused client=%s net=%s key=\"%s\" limit=\"%s\" "
                  "vhost=\"%s\" retry_after=%" APR_INT64_T_FMT "%s%s%s", ip,
                  net, quoted_key(r, sc, d), limit ? limit : "default",
                  sc->vhost_name ? sc->vhost_name : "-", d->retry_s,
                  ru ? " rule=" : "", ru ? ru->name : "",
                  d->res.banned ? " banned" : "");
}

/* Answer r, which the shared limit refused: 403 for a cost that never
 * fits, else 429 with Retry-After. */
int tbucket_refuse_shared(request_rec *r, const tbucket_dir_conf *dc,
                         const tbucket_srv_conf *sc, const tbucket_req *rq,
                         const tbucket_decision *d)
{
    if (d->cost_exceeded) {
        ap_log_rerror(APLOG_MARK, APLOG_INFO, 0, r, TBLOGNO(00111)
                      "refused %s: its cost %.0f exceeds the capacity %.0f "
                      "of a bucket it is charged to", r->uri, dc->cost,
                      d->res.limit);
        return tbucket_respond(r, HTTP_FORBIDDEN, apr_psprintf(r->pool,
                       "{\"error\":\"request cost exceeds the rate limit "
                       "capacity\",\"cost\":%.0f,\"capacity\":%.0f}\n",
                       dc->cost, d->res.limit));
    }
    log_refusal(r, sc, dc, d);
    apr_table_setn(r->err_headers_out, "Retry-After",
                   apr_psprintf(r->pool, "%" APR_INT64_T_FMT, d->retry_s));
    /* While the server is crowded, a refused client gives its worker
     * back (under prefork a kept-alive 429 holds a whole process). */
    if (tbucket_local_crowded(sc, apr_time_now())) {
        r->connection->keepalive = AP_CONN_CLOSE;
    }
    if (d->by_conc) {
        ap_log_rerror(APLOG_MARK, APLOG_DEBUG, 0, r, TBLOGNO(00120)
                      "refused %s: %" APR_INT64_T_FMT " of %d requests of "
                      "its key in flight (%s)", r->uri, d->res.in_flight,
                      dc->concurrency, tbucket_outcome_names[rq->outcome]);
        return tbucket_respond(r, HTTP_TOO_MANY_REQUESTS, apr_psprintf(r->pool,
                       "{\"error\":\"too many concurrent requests\","
                       "\"limit\":%d}\n", dc->concurrency));
    }
    ap_log_rerror(APLOG_MARK, APLOG_DEBUG, 0, r, TBLOGNO(00112)
                  "rate limited %s (%s), retry after %" APR_INT64_T_FMT " s",
                  r->uri, tbucket_outcome_names[rq->outcome], d->retry_s);
    if (rq->rule) {
        /* Names of limits with a key of their own are [A-Za-z0-9_-]:
         * nothing to escape. The field keeps its name, "rule": clients
         * parse this body, and an alias's answer stays byte for byte. */
        return tbucket_respond(r, HTTP_TOO_MANY_REQUESTS, apr_psprintf(r->pool,
                       "{\"error\":\"%s\",\"rule\":\"%s\","
                       "\"retry_after\":%" APR_INT64_T_FMT "}\n",
                       d->res.banned ? "banned" : "rate limited", rq->rule,
                       d->retry_s));
    }
    return tbucket_respond(r, HTTP_TOO_MANY_REQUESTS, apr_psprintf(r->pool,
                   "{\"error\":\"rate limited\",\"retry_after\":%"
                   APR_INT64_T_FMT "}\n", d->retry_s));
}

