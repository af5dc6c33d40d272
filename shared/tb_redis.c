/* tb_redis.c -- hiredis connections, the per-process pool, and the script
 * call.
 *
 * A connection is made on first need (so a host can start while Redis is
 * down), with a connect timeout and a command timeout (hiredis 0.14 needs
 * redisSetTimeout as well: the connect timeout covers the connect only).
 * AUTH, SELECT and SCRIPT LOAD are pipelined on connect: one extra round
 * trip per connection, none per decision. A connection that saw any I/O
 * error or timeout is freed, never reused (the hiredis contract: a context
 * in error cannot be reused, and a timed-out command may still answer
 * later). Each pool remembers the pid that opened its sockets: a forked
 * child drops them without a word to Redis and reconnects.
 *
 * Sentinel (issue 6): a pool whose address is redis-sentinel:// connects
 * to the primary the sentinels name (tb_sentinel.c) and checks with ROLE,
 * pipelined with the setup, that the node really is a primary. An I/O
 * error, a refused connect or a READONLY reply marks the pool stale, so
 * the next connect asks the sentinels again, and the idle connections
 * are dropped as they are next borrowed (the slot's generation; a sentinel
 * kills the clients of a node it promotes or demotes, and those of a dead
 * node are dead). When the sentinels name a new primary, that drops them
 * too. The pool also reads a subscription to +switch-master without
 * waiting each time a connection is borrowed, so a primary that the
 * sentinels replace while it is still alive (and still accepts writes) is
 * left at once rather than when it is finally demoted.
 *
 * Cluster (issue 6): tb_cluster.c keeps one ordinary pool per node and
 * calls tb__run_script_node(), which can send ASKING first and reports
 * MOVED, ASK, TRYAGAIN and CLUSTERDOWN replies as redirects.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "tb_int.h"

void tb__set_error(tb__error_t *e, int err, const char *fmt, ...)
{
    va_list ap;

    e->err = err;
    va_start(ap, fmt);
    vsnprintf(e->errstr, sizeof(e->errstr), fmt, ap);
    va_end(ap);
}

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

/* Map a hiredis context error to our kinds: EAGAIN on a blocking socket
 * with SO_RCVTIMEO is how hiredis 0.14 reports a timeout. */
void tb__ctx_error(tb__error_t *e, const redisContext *ctx,
                   const char *during)
{
    int kind = TB_ERR_IO;

    if ((ctx->err == REDIS_ERR_IO
         && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINPROGRESS))
        || strstr(ctx->errstr, "timed out")
        || strstr(ctx->errstr, "temporarily unavailable")) {
        kind = TB_ERR_TIMEOUT;
    }
    else if (ctx->err == REDIS_ERR_PROTOCOL) {
        kind = TB_ERR_PROTOCOL;
    }
    tb__set_error(e, kind, "%s: %s", during,
                  ctx->errstr[0] ? ctx->errstr : "connection lost");
}

void tb__cond_init(pthread_cond_t *cv)
{
    pthread_condattr_t ca;

    /* Wait against the monotonic clock: a wall-clock step must not turn
     * a 50 ms pool wait into minutes. */
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(cv, &ca);
    pthread_condattr_destroy(&ca);
}

int tb__pool_init(tb__pool_t *p, const tb_redis_addr_t *addr, int timeout_ms,
                  int connect_timeout_ms, int size, int verify_fd,
                  tb_stats_t *stats)
{
    memset(p, 0, sizeof(*p));
    p->slots = calloc((size_t)size, sizeof(*p->slots));
    if (!p->slots) {
        return TB_ERR;
    }
    p->addr = *addr;
    p->timeout_ms = timeout_ms;
    p->connect_timeout_ms = connect_timeout_ms;
    p->size = size;
    p->verify_fd = verify_fd;
    p->stats = stats;
    p->pid = self_pid();
    pthread_mutex_init(&p->mu, NULL);
    pthread_mutex_init(&p->rmu, NULL);
    tb__cond_init(&p->cv);
    /* Nothing is known about the primary until a sentinel is asked. */
    p->stale = addr->kind == TB_REDIS_SENTINEL;
    return TB_OK;
}

