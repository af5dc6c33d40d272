/* tbucket_charge.c -- count=: what a request's limits with a key of
 * their own cost once its response's status is known.
 *
 * Before the handler a counted limit takes its cost as a reservation
 * (tbucket_limits_takes), so parallel attempts see each other; once the
 * final status is known a protocol filter keeps the reservations whose
 * limit counts the status and gives the others back, before the first
 * byte leaves. A protocol-level filter survives internal redirects and
 * ErrorDocument and sees error responses made before the handler. A
 * success under known= marks the client known (tbucket_known.c) from a
 * filter of its own, before the response's headers are made. */
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

#define CHARGE_FILTER "TBUCKET_CHARGE"
#define KNOWN_FILTER "TBUCKET_KNOWN"

static ap_filter_rec_t *charge_filter_handle;
static ap_filter_rec_t *known_filter_handle;

/* The reservations of a chain's count= rules, settled by the status;
 * kept in the root's pool. */
struct tbucket_charge {
    tbucket_srv_conf *sc;
    tb_request_t q;                   /* Prefix, clock: the decision's. */
    int n;                            /* 0 once settled or cancelled.   */
    int marked;                       /* Known clients marked already.  */
    tb_take_t takes[TBUCKET_MAX_LIMITS];
    const tbucket_limit *which[TBUCKET_MAX_LIMITS];
    const char *base_key[TBUCKET_MAX_LIMITS]; /* known= rules' K.       */
};

/* ---- count=: reservations settled by the status --------------------- */

tbucket_charge *tbucket_charge_reserve(request_rec *root,
                                      tbucket_srv_conf *sc,
                                      const tbucket_decision *d,
                                      tbucket_charge *ch)
{
    const tb_request_t *q = &d->q;
    const tbucket_limit *const *which = d->which;
    int i, added = 0;

    for (i = 0; i < q->ntakes; i++) {
        if (!which[i] || !which[i]->counted) {
            continue;
        }
        if (!ch) {
            /* Its arrays are filled up to n as they are used: only the
             * head is zeroed (a request pays for what it keeps). */
            ch = apr_palloc(root->pool, sizeof(*ch));
            memset(ch, 0, APR_OFFSETOF(tbucket_charge, takes));
            ch->sc = sc;
            ch->q.prefix = q->prefix;
            ch->q.now_ms = q->now_ms;
            added = 1;
        }
        if (ch->n >= TBUCKET_MAX_LIMITS) {
            break;
        }
        ch->takes[ch->n] = q->takes[i];
        ch->takes[ch->n].key = apr_pstrmemdup(root->pool, q->takes[i].key,
                                              q->takes[i].key_len);
        ch->takes[ch->n].ban_ms = 0;
        ch->base_key[ch->n] = d->base_key[i]
                              ? apr_pstrdup(root->pool, d->base_key[i]) : NULL;
        ch->which[ch->n++] = which[i];
    }
    if (added) {
        ap_add_output_filter_handle(charge_filter_handle, ch, root,
                                    root->connection);
        ap_add_output_filter_handle(known_filter_handle, ch, root,
                                    root->connection);
    }
    return ch;
}

void tbucket_charge_cancel(tbucket_charge *ch)
{
    if (ch) {
        ch->n = 0;
    }
}

static int counts(const tbucket_limit *ru, int status)
{
    return status >= 100 && status <= 599
           && (ru->count[(status - 100) / 8] & (1u << ((status - 100) % 8)));
}

/* Settle ch by status: a reservation whose rule counts the status is
 * kept (no call), the others are given back in one call per slot. */
