/* tbucket_shm.h -- what mod_tbucket's shared memory segment offers the
 * other files: counting, the tables, the records of local scopes and
 * rules, the views the status page reads. Included by mod_tbucket.h at
 * the point where the types it names are known; the layout itself is
 * tbucket_shm_int.h's, for tbucket_shm.c and tbucket_shm_records.c only.
 */
#ifndef TBUCKET_SHM_H
#define TBUCKET_SHM_H

/* Create (once per parent) or re-attach the segment; assign the slots of
 * every server. Runs in post_config. */
int tbucket_shm_setup(apr_pool_t *pconf, apr_pool_t *plog, server_rec *s);

/* The stats slot of a server's Redis configuration, or NULL before the
 * first post_config. For child_init: the client counts into it. */
tbucket_client_stats *tbucket_shm_client(const tbucket_srv_conf *sc);

/* Count one decision for a server. Thread- and process-safe. */
void tbucket_count(const tbucket_srv_conf *sc, tbucket_outcome o,
                   int cost_exceeded);

/* Count what a decision with a lease did for a server: paid from the
 * lease, or a refill, and tokens given back. Thread- and process-safe. */
void tbucket_count_lease(const tbucket_srv_conf *sc, const tb_result_t *res);

/* What happened to a cost the application reported. */
typedef enum {
    TBUCKET_COST_REPORTED = 0,        /* A valid cost arrived.          */
    TBUCKET_COST_SETTLED,             /* It changed the buckets by
                                       * delta tokens (+ taken, -
                                       * given back).                   */
    TBUCKET_COST_UNSETTLED,           /* It differed, nothing changed.  */
    TBUCKET_COST_INVALID              /* The value was ignored.         */
} tbucket_cost_event;

/* Count a reported cost for a server. Thread- and process-safe. */
void tbucket_count_cost(const tbucket_srv_conf *sc, tbucket_cost_event ev,
                        double delta);

/* Count lease tokens given back to Redis. Thread- and process-safe. */
void tbucket_count_returned(double tokens);

/* Count a worker thread moved to prio's CPU step, or a move refused. */
void tbucket_count_cpu(tbucket_priority prio, int failed);
/* Count a refusal by the kind of limit that made it, and a concurrency
 * slot's event, for a server. Thread- and process-safe (and async-signal
 * safe: atomic adds only). */
void tbucket_count_refusal(const tbucket_srv_conf *sc, tbucket_limit_kind k);
void tbucket_count_slot(const tbucket_srv_conf *sc, tbucket_slot_event e);

/* Record why a breaker of cs's Redis configuration opened: the error
 * kind of the call, the core's errstr (control characters become '?',
 * cut to TBUCKET_REASON_LEN - 1 bytes) and the time. For breaker
 * transitions only, never per request. Thread- and process-safe; when
 * another writer holds the record, this one is dropped (both describe
 * the same Redis at the same moment). */
void tbucket_shm_note_failure(tbucket_client_stats *cs, int kind,
                              const char *reason, apr_time_t now);

/* Copy cs's last failure into *out: 1, or 0 when there is none or no
 * consistent copy could be read (a writer is in the middle of it).
 * Never blocks a writer. */
int tbucket_shm_failure_get(const tbucket_client_stats *cs,
                            tbucket_failure *out);

/* The local-policy table in the segment, or NULL. */
tb_local_t *tbucket_local_table(void);

/* The heavy hitters in the segment (TBucketTopKeys), or NULL when off:
 * made with the segment, sized by the TBucketTopKeys of the first
 * configuration, kept by every restart that keeps the segment. */
tb_topk_t *tbucket_top_table(void);

/* Count a decision of the shared limit in the heavy hitters:
 * tb_topk_note at the request's time. Thread- and process-safe. */
void tbucket_count_key(const tb_topk_item_t *item, int refused,
                       apr_time_t when);

/* The bytes of the segment's heavy-hitter region, 0 when off. */
apr_size_t tbucket_top_bytes(void);

/* post_config (parent): the record of the rule called name, made or
 * found by name: its slot, or -1 when all are taken by rules of the
 * current configuration. */
int tbucket_shm_scope_slot(const char *name);

/* Count a decision of a rule's slot. Thread- and process-safe. */
void tbucket_count_scope(int slot, tbucket_outcome o);

/* The rules' records, for the status page: an array of
 * tbucket_count_view from p, the current configuration's rules. */
apr_array_header_t *tbucket_shm_scope_views(apr_pool_t *p);

/* The same for TBucketRule names: the record of the rule called name
 * (its slot, or -1), a count of one of its events, and the views (an
 * array of tbucket_count_view whose outcome[] holds the events in
 * tbucket_limit_event order). */
int tbucket_shm_named_slot(const char *name);
void tbucket_count_named(int slot, tbucket_limit_event e);
apr_array_header_t *tbucket_shm_named_views(apr_pool_t *p);

/* The lease table in the segment, or NULL. */
tb_lease_t *tbucket_lease_table(void);

/* Fill *v with a view of the segment: 1, or 0 before the first
 * post_config (v untouched). */
int tbucket_shm_view_get(tbucket_shm_view *v);

/* The local scopes' records, for the status page: an array of
 * tbucket_local_view from p (the scopes of every configuration still
 * holding places, newest configuration's limit). */
apr_array_header_t *tbucket_shm_local_views(apr_pool_t *p);

/* post_config (parent): the record of the local scope called name with
 * limit places, made or found by name (a scope a restart keeps keeps its
 * places, and an auto scope what its cap learnt): its slot, or -1 with
 * *why saying why. auto_min > 0 makes the cap auto, within
 * [auto_min, limit]. */
int tbucket_shm_local_slot(const char *name, int limit, int auto_min,
                           const char **why);

/* Free the places of the process with tag (a child that exited), or,
 * with tag 0, of every owner alive() says is gone. */
void tbucket_shm_local_reap(uint32_t tag, tb_inflight_alive_fn alive);

/* The table of requests local protection refused that are still being
 * answered (one place each), or NULL. */
tb_inflight_t *tbucket_shm_refusing(void);

/* The in-flight table of a scope's slot, or NULL. */
tb_inflight_t *tbucket_shm_local_table(int slot);

/* The self-setting cap of an auto scope's slot, or NULL. */
tb_adapt_t *tbucket_shm_local_adapt(int slot);

/* Count a place taken in, or a request refused by, a scope's slot. */
void tbucket_count_local(int slot, int refused);

/* Count a request shed, or refused by a local limit, for a server. */
void tbucket_count_shed(const tbucket_srv_conf *sc, tbucket_priority prio,
                        int local);

/* The busy workers last counted from the scoreboard and when (in
 * apr_time_t), shared by every child: see tbucket_local.c. */
int tbucket_shm_busy_get(apr_time_t now, apr_time_t max_age,
                         uint32_t *busy);
void tbucket_shm_busy_put(apr_time_t now, uint32_t busy);

#endif /* TBUCKET_SHM_H */
