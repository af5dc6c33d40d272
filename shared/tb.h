/* tb.h -- the public header of libtb, the mod_tbucket limiter core: what
 * the hosts (the Apache module, the LD_PRELOAD shim, the tbucket tool)
 * call, grouped by topic.
 *
 * libtb decides whether a client may spend tokens from one or more shared
 * buckets kept in Redis. It owns the bucket arithmetic (in Lua for Redis
 * and in C for the local fallback, kept identical by shared test vectors),
 * the Redis connections, the circuit breaker and the failure policy. It is
 * C99 + POSIX + hiredis + OpenSSL (TLS to Redis; its headers stay out of
 * this one): no APR, httpd or libconfig header appears here, so every host
 * links the same library. What only the library and its
 * unit tests use lives in the internal header of each layer of shared/:
 * base/tb_base.h (errors, deadlines, SHA-256), algo/tb_algo_int.h (the
 * scripts' C twins), redis/tb_redis_int.h (the transport) and tb_int.h
 * (the decision path: breaker, policy, leases, the script call).
 *
 * Conventions (as in hiredis):
 *  - Functions return TB_OK / TB_ERR, or a pointer that is NULL on error.
 *    Objects carry `err` (a TB_ERR_* kind) and `errstr`; constructors that
 *    cannot return an object write their message into a caller buffer.
 *  - Every tb_x_create has a tb_x_free; tb_x_free(NULL) does nothing.
 *  - Being over the limit is a result (tb_result_t.allowed == 0), not an
 *    error. "Could not ask Redis" is an error path that the failure policy
 *    turns into a result; a decision therefore always fills a result.
 *  - Input structs (tb_options_t, tb_request_t) grow by fields whose zero
 *    value keeps the old meaning: zero them before filling them.
 *  - The core never logs, prints or exits.
 *
 * Units are in the names: _ms milliseconds, _us microseconds, _per_sec per
 * second. Token amounts and rates are doubles because the Redis side is Lua
 * 5.1, whose only number type is an IEEE-754 double: using the same type
 * and the same operation order in C makes the two agree to the last bit.
 */
#ifndef TB_H
#define TB_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ==== Errors ========================================================= */

#define TB_OK 0
#define TB_ERR (-1)

#define TB_ERR_NONE 0
#define TB_ERR_IO 1       /* Socket error, connection refused or reset. */
#define TB_ERR_TIMEOUT 2  /* Connect or command timeout, or pool wait.  */
#define TB_ERR_PROTOCOL 3 /* Unexpected reply shape from Redis.         */
#define TB_ERR_REPLY 4    /* Redis answered with an error reply.        */
#define TB_ERR_ARG 5      /* A bad argument from the caller.            */
#define TB_ERR_OOM 6      /* Allocation failed.                         */
#define TB_ERR_BREAKER 7  /* The breaker is open: Redis was not asked.  */
#define TB_ERR_AUTH 8     /* AUTH or SELECT was refused.                */
#define TB_ERR_TLS 9      /* TLS handshake, certificate check or record
                           * error (the reason is in errstr).          */
#define TB_ERR_KINDS 10

#define TB_ERRSTR_LEN 128

/* Human-readable name of an error kind ("io", "timeout", ...). */
const char *tb_err_name(int err);

/* Name tables: names[] holds the names of an enum's n values in enum
 * order. tb_name_index gives the value named s (ignoring case when nocase
 * is 1), or -1; tb_name_at the name of value i, or "unknown". */
int tb_name_index(const char *const *names, int n, const char *s,
                  int nocase);
const char *tb_name_at(const char *const *names, int n, int i);

/* ==== Time =========================================================== */

/* Monotonic time in microseconds, as redis's monotime. */
typedef int64_t tb_monotime_us;

/* The only reader of CLOCK_MONOTONIC. Tests replace tb_clock_now_us with
 * their own function to drive the breaker and the local bucket without
 * sleeping; set it before creating any object, never concurrently. */
extern tb_monotime_us (*tb_clock_now_us)(void);
tb_monotime_us tb_clock_monotonic_us(void);

/* ==== Parsing configuration values =================================== */

/* Parse a rate: "N/s", "N/m", "N/h" or a bare "N" (per second); N may be
 * fractional ("0.5/s"). Stores tokens per second in *per_sec. Returns
 * TB_ERR (with a message in err) for zero, negative, non-finite, absurdly
 * large (> 1e9/s) or malformed values. */
int tb_parse_rate(const char *s, double *per_sec, char *err, size_t errlen);

/* Parse a duration: a plain decimal and a unit, ms, s, m, h or d ("1.5m",
 * "1d"), rounded up to a whole ms, into *ms, within [min_ms, max_ms];
 * with TB_DURATION_BARE_MS a bare number is ms. Every refusal says:
 * "expected a duration such as 500ms, 30s, 15m, 1h or 1d, from MIN to MAX". */
#define TB_DURATION_BARE_MS 1u
int tb_parse_duration(const char *s, int64_t min_ms, int64_t max_ms,
                      unsigned flags, int64_t *ms, char *err, size_t errlen);

/* The shim's and tool's: the same grammar, bare ms, up to h, 0..24h. */
int tb_parse_duration_ms(const char *s, int64_t *ms, char *err,
                         size_t errlen);

/* ms in its largest whole unit ("30d", "1500ms"); length as snprintf. */
size_t tb_format_duration(int64_t ms, char *buf, size_t len);

/* Parse a whole number in [min, max] with nothing trailing. */
int tb_parse_int(const char *s, int64_t min, int64_t max, int64_t *out,
                 char *err, size_t errlen);

