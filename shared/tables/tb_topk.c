/* tb_topk.c -- heavy hitters: the keys with the most refusals and the
 * most decisions, per minute, in a fixed block of caller memory.
 *
 * The block holds a ring of TB_TOPK_SLOTS minute slots. A slot is two
 * Space-Saving sketches (tb.h, "Heavy hitters", says what their counts
 * promise): one counts every decision, one refusals only. A sketch is m
 * counters, a min-heap of the counters by count (the one to give to a
 * new key is at its root) and an open-addressing index from a key's hash
 * to its counter (linear probing, at most half full, deletion by
 * backward shift, so no tombstones build up). Every link is an index
 * into the slot, never a pointer, so the block works at any address in
 * every process that maps it.
 *
 * The request path (tb_topk_note) hashes the key's bytes eight at a
 * time, locks the current slot, finds or takes a counter and moves it
 * down the heap: no allocation, no system call, about 200 instructions
 * (callgrind; a decision is about 4,600). A key of up to TB_KEY_RAW_MAX
 * bytes is counted under the bytes given, which tb_key_sanitize maps one
 * to one to what it stores, so it is sanitised only when read; a longer
 * key is sanitised (hashed) first. The first writer of a new minute
 * empties the slot: only the counts in use and the index are cleared,
 * 4 KB for k = 20. Readers (tb_topk_read) lock each slot of a window
 * only to copy it, then merge the copies in caller scratch memory.
 *
 * The lock is in the slot (tb_shlock_t, as in tb_local.c). A holder that
 * dies holding it hands it to the next taker, writer or reader, with
 * TB_SHLOCK_RECOVERED; the holder may have died in the middle of an
 * update (a heap half sifted, an index entry without its counter), so
 * the taker empties the slot: a minute of figures is lost, never the
 * table. Every index read back from the block is also checked against
 * its bounds before use, so that a slot written wrong in some other way
 * can only miscount, never send a write out of the block.
 *
 * Left out: weights (a decision counts one, whatever its cost), keys by
 * any other identity than key, virtual host and limit, and decay within
 * a minute.
 */
#include <string.h>

#include "tables/tb_topk_int.h"

static uint32_t counters_of(int k)
{
    return k * 8 > 64 ? (uint32_t)k * 8 : 64;
}

static size_t heap_offset(uint32_t m)
{
    return CNT_OFF + 2 * (size_t)m * sizeof(counter_t);
}

static size_t index_offset(uint32_t m)
{
    return heap_offset(m) + ALIGN8(2 * (size_t)m * sizeof(uint32_t));
}

static size_t slot_size(uint32_t m, uint32_t isize)
{
    return index_offset(m) + 2 * (size_t)isize * sizeof(uint32_t);
}

size_t tb_topk_size(int k)
{
    uint32_t m;

    if (k < 1 || k > TB_TOPK_MAX_K) {
        return 0;
    }
    m = counters_of(k);
    return sizeof(struct tb_topk)
           + TB_TOPK_SLOTS * slot_size(m, index_size(m));
}

static uint32_t *index_of(const tb_topk_t *t, slot_t *s, int w)
{
    return (uint32_t *)((char *)s + t->idx_off) + (w ? t->isize : 0);
}

/* Empty a slot for minute: counters in use and index only; the counters
 * themselves are written when taken. */
void tb__topk_slot_reset(const tb_topk_t *t, slot_t *s, int64_t minute)
{
    int w;

    for (w = 0; w < 2; w++) {
        s->sk[w].n = 0;
        s->sk[w].events = 0;
        memset(index_of(t, s, w), 0xff, t->isize * sizeof(uint32_t));
    }
    s->minute = minute;
}

tb_topk_t *tb_topk_init(void *mem, int k)
{
    tb_topk_t *t = mem;
    int i;

    if (!mem || !tb_topk_size(k)) {
        return NULL;
    }
    memset(t, 0, sizeof(*t));
    t->k = (uint32_t)k;
    t->m = counters_of(k);
    t->isize = index_size(t->m);
    t->slot_bytes = slot_size(t->m, t->isize);
    t->heap_off = heap_offset(t->m);
    t->idx_off = index_offset(t->m);
    for (i = 0; i < TB_TOPK_SLOTS; i++) {
        slot_t *s = slot_at(t, i);

        if (tb_shlock_init(&s->lock) != TB_OK) {
            return NULL;
        }
        tb__topk_slot_reset(t, s, -1);
    }
    t->magic = TOPK_MAGIC;
    return t;
}

