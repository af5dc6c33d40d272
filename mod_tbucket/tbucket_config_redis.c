/* tbucket_config_redis.c -- the directives that say how to reach Redis:
 * TBucketRedis (the URL, its timeouts, pool, engine and TLS files, read
 * and checked at config time, the TLS context made once) and
 * TBucketBreaker. Split from tbucket_config.c, which holds the table of
 * every directive. */
#include "apr_strings.h"

#include "httpd.h"
#include "http_config.h"
#include "http_log.h"

#include "mod_tbucket.h"

APLOG_USE_MODULE(tbucket);

static tbucket_srv_conf *srv_conf(const server_rec *s)
{
    return ap_get_module_config(s->module_config, &tbucket_module);
}

/* A URL for a message, with any user:password replaced by "***". */
/* The URL as it may be shown in an error: whatever precedes the last '@'
 * (user and password, however mistyped the scheme) becomes "***". */
static const char *redact_raw(apr_pool_t *p, const char *url)
{
    const char *at = strrchr(url, '@');
    const char *scheme = strstr(url, "://");
    const char *start;

    if (!at) {
        return url;
    }
    start = scheme && scheme < at ? scheme + 3 : url;
    return apr_pstrcat(p, apr_pstrmemdup(p, url, (apr_size_t)(start - url)),
                       "***", at, NULL);
}

static apr_status_t tls_cleanup(void *ctx)
{
    tb_tls_free(ctx);
    return APR_SUCCESS;
}

/* tls_ca=, tls_cert=, tls_key=: a file, relative to ServerRoot as
 * httpd's own are, into the field of rec (a const char *) at off. */
static const char *tls_file(cmd_parms *cmd, void *rec, apr_size_t off,
                            const char *what, const char *value)
{
    const char **file = (const char **)((char *)rec + off);

    *file = *value ? ap_server_root_relative(cmd->pool, value) : NULL;
    return *file ? NULL : tbucket_bad_value(cmd, what, value,
                                            "not a file name");
}

#define TLS(f) (APR_OFFSETOF(tbucket_srv_conf, tls) \
                + APR_OFFSETOF(tb_tls_options_t, f))

static const char *tls_ca(cmd_parms *cmd, void *rec, const char *value)
{
    return tls_file(cmd, rec, TLS(ca_file), "tls_ca", value);
}

static const char *tls_cert(cmd_parms *cmd, void *rec, const char *value)
{
    return tls_file(cmd, rec, TLS(cert_file), "tls_cert", value);
}

static const char *tls_key(cmd_parms *cmd, void *rec, const char *value)
{
    return tls_file(cmd, rec, TLS(key_file), "tls_key", value);
}

static const char *const verify_names[] = { "on", "off" };
static const char *const coalesce_names[] = { "off", "on" };

#define SRV(f) APR_OFFSETOF(tbucket_srv_conf, f)

/* The options of TBucketRedis after its URL. Timeouts: a bare number is
 * ms, as the first configurations wrote them. */
static const tbucket_value redis_opts[] = {
    { "timeout", TBUCKET_V_DURATION, TBUCKET_AT_INT, SRV(timeout_ms),
      TBUCKET_SET_TIMEOUT, 1, 60000, TB_DURATION_BARE_MS, NULL, "DURATION",
      NULL, NULL },
    { "connect_timeout", TBUCKET_V_DURATION, TBUCKET_AT_INT,
      SRV(connect_timeout_ms), TBUCKET_SET_CONNECT_TIMEOUT, 1, 60000,
      TB_DURATION_BARE_MS, NULL, "DURATION", NULL, NULL },
    { "pool", TBUCKET_V_INT, TBUCKET_AT_INT, SRV(pool_size),
      TBUCKET_SET_POOL, 1, 1024, 0, NULL, "N", NULL, NULL },
    { "engine", TBUCKET_V_NAME, TBUCKET_AT_INT, SRV(engine), 0, 0,
      TB_ENGINE_COUNT, 0, tb_engine_names, NULL, NULL, NULL },
    { "coalesce", TBUCKET_V_NAME, TBUCKET_AT_INT, SRV(coalesce), 0, 0, 2,
      0, coalesce_names, NULL, NULL, NULL },
    { "tls_ca", TBUCKET_V_FN, TBUCKET_AT_INT, 0, 0, 0, 0, 0, NULL, "FILE",
      NULL, tls_ca },
    { "tls_cert", TBUCKET_V_FN, TBUCKET_AT_INT, 0, 0, 0, 0, 0, NULL, "FILE",
      NULL, tls_cert },
    { "tls_key", TBUCKET_V_FN, TBUCKET_AT_INT, 0, 0, 0, 0, 0, NULL, "FILE",
      NULL, tls_key },
    { "tls_server_name", TBUCKET_V_TEXT, TBUCKET_AT_INT,
      TLS(server_name), 0, 0, 0, 0, NULL, "NAME", NULL, NULL },
    { "tls_verify", TBUCKET_V_NAME, TBUCKET_AT_INT, TLS(no_verify), 0, 0, 2,
      0, verify_names, NULL, NULL, NULL },
    { NULL }
};