/* Numbers in the C locale ('.' for the decimal point) whatever
 * LC_NUMERIC the host has set: strtod(), and "%.17g" into buf (the
 * length written, at most len - 1; the digits Lua's tonumber() reads
 * back as v). Thread-safe; the host's locale is left as it is. */
double tb_strtod_c(const char *s, char **end);
size_t tb_fmt_double(char *buf, size_t len, double v);

/* ==== Limits and the token bucket ==================================== */

/* The most buckets one decision may take: a main bucket, routes and
 * rules (a host's own bounds are lower: the module allows 7 routes and
 * 8 rules). Bit i of a result's masks is bucket i. */
#define TB_MAX_BUCKETS 16

/* The longest ban a rule may set (30 days, in ms). */
#define TB_MAX_BAN_MS 2592000000LL

/* Largest capacity and cost accepted anywhere (tokens). Keeps every
 * intermediate value of the arithmetic exact in a double. */
#define TB_MAX_CAPACITY 1000000000.0

/* The longest time to fill a bucket from empty, capacity / rate, in ms
 * (about 31,700 years). Past it the scripts' TTLs would print in exponent
 * form, which PEXPIRE refuses. */
#define TB_MAX_FILL_MS 1e15

/* A limit: capacity (the largest burst, tokens) and refill rate. */
typedef struct tb_limit {
    double capacity;     /* Tokens, >= 1.                            */
    double rate_per_sec; /* Tokens per second, > 0.                   */
} tb_limit_t;

/* Check a limit: capacity 1..TB_MAX_CAPACITY, rate 1e-6..1e9 per second,
 * and capacity / rate within TB_MAX_FILL_MS. TB_OK, or TB_ERR with a
 * message in err (may be NULL). Hosts call it at configuration time; the
 * core calls it again on every decision. */
int tb_limit_check(const tb_limit_t *l, char *err, size_t errlen);

/* Time-to-live of a bucket key in ms: ceil(capacity / rate * 1000) + 1000,
 * the time to refill from empty plus a second of slack. */
int64_t tb_bucket_ttl_ms(const tb_limit_t *lim);

/* The state of one token bucket, as stored in the Redis hash (fields
 * `tokens` and `ts`). exists == 0 means "no key": a full bucket. */
typedef struct tb_bucket {
    double tokens;  /* Tokens in the bucket at ts (fractional); below 0,
                     * down to -capacity, the debt a settlement left
                     * (tb_client_settle), which refills first.     */
    int64_t ts_ms;  /* Clock of the last refill, in milliseconds.      */
    int exists;
} tb_bucket_t;

/* The outcome for one or more buckets. */
typedef struct tb_verdict {
    int allowed;         /* 1 when every bucket had enough tokens.    */
    int64_t remaining;   /* Smallest floor(tokens) after the decision.*/
    int64_t retry_ms;    /* 0 when allowed; the largest wait when not;
                          * -1 when some cost exceeds its capacity, so
                          * waiting can never help.                   */
    int binding;         /* Index of the bucket that bounds the answer
                          * (the refusing one, or the one with the
                          * fewest tokens left).                      */
} tb_verdict_t;

/* The pure decision over n buckets (1 <= n <= TB_MAX_BUCKETS), the C twin
 * of shared/algo/tb_bucket.lua: lazy refill to now_ms (elapsed clamped at
 * 0, refill capped at capacity), then all-or-nothing deduction of cost[i]
 * from bucket i. in[] is read, out[] receives the new states (out may
 * alias in); on refusal out[] holds the refilled but undeducted states and
 * the caller may skip writing them. No clock, I/O or allocation. Returns
 * TB_ERR only for bad arguments (n out of range, capacity < 1, rate <= 0,
 * negative cost). The tool uses it to show a stored bucket refilled to
 * now. */
int tb_bucket_take(const tb_bucket_t *in, const tb_limit_t *lim,
                   const double *cost, int n, int64_t now_ms,
                   tb_bucket_t *out, tb_verdict_t *v);

/* ==== Algorithms ===================================================== */

/* One limit CAPACITY RATE keeps one meaning whatever the algorithm: the
 * long-run rate is RATE and the largest burst is CAPACITY.
 *  - token-bucket: lazy refill at RATE up to CAPACITY.
 *  - gcra: emission interval 1000/RATE ms, burst tolerance CAPACITY
 *    requests (CAPACITY 1 is strict spacing). State: one number.
 *  - fixed-window: CAPACITY per window of CAPACITY*1000/RATE ms aligned to
 *    the epoch; up to 2*CAPACITY can pass around a boundary.
 *  - sliding-window: the same window length, estimated from the current
 *    and previous window counts (previous weighted by its overlap): an
 *    approximation, O(1).
 *  - sliding-log: exact, one sorted-set member per admitted unit of cost:
 *    memory and time grow with CAPACITY (at most TB_SLOG_MAX_CAPACITY).
 * The keys of the algorithms other than the token bucket get a suffix
 * (tb_algo_key_suffix) so that switching the algorithm of a live limit
 * never reads another algorithm's state. The local failure policy decides
 * with the token bucket whatever the algorithm. */
typedef enum {
    TB_ALGO_TOKEN_BUCKET = 0,
    TB_ALGO_GCRA = 1,
    TB_ALGO_SLIDING_WINDOW = 2,
    TB_ALGO_FIXED_WINDOW = 3,
    TB_ALGO_SLIDING_LOG = 4
} tb_algo_t;
#define TB_ALGO_COUNT 5

/* Largest capacity the sliding log accepts (members per key). */
#define TB_SLOG_MAX_CAPACITY 100000.0

