/* shim_conf.c -- the shim's libconfig file turned into rules and options.
 *
 * The only place libconfig appears. The file (example: conf/shim.conf)
 * holds scalar settings for the core's client (Redis URL, timeouts,
 * failure policy, breaker, replicas, key prefix, TLS), `strict`, and two
 * lists of rules, `inbound` and `outbound`. Every value is validated here,
 * once: a wrapper never parses. Unknown settings are errors, so a typo cannot
 * silently disable a limit. Hostnames of outbound rules are resolved here
 * with getaddrinfo(); a later change of DNS is not seen until the program
 * restarts.
 *
 * Errors name the file, the line and the problem in one line, which the
 * caller prints as it is. The caller's conf is left in a defined state
 * (no rules) on error, so running unlimited needs no extra step.
 *
 * The tbucket tool links this file too (shim_conf_rule() is its lookup
 * by name), so a rule's defaults, name and Redis key have one source.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <libconfig.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "tb_shim.h"

#define DEFAULT_PREFIX "tb:shim:"
#define DEFAULT_MAX_WAIT_MS 1000
#define DEFAULT_POOL_SIZE 2

typedef struct loader {
    const char *path;
    char *err;
    size_t errlen;
} loader_t;

/* Write "path:line: message" into the loader's buffer and return TB_ERR.
 * s may be NULL when no setting is to blame (line 0 is then omitted). */
static int fail(loader_t *ld, const config_setting_t *s, const char *fmt,
                ...) __attribute__((format(printf, 3, 4)));
static int fail(loader_t *ld, const config_setting_t *s, const char *fmt,
                ...)
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

/* ---- Scalar readers: each checks the type and the range. ------------- */

/* TB_OK when v is in min..max, else the message naming the setting s
 * and v, unit after it ("" or " ms"). */
static int check_range(loader_t *ld, const config_setting_t *s, int64_t v,
                       const char *unit, int64_t min, int64_t max)
{
    if (v < min || v > max) {
        return fail(ld, s, "'%s' = %lld%s is out of range %lld..%lld",
                    config_setting_name(s), (long long)v, unit,
                    (long long)min, (long long)max);
    }
    return TB_OK;
}