void tb__pool_suspect(tb__pool_t *p, int drop_idle)
{
    if (p->addr.kind != TB_REDIS_SENTINEL) {
        return;
    }
    pthread_mutex_lock(&p->mu);
    p->stale = 1;
    if (drop_idle) {
        p->gen++;
    }
    pthread_mutex_unlock(&p->mu);
}

/* Sentinel: take the primary the sentinels named. Under mu. */
static void set_primary(tb__pool_t *p, const char *host, int port)
{
    if (port != p->cur_port || strcmp(host, p->cur_host) != 0) {
        /* A new primary: connections to the old one must go. */
        p->gen++;
        snprintf(p->cur_host, sizeof(p->cur_host), "%s", host);
        p->cur_port = port;
    }
    p->stale = 0;
}

static void watch_drop(tb__pool_t *p, int silently)
{
    if (p->watch) {
        if (silently) {
            /* A forked child or a host that reused the fd: do not
             * close a descriptor that is not ours to close. */
            p->watch->fd = -1;
        }
        redisFree(p->watch);
        p->watch = NULL;
    }
}

/* Sentinel: read the +switch-master subscription, (re)subscribing at most
 * once a second while there is none. Never waits for another thread: if
 * one is asking the sentinels, its answer will do. */
static void watch_check(tb__pool_t *p)
{
    char host[sizeof(p->cur_host)];
    int port = 0, rc;
    tb__error_t e;
    struct stat st;

    if (p->addr.kind != TB_REDIS_SENTINEL
        || pthread_mutex_trylock(&p->rmu) != 0) {
        return;
    }
    if (p->watch && p->verify_fd
        && (fstat(p->watch->fd, &st) != 0 || st.st_dev != p->watch_dev
            || st.st_ino != p->watch_ino)) {
        watch_drop(p, 1);
    }
    if (!p->watch && tb_clock_monotonic_us() >= p->watch_retry_us) {
        p->watch_retry_us = tb_clock_monotonic_us() + 1000000;
        p->watch = tb__sentinel_watch(&p->addr, &p->watch_next,
                                      p->connect_timeout_ms, p->timeout_ms,
                                      &e);
        if (p->watch) {
            fcntl(p->watch->fd, F_SETFD,
                  fcntl(p->watch->fd, F_GETFD) | FD_CLOEXEC);
            if (fstat(p->watch->fd, &st) == 0) {
                p->watch_dev = st.st_dev;
                p->watch_ino = st.st_ino;
            }
            /* A switch may have been announced while nobody listened. */
            pthread_mutex_lock(&p->mu);
            p->stale = 1;
            pthread_mutex_unlock(&p->mu);
        }
    }
    if (p->watch) {
        rc = tb__sentinel_poll(p->watch, &p->addr, host, sizeof(host),
                               &port);
        if (rc < 0) {
            watch_drop(p, 0);
        }
        else if (rc > 0) {
            pthread_mutex_lock(&p->mu);
            set_primary(p, host, port);
            pthread_mutex_unlock(&p->mu);
        }
    }
    pthread_mutex_unlock(&p->rmu);
}

/* Sentinel: the primary to connect to now, asking the sentinels first
 * when the pool is stale, and its generation. One thread asks at a time;
 * the others wait for its answer rather than ask again. */
static int sentinel_target(tb__pool_t *p, char *host, size_t hostsz,
                           int *port, unsigned *gen, tb__error_t *e)
{
    char h[sizeof(p->cur_host)];
    int stale, first, pt = 0, rc = TB_OK;

    pthread_mutex_lock(&p->rmu);
    pthread_mutex_lock(&p->mu);
    stale = p->stale;
    first = p->next_sentinel;
    pthread_mutex_unlock(&p->mu);
    if (stale) {
        rc = tb__sentinel_resolve(&p->addr, &first, p->connect_timeout_ms,
                                  p->timeout_ms, h, sizeof(h), &pt, e);
        pthread_mutex_lock(&p->mu);
        if (rc == TB_OK) {
            set_primary(p, h, pt);
            p->next_sentinel = first;
        }
        pthread_mutex_unlock(&p->mu);
    }
    if (rc == TB_OK) {
        pthread_mutex_lock(&p->mu);
        snprintf(host, hostsz, "%s", p->cur_host);
        *port = p->cur_port;
        *gen = p->gen;
        pthread_mutex_unlock(&p->mu);
    }
    pthread_mutex_unlock(&p->rmu);
    return rc;
}

