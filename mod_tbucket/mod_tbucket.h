/* mod_tbucket.h -- what mod_tbucket.c and tbucket_status.c share.
 *
 * The configuration records, the per-child client record and the layout of
 * the server-wide shared memory segment. Only the module's own files
 * include this; the core's public header is shared/tb.h.
 */
#ifndef MOD_TBUCKET_H
#define MOD_TBUCKET_H

#include "httpd.h"
#include "http_config.h"
#include "ap_expr.h"
#include "apr_hash.h"
#include "apr_tables.h"

#include "tb.h"

/* Log tags: "TB" + five digits + ": ", one number per call site, never
 * reused (the rules of httpd's docs/log-message-tags/README). 001xx are
 * in mod_tbucket.c and tbucket_config.c, 002xx in tbucket_status.c. */
#define TBLOGNO(n) "TB" #n ": "

#define TBUCKET_DEFAULT_URL "redis://127.0.0.1:6379"
#define TBUCKET_DEFAULT_PREFIX "rl:"
#define MAX_ROUTES (TB_MAX_BUCKETS - 1)

/* What a request was told; the order is the metrics' label order. */
typedef enum {
    TBUCKET_OUT_ALLOWED = 0,
    TBUCKET_OUT_REJECTED,
    TBUCKET_OUT_SHADOW_REJECTED,
    TBUCKET_OUT_FALLBACK_OPEN,
    TBUCKET_OUT_FALLBACK_CLOSED,
    TBUCKET_OUT_FALLBACK_LOCAL,
    TBUCKET_OUTCOMES
} tbucket_outcome;

/* The TBUCKET_DECISION value of each outcome. */
extern const char *const tbucket_outcome_names[TBUCKET_OUTCOMES];

/* ---- Shared memory (one segment per parent process) ---------------- */

#define TBUCKET_SHM_MAGIC 0x74627531u /* "tbu1" */
#define TBUCKET_MAX_VHOSTS 256        /* Slots; the last one is "other". */
#define TBUCKET_MAX_CLIENTS 64        /* Stats slots, one per Redis URL
                                       * and policy.                    */
#define TBUCKET_NAME_LEN 160          /* Bytes, NUL included.           */
#define TBUCKET_LOCAL_ENTRIES 16384   /* Buckets in the local table.    */
#define TBUCKET_LEASE_ENTRIES 4096    /* Leases held at once (issue 6). */

typedef struct tbucket_vhost_stats {
    char name[TBUCKET_NAME_LEN];      /* "host:port" of the vhost.      */
    uint64_t outcome[TBUCKET_OUTCOMES];
    uint64_t cost_exceeded;           /* Requests whose cost can never
                                       * fit their bucket.              */
    /* Token leasing (issue 6). */
    uint64_t lease_hits;              /* Requests spent from a lease,
                                       * without asking Redis.          */
    uint64_t lease_refills;           /* Leases taken from Redis.       */
    uint64_t lease_tokens;            /* Tokens those leases granted.   */
} tbucket_vhost_stats;

typedef struct tbucket_client_stats {
    char redis[TBUCKET_NAME_LEN];     /* Redacted URL: no password.     */
    char policy[16];                  /* "open", "closed" or "local".   */
    tb_stats_t stats;                 /* The core's counters, shared by
                                       * every child's client.          */
} tbucket_client_stats;

/* The segment. Made once per parent process, in the first real
 * post_config, and kept across graceful restarts (it hangs off the
 * process pool), so counters never go backwards and children of an old
 * generation that are still finishing requests keep valid pointers.
 * Slots are only added, by the parent, while no child of the new
 * generation exists yet; children only do atomic adds. */
typedef struct tbucket_shm {
    uint32_t magic;
    uint32_t nvhosts;                 /* Slots in use.                  */
    uint32_t nclients;
    uint32_t pad;
    uint64_t generation;              /* Config loads since start.      */
    tbucket_vhost_stats vhosts[TBUCKET_MAX_VHOSTS];
    tbucket_client_stats clients[TBUCKET_MAX_CLIENTS];
    size_t local_entries;
    size_t local_off;                 /* Bytes from the segment start.  */
    size_t lease_entries;             /* The lease table (issue 6).     */
    size_t lease_off;                 /* Bytes from the segment start.  */
} tbucket_shm;

/* ---- Configuration -------------------------------------------------- */

/* One process's client for one distinct Redis configuration. Made in
 * child_init, freed by a cleanup on the child's pool. */
typedef struct tbucket_client {
    tb_client_t *tb;
    const char *label;                /* Redacted URL, for logs.        */
    tbucket_client_stats *slot;       /* In shared memory.              */
    server_rec *s;                    /* For log lines outside requests.*/
} tbucket_client;

/* Server (and virtual host) scope. Each scalar has a _set flag so a
 * virtual host inherits what it does not set. */
