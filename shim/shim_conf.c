/* shim_conf.c -- the shim's libconfig file turned into rules and options.
 *
 * The file (example: conf/shim.conf) holds settings for the core's client
 * (Redis URL, timeouts, failure policy, breaker, replicas, key prefix,
 * TLS), `strict`, and two lists of rules, `inbound` and `outbound`. This
 * file reads it, defaults a rule, and checks what a rule's settings say
 * together: a lease's needs, a bucket's two halves, the key, the addresses
 * of a host (resolved once, here, with getaddrinfo(): a later change of
 * DNS is not seen until the program restarts) and its Redis prefix. Each
 * value is read through shim_conf_table.c's table; a wrapper never parses.
 *
 * Errors name the file, the line and the problem in one line, which the
 * caller prints as it is. The caller's conf is left in a defined state
 * (no rules) on error, so running unlimited needs no extra step. The
 * tbucket tool links this file too (shim_conf_rule() is its lookup by
 * name), so a rule's defaults, name and Redis key have one source.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "shim_conf_int.h"

#define DEFAULT_PREFIX "tb:shim:"
#define DEFAULT_MAX_WAIT_MS 1000
#define DEFAULT_POOL_SIZE 2

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
static int resolve(shim_loader_t *ld, const config_setting_t *s,
                   const char *host, shim_rule_t *r)
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
        return shim_conf_fail(ld, s, "host name is too long");
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
        return shim_conf_fail(ld, s, "cannot resolve host \"%s\": %s", buf,
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
        return shim_conf_fail(ld, s, "host \"%s\" has no IPv4 or IPv6 "
                                     "address", buf);
    }
    return TB_OK;
}

/* ---- Rules --------------------------------------------------------- */

