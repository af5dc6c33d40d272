/* tb_topk_int.h -- what tb_topk.c (the sketches and the note) and
 * tb_topk_read.c (reading a window) share: the block's layout and the
 * small accessors both use, inline so that the note, the request path's
 * part, pays no call for them. */
#ifndef TB_TOPK_INT_H
#define TB_TOPK_INT_H

#include <string.h>

#include "tables/tb_tables_int.h"

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

static inline uint32_t index_size(uint32_t m)
{
    uint32_t n = 64;

    while (n < 2 * m) {
        n <<= 1;
    }
    return n;
}

static inline slot_t *slot_at(const tb_topk_t *t, int64_t minute)
{
    return (slot_t *)((char *)t->slots
                      + ((uint64_t)minute % TB_TOPK_SLOTS) * t->slot_bytes);
}

static inline counter_t *counters(const tb_topk_t *t, slot_t *s, int w)
{
    return (counter_t *)((char *)s + CNT_OFF) + (w ? t->m : 0);
}

static inline uint32_t *heap_of(const tb_topk_t *t, slot_t *s, int w)
{
    return (uint32_t *)((char *)s + t->heap_off) + (w ? t->m : 0);
}

static inline int valid(const tb_topk_t *t)
{
    return t && t->magic == TOPK_MAGIC;
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

#define META_KLEN(meta) ((size_t)((meta) >> 32) & 0xff)
#define META_LLEN(meta) ((size_t)((meta) >> 40) & 0xff)
/* Empty slot s for minute (the first writer of a new minute does). */
void tb__topk_slot_reset(const tb_topk_t *t, slot_t *s, int64_t minute);

#endif /* TB_TOPK_INT_H */
