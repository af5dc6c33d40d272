/* tb_coalesce.c -- the coalescer: one process per host that carries every
 * local client's commands to one Redis on one connection, as pipelines.
 *
 * Clients (Apache children's pools) speak RESP to its socket as to
 * Redis. It frames whole commands (tb__resp_span; nothing else is parsed)
 * and queues them; with nothing in flight it writes the queue at once,
 * what arrives meanwhile goes as the next single write once its replies
 * are in: batching without a timer. Redis answers in order, so a FIFO of
 * (client, commands) routes each reply's bytes back untouched. AUTH,
 * SELECT and TLS are its own connection's; a client sending a command
 * that would change or hold that connection (SELECT, MULTI, BLPOP...) is
 * closed.
 * Sentinel: the primary its tracker names, left on an I/O error,
 * READONLY or +switch-master. Failure: a pipeline with no reply within
 * the timeout, or a lost connection, answers every queued and in-flight
 * command with an error reply, in order, so each client stays in step
 * and its breaker counts it; a failed connect is retried after RETRY_MS
 * at the earliest, commands in between refused at once. One thread. A
 * Cluster's commands go one by one to tb_coalesce_cluster.c (a pipeline
 * per primary), their replies back in each client's order.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "redis/tb_redis_int.h"

#define RETRY_MS 100             /* Between failed connects.            */
#define READ_MAX (256 * 1024)    /* Read from one client per wake-up.   */
#define CHUNK 16384
#define CHECK_MS 1000            /* How often the socket file is looked at. */
#define TICK_MS 100              /* The longest sleep: stop, checks.    */
#define EV_LISTEN 0
#define EV_REDIS 1
#define EV_CLIENT 2              /* Slot i is EV_CLIENT + i.            */

typedef struct client {
    int fd;               /* -1: a free slot.                           */
    unsigned gen;         /* Moves when freed: older replies dropped.   */
    int want_out;         /* EPOLLOUT armed.                            */
    int dirty;            /* On the flush list.                         */
    size_t out_off;       /* Written of out.                            */
    tb__buf_t in;         /* Read, not yet a whole command.             */
    tb__buf_t out;        /* Replies not yet written.                   */
    tb__reorder_t ro;     /* Cluster: its commands' numbers, its order. */
} client_t;

/* One client's commands in order: queued (off..off+len) or in flight. */
typedef struct entry {
    int slot;
    unsigned gen;
    int n;
    size_t off, len;
} entry_t;

struct tb_coalescer {
    tb__redis_cfg_t cfg;       /* The Redis side: one address, TLS.     */
    char path[108];
    int lfd;                   /* The listener; -1 once stopping.       */
    tb_monotime_us paused;     /* Listener out of epoll until (0: in).  */
    ino_t lino;                /* The socket file it bound.             */
    dev_t ldev;
    int ep;
    client_t *cl;
    int ncl;
    int *dirty;                /* Slots with replies to write.          */
    int ndirty;
    entry_t *fifo;             /* fifo[head .. head + nent).            */
    size_t head, nent, cap;
    size_t inflight;           /* Of those, the first ones in flight.   */
    tb__buf_t q;               /* The queued entries' bytes.            */
    tb__buf_t rin;             /* From Redis, not yet a whole reply.    */
    tb__conn_t *redis;
    tb__sentinel_t *sentinel;  /* redis-sentinel:// only, else NULL.    */
    tb__ccl_t *ccl;            /* redis-cluster:// only, else NULL.     */
    unsigned gen;              /* The primary redis was opened to.      */
    tb_monotime_us sent_at, retry_at, next_check;
    tb__error_t why;           /* The last Redis failure.               */
    tb_coalescer_stats_t st;
};

