/* tb_client.c -- one decision: keys, breaker, script call, failure policy.
 *
 * tb_client_run() is the request path of every host. It builds the
 * bucket keys from the untrusted client key, asks the breaker whether Redis
 * may be called, makes exactly one script call through the pool and, when
 * Redis cannot decide, answers by the declared policy: open, closed, or a
 * local bucket of limit/replicas from a bounded table. It reads the clock
 * once per decision and never logs: counters and the result say what
 * happened, and the host logs. With a redis-cluster:// URL the script call
 * and the tools' commands go through redis/tb_cluster.c instead of the
 * pool; Sentinel is the pool's business (redis/tb_pool.c). The scripts
 * every connection loads are algo/'s, handed to the transport in its
 * settings (tb__redis_cfg_t). A concurrency limit rides on the same
 * script call (one more key and four more arguments) and is released by
 * tb_client_release(), one ZREM.
 *
 * tb_client_settle() and tb_client_give_back() make the other kind of
 * call: the same script in its 'settle' mode, over the buckets a decision
 * charged (or the bucket a lease came from), through the same breaker and
 * counters but with no failure policy: a settlement Redis cannot make is
 * reported, not guessed.
 */
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tb_int.h"

struct tb_client_priv {
    tb__pool_t pool;
    tb__cluster_t *cluster; /* redis-cluster:// only; the pool is idle. */
    const char *script_text[TB_ALGO_COUNT]; /* The transport's scripts, */
    const char *script_sha1[TB_ALGO_COUNT]; /* in tb_algo_t order.      */
    pthread_mutex_t bmu;   /* Guards the breaker. */
    tb_breaker_t breaker;
    tb_policy_t policy;
    int replicas;
    int closed_retry_ms;
    tb_local_t *local;
    void *own_local;       /* Our table's memory, if we made it. */
    tb__leases_t leases;   /* The host's lease table, if any. */
    tb_stats_t *stats;
    tb_stats_t own_stats;
    tb_tls_t *own_tls;     /* Our TLS context, if we made it. */
    /* Concurrency slot ids: "<tag>.<pid>.<seq>". The tag is random per
     * client, the pid tells a forked child from its parent, and the
     * sequence is atomic across threads. */
    char slot_tag[17];
    uint64_t slot_seq;
    int last_failed;       /* The last script call failed (atomic). */
    int cluster_keys;      /* tb_options_t.cluster_keys.             */
};

void tb_options_init(tb_options_t *o)
{
    memset(o, 0, sizeof(*o));
    o->url = TB_DEFAULT_URL;
    o->timeout_ms = 50;
    o->connect_timeout_ms = 0;
    o->pool_size = 2;
    o->breaker_threshold = 5;
    o->breaker_cooldown_ms = 10000;
    o->policy = TB_POLICY_OPEN;
    o->replicas = 1;
    o->local_entries = 4096;
    o->closed_retry_ms = 1000;
}

/* 16 hex digits of /dev/urandom, or of the clock and an address when it
 * cannot be read: unique enough to tell hosts apart in slot ids. */
static void make_slot_tag(char *tag, const void *salt)
{
    unsigned char b[8];
    uint64_t x = 0;
    int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC), i;

    if (fd < 0 || read(fd, b, sizeof(b)) != (ssize_t)sizeof(b)) {
        x = (uint64_t)tb_clock_now_us() * 0x9e3779b97f4a7c15ULL
            ^ (uint64_t)(uintptr_t)salt;
        memcpy(b, &x, sizeof(b));
    }
    if (fd >= 0) {
        close(fd);
    }
    for (i = 0; i < 8; i++) {
        snprintf(tag + 2 * i, 3, "%02x", b[i]);
    }
}

static tb_client_t *fail(char *err, size_t errlen, const char *msg,
                         tb_client_t *c)
{
    if (err && errlen) {
        snprintf(err, errlen, "%s", msg);
    }
    tb_client_free(c);
    return NULL;
}

