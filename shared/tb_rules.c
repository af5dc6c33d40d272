/* tb_rules.c -- rule buckets past one script call: decisions whose buckets
 * lie in several Redis Cluster slots, the later charge of held buckets,
 * and bans (their index, and the tools' ban, unban and list).
 *
 * A rule's bucket is keyed by a client key of its own (tb_take_t.key), so
 * one request's buckets may hash to several Cluster slots, which no single
 * script call may touch (CROSSSLOT). Such a decision is one call per slot,
 * made one after another; the first refusal stops the rest, and what the
 * earlier calls took is given back (a settlement of minus the cost, and
 * their concurrency slot released), so a refused request is charged
 * nothing, as in one call. A single Redis, or one slot, needs none of
 * this: tb_client.c makes the one call.
 *
 * Bans are the scripts' (a field `ban` in the bucket's hash); this file
 * keeps the index that lists them without scanning the keyspace, a sorted
 * set per prefix written after the call that banned, since in a Cluster
 * it lies in another slot than the buckets.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tb_int.h"

/* ---- Decisions over several slots ---------------------------------- */

/* The takes of a request in one Cluster slot (indexes into its takes),
 * and whether the slot set of its concurrency limit lies there too. */
typedef struct group {
    unsigned slot;
    int n;
    int idx[TB_MAX_BUCKETS];
    int conc;
} group_t;

#define MAX_GROUPS (TB_MAX_BUCKETS + 1)

static unsigned slot_of(const char *key)
{
    return tb_key_slot(key, strlen(key));
}

int tb__rules_one_slot(const tb_request_t *q, const tb__call_t *k,
                       const char *ckey)
{
    unsigned s0;
    int i;

    if (q->ntakes == 0) {
        return 1;
    }
    s0 = slot_of(k->keys[0]);
    for (i = 1; i < q->ntakes; i++) {
        if (slot_of(k->keys[i]) != s0) {
            return 0;
        }
    }
    return !ckey || slot_of(ckey) == s0;
}

/* The group of slot, made when new. */
static group_t *group_for(group_t *g, int *ng, unsigned slot)
{
    int i;

    for (i = 0; i < *ng; i++) {
        if (g[i].slot == slot) {
            return &g[i];
        }
    }
    memset(&g[*ng], 0, sizeof(g[*ng]));
    g[*ng].slot = slot;
    return &g[(*ng)++];
}

static int make_groups(const tb_request_t *q, const tb__call_t *k,
                       group_t *g)
{
    int i, ng = 0;

    for (i = 0; i < q->ntakes; i++) {
        group_t *gi = group_for(g, &ng, slot_of(k->keys[i]));

        gi->idx[gi->n++] = i;
    }
    if (k->conc) {
        group_for(g, &ng, slot_of(k->conc->key))->conc = 1;
    }
    return ng;
}

/* q restricted to group g's takes (into takes), with its concurrency
 * limit only where the slot set lies. */
static void sub_request(const tb_request_t *q, const group_t *g,
                        tb_take_t *takes, tb_request_t *sub)
{
    int i;

    *sub = *q;
    for (i = 0; i < g->n; i++) {
        takes[i] = q->takes[g->idx[i]];
    }
    sub->takes = takes;
    sub->ntakes = g->n;
    if (!g->conc) {
        sub->concurrency = 0;
        sub->concurrency_ttl_ms = 0;
    }
}

/* Bits of a group's result moved to the request's take indexes. */
static unsigned map_mask(const group_t *g, unsigned bits)
{
    unsigned out = 0;
    int i;

    for (i = 0; i < g->n; i++) {
        if (bits & (1u << i)) {
            out |= 1u << g->idx[i];
        }
    }
    return out;
}

/* One slot's call for sub (all's slot set and id): TB_OK with *r, or
 * TB_ERR with t->e. */
