/* tb_table.c -- the block both tb_local.c and tb_leases.c are: a fixed
 * number of entries in caller memory (shared memory, for the module and
 * the shim), identified by 16 bytes of SHA-256 of a full Redis key, found
 * in a window of TB__TABLE_PROBE slots from its hash, the least recently
 * used of the window evicted when it is full, so that a flood of distinct
 * keys costs bounded memory and only forgets old entries. One lock
 * (tb_shlock_t, a robust mutex) serialises threads and processes. A holder
 * that dies holding it hands it to the next taker, which repairs the
 * table first: every write to an entry happens between tb__table_mark()
 * and tb__table_unmark(), so the entries a dead holder may have half
 * written are the ones still marked, and those are dropped. */
#include <string.h>

#include "tables/tb_tables_int.h"

static size_t tb__table_round(size_t entries)
{
    size_t n = 64;

    while (n < entries && n < ((size_t)1 << 30)) {
        n <<= 1;
    }
    return n;
}

size_t tb__table_size(size_t entries, size_t esize)
{
    return sizeof(struct tb_local) + tb__table_round(entries) * esize;
}

tb_local_t *tb__table_init(void *mem, size_t entries, size_t esize,
                              uint32_t magic)
{
    tb_local_t *t = mem;
    size_t n = tb__table_round(entries);

    if (!mem) {
        return NULL;
    }
    memset(t, 0, tb__table_size(entries, esize));
    if (tb_shlock_init(&t->lock) != TB_OK) {
        return NULL;
    }
    t->mask = n - 1;
    t->esize = esize;
    t->magic = magic;
    return t;
}

entry_head_t *tb__table_at(tb_local_t *t, uint64_t i)
{
    return (entry_head_t *)((char *)t->e + (i & t->mask) * t->esize);
}

/* An entry about to be written, and written: a holder that dies between
 * the two leaves it marked. The fences keep the compiler from moving the
 * entry's stores across the marks: a process dies between two
 * instructions, and the kernel's release of its robust mutexes orders
 * every store it made before the next taker's. */
void tb__table_mark(entry_head_t *e)
{
    __atomic_store_n(&e->writing, 1, __ATOMIC_RELAXED);
    __atomic_signal_fence(__ATOMIC_SEQ_CST);
}

void tb__table_unmark(entry_head_t *e)
{
    __atomic_signal_fence(__ATOMIC_SEQ_CST);
    __atomic_store_n(&e->writing, 0, __ATOMIC_RELAXED);
}

/* The table after its last holder died holding the lock: entries still
 * marked are dropped, and the count of entries in use, which that holder
 * may have moved without its entry, is counted again. The header's other
 * fields are written once by table_init, or in one atomic add (epoch).
 * One pass over every entry, once per holder that died. */
static void tb__table_repair(tb_local_t *t)
{
    uint64_t i, used = 0;

    for (i = 0; i <= t->mask; i++) {
        entry_head_t *e = tb__table_at(t, i);

        if (e->writing) {
            e->inuse = 0;
            e->writing = 0;
        }
        used += e->inuse != 0;
    }
    __atomic_store_n(&t->used, used, __ATOMIC_RELAXED);
}

/* Take the table's lock (tb_shlock.c), repairing the table when its last
 * holder died holding it. TB_OK, or TB_ERR when the lock cannot be taken
 * (memory never initialised): the caller then does nothing. */
int tb__table_lock(tb_local_t *t)
{
    int rc = tb_shlock_take(&t->lock);

    if (rc == TB_SHLOCK_RECOVERED) {
        tb__table_repair(t);
        return TB_OK;
    }
    return rc;
}

void tb__table_unlock(tb_local_t *t)
{
    tb_shlock_release(&t->lock);
}

/* The identity of the entry of a full Redis key: its SHA-256, of which
 * the first 16 bytes are kept. TB_OK, or TB_ERR when libcrypto could not
 * make it. */
int tb__table_key_id(const char *key, unsigned char id[32])
{
    return tb_sha256(key, strlen(key), id);
}

/* The entry of id, or NULL; claims nothing. */
entry_head_t *tb__table_find(tb_local_t *t, const unsigned char id[16])
{
    uint64_t h, i;

    memcpy(&h, id, sizeof(h));
    for (i = 0; i < TB__TABLE_PROBE; i++) {
        entry_head_t *e = tb__table_at(t, h + i);

        if (e->inuse && memcmp(e->id, id, 16) == 0) {
            return e;
        }
    }
    return NULL;
}

/* The slot for id: its own, a free one in the window, or the LRU one. */
entry_head_t *tb__table_slot(tb_local_t *t, const unsigned char id[16],
                          int *found)
{
    uint64_t h, i;
    entry_head_t *free_e = NULL, *lru = NULL;

    memcpy(&h, id, sizeof(h));
    for (i = 0; i < TB__TABLE_PROBE; i++) {
        entry_head_t *e = tb__table_at(t, h + i);

        if (e->inuse && memcmp(e->id, id, 16) == 0) {
            *found = 1;
            return e;
        }
        if (!e->inuse) {
            if (!free_e) {
                free_e = e;
            }
        }
        else if (!lru || e->used_ms < lru->used_ms) {
            lru = e;
        }
    }
    *found = 0;
    if (free_e) {
        t->used++;
        return free_e;
    }
    return lru;
}

