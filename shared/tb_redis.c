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

/* Map a hiredis context error to our kinds: EAGAIN on a blocking socket
 * with SO_RCVTIMEO is how hiredis 0.14 reports a timeout. */
static void ctx_error(tb__error_t *e, const redisContext *ctx,
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

static void cond_init(pthread_cond_t *cv)
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
    p->pid = getpid();
    pthread_mutex_init(&p->mu, NULL);
    cond_init(&p->cv);
    return TB_OK;
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
    pthread_cond_destroy(&p->cv);
    pthread_mutex_destroy(&p->mu);
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
    cond_init(&p->cv);
    for (i = 0; i < p->size; i++) {
        if (p->slots[i].ctx) {
            redisFree(p->slots[i].ctx);
        }
        memset(&p->slots[i], 0, sizeof(p->slots[i]));
    }
    p->open = 0;
    p->in_use = 0;
    p->pid = getpid();
}

static struct timeval tv_ms(int ms)
{
    struct timeval tv;

    tv.tv_sec = ms / 1000;
    tv.tv_usec = (ms % 1000) * 1000;
    return tv;
}

/* Pipeline AUTH, SELECT and one SCRIPT LOAD per algorithm (issue 7),
 * then read every reply. */
static int setup(tb__pool_t *p, redisContext *ctx, tb__error_t *e)
{
    const tb_redis_addr_t *a = &p->addr;
    int i, n = 0, ok = 1, nauth;
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
            ctx_error(e, ctx, what[i]);
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
    return ok ? TB_OK : TB_ERR;
}

static redisContext *connect_one(tb__pool_t *p, tb__error_t *e)
{
    const tb_redis_addr_t *a = &p->addr;
    struct timeval ct = tv_ms(p->connect_timeout_ms);
    redisContext *ctx;

    if (a->path[0]) {
        ctx = redisConnectUnixWithTimeout(a->path, ct);
    }
    else {
        ctx = redisConnectWithTimeout(a->host, a->port, ct);
    }
    if (!ctx) {
        tb__set_error(e, TB_ERR_OOM, "connect: out of memory");
        return NULL;
    }
    if (ctx->err) {
        ctx_error(e, ctx, "connect");
        redisFree(ctx);
        return NULL;
    }
    /* A CGI child or an exec'd program must not inherit our socket. */
    fcntl(ctx->fd, F_SETFD, fcntl(ctx->fd, F_GETFD) | FD_CLOEXEC);
    if (redisSetTimeout(ctx, tv_ms(p->timeout_ms)) != REDIS_OK) {
        ctx_error(e, ctx, "set timeout");
        redisFree(ctx);
        return NULL;
    }
    if (!a->path[0]) {
        redisEnableKeepAlive(ctx);
    }
    if (setup(p, ctx, e) != TB_OK) {
        redisFree(ctx);
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
    redisContext *ctx;
    tb__slot_t *sl;
    int i, fresh;

    if (p->pid != getpid()) {
        /* Forked without tb_client_after_fork: do it now. */
        tb__pool_after_fork(p);
    }
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
    pthread_mutex_unlock(&p->mu);

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
        ctx = connect_one(p, e);
        pthread_mutex_lock(&p->mu);
        sl->ctx = ctx;
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

    if (p->pid != getpid()) {
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

static int parse_reply(const redisReply *r, tb__script_reply_t *out,
                       tb__error_t *e)
{
    size_t i;

    if (r->type != REDIS_REPLY_ARRAY || r->elements != 4) {
        tb__set_error(e, TB_ERR_PROTOCOL,
                      "script reply is not an array of 4 (type %d)",
                      r->type);
        return TB_ERR;
    }
    for (i = 0; i < 4; i++) {
        if (r->element[i]->type != REDIS_REPLY_INTEGER) {
            tb__set_error(e, TB_ERR_PROTOCOL,
                          "script reply element %zu is not an integer", i);
            return TB_ERR;
        }
        out->v[i] = r->element[i]->integer;
    }
    return TB_OK;
}

int tb__run_script(tb__pool_t *p, int argc, const char **argv,
                   size_t *argvlen, tb__script_reply_t *out,
                   tb__error_t *e)
{
    redisContext *ctx = tb__pool_get(p, e);
    redisReply *r;
    int rc;

    if (!ctx) {
        return TB_ERR;
    }
    r = redisCommandArgv(ctx, argc, argv, argvlen);
    if (r && r->type == REDIS_REPLY_ERROR
        && strncmp(r->str, "NOSCRIPT", 8) == 0) {
        /* The script cache was flushed (SCRIPT FLUSH, a restart, a
         * failover): EVAL sends the text once and caches it again. The
         * caller's argv is borrowed for the retry and put back. */
        const char *av0 = argv[0], *av1 = argv[1];
        size_t l0 = argvlen[0], l1 = argvlen[1];
        const char *text = tb_script_source;
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
        r = redisCommandArgv(ctx, argc, argv, argvlen);
        argv[0] = av0;
        argv[1] = av1;
        argvlen[0] = l0;
        argvlen[1] = l1;
    }
    if (!r) {
        ctx_error(e, ctx, "EVALSHA");
        tb__pool_put(p, ctx, 1);
        return TB_ERR;
    }
    if (r->type == REDIS_REPLY_ERROR) {
        tb__set_error(e, TB_ERR_REPLY, "%.120s", r->str);
        rc = TB_ERR;
    }
    else {
        rc = parse_reply(r, out, e);
    }
    freeReplyObject(r);
    tb__pool_put(p, ctx, 0);
    return rc;
}

int tb__command(tb__pool_t *p, int argc, const char **argv,
                const size_t *argvlen, redisReply **reply, tb__error_t *e)
{
    redisContext *ctx = tb__pool_get(p, e);

    if (!ctx) {
        return TB_ERR;
    }
    *reply = redisCommandArgv(ctx, argc, argv, argvlen);
    if (!*reply) {
        ctx_error(e, ctx, argv[0]);
        tb__pool_put(p, ctx, 1);
        return TB_ERR;
    }
    tb__pool_put(p, ctx, 0);
    if ((*reply)->type == REDIS_REPLY_ERROR) {
        tb__set_error(e, TB_ERR_REPLY, "%.120s", (*reply)->str);
        return TB_ERR;
    }
    return TB_OK;
}