static const char *const denied[] = {
    "AUTH", "SELECT", "HELLO", "MULTI", "EXEC", "DISCARD", "WATCH",
    "UNWATCH", "SUBSCRIBE", "PSUBSCRIBE", "SSUBSCRIBE", "UNSUBSCRIBE",
    "PUNSUBSCRIBE", "SUNSUBSCRIBE", "MONITOR", "RESET", "QUIT", "CLIENT",
    "BLPOP", "BRPOP", "BLMOVE", "BRPOPLPUSH", "BLMPOP", "BZPOPMIN",
    "BZPOPMAX", "BZMPOP", "WAIT", "WAITAOF", "XREAD", "XREADGROUP",
    "SHUTDOWN", "SYNC", "PSYNC", "REPLCONF", "READONLY", "READWRITE",
    "ASKING", "DEBUG", NULL
};

/* Would the command at p (len bytes, one whole RESP array) change or
 * hold the shared connection? */
static int is_denied(const char *p, size_t len)
{
    const char *name = memchr(p, '\n', len), *end;
    int i;

    if (!name || (size_t)(++name - p) >= len || *name != '$'
        || !(name = memchr(name, '\n', len - (size_t)(name - p)))) {
        return 1;
    }
    name++;
    end = memchr(name, '\r', len - (size_t)(name - p));
    if (!end) {
        return 1;
    }
    for (i = 0; denied[i]; i++) {
        if (strlen(denied[i]) == (size_t)(end - name)
            && strncasecmp(denied[i], name, (size_t)(end - name)) == 0) {
            return 1;
        }
    }
    return 0;
}

/* ---- The listener ------------------------------------------------------ */

/* Bind and listen on c->path (a stale socket file is replaced), mode
 * 0600 (never wider, even between bind and chmod). TB_OK, or TB_ERR
 * with c->why. */
static int listen_on(tb_coalescer_t *c)
{
    struct sockaddr_un sun;
    struct epoll_event ev;
    struct stat st;
    mode_t old;
    int fd, rc;

    memset(&sun, 0, sizeof(sun));
    sun.sun_family = AF_UNIX;
    memcpy(sun.sun_path, c->path, strlen(c->path) + 1);
    fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        tb__set_error(&c->why, TB_ERR_IO, "socket: %s", strerror(errno));
        return TB_ERR;
    }
    unlink(c->path);
    old = umask(0077);
    rc = bind(fd, (struct sockaddr *)&sun, sizeof(sun));
    umask(old);
    if (rc < 0 || chmod(c->path, 0600) < 0 || listen(fd, 4096) < 0
        || stat(c->path, &st) < 0) {
        tb__set_error(&c->why, TB_ERR_IO, "%s: %s", c->path,
                      strerror(errno));
        close(fd);
        return TB_ERR;
    }
    c->lino = st.st_ino;
    c->ldev = st.st_dev;
    memset(&ev, 0, sizeof(ev));
    ev.events = EPOLLIN;
    ev.data.u64 = EV_LISTEN;
    epoll_ctl(c->ep, EPOLL_CTL_ADD, fd, &ev);
    c->lfd = fd;
    return TB_OK;
}

/* Is the socket file still the one we bound? */
static int socket_is_ours(const tb_coalescer_t *c)
{
    struct stat st;

    return stat(c->path, &st) == 0 && st.st_ino == c->lino
           && st.st_dev == c->ldev;
}

static void stop_listening(tb_coalescer_t *c)
{
    if (c->lfd < 0) {
        return;
    }
    if (socket_is_ours(c)) {
        unlink(c->path);
    }
    close(c->lfd);
    c->lfd = -1;
}

/* ---- Clients ----------------------------------------------------------- */

static void client_close(tb_coalescer_t *c, int slot)
{
    client_t *k = &c->cl[slot];

    epoll_ctl(c->ep, EPOLL_CTL_DEL, k->fd, NULL);
    close(k->fd);
    k->fd = -1;
    k->gen++;
    k->in.len = k->out.len = k->out_off = 0;
    k->want_out = 0;
    tb__reorder_reset(&k->ro);
    c->st.clients--;
}

