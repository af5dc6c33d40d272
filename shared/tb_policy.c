/* tb_policy.c -- what a decision is when Redis could not make it.
 *
 * The host declares the policy; this file applies it. `open` allows and
 * reports the full capacity, `closed` rejects with the rest of the breaker's
 * cooldown (or a fixed retry-after) as the wait, and `local` decides on this
 * server's own bucket of capacity/replicas and rate/replicas from the
 * bounded table in tb_local.c, so N replicas together admit about the
 * shared limit while Redis is away. The breaker says when to stop trying;
 * the policy only says what an error means.
 */
#include <math.h>
#include <string.h>

#include "tb_int.h"

int tb_policy_parse(const char *s, tb_policy_t *p)
{
    if (!s) {
        return TB_ERR;
    }
    if (strcmp(s, "open") == 0) {
        *p = TB_POLICY_OPEN;
    }
    else if (strcmp(s, "closed") == 0) {
        *p = TB_POLICY_CLOSED;
    }
    else if (strcmp(s, "local") == 0) {
        *p = TB_POLICY_LOCAL;
    }
    else {
        return TB_ERR;
    }
    return TB_OK;
}

const char *tb_policy_name(tb_policy_t p)
{
    switch (p) {
    case TB_POLICY_OPEN: return "open";
    case TB_POLICY_CLOSED: return "closed";
    case TB_POLICY_LOCAL: return "local";
    }
    return "unknown";
}

void tb__policy_answer(const tb__policy_t *pol, const char *const *keys,
                       const tb_take_t *takes, int n, int err,
                       tb_monotime_us now, tb_stats_t *stats,
                       tb_result_t *res)
{
    int i;

    res->err = err;
    res->binding = 0;
    res->limit = takes[0].limit.capacity;
    switch (pol->policy) {
    case TB_POLICY_OPEN:
        res->allowed = 1;
        res->remaining = (int64_t)floor(takes[0].limit.capacity);
        res->retry_ms = 0;
        res->source = TB_SRC_OPEN;
        tb_stats_add(&stats->fallback_open, 1);
        return;
    case TB_POLICY_CLOSED:
        res->allowed = 0;
        res->remaining = 0;
        res->retry_ms = pol->breaker_wait_ms > 0 ? pol->breaker_wait_ms
                                                 : pol->closed_retry_ms;
        res->source = TB_SRC_CLOSED;
        tb_stats_add(&stats->fallback_closed, 1);
        return;
    case TB_POLICY_LOCAL: {
        tb_limit_t lim[TB_MAX_BUCKETS];
        double cost[TB_MAX_BUCKETS];
        tb_verdict_t v;

        for (i = 0; i < n; i++) {
            lim[i] = takes[i].limit;
            cost[i] = takes[i].cost;
        }
        if (tb_local_take(pol->local, keys, lim, cost, n, pol->replicas,
                          now / 1000, &v) != TB_OK) {
            /* No table (the host gave none): fail closed, not open. */
            memset(&v, 0, sizeof(v));
            v.retry_ms = pol->closed_retry_ms;
        }
        res->allowed = v.allowed;
        res->remaining = v.remaining;
        res->retry_ms = v.retry_ms;
        res->binding = v.binding;
        res->limit = takes[v.binding].limit.capacity;
        res->source = TB_SRC_LOCAL;
        tb_stats_add(&stats->fallback_local, 1);
        return;
    }
    }
}
