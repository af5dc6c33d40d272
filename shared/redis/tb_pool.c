/* tb_pool.c -- a process's connections to one Redis, and the batching of
 * commands that threads send at the same moment (group commit).
 *
 * A pool holds up to `size` connections (links), each made on first need
 * so that a host can start while Redis is down. A thread with a command
 * takes an idle link if there is one and sends at once: a lone decision
 * never waits for company. When every link is busy with a write-and-read
 * in flight (or is being opened), the thread queues its command in the
 * batch behind the link whose batch is shortest, and sleeps. When the
 * link's write-and-read completes, its leader hands the link to the
 * first member of the queued batch, which writes every queued command in
 * one write(2) and reads every reply in order; each member is woken with
 * exactly its own reply. One write and one read then carry many
 * decisions, and Redis answers a pipeline far more cheaply than the same
 * commands one by one.
 *
 * Waking: a waiting member sleeps on its batch's futex word, with a
 * bit of its own; the leader writes every member's reply and state under
 * the lock, moves the word, drops the lock, and then wakes the whole
 * batch with one FUTEX_WAKE_BITSET (and the next batch's leader by its
 * bit alone). A member woken with its reply never takes the lock again.
 * Measured under the event MPM (batches of about 6): a semaphore per
 * member cost one futex wake per member; one wake per batch saves most
 * of them (figures in the README). Linux only, as is the rest of the
 * product (the shim, the packages).
 *
 * Failure is per batch: a timeout, an I/O or a protocol error fails
 * exactly the members of that batch (a timed-out command may still run,
 * so it is never sent again), marks all but the first as `shared` so the
 * breaker counts the batch once, and closes the connection; the next
 * batch reconnects. Deadlines: each member's is its arrival plus the
 * command timeout; a batch is written and read by its earliest member's
 * deadline, extended to a full timeout after a fresh connect (connect,
 * write and read are each bounded, as with hiredis). A member whose batch
 * never completes gives up at its deadline plus the connect timeout, and
 * its command is then left out of a batch not yet written.
 *
 * Fork: each pool remembers its pid; a child drops every inherited
 * connection without a word to Redis (closing its copy of the fd sends
 * nothing) and starts empty. Connections another thread was using at the
 * fork are closed but not freed, since their buffers may have been half
 * way through growing.
 *
 * Sentinel: a pool whose address is redis-sentinel:// connects to the
 * primary its tracker names (tb_sentinel.c), and setup (tb_setup.c)
 * checks with ROLE that it is one. An I/O error or a refused connect
 * tells the tracker the primary may have moved; a link opened to a
 * primary of an older generation reconnects before its next use. Before
 * each call the tracker reads its +switch-master subscription without
 * waiting, so a primary replaced while still alive (and still accepting
 * writes) is left at once rather than when it is demoted.
 */
/* syscall(2), for futex, is declared for _GNU_SOURCE. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <linux/futex.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "redis/tb_redis_int.h"

/* What a waiting thread is told. */
enum {
    W_QUEUED = 0,  /* In a batch, no reply yet.                     */
    W_LEAD = 1,    /* Its batch's turn: write it and read it.        */
    W_DONE = 2,    /* reply holds its reply.                          */
    W_FAILED = 3   /* err says why.                                   */
};

/* A thread's place in a batch. Lives on the caller's stack; the pool
 * only reaches it through its batch slot, under the pool's lock. Its
 * state changes under the lock (a release store: a member reads it
 * without the lock), and nothing touches it after that change, so a
 * member that sees the change may return at once. */
struct tb__waiter {
    int state;
    redisReply *reply;
    tb__error_t err;
    tb__batch_t *batch;
    int index;             /* Its slot; compact() moves it.            */
    unsigned bit;          /* Its futex bitset, fixed while it sleeps. */
    tb_monotime_us deadline;
};

/* The futex wakes a leader makes once it has dropped the lock: one for
 * its batch's other members together, one for the next batch's leader.
 * They name batch words in the pool, never a member's stack. */
typedef struct {
    unsigned *word[2];
    unsigned bits[2];
    int n;
} wake_list_t;

/* This process's pid without a system call per decision (glibc does not
 * cache getpid()): read once, and again in the child of every fork() by
 * an atfork handler. A child made by a raw clone() keeps its parent's
 * figure; the shim checks for that itself. */
static pid_t cached_pid;
static pthread_once_t pid_once = PTHREAD_ONCE_INIT;

static void pid_refresh(void)
{
    cached_pid = getpid();
}

static void pid_init(void)
{
    pid_refresh();
    pthread_atfork(NULL, NULL, pid_refresh);
}