static int get_int(loader_t *ld, const config_setting_t *s, int64_t min,
                   int64_t max, int64_t *out)
{
    int t = config_setting_type(s);
    int64_t v;

    /* The value is named where it has one, so that a word or a fraction
     * is seen in the message as it was written. */
    if (t == CONFIG_TYPE_STRING) {
        return fail(ld, s, "'%s' = \"%s\" must be a whole number",
                    config_setting_name(s), config_setting_get_string(s));
    }
    if (t == CONFIG_TYPE_FLOAT) {
        return fail(ld, s, "'%s' = %g must be a whole number",
                    config_setting_name(s), config_setting_get_float(s));
    }
    if (t != CONFIG_TYPE_INT && t != CONFIG_TYPE_INT64) {
        return fail(ld, s, "'%s' must be a whole number",
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
static int get_ms(loader_t *ld, const config_setting_t *s, int64_t min,
                  int64_t max, int64_t *out)
{
    char msg[128];
    int64_t v;

    if (config_setting_type(s) != CONFIG_TYPE_STRING) {
        return get_int(ld, s, min, max, out);
    }
    if (tb_parse_duration_ms(config_setting_get_string(s), &v, msg,
                             sizeof(msg)) != TB_OK) {
        return fail(ld, s, "'%s': %s", config_setting_name(s), msg);
    }
    if (check_range(ld, s, v, " ms", min, max) != TB_OK) {
        return TB_ERR;
    }
    *out = v;
    return TB_OK;
}

static int get_number(loader_t *ld, const config_setting_t *s, double min,
                      double max, double *out)
{
    double v;

    if (!config_setting_is_number(s)) {
        return fail(ld, s, "'%s' must be a number", config_setting_name(s));
    }
    v = config_setting_type(s) == CONFIG_TYPE_FLOAT
            ? config_setting_get_float(s)
            : (double)config_setting_get_int64(s);
    if (!(v >= min && v <= max)) {
        return fail(ld, s, "'%s' = %g is out of range %g..%g",
                    config_setting_name(s), v, min, max);
    }
    *out = v;
    return TB_OK;
}

static int get_string(loader_t *ld, const config_setting_t *s,
                      const char **out)
{
    *out = "";
    if (config_setting_type(s) != CONFIG_TYPE_STRING) {
        return fail(ld, s, "'%s' must be a string in double quotes",
                    config_setting_name(s));
    }
    *out = config_setting_get_string(s);
    return TB_OK;
}

/* A string that must be one of two words: *out gets 0 for w0, 1 for w1,
 * and is left alone on an error. */
static int get_choice(loader_t *ld, const config_setting_t *s,
                      const char *w0, const char *w1, int *out)
{
    const char *str;

    if (get_string(ld, s, &str) != TB_OK) {
        return TB_ERR;
    }
    if (strcmp(str, w0) != 0 && strcmp(str, w1) != 0) {
        return fail(ld, s, "%s \"%s\" must be \"%s\" or \"%s\"",
                    config_setting_name(s), str, w0, w1);
    }
    *out = strcmp(str, w1) == 0;
    return TB_OK;
}

/* A rate: a number (tokens per second) or a string "N/s", "N/m", "N/h". */
static int get_rate(loader_t *ld, const config_setting_t *s, double *out)
{
    char msg[128];

    if (config_setting_is_number(s)) {
        char buf[64];
        double v = config_setting_type(s) == CONFIG_TYPE_FLOAT
                       ? config_setting_get_float(s)
                       : (double)config_setting_get_int64(s);
        /* Let the core apply one set of bounds to both spellings. */
        tb_fmt_double(buf, sizeof(buf), v);
        if (tb_parse_rate(buf, out, msg, sizeof(msg)) != TB_OK) {
            return fail(ld, s, "'rate': %s", msg);
        }
        return TB_OK;
    }
    if (config_setting_type(s) != CONFIG_TYPE_STRING) {
        return fail(ld, s, "'rate' must be a number or a string like "
                           "\"10/s\"");
    }
    if (tb_parse_rate(config_setting_get_string(s), out, msg, sizeof(msg))
        != TB_OK) {
        return fail(ld, s, "'rate': %s", msg);
    }
    return TB_OK;
}

/* ---- errno names --------------------------------------------------- */

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

static int get_errno(loader_t *ld, const config_setting_t *s, int *out)
{
    const char *name;
    size_t i;

    if (get_string(ld, s, &name) != TB_OK) {
        return TB_ERR;
    }
    for (i = 0; i < sizeof(errno_names) / sizeof(errno_names[0]); i++) {
        if (strcmp(name, errno_names[i].name) == 0) {
            *out = errno_names[i].value;
            return TB_OK;
        }
    }
    return fail(ld, s, "'%s' = \"%s\" is not a known errno name (try "
                       "\"ECONNREFUSED\", \"ETIMEDOUT\" or \"EAGAIN\")",
                config_setting_name(s), name);
}

/* ---- Addresses ----------------------------------------------------- */

static int add_addr(shim_rule_t *r, int family, const void *bytes)
{
    static const unsigned char v4mapped[12] = {0, 0, 0, 0, 0, 0, 0, 0,
                                               0, 0, 0xff, 0xff};
    size_t n;
    int i;

    /* ::ffff:a.b.c.d is an IPv4 destination: the wrappers compare it so. */
    if (family == AF_INET6 && memcmp(bytes, v4mapped, 12) == 0) {
        family = AF_INET;
        bytes = (const unsigned char *)bytes + 12;
    }
    n = family == AF_INET ? 4 : 16;

    for (i = 0; i < r->naddrs; i++) {
        if (r->addrs[i].family == family
            && memcmp(r->addrs[i].bytes, bytes, n) == 0) {
            return 0;
        }
    }
    if (r->naddrs == SHIM_MAX_ADDRS) {
        return 0;   /* Enough: the rest of a round-robin set is dropped. */
    }
    memset(&r->addrs[r->naddrs], 0, sizeof(r->addrs[0]));
    r->addrs[r->naddrs].family = family;
    memcpy(r->addrs[r->naddrs].bytes, bytes, n);
    r->naddrs++;
    return 1;
}

/* Resolve `host` (an IPv4 or IPv6 literal, "[v6]", a hostname, or "*" for
 * any address) into r->addrs. Runs once, at load time; getaddrinfo may
 * talk to DNS through glibc-internal sockets, which never reach our
 * wrappers. */
static int resolve(loader_t *ld, const config_setting_t *s, const char *host,
                   shim_rule_t *r)
{
    char buf[256];
    unsigned char bytes[16];
    struct addrinfo hints, *res = NULL, *ai;
    size_t len = strlen(host);
    int rc;

    if (len == 0 || strcmp(host, "*") == 0) {
        r->naddrs = 0;
        return TB_OK;
    }
    if (len >= sizeof(buf)) {
        return fail(ld, s, "host name is too long");
    }
    memcpy(buf, host, len + 1);
    if (buf[0] == '[' && buf[len - 1] == ']') {
        buf[len - 1] = '\0';
        memmove(buf, buf + 1, len - 1);
    }
    if (inet_pton(AF_INET, buf, bytes) == 1) {
        add_addr(r, AF_INET, bytes);
        return TB_OK;
    }
    if (inet_pton(AF_INET6, buf, bytes) == 1) {
        add_addr(r, AF_INET6, bytes);
        return TB_OK;
    }
    memset(&hints, 0, sizeof(hints));
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    rc = getaddrinfo(buf, NULL, &hints, &res);
    if (rc != 0) {
        return fail(ld, s, "cannot resolve host \"%s\": %s", buf,
                    gai_strerror(rc));
    }
    for (ai = res; ai != NULL; ai = ai->ai_next) {
        if (ai->ai_family == AF_INET) {
            add_addr(r, AF_INET,
                     &((struct sockaddr_in *)ai->ai_addr)->sin_addr);
        }
        else if (ai->ai_family == AF_INET6) {
            add_addr(r, AF_INET6,
                     &((struct sockaddr_in6 *)ai->ai_addr)->sin6_addr);
        }
    }
    freeaddrinfo(res);
    if (r->naddrs == 0) {
        return fail(ld, s, "host \"%s\" has no IPv4 or IPv6 address", buf);
    }
    return TB_OK;
}

/* ---- Rules --------------------------------------------------------- */

/* The key setting: "$peer" (inbound), "$program", or a fixed name. */
static int set_key(loader_t *ld, const config_setting_t *s, int inbound,
                   shim_rule_t *r)
{
    const char *k;
    size_t len;

    if (get_string(ld, s, &k) != TB_OK) {
        return TB_ERR;
    }
    if (strcmp(k, "$peer") == 0) {
        if (!inbound) {
            return fail(ld, s, "key \"$peer\" is for inbound rules; use a "
                               "fixed name or \"$program\"");
        }
        r->key_kind = SHIM_KEY_PEER;
        r->key[0] = '\0';
        r->key_len = 0;
        return TB_OK;
    }
    if (strcmp(k, "$program") == 0) {
        r->key_kind = SHIM_KEY_PROGRAM;
        k = program_invocation_short_name;
        if (k == NULL || *k == '\0') {
            k = "unknown";
        }
    }
    else if (k[0] == '$') {
        return fail(ld, s, "key \"%s\": only \"$peer\" and \"$program\" "
                           "may start with '$'", k);
    }
    else {
        r->key_kind = SHIM_KEY_FIXED;
    }
    len = strlen(k);
    if (len == 0) {
        return fail(ld, s, "key must not be empty");
    }
    /* The core hashes keys that are too long or odd; it reads len bytes. */
    r->key_len = tb_key_sanitize(k, len, r->key);
    return TB_OK;
}

static int set_rule_name(loader_t *ld, const config_setting_t *s,
                         shim_rule_t *r)
{
    const char *name;

    if (get_string(ld, s, &name) != TB_OK) {
        return TB_ERR;
    }
    if (strlen(name) > TB_NAME_MAX || !tb_name_valid(name)) {
        return fail(ld, s, "rule name \"%s\" must be 1..%d of "
                           "[A-Za-z0-9_.-]", name, TB_NAME_MAX);
    }
    strcpy(r->name, name);
    return TB_OK;
}

/* What a lease needs, once the whole rule is read (its settings come in
 * any order): a bucket (has_bucket), the token bucket, a whole cost of
 * at least one and no Redis concurrency limit, whose slots every
 * connection must ask Redis for; a lease_ttl needs a lease. The core
 * would decide any other rule without a lease, so a lease there would
 * do nothing: refused, naming the setting. lease_s is NULL when the rule
 * sets no lease. */
static int check_lease(loader_t *ld, const config_setting_t *lease_s,
                       const config_setting_t *ttl_s, int has_bucket,
                       const shim_rule_t *r)
{
    if (lease_s == NULL) {
        return fail(ld, ttl_s, "rule \"%s\": 'lease_ttl' needs 'lease'",
                    r->name);
    }
    if (!has_bucket) {
        return fail(ld, lease_s, "rule \"%s\": 'lease' = %d needs a bucket "
                    "('capacity' and 'rate')", r->name, r->lease);
    }
    if (r->concurrency > 0) {
        return fail(ld, lease_s, "rule \"%s\": 'lease' = %d cannot go with "
                    "'concurrency' = %d: every connection asks Redis for "
                    "its slot", r->name, r->lease, r->concurrency);
    }
    if (r->algo != TB_ALGO_TOKEN_BUCKET) {
        return fail(ld, lease_s, "rule \"%s\": 'lease' = %d needs algorithm "
                    "\"token-bucket\", not \"%s\"", r->name, r->lease,
                    tb_algo_name(r->algo));
    }
    if (!(r->take.cost >= 1)
        || r->take.cost != (double)(int64_t)r->take.cost) {
        return fail(ld, lease_s, "rule \"%s\": 'lease' = %d needs a whole "
                    "'cost' of at least 1, not %g", r->name, r->lease,
                    r->take.cost);
    }
    return TB_OK;
}

/* Read one rule group. Settings common to both directions are handled
 * here; the direction-only ones are refused in the other direction so a
 * misplaced `on_limit` is reported, not ignored. */
static int load_rule(loader_t *ld, const config_setting_t *g, int inbound,
                     int index, const char *prefix, shim_rule_t *r)
{
    const char *host = NULL, *str;
    const config_setting_t *host_s = g, *key_s = NULL;
    const config_setting_t *lease_s = NULL, *lease_ttl_s = NULL;
    int have_port = 0, have_cap = 0, have_rate = 0, i, n, k;
    int64_t v;

    memset(r, 0, sizeof(*r));
    r->line = config_setting_source_line(g);
    snprintf(r->name, sizeof(r->name), "%s%d", inbound ? "in" : "out",
             index + 1);
    r->take.cost = 1;
    r->key_kind = inbound ? SHIM_KEY_PEER : SHIM_KEY_FIXED;
    r->action = SHIM_ACT_CLOSE;
    r->on_limit = SHIM_ON_FAIL;
    r->max_wait_ms = DEFAULT_MAX_WAIT_MS;
    r->concurrency_ttl_ms = TB_CONCURRENCY_TTL_MS;
    r->lease_ttl_ms = TB_LEASE_TTL_MS;
    r->fail_errno = ECONNREFUSED;
    r->nonblock_errno = EAGAIN;
    /* on_limit decides for non-blocking sockets too: most clients (curl,
     * PHP, libpq) connect non-blocking only to time the connect. Event
     * loops opt out with nonblocking = "fail". */
    r->nonblock_wait = 1;

    if (!config_setting_is_group(g)) {
        return fail(ld, g, "each %s rule must be a group { ... }",
                    inbound ? "inbound" : "outbound");
    }
    n = config_setting_length(g);
    for (i = 0; i < n; i++) {
        const config_setting_t *s = config_setting_get_elem(g, i);
        const char *name = config_setting_name(s);
        int rc = TB_OK;

        if (strcmp(name, "name") == 0) {
            rc = set_rule_name(ld, s, r);
        }
        else if (strcmp(name, "port") == 0) {
            rc = get_int(ld, s, 1, 65535, &v);
            r->port = (int)v;
            have_port = 1;
        }
        else if ((inbound && strcmp(name, "address") == 0)
                 || (!inbound && strcmp(name, "host") == 0)) {
            rc = get_string(ld, s, &host);
            host_s = s;
        }
        else if (strcmp(name, "key") == 0) {
            key_s = s;
        }
        else if (strcmp(name, "capacity") == 0) {
            rc = get_number(ld, s, 1, TB_MAX_CAPACITY, &r->take.limit.capacity);
            have_cap = 1;
        }
        else if (strcmp(name, "rate") == 0) {
            rc = get_rate(ld, s, &r->take.limit.rate_per_sec);
            have_rate = 1;
        }
        else if (strcmp(name, "cost") == 0) {
            rc = get_number(ld, s, 0, TB_MAX_CAPACITY, &r->take.cost);
        }
        else if (strcmp(name, "algorithm") == 0) {
            rc = get_string(ld, s, &str);
            if (rc == TB_OK && tb_algo_parse(str, &r->algo) != TB_OK) {
                rc = fail(ld, s, "algorithm \"%s\" must be token-bucket, "
                                 "gcra, sliding-window, fixed-window or "
                                 "sliding-log", str);
            }
        }
        else if (strcmp(name, "lease") == 0) {
            rc = get_int(ld, s, 1, SHIM_MAX_LEASE, &v);
            r->lease = (int)v;
            lease_s = s;
        }
        else if (strcmp(name, "lease_ttl") == 0) {
            rc = get_ms(ld, s, 1, SHIM_MAX_LEASE_TTL_MS, &r->lease_ttl_ms);
            lease_ttl_s = s;
        }
        else if (inbound && strcmp(name, "concurrency") == 0) {
            rc = get_int(ld, s, 1, TB_MAX_CONCURRENCY, &v);
            r->concurrency = (int)v;
        }
        else if (inbound && strcmp(name, "local_concurrency") == 0) {
            rc = get_int(ld, s, 1, TB_INFLIGHT_MAX, &v);
            r->local_concurrency = (int)v;
        }
        else if (inbound && strcmp(name, "concurrency_ttl_ms") == 0) {
            rc = get_ms(ld, s, 1, TB_MAX_CONCURRENCY_TTL_MS,
                        &r->concurrency_ttl_ms);
        }
        else if (inbound && strcmp(name, "action") == 0) {
            k = (int)r->action;
            rc = get_choice(ld, s, "close", "http429", &k);
            r->action = (shim_action_t)k;
        }
        else if (!inbound && strcmp(name, "on_limit") == 0) {
            k = (int)r->on_limit;
            rc = get_choice(ld, s, "fail", "wait", &k);
            r->on_limit = (shim_on_limit_t)k;
        }
        else if (!inbound && strcmp(name, "max_wait_ms") == 0) {
            rc = get_ms(ld, s, 0, 3600000, &r->max_wait_ms);
        }
        else if (!inbound && strcmp(name, "errno") == 0) {
            rc = get_errno(ld, s, &r->fail_errno);
        }
        else if (!inbound && strcmp(name, "nonblock_errno") == 0) {
            rc = get_errno(ld, s, &r->nonblock_errno);
        }
        else if (!inbound && strcmp(name, "nonblocking") == 0) {
            rc = get_choice(ld, s, "fail", "wait", &r->nonblock_wait);
        }
        else {
            rc = fail(ld, s, "unknown setting '%s' in an %s rule", name,
                      inbound ? "inbound" : "outbound");
        }
        if (rc != TB_OK) {
            return TB_ERR;
        }
    }
    if (!have_port) {
        return fail(ld, g, "%s rule \"%s\" has no 'port'",
                    inbound ? "inbound" : "outbound", r->name);
    }
    if ((lease_s != NULL || lease_ttl_s != NULL)
        && check_lease(ld, lease_s, lease_ttl_s, have_cap && have_rate, r)
               != TB_OK) {
        return TB_ERR;
    }
    /* An inbound rule may limit concurrency alone, with no bucket: in
     * Redis, on this host, or both. */
    if (have_cap != have_rate
        || (!have_cap && !r->concurrency && !r->local_concurrency)) {
        return fail(ld, g, "rule \"%s\" needs both 'capacity' and 'rate'%s",
                    r->name, inbound ? " (or 'concurrency') or "
                                       "'local_concurrency'" : "");
    }
    if (have_cap) {
        char why[96];

        if (tb_limit_check(&r->take.limit, why, sizeof(why)) != TB_OK) {
            return fail(ld, g, "rule \"%s\": %s", r->name, why);
        }
    }
    if (r->algo == TB_ALGO_SLIDING_LOG
        && (r->take.limit.capacity > TB_SLOG_MAX_CAPACITY
            || r->take.cost != (double)(int64_t)r->take.cost)) {
        return fail(ld, g, "rule \"%s\": sliding-log needs capacity up to "
                           "%d and a whole cost", r->name,
                    (int)TB_SLOG_MAX_CAPACITY);
    }
    if (key_s != NULL) {
        if (set_key(ld, key_s, inbound, r) != TB_OK) {
            return TB_ERR;
        }
    }
    else if (!inbound) {
        /* By default a downstream is named after its rule, so that every
         * process and replica with this config shares one bucket. */
        r->key_len = tb_key_sanitize(r->name, strlen(r->name), r->key);
    }
    if (host != NULL && resolve(ld, host_s, host, r) != TB_OK) {
        return TB_ERR;
    }
    if ((size_t)snprintf(r->prefix, sizeof(r->prefix), "%s%s:%s:", prefix,
                         inbound ? "in" : "out", r->name)
            >= sizeof(r->prefix)
        || !tb_prefix_valid(r->prefix)) {
        return fail(ld, g, "prefix + rule name \"%s%s:%s:\" is longer "
                           "than %d bytes or invalid", prefix,
                    inbound ? "in" : "out", r->name, TB_PREFIX_MAX);
    }
    return TB_OK;
}

static int load_rules(loader_t *ld, const config_setting_t *list,
                      int inbound, shim_conf_t *conf)
{
    shim_rule_t *rules = inbound ? conf->in : conf->out;
    unsigned char *bitmap = inbound ? conf->in_ports : conf->out_ports;
    int *count = inbound ? &conf->nin : &conf->nout;
    int i, n;

    if (!config_setting_is_list(list) && !config_setting_is_array(list)) {
        return fail(ld, list, "'%s' must be a list: %s = ( { ... }, ... );",
                    config_setting_name(list), config_setting_name(list));
    }
    n = config_setting_length(list);
    if (n > SHIM_MAX_RULES) {
        return fail(ld, list, "more than %d %s rules", SHIM_MAX_RULES,
                    config_setting_name(list));
    }
    for (i = 0; i < n; i++) {
        if (load_rule(ld, config_setting_get_elem(list, i), inbound, i,
                      conf->prefix, &rules[i]) != TB_OK) {
            return TB_ERR;
        }
    }
    /* Publish only complete tables. */
    for (i = 0; i < n; i++) {
        bitmap[rules[i].port >> 3] |=
            (unsigned char)(1u << (rules[i].port & 7));
    }
    *count = n;
    return TB_OK;
}

const shim_rule_t *shim_conf_rule(const shim_conf_t *conf, const char *want)
{
    const char *name = want;
    int only = -1, i;

    if (strncmp(want, "in:", 3) == 0) {
        only = 1;
        name = want + 3;
    }
    else if (strncmp(want, "out:", 4) == 0) {
        only = 0;
        name = want + 4;
    }
    for (i = 0; only != 0 && i < conf->nin; i++) {
        if (strcmp(conf->in[i].name, name) == 0) {
            return &conf->in[i];
        }
    }
    for (i = 0; only != 1 && i < conf->nout; i++) {
        if (strcmp(conf->out[i].name, name) == 0) {
            return &conf->out[i];
        }
    }
    return NULL;
}

/* ---- Top level ------------------------------------------------------ */

/* A string setting into buf (size bytes), refused when it is empty or
 * does not fit. */
static int get_text(loader_t *ld, const config_setting_t *s, char *buf,
                    size_t size)
{
    const char *str;

    if (get_string(ld, s, &str) != TB_OK) {
        return TB_ERR;
    }
    if (!*str || strlen(str) >= size) {
        return fail(ld, s, "'%s' must be 1..%u bytes",
                    config_setting_name(s), (unsigned)size - 1);
    }
    strcpy(buf, str);
    return TB_OK;
}

/* The TLS settings (files are read by the core when it makes the
 * client). 1 when s is one of them, with *rc its outcome; else 0. */
static int tls_setting(loader_t *ld, const config_setting_t *s,
                       shim_conf_t *conf, int *rc)
{
    const char *name = config_setting_name(s);
    char *buf = !strcmp(name, "tls_ca")            ? conf->tls_ca
                : !strcmp(name, "tls_cert")        ? conf->tls_cert
                : !strcmp(name, "tls_key")         ? conf->tls_key
                : !strcmp(name, "tls_server_name") ? conf->tls_server_name
                                                   : NULL;

    if (buf) {
        *rc = get_text(ld, s, buf, !strcmp(name, "tls_server_name")
                                       ? sizeof(conf->tls_server_name)
                                       : SHIM_PATH_MAX);
        return 1;
    }
    if (strcmp(name, "tls_verify") != 0) {
        return 0;
    }
    if (config_setting_type(s) != CONFIG_TYPE_BOOL) {
        *rc = fail(ld, s, "'tls_verify' must be true or false");
    }
    else {
        conf->opts.tls.no_verify = !config_setting_get_bool(s);
        *rc = TB_OK;
    }
    return 1;
}

/* Point opts at the set TLS buffers (NULL for the unset ones). */
static void tls_point(shim_conf_t *conf)
{
    tb_tls_options_t *t = &conf->opts.tls;

    t->ca_file = conf->tls_ca[0] ? conf->tls_ca : NULL;
    t->cert_file = conf->tls_cert[0] ? conf->tls_cert : NULL;
    t->key_file = conf->tls_key[0] ? conf->tls_key : NULL;
    t->server_name = conf->tls_server_name[0] ? conf->tls_server_name
                                              : NULL;
}

/* Scalars first, in one pass; rules after, because a rule's Redis prefix
 * depends on `prefix` wherever it sits in the file. */
static int load_scalars(loader_t *ld, const config_setting_t *root,
                        shim_conf_t *conf)
{
    tb_options_t *o = &conf->opts;
    int i, n = config_setting_length(root);
    int64_t v;
    const char *str;

    for (i = 0; i < n; i++) {
        const config_setting_t *s = config_setting_get_elem(root, i);
        const char *name = config_setting_name(s);
        int rc = TB_OK;

        if (strcmp(name, "inbound") == 0 || strcmp(name, "outbound") == 0) {
            continue;
        }
        if (strcmp(name, "strict") == 0) {
            if (config_setting_type(s) != CONFIG_TYPE_BOOL) {
                rc = fail(ld, s, "'strict' must be true or false");
            }
            else {
                conf->strict = config_setting_get_bool(s);
            }
        }
        else if (strcmp(name, "redis_url") == 0) {
            rc = get_string(ld, s, &str);
            if (rc == TB_OK && strlen(str) >= sizeof(conf->url)) {
                rc = fail(ld, s, "'redis_url' is too long");
            }
            if (rc == TB_OK) {
                strcpy(conf->url, str);
            }
        }
        else if (strcmp(name, "timeout_ms") == 0) {
            rc = get_ms(ld, s, 1, 60000, &v);
            o->timeout_ms = (int)v;
            conf->timeout_set = 1;
        }
        else if (strcmp(name, "connect_timeout_ms") == 0) {
            rc = get_ms(ld, s, 1, 60000, &v);
            o->connect_timeout_ms = (int)v;
            conf->connect_timeout_set = 1;
        }
        else if (strcmp(name, "pool_size") == 0) {
            rc = get_int(ld, s, 1, 64, &v);
            o->pool_size = (int)v;
        }
        else if (strcmp(name, "policy") == 0) {
            rc = get_string(ld, s, &str);
            if (rc == TB_OK && tb_policy_parse(str, &o->policy) != TB_OK) {
                rc = fail(ld, s, "policy \"%s\" must be \"open\", "
                                 "\"closed\" or \"local\"", str);
            }
        }
        else if (strcmp(name, "engine") == 0) {
            int e;

            rc = get_string(ld, s, &str);
            if (rc == TB_OK
                && (e = tb_name_index(tb_engine_names, TB_ENGINE_COUNT,
                                      str, 0)) < 0) {
                rc = fail(ld, s, "engine \"%s\" must be \"auto\", "
                                 "\"script\" or \"module\"", str);
            }
            else if (rc == TB_OK) {
                o->engine = (tb_engine_t)e;
            }
        }
        else if (strcmp(name, "breaker_threshold") == 0) {
            rc = get_int(ld, s, 1, 1000000, &v);
            o->breaker_threshold = (int)v;
        }
        else if (strcmp(name, "breaker_cooldown_ms") == 0) {
            rc = get_ms(ld, s, 1, 86400000, &o->breaker_cooldown_ms);
        }
        else if (strcmp(name, "ipv6_prefix") == 0) {
            rc = get_int(ld, s, 1, 128, &v);
            conf->ipv6_bits = (int)v;
        }
        else if (strcmp(name, "replicas") == 0) {
            rc = get_int(ld, s, 1, 100000, &v);
            o->replicas = (int)v;
        }
        else if (strcmp(name, "local_entries") == 0) {
            rc = get_int(ld, s, 64, 1 << 24, &v);
            o->local_entries = (size_t)v;
        }
        else if (strcmp(name, "closed_retry_ms") == 0) {
            rc = get_ms(ld, s, 1, 3600000, &v);
            o->closed_retry_ms = (int)v;
        }
        else if (strcmp(name, "prefix") == 0) {
            rc = get_string(ld, s, &str);
            if (rc == TB_OK && (strlen(str) > TB_PREFIX_MAX
                                || !tb_prefix_valid(str))) {
                rc = fail(ld, s, "prefix \"%s\" must be 1..%d printable "
                                 "bytes without braces or spaces", str,
                          TB_PREFIX_MAX);
            }
            if (rc == TB_OK) {
                strcpy(conf->prefix, str);
            }
        }
        else if (!tls_setting(ld, s, conf, &rc)) {
            rc = fail(ld, s, "unknown setting '%s'", name);
        }
        if (rc != TB_OK) {
            return TB_ERR;
        }
    }
    if (!conf->connect_timeout_set) {
        o->connect_timeout_ms = o->timeout_ms;
    }
    return TB_OK;
}

/* Read `strict` before anything else, so that a later error in the file
 * is still judged by the file's own choice. */
static void peek_strict(const config_t *cfg, shim_conf_t *conf)
{
    int b;

    if (config_lookup_bool(cfg, "strict", &b) == CONFIG_TRUE) {
        conf->strict = b;
    }
}

static void defaults(shim_conf_t *conf)
{
    int strict = conf->strict;

    memset(conf, 0, sizeof(*conf));
    conf->strict = strict;
    tb_options_init(&conf->opts);
    conf->opts.pool_size = DEFAULT_POOL_SIZE;
    /* Inside someone else's process fds can be closed under us. */
    conf->opts.verify_fd = 1;
    strcpy(conf->url, TB_DEFAULT_URL);
    strcpy(conf->prefix, DEFAULT_PREFIX);
    conf->ipv6_bits = TB_DEFAULT_IPV6_BITS;
}

int shim_conf_load(const char *path, shim_conf_t *conf, char *err,
                   size_t errlen)
{
    loader_t ld = {path, err, errlen};
    config_t cfg;
    const config_setting_t *root, *list;
    int rc = TB_ERR;

    conf->strict = 0;
    defaults(conf);
    config_init(&cfg);
    config_set_auto_convert(&cfg, 1);
    if (config_read_file(&cfg, path) != CONFIG_TRUE) {
        if (config_error_type(&cfg) == CONFIG_ERR_FILE_IO) {
            snprintf(err, errlen, "%s: cannot read the file: %s", path,
                     strerror(errno != 0 ? errno : ENOENT));
        }
        else {
            /* libconfig 1.5 leaves error_file NULL for the top file. */
            snprintf(err, errlen, "%s:%d: %s",
                     config_error_file(&cfg) ? config_error_file(&cfg)
                                             : path,
                     config_error_line(&cfg),
                     config_error_text(&cfg) ? config_error_text(&cfg)
                                             : "syntax error");
        }
        goto done;
    }
    root = config_root_setting(&cfg);
    peek_strict(&cfg, conf);
    if (load_scalars(&ld, root, conf) != TB_OK) {
        goto done;
    }
    conf->opts.url = conf->url;
    tls_point(conf);
    if ((list = config_setting_get_member(root, "inbound")) != NULL
        && load_rules(&ld, list, 1, conf) != TB_OK) {
        goto done;
    }
    if ((list = config_setting_get_member(root, "outbound")) != NULL
        && load_rules(&ld, list, 0, conf) != TB_OK) {
        goto done;
    }
    rc = TB_OK;
done:
    config_destroy(&cfg);
    if (rc != TB_OK) {
        /* Leave no half-loaded table behind: no rules means unlimited. */
        defaults(conf);
        conf->opts.url = conf->url;
    }
    return rc;
}
