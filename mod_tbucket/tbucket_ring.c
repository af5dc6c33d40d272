/* tbucket_ring.c -- the last 15 minutes of the whole server, in 90
 * slots of 10 seconds, in the shared memory segment.
 *
 * No counter is added on the request path: the segment's totals (every
 * vhost's outcomes, every Redis configuration's core counters and
 * latency histogram, every named limit's events) are already counted by
 * all children. The first decision of a slot, in whichever child, wins
 * a compare-and-swap on the ring's newest slot and copies those totals
 * into the slot's entry; a slot's figures are then the next snapshot's
 * totals minus its own. A slot in which no decision came has no entry
 * and, by construction, nothing to show (the Redis call of a slot's
 * first decision is made before the snapshot, and counts in the slot
 * before it). Every other decision pays a
 * coarse clock read, a load and a compare. The ring lives in the segment,
 * so the series survive a graceful restart; a reader checks each entry's
 * stamp before and after copying it, so a snapshot being written is
 * never read half done.
 */
#include <time.h>

#include "httpd.h"

#include "mod_tbucket.h"
#include "tbucket_shm_int.h"

const char *const tbucket_ring_names[TBUCKET_RS_COUNTS] = {
    "decisions", "refused_limit", "refused_named", "refused_ban", "shed",
    "refused_local", "fallback", "redis_errors", "breaker_opens",
    "breaker_skips", "bans_set", "redis_calls"
};

static uint64_t get(const uint64_t *c)
{
    return tb_stats_get(c);
}

/* The vhosts' part of the totals: decisions, refusals, fallbacks. */
static void totals_vhosts(const tbucket_shm *seg, tbucket_ring_totals *t)
{
    uint32_t i;
    int k;

    for (i = 0; i < seg->nvhosts && i < MAX_VHOSTS; i++) {
        const tbucket_vhost_stats *v = &seg->vhosts[i];

        for (k = 0; k < TBUCKET_OUTCOMES; k++) {
            t->v[TBUCKET_RS_DECISIONS] += get(&v->outcome[k]);
        }
        t->v[TBUCKET_RS_LIMIT] += get(&v->outcome[TBUCKET_OUT_REJECTED]);
        t->v[TBUCKET_RS_BAN] += get(&v->outcome[TBUCKET_OUT_BANNED]);
        t->v[TBUCKET_RS_FALLBACK] +=
            get(&v->outcome[TBUCKET_OUT_FALLBACK_OPEN])
            + get(&v->outcome[TBUCKET_OUT_FALLBACK_CLOSED])
            + get(&v->outcome[TBUCKET_OUT_FALLBACK_LOCAL]);
        for (k = 0; k < TBUCKET_PRIOS; k++) {
            t->v[TBUCKET_RS_SHED] += get(&v->shed[k]);
            t->v[TBUCKET_RS_LOCAL] += get(&v->local_refused[k]);
        }
    }
}

/* Copy the server's totals now. A refusal a named limit bound is a
 * "rejected" outcome too: it is moved from limit to named. */
static void totals_now(const tbucket_shm *seg, tbucket_ring_totals *t)
{
    uint32_t i;
    int k;

    memset(t, 0, sizeof(*t));
    totals_vhosts(seg, t);
    for (i = 0; i < seg->nclients && i < MAX_CLIENTS; i++) {
        const tb_stats_t *st = &seg->clients[i].stats;

        t->v[TBUCKET_RS_ERRORS] += get(&st->redis_errors);
        t->v[TBUCKET_RS_OPENS] += get(&st->breaker_opens);
        t->v[TBUCKET_RS_SKIPS] += get(&st->breaker_skips);
        for (k = 0; k < TB_LAT_BUCKETS; k++) {
            t->lat[k] += get(&st->lat_count[k]);
            t->v[TBUCKET_RS_CALLS] += get(&st->lat_count[k]);
        }
    }
    for (i = 0; i < seg->nnamed && i < MAX_COUNT_RECS; i++) {
        const uint64_t *o = seg->named[i].outcome;

        t->v[TBUCKET_RS_NAMED] += get(&o[TBUCKET_LIMIT_EV_REFUSED]);
        t->v[TBUCKET_RS_BANS_SET] += get(&o[TBUCKET_LIMIT_EV_BANS]);
    }
    /* Shadow refusals of a named limit are counted under it, but not as
     * "rejected": never below zero. */
    t->v[TBUCKET_RS_LIMIT] = t->v[TBUCKET_RS_LIMIT] > t->v[TBUCKET_RS_NAMED]
                             ? t->v[TBUCKET_RS_LIMIT] - t->v[TBUCKET_RS_NAMED]
                             : 0;
}

/* Write slot's entry: stamp 0 while copying, the slot number after. */
static void snapshot(tbucket_shm *seg, uint64_t slot)
{
    tbucket_ring *ring = &seg->ring;
    uint64_t *words = (uint64_t *)&ring->snap[slot % TBUCKET_RING_SLOTS];
    tbucket_ring_totals t;
    const uint64_t *src = (const uint64_t *)&t;
    size_t i;

    totals_now(seg, &t);
    __atomic_store_n(&ring->stamp[slot % TBUCKET_RING_SLOTS], 0,
                     __ATOMIC_RELAXED);
    __atomic_thread_fence(__ATOMIC_RELEASE);
    for (i = 0; i < sizeof(t) / 8; i++) {
        __atomic_store_n(&words[i], src[i], __ATOMIC_RELAXED);
    }
    __atomic_store_n(&ring->stamp[slot % TBUCKET_RING_SLOTS], slot,
                     __ATOMIC_RELEASE);
}

