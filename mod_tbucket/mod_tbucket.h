/* mod_tbucket.h -- what the files of mod_tbucket share.
 *
 * The configuration records, the per-child client record, the counter
 * slots of the shared memory segment and the functions each file offers
 * the others. Only the module's own files include this; the core's public
 * header is shared/tb.h, and the status page's table of metrics is in
 * tbucket_status.h.
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
 * in mod_tbucket.c, tbucket_config.c and tbucket_check.c, 002xx in
 * tbucket_shm.c, 004xx in tbucket_settle.c, 005xx in tbucket_lease.c;
 * 00120..00129 belong to concurrency limits, 00140..00159 to local
 * protection (tbucket_local.c and its directives), 00160..00179 to who
 * is limited: the refusal line, top keys and rules. */
#define TBLOGNO(n) "TB" #n ": "

#define TBUCKET_DEFAULT_PREFIX "rl:"
/* TBucketTopKeys: keys shown per ranking by default. */
#define TBUCKET_DEFAULT_TOP_K 20

/* What a request was told; the order is the metrics' label order. */
typedef enum {
    TBUCKET_OUT_ALLOWED = 0,
    TBUCKET_OUT_REJECTED,
    TBUCKET_OUT_SHADOW_REJECTED,
    TBUCKET_OUT_FALLBACK_OPEN,
    TBUCKET_OUT_FALLBACK_CLOSED,
    TBUCKET_OUT_FALLBACK_LOCAL,
    TBUCKET_OUT_SHED,                 /* Refused by local protection:
                                       * shed by priority, or a local
                                       * concurrency limit (503).       */
    TBUCKET_OUT_BANNED,               /* Refused at once: a TBucketRule
                                       * has banned the key (429).      */
    TBUCKET_OUTCOMES
} tbucket_outcome;

/* TBucketPriority, least important first: a request is shed when the
 * busy share reaches its level's threshold; critical never is. */
typedef enum {
    TBUCKET_PRIO_LOW = 0,
    TBUCKET_PRIO_NORMAL,
    TBUCKET_PRIO_HIGH,
    TBUCKET_PRIO_CRITICAL,
    TBUCKET_PRIOS
} tbucket_priority;

/* Label values of the priorities (tbucket_shm.c). */
extern const char *const tbucket_priority_names[TBUCKET_PRIOS];

/* Local scopes one request can be in at once (nested sections that each
 * set TBucketLocalConcurrency); past it the outermost are dropped, and
 * check_config warns. */
#define TBUCKET_MAX_LOCAL 4
/* Most in-flight places of one local scope. */
#define TBUCKET_MAX_LOCAL_LIMIT 100000

/* The TBUCKET_DECISION value of each outcome, also the outcome label of
 * the metrics (defined in tbucket_shm.c, with the counters). */
extern const char *const tbucket_outcome_names[TBUCKET_OUTCOMES];

/* The kinds of limit that refuse, in the metrics' label order. */
typedef enum {
    TBUCKET_LIMIT_RATE = 0,
    TBUCKET_LIMIT_CONCURRENCY,
    TBUCKET_LIMIT_KINDS
} tbucket_limit_kind;

/* What happens to concurrency slots, in the metrics' label order. */
typedef enum {
    TBUCKET_SLOT_TAKEN = 0,
    TBUCKET_SLOT_REFUSED,
    TBUCKET_SLOT_RELEASED,
    TBUCKET_SLOT_RELEASE_FAILED,
    TBUCKET_SLOT_EVENTS
} tbucket_slot_event;

/* Label values of the two enums above (tbucket_shm.c). */
extern const char *const tbucket_limit_names[TBUCKET_LIMIT_KINDS];
extern const char *const tbucket_slot_event_names[TBUCKET_SLOT_EVENTS];

/* TBucketRefusalLog: the level of the line logged for each refusal of
 * the shared limit, in the order of its names. */
typedef enum {
    TBUCKET_REFUSAL_LOG_OFF = 0,
    TBUCKET_REFUSAL_LOG_NOTICE,
    TBUCKET_REFUSAL_LOG_INFO,
    TBUCKET_REFUSAL_LOG_DEBUG,
    TBUCKET_REFUSAL_LOGS
} tbucket_refusal_log;

extern const char *const tbucket_refusal_log_names[TBUCKET_REFUSAL_LOGS];

/* The one bucket record, tbucket_limit (tbucket_limit.h). */
#include "tbucket_limit.h"

/* ---- Shared memory slots (the layout is tbucket_shm_int.h's) ------- */

#define TBUCKET_NAME_LEN 160          /* Bytes, NUL included.           */

/* The counters of one virtual host. Children only add to them, with
 * tb_stats_add; readers use tb_stats_get. */
