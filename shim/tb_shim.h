/* tb_shim.h -- what the shim's config loader hands to its wrappers.
 *
 * shim_conf.c, with its table of settings in shim_conf_table.c, turns a
 * libconfig file into one shim_conf_t: the core's client options plus
 * two small tables of rules, inbound (matched on the local port of an
 * accepted connection) and outbound (matched on the destination of a
 * connect()). tb_shim.c owns the only instance, fills it once at
 * initialisation and only reads it afterwards, so the wrappers need no
 * lock to consult it. Nothing here allocates: a rule table is a fixed
 * array, and a per-port bitmap lets a wrapper dismiss an unmatched call
 * with one bit test.
 *
 * The tbucket tool (tools/tbucket.c) links both loader files too and
 * reads a shim config through shim_conf_load() and shim_conf_rule(), so
 * both accept the same files, with the same defaults, rule names and
 * keys. No symbol declared here is exported from the shim's .so.
 */
#ifndef TB_SHIM_H
#define TB_SHIM_H

/* local_concurrency = "auto" (shim_rule_t), and auto's default bounds. */
#define SHIM_LOCAL_AUTO (-1)
#define SHIM_LOCAL_AUTO_MIN 1
#define SHIM_LOCAL_AUTO_MAX 256

#include <stddef.h>
#include <stdint.h>

#include "tb.h"

#define SHIM_MAX_RULES 64   /* Rules per direction.                      */
#define SHIM_MAX_ADDRS 8    /* Addresses a rule's hostname may resolve to.*/
#define SHIM_ERR_LEN 512    /* Room for "file:line: problem".             */
#define SHIM_URL_MAX 512
#define SHIM_PATH_MAX 512   /* A TLS file name, NUL included.            */
#define SHIM_MAX_LEASE 1000000        /* `lease`, tokens.                  */
#define SHIM_MAX_LEASE_TTL_MS 60000   /* `lease_ttl`, ms.                  */

typedef enum {
    SHIM_KEY_FIXED = 0,   /* A fixed name shared by every process.       */
    SHIM_KEY_PEER = 1,    /* The peer's IP address (inbound only).       */
    SHIM_KEY_PROGRAM = 2  /* The program's own short name.               */
} shim_key_kind_t;

typedef enum {
    SHIM_ACT_CLOSE = 0,   /* Close silently, keep waiting in accept().   */
    SHIM_ACT_HTTP429 = 1  /* Write a minimal 429 response, then close.   */
} shim_action_t;

typedef enum {
    SHIM_ON_FAIL = 0,     /* connect() returns -1 with fail_errno.       */
    SHIM_ON_WAIT = 1      /* Sleep the retry-after, up to max_wait_ms.   */
} shim_on_limit_t;

/* One IP address in network byte order; 4 bytes used for AF_INET. */
typedef struct shim_addr {
    int family;               /* AF_INET or AF_INET6.                     */
    unsigned char bytes[16];
} shim_addr_t;

