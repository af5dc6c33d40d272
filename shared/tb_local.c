/* tb_local.c -- bounded tables in caller memory: the local buckets behind
 * the `local` failure policy with the slot counts of its concurrency
 * limits, and the token leases a server takes from the shared buckets.
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
 * hostile keys cannot collide with another client's entry. A lock in the
 * block (tb_shlock_t) serialises threads and processes; it is held for a
 * hash look-up and a few multiplications. A holder that dies holding it
 * hands it to the next taker, which repairs the table first (repair()):
 * every write to an entry happens between mark() and unmark(), so the
 * entries a dead holder may have half written are the ones still marked,
 * and those are dropped, as an eviction drops an entry. What dropping
 * costs: a local bucket starts full again, a slot count forgets the
 * slots it counted (up to one limit more is admitted until they would
 * have expired, two windows at most), a lease loses its unspent tokens
 * (never given back; the shared bucket refills them) and its traffic.
 *
 * A lease table is the same block with larger entries (lease_entry_t):
 * besides the unspent tokens and their expiry, each keeps the bucket's
 * full key and limit, so that tokens can go back to the shared bucket
 * without the request that took them, and the key's recent traffic on
 * this server, which sizes its next lease.
 */
#include <math.h>
#include <string.h>

#include "tb_int.h"

#define LOCAL_MAGIC 0x74626c31u /* "tbl1" */
#define LEASE_MAGIC 0x74626c33u /* "tbl3": a lease table. */
#define PROBE 8

/* What every entry starts with: identity, last use, occupancy. */
typedef struct entry_head {
    unsigned char id[16];
    int64_t used_ms;  /* Last use, for LRU eviction.  */
    uint32_t inuse;
    uint32_t writing; /* 1 while a holder writes the entry (mark()). */
} entry_head_t;

/* A local bucket: tokens at ts_ms. A concurrency count keeps the slots
 * taken in window ts_ms (a window number) in tokens and those of the
 * window before in prev. Keys tell them apart: a slot set's key (":conc")
 * is never a bucket's. */
typedef struct local_entry {
    entry_head_t h;
    double tokens;
    int64_t ts_ms;
    uint32_t prev;
    uint32_t pad;
} local_entry_t;

/* A lease and its key's recent traffic. */
typedef struct lease_entry {
    entry_head_t h;
    double tokens;       /* Unspent tokens.                              */
    int64_t expires_ms;  /* Spendable before this time.                  */
    double recent;       /* Tokens asked here, each weighted by
                          * exp(-age / ttl_ms): about one ttl of traffic.*/
    int64_t recent_ms;   /* When recent was last decayed.                */
    int64_t ttl_ms;      /* The last lease's ttl, the decay's constant.  */
    tb_limit_t limit;    /* The bucket's limit, for giving tokens back.  */
    int32_t owner;       /* The host's tag (tb_lease_info_t).            */
    uint32_t pad;
    char key[TB_KEY_BUF]; /* The bucket's full Redis key.                */
} lease_entry_t;

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

static size_t round_entries(size_t entries)
{
    size_t n = 64;

    while (n < entries && n < ((size_t)1 << 30)) {
        n <<= 1;
    }
    return n;
}

static size_t table_size(size_t entries, size_t esize)
{
    return sizeof(struct tb_local) + round_entries(entries) * esize;
}

static tb_local_t *table_init(void *mem, size_t entries, size_t esize,
                              uint32_t magic)
{
    tb_local_t *t = mem;
    size_t n = round_entries(entries);

    if (!mem) {
        return NULL;
    }
    memset(t, 0, table_size(entries, esize));
    if (tb_shlock_init(&t->lock) != TB_OK) {
        return NULL;
    }
    t->mask = n - 1;
    t->esize = esize;
    t->magic = magic;
    return t;
}

static entry_head_t *entry_at(tb_local_t *t, uint64_t i)
{
    return (entry_head_t *)((char *)t->e + (i & t->mask) * t->esize);
}

size_t tb_local_size(size_t entries)
{
    return table_size(entries, sizeof(local_entry_t));
}