/* Parse "token-bucket" | "gcra" | "sliding-window" | "fixed-window" |
 * "sliding-log" (the TBucketAlgorithm values). TB_ERR on anything else. */
int tb_algo_parse(const char *s, tb_algo_t *a);
/* The name tb_algo_parse() accepts, or "unknown". */
const char *tb_algo_name(tb_algo_t a);
/* The names, in tb_algo_t order. */
extern const char *const tb_algo_names[TB_ALGO_COUNT];
/* The Redis key suffix of an algorithm ("" for the token bucket). */
const char *tb_algo_key_suffix(tb_algo_t a);

/* ==== Keys =========================================================== */

/* A client key longer than TB_KEY_RAW_MAX, or holding a byte outside
 * 0x21..0x7e, a brace, or starting with '#', is replaced by '#' + 32 hex
 * digits of its SHA-256. Raw keys can never start with '#', so no client
 * can name the hashed key of another. */
#define TB_KEY_RAW_MAX 128
#define TB_PREFIX_MAX 64
#define TB_NAME_MAX 64
/* Room for prefix + "{" + key + " s63" + "}:route:" + name + an
 * algorithm suffix + NUL. */
#define TB_KEY_BUF (TB_PREFIX_MAX + TB_KEY_RAW_MAX + TB_NAME_MAX + 24)

/* The most sub-buckets (shards) one client key may be split into. */
#define TB_MAX_SHARDS 64

/* The key of a client known by its address, as text (what Apache's
 * r->useragent_ip or inet_ntop gives): IPv4 as it is; an IPv4-mapped IPv6
 * address as the IPv4 address it carries; IPv6 cut to its first v6_bits
 * bits (1..128) as "2001:db8:1:2::/64", since one subscriber holds a
 * whole /64 (often a /56) and could otherwise take a new bucket with each
 * address; 128 keeps the address ("2001:db8::7"). Anything else (a zone
 * id, not an address) is copied as it is. Writes at most len bytes with
 * the NUL (TB_IP_KEY_LEN is always enough for an address); returns the
 * length, or 0 if it does not fit. */
#define TB_IP_KEY_LEN 52
#define TB_DEFAULT_IPV6_BITS 64
size_t tb_ip_key(const char *ip, int v6_bits, char *out, size_t len);

/* tb_ip_key() of an address in binary: family AF_INET (4 bytes at addr)
 * or AF_INET6 (16 bytes), as a socket address holds it, so that a host
 * with the bytes (the shim's accept) converts once. v6_bits out of
 * 1..128 keeps the whole address. 0 for another family. */
size_t tb_ip_key_addr(int family, const void *addr, int v6_bits, char *out,
                      size_t len);

/* Write the sanitised form of an untrusted client key (len bytes, may
 * hold NUL) into out (at least TB_KEY_RAW_MAX + 1 bytes). Returns its
 * length. An empty key stays empty; callers substitute the client IP. A
 * key that needs hashing when no digest can be made (out of memory)
 * gives 0 and an empty out too. */
size_t tb_key_sanitize(const char *key, size_t len, char *out);

/* The key as operators see it, on the status page, in tbucket top and in
 * the refusal log line alike: its sanitised form, after "ip:" for a
 * client keyed by its address (ip != 0), into out (TB_TOPK_KEY_LEN
 * bytes). A key that is no address but starts with "ip:" or "key:" is
 * shown after "key:" ("key:ip:10.0.0.1"), so the two kinds never look
 * alike. Returns its length. */
size_t tb_key_show(const char *key, size_t len, int ip, char *out);

/* Build "<prefix>{<sanitised key>}" or, with a route name,
 * "<prefix>{<sanitised key>}:route:<name>" into out (TB_KEY_BUF bytes).
 * Returns the length, or 0 on a bad prefix or name. */
size_t tb_key_build(const char *prefix, const char *key, size_t len,
                    const char *route, char *out);

/* tb_key_build() for shard `shard` (0 .. TB_MAX_SHARDS - 1) of a client
 * key: "<prefix>{<sanitised key> s<shard>}" (":route:<name>" after it as
 * usual), so each shard has its own hash tag and Cluster slot. A raw
 * client key never holds a space (tb_key_sanitize hashes one that does),
 * so no client key can name a shard of another, or a shard at all. A
 * negative shard is exactly tb_key_build(). Returns the length, or 0 on
 * a bad prefix, name or shard (or a key tb_key_sanitize could not
 * hash). */
size_t tb_key_build_shard(const char *prefix, const char *key, size_t len,
                          int shard, const char *route, char *out);

/* The bucket of rule `rule` (tb_name_valid) for the client key `key`:
 * "<prefix>{<sanitised key>}:rule:<rule>" into out (TB_KEY_BUF bytes).
 * Returns the length, or 0 on a bad prefix or name. */
size_t tb_key_build_rule(const char *prefix, const char *key, size_t len,
                         const char *rule, char *out);

/* The Redis Cluster hash slot of a key, 0..16383: CRC16 (XMODEM) of the
 * hash tag -- the bytes between the first '{' and the first '}' after
 * it, when there are any -- else of the whole key, modulo 16384, exactly
 * as Redis's keyHashSlot. Every key tb_key_build() makes for one client
 * key has the same slot. */
unsigned tb_key_slot(const char *key, size_t len);

/* Validate a key prefix (1..TB_PREFIX_MAX printable bytes, no braces or
 * spaces) or a route name ([A-Za-z0-9_.-], 1..TB_NAME_MAX). These are
 * predicates: they return 1 when valid and 0 when not (not TB_OK). */
int tb_prefix_valid(const char *prefix);
int tb_name_valid(const char *name);

