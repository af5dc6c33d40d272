/* tb_adapt.c -- a concurrency cap that sets itself from the latency its
 * requests measure: a gradient limiter in caller memory, shared by every
 * process of a server.
 *
 * Samples (one per finished request) count into the current window's
 * histogram; the sample that finds the window old and full enough closes
 * it and moves the estimate by the gradient of the window's median
 * latency against the lowest latency seen without queueing (a median, so
 * that the one request in ten that is slow for reasons of its own does
 * not read as a queue). A rise shrinks the cap, latency
 * near that floor grows it, by at most a factor per window and smoothed.
 * Lock-free: adds and one claim word, so any process may sample and a
 * closer that dies loses one window, not the limiter. Why these bounds,
 * the probe and the constants: docs/design.md, "Caps that tune
 * themselves".
 */
#include <string.h>

#include "tables/tb_tables_int.h"

#define ADAPT_MAGIC 0x74626131u       /* "tba1" */

/* A window closes at the first sample after WIN_US with WIN_N samples,
 * after WIN_SLOW_US with 3, or after WIN_IDLE_US with 1. */
#define WIN_US 250000
#define WIN_N 8
#define WIN_SLOW_US 1000000
#define WIN_IDLE_US 5000000
/* Latency up to (1 + BUFFER) times the floor counts as no queueing. */
#define BUFFER 0.25
/* Requests one may queue beyond what the gradient allows. */
#define HEADROOM 1.0
#define GRADIENT_MIN 0.2
#define GRADIENT_MAX 2.0
/* The share of the way to a higher target a window moves the estimate
 * (a lower one is taken at once: a queue costs every request in it). */
#define SMOOTH 0.5
/* How far the estimate must pass the cap's next integer to move it, so
 * that an estimate near a half does not flip the cap every window. */
#define HYSTERESIS 0.6
/* A floor older than this is measured again (a probe) when the cap is
 * reached; a claim older than CLAIM_US is a dead closer's. */
#define PROBE_EVERY_US 30000000
#define PROBE_MAX_US 3000000
#define CLAIM_US 1000000
/* The histogram: 8 buckets an octave (12% wide at most) from 32 us over
 * 20 octaves (to about 34 s); faster and slower land in the ends. */
#define HIST_SUB 8
#define HIST_BASE_US 32
#define HIST_N 160

struct tb_adapt {
    uint32_t magic;
    uint32_t min, max;
    uint32_t cap;                     /* What takers use; atomic.       */
    uint64_t limit_milli;             /* The estimate x 1000.           */
    uint64_t floor_us;                /* Lowest latency without queue.  */
    uint64_t floor_at_us;             /* When it was last measured at
                                       * the bottom (0: never).         */
    uint64_t probe_from_us;           /* Probing since (0: not).        */
    uint64_t probe_p50_us;            /* The window that called it: its */
    uint32_t probe_peak;              /* median and peak in flight.     */
    uint32_t pad2;
    uint64_t claim_us;                /* The closer's claim time, 0.    */
    /* The current window: adds and a max, by any sampler. */
    uint64_t win_start_us;
    uint32_t win_n;
    uint32_t win_peak;
    uint32_t hist[HIST_N];
    /* The last window closed and the counts, for a view. */
    uint64_t last_us;
    uint32_t last_peak;
    uint32_t pad;
    uint64_t windows, ups, downs, probes;
};

/* The bucket of a latency: its octave above HIST_BASE_US and the next
 * three bits below the leading one (an HDR histogram's layout). */
static unsigned bucket_of(uint64_t us)
{
    uint64_t v = us / (HIST_BASE_US / HIST_SUB);
    unsigned oct, b;

    if (v < HIST_SUB * 2) {
        return v < HIST_SUB ? 0 : (unsigned)(v - HIST_SUB);
    }
    oct = 63 - (unsigned)__builtin_clzll(v);      /* v >= 16: oct >= 4. */
    b = (oct - 3) * HIST_SUB + (unsigned)((v >> (oct - 3)) & (HIST_SUB - 1));
    return b < HIST_N ? b : HIST_N - 1;
}

