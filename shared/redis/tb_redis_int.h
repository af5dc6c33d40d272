/* tb_redis_int.h -- the transport of the core that hosts never call: the
 * RESP writer (tb_resp.c), host names (tb_resolve.c), TLS (tb_tls.c), one
 * connection (tb_conn.c), the handshake of a new one (tb_setup.c),
 * Sentinel (tb_sentinel.c), the pool (tb_pool.c), commands and scripts
 * through a pool (tb_redis.c) and Redis Cluster (tb_cluster.c). Internal:
 * the decision path and the unit tests include it; hosts include tb.h
 * only.
 *
 * redis/ calls base/ and nothing else of libtb: it knows Redis, not
 * buckets. The scripts it loads and calls come in its settings
 * (tb__redis_cfg_t), and what their replies mean is the decision path's.
 * The files call each other in one direction only (redis/README.md draws
 * the graph).
 */
#ifndef TB_REDIS_INT_H
#define TB_REDIS_INT_H

#include <pthread.h>
#include <sys/types.h>

#include <hiredis/hiredis.h>

#include "base/tb_base.h"

/* ---- Commands and RESP output (tb_resp.c) ------------------------- */

/* A command: argc arguments, argv[i] of argvlen[i] bytes (binary safe).
 * Borrowed for the call that takes it. */
typedef struct tb__cmd {
    int argc;
    const char *const *argv;
    const size_t *argvlen;
} tb__cmd_t;

/* A growable byte buffer, kept by its owner between uses. Zero it to
 * initialise. */
typedef struct tb__buf {
    char *p;
    size_t len;
    size_t cap;
} tb__buf_t;

/* Append one command, argv[0..argc-1] (argvlen[i] bytes each, binary
 * safe), in RESP. TB_ERR when out of memory (the buffer is unchanged). */
int tb__buf_argv(tb__buf_t *b, int argc, const char *const *argv,
                 const size_t *argvlen);
/* tb__buf_argv() of a command. */
int tb__buf_cmd(tb__buf_t *b, const tb__cmd_t *cmd);
/* Append n raw bytes. TB_ERR when out of memory (unchanged). */
int tb__buf_put(tb__buf_t *b, const char *p, size_t n);
/* The length in bytes of the one RESP2 value (a command or a reply,
 * arrays nested up to 16 deep) that starts at p, of the n bytes read so
 * far: > 0 when it is all there, 0 when more bytes are needed, -1 when
 * the bytes are not RESP. */
long long tb__resp_span(const char *p, size_t n);
void tb__buf_free(tb__buf_t *b);

/* ---- Host names (tb_resolve.c) ------------------------------------- */

/* The addresses of host:port for a TCP connect, by deadline: an IP
 * literal at once, a name by getaddrinfo() in a thread of its own while
 * the caller waits no later than deadline. TB_OK with *res (the caller's
 * to freeaddrinfo), or TB_ERR with *e (TB_ERR_TIMEOUT when the deadline
 * came first, TB_ERR_IO when the name does not resolve). */
struct addrinfo;
int tb__resolve(const char *host, int port, tb_monotime_us deadline,
                struct addrinfo **res, tb__error_t *e);

/* ---- TLS (tb_tls.c) -------------------------------------------------
 *
 * OpenSSL's SSL stays opaque here: only tb_tls.c includes OpenSSL's TLS
 * headers. The I/O calls never wait: 0 means "wait for *events (POLLIN
 * or POLLOUT) on the socket and call again with the same arguments"; -1
 * fills *e (kind TB_ERR_TLS for a handshake, certificate or record
 * failure, TB_ERR_IO for a closed or broken socket).
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

/* Connect to path (a unix socket) when it is non-empty, else host:port
 * (a name resolved within the same deadline), by deadline, and with tls
 * (not NULL) complete a TLS handshake with host by the same deadline.
 * NULL with *e on failure. The socket is close-on-exec. */
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
/* The socket, for poll(2) by a caller that does its own waiting. */
int tb__conn_fd(const tb__conn_t *c);
/* Raw bytes as they came (decrypted under TLS), without waiting and
 * without the reply reader: > 0 bytes, 0 none yet, -1 closed or failed
 * (with *e). Not mixed with tb__conn_read on one connection once
 * replies may be pending. */
