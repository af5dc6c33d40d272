/* shim_match.c -- which rule applies to a socket address, and the bucket
 * key of an accepted connection.
 *
 * Pure lookups over the rule tables that shim_conf.c filled: an address
 * in, a rule (or NULL) out; a peer address in, its text out. No system
 * call, lock, clock or allocation, so the wrappers may call them on any
 * thread at any time. An IPv4-mapped IPv6 address counts as the IPv4
 * address it carries, so a rule written for 10.0.0.5 also matches a
 * dual-stack socket's ::ffff:10.0.0.5. Only AF_INET and AF_INET6 ever
 * match: a Unix socket has no rule.
 */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <string.h>

#include "shim_int.h"

/* Split a socket address into family, address bytes and port; IPv4-mapped
 * IPv6 addresses count as IPv4. Returns 0 for anything but a complete
 * AF_INET / AF_INET6 address. */
static int split_addr(const struct sockaddr *sa, socklen_t len, int *family,
                      const unsigned char **bytes, int *port)
{
    if (sa == NULL) {
        return 0;
    }
    if (sa->sa_family == AF_INET && len >= sizeof(struct sockaddr_in)) {
        const struct sockaddr_in *in = (const struct sockaddr_in *)sa;

        *family = AF_INET;
        *bytes = (const unsigned char *)&in->sin_addr;
        *port = ntohs(in->sin_port);
        return 1;
    }
    if (sa->sa_family == AF_INET6 && len >= sizeof(struct sockaddr_in6)) {
        const struct sockaddr_in6 *in6 = (const struct sockaddr_in6 *)sa;

        *port = ntohs(in6->sin6_port);
        if (IN6_IS_ADDR_V4MAPPED(&in6->sin6_addr)) {
            *family = AF_INET;
            *bytes = (const unsigned char *)&in6->sin6_addr + 12;
        }
        else {
            *family = AF_INET6;
            *bytes = (const unsigned char *)&in6->sin6_addr;
        }
        return 1;
    }
    return 0;
}

/* The bitmap turns away unmatched ports with one bit test; the scan
 * after it runs only for a port that has a rule. */
const shim_rule_t *shim_match(const shim_rule_t *rules, int n,
                              const unsigned char *bitmap,
                              const struct sockaddr *sa, socklen_t len)
{
    const unsigned char *bytes;
    int family, port, i, j;

    if (!split_addr(sa, len, &family, &bytes, &port)
        || !shim_port_has_rule(bitmap, port)) {
        return NULL;
    }
    for (i = 0; i < n; i++) {
        const shim_rule_t *r = &rules[i];

        if (r->port != port) {
            continue;
        }
        if (r->naddrs == 0) {
            return r;
        }
        for (j = 0; j < r->naddrs; j++) {
            if (r->addrs[j].family == family
                && memcmp(r->addrs[j].bytes, bytes,
                          family == AF_INET ? 4 : 16) == 0) {
                return r;
            }
        }
    }
    return NULL;
}

size_t shim_inbound_key(const shim_rule_t *r,
                        const struct sockaddr_storage *peer, socklen_t plen,
                        int v6_bits, char *buf, size_t buflen,
                        const char **key)
{
    const unsigned char *bytes;
    int family, port;

    if (r->key_kind != SHIM_KEY_PEER) {
        *key = r->key;
        return r->key_len;
    }
    *key = buf;
    if (!split_addr((const struct sockaddr *)peer, plen, &family, &bytes,
                    &port)
        || tb_ip_key_addr(family, bytes, v6_bits, buf, buflen) == 0) {
        snprintf(buf, buflen, "unknown");
    }
    return strlen(buf);
}
