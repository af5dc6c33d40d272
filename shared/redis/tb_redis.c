/* tb_redis.c -- what a Redis conversation means: connection setup, the
 * script call and its replies, ad-hoc commands, and the replies a cluster
 * answers with instead.
 *
 * Setup pipelines AUTH, SELECT, one SCRIPT LOAD per algorithm and, for
 * Sentinel, ROLE on every new connection: one extra round trip per
 * connection, none per decision. A script is called with EVALSHA; a
 * NOSCRIPT reply (a flushed cache, a restart, a failover) sends the text
 * again as EVAL, which caches it again. Error replies are errors, their
 * text copied: READONLY means the sentinels' primary was demoted, and
 * MOVED, ASK, TRYAGAIN and CLUSTERDOWN are handed to tb_cluster.c as
 * redirects. The transport, batching and connections are tb_pool.c's and
 * tb_conn.c's.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tb_int.h"

/* Sentinel: is ROLE's reply a primary's? */
static int role_is_master(const redisReply *r)
{
    return r->type == REDIS_REPLY_ARRAY && r->elements > 0
           && r->element[0]->type == REDIS_REPLY_STRING
           && strcmp(r->element[0]->str, "master") == 0;
}

/* Append one command given as NUL-terminated words. */
static int append_words(tb__buf_t *b, int argc, const char **argv)
{
    size_t len[4];
    int i;

    for (i = 0; i < argc; i++) {
        len[i] = strlen(argv[i]);
    }
    return tb__buf_argv(b, argc, argv, len);
}

int tb__setup(const tb_redis_addr_t *a, tb__conn_t *c,
              tb_monotime_us deadline, tb__error_t *e)
{
    const char *what[3 + TB_ALGO_COUNT], *av[4];
    char db[16];
    tb__buf_t out = { NULL, 0, 0 };
    int i, n = 0, nauth, ok = TB_OK, rc = TB_OK;

    if (a->password[0]) {
        av[0] = "AUTH";
        av[1] = a->user[0] ? a->user : a->password;
        av[2] = a->password;
        rc |= append_words(&out, a->user[0] ? 3 : 2, av);
        what[n++] = "AUTH";
    }
    if (a->db > 0) {
        snprintf(db, sizeof(db), "%d", a->db);
        av[0] = "SELECT";
        av[1] = db;
        rc |= append_words(&out, 2, av);
        what[n++] = "SELECT";
    }
    nauth = n;
    for (i = 0; i < TB_ALGO_COUNT; i++) {
        av[0] = "SCRIPT";
        av[1] = "LOAD";
        av[2] = tb_algo_script_source((tb_algo_t)i);
        if (!av[2]) {
            /* A library built with a stale script table: refuse rather
             * than send nothing. */
            tb__buf_free(&out);
            tb__set_error(e, TB_ERR_PROTOCOL, "no embedded script %d", i);
            return TB_ERR;
        }
        rc |= append_words(&out, 3, av);
        what[n++] = "SCRIPT LOAD";
    }
    if (a->kind == TB_REDIS_SENTINEL) {
        /* Sentinels name the primary a little before and after it is
         * one: a node that is not a primary would answer READONLY. */
        av[0] = "ROLE";
        rc |= append_words(&out, 1, av);
        what[n++] = "ROLE";
    }
    if (rc != TB_OK) {
        tb__buf_free(&out);
        tb__set_error(e, TB_ERR_OOM, "setup: out of memory");
        return TB_ERR;
    }
    rc = tb__conn_write(c, out.p, out.len, deadline, e);
    tb__buf_free(&out);
    for (i = 0; rc == TB_OK && i < n; i++) {
        redisReply *r = NULL;

        if (tb__conn_read(c, deadline, &r, e) != TB_OK) {
            char during[TB_ERRSTR_LEN];

            snprintf(during, sizeof(during), "%s", e->errstr);
            /* A TLS port drops a plaintext client at its first bytes. */
            tb__set_error(e, e->err, "%s: %.90s%s", what[i], during,
                          i == 0 && !a->tls && a->path[0] == '\0'
                                  && e->err == TB_ERR_IO
                              ? " (a TLS port? rediss://)"
                              : "");
            return TB_ERR;
        }
        if (ok == TB_OK && r->type == REDIS_REPLY_ERROR) {
            tb__set_error(e, i < nauth ? TB_ERR_AUTH : TB_ERR_REPLY,
                          "%s refused: %.80s", what[i], r->str);
            ok = TB_ERR;
        }
        else if (ok == TB_OK && strcmp(what[i], "SCRIPT LOAD") == 0
                 && (r->type != REDIS_REPLY_STRING
                     || strcmp(r->str, tb_algo_script_sha1(
                                           (tb_algo_t)(i - nauth))) != 0)) {
            tb__set_error(e, TB_ERR_PROTOCOL,
                          "SCRIPT LOAD returned an unexpected digest");
            ok = TB_ERR;
        }
        else if (ok == TB_OK && strcmp(what[i], "ROLE") == 0
                 && !role_is_master(r)) {
            tb__set_error(e, TB_ERR_REPLY, "the node the sentinels named "
                          "is not a primary (ROLE)");
            ok = TB_ERR;
        }
        tb__reply_free(r);
    }
    return rc == TB_OK ? ok : TB_ERR;
}

