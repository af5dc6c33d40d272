/* tb_local.c -- the local buckets behind the `local` failure policy, and
 * the slot counts of its concurrency limits, in a table (tb_table.c).
 *
 * When Redis cannot decide, each server falls back to its own buckets,
 * sized limit/replicas so that N replicas together still admit about the
 * shared limit; a concurrency limit to a count of this server's slots
 * against ceil(N/replicas). What dropping an entry costs (an eviction, or
 * the repair after a holder died): a local bucket starts full again, a
 * slot count forgets the slots it counted (up to one limit more is
 * admitted until they would have expired, two windows at most). */
#include <math.h>
#include <string.h>

#include "tables/tb_tables_int.h"

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

size_t tb_local_size(size_t entries)
{
    return tb__table_size(entries, sizeof(local_entry_t));
}

tb_local_t *tb_local_init(void *mem, size_t entries)
{
    return tb__table_init(mem, entries, sizeof(local_entry_t), TB__LOCAL_MAGIC);
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

    if (!t || t->magic != TB__LOCAL_MAGIC || !keys || !takes || !v || n < 1
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
        if (tb__table_key_id(keys[i], id[i]) != TB_OK) {
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
    if (tb__table_lock(t) != TB_OK) {
        return TB_ERR;
    }
    for (i = 0; i < n; i++) {
        int found;

        ent[i] = (local_entry_t *)tb__table_slot(t, id[i], &found);
        tb__table_mark(&ent[i]->h);
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
        tb__table_unmark(&ent[i]->h);
    }
    tb__table_unlock(t);
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

    if (!t || t->magic != TB__LOCAL_MAGIC || !key || limit < 1
        || limit > TB_MAX_CONCURRENCY || window_ms < 1 || now_ms < 0
        || !window || !held || tb__table_key_id(key, id) != TB_OK) {
        return -1;
    }
    w = now_ms / window_ms;
    if (tb__table_lock(t) != TB_OK) {
        return -1;
    }
    e = (local_entry_t *)tb__table_slot(t, id, &found);
    tb__table_mark(&e->h);
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
    tb__table_unmark(&e->h);
    tb__table_unlock(t);
    return taken;
}

void tb_local_conc_release(tb_local_t *t, const char *key,
                           int64_t window_ms, int64_t window,
                           int64_t now_ms)
{
    unsigned char id[32];
    local_entry_t *e;

    if (!t || t->magic != TB__LOCAL_MAGIC || !key || window_ms < 1
        || now_ms < 0 || tb__table_key_id(key, id) != TB_OK || tb__table_lock(t) != TB_OK) {
        return;
    }
    e = (local_entry_t *)tb__table_find(t, id);
    if (e) {
        tb__table_mark(&e->h);
        conc_roll(e, now_ms / window_ms);
        if (window == e->ts_ms && e->tokens >= 1) {
            e->tokens -= 1;
        }
        else if (window == e->ts_ms - 1 && e->prev > 0) {
            e->prev--;
        }
        tb__table_unmark(&e->h);
    }
    tb__table_unlock(t);
}

