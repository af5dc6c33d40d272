/* shim_conf_int.h -- what the config loader's two files share.
 *
 * shim_conf.c reads the file, its rules and what a rule's settings say
 * together; shim_conf_table.c holds the table of settings, one entry
 * each, and reads every value through it. This header joins them: the
 * loader's error buffer, the one-line message, the index of each
 * setting in its table and the pass that reads a group's settings.
 * libconfig is included here, so only the loader's files include this;
 * the wrappers and the tbucket tool see tb_shim.h alone.
 */
#ifndef SHIM_CONF_INT_H
#define SHIM_CONF_INT_H

#include <libconfig.h>

#include "tb_shim.h"

/* Where a message goes: "path:line: problem" into err (errlen bytes). */
typedef struct shim_loader {
    const char *path;
    char *err;
    size_t errlen;
} shim_loader_t;

/* Which rules a setting belongs to: an inbound rule, an outbound rule or
 * both; SHIM_DIR_TOP for a top-level setting. The top-level `inbound`
 * and `outbound` lists carry the direction of the rules they hold. */
#define SHIM_DIR_TOP 0
#define SHIM_DIR_IN 1
#define SHIM_DIR_OUT 2
#define SHIM_DIR_BOTH (SHIM_DIR_IN | SHIM_DIR_OUT)

/* The top-level settings, in the order of their table. */
typedef enum {
    SHIM_SC_STRICT, SHIM_SC_REDIS_URL, SHIM_SC_TIMEOUT,
    SHIM_SC_CONNECT_TIMEOUT, SHIM_SC_POOL_SIZE, SHIM_SC_POLICY,
    SHIM_SC_ENGINE, SHIM_SC_BREAKER_THRESHOLD, SHIM_SC_BREAKER_COOLDOWN,
    SHIM_SC_IPV6_PREFIX, SHIM_SC_REPLICAS, SHIM_SC_LOCAL_ENTRIES,
    SHIM_SC_CLOSED_RETRY, SHIM_SC_PREFIX, SHIM_SC_TLS_CA, SHIM_SC_TLS_CERT,
    SHIM_SC_TLS_KEY, SHIM_SC_TLS_SERVER_NAME, SHIM_SC_TLS_VERIFY,
    SHIM_SC_INBOUND, SHIM_SC_OUTBOUND,
    SHIM_SC_COUNT
} shim_scalar_id_t;

/* A rule's settings, in the order of their table. */
typedef enum {
    SHIM_RS_NAME, SHIM_RS_PORT, SHIM_RS_ADDRESS, SHIM_RS_HOST, SHIM_RS_KEY,
    SHIM_RS_CAPACITY, SHIM_RS_RATE, SHIM_RS_COST, SHIM_RS_ALGORITHM,
    SHIM_RS_LEASE, SHIM_RS_LEASE_TTL, SHIM_RS_CONCURRENCY,
    SHIM_RS_LOCAL_CONCURRENCY, SHIM_RS_LOCAL_MIN, SHIM_RS_LOCAL_MAX,
    SHIM_RS_CONCURRENCY_TTL, SHIM_RS_ACTION,
    SHIM_RS_ON_LIMIT, SHIM_RS_MAX_WAIT, SHIM_RS_ERRNO,
    SHIM_RS_NONBLOCK_ERRNO, SHIM_RS_NONBLOCKING,
    SHIM_RS_COUNT
} shim_rule_id_t;

/* Write "path:line: message" into the loader's buffer and return TB_ERR.
 * s may be NULL when no setting is to blame (the line is then left out,
 * as it is for a setting libconfig gives no line). */
int shim_conf_fail(shim_loader_t *ld, const config_setting_t *s,
                   const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* *out is the string value of s; TB_ERR, naming s, for any other type. */
int shim_conf_string(shim_loader_t *ld, const config_setting_t *s,
                     const char **out);

/* Read every setting of group g through the table of dir (SHIM_DIR_TOP:
 * the top-level settings into a shim_conf_t at base; SHIM_DIR_IN or
 * SHIM_DIR_OUT: one rule's into a shim_rule_t). Each value is checked
 * and stored in its field as it is met, in the file's order, so the
 * first bad one is the one reported; a name the table does not have for
 * dir is refused. seen[id] (SHIM_SC_COUNT or SHIM_RS_COUNT entries,
 * zeroed by the caller) is set to each setting read, for the checks
 * that need several settings, which the caller makes afterwards. The
 * `key` of a rule and the `inbound` and `outbound` lists are only
 * recorded in seen, not read. */
int shim_conf_read_group(shim_loader_t *ld, const config_setting_t *g,
                         int dir, void *base, const config_setting_t **seen);

#endif /* SHIM_CONF_INT_H */