/* The scripts answer {allowed, remaining, retry_ms, binding}; for a
 * lease a fifth element, the tokens granted; with a concurrency limit a
 * fifth (0 without a lease) and a sixth, the slots held. */
static int parse_reply(const redisReply *r, tb__script_reply_t *out,
                       tb__error_t *e)
{
    size_t i;

    if (r->type != REDIS_REPLY_ARRAY || r->elements < 4 || r->elements > 6) {
        tb__set_error(e, TB_ERR_PROTOCOL,
                      "script reply is not an array of 4 to 6 (type %d)",
                      r->type);
        return TB_ERR;
    }
    out->v[4] = 0;
    out->v[5] = 0;
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

/* An error reply: copy its text into *e and return TB_ERR. A READONLY
 * one means the sentinels' primary was demoted: the pool asks them
 * again and reconnects. */
static int reply_error(tb__pool_t *p, const redisReply *r,
                       tb__redirect_t *rd, tb__error_t *e)
{
    tb__set_error(e, TB_ERR_REPLY, "%.120s", r->str);
    if (rd) {
        parse_redirect(r->str, rd);
    }
    if (strncmp(r->str, "READONLY", 8) == 0) {
        tb__pool_suspect(p, 1);
    }
    return TB_ERR;
}

static int run_script(tb__pool_t *p, int asking, int argc,
                      const char **argv, size_t *argvlen,
                      tb__script_reply_t *out, tb__redirect_t *rd,
                      tb__error_t *e)
{
    redisReply *r;
    int rc;

    if (rd) {
        memset(rd, 0, sizeof(*rd));
    }
    if (tb__pool_call(p, asking, argc, argv, argvlen, &r, e) != TB_OK) {
        return TB_ERR;
    }
    if (r->type == REDIS_REPLY_ERROR && strncmp(r->str, "NOSCRIPT", 8) == 0) {
        /* The script cache was flushed (SCRIPT FLUSH, a restart, a
         * failover): EVAL sends the text once and caches it again. The
         * caller's argv is borrowed for the retry and put back. The
         * digest says which algorithm's script to send. */
        const char *av0 = argv[0], *av1 = argv[1];
        size_t l0 = argvlen[0], l1 = argvlen[1];
        const char *text = tb_algo_script_source(TB_ALGO_TOKEN_BUCKET);
        int a;

        for (a = 0; a < TB_ALGO_COUNT; a++) {
            if (l1 == 40 && memcmp(av1, tb_algo_script_sha1((tb_algo_t)a),
                                   40) == 0) {
                text = tb_algo_script_source((tb_algo_t)a);
            }
        }
        tb__reply_free(r);
        if (p->stats) {
            tb_stats_add(&p->stats->noscript_reloads, 1);
        }
        argv[0] = "EVAL";
        argvlen[0] = 4;
        argv[1] = text;
        argvlen[1] = strlen(text);
        /* ASKING held for the EVALSHA only: it goes again. */
        rc = tb__pool_call(p, asking, argc, argv, argvlen, &r, e);
        argv[0] = av0;
        argv[1] = av1;
        argvlen[0] = l0;
        argvlen[1] = l1;
        if (rc != TB_OK) {
            return TB_ERR;
        }
    }
    rc = r->type == REDIS_REPLY_ERROR ? reply_error(p, r, rd, e)
                                      : parse_reply(r, out, e);
    tb__reply_free(r);
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
    if (rd) {
        memset(rd, 0, sizeof(*rd));
    }
    if (tb__pool_call(p, asking, argc, argv, argvlen, reply, e) != TB_OK) {
        return TB_ERR;
    }
    if ((*reply)->type == REDIS_REPLY_ERROR) {
        return reply_error(p, *reply, rd, e);
    }
    return TB_OK;
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
