/* tb_key.c -- Redis key names from untrusted client keys.
 *
 * A bucket lives at "<prefix>{<client key>}" and a route bucket at
 * "<prefix>{<client key>}:route:<name>" (shard i of a split key:
 * "<prefix>{<client key> s<i>}"), so all of one client's buckets
 * share a Redis Cluster hash slot and one script call decides them
 * atomically. The client key comes from a request header or a peer
 * address and is hostile until proven otherwise: a key that is too long,
 * holds a byte outside printable ASCII, a brace (which would move the hash
 * tag) or starts with '#' is replaced by '#' and 32 hex digits of its
 * SHA-256. Raw keys never start with '#', so nobody can name another
 * client's hashed key, and nothing a client sends leaves the braces.
 * A client known by its IPv6 address is keyed by its network (a /64 by
 * default), which is what one subscriber holds.
 */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <string.h>

#include "base/tb_base.h"

static int safe_byte(unsigned char c)
{
    return c >= 0x21 && c <= 0x7e && c != '{' && c != '}';
}

size_t tb_key_show(const char *key, size_t len, int ip, char *out)
{
    size_t at = 0, n;

    if (ip) {
        memcpy(out, "ip:", 3);
        at = 3;
    }
    n = tb_key_sanitize(key, len, out + at);
    /* A key that is not an address but reads like one ("ip:10.0.0.1",
     * sent as a header) or like this escape is shown after "key:", so
     * no client can pose as another client's address, or as another
     * escaped key, wherever keys are shown. */
    if (!ip && ((n >= 3 && !memcmp(out, "ip:", 3))
                || (n >= 4 && !memcmp(out, "key:", 4)))) {
        memmove(out + 4, out, n + 1);
        memcpy(out, "key:", 4);
        at = 4;
    }
    return at + n;
}

size_t tb_key_sanitize(const char *key, size_t len, char *out)
{
    static const char hex[] = "0123456789abcdef";
    unsigned char d[32];
    size_t i;
    int raw = len <= TB_KEY_RAW_MAX && (len == 0 || key[0] != '#');

    for (i = 0; raw && i < len; i++) {
        raw = safe_byte((unsigned char)key[i]);
    }
    if (raw) {
        if (len) {
            memcpy(out, key, len);
        }
        out[len] = '\0';
        return len;
    }
    if (tb_sha256(key, len, d) != TB_OK) {
        /* No digest (out of memory): no key, rather than a wrong one. */
        out[0] = '\0';
        return 0;
    }
    out[0] = '#';
    for (i = 0; i < 16; i++) {
        out[1 + 2 * i] = hex[d[i] >> 4];
        out[2 + 2 * i] = hex[d[i] & 15];
    }
    out[33] = '\0';
    return 33;
}

/* A route name's bytes: letters, digits, '_', '.' and '-'. */
static int name_byte(unsigned char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')
           || (c >= '0' && c <= '9') || c == '_' || c == '.' || c == '-';
}

/* 1 when s holds 1..max bytes, each one ok() accepts. */
static int valid_text(const char *s, size_t max, int (*ok)(unsigned char))
{
    size_t i, n;

    if (!s) {
        return 0;
    }
    n = strlen(s);
    if (n < 1 || n > max) {
        return 0;
    }
    for (i = 0; i < n; i++) {
        if (!ok((unsigned char)s[i])) {
            return 0;
        }
    }
    return 1;
}

int tb_prefix_valid(const char *prefix)
{
    return valid_text(prefix, TB_PREFIX_MAX, safe_byte);
}

int tb_name_valid(const char *name)
{
    return valid_text(name, TB_NAME_MAX, name_byte);
}

size_t tb_key_build(const char *prefix, const char *key, size_t len,
                    const char *route, char *out)
{
    return tb_key_build_shard(prefix, key, len, -1, route, out);
}

/* What follows the braces: ":route:<name>" or ":rule:<name>". Distinct
 * words, so a route and a rule of the same name never share a bucket. */
