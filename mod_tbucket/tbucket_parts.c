/* tbucket_parts.c -- a request's limits decided in parts, each when its
 * keys exist, all or nothing across them.
 *
 * What needs no body (TBucketLimit, routes, concurrency, rules on
 * addresses and headers) is decided first, so that a banned client is
 * refused before its upload is read; the rules on the form body follow
 * in a second call; the rules on keys that need authentication wait for
 * fixups. A part that refuses gives back what the earlier ones took (a
 * settlement of minus their cost, their concurrency slot released), as
 * one call's all or nothing would: the core's own undo across Cluster
 * slots does the same. mod_tbucket.c runs the parts; this file keeps
 * what one part took for the next and folds their results.
 */
#include "apr_strings.h"

#include "httpd.h"
#include "http_config.h"
#include "http_log.h"
#include "http_request.h"

#include "mod_tbucket.h"

APLOG_USE_MODULE(tbucket);

/* Whether dc's buckets keyed by TBucketKey (its own TBucketLimit, the
 * named limits without key=, TBucketConcurrency) are decided in parts:
 * with the limits on early keys, unless TBucketKey needs the user. */
int tbucket_main_in(const tbucket_dir_conf *dc, int parts)
{
    return (dc->limit_set || dc->limits_scoped || dc->concurrency > 0)
           && (parts & (dc->key_late ? TBUCKET_PART_LATE
                                     : TBUCKET_PART_EARLY));
}

/* Give back what an allowed decision of q took (its token buckets, its
 * concurrency slot): a later part of the chain refused it, and a refused
 * request is charged nothing. Best effort, as the core's own undo
 * across Cluster slots: a lease, a shard or a window keeps its take. */
void tbucket_undo_taken(tbucket_srv_conf *sc, const tb_request_t *q,
                       const tb_result_t *res)
{
    tb_result_t ignored;

    if (!res->allowed || res->source != TB_SRC_REDIS) {
        return;
    }
    if (q->ntakes && q->algo == TB_ALGO_TOKEN_BUCKET && q->shards <= 1) {
        tb_client_refund(sc->client->tb, q, &ignored);
    }
    if (res->slot.kind != TB_SLOT_NONE) {
        tb_client_release(sc->client->tb, q, &res->slot);
    }
}

/* Fold the result of the call for d's takes from `from` on (sub) into
 * d->res, the result of the takes before: the first refusal decides
 * (and what the earlier call took is given back), else the tightest
 * bucket binds. */
static void fold_part(tbucket_srv_conf *sc, tbucket_decision *d, int from,
                      const tb_request_t *sub, const tb_result_t *res)
{
    tb_request_t before = d->q;

    before.ntakes = from;
    if (!res->allowed) {
        tbucket_undo_taken(sc, &before, &d->res);
        d->res = *res;
        d->res.binding += from;
        d->res.banned = res->banned << from;
        d->res.bans_set = res->bans_set << from;
        return;
    }
    if (res->source != TB_SRC_REDIS) {
        d->res.source = res->source;
        d->res.err = res->err;
    }
    if (res->remaining < d->res.remaining) {
        d->res.remaining = res->remaining;
        d->res.binding = res->binding + from;
        d->res.limit = sub->takes[res->binding].limit.capacity;
    }
    d->res.bans_set |= res->bans_set << from;
    d->res.redis_us += res->redis_us;
}

/* Decide the form body's rules of dc for r, after d's takes (allowed,
 * or none yet): evaluating their keys reads the body. 1 when some
 * applied (d holds the whole decision). */
int tbucket_decide_body(request_rec *r, const tbucket_dir_conf *dc,
                       tbucket_srv_conf *sc, tbucket_decision *d)
{
    int from = d->q.ntakes;
    tb_request_t sub;
    tb_result_t res;

    if (tbucket_limits_takes(r, dc, sc, d, TBUCKET_PART_BODY, 0, NULL)
        == from) {
        return 0;
    }
    sub = d->q;
    sub.takes = d->takes + from;
    sub.ntakes = d->q.ntakes - from;
    sub.algo = TB_ALGO_TOKEN_BUCKET;
    sub.concurrency = 0;
    sub.shards = 0;
    sub.lease = 0;
    tb_client_run(sc->client->tb, &sub, &res);
    tbucket_note_call(r, sc, &res);
    if (from == 0) {
        d->res = res;
    }
    else {
        fold_part(sc, d, from, &sub, &res);
    }
    return 1;
}

/* Keep a copy of what an allowed decision d took (its request, its
 * takes, their keys) in root's pool, for a later part to give back. */
void tbucket_keep_taken(request_rec *root, tbucket_req *rq,
                       const tbucket_decision *d)
{
    tbucket_taken *t = apr_pcalloc(root->pool, sizeof(*t));
    int i;

    t->q = d->q;
    t->q.key = apr_pmemdup(root->pool, d->q.key, d->q.key_len);
    t->q.takes = t->takes;
    for (i = 0; i < d->q.ntakes; i++) {
        t->takes[i] = d->takes[i];
        if (d->takes[i].key) {
            t->takes[i].key = apr_pmemdup(root->pool, d->takes[i].key,
                                          d->takes[i].key_len);
        }
    }
    t->res = d->res;
    rq->taken = t;
}

/* Whether parts of dc are left for fixups, after check_access decided
 * the early and body parts. */
int tbucket_late_parts(const tbucket_dir_conf *dc)
{
    return dc->limits_late || (dc->key_late && tbucket_main_in(dc, TBUCKET_PART_LATE));
}