typedef struct tbucket_vhost_stats {
    char name[TBUCKET_NAME_LEN];      /* "host:port" of the vhost.      */
    uint64_t outcome[TBUCKET_OUTCOMES];
    uint64_t cost_exceeded;           /* Requests whose cost can never
                                       * fit their bucket.              */
    uint64_t lease_hits;              /* Requests spent from a lease,
                                       * without asking Redis.          */
    uint64_t lease_refills;           /* Leases taken from Redis.       */
    uint64_t lease_tokens;            /* Tokens those leases granted.   */
    /* Costs the application reported (TBucketCostHeader). */
    uint64_t cost_reports;            /* Valid costs reported.          */
    uint64_t cost_settled;            /* Reports that changed the
                                       * buckets: a script call, or the
                                       * server's lease.                */
    uint64_t cost_unsettled;          /* Reports that differed from the
                                       * charge but were not settled.   */
    uint64_t cost_invalid;            /* Values ignored: not a number
                                       * 0..1e9.                        */
    uint64_t cost_debited;            /* Tokens settlements took,
                                       * rounded per settlement.        */
    uint64_t cost_refunded;           /* Tokens settlements gave back.  */
    /* Refusals (shadow mode's would-be ones too) decided by a limit, not
     * by the closed policy, by the kind of limit that refused. */
    uint64_t refused[TBUCKET_LIMIT_KINDS];
    /* Concurrency slots: taken by allowed requests, refused (as
     * refused[TBUCKET_LIMIT_CONCURRENCY]), given back when the request
     * ended, and of those the releases Redis did not get (such a slot
     * lasts until its ttl). */
    uint64_t slot_event[TBUCKET_SLOT_EVENTS];
    /* Requests shed by priority (TBucketShed), and requests refused by a
     * local concurrency limit, by the request's priority. */
    uint64_t shed[TBUCKET_PRIOS];
    uint64_t local_refused[TBUCKET_PRIOS];
} tbucket_vhost_stats;

/* One section that sets TBucketLocalConcurrency, as the configuration
 * read it. Made by the directive, in the configuration pool; slot is
 * filled in post_config and names the scope's record in the segment. */
typedef struct tbucket_local_scope {
    const char *name;                 /* The sections around the
                                       * directive, e.g. "<VirtualHost
                                       * *:80> <Location /api>".        */
    int limit;                        /* N: places in flight at most;
                                       * with auto the cap's max (0:
                                       * MaxRequestWorkers, set in
                                       * post_config).                  */
    int auto_min;                     /* auto: the cap's min; 0 fixed.  */
    int slot;                         /* -1 before post_config.         */
} tbucket_local_scope;

/* A section that sets TBucketLimit: a rule, counted on the status page
 * by outcome. Made by the directive, in the configuration pool (never in
 * .htaccess, which is read per request after the segment's records are
 * given out); slot is filled in post_config and names the rule's record
 * in the segment, -1 when it has none. name comes first:
 * tbucket_section_name() reads records by it. */
typedef struct tbucket_scope_counter {
    const char *name;                 /* As a local scope's name.       */
    int slot;
} tbucket_scope_counter;

/* What the status page reads of a rule (tbucket_shm.c): its decisions by
 * outcome, every generation that had it. */
typedef struct tbucket_count_view {
    const char *name;
    uint64_t outcome[TBUCKET_OUTCOMES];
} tbucket_count_view;

/* What the status page reads of a local scope (tbucket_shm.c). */
typedef struct tbucket_local_view {
    const char *name;
    uint32_t limit;                   /* N of the newest configuration;
                                       * with auto, the cap now.        */
    uint32_t in_flight;               /* Places held now.               */
    uint64_t taken;                   /* Places taken since start.      */
    uint64_t refused;                 /* Requests refused, table full.  */
    int adaptive;                     /* auto: adapt is filled.         */
    tb_adapt_view_t adapt;
} tbucket_local_view;

#define TBUCKET_REASON_LEN 160        /* Bytes, NUL included; a multiple
                                       * of 8 (copied in 8-byte words). */

/* The failure that last opened a breaker of one Redis configuration, in
 * whichever child it opened. Only tbucket_shm.c reads or writes the
 * fields, with atomic loads and stores (its head comment says how a
 * reader never sees half a record); others go through
 * tbucket_shm_note_failure and tbucket_shm_failure_get. */
typedef struct tbucket_failure_slot {
    uint64_t seq;                     /* Odd while a writer copies.     */
    tb_shlock_t lock;                 /* Held by the one writer.        */
    uint64_t kind;                    /* TB_ERR_* of the failed call.   */
    uint64_t time_us;                 /* apr_time_t when the breaker
                                       * opened; 0: never.              */
    uint64_t reason[TBUCKET_REASON_LEN / 8]; /* The core's errstr.      */
} tbucket_failure_slot;

