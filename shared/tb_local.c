/* tb_local.c -- the bounded table of local buckets behind the `local`
 * failure policy, and the same table holding token leases.
 *
 * When Redis cannot decide, each server falls back to its own buckets,
 * sized limit/replicas so that N replicas together still admit about the
 * shared limit. The table is one pointer-free block of fixed size that the
 * caller may place in shared memory (the Apache module does, so all
 * children of a server share one table). It never grows: a key is looked
 * for in a window of PROBE slots from its hash, and when the window is
 * full the least recently used entry there is evicted, so a flood of
 * distinct keys costs a bounded amount of memory and only forgets old
 * buckets (which then start full, as a missing Redis key does).
 *
 * Entries are identified by 16 bytes of SHA-256 of the full Redis key, so
 * hostile keys cannot collide with another client's entry. A spin lock in
 * the block serialises threads and processes; it is held for a hash look-up
 * and a few multiplications. A process that died holding it would wedge
 * the others, so a waiter takes the lock over after LOCK_STEAL_US.
 */
#include <sched.h>
#include <string.h>

#include "tb_int.h"

#define LOCAL_MAGIC 0x74626c31u /* "tbl1" */
#define LEASE_MAGIC 0x74626c32u /* "tbl2": a lease table. */
#define PROBE 8
#define LOCK_STEAL_US 100000

typedef struct local_entry {
    unsigned char id[16];
    double tokens;
    int64_t ts_ms;
    int64_t used_ms; /* Last use, for LRU eviction.  */
    uint32_t inuse;
    uint32_t pad;
} local_entry_t;

struct tb_local {
    uint32_t magic;
    uint32_t lock;
    uint64_t mask;   /* Entries - 1; entries is a power of two. */
    uint64_t used;
    local_entry_t e[];
};

static size_t round_entries(size_t entries)
{
    size_t n = 64;

    while (n < entries && n < ((size_t)1 << 30)) {
        n <<= 1;
    }
    return n;
}

size_t tb_local_size(size_t entries)
{
    return sizeof(struct tb_local)
           + round_entries(entries) * sizeof(local_entry_t);
}

tb_local_t *tb_local_init(void *mem, size_t entries)
{
    tb_local_t *t = mem;
    size_t n = round_entries(entries);

    if (!mem) {
        return NULL;
    }
    memset(t, 0, tb_local_size(entries));
    t->mask = n - 1;
    t->magic = LOCAL_MAGIC;
    return t;
}

static void lock(tb_local_t *t)
{
    tb_monotime_us start = 0;
    int spins = 0;

    while (__atomic_exchange_n(&t->lock, 1, __ATOMIC_ACQUIRE)) {
        if (++spins < 64) {
            continue;
        }
        if (!start) {
            start = tb_clock_now_us();
        }
        else if (tb_clock_now_us() - start > LOCK_STEAL_US) {
            /* The holder has been gone far longer than any critical
             * section takes: it died. Take the lock over. */
            break;
        }
        sched_yield();
    }
}

static void unlock(tb_local_t *t)
{
    __atomic_store_n(&t->lock, 0, __ATOMIC_RELEASE);
}

