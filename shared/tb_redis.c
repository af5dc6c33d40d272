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

int tb__pool_init(tb__pool_t *p, const tb_redis_addr_t *addr, int timeout_ms,
                  int connect_timeout_ms, int size, int verify_fd,
                  tb_stats_t *stats)
{
    pthread_condattr_t ca;

    memset(p, 0, sizeof(*p));
    p->idle = calloc((size_t)size, sizeof(*p->idle));
    if (!p->idle) {
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
    /* Wait against the monotonic clock: a wall-clock step must not turn
     * a 50 ms pool wait into minutes. */
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&p->cv, &ca);
    pthread_condattr_destroy(&ca);
    return TB_OK;
}

void tb__pool_destroy(tb__pool_t *p)
{
    int i;

    if (!p->idle) {
        return;
    }
    for (i = 0; i < p->nidle; i++) {
        redisFree(p->idle[i]);
    }
    free(p->idle);
    p->idle = NULL;
    pthread_cond_destroy(&p->cv);
    pthread_mutex_destroy(&p->mu);
}

void tb__pool_after_fork(tb__pool_t *p)
{
    int i;

    /* Only this thread survives the fork, so no lock is held by anyone
     * who can release it: make fresh ones. Closing our copy of each
     * inherited fd sends nothing, so the parent's sessions are intact. */
    pthread_mutex_init(&p->mu, NULL);
    {
        pthread_condattr_t ca;

        pthread_condattr_init(&ca);
        pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
        pthread_cond_init(&p->cv, &ca);
        pthread_condattr_destroy(&ca);
    }
    for (i = 0; i < p->nidle; i++) {
        redisFree(p->idle[i]);
    }
    p->nidle = 0;
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
        redisAppendCommand(ctx, "SCRIPT LOAD %s",
                           tb_algo_script_source((tb_algo_t)i));
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

/* Is the context's fd still the socket we opened? A daemon that closed
 * every fd, and perhaps opened a file on the same number, must never get
 * Redis protocol written into it. */
static int fd_still_ours(redisContext *ctx)
{
    struct stat st;

    return ctx->fd >= 0 && fstat(ctx->fd, &st) == 0 && S_ISSOCK(st.st_mode);
}

redisContext *tb__pool_get(tb__pool_t *p, tb__error_t *e)
{
    redisContext *ctx = NULL;
    struct timespec deadline;

    if (p->pid != getpid()) {
        /* Forked without tb_client_after_fork: do it now. */
        tb__pool_after_fork(p);
    }
    clock_gettime(CLOCK_MONOTONIC, &deadline);
    deadline.tv_sec += p->timeout_ms / 1000;
    deadline.tv_nsec += (long)(p->timeout_ms % 1000) * 1000000L;
    if (deadline.tv_nsec >= 1000000000L) {
        deadline.tv_sec++;
        deadline.tv_nsec -= 1000000000L;
    }
    pthread_mutex_lock(&p->mu);
    for (;;) {
        if (p->nidle > 0) {
            ctx = p->idle[--p->nidle];
            p->in_use++;
            break;
        }
        if (p->open < p->size) {
            p->open++;
            p->in_use++;
            break;
        }
        if (pthread_cond_timedwait(&p->cv, &p->mu, &deadline) == ETIMEDOUT) {
            pthread_mutex_unlock(&p->mu);
            tb__set_error(e, TB_ERR_TIMEOUT,
                          "no free connection in the pool within %d ms",
                          p->timeout_ms);
            return NULL;
        }
    }
    pthread_mutex_unlock(&p->mu);
    if (ctx && p->verify_fd && !fd_still_ours(ctx)) {
        /* Not ours any more: forget it without closing a stranger's fd. */
        ctx->fd = -1;
        redisFree(ctx);
        ctx = NULL;
    }
    if (!ctx) {
        /* Connect outside the lock: it may take the connect timeout. */
        ctx = connect_one(p, e);
        if (!ctx) {
            pthread_mutex_lock(&p->mu);
            p->open--;
            p->in_use--;
            pthread_cond_signal(&p->cv);
            pthread_mutex_unlock(&p->mu);
        }
    }
    return ctx;
}

void tb__pool_put(tb__pool_t *p, redisContext *ctx, int broken)
{
    if (p->pid != getpid()) {
        /* Borrowed before a fork, returned in the child: not ours. */
        redisFree(ctx);
        return;
    }
    pthread_mutex_lock(&p->mu);
    p->in_use--;
    if (broken || ctx->err) {
        p->open--;
        pthread_mutex_unlock(&p->mu);
        redisFree(ctx);
        pthread_mutex_lock(&p->mu);
    }
    else {
        p->idle[p->nidle++] = ctx;
    }
    pthread_cond_signal(&p->cv);
    pthread_mutex_unlock(&p->mu);
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