/* A consistent copy of a tbucket_failure_slot. */
typedef struct tbucket_failure {
    int kind;                         /* TB_ERR_* of the failed call.   */
    apr_time_t time;                  /* When the breaker opened.       */
    char reason[TBUCKET_REASON_LEN];  /* NUL-terminated, perhaps cut.   */
} tbucket_failure;

typedef struct tbucket_client_stats {
    char redis[TBUCKET_NAME_LEN];     /* Redacted URL: no password.     */
    char policy[16];                  /* "open", "closed" or "local".   */
    char servers[TBUCKET_NAME_LEN];   /* Where it is configured: the
                                       * servers (main, virtual hosts)
                                       * that use it, comma-separated,
                                       * cut with "..." when long.      */
    tb_stats_t stats;                 /* The core's counters, shared by
                                       * every child's client.          */
    tbucket_failure_slot failure;     /* The last failure that opened a
                                       * breaker, in any child.         */
} tbucket_client_stats;

/* What the status page reads of the segment: the slots in use and the
 * segment's own figures. The slot arrays are in shared memory; read
 * their counters with tb_stats_get only. */
typedef struct tbucket_shm_view {
    uint32_t nvhosts;                 /* Slots in use in vhosts.        */
    uint32_t nclients;                /* Slots in use in clients.       */
    const tbucket_vhost_stats *vhosts;
    const tbucket_client_stats *clients;
    size_t local_entries;             /* Size of the local table.       */
    uint64_t generation;              /* Config loads since start.      */
    uint64_t lease_returned;          /* Unspent lease tokens given back
                                       * to Redis, rounded per return.  */
    uint64_t cpu_set[TBUCKET_PRIOS];  /* TBucketCPUPriority's moves.    */
    uint64_t cpu_failed;
} tbucket_shm_view;

/* ---- Configuration -------------------------------------------------- */

/* One process's client for one distinct Redis configuration. Made in
 * child_init, freed by a cleanup on the child's pool. */
typedef struct tbucket_client {
    tb_client_t *tb;
    const char *label;                /* Redacted URL, for logs.        */
    tbucket_client_stats *slot;       /* In shared memory.              */
    server_rec *s;                    /* For log lines outside requests.*/
} tbucket_client;

/* Bits of tbucket_srv_conf.set: the scalars this record's directives
 * set, so that a virtual host inherits the others (the merge). */
enum {
    TBUCKET_SET_URL = 1u << 0,        /* TBucketRedis: URL and TLS.     */
    TBUCKET_SET_TIMEOUT = 1u << 1,
    TBUCKET_SET_CONNECT_TIMEOUT = 1u << 2,
    TBUCKET_SET_POOL = 1u << 3,
    TBUCKET_SET_POLICY = 1u << 4,
    TBUCKET_SET_REPLICAS = 1u << 5,
    TBUCKET_SET_THRESHOLD = 1u << 6,
    TBUCKET_SET_COOLDOWN = 1u << 7,
    TBUCKET_SET_PREFIX = 1u << 8,
    TBUCKET_SET_IPV6 = 1u << 9,
    TBUCKET_SET_SHED = 1u << 10,
    TBUCKET_SET_SHED_RETRY = 1u << 11,
    TBUCKET_SET_REFUSAL_LOG = 1u << 12,
    TBUCKET_SET_SECRET = 1u << 13
};

/* Server (and virtual host) scope; `set` says which scalars a virtual
 * host set itself (TBUCKET_SET_*). */