int tb_topk_k(const tb_topk_t *t)
{
    return valid(t) ? (int)t->k : 0;
}

int tb_topk_counters(const tb_topk_t *t)
{
    return valid(t) ? (int)t->m : 0;
}

/* ---- One sketch -------------------------------------------------------
 *
 * Index words: NIL when free, else the counter's number in the low 16
 * bits (m <= 8000) and the top 16 bits of its hash above them, so a
 * probe passes most other keys without reading their counters. */

#define TAG(h) ((uint32_t)((h) >> 48) << 16)

/* The key a note is about: its identity (as a counter keeps it) and the
 * bytes it came from, which a counter that takes it shows. */
typedef struct probe {
    uint64_t hash, meta, lw;
    uint64_t kw[KEY_WORDS];
    size_t nw;                          /* Words of kw in use, >= 1.     */
    size_t llen;                        /* Bytes of the limit.           */
    const char *key;                    /* The identity's bytes.         */
    const char *limit;
} probe_t;

static void heap_swap(uint32_t *heap, counter_t *c, uint32_t i, uint32_t j)
{
    uint32_t a = heap[i], b = heap[j];

    heap[i] = b;
    heap[j] = a;
    c[b].heap_pos = i;
    c[a].heap_pos = j;
}

/* Restore the heap below i after counter heap[i] grew. */
NOTE_STEP void sift_down(uint32_t *heap, counter_t *c, uint32_t n,
                         uint32_t i)
{
    for (;;) {
        uint32_t l = 2 * i + 1, r = l + 1, least = i;

        if (l < n && c[heap[l]].count < c[heap[least]].count) {
            least = l;
        }
        if (r < n && c[heap[r]].count < c[heap[least]].count) {
            least = r;
        }
        if (least == i) {
            return;
        }
        heap_swap(heap, c, i, least);
        i = least;
    }
}

static void sift_up(uint32_t *heap, counter_t *c, uint32_t i)
{
    while (i > 0) {
        uint32_t parent = (i - 1) / 2;

        if (c[heap[parent]].count <= c[heap[i]].count) {
            return;
        }
        heap_swap(heap, c, i, parent);
        i = parent;
    }
}

/* 1 when counter c holds p's key, virtual host and limit. */
NOTE_STEP int same(const counter_t *c, const probe_t *p)
{
    size_t i;

    /* Word 0 is zero in both for an empty key. */
    if (c->hash != p->hash || c->meta != p->meta || c->lw != p->lw
        || c->kw[0] != p->kw[0]) {
        return 0;
    }
    for (i = 1; i < p->nw; i++) {
        if (c->kw[i] != p->kw[i]) {
            return 0;
        }
    }
    /* Route names longer than 8 bytes: the rest of them. */
    return p->llen <= 8
           || memcmp(c->limit + 8, p->limit + 8, p->llen - 8) == 0;
}

/* The index position holding p's counter, or the free position where it
 * would go (*found 0). The index is at most half full, so a free word
 * ends every probe. */
NOTE_STEP uint32_t find(const uint32_t *idx, uint32_t mask,
                        const counter_t *c, uint32_t n, const probe_t *p,
                        int *found)
{
    uint32_t i = (uint32_t)p->hash & mask, tag = TAG(p->hash), steps;

    for (steps = 0; steps <= mask; steps++, i = (i + 1) & mask) {
        uint32_t v = idx[i], e = v & 0xffff;

        if (v == NIL) {
            break;
        }
        if ((v & 0xffff0000u) == tag && e < n && same(&c[e], p)) {
            *found = 1;
            return i;
        }
    }
    *found = 0;
    return i;
}

/* Remove the word at position i, shifting back the words after it that
 * probed past i, so every key stays reachable from its home. */
static void index_delete(uint32_t *idx, uint32_t mask, const counter_t *c,
                         uint32_t n, uint32_t i)
{
    uint32_t j = i, steps;

    for (steps = 0; steps < mask; steps++) {
        uint32_t v, e, home;

        j = (j + 1) & mask;
        v = idx[j];
        if (v == NIL) {
            break;
        }
        e = v & 0xffff;
        home = e < n ? (uint32_t)c[e].hash & mask : j;
        /* Move v into the hole unless its home lies cyclically in
         * (i, j]: then it is still reachable without passing i. */
        if ((j > i && (home <= i || home > j))
            || (j < i && home <= i && home > j)) {
            idx[i] = v;
            i = j;
        }
    }
    idx[i] = NIL;
}