/* A free slot, the array grown when full. -1 when out of memory. */
static int free_slot(tb_coalescer_t *c)
{
    client_t *cl;
    int *dirty, i, n;

    for (i = 0; i < c->ncl; i++) {
        if (c->cl[i].fd < 0) {
            return i;
        }
    }
    n = c->ncl ? 2 * c->ncl : 64;
    cl = realloc(c->cl, (size_t)n * sizeof(*cl));
    if (!cl) {
        return -1;
    }
    c->cl = cl;
    dirty = realloc(c->dirty, (size_t)n * sizeof(*dirty));
    if (!dirty) {
        return -1;
    }
    c->dirty = dirty;
    memset(cl + c->ncl, 0, (size_t)(n - c->ncl) * sizeof(*cl));
    for (i = c->ncl; i < n; i++) {
        cl[i].fd = -1;
    }
    i = c->ncl;
    c->ncl = n;
    return i;
}

/* Out of descriptors: the listener would stay readable and the loop
 * spin, so it leaves epoll until the next turn's housekeeping (at most
 * TICK_MS), while the clients already here are served. */
static void pause_listener(tb_coalescer_t *c)
{
    epoll_ctl(c->ep, EPOLL_CTL_DEL, c->lfd, NULL);
    c->paused = tb__deadline_ms(TICK_MS);
}

static void resume_listener(tb_coalescer_t *c)
{
    struct epoll_event ev;

    memset(&ev, 0, sizeof(ev));
    ev.events = EPOLLIN;
    ev.data.u64 = EV_LISTEN;
    if (c->lfd >= 0 && epoll_ctl(c->ep, EPOLL_CTL_ADD, c->lfd, &ev) == 0) {
        c->paused = 0;
    }
}

static void accept_all(tb_coalescer_t *c)
{
    struct epoll_event ev;
    int fd, slot;

    while (c->lfd >= 0) {
        fd = accept4(c->lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS
                || errno == ENOMEM) {
                pause_listener(c);
            }
            return;
        }
        if ((slot = free_slot(c)) < 0) {
            close(fd);
            continue;
        }
        c->cl[slot].fd = fd;
        memset(&ev, 0, sizeof(ev));
        ev.events = EPOLLIN | EPOLLRDHUP;
        ev.data.u64 = EV_CLIENT + (uint64_t)slot;
        epoll_ctl(c->ep, EPOLL_CTL_ADD, fd, &ev);
        c->st.clients++;
        c->st.accepted++;
    }
}

/* Queue n commands of slot (len bytes at p). A client's commands that
 * follow its last queued ones join that entry. */
static int enqueue(tb_coalescer_t *c, int slot, int n, const char *p,
                   size_t len)
{
    entry_t *e, *f;

    if (c->nent > c->inflight) {
        e = &c->fifo[c->head + c->nent - 1];
        if (e->slot == slot && e->gen == c->cl[slot].gen) {
            if (tb__buf_put(&c->q, p, len) != TB_OK) {
                return TB_ERR;
            }
            e->n += n;
            e->len += len;
            return TB_OK;
        }
    }
    if (c->head + c->nent == c->cap) {
        if (c->head > 0) {
            memmove(c->fifo, c->fifo + c->head, c->nent * sizeof(*f));
            c->head = 0;
        }
        else {
            f = realloc(c->fifo, (c->cap ? 2 * c->cap : 256) * sizeof(*f));
            if (!f) {
                return TB_ERR;
            }
            c->fifo = f;
            c->cap = c->cap ? 2 * c->cap : 256;
        }
    }
    e = &c->fifo[c->head + c->nent];
    e->slot = slot;
    e->gen = c->cl[slot].gen;
    e->n = n;
    e->off = c->q.len;
    e->len = len;
    if (tb__buf_put(&c->q, p, len) != TB_OK) {
        return TB_ERR;
    }
    c->nent++;
    return TB_OK;
}