/* ==== Redis addresses ================================================ */

/* The URL every host uses when none is configured. */
#define TB_DEFAULT_URL "redis://127.0.0.1:6379"

/* What a URL names: one Redis, a primary found through Sentinel, or a
 * Redis Cluster. */
#define TB_REDIS_SINGLE 0   /* redis://, rediss:// or unix:             */
#define TB_REDIS_SENTINEL 1 /* redis-sentinel://h:p[,h:p...]/MASTER     */
#define TB_REDIS_CLUSTER 2  /* redis-cluster://h:p[,h:p...]             */

/* The most sentinels or cluster seed nodes one URL may list. */
#define TB_MAX_SEEDS 8
#define TB_MASTER_NAME_MAX 128

/* A host and port: a sentinel or a cluster seed. */
typedef struct tb_redis_endpoint {
    char host[256];
    int port;
} tb_redis_endpoint_t;

typedef struct tb_redis_addr {
    char host[256];      /* Empty for a unix socket.                  */
    int port;            /* Default 6379.                             */
    char path[108];      /* Unix socket path, or empty.               */
    char user[128];      /* ACL user, or empty (AUTH password only).  */
    char password[256];  /* Empty: no AUTH.                           */
    int db;              /* SELECT when > 0.                          */
    /* Zero for redis:// and unix: URLs. For the other kinds host and
     * port are the first seed; user, password and db apply to the data
     * nodes (sentinels are asked without AUTH). */
    int kind;            /* TB_REDIS_*.                               */
    int nseeds;          /* Entries used in seeds (0 for SINGLE).     */
    tb_redis_endpoint_t seeds[TB_MAX_SEEDS]; /* Sentinels (default
                          * port 26379) or cluster seeds (6379).      */
    char master[TB_MASTER_NAME_MAX]; /* Sentinel's master name.       */
    int tls;             /* 1: every connection made for this address
                          * speaks TLS (data nodes, sentinels and
                          * cluster nodes alike).                     */
} tb_redis_addr_t;

/* Parse "redis://[user:password@]host[:port][/db]" (IPv6 hosts in
 * brackets, %XX escapes in user and password), "unix:/path[?db=N]",
 * "redis-sentinel://[user:password@]host[:port][,host[:port]...]/MASTER[/db]"
 * or "redis-cluster://[user:password@]host[:port][,host[:port]...]"
 * (Cluster has database 0 only), at most TB_MAX_SEEDS endpoints.
 * "rediss://" is redis:// over TLS; "?tls=on" at the end of a redis://,
 * redis-sentinel:// or redis-cluster:// URL turns TLS on too ("?tls=off"
 * is the default). A unix socket never uses TLS.
 * On error returns TB_ERR with a message naming the bad part. */
int tb_url_parse(const char *url, tb_redis_addr_t *addr, char *err,
                 size_t errlen);

/* Write the URL with any password replaced by "***": for logs and the
 * status page. */
void tb_url_redact(const tb_redis_addr_t *addr, char *out, size_t outlen);

/* ==== Counters ======================================================= */

/* Latency histogram upper bounds in microseconds; the last is +Inf. */
#define TB_LAT_BUCKETS 12
extern const int64_t tb_lat_bounds_us[TB_LAT_BUCKETS - 1];

/* Counters, updated with atomic adds so that the struct may live in
 * memory shared by several processes (the module puts it in shared
 * memory). Plain data: zero it to initialise. */
typedef struct tb_stats {
    uint64_t decisions;         /* Every decision asked of a client.  */
    uint64_t allowed;
    uint64_t rejected;
    uint64_t redis_calls;       /* Script calls sent to Redis.        */
    uint64_t batches;           /* Writes that carried commands: one
                                 * per batch, so redis_calls / batches
                                 * is the mean batch size.            */
    uint64_t redis_errors;      /* Failed calls, all kinds.           */
    uint64_t errors[TB_ERR_KINDS]; /* Failed calls by TB_ERR_* kind.  */
    uint64_t noscript_reloads;  /* NOSCRIPT answered, retried by EVAL.*/
    uint64_t module_calls;      /* Of redis_calls, those made to the
                                 * Redis module (tbucket.*) instead of
                                 * a script.                          */
    uint64_t connects;          /* Connections opened.                */
    uint64_t breaker_opens;
    uint64_t breaker_closes;
    uint64_t breaker_skips;     /* Decisions made without asking.     */
    uint64_t fallback_open;
    uint64_t fallback_closed;
    uint64_t fallback_local;
    uint64_t lat_count[TB_LAT_BUCKETS];
    uint64_t lat_sum_us;
} tb_stats_t;

/* Atomic add and read of one counter, for hosts that keep counters of
 * their own beside the core's in shared memory. */
void tb_stats_add(uint64_t *counter, uint64_t n);
uint64_t tb_stats_get(const uint64_t *counter);

/* The tables in caller memory (shared memory, for the hosts): the lock,
 * the local buckets and leases, the in-flight table, the heavy hitters. */
#include "tb_tables.h"

/* ==== The client: options ============================================ */

typedef enum {
    TB_POLICY_OPEN = 0,   /* Allow when Redis cannot decide.            */
    TB_POLICY_CLOSED = 1, /* Reject when Redis cannot decide.           */
    TB_POLICY_LOCAL = 2   /* Decide on a local bucket of limit/replicas.*/
} tb_policy_t;

#define TB_POLICY_COUNT 3
/* The names, in tb_policy_t order. */
extern const char *const tb_policy_names[TB_POLICY_COUNT];