/* A counter for p, which sketch w does not hold; at is the free index
 * position find() gave. A free counter, or else the least one, whose
 * count is the most p's key can have had in the minute so far. Returns
 * the counter's number. */
static uint32_t take_counter(const tb_topk_t *t, slot_t *s, int w,
                             const probe_t *p, uint32_t at)
{
    counter_t *c = counters(t, s, w), *e;
    uint32_t *heap = heap_of(t, s, w), *idx = index_of(t, s, w);
    uint32_t mask = t->isize - 1, n = s->sk[w].n, ci;
    size_t llen = META_LLEN(p->meta);
    int found;

    if (n < t->m) {
        ci = n;
        s->sk[w].n = n + 1;
        e = &c[ci];
        e->count = 0;
        e->err = 0;
        e->heap_pos = n;
        heap[n] = ci;
    }
    else {
        probe_t old;

        ci = heap[0] < n ? heap[0] : 0;
        e = &c[ci];
        old.hash = e->hash;
        old.meta = e->meta;
        old.lw = e->lw;
        memcpy(old.kw, e->kw, sizeof(old.kw));
        old.nw = META_KLEN(e->meta) ? (META_KLEN(e->meta) + 7) / 8 : 1;
        old.llen = META_LLEN(e->meta);
        old.limit = e->limit;
        at = find(idx, mask, c, n, &old, &found);
        if (found) {
            index_delete(idx, mask, c, n, at);
        }
        e->err = e->count;
        at = find(idx, mask, c, n, p, &found);
    }
    e->hash = p->hash;
    e->meta = p->meta;
    e->lw = p->lw;
    memcpy(e->kw, p->kw, p->nw * 8);
    memcpy(e->limit, p->limit, llen);
    e->limit[llen] = '\0';
    e->allowed = 0;
    e->refused = 0;
    e->last_refusal_ms = 0;
    idx[at] = TAG(p->hash) | ci;
    return ci;
}

/* Count one event of p in sketch w of slot s. The usual case is a key
 * the sketch holds: one probe, one comparison, an increment and a look
 * at the counter's children in the heap. */
NOTE_STEP void count(const tb_topk_t *t, slot_t *s, int w,
                     const probe_t *p, int refused, int64_t now_ms)
{
    counter_t *c = counters(t, s, w), *e;
    uint32_t *heap = heap_of(t, s, w), *idx = index_of(t, s, w);
    uint32_t n = s->sk[w].n, at;
    int found;

    n = n <= t->m ? n : t->m;
    s->sk[w].events++;
    at = find(idx, t->isize - 1, c, n, p, &found);
    if (found) {
        e = &c[idx[at] & 0xffff];
        e->count++;
    }
    else {
        e = &c[take_counter(t, s, w, p, at)];
        n = s->sk[w].n;
        /* A free counter starts at 1, the least count: up the heap. */
        if (++e->count == 1 && e->heap_pos < n) {
            sift_up(heap, c, e->heap_pos);
        }
    }
    /* heap_pos < n keeps a heap written wrong in bounds; nothing else is
     * needed for that. */
    if (e->heap_pos < n && e->count > 1) {
        sift_down(heap, c, n, e->heap_pos);
    }
    if (refused) {
        e->refused++;
        e->last_refusal_ms = now_ms;
    }
    else {
        e->allowed++;
    }
}

/* A refusal in the refusals' sketch: out of line, so that the inlined
 * copy of count() for every decision has a constant sketch. */
static void count_refusal(const tb_topk_t *t, slot_t *s, const probe_t *p,
                          int64_t now_ms)
{
    count(t, s, REFUSALS, p, 1, now_ms);
}

/* ---- Writing ---------------------------------------------------------- */

#define MUL 0x9e3779b97f4a7c15ULL

static uint64_t mix(uint64_t h, uint64_t w)
{
    h = (h ^ w) * MUL;
    return h ^ (h >> 29);
}

/* The last len bytes (1..8) of s[0..total), in memory order in a
 * zero-padded word. A little-endian machine reads them with at most two
 * loads, none outside the string. */
