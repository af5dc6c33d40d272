/* tb_breaker.c -- the circuit breaker in front of Redis.
 *
 * Closed: calls go through and consecutive failures are counted. After
 * `threshold` of them it opens: for `cooldown` no call is made at all and
 * the failure policy answers at once. Then it lets exactly one probe
 * through (half-open); the probe's success closes it, its failure opens
 * it for another cooldown. The states follow ap_proxy_retry_worker. Time is
 * passed in; the caller serialises access (tb_client.c holds its lock).
 */
#include "tb_int.h"

void tb_breaker_init(tb_breaker_t *b, int threshold, int64_t cooldown_ms)
{
    b->threshold = threshold < 1 ? 1 : threshold;
    b->cooldown_us = cooldown_ms < 0 ? 0 : cooldown_ms * 1000;
    b->state = TB_BREAKER_CLOSED;
    b->failures = 0;
    b->opened_at_us = 0;
    b->probe_in_flight = 0;
}

int tb_breaker_allow(tb_breaker_t *b, tb_monotime_us now)
{
    switch (b->state) {
    case TB_BREAKER_CLOSED:
        return 1;
    case TB_BREAKER_OPEN:
        if (now - b->opened_at_us < b->cooldown_us) {
            return 0;
        }
        b->state = TB_BREAKER_HALF_OPEN;
        b->probe_in_flight = 1;
        return 1;
    case TB_BREAKER_HALF_OPEN:
        /* One probe at a time; the others are answered by the policy. */
        if (b->probe_in_flight) {
            return 0;
        }
        b->probe_in_flight = 1;
        return 1;
    }
    return 0;
}

int tb_breaker_success(tb_breaker_t *b, tb_monotime_us now)
{
    int was_open = b->state != TB_BREAKER_CLOSED;

    (void)now;
    b->failures = 0;
    b->probe_in_flight = 0;
    b->state = TB_BREAKER_CLOSED;
    return was_open;
}

int tb_breaker_failure(tb_breaker_t *b, tb_monotime_us now)
{
    switch (b->state) {
    case TB_BREAKER_CLOSED:
        if (++b->failures < b->threshold) {
            return 0;
        }
        break;
    case TB_BREAKER_HALF_OPEN:
        b->probe_in_flight = 0;
        b->state = TB_BREAKER_OPEN;
        b->opened_at_us = now;
        return 0;   /* Still open: not a transition worth a log line. */
    case TB_BREAKER_OPEN:
        /* A call that was in flight when the breaker opened. */
        return 0;
    }
    b->state = TB_BREAKER_OPEN;
    b->opened_at_us = now;
    b->failures = 0;
    return 1;
}

int64_t tb_breaker_wait_ms(const tb_breaker_t *b, tb_monotime_us now)
{
    int64_t left;

    if (b->state != TB_BREAKER_OPEN) {
        return 0;
    }
    left = b->opened_at_us + b->cooldown_us - now;
    return left <= 0 ? 0 : (left + 999) / 1000;
}

const char *tb_breaker_state_name(tb_breaker_state_t s)
{
    switch (s) {
    case TB_BREAKER_CLOSED: return "closed";
    case TB_BREAKER_OPEN: return "open";
    case TB_BREAKER_HALF_OPEN: return "half-open";
    }
    return "unknown";
}
