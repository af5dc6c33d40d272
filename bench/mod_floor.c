/* mod_floor.c -- the one-round-trip floor of bench/: a module that sends
 * one blocking PING to Redis per request and does nothing else.
 *
 * A limiter that asks Redis on every request cannot beat one blocking
 * round trip per request; this module is that round trip with no limiter
 * around it (a thread-local hiredis connection, one PING in the access
 * checker), so "module over floor" in bench/run.py says what mod_tbucket
 * costs beyond it. `FloorRedis HOST PORT` (server scope) turns it on; a
 * PING that fails answers 503 and drops the connection, so a broken floor
 * shows as non-2xx responses, never as speed. */
#include <stdlib.h>
#include <sys/time.h>

#include <hiredis/hiredis.h>

#include "apr_strings.h"

#include "httpd.h"
#include "http_config.h"
#include "http_log.h"
#include "http_request.h"

module AP_MODULE_DECLARE_DATA floor_module;

typedef struct floor_conf {
    const char *host;   /* NULL: the module is off.                  */
    int port;
} floor_conf;

/* One connection per thread: the cheapest client there is. */
static __thread redisContext *conn;

static void *create_srv_conf(apr_pool_t *p, server_rec *s)
{
    (void)s;
    return apr_pcalloc(p, sizeof(floor_conf));
}

static const char *set_redis(cmd_parms *cmd, void *dummy, const char *host,
                             const char *port)
{
    floor_conf *fc = ap_get_module_config(cmd->server->module_config,
                                          &floor_module);
    char *end;
    long n = strtol(port, &end, 10);

    (void)dummy;
    if (*end || n < 1 || n > 65535) {
        return apr_psprintf(cmd->pool, "FloorRedis: bad port '%s'", port);
    }
    fc->host = apr_pstrdup(cmd->pool, host);
    fc->port = (int)n;
    return NULL;
}

/* This thread's connection, opened on first use; NULL if Redis cannot be
 * reached (tried again on the next request). Timeouts of 2 s: a loaded
 * bench machine must not turn into errors. */
static redisContext *thread_conn(const floor_conf *fc)
{
    struct timeval tv = { 2, 0 };

    if (conn) {
        return conn;
    }
    conn = redisConnectWithTimeout(fc->host, fc->port, tv);
    if (conn && !conn->err && redisSetTimeout(conn, tv) == REDIS_OK) {
        return conn;
    }
    redisFree(conn);
    conn = NULL;
    return NULL;
}

static int ping(request_rec *r)
{
    const floor_conf *fc = ap_get_module_config(r->server->module_config,
                                                &floor_module);
    redisContext *c;
    redisReply *rep;
    int ok;

    if (!fc->host || !ap_is_initial_req(r)) {
        return DECLINED;
    }
    c = thread_conn(fc);
    rep = c ? redisCommand(c, "PING") : NULL;
    ok = rep && rep->type == REDIS_REPLY_STATUS;
    freeReplyObject(rep);
    if (!ok) {
        /* A context in error cannot be reused: open a fresh one next. */
        ap_log_rerror(APLOG_MARK, APLOG_ERR, 0, r, "floor: PING to %s:%d "
                      "failed: %s", fc->host, fc->port,
                      c ? c->errstr : "cannot connect");
        redisFree(c);
        conn = NULL;
        r->connection->keepalive = AP_CONN_CLOSE;
        return HTTP_SERVICE_UNAVAILABLE;
    }
    return DECLINED;
}

static const command_rec floor_cmds[] = {
    AP_INIT_TAKE2("FloorRedis", set_redis, NULL, RSRC_CONF,
                  "Redis to PING on every request, e.g. "
                  "FloorRedis 127.0.0.1 6379"),
    { NULL }
};

static void register_hooks(apr_pool_t *p)
{
    (void)p;
    /* The phase and place mod_tbucket decides in, so both pay the same
     * request processing around the round trip. */
    ap_hook_check_access(ping, NULL, NULL, APR_HOOK_FIRST,
                         AP_AUTH_INTERNAL_PER_CONF);
}

AP_DECLARE_MODULE(floor) = {
    STANDARD20_MODULE_STUFF,
    NULL,
    NULL,
    create_srv_conf,
    NULL,
    floor_cmds,
    register_hooks,
    0
};
