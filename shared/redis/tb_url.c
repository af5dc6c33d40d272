/* tb_url.c -- Redis addresses: parsing and redaction.
 *
 * Accepts redis://[user:password@]host[:port][/db] (IPv6 hosts in
 * brackets, %XX escapes in the user and password), its TLS twin
 * rediss://, unix:/path[?db=N], and
 * redis-sentinel://[userinfo@]h[:p][,h[:p]...]/MASTER[/db] and
 * redis-cluster://[userinfo@]h[:p][,h[:p]...], whose endpoint lists land
 * in addr->seeds. A query "?tls=on" (or "?tls=off") ends any of the TCP
 * forms: the one way to ask TLS of the sentinels and cluster nodes.
 * Runs at configuration time. tb_url_redact() is what logs and status
 * pages print, so a password never leaves this file in clear.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "redis/tb_redis_int.h"

static int fail(char *err, size_t errlen, const char *what, const char *url)
{
    if (err && errlen) {
        /* Never echo the URL: it may hold a password. */
        snprintf(err, errlen, "bad Redis URL: %s%s", what,
                 url && strncmp(url, "redis://", 8) && strncmp(url, "unix:", 5)
                         && strncmp(url, "rediss://", 9)
                         && strncmp(url, "redis-sentinel://", 17)
                         && strncmp(url, "redis-cluster://", 16)
                     ? " (expected redis://host[:port][/db], rediss://..., "
                       "unix:/path, redis-sentinel://host[:port][,...]/MASTER"
                       " or redis-cluster://host[:port][,...])"
                     : "");
    }
    return TB_ERR;
}

