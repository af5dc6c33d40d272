/* tbucket_known.c -- known clients: a client that has logged in as a user
 * keeps a budget of its own for that name while the name is under attack
 * (known= on TBucketRule), so nobody can lock the owner out.
 *
 * OWASP's device cookies: a success (a status the rule's count= does not
 * count) for a request the rule applied to with key K makes its client
 * known for (rule, K) for the rule's known= time, by a signed cookie
 * (base/tb_token.c: HMAC-SHA-256 under TBucketSecret, checked without
 * Redis) or, for clients that keep no cookies, by its address marked in
 * Redis (tb_known.c). A known client's request for K is decided on a
 * bucket of its own, "K#k<id>" or "K#a<address>", with the rule's
 * capacity and rate: bans on K that unknown clients earned do not reach
 * it, and it cannot spend theirs. A forged, expired, another name's or
 * another rule's cookie is unknown. One cookie per rule, "tbk_<rule>",
 * holds up to 8 names (a family computer).
 */
#include "apr_strings.h"

#include <sys/stat.h>

#include "httpd.h"
#include "http_config.h"
#include "http_core.h"
#include "http_log.h"
#include "http_protocol.h"

#include "mod_tbucket.h"

APLOG_USE_MODULE(tbucket);

#define SECRET_MIN 32
#define SECRET_MAX 4096

/* ---- TBucketSecret ---------------------------------------------------- */

/* The contents of a secret file into k, or a message naming it. */
static const char *read_secret(cmd_parms *cmd, const char *arg,
                               tb_token_keys_t *k)
{
    const char *path = ap_server_root_relative(cmd->temp_pool, arg);
    struct stat st;
    char buf[SECRET_MAX];
    apr_file_t *f;
    apr_size_t n = sizeof(buf);

    if (!path || stat(path, &st) != 0 || !S_ISREG(st.st_mode)) {
        return tbucket_bad_value(cmd, "file", arg, "no such file");
    }
    if (st.st_mode & S_IROTH) {
        return tbucket_bad_value(cmd, "file", arg, "others can read it: "
                                 "make it 0600 or 0640 (chmod o-r)");
    }
    if (apr_file_open(&f, path, APR_READ | APR_BINARY, 0, cmd->temp_pool)
            != APR_SUCCESS) {
        return tbucket_bad_value(cmd, "file", arg, "cannot be read");
    }
    apr_file_read_full(f, buf, sizeof(buf), &n);
    apr_file_close(f);
    if (n < SECRET_MIN) {
        return tbucket_bad_value(cmd, "file", arg, "under 32 bytes: make "
                                 "one with `head -c 32 /dev/urandom "
                                 "| base64`");
    }
    tb_token_keys_add(k, buf, n);
    memset(buf, 0, sizeof(buf));
    return NULL;
}

const char *tbucket_set_secret(cmd_parms *cmd, void *dummy,
                               const char *cur, const char *prev)
{
    tbucket_srv_conf *sc = ap_get_module_config(cmd->server->module_config,
                                                &tbucket_module);
    tb_token_keys_t *k = apr_pcalloc(cmd->pool, sizeof(*k));
    const char *msg;

    (void)dummy;
    if ((msg = read_secret(cmd, cur, k)) != NULL
        || (prev && (msg = read_secret(cmd, prev, k)) != NULL)) {
        return msg;
    }
    sc->secret = k;
    sc->set |= TBUCKET_SET_SECRET;
    return NULL;
}

/* ---- Who is known ---------------------------------------------------- */

/* The value of cookie `name` in r's Cookie headers, NULL when none. */
static const char *cookie_value(request_rec *r, const char *name,
                                apr_size_t *len)
{
    const char *all = apr_table_get(r->headers_in, "Cookie"), *p;
    size_t nl = strlen(name);

    for (p = all; p && *p; ) {
        while (*p == ' ' || *p == ';') {
            p++;
        }
        if (!strncmp(p, name, nl) && p[nl] == '=') {
            const char *v = p + nl + 1;

            *len = strcspn(v, "; ");
            return v;
        }
        p += strcspn(p, ";");
    }
    return NULL;
}