static int call_part(tb_client_t *c, const tb_request_t *sub,
                     const tb__call_t *all, tb__trip_t *t, tb_result_t *r)
{
    tb__call_t k;

    memset(r, 0, sizeof(*r));
    t->e.err = TB_ERR_NONE;
    t->e.shared = 0;
    t->e.errstr[0] = '\0';
    if (!tb__call_prepare(sub, k.takes, k.keys)) {
        tb__set_error(&t->e, TB_ERR_ARG, "rules: bad part");
        return TB_ERR;
    }
    k.what = TB__CALL_DECIDE;
    k.conc = sub->concurrency ? all->conc : NULL;
    k.slot_id = all->slot_id;
    tb__call_argv(sub, &k);
    t->key = sub->ntakes ? k.keys[0] : all->conc->key;
    if (tb__client_script(c, &k, t, r) != TB_OK) {
        return TB_ERR;
    }
    tb__call_result(&t->rep, sub, k.takes, all->slot_id, r);
    if (r->bans_set) {
        tb__rules_index(c, sub, &k, r->bans_set);
    }
    return TB_OK;
}

/* Give back what an allowed part took: its charged buckets' costs (held
 * buckets took nothing) and its concurrency slot. Best effort: a refund
 * Redis cannot make leaves the tokens taken, as a failed release leaves
 * a slot until its ttl. */
static void refund(tb_client_t *c, const tb_request_t *sub,
                   const tb_result_t *r)
{
    tb_request_t plain = *sub;
    tb__call_t k;
    tb_result_t ignored;
    int i, any = 0;

    plain.concurrency = 0;
    plain.concurrency_ttl_ms = 0;
    if (plain.ntakes && tb__call_prepare(&plain, k.takes, k.keys)) {
        for (i = 0; i < plain.ntakes; i++) {
            k.takes[i].cost = k.takes[i].hold ? 0 : -k.takes[i].cost;
            any |= k.takes[i].cost != 0;
        }
        if (any) {
            tb__client_settle_call(c, &plain, &k, &ignored);
        }
    }
    if (r->slot.kind != TB_SLOT_NONE) {
        tb_client_release(c, sub, &r->slot);
    }
}

/* Refund the parts before `upto`, all of which were allowed. */
static void undo(tb_client_t *c, const tb_request_t *q, const group_t *g,
                 const tb_result_t *r, int upto)
{
    tb_take_t takes[TB_MAX_BUCKETS];
    tb_request_t sub;
    int i;

    for (i = 0; i < upto; i++) {
        sub_request(q, &g[i], takes, &sub);
        refund(c, &sub, &r[i]);
    }
}

/* The request's result from its parts, every one allowed: the tightest
 * bucket binds; the slot is the part's that held the slot set. */
static void fold_allowed(const tb_request_t *q, const group_t *g,
                         const tb_result_t *r, int ng, tb_result_t *res)
{
    int i, first = 1;

    *res = r[ng - 1];
    res->banned = 0;
    res->bans_set = 0;
    for (i = 0; i < ng; i++) {
        if (g[i].conc) {
            res->slot = r[i].slot;
            res->in_flight = r[i].in_flight;
        }
        if (g[i].n && (first || r[i].remaining < res->remaining)) {
            res->remaining = r[i].remaining;
            res->binding = g[i].idx[r[i].binding];
            first = 0;
        }
    }
    res->limit = q->takes[res->binding].limit.capacity;
}

/* The request's result from the part that refused it. */
static void fold_refused(const tb_request_t *q, const group_t *g,
                         const tb_result_t *r, tb_result_t *res)
{
    *res = *r;
    res->binding = g->n ? g->idx[r->binding < g->n ? r->binding : 0] : 0;
    res->banned = map_mask(g, r->banned);
    res->bans_set = map_mask(g, r->bans_set);
    if (r->refused_by != TB_LIMIT_CONCURRENCY && q->ntakes) {
        res->limit = q->takes[res->binding].limit.capacity;
    }
}