void tb__pool_destroy(tb__pool_t *p)
{
    int i;

    if (!p->slots) {
        return;
    }
    for (i = 0; i < p->size; i++) {
        /* Borrowed ones too: destroy means nobody uses the pool now. */
        if (p->slots[i].ctx) {
            redisFree(p->slots[i].ctx);
        }
    }
    free(p->slots);
    p->slots = NULL;
    watch_drop(p, 0);
    pthread_cond_destroy(&p->cv);
    pthread_mutex_destroy(&p->mu);
    pthread_mutex_destroy(&p->rmu);
}

void tb__pool_after_fork(tb__pool_t *p)
{
    int i;

    /* Only this thread survives the fork, so no lock is held by anyone
     * who can release it: make fresh ones. Every inherited connection is
     * dropped, the ones other threads had borrowed included (those
     * threads do not exist here). Closing our copy of an fd sends
     * nothing, so the parent's sessions are intact. */
    pthread_mutex_init(&p->mu, NULL);
    pthread_mutex_init(&p->rmu, NULL);
    tb__cond_init(&p->cv);
    for (i = 0; i < p->size; i++) {
        if (p->slots[i].ctx) {
            redisFree(p->slots[i].ctx);
        }
        memset(&p->slots[i], 0, sizeof(p->slots[i]));
    }
    p->open = 0;
    p->in_use = 0;
    p->pid = self_pid();
    /* Closing our copy sends nothing: the parent stays subscribed. */
    watch_drop(p, 0);
    p->watch_retry_us = 0;
}

static struct timeval tv_ms(int ms)
{
    struct timeval tv;

    tv.tv_sec = ms / 1000;
    tv.tv_usec = (ms % 1000) * 1000;
    return tv;
}

/* Sentinel: is ROLE's reply a primary's? */
static int role_is_master(const redisReply *r)
{
    return r->type == REDIS_REPLY_ARRAY && r->elements > 0
           && r->element[0]->type == REDIS_REPLY_STRING
           && strcmp(r->element[0]->str, "master") == 0;
}

/* Pipeline AUTH, SELECT, one SCRIPT LOAD per algorithm (issue 7) and,
 * for Sentinel, ROLE, then read every reply. */
static int setup(tb__pool_t *p, redisContext *ctx, tb__error_t *e)
{
    const tb_redis_addr_t *a = &p->addr;
    int i, n = 0, ok = 1, nauth, role = a->kind == TB_REDIS_SENTINEL;
    const char *what[2 + TB_ALGO_COUNT];

    if (a->password[0]) {
        if (a->user[0]) {
            redisAppendCommand(ctx, "AUTH %s %s", a->user, a->password);
        }
        else {
            redisAppendCommand(ctx, "AUTH %s", a->password);
        }
        what[n++] = "AUTH";
    }
    if (a->db > 0) {
        redisAppendCommand(ctx, "SELECT %d", a->db);
        what[n++] = "SELECT";
    }
    nauth = n;
    for (i = 0; i < TB_ALGO_COUNT; i++) {
        const char *src = tb_algo_script_source((tb_algo_t)i);

        if (!src) {
            /* A library built with a stale script table: refuse rather
             * than crash in the formatter. */
            tb__set_error(e, TB_ERR_PROTOCOL, "no embedded script %d", i);
            return TB_ERR;
        }
        redisAppendCommand(ctx, "SCRIPT LOAD %s", src);
        what[n++] = "SCRIPT LOAD";
    }
    for (i = 0; i < n; i++) {
        redisReply *r = NULL;

        if (redisGetReply(ctx, (void **)&r) != REDIS_OK) {
            tb__ctx_error(e, ctx, what[i]);
            return TB_ERR;
        }
        if (ok && r->type == REDIS_REPLY_ERROR) {
            tb__set_error(e, i < nauth ? TB_ERR_AUTH : TB_ERR_REPLY,
                          "%s refused: %.80s", what[i], r->str);
            ok = 0;
        }
        else if (ok && i >= nauth
                 && (r->type != REDIS_REPLY_STRING
                     || strcmp(r->str, tb_algo_script_sha1(
                                           (tb_algo_t)(i - nauth))) != 0)) {
            tb__set_error(e, TB_ERR_PROTOCOL,
                          "SCRIPT LOAD returned an unexpected digest");
            ok = 0;
        }
        freeReplyObject(r);
    }
    if (role) {
        redisReply *r = NULL;

        /* Sentinels name the primary a little before and after it is
         * one: a node that is not a primary would answer READONLY. */
        redisAppendCommand(ctx, "ROLE");
        if (redisGetReply(ctx, (void **)&r) != REDIS_OK) {
            tb__ctx_error(e, ctx, "ROLE");
            return TB_ERR;
        }
        if (ok && !role_is_master(r)) {
            tb__set_error(e, TB_ERR_REPLY, "the node the sentinels named "
                          "is not a primary (ROLE)");
            ok = 0;
        }
        freeReplyObject(r);
    }
    return ok ? TB_OK : TB_ERR;
}

