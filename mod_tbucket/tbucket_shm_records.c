/* tbucket_shm_records.c -- the segment's records that configurations
 * name: a local scope's (its in-flight table, its auto cap, its counts)
 * and a rule's (decisions by outcome, TBucketRule events). Found by name
 * at every configuration load, in the parent, so that what a restart
 * keeps keeps its places, its learnt cap and its counts; children only
 * count. The layout is tbucket_shm_int.h's.
 */
#include "apr_strings.h"

#include "httpd.h"
#include "http_config.h"

#include "mod_tbucket.h"
#include "tbucket_shm_int.h"

/* ---- Local protection's records ------------------------------------ */

/* Make r's cap auto within [min, max]: what an earlier configuration's
 * cap learnt is kept, within the new bounds. 0, or -1 when the pool is
 * spent. */
static int rec_adapt(tbucket_shm *seg, tbucket_scope_rec *r, uint32_t min,
                     uint32_t max)
{
    tb_adapt_t *a = r->adapt_off
                    ? (tb_adapt_t *)((char *)seg + r->adapt_off) : NULL;

    if (a && tb_adapt_bounds(a, min, max) == TB_OK) {
        return 0;
    }
    if (!r->adapt_off && !(r->adapt_off = tbucket_shm_pool_take(seg, tb_adapt_size()))) {
        return -1;
    }
    return tb_adapt_init((char *)seg + r->adapt_off, min, max) ? 0 : -1;
}

/* The table of a record, or NULL. */
static tb_inflight_t *rec_table(tbucket_shm *seg, const tbucket_scope_rec *r)
{
    return r->off ? (tb_inflight_t *)((char *)seg + r->off) : NULL;
}

int tbucket_shm_local_slot(const char *name, int limit, int auto_min,
                           const char **why)
{
    tbucket_shm *seg = tbucket_shm_seg;
    tbucket_scope_rec *r = NULL;
    uint32_t i, cap = (uint32_t)limit;

    *why = NULL;
    if (!seg) {
        *why = "no shared memory";
        return -1;
    }
    for (i = 0; i < seg->nscopes && !r; i++) {
        if (!strcmp(seg->scopes[i].name, name)) {
            r = &seg->scopes[i];
        }
    }
    /* A record no configuration has used since the last load, with no
     * place held, may take a new name. */
    for (i = 0; i < seg->nscopes && !r && seg->nscopes == MAX_LOCAL_SCOPES;
         i++) {
        tbucket_scope_rec *o = &seg->scopes[i];

        if (o->generation + 1 < seg->generation
            && tb_inflight_count(rec_table(seg, o)) == 0) {
            r = o;
            r->off = tb_inflight_cap(rec_table(seg, o)) >= cap ? r->off : 0;
            r->taken = r->refused = 0;
            /* Another scope's learning is not this one's. */
            r->adapt_off = 0;
        }
    }
    if (!r && seg->nscopes < MAX_LOCAL_SCOPES) {
        r = &seg->scopes[seg->nscopes++];
    }
    if (!r) {
        *why = "too many local scopes (256 records, all in use)";
        return -1;
    }
    apr_cpystrn(r->name, name, sizeof(r->name));
    /* A limit raised past the table's places needs a new table: the old
     * one stays with the requests of the old generation that hold it. */
    if (tb_inflight_cap(rec_table(seg, r)) < cap) {
        uint64_t off = tbucket_shm_pool_table(seg, cap);

        if (!off) {
            *why = "the shared memory for local limits is spent (about "
                   "500,000 places); stop and start Apache to reclaim "
                   "what earlier configurations used";
            return -1;
        }
        r->off = off;
    }
    if (auto_min > 0 && rec_adapt(seg, r, (uint32_t)auto_min, cap) != 0) {
        *why = "the shared memory for local limits is spent; stop and "
               "start Apache to reclaim what earlier configurations used";
        return -1;
    }
    r->adaptive = auto_min > 0;
    r->limit = cap;
    r->generation = seg->generation;
    return (int)(r - seg->scopes);
}

tb_adapt_t *tbucket_shm_local_adapt(int slot)
{
    const tbucket_scope_rec *r;

    if (!tbucket_shm_seg || slot < 0 || (uint32_t)slot >= tbucket_shm_seg->nscopes) {
        return NULL;
    }
    r = &tbucket_shm_seg->scopes[slot];
    return r->adaptive && r->adapt_off
           ? (tb_adapt_t *)((char *)tbucket_shm_seg + r->adapt_off) : NULL;
}

tb_inflight_t *tbucket_shm_local_table(int slot)
{
    if (!tbucket_shm_seg || slot < 0 || (uint32_t)slot >= tbucket_shm_seg->nscopes) {
        return NULL;
    }
    return rec_table(tbucket_shm_seg, &tbucket_shm_seg->scopes[slot]);
}

tb_inflight_t *tbucket_shm_refusing(void)
{
    if (!tbucket_shm_seg || !tbucket_shm_seg->refusing_off) {
        return NULL;
    }
    return (tb_inflight_t *)((char *)tbucket_shm_seg + tbucket_shm_seg->refusing_off);
}

void tbucket_shm_local_reap(uint32_t tag, tb_inflight_alive_fn alive)
{
    uint32_t i;

    for (i = 0; tbucket_shm_seg && i <= tbucket_shm_seg->nscopes; i++) {
        tb_inflight_t *t = i < tbucket_shm_seg->nscopes
                           ? rec_table(tbucket_shm_seg, &tbucket_shm_seg->scopes[i])
                           : tbucket_shm_refusing();

        if (tag) {
            tb_inflight_reap(t, tag);
        }
        else {
            tb_inflight_reap_dead(t, alive);
        }
    }
}

