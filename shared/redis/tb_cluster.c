/* tb_cluster.c -- Redis Cluster: hash slots, the slot map, one pool per
 * node, and the redirects.
 *
 * hiredis 0.14 knows nothing of Cluster, so this file does the little a
 * limiter needs. Every key of one decision carries the client's hash tag
 * ("<prefix>{<key>}..."), so one decision is one slot and one script call
 * on one node, atomic as before. The map (slot -> node) is learnt with
 * CLUSTER SLOTS from any node we know, seeds first; each node gets an
 * ordinary tb__pool_t (tb_pool.c) made from the client's settings with
 * the node's address, pool_size connections made on first need, which
 * also loads the scripts on each node as it connects.
 *
 * A call goes to the slot's primary. MOVED points the slot at the named
 * node at once and marks the map stale; ASK sends ASKING and the command
 * to the named node, once, without touching the map; TRYAGAIN (some keys
 * of the slot moved, some not, mid-migration) asks the owner again;
 * CLUSTERDOWN and I/O errors mark the map stale
 * and fail the call, which the failure policy answers. A stale map is
 * refreshed by the next call, by one thread at a time and at most every
 * TB__REFRESH_GAP_US, so a resharding cannot turn into a storm of CLUSTER
 * SLOTS. At most TB__MAX_HOPS tries per call, the third and later after
 * a short backoff (1, 2, 4, 8 ms: 15 ms at worst). A script is never sent
 * again after an I/O error or a timeout (it may have run).
 *
 * Left out: reading from replicas (a limiter writes on every call),
 * CLUSTER SHARDS, and forgetting nodes: a node that leaves keeps its idle
 * connections until they fail. Nodes are never freed before the client,
 * so a node pointer stays valid without reference counts.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "redis/tb_redis_int.h"

#define TB__SLOTS 16384
#define TB__MAX_NODES 128
#define TB__MAX_HOPS 6
#define TB__REFRESH_GAP_US 100000

typedef struct tb__cnode {
    char host[256];
    int port;
    tb__pool_t pool;
} tb__cnode_t;

struct tb__cluster {
    pthread_mutex_t mu;          /* Guards everything below.           */
    tb__redis_cfg_t cfg;         /* Seeds, user and password in addr;
                                  * each node's pool takes a copy.     */
    tb__cnode_t *nodes[TB__MAX_NODES];
    int nnodes;
    short slots[TB__SLOTS];      /* Index into nodes, or -1.           */
    int stale;                   /* Refresh before the next call.      */
    int refreshing;              /* A thread is asking CLUSTER SLOTS.  */
    pthread_cond_t refreshed;    /* Signalled when it is done.          */
    tb_monotime_us next_refresh_us;
    int next_ask;                /* Node to ask for the map first.     */
};

/* ---- Hash slots ------------------------------------------------------ */

/* CRC16-CCITT (XMODEM): polynomial 0x1021, initial 0, as Redis's crc16.c,
 * bit by bit (the table buys nothing at one short key per decision). */
static unsigned crc16(const char *buf, size_t len)
{
    unsigned crc = 0;
    size_t i;
    int b;

    for (i = 0; i < len; i++) {
        crc ^= (unsigned)(unsigned char)buf[i] << 8;
        for (b = 0; b < 8; b++) {
            crc = crc & 0x8000 ? (crc << 1) ^ 0x1021 : crc << 1;
            crc &= 0xffff;
        }
    }
    return crc;
}

unsigned tb_key_slot(const char *key, size_t len)
{
    size_t s, e;

    for (s = 0; s < len && key[s] != '{'; s++) {
    }
    if (s == len) {
        return crc16(key, len) & (TB__SLOTS - 1);
    }
    for (e = s + 1; e < len && key[e] != '}'; e++) {
    }
    /* No '}' or "{}": the whole key is hashed. */
    if (e == len || e == s + 1) {
        return crc16(key, len) & (TB__SLOTS - 1);
    }
    return crc16(key + s + 1, e - s - 1) & (TB__SLOTS - 1);
}

/* ---- Nodes ----------------------------------------------------------- */

/* Under mu: the node at host:port, added (not connected) if new. NULL
 * when the table is full or out of memory. */