void tb__rules_slots(tb_client_t *c, const tb_request_t *q, tb__call_t *k,
                     tb__trip_t *t, tb_result_t *res)
{
    group_t g[MAX_GROUPS];
    tb_result_t r[MAX_GROUPS];
    tb_take_t takes[TB_MAX_BUCKETS];
    tb_request_t sub;
    int i, ng = make_groups(q, k, g), change = 0;

    for (i = 0; i < ng; i++) {
        sub_request(q, &g[i], takes, &sub);
        if (call_part(c, &sub, k, t, &r[i]) != TB_OK) {
            change = r[i].breaker_change ? r[i].breaker_change : change;
            undo(c, q, g, r, i);
            tb__client_answer(c, q, k, t->e.err, t->end, res);
            res->redis_us = t->end - t->start;
            res->breaker_change = change;
            return;
        }
        change = r[i].breaker_change ? r[i].breaker_change : change;
        if (!r[i].allowed) {
            undo(c, q, g, r, i);
            fold_refused(q, &g[i], &r[i], res);
            res->breaker_change = change;
            return;
        }
    }
    fold_allowed(q, g, r, ng, res);
    res->breaker_change = change;
}

/* ---- Charges after the response -------------------------------------- */

/* Settle the buckets of plain in k (prepared, each cost already given
 * its sign), one call per slot. */
static int charge_slots(tb_client_t *c, const tb_request_t *plain,
                        tb__call_t *k, double sign, tb_result_t *res)
{
    group_t g[MAX_GROUPS];
    tb_take_t takes[TB_MAX_BUCKETS];
    tb_request_t sub;
    tb__call_t part;
    tb_result_t r;
    int i, j, ng = make_groups(plain, k, g), rc = TB_OK;

    for (i = 0; i < ng; i++) {
        sub_request(plain, &g[i], takes, &sub);
        if (!tb__call_prepare(&sub, part.takes, part.keys)) {
            continue;
        }
        for (j = 0; j < sub.ntakes; j++) {
            part.takes[j].cost *= sign;
        }
        if (tb__client_settle_call(c, &sub, &part, &r) != TB_OK) {
            rc = TB_ERR;
            *res = r;
        }
        else if (rc == TB_OK && (i == 0 || !r.allowed)) {
            *res = r;
            res->binding = g[i].idx[r.binding < g[i].n ? r.binding : 0];
        }
    }
    return rc;
}

/* Take (sign 1) or give back (sign -1) every bucket of req its cost, one
 * settlement call per Cluster slot the keys lie in. */
static int adjust(tb_client_t *c, const tb_request_t *req, double sign,
                  tb_result_t *res)
{
    tb_request_t plain;
    tb__call_t k;
    int i;

    memset(res, 0, sizeof(*res));
    res->source = TB_SRC_ERROR;
    res->err = TB_ERR_ARG;
    if (!c || !c->priv || !req || req->algo != TB_ALGO_TOKEN_BUCKET
        || req->ntakes < 1) {
        return TB_ERR;
    }
    plain = *req;
    plain.concurrency = 0;
    plain.concurrency_ttl_ms = 0;
    plain.lease = 0;
    plain.lease_back = 0;
    plain.shards = 0;
    if (!tb__call_prepare(&plain, k.takes, k.keys)) {
        return TB_ERR;
    }
    k.conc = NULL;
    if (tb__client_cluster(c) && !tb__rules_one_slot(&plain, &k, NULL)) {
        return charge_slots(c, &plain, &k, sign, res);
    }
    for (i = 0; i < plain.ntakes; i++) {
        k.takes[i].cost *= sign;
    }
    return tb__client_settle_call(c, &plain, &k, res);
}

int tb_client_charge(tb_client_t *c, const tb_request_t *req,
                     tb_result_t *res)
{
    return adjust(c, req, 1, res);
}

int tb_client_refund(tb_client_t *c, const tb_request_t *req,
                     tb_result_t *res)
{
    return adjust(c, req, -1, res);
}

/* ---- Bans ------------------------------------------------------------ */

/* The index's update: drop what expired, add each (member, ms) pair with
 * its end on Redis's clock (GT: a longer ban there is kept), and live as
 * long as the latest. Rare (a ban is made once per refusal that bans), so
 * sent as EVAL: no digest to load on every server. */
static const char index_lua[] =
    "local t = redis.call('TIME') "
    "local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) "
    "redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now) "
    "for i = 1, #ARGV, 2 do "
    "  redis.call('ZADD', KEYS[1], 'GT', now + tonumber(ARGV[i + 1]), "
    "             ARGV[i]) "
    "end "
    "local last = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES') "
    "if last[2] then redis.call('PEXPIREAT', KEYS[1], last[2]) end "
    "return 1";