/* Open and set up one connection; *gen receives the generation of the
 * primary it was opened to (always 0 but for Sentinel). */
static redisContext *connect_one(tb__pool_t *p, unsigned *gen,
                                 tb__error_t *e)
{
    const tb_redis_addr_t *a = &p->addr;
    struct timeval ct = tv_ms(p->connect_timeout_ms);
    redisContext *ctx;
    char host[sizeof(p->cur_host)];
    int port = a->port;

    *gen = 0;
    snprintf(host, sizeof(host), "%s", a->host);
    if (a->kind == TB_REDIS_SENTINEL
        && sentinel_target(p, host, sizeof(host), &port, gen, e) != TB_OK) {
        return NULL;
    }
    if (a->path[0]) {
        ctx = redisConnectUnixWithTimeout(a->path, ct);
    }
    else {
        ctx = redisConnectWithTimeout(host, port, ct);
    }
    if (!ctx) {
        tb__set_error(e, TB_ERR_OOM, "connect: out of memory");
        return NULL;
    }
    if (ctx->err) {
        tb__ctx_error(e, ctx, "connect");
        redisFree(ctx);
        /* A primary that refuses connections may have been replaced. */
        tb__pool_suspect(p, 0);
        return NULL;
    }
    /* A CGI child or an exec'd program must not inherit our socket. */
    fcntl(ctx->fd, F_SETFD, fcntl(ctx->fd, F_GETFD) | FD_CLOEXEC);
    if (redisSetTimeout(ctx, tv_ms(p->timeout_ms)) != REDIS_OK) {
        tb__ctx_error(e, ctx, "set timeout");
        redisFree(ctx);
        return NULL;
    }
    if (!a->path[0]) {
        redisEnableKeepAlive(ctx);
    }
    if (setup(p, ctx, e) != TB_OK) {
        redisFree(ctx);
        tb__pool_suspect(p, 0);
        return NULL;
    }
    if (p->stats) {
        tb_stats_add(&p->stats->connects, 1);
    }
    return ctx;
}

/* Remember which socket a connection's fd is, so a later check can
 * tell it from whatever a host put on the same number after closing it. */
static void remember_fd(tb__slot_t *sl)
{
    struct stat st;

    if (fstat(sl->ctx->fd, &st) == 0) {
        sl->dev = st.st_dev;
        sl->ino = st.st_ino;
    }
}

/* Is the fd still the socket we opened? A daemon that closed every fd and
 * opened a file or a socket of its own on the same number must never get
 * Redis protocol written into it. */
static int fd_still_ours(const tb__slot_t *sl)
{
    struct stat st;

    return sl->ctx->fd >= 0 && fstat(sl->ctx->fd, &st) == 0
           && S_ISSOCK(st.st_mode) && st.st_dev == sl->dev
           && st.st_ino == sl->ino;
}

static struct timespec deadline_in(int ms)
{
    struct timespec d;

    clock_gettime(CLOCK_MONOTONIC, &d);
    d.tv_sec += ms / 1000;
    d.tv_nsec += (long)(ms % 1000) * 1000000L;
    if (d.tv_nsec >= 1000000000L) {
        d.tv_sec++;
        d.tv_nsec -= 1000000000L;
    }
    return d;
}

