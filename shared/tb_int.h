/* tb_int.h -- the I/O side of the core that hosts never call: the circuit
 * breaker, the transport (tb_resp.c, tb_conn.c and its TLS, tb_tls.c,
 * tb_pool.c), the script call (tb_call.c, tb_redis.c), Sentinel
 * (tb_sentinel.c), Cluster (tb_cluster.c) and the failure policy
 * (tb_policy.c). Internal:
 * the library's files and its unit tests include it; hosts include tb.h
 * only.
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
 * wall-clock step cannot stretch a bounded wait (tb_pool.c). */
void tb__cond_init(pthread_cond_t *cv);

/* ---- Leases in a decision (tb_lease.c) ------------------------------ */

/* A client's lease table: the host's, the drain count it was made at
 * (a table drained since is not used) and the host's owner tag. */
typedef struct tb__leases {
    tb_lease_t *table;
    uint64_t epoch;
    int owner;
} tb__leases_t;

/* One decision's lease: its bucket's key and limit, the plan, the
 * clock it was read at. */
typedef struct tb__lease_step {
    char rkey[TB_KEY_BUF];
    tb_lease_info_t info;
    tb_lease_plan_t plan;
    int64_t now_ms;
} tb__lease_step_t;

#define TB__LEASE_NONE 0  /* Decide without a lease.                    */
#define TB__LEASE_PAID 1  /* Paid from the lease: *res is the answer.   */
#define TB__LEASE_CALL 2  /* Ask Redis for st->plan.want tokens, giving
                           * st->plan.back back, then tb__lease_end.    */

/* Begin deciding q with ls's table: one of TB__LEASE_*. */
int tb__lease_begin(const tb__leases_t *ls, const tb_request_t *q,
                    tb__lease_step_t *st, tb_result_t *res);
/* After the call: keep the grant beyond the cost as the lease, note what
 * went back in res->lease_returned and add what the host may still spend
 * to res->remaining. Returns tokens the table would not keep, which the
 * caller gives back to the bucket (st->rkey, st->info.limit). */
double tb__lease_end(const tb__leases_t *ls, const tb_request_t *q,
                     const tb__lease_step_t *st, tb_result_t *res);
/* Settle a real cost in the key's lease when it holds one: 1 (*res says
 * TB_SRC_LEASE), or 0 when Redis must settle it. */
int tb__lease_settle(const tb__leases_t *ls, const tb_request_t *q,
                     double cost, tb_result_t *res);

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

/* A failure: kind and message, as the hiredis contract has them. shared
 * is set on every decision of a failed batch but the first, so that the
 * breaker counts one failed write-and-read once, not once per decision
 * that rode on it. */
typedef struct tb__error {
    int err;
    int shared;
    char errstr[TB_ERRSTR_LEN];
} tb__error_t;