/* The whole commands in slot's input, queued; a partial one stays. -1
 * when the client must be closed (not RESP, a denied command). */
static int take_commands(tb_coalescer_t *c, int slot)
{
    client_t *k = &c->cl[slot];
    size_t pos = 0;
    long long len;
    int n = 0;

    while ((len = tb__resp_span(k->in.p + pos, k->in.len - pos)) > 0) {
        if (k->in.p[pos] != '*' || is_denied(k->in.p + pos, (size_t)len)) {
            c->st.refused++;
            return -1;
        }
        if (c->ccl && tb__ccl_submit(c->ccl, slot, k->gen, k->ro.next_in++,
                                     k->in.p + pos, (size_t)len) != TB_OK) {
            return -1;
        }
        if (k->fd < 0) {
            return 0;   /* Closed by an answer it could not take. */
        }
        pos += (size_t)len;
        n++;
    }
    if (len < 0
        || (n && !c->ccl && enqueue(c, slot, n, k->in.p, pos) != TB_OK)) {
        return -1;
    }
    if (pos) {
        memmove(k->in.p, k->in.p + pos, k->in.len - pos);
        k->in.len -= pos;
    }
    return 0;
}

/* Read what slot sent (events: epoll's word). A client that has gone is
 * closed before anything it sent is queued (EPOLLRDHUP, or the read's
 * end). A short read with no hang-up took all there was: no recv() to
 * hear EAGAIN, a system call per decision (level-triggered epoll). */
static void client_read(tb_coalescer_t *c, int slot, uint32_t events)
{
    client_t *k = &c->cl[slot];
    char buf[CHUNK];
    size_t total = 0;
    ssize_t n;

    for (;;) {
        n = recv(k->fd, buf, sizeof(buf), MSG_DONTWAIT);
        if (n > 0) {
            if (tb__buf_put(&k->in, buf, (size_t)n) != TB_OK) {
                break;
            }
            total += (size_t)n;
            if (total < READ_MAX
                && ((size_t)n == sizeof(buf)
                    || (events & (EPOLLRDHUP | EPOLLHUP | EPOLLERR)))) {
                continue;
            }
            /* All there was, or enough for one wake-up. */
        }
        else if (n < 0 && errno == EINTR) {
            continue;
        }
        else if (n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK)) {
            break;
        }
        if (take_commands(c, slot) == 0) {
            return;
        }
        break;
    }
    client_close(c, slot);
}

/* Write what slot has been answered; arm EPOLLOUT for the rest. */
static void client_flush(tb_coalescer_t *c, int slot)
{
    client_t *k = &c->cl[slot];
    struct epoll_event ev;
    ssize_t n;

    while (k->out_off < k->out.len) {
        n = send(k->fd, k->out.p + k->out_off, k->out.len - k->out_off,
                 MSG_DONTWAIT | MSG_NOSIGNAL);
        if (n > 0) {
            k->out_off += (size_t)n;
        }
        else if (n < 0 && errno == EINTR) {
            continue;
        }
        else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            break;
        }
        else {
            client_close(c, slot);
            return;
        }
    }
    if (k->out_off == k->out.len) {
        k->out.len = k->out_off = 0;
    }
    if (k->want_out != (k->out.len > 0)) {
        k->want_out = k->out.len > 0;
        memset(&ev, 0, sizeof(ev));
        ev.events = EPOLLIN | EPOLLRDHUP | (k->want_out ? EPOLLOUT : 0);
        ev.data.u64 = EV_CLIENT + (uint64_t)slot;
        epoll_ctl(c->ep, EPOLL_CTL_MOD, k->fd, &ev);
    }
}

/* Hand len reply bytes at p to client slot (of generation gen) of the
 * coalescer arg, if it is still there; seq: the command's number
 * (Cluster: tb__ccl_host_t's deliver), or -1: in order. */