/* The lowest latency of bucket b and its width, in microseconds. */
static void bucket_range(unsigned b, double *lo, double *width)
{
    unsigned oct = b / HIST_SUB, sub = b % HIST_SUB;
    double unit = (double)(HIST_BASE_US / HIST_SUB) * (double)(1ull << oct);

    *lo = unit * (HIST_SUB + sub);
    *width = unit;
}

/* The median of n samples in h, read within its bucket linearly. */
static double median_of(const uint32_t *h, uint32_t n)
{
    double half = n / 2.0, seen = 0, lo, width;
    unsigned b;

    for (b = 0; b < HIST_N; b++) {
        if (h[b] && seen + h[b] >= half) {
            bucket_range(b, &lo, &width);
            return lo + width * (half - seen) / h[b];
        }
        seen += h[b];
    }
    bucket_range(HIST_N - 1, &lo, &width);
    return lo + width;
}

size_t tb_adapt_size(void)
{
    return sizeof(tb_adapt_t);
}

static uint32_t clamp_u32(double v, uint32_t lo, uint32_t hi)
{
    if (v < lo) {
        return lo;
    }
    return v > hi ? hi : (uint32_t)v;
}

static void set_cap(tb_adapt_t *a, uint32_t cap)
{
    __atomic_store_n(&a->cap, cap, __ATOMIC_RELAXED);
}

tb_adapt_t *tb_adapt_init(void *mem, uint32_t min, uint32_t max)
{
    tb_adapt_t *a = mem;

    if (!mem || min == 0 || max < min || max > TB_INFLIGHT_MAX) {
        return NULL;
    }
    memset(a, 0, sizeof(*a));
    a->magic = ADAPT_MAGIC;
    a->min = min;
    a->max = max;
    /* Open at the top: a server's own traffic is never refused while the
     * limiter learns; a flood that finds no floor yet is probed. */
    a->limit_milli = (uint64_t)max * 1000;
    set_cap(a, max);
    return a;
}

int tb_adapt_bounds(tb_adapt_t *a, uint32_t min, uint32_t max)
{
    double limit;

    if (!a || a->magic != ADAPT_MAGIC || min == 0 || max < min
        || max > TB_INFLIGHT_MAX) {
        return TB_ERR;
    }
    a->min = min;
    a->max = max;
    /* The cap and the estimate each kept, clamped: the cap lags the
     * estimate by up to HYSTERESIS, so the estimate rounded could move a
     * cap that a reload with the same bounds must leave where it is. */
    limit = a->limit_milli / 1000.0;
    limit = limit < min ? min : limit > max ? max : limit;
    a->limit_milli = (uint64_t)(limit * 1000.0 + 0.5);
    set_cap(a, clamp_u32(__atomic_load_n(&a->cap, __ATOMIC_RELAXED), min,
                         max));
    return TB_OK;
}

uint32_t tb_adapt_cap(const tb_adapt_t *a)
{
    return a && a->magic == ADAPT_MAGIC
           ? __atomic_load_n(&a->cap, __ATOMIC_RELAXED) : 0;
}

void tb_adapt_taken(tb_adapt_t *a, uint32_t in_flight)
{
    uint32_t peak;

    if (!a || a->magic != ADAPT_MAGIC) {
        return;
    }
    peak = __atomic_load_n(&a->win_peak, __ATOMIC_RELAXED);
    while (in_flight > peak
           && !__atomic_compare_exchange_n(&a->win_peak, &peak, in_flight,
                                           1, __ATOMIC_RELAXED,
                                           __ATOMIC_RELAXED)) {
    }
}

