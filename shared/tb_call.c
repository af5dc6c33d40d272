/* tb_call.c -- from a request to a script call and back: validation, the
 * Redis keys, the EVALSHA argument vector and the reply read as a result.
 *
 * Pure, no I/O: tb_client.c calls Redis with what this builds. The layout
 * here is the contract with the Lua scripts (shared/algo/tb_*.lua), so it
 * lives in one place, and numbers are formatted so that Lua's tonumber()
 * reads back exactly the double C holds: the C twins and the scripts must
 * agree bit for bit (tests/vectors/).
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "tb_int.h"

/* Append the algorithm's key suffix, if it fits. */
static int add_suffix(char *key, tb_algo_t algo)
{
    const char *sfx = tb_algo_key_suffix(algo);
    size_t kl = strlen(key), sl = strlen(sfx);

    if (kl + sl >= TB_KEY_BUF) {
        return 0;
    }
    memcpy(key + kl, sfx, sl + 1);
    return 1;
}

/* Whether a take carries nothing of a keyed one (its own key, prefix,
 * hold, ban): one test of the OR of them all. */
static int take_unkeyed(const tb_take_t *t)
{
    return ((uintptr_t)t->key | (uintptr_t)t->prefix | t->key_len
            | (uint64_t)t->hold | (uint64_t)t->ban_ms) == 0;
}

/* A take's kind against its name and key: a main or named take is the
 * request key's and holds nothing, bans nothing; a keyed one has both.
 * The main take, the common case, is judged first. */
static int take_kind_valid(const tb_take_t *t)
{
    if (t->kind == TB_TAKE_MAIN) {
        return !t->name && take_unkeyed(t);
    }
    if (t->kind == TB_TAKE_NAMED) {
        return t->name && take_unkeyed(t) && tb_name_valid(t->name);
    }
    return t->kind == TB_TAKE_KEYED && t->key && t->name
           && tb_name_valid(t->name) && (t->hold == 0 || t->hold == 1)
           && t->ban_ms >= 0 && t->ban_ms <= TB_MAX_BAN_MS;
}

static int take_valid(const tb_take_t *t)
{
    return tb_limit_check(&t->limit, NULL, 0) == TB_OK && t->cost >= 0
           && t->cost <= TB_MAX_CAPACITY && take_kind_valid(t);
}

int tb__call_rules(const tb_request_t *q)
{
    int i;

    for (i = 0; i < q->ntakes && q->takes; i++) {
        if (q->takes[i].kind == TB_TAKE_KEYED) {
            return 1;
        }
    }
    return 0;
}

/* The full Redis key of take t of q: a rule's own, or the request key's
 * (of the shard), with the algorithm's suffix. 0 when it cannot be. */
static int take_key(const tb_request_t *q, const tb_take_t *t, int shard,
                    char *out)
{
    if (t->key) {
        /* Rules are token buckets of their own key, never split. */
        return q->algo == TB_ALGO_TOKEN_BUCKET && shard < 0
               && tb_key_build_rule(t->prefix ? t->prefix : q->prefix,
                                    t->key, t->key_len, t->name, out);
    }
    return tb_key_build_shard(q->prefix, q->key, q->key_len, shard,
                              t->name, out)
           && add_suffix(out, q->algo);
}

/* May the sliding log take this? Its work and memory grow with capacity,
 * and it stores one member per whole unit of cost. */
static int slog_take_valid(const tb_take_t *t)
{
    return t->limit.capacity <= TB_SLOG_MAX_CAPACITY
           && t->cost == floor(t->cost);
}

int tb__lease_shape(const tb_request_t *q)
{
    const tb_take_t *t;

    /* Not even &takes[0] before the count is known: takes may be NULL
     * for a concurrency limit alone. */
    if (q->algo != TB_ALGO_TOKEN_BUCKET || q->ntakes != 1 || !q->takes) {
        return 0;
    }
    t = &q->takes[0];
    return !t->key && t->cost >= 1 && t->cost == floor(t->cost)
           && q->lease >= t->cost && q->lease <= TB_MAX_LEASE
           && q->lease == floor(q->lease);
}

/* A lease on the wire: its shape, on a bucket of the key's own (not a
 * route's), giving back a number of tokens. */
static int lease_valid(const tb_request_t *q)
{
    return tb__lease_shape(q) && q->takes[0].kind == TB_TAKE_MAIN
           && q->lease_back >= 0 && q->lease_back <= TB_MAX_CAPACITY;
}