void tb__set_error(tb__error_t *e, int err, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;

/* The monotonic clock ms milliseconds from now. */
tb_monotime_us tb__deadline_ms(int ms);

/* ---- RESP output (tb_resp.c) --------------------------------------- */

/* A growable byte buffer, kept by its owner between uses. Zero it to
 * initialise. */
typedef struct tb__buf {
    char *p;
    size_t len;
    size_t cap;
} tb__buf_t;

/* Append one command, argv[0..argc-1] (argvlen[i] bytes each, binary
 * safe), in RESP. TB_ERR when out of memory (the buffer is unchanged). */
int tb__buf_argv(tb__buf_t *b, int argc, const char **argv,
                 const size_t *argvlen);
void tb__buf_free(tb__buf_t *b);

/* ---- TLS (tb_tls.c) -------------------------------------------------
 *
 * OpenSSL's SSL stays opaque here: only tb_tls.c includes OpenSSL. The
 * I/O calls never wait: 0 means "wait for *events (POLLIN or POLLOUT) on
 * the socket and call again with the same arguments"; -1 fills *e (kind
 * TB_ERR_TLS for a handshake, certificate or record failure, TB_ERR_IO
 * for a closed or broken socket).
 */
struct ssl_st;

/* A session for the connected socket fd, checked against t's server
 * name or else host; no I/O yet. NULL with *e. */
struct ssl_st *tb__tls_session(const tb_tls_t *t, int fd, const char *host,
                               tb__error_t *e);
/* One step of the handshake: 1 done, 0 wait, -1 failed. */
int tb__tls_handshake(struct ssl_st *s, short *events, tb__error_t *e);
/* Bytes written (> 0) or read (> 0; a reply may span several calls), 0
 * wait, -1 failed. A read with block waits in recv() for as long as the
 * socket's SO_RCVTIMEO lets it (0 with POLLIN when that ran out); one
 * without never waits. */
long tb__tls_write(struct ssl_st *s, const char *buf, size_t len,
                   short *events, tb__error_t *e);
long tb__tls_read(struct ssl_st *s, char *buf, size_t len, int block,
                  short *events, tb__error_t *e);
/* After an I/O error: when the server's last words were a TLS alert (a
 * TLS 1.3 server refuses a client certificate after the handshake, then
 * resets the connection our write was on), *e becomes that alert. */
void tb__tls_why_closed(struct ssl_st *s, tb__error_t *e);
/* Free the session without a word to the server (no close_notify). */
void tb__tls_end(struct ssl_st *s);

/* ---- One connection (tb_conn.c) ------------------------------------ */

typedef struct tb__conn tb__conn_t;

/* Connect to path (a unix socket) when it is non-empty, else host:port,
 * by deadline, and with tls (not NULL) complete a TLS handshake with
 * host by the same deadline. NULL with *e on failure. The socket is
 * non-blocking and close-on-exec. */
tb__conn_t *tb__conn_open(const char *host, int port, const char *path,
                          const tb_tls_t *tls, tb_monotime_us deadline,
                          tb__error_t *e);
/* Close and free. tb__conn_free(NULL) does nothing. */
void tb__conn_free(tb__conn_t *c);
/* Free without closing the fd: the host closed it and may have reused
 * the number. */
void tb__conn_forget(tb__conn_t *c);
/* Close the fd but free nothing: a forked child's copy of a connection
 * that another thread of the parent was using (its reader may have been
 * half-way through growing its buffer). */
void tb__conn_abandon(tb__conn_t *c);
/* 1 when the fd is still the socket we opened (same device and inode). */
int tb__conn_is_ours(const tb__conn_t *c);
int tb__conn_fd(const tb__conn_t *c);
/* Write len bytes by deadline. */
int tb__conn_write(tb__conn_t *c, const char *buf, size_t len,
                   tb_monotime_us deadline, tb__error_t *e);
/* Free a reply the reader made (never with freeReplyObject: an array's
 * elements live in its own block). tb__reply_free(NULL) does nothing. */
void tb__reply_free(void *reply);
/* The next reply, waiting until deadline. The reply is the caller's to
 * tb__reply_free. */
int tb__conn_read(tb__conn_t *c, tb_monotime_us deadline, redisReply **r,
                  tb__error_t *e);
/* The next reply if one has arrived, without waiting: 1 with *r, 0 none
 * yet, -1 the connection is dead. */
int tb__conn_poll(tb__conn_t *c, redisReply **r);
/* Write one command and read its reply, by deadline. */
int tb__conn_command(tb__conn_t *c, int argc, const char **argv,
                     const size_t *argvlen, tb_monotime_us deadline,
                     redisReply **r, tb__error_t *e);

/* ---- The pool: connections shared by a process's threads (tb_pool.c)
 *
 * A thread that finds a connection idle sends its command at once. One
 * that finds every connection busy with a write-and-read in flight joins
 * the batch queued behind the least loaded one: the batch's first member
 * leads it when the connection is free, writing every queued command in
 * one write and reading every reply, and each member gets its own reply.
 */

/* The most commands one batch carries. */
#define TB__BATCH_MAX 64

typedef struct tb__waiter tb__waiter_t;

/* Commands queued on one connection for one write. */
typedef struct tb__batch {
    tb__waiter_t *w[TB__BATCH_MAX]; /* Members; NULL when one gave up.  */
    unsigned char ncmds[TB__BATCH_MAX]; /* Commands of each (ASKING). */
    size_t off[TB__BATCH_MAX];      /* Where each one's bytes start.   */
    int n;
    tb__buf_t out;                  /* Their encoded commands.         */
    tb_monotime_us deadline;        /* The earliest member's.          */
    unsigned seq;                   /* Futex word: moves whenever a
                                     * member's state does.           */
} tb__batch_t;

/* One connection of the pool and its two batches: b[cur] is being
 * written and read while busy, b[1 - cur] collects the next. */
typedef struct tb__link {
    tb__conn_t *conn;               /* NULL: not connected.            */
    int busy;                       /* A leader is connecting, writing
                                     * or reading.                    */
    unsigned gen;                   /* The primary it was opened to.   */
    int cur;
    tb__batch_t b[2];
} tb__link_t;

/* The connections of one process to one Redis (one node of a cluster). */
typedef struct tb__pool {
    pthread_mutex_t mu;        /* Guards the links and the waiters.   */
    pthread_cond_t cv;         /* Signalled when a link goes idle.    */
    tb_redis_addr_t addr;
    int timeout_ms;
    int connect_timeout_ms;
    int size;                  /* Most connections open at once.      */
    tb__link_t *links;         /* size links.                          */
    pid_t pid;                 /* Process that owns these sockets.    */
    int verify_fd;
    tb_stats_t *stats;
    const tb_tls_t *tls;       /* Not owned; NULL: plaintext.         */
    /* Sentinel (addr.kind TB_REDIS_SENTINEL): the primary the sentinels
     * last named. Under mu, except that rmu lets one thread at a time
     * ask the sentinels. */
    pthread_mutex_t rmu;
    char cur_host[256];
    int cur_port;
    int stale;                 /* Ask the sentinels before connecting.*/
    unsigned gen;              /* Bumped when the primary moved: links
                                * of an older gen reconnect.          */
    int next_sentinel;         /* Index of the one to ask first.      */
    tb__conn_t *watch;         /* SUBSCRIBE +switch-master on one
                                * sentinel, or NULL; under rmu.       */
    int watch_next;            /* Sentinel to subscribe to next.      */
    tb_monotime_us watch_retry_us; /* No new subscription before.    */
} tb__pool_t;

/* tls: the context of every connection (sentinels' too), not owned, or
 * NULL for plaintext. */
int tb__pool_init(tb__pool_t *p, const tb_redis_addr_t *addr,
                  const tb_tls_t *tls, int timeout_ms,
                  int connect_timeout_ms, int size, int verify_fd,
                  tb_stats_t *stats);
void tb__pool_destroy(tb__pool_t *p);
void tb__pool_after_fork(tb__pool_t *p);
/* Connections open (or being opened) and busy, for metrics. */
void tb__pool_usage(tb__pool_t *p, int *open, int *busy);

/* Sentinel: the primary may have moved (an I/O error, a refused
 * connect, a READONLY reply). The next connect asks the sentinels again;
 * with drop_idle, open connections reconnect before their next use.
 * A no-op for other kinds of address. */
void tb__pool_suspect(tb__pool_t *p, int drop_idle);

/* One command through the pool (with asking, ASKING before it in the
 * same write), sharing a write and a read with other threads' commands
 * when the connections are busy. TB_OK with *reply (the caller's to
 * tb__reply_free; it may be an error reply), or TB_ERR with *e when
 * the command got no reply (I/O, timeout, protocol; e->shared as above).
 * Never waits past the command timeout plus, when it has to connect,
 * the connect timeout. */
int tb__pool_call(tb__pool_t *p, int asking, int argc, const char **argv,
                  const size_t *argvlen, redisReply **reply, tb__error_t *e);

/* Set up a new connection to a (tb_redis.c): AUTH, SELECT, SCRIPT LOAD of
 * every algorithm and, for Sentinel, ROLE, pipelined; by deadline. */
int tb__setup(const tb_redis_addr_t *a, tb__conn_t *c,
              tb_monotime_us deadline, tb__error_t *e);

/* Subscribe to +switch-master on a sentinel of p's address (tried from
 * *next, which advances past one that failed), with p's timeouts and
 * TLS. The connection, or NULL with *e. tb_sentinel.c. */
tb__conn_t *tb__sentinel_watch(const tb__pool_t *p, int *next,
                               tb__error_t *e);

/* Read what a watch has received without waiting. 1 with host and *port
 * set when a +switch-master for a->master arrived (the last one wins), 0
 * when nothing did, -1 when the watch is dead and must be freed. */
int tb__sentinel_poll(tb__conn_t *watch, const tb_redis_addr_t *a,
                      char *host, size_t hostsz, int *port);

/* Ask the sentinels of p's address (tried in turn from *first, which is
 * set to the one that answered) for the address of its master, with p's
 * timeouts and TLS. TB_OK with host and *port filled, or TB_ERR with *e
 * naming the last failure. tb_sentinel.c. */
int tb__sentinel_resolve(const tb__pool_t *p, int *first, char *host,
                         size_t hostsz, int *port, tb__error_t *e);

/* The script's reply. */
typedef struct tb__script_reply {
    int64_t v[6]; /* allowed, remaining, retry_ms, binding, granted,
                   * concurrency slots held */
} tb__script_reply_t;

/* Run a script once over argv (EVALSHA form) through the pool; on
 * NOSCRIPT send it again as EVAL. argv is borrowed for the retry and
 * given back as it was. */
int tb__run_script(tb__pool_t *p, int argc, const char **argv,
                   size_t *argvlen, tb__script_reply_t *out,
                   tb__error_t *e);

/* Run one ad-hoc command, for tools (inspect, reset) and CLUSTER SLOTS.
 * The reply is the caller's to tb__reply_free. */
int tb__command(tb__pool_t *p, int argc, const char **argv,
                const size_t *argvlen, redisReply **reply, tb__error_t *e);

/* Redis's error kinds a cluster client acts on. */
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
 * TB_REDIS_CLUSTER); pool_size connections per node, each with tls (not
 * owned; NULL: plaintext). Connects nothing. NULL when out of memory. */
