/* tb_leases.c -- the lease table: tokens a server took from a shared
 * bucket in one call and spends without asking Redis again, in a table
 * (tb_table.c) with larger entries: besides the unspent tokens and their
 * expiry, each keeps the bucket's full key and limit, so that tokens can
 * go back to the shared bucket without the request that took them, and
 * the key's recent traffic on this server, which sizes its next lease.
 * Dropping an entry (an eviction, or the repair after a holder died)
 * loses its unspent tokens, which the shared bucket then refills. */
#include <math.h>
#include <string.h>

#include "tables/tb_tables_int.h"

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
    return tb__table_size(entries, sizeof(lease_entry_t));
}

tb_lease_t *tb_lease_init(void *mem, size_t entries)
{
    return tb__table_init(mem, entries, sizeof(lease_entry_t), TB__LEASE_MAGIC);
}

static int lease_table(const tb_lease_t *t)
{
    return t && t->magic == TB__LEASE_MAGIC;
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
        || cost > TB_MAX_CAPACITY || tb__table_key_id(key, id) != TB_OK
        || tb__table_lock(t) != TB_OK) {
        return -1;
    }
    e = (lease_entry_t *)tb__table_find(t, id);
    if (e && now_ms < e->expires_ms && e->tokens >= cost) {
        tb__table_mark(&e->h);
        e->tokens -= cost;
        e->h.used_ms = now_ms;
        count_traffic(e, cost, now_ms);
        *left = e->tokens;
        hit = 1;
        tb__table_unmark(&e->h);
    }
    tb__table_unlock(t);
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
        || tb__table_key_id(in->key, id) != TB_OK || tb__table_lock(t) != TB_OK) {
        return TB_ERR;
    }
    e = (lease_entry_t *)tb__table_slot(t, id, &found);
    tb__table_mark(&e->h);
    entry_claim(e, id, in, found, now_ms);
    count_traffic(e, cost, now_ms);
    plan->back = 0;
    if (now_ms >= e->expires_ms && e->tokens > 0) {
        plan->back = e->tokens;
        e->tokens = 0;
    }
    plan->epoch = t->epoch;
    want = floor(e->recent);
    tb__table_unmark(&e->h);
    tb__table_unlock(t);
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
        || tokens > TB_MAX_CAPACITY || tb__table_key_id(in->key, id) != TB_OK
        || tb__table_lock(t) != TB_OK) {
        return -1;
    }
    if (t->epoch == plan->epoch) {
        e = (lease_entry_t *)tb__table_slot(t, id, &found);
        tb__table_mark(&e->h);
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
        tb__table_unmark(&e->h);
        kept = 1;
    }
    tb__table_unlock(t);
    return kept;
}

int tb_lease_credit(tb_lease_t *t, const char *key, double tokens,
                    int64_t now_ms)
{
    unsigned char id[32];
    lease_entry_t *e;
    int kept = 0;

    if (!lease_table(t) || !key || !(tokens >= 0)
        || tokens > TB_MAX_CAPACITY || tb__table_key_id(key, id) != TB_OK
        || tb__table_lock(t) != TB_OK) {
        return -1;
    }
    e = (lease_entry_t *)tb__table_find(t, id);
    if (e && now_ms < e->expires_ms) {
        tb__table_mark(&e->h);
        e->tokens += tokens;
        e->h.used_ms = now_ms;
        tb__table_unmark(&e->h);
        kept = 1;
    }
    tb__table_unlock(t);
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

    if (!lease_table(t) || tb__table_lock(t) != TB_OK) {
        return 0;
    }
    __atomic_add_fetch(&t->epoch, 1, __ATOMIC_RELEASE);
    tb__table_unlock(t);
    /* One entry at a time, so give() (a Redis call) never runs under the
     * lock that every child's requests take. */
    for (i = 0; i <= t->mask; i++) {
        lease_entry_t copy, *e;
        tb_lease_info_t info;

        if (tb__table_lock(t) != TB_OK) {
            break;
        }
        e = (lease_entry_t *)tb__table_at(t, i);
        copy.h.inuse = e->h.inuse;
        if (e->h.inuse) {
            /* One store drops it: nothing to mark (tb__table_repair() counts the
             * entries in use again). */
            memcpy(&copy, e, sizeof(copy));
            e->h.inuse = 0;
            t->used--;
        }
        tb__table_unlock(t);
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