/* A ban of the bucket KEYS[1] for ARGV[1] ms from now, unless a longer
 * one is there, with a TTL that outlives it: what the decision script
 * does when its rule refuses. */
static const char ban_lua[] =
    "local t = redis.call('TIME') "
    "local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) "
    "local ms = tonumber(ARGV[1]) "
    "local cur = tonumber(redis.call('HGET', KEYS[1], 'ban')) "
    "if cur == nil or cur < now + ms then "
    "  redis.call('HSET', KEYS[1], 'ban', now + ms) "
    "end "
    "if redis.call('PTTL', KEYS[1]) < ms then "
    "  redis.call('PEXPIRE', KEYS[1], ms) "
    "end "
    "return 1";

/* One page of the index after the clock, newest first (the
 * latest-ending ban first): {now, the index's size, bans matched in the
 * page, the offset of the next page or -1, then at most ARGV[1] matching
 * members}. ARGV[2] a rule and ARGV[3] a stored key narrow it, ARGV[4] is
 * the prefix: both given, the one member is asked for; one given, the
 * ARGV[6] members from offset ARGV[5] are matched here, so that the
 * client reads no member it does not list and no call holds Redis long
 * (10,000 members: 6 ms of Redis, measured; 100,000 in one call held
 * it 0.2 s); none, the newest are listed at once.
 * Keys hold no brace and rule names no '}', so a member's
 * "{KEY}:rule:RULE" is unambiguous. */
static const char list_lua[] =
    "local t = redis.call('TIME') "
    "local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) "
    "redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now) "
    "local lim, rule, key = tonumber(ARGV[1]), ARGV[2], ARGV[3] "
    "local size = redis.call('ZCARD', KEYS[1]) "
    "local out = {now, size, 0, -1} "
    "if rule == '' and key == '' then "
    "  out[3] = size "
    "  if lim > 0 then "
    "    for _, m in ipairs(redis.call('ZREVRANGE', KEYS[1], 0, lim - 1)) "
    "    do table.insert(out, m) end "
    "  end "
    "  return out "
    "end "
    "if rule ~= '' and key ~= '' then "
    "  local m = ARGV[4] .. '{' .. key .. '}:rule:' .. rule "
    "  if redis.call('ZSCORE', KEYS[1], m) then "
    "    out[3] = 1 "
    "    if lim > 0 then table.insert(out, m) end "
    "  end "
    "  return out "
    "end "
    "local head, tail = ARGV[4] .. '{' .. key .. '}:rule:', "
    "                   '}:rule:' .. rule "
    "local from = tonumber(ARGV[5]) "
    "local page = redis.call('ZREVRANGE', KEYS[1], from, "
    "                        from + tonumber(ARGV[6]) - 1) "
    "for _, m in ipairs(page) do "
    "  if (key == '' or string.sub(m, 1, #head) == head) and "
    "     (rule == '' or string.sub(m, -#tail) == tail) then "
    "    out[3] = out[3] + 1 "
    "    if out[3] <= lim then table.insert(out, m) end "
    "  end "
    "end "
    "if #page > 0 and from + #page < size then out[4] = from + #page end "
    "return out";

/* "<prefix>bans" into out (TB_KEY_BUF bytes): 0 on a bad prefix. */
static int index_key(const char *prefix, char *out)
{
    if (!tb_prefix_valid(prefix)) {
        return 0;
    }
    snprintf(out, TB_KEY_BUF, "%s%s", prefix, TB_BANS_SUFFIX);
    return 1;
}

/* EVAL of text on key with up to 2 * TB_MAX_BUCKETS arguments. TB_OK
 * with *r, or TB_ERR with *e. */