static tb__cnode_t *node_get(tb__cluster_t *c, const char *host, int port,
                             int *index)
{
    tb__redis_cfg_t cfg;
    tb_redis_addr_t *a = &cfg.addr;
    tb__cnode_t *n;
    int i;

    for (i = 0; i < c->nnodes; i++) {
        if (c->nodes[i]->port == port
            && strcmp(c->nodes[i]->host, host) == 0) {
            if (index) {
                *index = i;
            }
            return c->nodes[i];
        }
    }
    if (c->nnodes == TB__MAX_NODES || strlen(host) >= sizeof(n->host)
        || !(n = calloc(1, sizeof(*n)))) {
        return NULL;
    }
    snprintf(n->host, sizeof(n->host), "%s", host);
    n->port = port;
    /* A node is a plain Redis to its pool: same credentials, db 0. */
    cfg = c->cfg;
    a->kind = TB_REDIS_SINGLE;
    a->nseeds = 0;
    a->db = 0;
    a->path[0] = '\0';
    snprintf(a->host, sizeof(a->host), "%s", host);
    a->port = port;
    if (tb__pool_init(&n->pool, &cfg) != TB_OK) {
        free(n);
        return NULL;
    }
    c->nodes[c->nnodes] = n;
    if (index) {
        *index = c->nnodes;
    }
    c->nnodes++;
    return n;
}

tb__cluster_t *tb__cluster_create(const tb__redis_cfg_t *cfg)
{
    const tb_redis_addr_t *a = &cfg->addr;
    tb__cluster_t *c = calloc(1, sizeof(*c));
    int i;

    if (!c) {
        return NULL;
    }
    pthread_mutex_init(&c->mu, NULL);
    tb__cond_init(&c->refreshed);
    c->cfg = *cfg;
    c->stale = 1;
    for (i = 0; i < TB__SLOTS; i++) {
        c->slots[i] = -1;
    }
    for (i = 0; i < a->nseeds; i++) {
        if (!node_get(c, a->seeds[i].host, a->seeds[i].port, NULL)) {
            tb__cluster_free(c);
            return NULL;
        }
    }
    return c;
}

void tb__cluster_free(tb__cluster_t *c)
{
    int i;

    if (!c) {
        return;
    }
    for (i = 0; i < c->nnodes; i++) {
        tb__pool_destroy(&c->nodes[i]->pool);
        free(c->nodes[i]);
    }
    pthread_cond_destroy(&c->refreshed);
    pthread_mutex_destroy(&c->mu);
    free(c);
}

void tb__cluster_after_fork(tb__cluster_t *c)
{
    int i;

    if (!c) {
        return;
    }
    /* As tb__pool_after_fork: only this thread exists in the child. */
    pthread_mutex_init(&c->mu, NULL);
    tb__cond_init(&c->refreshed);
    c->refreshing = 0;
    for (i = 0; i < c->nnodes; i++) {
        tb__pool_after_fork(&c->nodes[i]->pool);
    }
}

void tb__cluster_usage(tb__cluster_t *c, int *size, int *open, int *in_use)
{
    int i;

    *size = *open = *in_use = 0;
    pthread_mutex_lock(&c->mu);
    for (i = 0; i < c->nnodes; i++) {
        int o, b;

        tb__pool_usage(&c->nodes[i]->pool, &o, &b);
        *size += c->nodes[i]->pool.cfg.pool_size;
        *open += o;
        *in_use += b;
    }
    pthread_mutex_unlock(&c->mu);
}

void tb__cluster_module(tb__cluster_t *c, int *yes, int *no)
{
    int i;

    *yes = *no = 0;
    pthread_mutex_lock(&c->mu);
    for (i = 0; i < c->nnodes; i++) {
        int m = __atomic_load_n(&c->nodes[i]->pool.module, __ATOMIC_RELAXED);

        *yes += m == TB__MODULE_YES;
        *no += m == TB__MODULE_NO;
    }
    pthread_mutex_unlock(&c->mu);
}

/* ---- The map --------------------------------------------------------- */

static void mark_stale(tb__cluster_t *c)
{
    pthread_mutex_lock(&c->mu);
    c->stale = 1;
    pthread_mutex_unlock(&c->mu);
}

int tb__cluster_rows(const redisReply *r, tb__slot_row_fn fn, void *arg,
                     tb__error_t *e)
{
    size_t i;
    long s, t;

    if (r->type != REDIS_REPLY_ARRAY) {
        tb__set_error(e, TB_ERR_PROTOCOL, "CLUSTER SLOTS: not an array");
        return TB_ERR;
    }
    for (i = 0; i < r->elements; i++) {
        const redisReply *row = r->element[i], *pn;
        const char *host;

        if (row->type != REDIS_REPLY_ARRAY || row->elements < 3
            || row->element[0]->type != REDIS_REPLY_INTEGER
            || row->element[1]->type != REDIS_REPLY_INTEGER
            || row->element[2]->type != REDIS_REPLY_ARRAY
            || row->element[2]->elements < 2
            || row->element[2]->element[0]->type != REDIS_REPLY_STRING
            || row->element[2]->element[1]->type != REDIS_REPLY_INTEGER) {
            tb__set_error(e, TB_ERR_PROTOCOL, "CLUSTER SLOTS: bad row");
            return TB_ERR;
        }
        s = (long)row->element[0]->integer;
        t = (long)row->element[1]->integer;
        pn = row->element[2];
        host = pn->element[0]->str;
        if (strcmp(host, "?") == 0) {
            host = "";
        }
        if (s < 0 || t >= TB__SLOTS || s > t || pn->element[1]->integer < 1
            || pn->element[1]->integer > 65535) {
            tb__set_error(e, TB_ERR_PROTOCOL, "CLUSTER SLOTS: bad range");
            return TB_ERR;
        }
        if (fn(arg, (int)s, (int)t, host, (int)pn->element[1]->integer, e)
            != TB_OK) {
            return TB_ERR;
        }
    }
    return TB_OK;
}