long tb__conn_recv(tb__conn_t *c, char *buf, size_t len, tb__error_t *e);
/* Write one command and read its reply, by deadline. */
int tb__conn_command(tb__conn_t *c, const tb__cmd_t *cmd,
                     tb_monotime_us deadline, redisReply **r,
                     tb__error_t *e);

/* ---- How a client reaches Redis ------------------------------------ */

/* The scripts every connection loads (SCRIPT LOAD during setup) and a
 * NOSCRIPT reply sends again: n (at most TB__MAX_SCRIPTS) texts and their
 * SHA-1 digests (40 hex digits), in the caller's storage, which outlives
 * every pool. */
#define TB__MAX_SCRIPTS 16
typedef struct tb__scripts {
    int n;
    const char *const *text;
    const char *const *sha1;
    const char *const *module_cmd; /* The Redis module's command that
                                    * takes script i's keys and
                                    * arguments ("tbucket.bucket").   */
} tb__scripts_t;

/* Whether a server has the Redis module, as its connections' setup
 * found (a pool's, for one server). */
#define TB__MODULE_UNKNOWN 0
#define TB__MODULE_NO 1
#define TB__MODULE_YES 2

/* The settings of every connection a client makes, shared by its pool,
 * its Sentinel questions and each Cluster node's pool (which takes a
 * copy with the node's address). */
typedef struct tb__redis_cfg {
    tb_redis_addr_t addr;     /* One Redis, the sentinels, or the
                               * cluster's seeds (tb_url_parse).      */
    const tb_tls_t *tls;      /* Not owned; NULL: plaintext.          */
    int timeout_ms;           /* A command's write and read.          */
    int connect_timeout_ms;   /* A connect and its TLS handshake.     */
    int pool_size;            /* Connections per pool (per node).     */
    int verify_fd;            /* Check a connection's fd before each
                               * use (tb_options_t.verify_fd).        */
    tb_stats_t *stats;        /* Counters (connects, batches, NOSCRIPT
                               * reloads); not owned.                 */
    tb__scripts_t scripts;
    int engine;               /* A tb_engine_t: how scripts are called.*/
} tb__redis_cfg_t;

/* ---- A new connection's handshake (tb_setup.c) --------------------- */

/* Set up a new connection to cfg->addr: AUTH, SELECT, SCRIPT LOAD of
 * every script, unless the engine is script COMMAND INFO of the module's
 * first command (*module: TB__MODULE_YES or _NO) and, for Sentinel,
 * ROLE, pipelined; by deadline. With engine module, a server without the
 * module fails the setup. */
int tb__setup(const tb__redis_cfg_t *cfg, tb__conn_t *c,
              tb_monotime_us deadline, int *module, tb__error_t *e);

/* ---- Sentinel: which primary (tb_sentinel.c) ----------------------- */

/* The primary a pool of a redis-sentinel:// address connects to: asked
 * of the sentinels when stale, followed through a +switch-master
 * subscription, and numbered by generation so that connections opened
 * to an older primary reconnect. Its own locks; it never calls the pool. */
typedef struct tb__sentinel tb__sentinel_t;

/* A tracker for cfg's sentinels (cfg is borrowed for the tracker's life).
 * Nothing is asked yet: the first target asks. NULL when out of memory. */
tb__sentinel_t *tb__sentinel_create(const tb__redis_cfg_t *cfg);
void tb__sentinel_free(tb__sentinel_t *s);
/* In a forked child: drop the subscription and reset the locks. */
void tb__sentinel_after_fork(tb__sentinel_t *s);
/* Read the +switch-master subscription without waiting, subscribing at
 * most once a second while there is none. */
void tb__sentinel_check(tb__sentinel_t *s);
/* The primary to connect to now (asking the sentinels first when stale)
 * into *to, and its generation. TB_OK, or TB_ERR with *e naming the last
 * sentinel's failure. */
int tb__sentinel_target(tb__sentinel_t *s, tb_redis_endpoint_t *to,
                        unsigned *gen, tb__error_t *e);
/* The primary may have moved (an I/O error, a refused connect, a
 * READONLY reply): the next target asks again; with drop_idle, the
 * generation moves, so open connections reconnect before their next
 * use. */