/* 1 when o sets any TLS setting. */
static int tls_options_set(const tb_options_t *o)
{
    const tb_tls_options_t *t = &o->tls;

    return o->tls_ctx || t->ca_file || t->cert_file || t->key_file
           || t->server_name || t->no_verify;
}

/* The TLS context of p's connections in *tls: the caller's, or one made
 * from the options (the files are read here, once), or NULL for a
 * plaintext address. TB_ERR with a message in err when the files are
 * refused or TLS settings come with a plaintext address. */
static int client_tls(struct tb_client_priv *p, const tb_options_t *o,
                      const tb_redis_addr_t *addr, const tb_tls_t **tls,
                      char *err, size_t errlen)
{
    *tls = NULL;
    if (!addr->tls) {
        if (tls_options_set(o)) {
            snprintf(err, errlen, "TLS settings (tls_ca, tls_cert, tls_key, "
                     "tls_server_name, tls_verify) need a TLS URL: "
                     "rediss://, or ?tls=on");
            return TB_ERR;
        }
        return TB_OK;
    }
    if (o->tls_ctx) {
        *tls = o->tls_ctx;
        return TB_OK;
    }
    p->own_tls = tb_tls_create(&o->tls, err, errlen);
    *tls = p->own_tls;
    return p->own_tls ? TB_OK : TB_ERR;
}

/* The connect timeout o asks for: timeout_ms unless set. */
static int connect_timeout(const tb_options_t *o)
{
    return o->connect_timeout_ms ? o->connect_timeout_ms : o->timeout_ms;
}

/* What is wrong with o's numbers and names, or NULL. */
static const char *options_error(const tb_options_t *o)
{
    int cto = connect_timeout(o);

    if (o->timeout_ms < 1 || o->timeout_ms > 60000) {
        return "timeout must be 1..60000 ms";
    }
    if (cto < 1 || cto > 60000) {
        return "connect timeout must be 1..60000 ms";
    }
    if (o->pool_size < 1 || o->pool_size > 1024) {
        return "pool size must be 1..1024";
    }
    if (o->breaker_threshold < 1 || o->breaker_threshold > 1000000) {
        return "breaker threshold must be 1..1000000";
    }
    if (o->breaker_cooldown_ms < 0 || o->breaker_cooldown_ms > 86400000) {
        return "breaker cooldown must be 0..24h";
    }
    if (o->policy != TB_POLICY_OPEN && o->policy != TB_POLICY_CLOSED
        && o->policy != TB_POLICY_LOCAL) {
        return "unknown failure policy";
    }
    if (o->replicas < 1 || o->replicas > 100000) {
        return "replicas must be 1..100000";
    }
    if ((unsigned)o->engine >= TB_ENGINE_COUNT) {
        return "unknown engine";
    }
    return NULL;
}

/* The settings of p's connections from o, cfg->addr and cfg->tls being
 * set: timeouts, pool size, counters and algo/'s scripts. */
static void redis_cfg(struct tb_client_priv *p, const tb_options_t *o,
                      tb__redis_cfg_t *cfg)
{
    int i;

    for (i = 0; i < TB_ALGO_COUNT; i++) {
        p->script_text[i] = tb_algo_script_source((tb_algo_t)i);
        p->script_sha1[i] = tb_algo_script_sha1((tb_algo_t)i);
    }
    cfg->timeout_ms = o->timeout_ms;
    cfg->connect_timeout_ms = connect_timeout(o);
    cfg->pool_size = o->pool_size;
    cfg->verify_fd = o->verify_fd;
    cfg->stats = p->stats;
    cfg->scripts.n = TB_ALGO_COUNT;
    cfg->scripts.text = p->script_text;
    cfg->scripts.sha1 = p->script_sha1;
    cfg->scripts.module_cmd = tb_algo_module_commands;
    cfg->engine = o->engine;
}

/* The breaker, the failure policy and the tables o gives p, or the local
 * table p makes. TB_ERR when out of memory. */