/* What parse_slots() hands each row. */
typedef struct slots_ctx {
    tb__cluster_t *c;
    const tb__cnode_t *asked;
    short *map;
} slots_ctx_t;

static int slots_row(void *arg, int s, int t, const char *host, int port,
                     tb__error_t *e)
{
    slots_ctx_t *x = arg;
    int idx;

    pthread_mutex_lock(&x->c->mu);
    if (!node_get(x->c, host[0] ? host : x->asked->host, port, &idx)) {
        pthread_mutex_unlock(&x->c->mu);
        tb__set_error(e, TB_ERR_OOM, "too many cluster nodes");
        return TB_ERR;
    }
    pthread_mutex_unlock(&x->c->mu);
    for (; s <= t; s++) {
        x->map[s] = (short)idx;
    }
    return TB_OK;
}

/* Fill map from one CLUSTER SLOTS reply of the node asked. */
static int parse_slots(tb__cluster_t *c, const redisReply *r,
                       const tb__cnode_t *asked, short *map, tb__error_t *e)
{
    slots_ctx_t x;

    x.c = c;
    x.asked = asked;
    x.map = map;
    return tb__cluster_rows(r, slots_row, &x, e);
}

/* Ask the known nodes in turn for the map, from the one that answered
 * last. One refresh at a time: a thread that finds one running goes on
 * with the current map. */
static int refresh(tb__cluster_t *c, int force, tb__error_t *e)
{
    static const char *argv[2] = { "CLUSTER", "SLOTS" };
    static const size_t argvlen[2] = { 7, 5 };
    tb__redis_call_t k;
    tb_monotime_us now = tb_clock_monotonic_us();
    short *map;
    int t, n, first, rc = TB_ERR;

    pthread_mutex_lock(&c->mu);
    if (c->refreshing && force) {
        /* Another thread is asking already: wait for its map (bounded by
         * the command timeout) rather than fail the call at once, as a
         * burst of first requests on an empty map would. */
        struct timespec d = tb__timespec_at(
            tb__deadline_ms(c->cfg.timeout_ms));

        while (c->refreshing
               && pthread_cond_timedwait(&c->refreshed, &c->mu, &d) == 0) {
        }
        pthread_mutex_unlock(&c->mu);
        return TB_OK;
    }
    if (c->refreshing || (!force && (!c->stale || now < c->next_refresh_us))) {
        pthread_mutex_unlock(&c->mu);
        return TB_OK;
    }
    c->refreshing = 1;
    c->next_refresh_us = now + TB__REFRESH_GAP_US;
    n = c->nnodes;
    first = c->next_ask;
    pthread_mutex_unlock(&c->mu);

    map = malloc(sizeof(c->slots));
    if (!map) {
        tb__set_error(e, TB_ERR_OOM, "out of memory");
        n = 0;
    }
    memset(&k, 0, sizeof(k));
    k.cmd.argc = 2;
    k.cmd.argv = argv;
    k.cmd.argvlen = argvlen;
    for (t = 0; t < n && rc != TB_OK; t++) {
        int i = (first + t) % n;
        tb__cnode_t *node;

        pthread_mutex_lock(&c->mu);
        node = c->nodes[i];
        pthread_mutex_unlock(&c->mu);
        memset(map, 0xff, sizeof(c->slots)); /* -1 everywhere */
        if (tb__redis_call(&node->pool, &k, e) == TB_OK
            && parse_slots(c, k.reply, node, map, e) == TB_OK) {
            pthread_mutex_lock(&c->mu);
            memcpy(c->slots, map, sizeof(c->slots));
            c->stale = 0;
            c->next_ask = i;
            pthread_mutex_unlock(&c->mu);
            rc = TB_OK;
        }
        tb__reply_free(k.reply);
    }
    free(map);
    pthread_mutex_lock(&c->mu);
    c->refreshing = 0;
    pthread_cond_broadcast(&c->refreshed);
    pthread_mutex_unlock(&c->mu);
    return rc;
}

