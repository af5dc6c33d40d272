/* tbucket_redis.c -- tbucket_redis.so, the rate-limit scripts as a Redis
 * module: the same decisions on the same keys, as native commands.
 *
 *   redis-server --loadmodule /usr/lib/redis/modules/tbucket_redis.so
 *
 * One command per script (tbucket.bucket, .gcra, .swindow, .fwindow,
 * .slog), taking exactly the script's KEYS and ARGV with EVAL's numkeys
 * and answering exactly its reply, so a client swaps "EVALSHA <sha>" for
 * "tbucket.<algo>". rm_command.c parses and decides with the core's C
 * twins; this file opens and type-checks every key before writing, reads
 * the state, writes back what the outcome says, byte for byte as the
 * scripts do, and replicates effects (never the command, which reads the
 * clock). Key positions come from numkeys (a key spec and the getkeys
 * callback), so Cluster refuses CROSSSLOT as for EVAL. redismod/README.md and docs/design.md give the argument forms.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "redismodule_api.h"
#include "rm_command.h"

#ifndef TBUCKET_REDIS_VERSION
#define TBUCKET_REDIS_VERSION 1
#endif

/* Score ranks up to this are found by walking the set; past it by ZRANGE,
 * which finds a rank in O(log N). */
#define WALK_MAX 128

static int (*RedisModule_GetApi)(const char *name, void *fnptr);

#define TBUCKET_RM_DECLARE(ret, name, args) static ret(*RedisModule_##name) args;
TBUCKET_RM_API(TBUCKET_RM_DECLARE)

/* The keys of one call: one handle per distinct key, which positions
 * share, since two handles on one key each cache its value. */
typedef struct rm_keys {
    RedisModuleCtx *ctx;
    int numkeys;
    RedisModuleString *name[RM_MAX_KEYS];
    RedisModuleKey *key[RM_MAX_KEYS];
    int first[RM_MAX_KEYS];  /* Position that opened the handle. */
    /* Sliding log: the entries bucket i's decision may read, read right
     * after its own trim, as its script reads them: a key named again
     * later in the call is trimmed again under that bucket's window
     * before the decision runs. [0] for the call's cost, [1] for a zero
     * cost (the remaining count of a call its slot set refused). */
    int64_t nth_k[2][RM_MAX_KEYS];   /* -1: none read.            */
    double nth_v[2][RM_MAX_KEYS];
} rm_keys_t;

/* ---- Keys --------------------------------------------------------------- */

static void keys_close(rm_keys_t *k)
{
    int i;

    for (i = 0; i < k->numkeys; i++) {
        if (k->first[i] == i && k->key[i]) {
            RedisModule_CloseKey(k->key[i]);
        }
    }
}

/* Open every key for writing, one handle per distinct name. */
static void keys_open(RedisModuleCtx *ctx, RedisModuleString **names,
                      const rm_arg_t *args, int numkeys,
                      rm_keys_t *k)
{
    int i, j;

    k->ctx = ctx;
    k->numkeys = numkeys;
    for (i = 0; i < numkeys; i++) {
        k->name[i] = names[i];
        k->first[i] = i;
        k->nth_k[0][i] = k->nth_k[1][i] = -1;
        for (j = 0; j < i; j++) {
            if (args[j].len == args[i].len
                && memcmp(args[j].p, args[i].p, args[i].len) == 0) {
                k->first[i] = k->first[j];
                break;
            }
        }
        k->key[i] = k->first[i] == i
                    ? RedisModule_OpenKey(ctx, names[i],
                                          REDISMODULE_READ | REDISMODULE_WRITE)
                    : k->key[k->first[i]];
    }
}

/* The Redis type each algorithm keeps its buckets in. */
static int bucket_type(tb_algo_t algo)
{
    switch (algo) {
    case TB_ALGO_GCRA:
        return REDISMODULE_KEYTYPE_STRING;
    case TB_ALGO_SLIDING_LOG:
        return REDISMODULE_KEYTYPE_ZSET;
    default:
        return REDISMODULE_KEYTYPE_HASH;
    }
}

