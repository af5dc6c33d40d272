/* tb_coalesce_cluster.c -- the coalescer's Redis Cluster side: one
 * connection and one pipeline per primary, the slot map, redirects.
 *
 * tb_coalesce.c hands each whole command of a client here with its
 * sequence number. It goes to the primary of its first key's slot (the
 * client puts every key of a call under one hash tag), keyless ones to
 * one live primary, SCRIPT LOAD to every primary (the reply of one live
 * node goes back, the others' copies are dropped: each node caches the
 * script, and a node that missed it answers NOSCRIPT, which the client
 * follows with EVAL). Each node batches as the single-Redis coalescer
 * does: with nothing in flight its queue goes at once as one write.
 * The map comes from CLUSTER SLOTS on a connection of its own, asked
 * (blocking, bounded by the timeouts) when empty or stale, at most every
 * REFRESH_GAP_US. MOVED points the slot at the named node, marks the map
 * stale and sends the command there; ASK sends ASKING and the command to
 * the named node; TRYAGAIN asks the owner again: at most MAX_HOPS times,
 * then the reply goes back as it is. A node that fails or times out
 * answers its own queued and in-flight commands with error replies; the
 * others go on. Left out: replicas, non-blocking connects.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/epoll.h>

#include "redis/tb_redis_int.h"

#define SLOTS 16384
#define MAX_NODES 128
#define MAX_HOPS 5
#define RETRY_MS 100
#define REFRESH_GAP_US 100000

/* One command on a node: queued (bytes off..off+len of q) or in flight
 * (of sent). */
typedef struct centry {
    int client;            /* -1: nobody's (ASKING, SCRIPT LOAD copies). */
    unsigned gen;
    uint64_t seq;
    int slot;              /* TB__ROUTE_* for a keyless command.        */
    int hops;              /* Redirects followed so far.                */
    size_t off, len;
} centry_t;

typedef struct cnode {
    char host[256];
    int port;
    int owns;              /* Serves slots by the last map.            */
    tb__conn_t *conn;
    tb__buf_t q, sent, rin;
    centry_t *e;           /* e[head .. head + n): the first inflight
                            * ones in flight.                          */
    size_t head, n, cap, inflight;
    tb_monotime_us sent_at, retry_at;
} cnode_t;

struct tb__ccl {
    tb__redis_cfg_t cfg;
    tb__ccl_host_t h;
    cnode_t *nodes[MAX_NODES];
    int nnodes;
    short slots[SLOTS];          /* Index into nodes, or -1.            */
    int stale;
    int next_ask;
    tb_monotime_us next_refresh;
    tb__error_t why;
};

/* ---- Commands: where each goes --------------------------------------- */

/* Argument i of the RESP command at p (len bytes, whole): *s, *sl. */
static int arg_at(const char *p, size_t len, int i, const char **s,
                  size_t *sl)
{
    const char *end = p + len, *nl;
    long n, argc;
    int k;

    argc = strtol(p + 1, NULL, 10);
    if (i >= argc || !(nl = memchr(p, '\n', len))) {
        return 0;
    }
    for (k = 0, p = nl + 1; p < end && *p == '$'; k++) {
        n = strtol(p + 1, NULL, 10);
        if (!(nl = memchr(p, '\n', (size_t)(end - p))) || n < 0
            || nl + 1 + n + 2 > end) {
            return 0;
        }
        if (k == i) {
            *s = nl + 1;
            *sl = (size_t)n;
            return 1;
        }
        p = nl + 1 + n + 2;
    }
    return 0;
}

static int is(const char *s, size_t sl, const char *name)
{
    return strlen(name) == sl && strncasecmp(s, name, sl) == 0;
}

/* The slot of the key that argument numkeys_at's count is followed by,
 * or TB__ROUTE_ANY for no key. */
static int numkeys_slot(const char *p, size_t len, int numkeys_at)
{
    const char *s;
    size_t sl;

    if (!arg_at(p, len, numkeys_at, &s, &sl) || sl == 0 || s[0] < '1'
        || s[0] > '9' || !arg_at(p, len, numkeys_at + 1, &s, &sl)) {
        return TB__ROUTE_ANY;
    }
    return (int)tb_key_slot(s, sl);
}