static int client_policy(struct tb_client_priv *p, const tb_options_t *o)
{
    pthread_mutex_init(&p->bmu, NULL);
    make_slot_tag(p->slot_tag, p);
    tb_breaker_init(&p->breaker, o->breaker_threshold,
                    o->breaker_cooldown_ms);
    p->policy = o->policy;
    p->replicas = o->replicas;
    p->closed_retry_ms = o->closed_retry_ms > 0 ? o->closed_retry_ms : 1000;
    if (o->leases) {
        p->leases.table = o->leases;
        p->leases.epoch = tb_lease_epoch(o->leases);
        p->leases.owner = o->lease_owner;
    }
    if (o->local) {
        p->local = o->local;
    }
    else if (o->policy == TB_POLICY_LOCAL) {
        size_t entries = o->local_entries ? o->local_entries : 4096;

        p->own_local = malloc(tb_local_size(entries));
        if (!p->own_local) {
            return TB_ERR;
        }
        p->local = tb_local_init(p->own_local, entries);
    }
    return TB_OK;
}

tb_client_t *tb_client_create(const tb_options_t *o, char *err,
                              size_t errlen)
{
    tb_client_t *c;
    struct tb_client_priv *p;
    tb__redis_cfg_t cfg;
    const char *why;
    char uerr[256];

    if (!o) {
        return fail(err, errlen, "no options given", NULL);
    }
    memset(&cfg, 0, sizeof(cfg));
    if (tb_url_parse(o->url, &cfg.addr, uerr, sizeof(uerr)) != TB_OK) {
        return fail(err, errlen, uerr, NULL);
    }
    if ((why = options_error(o))) {
        return fail(err, errlen, why, NULL);
    }
    c = calloc(1, sizeof(*c));
    p = calloc(1, sizeof(*p));
    if (!c || !p) {
        free(p);
        return fail(err, errlen, "out of memory", c);
    }
    c->priv = p;
    p->cluster_keys = o->cluster_keys;
    p->stats = o->stats ? o->stats : &p->own_stats;
    if (client_tls(p, o, &cfg.addr, &cfg.tls, uerr, sizeof(uerr)) != TB_OK) {
        return fail(err, errlen, uerr, c);
    }
    redis_cfg(p, o, &cfg);
    if (tb__pool_init(&p->pool, &cfg) != TB_OK
        || (cfg.addr.kind == TB_REDIS_CLUSTER
            && !(p->cluster = tb__cluster_create(&cfg)))
        || client_policy(p, o) != TB_OK) {
        return fail(err, errlen, "out of memory", c);
    }
    return c;
}

void tb_client_free(tb_client_t *c)
{
    if (!c) {
        return;
    }
    if (c->priv) {
        tb__pool_destroy(&c->priv->pool);
        tb__cluster_free(c->priv->cluster);
        /* After the connections that use it. */
        tb_tls_free(c->priv->own_tls);
        pthread_mutex_destroy(&c->priv->bmu);
        free(c->priv->own_local);
        free(c->priv);
    }
    free(c);
}

void tb_client_after_fork(tb_client_t *c)
{
    if (!c || !c->priv) {
        return;
    }
    tb__pool_after_fork(&c->priv->pool);
    tb__cluster_after_fork(c->priv->cluster);
    pthread_mutex_init(&c->priv->bmu, NULL);
}

void tb__client_error(tb_client_t *c, const tb__error_t *e)
{
    /* Racy across threads by nature; it is for diagnostics only. The
     * last byte is never anything but NUL, so a host that prints errstr
     * while two threads write it reads a mixed message, never past it. */
    size_t n = strnlen(e->errstr, sizeof(c->errstr) - 1);

    __atomic_store_n(&c->err, e->err, __ATOMIC_RELAXED);
    memcpy(c->errstr, e->errstr, n);
    c->errstr[n] = '\0';
}