/* The first caller of a slot takes its snapshot; a clock that went back
 * leaves the ring alone. */
static void tick_at(tbucket_shm *seg, uint64_t slot)
{
    uint64_t old = __atomic_load_n(&seg->ring.newest, __ATOMIC_RELAXED);

    if (old >= slot) {
        return;
    }
    if (__atomic_compare_exchange_n(&seg->ring.newest, &old, slot, 0,
                                    __ATOMIC_ACQ_REL, __ATOMIC_RELAXED)) {
        snapshot(seg, slot);
    }
}

void tbucket_ring_tick(void)
{
    struct timespec ts;
    tbucket_shm *seg = tbucket_shm_seg;

    /* The coarse clock: a vDSO read of the last tick, no system call;
     * its few milliseconds of lag only move a slot's border. */
    if (!seg || clock_gettime(CLOCK_REALTIME_COARSE, &ts)) {
        return;
    }
    if ((uint64_t)ts.tv_sec / TBUCKET_RING_SLOT_S
        != __atomic_load_n(&seg->ring.newest, __ATOMIC_RELAXED)) {
        tick_at(seg, (uint64_t)ts.tv_sec / TBUCKET_RING_SLOT_S);
    }
}

/* Copy the entry of slot into *t: 1 when it holds that slot and was not
 * rewritten while copying. */
static int entry_get(const tbucket_ring *ring, uint64_t slot,
                     tbucket_ring_totals *t)
{
    const uint64_t *stamp = &ring->stamp[slot % TBUCKET_RING_SLOTS];
    const uint64_t *words = (const uint64_t *)&ring->snap[slot
                                                          % TBUCKET_RING_SLOTS];
    uint64_t *dst = (uint64_t *)t;
    size_t i;

    if (__atomic_load_n(stamp, __ATOMIC_ACQUIRE) != slot) {
        return 0;
    }
    for (i = 0; i < sizeof(*t) / 8; i++) {
        dst[i] = __atomic_load_n(&words[i], __ATOMIC_RELAXED);
    }
    __atomic_thread_fence(__ATOMIC_ACQUIRE);
    return __atomic_load_n(stamp, __ATOMIC_RELAXED) == slot;
}

/* The 99th percentile of a slot's calls, as the upper bound of the
 * histogram bucket it fell in: -1 without calls, 0 past the last. */
static int64_t p99_of(const uint64_t *lat, uint64_t calls)
{
    uint64_t need = calls - calls / 100, seen = 0;
    int k;

    if (!calls) {
        return -1;
    }
    for (k = 0; k < TB_LAT_BUCKETS - 1; k++) {
        seen += lat[k];
        if (seen >= need) {
            return tb_lat_bounds_us[k];
        }
    }
    return 0;
}

/* Slot i's figures: from its snapshot a to the next one b. */
static void slot_fill(tbucket_ring_series *out, int i,
                      const tbucket_ring_totals *a,
                      const tbucket_ring_totals *b)
{
    uint64_t lat[TB_LAT_BUCKETS];
    int k;

    for (k = 0; k < TBUCKET_RS_COUNTS; k++) {
        out->v[k][i] = b->v[k] > a->v[k] ? b->v[k] - a->v[k] : 0;
    }
    for (k = 0; k < TB_LAT_BUCKETS; k++) {
        lat[k] = b->lat[k] > a->lat[k] ? b->lat[k] - a->lat[k] : 0;
    }
    out->p99_us[i] = p99_of(lat, out->v[TBUCKET_RS_CALLS][i]);
    out->breaker[i] = out->v[TBUCKET_RS_OPENS][i]
                      || out->v[TBUCKET_RS_SKIPS][i];
}

/* The oldest slot any entry holds, or now's when none. */
static uint64_t first_slot(const tbucket_ring *ring, uint64_t now_slot)
{
    uint64_t first = now_slot, s;
    int i;

    for (i = 0; i < TBUCKET_RING_SLOTS; i++) {
        s = __atomic_load_n(&ring->stamp[i], __ATOMIC_ACQUIRE);
        if (s && s < first) {
            first = s;
        }
    }
    return first;
}

int tbucket_ring_read(apr_time_t now, tbucket_ring_series *out)
{
    tbucket_shm *seg = tbucket_shm_seg;
    uint64_t now_slot = (uint64_t)apr_time_sec(now) / TBUCKET_RING_SLOT_S;
    uint64_t base = now_slot - (TBUCKET_RING_SLOTS - 1), first;
    tbucket_ring_totals cur, next;
    int i;

    if (!seg) {
        return 0;
    }
    tick_at(seg, now_slot);
    memset(out, 0, sizeof(*out));
    out->start = apr_time_from_sec((apr_time_t)(base * TBUCKET_RING_SLOT_S));
    first = first_slot(&seg->ring, now_slot);
    totals_now(seg, &next);
    /* Newest first: each snapshot's figures run to the one after it. */
    for (i = TBUCKET_RING_SLOTS - 1; i >= 0; i--) {
        out->p99_us[i] = -1;
        out->known[i] = base + (uint64_t)i >= first;
        if (entry_get(&seg->ring, base + (uint64_t)i, &cur)) {
            slot_fill(out, i, &cur, &next);
            next = cur;
        }
    }
    return 1;
}