int tb__cmd_route(const char *p, size_t len)
{
    static const char *const keyless[] = {
        "PING", "ECHO", "COMMAND", "INFO", "TIME", "CLUSTER", "DBSIZE",
        "CONFIG", "ROLE", "LASTSAVE", "SLOWLOG", "LATENCY", "MODULE",
        "FUNCTION", NULL
    };
    const char *s;
    size_t sl;
    int i;

    if (!arg_at(p, len, 0, &s, &sl)) {
        return TB__ROUTE_ANY;
    }
    if (is(s, sl, "EVAL") || is(s, sl, "EVALSHA") || is(s, sl, "EVAL_RO")
        || is(s, sl, "EVALSHA_RO") || is(s, sl, "FCALL")
        || is(s, sl, "FCALL_RO")) {
        return numkeys_slot(p, len, 2);
    }
    if (sl > 8 && strncasecmp(s, "tbucket.", 8) == 0) {
        return numkeys_slot(p, len, 1);
    }
    if (is(s, sl, "SCRIPT")) {
        return arg_at(p, len, 1, &s, &sl)
                   && (is(s, sl, "LOAD") || is(s, sl, "FLUSH"))
               ? TB__ROUTE_ALL : TB__ROUTE_ANY;
    }
    for (i = 0; keyless[i]; i++) {
        if (is(s, sl, keyless[i])) {
            return TB__ROUTE_ANY;
        }
    }
    return arg_at(p, len, 1, &s, &sl) ? (int)tb_key_slot(s, sl)
                                      : TB__ROUTE_ANY;
}

/* ---- A client's order ------------------------------------------------ */

int tb__reorder_put(tb__reorder_t *o, uint64_t seq, const char *p,
                    size_t len, tb__buf_t *out)
{
    tb__held_t *h;
    int i;

    if (seq != o->next_out) {
        if (o->nheld == o->cap) {
            h = realloc(o->held, (size_t)(o->cap ? 2 * o->cap : 8)
                                     * sizeof(*h));
            if (!h) {
                return TB_ERR;
            }
            o->held = h;
            o->cap = o->cap ? 2 * o->cap : 8;
        }
        h = &o->held[o->nheld];
        if (!(h->p = malloc(len ? len : 1))) {
            return TB_ERR;
        }
        memcpy(h->p, p, len);
        h->len = len;
        h->seq = seq;
        o->nheld++;
        return TB_OK;
    }
    if (tb__buf_put(out, p, len) != TB_OK) {
        return TB_ERR;
    }
    o->next_out++;
    for (i = 0; i < o->nheld; i++) {
        h = &o->held[i];
        if (h->seq != o->next_out) {
            continue;
        }
        if (tb__buf_put(out, h->p, h->len) != TB_OK) {
            return TB_ERR;
        }
        free(h->p);
        *h = o->held[--o->nheld];
        o->next_out++;
        i = -1;  /* The next one may be anywhere. */
    }
    return TB_OK;
}

void tb__reorder_reset(tb__reorder_t *o)
{
    int i;

    for (i = 0; i < o->nheld; i++) {
        free(o->held[i].p);
    }
    free(o->held);
    memset(o, 0, sizeof(*o));
}

/* ---- Nodes ----------------------------------------------------------- */

/* The index of the node at host:port, added (not connected) if new; -1
 * when the table is full or out of memory. */
static int node_get(tb__ccl_t *cc, const char *host, int port)
{
    cnode_t *n;
    int i;

    for (i = 0; i < cc->nnodes; i++) {
        if (cc->nodes[i]->port == port
            && strcmp(cc->nodes[i]->host, host) == 0) {
            return i;
        }
    }
    if (cc->nnodes == MAX_NODES || strlen(host) >= sizeof(n->host)
        || !(n = calloc(1, sizeof(*n)))) {
        return -1;
    }
    snprintf(n->host, sizeof(n->host), "%s", host);
    n->port = port;
    cc->nodes[cc->nnodes] = n;
    return cc->nnodes++;
}

/* The settings of a connection to node n: a plain Redis, same
 * credentials and TLS, db 0, no scripts. */
static void node_cfg(const tb__ccl_t *cc, const cnode_t *n,
                     tb__redis_cfg_t *cfg)
{
    tb_redis_addr_t *a = &cfg->addr;

    *cfg = cc->cfg;
    a->kind = TB_REDIS_SINGLE;
    a->nseeds = 0;
    a->db = 0;
    a->path[0] = '\0';
    snprintf(a->host, sizeof(a->host), "%s", n->host);
    a->port = n->port;
}

