/* tb_int.h -- the I/O side of the core that hosts never call: the circuit
 * breaker, the Redis connection pool and script call (tb_redis.c), Sentinel
 * (tb_sentinel.c), Cluster (tb_cluster.c) and the failure policy
 * (tb_policy.c). Internal: the library's files and its unit tests include
 * it; hosts include tb.h only.
 */
#ifndef TB_INT_H
#define TB_INT_H

#include <pthread.h>
#include <sys/types.h>

#include <hiredis/hiredis.h>

#include "tb.h"
#include "tb_algo_int.h"

/* ---- Small helpers -------------------------------------------------- */

/* SHA-256 (tb_sha256.c), for key hashing and the local table. */
void tb_sha256(const void *data, size_t len, unsigned char out[32]);

/* Count one Redis call's latency in the histogram (tb_stats.c). */
void tb_stats_latency(tb_stats_t *s, int64_t us);

/* A condition variable that waits against CLOCK_MONOTONIC, so that a
 * wall-clock step cannot stretch a bounded wait (tb_redis.c). */
void tb__cond_init(pthread_cond_t *cv);

/* ---- Circuit breaker (tb_breaker.c) -------------------------------- */

/* Plain data, no locks: the client serialises access. */
typedef struct tb_breaker {
    int threshold;            /* Consecutive failures that open it.  */
    int64_t cooldown_us;      /* Time open before a probe.           */
    tb_breaker_state_t state;
    int failures;             /* Consecutive failures so far.        */
    tb_monotime_us opened_at_us;
    int probe_in_flight;
} tb_breaker_t;

void tb_breaker_init(tb_breaker_t *b, int threshold, int64_t cooldown_ms);
/* 1 when a call may go to Redis now; in OPEN past the cooldown this moves
 * to HALF_OPEN and lets exactly one probe through. */
int tb_breaker_allow(tb_breaker_t *b, tb_monotime_us now);
/* Report a call's outcome. Return 1 when this report changed the state
 * between closed and open (for logging a transition once). */
int tb_breaker_success(tb_breaker_t *b, tb_monotime_us now);
int tb_breaker_failure(tb_breaker_t *b, tb_monotime_us now);
/* Milliseconds until a probe will be allowed (0 unless open). */
int64_t tb_breaker_wait_ms(const tb_breaker_t *b, tb_monotime_us now);

/* One connection slot: empty (ctx NULL), idle, or borrowed (busy). dev and
 * ino say which socket the fd was when we opened it; gen which primary
 * (Sentinel) it was opened to. */
typedef struct tb__slot {
    redisContext *ctx;
    dev_t dev;
    ino_t ino;
    int busy;
    unsigned gen;
} tb__slot_t;

/* A bounded, thread-safe pool of Redis connections for one process. */
typedef struct tb__pool {
    pthread_mutex_t mu;
    pthread_cond_t cv;         /* Signalled when a connection returns. */
    tb_redis_addr_t addr;
    int timeout_ms;
    int connect_timeout_ms;
    int size;                  /* Most connections open at once.      */
    int open;                  /* Idle + borrowed + being made.       */
    int in_use;                /* Borrowed right now.                 */
    tb__slot_t *slots;         /* size slots.                          */
    pid_t pid;                 /* Process that owns these sockets.    */
    int verify_fd;
    tb_stats_t *stats;
    /* Sentinel (issue 6; addr.kind TB_REDIS_SENTINEL): the primary the
     * sentinels last named. Under mu, except that rmu lets one thread at
     * a time ask the sentinels. */
    pthread_mutex_t rmu;
    char cur_host[256];
    int cur_port;
    int stale;                 /* Ask the sentinels before connecting.*/
    unsigned gen;              /* Bumped when the primary moved: idle
                                * slots of an older gen are dropped.   */
    int next_sentinel;         /* Index of the one to ask first.      */
    redisContext *watch;       /* SUBSCRIBE +switch-master on one
                                * sentinel, or NULL; under rmu.       */
    dev_t watch_dev;           /* Which socket watch's fd was.        */
    ino_t watch_ino;
    int watch_next;            /* Sentinel to subscribe to next.      */
    tb_monotime_us watch_retry_us; /* No new subscription before.    */
} tb__pool_t;

/* A failure: kind and message, as the hiredis contract has them. */
typedef struct tb__error {
    int err;
    char errstr[TB_ERRSTR_LEN];
} tb__error_t;

