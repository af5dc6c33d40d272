/* shim_conf_table.c -- the shim's settings, one table entry each, and
 * the readers that parse and check their values.
 *
 * Each entry says what a setting is called, which rules it belongs to,
 * the kind of value it takes (a whole number, a duration, a rate, one of
 * some words...), its bounds and the field it fills, by offset, in a
 * shim_conf_t or a shim_rule_t; the reader of its kind checks the type
 * and range and names the setting and the bad value in its message. So
 * a setting is parsed and checked in one place, and the settings a file
 * may hold are the tables below: any other name is an error, so that a
 * typo cannot silently disable a limit. docs/reference.txt is checked
 * against them (tests/integration/ops/test_docs_reference.py).
 *
 * Left to shim_conf.c: the defaults, and what several settings say
 * together (a lease's needs, a bucket's two halves, the key, the
 * addresses of a host, a rule's Redis prefix), checked once a whole rule
 * or file has been read.
 */
#include <errno.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "shim_conf_int.h"

/* How a value is written, read and stored. */
typedef enum {
    K_BOOL,      /* true or false, into an int.                           */
    K_BOOL_INV,  /* true or false, into an int as its negation.           */
    K_INT,       /* A whole number, min..max, into an int or an int64_t.  */
    K_INT_AUTO,  /* K_INT, or "auto" (stored as SHIM_LOCAL_AUTO).         */
    K_MS,        /* A duration: a whole number of ms, or "250ms", "10s",
                  * "2m"; min..max ms, into an int or an int64_t.         */
    K_NUMBER,    /* A number, min..max, into a double.                    */
    K_RATE,      /* Tokens per second: a number or "N/s", "N/m", "N/h",
                  * bounded by the core (tb_parse_rate), into a double.   */
    K_NAMES,     /* One of max words (names), into an int (an enum) as
                  * its place in the list.                                */
    K_ERRNO,     /* An errno name such as "ECONNREFUSED", into an int.    */
    K_TEXT,      /* A string that fits its buffer, copied in; min 1: it
                  * may not be empty.                                     */
    K_PREFIX,    /* A Redis key prefix (tb_prefix_valid), copied in.      */
    K_NAME,      /* A rule name (tb_name_valid), copied in.               */
    K_STRING,    /* A string, checked now and used later by shim_conf.c. */
    K_LATER,     /* Read later by shim_conf.c (a rule's key, whose checks
                  * come after the rule's limits).                        */
    K_RULES      /* A list of rules, read by shim_conf.c after the
                  * top-level settings.                                   */
} kind_t;

typedef struct setting {
    const char *name;          /* As written in the file.                */
    int dirs;                  /* SHIM_DIR_*: the rules it belongs to.   */
    kind_t kind;
    int64_t min, max;          /* Bounds (ms for K_MS); K_NAMES: the
                                * count of names in max; K_TEXT: the
                                * least length in min.                   */
    size_t off, size;          /* The field: offset and size in bytes.   */
    const char *const *names;  /* K_NAMES: the words, in enum order.     */
    const char *expect;        /* K_NAMES, K_PREFIX, K_NAME: what a good
                                * value is, said of a bad one.           */
} setting_t;

#define CONF(m) offsetof(shim_conf_t, m), sizeof(((shim_conf_t *)0)->m)
#define RULE(m) offsetof(shim_rule_t, m), sizeof(((shim_rule_t *)0)->m)
#define NOFIELD 0, 0
#define TOP SHIM_DIR_TOP
#define IN SHIM_DIR_IN
#define OUT SHIM_DIR_OUT
#define BOTH SHIM_DIR_BOTH

static const char *const action_names[] = {"close", "http429"};
static const char *const wait_names[] = {"fail", "wait"};

/* The top-level settings. The core's client options go into conf->opts;
 * a TLS file name into its buffer, to which opts.tls points once read. */
