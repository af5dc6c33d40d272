/* tb_tables_int.h -- the tables' internal header: what the files of
 * shared/tables/ share and what the decision path calls of them beyond
 * tb.h. Includes tb.h and the headers of the layers the tables stand on:
 * base/ (errors, SHA-256) and algo/ (the token bucket's C twin, which
 * the local policy's buckets run). */
#ifndef TB_TABLES_INT_H
#define TB_TABLES_INT_H

#include "tb.h"
#include "base/tb_base.h"
#include "algo/tb_algo_int.h"

/* ---- The block of tb_local.c and tb_leases.c (tb_table.c) ----------- */

#define TB__LOCAL_MAGIC 0x74626c31u /* "tbl1" */
#define TB__LEASE_MAGIC 0x74626c33u /* "tbl3": a lease table. */
/* Slots a key is looked for in, from its hash. */
#define TB__TABLE_PROBE 8

/* What every entry starts with: identity, last use, occupancy. */
typedef struct entry_head {
    unsigned char id[16];
    int64_t used_ms;  /* Last use, for LRU eviction.  */
    uint32_t inuse;
    uint32_t writing; /* 1 while a holder writes the entry (mark()). */
} entry_head_t;

struct tb_local {
    uint32_t magic;
    uint32_t pad;
    tb_shlock_t lock;
    uint64_t mask;   /* Entries - 1; entries is a power of two. */
    uint64_t used;
    uint64_t esize;  /* Bytes per entry, a multiple of 8.       */
    uint64_t epoch;  /* Lease tables: drains so far.            */
    uint64_t e[];    /* mask + 1 entries of esize bytes each.   */
};


/* Bytes of a table of entries entries (rounded up to a power of two, at
 * least 64) of esize bytes; make one in mem (zeroed, its lock made). */
size_t tb__table_size(size_t entries, size_t esize);
tb_local_t *tb__table_init(void *mem, size_t entries, size_t esize,
                           uint32_t magic);
/* Entry i (wrapped) of t. */
entry_head_t *tb__table_at(tb_local_t *t, uint64_t i);
/* An entry about to be written, and written: what a holder that dies
 * between the two leaves marked is dropped by the next taker. */
void tb__table_mark(entry_head_t *e);
void tb__table_unmark(entry_head_t *e);
/* t's lock, t repaired first when its last holder died holding it:
 * TB_OK, or TB_ERR (memory never initialised). */
int tb__table_lock(tb_local_t *t);
void tb__table_unlock(tb_local_t *t);
/* An entry's identity: the SHA-256 of a full Redis key (16 bytes kept). */
int tb__table_key_id(const char *key, unsigned char id[32]);
/* The entry of id, or NULL; claims nothing. */
entry_head_t *tb__table_find(tb_local_t *t, const unsigned char id[16]);
/* The entry for id: its own (*found 1), a free one or the least recently
 * used of its window (*found 0). */
entry_head_t *tb__table_slot(tb_local_t *t, const unsigned char id[16],
                             int *found);

/* ---- The local policy's tables (tb_local.c) ------------------------ */

/* The local failure policy's decision: n token buckets, the limits of
 * takes[i] divided by `replicas`, takes[i].cost from each, at now_ms, in
 * the caller's table. Keys are the full Redis keys (takes' routes are
 * not read). Returns TB_ERR on bad arguments. */
int tb_local_take(tb_local_t *t, const char *const *keys,
                  const tb_take_t *takes, int n, int replicas,
                  int64_t now_ms, tb_verdict_t *v);

/* The local policy's slot count of a concurrency limit, kept in the same
 * table as its buckets under the slot set's full Redis key, in windows
 * of window_ms (see "Concurrency limits" in tb.h). take: 1 when fewer
 * than limit slots were counted (one more is, and *window says in which
 * window, for the release), 0 when full; *held is the count after. -1 on
 * bad arguments. release: gives back one slot of `window`, or nothing
 * when that window has been forgotten. Both take the table's lock. */
int tb_local_conc_take(tb_local_t *t, const char *key, int64_t limit,
                       int64_t window_ms, int64_t now_ms, int64_t *window,
                       int64_t *held);
void tb_local_conc_release(tb_local_t *t, const char *key,
                           int64_t window_ms, int64_t window,
                           int64_t now_ms);

#endif /* TB_TABLES_INT_H */