/* Parse "open" | "closed" | "local". */
int tb_policy_parse(const char *s, tb_policy_t *p);
const char *tb_policy_name(tb_policy_t p);

/* TLS to Redis, for an address with TLS on (rediss://, ?tls=on): the
 * settings of every connection the client makes for it. The zero value is
 * the safe one: the system's CA store, no client certificate, each
 * connection's own host as the server name, verification on. Only
 * tb_tls_create() reads the files. */
typedef struct tb_tls_options {
    const char *ca_file;     /* PEM CA certificates the server's must chain
                              * to, or NULL: the system's CA store.     */
    const char *cert_file;   /* PEM client certificate (and chain), for a
                              * server that asks for one, or NULL.      */
    const char *key_file;    /* Its PEM private key, unencrypted; needed
                              * with cert_file and only with it.        */
    const char *server_name; /* The name (or IP address) the server's
                              * certificate must carry, also sent as SNI;
                              * NULL: the host each connection goes to
                              * (the URL's, a sentinel's or a cluster
                              * node's).                                */
    int no_verify;           /* 1: accept any certificate (tls_verify
                              * off): encryption without authentication,
                              * for tests. Default 0: verify.           */
} tb_tls_options_t;

/* A TLS context: the CA, certificate and key read once, shared by every
 * connection of the clients given it. Thread-safe once made, and a forked
 * child may go on using its parent's (the module makes it in the parent,
 * as root, so key files may stay readable by root only). */
typedef struct tb_tls tb_tls_t;

/* Read and check the files of o: each must be readable and parse, the key
 * must be unencrypted and match the certificate, and cert_file and
 * key_file come together. Returns NULL with a message naming the setting
 * and the file in err, e.g. "tls_ca '/etc/ca.pem': No such file or
 * directory". */
tb_tls_t *tb_tls_create(const tb_tls_options_t *o, char *err,
                        size_t errlen);
void tb_tls_free(tb_tls_t *t);

/* How decisions are asked of Redis: the Lua scripts (EVALSHA, which
 * any Redis runs, managed ones included), or the commands of the Redis
 * module tbucket_redis.so (tbucket.bucket, ...: the same keys, state and
 * replies, for a fraction of Redis's CPU). auto asks each server once
 * per connection (COMMAND INFO) and uses the module where it is loaded;
 * module requires it, and a server without it is a failed connection,
 * answered by the failure policy. */
typedef enum {
    TB_ENGINE_AUTO = 0,
    TB_ENGINE_SCRIPT = 1,
    TB_ENGINE_MODULE = 2
} tb_engine_t;
#define TB_ENGINE_COUNT 3
/* "auto", "script", "module", in tb_engine_t order. */
extern const char *const tb_engine_names[TB_ENGINE_COUNT];

/* Client options: a small value struct on the caller's stack. Call
 * tb_options_init() first for the defaults. */
typedef struct tb_options {
    const char *url;            /* Default TB_DEFAULT_URL.          */
    int timeout_ms;             /* Command timeout, default 50.     */
    int connect_timeout_ms;     /* Default: timeout_ms. Covers the
                                 * host name's lookup, the connect
                                 * and the TLS handshake together.  */
    int pool_size;              /* Connections per process, def. 2. */
    int breaker_threshold;      /* Default 5.                       */
    int64_t breaker_cooldown_ms;/* Default 10000.                   */
    tb_policy_t policy;         /* Default TB_POLICY_OPEN.          */
    int replicas;               /* For TB_POLICY_LOCAL, default 1.  */
    size_t local_entries;       /* Own local table size, def. 4096. */
    tb_local_t *local;          /* Caller's table (not owned), or
                                 * NULL for one of our own.         */
    tb_stats_t *stats;          /* Caller's counters (not owned), or
                                 * NULL for our own.                */
    int closed_retry_ms;        /* Retry-after when failing closed
                                 * and the breaker gives no better
                                 * figure; default 1000.            */
    int verify_fd;              /* Before each use, check that the
                                 * connection's fd is still the
                                 * socket we opened (same device and
                                 * inode; one fstat), for hosts that
                                 * close or reuse fds under us, as
                                 * daemons do; default 0.           */
    tb_tls_options_t tls;       /* TLS settings; only an address with
                                 * TLS on may set them (or tls_ctx). */
    tb_tls_t *tls_ctx;          /* The caller's TLS context (not
                                 * owned; it must outlive the
                                 * client), or NULL: the client makes
                                 * one from tls when the URL asks for
                                 * TLS.                             */
    tb_lease_t *leases;         /* The host's lease table (memory its
                                 * processes share; not owned), or
                                 * NULL: requests' leases take the
                                 * raw form. A table drained since
                                 * the client was made (the host is
                                 * stopping) is no longer used.     */
    int lease_owner;            /* The host's tag for where the
                                 * buckets live, kept with each lease
                                 * and handed back by tb_lease_drain.*/
    tb_engine_t engine;         /* Default TB_ENGINE_AUTO.          */
    int cluster_keys;           /* The URL (a coalescer's socket)
                                 * leads to a Redis Cluster: a call
                                 * whose keys lie in several slots is
                                 * split per slot, as for a
                                 * redis-cluster:// URL; default 0.  */
} tb_options_t;

void tb_options_init(tb_options_t *o);

/* ==== The client: one decision ======================================= */

/* What a take's bucket is keyed by, and so its Redis key:
 *  - TB_TAKE_MAIN: the request's key, "<prefix>{key}" (no name, no key);
 *  - TB_TAKE_NAMED: the request's key, a bucket of its own name,
 *    "<prefix>{key}:route:<name>" (a route: the module's named limit
 *    without key=);
 *  - TB_TAKE_KEYED: a client key of its own, "<prefix>{<key>}:rule:<name>"
 *    (the module's named limit with key=, TBucketRule). */
