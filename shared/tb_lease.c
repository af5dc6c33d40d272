/* tb_lease.c -- a decision made with a lease: paid from the host's lease
 * table, or sized, asked for in the call and kept.
 *
 * A host that gives its client a lease table (tb_options_t.leases,
 * memory its processes share) and a request a lease size
 * (tb_request_t.lease, TBucketLease N) has tb_client_run() try the table
 * first: a request the key's lease holds is allowed with no Redis call
 * (TB_SRC_LEASE). Otherwise the call that decides also takes the next
 * lease, sized by the key's traffic on this host (tb_lease_plan: about
 * one ttl of it, at least the cost, at most N), and gives back the
 * unspent tokens of the key's expired lease in the same call. What the
 * grant brings beyond the cost is kept as the lease; a table drained
 * since the plan (the host is stopping) keeps nothing, and the caller
 * gives those tokens back.
 *
 * Pure table logic, no I/O: tb_client.c makes the calls (the decision,
 * and the give-back of tokens the table would not keep) with what this
 * file prepares and reads. A lease is whole tokens of one main token
 * bucket with a whole cost of at least one; any other request is
 * decided without one.
 */
#include <math.h>
#include <string.h>

#include "tb_int.h"

/* May q be decided with a lease of the table? */
static int lease_applies(const tb_request_t *q)
{
    return tb__lease_shape(q) && !q->concurrency
           && q->lease_ttl_ms >= 0 && q->lease_ttl_ms <= 86400000;
}

/* The key of q's (shard's) bucket and its limit, as the lease table
 * knows them: 0 when q cannot have one. */
static int lease_info(const tb_request_t *q, char *rkey,
                      tb__lease_step_t *st)
{
    const tb_take_t *take = &q->takes[0];
    int k = q->shards > 1 ? q->shards : 1;

    if (!tb_key_build_shard(q->prefix, q->key, q->key_len,
                            k > 1 ? q->shard : -1, NULL, rkey)) {
        return 0;
    }
    st->info.key = rkey;
    st->info.limit.capacity = take->limit.capacity / k;
    st->info.limit.rate_per_sec = take->limit.rate_per_sec / k;
    st->info.ttl_ms = q->lease_ttl_ms ? q->lease_ttl_ms
                                      : TB_LEASE_TTL_MS;
    return 1;
}

int tb__lease_begin(const tb__leases_t *ls, const tb_request_t *q,
                    tb__lease_step_t *st, tb_result_t *res)
{
    const tb_take_t *take;
    double left, max;

    memset(st, 0, sizeof(*st));
    if (!ls->table || tb_lease_epoch(ls->table) != ls->epoch
        || !lease_applies(q) || !lease_info(q, st->rkey, st)) {
        return TB__LEASE_NONE;
    }
    take = &q->takes[0];
    st->info.owner = ls->owner;
    st->now_ms = tb_clock_now_us() / 1000;
    if (tb_lease_spend(ls->table, st->rkey, take->cost, st->now_ms, &left)
        == 1) {
        memset(res, 0, sizeof(*res));
        res->allowed = 1;
        res->remaining = (int64_t)left;
        res->limit = st->info.limit.capacity;
        res->source = TB_SRC_LEASE;
        return TB__LEASE_PAID;
    }
    max = q->lease > take->cost ? q->lease : take->cost;
    if (tb_lease_plan(ls->table, &st->info, take->cost, max, st->now_ms,
                      &st->plan) != TB_OK) {
        return TB__LEASE_NONE;
    }
    return TB__LEASE_CALL;
}

double tb__lease_end(const tb__leases_t *ls, const tb_request_t *q,
                     const tb__lease_step_t *st, tb_result_t *res)
{
    double extra, give = 0;

    if (res->source != TB_SRC_REDIS) {
        /* Redis took nothing back and granted nothing: the expired
         * lease's tokens stay this host's. */
        res->granted = 0;
        if (st->plan.back > 0
            && tb_lease_store(ls->table, &st->info, &st->plan, st->plan.back,
                              st->now_ms) != 1) {
            give = st->plan.back;
        }
        return give;
    }
    res->lease_returned = st->plan.back;
    extra = (double)res->granted - q->takes[0].cost;
    if (res->granted > 0 && extra > 0) {
        if (tb_lease_store(ls->table, &st->info, &st->plan, extra,
                           st->now_ms) == 1) {
            /* What this host may still spend: the bucket's remainder
             * and its own. */
            res->remaining += (int64_t)extra;
        }
        else {
            give = extra;
        }
    }
    return give;
}

int tb__lease_settle(const tb__leases_t *ls, const tb_request_t *q,
                     double cost, tb_result_t *res)
{
    tb__lease_step_t st;
    double delta, left;
    int64_t now_ms;
    int ok;

    memset(&st, 0, sizeof(st));
    if (!ls->table || tb_lease_epoch(ls->table) != ls->epoch
        || !lease_applies(q) || !lease_info(q, st.rkey, &st)) {
        return 0;
    }
    delta = cost - q->takes[0].cost;
    now_ms = tb_clock_now_us() / 1000;
    ok = delta > 0 ? tb_lease_spend(ls->table, st.rkey, delta, now_ms,
                                    &left) == 1
                   : tb_lease_credit(ls->table, st.rkey, -delta, now_ms)
                         == 1;
    if (!ok) {
        return 0;
    }
    memset(res, 0, sizeof(*res));
    res->allowed = 1;
    res->remaining = -1;
    res->source = TB_SRC_LEASE;
    return 1;
}
