/* tb_policy.c -- what a decision is when Redis could not make it.
 *
 * The host declares the policy; this file applies it. `open` allows and
 * reports the full capacity, `closed` rejects with the rest of the breaker's
 * cooldown (or a fixed retry-after) as the wait, and `local` decides on this
 * server's own bucket of capacity/replicas and rate/replicas from the
 * bounded table in tb_local.c, so N replicas together admit about the
 * shared limit while Redis is away; a concurrency limit gets there a
 * count of this server's slots against ceil(N/replicas). The breaker says
 * when to stop trying; the policy only says what an error means.
 */
#include <math.h>
#include <string.h>

#include "tb_int.h"

const char *const tb_policy_names[TB_POLICY_COUNT] = {
    "open", "closed", "local"
};

int tb_policy_parse(const char *s, tb_policy_t *p)
{
    int i = tb_name_index(tb_policy_names, TB_POLICY_COUNT, s, 0);

    if (i < 0 || !p) {
        return TB_ERR;
    }
    *p = (tb_policy_t)i;
    return TB_OK;
}

const char *tb_policy_name(tb_policy_t p)
{
    return tb_name_at(tb_policy_names, TB_POLICY_COUNT, (int)p);
}

/* The local policy's window of slot counts: half the ttl, so that a
 * slot is counted for between ttl/2 and ttl (tb_local.c). */
static int64_t conc_window_ms(const tb__conc_t *conc)
{
    return conc->ttl_ms >= 2 ? conc->ttl_ms / 2 : 1;
}

/* The local policy's slot of ceil(N / replicas) for f->conc into v and
 * res: 1 taken (*window says where), 0 full. */
static int local_slot(const tb__policy_t *pol, const tb__fallback_t *f,
                      int64_t *window, tb_verdict_t *v, tb_result_t *res)
{
    const tb__conc_t *conc = f->conc;
    int64_t share = ((int64_t)conc->limit + pol->replicas - 1)
                    / pol->replicas;
    int64_t held = 0;
    int got;

    got = tb_local_conc_take(pol->local, conc->key, share,
                             conc_window_ms(conc), f->now / 1000, window,
                             &held);
    res->in_flight = held;
    v->remaining = share - held;
    if (got == 0) {
        v->allowed = 0;
        v->retry_ms = TB_CONCURRENCY_RETRY_MS;
        res->refused_by = TB_LIMIT_CONCURRENCY;
    }
    return got;
}

/* The local policy: a slot of ceil(N / replicas) on this server first,
 * then the buckets of limit/replicas; a bucket that refuses gives the
 * slot back, so neither kind takes anything when the other refuses. */
static void local_answer(const tb__policy_t *pol, const tb__fallback_t *f,
                         tb_result_t *res)
{
    const tb__conc_t *conc = f->conc;
    int64_t now_ms = f->now / 1000, window = 0;
    tb_verdict_t v;
    int got = 1;

    memset(&v, 0, sizeof(v));
    v.allowed = 1;
    if (conc) {
        got = local_slot(pol, f, &window, &v, res);
    }
    if (got == 1 && f->n > 0) {
        if (tb_local_take(pol->local, f->keys, f->takes, f->n, pol->replicas,
                          now_ms, &v) != TB_OK) {
            got = -1;
        }
        else if (!v.allowed) {
            res->refused_by = TB_LIMIT_RATE;
            if (conc) {
                tb_local_conc_release(pol->local, conc->key,
                                      conc_window_ms(conc), window, now_ms);
                res->in_flight--;
            }
        }
    }
    if (got < 0) {
        /* No table (the host gave none): fail closed, not open. */
        memset(&v, 0, sizeof(v));
        v.retry_ms = pol->closed_retry_ms;
        res->refused_by = f->n > 0 ? TB_LIMIT_RATE : TB_LIMIT_CONCURRENCY;
    }
    else if (conc && v.allowed) {
        res->slot.kind = TB_SLOT_LOCAL;
        res->slot.window = window;
    }
    res->allowed = v.allowed;
    res->remaining = v.remaining;
    res->retry_ms = v.retry_ms;
    res->binding = v.binding;
    if (res->refused_by == TB_LIMIT_CONCURRENCY || f->n == 0) {
        res->limit = conc ? conc->limit : 0;
    }
    else {
        /* The bucket that decided: this server's share of the limit. */
        res->limit = f->takes[v.binding].limit.capacity / pol->replicas;
    }
}

void tb__policy_answer(const tb__policy_t *pol, const tb__fallback_t *f,
                       tb_result_t *res)
{
    const tb_take_t *takes = f->takes;
    int n = f->n;

    res->err = f->err;
    res->binding = 0;
    res->limit = n > 0 ? takes[0].limit.capacity : f->conc->limit;
    switch (pol->policy) {
    case TB_POLICY_OPEN:
        res->allowed = 1;
        res->remaining = n > 0 ? (int64_t)floor(takes[0].limit.capacity)
                               : f->conc->limit;
        res->retry_ms = 0;
        res->source = TB_SRC_OPEN;
        tb_stats_add(&pol->stats->fallback_open, 1);
        return;
    case TB_POLICY_CLOSED:
        res->allowed = 0;
        res->remaining = 0;
        res->retry_ms = pol->breaker_wait_ms > 0 ? pol->breaker_wait_ms
                                                 : pol->closed_retry_ms;
        res->refused_by = n > 0 ? TB_LIMIT_RATE : TB_LIMIT_CONCURRENCY;
        res->source = TB_SRC_CLOSED;
        tb_stats_add(&pol->stats->fallback_closed, 1);
        return;
    case TB_POLICY_LOCAL:
        local_answer(pol, f, res);
        res->source = TB_SRC_LOCAL;
        tb_stats_add(&pol->stats->fallback_local, 1);
        return;
    }
}

void tb__policy_release(const tb__policy_t *pol, const tb__conc_t *conc,
                        int64_t window, tb_monotime_us now)
{
    tb_local_conc_release(pol->local, conc->key, conc_window_ms(conc),
                          window, now / 1000);
}