/* Under the lock: an idle slot, else an empty one to fill, else -1. */
static int pick_slot(tb__pool_t *p, int *fresh)
{
    int i, empty = -1;

    for (i = 0; i < p->size; i++) {
        if (p->slots[i].busy) {
            continue;
        }
        if (p->slots[i].ctx) {
            *fresh = 0;
            return i;
        }
        if (empty < 0) {
            empty = i;
        }
    }
    *fresh = 1;
    return empty;
}

redisContext *tb__pool_get(tb__pool_t *p, tb__error_t *e)
{
    struct timespec deadline;
    redisContext *ctx, *old = NULL;
    tb__slot_t *sl;
    int i, fresh;
    unsigned gen = 0;

    if (p->pid != self_pid()) {
        /* Forked without tb_client_after_fork: do it now. */
        tb__pool_after_fork(p);
    }
    watch_check(p);
    deadline = deadline_in(p->timeout_ms);
    pthread_mutex_lock(&p->mu);
    while ((i = pick_slot(p, &fresh)) < 0) {
        if (pthread_cond_timedwait(&p->cv, &p->mu, &deadline) == ETIMEDOUT) {
            pthread_mutex_unlock(&p->mu);
            tb__set_error(e, TB_ERR_TIMEOUT,
                          "no free connection in the pool within %d ms",
                          p->timeout_ms);
            return NULL;
        }
    }
    sl = &p->slots[i];
    sl->busy = 1;
    p->in_use++;
    if (fresh) {
        p->open++;
    }
    if (sl->ctx && sl->gen != p->gen) {
        /* Opened to a primary the sentinels no longer name. */
        old = sl->ctx;
        sl->ctx = NULL;
    }
    pthread_mutex_unlock(&p->mu);
    if (old) {
        redisFree(old);
    }

    ctx = sl->ctx;
    if (ctx && p->verify_fd && !fd_still_ours(sl)) {
        /* Not ours any more: forget it without closing a stranger's fd. */
        ctx->fd = -1;
        redisFree(ctx);
        ctx = NULL;
    }
    if (!ctx) {
        /* Connect outside the lock: it may take the connect timeout. The
         * slot is ours (busy) meanwhile; its fields change under the lock
         * only, because tb__pool_put scans them. */
        ctx = connect_one(p, &gen, e);
        pthread_mutex_lock(&p->mu);
        sl->ctx = ctx;
        sl->gen = gen;
        if (ctx) {
            remember_fd(sl);
        }
        else {
            sl->busy = 0;
            p->open--;
            p->in_use--;
            pthread_cond_signal(&p->cv);
        }
        pthread_mutex_unlock(&p->mu);
    }
    return ctx;
}

void tb__pool_put(tb__pool_t *p, redisContext *ctx, int broken)
{
    int i;

    if (p->pid != self_pid()) {
        /* Borrowed before a fork, returned in the child: after_fork has
         * already freed it. */
        return;
    }
    pthread_mutex_lock(&p->mu);
    for (i = 0; i < p->size; i++) {
        if (p->slots[i].ctx == ctx) {
            break;
        }
    }
    if (i == p->size) {
        pthread_mutex_unlock(&p->mu);
        return;
    }
    p->in_use--;
    p->slots[i].busy = 0;
    if (broken || ctx->err) {
        p->open--;
        p->slots[i].ctx = NULL;
    }
    else {
        ctx = NULL;
    }
    pthread_cond_signal(&p->cv);
    pthread_mutex_unlock(&p->mu);
    if (ctx) {
        redisFree(ctx);
    }
}

/* The scripts answer {allowed, remaining, retry_ms, binding} and, for a
 * lease, a fifth element: the tokens granted. */
static int parse_reply(const redisReply *r, tb__script_reply_t *out,
                       tb__error_t *e)
{
    size_t i;

    if (r->type != REDIS_REPLY_ARRAY || r->elements < 4 || r->elements > 5) {
        tb__set_error(e, TB_ERR_PROTOCOL,
                      "script reply is not an array of 4 or 5 (type %d)",
                      r->type);
        return TB_ERR;
    }
    out->v[4] = 0;
    for (i = 0; i < r->elements; i++) {
        if (r->element[i]->type != REDIS_REPLY_INTEGER) {
            tb__set_error(e, TB_ERR_PROTOCOL,
                          "script reply element %zu is not an integer", i);
            return TB_ERR;
        }
        out->v[i] = r->element[i]->integer;
    }
    return TB_OK;
}