void tb__sentinel_suspect(tb__sentinel_t *s, int drop_idle);
/* The current generation. */
unsigned tb__sentinel_gen(tb__sentinel_t *s);

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
    tb__redis_cfg_t cfg;       /* cfg.pool_size links.                */
    tb__link_t *links;
    pid_t pid;                 /* Process that owns these sockets.    */
    tb__sentinel_t *sentinel;  /* Sentinel addresses only, else NULL. */
    int module;                /* TB__MODULE_*: the server's, as the
                                * last connection's setup found it, or
                                * a call's "unknown command" reply.
                                * Atomic: read without mu.            */
} tb__pool_t;

/* A pool for cfg (copied); connects nothing. TB_ERR when out of memory. */
int tb__pool_init(tb__pool_t *p, const tb__redis_cfg_t *cfg);
void tb__pool_destroy(tb__pool_t *p);
void tb__pool_after_fork(tb__pool_t *p);
/* Connections open (or being opened) and busy, for metrics. */
void tb__pool_usage(tb__pool_t *p, int *open, int *busy);

/* Sentinel: the primary may have moved (tb__sentinel_suspect). A no-op
 * for other kinds of address. */
void tb__pool_suspect(tb__pool_t *p, int drop_idle);

/* One command through the pool (with asking, ASKING before it in the
 * same write), sharing a write and a read with other threads' commands
 * when the connections are busy. TB_OK with *reply (the caller's to
 * tb__reply_free; it may be an error reply), or TB_ERR with *e when
 * the command got no reply (I/O, timeout, protocol; e->shared as above).
 * Never waits past the command timeout plus, when it has to connect,
 * the connect timeout. */
int tb__pool_call(tb__pool_t *p, int asking, const tb__cmd_t *cmd,
                  redisReply **reply, tb__error_t *e);

/* ---- Commands and scripts through a pool (tb_redis.c) -------------- */

/* A script's reply: 4 to 6 integers (what they mean is the caller's;
 * missing ones read 0). */
typedef struct tb__script_reply {
    int64_t v[8];
} tb__script_reply_t;

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

/* One command or script call and what came back. The caller sets cmd,
 * script and asking; the call writes reply and rd. */
typedef struct tb__redis_call {
    tb__cmd_t cmd;               /* A script's in EVALSHA form.          */
    tb__script_reply_t *script;  /* Not NULL: cmd calls a script, whose
                                  * reply is read into *script; NOSCRIPT
                                  * sends it again as EVAL (the text
                                  * whose digest is cmd's argv[1]).     */
    redisReply *reply;           /* Without script: the reply, the
                                  * caller's to tb__reply_free; NULL
                                  * after a failure.                    */
    int asking;                  /* Cluster: ASKING before it.          */
    tb__redirect_t rd;           /* Cluster: the redirect an error reply
                                  * named (kind TB__REDIR_NONE if none).*/
} tb__redis_call_t;

/* Make the call k through p. TB_OK, or TB_ERR with *e: no reply (as
 * tb__pool_call), a reply of the wrong shape, or an error reply, whose
 * text is copied into *e and which fills k->rd when it redirects. A
 * READONLY reply tells a Sentinel pool that its primary was demoted. */
int tb__redis_call(tb__pool_t *p, tb__redis_call_t *k, tb__error_t *e);
/* Read an error reply's text s (without its '-') into *rd: MOVED, ASK,
 * TRYAGAIN or CLUSTERDOWN; kind TB__REDIR_NONE for any other. */
void tb__redirect_parse(const char *s, tb__redirect_t *rd);

/* ---- Redis Cluster (tb_cluster.c): the slot map and a pool per node */

typedef struct tb__cluster tb__cluster_t;

/* A client for the cluster whose seeds, user and password are in
 * cfg->addr (kind TB_REDIS_CLUSTER), each node's pool made from cfg.
 * Connects nothing. NULL when out of memory. */
tb__cluster_t *tb__cluster_create(const tb__redis_cfg_t *cfg);
void tb__cluster_free(tb__cluster_t *c);
void tb__cluster_after_fork(tb__cluster_t *c);
/* Sums over the nodes' pools. */
void tb__cluster_usage(tb__cluster_t *c, int *size, int *open,
                       int *in_use);
/* Nodes whose connections found the Redis module (*yes) and found it
 * missing (*no). */
void tb__cluster_module(tb__cluster_t *c, int *yes, int *no);

/* tb__redis_call() on the primary of key's slot, following MOVED and
 * ASK. key is one of the command's keys (all share a slot). */
int tb__cluster_call(tb__cluster_t *c, const char *key, tb__redis_call_t *k,
                     tb__error_t *e);