/* A connection to n set up (AUTH), or NULL with cc->why. Blocks for at
 * most the connect timeout plus the timeout. */
static tb__conn_t *node_open(tb__ccl_t *cc, const cnode_t *n)
{
    tb__redis_cfg_t cfg;
    tb__conn_t *conn;
    int module;

    node_cfg(cc, n, &cfg);
    conn = tb__conn_open(n->host, n->port, "", cfg.tls,
                         tb__deadline_ms(cfg.connect_timeout_ms), &cc->why);
    if (conn && tb__setup(&cfg, conn, tb__deadline_ms(cfg.timeout_ms),
                          &module, &cc->why) != TB_OK) {
        tb__conn_free(conn);
        conn = NULL;
    }
    return conn;
}

static void node_drop(tb__ccl_t *cc, cnode_t *n)
{
    if (n->conn) {
        epoll_ctl(cc->h.ep, EPOLL_CTL_DEL, tb__conn_fd(n->conn), NULL);
        tb__conn_free(n->conn);
        n->conn = NULL;
    }
    n->rin.len = 0;
}

/* Node i connected, or 0 (cc->why says why; too soon to try again). */
static int node_ready(tb__ccl_t *cc, int i)
{
    cnode_t *n = cc->nodes[i];
    struct epoll_event ev;

    if (n->conn) {
        return 1;
    }
    if (tb_clock_monotonic_us() < n->retry_at) {
        tb__set_error(&cc->why, TB_ERR_IO, "%s:%d: down, retried soon",
                      n->host, n->port);
        return 0;
    }
    if (!(n->conn = node_open(cc, n))) {
        n->retry_at = tb__deadline_ms(RETRY_MS);
        return 0;
    }
    memset(&ev, 0, sizeof(ev));
    ev.events = EPOLLIN;
    ev.data.u64 = TB__CCL_EV + (uint64_t)i;
    epoll_ctl(cc->h.ep, EPOLL_CTL_ADD, tb__conn_fd(n->conn), &ev);
    cc->h.st->connects++;
    return 1;
}

/* Queue len bytes at p on node n as command seq of client. */
static int node_put(cnode_t *n, const centry_t *like, const char *p,
                    size_t len)
{
    centry_t *e;

    if (n->head + n->n == n->cap) {
        if (n->head > 0) {
            memmove(n->e, n->e + n->head, n->n * sizeof(*e));
            n->head = 0;
        }
        else {
            e = realloc(n->e, (n->cap ? 2 * n->cap : 64) * sizeof(*e));
            if (!e) {
                return TB_ERR;
            }
            n->e = e;
            n->cap = n->cap ? 2 * n->cap : 64;
        }
    }
    e = &n->e[n->head + n->n];
    *e = *like;
    e->off = n->q.len;
    e->len = len;
    if (tb__buf_put(&n->q, p, len) != TB_OK) {
        return TB_ERR;
    }
    n->n++;
    return TB_OK;
}

/* Answer e with an error reply naming what went wrong (cc->why). */
static void answer_error(tb__ccl_t *cc, const centry_t *e)
{
    char line[TB_ERRSTR_LEN + 32];
    size_t i, len;

    if (e->client < 0) {
        return;
    }
    len = (size_t)snprintf(line, sizeof(line), "-ERR coalescer: %s\r\n",
                           cc->why.errstr);
    len = len < sizeof(line) ? len : sizeof(line) - 1;
    for (i = 0; i + 2 < len; i++) {
        line[i] = line[i] == '\r' || line[i] == '\n' ? ' ' : line[i];
    }
    memcpy(line + len - 2, "\r\n", 2);
    cc->h.deliver(cc->h.arg, e->client, e->gen, e->seq, line, len);
    cc->h.st->failed++;
}

/* Node n failed (cc->why says how): its queued and in-flight commands
 * are answered with error replies, its connection dropped, the map
 * asked again. */
static void node_fail(tb__ccl_t *cc, cnode_t *n)
{
    size_t i;

    node_drop(cc, n);
    for (i = n->head; i < n->head + n->n; i++) {
        answer_error(cc, &n->e[i]);
    }
    n->head = n->n = n->inflight = 0;
    n->q.len = n->sent.len = 0;
    cc->stale = 1;
}