typedef enum {
    TB_TAKE_MAIN = 0,
    TB_TAKE_NAMED,
    TB_TAKE_KEYED
} tb_take_kind_t;

/* One bucket of a request: a limit, the tokens to take, its kind and
 * name (tb_name_valid; NULL for TB_TAKE_MAIN).
 *
 * A keyed bucket has a client key of its own: key (key_len bytes,
 * untrusted, sanitised as the request's key is) and the name make it
 * "<prefix>{<key>}:rule:<name>", so a request may count against several
 * clients at once (its address, the user it names, everyone), all or
 * nothing. Only the token bucket takes keyed buckets, never with shards.
 * Such a bucket may also be:
 *  - held (hold 1): the request needs cost tokens in it but takes none;
 *    the host charges them later with tb_client_charge(), once it knows
 *    the request should count (a failed login);
 *  - banning (ban_ms > 0): when it refuses, its key is banned by its rule
 *    for ban_ms, and until then every decision that has the bucket is
 *    refused at once, touching nothing. The ban lives in the bucket's
 *    hash (field `ban`, Redis's clock in ms), so every host sees it, and
 *    in an index (tb_client_bans). Bans are checked for every rule
 *    bucket, banning or not, so a ban made by hand holds too. */
typedef struct tb_take {
    tb_limit_t limit;
    double cost;
    tb_take_kind_t kind;
    const char *name;  /* NULL for TB_TAKE_MAIN, else tb_name_valid. */
    const char *key;   /* TB_TAKE_KEYED's own key, else NULL.        */
    const char *prefix; /* A rule's: its key prefix, NULL for the
                        * request's (tb_prefix_valid).                */
    size_t key_len;
    int hold;          /* 1: must hold cost, charged later.          */
    int64_t ban_ms;    /* 0, or 1 .. TB_MAX_BAN_MS.                  */
} tb_take_t;

/* The most tokens one lease may ask for, and a lease's default ttl. */
#define TB_MAX_LEASE TB_MAX_CAPACITY
#define TB_LEASE_TTL_MS 1000

/* What to decide. Zero it, then fill what applies: the zero value of each
 * optional field is the plain case (the token bucket, the whole key, no
 * lease, Redis's own clock). Nothing here is kept after the call. */
typedef struct tb_request {
    const char *prefix;     /* Key prefix, e.g. "rl:" (tb_prefix_valid).*/
    const char *key;        /* The client key: untrusted, key_len bytes,
                             * may hold NUL; sanitised by the core.     */
    size_t key_len;
    const tb_take_t *takes; /* The buckets, all decided in one script
                             * call, all or nothing: takes[0] is the
                             * main bucket, routes follow.             */
    int ntakes;             /* 1 .. TB_MAX_BUCKETS; 0 with concurrency. */
    tb_algo_t algo;         /* The script of every bucket. Sliding log:
                             * whole costs, capacity at most
                             * TB_SLOG_MAX_CAPACITY.                    */
    int shards;             /* 0 or 1: the key's own buckets. K > 1
                             * (at most TB_MAX_SHARDS): the key is split
                             * into K sub-buckets of capacity/K and
                             * rate/K each, and this decision takes from
                             * sub-bucket `shard` (0 .. K-1); the core
                             * divides the limits.                     */
    int shard;
    double lease;           /* 0: no lease. Else, with a client that
                             * has a lease table (tb_options_t.leases):
                             * the most tokens one lease takes
                             * (TBucketLease N). The client pays the
                             * request from the key's lease when it
                             * holds the cost (res->source
                             * TB_SRC_LEASE, no Redis call), else takes
                             * the next lease, sized by the key's
                             * traffic, in the call that decides, and
                             * keeps it in the table. Token bucket, one
                             * main take, whole cost and lease; other
                             * requests are decided without one.
                             * Without a lease table, the raw form: take
                             * up to `lease` tokens in this call
                             * (res->granted), cost <= lease <=
                             * TB_MAX_LEASE, and return lease_back.    */
    double lease_back;      /* Raw form only: unspent tokens of the
                             * host's expired lease of the same bucket
                             * (tb_lease_plan), returned in the same
                             * call, up to the capacity, before the
                             * decision; written even when the request
                             * is refused. 0 .. TB_MAX_CAPACITY.        */
    int64_t lease_ttl_ms;   /* How long a lease's tokens may be spent,
                             * 1 .. 86400000; 0: TB_LEASE_TTL_MS.      */
    const int64_t *now_ms;  /* Tests only: Redis's clock replaced by
                             * *now_ms. NULL in production.             */
    /* Concurrency (see "Concurrency limits" below). */
    int concurrency;        /* 0: none. N (1 .. TB_MAX_CONCURRENCY): at
                             * most N requests of the key in flight,
                             * decided with the takes in the same call;
                             * ntakes may then be 0. Not with shards.  */
    int64_t concurrency_ttl_ms; /* A slot's life if it is never released,
                             * 1 .. TB_MAX_CONCURRENCY_TTL_MS; 0: the
                             * default, TB_CONCURRENCY_TTL_MS.          */
} tb_request_t;

typedef enum {
    TB_SRC_REDIS = 0,
    TB_SRC_OPEN = 1,
    TB_SRC_CLOSED = 2,
    TB_SRC_LOCAL = 3,
    TB_SRC_ERROR = 4,  /* The arguments were refused (err TB_ERR_ARG):
                        * nothing was decided; allowed is 0. */
    TB_SRC_LEASE = 5   /* Paid from the host's lease: no Redis call. */
} tb_source_t;
const char *tb_source_name(tb_source_t s);

