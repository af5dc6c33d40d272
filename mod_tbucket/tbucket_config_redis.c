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

/* A tls_* option of TBucketRedis into sc->tls: 1 when name is one (*msg
 * then says what is wrong with value, or is NULL), else 0. Files are
 * relative to ServerRoot, as httpd's own are. */
static int tls_option(cmd_parms *cmd, tbucket_srv_conf *sc, const char *name,
                      const char *value, const char **msg)
{
    tb_tls_options_t *t = &sc->tls;
    const char **file = !strcmp(name, "tls_ca")     ? &t->ca_file
                         : !strcmp(name, "tls_cert") ? &t->cert_file
                         : !strcmp(name, "tls_key")  ? &t->key_file
                                                     : NULL;

    *msg = NULL;
    if (file) {
        *file = *value ? ap_server_root_relative(cmd->pool, value) : NULL;
        if (!*file) {
            *msg = tbucket_bad_value(cmd, name, value, "not a file name");
        }
        return 1;
    }
    if (!strcmp(name, "tls_server_name")) {
        t->server_name = apr_pstrdup(cmd->pool, value);
        return 1;
    }
    if (!strcmp(name, "tls_verify")) {
        if (strcasecmp(value, "on") && strcasecmp(value, "off")) {
            *msg = tbucket_bad_value(cmd, name, value, "must be on or off");
        }
        t->no_verify = !strcasecmp(value, "off");
        return 1;
    }
    return 0;
}

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

/* One name=value option of TBucketRedis into sc: NULL, or what is
 * wrong; *known is 0 when name is no option of it. */
static const char *redis_option(cmd_parms *cmd, tbucket_srv_conf *sc,
                                const char *name, const char *value,
                                int *known)
{
    const char *msg;
    int64_t n;
    int e;

    *known = 1;
    if (tls_option(cmd, sc, name, value, &msg)) {
        return msg;
    }
    if (!strcmp(name, "timeout") || !strcmp(name, "connect_timeout")) {
        int timeout = name[0] == 't';

        sc->set |= timeout ? TBUCKET_SET_TIMEOUT
                           : TBUCKET_SET_CONNECT_TIMEOUT;
        return tbucket_parse_ms(cmd, name, value, timeout ? &sc->timeout_ms
                                                  : &sc->connect_timeout_ms);
    }
    if (!strcmp(name, "pool")) {
        if ((msg = tbucket_int_value(cmd, "pool", value, 1, 1024, &n))) {
            return msg;
        }
        sc->pool_size = (int)n;
        sc->set |= TBUCKET_SET_POOL;
        return NULL;
    }
    if (!strcmp(name, "engine")) {
        if ((e = tb_name_index(tb_engine_names, TB_ENGINE_COUNT, value, 1))
            < 0) {
            return tbucket_bad_value(cmd, "engine", value,
                             "expected auto, script or module");
        }
        sc->engine = e;
        return NULL;
    }
    *known = 0;
    return NULL;
}

const char *tbucket_set_redis(cmd_parms *cmd, void *dummy, const char *args)
{
    tbucket_srv_conf *sc = srv_conf(cmd->server);
    const char *url = ap_getword_conf(cmd->temp_pool, &args);
    const char *word, *value, *msg;
    tb_redis_addr_t addr;
    char err[160];
    int known;

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
    while (*(word = ap_getword_conf(cmd->temp_pool, &args))) {
        const char *name = tbucket_split_opt(cmd->temp_pool, word, &value);

        msg = name ? redis_option(cmd, sc, name, value, &known) : NULL;
        if (msg) {
            return msg;
        }
        if (!name || !known) {
            return apr_psprintf(cmd->pool, "TBucketRedis: unknown option "
                                "'%s' (expected timeout=MS, "
                                "connect_timeout=MS, pool=N, "
                                "engine=auto|script|module, tls_ca=FILE, "
                                "tls_cert=FILE, tls_key=FILE, "
                                "tls_server_name=NAME or tls_verify=on|off)",
                                word);
        }
    }
    return make_tls(cmd, sc, &addr);
}




const char *tbucket_set_breaker(cmd_parms *cmd, void *dummy,
                               const char *args)
{
    tbucket_srv_conf *sc = srv_conf(cmd->server);
    const char *word, *value;
    char err[128];
    int64_t n;
    int seen = 0;

    (void)dummy;
    while (*(word = ap_getword_conf(cmd->temp_pool, &args))) {
        const char *name = tbucket_split_opt(cmd->temp_pool, word, &value);

        if (name && !strcmp(name, "threshold")) {
            const char *msg = tbucket_int_value(cmd, "threshold", value, 1,
                                        1000000, &n);

            if (msg) {
                return msg;
            }
            sc->breaker_threshold = (int)n;
            sc->set |= TBUCKET_SET_THRESHOLD;
        }
        else if (name && !strcmp(name, "cooldown")) {
            if (tb_parse_duration_ms(value, &n, err, sizeof(err)) != TB_OK) {
                return tbucket_bad_value(cmd, "cooldown", value, err);
            }
            if (n < 1) {
                return tbucket_bad_value(cmd, "cooldown", value, "must be > 0");
            }
            sc->breaker_cooldown_ms = n;
            sc->set |= TBUCKET_SET_COOLDOWN;
        }
        else {
            return apr_psprintf(cmd->pool, "TBucketBreaker: unknown option "
                                "'%s' (expected threshold=N "
                                "cooldown=DURATION)", word);
        }
        seen++;
    }
    if (!seen) {
        return "TBucketBreaker: expected threshold=N and/or "
               "cooldown=DURATION, e.g. TBucketBreaker threshold=5 "
               "cooldown=10s";
    }
    return NULL;
}