static int hexval(char c)
{
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* Copy s[0..n) into out (size outlen), decoding %XX. */
static int unescape(const char *s, size_t n, char *out, size_t outlen)
{
    size_t i, o = 0;

    for (i = 0; i < n; i++) {
        char c = s[i];

        if (c == '%') {
            int hi, lo;

            if (i + 2 >= n) {
                return TB_ERR;
            }
            hi = hexval(s[i + 1]);
            lo = hexval(s[i + 2]);
            if (hi < 0 || lo < 0 || (hi == 0 && lo == 0)) {
                return TB_ERR;
            }
            c = (char)(hi * 16 + lo);
            i += 2;
        }
        if (o + 1 >= outlen) {
            return TB_ERR;
        }
        out[o++] = c;
    }
    out[o] = '\0';
    return TB_OK;
}

static int parse_db(const char *s, int *db)
{
    int64_t v;

    if (tb_parse_int(s, 0, 1000000, &v, NULL, 0) != TB_OK) {
        return TB_ERR;
    }
    *db = (int)v;
    return TB_OK;
}

static int parse_unix(const char *url, tb_redis_addr_t *a, char *err,
                      size_t errlen)
{
    const char *p = url + 5, *q = strchr(p, '?');
    size_t n = q ? (size_t)(q - p) : strlen(p);

    if (n == 0 || p[0] != '/') {
        return fail(err, errlen, "unix socket path must be absolute", url);
    }
    if (n >= sizeof(a->path)) {
        return fail(err, errlen, "unix socket path is too long", url);
    }
    memcpy(a->path, p, n);
    a->path[n] = '\0';
    if (q) {
        if (strncmp(q, "?db=", 4) != 0 || parse_db(q + 4, &a->db) != TB_OK) {
            return fail(err, errlen, "expected ?db=N after the path", url);
        }
    }
    return TB_OK;
}

static int parse_userinfo(const char *s, size_t n, tb_redis_addr_t *a)
{
    const char *colon = memchr(s, ':', n);

    if (!colon) {
        /* A lone word is a password, as redis-cli's -u treats it. */
        return unescape(s, n, a->password, sizeof(a->password));
    }
    if (unescape(s, (size_t)(colon - s), a->user, sizeof(a->user))
        != TB_OK) {
        return TB_ERR;
    }
    return unescape(colon + 1, n - (size_t)(colon - s) - 1, a->password,
                    sizeof(a->password));
}

/* Host names, IPv4 and IPv6 literals: printable, no URL delimiters. */
static int host_valid(const char *h)
{
    for (; *h; h++) {
        unsigned char c = (unsigned char)*h;

        if (c < 0x21 || c > 0x7e || strchr("@/?#[]{}\\\"'<>%", c)) {
            return 0;
        }
    }
    return 1;
}

/* Parse "host[:port]" or "[v6]:port" from s[0..n) into host (hostsz
 * bytes) and *port (left alone when absent). */
static int parse_hostport(const char *s, size_t n, char *host,
                          size_t hostsz, int *portp)
{
    const char *port = NULL;
    size_t hlen;

    if (n && s[0] == '[') {
        const char *close = memchr(s, ']', n);

        if (!close) {
            return TB_ERR;
        }
        hlen = (size_t)(close - s) - 1;
        if (hlen == 0 || hlen >= hostsz) {
            return TB_ERR;
        }
        memcpy(host, s + 1, hlen);
        host[hlen] = '\0';
        /* Brackets hold an IPv6 literal and nothing else. */
        if (strspn(host, "0123456789abcdefABCDEF:.") != hlen
            || !strchr(host, ':')) {
            return TB_ERR;
        }
        if (close + 1 < s + n) {
            if (close[1] != ':') {
                return TB_ERR;
            }
            port = close + 2;
        }
    }
    else {
        const char *colon = memchr(s, ':', n);

        hlen = colon ? (size_t)(colon - s) : n;
        if (hlen == 0 || hlen >= hostsz) {
            return TB_ERR;
        }
        memcpy(host, s, hlen);
        host[hlen] = '\0';
        if (colon) {
            port = colon + 1;
        }
    }
    if (!host_valid(host)) {
        return TB_ERR;
    }
    if (port) {
        char buf[8];
        size_t plen = (size_t)(s + n - port);
        int64_t v;

        if (plen == 0 || plen >= sizeof(buf)) {
            return TB_ERR;
        }
        memcpy(buf, port, plen);
        buf[plen] = '\0';
        if (tb_parse_int(buf, 1, 65535, &v, NULL, 0) != TB_OK) {
            return TB_ERR;
        }
        *portp = (int)v;
    }
    return TB_OK;
}

/* A comma-separated endpoint list s[0..n) into a->seeds, each with
 * default_port unless it names one; the first also goes to host/port. */
static int parse_seeds(const char *s, size_t n, int default_port,
                       tb_redis_addr_t *a)
{
    const char *end = s + n;

    while (s <= end) {
        const char *comma = memchr(s, ',', (size_t)(end - s));
        const char *e = comma ? comma : end;
        tb_redis_endpoint_t *ep;

        if (a->nseeds == TB_MAX_SEEDS) {
            return TB_ERR - 1; /* Too many: a message of its own. */
        }
        ep = &a->seeds[a->nseeds++];
        ep->port = default_port;
        if (parse_hostport(s, (size_t)(e - s), ep->host, sizeof(ep->host),
                           &ep->port) != TB_OK) {
            return TB_ERR;
        }
        if (!comma) {
            break;
        }
        s = comma + 1;
    }
    memcpy(a->host, a->seeds[0].host, sizeof(a->host));
    a->port = a->seeds[0].port;
    return TB_OK;
}

/* Sentinel master names: printable, no URL delimiters. */
static int master_valid(const char *s, size_t n)
{
    size_t i;

    if (n == 0 || n >= TB_MASTER_NAME_MAX) {
        return 0;
    }
    for (i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];

        if (c < 0x21 || c > 0x7e || strchr("@/?#%,\\\"'", c)) {
            return 0;
        }
    }
    return 1;
}

/* The part after the endpoints: "/MASTER[/db]" for Sentinel, nothing
 * (or a lone "/") for Cluster. */