/* NULL when every key is empty or of its type, else the error reply. */
static const char *keys_check(const rm_call_t *c, rm_keys_t *k)
{
    int i, t;

    for (i = 0; i < c->numkeys; i++) {
        int want = i < c->n ? bucket_type(c->algo) : REDISMODULE_KEYTYPE_ZSET;

        if (!k->key[i]) {
            return "ERR tbucket: cannot open a key";
        }
        t = RedisModule_KeyType(k->key[i]);
        if (t != REDISMODULE_KEYTYPE_EMPTY && t != want) {
            return REDISMODULE_ERRORMSG_WRONGTYPE;
        }
    }
    if (c->conc) {
        for (i = 0; i < c->n; i++) {
            if (k->first[i] == k->first[c->n]) {
                /* The script would write a hash, then fail on ZADD. */
                return "ERR tbucket: the slot set is also a bucket key";
            }
        }
    }
    return NULL;
}

/* ---- Writing, with the effects replicated ------------------------------ */

static void expire_at(RedisModuleCtx *ctx, RedisModuleString *name,
                      RedisModuleKey *key, mstime_t at)
{
    RedisModule_SetAbsExpire(key, at);
    RedisModule_Replicate(ctx, "PEXPIREAT", "sl", name, (long long)at);
}

/* HSET name f0 v0 [f1 v1 [f2 v2]] with numbers formatted as the script's.
 * Field names are strings made once (fields_make), and the values made
 * here are handed to the replication by reference: allocation was a
 * quarter of Redis's time in a call (perf, one hot key). */
static void hash_put(RedisModuleCtx *ctx, RedisModuleString *name,
                     RedisModuleKey *key, RedisModuleString *const *field,
                     const double *val, int nf)
{
    char buf[40];
    RedisModuleString *s[3];
    size_t len;
    int i;

    for (i = 0; i < nf; i++) {
        len = tb__fmt_num(buf, sizeof(buf), val[i]);
        s[i] = RedisModule_CreateString(ctx, buf, len);
    }
    if (nf == 1) {
        RedisModule_HashSet(key, REDISMODULE_HASH_NONE, field[0], s[0],
                            NULL);
        RedisModule_Replicate(ctx, "HSET", "sss", name, field[0], s[0]);
    }
    else if (nf == 2) {
        RedisModule_HashSet(key, REDISMODULE_HASH_NONE, field[0], s[0],
                            field[1], s[1], NULL);
        RedisModule_Replicate(ctx, "HSET", "sssss", name, field[0], s[0],
                              field[1], s[1]);
    }
    else {
        RedisModule_HashSet(key, REDISMODULE_HASH_NONE, field[0], s[0],
                            field[1], s[1], field[2], s[2], NULL);
        RedisModule_Replicate(ctx, "HSET", "sssssss", name, field[0], s[0],
                              field[1], s[1], field[2], s[2]);
    }
    for (i = 0; i < nf; i++) {
        RedisModule_FreeString(ctx, s[i]);
    }
}

/* SET name value PXAT at: the GCRA's TAT. */
static void string_put(RedisModuleCtx *ctx, RedisModuleString *name,
                       RedisModuleKey *key, double v, mstime_t at)
{
    char buf[40];
    size_t len = tb__fmt_num(buf, sizeof(buf), v);
    RedisModuleString *s = RedisModule_CreateString(ctx, buf, len);

    RedisModule_StringSet(key, s);
    RedisModule_FreeString(ctx, s);
    RedisModule_SetAbsExpire(key, at);
    RedisModule_Replicate(ctx, "SET", "sbcl", name, buf, len, "PXAT",
                          (long long)at);
}

/* ZADD name score member, one member, as the scripts add them. */
static void zset_add(RedisModuleCtx *ctx, RedisModuleString *name,
                     RedisModuleKey *key, double score, const char *member,
                     size_t mlen)
{
    char buf[40];
    size_t len = tb__fmt_num(buf, sizeof(buf), score);
    RedisModuleString *m = RedisModule_CreateString(ctx, member, mlen);

    RedisModule_ZsetAdd(key, score, m, NULL);
    RedisModule_FreeString(ctx, m);
    RedisModule_Replicate(ctx, "ZADD", "sbb", name, buf, len, member, mlen);
}

/* ZREMRANGEBYSCORE name -inf max: the members at or below max go, one at
 * a time from the lowest (a set left empty is deleted with its last). The
 * command is replicated when it removed something, as a script's is. */