static void policy_of(struct tb_client_priv *p, tb_monotime_us now,
                      tb__policy_t *pol)
{
    pol->policy = p->policy;
    pol->replicas = p->replicas;
    pol->local = p->local;
    pol->closed_retry_ms = p->closed_retry_ms;
    pol->stats = p->stats;
    pthread_mutex_lock(&p->bmu);
    pol->breaker_wait_ms = tb_breaker_wait_ms(&p->breaker, now);
    pthread_mutex_unlock(&p->bmu);
}

/* Answer k's decision of q by the declared policy when Redis did not
 * (err says why). A rule's held bucket is charged only by a later
 * tb_client_charge(), which needs Redis: the fallback charges it
 * nothing, and bans are Redis's alone. */
void tb__client_answer(tb_client_t *c, const tb_request_t *q,
                       const tb__call_t *k, int err, tb_monotime_us now,
                       tb_result_t *res)
{
    struct tb_client_priv *p = c->priv;
    tb__policy_t pol;
    tb__fallback_t f;
    const char *kp[TB_MAX_BUCKETS];
    tb_take_t takes[TB_MAX_BUCKETS];
    int i;

    policy_of(p, now, &pol);
    for (i = 0; i < q->ntakes; i++) {
        kp[i] = k->keys[i];
        takes[i] = k->takes[i];
        if (takes[i].hold) {
            takes[i].cost = 0;
        }
    }
    f.keys = kp;
    f.takes = takes;
    f.n = q->ntakes;
    f.conc = k->conc;
    f.err = err;
    f.now = now;
    tb__policy_answer(&pol, &f, res);
}

/* ---- Concurrency slots ----------------------------------------------- */

/* A fresh slot id: "<tag>.<pid>.<seq>", unique across hosts (tag),
 * forked children (pid) and this process's requests (seq). */
static void conc_slot_id(struct tb_client_priv *p, char *id)
{
    uint64_t seq = __atomic_add_fetch(&p->slot_seq, 1, __ATOMIC_RELAXED);

    snprintf(id, TB_SLOT_ID_LEN, "%s.%ld.%llx", p->slot_tag,
             (long)getpid(), (unsigned long long)seq);
}

int tb_client_release(tb_client_t *c, const tb_request_t *q,
                      const tb_slot_t *slot)
{
    struct tb_client_priv *p;
    char key[TB_KEY_BUF];
    const char *argv[3];
    size_t argvlen[3];
    tb__cmd_t cmd = { 3, argv, argvlen };
    tb__conc_t conc;
    redisReply *r = NULL;
    tb__error_t e = { 0, 0, "" };
    tb_breaker_state_t st;

    if (!c || !c->priv || !q || !slot) {
        return TB_ERR;
    }
    if (slot->kind == TB_SLOT_NONE) {
        return TB_OK;
    }
    p = c->priv;
    if (!tb__call_conc(q, key, &conc)) {
        tb__set_error(&e, TB_ERR_ARG, "release: bad prefix");
        tb__client_error(c, &e);
        return TB_ERR;
    }
    if (slot->kind == TB_SLOT_LOCAL) {
        tb__policy_t pol;
        tb_monotime_us now = tb_clock_now_us();

        policy_of(p, now, &pol);
        tb__policy_release(&pol, &conc, slot->window, now);
        return TB_OK;
    }
    pthread_mutex_lock(&p->bmu);
    st = p->breaker.state;
    pthread_mutex_unlock(&p->bmu);
    if (st == TB_BREAKER_OPEN) {
        /* Not worth a timeout: the slot expires on its own. */
        tb__set_error(&e, TB_ERR_BREAKER, "release: breaker open");
        tb__client_error(c, &e);
        return TB_ERR;
    }
    argv[0] = "ZREM";
    argvlen[0] = 4;
    argv[1] = key;
    argvlen[1] = strlen(key);
    argv[2] = slot->id;
    argvlen[2] = strlen(slot->id);
    if (tb__client_command(c, key, &cmd, &r, &e) != TB_OK) {
        tb__client_error(c, &e);
        return TB_ERR;
    }
    tb__reply_free(r);
    return TB_OK;
}

/* ---- One decision ------------------------------------------------------ */