typedef struct tbucket_srv_conf {
    const char *url;                  /* NULL: the default.             */
    int timeout_ms;                   /* Command timeout, ms.           */
    int connect_timeout_ms;           /* Connect timeout, ms; 0: same as
                                       * timeout_ms.                    */
    int pool_size;                    /* Connections per child.         */
    int policy;                       /* A tb_policy_t.                 */
    int replicas;                     /* For the local policy.          */
    int breaker_threshold;            /* Consecutive failures.          */
    apr_int64_t breaker_cooldown_ms;
    const char *prefix;               /* Redis key prefix.              */
    const char *ip_prefix;            /* prefix + "ip:", made at config
                                       * time for keys that fell back to
                                       * the client IP.                 */
    int ipv6_bits;                    /* TBucketIPv6Prefix: the bits of
                                       * an IPv6 client address that key
                                       * it (tb_ip_key).                */
    /* TBucketShed: the busy share, in percent of the server's workers,
     * at which each priority's requests are shed; 0 never (a level left
     * out, and always critical). shed_min is the smallest set, 0 when
     * none is: from there on 429s close their connection too.
     * shed_retry_s is the Retry-After of every 503 of local protection
     * (TBucketShedRetryAfter), in seconds. */
    int shed_pct[TBUCKET_PRIOS];
    int shed_min;
    int shed_retry_s;
    /* TBucketRefusalLog, a tbucket_refusal_log. */
    int refusal_log;
    /* TBucketTopKeys K (0: Off; TBUCKET_DEFAULT_TOP_K unless set), read
     * in the main server's record only. */
    int top_k;
    /* TBucketCPUPriority On (cpu_on) and each priority's nice step, read
     * in the main server's record only (tbucket_cpu_check). */
    int cpu_on;
    int cpu_step[TBUCKET_PRIOS];
    /* TLS: the tls_* options of the TBucketRedis line (they go with its
     * URL, never inherited apart from it) and the context made from
     * them at config time, in the parent, before privileges are
     * dropped; NULL for a plaintext URL. Freed with the config pool. */
    tb_tls_options_t tls;
    tb_tls_t *tls_ctx;
    int engine;                       /* A tb_engine_t (engine= of the
                                       * TBucketRedis line).            */
    int coalesce;                     /* 1: through the host's
                                       * coalescer (coalesce=on of the
                                       * TBucketRedis line), else 0.    */
    const tb_token_keys_t *secret;    /* TBucketSecret, NULL unset.     */
    unsigned int set;                 /* TBUCKET_SET_* bits.            */

    /* Filled in post_config (parent) and child_init (child). */
    const char *signature;            /* Identity of the client config. */
    const char *coalesce_url;         /* coalesce=on: "unix:" and the
                                       * coalescer's socket, the URL the
                                       * children's client uses.        */
    int vhost_slot;                   /* Slot of the vhost's counters.  */
    const char *vhost_name;           /* Its name, "host:port".         */
    int client_slot;                  /* Slot of the client's counters. */
    tbucket_client *client;           /* This child's client.           */
} tbucket_srv_conf;

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
    int key_is_addr;                  /* The key is the client address
                                       * written out (%{REMOTE_ADDR}):
                                       * warned about at startup.       */
    int key_const;                    /* The key is a constant: every
                                       * client shares the bucket, so
                                       * its refusals are no client's
                                       * doing (TB00162).               */
    unsigned int key_set:1, limit_set:1, cost_set:1;
    tb_limit_t limit;
    /* The scope that set the unnamed limit, for its counts; NULL in
     * .htaccess. */
    const tbucket_scope_counter *rule;
    double cost;                      /* Tokens per request.            */
    /* Tenant overrides: this scope's table (key -> tb_limit_t*) and the
     * scope whose tables come next. Looked up inner to outer, so a merge
     * only copies two pointers. */
    apr_hash_t *tenants;
    const struct tbucket_dir_conf *tenants_up;
    /* lease: -1 unset, 0 off, else the tokens one Redis call takes for
     * this server (TBucketLease N); lease_ttl_ms how long they may be
     * spent. shards: -1 unset, else K sub-buckets of capacity/K and
     * rate/K (TBucketShards K, 1..TB_MAX_SHARDS). */
    int lease;
    int lease_ttl_ms;
    int shards;
    /* TBucketCostHeader: the response header that reports a request's
     * real cost; NULL unset, "" turned off in this scope. */
    const char *cost_header;
    /* concurrency: -1 unset, 0 off, else at most N requests of a key in
     * flight (TBucketConcurrency N, 1..TB_MAX_CONCURRENCY);
     * concurrency_ttl_ms the life of a slot never released. */
    int concurrency;
    int concurrency_ttl_ms;
    /* TBucketPriority: -1 unset (normal), else a tbucket_priority.
     * prio_lowered: set in .htaccess, where it may only lower what the
     * server's configuration gives (the merge takes the lower). */
    int priority;
    unsigned int prio_lowered:1;
    /* TBucketLocalConcurrency: local_state -1 unset, 0 Off (the scopes
     * of outer sections no longer apply), 1 set; local[] the scopes a
     * request here takes a place in, outer first. */
    int local_state;
    int nlocal;
    const tbucket_local_scope *local[TBUCKET_MAX_LOCAL];
    /* Named limits (TBucketLimit NAME and its aliases): this scope's
     * after the merge, outer first, an inner limit of a name replacing
     * the outer one; "Off" records are kept until the merge applies
     * them. limits_late: a limit's own key needs the request's user or
     * another module's variables. form_limit: TBucketFormLimit, -1
     * unset. */
    int nlimits;
    const tbucket_limit *limits[TBUCKET_MAX_LIMITS];
    int limits_late;
    int limits_body;                  /* A limit reads the form body.   */
    int limits_counted;               /* A limit has count=.            */
    int limits_scoped;                /* Limits keyed by TBucketKey.    */
    apr_off_t form_limit;
    int form_timeout_ms;              /* TBucketFormTimeout, -1 unset.  */
} tbucket_dir_conf;

typedef struct tbucket_settle tbucket_settle;