static const setting_t scalars[SHIM_SC_COUNT] = {
    [SHIM_SC_STRICT] = {"strict", TOP, K_BOOL, 0, 0, CONF(strict), NULL,
                        NULL},
    [SHIM_SC_REDIS_URL] = {"redis_url", TOP, K_TEXT, 0, 0, CONF(url), NULL,
                           NULL},
    [SHIM_SC_TIMEOUT] = {"timeout_ms", TOP, K_MS, 1, 60000,
                         CONF(opts.timeout_ms), NULL, NULL},
    [SHIM_SC_CONNECT_TIMEOUT] = {"connect_timeout_ms", TOP, K_MS, 1, 60000,
                                 CONF(opts.connect_timeout_ms), NULL, NULL},
    [SHIM_SC_POOL_SIZE] = {"pool_size", TOP, K_INT, 1, 64,
                           CONF(opts.pool_size), NULL, NULL},
    [SHIM_SC_POLICY] = {"policy", TOP, K_NAMES, 0, TB_POLICY_COUNT,
                        CONF(opts.policy), tb_policy_names,
                        "\"open\", \"closed\" or \"local\""},
    [SHIM_SC_ENGINE] = {"engine", TOP, K_NAMES, 0, TB_ENGINE_COUNT,
                        CONF(opts.engine), tb_engine_names,
                        "\"auto\", \"script\" or \"module\""},
    [SHIM_SC_BREAKER_THRESHOLD] = {"breaker_threshold", TOP, K_INT, 1,
                                   1000000, CONF(opts.breaker_threshold),
                                   NULL, NULL},
    [SHIM_SC_BREAKER_COOLDOWN] = {"breaker_cooldown_ms", TOP, K_MS, 1,
                                  86400000, CONF(opts.breaker_cooldown_ms),
                                  NULL, NULL},
    [SHIM_SC_IPV6_PREFIX] = {"ipv6_prefix", TOP, K_INT, 1, 128,
                             CONF(ipv6_bits), NULL, NULL},
    [SHIM_SC_REPLICAS] = {"replicas", TOP, K_INT, 1, 100000,
                          CONF(opts.replicas), NULL, NULL},
    [SHIM_SC_LOCAL_ENTRIES] = {"local_entries", TOP, K_INT, 64, 1 << 24,
                               CONF(opts.local_entries), NULL, NULL},
    [SHIM_SC_CLOSED_RETRY] = {"closed_retry_ms", TOP, K_MS, 1, 3600000,
                              CONF(opts.closed_retry_ms), NULL, NULL},
    [SHIM_SC_PREFIX] = {"prefix", TOP, K_PREFIX, 0, 0, CONF(prefix), NULL,
                        "printable bytes without braces or spaces"},
    [SHIM_SC_TLS_CA] = {"tls_ca", TOP, K_TEXT, 1, 0, CONF(tls_ca), NULL,
                        NULL},
    [SHIM_SC_TLS_CERT] = {"tls_cert", TOP, K_TEXT, 1, 0, CONF(tls_cert),
                          NULL, NULL},
    [SHIM_SC_TLS_KEY] = {"tls_key", TOP, K_TEXT, 1, 0, CONF(tls_key), NULL,
                         NULL},
    [SHIM_SC_TLS_SERVER_NAME] = {"tls_server_name", TOP, K_TEXT, 1, 0,
                                 CONF(tls_server_name), NULL, NULL},
    [SHIM_SC_TLS_VERIFY] = {"tls_verify", TOP, K_BOOL_INV, 0, 0,
                            CONF(opts.tls.no_verify), NULL, NULL},
    [SHIM_SC_INBOUND] = {"inbound", IN, K_RULES, 0, 0, NOFIELD, NULL,
                         NULL},
    [SHIM_SC_OUTBOUND] = {"outbound", OUT, K_RULES, 0, 0, NOFIELD, NULL,
                          NULL},
};

/* A rule's settings. A setting of one direction is unknown in a rule of
 * the other, so that a misplaced `on_limit` is reported, not ignored. */