static int breaker_allows(struct tb_client_priv *p, tb_monotime_us now)
{
    int allow;

    pthread_mutex_lock(&p->bmu);
    allow = tb_breaker_allow(&p->breaker, now);
    pthread_mutex_unlock(&p->bmu);
    if (!allow) {
        tb_stats_add(&p->stats->breaker_skips, 1);
    }
    return allow;
}


/* Tell the breaker how a call went, under its lock, and count a change
 * between closed and open in res and the counters. */
static void breaker_report(struct tb_client_priv *p, int rc,
                           const tb__trip_t *t, tb_result_t *res)
{
    int changed = 0;

    /* A batch that failed is one failure however many calls rode on it:
     * only its first member reports it. */
    if (rc == TB_OK || !t->e.shared) {
        pthread_mutex_lock(&p->bmu);
        changed = rc == TB_OK ? tb_breaker_success(&p->breaker, t->end)
                              : tb_breaker_failure(&p->breaker, t->end);
        pthread_mutex_unlock(&p->bmu);
    }
    if (changed) {
        res->breaker_change = rc == TB_OK ? -1 : 1;
        tb_stats_add(rc == TB_OK ? &p->stats->breaker_closes
                                 : &p->stats->breaker_opens, 1);
    }
}

/* k's script call, to the pool or to t->key's cluster node, counted and
 * reported to the breaker. Sets res->redis_us and res->breaker_change.
 * TB_OK with t->rep, or TB_ERR with t->e; t->end either way. */
int tb__client_script(tb_client_t *c, const tb__call_t *k, tb__trip_t *t,
                      tb_result_t *res)
{
    struct tb_client_priv *p = c->priv;
    tb__redis_call_t rc;
    int ok;

    rc.cmd.argc = k->argc;
    rc.cmd.argv = k->argv;
    rc.cmd.argvlen = k->argvlen;
    rc.script = &t->rep;
    rc.asking = 0;
    tb_stats_add(&p->stats->redis_calls, 1);
    ok = p->cluster ? tb__cluster_call(p->cluster, t->key, &rc, &t->e)
                    : tb__redis_call(&p->pool, &rc, &t->e);
    t->end = tb_clock_now_us();
    __atomic_store_n(&p->last_failed, ok != TB_OK, __ATOMIC_RELAXED);
    res->redis_us = t->end - t->start;
    tb_stats_latency(p->stats, res->redis_us);
    breaker_report(p, ok, t, res);
    if (ok != TB_OK) {
        tb_stats_add(&p->stats->redis_errors, 1);
        tb_stats_add(&p->stats->errors[t->e.err], 1);
        tb__client_error(c, &t->e);
    }
    return ok;
}

/* One decision in one script call (or by the policy), q's lease taken
 * in its raw form. */
static int run(tb_client_t *c, const tb_request_t *q, tb_result_t *res)
{
    struct tb_client_priv *p;
    tb__call_t k;
    char ckey[TB_KEY_BUF], slot_id[TB_SLOT_ID_LEN] = "";
    tb__conc_t conc;
    tb__trip_t t;

    memset(res, 0, sizeof(*res));
    if (!c || !c->priv || !q || !tb__call_prepare(q, k.takes, k.keys)
        || (q->concurrency && !tb__call_conc(q, ckey, &conc))) {
        res->err = TB_ERR_ARG;
        res->source = TB_SRC_ERROR;
        return TB_ERR;
    }
    p = c->priv;
    k.what = TB__CALL_DECIDE;
    k.conc = NULL;
    k.slot_id = slot_id;
    if (q->concurrency) {
        k.conc = &conc;
        conc_slot_id(p, slot_id);
    }
    tb_stats_add(&p->stats->decisions, 1);
    t.start = tb_clock_now_us();

    if (!breaker_allows(p, t.start)) {
        tb__client_answer(c, q, &k, TB_ERR_BREAKER, t.start, res);
        goto count;
    }
    if (tb__client_cluster(c) && tb__call_rules(q)
        && !tb__rules_one_slot(q, &k, q->concurrency ? ckey : NULL)) {
        /* Rule buckets in several Cluster slots: a call per slot. */
        tb__rules_slots(c, q, &k, &t, res);
        goto count;
    }
    tb__call_argv(q, &k);
    t.key = q->ntakes ? k.keys[0] : ckey;
    t.e.err = TB_ERR_NONE;
    t.e.shared = 0;
    t.e.errstr[0] = '\0';
    if (tb__client_script(c, &k, &t, res) != TB_OK) {
        tb__client_answer(c, q, &k, t.e.err, t.end, res);
        goto count;
    }
    tb__call_result(&t.rep, q, k.takes, slot_id, res);
    if (res->bans_set) {
        tb__rules_index(c, q, &k, res->bans_set);
    }

count:
    tb_stats_add(res->allowed ? &p->stats->allowed : &p->stats->rejected, 1);
    return res->source == TB_SRC_REDIS ? TB_OK : TB_ERR;
}