static pid_t self_pid(void)
{
    pthread_once(&pid_once, pid_init);
    return cached_pid;
}

int tb__pool_init(tb__pool_t *p, const tb__redis_cfg_t *cfg)
{
    memset(p, 0, sizeof(*p));
    p->cfg = *cfg;
    p->links = calloc((size_t)cfg->pool_size, sizeof(*p->links));
    if (!p->links) {
        return TB_ERR;
    }
    /* The tracker borrows the pool's own copy of the settings. */
    if (cfg->addr.kind == TB_REDIS_SENTINEL
        && !(p->sentinel = tb__sentinel_create(&p->cfg))) {
        free(p->links);
        p->links = NULL;
        return TB_ERR;
    }
    p->pid = self_pid();
    pthread_mutex_init(&p->mu, NULL);
    tb__cond_init(&p->cv);
    return TB_OK;
}

void tb__pool_destroy(tb__pool_t *p)
{
    int i;

    if (!p->links) {
        return;
    }
    for (i = 0; i < p->cfg.pool_size; i++) {
        /* Busy ones too: destroy means nobody uses the pool now. */
        tb__conn_free(p->links[i].conn);
        tb__buf_free(&p->links[i].b[0].out);
        tb__buf_free(&p->links[i].b[1].out);
    }
    free(p->links);
    p->links = NULL;
    tb__sentinel_free(p->sentinel);
    p->sentinel = NULL;
    pthread_cond_destroy(&p->cv);
    pthread_mutex_destroy(&p->mu);
}

void tb__pool_after_fork(tb__pool_t *p)
{
    int i;

    /* Only this thread survives the fork, so no lock is held by anyone
     * who can release it. A busy link was being used at the fork: what
     * it holds may be half-changed, so it is abandoned, not freed. */
    pthread_mutex_init(&p->mu, NULL);
    tb__cond_init(&p->cv);
    for (i = 0; i < p->cfg.pool_size; i++) {
        tb__link_t *l = &p->links[i];

        if (l->busy) {
            tb__conn_abandon(l->conn);
        }
        else {
            tb__conn_free(l->conn);
        }
        l->conn = NULL;
        l->busy = 0;
        l->b[0].n = l->b[1].n = 0;
        l->b[0].out.len = l->b[1].out.len = 0;
    }
    p->pid = self_pid();
    if (p->sentinel) {
        tb__sentinel_after_fork(p->sentinel);
    }
}

void tb__pool_usage(tb__pool_t *p, int *open, int *busy)
{
    int i;

    *open = *busy = 0;
    pthread_mutex_lock(&p->mu);
    for (i = 0; i < p->cfg.pool_size; i++) {
        *open += p->links[i].conn != NULL || p->links[i].busy;
        *busy += p->links[i].busy;
    }
    pthread_mutex_unlock(&p->mu);
}

void tb__pool_suspect(tb__pool_t *p, int drop_idle)
{
    if (p->sentinel) {
        tb__sentinel_suspect(p->sentinel, drop_idle);
    }
}

/* Open and set up one connection; *gen receives the generation of the
 * primary it was opened to (always 0 but for Sentinel). Not under mu. */
static tb__conn_t *connect_one(tb__pool_t *p, unsigned *gen, tb__error_t *e)
{
    const tb_redis_addr_t *a = &p->cfg.addr;
    tb_redis_endpoint_t to;
    tb__conn_t *c;
    int module = TB__MODULE_UNKNOWN;

    *gen = 0;
    snprintf(to.host, sizeof(to.host), "%s", a->host);
    to.port = a->port;
    if (p->sentinel
        && tb__sentinel_target(p->sentinel, &to, gen, e) != TB_OK) {
        return NULL;
    }
    c = tb__conn_open(to.host, to.port, a->path, p->cfg.tls,
                      tb__deadline_ms(p->cfg.connect_timeout_ms), e);
    if (c && tb__setup(&p->cfg, c, tb__deadline_ms(p->cfg.timeout_ms),
                       &module, e) != TB_OK) {
        tb__conn_free(c);
        c = NULL;
    }
    if (!c) {
        /* A primary that refuses connections may have been replaced. */
        tb__pool_suspect(p, 0);
        return NULL;
    }
    if (p->cfg.stats) {
        tb_stats_add(&p->cfg.stats->connects, 1);
    }
    if (module != TB__MODULE_UNKNOWN) {
        __atomic_store_n(&p->module, module, __ATOMIC_RELAXED);
    }
    return c;
}

/* ---- Batches ------------------------------------------------------------ */

