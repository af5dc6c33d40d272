/* tbucket_login.h -- what the login defence's files offer the others:
 * known clients (tbucket_known.c) and a request's limits decided in
 * parts (tbucket_parts.c). Included by mod_tbucket.h, after the records
 * and the decision it uses. */
#ifndef TBUCKET_LOGIN_H
#define TBUCKET_LOGIN_H

/* ---- tbucket_known.c ------------------------------------------------ */

/* TBucketSecret FILE [PREVIOUS]: read and checked at config time. */
const char *tbucket_set_secret(cmd_parms *cmd, void *dummy,
                               const char *cur, const char *prev);

/* The bucket key of rule ru for key K on r: K for an unknown client;
 * for a client known for (ru, K) -- a valid cookie, or its address
 * marked in Redis -- K with the client's own suffix, and *known 1. */
const char *tbucket_known_key(request_rec *r, const tbucket_named_rule *ru,
                              const tbucket_srv_conf *sc, const char *key,
                              int *known);

/* r succeeded for rule ru with key K: make its client known for
 * known= (a Set-Cookie in r's error headers, a mark in Redis). */
void tbucket_known_mark(request_rec *r, const tbucket_named_rule *ru,
                        tbucket_srv_conf *sc, const char *key);

/* ---- tbucket_parts.c ------------------------------------------------ */

/* Log and note what an answer from Redis (or its absence) says
 * (mod_tbucket.c). */
void tbucket_note_call(request_rec *r, tbucket_srv_conf *sc,
                       const tb_result_t *res);

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
