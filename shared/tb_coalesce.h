/* tb_coalesce.h -- the part of libtb's public header about the
 * coalescer: one process per host and Redis that carries its clients'
 * commands in pipelines (shared/redis/tb_coalesce.c implements it,
 * tb_coalesce_cluster.c its Cluster side).
 * Included by tb.h, which hosts include alone. */
#ifndef TB_COALESCE_H
#define TB_COALESCE_H

#ifndef TB_H
#error "include tb.h, not tb_coalesce.h"
#endif

#include <signal.h>

#ifdef __cplusplus
extern "C" {
#endif

/* One process per host and Redis (shared/redis/tb_coalesce.c) carries the
 * commands of the clients on its unix socket (URL "unix:PATH") to one
 * Redis on one connection: what arrives while a pipeline is in flight
 * goes as the next write, each reply back to its sender. AUTH, SELECT and
 * TLS are its own; Sentinel is followed; a Cluster gets one connection
 * and one pipeline per primary, each client its replies in its order. */
typedef struct tb_coalescer tb_coalescer_t;

typedef struct tb_coalescer_options {
    const char *url;            /* One Redis, redis-sentinel:// or
                                 * redis-cluster://.                  */
    const char *path;           /* Its socket (absolute; a stale one
                                 * is replaced).                      */
    int timeout_ms;             /* A pipeline's write and replies.    */
    int connect_timeout_ms;     /* Default: timeout_ms.               */
    tb_tls_t *tls_ctx;          /* For a TLS URL (not owned).         */
} tb_coalescer_options_t;

typedef struct tb_coalescer_stats {
    uint64_t accepted, clients; /* Connections accepted; open now.    */
    uint64_t batches, commands; /* Writes to Redis; commands carried. */
    uint64_t failed;            /* Answered with an error: Redis failed.*/
    uint64_t refused;           /* Clients closed: a denied command.  */
    uint64_t connects, rebinds; /* To Redis; socket files put back.   */
} tb_coalescer_stats_t;

/* Listen on o->path, mode 0600 (the caller may chown it); no Redis yet.
 * NULL with a message in err. */
tb_coalescer_t *tb_coalescer_create(const tb_coalescer_options_t *o,
                                    char *err, size_t errlen);
/* Serve until *stop is set (by a signal handler), then stop listening
 * and serve the clients left until they go or linger_ms pass: TB_OK.
 * TB_ERR when its socket file was removed and cannot be put back. */
int tb_coalescer_run(tb_coalescer_t *c, volatile sig_atomic_t *stop,
                     int linger_ms);
void tb_coalescer_stats(const tb_coalescer_t *c, tb_coalescer_stats_t *st);
/* Close all; the socket file is removed if it is still ours. */
void tb_coalescer_free(tb_coalescer_t *c);

#ifdef __cplusplus
}
#endif

#endif /* TB_COALESCE_H */
