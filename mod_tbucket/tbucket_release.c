/* tbucket_release.c -- giving back what a request chain holds for a
 * concurrency limit (its TBucketConcurrency slot, its
 * TBucketLocalConcurrency places) before the response's last byte leaves
 * the server, exactly once.
 *
 * A client that sends its next request as soon as it has read the whole
 * answer must find its slot free, even when that request reaches another
 * worker at once. The response is complete when its EOS bucket passes the
 * output filters, so a filter gives back when it sees EOS, before it
 * passes the brigade on: the bytes that travel with the EOS, the final
 * chunk that the CHUNK filter writes after it, and the EOR bucket that
 * ends the request (the flush of a kept-alive connection) all come
 * later. The filter is a protocol filter added to the request that took
 * the slot: httpd moves the protocol filters to the request that replaces
 * it (ap_internal_redirect: PHP through Action, an ErrorDocument,
 * mod_rewrite's [PT]) and keeps them for its own error responses, so the
 * filter sees the EOS of the chain's final response. It comes after
 * HTTP_HEADER, which passes the EOS of a response without a body (HEAD,
 * 204, 304) on with the headers. A sub-request's EOS never reaches it:
 * httpd's SUBREQ_CORE filter drops it.
 *
 * What the filter never sees (a chain that ends without an EOS: an
 * aborted connection, a handler that failed after its first bytes, a
 * prefork child exiting from its signal handler) is given back by a
 * pre-cleanup of the chain's first request's pool, which httpd destroys
 * once, after the response, however the chain ended; as a pre-cleanup it
 * runs before mod_cgid's cleanup, which waits up to 10 ms for the
 * script's process. Whichever of the two comes first gives back; the
 * other finds it done.
 *
 * Left out: a handler that flushes the whole of a response of declared
 * length and then keeps running. Its client has the answer before the
 * EOS, and the slot comes back only when the handler ends, as a limit on
 * the application's work should. (A CGI that printed Content-Length and
 * a 20,000-byte body, then kept its output open for 50 ms, was not seen
 * to do it: no refusal in 160 requests, mod_cgi and mod_cgid.)
 */
#include "httpd.h"
#include "http_config.h"
#include "util_filter.h"

#include "mod_tbucket.h"

APLOG_USE_MODULE(tbucket);

/* One thing to give back: fn(data), once. */
typedef struct tbucket_release {
    tbucket_release_fn fn;
    void *data;
    int done;
} tbucket_release;

static ap_filter_rec_t *release_filter;

/* Give back, unless done already. done is set first: a prefork child's
 * signal handler that destroys the pool while the filter is giving back
 * finds nothing left to do. */
static apr_status_t release_once(void *arg)
{
    tbucket_release *rel = arg;

    if (rel->done) {
        return APR_SUCCESS;
    }
    rel->done = 1;
    return rel->fn(rel->data);
}

static apr_status_t release_out(ap_filter_t *f, apr_bucket_brigade *bb)
{
    apr_bucket *b;

    for (b = APR_BRIGADE_FIRST(bb); b != APR_BRIGADE_SENTINEL(bb);
         b = APR_BUCKET_NEXT(b)) {
        if (APR_BUCKET_IS_EOS(b)) {
            release_once(f->ctx);
            ap_remove_output_filter(f);
            break;
        }
    }
    return ap_pass_brigade(f->next, bb);
}

void tbucket_release_register(void)
{
    release_filter = ap_register_output_filter("TBUCKET_RELEASE",
                                               release_out, NULL,
                                               AP_FTYPE_PROTOCOL);
}

void tbucket_release_at_end(request_rec *r, request_rec *root,
                            tbucket_release_fn fn, void *data)
{
    tbucket_release *rel = apr_palloc(root->pool, sizeof(*rel));

    rel->fn = fn;
    rel->data = data;
    rel->done = 0;
    apr_pool_pre_cleanup_register(root->pool, rel, release_once);
    ap_add_output_filter_handle(release_filter, rel, r, r->connection);
}