/* Under mu: the link to use. An idle open link first, then an unopened
 * one (the caller opens it), both led at once (*join 0); else the busy
 * link whose queued batch is shortest and not full (*join 1); else NULL. */
static tb__link_t *pick(tb__pool_t *p, int *join)
{
    tb__link_t *unopened = NULL, *shortest = NULL;
    int i, best = TB__BATCH_MAX;

    for (i = 0; i < p->cfg.pool_size; i++) {
        tb__link_t *l = &p->links[i];

        if (!l->busy) {
            if (l->conn) {
                *join = 0;
                return l;
            }
            if (!unopened) {
                unopened = l;
            }
        }
        else if (l->b[1 - l->cur].n < best) {
            best = l->b[1 - l->cur].n;
            shortest = l;
        }
    }
    *join = unopened == NULL;
    return unopened ? unopened : shortest;
}

/* Under mu: put w's command (ASKING first when asking) in batch b. */
static int enqueue(tb__batch_t *b, tb__waiter_t *w, int asking,
                   const tb__cmd_t *cmd)
{
    static const char *ask[1] = { "ASKING" };
    static const size_t asklen[1] = { 6 };
    size_t mark = b->out.len;

    if ((asking && tb__buf_argv(&b->out, 1, ask, asklen) != TB_OK)
        || tb__buf_cmd(&b->out, cmd) != TB_OK) {
        b->out.len = mark;
        return TB_ERR;
    }
    if (b->n == 0 || w->deadline < b->deadline) {
        b->deadline = w->deadline;
    }
    w->batch = b;
    w->index = b->n;
    w->bit = 1u << (b->n & 31);
    b->off[b->n] = mark;
    b->w[b->n] = w;
    b->ncmds[b->n] = (unsigned char)(asking ? 2 : 1);
    b->n++;
    return TB_OK;
}

/* Under mu: leave out of batch b the commands of members that gave up
 * before it was written. */
static void compact(tb__batch_t *b)
{
    size_t at = 0, from, end;
    int i, j = 0;

    for (i = 0; i < b->n; i++) {
        from = b->off[i];
        end = i + 1 < b->n ? b->off[i + 1] : b->out.len;
        if (!b->w[i]) {
            continue;
        }
        if (at != from) {
            memmove(b->out.p + at, b->out.p + from, end - from);
        }
        b->off[j] = at;
        b->w[j] = b->w[i];
        b->ncmds[j] = b->ncmds[i];
        b->w[j]->index = j;
        if (j == 0 || b->w[j]->deadline < b->deadline) {
            b->deadline = b->w[j]->deadline;
        }
        at += end - from;
        j++;
    }
    b->n = j;
    b->out.len = at;
}

/* Under mu: tell w what became of it. Its reply or error is written
 * first; a member reads the state without the lock. */
static void set_state(tb__waiter_t *w, int state)
{
    __atomic_store_n(&w->state, state, __ATOMIC_RELEASE);
}

/* Under mu: hand link l to the first member of its queued batch that has
 * not given up (to be woken from wake); if there is none, the link goes
 * idle. */
static void hand_over(tb__pool_t *p, tb__link_t *l, wake_list_t *wake)
{
    tb__batch_t *nb = &l->b[1 - l->cur];
    int i;

    for (i = 0; i < nb->n; i++) {
        if (nb->w[i]) {
            l->cur = 1 - l->cur;
            wake->word[wake->n] = &nb->seq;
            wake->bits[wake->n++] = nb->w[i]->bit;
            set_state(nb->w[i], W_LEAD);
            __atomic_add_fetch(&nb->seq, 1, __ATOMIC_RELEASE);
            return;
        }
    }
    nb->n = 0;
    nb->out.len = 0;
    l->busy = 0;
    pthread_cond_signal(&p->cv);
}

/* Without mu: make sure l has a usable connection (l->conn changes under
 * mu only, so that a fork in another thread sees either the old or the
 * new one). The connection, or NULL with *e. *deadline is extended after
 * a fresh connect: the command gets its own full timeout. */
static tb__conn_t *ready_conn(tb__pool_t *p, tb__link_t *l,
                              tb__conn_t *conn, tb_monotime_us *deadline,
                              tb__error_t *e)
{
    tb_monotime_us full;
    unsigned gen = 0;

    if (conn && p->cfg.verify_fd && !tb__conn_is_ours(conn)) {
        /* Not ours any more: forget it without closing a stranger's fd. */
        pthread_mutex_lock(&p->mu);
        l->conn = NULL;
        pthread_mutex_unlock(&p->mu);
        tb__conn_forget(conn);
        conn = NULL;
    }
    if (conn) {
        return conn;
    }
    conn = connect_one(p, &gen, e);
    if (conn) {
        full = tb__deadline_ms(p->cfg.timeout_ms);
        *deadline = *deadline > full ? *deadline : full;
        pthread_mutex_lock(&p->mu);
        l->conn = conn;
        l->gen = gen;
        pthread_mutex_unlock(&p->mu);
    }
    return conn;
}