static const setting_t rule_settings[SHIM_RS_COUNT] = {
    [SHIM_RS_NAME] = {"name", BOTH, K_NAME, 0, 0, RULE(name), NULL,
                      "of [A-Za-z0-9_.-]"},
    [SHIM_RS_PORT] = {"port", BOTH, K_INT, 1, 65535, RULE(port), NULL,
                      NULL},
    [SHIM_RS_ADDRESS] = {"address", IN, K_STRING, 0, 0, NOFIELD, NULL,
                         NULL},
    [SHIM_RS_HOST] = {"host", OUT, K_STRING, 0, 0, NOFIELD, NULL, NULL},
    [SHIM_RS_KEY] = {"key", BOTH, K_LATER, 0, 0, NOFIELD, NULL, NULL},
    [SHIM_RS_CAPACITY] = {"capacity", BOTH, K_NUMBER, 1,
                          (int64_t)TB_MAX_CAPACITY,
                          RULE(take.limit.capacity), NULL, NULL},
    [SHIM_RS_RATE] = {"rate", BOTH, K_RATE, 0, 0,
                      RULE(take.limit.rate_per_sec), NULL, NULL},
    [SHIM_RS_COST] = {"cost", BOTH, K_NUMBER, 0, (int64_t)TB_MAX_CAPACITY,
                      RULE(take.cost), NULL, NULL},
    [SHIM_RS_ALGORITHM] = {"algorithm", BOTH, K_NAMES, 0, TB_ALGO_COUNT,
                           RULE(algo), tb_algo_names,
                           "token-bucket, gcra, sliding-window, "
                           "fixed-window or sliding-log"},
    [SHIM_RS_LEASE] = {"lease", BOTH, K_INT, 1, SHIM_MAX_LEASE, RULE(lease),
                       NULL, NULL},
    [SHIM_RS_LEASE_TTL] = {"lease_ttl", BOTH, K_MS, 1, SHIM_MAX_LEASE_TTL_MS,
                           RULE(lease_ttl_ms), NULL, NULL},
    [SHIM_RS_CONCURRENCY] = {"concurrency", IN, K_INT, 1,
                             TB_MAX_CONCURRENCY, RULE(concurrency), NULL,
                             NULL},
    [SHIM_RS_LOCAL_CONCURRENCY] = {"local_concurrency", IN, K_INT_AUTO, 1,
                                   TB_INFLIGHT_MAX, RULE(local_concurrency),
                                   NULL, NULL},
    [SHIM_RS_LOCAL_MIN] = {"local_concurrency_min", IN, K_INT, 1,
                           TB_INFLIGHT_MAX, RULE(local_min), NULL, NULL},
    [SHIM_RS_LOCAL_MAX] = {"local_concurrency_max", IN, K_INT, 1,
                           TB_INFLIGHT_MAX, RULE(local_max), NULL, NULL},
    [SHIM_RS_CONCURRENCY_TTL] = {"concurrency_ttl_ms", IN, K_MS, 1,
                                 TB_MAX_CONCURRENCY_TTL_MS,
                                 RULE(concurrency_ttl_ms), NULL, NULL},
    [SHIM_RS_ACTION] = {"action", IN, K_NAMES, 0, 2, RULE(action),
                        action_names, "\"close\" or \"http429\""},
    [SHIM_RS_ON_LIMIT] = {"on_limit", OUT, K_NAMES, 0, 2, RULE(on_limit),
                          wait_names, "\"fail\" or \"wait\""},
    [SHIM_RS_MAX_WAIT] = {"max_wait_ms", OUT, K_MS, 0, 3600000,
                          RULE(max_wait_ms), NULL, NULL},
    [SHIM_RS_ERRNO] = {"errno", OUT, K_ERRNO, 0, 0, RULE(fail_errno), NULL,
                       NULL},
    [SHIM_RS_NONBLOCK_ERRNO] = {"nonblock_errno", OUT, K_ERRNO, 0, 0,
                                RULE(nonblock_errno), NULL, NULL},
    [SHIM_RS_NONBLOCKING] = {"nonblocking", OUT, K_NAMES, 0, 2,
                             RULE(nonblock_wait), wait_names,
                             "\"fail\" or \"wait\""},
};

int shim_conf_fail(shim_loader_t *ld, const config_setting_t *s,
                   const char *fmt, ...)
{
    char msg[SHIM_ERR_LEN];
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    if (s != NULL && config_setting_source_line(s) > 0) {
        snprintf(ld->err, ld->errlen, "%s:%u: %s", ld->path,
                 (unsigned)config_setting_source_line(s), msg);
    }
    else {
        snprintf(ld->err, ld->errlen, "%s: %s", ld->path, msg);
    }
    return TB_ERR;
}