/* What the first limited request of a chain decided; kept in the
 * request_config of the chain's root so that later requests of the chain
 * (internal redirects, ErrorDocument) copy it instead of counting again,
 * and so that the chain's real cost can be settled after the response. */
typedef struct tbucket_charge tbucket_charge;

/* What an allowed decision took, kept for a later part of the chain's
 * limits to give back if it refuses (all or nothing across parts). */
typedef struct tbucket_taken {
    tb_request_t q;
    tb_take_t takes[TB_MAX_BUCKETS];
    tb_result_t res;
} tbucket_taken;

typedef struct tbucket_req {
    int decided;                      /* The shared limit decided every
                                       * part; when 0 only local
                                       * protection ran, or the late
                                       * parts are still to come.       */
    int early;                        /* check_access decided the early
                                       * and body parts.               */
    int drop;                         /* Refused with its body unread:
                                       * close without lingering.      */
    tbucket_taken *taken;             /* An earlier part's takes, while
                                       * a later part is to come.      */
    int refused;                      /* The shared limit refused it.   */
    tbucket_outcome outcome;
    const char *remaining;            /* TBUCKET_REMAINING, as text.    */
    const char *rule;                 /* TBUCKET_RULE: the TBucketRule
                                       * that refused, or NULL.         */
    tbucket_settle *settle;           /* tbucket_settle.c's, or NULL.   */
    tbucket_charge *charge;           /* tbucket_charge.c's count=
                                       * charge, or NULL.               */
} tbucket_req;

extern module AP_MODULE_DECLARE_DATA tbucket_module;

/* ---- mod_tbucket.c -------------------------------------------------- */

/* The first request of r's chain: internal redirects point back through
 * r->prev, sub-requests up through r->main. */
request_rec *tbucket_chain_root(request_rec *r);

/* r's client address as a key: an IPv6 client's network
 * (TBucketIPv6Prefix), in r's pool. */
const char *tbucket_ip_key(request_rec *r, const tbucket_srv_conf *sc);

/* Log and note what an answer from Redis (or its absence) says. */
void tbucket_note_call(request_rec *r, tbucket_srv_conf *sc,
                       const tb_result_t *res);

/* r of root's chain is refused: when its body was never read, close the
 * connection without reading it. */
void tbucket_refusing_body(request_rec *r, request_rec *root);

/* 0 when the shared limit refused root's chain (mod_tbucket.c), else 1:
 * whether the chain's latency says anything about the application. */
int tbucket_chain_admitted(request_rec *root);

/* ---- tbucket_client.c ---------------------------------------------- */

/* post_config (parent): each server's client identity and pool size;
 * one warning per Redis configuration with tls_verify=off. */
void tbucket_clients_post_config(apr_pool_t *pconf, apr_pool_t *ptemp,
                                 server_rec *main_s);

/* child_init: one client per distinct Redis configuration, freed with
 * pchild. */
void tbucket_clients_child_init(apr_pool_t *pchild, server_rec *main_s);

/* 1 once the child's pool is being destroyed: the child is exiting. */
int tbucket_child_exiting(void);

/* Log a breaker transition once, on the call that made it (a decision's
 * or a settlement's). */
void tbucket_note_breaker(request_rec *r, const tbucket_client *c,
                          const tb_result_t *res,
                          const tbucket_srv_conf *sc);

/* ---- tbucket_config.c ---------------------------------------------- */

/* The directive table; the head comment of tbucket_config.c is the
 * directive manual. */
extern const command_rec tbucket_cmds[];

/* The sections around cmd's directive, outermost first, as written:
 * "<VirtualHost *:80> <Location /api>", or "server" at the top level;
 * stable across reloads of the same text, at most TBUCKET_NAME_LEN - 8
 * bytes. taken (may be NULL) holds pointers to the records named so far
 * in this configuration, each starting with its name: a name already
 * there gets " #2", " #3"... From cmd->temp_pool. */
const char *tbucket_section_name(cmd_parms *cmd,
                                 const apr_array_header_t *taken);

/* pre_config: start a new list of scopes that set a limit. */
void tbucket_scopes_pre_config(apr_pool_t *pconf);

/* The record of the scope cmd's unnamed TBucketLimit is in (made on
 * first need), or NULL in .htaccess. */
const tbucket_scope_counter *tbucket_scope_record(cmd_parms *cmd,
                                         const tbucket_dir_conf *dc);

/* post_config (parent): give each such scope its record in the segment
 * (by name, so a scope a restart keeps keeps its counts); a scope left
 * without one is logged and not counted. */
void tbucket_scopes_setup(server_rec *main_s);

/* CAPACITY RATE as a checked limit; the start of a quote inside
 * %{NAME:arg} (httpd's scanner cannot take it), or NULL. */