static void answer_seq(void *arg, int slot, unsigned gen, uint64_t seq,
                       const char *p, size_t len)
{
    tb_coalescer_t *c = arg;
    client_t *k = &c->cl[slot];

    if (k->fd < 0 || k->gen != gen) {
        return;
    }
    if ((seq == UINT64_MAX ? tb__buf_put(&k->out, p, len)
                           : tb__reorder_put(&k->ro, seq, p, len, &k->out))
        != TB_OK) {
        client_close(c, slot);
        return;
    }
    if (!k->dirty) {
        k->dirty = 1;
        c->dirty[c->ndirty++] = slot;
    }
}

/* Is client slot of generation gen still there (tb__ccl_host_t)? */
static int ccl_alive(void *arg, int client, unsigned gen)
{
    const tb_coalescer_t *c = arg;

    return c->cl[client].fd >= 0 && c->cl[client].gen == gen;
}

static void flush_all(tb_coalescer_t *c)
{
    int i, slot;

    for (i = 0; i < c->ndirty; i++) {
        slot = c->dirty[i];
        c->cl[slot].dirty = 0;
        if (c->cl[slot].fd >= 0) {
            client_flush(c, slot);
        }
    }
    c->ndirty = 0;
}

/* ---- Redis ------------------------------------------------------------- */

static void drop_redis(tb_coalescer_t *c)
{
    if (c->redis) {
        epoll_ctl(c->ep, EPOLL_CTL_DEL, tb__conn_fd(c->redis), NULL);
        tb__conn_free(c->redis);
        c->redis = NULL;
    }
    c->rin.len = 0;
}

/* Redis failed (c->why says how): every queued and in-flight command is
 * answered with an error reply, in order, and the connection dropped. */
static void fail_all(tb_coalescer_t *c)
{
    char line[TB_ERRSTR_LEN + 32];
    size_t i, len;
    int k;

    drop_redis(c);
    if (c->sentinel) {
        /* A dead or demoted primary: ask the sentinels again. */
        tb__sentinel_suspect(c->sentinel, 1);
    }
    len = (size_t)snprintf(line, sizeof(line), "-ERR coalescer: %s\r\n",
                           c->why.errstr);
    len = len < sizeof(line) ? len : sizeof(line) - 1;
    for (i = 0; i < len - 2; i++) {
        line[i] = line[i] == '\r' || line[i] == '\n' ? ' ' : line[i];
    }
    for (i = c->head; i < c->head + c->nent; i++) {
        for (k = 0; k < c->fifo[i].n; k++) {
            answer_seq(c, c->fifo[i].slot, c->fifo[i].gen, UINT64_MAX,
                       line, len);
        }
        c->st.failed += (uint64_t)c->fifo[i].n;
    }
    c->head = c->nent = c->inflight = 0;
    c->q.len = 0;
}

/* A connection to Redis (to the primary the sentinels name, for
 * Sentinel), set up (AUTH, SELECT; ROLE for Sentinel); 0 when there is
 * none (c->why says why) and it is too soon to try again. Blocks for at
 * most the connect timeout plus the timeout. */
static int redis_ready(tb_coalescer_t *c)
{
    const tb_redis_addr_t *a = &c->cfg.addr;
    tb_redis_endpoint_t to;
    struct epoll_event ev;
    int module;

    if (c->redis && c->sentinel && c->gen != tb__sentinel_gen(c->sentinel)) {
        drop_redis(c);  /* Opened to a primary no longer named. */
    }
    if (c->redis) {
        return 1;
    }
    if (tb_clock_monotonic_us() < c->retry_at) {
        return 0;
    }
    snprintf(to.host, sizeof(to.host), "%s", a->host);
    to.port = a->port;
    if (!c->sentinel
        || tb__sentinel_target(c->sentinel, &to, &c->gen, &c->why) == TB_OK) {
        c->redis = tb__conn_open(to.host, to.port, a->path, c->cfg.tls,
                                 tb__deadline_ms(c->cfg.connect_timeout_ms),
                                 &c->why);
    }
    if (c->redis
        && tb__setup(&c->cfg, c->redis, tb__deadline_ms(c->cfg.timeout_ms),
                     &module, &c->why) != TB_OK) {
        tb__conn_free(c->redis);
        c->redis = NULL;
    }
    if (!c->redis) {
        if (c->sentinel) {
            tb__sentinel_suspect(c->sentinel, 0);
        }
        c->retry_at = tb__deadline_ms(RETRY_MS);
        return 0;
    }
    memset(&ev, 0, sizeof(ev));
    ev.events = EPOLLIN;
    ev.data.u64 = EV_REDIS;
    epoll_ctl(c->ep, EPOLL_CTL_ADD, tb__conn_fd(c->redis), &ev);
    c->st.connects++;
    return 1;
}

