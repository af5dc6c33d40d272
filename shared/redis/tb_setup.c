/* tb_setup.c -- what a new connection says first: AUTH, SELECT, SCRIPT
 * LOAD of every script, whether the server has the Redis module and, for
 * Sentinel, ROLE.
 *
 * The pool (tb_pool.c) sets up each connection it opens, once, before
 * its first command: every step is pipelined in one write and one read
 * of all the replies, so a connection costs one extra round trip and a
 * decision none. SCRIPT LOAD puts every script in the server's cache
 * (the digests are checked against the ones the settings carry), so the
 * first EVALSHA of each finds it; the scripts are loaded even where the
 * module answers, so that falling back to them never meets NOSCRIPT.
 * COMMAND INFO of the module's first command says whether this server
 * has the module: an array for a known command, a nil for an unknown
 * one (Redis 7). Sentinels name the primary a little
 * before and after it is one, so a Sentinel pool asks ROLE and refuses a
 * node that is not a primary (it would answer READONLY).
 */
#include <stdio.h>
#include <string.h>

#include "redis/tb_redis_int.h"

/* The commands of one setup, in the order they are sent. */
typedef struct steps {
    tb__buf_t out;                 /* Their RESP, for one write.        */
    const char *what[4 + TB__MAX_SCRIPTS]; /* Each one's name.          */
    int n;
    int nauth;                     /* AUTH and SELECT come first.       */
} steps_t;

/* Append one command given as NUL-terminated words, named what. */
static int add(steps_t *st, const char *what, int argc, const char **argv)
{
    size_t len[4];
    int i;

    for (i = 0; i < argc; i++) {
        len[i] = strlen(argv[i]);
    }
    st->what[st->n++] = what;
    return tb__buf_argv(&st->out, argc, argv, len);
}

/* Sentinel: is ROLE's reply a primary's? */
static int role_is_master(const redisReply *r)
{
    return r->type == REDIS_REPLY_ARRAY && r->elements > 0
           && r->element[0]->type == REDIS_REPLY_STRING
           && strcmp(r->element[0]->str, "master") == 0;
}

/* The setup commands for cfg into *st. TB_ERR with *e. */
static int build(const tb__redis_cfg_t *cfg, steps_t *st, tb__error_t *e)
{
    const tb_redis_addr_t *a = &cfg->addr;
    const char *av[4];
    char db[16];
    int i, rc = TB_OK;

    if (a->password[0]) {
        av[0] = "AUTH";
        av[1] = a->user[0] ? a->user : a->password;
        av[2] = a->password;
        rc |= add(st, "AUTH", a->user[0] ? 3 : 2, av);
    }
    if (a->db > 0) {
        snprintf(db, sizeof(db), "%d", a->db);
        av[0] = "SELECT";
        av[1] = db;
        rc |= add(st, "SELECT", 2, av);
    }
    st->nauth = st->n;
    if (cfg->scripts.n > TB__MAX_SCRIPTS) {
        tb__set_error(e, TB_ERR_ARG, "setup: %d scripts, at most %d",
                      cfg->scripts.n, TB__MAX_SCRIPTS);
        return TB_ERR;
    }
    for (i = 0; i < cfg->scripts.n; i++) {
        av[0] = "SCRIPT";
        av[1] = "LOAD";
        av[2] = cfg->scripts.text[i];
        if (!av[2]) {
            /* A library built with a stale script table: refuse rather
             * than send nothing. */
            tb__set_error(e, TB_ERR_PROTOCOL, "no embedded script %d", i);
            return TB_ERR;
        }
        rc |= add(st, "SCRIPT LOAD", 3, av);
    }
    if (cfg->engine != TB_ENGINE_SCRIPT && cfg->scripts.module_cmd
        && cfg->scripts.n > 0) {
        av[0] = "COMMAND";
        av[1] = "INFO";
        av[2] = cfg->scripts.module_cmd[0];
        rc |= add(st, "COMMAND INFO", 3, av);
    }
    if (a->kind == TB_REDIS_SENTINEL) {
        av[0] = "ROLE";
        rc |= add(st, "ROLE", 1, av);
    }
    if (rc != TB_OK) {
        tb__set_error(e, TB_ERR_OOM, "setup: out of memory");
        return TB_ERR;
    }
    return TB_OK;
}

