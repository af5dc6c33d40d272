/* tbucket_login.h -- what the login defence's files offer the others:
 * named limits (tbucket_limits.c), count= (tbucket_charge.c), the form
 * reader (tbucket_form.c), known clients (tbucket_known.c) and a
 * request's limits decided in parts (tbucket_parts.c). Included by mod_tbucket.h, after the records and
 * the decision it uses. */
#ifndef TBUCKET_LOGIN_H
#define TBUCKET_LOGIN_H

/* ---- tbucket_limits.c ----------------------------------------------- */

/* 1 when an expression names what only authentication or another
 * module sets (REMOTE_USER, AUTH_TYPE, %{ENV:..}, %{reqenv:..},
 * %{note:..}), so that it is decided in fixups. */
int tbucket_key_is_late(const char *expr);

/* The handlers of TBucketLimit and its aliases TBucketRouteLimit and
 * TBucketRule (tbucket_config.c's table names them). */
const char *tbucket_set_limit(cmd_parms *cmd, void *dcv, const char *args);
const char *tbucket_set_route(cmd_parms *cmd, void *dcv, const char *name,
                              const char *cap, const char *rate);
const char *tbucket_set_rule(cmd_parms *cmd, void *dcv, const char *args);

/* The merge of two scopes' named limits into m (tbucket_merge_dir_conf);
 * past TBUCKET_MAX_LIMITS the outermost are dropped. */
void tbucket_limits_merge(tbucket_dir_conf *m, const tbucket_dir_conf *base,
                          const tbucket_dir_conf *add);

/* How many named limits merging add into base drops, their names joined
 * in *names (from p): check_config reports them. */
int tbucket_limits_dropped(const tbucket_dir_conf *base,
                           const tbucket_dir_conf *add, const char **names,
                           apr_pool_t *p);

/* 1 when a named limit of the configuration bans (ban=): the status
 * page asks Redis for active bans only then. */
int tbucket_limits_ban(void);

/* post_config (parent): each named limit's counters in the segment. */
void tbucket_limits_setup(server_rec *main_s);

/* pre_config: start a new list of named limits. */
void tbucket_limits_pre_config(apr_pool_t *pconf);

/* When a request's limits can be decided: the parts of a scope, by
 * when their keys exist. EARLY: in the access phase, before the body
 * is read (the scope's own bucket and the limits keyed by TBucketKey,
 * limits on addresses and headers); BODY: limits on the form body, read
 * once EARLY has passed; LATE: in fixups, after authentication
 * (REMOTE_USER, another module's variables). A limit keyed by TBucketKey
 * goes with the scope's own bucket (tbucket_main_in). */
#define TBUCKET_PART_EARLY 1
#define TBUCKET_PART_BODY 2
#define TBUCKET_PART_LATE 4
int tbucket_limit_part(const tbucket_limit *l);

struct tbucket_decision;

/* Append to d's takes (from d->q.ntakes, at most TB_MAX_BUCKETS) the
 * buckets of dc's limits in parts: main_limit first when not NULL (the
 * scope's own, at TBucketCost), then the named limits keyed by TBucketKey
 * (when main: parts hold the main part, tbucket_main_in), then those with
 * a key of their own
 * whose key is not empty for r; into d->which[] the record of each named
 * one (same index). d->q.ntakes is the new count, also returned. */
int tbucket_limits_takes(request_rec *r, const tbucket_dir_conf *dc,
                         const tbucket_srv_conf *sc,
                         struct tbucket_decision *d, int parts,
                         int main, const tb_limit_t *main_limit);


/* ---- tbucket_charge.c ----------------------------------------------- */

/* After an allowed decision d of root's chain: keep the reservations of
 * its count= rules in ch (made when NULL; the filter that settles them
 * once the response's status is known is then added). Returns ch. */
tbucket_charge *tbucket_charge_reserve(request_rec *root,
                                      tbucket_srv_conf *sc,
                                      const struct tbucket_decision *d,
                                      tbucket_charge *ch);

/* Forget ch's reservations (they were given back with the rest of a
 * refused chain's takes). NULL does nothing. */
void tbucket_charge_cancel(tbucket_charge *ch);

/* ---- tbucket_tally.c ------------------------------------------------- */

/* Count decision d of r's chain for the status page, all of it in one
 * call: its named limits' events (every part), the lease's figures,
 * and when whole (the chain's first count, or a later part's refusal)
 * its outcome o, the kind of limit that refused, its scope's record and
 * its key among the heavy hitters. */