void tbucket_count_local(int slot, int refused)
{
    tbucket_scope_rec *r;

    if (!tbucket_shm_seg || slot < 0 || (uint32_t)slot >= tbucket_shm_seg->nscopes) {
        return;
    }
    r = &tbucket_shm_seg->scopes[slot];
    tb_stats_add(refused ? &r->refused : &r->taken, 1);
}

apr_array_header_t *tbucket_shm_local_views(apr_pool_t *p)
{
    apr_array_header_t *a = apr_array_make(p, 4, sizeof(tbucket_local_view));
    uint32_t i;

    for (i = 0; tbucket_shm_seg && i < tbucket_shm_seg->nscopes; i++) {
        const tbucket_scope_rec *r = &tbucket_shm_seg->scopes[i];
        uint32_t held = tb_inflight_count(rec_table(tbucket_shm_seg, r));
        tbucket_local_view *v;

        /* Scopes a restart dropped are shown while places are held. */
        if (r->generation != tbucket_shm_seg->generation && !held) {
            continue;
        }
        v = apr_array_push(a);
        v->name = apr_pstrdup(p, r->name);
        v->limit = r->limit;
        v->in_flight = held;
        v->taken = tb_stats_get(&r->taken);
        v->refused = tb_stats_get(&r->refused);
        v->adaptive = r->adaptive && r->adapt_off
                      && tb_adapt_view((tb_adapt_t *)((char *)tbucket_shm_seg
                                                      + r->adapt_off),
                                       &v->adapt) == TB_OK;
        if (v->adaptive) {
            v->limit = v->adapt.cap;
        }
    }
    return a;
}

/* ---- Rules ------------------------------------------------------------ */

/* The record called name in recs (*n in use), made or found: its slot,
 * or -1 when all are taken by names of the current configuration. */
static int rec_slot(tbucket_shm *seg, tbucket_count_rec *recs, uint32_t *n,
                    const char *name)
{
    tbucket_count_rec *r = NULL;
    uint32_t i;

    for (i = 0; i < *n && !r; i++) {
        if (!strcmp(recs[i].name, name)) {
            r = &recs[i];
        }
    }
    /* A record no configuration has used since the last load may take a
     * new name, and starts again from 0. */
    for (i = 0; i < *n && !r && *n == MAX_COUNT_RECS; i++) {
        if (recs[i].generation + 1 < seg->generation) {
            r = &recs[i];
            memset(r->outcome, 0, sizeof(r->outcome));
        }
    }
    if (!r && *n < MAX_COUNT_RECS) {
        r = &recs[(*n)++];
    }
    if (!r) {
        return -1;
    }
    apr_cpystrn(r->name, name, sizeof(r->name));
    r->generation = seg->generation;
    return (int)(r - recs);
}

int tbucket_shm_scope_slot(const char *name)
{
    return tbucket_shm_seg ? rec_slot(tbucket_shm_seg, tbucket_shm_seg->counted, &tbucket_shm_seg->ncounted,
                              name)
                   : -1;
}

int tbucket_shm_named_slot(const char *name)
{
    return tbucket_shm_seg ? rec_slot(tbucket_shm_seg, tbucket_shm_seg->named, &tbucket_shm_seg->nnamed,
                              name)
                   : -1;
}

void tbucket_count_scope(int slot, tbucket_outcome o)
{
    if (tbucket_shm_seg && slot >= 0 && (uint32_t)slot < tbucket_shm_seg->ncounted
        && o < TBUCKET_OUTCOMES) {
        tb_stats_add(&tbucket_shm_seg->counted[slot].outcome[o], 1);
    }
}

void tbucket_count_named(int slot, tbucket_limit_event e)
{
    if (tbucket_shm_seg && slot >= 0 && (uint32_t)slot < tbucket_shm_seg->nnamed
        && e < TBUCKET_LIMIT_EVENTS) {
        tb_stats_add(&tbucket_shm_seg->named[slot].outcome[e], 1);
    }
}

/* The current configuration's records of recs, with n counters each, as
 * views from p. */
static apr_array_header_t *rec_views(apr_pool_t *p,
                                     const tbucket_count_rec *recs,
                                     uint32_t nrecs, int n)
{
    apr_array_header_t *a = apr_array_make(p, 8, sizeof(tbucket_count_view));
    uint32_t i;
    int o;

    for (i = 0; tbucket_shm_seg && i < nrecs; i++) {
        const tbucket_count_rec *r = &recs[i];
        tbucket_count_view *v;

        if (r->generation != tbucket_shm_seg->generation) {
            continue;
        }
        v = apr_array_push(a);
        v->name = apr_pstrdup(p, r->name);
        memset(v->outcome, 0, sizeof(v->outcome));
        for (o = 0; o < n; o++) {
            v->outcome[o] = tb_stats_get(&r->outcome[o]);
        }
    }
    return a;
}

apr_array_header_t *tbucket_shm_scope_views(apr_pool_t *p)
{
    return tbucket_shm_seg ? rec_views(p, tbucket_shm_seg->counted, tbucket_shm_seg->ncounted,
                               TBUCKET_OUTCOMES)
                   : apr_array_make(p, 1, sizeof(tbucket_count_view));
}

apr_array_header_t *tbucket_shm_named_views(apr_pool_t *p)
{
    return tbucket_shm_seg ? rec_views(p, tbucket_shm_seg->named, tbucket_shm_seg->nnamed,
                               TBUCKET_LIMIT_EVENTS)
                   : apr_array_make(p, 1, sizeof(tbucket_count_view));
}