/* Claim the close of the window: 1 when this caller may, 0 otherwise. */
static int claim(tb_adapt_t *a, uint64_t now_us)
{
    uint64_t held = __atomic_load_n(&a->claim_us, __ATOMIC_ACQUIRE);

    if (held && now_us - held < CLAIM_US) {
        return 0;
    }
    return __atomic_compare_exchange_n(&a->claim_us, &held, now_us, 0,
                                       __ATOMIC_ACQ_REL, __ATOMIC_RELAXED);
}

static int window_due(uint64_t age, uint32_t n)
{
    return (age >= WIN_US && n >= WIN_N) || (age >= WIN_SLOW_US && n >= 3)
           || (age >= WIN_IDLE_US && n >= 1);
}

/* The estimate after a window of median latency p50_us, peak in flight
 * peak, at limit. */
static double next_limit(const tb_adapt_t *a, double limit, double p50_us,
                         uint32_t peak)
{
    double g = (double)a->floor_us * (1.0 + BUFFER) / p50_us, target;

    g = g < GRADIENT_MIN ? GRADIENT_MIN : g > GRADIENT_MAX ? GRADIENT_MAX : g;
    target = limit * g + HEADROOM;
    /* Traffic that used less than half the cap says nothing about more:
     * hold instead of growing past what was tried. */
    if (target > limit && peak * 2 < (uint32_t)(limit + 0.5)) {
        return limit;
    }
    return target > limit ? limit + SMOOTH * (target - limit) : target;
}

/* The floor after a window of median last_us and peak in flight; 1 when
 * the window starts a probe instead (the cap set to min), 0 otherwise. */
static int note_floor(tb_adapt_t *a, uint64_t now_us, uint32_t peak,
                      uint32_t cap)
{
    if (peak > 0 && peak <= a->min) {
        /* Run at the bottom anyway: as good as a probe. A window with no
         * take at all (peak 0) is not: right after a cut, more requests
         * run than the new cap, none is let in, and the window's samples
         * are those of the queue that the cut was made for. */
        a->floor_us = a->last_us ? a->last_us : 1;
        a->floor_at_us = now_us;
    }
    else if (!a->floor_us || a->last_us < a->floor_us) {
        a->floor_us = a->last_us ? a->last_us : 1;
    }
    if (peak >= cap && (!a->floor_at_us
                        || now_us - a->floor_at_us >= PROBE_EVERY_US)) {
        /* The cap binds and the floor is old or was never seen without a
         * queue: measure it at the bottom for one window, and keep this
         * window to judge against it then. */
        a->probe_from_us = now_us;
        a->probe_p50_us = a->last_us;
        a->probe_peak = peak;
        a->probes++;
        set_cap(a, a->min);
        return 1;
    }
    return 0;
}

/* Close the window (the caller has the claim): the floor, a probe, the
 * estimate and the cap. */
static void close_window(tb_adapt_t *a, uint64_t now_us, const uint32_t *h,
                         uint32_t n, uint32_t peak)
{
    double limit = a->limit_milli / 1000.0, p50 = median_of(h, n);
    uint32_t cap = __atomic_load_n(&a->cap, __ATOMIC_RELAXED), next;

    a->last_us = (uint64_t)(p50 + 0.5);
    a->last_peak = peak;
    a->windows++;
    if (a->probe_from_us) {
        /* A probe ran at the bottom: its median is the floor now, higher
         * or lower, and the window that called it is judged against it
         * at once, so that a flood that found no floor yet is cut now. */
        a->floor_us = a->last_us ? a->last_us : 1;
        a->floor_at_us = now_us;
        a->probe_from_us = 0;
        p50 = (double)a->probe_p50_us;
        peak = a->probe_peak;
    }
    else if (note_floor(a, now_us, peak, cap)) {
        return;
    }
    limit = next_limit(a, limit, p50, peak);
    limit = limit < a->min ? a->min : limit > a->max ? a->max : limit;
    a->limit_milli = (uint64_t)(limit * 1000.0 + 0.5);
    next = cap;
    if (limit >= cap + HYSTERESIS || limit <= cap - HYSTERESIS) {
        next = clamp_u32(limit + 0.5, a->min, a->max);
    }
    if (next != cap) {
        if (next > cap) {
            a->ups++;
        }
        else {
            a->downs++;
        }
        set_cap(a, next);
    }
}