/* Which limit refused a request. */
typedef enum {
    TB_LIMIT_NONE = 0,        /* Allowed.                                */
    TB_LIMIT_RATE = 1,        /* A bucket (binding says which), or the
                               * closed policy when the request had one. */
    TB_LIMIT_CONCURRENCY = 2  /* The key's slots were all taken, or the
                               * closed policy refused a request that had
                               * only a concurrency limit.               */
} tb_limit_kind_t;

/* Where a request's concurrency slot is held. */
typedef enum {
    TB_SLOT_NONE = 0,   /* No slot: nothing to release.                  */
    TB_SLOT_REDIS = 1,  /* A member of the key's slot set in Redis.      */
    TB_SLOT_LOCAL = 2   /* A count in the local policy's table.          */
} tb_slot_kind_t;

#define TB_SLOT_ID_LEN 48

/* A slot taken by a decision: a small value the host keeps until the
 * request ends and then hands to tb_client_release(), once. */
typedef struct tb_slot {
    tb_slot_kind_t kind;
    int64_t window;           /* TB_SLOT_LOCAL: the count it is in.     */
    char id[TB_SLOT_ID_LEN];  /* TB_SLOT_REDIS: the set member, unique
                               * across hosts, processes and requests. */
} tb_slot_t;

typedef struct tb_result {
    int allowed;
    int64_t remaining;   /* Tokens left in the binding bucket.         */
    int64_t retry_ms;    /* 0 if allowed, -1 if cost > capacity.       */
    double limit;        /* Capacity of the binding bucket (of the
                          * shard, for a split key; this server's
                          * share, capacity/replicas, when the local
                          * policy decided).                           */
    int binding;         /* Index into the request's takes.            */
    tb_source_t source;
    int err;             /* TB_ERR_* of the Redis call, or TB_ERR_NONE.*/
    int64_t redis_us;    /* Time spent on Redis, 0 if not asked.       */
    int breaker_change;  /* +1 when this decision opened the breaker,
                          * -1 when it closed it, else 0: hosts log a
                          * transition once, not once per request.     */
    int64_t granted;     /* Lease requests: the tokens taken from the
                          * shared bucket, cost included (0 when
                          * refused, and whenever the failure policy
                          * answered: no lease is made from a guess).
                          * res->remaining is what the bucket keeps
                          * after the grant.                           */
    double lease_returned; /* With a lease table: unspent tokens of
                          * the host's leases this decision gave back
                          * to Redis (an expired lease's, or a grant
                          * the drained table would not keep).        */
    /* Which limit refused; and for concurrency requests the slot. */
    tb_limit_kind_t refused_by;
    int64_t in_flight;   /* Concurrency requests: slots of the key held
                          * after the decision (on this server for the
                          * local policy; 0 when open or closed
                          * answered). Refused by concurrency: limit is
                          * N, retry_ms TB_CONCURRENCY_RETRY_MS.  With
                          * no takes, remaining is N - in_flight.     */
    tb_slot_t slot;      /* The slot taken, kind TB_SLOT_NONE if none. */
    /* Rule buckets (tb_take_t.key): bit i for takes[i]. */
    unsigned banned;     /* Keys under a ban, which refused the request
                          * (binding the longest, retry_ms its time
                          * left). Nothing was charged or written.     */
    unsigned bans_set;   /* Keys this decision banned (retry_ms the
                          * longest ban when one was set).            */
} tb_result_t;

typedef struct tb_client {
    int err;
    char errstr[TB_ERRSTR_LEN];
    /* The rest is private to tb_client.c. */
    struct tb_client_priv *priv;
} tb_client_t;

/* Create a client. Parses the URL and validates options, and with TLS
 * reads its files (unless tls_ctx is given); does not connect (the first
 * decision does, so a server can start while Redis is down). Redis
 * sockets are close-on-exec and written with send(MSG_NOSIGNAL), so a
 * dead Redis cannot raise SIGPIPE.
 *
 * Returns NULL and a message in err on bad options. Thread-safe once
 * created: any number of threads may make decisions at once. */
tb_client_t *tb_client_create(const tb_options_t *o, char *err,
                              size_t errlen);
void tb_client_free(tb_client_t *c);

/* Decide *req in one Redis script call, or by the failure policy when
 * Redis cannot answer. Always fills *res. Returns TB_OK when Redis
 * decided and TB_ERR when the policy did or the request was refused as
 * malformed (res->source and res->err say which). */
int tb_client_run(tb_client_t *c, const tb_request_t *req, tb_result_t *res);

/* The plain case of tb_client_run(): n token buckets of the client key
 * `key` (len bytes) under prefix. */
int tb_client_decide(tb_client_t *c, const char *prefix, const char *key,
                     size_t len, const tb_take_t *takes, int n,
                     tb_result_t *res);

/* Call in a forked child before its first decision: drops (closes without
 * a word to Redis) every connection inherited from the parent and resets
 * the locks. Safe to call from a pthread_atfork child handler. */
void tb_client_after_fork(tb_client_t *c);

/* ==== The client: settling real costs, giving lease tokens back ====== */