/* ---- Readers by kind: each checks the type and the range. ------------ */

/* TB_OK when v is in min..max, else the message naming the setting s
 * and v, unit after it ("" or " ms"). */
static int check_range(shim_loader_t *ld, const config_setting_t *s,
                       int64_t v, const char *unit, int64_t min,
                       int64_t max)
{
    if (v < min || v > max) {
        return shim_conf_fail(ld, s, "'%s' = %lld%s is out of range "
                                     "%lld..%lld",
                              config_setting_name(s), (long long)v, unit,
                              (long long)min, (long long)max);
    }
    return TB_OK;
}

static int get_int(shim_loader_t *ld, const config_setting_t *s,
                   int64_t min, int64_t max, int64_t *out)
{
    int t = config_setting_type(s);
    int64_t v;

    /* The value is named where it has one, so that a word or a fraction
     * is seen in the message as it was written. */
    if (t == CONFIG_TYPE_STRING) {
        return shim_conf_fail(ld, s, "'%s' = \"%s\" must be a whole number",
                              config_setting_name(s),
                              config_setting_get_string(s));
    }
    if (t == CONFIG_TYPE_FLOAT) {
        return shim_conf_fail(ld, s, "'%s' = %g must be a whole number",
                              config_setting_name(s),
                              config_setting_get_float(s));
    }
    if (t != CONFIG_TYPE_INT && t != CONFIG_TYPE_INT64) {
        return shim_conf_fail(ld, s, "'%s' must be a whole number",
                              config_setting_name(s));
    }
    v = config_setting_get_int64(s);
    if (check_range(ld, s, v, "", min, max) != TB_OK) {
        return TB_ERR;
    }
    *out = v;
    return TB_OK;
}

/* A duration in milliseconds: a whole number, or a string such as "250ms",
 * "10s" or "2m" parsed by the core. */
static int get_ms(shim_loader_t *ld, const config_setting_t *s, int64_t min,
                  int64_t max, int64_t *out)
{
    char msg[128];
    int64_t v;

    if (config_setting_type(s) != CONFIG_TYPE_STRING) {
        return get_int(ld, s, min, max, out);
    }
    if (tb_parse_duration_ms(config_setting_get_string(s), &v, msg,
                             sizeof(msg)) != TB_OK) {
        return shim_conf_fail(ld, s, "'%s': %s", config_setting_name(s),
                              msg);
    }
    if (check_range(ld, s, v, " ms", min, max) != TB_OK) {
        return TB_ERR;
    }
    *out = v;
    return TB_OK;
}

static double number_of(const config_setting_t *s)
{
    return config_setting_type(s) == CONFIG_TYPE_FLOAT
               ? config_setting_get_float(s)
               : (double)config_setting_get_int64(s);
}

static int get_number(shim_loader_t *ld, const config_setting_t *s,
                      double min, double max, double *out)
{
    double v;

    if (!config_setting_is_number(s)) {
        return shim_conf_fail(ld, s, "'%s' must be a number",
                              config_setting_name(s));
    }
    v = number_of(s);
    if (!(v >= min && v <= max)) {
        return shim_conf_fail(ld, s, "'%s' = %g is out of range %g..%g",
                              config_setting_name(s), v, min, max);
    }
    *out = v;
    return TB_OK;
}

/* A rate: a number (tokens per second) or a string "N/s", "N/m", "N/h". */
static int get_rate(shim_loader_t *ld, const config_setting_t *s,
                    double *out)
{
    char msg[128], buf[64];
    const char *text;

    if (config_setting_is_number(s)) {
        /* Let the core apply one set of bounds to both spellings. */
        tb_fmt_double(buf, sizeof(buf), number_of(s));
        text = buf;
    }
    else if (config_setting_type(s) == CONFIG_TYPE_STRING) {
        text = config_setting_get_string(s);
    }
    else {
        return shim_conf_fail(ld, s, "'%s' must be a number or a string "
                                     "like \"10/s\"", config_setting_name(s));
    }
    if (tb_parse_rate(text, out, msg, sizeof(msg)) != TB_OK) {
        return shim_conf_fail(ld, s, "'%s': %s", config_setting_name(s),
                              msg);
    }
    return TB_OK;
}