/* Leave out of the queue the commands of clients that have gone. */
static void compact(tb_coalescer_t *c)
{
    size_t i, j = c->head, at = 0;

    for (i = c->head; i < c->head + c->nent; i++) {
        entry_t *e = &c->fifo[i];

        if (c->cl[e->slot].fd < 0 || c->cl[e->slot].gen != e->gen) {
            continue;
        }
        if (at != e->off) {
            memmove(c->q.p + at, c->q.p + e->off, e->len);
        }
        e->off = at;
        at += e->len;
        c->fifo[j++] = *e;
    }
    c->nent = j - c->head;
    c->q.len = at;
}

/* With nothing in flight, write every queued command in one write. */
static void send_batch(tb_coalescer_t *c)
{
    size_t i;

    if (c->ccl) {
        tb__ccl_send(c->ccl);
        return;
    }
    if (c->inflight || !c->nent) {
        return;
    }
    compact(c);
    if (!c->nent) {
        return;
    }
    if (!redis_ready(c)) {
        fail_all(c);
        return;
    }
    if (tb__conn_write(c->redis, c->q.p, c->q.len,
                       tb__deadline_ms(c->cfg.timeout_ms), &c->why)
        != TB_OK) {
        fail_all(c);
        return;
    }
    c->inflight = c->nent;
    c->sent_at = tb_clock_monotonic_us();
    c->q.len = 0;
    c->st.batches++;
    for (i = c->head; i < c->head + c->nent; i++) {
        c->st.commands += (uint64_t)c->fifo[i].n;
    }
}

/* Route what Redis answered to the in-flight entries, in order. */
static void redis_read(tb_coalescer_t *c)
{
    char buf[CHUNK];
    size_t pos = 0;
    long long len;
    long n;

    while (c->redis
           && (n = tb__conn_recv(c->redis, buf, sizeof(buf), &c->why)) != 0) {
        if (n < 0 || tb__buf_put(&c->rin, buf, (size_t)n) != TB_OK) {
            fail_all(c);
            return;
        }
    }
    while (c->inflight
           && (len = tb__resp_span(c->rin.p + pos, c->rin.len - pos)) > 0) {
        entry_t *e = &c->fifo[c->head];

        if (c->sentinel && len > 9
            && memcmp(c->rin.p + pos, "-READONLY", 9) == 0) {
            /* The primary was demoted: the next pipeline goes to the
             * one the sentinels name now. */
            tb__sentinel_suspect(c->sentinel, 1);
        }
        answer_seq(c, e->slot, e->gen, UINT64_MAX, c->rin.p + pos,
                   (size_t)len);
        pos += (size_t)len;
        if (--e->n == 0) {
            c->head++;
            c->nent--;
            c->inflight--;
        }
    }
    if (c->rin.len > pos && (!c->inflight
                             || tb__resp_span(c->rin.p + pos,
                                              c->rin.len - pos) < 0)) {
        tb__set_error(&c->why, TB_ERR_PROTOCOL, "unexpected bytes from Redis");
        fail_all(c);
        return;
    }
    if (pos) {
        memmove(c->rin.p, c->rin.p + pos, c->rin.len - pos);
        c->rin.len -= pos;
    }
    if (!c->nent) {
        c->head = 0;
    }
}