/* Settle what a request allowed by tb_client_run() really cost. req is
 * the request that decision used, unchanged (the same key, shard, limits
 * and algorithm, so the same buckets), each takes[i].cost being what
 * bucket i was charged; cost is the real cost, 0 .. TB_MAX_CAPACITY.
 * Each bucket is charged cost - takes[i].cost more (taken when positive,
 * given back when negative) in one script call: a bucket never holds more
 * than its capacity and may go into debt down to -capacity, which later
 * decisions refuse with a retry_ms that covers it; its key's TTL covers
 * the refill from the debt. Token bucket and GCRA only: the window
 * algorithms keep what they charged (TB_ERR_ARG). No lease is taken or
 * given back (req->lease and lease_back are ignored).
 *
 * TB_OK when Redis settled, or when every difference is 0 and nothing
 * was sent (res->redis_us 0, remaining -1). res->allowed is then 0 when a
 * bucket is left in debt, res->retry_ms the time until none is, and
 * res->remaining the smallest number of whole tokens left (0 in debt),
 * res->binding the most indebted or tightest bucket. TB_ERR when nothing
 * was settled: res->source is TB_SRC_ERROR and res->err says why (the
 * arguments, the breaker, Redis). No failure policy applies; a failed
 * call counts toward the breaker as a decision's would. Thread-safe. */
int tb_client_settle(tb_client_t *c, const tb_request_t *req, double cost,
                     tb_result_t *res);

/* Give tokens back to the token bucket at the full Redis key rkey (as
 * tb_lease_drain hands them: info->key), of limit lim, up to its
 * capacity, in one script call: unspent lease tokens of a host that
 * stops. TB_OK, or TB_ERR with res as for tb_client_settle(). */
int tb_client_give_back(tb_client_t *c, const char *rkey,
                        const tb_limit_t *lim, double tokens,
                        tb_result_t *res);

/* Bans: their index, and the tools' list, ban and unban. */
#include "tb_bans.h"

/* ==== Concurrency limits ============================================= */

/* At most N requests of one client key in flight at once, across every
 * host sharing the Redis (tb_request_t.concurrency). The slots are a
 * sorted set "<prefix>{<key>}:conc" beside the key's buckets (the same
 * hash tag, so the same Cluster slot): members are slot ids, scores the
 * slot's expiry in ms of Redis's clock. The decision prunes expired
 * slots and takes one in the same script call as the buckets, all or
 * nothing: a request refused by either kind of limit takes nothing from
 * the other. A slot whose release never comes (the process died) is
 * pruned at its expiry, concurrency_ttl_ms after it was taken; so is one
 * whose request outlives the ttl.
 *
 * When Redis cannot decide, `open` allows without a slot, `closed`
 * refuses, and `local` counts the key's slots of this server in the local
 * table (tb_options_t.local, the same one as its buckets) against
 * ceil(N / replicas). A local slot is counted for between ttl/2 and ttl:
 * the count is kept per half-ttl window, this one and the one before, so
 * the slot of a process that died is forgotten within ttl. */

#define TB_MAX_CONCURRENCY 1000000
#define TB_CONCURRENCY_TTL_MS 60000       /* Default slot life.       */
#define TB_MAX_CONCURRENCY_TTL_MS 86400000
/* The wait a full slot set answers with (ms). A constant: no slot says
 * when its request will end, and a slot's age says nothing of how much
 * of it is left. The scripts' CONC_WAIT (shared/algo/tb_prelude.lua). */
#define TB_CONCURRENCY_RETRY_MS 1000

/* Release the slot a decision on *req took (res->slot), once, when the
 * request ends: ZREM from the slot set for TB_SLOT_REDIS (one command,
 * nothing else), a decrement of the local count for TB_SLOT_LOCAL,
 * nothing for TB_SLOT_NONE. Only req's prefix, key, key_len and
 * concurrency_ttl_ms are read. TB_OK when released (or nothing was held);
 * TB_ERR when Redis could not be told, with c->err and c->errstr: the
 * slot then lasts until its expiry. An open breaker is not tried (err
 * TB_ERR_BREAKER). Releases neither count as decisions nor move the
 * breaker. Thread-safe. */
int tb_client_release(tb_client_t *c, const tb_request_t *req,
                      const tb_slot_t *slot);

/* ==== The client: tools and metrics ================================== */

/* Ask Redis for a token bucket's stored state (for tools): tokens, ts and
 * the key's TTL in ms (-2 missing, -1 no TTL). */
int tb_client_inspect(tb_client_t *c, const char *rkey, tb_bucket_t *b,
                      int64_t *ttl_ms);
/* Delete a bucket key; returns TB_OK. */
int tb_client_reset(tb_client_t *c, const char *rkey);

typedef enum {
    TB_BREAKER_CLOSED = 0,
    TB_BREAKER_OPEN = 1,
    TB_BREAKER_HALF_OPEN = 2
} tb_breaker_state_t;
const char *tb_breaker_state_name(tb_breaker_state_t s);

tb_breaker_state_t tb_client_breaker_state(tb_client_t *c);
const tb_stats_t *tb_client_stats(tb_client_t *c);
void tb_client_pool_usage(tb_client_t *c, int *size, int *open,
                          int *in_use);

/* Which engine the client's connections use now. A forced engine
 * (script, module) is itself. Under auto, as far as connections have
 * been opened: TB_ENGINE_MODULE or TB_ENGINE_SCRIPT, or TB_ENGINE_AUTO
 * while none has said, and for a cluster whose nodes differ (*mixed is
 * then 1). */
tb_engine_t tb_client_engine(tb_client_t *c, int *mixed);

/* 1 when the client's last call to Redis failed or its breaker is open:
 * whatever engine its connections last used, none answers now. */
int tb_client_failing(tb_client_t *c);

#ifdef __cplusplus
}
#endif

/* Known clients: signed tokens and address marks. */
#include "tb_known.h"

/* The coalescer: a host's decisions to Redis in pipelines. */
#include "tb_coalesce.h"

#endif /* TB_H */