/* A decision with the host's lease table (tb_lease.c prepares and
 * reads, this makes the calls). */
static int lease_run(tb_client_t *c, const tb_request_t *q,
                     tb_result_t *res)
{
    struct tb_client_priv *p = c->priv;
    tb__lease_step_t st;
    tb_request_t call = *q;
    tb_result_t gb;
    double give;

    switch (tb__lease_begin(&p->leases, q, &st, res)) {
    case TB__LEASE_PAID:
        tb_stats_add(&p->stats->decisions, 1);
        tb_stats_add(&p->stats->allowed, 1);
        return TB_OK;
    case TB__LEASE_CALL:
        call.lease = st.plan.want;
        call.lease_back = st.plan.back;
        break;
    default:
        call.lease = 0;
        call.lease_back = 0;
        return run(c, &call, res);
    }
    run(c, &call, res);
    give = tb__lease_end(&p->leases, q, &st, res);
    if (give > 0
        && tb_client_give_back(c, st.rkey, &st.info.limit, give, &gb)
               == TB_OK) {
        res->lease_returned += give;
    }
    return res->source == TB_SRC_REDIS ? TB_OK : TB_ERR;
}

int tb_client_run(tb_client_t *c, const tb_request_t *q, tb_result_t *res)
{
    if (c && c->priv && q && q->lease > 0 && c->priv->leases.table) {
        return lease_run(c, q, res);
    }
    return run(c, q, res);
}

int tb_client_decide(tb_client_t *c, const char *prefix, const char *key,
                     size_t len, const tb_take_t *takes, int n,
                     tb_result_t *res)
{
    tb_request_t q;

    memset(&q, 0, sizeof(q));
    q.prefix = prefix;
    q.key = key;
    q.key_len = len;
    q.takes = takes;
    q.ntakes = n;
    return tb_client_run(c, &q, res);
}

/* ---- Settling real costs, giving lease tokens back ------------------ */

/* A settlement that sent nothing, or whose arguments were refused. */
static int settle_none(tb_result_t *res, int err)
{
    res->source = err ? TB_SRC_ERROR : TB_SRC_REDIS;
    res->err = err;
    res->allowed = !err;
    res->remaining = err ? 0 : -1;
    return err ? TB_ERR : TB_OK;
}

/* One 'settle' call of q's script over k's takes, whose costs are the
 * differences to settle. */
int tb__client_settle_call(tb_client_t *c, const tb_request_t *q,
                           tb__call_t *k, tb_result_t *res)
{
    tb__trip_t t;

    t.start = tb_clock_now_us();
    if (!breaker_allows(c->priv, t.start)) {
        return settle_none(res, TB_ERR_BREAKER);
    }
    k->what = TB__CALL_SETTLE;
    k->conc = NULL;
    k->slot_id = NULL;
    tb__call_argv(q, k);
    t.key = k->keys[0];
    t.e.err = TB_ERR_NONE;
    t.e.shared = 0;
    t.e.errstr[0] = '\0';
    if (tb__client_script(c, k, &t, res) != TB_OK) {
        return settle_none(res, t.e.err);
    }
    res->allowed = t.rep.v[0] == 1;
    res->remaining = t.rep.v[1];
    res->retry_ms = t.rep.v[2];
    res->binding = t.rep.v[3] >= 0 && t.rep.v[3] < q->ntakes
                   ? (int)t.rep.v[3] : 0;
    res->limit = k->takes[res->binding].limit.capacity;
    res->source = TB_SRC_REDIS;
    return TB_OK;
}