static int eval(tb_client_t *c, const char *text, const char *key,
                const char *const *args, int nargs, redisReply **r,
                tb__error_t *e)
{
    const char *argv[4 + 2 * TB_MAX_BUCKETS];
    size_t argvlen[4 + 2 * TB_MAX_BUCKETS];
    tb__cmd_t cmd;
    int i;

    argv[0] = "EVAL";
    argv[1] = text;
    argv[2] = "1";
    argv[3] = key;
    for (i = 0; i < nargs && i < 2 * TB_MAX_BUCKETS; i++) {
        argv[4 + i] = args[i];
    }
    for (i = 0; i < 4 + nargs; i++) {
        argvlen[i] = strlen(argv[i]);
    }
    cmd.argc = 4 + nargs;
    cmd.argv = argv;
    cmd.argvlen = argvlen;
    *r = NULL;
    return tb__client_command(c, key, &cmd, r, e);
}

/* Add (member, ms) pairs to the index of prefix. */
static int index_add(tb_client_t *c, const char *prefix,
                     const char *const *pairs, int npairs, tb__error_t *e)
{
    char ikey[TB_KEY_BUF];
    redisReply *r;

    if (!index_key(prefix, ikey)) {
        tb__set_error(e, TB_ERR_ARG, "bans: bad prefix");
        return TB_ERR;
    }
    if (eval(c, index_lua, ikey, pairs, 2 * npairs, &r, e) != TB_OK) {
        return TB_ERR;
    }
    tb__reply_free(r);
    return TB_OK;
}

void tb__rules_index(tb_client_t *c, const tb_request_t *q,
                     const tb__call_t *k, unsigned bans)
{
    const char *pairs[2];
    char ms[24];
    tb__error_t e = { 0, 0, "" };
    int i;

    /* One update per ban: each rule bucket may have a prefix of its
     * own, and bans are rare (one per refusal that bans). */
    for (i = 0; i < q->ntakes; i++) {
        if (bans & (1u << i)) {
            snprintf(ms, sizeof(ms), "%lld", (long long)k->takes[i].ban_ms);
            pairs[0] = k->keys[i];
            pairs[1] = ms;
            index_add(c, k->takes[i].prefix ? k->takes[i].prefix
                                            : q->prefix, pairs, 1, &e);
        }
    }
}

/* The bucket of rule `rule` for key, into out; 0 when it cannot be. */
static int ban_bucket(const char *prefix, const char *rule, const char *key,
                      size_t len, char *out)
{
    return rule && tb_name_valid(rule) && (key || !len)
           && tb_key_build_rule(prefix, key ? key : "", len, rule, out);
}

int tb_client_ban(tb_client_t *c, const char *prefix, const char *rule,
                  const char *key, size_t len, int64_t ban_ms)
{
    char rkey[TB_KEY_BUF], ms[24];
    const char *args[1] = { ms }, *pair[2] = { rkey, ms };
    redisReply *r;
    tb__error_t e = { 0, 0, "" };

    if (!c || !c->priv) {
        return TB_ERR;
    }
    if (!ban_bucket(prefix, rule, key, len, rkey) || ban_ms < 1
        || ban_ms > TB_MAX_BAN_MS) {
        tb__set_error(&e, TB_ERR_ARG, "ban: bad prefix, rule, key or time");
        goto err;
    }
    snprintf(ms, sizeof(ms), "%lld", (long long)ban_ms);
    if (eval(c, ban_lua, rkey, args, 1, &r, &e) != TB_OK) {
        goto err;
    }
    tb__reply_free(r);
    if (index_add(c, prefix, pair, 1, &e) != TB_OK) {
        goto err;
    }
    return TB_OK;
err:
    tb__client_error(c, &e);
    return TB_ERR;
}

/* One command of argc words on key: TB_OK with its integer in *v. */
static int key_int(tb_client_t *c, const char *key, const char *const *w,
                   int argc, long long *v, tb__error_t *e)
{
    size_t len[4];
    tb__cmd_t cmd;
    redisReply *r;
    int i;

    for (i = 0; i < argc; i++) {
        len[i] = strlen(w[i]);
    }
    cmd.argc = argc;
    cmd.argv = w;
    cmd.argvlen = len;
    if (tb__client_command(c, key, &cmd, &r, e) != TB_OK) {
        return TB_ERR;
    }
    *v = r->type == REDIS_REPLY_INTEGER ? r->integer : 0;
    tb__reply_free(r);
    return TB_OK;
}