/* Send argv and read its reply; with asking, ASKING goes first in the
 * same write (it holds for the one command after it). NULL on an I/O
 * error or timeout, with ctx->err set. */
static redisReply *send_argv(redisContext *ctx, int asking, int argc,
                             const char **argv, const size_t *argvlen)
{
    redisReply *r = NULL;

    if (!asking) {
        return redisCommandArgv(ctx, argc, argv, argvlen);
    }
    redisAppendCommand(ctx, "ASKING");
    redisAppendCommandArgv(ctx, argc, argv, argvlen);
    if (redisGetReply(ctx, (void **)&r) != REDIS_OK) {
        return NULL;
    }
    /* +OK; were it an error, the command's own reply says more. */
    freeReplyObject(r);
    r = NULL;
    if (redisGetReply(ctx, (void **)&r) != REDIS_OK) {
        return NULL;
    }
    return r;
}

/* Classify a cluster error reply: "MOVED <slot> <host>:<port>", "ASK
 * ...", "TRYAGAIN ..." or "CLUSTERDOWN ...". The host is what follows the
 * slot up to the last ':' (so IPv6 literals pass), brackets removed;
 * empty means "the node that answered" (Redis 7 sends that when a node
 * does not know its own address). */
static void parse_redirect(const char *s, tb__redirect_t *rd)
{
    const char *rest, *colon;
    char *end;
    size_t hl;
    long slot, port;

    memset(rd, 0, sizeof(*rd));
    if (strncmp(s, "TRYAGAIN", 8) == 0) {
        rd->kind = TB__REDIR_TRYAGAIN;
        return;
    }
    if (strncmp(s, "CLUSTERDOWN", 11) == 0) {
        rd->kind = TB__REDIR_DOWN;
        return;
    }
    if (strncmp(s, "MOVED ", 6) == 0) {
        rest = s + 6;
    }
    else if (strncmp(s, "ASK ", 4) == 0) {
        rest = s + 4;
    }
    else {
        return;
    }
    slot = strtol(rest, &end, 10);
    if (end == rest || *end != ' ' || slot < 0 || slot > 16383) {
        return;
    }
    rest = end + 1;
    colon = strrchr(rest, ':');
    if (!colon) {
        return;
    }
    port = strtol(colon + 1, &end, 10);
    if (*end || port < 1 || port > 65535) {
        return;
    }
    hl = (size_t)(colon - rest);
    if (hl >= 2 && rest[0] == '[' && rest[hl - 1] == ']') {
        rest++;
        hl -= 2;
    }
    if (hl >= sizeof(rd->host) || (hl == 1 && rest[0] == '?')) {
        hl = 0;
    }
    memcpy(rd->host, rest, hl);
    rd->host[hl] = '\0';
    rd->slot = (int)slot;
    rd->port = (int)port;
    rd->kind = s[0] == 'M' ? TB__REDIR_MOVED : TB__REDIR_ASK;
}

/* An error reply: copy its text; a READONLY one means the sentinels'
 * primary was demoted. Returns 1 when the connection must not be kept. */
static int reply_error(tb__pool_t *p, const redisReply *r,
                       tb__redirect_t *rd, tb__error_t *e)
{
    tb__set_error(e, TB_ERR_REPLY, "%.120s", r->str);
    if (rd) {
        parse_redirect(r->str, rd);
    }
    if (p->addr.kind == TB_REDIS_SENTINEL
        && strncmp(r->str, "READONLY", 8) == 0) {
        tb__pool_suspect(p, 1);
        return 1;
    }
    return 0;
}