const char *tbucket_parse_limit(cmd_parms *cmd, const char *cap,
                                const char *rate, tb_limit_t *lim);
const char *tbucket_quote_in_var_arg(const char *arg);

/* 1 when the string expression expr names no variable and no function
 * (a constant such as "all"): every request gets the same key (an empty
 * one is no constant: it stands for the client's address). Parses
 * expr again in cmd->temp_pool; at config time only. */
int tbucket_expr_constant(cmd_parms *cmd, const char *expr);

/* ---- tbucket_options.c ---------------------------------------------- */

/* What one value of a directive is: a scalar directive's argument, or
 * one name=value option. */
typedef enum {
    TBUCKET_V_INT = 0,                /* A whole number in min..max.    */
    TBUCKET_V_DURATION,               /* ms in min..max, the core's
                                       * grammar (flags: TB_DURATION_*).*/
    TBUCKET_V_NAME,                   /* The index of one of names (max
                                       * of them), any case.            */
    TBUCKET_V_TEXT,                   /* The text, copied.              */
    TBUCKET_V_FN                      /* fn reads it.                   */
} tbucket_value_kind;

/* The type of the field a number goes to. */
typedef enum {
    TBUCKET_AT_INT = 0,
    TBUCKET_AT_INT64,
    TBUCKET_AT_DOUBLE
} tbucket_value_at;

/* One value, as a table entry; a table of options ends with an entry
 * whose name is NULL. */
typedef struct tbucket_value {
    const char *name;                 /* The option's name; a scalar's:
                                       * what its value is called.      */
    tbucket_value_kind kind;
    tbucket_value_at at;
    apr_size_t off;                   /* The field, in the record.      */
    unsigned int set;                 /* TBUCKET_SET_* bit it sets.     */
    int64_t min, max;                 /* INT, DURATION (ms): the range;
                                       * NAME: the count of names.      */
    unsigned int flags;               /* DURATION: TB_DURATION_*.       */
    const char *const *names;         /* NAME: in enum order.           */
    const char *form;                 /* In "expected a=FORM": "N",
                                       * "DURATION"; NULL for NAME (its
                                       * names) or to leave it out.     */
    const char *why;                  /* Added to a refusal; for NAME,
                                       * the whole of it.               */
    const char *(*fn)(cmd_parms *cmd, void *rec, const char *value);
} tbucket_value;

/* text as v says into rec: NULL, or "DIRECTIVE: bad NAME 'TEXT': WHY"
 * from cmd->pool. */
const char *tbucket_value_store(cmd_parms *cmd, const tbucket_value *v,
                                void *rec, const char *text);
/* Every word of args as a name=value option of table (names in any
 * case; a later one wins) into rec; each option's bit into *set and the
 * options read into *count (either may be NULL). NULL, or the refusal:
 * a bad value as above, "DIRECTIVE: unknown option 'WORD' (expected
 * a=N, b=DURATION or c=x|y)" for a word the table does not have. */
const char *tbucket_options(cmd_parms *cmd, const tbucket_value *table,
                            void *rec, unsigned int *set, const char *args,
                            int *count);
/* "DIRECTIVE: bad WHAT 'VALUE': WHY" from cmd->pool; a whole number in
 * min..max, else that message; "name=value" into name (returned, from
 * p) and *value, NULL when there is no '='. */
const char *tbucket_bad_value(cmd_parms *cmd, const char *what,
                              const char *value, const char *why);
const char *tbucket_int_value(cmd_parms *cmd, const char *what,
                              const char *arg, int64_t min, int64_t max,
                              int64_t *n);
const char *tbucket_split_opt(apr_pool_t *p, const char *word,
                              const char **value);
/* In .htaccess without AllowOverride Limit (or an AllowOverrideList
 * naming the directive): the refusal saying which; else NULL. Every
 * scope directive's handler starts with TBUCKET_HTACCESS_CHECK. */
const char *tbucket_htaccess_denied(cmd_parms *cmd);
#define TBUCKET_HTACCESS_CHECK(cmd) do { const char *denied_ = \
    tbucket_htaccess_denied(cmd); if (denied_) return denied_; } while (0)

/* ---- tbucket_config_redis.c ------------------------------------------ */

/* TBucketRedis and TBucketBreaker. */
const char *tbucket_set_redis(cmd_parms *cmd, void *dummy, const char *args);
const char *tbucket_set_breaker(cmd_parms *cmd, void *dummy,
                                const char *args);

/* ---- tbucket_records.c --------------------------------------------- */

void *tbucket_create_srv_conf(apr_pool_t *p, server_rec *s);
void *tbucket_merge_srv_conf(apr_pool_t *p, void *basev, void *addv);
void *tbucket_create_dir_conf(apr_pool_t *p, char *dir);
void *tbucket_merge_dir_conf(apr_pool_t *p, void *basev, void *addv);
/* The options of the client a server makes in each child. */
void tbucket_client_options(const tbucket_srv_conf *sc, tb_options_t *o);