static int parse_ha_path(const char *slash, tb_redis_addr_t *a, char *err,
                         size_t errlen, const char *url)
{
    const char *name, *db;
    size_t n;

    if (a->kind == TB_REDIS_CLUSTER) {
        if (slash && slash[1] != '\0') {
            return fail(err, errlen, "Redis Cluster has no database "
                        "(nothing may follow the nodes)", url);
        }
        return TB_OK;
    }
    if (!slash || slash[1] == '\0') {
        return fail(err, errlen, "/MASTERNAME is required after the "
                    "sentinels", url);
    }
    name = slash + 1;
    db = strchr(name, '/');
    n = db ? (size_t)(db - name) : strlen(name);
    if (!master_valid(name, n)) {
        return fail(err, errlen, "bad master name", url);
    }
    memcpy(a->master, name, n);
    a->master[n] = '\0';
    if (db && db[1] != '\0' && parse_db(db + 1, &a->db) != TB_OK) {
        return fail(err, errlen, "database must be a number after "
                    "'/MASTERNAME/'", url);
    }
    return TB_OK;
}

/* The query of a TCP URL, "tls=on" or "tls=off", into a->tls. A rediss://
 * URL is TLS already: "tls=off" contradicts it. */
static int parse_query(const char *q, int rediss, tb_redis_addr_t *a)
{
    if (strcmp(q, "tls=on") == 0) {
        a->tls = 1;
        return TB_OK;
    }
    return strcmp(q, "tls=off") == 0 && !rediss ? TB_OK : TB_ERR;
}

/* Parse the part of a TCP URL after its scheme, p[0..end). */
static int parse_tcp(const char *url, const char *p, const char *end,
                     tb_redis_addr_t *a, char *err, size_t errlen);

int tb_url_parse(const char *url, tb_redis_addr_t *a, char *err,
                 size_t errlen)
{
    const char *p, *q, *at;
    char *copy;
    int rc;

    if (!a) {
        return fail(err, errlen, "no address to fill", NULL);
    }
    memset(a, 0, sizeof(*a));
    a->port = 6379;
    if (!url || !*url) {
        return fail(err, errlen, "empty", url);
    }
    if (strncmp(url, "unix:", 5) == 0) {
        return parse_unix(url, a, err, errlen);
    }
    if (strncmp(url, "redis-sentinel://", 17) == 0) {
        a->kind = TB_REDIS_SENTINEL;
        p = url + 17;
    }
    else if (strncmp(url, "redis-cluster://", 16) == 0) {
        a->kind = TB_REDIS_CLUSTER;
        p = url + 16;
    }
    else if (strncmp(url, "redis://", 8) == 0) {
        p = url + 8;
    }
    else if (strncmp(url, "rediss://", 9) == 0) {
        a->tls = 1;
        p = url + 9;
    }
    else {
        return fail(err, errlen, "unknown scheme", url);
    }
    /* The query starts at the first '?' after the userinfo (a password
     * may hold a '?'). */
    at = strrchr(p, '@');
    q = strchr(at ? at : p, '?');
    if (!q) {
        return parse_tcp(url, p, p + strlen(p), a, err, errlen);
    }
    if (parse_query(q + 1, a->tls, a) != TB_OK) {
        return fail(err, errlen, a->tls ? "rediss:// takes no query but "
                    "?tls=on" : "the only query is ?tls=on or ?tls=off", url);
    }
    /* The rest parses as a string of its own. */
    if (!(copy = malloc((size_t)(q - url) + 1))) {
        return fail(err, errlen, "out of memory", url);
    }
    memcpy(copy, url, (size_t)(q - url));
    copy[q - url] = '\0';
    rc = parse_tcp(url, copy + (p - url), copy + (q - url), a, err, errlen);
    free(copy);
    return rc;
}