void tb_adapt_sample(tb_adapt_t *a, uint64_t started_us, uint64_t now_us)
{
    uint64_t start;
    uint32_t n, peak, h[HIST_N];
    unsigned b;

    if (!a || a->magic != ADAPT_MAGIC || now_us < started_us) {
        return;
    }
    start = __atomic_load_n(&a->probe_from_us, __ATOMIC_RELAXED);
    /* A probe measures requests that began under it: the ones before ran
     * beside a queue the probe is there to avoid. */
    if (start && started_us < start) {
        if (now_us - start >= PROBE_MAX_US && claim(a, now_us)) {
            a->probe_from_us = 0;
            set_cap(a, clamp_u32(a->limit_milli / 1000.0 + 0.5, a->min,
                                 a->max));
            __atomic_store_n(&a->claim_us, 0, __ATOMIC_RELEASE);
        }
        return;
    }
    __atomic_add_fetch(&a->hist[bucket_of(now_us - started_us)], 1,
                       __ATOMIC_RELAXED);
    n = __atomic_add_fetch(&a->win_n, 1, __ATOMIC_RELAXED);
    start = __atomic_load_n(&a->win_start_us, __ATOMIC_RELAXED);
    if (!start) {
        __atomic_compare_exchange_n(&a->win_start_us, &start, started_us, 0,
                                    __ATOMIC_RELAXED, __ATOMIC_RELAXED);
        return;
    }
    if (now_us < start || !window_due(now_us - start, n)
        || !claim(a, now_us)) {
        return;
    }
    /* Samples that land between these exchanges count in the next
     * window, or in this one without being counted in win_n: a window
     * is dozens of them, one more or less. */
    n = 0;
    for (b = 0; b < HIST_N; b++) {
        h[b] = __atomic_exchange_n(&a->hist[b], 0, __ATOMIC_RELAXED);
        n += h[b];
    }
    __atomic_store_n(&a->win_n, 0, __ATOMIC_RELAXED);
    peak = __atomic_exchange_n(&a->win_peak, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&a->win_start_us, now_us, __ATOMIC_RELAXED);
    if (n) {
        close_window(a, now_us, h, n, peak);
    }
    __atomic_store_n(&a->claim_us, 0, __ATOMIC_RELEASE);
}

int tb_adapt_view(const tb_adapt_t *a, tb_adapt_view_t *v)
{
    if (!a || !v || a->magic != ADAPT_MAGIC) {
        return TB_ERR;
    }
    memset(v, 0, sizeof(*v));
    v->cap = __atomic_load_n(&a->cap, __ATOMIC_RELAXED);
    v->min = a->min;
    v->max = a->max;
    v->limit = __atomic_load_n(&a->limit_milli, __ATOMIC_RELAXED) / 1000.0;
    v->floor_us = __atomic_load_n(&a->floor_us, __ATOMIC_RELAXED);
    v->last_us = __atomic_load_n(&a->last_us, __ATOMIC_RELAXED);
    v->last_peak = __atomic_load_n(&a->last_peak, __ATOMIC_RELAXED);
    v->probing = __atomic_load_n(&a->probe_from_us, __ATOMIC_RELAXED) != 0;
    v->windows = __atomic_load_n(&a->windows, __ATOMIC_RELAXED);
    v->ups = __atomic_load_n(&a->ups, __ATOMIC_RELAXED);
    v->downs = __atomic_load_n(&a->downs, __ATOMIC_RELAXED);
    v->probes = __atomic_load_n(&a->probes, __ATOMIC_RELAXED);
    return TB_OK;
}