/* ---- tbucket_check.c ----------------------------------------------- */

/* The options of one limit record (l->name NULL: the unnamed
 * TBucketLimit) that cannot go together, from the table of what cannot:
 * the refusal naming the record, the pair and why, or NULL. At parse
 * time, so .htaccess too. */
const char *tbucket_refuse_options(cmd_parms *cmd, const tbucket_limit *l);

/* The check_config hook: refuses what cannot work and warns about what
 * can be seen to be wrong across scopes, also under apache2 -t. */
int tbucket_check_config(apr_pool_t *pconf, apr_pool_t *plog,
                         apr_pool_t *ptemp, server_rec *s);

/* ---- tbucket_shm.c, tbucket_shm_records.c: tbucket_shm.h ---------- */

#include "tbucket_shm.h"

/* ---- tbucket_cpu.c -------------------------------------------------- */

/* TBucketCPUPriority's directive handler (main server only). */
const char *tbucket_cpu_set(cmd_parms *cmd, void *dummy, const char *args);
/* pre_config: Off until the directive says otherwise. */
void tbucket_cpu_pre_config(void);
/* check_config (parent, before children): main_s's settings taken for
 * the configuration that runs, RLIMIT_NICE raised so that a
 * worker can put its priority back, or the message refusing the start. */
const char *tbucket_cpu_check(apr_pool_t *p, server_rec *main_s);
/* post_config (parent): the helper started where the workers need one. */
int tbucket_cpu_post_config(server_rec *main_s);
/* child_init: the worker's own nice value, the one to put back. */
void tbucket_cpu_child_init(void);
/* Move r's thread to the step of its priority in dc (the chain's root
 * gives it back when the response ends): from the decision path, before
 * anything is decided, so that a low request that is refused is answered
 * at low's step too; again (one load) from the last fixup. */
void tbucket_cpu_enter(request_rec *r, request_rec *root,
                       const tbucket_dir_conf *dc);
/* register_hooks: the fixup that moves a thread, the give-back before a
 * thread reads its next request. */
void tbucket_cpu_register(void);

/* ---- tbucket_coalesce.c --------------------------------------------- */

/* post_config (parent): the coalescers the configuration asks for
 * (coalesce=on) started or kept, the others retired; each such server
 * gets its coalesce_url. OK, or an error status (logged). */
int tbucket_coalesce_post_config(apr_pool_t *pconf, server_rec *main_s);

/* ---- tbucket_nice.c ------------------------------------------------- */

/* The helper for [lo, hi] (started, or kept from an earlier load): the
 * socket children ask on, or -1 (logged). */
int tbucket_nice_helper(server_rec *main_s, int lo, int hi);
/* Ask the helper to move thread tid to nice: 0, or -1. */
int tbucket_nice_ask(int fd, pid_t tid, int nice);

/* ---- tbucket_local.c ------------------------------------------------ */

/* Every TBucketLocalConcurrency of the configuration being read, in the
 * order read; the directive adds to it (tbucket_config.c). */
tbucket_local_scope *tbucket_local_scope_add(cmd_parms *cmd, int limit,
                                             int auto_min);

/* post_config (parent): forget the scopes of the configuration read
 * before, give this one's scopes their records in the segment (by name,
 * so a scope that survives a restart keeps its places) and read the
 * MPM's size. */
int tbucket_local_setup(apr_pool_t *pconf, server_rec *main_s);

/* pre_config: start a new list of scopes. */
void tbucket_local_pre_config(apr_pool_t *pconf);

/* child_init: this process's owner tag for the places it takes. */
void tbucket_local_child_init(void);

/* The hooks local protection needs (child_status, in the parent). */
void tbucket_local_register(void);

/* The workers busy with a request now (scoreboard, at most a
 * millisecond old) and the most the server runs (MaxRequestWorkers). */
void tbucket_local_busy(apr_time_t now, uint32_t *busy, uint32_t *workers);

/* 1 when requests of priority prio are shed now on sc's server. */
int tbucket_local_shed(const tbucket_srv_conf *sc, tbucket_priority prio,
                       apr_time_t now);

/* 1 when the server is at or above sc's lowest shed threshold: refused
 * clients should close their connection. */
int tbucket_local_crowded(const tbucket_srv_conf *sc, apr_time_t now);

/* Take a place in every local scope of dc for r's chain, whose first
 * request is root: given back when r's response ends, or at the latest
 * when root's pool goes. NULL when all were taken (or dc has none);
 * else the scope that was full, and nothing is held. */
const tbucket_local_scope *tbucket_local_take(request_rec *r,
                                              request_rec *root,
                                              const tbucket_dir_conf *dc);