void tbucket_tally(request_rec *r, const tbucket_dir_conf *dc,
                   const tbucket_srv_conf *sc,
                   const struct tbucket_decision *d, tbucket_outcome o,
                   int whole);

/* A count= reservation of l kept by the status: counted as charged. */
void tbucket_tally_charged(const tbucket_limit *l);

/* A limit with a key of its own found it empty for r (keyless) or not
 * (keyed): counted per child for form posts; a limit whose form field
 * was in none of its first posts is logged once. */
void tbucket_limit_keyless(request_rec *r, const tbucket_limit *l);
void tbucket_limit_keyed(request_rec *r, const tbucket_limit *l);

/* ---- tbucket_charge.c (cont.) ---------------------------------------- */

/* Drop r's Range, Request-Range and If-Range when a rule of dc counts
 * by status: the status must reach count= as the handler set it. */
void tbucket_charge_no_ranges(request_rec *r, const tbucket_dir_conf *dc);

/* The hooks of count= (the FORM expression function, the charge and
 * known filters). */
void tbucket_charge_register(void);

/* ---- tbucket_form.c ------------------------------------------------- */

/* TBucketFormLimit's and TBucketFormTimeout's handlers. */
const char *tbucket_set_form_limit(cmd_parms *cmd, void *dcv,
                                   const char *arg);
const char *tbucket_set_form_timeout(cmd_parms *cmd, void *dcv,
                                     const char *arg);

/* 1 when r has a body that the form reader has not read whole. */
int tbucket_form_unread(request_rec *r);

/* %{FORM:field} for ap_expr: the field of r's urlencoded body, read once
 * per request (at most dc->form_limit bytes, kept for the handler), ""
 * when absent, TBUCKET_FORM_UNREADABLE when it cannot be read. */
#define TBUCKET_FORM_UNREADABLE "#form?"
void tbucket_form_register(void);

/* ---- tbucket_known.c ------------------------------------------------ */

/* TBucketSecret FILE [PREVIOUS]: read and checked at config time. */
const char *tbucket_set_secret(cmd_parms *cmd, void *dummy,
                               const char *cur, const char *prev);

/* The bucket key of rule ru for key K on r: K for an unknown client;
 * for a client known for (ru, K) -- a valid cookie, or its address
 * marked in Redis -- K with the client's own suffix, and *known 1. */
const char *tbucket_known_key(request_rec *r, const tbucket_limit *ru,
                              const tbucket_srv_conf *sc, const char *key,
                              int *known);

/* r succeeded for rule ru with key K: make its client known for
 * known= (a Set-Cookie in r's error headers, a mark in Redis). */
void tbucket_known_mark(request_rec *r, const tbucket_limit *ru,
                        tbucket_srv_conf *sc, const char *key);

/* After an allowed decision d with known clients in it: count, for the
 * status page, each known client whose name's shared bucket is banned
 * (a refusal it was spared); one HGET each, known clients only. */
void tbucket_known_spared(tbucket_srv_conf *sc, const tbucket_decision *d);

/* ---- tbucket_parts.c ------------------------------------------------ */

/* Whether dc's main bucket (TBucketLimit, routes, TBucketConcurrency) is
 * decided in parts (TBUCKET_PART_*): with the early rules, unless
 * TBucketKey needs the user. */
int tbucket_main_in(const tbucket_dir_conf *dc, int parts);

/* Whether parts of dc are left for fixups once check_access decided the
 * early and body parts. */
int tbucket_late_parts(const tbucket_dir_conf *dc);

/* Decide the form body's rules of dc for r after d's takes (allowed, or
 * none yet): evaluating their keys reads the body. 1 when some applied
 * (d->res is then the whole decision, an earlier part given back when
 * this one refused). */
int tbucket_decide_body(request_rec *r, const tbucket_dir_conf *dc,
                        tbucket_srv_conf *sc, tbucket_decision *d);

/* Give back what an allowed decision q (result res) took: its token
 * buckets and its concurrency slot. Best effort; a lease, a shard or a
 * window keeps its take. */
void tbucket_undo_taken(tbucket_srv_conf *sc, const tb_request_t *q,
                        const tb_result_t *res);

/* Keep a copy of what the allowed decision d took in root's pool (rq's
 * taken), for a later part to give back if it refuses. */
void tbucket_keep_taken(request_rec *root, tbucket_req *rq,
                        const tbucket_decision *d);

#endif /* TBUCKET_LOGIN_H */