const char *tbucket_known_key(request_rec *r, const tbucket_limit *ru,
                              const tbucket_srv_conf *sc, const char *key,
                              int *known)
{
    char id[TB_TOKEN_ID_LEN];
    const char *v, *addr;
    apr_size_t len = 0;
    int marked = 0;
    tb_token_about_t a;

    *known = 0;
    a.keys = sc->secret;
    a.rule = ru->name;
    a.key = key;
    a.klen = strlen(key);
    a.now_s = (int64_t)apr_time_sec(r->request_time);
    if ((ru->known_by & TBUCKET_KNOWN_COOKIE) && sc->secret
        && (v = cookie_value(r, ru->cookie, &len))
        && tb_token_find(&a, v, len, id)) {
        *known = 1;
        return apr_pstrcat(r->pool, key, "#k", id, NULL);
    }
    if ((ru->known_by & TBUCKET_KNOWN_ADDRESS) && sc->client
        && sc->client->tb && (addr = tbucket_ip_key(r, sc))
        && tb_client_known(sc->client->tb, sc->prefix, ru->name, key,
                           strlen(key), addr, &marked) == TB_OK
        && marked) {
        *known = 1;
        return apr_pstrcat(r->pool, key, "#a", addr, NULL);
    }
    return key;
}

/* ---- Making a client known ------------------------------------------- */

/* Whether r came over TLS, itself or through a proxy that mod_remoteip
 * trusts (it replaced the address, so its X-Forwarded-Proto is too). */
static int secure(request_rec *r)
{
    const char *xfp;

    if (!strcmp(ap_http_scheme(r), "https")) {
        return 1;
    }
    xfp = apr_table_get(r->headers_in, "X-Forwarded-Proto");
    return xfp && !strcasecmp(xfp, "https") && r->useragent_ip
           && r->connection->client_ip
           && strcmp(r->useragent_ip, r->connection->client_ip) != 0;
}

static void set_cookie(request_rec *r, const tbucket_limit *ru,
                       const tbucket_srv_conf *sc, const char *key)
{
    const char *name = ru->cookie;
    apr_size_t len = 0;
    const char *old = cookie_value(r, name, &len);
    int64_t now = (int64_t)apr_time_sec(r->request_time);
    int64_t ttl = ru->known_ms / 1000;
    char *out = apr_palloc(r->pool, TB_TOKEN_COOKIE_LEN);
    tb_token_about_t a;

    a.keys = sc->secret;
    a.rule = ru->name;
    a.key = key;
    a.klen = strlen(key);
    a.now_s = now;
    if (!tb_token_update(&a, now + ttl, old ? old : "", old ? len : 0,
                         out)) {
        return;
    }
    apr_table_add(r->err_headers_out, "Set-Cookie", apr_psprintf(r->pool,
                  "%s=%s; Max-Age=%" APR_INT64_T_FMT "; Path=/; HttpOnly; "
                  "SameSite=Lax%s", name, out, ttl,
                  secure(r) ? "; Secure" : ""));
}

void tbucket_known_mark(request_rec *r, const tbucket_limit *ru,
                        tbucket_srv_conf *sc, const char *key)
{
    const char *addr;

    if ((ru->known_by & TBUCKET_KNOWN_COOKIE) && sc->secret) {
        set_cookie(r, ru, sc, key);
    }
    if ((ru->known_by & TBUCKET_KNOWN_ADDRESS) && sc->client
        && sc->client->tb && (addr = tbucket_ip_key(r, sc))
        && tb_client_know(sc->client->tb, sc->prefix, ru->name, key,
                          strlen(key), addr, ru->known_ms) != TB_OK) {
        ap_log_rerror(APLOG_MARK, APLOG_DEBUG, 0, r, TBLOGNO(00175)
                      "TBucketRule %s: could not mark %s known (%s)",
                      ru->name, addr, sc->client->tb->errstr);
    }
    tbucket_count_named(ru->slot, TBUCKET_LIMIT_EV_MARKED);
}

void tbucket_known_spared(tbucket_srv_conf *sc, const tbucket_decision *d)
{
    int64_t now = (int64_t)apr_time_as_msec(apr_time_now());
    int i, banned;

    for (i = 0; i < d->q.ntakes && sc->client && sc->client->tb; i++) {
        if ((d->known & (1u << i)) && d->which[i] && d->base_key[i]
            && tb_client_banned(sc->client->tb, sc->prefix,
                                d->which[i]->name, d->base_key[i],
                                strlen(d->base_key[i]), now, &banned)
               == TB_OK && banned) {
            tbucket_count_named(d->which[i]->slot, TBUCKET_LIMIT_EV_SPARED);
        }
    }
}