/* Root's chain was refused by local protection: until its pool goes,
 * its worker is not counted as busy. */
void tbucket_local_refusing(request_rec *root);

/* The effective priority of a merged scope. */
tbucket_priority tbucket_dir_priority(const tbucket_dir_conf *dc);

/* ---- tbucket_release.c ---------------------------------------------- */

/* Gives back what a chain holds; data as given to tbucket_release_at_end.
 * Runs on the request's thread, or from a prefork child's signal handler
 * as it exits (tbucket_child_exiting() then says so). */
typedef apr_status_t (*tbucket_release_fn)(void *data);

/* Register the output filter that gives back at the end of a response. */
void tbucket_release_register(void);

/* Have fn(data) run once for the chain of r, whose first request is root:
 * when the EOS of the chain's final response passes the output filters,
 * before the response's last bytes go to the connection, or at the latest
 * when root's pool is destroyed. data lives at least as long as root's
 * pool. */
void tbucket_release_at_end(request_rec *r, request_rec *root,
                            tbucket_release_fn fn, void *data);

/* ---- tbucket_lease.c ------------------------------------------------ */

/* post_config (parent): have the lease table drained into Redis when
 * this configuration ends (a stop or a restart, graceful or not). */
void tbucket_lease_setup(apr_pool_t *pconf, server_rec *main_s);

/* ---- tbucket_answer.c ------------------------------------------------ */

/* One decision of the shared limit in the making: the request, its
 * buckets, what answered and how a refusal is told. */
typedef struct tbucket_decision {
    tb_take_t takes[TB_MAX_BUCKETS];
    const tbucket_limit *which[TB_MAX_BUCKETS]; /* Each take's
                                       * TBucketRule, NULL for the main
                                       * bucket and routes.             */
    const char *base_key[TB_MAX_BUCKETS]; /* A known= rule's key K before
                                       * a known client's own bucket
                                       * was chosen, else NULL.         */
    unsigned known;                   /* Takes decided as known.        */
    tb_request_t q;
    tb_result_t res;
    apr_int64_t retry_s;              /* Retry-After of a refusal, >= 1;
                                       * 0 when allowed or the cost can
                                       * never fit.                     */
    int cost_exceeded;                /* Refused for good: 403.         */
    int by_conc;                      /* Refused by TBucketConcurrency. */
} tbucket_decision;

/* The limit headers of d's binding bucket (TBucketHeaders), in
 * err_headers_out; retry_s the Retry-After of a refusal, or 0. */
void tbucket_limit_headers(request_rec *r, const tbucket_dir_conf *dc,
                           const tb_take_t *takes, const tb_result_t *res,
                           apr_int64_t retry_s);

/* Answer r here with status and a small JSON body, unless an
 * ErrorDocument is set for the status (httpd's error path serves it). */
int tbucket_respond(request_rec *r, int status, const char *body);

/* The TBucketRule that bound a refusal of d, or NULL; the name of the
 * limit that decided d (a route's or rule's, NULL for the main bucket,
 * "concurrency"); d's key as operators see it, into out
 * (TB_TOPK_KEY_LEN bytes), the refusing rule's when a rule refused. */
const tbucket_limit *tbucket_refusing_rule(const tbucket_decision *d);
const char *tbucket_binding_name(const tbucket_decision *d);
size_t tbucket_shown_key(const tbucket_srv_conf *sc,
                         const tbucket_decision *d, char *out);

/* Answer r, which the shared limit refused (d, recorded in rq): 403 for
 * a cost that never fits, else 429 with Retry-After and the refusal
 * line. */
int tbucket_refuse_shared(request_rec *r, const tbucket_dir_conf *dc,
                          const tbucket_srv_conf *sc, const tbucket_req *rq,
                          const tbucket_decision *d);

/* ---- tbucket_settle.c ----------------------------------------------- */

/* Record what settling the chain's real cost needs after a decision of
 * request q made under dc (nothing when TBucketCostHeader is not set
 * there): the header's name, the request and what it charged, and
 * whether it can be settled at all (allowed, by Redis or a lease, with
 * a token bucket or GCRA). */
tbucket_settle *tbucket_settle_note(request_rec *root,
                                    const tbucket_dir_conf *dc,
                                    tbucket_srv_conf *sc,
                                    const tb_request_t *q,
                                    const tb_result_t *res);

/* Register the cost header's filter and the hooks that settle. */
void tbucket_settle_register(void);

/* ---- tbucket_status.c ---------------------------------------------- */

/* The tbucket-status handler: Prometheus text, or HTML with ?view=html. */
int tbucket_status_handler(request_rec *r);

/* The login defence's files: parts, known clients. */
#include "tbucket_login.h"

#endif /* MOD_TBUCKET_H */