static void settle(request_rec *r, tbucket_charge *ch, int status)
{
    tb_take_t takes[TBUCKET_MAX_LIMITS];
    const tbucket_limit *which[TBUCKET_MAX_LIMITS];
    tb_request_t q = ch->q;
    tb_result_t res;
    tbucket_client *c = ch->sc->client;
    int i, n = 0;

    for (i = 0; i < ch->n; i++) {
        if (counts(ch->which[i], status)) {
            tbucket_tally_charged(ch->which[i]);
        }
        else {
            which[n] = ch->which[i];
            takes[n++] = ch->takes[i];
        }
    }
    ch->n = 0;
    if (!n || !c || !c->tb) {
        return;
    }
    q.takes = takes;
    q.ntakes = n;
    if (tb_client_refund(c->tb, &q, &res) != TB_OK) {
        tbucket_note_breaker(r, c, &res, ch->sc);
        ap_log_rerror(APLOG_MARK, APLOG_DEBUG, 0, r, TBLOGNO(00172)
                      "status %d: %d reservation(s) not given back (%s: "
                      "%s)", status, n, tb_err_name(res.err), c->tb->errstr);
        return;
    }
    tbucket_note_breaker(r, c, &res, ch->sc);
    ap_log_rerror(APLOG_MARK, APLOG_DEBUG, 0, r, TBLOGNO(00173)
                  "status %d: gave back %d reservation(s), first %s", status,
                  n, which[0]->name);
}

/* The first brigade of the final response: its status is known and no
 * byte of it has left. Settle, then step aside. */
static apr_status_t charge_filter(ap_filter_t *f, apr_bucket_brigade *bb)
{
    settle(f->r, f->ctx, f->r->status);
    ap_remove_output_filter(f);
    return ap_pass_brigade(f->next, bb);
}

/* The first brigade of a response of the chain, before its headers are
 * made: a known= rule whose status this is not counted and is under 400
 * (a success) makes
 * the client known for its key, by a Set-Cookie the response still
 * carries. */
static apr_status_t known_filter(ap_filter_t *f, apr_bucket_brigade *bb)
{
    tbucket_charge *ch = f->ctx;
    int i;

    for (i = 0; i < ch->n && !ch->marked; i++) {
        /* A success: a status the rule does not count, and not an
         * error (a 401, a 500 is never a login). */
        if (ch->base_key[i] && f->r->status < 400
            && !counts(ch->which[i], f->r->status)) {
            tbucket_known_mark(f->r, ch->which[i], ch->sc, ch->base_key[i]);
        }
    }
    ch->marked = 1;
    ap_remove_output_filter(f);
    return ap_pass_brigade(f->next, bb);
}

/* Every later request of a chain with known= reservations gets the
 * filter again: an internal redirect's request starts from the
 * connection's filters. */
static void insert_known(request_rec *r)
{
    const tbucket_req *rq;
    int i;

    if (r->main || !r->prev) {
        return;
    }
    rq = ap_get_module_config(tbucket_chain_root(r)->request_config,
                              &tbucket_module);
    for (i = 0; rq && rq->charge && !rq->charge->marked
                && i < rq->charge->n; i++) {
        if (rq->charge->base_key[i]) {
            ap_add_output_filter_handle(known_filter_handle, rq->charge, r,
                                        r->connection);
            return;
        }
    }
}

void tbucket_charge_no_ranges(request_rec *r, const tbucket_dir_conf *dc)
{
    /* httpd's byte-range filter would turn the status count= judges (a
     * failed login's 200) into a 206 before the filter sees it; the
     * scope's pages are logins, not downloads to resume. */
    if (dc->limits_counted) {
        apr_table_unset(r->headers_in, "Range");
        apr_table_unset(r->headers_in, "Request-Range");
        apr_table_unset(r->headers_in, "If-Range");
    }
}

void tbucket_charge_register(void)
{
    /* After HTTP_HEADER (AP_FTYPE_PROTOCOL) and before the connection's
     * filters: the status is final, nothing has been sent. (A filter of
     * httpd's own type goes after BYTERANGE, measured: no use; the
     * byte ranges are kept off by tbucket_charge_no_ranges instead.) */
    charge_filter_handle = ap_register_output_filter(
        CHARGE_FILTER, charge_filter, NULL,
        (ap_filter_type)(AP_FTYPE_PROTOCOL + 1));
    /* Before the response's headers are made, to add a cookie to them;
     * a request filter, so each request of a chain gets its own. */
    known_filter_handle = ap_register_output_filter(
        KNOWN_FILTER, known_filter, NULL, AP_FTYPE_CONTENT_SET);
    ap_hook_insert_filter(insert_known, NULL, NULL, APR_HOOK_MIDDLE);
    tbucket_form_register();
}