int tb_client_settle(tb_client_t *c, const tb_request_t *q, double cost,
                     tb_result_t *res)
{
    tb__call_t k;
    tb_request_t plain;
    int i, changes = 0;

    memset(res, 0, sizeof(*res));
    if (!c || !c->priv || !q || !(cost >= 0) || cost > TB_MAX_CAPACITY
        || (q->algo != TB_ALGO_TOKEN_BUCKET && q->algo != TB_ALGO_GCRA)) {
        return settle_none(res, TB_ERR_ARG);
    }
    /* A lease of the host's that holds the difference settles it. */
    if (q->lease > 0 && c->priv->leases.table
        && tb__lease_settle(&c->priv->leases, q, cost, res)) {
        return TB_OK;
    }
    /* The decision's request without its lease: the same buckets. */
    plain = *q;
    plain.lease = 0;
    plain.lease_back = 0;
    if (!tb__call_prepare(&plain, k.takes, k.keys)) {
        return settle_none(res, TB_ERR_ARG);
    }
    for (i = 0; i < plain.ntakes; i++) {
        k.takes[i].cost = cost - k.takes[i].cost;
        changes += k.takes[i].cost != 0;
    }
    if (!changes) {
        return settle_none(res, 0);
    }
    return tb__client_settle_call(c, &plain, &k, res);
}

int tb_client_give_back(tb_client_t *c, const char *rkey,
                        const tb_limit_t *lim, double tokens,
                        tb_result_t *res)
{
    tb__call_t k;
    tb_request_t q;
    size_t len = rkey ? strlen(rkey) : 0;

    memset(res, 0, sizeof(*res));
    if (!c || !c->priv || !len || len >= TB_KEY_BUF || !lim
        || tb_limit_check(lim, NULL, 0) != TB_OK || !(tokens >= 0)
        || tokens > TB_MAX_CAPACITY) {
        return settle_none(res, TB_ERR_ARG);
    }
    if (tokens == 0) {
        return settle_none(res, 0);
    }
    memcpy(k.keys[0], rkey, len + 1);
    memset(&k.takes[0], 0, sizeof(k.takes[0]));
    k.takes[0].limit = *lim;
    k.takes[0].cost = -tokens;
    memset(&q, 0, sizeof(q));
    q.takes = k.takes;
    q.ntakes = 1;
    q.algo = TB_ALGO_TOKEN_BUCKET;
    return tb__client_settle_call(c, &q, &k, res);
}

int tb__client_command(tb_client_t *c, const char *rkey,
                       const tb__cmd_t *cmd, redisReply **r, tb__error_t *e)
{
    tb__redis_call_t k;
    int rc;

    k.cmd = *cmd;
    k.script = NULL;
    k.reply = NULL;
    k.asking = 0;
    rc = c->priv->cluster ? tb__cluster_call(c->priv->cluster, rkey, &k, e)
                          : tb__redis_call(&c->priv->pool, &k, e);
    *r = k.reply;
    return rc;
}