NOTE_STEP uint64_t tail_word(const char *s, size_t total, size_t len)
{
    uint64_t w = 0;
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    uint32_t a, b;

    if (total >= 8) {
        memcpy(&w, s + total - 8, 8);
        return w >> (8 * (8 - len));
    }
    if (len >= 4) {
        /* Two 4-byte loads that overlap: the shared bytes agree. */
        memcpy(&a, s, 4);
        memcpy(&b, s + len - 4, 4);
        return a | (uint64_t)b << (8 * (len - 4));
    }
    for (a = 0; a < len; a++) {
        w |= (uint64_t)(unsigned char)s[a] << (8 * a);
    }
    return w;
#else
    memcpy(&w, s + total - len, len);
    return w;
#endif
}

/* Fill p from item, with buf (TB_KEY_RAW_MAX + 1 bytes) for the
 * sanitised form of an over-long key; nothing here tests the key's
 * bytes, which take_counter does once per counter. */
NOTE_STEP void make_probe(probe_t *p, const tb_topk_item_t *item,
                          char *buf)
{
    const char *key = item->key ? item->key : "";
    size_t klen = item->key_len, llen, i, full;
    uint64_t flags = item->ip ? FLAG_IP : 0, h, w;

    if (klen > TB_KEY_RAW_MAX) {
        klen = tb_key_sanitize(key, klen, buf);
        key = buf;
        flags |= FLAG_LONG;
    }
    p->key = key;
    if (item->limit) {
        p->limit = item->limit;
        llen = item->limit_len ? item->limit_len : strlen(item->limit);
        llen = llen < TB_NAME_MAX ? llen : TB_NAME_MAX;
        p->lw = tail_word(p->limit, llen < 8 ? llen : 8,
                          llen < 8 ? llen : 8);
    }
    else {
        /* The main bucket's name: its word is folded at compile time. */
        p->limit = "default";
        llen = 7;
        p->lw = tail_word("default", 7, 7);
    }
    p->llen = llen;
    p->meta = item->vhost | (uint64_t)klen << 32 | (uint64_t)llen << 40
              | flags << 48;
    /* meta and the limit seed the hash; the key's words are mixed in. */
    h = p->meta ^ (p->lw << 21 | p->lw >> 43);
    p->kw[0] = 0;
    full = klen ? (klen - 1) / 8 : 0;
    for (i = 0; i < full; i++) {
        memcpy(&w, key + 8 * i, 8);
        p->kw[i] = w;
        h = mix(h, w);
    }
    if (klen) {
        w = tail_word(key, klen, klen - 8 * full);
        p->kw[full] = w;
        h = mix(h, w);
    }
    p->nw = full + 1;
    /* The top bits of the last product depend on every bit before
     * them: fold them onto the low bits, the index position (the tag is
     * the top 16). */
    p->hash = h ^ (h >> 32);
}

/* The minute to count in: now's, or the newest one written if the clock
 * went back. */
static int64_t current_minute(tb_topk_t *t, int64_t now_ms)
{
    int64_t minute = now_ms > 0 ? (int64_t)((uint64_t)now_ms / MINUTE_MS)
                                : 0;
    int64_t newest = __atomic_load_n(&t->newest, __ATOMIC_RELAXED);

    while (minute > newest
           && !__atomic_compare_exchange_n(&t->newest, &newest, minute, 0,
                                           __ATOMIC_RELAXED,
                                           __ATOMIC_RELAXED)) {
    }
    return minute < newest ? newest : minute;
}

void tb_topk_note(tb_topk_t *t, const tb_topk_item_t *item, int refused,
                  int64_t now_ms)
{
    char buf[TB_KEY_RAW_MAX + 1];
    probe_t p;
    int64_t minute;
    slot_t *s;
    int rc;

    if (!valid(t) || !item || (!item->key && item->key_len)) {
        return;
    }
    make_probe(&p, item, buf);
    minute = current_minute(t, now_ms);
    s = slot_at(t, minute);
    rc = lock(s);
    if (rc == TB_ERR) {
        return;
    }
    if (rc == TB_SHLOCK_RECOVERED || s->minute != minute) {
        tb__topk_slot_reset(t, s, minute);
    }
    count(t, s, DECISIONS, &p, refused, now_ms);
    if (refused) {
        count_refusal(t, s, &p, now_ms);
    }
    unlock(s);
}

