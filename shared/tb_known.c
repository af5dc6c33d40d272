/* tb_known.c -- clients known by address: the marks a successful login
 * leaves in Redis, for clients that keep no cookies (scripts, XML-RPC
 * applications).
 *
 * A mark says "this address logged in as KEY under rule RULE": the key
 * "<prefix>{KEY}:rule:RULE:known:ADDR" with a TTL of the rule's known=
 * time, in KEY's hash slot beside its bucket, so a Cluster keeps them on
 * one node. Reading one is one EXISTS, made only for a rule that asks
 * for it and only when that rule applies (a login post); a failed read
 * counts as unknown, the safe side. Cookies need no Redis at all
 * (base/tb_token.c). Also here: whether the bucket unknown clients
 * share is banned, read after a known client's decision for the
 * status page.
 */
#include <stdio.h>
#include <string.h>

#include "tb_int.h"

/* The mark's key into out (TB_KEY_BUF bytes): 0 when it cannot be. */
static int mark_key(const char *prefix, const char *rule, const char *key,
                    size_t len, const char *client, char *out)
{
    size_t n = tb_key_build_rule(prefix, key, len, rule, out);
    size_t cl = client ? strlen(client) : 0;

    if (!n || !cl || cl > 64 || strpbrk(client, "{} \r\n")
        || n + 7 + cl >= TB_KEY_BUF) {
        return 0;
    }
    memcpy(out + n, ":known:", 7);
    memcpy(out + n + 7, client, cl + 1);
    return 1;
}

/* One command of argc words about key rkey: TB_OK with its reply in *r
 * (the caller's to tb__reply_free), or TB_ERR with the client's error
 * set. */
static int command(tb_client_t *c, const char *rkey, const char **argv,
                   int argc, redisReply **r)
{
    size_t argvlen[5];
    tb__cmd_t cmd;
    tb__error_t e = { 0, 0, "" };
    int i;

    for (i = 0; i < argc; i++) {
        argvlen[i] = strlen(argv[i]);
    }
    cmd.argc = argc;
    cmd.argv = argv;
    cmd.argvlen = argvlen;
    if (tb__client_command(c, rkey, &cmd, r, &e) != TB_OK) {
        tb__client_error(c, &e);
        return TB_ERR;
    }
    return TB_OK;
}

int tb_client_known(tb_client_t *c, const char *prefix, const char *rule,
                    const char *key, size_t len, const char *client,
                    int *known)
{
    char mkey[TB_KEY_BUF];
    const char *argv[2] = { "EXISTS", mkey };
    redisReply *r;

    *known = 0;
    if (!c || !c->priv || !mark_key(prefix, rule, key, len, client, mkey)
        || command(c, mkey, argv, 2, &r) != TB_OK) {
        return TB_ERR;
    }
    *known = r->type == REDIS_REPLY_INTEGER && r->integer > 0;
    tb__reply_free(r);
    return TB_OK;
}

int tb_client_know(tb_client_t *c, const char *prefix, const char *rule,
                   const char *key, size_t len, const char *client,
                   int64_t ttl_ms)
{
    char mkey[TB_KEY_BUF], ms[24];
    const char *argv[5] = { "SET", mkey, "1", "PX", ms };
    redisReply *r;

    if (!c || !c->priv || ttl_ms < 1
        || !mark_key(prefix, rule, key, len, client, mkey)) {
        return TB_ERR;
    }
    snprintf(ms, sizeof(ms), "%lld", (long long)ttl_ms);
    if (command(c, mkey, argv, 5, &r) != TB_OK) {
        return TB_ERR;
    }
    tb__reply_free(r);
    return TB_OK;
}

int tb_client_banned(tb_client_t *c, const char *prefix, const char *rule,
                     const char *key, size_t len, int64_t now_ms,
                     int *banned)
{
    char rkey[TB_KEY_BUF];
    const char *argv[3] = { "HGET", rkey, "ban" };
    redisReply *r;

    *banned = 0;
    if (!c || !c->priv || !tb_key_build_rule(prefix, key, len, rule, rkey)
        || command(c, rkey, argv, 3, &r) != TB_OK) {
        return TB_ERR;
    }
    *banned = r->type == REDIS_REPLY_STRING
              && tb_strtod_c(r->str, NULL) > (double)now_ms;
    tb__reply_free(r);
    return TB_OK;
}