int tb_client_inspect(tb_client_t *c, const char *rkey, tb_bucket_t *b,
                      int64_t *ttl_ms)
{
    const char *argv[4] = { "HMGET", rkey, "tokens", "ts" };
    size_t argvlen[4] = { 5, 0, 6, 2 };
    const char *pv[2] = { "PTTL", rkey };
    size_t pl[2] = { 4, 0 };
    tb__cmd_t hmget = { 4, argv, argvlen }, pttl = { 2, pv, pl };
    redisReply *r = NULL;
    tb__error_t e = { 0, 0, "" };

    if (!c || !rkey || !b || !ttl_ms) {
        return TB_ERR;
    }
    argvlen[1] = pl[1] = strlen(rkey);
    memset(b, 0, sizeof(*b));
    if (tb__client_command(c, rkey, &hmget, &r, &e) != TB_OK) {
        goto err;
    }
    if (r->type == REDIS_REPLY_ARRAY && r->elements == 2
        && r->element[0]->type == REDIS_REPLY_STRING
        && r->element[1]->type == REDIS_REPLY_STRING) {
        b->exists = 1;
        b->tokens = tb_strtod_c(r->element[0]->str, NULL);
        b->ts_ms = strtoll(r->element[1]->str, NULL, 10);
    }
    tb__reply_free(r);
    if (tb__client_command(c, rkey, &pttl, &r, &e) != TB_OK) {
        goto err;
    }
    *ttl_ms = r->type == REDIS_REPLY_INTEGER ? r->integer : -2;
    tb__reply_free(r);
    return TB_OK;
err:
    tb__client_error(c, &e);
    return TB_ERR;
}

int tb_client_reset(tb_client_t *c, const char *rkey)
{
    const char *argv[2] = { "DEL", rkey };
    size_t argvlen[2] = { 3, 0 };
    tb__cmd_t cmd = { 2, argv, argvlen };
    redisReply *r = NULL;
    tb__error_t e = { 0, 0, "" };

    if (!c || !rkey) {
        return TB_ERR;
    }
    argvlen[1] = strlen(rkey);
    if (tb__client_command(c, rkey, &cmd, &r, &e) != TB_OK) {
        tb__client_error(c, &e);
        return TB_ERR;
    }
    tb__reply_free(r);
    return TB_OK;
}

int tb_client_failing(tb_client_t *c)
{
    return c && c->priv
           && (__atomic_load_n(&c->priv->last_failed, __ATOMIC_RELAXED)
               || tb_client_breaker_state(c) == TB_BREAKER_OPEN);
}

int tb__client_cluster(const tb_client_t *c)
{
    return c->priv->cluster != NULL || c->priv->cluster_keys;
}

tb_breaker_state_t tb_client_breaker_state(tb_client_t *c)
{
    tb_breaker_state_t s;

    pthread_mutex_lock(&c->priv->bmu);
    s = c->priv->breaker.state;
    pthread_mutex_unlock(&c->priv->bmu);
    return s;
}

const tb_stats_t *tb_client_stats(tb_client_t *c)
{
    return c->priv->stats;
}

const char *const tb_engine_names[TB_ENGINE_COUNT] = {
    "auto", "script", "module"
};

tb_engine_t tb_client_engine(tb_client_t *c, int *mixed)
{
    struct tb_client_priv *p = c->priv;
    int yes, no;

    *mixed = 0;
    /* A forced engine is the one in use, or none: a server without the
     * module refuses engine=module's connections. */
    if (p->pool.cfg.engine != TB_ENGINE_AUTO) {
        return (tb_engine_t)p->pool.cfg.engine;
    }
    if (p->cluster) {
        tb__cluster_module(p->cluster, &yes, &no);
    }
    else {
        int m = __atomic_load_n(&p->pool.module, __ATOMIC_RELAXED);

        yes = m == TB__MODULE_YES;
        no = m == TB__MODULE_NO;
    }
    *mixed = yes && no;
    return yes && !no ? TB_ENGINE_MODULE
                      : no && !yes ? TB_ENGINE_SCRIPT : TB_ENGINE_AUTO;
}

void tb_client_pool_usage(tb_client_t *c, int *size, int *open, int *in_use)
{
    if (c->priv->cluster) {
        tb__cluster_usage(c->priv->cluster, size, open, in_use);
        return;
    }
    *size = c->priv->pool.cfg.pool_size;
    tb__pool_usage(&c->priv->pool, open, in_use);
}