static void zset_trim(RedisModuleCtx *ctx, RedisModuleString *name,
                      RedisModuleKey *key, double max)
{
    long long removed = 0;
    char buf[40];
    size_t len;

    while (RedisModule_ZsetFirstInScoreRange(key, -INFINITY, max, 0, 0)
           == REDISMODULE_OK) {
        RedisModuleString *ele = NULL;
        double score;
        int gone = 0;

        if (!RedisModule_ZsetRangeEndReached(key)) {
            ele = RedisModule_ZsetRangeCurrentElement(key, &score);
        }
        RedisModule_ZsetRangeStop(key);
        if (!ele) {
            break;
        }
        RedisModule_ZsetRem(key, ele, &gone);
        RedisModule_FreeString(ctx, ele);
        if (!gone) {
            break;
        }
        removed++;
    }
    if (removed) {
        len = tb__fmt_num(buf, sizeof(buf), max);
        RedisModule_Replicate(ctx, "ZREMRANGEBYSCORE", "scb", name, "-inf",
                              buf, len);
    }
}

/* ZCOUNT key score score. */
static long long zset_count_at(RedisModuleKey *key, double score)
{
    long long n = 0;

    if (RedisModule_ZsetFirstInScoreRange(key, score, score, 0, 0)
        != REDISMODULE_OK) {
        return 0;
    }
    if (!RedisModule_ZsetRangeEndReached(key)) {
        do {
            n++;
        } while (RedisModule_ZsetRangeNext(key));
    }
    RedisModule_ZsetRangeStop(key);
    return n;
}

/* The score at rank k (0-based from the lowest): ZRANGE k k WITHSCORES. */
static double zset_rank_score(RedisModuleCtx *ctx, RedisModuleString *name,
                              RedisModuleKey *key, int64_t k)
{
    RedisModuleCallReply *r, *e;
    RedisModuleString *ele = NULL;
    double score = 0;
    const char *p;
    size_t len;
    int64_t j;

    if (k < WALK_MAX) {
        if (RedisModule_ZsetFirstInScoreRange(key, -INFINITY, INFINITY, 0, 0)
            != REDISMODULE_OK) {
            return 0;
        }
        for (j = 0; j < k && !RedisModule_ZsetRangeEndReached(key); j++) {
            RedisModule_ZsetRangeNext(key);
        }
        if (!RedisModule_ZsetRangeEndReached(key)) {
            ele = RedisModule_ZsetRangeCurrentElement(key, &score);
        }
        RedisModule_ZsetRangeStop(key);
        if (ele) {
            RedisModule_FreeString(ctx, ele);
        }
        return score;
    }
    r = RedisModule_Call(ctx, "ZRANGE", "sllc", name, (long long)k,
                         (long long)k, "WITHSCORES");
    if (r && RedisModule_CallReplyType(r) == REDISMODULE_REPLY_ARRAY
        && RedisModule_CallReplyLength(r) == 2
        && (e = RedisModule_CallReplyArrayElement(r, 1)) != NULL
        && RedisModule_CallReplyType(e) == REDISMODULE_REPLY_STRING
        && (p = RedisModule_CallReplyStringPtr(e, &len)) != NULL) {
        rm_lua_number(p, len, &score);
    }
    if (r) {
        RedisModule_FreeCallReply(r);
    }
    return score;
}

/* rm_nth_fn for the sliding log: the entry read for bucket i after
 * its trim (slog_prefetch), else the set as it is now. */
static double slog_nth(void *ctx, int i, int64_t k)
{
    rm_keys_t *keys = ctx;
    int j;

    for (j = 0; j < 2; j++) {
        if (keys->nth_k[j][i] == k && k >= 0) {
            return keys->nth_v[j][i];
        }
    }
    return zset_rank_score(keys->ctx, keys->name[i], keys->key[i], k);
}

/* Read the entries bucket i's decision will ask for, now, between its
 * trim and the next bucket's. */
