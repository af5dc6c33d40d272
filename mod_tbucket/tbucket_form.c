/* tbucket_form.c -- %{FORM:field} and %{FORMLOGIN:field} for ap_expr: a
 * field of the request's application/x-www-form-urlencoded body, read
 * before the handler, which still gets the body byte for byte.
 *
 * The first evaluation in a request chain reads at most TBucketFormLimit
 * bytes of the body (8 KB by default) through the input filters, as
 * mod_request's KeptBodySize does, keeps them in the chain's first
 * request, and hands them to whoever reads the body next (PHP, a CGI),
 * before what is still on the connection, through an input filter that
 * every request of the chain gets while kept bytes remain: an Action or
 * a per-directory RewriteRule makes an internal redirect, whose request
 * starts with the connection's filters only. The read has a deadline of
 * its own (TBucketFormTimeout, 2 s): a body that cannot be read -- over
 * the limit, not a form, holding a NUL, or a client that sends too
 * slowly -- gives every field the one value TBUCKET_FORM_UNREADABLE, so
 * padding or pacing a form shares one bucket rather than escaping the
 * rule. No body (a GET of the login page) gives "", so a rule keyed by
 * the field does not apply. The parsing is tbucket_form_parse.c's, the
 * way PHP fills $_POST.
 */
#include "apr_strings.h"

#include "httpd.h"
#include "http_config.h"
#include "http_core.h"
#include "http_log.h"
#include "http_protocol.h"
#include "http_request.h"
#include "ap_expr.h"
#include "util_filter.h"

#include "mod_tbucket.h"
#include "tbucket_form_parse.h"

APLOG_USE_MODULE(tbucket);

#define FORM_KEY "tbucket-form"
#define KEPT_FILTER "TBUCKET_FORM_KEPT"
#define DEFAULT_FORM_LIMIT 8192
#define DEFAULT_FORM_TIMEOUT_MS 2000

/* A request's body as read for its fields: data is NULL when unreadable,
 * len 0 with absent set when there is none. */
typedef struct form_body {
    const char *data;
    apr_size_t len;
    int absent;
    apr_bucket_brigade *kept;         /* What the handler gets first.   */
} form_body;

static ap_filter_rec_t *kept_filter_handle;

/* ---- Handing the body on ---------------------------------------------- */

/* The kept buckets first, then what is left on the connection. */
static apr_status_t kept_filter(ap_filter_t *f, apr_bucket_brigade *bb,
                                ap_input_mode_t mode,
                                apr_read_type_e block, apr_off_t readbytes)
{
    apr_bucket_brigade *kept = f->ctx;
    apr_bucket *after;
    apr_status_t rv;

    if (APR_BRIGADE_EMPTY(kept)) {
        ap_remove_input_filter(f);
        return ap_get_brigade(f->next, bb, mode, block, readbytes);
    }
    if (mode != AP_MODE_READBYTES && mode != AP_MODE_SPECULATIVE) {
        return ap_get_brigade(f->next, bb, mode, block, readbytes);
    }
    rv = apr_brigade_partition(kept, readbytes, &after);
    if (rv != APR_SUCCESS && rv != APR_INCOMPLETE) {
        return rv;
    }
    while (APR_BRIGADE_FIRST(kept) != after) {
        apr_bucket *b = APR_BRIGADE_FIRST(kept), *copy;

        if (mode == AP_MODE_SPECULATIVE) {
            /* Seen, not consumed: the next read gets it again. */
            if ((rv = apr_bucket_copy(b, &copy)) != APR_SUCCESS) {
                return rv;
            }
            APR_BRIGADE_INSERT_TAIL(bb, copy);
            if (APR_BUCKET_NEXT(b) == after) {
                break;
            }
            continue;
        }
        APR_BUCKET_REMOVE(b);
        APR_BRIGADE_INSERT_TAIL(bb, b);
    }
    return APR_SUCCESS;
}

/* ---- Reading it ------------------------------------------------------ */

static int is_form(request_rec *r)
{
    const char *ct = apr_table_get(r->headers_in, "Content-Type");

    return ct && !strncasecmp(ct, "application/x-www-form-urlencoded", 33)
           && (ct[33] == '\0' || ct[33] == ';' || ct[33] == ' ');
}

