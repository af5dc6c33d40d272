/* tb_sentinel.c -- asking Redis Sentinel where the primary is (issue 6).
 *
 * One question, SENTINEL get-master-addr-by-name, over a short-lived
 * connection to one sentinel after another until one names the primary.
 * The pool (tb_redis.c) decides when to ask: before its first connect and
 * again after anything that suggests the primary moved.
 *
 * That alone is not enough: after a failover the old primary, if alive,
 * keeps accepting writes until the sentinels reconfigure it (up to about
 * ten seconds), and a limiter writing there would admit twice. So the pool
 * also keeps one connection subscribed to +switch-master on one sentinel
 * and reads it without waiting (one poll(2) per borrow, no thread): the
 * switch is seen on the first decision after the sentinels announce it.
 * Sentinels are asked without AUTH (a URL's user and password are for the
 * data nodes).
 */
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>

#include "tb_int.h"

static struct timeval tv_ms(int ms)
{
    struct timeval tv;

    tv.tv_sec = ms / 1000;
    tv.tv_usec = (ms % 1000) * 1000;
    return tv;
}

/* Ask one sentinel. TB_OK with host and *port, or TB_ERR and *e. */
static int ask_one(const tb_redis_endpoint_t *s, const char *master,
                   int connect_timeout_ms, int timeout_ms, char *host,
                   size_t hostsz, int *port, tb__error_t *e)
{
    redisContext *ctx;
    redisReply *r;
    int rc = TB_ERR;
    char during[300];

    snprintf(during, sizeof(during), "sentinel %s:%d", s->host, s->port);
    ctx = redisConnectWithTimeout(s->host, s->port,
                                  tv_ms(connect_timeout_ms));
    if (!ctx) {
        tb__set_error(e, TB_ERR_OOM, "sentinel: out of memory");
        return TB_ERR;
    }
    if (ctx->err || redisSetTimeout(ctx, tv_ms(timeout_ms)) != REDIS_OK) {
        tb__ctx_error(e, ctx, during);
        redisFree(ctx);
        return TB_ERR;
    }
    r = redisCommand(ctx, "SENTINEL get-master-addr-by-name %s", master);
    if (!r) {
        tb__ctx_error(e, ctx, during);
    }
    else if (r->type == REDIS_REPLY_ARRAY && r->elements == 2
             && r->element[0]->type == REDIS_REPLY_STRING
             && r->element[1]->type == REDIS_REPLY_STRING
             && r->element[0]->len > 0 && r->element[0]->len < hostsz) {
        long pt = strtol(r->element[1]->str, NULL, 10);

        if (pt >= 1 && pt <= 65535) {
            memcpy(host, r->element[0]->str, r->element[0]->len + 1);
            *port = (int)pt;
            rc = TB_OK;
        }
        else {
            tb__set_error(e, TB_ERR_PROTOCOL, "%.40s: bad port", during);
        }
    }
    else if (r->type == REDIS_REPLY_ERROR) {
        tb__set_error(e, TB_ERR_REPLY, "%.40s: %.80s", during, r->str);
    }
    else {
        /* A nil: this sentinel does not know the master name. */
        tb__set_error(e, TB_ERR_REPLY, "%.40s: unknown master '%.60s'",
                      during, master);
    }
    if (r) {
        freeReplyObject(r);
    }
    redisFree(ctx);
    return rc;
}

int tb__sentinel_resolve(const tb_redis_addr_t *a, int *first,
                         int connect_timeout_ms, int timeout_ms,
                         char *host, size_t hostsz, int *port,
                         tb__error_t *e)
{
    int k, i;

    if (a->nseeds < 1) {
        tb__set_error(e, TB_ERR_ARG, "no sentinels");
        return TB_ERR;
    }
    /* Start with the one that answered last; on failure try the rest in
     * turn, and remember the next one to answer. */
    for (k = 0; k < a->nseeds; k++) {
        i = (*first + k) % a->nseeds;
        if (i < 0) {
            i = 0;
        }
        if (ask_one(&a->seeds[i], a->master, connect_timeout_ms, timeout_ms,
                    host, hostsz, port, e) == TB_OK) {
            *first = i;
            return TB_OK;
        }
    }
    return TB_ERR;
}