/* The TLS context of a TLS URL, made here so that its files are read by
 * root, before httpd drops privileges (a key may be readable by root
 * only), and once per configuration load; children inherit it. */
static const char *make_tls(cmd_parms *cmd, tbucket_srv_conf *sc,
                            const tb_redis_addr_t *addr)
{
    const tb_tls_options_t *t = &sc->tls;
    char err[2 * TB_ERRSTR_LEN];

    if (!addr->tls) {
        if (t->ca_file || t->cert_file || t->key_file || t->server_name
            || t->no_verify) {
            return "TBucketRedis: the tls_* options need a TLS URL: "
                   "rediss://, or ?tls=on after a redis-sentinel:// or "
                   "redis-cluster:// URL";
        }
        return NULL;
    }
    if (!(sc->tls_ctx = tb_tls_create(t, err, sizeof(err)))) {
        return apr_psprintf(cmd->pool, "TBucketRedis: %s", err);
    }
    apr_pool_cleanup_register(cmd->pool, sc->tls_ctx, tls_cleanup,
                              apr_pool_cleanup_null);
    return NULL;
}

const char *tbucket_set_redis(cmd_parms *cmd, void *dummy, const char *args)
{
    tbucket_srv_conf *sc = srv_conf(cmd->server);
    const char *url = ap_getword_conf(cmd->temp_pool, &args);
    const char *msg;
    tb_redis_addr_t addr;
    char err[160];

    (void)dummy;
    if (!*url) {
        return "TBucketRedis: a URL is required, e.g. "
               "TBucketRedis redis://127.0.0.1:6379 timeout=50";
    }
    if (tb_url_parse(url, &addr, err, sizeof(err)) != TB_OK) {
        return tbucket_bad_value(cmd, "URL", redact_raw(cmd->temp_pool, url), err);
    }
    sc->url = apr_pstrdup(cmd->pool, url);
    sc->set |= TBUCKET_SET_URL;
    /* The TLS settings and the engine belong to this line's URL alone. */
    memset(&sc->tls, 0, sizeof(sc->tls));
    sc->tls_ctx = NULL;
    sc->engine = TB_ENGINE_AUTO;
    sc->coalesce = 0;
    if ((msg = tbucket_options(cmd, redis_opts, sc, &sc->set, args,
                               NULL))) {
        return msg;
    }
    return make_tls(cmd, sc, &addr);
}

static const tbucket_value breaker_opts[] = {
    { "threshold", TBUCKET_V_INT, TBUCKET_AT_INT, SRV(breaker_threshold),
      TBUCKET_SET_THRESHOLD, 1, 1000000, 0, NULL, "N", NULL, NULL },
    { "cooldown", TBUCKET_V_DURATION, TBUCKET_AT_INT64,
      SRV(breaker_cooldown_ms), TBUCKET_SET_COOLDOWN, 1, 86400000,
      TB_DURATION_BARE_MS, NULL, "DURATION", NULL, NULL },
    { NULL }
};

const char *tbucket_set_breaker(cmd_parms *cmd, void *dummy,
                                const char *args)
{
    tbucket_srv_conf *sc = srv_conf(cmd->server);
    const char *msg;
    int seen = 0;

    (void)dummy;
    if ((msg = tbucket_options(cmd, breaker_opts, sc, &sc->set, args,
                               &seen))) {
        return msg;
    }
    if (!seen) {
        return "TBucketBreaker: expected threshold=N and/or "
               "cooldown=DURATION, e.g. TBucketBreaker threshold=5 "
               "cooldown=10s";
    }
    return NULL;
}