/* Lift the ban of the bucket KEYS[1] and, unless ARGV[1] is "1", delete
 * the bucket (a missing bucket is a full one at the next decision):
 * {ban lifted 0|1, bucket deleted 0|1}. */
static const char unban_lua[] =
    "local b = redis.call('HDEL', KEYS[1], 'ban') "
    "local d = 0 "
    "if ARGV[1] ~= '1' then d = redis.call('DEL', KEYS[1]) end "
    "return {b, d}";

int tb_client_unban(tb_client_t *c, const char *prefix, const char *rule,
                    const char *key, size_t len, unsigned flags, int *found)
{
    char rkey[TB_KEY_BUF], ikey[TB_KEY_BUF];
    const char *keep[1] = { flags & TB_UNBAN_KEEP_BUCKET ? "1" : "0" };
    const char *zrem[3] = { "ZREM", ikey, rkey };
    tb__error_t e = { 0, 0, "" };
    long long ignored;
    redisReply *r = NULL;

    if (!c || !c->priv) {
        return TB_ERR;
    }
    if (!ban_bucket(prefix, rule, key, len, rkey)
        || !index_key(prefix, ikey)) {
        tb__set_error(&e, TB_ERR_ARG, "unban: bad prefix, rule or key");
        goto err;
    }
    if (eval(c, unban_lua, rkey, keep, 1, &r, &e) != TB_OK) {
        goto err;
    }
    if (r->type != REDIS_REPLY_ARRAY || r->elements != 2
        || r->element[0]->type != REDIS_REPLY_INTEGER) {
        tb__set_error(&e, TB_ERR_PROTOCOL, "unban: unexpected reply");
        goto err;
    }
    if (found) {
        *found = r->element[0]->integer > 0;
    }
    tb__reply_free(r);
    r = NULL;
    if (key_int(c, ikey, zrem, 3, &ignored, &e) != TB_OK) {
        goto err;
    }
    return TB_OK;
err:
    tb__reply_free(r);
    tb__client_error(c, &e);
    return TB_ERR;
}

/* Split a listed bucket key "<prefix>{<key>}:rule:<rule>" into b. */
static int ban_parse(const char *prefix, const char *rkey, tb_ban_t *b)
{
    size_t p = strlen(prefix);
    const char *open = rkey + p, *close;

    if (strncmp(rkey, prefix, p) != 0 || *open != '{'
        || !(close = strstr(open, "}:rule:"))
        || (size_t)(close - open - 1) >= sizeof(b->key)
        || strlen(close + 7) >= sizeof(b->rule)) {
        return 0;
    }
    memcpy(b->key, open + 1, (size_t)(close - open - 1));
    b->key[close - open - 1] = '\0';
    strcpy(b->rule, close + 7);
    return 1;
}

/* The ban of one listed member: 1 with b filled when it is active at now
 * (Redis's clock in ms), 0 when lifted or over, -1 on error. */
static int ban_read(tb_client_t *c, const char *prefix, const char *rkey,
                    long long now, tb_ban_t *b, tb__error_t *e)
{
    const char *argv[3] = { "HGET", rkey, "ban" };
    size_t len[3] = { 4, strlen(rkey), 3 };
    tb__cmd_t cmd = { 3, argv, len };
    redisReply *r;
    long long until = 0;

    if (!ban_parse(prefix, rkey, b)) {
        return 0;
    }
    if (tb__client_command(c, rkey, &cmd, &r, e) != TB_OK) {
        return -1;
    }
    if (r->type == REDIS_REPLY_STRING) {
        until = (long long)tb_strtod_c(r->str, NULL);
    }
    tb__reply_free(r);
    b->left_ms = until - now;
    return b->left_ms > 0;
}

/* The arguments of one call of list_lua, and the buffers they point
 * into. */
typedef struct list_call {
    const char *args[6];
    char count[24], from[24], page[24];
    char key[TB_KEY_RAW_MAX + 1];
    tb_ban_t *out;                 /* Where the bans listed go: at    */
    int max;                       /* most max of them, *n so far.    */
    int *n;
} list_call_t;

