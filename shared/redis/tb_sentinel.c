/* tb_sentinel.c -- Redis Sentinel: asking where the primary is, and
 * tracking it for a pool.
 *
 * One question, SENTINEL get-master-addr-by-name, over a short-lived
 * connection to one sentinel after another until one names the primary.
 * A pool of a redis-sentinel:// address (tb_pool.c) keeps a tracker
 * (tb__sentinel_t) and asks it where to connect before each connect; the
 * tracker asks the sentinels when it is stale: at first, and again after
 * anything that suggests the primary moved (an I/O error, a refused
 * connect, a READONLY reply: tb__sentinel_suspect). A primary other than
 * the last one moves the generation, and the pool reconnects links
 * opened to an older one.
 *
 * That alone is not enough: after a failover the old primary, if alive,
 * keeps accepting writes until the sentinels reconfigure it (up to about
 * ten seconds), and a limiter writing there would admit twice. So the
 * tracker also keeps one connection subscribed to +switch-master on one
 * sentinel and reads it without waiting before each of the pool's calls
 * (one read attempt, no thread): the switch is seen on the first decision
 * after the sentinels announce it. Sentinels are asked without AUTH (a
 * URL's user and password are for the data nodes), over TLS when the URL
 * asks for it, like the data nodes.
 *
 * Locks: mu guards the primary and its generation; rmu lets one thread at
 * a time ask the sentinels or read the subscription (the others use the
 * answer it leaves). The tracker never calls the pool, so the pool may
 * call it holding its own lock.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "redis/tb_redis_int.h"

struct tb__sentinel {
    const tb__redis_cfg_t *cfg;    /* The pool's; borrowed.            */
    pthread_mutex_t mu;            /* Guards the primary and gen.      */
    pthread_mutex_t rmu;           /* One asker or reader at a time.   */
    tb_redis_endpoint_t primary;   /* The one the sentinels last named.*/
    int stale;                     /* Ask the sentinels before the next
                                    * connect.                        */
    unsigned gen;                  /* Moves when the primary does.     */
    int next_sentinel;             /* Index of the one to ask first.   */
    tb__conn_t *watch;             /* SUBSCRIBE +switch-master on one
                                    * sentinel, or NULL; under rmu.    */
    int watch_next;                /* Sentinel to subscribe to next.   */
    tb_monotime_us watch_retry_us; /* No new subscription before.      */
};

/* Connect to sentinel s of cfg and send cmd, by cfg's timeouts: TB_OK
 * with the reply in *r, or TB_ERR with *e. *c is the connection, or
 * NULL when none opened; the caller frees it either way. */
static int sentinel_command(const tb__redis_cfg_t *cfg,
                            const tb_redis_endpoint_t *s,
                            const tb__cmd_t *cmd, tb__conn_t **c,
                            redisReply **r, tb__error_t *e)
{
    *c = tb__conn_open(s->host, s->port, NULL, cfg->tls,
                       tb__deadline_ms(cfg->connect_timeout_ms), e);
    if (!*c) {
        return TB_ERR;
    }
    return tb__conn_command(*c, cmd, tb__deadline_ms(cfg->timeout_ms), r, e);
}

