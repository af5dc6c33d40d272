/* tb_redis.c -- what a command's reply means: one command or script call
 * through a pool, its errors, and the replies a cluster answers with
 * instead.
 *
 * A script is called with EVALSHA; a NOSCRIPT reply (a flushed cache, a
 * restart, a failover) sends the text again as EVAL, which caches it
 * again: the settings' scripts say which text the digest names. Where
 * the server has the Redis module (engine module, or auto and its
 * connections' setup found it), the same call goes as the module's
 * command instead, which takes the script's keys and arguments and
 * answers its reply: EVALSHA's first two words become the command's
 * name. An "unknown command" reply then (the module was unloaded) under
 * auto sends the call again as EVALSHA, and later ones follow. A
 * script's reply is read as 4 to 6 integers; an ad-hoc command's is
 * handed back as it came. Error replies are errors, their text copied:
 * READONLY means the sentinels' primary was demoted, and MOVED, ASK,
 * TRYAGAIN and CLUSTERDOWN are parsed for tb_cluster.c as redirects. The
 * transport, batching and connections are tb_pool.c's and tb_conn.c's,
 * a new connection's setup tb_setup.c's.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "redis/tb_redis_int.h"

/* A script's reply: an array of 4 to 8 integers. */
static int parse_reply(const redisReply *r, tb__script_reply_t *out,
                       tb__error_t *e)
{
    size_t i;

    if (r->type != REDIS_REPLY_ARRAY || r->elements < 4 || r->elements > 8) {
        tb__set_error(e, TB_ERR_PROTOCOL,
                      "script reply is not an array of 4 to 8 (type %d)",
                      r->type);
        return TB_ERR;
    }
    for (i = 4; i < 8; i++) {
        out->v[i] = 0;
    }
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
void tb__redirect_parse(const char *s, tb__redirect_t *rd)
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
    tb__redirect_parse(r->str, rd);
    if (strncmp(r->str, "READONLY", 8) == 0) {
        tb__pool_suspect(p, 1);
    }
    return TB_ERR;
}

/* The text of the script whose digest is sha1 (len bytes), or else the
 * first script's. */
static const char *script_text(const tb__scripts_t *sc, const char *sha1,
                               size_t len)
{
    int i;

    for (i = 0; i < sc->n; i++) {
        if (len == 40 && memcmp(sha1, sc->sha1[i], 40) == 0) {
            return sc->text[i];
        }
    }
    return sc->n > 0 ? sc->text[0] : NULL;
}

/* The cache was flushed (SCRIPT FLUSH, a restart, a failover): send k's
 * script again as EVAL, which sends the text once and caches it again.
 * The digest (argv[1]) says which text. TB_OK with *r, or TB_ERR. */
static int noscript(tb__pool_t *p, const tb__redis_call_t *k,
                    redisReply **r, tb__error_t *e)
{
    const tb__cmd_t *cmd = &k->cmd;
    const char *text = script_text(&p->cfg.scripts, cmd->argv[1],
                                   cmd->argvlen[1]);
    const char **av;
    size_t *al, n = (size_t)cmd->argc;
    tb__cmd_t eval;
    int rc;

    if (p->cfg.stats) {
        tb_stats_add(&p->cfg.stats->noscript_reloads, 1);
    }
    av = malloc(n * sizeof(*av));
    al = malloc(n * sizeof(*al));
    if (!text || !av || !al) {
        free(av);
        free(al);
        tb__set_error(e, TB_ERR_OOM, "EVAL: out of memory");
        return TB_ERR;
    }
    memcpy(av, cmd->argv, n * sizeof(*av));
    memcpy(al, cmd->argvlen, n * sizeof(*al));
    av[0] = "EVAL";
    al[0] = 4;
    av[1] = text;
    al[1] = strlen(text);
    eval.argc = cmd->argc;
    eval.argv = av;
    eval.argvlen = al;
    /* ASKING held for the EVALSHA only: it goes again. */
    rc = tb__pool_call(p, k->asking, &eval, r, e);
    free(av);
    free(al);
    return rc;
}

/* The module's command for k's script, or NULL when k is to go as
 * EVALSHA: engine script, or auto on a server whose connections have not
 * found the module. */