typedef struct shim_rule {
    char name[TB_NAME_MAX + 1];
    char prefix[TB_PREFIX_MAX + 1]; /* "<conf prefix><in|out>:<name>:".   */
    int line;                 /* Line of the rule in the config file.     */
    int port;                 /* 1..65535, host byte order.               */
    int naddrs;               /* 0 matches any address.                   */
    shim_addr_t addrs[SHIM_MAX_ADDRS];
    shim_key_kind_t key_kind;
    char key[TB_KEY_RAW_MAX + 1]; /* The key for FIXED and PROGRAM.        */
    size_t key_len;
    tb_take_t take;           /* Capacity (tokens), rate (tokens/s), cost.*/
    tb_algo_t algo;           /* `algorithm`, default token-bucket.       */
    shim_action_t action;     /* Inbound only.                            */
    shim_on_limit_t on_limit; /* Outbound only.                           */
    int64_t max_wait_ms;      /* Outbound `wait`: total sleep bound, ms.  */
    int fail_errno;           /* Outbound: errno of a refused connect.    */
    int nonblock_errno;       /* Outbound: errno on a non-blocking socket
                               * under `nonblocking = "fail"`.          */
    int nonblock_wait;        /* Outbound: 1 (default, "wait") lets
                               * on_limit decide for a non-blocking socket
                               * too; 0 ("fail") never sleeps on one.   */
    int concurrency;          /* Inbound: 0, or at most N connections of
                               * one key open at once. A rule may have
                               * this alone (take.limit.capacity 0: no
                               * bucket).                               */
    int64_t concurrency_ttl_ms; /* Life of a slot never released, ms.    */
    int local_concurrency;    /* Inbound: 0, or at most N connections of
                               * this rule open at once in this host's
                               * processes, counted in shared memory
                               * without Redis (shim_local.c), or
                               * SHIM_LOCAL_AUTO: a cap set from how long
                               * connections last, within local_min and
                               * local_max. A rule may have this alone. */
    int local_min, local_max; /* auto's bounds; 0 until read.          */
    int lease;                /* 0, or the most tokens one lease takes
                               * from the bucket (1..SHIM_MAX_LEASE):
                               * the host's processes spend them without
                               * a Redis call (shim_lease.c). Only on a
                               * token bucket with a whole cost >= 1 and
                               * no `concurrency`.                      */
    int64_t lease_ttl_ms;     /* How long a lease may be spent, ms,
                               * 1..SHIM_MAX_LEASE_TTL_MS.              */
} shim_rule_t;

typedef struct shim_conf {
    tb_options_t opts;        /* opts.url points into url[], the set ones
                               * of opts.tls into the tls_ buffers.      */
    char url[SHIM_URL_MAX];
    char tls_ca[SHIM_PATH_MAX];     /* Empty: not set.                    */
    char tls_cert[SHIM_PATH_MAX];
    char tls_key[SHIM_PATH_MAX];
    char tls_server_name[256];
    char prefix[TB_PREFIX_MAX + 1];
    int ipv6_bits;            /* ipv6_prefix: bits of an IPv6 peer that
                               * key it (tb_ip_key), default 64.         */
    int strict;               /* 1: a bad config stops the program.       */
    int timeout_set;          /* 1: the file sets timeout_ms.             */
    int connect_timeout_set;  /* 1: the file sets connect_timeout_ms.     */
    int nin;
    int nout;
    shim_rule_t in[SHIM_MAX_RULES];
    shim_rule_t out[SHIM_MAX_RULES];
    unsigned char in_ports[65536 / 8];  /* Bit p set: a rule has port p. */
    unsigned char out_ports[65536 / 8];
} shim_conf_t;

/* Load the libconfig file at `path` into *conf (zeroed and defaulted
 * first). Hostnames in outbound rules are resolved here, once. Returns
 * TB_OK, or TB_ERR with "path:line: problem" in err. conf->strict holds
 * the file's `strict` setting whenever the file could be parsed, even on
 * a later error, so the caller can decide whether to refuse to start.
 * Not thread-safe: call once, from initialisation. */
int shim_conf_load(const char *path, shim_conf_t *conf, char *err,
                   size_t errlen);

/* The rule that `want` names: "in:NAME" or "out:NAME" in that table, a
 * bare "NAME" in the inbound table first. A rule without a `name` is
 * called in1, in2, ... or out1, ... by its place in its list. Returns NULL
 * when no rule has that name. Reads conf only. */
const shim_rule_t *shim_conf_rule(const shim_conf_t *conf, const char *want);

/* 1 when rule r asks Redis: it has a bucket or a Redis concurrency
 * limit. A rule with local_concurrency alone never does. */
static inline int shim_rule_uses_redis(const shim_rule_t *r)
{
    return r->take.limit.capacity > 0 || r->concurrency > 0;
}

/* 1 when some rule of the table uses TCP port `port`. */
static inline int shim_port_has_rule(const unsigned char *bitmap, int port)
{
    return (bitmap[port >> 3] >> (port & 7)) & 1;
}

#endif /* TB_SHIM_H */