/* Bound the next blocking read of r's connection by deadline: its
 * socket's timeout for that read is at most the time left (mod_reqtimeout,
 * when loaded, keeps the smaller of its own and this). 0 once the
 * deadline has passed. HTTP/2 streams share their connection's socket
 * with other streams: their reads keep the server's Timeout. */
static int bound_read(request_rec *r, apr_socket_t *sock, apr_time_t deadline,
                      apr_interval_time_t saved)
{
    apr_interval_time_t left = deadline - apr_time_now();

    if (!sock) {
        return 1;
    }
    if (left <= 0) {
        return 0;
    }
    apr_socket_timeout_set(sock, saved >= 0 && saved < left ? saved : left);
    (void)r;
    return 1;
}

/* Read up to limit + 1 bytes of r's body into kept (set aside in
 * r->pool) and their copy into buf, within timeout_ms. 1 when the whole
 * body fit in time, 0 when it is longer, too slow or could not be
 * read. */
static int read_body(request_rec *r, apr_off_t limit, int timeout_ms,
                     apr_bucket_brigade *kept, char *buf, apr_size_t *len)
{
    apr_bucket_brigade *bb = apr_brigade_create(r->pool,
                                                r->connection->bucket_alloc);
    apr_socket_t *sock = r->connection->master ? NULL
                         : ap_get_conn_socket(r->connection);
    apr_interval_time_t saved = -1;
    apr_time_t deadline = apr_time_now()
                          + apr_time_from_msec(timeout_ms);
    int eos = 0, ok = 1;

    if (sock) {
        apr_socket_timeout_get(sock, &saved);
    }
    *len = 0;
    while (ok && !eos && (apr_off_t)*len <= limit) {
        if (!bound_read(r, sock, deadline, saved)
            || ap_get_brigade(r->input_filters, bb, AP_MODE_READBYTES,
                              APR_BLOCK_READ, limit + 1 - (apr_off_t)*len)
               != APR_SUCCESS) {
            ok = 0;
        }
        while (!APR_BRIGADE_EMPTY(bb)) {
            apr_bucket *b = APR_BRIGADE_FIRST(bb);
            const char *data;
            apr_size_t n;

            eos |= APR_BUCKET_IS_EOS(b);
            if (!APR_BUCKET_IS_METADATA(b)
                && apr_bucket_read(b, &data, &n, APR_BLOCK_READ)
                   == APR_SUCCESS) {
                apr_size_t room = (apr_size_t)limit + 1 - *len;

                memcpy(buf + *len, data, n < room ? n : room);
                *len += n < room ? n : room;
            }
            apr_bucket_setaside(b, kept->p);
            APR_BUCKET_REMOVE(b);
            APR_BRIGADE_INSERT_TAIL(kept, b);
        }
    }
    if (sock) {
        apr_socket_timeout_set(sock, saved);
    }
    return ok && eos && (apr_off_t)*len <= limit;
}

/* The body record of root's chain, NULL before the first read. */
static form_body *body_record(request_rec *root)
{
    form_body *fb = NULL;

    apr_pool_userdata_get((void **)&fb, FORM_KEY, root->pool);
    return fb;
}

/* The body of r's chain (root its first request), read once per
 * chain. */
static const form_body *body_of(request_rec *r, request_rec *root)
{
    const tbucket_dir_conf *dc = ap_get_module_config(r->per_dir_config,
                                                      &tbucket_module);
    apr_off_t limit = dc->form_limit > 0 ? dc->form_limit
                                         : DEFAULT_FORM_LIMIT;
    int timeout_ms = dc->form_timeout_ms > 0 ? dc->form_timeout_ms
                                             : DEFAULT_FORM_TIMEOUT_MS;
    form_body *fb = body_record(root);
    char *buf;

    if (fb) {
        return fb;
    }
    fb = apr_pcalloc(root->pool, sizeof(*fb));
    apr_pool_userdata_setn(fb, FORM_KEY, NULL, root->pool);
    if (!ap_request_has_body(r)) {
        fb->absent = 1;
        return fb;
    }
    if (!is_form(r)) {
        return fb;
    }
    fb->kept = apr_brigade_create(root->pool, r->connection->bucket_alloc);
    buf = apr_palloc(root->pool, (apr_size_t)limit + 2);
    if (read_body(r, limit, timeout_ms, fb->kept, buf, &fb->len)
        && !memchr(buf, '\0', fb->len)) {
        fb->data = buf;
    }
    ap_add_input_filter_handle(kept_filter_handle, fb->kept, r,
                               r->connection);
    if (!fb->data) {
        ap_log_rerror(APLOG_MARK, APLOG_DEBUG, 0, r, TBLOGNO(00174)
                      "form body over %" APR_OFF_T_FMT " bytes, not read "
                      "within %d ms, or not read: its fields share one key",
                      limit, timeout_ms);
    }
    return fb;
}