static const char *module_command(const tb__pool_t *p,
                                  const tb__redis_call_t *k)
{
    const tb__scripts_t *sc = &p->cfg.scripts;
    const tb__cmd_t *cmd = &k->cmd;
    int i, m;

    if (!k->script || !sc->module_cmd || cmd->argc < 2
        || p->cfg.engine == TB_ENGINE_SCRIPT) {
        return NULL;
    }
    m = __atomic_load_n(&p->module, __ATOMIC_RELAXED);
    if (p->cfg.engine == TB_ENGINE_AUTO && m != TB__MODULE_YES) {
        return NULL;
    }
    for (i = 0; i < sc->n; i++) {
        if (cmd->argvlen[1] == 40 && memcmp(cmd->argv[1], sc->sha1[i], 40)
                                         == 0) {
            return sc->module_cmd[i];
        }
    }
    return NULL;
}

/* The most words of a call sent to the module without allocating. */
#define MODULE_ARGS 64

/* k's script call as the module's command name: EVALSHA <sha> numkeys
 * ... becomes name numkeys ... */
static int module_call(tb__pool_t *p, const tb__redis_call_t *k,
                       const char *name, redisReply **r, tb__error_t *e)
{
    const char *stack_av[MODULE_ARGS], **av = stack_av;
    size_t stack_al[MODULE_ARGS], *al = stack_al, n;
    tb__cmd_t mc;
    int rc;

    n = (size_t)k->cmd.argc - 1;
    if (n > MODULE_ARGS) {
        av = malloc(n * sizeof(*av));
        al = malloc(n * sizeof(*al));
        if (!av || !al) {
            free(av == stack_av ? NULL : av);
            free(al == stack_al ? NULL : al);
            tb__set_error(e, TB_ERR_OOM, "%s: out of memory", name);
            return TB_ERR;
        }
    }
    memcpy(av, k->cmd.argv + 1, n * sizeof(*av));
    memcpy(al, k->cmd.argvlen + 1, n * sizeof(*al));
    av[0] = name;
    al[0] = strlen(name);
    mc.argc = (int)n;
    mc.argv = av;
    mc.argvlen = al;
    rc = tb__pool_call(p, k->asking, &mc, r, e);
    if (av != stack_av) {
        free(av);
        free(al);
    }
    return rc;
}

/* Send k: as the module's command when the server has it (*by_module
 * then 1), else as EVALSHA (and EVAL after NOSCRIPT). */
static int send_call(tb__pool_t *p, const tb__redis_call_t *k,
                     redisReply **r, int *by_module, tb__error_t *e)
{
    const char *name = module_command(p, k);

    *by_module = 0;
    if (name) {
        if (module_call(p, k, name, r, e) != TB_OK) {
            return TB_ERR;
        }
        if (p->cfg.engine == TB_ENGINE_MODULE
            || (*r)->type != REDIS_REPLY_ERROR
            || strncmp((*r)->str, "ERR unknown command", 19) != 0) {
            *by_module = 1;
            return TB_OK;
        }
        /* The module is gone from this server: its scripts answer, this
         * call and the next ones, until a new connection finds it. */
        __atomic_store_n(&p->module, TB__MODULE_NO, __ATOMIC_RELAXED);
        tb__reply_free(*r);
        *r = NULL;
    }
    if (tb__pool_call(p, k->asking, &k->cmd, r, e) != TB_OK) {
        return TB_ERR;
    }
    return TB_OK;
}

int tb__redis_call(tb__pool_t *p, tb__redis_call_t *k, tb__error_t *e)
{
    redisReply *r;
    int rc, by_module;

    k->rd.kind = TB__REDIR_NONE;
    k->reply = NULL;
    if (send_call(p, k, &r, &by_module, e) != TB_OK) {
        return TB_ERR;
    }
    if (k->script && r->type == REDIS_REPLY_ERROR
        && strncmp(r->str, "NOSCRIPT", 8) == 0) {
        tb__reply_free(r);
        if (noscript(p, k, &r, e) != TB_OK) {
            return TB_ERR;
        }
    }
    if (r->type == REDIS_REPLY_ERROR) {
        rc = reply_error(p, r, &k->rd, e);
    }
    else if (k->script) {
        rc = parse_reply(r, k->script, e);
    }
    else {
        k->reply = r;
        return TB_OK;
    }
    /* Counted where the call ended: a redirected one is sent again to
     * another node, and counted there. */
    if (by_module && k->rd.kind == TB__REDIR_NONE && p->cfg.stats) {
        tb_stats_add(&p->cfg.stats->module_calls, 1);
    }
    tb__reply_free(r);
    return rc;
}