/* ---- The loop ---------------------------------------------------------- */

static tb__ccl_t *cluster_side(tb_coalescer_t *c)
{
    tb__ccl_host_t h;

    h.deliver = answer_seq;
    h.alive = ccl_alive;
    h.arg = c;
    h.ep = c->ep;
    h.st = &c->st;
    return c->ccl = tb__ccl_create(&c->cfg, &h);
}

tb_coalescer_t *tb_coalescer_create(const tb_coalescer_options_t *o,
                                    char *err, size_t errlen)
{
    tb_coalescer_t *c = calloc(1, sizeof(*c));
    char why[160];

    if (!c) {
        snprintf(err, errlen, "coalescer: out of memory");
        return NULL;
    }
    c->lfd = -1;
    c->ep = -1;
    if (tb_url_parse(o->url, &c->cfg.addr, why, sizeof(why)) != TB_OK) {
        snprintf(err, errlen, "coalescer: %s", why);
    }
    else if (c->cfg.addr.tls && !o->tls_ctx) {
        snprintf(err, errlen, "coalescer: a TLS URL needs a TLS context");
    }
    else if (!o->path || strlen(o->path) >= sizeof(c->path)
             || o->path[0] != '/') {
        snprintf(err, errlen, "coalescer: the socket path must be "
                 "absolute and shorter than %zu bytes", sizeof(c->path));
    }
    else if ((c->ep = epoll_create1(EPOLL_CLOEXEC)) < 0) {
        snprintf(err, errlen, "coalescer: epoll: %s", strerror(errno));
    }
    else {
        memcpy(c->path, o->path, strlen(o->path) + 1);
        c->cfg.tls = c->cfg.addr.tls ? o->tls_ctx : NULL;
        c->cfg.timeout_ms = o->timeout_ms > 0 ? o->timeout_ms : 50;
        c->cfg.connect_timeout_ms = o->connect_timeout_ms > 0
                                        ? o->connect_timeout_ms
                                        : c->cfg.timeout_ms;
        c->cfg.pool_size = 1;
        c->cfg.engine = TB_ENGINE_SCRIPT;
        /* The tracker borrows c->cfg, which lives as long as it. */
        if ((c->cfg.addr.kind == TB_REDIS_SENTINEL
             && !(c->sentinel = tb__sentinel_create(&c->cfg)))
            || (c->cfg.addr.kind == TB_REDIS_CLUSTER && !cluster_side(c))) {
            snprintf(err, errlen, "coalescer: out of memory");
        }
        else if (listen_on(c) == TB_OK) {
            return c;
        }
        else {
            snprintf(err, errlen, "coalescer: %s", c->why.errstr);
        }
    }
    tb_coalescer_free(c);
    return NULL;
}

void tb_coalescer_free(tb_coalescer_t *c)
{
    int i;

    if (!c) {
        return;
    }
    stop_listening(c);
    for (i = 0; i < c->ncl; i++) {
        if (c->cl[i].fd >= 0) {
            close(c->cl[i].fd);
        }
        tb__buf_free(&c->cl[i].in);
        tb__buf_free(&c->cl[i].out);
        tb__reorder_reset(&c->cl[i].ro);
    }
    drop_redis(c);
    tb__ccl_free(c->ccl);
    tb__sentinel_free(c->sentinel);
    if (c->ep >= 0) {
        close(c->ep);
    }
    tb__buf_free(&c->q);
    tb__buf_free(&c->rin);
    free(c->cl);
    free(c->dirty);
    free(c->fifo);
    free(c);
}

void tb_coalescer_stats(const tb_coalescer_t *c, tb_coalescer_stats_t *st)
{
    *st = c->st;
}

