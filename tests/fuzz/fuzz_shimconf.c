/* fuzz_shimconf.c -- the shim's libconfig loader, shim_conf_load().
 *
 * The input is written to a private temp file and loaded. Inputs that
 * mention "include" are skipped: libconfig's @include would let the
 * fuzzer read arbitrary files (/dev/zero hangs). getaddrinfo() is
 * replaced below by a numeric-only lookup so no input reaches DNS.
 *
 * Invariants on success: counts 0..SHIM_MAX_RULES; every rule has a
 * port 1..65535 whose bitmap bit is set, a valid name and Redis prefix,
 * capacity 1..TB_MAX_CAPACITY, rate (0, 1e9], cost 0..TB_MAX_CAPACITY, a
 * key in the sanitised form, at most SHIM_MAX_ADDRS addresses, lease_ttl
 * in range and a lease only on a token bucket with a whole cost and no
 * concurrency; options in range. On failure: a terminated "path..."
 * message and no rules.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dlfcn.h>
#include <netdb.h>
#include <unistd.h>

#include "fuzz_common.h"
#include "tb_shim.h"

int getaddrinfo(const char *node, const char *service,
                const struct addrinfo *hints, struct addrinfo **res)
{
    typedef int (*gai_fn)(const char *, const char *,
                          const struct addrinfo *, struct addrinfo **);
    static gai_fn real;
    struct addrinfo h;

    if (!real) {
        real = (gai_fn)dlsym(RTLD_NEXT, "getaddrinfo");
    }
    memset(&h, 0, sizeof(h));
    if (hints) {
        h = *hints;
    }
    h.ai_flags |= AI_NUMERICHOST | AI_NUMERICSERV;
    return real(node, service, &h, res);
}

static char path[64];
static shim_conf_t conf;

static void check_rule(const shim_rule_t *r, const unsigned char *bitmap)
{
    size_t i;

    FUZZ_CHECK(r->port >= 1 && r->port <= 65535, "port %d", r->port);
    FUZZ_CHECK(shim_port_has_rule(bitmap, r->port), "bitmap bit %d",
               r->port);
    FUZZ_CHECK(memchr(r->name, '\0', sizeof(r->name)) != NULL, "name");
    FUZZ_CHECK(tb_name_valid(r->name), "accepted an invalid rule name "
               "'%s'", r->name);
    FUZZ_CHECK(memchr(r->prefix, '\0', sizeof(r->prefix)) != NULL,
               "prefix");
    FUZZ_CHECK(tb_prefix_valid(r->prefix), "accepted an invalid prefix "
               "'%s'", r->prefix);
    /* A rule with only a concurrency limit, Redis's or the local one,
     * has no bucket: capacity and rate 0. Any other has a valid one. */
    FUZZ_CHECK(r->take.limit.capacity > 0
                   || r->concurrency > 0 || r->local_concurrency > 0,
               "a rule with no limit at all");
    FUZZ_CHECK(r->take.limit.capacity == 0
                   || (r->take.limit.capacity >= 1
                       && r->take.limit.capacity <= TB_MAX_CAPACITY),
               "capacity %g", r->take.limit.capacity);
    FUZZ_CHECK(r->take.limit.capacity == 0
                   || (r->take.limit.rate_per_sec > 0
                       && r->take.limit.rate_per_sec <= 1e9),
               "rate %g", r->take.limit.rate_per_sec);
    FUZZ_CHECK(r->local_concurrency >= 0
                   && r->local_concurrency <= TB_INFLIGHT_MAX,
               "local_concurrency %d", r->local_concurrency);
    FUZZ_CHECK(r->take.cost >= 0 && r->take.cost <= TB_MAX_CAPACITY,
               "cost %g", r->take.cost);
    /* lease_ttl always holds a usable value (the default without a
     * lease); a lease only where the core would honour it: a token
     * bucket with a whole cost >= 1 and no Redis concurrency limit. */
    FUZZ_CHECK(r->lease_ttl_ms >= 1
                   && r->lease_ttl_ms <= SHIM_MAX_LEASE_TTL_MS,
               "lease_ttl_ms %lld", (long long)r->lease_ttl_ms);
    FUZZ_CHECK(r->lease >= 0 && r->lease <= SHIM_MAX_LEASE, "lease %d",
               r->lease);
    if (r->lease > 0) {
        FUZZ_CHECK(r->take.limit.capacity >= 1
                       && r->take.limit.rate_per_sec > 0,
                   "lease %d without a bucket", r->lease);
        FUZZ_CHECK(r->concurrency == 0, "lease %d with concurrency %d",
                   r->lease, r->concurrency);
        FUZZ_CHECK(r->algo == TB_ALGO_TOKEN_BUCKET, "lease %d with "
                   "algorithm %d", r->lease, (int)r->algo);
        FUZZ_CHECK(r->take.cost >= 1
                       && r->take.cost == (double)(int64_t)r->take.cost,
                   "lease %d with cost %g", r->lease, r->take.cost);
    }
    FUZZ_CHECK(r->naddrs >= 0 && r->naddrs <= SHIM_MAX_ADDRS, "naddrs %d",
               r->naddrs);
    FUZZ_CHECK(r->key_len <= TB_KEY_RAW_MAX && r->key[r->key_len] == '\0',
               "key_len %zu", r->key_len);
    if (r->key_kind != SHIM_KEY_PEER) {
        /* Sanitised: 1..128 bytes of 0x21..0x7e without braces and not
         * starting with '#', or '#' + 32 hex digits. */
        FUZZ_CHECK(r->key_len > 0, "empty fixed key");
        if (r->key[0] == '#') {
            FUZZ_CHECK(r->key_len == 33
                           && strspn(r->key + 1, "0123456789abcdef") == 32,
                       "hashed key '%s'", r->key);
        }
        else {
            for (i = 0; i < r->key_len; i++) {
                unsigned char c = (unsigned char)r->key[i];

                FUZZ_CHECK(c >= 0x21 && c <= 0x7e && c != '{' && c != '}',
                           "raw key byte 0x%02x", c);
            }
        }
    }
    for (i = 0; i < (size_t)r->naddrs; i++) {
        FUZZ_CHECK(r->addrs[i].family == AF_INET
                       || r->addrs[i].family == AF_INET6, "family");
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char err[SHIM_ERR_LEN];
    FILE *f;
    int rc, i;

    if (memmem(data, size, "include", 7) || memmem(data, size, "INCLUDE", 7)
        || memmem(data, size, "Include", 7)) {
        return 0;
    }
    if (!path[0]) {
        snprintf(path, sizeof(path), "/tmp/fuzz_shimconf.%d.conf",
                 (int)getpid());
    }
    f = fopen(path, "wb");
    if (!f) {
        abort();
    }
    if (size && fwrite(data, 1, size, f) != size) {
        abort();
    }
    fclose(f);
    memset(err, 'x', sizeof(err));
    rc = shim_conf_load(path, &conf, err, sizeof(err));
    unlink(path);
    FUZZ_CHECK(rc == TB_OK || rc == TB_ERR, "rc %d", rc);
    FUZZ_CHECK(conf.opts.url == conf.url, "opts.url");
    FUZZ_CHECK(memchr(conf.url, '\0', sizeof(conf.url)) != NULL, "url");
    FUZZ_CHECK(tb_prefix_valid(conf.prefix), "prefix '%s'", conf.prefix);
    if (rc != TB_OK) {
        FUZZ_CHECK(memchr(err, '\0', sizeof(err)) != NULL, "err");
        FUZZ_CHECK(strncmp(err, path, strlen(path)) == 0, "err '%s'", err);
        FUZZ_CHECK(conf.nin == 0 && conf.nout == 0, "rules left on error");
        return 0;
    }
    FUZZ_CHECK(conf.nin >= 0 && conf.nin <= SHIM_MAX_RULES, "nin");
    FUZZ_CHECK(conf.nout >= 0 && conf.nout <= SHIM_MAX_RULES, "nout");
    FUZZ_CHECK(conf.opts.timeout_ms >= 1 && conf.opts.pool_size >= 1
                   && conf.opts.breaker_threshold >= 1
                   && conf.opts.replicas >= 1,
               "options out of range");
    for (i = 0; i < conf.nin; i++) {
        check_rule(&conf.in[i], conf.in_ports);
    }
    for (i = 0; i < conf.nout; i++) {
        check_rule(&conf.out[i], conf.out_ports);
    }
    return 0;
}