/* The slot for id: its own, a free one in the window, or the LRU one. */
static local_entry_t *slot(tb_local_t *t, const unsigned char id[16],
                           int *found)
{
    uint64_t h, i;
    local_entry_t *free_e = NULL, *lru = NULL;

    memcpy(&h, id, sizeof(h));
    for (i = 0; i < PROBE; i++) {
        local_entry_t *e = &t->e[(h + i) & t->mask];

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

int tb_local_take(tb_local_t *t, const char *const *keys,
                  const tb_limit_t *lim, const double *cost, int n,
                  int replicas, int64_t now_ms, tb_verdict_t *v)
{
    tb_bucket_t st[TB_MAX_BUCKETS];
    tb_limit_t div[TB_MAX_BUCKETS];
    local_entry_t *ent[TB_MAX_BUCKETS];
    unsigned char id[TB_MAX_BUCKETS][32];
    int i, rc;

    if (!t || t->magic != LOCAL_MAGIC || !keys || !lim || !cost || !v
        || n < 1 || n > TB_MAX_BUCKETS || replicas < 1) {
        return TB_ERR;
    }
    for (i = 0; i < n; i++) {
        /* Refuse bad input before any entry is claimed. */
        if (!keys[i] || tb_limit_check(&lim[i], NULL, 0) != TB_OK
            || !(cost[i] >= 0)
            || cost[i] > TB_MAX_CAPACITY) {
            return TB_ERR;
        }
    }
    for (i = 0; i < n; i++) {
        tb_sha256(keys[i], strlen(keys[i]), id[i]);
        div[i].capacity = lim[i].capacity / replicas;
        /* A share below one token could never admit anything. */
        if (div[i].capacity < 1) {
            div[i].capacity = 1;
        }
        div[i].rate_per_sec = lim[i].rate_per_sec / replicas;
    }
    lock(t);
    for (i = 0; i < n; i++) {
        int found;

        ent[i] = slot(t, id[i], &found);
        st[i].exists = found;
        st[i].tokens = found ? ent[i]->tokens : 0;
        st[i].ts_ms = found ? ent[i]->ts_ms : 0;
        if (!found) {
            /* Claim it now so a second key of this call cannot. */
            memcpy(ent[i]->id, id[i], 16);
            ent[i]->inuse = 1;
            ent[i]->tokens = div[i].capacity;
            ent[i]->ts_ms = now_ms;
        }
        ent[i]->used_ms = now_ms;
    }
    rc = tb_bucket_take(st, div, cost, n, now_ms, st, v);
    if (rc == TB_OK) {
        for (i = 0; i < n; i++) {
            ent[i]->tokens = st[i].tokens;
            ent[i]->ts_ms = st[i].ts_ms;
        }
    }
    unlock(t);
    return rc;
}

size_t tb_local_used(tb_local_t *t)
{
    return t ? (size_t)__atomic_load_n(&t->used, __ATOMIC_RELAXED) : 0;
}

/* ---- The lease table ---------------------------------------
 *
 * The same block, lock, probe window and LRU eviction, with another
 * magic; an entry's tokens are the lease's unspent tokens and its ts_ms
 * the lease's expiry. Spending is a look-up and a subtraction under the
 * lock, so a lease is never spent twice across children. */

size_t tb_lease_size(size_t entries)
{
    return tb_local_size(entries);
}

tb_lease_t *tb_lease_init(void *mem, size_t entries)
{
    tb_lease_t *t = tb_local_init(mem, entries);

    if (t) {
        t->magic = LEASE_MAGIC;
    }
    return t;
}

/* The entry of id, or NULL; claims nothing. */
static local_entry_t *find(tb_local_t *t, const unsigned char id[16])
{
    uint64_t h, i;

    memcpy(&h, id, sizeof(h));
    for (i = 0; i < PROBE; i++) {
        local_entry_t *e = &t->e[(h + i) & t->mask];

        if (e->inuse && memcmp(e->id, id, 16) == 0) {
            return e;
        }
    }
    return NULL;
}

int tb_lease_spend(tb_lease_t *t, const char *key, double cost,
                   int64_t now_ms, double *left)
{
    unsigned char id[32];
    local_entry_t *e;
    int hit = 0;

    if (!t || t->magic != LEASE_MAGIC || !key || !left || !(cost >= 0)
        || cost > TB_MAX_CAPACITY) {
        return -1;
    }
    tb_sha256(key, strlen(key), id);
    lock(t);
    e = find(t, id);
    if (e && now_ms < e->ts_ms && e->tokens >= cost) {
        e->tokens -= cost;
        e->used_ms = now_ms;
        *left = e->tokens;
        hit = 1;
    }
    unlock(t);
    return hit;
}

int tb_lease_store(tb_lease_t *t, const char *key, double tokens,
                   int64_t now_ms, int64_t expires_ms)
{
    unsigned char id[32];
    local_entry_t *e;
    int found;

    if (!t || t->magic != LEASE_MAGIC || !key || !(tokens >= 0)
        || tokens > TB_MAX_CAPACITY) {
        return TB_ERR;
    }
    tb_sha256(key, strlen(key), id);
    lock(t);
    e = slot(t, id, &found);
    if (found && now_ms < e->ts_ms) {
        /* Another child refilled too: keep both grants. */
        e->tokens += tokens;
        if (expires_ms > e->ts_ms) {
            e->ts_ms = expires_ms;
        }
    }
    else {
        memcpy(e->id, id, 16);
        e->inuse = 1;
        e->tokens = tokens;
        e->ts_ms = expires_ms;
    }
    e->used_ms = now_ms;
    unlock(t);
    return TB_OK;
}

size_t tb_lease_used(tb_lease_t *t)
{
    return tb_local_used(t);
}