static int parse_tcp(const char *url, const char *p, const char *end,
                     tb_redis_addr_t *a, char *err, size_t errlen)
{
    const char *at, *slash;

    slash = strchr(p, '/');
    /* The userinfo ends at the last '@' before the path: passwords may
     * hold '@' only when escaped, but be lenient with the host part. */
    at = NULL;
    for (const char *q = p; q < (slash ? slash : end); q++) {
        if (*q == '@') {
            at = q;
        }
    }
    if (at) {
        if (parse_userinfo(p, (size_t)(at - p), a) != TB_OK) {
            return fail(err, errlen, "bad user or password", url);
        }
        p = at + 1;
    }
    if (a->kind != TB_REDIS_SINGLE) {
        int rc = parse_seeds(p, (size_t)((slash ? slash : end) - p),
                             a->kind == TB_REDIS_SENTINEL ? 26379 : 6379, a);

        if (rc != TB_OK) {
            return fail(err, errlen, rc == TB_ERR ? "bad host or port"
                        : "too many hosts (at most 8)", url);
        }
        return parse_ha_path(slash, a, err, errlen, url);
    }
    if (parse_hostport(p, (size_t)((slash ? slash : end) - p), a->host,
                       sizeof(a->host), &a->port) != TB_OK) {
        return fail(err, errlen, "bad host or port", url);
    }
    if (slash && slash[1] != '\0' && parse_db(slash + 1, &a->db) != TB_OK) {
        return fail(err, errlen, "database must be a number after '/'", url);
    }
    return TB_OK;
}

/* Append "host:port" (brackets for IPv6) to out at *used, bounded. */
static void put_endpoint(char *out, size_t outlen, size_t *used,
                         const char *host, int port, const char *sep)
{
    int n;

    if (*used >= outlen) {
        return;
    }
    n = snprintf(out + *used, outlen - *used, "%s%s%s%s:%d", sep,
                 strchr(host, ':') ? "[" : "", host,
                 strchr(host, ':') ? "]" : "", port);
    *used = n < 0 ? outlen : *used + (size_t)n;
}

static void redact_ha(const tb_redis_addr_t *a, char *out, size_t outlen)
{
    size_t used;
    int i, n;

    n = snprintf(out, outlen, "%s://%s%s%s",
                 a->kind == TB_REDIS_SENTINEL ? "redis-sentinel"
                                              : "redis-cluster", a->user,
                 a->password[0] ? (a->user[0] ? ":***" : "***") : "",
                 a->user[0] || a->password[0] ? "@" : "");
    used = n < 0 ? outlen : (size_t)n;
    for (i = 0; i < a->nseeds; i++) {
        put_endpoint(out, outlen, &used, a->seeds[i].host, a->seeds[i].port,
                     i ? "," : "");
    }
    if (a->kind == TB_REDIS_SENTINEL && used < outlen) {
        n = snprintf(out + used, outlen - used, "/%s", a->master);
        used = n < 0 ? outlen : used + (size_t)n;
        if (a->db > 0 && used < outlen) {
            n = snprintf(out + used, outlen - used, "/%d", a->db);
            used = n < 0 ? outlen : used + (size_t)n;
        }
    }
    if (a->tls && used < outlen) {
        snprintf(out + used, outlen - used, "?tls=on");
    }
}

void tb_url_redact(const tb_redis_addr_t *a, char *out, size_t outlen)
{
    char db[24] = "";

    if (outlen == 0) {
        return;
    }
    if (a->kind == TB_REDIS_SENTINEL || a->kind == TB_REDIS_CLUSTER) {
        redact_ha(a, out, outlen);
        return;
    }

    if (a->path[0]) {
        if (a->db > 0) {
            snprintf(db, sizeof(db), "?db=%d", a->db);
        }
        snprintf(out, outlen, "unix:%s%s", a->path, db);
        return;
    }
    if (a->db > 0) {
        snprintf(db, sizeof(db), "/%d", a->db);
    }
    snprintf(out, outlen, "%s://%s%s%s%s%s%s:%d%s",
             a->tls ? "rediss" : "redis", a->user,
             a->password[0] ? (a->user[0] ? ":***" : "***") : "",
             a->user[0] || a->password[0] ? "@" : "",
             strchr(a->host, ':') ? "[" : "", a->host,
             strchr(a->host, ':') ? "]" : "", a->port, db);
}
