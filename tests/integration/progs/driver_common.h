/* driver_common.h -- what the libtb test drivers (tb_driver.c, tb_batch.c)
 * share: the client's options from their command lines, under the same
 * letters in both, and a request for one client key.
 */
#ifndef DRIVER_COMMON_H
#define DRIVER_COMMON_H

#include <stdlib.h>
#include <string.h>

#include "tb.h"

/* Set the client option of command line letter ch to arg: 1 when done,
 * 0 when ch names no client option, -1 for a bad value.
 *   u URL  t TIMEOUT_MS  c CONNECT_MS  p POOL  P open|closed|local
 *   r REPLICAS  b BREAKER_THRESHOLD  B BREAKER_COOLDOWN_MS
 *   A TLS_CA  C TLS_CERT  K TLS_KEY  N TLS_SERVER_NAME  V on|off */
static int client_option(tb_options_t *o, int ch, const char *arg)
{
    switch (ch) {
    case 'u': o->url = arg; break;
    case 't': o->timeout_ms = atoi(arg); break;
    case 'c': o->connect_timeout_ms = atoi(arg); break;
    case 'p': o->pool_size = atoi(arg); break;
    case 'P': return tb_policy_parse(arg, &o->policy) == TB_OK ? 1 : -1;
    case 'r': o->replicas = atoi(arg); break;
    case 'b': o->breaker_threshold = atoi(arg); break;
    case 'B': o->breaker_cooldown_ms = atoll(arg); break;
    case 'A': o->tls.ca_file = arg; break;
    case 'C': o->tls.cert_file = arg; break;
    case 'K': o->tls.key_file = arg; break;
    case 'N': o->tls.server_name = arg; break;
    case 'V': o->tls.no_verify = strcmp(arg, "off") == 0; break;
    case 'E': {
        int e = tb_name_index(tb_engine_names, TB_ENGINE_COUNT, arg, 0);

        if (e < 0) {
            return -1;
        }
        o->engine = (tb_engine_t)e;
        break;
    }
    default: return 0;
    }
    return 1;
}

/* A request over the n takes t for client key `key` (key_len bytes) under
 * prefix; every other field zero. */
static void request_init(tb_request_t *q, const char *prefix,
                         const char *key, size_t key_len, const tb_take_t *t,
                         int n)
{
    memset(q, 0, sizeof(*q));
    q->prefix = prefix;
    q->key = key;
    q->key_len = key_len;
    q->takes = t;
    q->ntakes = n;
}

#endif /* DRIVER_COMMON_H */
