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

#include "base/tb_base.h"

#define TOPK_MAGIC 0x74626b33u          /* "tbk3"                       */
#define MINUTE_MS 60000
#define DECISIONS 0                     /* The two sketches of a slot.   */
#define REFUSALS 1
#define NIL 0xffffffffu

/* A key is counted under the bytes the host gave (up to TB_KEY_RAW_MAX,
 * which tb_key_sanitize keeps or hashes, one to one) or, for a longer
 * key, under its sanitised form; either way in zero-padded words, so
 * that two keys compare a word at a time. What a reader shows is the
 * sanitised form, made from those bytes when read. */
#define KEY_WORDS (TB_KEY_RAW_MAX / 8)

/* Bits of a key's identity besides its bytes (meta, bits 48 up). */
#define FLAG_IP 1u                      /* A client keyed by address.    */
#define FLAG_LONG 2u                    /* Bytes are the sanitised form
                                         * of a longer key.              */

/* One counter. count is what Space-Saving reports: the events since the
 * counter took its key plus err, the count it inherited then. allowed
 * and refused are the events themselves, split. meta packs the virtual
 * host (bits 0-31), the key's and the limit's lengths (32-39, 40-47) and
 * the FLAG_ bits, so that one comparison checks them all. */
typedef struct counter {
    uint64_t hash;
    uint64_t meta;
    uint64_t lw;                        /* The limit's first 8 bytes,
                                         * zero-padded.                  */
    uint32_t count;
    uint32_t err;
    uint32_t allowed;
    uint32_t refused;
    int64_t last_refusal_ms;
    uint32_t heap_pos;                  /* Its place in the heap.        */
    uint32_t pad;
    uint64_t kw[KEY_WORDS];
    char limit[TB_NAME_MAX + 1];
} counter_t;

typedef struct sketch {
    uint32_t n;                         /* Counters in use.              */
    uint32_t pad;
    uint64_t events;                    /* Events counted this minute.   */
} sketch_t;

/* A minute's slot; its counters, heaps and indexes follow it. */
typedef struct slot {
    tb_shlock_t lock;
    int64_t minute;                     /* Minutes since the epoch; -1
                                         * never used.                   */
    sketch_t sk[2];
} slot_t;

/* The block. The offsets are bytes from a slot's start: counters of
 * sketch w at CNT_OFF + w * m counters, its heap (m counter numbers) at
 * heap_off + w * m words, its index at idx_off + w * isize words. */
struct tb_topk {
    uint32_t magic;
    uint32_t k;
    uint32_t m;                         /* Counters per sketch.          */
    uint32_t isize;                     /* Index words per sketch, a
                                         * power of two >= 2m.           */
    uint64_t slot_bytes;
    uint64_t heap_off, idx_off;
    int64_t newest;                     /* The newest minute written.    */
    uint64_t slots[];                   /* TB_TOPK_SLOTS slots.          */
};

#define ALIGN8(n) (((n) + 7) & ~(size_t)7)
#define CNT_OFF ALIGN8(sizeof(slot_t))

/* The steps of a note, inlined into it whatever the compiler's size
 * heuristics say: out of line, their calls and register saves were a
 * fifth of a note's instructions (callgrind). */
#define NOTE_STEP static inline __attribute__((always_inline))

static uint32_t counters_of(int k)
{
    return k * 8 > 64 ? (uint32_t)k * 8 : 64;
}

static uint32_t index_size(uint32_t m)
{
    uint32_t n = 64;

    while (n < 2 * m) {
        n <<= 1;
    }
    return n;
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

static slot_t *slot_at(const tb_topk_t *t, int64_t minute)
{
    return (slot_t *)((char *)t->slots
                      + ((uint64_t)minute % TB_TOPK_SLOTS) * t->slot_bytes);
}

static counter_t *counters(const tb_topk_t *t, slot_t *s, int w)
{
    return (counter_t *)((char *)s + CNT_OFF) + (w ? t->m : 0);
}

static uint32_t *heap_of(const tb_topk_t *t, slot_t *s, int w)
{
    return (uint32_t *)((char *)s + t->heap_off) + (w ? t->m : 0);
}

static uint32_t *index_of(const tb_topk_t *t, slot_t *s, int w)
{
    return (uint32_t *)((char *)s + t->idx_off) + (w ? t->isize : 0);
}

/* Empty a slot for minute: counters in use and index only; the counters
 * themselves are written when taken. */
static void slot_reset(const tb_topk_t *t, slot_t *s, int64_t minute)
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
        slot_reset(t, s, -1);
    }
    t->magic = TOPK_MAGIC;
    return t;
}

static int valid(const tb_topk_t *t)
{
    return t && t->magic == TOPK_MAGIC;
}

int tb_topk_k(const tb_topk_t *t)
{
    return valid(t) ? (int)t->k : 0;
}

int tb_topk_counters(const tb_topk_t *t)
{
    return valid(t) ? (int)t->m : 0;
}

/* Take the slot's lock (tb_shlock.c): TB_OK, or TB_SHLOCK_RECOVERED when
 * its last holder died holding it (the slot may be half updated: the
 * caller empties it), or TB_ERR when the lock cannot be taken (memory
 * never initialised) and the caller leaves the slot alone. */
static inline int lock(slot_t *s)
{
    return tb_shlock_take(&s->lock);
}

static inline void unlock(slot_t *s)
{
    tb_shlock_release(&s->lock);
}

/* ---- One sketch -------------------------------------------------------
 *
 * Index words: NIL when free, else the counter's number in the low 16
 * bits (m <= 8000) and the top 16 bits of its hash above them, so a
 * probe passes most other keys without reading their counters. */

#define TAG(h) ((uint32_t)((h) >> 48) << 16)
#define META_KLEN(meta) ((size_t)((meta) >> 32) & 0xff)
#define META_LLEN(meta) ((size_t)((meta) >> 40) & 0xff)

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
        slot_reset(t, s, minute);
    }
    count(t, s, DECISIONS, &p, refused, now_ms);
    if (refused) {
        count_refusal(t, s, &p, now_ms);
    }
    unlock(s);
}

/* ---- Reading ---------------------------------------------------------- */

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
        slot_reset(t, s, -1);
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
