/* tb_topk_read.c -- reading the heavy hitters of a window: each slot of
 * the window locked only to copy it, the copies merged in caller scratch
 * memory, each key's counts summed and its error bounded, and the keys
 * ranked by refusals and by decisions (tb_topk_read). */
#include <string.h>

#include "tables/tb_topk_int.h"

/* One key of the window, summed over the slots that held it. For each
 * sketch w: cnt and err summed; pmin the c_min of the full slots that
 * held it (those that did not hold it add their c_min at the end). */
typedef struct merged {
    uint64_t hash, meta, lw;
    uint64_t kw[KEY_WORDS];
    uint64_t cnt[2], err[2], pmin[2];
    uint64_t allowed, refused[2];
    int64_t last_refusal_ms;
    uint32_t present;                   /* Bit w: held by sketch w.      */
    char limit[TB_NAME_MAX + 1];
} merged_t;

/* The scratch of a read, carved from the caller's memory. */
typedef struct scratch {
    counter_t *copy;                    /* One slot's counters: 2m.      */
    merged_t *rec;                      /* Up to maxrec keys.            */
    uint32_t nrec, maxrec;
    uint32_t *idx;                      /* Their index: isize words.     */
    uint32_t isize;
    uint32_t *top;                      /* A ranking: k entries.         */
} scratch_t;

static int window_ok(const tb_topk_t *t, int minutes)
{
    return valid(t) && minutes >= 1 && minutes < TB_TOPK_SLOTS;
}

static uint32_t max_records(const tb_topk_t *t, int minutes)
{
    return (uint32_t)(minutes + 1) * 2 * t->m;
}

size_t tb_topk_scratch_size(const tb_topk_t *t, int minutes)
{
    uint32_t maxrec;

    if (!window_ok(t, minutes)) {
        return 0;
    }
    maxrec = max_records(t, minutes);
    return 2 * (size_t)t->m * sizeof(counter_t)
           + (size_t)maxrec * sizeof(merged_t)
           + index_size(maxrec) * sizeof(uint32_t)
           + ALIGN8(t->k * sizeof(uint32_t));
}

static void scratch_carve(const tb_topk_t *t, int minutes, void *mem,
                          scratch_t *sc)
{
    char *p = mem;

    sc->maxrec = max_records(t, minutes);
    sc->nrec = 0;
    sc->copy = (counter_t *)p;
    p += 2 * (size_t)t->m * sizeof(counter_t);
    sc->rec = (merged_t *)p;
    p += (size_t)sc->maxrec * sizeof(merged_t);
    sc->isize = index_size(sc->maxrec);
    sc->idx = (uint32_t *)p;
    memset(sc->idx, 0xff, sc->isize * sizeof(uint32_t));
    p += sc->isize * sizeof(uint32_t);
    sc->top = (uint32_t *)p;
}

/* The key of record r as shown: its sanitised form, after "ip:" for a
 * client keyed by address, into out (TB_TOPK_KEY_LEN bytes). */
static void shown_key(const merged_t *r, char *out)
{
    size_t klen = META_KLEN(r->meta);
    int ip = (r->meta >> 48 & FLAG_IP) != 0;

    klen = klen <= TB_KEY_RAW_MAX ? klen : TB_KEY_RAW_MAX;
    if (r->meta >> 48 & FLAG_LONG) {
        /* Stored already in its shown (hashed) form. */
        size_t at = ip ? 3 : 0;

        memcpy(out, "ip:", at);
        memcpy(out + at, r->kw, klen);
        out[at + klen] = '\0';
    }
    else {
        tb_key_show((const char *)r->kw, klen, ip, out);
    }
}

/* The record of counter c, made when new; NULL when full (never: a
 * window holds at most maxrec distinct counters). */