/* ---- The map --------------------------------------------------------- */

typedef struct rows_ctx {
    tb__ccl_t *cc;
    const cnode_t *asked;
    short *map;
} rows_ctx_t;

static int map_row(void *arg, int s, int t, const char *host, int port,
                   tb__error_t *e)
{
    rows_ctx_t *x = arg;
    int i = node_get(x->cc, host[0] ? host : x->asked->host, port);

    if (i < 0) {
        tb__set_error(e, TB_ERR_OOM, "too many cluster nodes");
        return TB_ERR;
    }
    for (; s <= t; s++) {
        x->map[s] = (short)i;
    }
    return TB_OK;
}

/* CLUSTER SLOTS of node i into map, on a connection of its own (the
 * node's may have a pipeline in flight). */
static int ask_map(tb__ccl_t *cc, int i, short *map)
{
    static const char *argv[2] = { "CLUSTER", "SLOTS" };
    static const size_t argvlen[2] = { 7, 5 };
    tb__cmd_t cmd = { 2, argv, argvlen };
    rows_ctx_t x;
    redisReply *r = NULL;
    tb__conn_t *conn = node_open(cc, cc->nodes[i]);
    int rc = TB_ERR;

    if (conn && tb__conn_command(conn, &cmd,
                                 tb__deadline_ms(cc->cfg.timeout_ms), &r,
                                 &cc->why) == TB_OK) {
        x.cc = cc;
        x.asked = cc->nodes[i];
        x.map = map;
        memset(map, 0xff, SLOTS * sizeof(*map));
        rc = tb__cluster_rows(r, map_row, &x, &cc->why);
    }
    tb__reply_free(r);
    tb__conn_free(conn);
    return rc;
}

/* Ask the known nodes in turn for the map, from the one that answered
 * last, when it is stale (or force) and REFRESH_GAP_US has passed. */
static void refresh(tb__ccl_t *cc, int force)
{
    short map[SLOTS];
    tb_monotime_us now = tb_clock_monotonic_us();
    int t, i, k;

    if ((!force && !cc->stale) || now < cc->next_refresh) {
        return;
    }
    cc->next_refresh = now + REFRESH_GAP_US;
    for (t = 0; t < cc->nnodes; t++) {
        i = (cc->next_ask + t) % cc->nnodes;
        if (ask_map(cc, i, map) == TB_OK) {
            memcpy(cc->slots, map, sizeof(map));
            for (k = 0; k < cc->nnodes; k++) {
                cc->nodes[k]->owns = 0;
            }
            for (k = 0; k < SLOTS; k++) {
                if (map[k] >= 0) {
                    cc->nodes[map[k]]->owns = 1;
                }
            }
            cc->stale = 0;
            cc->next_ask = i;
            return;
        }
    }
}

/* The node for a keyless command: a primary with a connection, else one
 * not waiting to be retried, else the first. */
static int lead(const tb__ccl_t *cc)
{
    tb_monotime_us now = tb_clock_monotonic_us();
    int i;

    for (i = 0; i < cc->nnodes; i++) {
        if (cc->nodes[i]->owns && cc->nodes[i]->conn) {
            return i;
        }
    }
    for (i = 0; i < cc->nnodes; i++) {
        if (cc->nodes[i]->owns && cc->nodes[i]->retry_at <= now) {
            return i;
        }
    }
    return cc->nnodes ? 0 : -1;
}

/* ---- Commands in and replies out ------------------------------------- */

int tb__ccl_submit(tb__ccl_t *cc, int client, unsigned gen, uint64_t seq,
                   const char *p, size_t len)
{
    centry_t e;
    int i, to;

    memset(&e, 0, sizeof(e));
    e.client = client;
    e.gen = gen;
    e.seq = seq;
    e.slot = tb__cmd_route(p, len);
    refresh(cc, 0);
    if (e.slot >= 0 && cc->slots[e.slot] < 0) {
        refresh(cc, 1);
    }
    to = e.slot >= 0 ? cc->slots[e.slot] : lead(cc);
    if (to < 0) {
        tb__set_error(&cc->why, TB_ERR_IO, "no cluster node serves slot "
                      "%d", e.slot);
        answer_error(cc, &e);
        return TB_OK;
    }
    if (node_put(cc->nodes[to], &e, p, len) != TB_OK) {
        return TB_ERR;
    }
    if (e.slot != TB__ROUTE_ALL) {
        return TB_OK;
    }
    /* The other primaries' copies: nobody's replies. */
    e.client = -1;
    for (i = 0; i < cc->nnodes; i++) {
        if (i != to && cc->nodes[i]->owns
            && node_put(cc->nodes[i], &e, p, len) != TB_OK) {
            return TB_ERR;
        }
    }
    return TB_OK;
}

