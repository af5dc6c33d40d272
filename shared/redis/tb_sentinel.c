/* tb_sentinel.c -- asking Redis Sentinel where the primary is.
 *
 * One question, SENTINEL get-master-addr-by-name, over a short-lived
 * connection to one sentinel after another until one names the primary.
 * The pool (tb_pool.c) decides when to ask: before its first connect and
 * again after anything that suggests the primary moved.
 *
 * That alone is not enough: after a failover the old primary, if alive,
 * keeps accepting writes until the sentinels reconfigure it (up to about
 * ten seconds), and a limiter writing there would admit twice. So the pool
 * also keeps one connection subscribed to +switch-master on one sentinel
 * and reads it without waiting (one read attempt per call, no thread): the
 * switch is seen on the first decision after the sentinels announce it.
 * Sentinels are asked without AUTH (a URL's user and password are for the
 * data nodes), over TLS when the URL asks for it, like the data nodes.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tb_int.h"

/* Ask one sentinel of p. TB_OK with host and *port, or TB_ERR and *e. */
static int ask_one(const tb__pool_t *p, const tb_redis_endpoint_t *s,
                   char *host, size_t hostsz, int *port, tb__error_t *e)
{
    const char *master = p->addr.master;
    const char *argv[3] = { "SENTINEL", "get-master-addr-by-name", master };
    size_t argvlen[3] = { 8, 23, 0 };
    tb__conn_t *c;
    redisReply *r = NULL;
    int rc = TB_ERR;
    char during[300];

    snprintf(during, sizeof(during), "sentinel %s:%d", s->host, s->port);
    argvlen[2] = strlen(master);
    c = tb__conn_open(s->host, s->port, NULL, p->tls,
                      tb__deadline_ms(p->connect_timeout_ms), e);
    if (!c || tb__conn_command(c, 3, argv, argvlen,
                               tb__deadline_ms(p->timeout_ms), &r, e)
                  != TB_OK) {
        char why[TB_ERRSTR_LEN];

        snprintf(why, sizeof(why), "%s", e->errstr);
        tb__set_error(e, e->err, "%.60s: %s", during, why);
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
        tb__reply_free(r);
    }
    tb__conn_free(c);
    return rc;
}

int tb__sentinel_resolve(const tb__pool_t *p, int *first, char *host,
                         size_t hostsz, int *port, tb__error_t *e)
{
    const tb_redis_addr_t *a = &p->addr;
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
        if (ask_one(p, &a->seeds[i], host, hostsz, port, e) == TB_OK) {
            *first = i;
            return TB_OK;
        }
    }
    return TB_ERR;
}

tb__conn_t *tb__sentinel_watch(const tb__pool_t *p, int *next,
                               tb__error_t *e)
{
    static const char *argv[2] = { "SUBSCRIBE", "+switch-master" };
    static const size_t argvlen[2] = { 9, 14 };
    const tb_redis_addr_t *a = &p->addr;
    const tb_redis_endpoint_t *s;
    tb__conn_t *c;
    redisReply *r = NULL;

    if (a->nseeds < 1) {
        tb__set_error(e, TB_ERR_ARG, "no sentinels");
        return NULL;
    }
    s = &a->seeds[(*next < 0 ? 0 : *next) % a->nseeds];
    c = tb__conn_open(s->host, s->port, NULL, p->tls,
                      tb__deadline_ms(p->connect_timeout_ms), e);
    if (!c || tb__conn_command(c, 2, argv, argvlen,
                               tb__deadline_ms(p->timeout_ms), &r, e)
                  != TB_OK) {
        goto err;
    }
    if (r->type != REDIS_REPLY_ARRAY) {
        tb__set_error(e, TB_ERR_PROTOCOL, "sentinel refused SUBSCRIBE");
        tb__reply_free(r);
        goto err;
    }
    tb__reply_free(r);
    return c;
err:
    tb__conn_free(c);
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

int tb__sentinel_poll(tb__conn_t *watch, const tb_redis_addr_t *a,
                      char *host, size_t hostsz, int *port)
{
    redisReply *r = NULL;
    int found = 0, rc;

    while ((rc = tb__conn_poll(watch, &r)) > 0) {
        if (r->type == REDIS_REPLY_ARRAY && r->elements == 3
            && r->element[2]->type == REDIS_REPLY_STRING
            && switch_message(r->element[2]->str, a, host, hostsz, port)) {
            found = 1;
        }
        tb__reply_free(r);
        r = NULL;
    }
    return rc < 0 ? -1 : found;
}