/* The slot life a request asks for. */
static int64_t conc_ttl_ms(const tb_request_t *q)
{
    return q->concurrency_ttl_ms ? q->concurrency_ttl_ms
                                 : TB_CONCURRENCY_TTL_MS;
}

/* The slot set of the request's key, "<prefix>{<key>}:conc", into out
 * (TB_KEY_BUF bytes), and the policy's view of the limit. 0 when the
 * prefix is bad. */
int tb__call_conc(const tb_request_t *q, char *out, tb__conc_t *conc)
{
    size_t n = tb_key_build(q->prefix, q->key, q->key_len, NULL, out);

    if (!n || n + sizeof(":conc") > TB_KEY_BUF) {
        return 0;
    }
    memcpy(out + n, ":conc", sizeof(":conc"));
    conc->key = out;
    conc->limit = q->concurrency;
    conc->ttl_ms = conc_ttl_ms(q);
    return 1;
}

/* A concurrency limit is whole slots of one key, never split. */
static int conc_valid(const tb_request_t *q)
{
    int64_t ttl = conc_ttl_ms(q);

    return q->concurrency >= 1 && q->concurrency <= TB_MAX_CONCURRENCY
           && ttl >= 1 && ttl <= TB_MAX_CONCURRENCY_TTL_MS
           && q->shards <= 1;
}


/* Check a request and build what the script call needs: the takes with
 * the limits of the shard (a split key's sub-buckets hold capacity/K and
 * refill at rate/K) and the full Redis key of every bucket. 0 when the
 * request is malformed. No takes at all is a concurrency limit alone. */
int tb__call_prepare(const tb_request_t *q, tb_take_t *takes,
                     char keys[][TB_KEY_BUF])
{
    int i, split = q->shards > 1, shard = split ? q->shard : -1;

    if ((q->concurrency && !conc_valid(q)) || q->ntakes < 0
        || (q->ntakes == 0 && !q->concurrency)
        || (q->ntakes > 0 && !q->takes) || q->ntakes > TB_MAX_BUCKETS
        || (!q->key && q->key_len) || !tb_algo_script_sha1(q->algo)
        || q->shards < 0 || q->shards > TB_MAX_SHARDS
        || (split && (q->shard < 0 || q->shard >= q->shards))
        || !(q->lease >= 0) || (q->lease > 0 && !lease_valid(q))
        || (q->lease <= 0 && q->lease_back != 0)) {
        return 0;
    }
    for (i = 0; i < q->ntakes; i++) {
        takes[i] = q->takes[i];
        if (split) {
            takes[i].limit.capacity /= q->shards;
            takes[i].limit.rate_per_sec /= q->shards;
        }
        if (!take_valid(&takes[i]) || !take_key(q, &takes[i], shard, keys[i])
            || (q->algo == TB_ALGO_SLIDING_LOG
                && !slog_take_valid(&takes[i]))) {
            return 0;
        }
    }
    return 1;
}

/* Append one argument of len bytes to k's vector. */
static void arg(tb__call_t *k, const char *a, size_t len)
{
    k->argv[k->argc] = a;
    k->argvlen[k->argc++] = len;
}

/* Append v as a number, formatted into k's next free nums[i]. */
static void arg_num(tb__call_t *k, int i, double v)
{
    arg(k, k->nums[i], tb__fmt_num(k->nums[i], sizeof(k->nums[i]), v));
}

/* The script's arguments, EVALSHA form: digest, the keys, the clock ("" for
 * Redis's own), capacity, rate and cost per bucket, then 'settle', or the
 * lease size and the tokens given back when a lease is asked for; with a
 * concurrency limit (k->conc) its slot set as the last key and 'conc', N,
 * ttl and the slot id last. Without buckets the token bucket's script
 * carries the limit alone. */