int shim_conf_string(shim_loader_t *ld, const config_setting_t *s,
                     const char **out)
{
    *out = "";
    if (config_setting_type(s) != CONFIG_TYPE_STRING) {
        return shim_conf_fail(ld, s, "'%s' must be a string in double "
                                     "quotes", config_setting_name(s));
    }
    *out = config_setting_get_string(s);
    return TB_OK;
}

static const struct {
    const char *name;
    int value;
} errno_names[] = {
    {"ECONNREFUSED", ECONNREFUSED}, {"ETIMEDOUT", ETIMEDOUT},
    {"EAGAIN", EAGAIN},             {"EWOULDBLOCK", EWOULDBLOCK},
    {"ECONNRESET", ECONNRESET},     {"ECONNABORTED", ECONNABORTED},
    {"ENETUNREACH", ENETUNREACH},   {"EHOSTUNREACH", EHOSTUNREACH},
    {"EADDRNOTAVAIL", EADDRNOTAVAIL}, {"ENOBUFS", ENOBUFS},
    {"EACCES", EACCES},             {"EPERM", EPERM},
    {"EBUSY", EBUSY},               {"EINTR", EINTR},
};

static int get_errno(shim_loader_t *ld, const config_setting_t *s, int *out)
{
    const char *name;
    size_t i;

    if (shim_conf_string(ld, s, &name) != TB_OK) {
        return TB_ERR;
    }
    for (i = 0; i < sizeof(errno_names) / sizeof(errno_names[0]); i++) {
        if (strcmp(name, errno_names[i].name) == 0) {
            *out = errno_names[i].value;
            return TB_OK;
        }
    }
    return shim_conf_fail(ld, s, "'%s' = \"%s\" is not a known errno name "
                                 "(try \"ECONNREFUSED\", \"ETIMEDOUT\" or "
                                 "\"EAGAIN\")", config_setting_name(s), name);
}

/* ---- Storing by kind ------------------------------------------------- */

/* v into the integer field at p of size bytes: an int (an enum too) or a
 * 64-bit one (int64_t; size_t on LP64), the only sizes the tables name.
 * The value is in the setting's bounds, so it fits either. */
static void store_int(char *p, size_t size, int64_t v)
{
    int i = (int)v;

    if (size == sizeof(int64_t)) {
        memcpy(p, &v, sizeof(v));
    }
    else if (size == sizeof(int)) {
        memcpy(p, &i, sizeof(i));
    }
}

/* A string into d's buffer at p, when it fits and (for K_PREFIX and
 * K_NAME) is valid; else the message for d. */
static int read_text(shim_loader_t *ld, const setting_t *d,
                     const config_setting_t *s, char *p)
{
    const char *str;
    size_t len, max = d->size - 1;

    if (shim_conf_string(ld, s, &str) != TB_OK) {
        return TB_ERR;
    }
    len = strlen(str);
    if (d->kind == K_TEXT && (len > max || len < (size_t)d->min)) {
        /* A text that may be empty (the URL) is only ever too long. */
        if (d->min == 0) {
            return shim_conf_fail(ld, s, "'%s' is too long", d->name);
        }
        return shim_conf_fail(ld, s, "'%s' must be 1..%u bytes", d->name,
                              (unsigned)max);
    }
    if (d->kind != K_TEXT
        && (len > max || !(d->kind == K_NAME ? tb_name_valid(str)
                                             : tb_prefix_valid(str)))) {
        return shim_conf_fail(ld, s, "%s \"%s\" must be 1..%d %s",
                              d->kind == K_NAME ? "rule name" : d->name,
                              str, (int)max, d->expect);
    }
    memcpy(p, str, len + 1);
    return TB_OK;
}