static void slog_prefetch(const rm_call_t *c, rm_keys_t *k, int i,
                          double count)
{
    double cost[2];
    int j;

    cost[0] = c->cost[i];
    cost[1] = 0;
    for (j = 0; j < 2; j++) {
        k->nth_k[j][i] = tb_slog_need(&c->lim[i], cost[j], count);
        if (k->nth_k[j][i] >= 0) {
            k->nth_v[j][i] = zset_rank_score(k->ctx, k->name[i], k->key[i],
                                             k->nth_k[j][i]);
        }
    }
}

/* ---- Reading ------------------------------------------------------------ */

/* HMGET of up to three fields into decoder arguments; the strings are
 * kept in s[] until the caller frees them. */
static void hash_get(RedisModuleKey *key, RedisModuleString *const *field,
                     int nf, RedisModuleString **s, rm_arg_t *a)
{
    int i;

    for (i = 0; i < 3; i++) {
        s[i] = NULL;
    }
    if (RedisModule_KeyType(key) != REDISMODULE_KEYTYPE_HASH) {
        /* An empty key: no field to look up. */
        for (i = 0; i < nf; i++) {
            a[i].p = NULL;
            a[i].len = 0;
        }
        return;
    }
    if (nf == 2) {
        RedisModule_HashGet(key, REDISMODULE_HASH_NONE, field[0], &s[0],
                            field[1], &s[1], NULL);
    }
    else {
        RedisModule_HashGet(key, REDISMODULE_HASH_NONE, field[0], &s[0],
                            field[1], &s[1], field[2], &s[2], NULL);
    }
    for (i = 0; i < nf; i++) {
        a[i].p = s[i] ? RedisModule_StringPtrLen(s[i], &a[i].len) : NULL;
        if (!s[i]) {
            a[i].len = 0;
        }
    }
}

/* The scripts' hash fields, as strings made once at load (fields_make)
 * and kept for the module's life. */
static RedisModuleString *bucket_fields[3];  /* tokens, ts, ban */
static RedisModuleString *fwindow_fields[2];
static RedisModuleString *swindow_fields[3];

static void fields_make(void)
{
    static const char *const names[8] = { "tokens", "ts", "ban", "w", "n",
                                          "w", "cur", "prev" };
    RedisModuleString **out[8] = {
        &bucket_fields[0], &bucket_fields[1], &bucket_fields[2],
        &fwindow_fields[0], &fwindow_fields[1], &swindow_fields[0],
        &swindow_fields[1], &swindow_fields[2]
    };
    int i;

    for (i = 0; i < 8; i++) {
        *out[i] = RedisModule_CreateString(NULL, names[i], strlen(names[i]));
    }
}

/* Bucket i's state as its script reads it; the sliding log's set is
 * trimmed first (now - W), as the script trims it. */
static void read_state(const rm_call_t *c, rm_keys_t *k, int i,
                       int64_t now_ms, rm_state_t *st)
{
    RedisModuleKey *key = k->key[i];
    RedisModuleString *s[3];
    rm_arg_t a[3];
    const char *dma;
    size_t len;
    int j;

    memset(st, 0, sizeof(*st));
    st->ban_until = -1;
    switch (c->algo) {
    case TB_ALGO_TOKEN_BUCKET:
        /* 'rules' and 'settle' read the ban too, as the script does. */
        hash_get(key, bucket_fields, c->rules || c->settle ? 3 : 2, s, a);
        rm_decode_bucket(&a[0], &a[1], &st->bucket);
        if (c->rules || c->settle) {
            st->ban_until = rm_decode_ban(&a[2]);
        }
        break;
    case TB_ALGO_GCRA:
        a[0].p = NULL;
        a[0].len = 0;
        if (RedisModule_KeyType(key) == REDISMODULE_KEYTYPE_STRING
            && (dma = RedisModule_StringDMA(key, &len, REDISMODULE_READ))) {
            a[0].p = dma;
            a[0].len = len;
        }
        rm_decode_gcra(&a[0], &st->gcra);
        return;
    case TB_ALGO_FIXED_WINDOW:
        hash_get(key, fwindow_fields, 2, s, a);
        rm_decode_window(&a[0], &a[1], NULL, &st->window);
        break;
    case TB_ALGO_SLIDING_WINDOW:
        hash_get(key, swindow_fields, 3, s, a);
        rm_decode_window(&a[0], &a[1], &a[2], &st->window);
        break;
    case TB_ALGO_SLIDING_LOG:
        if (RedisModule_KeyType(key) == REDISMODULE_KEYTYPE_ZSET) {
            zset_trim(k->ctx, k->name[i], key,
                      tb_slog_cut_ms(&c->lim[i], now_ms));
        }
        st->count = RedisModule_KeyType(key) == REDISMODULE_KEYTYPE_ZSET
                    ? (double)RedisModule_ValueLength(key) : 0;
        slog_prefetch(c, k, i, st->count);
        return;
    }
    for (j = 0; j < 3; j++) {
        if (s[j]) {
            RedisModule_FreeString(k->ctx, s[j]);
        }
    }
}