static merged_t *record(scratch_t *sc, const counter_t *c)
{
    uint32_t mask = sc->isize - 1, i = (uint32_t)c->hash & mask, steps;
    size_t llen = META_LLEN(c->meta);
    size_t words = (META_KLEN(c->meta) + 7) / 8 * 8;
    merged_t *r;

    llen = llen <= TB_NAME_MAX ? llen : TB_NAME_MAX;
    words = words <= sizeof(r->kw) ? words : sizeof(r->kw);
    for (steps = 0; steps <= mask; steps++, i = (i + 1) & mask) {
        uint32_t v = sc->idx[i];

        if (v == NIL) {
            break;
        }
        r = &sc->rec[v];
        if (r->hash == c->hash && r->meta == c->meta && r->lw == c->lw
            && memcmp(r->kw, c->kw, words) == 0
            && memcmp(r->limit, c->limit, llen) == 0) {
            return r;
        }
    }
    if (sc->idx[i] != NIL || sc->nrec >= sc->maxrec) {
        return NULL;
    }
    r = &sc->rec[sc->nrec];
    memset(r, 0, sizeof(*r));
    r->hash = c->hash;
    r->meta = c->meta;
    r->lw = c->lw;
    memcpy(r->kw, c->kw, words);
    memcpy(r->limit, c->limit, llen);
    r->limit[llen] = '\0';
    sc->idx[i] = sc->nrec++;
    return r;
}

/* Copy slot s under its lock if it belongs to minutes [from, to], and
 * merge the copy: 1 when it did. fmin[w] gets the slot's c_min (0 when
 * a sketch was never full). */
static int merge_slot(const tb_topk_t *t, slot_t *s, int64_t from,
                      int64_t to, scratch_t *sc, uint64_t events[2],
                      uint64_t fmin[2])
{
    uint32_t n[2], i;
    int w, rc = lock(s);

    if (rc == TB_ERR) {
        return 0;
    }
    if (rc == TB_SHLOCK_RECOVERED) {
        tb__topk_slot_reset(t, s, -1);
    }
    if (s->minute < from || s->minute > to) {
        unlock(s);
        return 0;
    }
    for (w = 0; w < 2; w++) {
        counter_t *c = counters(t, s, w);
        uint32_t *heap = heap_of(t, s, w);

        n[w] = s->sk[w].n <= t->m ? s->sk[w].n : t->m;
        events[w] += s->sk[w].events;
        fmin[w] = n[w] == t->m && heap[0] < t->m ? c[heap[0]].count : 0;
        memcpy(sc->copy + (size_t)w * t->m, c, n[w] * sizeof(counter_t));
    }
    unlock(s);
    for (w = 0; w < 2; w++) {
        for (i = 0; i < n[w]; i++) {
            const counter_t *c = &sc->copy[(size_t)w * t->m + i];
            merged_t *r = record(sc, c);

            if (!r) {
                continue;
            }
            r->present |= (uint8_t)(1u << w);
            r->cnt[w] += c->count;
            r->err[w] += c->err;
            r->pmin[w] += fmin[w];
            r->refused[w] += c->refused;
            if (w == DECISIONS) {
                r->allowed += c->allowed;
            }
            if (c->last_refusal_ms > r->last_refusal_ms) {
                r->last_refusal_ms = c->last_refusal_ms;
            }
        }
    }
    return 1;
}

/* The estimate of r in sketch w: present counts plus what the full
 * slots that no longer held it may have seen. */
static uint64_t estimate(const merged_t *r, int w, const uint64_t fsum[2])
{
    return r->cnt[w] + (fsum[w] - r->pmin[w]);
}

/* 1 when a ranks before b in sketch w: larger estimate, then the key's
 * bytes, the limit, the key's length and kind and the virtual host, so
 * equal counts come out in a stable order. */