/* Leave out of n's queue the commands of clients that have gone. */
static void compact(tb__ccl_t *cc, cnode_t *n)
{
    size_t i, j = n->head, at = 0;

    for (i = n->head; i < n->head + n->n; i++) {
        centry_t *e = &n->e[i];

        if (e->client >= 0 && !cc->h.alive(cc->h.arg, e->client, e->gen)) {
            continue;
        }
        if (at != e->off) {
            memmove(n->q.p + at, n->q.p + e->off, e->len);
        }
        e->off = at;
        at += e->len;
        n->e[j++] = *e;
    }
    n->n = j - n->head;
    n->q.len = at;
}

/* Node i, with nothing in flight, writes every queued command. */
static void node_send(tb__ccl_t *cc, int i)
{
    cnode_t *n = cc->nodes[i];
    tb__buf_t t;

    if (n->inflight || !n->n) {
        return;
    }
    compact(cc, n);
    if (!n->n) {
        return;
    }
    if (!node_ready(cc, i)
        || tb__conn_write(n->conn, n->q.p, n->q.len,
                          tb__deadline_ms(cc->cfg.timeout_ms), &cc->why)
               != TB_OK) {
        node_fail(cc, n);
        return;
    }
    /* The bytes in flight are kept: a MOVED sends one again. */
    t = n->sent;
    n->sent = n->q;
    n->q = t;
    n->q.len = 0;
    n->inflight = n->n;
    n->sent_at = tb_clock_monotonic_us();
    cc->h.st->batches++;
    cc->h.st->commands += n->n;
}

void tb__ccl_send(tb__ccl_t *cc)
{
    int i;

    refresh(cc, 0);
    for (i = 0; i < cc->nnodes; i++) {
        node_send(cc, i);
    }
}

/* A reply (len bytes at p) that redirects e (MOVED, ASK, TRYAGAIN)
 * sends e's command (e->len bytes at cmd) on from the node that answered
 * (index from): 1. 0 when the reply is e's answer as it is. TRYAGAIN
 * goes again at once, without the direct client's backoff: the hops
 * bound it. */
static int redirect(tb__ccl_t *cc, int from, const centry_t *e,
                    const char *p, size_t len, const char *cmd)
{
    static const char asking[] = "*1\r\n$6\r\nASKING\r\n";
    char text[320];
    tb__redirect_t rd;
    centry_t next = *e;
    int to;

    if (e->client < 0 || e->hops >= MAX_HOPS || len < 4 || p[0] != '-'
        || len - 3 >= sizeof(text)) {
        return 0;
    }
    memcpy(text, p + 1, len - 3);
    text[len - 3] = '\0';
    tb__redirect_parse(text, &rd);
    if (rd.kind == TB__REDIR_DOWN) {
        cc->stale = 1;
    }
    if (rd.kind == TB__REDIR_NONE || rd.kind == TB__REDIR_DOWN) {
        return 0;
    }
    next.hops++;
    if (rd.kind == TB__REDIR_TRYAGAIN) {
        /* Mid-migration: the owner again, once MIGRATE moved the rest. */
        to = e->slot >= 0 && cc->slots[e->slot] >= 0 ? cc->slots[e->slot]
                                                     : from;
    }
    else {
        to = node_get(cc, rd.host[0] ? rd.host : cc->nodes[from]->host,
                      rd.port);
    }
    if (to < 0) {
        return 0;
    }
    if (rd.kind == TB__REDIR_MOVED) {
        /* Right for this slot now; the rest on the next refresh. */
        cc->slots[rd.slot] = (short)to;
        cc->nodes[to]->owns = 1;
        cc->stale = 1;
    }
    if (rd.kind == TB__REDIR_ASK) {
        centry_t ask = next;

        ask.client = -1;
        if (node_put(cc->nodes[to], &ask, asking, sizeof(asking) - 1)
            != TB_OK) {
            return 0;
        }
    }
    return node_put(cc->nodes[to], &next, cmd, e->len) == TB_OK;
}

