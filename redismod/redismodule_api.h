/* redismodule_api.h -- the part of Redis's module API that tbucket_redis.so
 * calls, declared by hand.
 *
 * Why by hand: Redis gives a module its API at run time, as functions
 * looked up by name through RedisModule_GetApi, the pointer at the head of
 * the context it passes to RedisModule_OnLoad; redismodule.h is only a
 * convenience that declares those pointers and fills them in. No Debian
 * package ships that header (redis-server ships the server alone), and the
 * project builds from Debian's packages and its own files, so the module
 * declares what it uses: the opaque types, the constants it passes or
 * compares, and one line per call in TBUCKET_RM_API below, each with the
 * signature of Redis 7.0's module API documentation. tbucket_redis.c turns
 * the list into static function pointers and fetches every one when the
 * module loads, refusing to load if the server lacks one (Redis 7.0.0 has
 * them all; SetAbsExpire needs 6.2.2, KeyAtPos 4.0, SetCommandInfo 7.0).
 *
 * Nothing else of the API is declared: add a line to the list, with the
 * documented signature, before calling anything new.
 */
#ifndef REDISMODULE_API_H
#define REDISMODULE_API_H

#include <stddef.h>

/* Opaque types: only pointers to them cross the API. */
typedef struct RedisModuleCtx RedisModuleCtx;
typedef struct RedisModuleKey RedisModuleKey;
typedef struct RedisModuleString RedisModuleString;
typedef struct RedisModuleCallReply RedisModuleCallReply;

typedef struct RedisModuleCommand RedisModuleCommand;

typedef long long mstime_t;
typedef int (*RedisModuleCmdFunc)(RedisModuleCtx *ctx,
                                  RedisModuleString **argv, int argc);

#define REDISMODULE_OK 0
#define REDISMODULE_ERR 1
#define REDISMODULE_APIVER_1 1

/* OpenKey modes. */
#define REDISMODULE_READ (1 << 0)
#define REDISMODULE_WRITE (1 << 1)

/* KeyType results. */
#define REDISMODULE_KEYTYPE_EMPTY 0
#define REDISMODULE_KEYTYPE_STRING 1
#define REDISMODULE_KEYTYPE_HASH 3
#define REDISMODULE_KEYTYPE_ZSET 5

/* CallReplyType results. */
#define REDISMODULE_REPLY_STRING 0
#define REDISMODULE_REPLY_ARRAY 3

/* GetExpire: the key has no TTL. */
#define REDISMODULE_NO_EXPIRE -1

/* HashGet/HashSet: field names given as RedisModuleStrings (NONE), or as
 * C strings (CFIELDS). */
#define REDISMODULE_HASH_NONE 0
#define REDISMODULE_HASH_CFIELDS (1 << 2)

#define REDISMODULE_ERRORMSG_WRONGTYPE                                     \
    "WRONGTYPE Operation against a key holding the wrong kind of value"

/* SetCommandInfo's key specs (Redis 7.0): where a command's keys are, so
 * that COMMAND INFO lists them and servers, proxies and Cluster clients
 * find them without calling the command's getkeys callback. Only the
 * parts the module fills are declared; the others stay NULL, so their
 * element sizes are never read. */
#define REDISMODULE_KSPEC_BS_INDEX 2
#define REDISMODULE_KSPEC_FK_KEYNUM 3
#define REDISMODULE_CMD_KEY_RW (1ULL << 1)
#define REDISMODULE_CMD_KEY_ACCESS (1ULL << 4)
#define REDISMODULE_CMD_KEY_UPDATE (1ULL << 5)

typedef struct RedisModuleCommandKeySpec {
    const char *notes;
    unsigned long long flags;
    int begin_search_type;
    union {
        struct {
            int pos;
        } index;
        struct {
            const char *keyword;
            int startfrom;
        } keyword;
    } bs;
    int find_keys_type;
    union {
        struct {
            int lastkey;
            int keystep;
            int limit;
        } range;
        struct {
            int keynumidx;
            int firstkey;
            int keystep;
        } keynum;
    } fk;
} RedisModuleCommandKeySpec;

typedef struct RedisModuleCommandInfoVersion {
    int version;
    size_t sizeof_historyentry;
    size_t sizeof_keyspec;
    size_t sizeof_arg;
} RedisModuleCommandInfoVersion;

typedef struct RedisModuleCommandInfo {
    const RedisModuleCommandInfoVersion *version;
    const char *summary;
    const char *complexity;
    const char *since;
    void *history; /* NULL: no history entries */
    const char *tips;
    int arity;
    RedisModuleCommandKeySpec *key_specs;
    void *args; /* NULL: no argument docs */
} RedisModuleCommandInfo;