/* The checks of each turn: a pipeline past its timeout, the socket file
 * (put back if someone removed it). TB_ERR when it cannot be. */
static int housekeeping(tb_coalescer_t *c, tb_monotime_us now)
{
    if (c->sentinel) {
        /* +switch-master, read without waiting: a primary replaced
         * while alive is left before its next pipeline. */
        tb__sentinel_check(c->sentinel);
    }
    if (c->ccl) {
        tb__ccl_check(c->ccl, now, TICK_MS);
    }
    if (c->inflight
        && now - c->sent_at > (tb_monotime_us)c->cfg.timeout_ms * 1000) {
        tb__set_error(&c->why, TB_ERR_TIMEOUT, "no reply from Redis "
                      "within %d ms", c->cfg.timeout_ms);
        fail_all(c);
    }
    if (c->paused && now >= c->paused) {
        resume_listener(c);
    }
    if (c->lfd >= 0 && now >= c->next_check) {
        c->next_check = now + CHECK_MS * 1000;
        if (!socket_is_ours(c)) {
            epoll_ctl(c->ep, EPOLL_CTL_DEL, c->lfd, NULL);
            close(c->lfd);
            c->lfd = -1;
            c->st.rebinds++;
            return listen_on(c);
        }
    }
    return TB_OK;
}

/* How long the next wait may sleep, in ms. */
static int sleep_ms(tb_coalescer_t *c, tb_monotime_us now)
{
    tb_monotime_us left;

    if (c->ccl) {
        return tb__ccl_check(c->ccl, now, TICK_MS);
    }
    if (!c->inflight) {
        return TICK_MS;
    }
    left = c->sent_at + (tb_monotime_us)c->cfg.timeout_ms * 1000 - now;
    left = left <= 0 ? 0 : (left + 999) / 1000;
    return left < TICK_MS ? (int)left : TICK_MS;
}

static void dispatch(tb_coalescer_t *c, const struct epoll_event *ev)
{
    uint64_t id = ev->data.u64;
    int slot;

    if (id == EV_LISTEN) {
        accept_all(c);
        return;
    }
    if (id == EV_REDIS) {
        redis_read(c);
        return;
    }
    if (id >= TB__CCL_EV) {
        tb__ccl_read(c->ccl, (int)(id - TB__CCL_EV));
        return;
    }
    slot = (int)(id - EV_CLIENT);
    if (c->cl[slot].fd < 0) {
        return;
    }
    if (ev->events & EPOLLOUT) {
        client_flush(c, slot);
    }
    if (c->cl[slot].fd >= 0 && (ev->events & (EPOLLIN | EPOLLRDHUP
                                              | EPOLLHUP | EPOLLERR))) {
        client_read(c, slot, ev->events);
    }
}

int tb_coalescer_run(tb_coalescer_t *c, volatile sig_atomic_t *stop,
                     int linger_ms)
{
    struct epoll_event ev[64];
    tb_monotime_us now, until = 0;
    int i, n;

    for (;;) {
        now = tb_clock_monotonic_us();
        if (*stop && c->lfd >= 0) {
            /* New clients go to whoever binds the path next; the ones
             * here are served until they leave, or for linger_ms. */
            stop_listening(c);
            until = now + (tb_monotime_us)linger_ms * 1000;
        }
        if (*stop && ((!c->st.clients && !c->nent
                       && !(c->ccl && tb__ccl_pending(c->ccl)))
                      || now >= until)) {
            return TB_OK;
        }
        if (housekeeping(c, now) != TB_OK) {
            return TB_ERR;
        }
        n = epoll_wait(c->ep, ev, 64, sleep_ms(c, now));
        if (n < 0 && errno != EINTR) {
            return TB_ERR;
        }
        for (i = 0; i < n; i++) {
            dispatch(c, &ev[i]);
        }
        /* Redis works on the next pipeline while replies go out. */
        send_batch(c);
        flush_all(c);
    }
}