/* One of d's words, stored as its place in d->names. */
static int read_names(shim_loader_t *ld, const setting_t *d,
                      const config_setting_t *s, char *p)
{
    const char *str;
    int i;

    if (shim_conf_string(ld, s, &str) != TB_OK) {
        return TB_ERR;
    }
    if ((i = tb_name_index(d->names, (int)d->max, str, 0)) < 0) {
        return shim_conf_fail(ld, s, "%s \"%s\" must be %s", d->name,
                              str, d->expect);
    }
    store_int(p, d->size, i);
    return TB_OK;
}

/* Setting s, described by d, checked and stored in its field of base. */
static int read_value(shim_loader_t *ld, const setting_t *d,
                      const config_setting_t *s, void *base)
{
    char *p = (char *)base + d->off;
    const char *str;
    int64_t v;
    int b;

    switch (d->kind) {
    case K_BOOL:
    case K_BOOL_INV:
        if (config_setting_type(s) != CONFIG_TYPE_BOOL) {
            return shim_conf_fail(ld, s, "'%s' must be true or false",
                                  d->name);
        }
        b = config_setting_get_bool(s) != 0;
        store_int(p, d->size, d->kind == K_BOOL_INV ? !b : b);
        return TB_OK;
    case K_INT_AUTO:
        if (config_setting_type(s) == CONFIG_TYPE_STRING) {
            if (strcmp(config_setting_get_string(s), "auto")) {
                return shim_conf_fail(ld, s, "'%s' = \"%s\" must be a "
                                             "whole number or \"auto\"",
                                      config_setting_name(s),
                                      config_setting_get_string(s));
            }
            store_int(p, d->size, SHIM_LOCAL_AUTO);
            return TB_OK;
        }
        /* fall through */
    case K_INT:
    case K_MS:
        if ((d->kind != K_MS ? get_int(ld, s, d->min, d->max, &v)
                              : get_ms(ld, s, d->min, d->max, &v)) != TB_OK) {
            return TB_ERR;
        }
        store_int(p, d->size, v);
        return TB_OK;
    case K_NUMBER:
        return get_number(ld, s, (double)d->min, (double)d->max,
                          (double *)(void *)p);
    case K_RATE:
        return get_rate(ld, s, (double *)(void *)p);
    case K_NAMES:
        return read_names(ld, d, s, p);
    case K_ERRNO:
        return get_errno(ld, s, (int *)(void *)p);
    case K_TEXT:
    case K_PREFIX:
    case K_NAME:
        return read_text(ld, d, s, p);
    case K_STRING:
        return shim_conf_string(ld, s, &str);
    case K_LATER:
    case K_RULES:
        break;
    }
    return TB_OK;
}

/* The index in tab (n entries) of the setting called name for dir, or
 * -1. A top-level table holds every direction's lists. An index with no
 * entry (a name of NULL) matches nothing. */
static int find(const setting_t *tab, int n, const char *name, int dir)
{
    int i;

    for (i = 0; i < n; i++) {
        if (tab[i].name != NULL
            && (dir == SHIM_DIR_TOP || (tab[i].dirs & dir))
            && strcmp(tab[i].name, name) == 0) {
            return i;
        }
    }
    return -1;
}

int shim_conf_read_group(shim_loader_t *ld, const config_setting_t *g,
                         int dir, void *base, const config_setting_t **seen)
{
    const setting_t *tab = dir == SHIM_DIR_TOP ? scalars : rule_settings;
    int ntab = dir == SHIM_DIR_TOP ? SHIM_SC_COUNT : SHIM_RS_COUNT;
    int i, k, n = config_setting_length(g);

    for (i = 0; i < n; i++) {
        const config_setting_t *s = config_setting_get_elem(g, i);
        const char *name = config_setting_name(s);

        k = find(tab, ntab, name, dir);
        if (k < 0 && dir == SHIM_DIR_TOP) {
            return shim_conf_fail(ld, s, "unknown setting '%s'", name);
        }
        if (k < 0) {
            return shim_conf_fail(ld, s, "unknown setting '%s' in an %s rule",
                                  name, dir == SHIM_DIR_IN ? "inbound"
                                                           : "outbound");
        }
        seen[k] = s;
        if (read_value(ld, &tab[k], s, base) != TB_OK) {
            return TB_ERR;
        }
    }
    return TB_OK;
}