/* COMMAND INFO's answer: the module's command is known (a non-empty
 * array in the one-element array), or not (a nil there). */
static int module_known(const redisReply *r)
{
    return r->type == REDIS_REPLY_ARRAY && r->elements == 1
           && r->element[0]->type == REDIS_REPLY_ARRAY
           && r->element[0]->elements > 0;
}

/* Judge reply i of the steps: TB_OK, or TB_ERR with *e. */
static int check(const tb__redis_cfg_t *cfg, const steps_t *st, int i,
                 const redisReply *r, int *module, tb__error_t *e)
{
    const char *what = st->what[i];

    if (r->type == REDIS_REPLY_ERROR) {
        tb__set_error(e, i < st->nauth ? TB_ERR_AUTH : TB_ERR_REPLY,
                      "%s refused: %.80s", what, r->str);
        return TB_ERR;
    }
    if (strcmp(what, "SCRIPT LOAD") == 0
        && (r->type != REDIS_REPLY_STRING
            || strcmp(r->str, cfg->scripts.sha1[i - st->nauth]) != 0)) {
        tb__set_error(e, TB_ERR_PROTOCOL,
                      "SCRIPT LOAD returned an unexpected digest");
        return TB_ERR;
    }
    if (strcmp(what, "COMMAND INFO") == 0) {
        *module = module_known(r) ? TB__MODULE_YES : TB__MODULE_NO;
        if (*module == TB__MODULE_NO && cfg->engine == TB_ENGINE_MODULE) {
            tb__set_error(e, TB_ERR_REPLY, "engine=module, but this Redis "
                          "has no %s: load tbucket_redis.so "
                          "(loadmodule), or use engine=auto",
                          cfg->scripts.module_cmd[0]);
            return TB_ERR;
        }
        return TB_OK;
    }
    if (strcmp(what, "ROLE") == 0 && !role_is_master(r)) {
        tb__set_error(e, TB_ERR_REPLY, "the node the sentinels named "
                      "is not a primary (ROLE)");
        return TB_ERR;
    }
    return TB_OK;
}

/* A read of reply i failed: say during which step. A TLS port drops a
 * plaintext client at its first bytes. */
static void read_failed(const tb__redis_cfg_t *cfg, const steps_t *st,
                        int i, tb__error_t *e)
{
    const tb_redis_addr_t *a = &cfg->addr;
    char during[TB_ERRSTR_LEN];

    snprintf(during, sizeof(during), "%s", e->errstr);
    tb__set_error(e, e->err, "%s: %.90s%s", st->what[i], during,
                  i == 0 && !a->tls && a->path[0] == '\0'
                          && e->err == TB_ERR_IO
                      ? " (a TLS port? rediss://)"
                      : "");
}

int tb__setup(const tb__redis_cfg_t *cfg, tb__conn_t *c,
              tb_monotime_us deadline, int *module, tb__error_t *e)
{
    steps_t st;
    int i, ok = TB_OK, rc;

    *module = TB__MODULE_UNKNOWN;
    memset(&st, 0, sizeof(st));
    if (build(cfg, &st, e) != TB_OK) {
        tb__buf_free(&st.out);
        return TB_ERR;
    }
    rc = tb__conn_write(c, st.out.p, st.out.len, deadline, e);
    tb__buf_free(&st.out);
    /* Every reply is read, so the connection stays in step; the first
     * refusal is the one reported. */
    for (i = 0; rc == TB_OK && i < st.n; i++) {
        redisReply *r = NULL;

        if (tb__conn_read(c, deadline, &r, e) != TB_OK) {
            read_failed(cfg, &st, i, e);
            return TB_ERR;
        }
        if (ok == TB_OK) {
            ok = check(cfg, &st, i, r, module, e);
        }
        tb__reply_free(r);
    }
    return rc == TB_OK ? ok : TB_ERR;
}