tb__cluster_t *tb__cluster_create(const tb_redis_addr_t *a,
                                  const tb_tls_t *tls, int timeout_ms,
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

/* A request's concurrency limit, for the failure policy: the slot set's
 * full Redis key (the local table's entry), N and the slot ttl. */
typedef struct tb__conc {
    const char *key;
    int limit;
    int64_t ttl_ms;
} tb__conc_t;

/* Fill *res by the policy, for a decision Redis did not make (err says
 * why). keys are the full Redis keys, used by the local table; n may be
 * 0 when conc is given; conc is NULL without a concurrency limit. */
void tb__policy_answer(const tb__policy_t *pol, const char *const *keys,
                       const tb_take_t *takes, int n,
                       const tb__conc_t *conc, int err, tb_monotime_us now,
                       tb_stats_t *stats, tb_result_t *res);

/* Give back a slot the local policy counted in `window` (res->slot). */
void tb__policy_release(const tb__policy_t *pol, const tb__conc_t *conc,
                        int64_t window, tb_monotime_us now);

/* ---- From a request to a script call (tb_call.c) -------------------- */

/* What a script call is for: a decision, or a settlement (the script's
 * 'settle' mode, the takes' costs being the differences to settle). */
enum { TB__CALL_DECIDE = 0, TB__CALL_SETTLE = 1 };

/* Room for the formatted numbers (numkeys, now, 3 per bucket, the lease
 * and what it gives back, the concurrency limit and ttl) and the
 * arguments of one call (EVALSHA, digest, numkeys, the keys and the slot
 * set, the clock, 3 per bucket, 2 for the lease, 4 for concurrency). */
#define TB__CALL_NUMS (6 + TB_MAX_BUCKETS * 3)
#define TB__CALL_ARGS (3 + TB_MAX_BUCKETS * 4 + 8)

/* Check q and fill takes (with the shard's limits) and the full Redis
 * key of every bucket. 0 when the request is malformed. */
int tb__call_prepare(const tb_request_t *q, tb_take_t *takes,
                     char keys[][TB_KEY_BUF]);

/* The slot set's key of q into out (TB_KEY_BUF bytes) and the policy's
 * view of its concurrency limit. 0 when the prefix is bad. */
int tb__call_conc(const tb_request_t *q, char *out, tb__conc_t *conc);

/* The EVALSHA argument vector of a call (what: TB__CALL_*); nums
 * (TB__CALL_NUMS) holds the formatted numbers. Returns argc. */
int tb__call_argv(const tb_request_t *q, const tb_take_t *takes,
                  char keys[][TB_KEY_BUF], int what,
                  const tb__conc_t *conc, const char *slot_id,
                  char nums[][32], const char **argv, size_t *argvlen);

/* A decision's script reply read into *res. */
void tb__call_result(const tb__script_reply_t *rep, const tb_request_t *q,
                     const tb_take_t *takes, const char *slot_id,
                     tb_result_t *res);

/* v formatted so that Lua's tonumber() reads back the same double; the
 * digits are those of "%.17g". Returns the length. */
size_t tb__fmt_num(char *buf, size_t len, double v);

#endif /* TB_INT_H */