int tbucket_form_unread(request_rec *r)
{
    const form_body *fb = body_record(tbucket_chain_root(r));

    return ap_request_has_body(r) && !(fb && fb->data);
}

/* Every later request of a chain whose first read the body gets the
 * kept bytes first, while some remain: an internal redirect's request
 * starts from the connection's filters. */
static void insert_kept(request_rec *r)
{
    request_rec *root;
    const form_body *fb;

    if (r->main || !r->prev) {
        return;
    }
    root = tbucket_chain_root(r);
    fb = body_record(root);
    if (fb && fb->kept && !APR_BRIGADE_EMPTY(fb->kept)) {
        ap_add_input_filter_handle(kept_filter_handle, fb->kept, r,
                                   r->connection);
    }
}

/* %{FORM:field} and %{FORMLOGIN:field}: data says which. */
static const char *form_func(ap_expr_eval_ctx_t *ctx, const void *data,
                             const char *arg)
{
    request_rec *r = ctx->r;
    const form_body *fb;
    char *out;
    apr_size_t n;

    if (!r || !arg || !*arg) {
        return "";
    }
    fb = body_of(r, tbucket_chain_root(r));
    if (fb->absent) {
        return "";
    }
    if (!fb->data) {
        return TBUCKET_FORM_UNREADABLE;
    }
    out = apr_palloc(r->pool, fb->len + 1);
    switch (tbucket_form_field(fb->data, fb->len, arg, out, &n)) {
    case TBUCKET_FORM_FOUND:
        break;
    case TBUCKET_FORM_SHARED:
        /* Given twice, as an array, or past what PHP reads. */
        return TBUCKET_FORM_UNREADABLE;
    default:
        return "";
    }
    if (data && tbucket_form_login(out, n, &n) != TBUCKET_FORM_FOUND) {
        return TBUCKET_FORM_UNREADABLE;
    }
    /* A NUL in the value would end the key early: a key of its own. */
    return memchr(out, '\0', n) ? TBUCKET_FORM_UNREADABLE : out;
}

static int expr_lookup(ap_expr_lookup_parms *parms)
{
    if (parms->type != AP_EXPR_FUNC_STRING) {
        return DECLINED;
    }
    if (!strcasecmp(parms->name, "FORM")) {
        *parms->func = form_func;
        *parms->data = NULL;
        return OK;
    }
    if (!strcasecmp(parms->name, "FORMLOGIN")) {
        *parms->func = form_func;
        *parms->data = "login";
        return OK;
    }
    return DECLINED;
}

void tbucket_form_register(void)
{
    /* First among the input filters a request adds: the kept bytes are
     * already decoded (chunks, TLS) by the ones below. */
    kept_filter_handle = ap_register_input_filter(KEPT_FILTER, kept_filter,
                                                  NULL, AP_FTYPE_RESOURCE);
    ap_hook_expr_lookup(expr_lookup, NULL, NULL, APR_HOOK_MIDDLE);
    ap_hook_insert_filter(insert_kept, NULL, NULL, APR_HOOK_MIDDLE);
}

const char *tbucket_set_form_limit(cmd_parms *cmd, void *dcv,
                                   const char *arg)
{
    tbucket_dir_conf *dc = dcv;
    int64_t n;
    const char *msg = tbucket_int_value(cmd, "size", arg, 1, 1048576, &n);

    TBUCKET_HTACCESS_CHECK(cmd);

    if (!msg) {
        dc->form_limit = (apr_off_t)n;
    }
    return msg;
}

const char *tbucket_set_form_timeout(cmd_parms *cmd, void *dcv,
                                     const char *arg)
{
    static const tbucket_value timeout = {
        "timeout", TBUCKET_V_DURATION, TBUCKET_AT_INT,
        APR_OFFSETOF(tbucket_dir_conf, form_timeout_ms), 0, 1, 60000, 0,
        NULL, "DURATION", NULL, NULL
    };

    TBUCKET_HTACCESS_CHECK(cmd);

    return tbucket_value_store(cmd, &timeout, dcv, arg);
}