/* The calls: X(return type, name without "RedisModule_", parameters). */
#define TBUCKET_RM_API(X)                                                  \
    X(int, IsModuleNameBusy, (const char *name))                           \
    X(void, SetModuleAttribs, (RedisModuleCtx *ctx, const char *name,      \
                               int ver, int apiver))                       \
    X(int, CreateCommand, (RedisModuleCtx *ctx, const char *name,          \
                           RedisModuleCmdFunc cmdfunc, const char *strflags, \
                           int firstkey, int lastkey, int keystep))         \
    X(RedisModuleCommand *, GetCommand, (RedisModuleCtx *ctx,              \
                                         const char *name))                \
    X(int, SetCommandInfo, (RedisModuleCommand *command,                   \
                            const RedisModuleCommandInfo *info))           \
    X(void, Log, (RedisModuleCtx *ctx, const char *level, const char *fmt, \
                  ...))                                                    \
    X(int, IsKeysPositionRequest, (RedisModuleCtx *ctx))                   \
    X(void, KeyAtPos, (RedisModuleCtx *ctx, int pos))                      \
    X(int, WrongArity, (RedisModuleCtx *ctx))                              \
    X(int, ReplyWithError, (RedisModuleCtx *ctx, const char *err))         \
    X(int, ReplyWithArray, (RedisModuleCtx *ctx, long len))                \
    X(int, ReplyWithLongLong, (RedisModuleCtx *ctx, long long ll))         \
    X(const char *, StringPtrLen, (const RedisModuleString *str,           \
                                   size_t *len))                           \
    X(RedisModuleString *, CreateString, (RedisModuleCtx *ctx,             \
                                          const char *ptr, size_t len))    \
    X(void, FreeString, (RedisModuleCtx *ctx, RedisModuleString *str))     \
    X(long long, Milliseconds, (void))                                     \
    X(RedisModuleKey *, OpenKey, (RedisModuleCtx *ctx,                     \
                                  RedisModuleString *keyname, int mode))   \
    X(void, CloseKey, (RedisModuleKey *key))                               \
    X(int, KeyType, (RedisModuleKey *key))                                 \
    X(size_t, ValueLength, (RedisModuleKey *key))                          \
    X(mstime_t, GetExpire, (RedisModuleKey *key))                          \
    X(int, SetAbsExpire, (RedisModuleKey *key, mstime_t expire))           \
    X(int, HashGet, (RedisModuleKey *key, int flags, ...))                 \
    X(int, HashSet, (RedisModuleKey *key, int flags, ...))                 \
    X(char *, StringDMA, (RedisModuleKey *key, size_t *len, int mode))     \
    X(int, StringSet, (RedisModuleKey *key, RedisModuleString *str))       \
    X(int, ZsetAdd, (RedisModuleKey *key, double score,                    \
                     RedisModuleString *ele, int *flagsptr))               \
    X(int, ZsetRem, (RedisModuleKey *key, RedisModuleString *ele,          \
                     int *deleted))                                        \
    X(int, ZsetFirstInScoreRange, (RedisModuleKey *key, double min,        \
                                   double max, int minex, int maxex))      \
    X(RedisModuleString *, ZsetRangeCurrentElement, (RedisModuleKey *key,  \
                                                     double *score))      \
    X(int, ZsetRangeNext, (RedisModuleKey *key))                           \
    X(int, ZsetRangeEndReached, (RedisModuleKey *key))                     \
    X(void, ZsetRangeStop, (RedisModuleKey *key))                          \
    X(int, Replicate, (RedisModuleCtx *ctx, const char *cmdname,           \
                       const char *fmt, ...))                              \
    X(RedisModuleCallReply *, Call, (RedisModuleCtx *ctx,                  \
                                     const char *cmdname, const char *fmt, \
                                     ...))                                 \
    X(int, CallReplyType, (RedisModuleCallReply *reply))                   \
    X(size_t, CallReplyLength, (RedisModuleCallReply *reply))              \
    X(RedisModuleCallReply *, CallReplyArrayElement,                       \
      (RedisModuleCallReply *reply, size_t idx))                           \
    X(const char *, CallReplyStringPtr, (RedisModuleCallReply *reply,      \
                                         size_t *len))                     \
    X(void, FreeCallReply, (RedisModuleCallReply *reply))

/* The entry point Redis looks up with dlsym() in a module it loads. */
int RedisModule_OnLoad(RedisModuleCtx *ctx, RedisModuleString **argv,
                       int argc);

#endif /* REDISMODULE_API_H */