/* The arguments for q (may be NULL) into *lc: 0 when q is bad. */
static int list_args(const char *prefix, const tb_bans_query_t *q,
                     list_call_t *lc)
{
    lc->key[0] = '\0';
    if (q && q->key && !tb_key_sanitize(q->key, q->key_len, lc->key)) {
        return 0;
    }
    if (q && q->rule && !tb_name_valid(q->rule)) {
        return 0;
    }
    snprintf(lc->page, sizeof(lc->page), "%d", TB_BANS_PAGE);
    lc->args[0] = lc->count;
    lc->args[1] = q && q->rule ? q->rule : "";
    lc->args[2] = lc->key;
    lc->args[3] = prefix;
    lc->args[4] = lc->from;
    lc->args[5] = lc->page;
    return 1;
}

/* The listed members of reply r into out, each read and checked. */
static int list_read(tb_client_t *c, const char *prefix, redisReply *r,
                     tb_ban_t *out, int max, int *n, tb__error_t *e)
{
    long long now = r->element[0]->integer;
    size_t i;

    for (i = 4; i < r->elements && *n < max; i++) {
        int got;

        if (r->element[i]->type != REDIS_REPLY_STRING) {
            continue;
        }
        got = ban_read(c, prefix, r->element[i]->str, now, &out[*n], e);
        if (got < 0) {
            return TB_ERR;
        }
        *n += got;
    }
    return TB_OK;
}

/* One call of list_lua from offset *from: the bans it lists added to
 * out, its counts to q (may be NULL), *from the next page's offset or
 * -1. TB_OK, or TB_ERR with *e. */
static int list_page(tb_client_t *c, const char *prefix, const char *ikey,
                     list_call_t *lc, tb_bans_query_t *q, long long *from,
                     tb__error_t *e)
{
    redisReply *r = NULL;
    size_t i;
    int rc = TB_ERR;

    snprintf(lc->from, sizeof(lc->from), "%lld", *from);
    if (eval(c, list_lua, ikey, lc->args, 6, &r, e) != TB_OK) {
        return TB_ERR;
    }
    if (r->type != REDIS_REPLY_ARRAY || r->elements < 4) {
        goto bad;
    }
    for (i = 0; i < 4; i++) {
        if (r->element[i]->type != REDIS_REPLY_INTEGER) {
            goto bad;
        }
    }
    if (q) {
        q->size = r->element[1]->integer;
        q->matched += r->element[2]->integer;
    }
    *from = r->element[3]->integer;
    rc = list_read(c, prefix, r, lc->out, lc->max, lc->n, e);
    tb__reply_free(r);
    return rc;
bad:
    tb__set_error(e, TB_ERR_PROTOCOL, "bans: unexpected reply");
    tb__reply_free(r);
    return TB_ERR;
}

int tb_client_bans_query(tb_client_t *c, const char *prefix,
                         tb_bans_query_t *q, tb_ban_t *out, int max, int *n)
{
    char ikey[TB_KEY_BUF];
    tb__error_t e = { 0, 0, "" };
    list_call_t lc;
    long long from = 0;
    int pages = 0;

    if (!c || !c->priv || !n || (max > 0 && !out)) {
        return TB_ERR;
    }
    *n = 0;
    if (q) {
        q->size = q->matched = 0;
    }
    if (!index_key(prefix, ikey) || !list_args(prefix, q, &lc)) {
        tb__set_error(&e, TB_ERR_ARG, "bans: bad prefix, rule or key");
        goto err;
    }
    lc.out = out;
    lc.max = max > 0 ? max : 0;
    lc.n = n;
    /* Each page lists what the caller still has room for, and counts
     * every match, so the pages go on past a full out; an index that
     * grows as fast as it is read ends the listing after 1,000 pages. */
    do {
        snprintf(lc.count, sizeof(lc.count), "%d", lc.max - *n);
        if (list_page(c, prefix, ikey, &lc, q, &from, &e) != TB_OK) {
            goto err;
        }
    } while (from > 0 && ++pages < 1000);
    return TB_OK;
err:
    tb__client_error(c, &e);
    return TB_ERR;
}

int tb_client_bans(tb_client_t *c, const char *prefix, tb_ban_t *out,
                   int max, int *n)
{
    return tb_client_bans_query(c, prefix, NULL, out, max, n);
}