/* ---- Writing the outcome ------------------------------------------------ */

/* Store bucket i's new state with its TTL, as its script does. */
static void write_state(const rm_call_t *c, rm_keys_t *k, int i,
                        const rm_outcome_t *o, int64_t now_ms,
                        mstime_t clock_ms)
{
    RedisModuleCtx *ctx = k->ctx;
    RedisModuleString *name = k->name[i];
    RedisModuleKey *key = k->key[i];
    mstime_t at = clock_ms + o->ttl_ms[i];
    const rm_state_t *st = &o->st[i];
    double v[3];

    switch (c->algo) {
    case TB_ALGO_TOKEN_BUCKET:
        v[0] = st->bucket.tokens;
        v[1] = (double)st->bucket.ts_ms;
        hash_put(ctx, name, key, bucket_fields, v, 2);
        break;
    case TB_ALGO_GCRA:
        string_put(ctx, name, key, st->gcra.tat_ms, at);
        return;
    case TB_ALGO_FIXED_WINDOW:
        v[0] = st->window.w;
        v[1] = st->window.cur;
        hash_put(ctx, name, key, fwindow_fields, v, 2);
        break;
    case TB_ALGO_SLIDING_WINDOW:
        v[0] = st->window.w;
        v[1] = st->window.cur;
        v[2] = st->window.prev;
        hash_put(ctx, name, key, swindow_fields, v, 3);
        break;
    case TB_ALGO_SLIDING_LOG: {
        /* Members "<now>:<seq>", numbered after those already at now:
         * unique, as a trim removes every member of one score at once. */
        long long seq = zset_count_at(key, (double)now_ms), j;
        char member[64];
        int mlen;

        for (j = 1; j <= (long long)c->cost[i]; j++) {
            mlen = snprintf(member, sizeof(member), "%lld:%lld",
                            (long long)now_ms, seq + j);
            zset_add(ctx, name, key, (double)now_ms, member, (size_t)mlen);
        }
        break;
    }
    }
    expire_at(ctx, name, key, at);
}

/* The prelude's finish(): take the slot when allowed; the set lives as
 * long as its latest slot. */
static void take_slot(const rm_call_t *c, rm_keys_t *k,
                      int64_t now_ms, mstime_t clock_ms)
{
    RedisModuleKey *key = k->key[c->n];
    mstime_t ttl;

    zset_add(k->ctx, k->name[c->n], key,
             (double)now_ms + (double)c->conc_ttl_ms, c->slot_id.p,
             c->slot_id.len);
    ttl = RedisModule_GetExpire(key);
    if (ttl < c->conc_ttl_ms) {
        expire_at(k->ctx, k->name[c->n], key, clock_ms + c->conc_ttl_ms);
    }
}

/* 'rules': each bucket the call bans gets the field ban, now + its ban,
 * and a TTL at least that long, as the script sets them. */
static void write_bans(const rm_call_t *c, rm_keys_t *k,
                       const rm_outcome_t *o, int64_t now_ms,
                       mstime_t clock_ms)
{
    int i;

    for (i = 0; i < c->n; i++) {
        double until = (double)now_ms + c->ban_ms[i];

        if (!(o->ban_set & (1u << i))) {
            continue;
        }
        hash_put(k->ctx, k->name[i], k->key[i], &bucket_fields[2], &until,
                 1);
        if (RedisModule_GetExpire(k->key[i]) < (mstime_t)c->ban_ms[i]) {
            expire_at(k->ctx, k->name[i], k->key[i],
                      clock_ms + (mstime_t)c->ban_ms[i]);
        }
    }
}