typedef struct suffix {
    const char *sep;
    const char *name;
} suffix_t;

static size_t build(const char *prefix, const char *key, size_t len,
                    int shard, const suffix_t *sfx, char *out);

size_t tb_key_build_shard(const char *prefix, const char *key, size_t len,
                          int shard, const char *route, char *out)
{
    suffix_t sfx = { ":route:", route };

    return build(prefix, key, len, shard, &sfx, out);
}

size_t tb_key_build_rule(const char *prefix, const char *key, size_t len,
                         const char *rule, char *out)
{
    suffix_t sfx = { ":rule:", rule };

    if (!rule) {
        return 0;
    }
    return build(prefix, key, len, -1, &sfx, out);
}

/* The shard sits inside the braces, after a space: its own hash tag, and
 * a byte no raw client key holds, so "<key> s<i>" is read back one way
 * only and no client key can spell it. */
static size_t build(const char *prefix, const char *key, size_t len,
                    int shard, const suffix_t *sfx, char *out)
{
    const char *route = sfx->name;
    size_t n, p;

    if (!tb_prefix_valid(prefix) || (route && !tb_name_valid(route))
        || (!key && len) || shard >= TB_MAX_SHARDS) {
        return 0;
    }
    p = strlen(prefix);
    memcpy(out, prefix, p);
    out[p++] = '{';
    n = tb_key_sanitize(key, len, out + p);
    if (len && !n) {
        return 0;
    }
    p += n;
    if (shard >= 0) {
        out[p++] = ' ';
        out[p++] = 's';
        if (shard >= 10) {
            out[p++] = (char)('0' + shard / 10);
        }
        out[p++] = (char)('0' + shard % 10);
    }
    out[p++] = '}';
    if (route) {
        size_t r = strlen(route), sl = strlen(sfx->sep);

        memcpy(out + p, sfx->sep, sl);
        p += sl;
        memcpy(out + p, route, r);
        p += r;
    }
    out[p] = '\0';
    return p;
}

/* snprintf's length when the whole text fit in len bytes, else 0. */
static size_t fitted(int n, size_t len)
{
    return n >= 0 && (size_t)n < len ? (size_t)n : 0;
}

size_t tb_ip_key_addr(int family, const void *addr, int v6_bits, char *out,
                      size_t len)
{
    unsigned char a[16];
    char text[INET6_ADDRSTRLEN];
    int i;

    if (!addr || !out || !len) {
        return 0;
    }
    if (family == AF_INET6
        && IN6_IS_ADDR_V4MAPPED((const struct in6_addr *)addr)) {
        family = AF_INET;
        addr = (const unsigned char *)addr + 12;
    }
    if (family == AF_INET) {
        return inet_ntop(AF_INET, addr, out, (socklen_t)len) ? strlen(out)
                                                             : 0;
    }
    if (family != AF_INET6) {
        return 0;
    }
    if (v6_bits < 1 || v6_bits > 128) {
        v6_bits = 128;
    }
    memcpy(a, addr, sizeof(a));
    for (i = 0; i < 16; i++) {
        int keep = v6_bits - 8 * i;

        if (keep <= 0) {
            a[i] = 0;
        }
        else if (keep < 8) {
            a[i] &= (unsigned char)(0xff << (8 - keep));
        }
    }
    if (!inet_ntop(AF_INET6, a, text, sizeof(text))) {
        return 0;
    }
    return v6_bits == 128 ? fitted(snprintf(out, len, "%s", text), len)
                          : fitted(snprintf(out, len, "%s/%d", text, v6_bits),
                                   len);
}

size_t tb_ip_key(const char *ip, int v6_bits, char *out, size_t len)
{
    unsigned char a[16];

    if (!ip || !out || !len) {
        return 0;
    }
    if (strchr(ip, ':') && inet_pton(AF_INET6, ip, a) == 1) {
        return tb_ip_key_addr(AF_INET6, a, v6_bits, out, len);
    }
    return fitted(snprintf(out, len, "%s", ip), len);
}