/* The whole replies in node i's input, each to its command's client,
 * in order, or on to where a redirect says. */
static void route_replies(tb__ccl_t *cc, int i)
{
    cnode_t *n = cc->nodes[i];
    size_t pos = 0;
    long long len;

    while (n->inflight
           && (len = tb__resp_span(n->rin.p + pos, n->rin.len - pos)) > 0) {
        centry_t e = n->e[n->head];
        const char *p = n->rin.p + pos;

        if (!redirect(cc, i, &e, p, (size_t)len, n->sent.p + e.off)
            && e.client >= 0) {
            cc->h.deliver(cc->h.arg, e.client, e.gen, e.seq, p,
                          (size_t)len);
        }
        pos += (size_t)len;
        n->head++;
        n->n--;
        n->inflight--;
    }
    if (n->rin.len > pos
        && (!n->inflight
            || tb__resp_span(n->rin.p + pos, n->rin.len - pos) < 0)) {
        tb__set_error(&cc->why, TB_ERR_PROTOCOL, "%s:%d: unexpected bytes",
                      n->host, n->port);
        node_fail(cc, n);
        return;
    }
    if (pos) {
        memmove(n->rin.p, n->rin.p + pos, n->rin.len - pos);
        n->rin.len -= pos;
    }
    if (!n->inflight) {
        n->sent.len = 0;
    }
    if (!n->n) {
        n->head = 0;
    }
}

void tb__ccl_read(tb__ccl_t *cc, int i)
{
    cnode_t *n;
    char buf[16384];
    long got;

    if (i < 0 || i >= cc->nnodes) {
        return;
    }
    n = cc->nodes[i];
    while (n->conn
           && (got = tb__conn_recv(n->conn, buf, sizeof(buf), &cc->why))
                  != 0) {
        if (got < 0 || tb__buf_put(&n->rin, buf, (size_t)got) != TB_OK) {
            node_fail(cc, n);
            return;
        }
    }
    route_replies(cc, i);
}

int tb__ccl_check(tb__ccl_t *cc, tb_monotime_us now, int max_ms)
{
    tb_monotime_us limit = (tb_monotime_us)cc->cfg.timeout_ms * 1000, left;
    int i, wait = max_ms;

    for (i = 0; i < cc->nnodes; i++) {
        cnode_t *n = cc->nodes[i];

        if (!n->inflight) {
            continue;
        }
        if (now - n->sent_at > limit) {
            tb__set_error(&cc->why, TB_ERR_TIMEOUT, "%s:%d: no reply "
                          "within %d ms", n->host, n->port,
                          cc->cfg.timeout_ms);
            node_fail(cc, n);
            continue;
        }
        left = (n->sent_at + limit - now + 999) / 1000;
        wait = left < wait ? (int)left : wait;
    }
    return wait;
}

size_t tb__ccl_pending(const tb__ccl_t *cc)
{
    size_t sum = 0;
    int i;

    for (i = 0; i < cc->nnodes; i++) {
        sum += cc->nodes[i]->n;
    }
    return sum;
}

tb__ccl_t *tb__ccl_create(const tb__redis_cfg_t *cfg,
                          const tb__ccl_host_t *h)
{
    tb__ccl_t *cc = calloc(1, sizeof(*cc));
    int i;

    if (!cc) {
        return NULL;
    }
    cc->cfg = *cfg;
    cc->h = *h;
    cc->stale = 1;
    memset(cc->slots, 0xff, sizeof(cc->slots));
    for (i = 0; i < cfg->addr.nseeds; i++) {
        if (node_get(cc, cfg->addr.seeds[i].host,
                     cfg->addr.seeds[i].port) < 0) {
            tb__ccl_free(cc);
            return NULL;
        }
    }
    return cc;
}

void tb__ccl_free(tb__ccl_t *cc)
{
    int i;

    if (!cc) {
        return;
    }
    for (i = 0; i < cc->nnodes; i++) {
        cnode_t *n = cc->nodes[i];

        node_drop(cc, n);
        tb__buf_free(&n->q);
        tb__buf_free(&n->sent);
        tb__buf_free(&n->rin);
        free(n->e);
        free(n);
    }
    free(cc);
}
