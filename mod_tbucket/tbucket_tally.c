/* tbucket_tally.c -- one decision of the shared limit counted for the
 * status page, in one call from the request path: its outcome, the kind
 * of limit that refused, the scope that set the limit, each named
 * limit's events, the heavy hitters.
 *
 * The request path used to count from six places, each a return to the
 * shared-memory tables; now it hands the whole decision over once. A
 * chain is counted once: a later part (the form body, fixups) counts
 * its named limits' events, and the rest only when it refuses. The
 * per-child hints about limits that cannot be working (a form field
 * never posted, a count= never charged) live here too, beside the counts
 * they read. */
#include "apr_atomic.h"

#include "httpd.h"
#include "http_config.h"
#include "http_log.h"

#include "mod_tbucket.h"

APLOG_USE_MODULE(tbucket);

/* ---- Hints at run time ------------------------------------------------ */

/* Per child, by the limit's record (its slot in the segment). A child
 * says each hint once; every child may. */
#define HINT_SLOTS 256

/* Form posts a limit on a form field looks at before it may say the field
 * is never there: enough that a real form would have shown it. */
#define KEYLESS_POSTS 20
/* Applications of a counted limit before it may say that none was ever
 * charged: a login page under attack charges within a few dozen. */
#define NEVER_CHARGED 200

static apr_uint32_t posts_without[HINT_SLOTS], applied[HINT_SLOTS];
static apr_uint32_t posts_with[HINT_SLOTS], charged[HINT_SLOTS];

/* One more of count[slot], unless settled[slot] says the hint is not
 * for this limit: 1 exactly once, when the count reaches after. */
static int hint_due(const tbucket_limit *l, apr_uint32_t *count,
                    const apr_uint32_t *settled, apr_uint32_t after)
{
    return l->slot >= 0 && l->slot < HINT_SLOTS && !settled[l->slot]
           && apr_atomic_inc32(&count[l->slot]) + 1 == after;
}

void tbucket_limit_keyless(request_rec *r, const tbucket_limit *l)
{
    if (l->key_body && r->method_number == M_POST
        && hint_due(l, posts_without, posts_with, KEYLESS_POSTS)) {
        ap_log_rerror(APLOG_MARK, APLOG_WARNING, 0, r, TBLOGNO(00176)
                      "%s %s: its key %s was empty in each of the first %d "
                      "form posts here (last %s): the form may have no "
                      "such field, and then the limit never applies",
                      l->directive, l->name, l->key_text, KEYLESS_POSTS,
                      r->uri);
    }
}

void tbucket_limit_keyed(request_rec *r, const tbucket_limit *l)
{
    if (l->key_body && l->slot >= 0 && l->slot < HINT_SLOTS
        && r->method_number == M_POST) {
        posts_with[l->slot] = 1;
    }
}

/* A counted limit applied: after NEVER_CHARGED applications without a
 * charge, its count= likely names a status the page never answers. */
static void note_applied(const tbucket_limit *l)
{
    if (l->counted && hint_due(l, applied, charged, NEVER_CHARGED)) {
        ap_log_error(APLOG_MARK, APLOG_WARNING, 0, NULL, TBLOGNO(00177)
                     "%s %s: applied %d times here and never charged: "
                     "does the page ever answer count=%s? (a login form "
                     "that redirects after a failure answers 302)",
                     l->directive, l->name, NEVER_CHARGED, l->count_text);
    }
}

/* ---- The count -------------------------------------------------------- */

void tbucket_tally_charged(const tbucket_limit *l)
{
    tbucket_count_named(l->slot, TBUCKET_LIMIT_EV_CHARGED);
    if (l->slot >= 0 && l->slot < HINT_SLOTS) {
        charged[l->slot] = 1;
    }
}

/* Each named limit of d: applied, on a known client's bucket, a ban it
 * set, the refusal it bound (under its ban or not). */
static void count_limits(const tbucket_decision *d)
{
    const tb_result_t *res = &d->res;
    int i;

    for (i = 0; i < d->q.ntakes; i++) {
        const tbucket_limit *l = d->which[i];

        if (!l) {
            continue;
        }
        tbucket_count_named(l->slot, TBUCKET_LIMIT_EV_APPLIED);
        note_applied(l);
        if (d->known & (1u << i)) {
            tbucket_count_named(l->slot, TBUCKET_LIMIT_EV_KNOWN);
        }
        if (res->bans_set & (1u << i)) {
            tbucket_count_named(l->slot, TBUCKET_LIMIT_EV_BANS);
        }
        if (!res->allowed && res->binding == i
            && res->refused_by == TB_LIMIT_RATE) {
            tbucket_count_named(l->slot, res->banned
                                         ? TBUCKET_LIMIT_EV_BANNED
                                         : TBUCKET_LIMIT_EV_REFUSED);
        }
    }
}

/* A refusal by the kind of limit that made it; the closed policy's
 * refusals are fallback decisions, counted as such only. */
static void count_refusal(const tbucket_srv_conf *sc, const tb_result_t *res)
{
    if (res->allowed || res->source == TB_SRC_CLOSED) {
        return;
    }
    if (res->refused_by == TB_LIMIT_CONCURRENCY) {
        tbucket_count_refusal(sc, TBUCKET_LIMIT_CONCURRENCY);
        tbucket_count_slot(sc, TBUCKET_SLOT_REFUSED);
    }
    else {
        tbucket_count_refusal(sc, TBUCKET_LIMIT_RATE);
    }
}

/* d under its scope's record by outcome, and under its key in the heavy
 * hitters, unless the open or closed policy answered (they say nothing
 * about the key). A shadow refusal let the request through: it counts as
 * allowed there, and as shadow-rejected under the scope. */
static void count_key(request_rec *r, const tbucket_dir_conf *dc,
                      const tbucket_srv_conf *sc, const tbucket_decision *d,
                      tbucket_outcome o)
{
    tb_topk_item_t it;

    if (dc->rule) {
        tbucket_count_scope(dc->rule->slot, o);
    }
    if (!sc->top_k || d->res.source == TB_SRC_OPEN
        || d->res.source == TB_SRC_CLOSED) {
        return;
    }
    memset(&it, 0, sizeof(it));
    it.key = d->q.key;
    it.key_len = d->q.key_len;
    it.ip = d->q.prefix == sc->ip_prefix;
    if (tbucket_refusing_rule(d)) {
        /* A refusal by a limit with its own key is about that key (the
         * user name). */
        it.key = d->takes[d->res.binding].key;
        it.key_len = d->takes[d->res.binding].key_len;
        it.ip = 0;
    }
    it.vhost = (uint32_t)sc->vhost_slot;
    it.limit = tbucket_binding_name(d);
    tbucket_count_key(&it, !d->res.allowed
                           && o != TBUCKET_OUT_SHADOW_REJECTED,
                      r->request_time);
}

void tbucket_tally(request_rec *r, const tbucket_dir_conf *dc,
                   const tbucket_srv_conf *sc,
                   const struct tbucket_decision *d, tbucket_outcome o,
                   int whole)
{
    if (dc->nlimits) {
        count_limits(d);
    }
    if (dc->lease > 0 && d->q.lease > 0) {
        tbucket_count_lease(sc, &d->res);
    }
    if (whole) {
        tbucket_count(sc, o, d->cost_exceeded);
        count_refusal(sc, &d->res);
        count_key(r, dc, sc, d, o);
    }
}