static void reply(RedisModuleCtx *ctx, const rm_call_t *c,
                  const rm_outcome_t *o, long long held)
{
    RedisModule_ReplyWithArray(ctx, c->rules ? 8
                                    : c->conc ? 6 : (c->lease ? 5 : 4));
    RedisModule_ReplyWithLongLong(ctx, o->v.allowed);
    RedisModule_ReplyWithLongLong(ctx, o->v.remaining);
    RedisModule_ReplyWithLongLong(ctx, o->v.retry_ms);
    RedisModule_ReplyWithLongLong(ctx, o->v.binding);
    if (c->lease || c->conc || c->rules) {
        RedisModule_ReplyWithLongLong(ctx, c->lease ? o->granted : 0);
    }
    if (c->conc || c->rules) {
        RedisModule_ReplyWithLongLong(ctx, held);
    }
    if (c->rules) {
        RedisModule_ReplyWithLongLong(ctx, o->banned);
        RedisModule_ReplyWithLongLong(ctx, o->ban_set);
    }
}

/* ---- The commands ------------------------------------------------------- */

/* The getkeys callback: numkeys keys after it, as EVAL's. */
static int key_positions(RedisModuleCtx *ctx, RedisModuleString **argv,
                         int argc)
{
    rm_arg_t a[2];
    int i, numkeys;

    if (argc < 2) {
        return REDISMODULE_OK;
    }
    for (i = 0; i < 2; i++) {
        a[i].p = RedisModule_StringPtrLen(argv[i], &a[i].len);
    }
    numkeys = rm_numkeys(argc, a);
    for (i = 0; i < numkeys; i++) {
        RedisModule_KeyAtPos(ctx, 2 + i);
    }
    return REDISMODULE_OK;
}

/* The slot set's members after the prune of those expired at now_ms. */
static long long slots_held(const rm_call_t *c, rm_keys_t *k,
                            int64_t now_ms)
{
    RedisModuleKey *set = k->key[c->n];

    if (RedisModule_KeyType(set) == REDISMODULE_KEYTYPE_ZSET) {
        zset_trim(k->ctx, k->name[c->n], set, (double)now_ms);
    }
    return RedisModule_KeyType(set) == REDISMODULE_KEYTYPE_ZSET
           ? (long long)RedisModule_ValueLength(set) : 0;
}

/* 1, with the error reply in err, when a state to store would need a TTL
 * PEXPIRE refuses from a script: the script fails there (after its
 * HSET); we fail before writing anything. Only a window stored under a
 * far smaller limit gets here, until that key expires. */
static int ttl_refused(const rm_call_t *c, const rm_outcome_t *o,
                       char *err, size_t errlen)
{
    int i;

    for (i = 0; i < c->n; i++) {
        if (o->store[i] && !((double)o->ttl_ms[i] < RM_MAX_TTL_MS)) {
            snprintf(err, errlen, "ERR %s: bucket %d: its TTL would be "
                     "%lld ms, more than PEXPIRE takes from a script",
                     rm_command_name(c->algo), i,
                     (long long)o->ttl_ms[i]);
            return 1;
        }
    }
    return 0;
}

/* One tbucket.<algo> call: parse, open and check every key, read, decide,
 * write, reply. */