/* One row of a CLUSTER SLOTS reply: slots s..t served by the primary at
 * host:port (host "" for the node that was asked). TB_OK to go on, or
 * TB_ERR with *e to stop. */
typedef int (*tb__slot_row_fn)(void *arg, int s, int t, const char *host,
                               int port, tb__error_t *e);
/* Hand each row of the CLUSTER SLOTS reply r to fn. TB_OK, or TB_ERR
 * with *e (a reply of the wrong shape, or fn's). */
int tb__cluster_rows(const redisReply *r, tb__slot_row_fn fn, void *arg,
                     tb__error_t *e);

/* ---- The coalescer's Cluster side (tb_coalesce_cluster.c) ----------
 *
 * For a redis-cluster:// URL the coalescer (tb_coalesce.c) hands each
 * whole command of a client here: one connection and one pipeline per
 * primary, the slot map, MOVED and ASK. Replies come back through the
 * host's deliver() with the command's sequence number, possibly out of
 * the client's order (its commands may go to several nodes): the host
 * puts them back in order with a tb__reorder_t per client.
 */

/* Where a command goes: its first key's hash slot (0..16383), or: */
#define TB__ROUTE_ANY (-1)      /* No key: any one primary.           */
#define TB__ROUTE_ALL (-2)      /* SCRIPT LOAD/FLUSH: every primary.  */
/* The route of the one whole RESP command at p (len bytes): the key
 * after numkeys for EVAL, EVALSHA, FCALL and the module's tbucket.*
 * commands, else the first argument; none for a keyless command. */
int tb__cmd_route(const char *p, size_t len);

/* A client's replies put back in the order of its commands: next_in
 * numbers its commands, next_out is the one whose reply goes next, and
 * the replies that came early wait in held. Zero it to initialise. */
typedef struct tb__held {
    uint64_t seq;
    char *p;
    size_t len;
} tb__held_t;
typedef struct tb__reorder {
    uint64_t next_in, next_out;
    tb__held_t *held;
    int nheld, cap;
} tb__reorder_t;
/* The reply to command seq (len bytes at p): appended to out at once
 * when it is next, with the held ones that follow it; else held (a
 * copy). TB_ERR when out of memory. */
int tb__reorder_put(tb__reorder_t *o, uint64_t seq, const char *p,
                    size_t len, tb__buf_t *out);
/* Free what is held and start again from 0. */
void tb__reorder_reset(tb__reorder_t *o);

/* The epoll id of node i is TB__CCL_EV + i. */
#define TB__CCL_EV ((uint64_t)1 << 32)

typedef struct tb__ccl tb__ccl_t;
/* The host's side: deliver the reply to command seq of client (gen
 * names the client's connection, as the host numbers them); alive says
 * whether that client is still there (a gone client's queued commands
 * are never sent). */
typedef struct tb__ccl_host {
    void (*deliver)(void *arg, int client, unsigned gen, uint64_t seq,
                    const char *p, size_t len);
    int (*alive)(void *arg, int client, unsigned gen);
    void *arg;
    int ep;                         /* The host's epoll.               */
    tb_coalescer_stats_t *st;       /* The host's counters.            */
} tb__ccl_host_t;

/* The Cluster side for cfg (its seeds; copied). NULL when out of
 * memory. Connects nothing. */
tb__ccl_t *tb__ccl_create(const tb__redis_cfg_t *cfg,
                          const tb__ccl_host_t *h);
void tb__ccl_free(tb__ccl_t *cc);
/* Route and queue command seq of client (len bytes at p). A command no
 * node can take is answered with an error reply at once. TB_ERR when
 * out of memory. */
int tb__ccl_submit(tb__ccl_t *cc, int client, unsigned gen, uint64_t seq,
                   const char *p, size_t len);
/* Each node with nothing in flight writes its queue as one pipeline. */
void tb__ccl_send(tb__ccl_t *cc);
/* Node i's socket is readable. */
void tb__ccl_read(tb__ccl_t *cc, int i);
/* Fail the nodes whose pipeline has had no reply within the timeout;
 * the longest the next wait may sleep (at most max_ms). */
int tb__ccl_check(tb__ccl_t *cc, tb_monotime_us now, int max_ms);
/* Commands queued or in flight. */
size_t tb__ccl_pending(const tb__ccl_t *cc);

#endif /* TB_REDIS_INT_H */