tb_local_t *tb_local_init(void *mem, size_t entries)
{
    return table_init(mem, entries, sizeof(local_entry_t), LOCAL_MAGIC);
}

/* An entry about to be written, and written: a holder that dies between
 * the two leaves it marked. The fences keep the compiler from moving the
 * entry's stores across the marks: a process dies between two
 * instructions, and the kernel's release of its robust mutexes orders
 * every store it made before the next taker's. */
static void mark(entry_head_t *e)
{
    __atomic_store_n(&e->writing, 1, __ATOMIC_RELAXED);
    __atomic_signal_fence(__ATOMIC_SEQ_CST);
}

static void unmark(entry_head_t *e)
{
    __atomic_signal_fence(__ATOMIC_SEQ_CST);
    __atomic_store_n(&e->writing, 0, __ATOMIC_RELAXED);
}

/* The table after its last holder died holding the lock: entries still
 * marked are dropped, and the count of entries in use, which that holder
 * may have moved without its entry, is counted again. The header's other
 * fields are written once by table_init, or in one atomic add (epoch).
 * One pass over every entry, once per holder that died. */
static void repair(tb_local_t *t)
{
    uint64_t i, used = 0;

    for (i = 0; i <= t->mask; i++) {
        entry_head_t *e = entry_at(t, i);

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
static int lock(tb_local_t *t)
{
    int rc = tb_shlock_take(&t->lock);

    if (rc == TB_SHLOCK_RECOVERED) {
        repair(t);
        return TB_OK;
    }
    return rc;
}

static void unlock(tb_local_t *t)
{
    tb_shlock_release(&t->lock);
}

/* The identity of the entry of a full Redis key: its SHA-256, of which
 * the first 16 bytes are kept. TB_OK, or TB_ERR when libcrypto could not
 * make it. */
static int key_id(const char *key, unsigned char id[32])
{
    return tb_sha256(key, strlen(key), id);
}

/* The entry of id, or NULL; claims nothing. */
static entry_head_t *find(tb_local_t *t, const unsigned char id[16])
{
    uint64_t h, i;

    memcpy(&h, id, sizeof(h));
    for (i = 0; i < PROBE; i++) {
        entry_head_t *e = entry_at(t, h + i);

        if (e->inuse && memcmp(e->id, id, 16) == 0) {
            return e;
        }
    }
    return NULL;
}

/* The slot for id: its own, a free one in the window, or the LRU one. */
static entry_head_t *slot(tb_local_t *t, const unsigned char id[16],
                          int *found)
{
    uint64_t h, i;
    entry_head_t *free_e = NULL, *lru = NULL;

    memcpy(&h, id, sizeof(h));
    for (i = 0; i < PROBE; i++) {
        entry_head_t *e = entry_at(t, h + i);

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
                  const tb_take_t *takes, int n, int replicas,
                  int64_t now_ms, tb_verdict_t *v)
{
    tb_bucket_t st[TB_MAX_BUCKETS];
    tb_limit_t div[TB_MAX_BUCKETS];
    double cost[TB_MAX_BUCKETS];
    local_entry_t *ent[TB_MAX_BUCKETS];
    unsigned char id[TB_MAX_BUCKETS][32];
    int i, rc;

    if (!t || t->magic != LOCAL_MAGIC || !keys || !takes || !v || n < 1
        || n > TB_MAX_BUCKETS || replicas < 1) {
        return TB_ERR;
    }
    for (i = 0; i < n; i++) {
        /* Refuse bad input before any entry is claimed. */
        if (!keys[i] || tb_limit_check(&takes[i].limit, NULL, 0) != TB_OK
            || !(takes[i].cost >= 0) || takes[i].cost > TB_MAX_CAPACITY) {
            return TB_ERR;
        }
    }
    for (i = 0; i < n; i++) {
        if (key_id(keys[i], id[i]) != TB_OK) {
            return TB_ERR;
        }
        cost[i] = takes[i].cost;
        div[i].capacity = takes[i].limit.capacity / replicas;
        /* A share below one token could never admit anything. */
        if (div[i].capacity < 1) {
            div[i].capacity = 1;
        }
        div[i].rate_per_sec = takes[i].limit.rate_per_sec / replicas;
    }
    if (lock(t) != TB_OK) {
        return TB_ERR;
    }
    for (i = 0; i < n; i++) {
        int found;

        ent[i] = (local_entry_t *)slot(t, id[i], &found);
        mark(&ent[i]->h);
        st[i].exists = found;
        st[i].tokens = found ? ent[i]->tokens : 0;
        st[i].ts_ms = found ? ent[i]->ts_ms : 0;
        if (!found) {
            /* Claim it now so a second key of this call cannot. */
            memcpy(ent[i]->h.id, id[i], 16);
            ent[i]->h.inuse = 1;
            ent[i]->tokens = div[i].capacity;
            ent[i]->ts_ms = now_ms;
        }
        ent[i]->h.used_ms = now_ms;
    }
    rc = tb_bucket_take(st, div, cost, n, now_ms, st, v);
    for (i = 0; i < n; i++) {
        if (rc == TB_OK) {
            ent[i]->tokens = st[i].tokens;
            ent[i]->ts_ms = st[i].ts_ms;
        }
        unmark(&ent[i]->h);
    }
    unlock(t);
    return rc;
}

size_t tb_local_used(tb_local_t *t)
{
    return t ? (size_t)__atomic_load_n(&t->used, __ATOMIC_RELAXED) : 0;
}

/* ---- Slot counts of concurrency limits ------------------------------
 *
 * A count per slot set, in windows of window_ms: the slots taken in the
 * current window and in the one before are in flight; older ones are
 * forgotten, which is how the slot of a process that died frees itself.
 * A slot is thus counted for between one and two windows. */

/* Move e to window w: the current count becomes the previous one when w
 * follows it, and both are dropped when w is further on. A window that
 * went backwards (a clock step) keeps the counts. */
static void conc_roll(local_entry_t *e, int64_t w)
{
    if (w == e->ts_ms + 1) {
        e->prev = (uint32_t)e->tokens;
        e->tokens = 0;
        e->ts_ms = w;
    }
    else if (w > e->ts_ms + 1) {
        e->prev = 0;
        e->tokens = 0;
        e->ts_ms = w;
    }
}

int tb_local_conc_take(tb_local_t *t, const char *key, int64_t limit,
                       int64_t window_ms, int64_t now_ms, int64_t *window,
                       int64_t *held)
{
    unsigned char id[32];
    local_entry_t *e;
    int64_t w, n;
    int found, taken = 0;

    if (!t || t->magic != LOCAL_MAGIC || !key || limit < 1
        || limit > TB_MAX_CONCURRENCY || window_ms < 1 || now_ms < 0
        || !window || !held || key_id(key, id) != TB_OK) {
        return -1;
    }
    w = now_ms / window_ms;
    if (lock(t) != TB_OK) {
        return -1;
    }
    e = (local_entry_t *)slot(t, id, &found);
    mark(&e->h);
    if (!found) {
        memcpy(e->h.id, id, 16);
        e->h.inuse = 1;
        e->tokens = 0;
        e->prev = 0;
        e->ts_ms = w;
    }
    conc_roll(e, w);
    e->h.used_ms = now_ms;
    n = (int64_t)e->tokens + e->prev;
    if (n < limit) {
        e->tokens += 1;
        n++;
        taken = 1;
    }
    *window = e->ts_ms;
    *held = n;
    unmark(&e->h);
    unlock(t);
    return taken;
}

void tb_local_conc_release(tb_local_t *t, const char *key,
                           int64_t window_ms, int64_t window,
                           int64_t now_ms)
{
    unsigned char id[32];
    local_entry_t *e;

    if (!t || t->magic != LOCAL_MAGIC || !key || window_ms < 1
        || now_ms < 0 || key_id(key, id) != TB_OK || lock(t) != TB_OK) {
        return;
    }
    e = (local_entry_t *)find(t, id);
    if (e) {
        mark(&e->h);
        conc_roll(e, now_ms / window_ms);
        if (window == e->ts_ms && e->tokens >= 1) {
            e->tokens -= 1;
        }
        else if (window == e->ts_ms - 1 && e->prev > 0) {
            e->prev--;
        }
        unmark(&e->h);
    }
    unlock(t);
}

/* ---- The lease table -------------------------------------------------
 *
 * Spending is a look-up and a subtraction under the lock, so a lease is
 * never spent twice across children. Tokens leave the table only by
 * being spent, by tb_lease_plan (an expired lease's, to be returned in
 * the call that refills) and by tb_lease_drain (every lease's, to be
 * returned when the server stops); an entry evicted to make room for
 * another key (eight keys in its probe window, all used more recently)
 * loses them. */

size_t tb_lease_size(size_t entries)
{
    return table_size(entries, sizeof(lease_entry_t));
}

tb_lease_t *tb_lease_init(void *mem, size_t entries)
{
    return table_init(mem, entries, sizeof(lease_entry_t), LEASE_MAGIC);
}

static int lease_table(const tb_lease_t *t)
{
    return t && t->magic == LEASE_MAGIC;
}

/* Bring e->recent to now_ms and add cost. A clock read earlier by
 * another process (now_ms < recent_ms) decays nothing. */
static void count_traffic(lease_entry_t *e, double cost, int64_t now_ms)
{
    if (now_ms > e->recent_ms && e->ttl_ms > 0) {
        e->recent *= exp(-(double)(now_ms - e->recent_ms)
                         / (double)e->ttl_ms);
        e->recent_ms = now_ms;
    }
    e->recent += cost;
}

int tb_lease_spend(tb_lease_t *t, const char *key, double cost,
                   int64_t now_ms, double *left)
{
    unsigned char id[32];
    lease_entry_t *e;
    int hit = 0;

    if (!lease_table(t) || !key || !left || !(cost >= 0)
        || cost > TB_MAX_CAPACITY || key_id(key, id) != TB_OK
        || lock(t) != TB_OK) {
        return -1;
    }
    e = (lease_entry_t *)find(t, id);
    if (e && now_ms < e->expires_ms && e->tokens >= cost) {
        mark(&e->h);
        e->tokens -= cost;
        e->h.used_ms = now_ms;
        count_traffic(e, cost, now_ms);
        *left = e->tokens;
        hit = 1;
        unmark(&e->h);
    }
    unlock(t);
    return hit;
}

static int info_valid(const tb_lease_info_t *in)
{
    return in && in->key && in->key[0] && strlen(in->key) < TB_KEY_BUF
           && tb_limit_check(&in->limit, NULL, 0) == TB_OK
           && in->ttl_ms >= 1 && in->ttl_ms <= 86400000;
}

/* Make e the entry of in, keeping its traffic when it already was. */
static void entry_claim(lease_entry_t *e, const unsigned char id[16],
                        const tb_lease_info_t *in, int found,
                        int64_t now_ms)
{
    if (!found) {
        memset((char *)e + sizeof(e->h), 0, sizeof(*e) - sizeof(e->h));
        memcpy(e->h.id, id, 16);
        e->h.inuse = 1;
        e->recent_ms = now_ms;
    }
    e->ttl_ms = in->ttl_ms;
    e->limit = in->limit;
    e->owner = in->owner;
    memcpy(e->key, in->key, strlen(in->key) + 1);
    e->h.used_ms = now_ms;
}

int tb_lease_plan(tb_lease_t *t, const tb_lease_info_t *in, double cost,
                  double max, int64_t now_ms, tb_lease_plan_t *plan)
{
    unsigned char id[32];
    lease_entry_t *e;
    double want;
    int found;

    if (!lease_table(t) || !info_valid(in) || !plan || !(cost >= 0)
        || !(max >= cost) || max > TB_MAX_LEASE
        || key_id(in->key, id) != TB_OK || lock(t) != TB_OK) {
        return TB_ERR;
    }
    e = (lease_entry_t *)slot(t, id, &found);
    mark(&e->h);
    entry_claim(e, id, in, found, now_ms);
    count_traffic(e, cost, now_ms);
    plan->back = 0;
    if (now_ms >= e->expires_ms && e->tokens > 0) {
        plan->back = e->tokens;
        e->tokens = 0;
    }
    plan->epoch = t->epoch;
    want = floor(e->recent);
    unmark(&e->h);
    unlock(t);
    if (want > max) {
        want = max;
    }
    plan->want = want < cost ? cost : want;
    return TB_OK;
}

int tb_lease_store(tb_lease_t *t, const tb_lease_info_t *in,
                   const tb_lease_plan_t *plan, double tokens,
                   int64_t now_ms)
{
    unsigned char id[32];
    lease_entry_t *e;
    int found, kept = 0;

    if (!lease_table(t) || !info_valid(in) || !plan || !(tokens >= 0)
        || tokens > TB_MAX_CAPACITY || key_id(in->key, id) != TB_OK
        || lock(t) != TB_OK) {
        return -1;
    }
    if (t->epoch == plan->epoch) {
        e = (lease_entry_t *)slot(t, id, &found);
        mark(&e->h);
        entry_claim(e, id, in, found, now_ms);
        if (now_ms < e->expires_ms) {
            /* Another child refilled too: keep both grants. */
            e->tokens += tokens;
        }
        else {
            e->tokens = tokens;
        }
        if (now_ms + in->ttl_ms > e->expires_ms) {
            e->expires_ms = now_ms + in->ttl_ms;
        }
        unmark(&e->h);
        kept = 1;
    }
    unlock(t);
    return kept;
}

int tb_lease_credit(tb_lease_t *t, const char *key, double tokens,
                    int64_t now_ms)
{
    unsigned char id[32];
    lease_entry_t *e;
    int kept = 0;

    if (!lease_table(t) || !key || !(tokens >= 0)
        || tokens > TB_MAX_CAPACITY || key_id(key, id) != TB_OK
        || lock(t) != TB_OK) {
        return -1;
    }
    e = (lease_entry_t *)find(t, id);
    if (e && now_ms < e->expires_ms) {
        mark(&e->h);
        e->tokens += tokens;
        e->h.used_ms = now_ms;
        unmark(&e->h);
        kept = 1;
    }
    unlock(t);
    return kept;
}

uint64_t tb_lease_epoch(tb_lease_t *t)
{
    return lease_table(t) ? __atomic_load_n(&t->epoch, __ATOMIC_ACQUIRE)
                          : 0;
}

size_t tb_lease_drain(tb_lease_t *t, tb_lease_give_fn give, void *arg)
{
    size_t n = 0;
    uint64_t i;

    if (!lease_table(t) || lock(t) != TB_OK) {
        return 0;
    }
    __atomic_add_fetch(&t->epoch, 1, __ATOMIC_RELEASE);
    unlock(t);
    /* One entry at a time, so give() (a Redis call) never runs under the
     * lock that every child's requests take. */
    for (i = 0; i <= t->mask; i++) {
        lease_entry_t copy, *e;
        tb_lease_info_t info;

        if (lock(t) != TB_OK) {
            break;
        }
        e = (lease_entry_t *)entry_at(t, i);
        copy.h.inuse = e->h.inuse;
        if (e->h.inuse) {
            /* One store drops it: nothing to mark (repair() counts the
             * entries in use again). */
            memcpy(&copy, e, sizeof(copy));
            e->h.inuse = 0;
            t->used--;
        }
        unlock(t);
        if (!copy.h.inuse || !(copy.tokens > 0)) {
            continue;
        }
        copy.key[TB_KEY_BUF - 1] = '\0';
        info.key = copy.key;
        info.limit = copy.limit;
        info.ttl_ms = copy.ttl_ms;
        info.owner = copy.owner;
        if (give) {
            give(arg, &info, copy.tokens);
        }
        n++;
    }
    return n;
}

size_t tb_lease_used(tb_lease_t *t)
{
    return tb_local_used(t);
}