static int command(RedisModuleCtx *ctx, RedisModuleString **argv, int argc,
                   tb_algo_t algo)
{
    rm_arg_t args[RM_MAX_ARGS];
    rm_state_t in[TB_MAX_BUCKETS];
    rm_outcome_t o;
    rm_call_t c;
    rm_keys_t k;
    const char *why;
    char err[256];
    mstime_t clock_ms;
    int64_t now_ms;
    long long held = 0;
    int i, conc_full = 0;

    if (RedisModule_IsKeysPositionRequest(ctx)) {
        return key_positions(ctx, argv, argc);
    }
    if (argc < 2) {
        return RedisModule_WrongArity(ctx);
    }
    if (argc > RM_MAX_ARGS) {
        snprintf(err, sizeof(err), "ERR %s: at most %d arguments",
                 rm_command_name(algo), RM_MAX_ARGS);
        return RedisModule_ReplyWithError(ctx, err);
    }
    for (i = 0; i < argc; i++) {
        args[i].p = RedisModule_StringPtrLen(argv[i], &args[i].len);
    }
    if (rm_parse(algo, argc, args, &c, err, sizeof(err)) != TB_OK) {
        return RedisModule_ReplyWithError(ctx, err);
    }
    keys_open(ctx, argv + 2, args + 2, c.numkeys, &k);
    if ((why = keys_check(&c, &k)) != NULL) {
        keys_close(&k);
        return RedisModule_ReplyWithError(ctx, why);
    }
    /* The clock, read once: the decision's (unless injected) and the base
     * of every expiry this call sets. */
    clock_ms = RedisModule_Milliseconds();
    now_ms = c.has_now ? c.now_ms : clock_ms;
    if (c.conc) {
        held = slots_held(&c, &k, now_ms);
        conc_full = (double)held >= c.conc_limit;
    }
    for (i = 0; i < c.n; i++) {
        read_state(&c, &k, i, now_ms, &in[i]);
    }
    if (rm_decide(&c, in, now_ms, conc_full, slog_nth, &k, &o)
        != TB_OK) {
        keys_close(&k);
        snprintf(err, sizeof(err), "ERR %s: the arguments were refused",
                 rm_command_name(algo));
        return RedisModule_ReplyWithError(ctx, err);
    }
    if (ttl_refused(&c, &o, err, sizeof(err))) {
        keys_close(&k);
        return RedisModule_ReplyWithError(ctx, err);
    }
    for (i = 0; i < c.n; i++) {
        if (o.store[i]) {
            write_state(&c, &k, i, &o, now_ms, clock_ms);
        }
    }
    if (o.ban_set) {
        write_bans(&c, &k, &o, now_ms, clock_ms);
    }
    if (c.conc && o.v.allowed) {
        take_slot(&c, &k, now_ms, clock_ms);
        held++;
    }
    keys_close(&k);
    reply(ctx, &c, &o, held);
    return REDISMODULE_OK;
}

static int cmd_bucket(RedisModuleCtx *ctx, RedisModuleString **argv,
                      int argc)
{
    return command(ctx, argv, argc, TB_ALGO_TOKEN_BUCKET);
}

static int cmd_gcra(RedisModuleCtx *ctx, RedisModuleString **argv, int argc)
{
    return command(ctx, argv, argc, TB_ALGO_GCRA);
}

static int cmd_swindow(RedisModuleCtx *ctx, RedisModuleString **argv,
                       int argc)
{
    return command(ctx, argv, argc, TB_ALGO_SLIDING_WINDOW);
}

static int cmd_fwindow(RedisModuleCtx *ctx, RedisModuleString **argv,
                       int argc)
{
    return command(ctx, argv, argc, TB_ALGO_FIXED_WINDOW);
}

static int cmd_slog(RedisModuleCtx *ctx, RedisModuleString **argv, int argc)
{
    return command(ctx, argv, argc, TB_ALGO_SLIDING_LOG);
}

/* ---- Loading ------------------------------------------------------------ */

/* Fetch every call of TBUCKET_RM_API; the name of the first the server
 * lacks, or NULL. */