void tb__set_error(tb__error_t *e, int err, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;

int tb__pool_init(tb__pool_t *p, const tb_redis_addr_t *addr, int timeout_ms,
                  int connect_timeout_ms, int size, int verify_fd,
                  tb_stats_t *stats);
void tb__pool_destroy(tb__pool_t *p);
void tb__pool_after_fork(tb__pool_t *p);

/* Sentinel: the primary may have moved (an I/O error, a refused
 * connect, a READONLY reply). The next connect asks the sentinels again;
 * with drop_idle, idle connections are closed as they are next borrowed.
 * A no-op for other kinds of address. */
void tb__pool_suspect(tb__pool_t *p, int drop_idle);

/* Subscribe to +switch-master on a sentinel of a (tried from *next,
 * which advances past one that failed). The context, or NULL with *e.
 * tb_sentinel.c. */
redisContext *tb__sentinel_watch(const tb_redis_addr_t *a, int *next,
                                 int connect_timeout_ms, int timeout_ms,
                                 tb__error_t *e);

/* Read what a watch has received without waiting. 1 with host and *port
 * set when a +switch-master for a->master arrived (the last one wins), 0
 * when nothing did, -1 when the watch is dead and must be freed. */
int tb__sentinel_poll(redisContext *watch, const tb_redis_addr_t *a,
                      char *host, size_t hostsz, int *port);

/* Ask the sentinels of a (tried in turn from *first, which is set to the
 * one that answered) for the address of a->master. TB_OK with host and
 * *port filled, or TB_ERR with *e naming the last failure. tb_sentinel.c.*/
int tb__sentinel_resolve(const tb_redis_addr_t *a, int *first,
                         int connect_timeout_ms, int timeout_ms,
                         char *host, size_t hostsz, int *port,
                         tb__error_t *e);

/* Borrow a connection (reusing an idle one, making one, or waiting up to
 * the command timeout for one to come back). NULL with *e set on failure.*/
redisContext *tb__pool_get(tb__pool_t *p, tb__error_t *e);
/* Return it; a broken one is freed and its slot released. */
void tb__pool_put(tb__pool_t *p, redisContext *ctx, int broken);

/* The script's reply. */
typedef struct tb__script_reply {
    int64_t v[5]; /* allowed, remaining, retry_ms, binding, granted */
} tb__script_reply_t;

/* Run the bucket script once over argv (EVALSHA form) on a borrowed
 * connection; on NOSCRIPT send it again as EVAL. */
int tb__run_script(tb__pool_t *p, int argc, const char **argv,
                   size_t *argvlen, tb__script_reply_t *out,
                   tb__error_t *e);

/* Run one ad-hoc command, for tools (inspect, reset). The reply is the
 * caller's to freeReplyObject. */
int tb__command(tb__pool_t *p, int argc, const char **argv,
                const size_t *argvlen, redisReply **reply, tb__error_t *e);

/* Redis's error kinds a cluster client acts on (issue 6). */
typedef enum {
    TB__REDIR_NONE = 0,
    TB__REDIR_MOVED = 1,
    TB__REDIR_ASK = 2,
    TB__REDIR_TRYAGAIN = 3,
    TB__REDIR_DOWN = 4      /* CLUSTERDOWN: the slot is not served. */
} tb__redir_kind_t;

typedef struct tb__redirect {
    tb__redir_kind_t kind;
    int slot;
    char host[256];         /* Empty: the node that answered.        */
    int port;
} tb__redirect_t;

/* Map a hiredis context error to an error kind (tb_redis.c). */
void tb__ctx_error(tb__error_t *e, const redisContext *ctx,
                   const char *during);

/* tb__run_script on one node of a cluster: with asking, ASKING is
 * pipelined before the command (and before its EVAL retry). A MOVED, ASK,
 * TRYAGAIN or CLUSTERDOWN reply fills *rd (and *e) and returns TB_ERR. */
int tb__run_script_node(tb__pool_t *p, int asking, int argc,
                        const char **argv, size_t *argvlen,
                        tb__script_reply_t *out, tb__redirect_t *rd,
                        tb__error_t *e);

/* tb__command on one node of a cluster, as tb__run_script_node. */
int tb__command_node(tb__pool_t *p, int asking, int argc,
                     const char **argv, const size_t *argvlen,
                     redisReply **reply, tb__redirect_t *rd,
                     tb__error_t *e);

/* Redis Cluster (tb_cluster.c): the slot map and a pool per node. */
typedef struct tb__cluster tb__cluster_t;

/* A client for the cluster whose seeds, user and password are in a (kind
 * TB_REDIS_CLUSTER); pool_size connections per node. Connects nothing.
 * NULL when out of memory. */
tb__cluster_t *tb__cluster_create(const tb_redis_addr_t *a, int timeout_ms,
                                  int connect_timeout_ms, int pool_size,
                                  int verify_fd, tb_stats_t *stats);
void tb__cluster_free(tb__cluster_t *c);
void tb__cluster_after_fork(tb__cluster_t *c);
/* Sums over the nodes' pools. */
void tb__cluster_usage(tb__cluster_t *c, int *size, int *open,
                       int *in_use);

/* tb__run_script / tb__command on the primary of key's slot, following
 * MOVED and ASK. key is one of the command's keys (all share a slot). */
int tb__cluster_run_script(tb__cluster_t *c, const char *key, int argc,
                           const char **argv, size_t *argvlen,
                           tb__script_reply_t *out, tb__error_t *e);
int tb__cluster_command(tb__cluster_t *c, const char *key, int argc,
                        const char **argv, const size_t *argvlen,
                        redisReply **reply, tb__error_t *e);

/* The failure policy's inputs (tb_policy.c). */
typedef struct tb__policy {
    tb_policy_t policy;
    int replicas;
    tb_local_t *local;
    int closed_retry_ms;
    int64_t breaker_wait_ms;
} tb__policy_t;

/* Fill *res by the policy, for a decision Redis did not make (err says
 * why). keys are the full Redis keys, used by the local table. */
void tb__policy_answer(const tb__policy_t *pol, const char *const *keys,
                       const tb_take_t *takes, int n, int err,
                       tb_monotime_us now, tb_stats_t *stats,
                       tb_result_t *res);

#endif /* TB_INT_H */