/* The key setting: "$peer" (inbound), "$program", or a fixed name. */
static int set_key(shim_loader_t *ld, const config_setting_t *s, int inbound,
                   shim_rule_t *r)
{
    const char *k;
    size_t len;

    if (shim_conf_string(ld, s, &k) != TB_OK) {
        return TB_ERR;
    }
    if (strcmp(k, "$peer") == 0) {
        if (!inbound) {
            return shim_conf_fail(ld, s, "key \"$peer\" is for inbound "
                                         "rules; use a fixed name or "
                                         "\"$program\"");
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
        return shim_conf_fail(ld, s, "key \"%s\": only \"$peer\" and "
                                     "\"$program\" may start with '$'", k);
    }
    else {
        r->key_kind = SHIM_KEY_FIXED;
    }
    len = strlen(k);
    if (len == 0) {
        return shim_conf_fail(ld, s, "key must not be empty");
    }
    /* The core hashes keys that are too long or odd; it reads len bytes. */
    r->key_len = tb_key_sanitize(k, len, r->key);
    return TB_OK;
}

/* What a lease needs, once the whole rule is read (its settings come in
 * any order): a bucket (has_bucket), the token bucket, a whole cost of
 * at least one and no Redis concurrency limit, whose slots every
 * connection must ask Redis for; a lease_ttl needs a lease. The core
 * would decide any other rule without a lease, so a lease there would
 * do nothing: refused, naming the setting. lease_s is NULL when the rule
 * sets no lease. */
static int check_lease(shim_loader_t *ld, const config_setting_t *lease_s,
                       const config_setting_t *ttl_s, int has_bucket,
                       const shim_rule_t *r)
{
    if (lease_s == NULL) {
        return shim_conf_fail(ld, ttl_s, "rule \"%s\": 'lease_ttl' needs "
                                         "'lease'", r->name);
    }
    if (!has_bucket) {
        return shim_conf_fail(ld, lease_s, "rule \"%s\": 'lease' = %d needs "
                              "a bucket ('capacity' and 'rate')", r->name,
                              r->lease);
    }
    if (r->concurrency > 0) {
        return shim_conf_fail(ld, lease_s, "rule \"%s\": 'lease' = %d cannot "
                              "go with 'concurrency' = %d: every connection "
                              "asks Redis for its slot", r->name, r->lease,
                              r->concurrency);
    }
    if (r->algo != TB_ALGO_TOKEN_BUCKET) {
        return shim_conf_fail(ld, lease_s, "rule \"%s\": 'lease' = %d needs "
                              "algorithm \"token-bucket\", not \"%s\"",
                              r->name, r->lease, tb_algo_name(r->algo));
    }
    if (!(r->take.cost >= 1)
        || r->take.cost != (double)(int64_t)r->take.cost) {
        return shim_conf_fail(ld, lease_s, "rule \"%s\": 'lease' = %d needs "
                              "a whole 'cost' of at least 1, not %g",
                              r->name, r->lease, r->take.cost);
    }
    return TB_OK;
}

/* A rule's defaults, before its settings are read: named after its place
 * in its list (in1, out1, ...), cost 1, keyed by the peer (inbound) or by
 * its name (outbound, set once the name is known). */
static void rule_defaults(shim_rule_t *r, const config_setting_t *g,
                          int inbound, int index)
{
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
}

/* local_concurrency = "auto": its bounds, defaulted and in order; the
 * bounds alone, without auto, are refused. */
static int local_bounds(shim_loader_t *ld, const config_setting_t *g,
                        const config_setting_t **seen, shim_rule_t *r)
{
    if (r->local_concurrency != SHIM_LOCAL_AUTO) {
        if (seen[SHIM_RS_LOCAL_MIN] || seen[SHIM_RS_LOCAL_MAX]) {
            return shim_conf_fail(ld, g, "rule \"%s\": "
                                         "'local_concurrency_min' and "
                                         "'local_concurrency_max' need "
                                         "local_concurrency = \"auto\"",
                                  r->name);
        }
        return TB_OK;
    }
    r->local_min = r->local_min ? r->local_min : SHIM_LOCAL_AUTO_MIN;
    r->local_max = r->local_max ? r->local_max : SHIM_LOCAL_AUTO_MAX;
    if (r->local_min > r->local_max) {
        return shim_conf_fail(ld, g, "rule \"%s\": local_concurrency_min "
                                     "= %d is more than "
                                     "local_concurrency_max = %d", r->name,
                              r->local_min, r->local_max);
    }
    return TB_OK;
}

/* The limits of rule r (group g), once all its settings are read: a
 * port, what a lease needs, a bucket whole (or, inbound, a concurrency
 * limit instead), and the bounds of its algorithm. seen holds the
 * settings the rule has (shim_conf_read_group). */
static int check_limits(shim_loader_t *ld, const config_setting_t *g,
                        int inbound, const config_setting_t **seen,
                        const shim_rule_t *r)
{
    const config_setting_t *lease_s = seen[SHIM_RS_LEASE];
    const config_setting_t *ttl_s = seen[SHIM_RS_LEASE_TTL];
    int have_cap = seen[SHIM_RS_CAPACITY] != NULL;
    int have_rate = seen[SHIM_RS_RATE] != NULL;

    if (seen[SHIM_RS_PORT] == NULL) {
        return shim_conf_fail(ld, g, "%s rule \"%s\" has no 'port'",
                              inbound ? "inbound" : "outbound", r->name);
    }
    if ((lease_s != NULL || ttl_s != NULL)
        && check_lease(ld, lease_s, ttl_s, have_cap && have_rate, r)
               != TB_OK) {
        return TB_ERR;
    }
    /* An inbound rule may limit concurrency alone, with no bucket: in
     * Redis, on this host, or both. */
    if (have_cap != have_rate
        || (!have_cap && !r->concurrency && !r->local_concurrency)) {
        return shim_conf_fail(ld, g, "rule \"%s\" needs both 'capacity' and "
                                     "'rate'%s", r->name,
                              inbound ? " (or 'concurrency') or "
                                        "'local_concurrency'" : "");
    }
    if (have_cap) {
        char why[96];

        if (tb_limit_check(&r->take.limit, why, sizeof(why)) != TB_OK) {
            return shim_conf_fail(ld, g, "rule \"%s\": %s", r->name, why);
        }
    }
    if (r->algo == TB_ALGO_SLIDING_LOG
        && (r->take.limit.capacity > TB_SLOG_MAX_CAPACITY
            || r->take.cost != (double)(int64_t)r->take.cost)) {
        return shim_conf_fail(ld, g, "rule \"%s\": sliding-log needs "
                                     "capacity up to %d and a whole cost",
                              r->name, (int)TB_SLOG_MAX_CAPACITY);
    }
    return TB_OK;
}

/* What rule r is matched and counted by: its key, the addresses of its
 * `address` or `host`, and its Redis prefix "<prefix><in|out>:<name>:". */
static int place_rule(shim_loader_t *ld, const config_setting_t *g,
                      int inbound, const config_setting_t **seen,
                      const char *prefix, shim_rule_t *r)
{
    const config_setting_t *host_s =
        seen[inbound ? SHIM_RS_ADDRESS : SHIM_RS_HOST];

    if (seen[SHIM_RS_KEY] != NULL) {
        if (set_key(ld, seen[SHIM_RS_KEY], inbound, r) != TB_OK) {
            return TB_ERR;
        }
    }
    else if (!inbound) {
        /* By default a downstream is named after its rule, so that every
         * process and replica with this config shares one bucket. */
        r->key_len = tb_key_sanitize(r->name, strlen(r->name), r->key);
    }
    if (host_s != NULL
        && resolve(ld, host_s, config_setting_get_string(host_s), r)
               != TB_OK) {
        return TB_ERR;
    }
    if ((size_t)snprintf(r->prefix, sizeof(r->prefix), "%s%s:%s:", prefix,
                         inbound ? "in" : "out", r->name)
            >= sizeof(r->prefix)
        || !tb_prefix_valid(r->prefix)) {
        return shim_conf_fail(ld, g, "prefix + rule name \"%s%s:%s:\" is "
                                     "longer than %d bytes or invalid",
                              prefix, inbound ? "in" : "out", r->name,
                              TB_PREFIX_MAX);
    }
    return TB_OK;
}

/* Read rule group g, the index'th of its list, into r: its settings
 * through the table (a setting of the other direction is refused, so a
 * misplaced `on_limit` is reported, not ignored), then what they say
 * together. */
static int load_rule(shim_loader_t *ld, const config_setting_t *g,
                     int inbound, int index, const char *prefix,
                     shim_rule_t *r)
{
    const config_setting_t *seen[SHIM_RS_COUNT] = {NULL};

    rule_defaults(r, g, inbound, index);
    if (!config_setting_is_group(g)) {
        return shim_conf_fail(ld, g, "each %s rule must be a group { ... }",
                              inbound ? "inbound" : "outbound");
    }
    if (shim_conf_read_group(ld, g, inbound ? SHIM_DIR_IN : SHIM_DIR_OUT, r,
                             seen) != TB_OK
        || check_limits(ld, g, inbound, seen, r) != TB_OK
        || local_bounds(ld, g, seen, r) != TB_OK) {
        return TB_ERR;
    }
    return place_rule(ld, g, inbound, seen, prefix, r);
}
static int load_rules(shim_loader_t *ld, const config_setting_t *list,
                      int inbound, shim_conf_t *conf)
{
    shim_rule_t *rules = inbound ? conf->in : conf->out;
    unsigned char *bitmap = inbound ? conf->in_ports : conf->out_ports;
    int *count = inbound ? &conf->nin : &conf->nout;
    int i, n;

    if (!config_setting_is_list(list) && !config_setting_is_array(list)) {
        return shim_conf_fail(ld, list, "'%s' must be a list: "
                                        "%s = ( { ... }, ... );",
                              config_setting_name(list),
                              config_setting_name(list));
    }
    n = config_setting_length(list);
    if (n > SHIM_MAX_RULES) {
        return shim_conf_fail(ld, list, "more than %d %s rules",
                              SHIM_MAX_RULES, config_setting_name(list));
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

/* The top-level settings through the table, in one pass; the rules
 * after, because a rule's Redis prefix depends on `prefix` wherever it
 * sits in the file. */
static int load_top(shim_loader_t *ld, const config_setting_t *root,
                    shim_conf_t *conf)
{
    const config_setting_t *seen[SHIM_SC_COUNT] = {NULL};

    if (shim_conf_read_group(ld, root, SHIM_DIR_TOP, conf, seen) != TB_OK) {
        return TB_ERR;
    }
    conf->timeout_set = seen[SHIM_SC_TIMEOUT] != NULL;
    conf->connect_timeout_set = seen[SHIM_SC_CONNECT_TIMEOUT] != NULL;
    if (!conf->connect_timeout_set) {
        conf->opts.connect_timeout_ms = conf->opts.timeout_ms;
    }
    conf->opts.url = conf->url;
    tls_point(conf);
    if (seen[SHIM_SC_INBOUND] != NULL
        && load_rules(ld, seen[SHIM_SC_INBOUND], 1, conf) != TB_OK) {
        return TB_ERR;
    }
    if (seen[SHIM_SC_OUTBOUND] != NULL
        && load_rules(ld, seen[SHIM_SC_OUTBOUND], 0, conf) != TB_OK) {
        return TB_ERR;
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
    shim_loader_t ld = {path, err, errlen};
    config_t cfg;
    const config_setting_t *root;
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
    if (load_top(&ld, root, conf) != TB_OK) {
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