redisContext *tb__sentinel_watch(const tb_redis_addr_t *a, int *next,
                                 int connect_timeout_ms, int timeout_ms,
                                 tb__error_t *e)
{
    const tb_redis_endpoint_t *s;
    redisContext *ctx;
    redisReply *r;

    if (a->nseeds < 1) {
        tb__set_error(e, TB_ERR_ARG, "no sentinels");
        return NULL;
    }
    s = &a->seeds[(*next < 0 ? 0 : *next) % a->nseeds];
    ctx = redisConnectWithTimeout(s->host, s->port,
                                  tv_ms(connect_timeout_ms));
    if (!ctx) {
        tb__set_error(e, TB_ERR_OOM, "sentinel: out of memory");
        return NULL;
    }
    if (ctx->err || redisSetTimeout(ctx, tv_ms(timeout_ms)) != REDIS_OK) {
        tb__ctx_error(e, ctx, "sentinel subscribe");
        goto err;
    }
    r = redisCommand(ctx, "SUBSCRIBE +switch-master");
    if (!r) {
        tb__ctx_error(e, ctx, "sentinel subscribe");
        goto err;
    }
    if (r->type != REDIS_REPLY_ARRAY) {
        tb__set_error(e, TB_ERR_PROTOCOL, "sentinel refused SUBSCRIBE");
        freeReplyObject(r);
        goto err;
    }
    freeReplyObject(r);
    return ctx;
err:
    redisFree(ctx);
    *next = (*next + 1) % a->nseeds;
    return NULL;
}

/* "+switch-master" payload: "<name> <old ip> <old port> <new ip> <new
 * port>". 1 when it is about a->master and parses. */
static int switch_message(const char *msg, const tb_redis_addr_t *a,
                          char *host, size_t hostsz, int *port)
{
    size_t n = strlen(a->master);
    const char *p, *sp;
    long pt;
    char *end;
    int k;

    if (strncmp(msg, a->master, n) != 0 || msg[n] != ' ') {
        return 0;
    }
    /* Skip the name and the old address: three spaces in all. */
    for (p = msg, k = 0; k < 3; k++) {
        if (!(p = strchr(p, ' '))) {
            return 0;
        }
        p++;
    }
    sp = strchr(p, ' ');
    if (!sp || sp == p || (size_t)(sp - p) >= hostsz) {
        return 0;
    }
    pt = strtol(sp + 1, &end, 10);
    if (*end || pt < 1 || pt > 65535) {
        return 0;
    }
    memcpy(host, p, (size_t)(sp - p));
    host[sp - p] = '\0';
    *port = (int)pt;
    return 1;
}

int tb__sentinel_poll(redisContext *watch, const tb_redis_addr_t *a,
                      char *host, size_t hostsz, int *port)
{
    struct pollfd pfd;
    redisReply *r = NULL;
    int found = 0;

    pfd.fd = watch->fd;
    pfd.events = POLLIN;
    pfd.revents = 0;
    if (poll(&pfd, 1, 0) <= 0) {
        return 0;
    }
    if (redisBufferRead(watch) != REDIS_OK) {
        return -1;
    }
    while (redisGetReplyFromReader(watch, (void **)&r) == REDIS_OK && r) {
        if (r->type == REDIS_REPLY_ARRAY && r->elements == 3
            && r->element[2]->type == REDIS_REPLY_STRING
            && switch_message(r->element[2]->str, a, host, hostsz, port)) {
            found = 1;
        }
        freeReplyObject(r);
        r = NULL;
    }
    return watch->err ? -1 : found;
}