static int before(const merged_t *a, const merged_t *b, int w,
                  const uint64_t fsum[2])
{
    uint64_t ea = estimate(a, w, fsum), eb = estimate(b, w, fsum);
    int d;

    if (ea != eb) {
        return ea > eb;
    }
    if ((d = memcmp(a->kw, b->kw, sizeof(a->kw))) != 0
        || (d = strcmp(a->limit, b->limit)) != 0
        || (d = (int)(a->meta >> 32) - (int)(b->meta >> 32)) != 0) {
        return d < 0;
    }
    return (uint32_t)a->meta < (uint32_t)b->meta;
}

/* The n records of sketch w that rank first, into out. Insertion into a
 * sorted list of n: most records lose to the last one at once. */
static int rank(const scratch_t *sc, int w, const uint64_t fsum[2], int n,
                tb_topk_entry_t *out)
{
    int len = 0, j;
    uint32_t i;

    for (i = 0; i < sc->nrec && n > 0; i++) {
        const merged_t *r = &sc->rec[i];

        if (!(r->present & (1u << w))
            || (len == n && !before(r, &sc->rec[sc->top[len - 1]], w,
                                    fsum))) {
            continue;
        }
        j = len < n ? len++ : n - 1;
        for (; j > 0 && before(r, &sc->rec[sc->top[j - 1]], w, fsum); j--) {
            sc->top[j] = sc->top[j - 1];
        }
        sc->top[j] = i;
    }
    for (j = 0; j < len; j++) {
        const merged_t *r = &sc->rec[sc->top[j]];
        tb_topk_entry_t *e = &out[j];

        shown_key(r, e->key);
        memcpy(e->limit, r->limit, sizeof(e->limit));
        e->vhost = (uint32_t)r->meta;
        e->decisions = estimate(r, DECISIONS, fsum);
        e->decisions_err = r->err[DECISIONS] + fsum[DECISIONS]
                           - r->pmin[DECISIONS];
        e->refusals = estimate(r, REFUSALS, fsum);
        e->refusals_err = r->err[REFUSALS] + fsum[REFUSALS]
                          - r->pmin[REFUSALS];
        e->allowed = r->allowed;
        e->refused = r->refused[0] > r->refused[1] ? r->refused[0]
                                                   : r->refused[1];
        e->last_refusal_ms = r->last_refusal_ms;
    }
    return len;
}

int tb_topk_read(tb_topk_t *t, const tb_topk_query_t *q,
                 tb_topk_result_t *res)
{
    uint64_t fsum[2] = { 0, 0 }, fmin[2];
    int64_t to, from;
    scratch_t sc;
    int i;

    if (!q || !res || !window_ok(t, q->minutes) || !q->scratch
        || q->n < 0 || (uint32_t)q->n > t->k) {
        return TB_ERR;
    }
    memset(res, 0, sizeof(*res));
    scratch_carve(t, q->minutes, q->scratch, &sc);
    to = q->now_ms > 0 ? q->now_ms / MINUTE_MS : 0;
    if (__atomic_load_n(&t->newest, __ATOMIC_RELAXED) > to) {
        to = __atomic_load_n(&t->newest, __ATOMIC_RELAXED);
    }
    from = to - q->minutes;
    for (i = 0; i < TB_TOPK_SLOTS; i++) {
        uint64_t events[2] = { 0, 0 };

        if (merge_slot(t, slot_at(t, i), from, to, &sc, events, fmin)) {
            res->decisions += events[DECISIONS];
            res->refusals += events[REFUSALS];
            fsum[DECISIONS] += fmin[DECISIONS];
            fsum[REFUSALS] += fmin[REFUSALS];
        }
    }
    res->decisions_bound = fsum[DECISIONS];
    res->refusals_bound = fsum[REFUSALS];
    if (q->by_refusals) {
        res->n_refusals = rank(&sc, REFUSALS, fsum, q->n, q->by_refusals);
    }
    if (q->by_decisions) {
        res->n_decisions = rank(&sc, DECISIONS, fsum, q->n,
                                q->by_decisions);
    }
    return TB_OK;
}