static const char *fetch_api(void)
{
#define TBUCKET_RM_FETCH(ret, name, args)                                  \
    if (RedisModule_GetApi("RedisModule_" #name,                           \
                           (void *)&RedisModule_##name) != REDISMODULE_OK  \
        || !RedisModule_##name) {                                          \
        return "RedisModule_" #name;                                       \
    }
    TBUCKET_RM_API(TBUCKET_RM_FETCH)
#undef TBUCKET_RM_FETCH
    return NULL;
}

/* The command's keys for COMMAND INFO, as EVAL declares its own: numkeys
 * at argv[1], then that many keys, each read, updated and used for the
 * reply. With them Redis, proxies and Cluster clients find the keys of a
 * pipelined call without asking the getkeys callback (COMMAND GETKEYS),
 * which stays for servers older than 7.0's key specs. */
static int declare_keys(RedisModuleCtx *ctx, const char *name,
                        const char *summary)
{
    static const RedisModuleCommandInfoVersion version = {
        1, 0, sizeof(RedisModuleCommandKeySpec), 0
    };
    RedisModuleCommandKeySpec specs[2];
    RedisModuleCommandInfo info;
    RedisModuleCommand *cmd = RedisModule_GetCommand(ctx, name);

    memset(specs, 0, sizeof(specs)); /* a zeroed spec ends the list */
    specs[0].flags = REDISMODULE_CMD_KEY_RW | REDISMODULE_CMD_KEY_ACCESS
                     | REDISMODULE_CMD_KEY_UPDATE;
    specs[0].begin_search_type = REDISMODULE_KSPEC_BS_INDEX;
    specs[0].bs.index.pos = 1;
    specs[0].find_keys_type = REDISMODULE_KSPEC_FK_KEYNUM;
    specs[0].fk.keynum.keynumidx = 0;
    specs[0].fk.keynum.firstkey = 1;
    specs[0].fk.keynum.keystep = 1;
    memset(&info, 0, sizeof(info));
    info.version = &version;
    info.summary = summary;
    info.complexity = "O(N) for N keys (O(log M) more per key for slog)";
    info.since = "1";
    info.key_specs = specs;
    return cmd ? RedisModule_SetCommandInfo(cmd, &info) : REDISMODULE_ERR;
}

int RedisModule_OnLoad(RedisModuleCtx *ctx, RedisModuleString **argv,
                       int argc)
{
    static const struct {
        tb_algo_t algo;
        RedisModuleCmdFunc fn;
        const char *summary;
    } cmds[TB_ALGO_COUNT] = {
        { TB_ALGO_TOKEN_BUCKET, cmd_bucket,
          "Takes from token buckets, as tbucket's token_bucket script" },
        { TB_ALGO_GCRA, cmd_gcra,
          "Decides on GCRA limits, as tbucket's gcra script" },
        { TB_ALGO_SLIDING_WINDOW, cmd_swindow,
          "Counts in sliding windows, as tbucket's sliding_window script" },
        { TB_ALGO_FIXED_WINDOW, cmd_fwindow,
          "Counts in fixed windows, as tbucket's fixed_window script" },
        { TB_ALGO_SLIDING_LOG, cmd_slog,
          "Logs in sliding logs, as tbucket's sliding_log script" },
    };
    const char *missing;
    int i;

    (void)argv;
    /* The API's lookup function is the first field of the context. */
    memcpy(&RedisModule_GetApi, (const void *)ctx, sizeof(RedisModule_GetApi));
    if (!RedisModule_GetApi || (missing = fetch_api()) != NULL) {
        /* Redis reports the failed load; say why if it can be said. */
        if (RedisModule_GetApi && RedisModule_Log) {
            RedisModule_Log(ctx, "warning", "tbucket: this Redis lacks %s",
                            missing);
        }
        return REDISMODULE_ERR;
    }
    if (RedisModule_IsModuleNameBusy("tbucket")) {
        RedisModule_Log(ctx, "warning", "tbucket: a module of that name "
                        "is loaded already");
        return REDISMODULE_ERR;
    }
    if (argc != 0) {
        RedisModule_Log(ctx, "warning", "tbucket: the module takes no "
                        "arguments");
        return REDISMODULE_ERR;
    }
    RedisModule_SetModuleAttribs(ctx, "tbucket", TBUCKET_REDIS_VERSION,
                                 REDISMODULE_APIVER_1);
    fields_make();
    for (i = 0; i < TB_ALGO_COUNT; i++) {
        /* Keys come from numkeys (getkeys-api), as EVAL's do. */
        if (RedisModule_CreateCommand(ctx, rm_command_name(cmds[i].algo),
                                      cmds[i].fn,
                                      "write deny-oom getkeys-api", 0, 0, 0)
                != REDISMODULE_OK
            || declare_keys(ctx, rm_command_name(cmds[i].algo),
                            cmds[i].summary)
                   != REDISMODULE_OK) {
            RedisModule_Log(ctx, "warning", "tbucket: cannot register %s",
                            rm_command_name(cmds[i].algo));
            return REDISMODULE_ERR;
        }
    }
    RedisModule_Log(ctx, "notice", "tbucket %d: tbucket.bucket, "
                    "tbucket.gcra, tbucket.swindow, tbucket.fwindow, "
                    "tbucket.slog", TBUCKET_REDIS_VERSION);
    return REDISMODULE_OK;
}
