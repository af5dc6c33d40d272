/* tbucket_release.c -- giving back what a request chain holds for a
 * concurrency limit (its TBucketConcurrency slot, its
 * TBucketLocalConcurrency places) before the response's last byte leaves
 * the server, exactly once.
 *
 * A protocol filter gives back when the chain's final EOS passes it; a
 * pre-cleanup of the chain's first request's pool gives back what the
 * filter never saw (aborted clients, failed handlers, a prefork child
 * exiting). Why these two and what is left out: docs/design.md, "File
 * notes".
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