/* What a leader's write-and-read of its batch came to. */
typedef struct outcome {
    redisReply *rep[TB__BATCH_MAX]; /* The replies that came, in order. */
    int got;
    tb__conn_t *conn;               /* The connection used, or NULL.    */
    tb__error_t e;                  /* Why the rest did not come.       */
} outcome_t;

/* Without mu: make sure l has a connection (conn, if still usable), write
 * batch b on it and read every member's reply (after its ASKING's) by
 * b's deadline, into *o. TB_OK when every reply came. */
static int exchange(tb__pool_t *p, tb__link_t *l, tb__conn_t *conn,
                    const tb__batch_t *b, outcome_t *o)
{
    tb_monotime_us deadline = b->deadline;
    int rc, i, k;

    o->conn = ready_conn(p, l, conn, &deadline, &o->e);
    if (!o->conn) {
        return TB_ERR;
    }
    rc = tb__conn_write(o->conn, b->out.p, b->out.len, deadline, &o->e);
    if (p->cfg.stats) {
        tb_stats_add(&p->cfg.stats->batches, 1);
    }
    for (i = 0; rc == TB_OK && i < b->n; i++) {
        for (k = 0; k < b->ncmds[i]; k++) {
            redisReply *r;

            if (tb__conn_read(o->conn, deadline, &r, &o->e) != TB_OK) {
                return TB_ERR;
            }
            if (k + 1 < b->ncmds[i]) {
                /* ASKING's +OK: had it failed, the command's own reply
                 * says more. */
                tb__reply_free(r);
            }
            else {
                o->rep[o->got++] = r;
            }
        }
    }
    return rc;
}

/* Under mu: give every member of b its reply, or the batch's error (the
 * first failed member reports it, the others share it), and note the
 * members to wake, all but self, in wake. */
static void deliver(tb__batch_t *b, const tb__waiter_t *self,
                    const outcome_t *o, wake_list_t *wake)
{
    unsigned bits = 0;
    int i, first = 1;

    for (i = 0; i < b->n; i++) {
        tb__waiter_t *w = b->w[i];

        /* Its bit first: once its state changes, a member that is awake
         * (its sleep timed out) may return and its waiter be gone. */
        if (w && w != self) {
            bits |= w->bit;
        }
        if (i < o->got) {
            if (w) {
                w->reply = o->rep[i];
                set_state(w, W_DONE);
            }
            else {
                tb__reply_free(o->rep[i]);
            }
        }
        else if (w) {
            w->err = o->e;
            w->err.shared = !first;
            first = 0;
            set_state(w, W_FAILED);
        }
    }
    if (bits) {
        __atomic_add_fetch(&b->seq, 1, __ATOMIC_RELEASE);
        wake->word[wake->n] = &b->seq;
        wake->bits[wake->n++] = bits;
    }
}

/* Under mu, with l busy and self a member of l->b[l->cur]: connect if
 * needed, write the batch, read its replies, give every member its
 * outcome, and hand the link on; the threads to wake go to wake. Drops
 * mu during the I/O. */
static void lead(tb__pool_t *p, tb__link_t *l, tb__waiter_t *self,
                 wake_list_t *wake)
{
    tb__batch_t *b = &l->b[l->cur];
    tb__conn_t *conn = l->conn, *stale = NULL;
    outcome_t o;
    int rc;

    compact(b);
    o.got = 0;
    o.e.err = TB_ERR_NONE;
    o.e.shared = 0;
    o.e.errstr[0] = '\0';
    if (conn && p->sentinel && l->gen != tb__sentinel_gen(p->sentinel)) {
        /* Opened to a primary the sentinels no longer name. */
        stale = conn;
        conn = NULL;
        l->conn = NULL;
    }
    pthread_mutex_unlock(&p->mu);

    tb__conn_free(stale);
    rc = exchange(p, l, conn, b, &o);

    pthread_mutex_lock(&p->mu);
    if (rc != TB_OK) {
        /* A sentinel kills the clients of a node it promotes or demotes,
         * and a dead primary's connections are all dead. */
        tb__pool_suspect(p, 1);
        l->conn = NULL;
        tb__conn_free(o.conn);
    }
    deliver(b, self, &o, wake);
    b->n = 0;
    b->out.len = 0;
    hand_over(p, l, wake);
}