/* The primary of slot by the current map, or NULL. */
static tb__cnode_t *route(tb__cluster_t *c, unsigned slot)
{
    tb__cnode_t *n = NULL;

    pthread_mutex_lock(&c->mu);
    if (c->slots[slot] >= 0) {
        n = c->nodes[c->slots[slot]];
    }
    pthread_mutex_unlock(&c->mu);
    return n;
}

/* Where a call for slot goes first, refreshing a stale or missing map. */
static tb__cnode_t *first_hop(tb__cluster_t *c, unsigned slot,
                              tb__error_t *e)
{
    tb__cnode_t *n;

    refresh(c, 0, e);
    if ((n = route(c, slot))) {
        return n;
    }
    if (refresh(c, 1, e) != TB_OK) {
        return NULL;
    }
    if ((n = route(c, slot))) {
        return n;
    }
    tb__set_error(e, TB_ERR_IO, "no cluster node serves slot %u", slot);
    return NULL;
}

/* Follow one redirect: the node to ask next, or NULL when rd is not one
 * (the call's error stands). *asking says whether to send ASKING. */
static tb__cnode_t *redirected(tb__cluster_t *c, tb__cnode_t *from,
                               unsigned slot, const tb__redirect_t *rd,
                               int *asking, tb__error_t *e)
{
    tb__cnode_t *to = NULL;
    int idx = -1;

    switch (rd->kind) {
    case TB__REDIR_MOVED:
    case TB__REDIR_ASK:
        pthread_mutex_lock(&c->mu);
        to = node_get(c, rd->host[0] ? rd->host : from->host, rd->port,
                      &idx);
        if (to && rd->kind == TB__REDIR_MOVED) {
            /* Right for this slot now; the rest on the next refresh. */
            c->slots[rd->slot] = (short)idx;
            c->stale = 1;
        }
        pthread_mutex_unlock(&c->mu);
        if (!to) {
            tb__set_error(e, TB_ERR_OOM, "too many cluster nodes");
        }
        *asking = rd->kind == TB__REDIR_ASK;
        return to;
    case TB__REDIR_TRYAGAIN:
        /* Mid-migration, some of the slot's keys moved: a moment later
         * MIGRATE has moved the rest. Start again from the owner (after
         * backoff()). */
        *asking = 0;
        to = route(c, slot);
        return to ? to : from;
    case TB__REDIR_DOWN:
        mark_stale(c);
        return NULL;
    default:
        if (e->err != TB_ERR_REPLY) {
            /* I/O, timeout, refused: the node may be gone. */
            mark_stale(c);
        }
        return NULL;
    }
}

/* Before the third and later tries of one call, wait 1, 2, 4... ms: a
 * slot whose owner is changing may bounce a call between two nodes until
 * every node has been told (SETSLOT NODE reaches them one by one). */
static void backoff(int hop)
{
    struct timespec ts = { 0, 0 };

    if (hop >= 2) {
        ts.tv_nsec = 1000000L << (hop - 2);
        nanosleep(&ts, NULL);
    }
}

/* The tries of one call by key: first the node serving the key's slot,
 * then the target of each redirect, at most TB__MAX_HOPS tries, each after
 * backoff(). A try that fails fills rd when it was redirected. */
typedef struct hops {
    tb__cluster_t *c;
    unsigned slot;
    tb__cnode_t *node;
    int hop;
    int asking;             /* Send ASKING before the call. */
    tb__redirect_t rd;
} hops_t;

/* The node of the first try, made at once, or NULL (*e says why). */
static tb__cnode_t *hops_first(hops_t *h, tb__cluster_t *c, const char *key,
                               tb__error_t *e)
{
    h->c = c;
    h->slot = tb_key_slot(key, strlen(key));
    h->hop = 0;
    h->asking = 0;
    h->node = first_hop(c, h->slot, e);
    return h->node;
}

/* The node of the next try after a failed one, or NULL: the failure was
 * no redirect (its error stands), or the tries are used up. */
static tb__cnode_t *hops_next(hops_t *h, tb__error_t *e)
{
    h->node = redirected(h->c, h->node, h->slot, &h->rd, &h->asking, e);
    if (h->node && ++h->hop >= TB__MAX_HOPS) {
        tb__set_error(e, TB_ERR_REPLY, "slot %u: too many redirects",
                      h->slot);
        return NULL;
    }
    if (h->node) {
        backoff(h->hop);
    }
    return h->node;
}

int tb__cluster_call(tb__cluster_t *c, const char *key, tb__redis_call_t *k,
                     tb__error_t *e)
{
    hops_t h;
    tb__cnode_t *n;

    for (n = hops_first(&h, c, key, e); n; n = hops_next(&h, e)) {
        k->asking = h.asking;
        if (tb__redis_call(&n->pool, k, e) == TB_OK) {
            return TB_OK;
        }
        h.rd = k->rd;
    }
    return TB_ERR;
}