/* Ask one sentinel of cfg. TB_OK with *to, or TB_ERR and *e. */
static int ask_one(const tb__redis_cfg_t *cfg, const tb_redis_endpoint_t *s,
                   tb_redis_endpoint_t *to, tb__error_t *e)
{
    const char *master = cfg->addr.master;
    const char *argv[3] = { "SENTINEL", "get-master-addr-by-name", master };
    size_t argvlen[3] = { 8, 23, 0 };
    tb__cmd_t cmd = { 3, argv, argvlen };
    tb__conn_t *c;
    redisReply *r = NULL;
    int rc = TB_ERR;
    char during[300];

    snprintf(during, sizeof(during), "sentinel %s:%d", s->host, s->port);
    argvlen[2] = strlen(master);
    if (sentinel_command(cfg, s, &cmd, &c, &r, e) != TB_OK) {
        char why[TB_ERRSTR_LEN];

        snprintf(why, sizeof(why), "%s", e->errstr);
        tb__set_error(e, e->err, "%.60s: %s", during, why);
    }
    else if (r->type == REDIS_REPLY_ARRAY && r->elements == 2
             && r->element[0]->type == REDIS_REPLY_STRING
             && r->element[1]->type == REDIS_REPLY_STRING
             && r->element[0]->len > 0
             && r->element[0]->len < sizeof(to->host)) {
        long pt = strtol(r->element[1]->str, NULL, 10);

        if (pt >= 1 && pt <= 65535) {
            memcpy(to->host, r->element[0]->str, r->element[0]->len + 1);
            to->port = (int)pt;
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

/* Ask the sentinels of cfg in turn from *first, which is set to the one
 * that answered, for the address of the master. TB_OK with *to, or
 * TB_ERR with *e naming the last failure. */
static int ask_sentinels(const tb__redis_cfg_t *cfg, int *first,
                         tb_redis_endpoint_t *to, tb__error_t *e)
{
    const tb_redis_addr_t *a = &cfg->addr;
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
        if (ask_one(cfg, &a->seeds[i], to, e) == TB_OK) {
            *first = i;
            return TB_OK;
        }
    }
    return TB_ERR;
}

/* Subscribe to +switch-master on a sentinel of cfg (tried from *next,
 * which advances past one that failed). The connection, or NULL with
 * *e. */
static tb__conn_t *subscribe(const tb__redis_cfg_t *cfg, int *next,
                             tb__error_t *e)
{
    static const char *argv[2] = { "SUBSCRIBE", "+switch-master" };
    static const size_t argvlen[2] = { 9, 14 };
    static const tb__cmd_t cmd = { 2, argv, argvlen };
    const tb_redis_addr_t *a = &cfg->addr;
    const tb_redis_endpoint_t *s;
    tb__conn_t *c;
    redisReply *r = NULL;

    if (a->nseeds < 1) {
        tb__set_error(e, TB_ERR_ARG, "no sentinels");
        return NULL;
    }
    s = &a->seeds[(*next < 0 ? 0 : *next) % a->nseeds];
    if (sentinel_command(cfg, s, &cmd, &c, &r, e) != TB_OK) {
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
                          tb_redis_endpoint_t *to)
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
    if (!sp || sp == p || (size_t)(sp - p) >= sizeof(to->host)) {
        return 0;
    }
    pt = strtol(sp + 1, &end, 10);
    if (*end || pt < 1 || pt > 65535) {
        return 0;
    }
    memcpy(to->host, p, (size_t)(sp - p));
    to->host[sp - p] = '\0';
    to->port = (int)pt;
    return 1;
}

/* Read what a subscription has received without waiting. 1 with *to set
 * when a +switch-master for a->master arrived (the last one wins), 0
 * when nothing did, -1 when the subscription is dead and must be
 * freed. */
static int poll_switch(tb__conn_t *watch, const tb_redis_addr_t *a,
                       tb_redis_endpoint_t *to)
{
    redisReply *r = NULL;
    int found = 0, rc;

    while ((rc = tb__conn_poll(watch, &r)) > 0) {
        if (r->type == REDIS_REPLY_ARRAY && r->elements == 3
            && r->element[2]->type == REDIS_REPLY_STRING
            && switch_message(r->element[2]->str, a, to)) {
            found = 1;
        }
        tb__reply_free(r);
        r = NULL;
    }
    return rc < 0 ? -1 : found;
}

/* ---- The tracker ------------------------------------------------------ */

tb__sentinel_t *tb__sentinel_create(const tb__redis_cfg_t *cfg)
{
    tb__sentinel_t *s = calloc(1, sizeof(*s));

    if (!s) {
        return NULL;
    }
    s->cfg = cfg;
    pthread_mutex_init(&s->mu, NULL);
    pthread_mutex_init(&s->rmu, NULL);
    /* Nothing is known about the primary until a sentinel is asked. */
    s->stale = 1;
    return s;
}

void tb__sentinel_free(tb__sentinel_t *s)
{
    if (!s) {
        return;
    }
    tb__conn_free(s->watch);
    pthread_mutex_destroy(&s->mu);
    pthread_mutex_destroy(&s->rmu);
    free(s);
}

void tb__sentinel_after_fork(tb__sentinel_t *s)
{
    /* Only this thread survives the fork, so no lock is held by anyone
     * who can release it. A subscription being read at the fork (rmu
     * taken) may be half-changed: it is abandoned, not freed. */
    int watched = pthread_mutex_trylock(&s->rmu) == 0;

    pthread_mutex_init(&s->mu, NULL);
    pthread_mutex_init(&s->rmu, NULL);
    if (watched) {
        /* Closing our copy sends nothing: the parent stays subscribed. */
        tb__conn_free(s->watch);
    }
    else {
        tb__conn_abandon(s->watch);
    }
    s->watch = NULL;
    s->watch_retry_us = 0;
}

void tb__sentinel_suspect(tb__sentinel_t *s, int drop_idle)
{
    pthread_mutex_lock(&s->mu);
    s->stale = 1;
    if (drop_idle) {
        s->gen++;
    }
    pthread_mutex_unlock(&s->mu);
}

unsigned tb__sentinel_gen(tb__sentinel_t *s)
{
    unsigned gen;

    pthread_mutex_lock(&s->mu);
    gen = s->gen;
    pthread_mutex_unlock(&s->mu);
    return gen;
}

/* Take the primary the sentinels named. Under mu. */
static void set_primary(tb__sentinel_t *s, const tb_redis_endpoint_t *to)
{
    if (to->port != s->primary.port
        || strcmp(to->host, s->primary.host) != 0) {
        /* A new primary: connections to the old one must go. */
        s->gen++;
        s->primary = *to;
    }
    s->stale = 0;
}

/* Under rmu: a subscription, if it is time to try one. */
static void watch_open(tb__sentinel_t *s)
{
    tb__error_t e;

    if (s->watch || tb_clock_monotonic_us() < s->watch_retry_us) {
        return;
    }
    s->watch_retry_us = tb_clock_monotonic_us() + 1000000;
    s->watch = subscribe(s->cfg, &s->watch_next, &e);
    if (s->watch) {
        /* A switch may have been announced while nobody listened. */
        pthread_mutex_lock(&s->mu);
        s->stale = 1;
        pthread_mutex_unlock(&s->mu);
    }
}

void tb__sentinel_check(tb__sentinel_t *s)
{
    tb_redis_endpoint_t to;
    int rc;

    /* Never waits for another thread: if one is asking the sentinels,
     * its answer will do. */
    if (pthread_mutex_trylock(&s->rmu) != 0) {
        return;
    }
    if (s->watch && s->cfg->verify_fd && !tb__conn_is_ours(s->watch)) {
        /* The host reused the fd: not ours to close. */
        tb__conn_forget(s->watch);
        s->watch = NULL;
    }
    watch_open(s);
    if (s->watch) {
        rc = poll_switch(s->watch, &s->cfg->addr, &to);
        if (rc < 0) {
            tb__conn_free(s->watch);
            s->watch = NULL;
        }
        else if (rc > 0) {
            pthread_mutex_lock(&s->mu);
            set_primary(s, &to);
            pthread_mutex_unlock(&s->mu);
        }
    }
    pthread_mutex_unlock(&s->rmu);
}

int tb__sentinel_target(tb__sentinel_t *s, tb_redis_endpoint_t *to,
                        unsigned *gen, tb__error_t *e)
{
    tb_redis_endpoint_t named;
    int stale, first, rc = TB_OK;

    /* One thread asks at a time; the others wait for its answer rather
     * than ask again. */
    pthread_mutex_lock(&s->rmu);
    pthread_mutex_lock(&s->mu);
    stale = s->stale;
    first = s->next_sentinel;
    pthread_mutex_unlock(&s->mu);
    if (stale) {
        rc = ask_sentinels(s->cfg, &first, &named, e);
        pthread_mutex_lock(&s->mu);
        if (rc == TB_OK) {
            set_primary(s, &named);
            s->next_sentinel = first;
        }
        pthread_mutex_unlock(&s->mu);
    }
    if (rc == TB_OK) {
        pthread_mutex_lock(&s->mu);
        *to = s->primary;
        *gen = s->gen;
        pthread_mutex_unlock(&s->mu);
    }
    pthread_mutex_unlock(&s->rmu);
    return rc;
}