typedef struct tbucket_srv_conf {
    const char *url;                  /* NULL: the default.             */
    int timeout_ms;                   /* Command timeout, ms.           */
    int connect_timeout_ms;           /* Connect timeout, ms; 0: same as
                                       * timeout_ms.                    */
    int pool_size;                    /* Connections per child.         */
    tb_policy_t policy;
    int replicas;                     /* For the local policy.          */
    int breaker_threshold;            /* Consecutive failures.          */
    apr_int64_t breaker_cooldown_ms;
    const char *prefix;               /* Redis key prefix.              */
    const char *ip_prefix;            /* prefix + "ip:", made at config
                                       * time for keys that fell back to
                                       * the client IP.                 */
    unsigned int url_set:1, timeout_set:1, connect_timeout_set:1,
        pool_set:1, policy_set:1, replicas_set:1, threshold_set:1,
        cooldown_set:1, prefix_set:1;

    /* Filled in post_config (parent) and child_init (child). */
    const char *signature;            /* Identity of the client config. */
    int vhost_slot;                   /* Index in shm->vhosts.          */
    int client_slot;                  /* Index in shm->clients.         */
    tbucket_client *client;           /* This child's client.           */
} tbucket_srv_conf;

typedef struct tbucket_route {
    const char *name;
    tb_limit_t limit;
} tbucket_route;

typedef enum {
    TBUCKET_HDR_LEGACY = 0,
    TBUCKET_HDR_IETF,
    TBUCKET_HDR_BOTH,
    TBUCKET_HDR_OFF
} tbucket_headers_mode;

/* Directory scope (<VirtualHost>, <Location>, <Directory>, <If>,
 * .htaccess). -1 marks an unset int; pointers are NULL when unset. */
typedef struct tbucket_dir_conf {
    int enable;                       /* -1, 0 or 1.                    */
    int shadow;                       /* -1, 0 enforce, 1 shadow.       */
    int headers;                      /* -1 or a tbucket_headers_mode.  */
    int algo;                         /* -1 or a tb_algo_t.             */
    const ap_expr_info_t *key;        /* NULL: the client IP.           */
    int key_late;                     /* The key needs the user: decide
                                       * in fixups, after authn.        */
    unsigned int key_set:1, limit_set:1, cost_set:1;
    tb_limit_t limit;
    double cost;                      /* Tokens per request.            */
    /* Tenant overrides: this scope's table (key -> tb_limit_t*) and the
     * scope whose tables come next. Looked up inner to outer, so a merge
     * only copies two pointers. */
    apr_hash_t *tenants;
    const struct tbucket_dir_conf *tenants_up;
    /* Route buckets (tbucket_route), outer first, at most
     * TB_MAX_BUCKETS - 1 after a merge. */
    apr_array_header_t *routes;
    /* Issue 6. lease: -1 unset, 0 off, else the tokens one Redis call
     * takes for this server (TBucketLease N); lease_ttl_ms how long they
     * may be spent. shards: -1 unset, else K sub-buckets of capacity/K
     * and rate/K (TBucketShards K, 1..TB_MAX_SHARDS). */
    int lease;
    int lease_ttl_ms;
    int shards;
} tbucket_dir_conf;

extern module AP_MODULE_DECLARE_DATA tbucket_module;

/* ---- tbucket_config.c ---------------------------------------------- */

extern const command_rec tbucket_cmds[];
void *tbucket_create_srv_conf(apr_pool_t *p, server_rec *s);
void *tbucket_merge_srv_conf(apr_pool_t *p, void *basev, void *addv);
void *tbucket_create_dir_conf(apr_pool_t *p, char *dir);
void *tbucket_merge_dir_conf(apr_pool_t *p, void *basev, void *addv);
int tbucket_check_config(apr_pool_t *pconf, apr_pool_t *plog,
                         apr_pool_t *ptemp, server_rec *s);
/* The options of the client a server makes in each child. */
void tbucket_client_options(const tbucket_srv_conf *sc, tb_options_t *o);

/* ---- tbucket_status.c ---------------------------------------------- */

/* The segment, or NULL before the first post_config. */
extern tbucket_shm *tbucket_shm_seg;

/* Create (once per parent) or re-attach the segment; assign the slots of
 * every server. Runs in post_config. */
int tbucket_shm_setup(apr_pool_t *pconf, apr_pool_t *plog, server_rec *s);

/* Count one decision for a server. Thread- and process-safe. */
void tbucket_count(const tbucket_srv_conf *sc, tbucket_outcome o,
                   int cost_exceeded);

/* The tbucket-status handler: Prometheus text, or HTML with ?view=html. */
int tbucket_status_handler(request_rec *r);

/* The local-policy table in the segment, or NULL. */
tb_local_t *tbucket_local_table(void);

/* The lease table in the segment, or NULL (issue 6). */
tb_lease_t *tbucket_lease_table(void);

/* Count a lease hit (granted 0) or a refill that granted `granted`
 * tokens, for a server. Thread- and process-safe. */
void tbucket_count_lease(const tbucket_srv_conf *sc, int hit,
                         int64_t granted);

#endif /* MOD_TBUCKET_H */