static int run_script(tb__pool_t *p, int asking, int argc,
                      const char **argv, size_t *argvlen,
                      tb__script_reply_t *out, tb__redirect_t *rd,
                      tb__error_t *e)
{
    redisContext *ctx = tb__pool_get(p, e);
    redisReply *r;
    int rc, drop = 0;

    if (rd) {
        memset(rd, 0, sizeof(*rd));
    }
    if (!ctx) {
        return TB_ERR;
    }
    r = send_argv(ctx, asking, argc, argv, argvlen);
    if (r && r->type == REDIS_REPLY_ERROR
        && strncmp(r->str, "NOSCRIPT", 8) == 0) {
        /* The script cache was flushed (SCRIPT FLUSH, a restart, a
         * failover): EVAL sends the text once and caches it again. The
         * caller's argv is borrowed for the retry and put back. */
        const char *av0 = argv[0], *av1 = argv[1];
        size_t l0 = argvlen[0], l1 = argvlen[1];
        const char *text = tb_algo_script_source(TB_ALGO_TOKEN_BUCKET);
        int a;

        /* The digest says which algorithm's script to send (issue 7). */
        for (a = 0; a < TB_ALGO_COUNT; a++) {
            if (l1 == 40 && memcmp(av1, tb_algo_script_sha1((tb_algo_t)a),
                                   40) == 0) {
                text = tb_algo_script_source((tb_algo_t)a);
            }
        }

        freeReplyObject(r);
        if (p->stats) {
            tb_stats_add(&p->stats->noscript_reloads, 1);
        }
        argv[0] = "EVAL";
        argvlen[0] = 4;
        argv[1] = text;
        argvlen[1] = strlen(text);
        /* ASKING held for the EVALSHA only: send it again. */
        r = send_argv(ctx, asking, argc, argv, argvlen);
        argv[0] = av0;
        argv[1] = av1;
        argvlen[0] = l0;
        argvlen[1] = l1;
    }
    if (!r) {
        tb__ctx_error(e, ctx, "EVALSHA");
        tb__pool_put(p, ctx, 1);
        /* Sentinel kills the clients of a node it promotes or demotes,
         * and a dead primary's connections are all dead: drop them. */
        tb__pool_suspect(p, 1);
        return TB_ERR;
    }
    if (r->type == REDIS_REPLY_ERROR) {
        drop = reply_error(p, r, rd, e);
        rc = TB_ERR;
    }
    else {
        rc = parse_reply(r, out, e);
    }
    freeReplyObject(r);
    tb__pool_put(p, ctx, drop);
    return rc;
}

int tb__run_script(tb__pool_t *p, int argc, const char **argv,
                   size_t *argvlen, tb__script_reply_t *out,
                   tb__error_t *e)
{
    return run_script(p, 0, argc, argv, argvlen, out, NULL, e);
}

int tb__run_script_node(tb__pool_t *p, int asking, int argc,
                        const char **argv, size_t *argvlen,
                        tb__script_reply_t *out, tb__redirect_t *rd,
                        tb__error_t *e)
{
    return run_script(p, asking, argc, argv, argvlen, out, rd, e);
}

static int command(tb__pool_t *p, int asking, int argc, const char **argv,
                   const size_t *argvlen, redisReply **reply,
                   tb__redirect_t *rd, tb__error_t *e)
{
    redisContext *ctx = tb__pool_get(p, e);
    int drop = 0;

    if (rd) {
        memset(rd, 0, sizeof(*rd));
    }
    if (!ctx) {
        return TB_ERR;
    }
    *reply = send_argv(ctx, asking, argc, argv, argvlen);
    if (!*reply) {
        tb__ctx_error(e, ctx, argv[0]);
        tb__pool_put(p, ctx, 1);
        /* Sentinel kills the clients of a node it promotes or demotes,
         * and a dead primary's connections are all dead: drop them. */
        tb__pool_suspect(p, 1);
        return TB_ERR;
    }
    if ((*reply)->type == REDIS_REPLY_ERROR) {
        drop = reply_error(p, *reply, rd, e);
    }
    tb__pool_put(p, ctx, drop);
    return (*reply)->type == REDIS_REPLY_ERROR ? TB_ERR : TB_OK;
}

int tb__command(tb__pool_t *p, int argc, const char **argv,
                const size_t *argvlen, redisReply **reply, tb__error_t *e)
{
    return command(p, 0, argc, argv, argvlen, reply, NULL, e);
}

int tb__command_node(tb__pool_t *p, int asking, int argc,
                     const char **argv, const size_t *argvlen,
                     redisReply **reply, tb__redirect_t *rd, tb__error_t *e)
{
    return command(p, asking, argc, argv, argvlen, reply, rd, e);
}