/* Takes mu held and returns without it: sleep until w's batch is done
 * or w must lead it; give up at the last moment a member can be kept
 * waiting. The sleep is on the batch's word with w's bit, so one wake
 * from the leader rouses its whole batch (one system call rather than
 * one per member); the word moves after every state change, so a change
 * between the reads below and the sleep makes the sleep return at once
 * rather than miss its wake. */
static void wait_turn(tb__pool_t *p, tb__waiter_t *w)
{
    struct timespec until = tb__timespec_at(
        w->deadline + (tb_monotime_us)p->cfg.connect_timeout_ms * 1000
        + 10000);
    tb__batch_t *b = w->batch;
    unsigned bit = w->bit, seen;

    pthread_mutex_unlock(&p->mu);
    for (;;) {
        seen = __atomic_load_n(&b->seq, __ATOMIC_ACQUIRE);
        if (__atomic_load_n(&w->state, __ATOMIC_ACQUIRE) != W_QUEUED) {
            return;
        }
        if (syscall(SYS_futex, &b->seq, FUTEX_WAIT_BITSET_PRIVATE, seen,
                    &until, NULL, bit) == 0 || errno != ETIMEDOUT) {
            continue;  /* Woken, moved (EAGAIN) or EINTR: look again. */
        }
        pthread_mutex_lock(&p->mu);
        if (w->state == W_QUEUED) {
            w->batch->w[w->index] = NULL;
            pthread_mutex_unlock(&p->mu);
            tb__set_error(&w->err, TB_ERR_TIMEOUT,
                          "no reply within %d ms (connection busy)",
                          p->cfg.timeout_ms);
            /* The batch's leader reports the batch to the breaker. */
            w->err.shared = 1;
            w->state = W_FAILED;
            return;
        }
        /* Decided just now; nothing will touch w again. */
        pthread_mutex_unlock(&p->mu);
        return;
    }
}

/* Without mu: the wakes lead() and hand_over() chose. A woken member
 * may return (and its waiter go) at once: only batch words are named. */
static void wake_all(wake_list_t *wake)
{
    int i;

    for (i = 0; i < wake->n; i++) {
        syscall(SYS_futex, wake->word[i], FUTEX_WAKE_BITSET_PRIVATE, INT_MAX,
                NULL, NULL, wake->bits[i]);
    }
}

int tb__pool_call(tb__pool_t *p, int asking, const tb__cmd_t *cmd,
                  redisReply **reply, tb__error_t *e)
{
    tb__waiter_t w;
    wake_list_t wake;
    tb__link_t *l;
    int join, rc;

    *reply = NULL;
    if (p->pid != self_pid()) {
        /* Forked without tb_client_after_fork: do it now. */
        tb__pool_after_fork(p);
    }
    if (p->sentinel) {
        tb__sentinel_check(p->sentinel);
    }
    w.state = W_QUEUED;
    w.reply = NULL;
    wake.n = 0;
    w.deadline = tb__deadline_ms(p->cfg.timeout_ms);

    pthread_mutex_lock(&p->mu);
    while (!(l = pick(p, &join))) {
        struct timespec until = tb__timespec_at(w.deadline);

        /* Every link busy and every queued batch full. */
        if (pthread_cond_timedwait(&p->cv, &p->mu, &until) == ETIMEDOUT) {
            pthread_mutex_unlock(&p->mu);
            tb__set_error(e, TB_ERR_TIMEOUT,
                          "no free connection in the pool within %d ms",
                          p->cfg.timeout_ms);
            return TB_ERR;
        }
    }
    if (enqueue(&l->b[join ? 1 - l->cur : l->cur], &w, asking, cmd)
        != TB_OK) {
        pthread_mutex_unlock(&p->mu);
        tb__set_error(e, TB_ERR_OOM, "%s: out of memory", cmd->argv[0]);
        return TB_ERR;
    }
    if (join) {
        wait_turn(p, &w);
        if (w.state == W_LEAD) {
            pthread_mutex_lock(&p->mu);
        }
    }
    else {
        l->busy = 1;
        w.state = W_LEAD;
    }
    if (w.state == W_LEAD) {
        lead(p, l, &w, &wake);
        pthread_mutex_unlock(&p->mu);
        wake_all(&wake);
    }
    rc = w.state == W_DONE ? TB_OK : TB_ERR;
    if (rc == TB_OK) {
        *reply = w.reply;
    }
    else {
        *e = w.err;
    }
    return rc;
}