int tb__call_argv(const tb_request_t *q, tb__call_t *k)
{
    const tb__conc_t *conc = k->conc;
    int i, n = q->ntakes;
    tb_algo_t algo = n > 0 ? q->algo : TB_ALGO_TOKEN_BUCKET;

    k->argc = 0;
    arg(k, "EVALSHA", 7);
    arg(k, tb_algo_script_sha1(algo), 40);
    arg_num(k, 0, n + (conc ? 1 : 0));
    for (i = 0; i < n; i++) {
        arg(k, k->keys[i], strlen(k->keys[i]));
    }
    if (conc) {
        arg(k, conc->key, strlen(conc->key));
    }
    if (q->now_ms) {
        arg(k, k->nums[1], (size_t)snprintf(k->nums[1], sizeof(k->nums[1]),
                                            "%lld", (long long)*q->now_ms));
    }
    else {
        arg(k, "", 0);
    }
    for (i = 0; i < n; i++) {
        arg_num(k, 2 + 3 * i, k->takes[i].limit.capacity);
        arg_num(k, 3 + 3 * i, k->takes[i].limit.rate_per_sec);
        arg_num(k, 4 + 3 * i, k->takes[i].cost);
    }
    if (k->what == TB__CALL_SETTLE) {
        arg(k, "settle", 6);
    }
    else if (tb__call_rules(q)) {
        /* Per bucket: held (checked, charged later), and its ban. */
        arg(k, "rules", 5);
        for (i = 0; i < n; i++) {
            arg(k, k->takes[i].hold ? "1" : "0", 1);
            arg_num(k, 6 + 3 * TB_MAX_BUCKETS + i,
                    (double)k->takes[i].ban_ms);
        }
    }
    else if (q->lease > 0) {
        /* The lease: the script's optional arguments after the buckets. */
        arg_num(k, 2 + 3 * n, q->lease);
        if (q->lease_back > 0) {
            arg_num(k, 3 + 3 * n, q->lease_back);
        }
    }
    if (conc) {
        arg(k, "conc", 4);
        arg_num(k, 4 + 3 * n, conc->limit);
        arg_num(k, 5 + 3 * n, (double)conc->ttl_ms);
        arg(k, k->slot_id, strlen(k->slot_id));
    }
    return k->argc;
}

/* Turn the script's reply into the result. The script binds a
 * concurrency refusal to index n, past the buckets. A reply out of range
 * (a binding, a grant, a wait or a count no script of ours returns) is
 * held to the request's bounds, never trusted into arithmetic. */
void tb__call_result(const tb__script_reply_t *rep, const tb_request_t *q,
                     const tb_take_t *takes, const char *slot_id,
                     tb_result_t *res)
{
    int n = q->ntakes;

    res->allowed = rep->v[0] == 1;
    res->remaining = rep->v[1];
    res->retry_ms = rep->v[2] >= -1 ? rep->v[2] : -1; /* -1: never. */
    res->binding = rep->v[3] >= 0 && rep->v[3] < n ? (int)rep->v[3] : 0;
    res->limit = n > 0 ? takes[res->binding].limit.capacity : 0;
    res->source = TB_SRC_REDIS;
    res->err = TB_ERR_NONE;
    if (!res->allowed) {
        res->refused_by = q->concurrency && rep->v[3] == n
                          ? TB_LIMIT_CONCURRENCY : TB_LIMIT_RATE;
    }
    if (q->lease > 0 && res->allowed) {
        /* A reply without a grant means only the cost was taken; more
         * than was asked is never believed. */
        res->granted = rep->v[4] >= takes[0].cost ? rep->v[4]
                                                  : (int64_t)takes[0].cost;
        if (res->granted > q->lease) {
            res->granted = (int64_t)q->lease;
        }
    }
    if (tb__call_rules(q)) {
        /* Bits past the buckets are no bucket's. */
        unsigned all = n >= 32 ? ~0u : (1u << n) - 1;

        res->banned = (unsigned)rep->v[6] & all;
        res->bans_set = (unsigned)rep->v[7] & all;
    }
    if (q->concurrency) {
        /* Slots held may pass N after N was lowered, never below 0. */
        res->in_flight = rep->v[5] > 0 ? rep->v[5] : 0;
        if (res->refused_by == TB_LIMIT_CONCURRENCY || n == 0) {
            res->limit = q->concurrency;
        }
        if (n == 0) {
            res->remaining = res->allowed && res->in_flight < q->concurrency
                             ? q->concurrency - res->in_flight : 0;
        }
        if (res->allowed) {
            /* The id as a string, whatever the size of its buffer. */
            size_t l = strnlen(slot_id, TB_SLOT_ID_LEN - 1);

            res->slot.kind = TB_SLOT_REDIS;
            memcpy(res->slot.id, slot_id, l);
            res->slot.id[l] = '\0';
        }
    }
}

