/* tb_int.h -- the decision path of the core that hosts never call: from a
 * request to a script call and back (tb_call.c), leases in a decision
 * (tb_lease.c), the circuit breaker (tb_breaker.c), the failure policy
 * (tb_policy.c), rule buckets past one call (tb_rules.c). Internal: the files at
 * the top of shared/ and the unit tests include it; hosts include tb.h
 * only.
 *
 * The decision path sits on the layers below it and may call any of
 * them (shared/README.md): base/ (errors, deadlines, SHA-256), algo/
 * (the scripts and their C twins), redis/ (the transport) and tables/
 * (the tables in caller memory).
 * Nothing below calls back up.
 */
#ifndef TB_INT_H
#define TB_INT_H

#include "tb.h"
#include "base/tb_base.h"
#include "algo/tb_algo_int.h"
#include "redis/tb_redis_int.h"
#include "tables/tb_tables_int.h"

/* ---- Leases in a decision (tb_lease.c) ------------------------------ */

/* The one shape a lease has, for the table and for the wire alike
 * (tb_call.c): whole tokens, at least the cost, of one main token
 * bucket, taken at a whole cost of at least one. */
int tb__lease_shape(const tb_request_t *q);

/* A client's lease table: the host's, the drain count it was made at
 * (a table drained since is not used) and the host's owner tag. */
typedef struct tb__leases {
    tb_lease_t *table;
    uint64_t epoch;
    int owner;
} tb__leases_t;

/* One decision's lease: its bucket's key and limit, the plan, the
 * clock it was read at. */
typedef struct tb__lease_step {
    char rkey[TB_KEY_BUF];
    tb_lease_info_t info;
    tb_lease_plan_t plan;
    int64_t now_ms;
} tb__lease_step_t;

#define TB__LEASE_NONE 0  /* Decide without a lease.                    */
#define TB__LEASE_PAID 1  /* Paid from the lease: *res is the answer.   */
#define TB__LEASE_CALL 2  /* Ask Redis for st->plan.want tokens, giving
                           * st->plan.back back, then tb__lease_end.    */

/* Begin deciding q with ls's table: one of TB__LEASE_*. */
int tb__lease_begin(const tb__leases_t *ls, const tb_request_t *q,
                    tb__lease_step_t *st, tb_result_t *res);
/* After the call: keep the grant beyond the cost as the lease, note what
 * went back in res->lease_returned and add what the host may still spend
 * to res->remaining. Returns tokens the table would not keep, which the
 * caller gives back to the bucket (st->rkey, st->info.limit). */
double tb__lease_end(const tb__leases_t *ls, const tb_request_t *q,
                     const tb__lease_step_t *st, tb_result_t *res);
/* Settle a real cost in the key's lease when it holds one: 1 (*res says
 * TB_SRC_LEASE), or 0 when Redis must settle it. */
int tb__lease_settle(const tb__leases_t *ls, const tb_request_t *q,
                     double cost, tb_result_t *res);

/* ---- Circuit breaker (tb_breaker.c) -------------------------------- */

/* Plain data, no locks: the client serialises access. */
typedef struct tb_breaker {
    int threshold;            /* Consecutive failures that open it.  */
    int64_t cooldown_us;      /* Time open before a probe.           */
    tb_breaker_state_t state;
    int failures;             /* Consecutive failures so far.        */
    tb_monotime_us opened_at_us;
    int probe_in_flight;
} tb_breaker_t;

void tb_breaker_init(tb_breaker_t *b, int threshold, int64_t cooldown_ms);
/* 1 when a call may go to Redis now; in OPEN past the cooldown this moves
 * to HALF_OPEN and lets exactly one probe through. */
int tb_breaker_allow(tb_breaker_t *b, tb_monotime_us now);
/* Report a call's outcome. Return 1 when this report changed the state
 * between closed and open (for logging a transition once). */
int tb_breaker_success(tb_breaker_t *b, tb_monotime_us now);
int tb_breaker_failure(tb_breaker_t *b, tb_monotime_us now);
/* Milliseconds until a probe will be allowed (0 unless open). */
int64_t tb_breaker_wait_ms(const tb_breaker_t *b, tb_monotime_us now);

/* ---- The failure policy (tb_policy.c) ------------------------------ */

/* The failure policy's inputs. */
typedef struct tb__policy {
    tb_policy_t policy;
    int replicas;
    tb_local_t *local;
    int closed_retry_ms;
    int64_t breaker_wait_ms;
    tb_stats_t *stats;       /* The fallback_* counters; not owned.    */
} tb__policy_t;

/* A request's concurrency limit, for the failure policy: the slot set's
 * full Redis key (the local table's entry), N and the slot ttl. */
typedef struct tb__conc {
    const char *key;
    int limit;
    int64_t ttl_ms;
} tb__conc_t;

/* A decision Redis did not make, for the policy. */
typedef struct tb__fallback {
    const char *const *keys;  /* The buckets' full Redis keys, for the
                               * local table.                          */
    const tb_take_t *takes;   /* With the shard's limits.              */
    int n;                    /* Buckets; 0 with conc alone.           */
    const tb__conc_t *conc;   /* NULL without a concurrency limit.     */
    int err;                  /* Why Redis did not decide (TB_ERR_*).  */
    tb_monotime_us now;
} tb__fallback_t;

/* Fill *res by the policy for the decision f. */
void tb__policy_answer(const tb__policy_t *pol, const tb__fallback_t *f,
                       tb_result_t *res);

/* Give back a slot the local policy counted in `window` (res->slot). */
void tb__policy_release(const tb__policy_t *pol, const tb__conc_t *conc,
                        int64_t window, tb_monotime_us now);

/* ---- From a request to a script call (tb_call.c) ------------------ */

/* What a script call is for: a decision, or a settlement (the script's
 * 'settle' mode, the takes' costs being the differences to settle). */
enum { TB__CALL_DECIDE = 0, TB__CALL_SETTLE = 1 };

/* Room for the formatted numbers (numkeys, now, 3 per bucket, the lease
 * and what it gives back, the concurrency limit and ttl, a rule's ban per
 * bucket) and the arguments of one call (EVALSHA, digest, numkeys, the
 * keys and the slot set, the clock, 3 per bucket, 2 for the lease or
 * 'rules' and 2 per bucket, 4 for concurrency). */
#define TB__CALL_NUMS (6 + TB_MAX_BUCKETS * 4)
#define TB__CALL_ARGS (4 + TB_MAX_BUCKETS * 6 + 8)

/* 1 when q has a rule's bucket (tb_take_t.key): its call is in the
 * token-bucket script's 'rules' mode. */
int tb__call_rules(const tb_request_t *q);

/* Check q and fill takes (with the shard's limits) and the full Redis
 * key of every bucket. 0 when the request is malformed. */
int tb__call_prepare(const tb_request_t *q, tb_take_t *takes,
                     char keys[][TB_KEY_BUF]);

/* The slot set's key of q into out (TB_KEY_BUF bytes) and the policy's
 * view of its concurrency limit. 0 when the prefix is bad. */
int tb__call_conc(const tb_request_t *q, char *out, tb__conc_t *conc);

/* One script call in the making: what it is for, the request's buckets
 * (tb__call_prepare fills takes and keys), its concurrency limit, then
 * its argument vector (tb__call_argv). On the caller's stack; nothing in
 * it outlives the call. */
typedef struct tb__call {
    int what;                               /* TB__CALL_*.             */
    tb_take_t takes[TB_MAX_BUCKETS];
    char keys[TB_MAX_BUCKETS][TB_KEY_BUF];
    const tb__conc_t *conc;                 /* NULL: none.             */
    const char *slot_id;                    /* The slot conc takes.    */
    int argc;                               /* argv, out.              */
    const char *argv[TB__CALL_ARGS];
    size_t argvlen[TB__CALL_ARGS];
    char nums[TB__CALL_NUMS][32];           /* The numbers in argv.    */
} tb__call_t;

/* The EVALSHA argument vector of k's call for q into k->argc, argv and
 * argvlen. Returns argc. */
int tb__call_argv(const tb_request_t *q, tb__call_t *k);

/* A decision's script reply read into *res. */
void tb__call_result(const tb__script_reply_t *rep, const tb_request_t *q,
                     const tb_take_t *takes, const char *slot_id,
                     tb_result_t *res);

/* ---- The client's calls, for the files beside it (tb_client.c) ---- */

/* One script call's round trip. */
typedef struct tb__trip {
    const char *key;           /* One of the call's keys: its node in a
                                * cluster.                            */
    tb_monotime_us start;      /* The decision's clock.               */
    tb_monotime_us end;        /* Out: the clock after the call.      */
    tb__script_reply_t rep;    /* Out: the reply, on TB_OK.           */
    tb__error_t e;             /* Out: why none, on TB_ERR.           */
} tb__trip_t;

/* k's script call (argv built), to the pool or to t->key's cluster node,
 * counted and reported to the breaker; sets res->redis_us and
 * res->breaker_change. TB_OK with t->rep, or TB_ERR with t->e. */
int tb__client_script(tb_client_t *c, const tb__call_t *k, tb__trip_t *t,
                      tb_result_t *res);
/* Fill *res by the failure policy for k's decision of q. */
void tb__client_answer(tb_client_t *c, const tb_request_t *q,
                       const tb__call_t *k, int err, tb_monotime_us now,
                       tb_result_t *res);
/* A tool's command about one key: to the pool, or to the key's node.
 * TB_OK with *r (the caller's to tb__reply_free), or TB_ERR with *e and
 * *r NULL. */
int tb__client_command(tb_client_t *c, const char *rkey,
                       const tb__cmd_t *cmd, redisReply **r, tb__error_t *e);
/* Copy e into c's err and errstr (for the host's diagnostics). */
void tb__client_error(tb_client_t *c, const tb__error_t *e);
/* 1 when c speaks to a Redis Cluster. */
int tb__client_cluster(const tb_client_t *c);
/* One 'settle' call of q's script over k's takes (prepared), whose costs
 * are the differences to settle; fills *res as tb_client_settle. */
int tb__client_settle_call(tb_client_t *c, const tb_request_t *q,
                           tb__call_t *k, tb_result_t *res);

/* ---- Rule buckets beyond one call (tb_rules.c) --------------------- */

/* 1 when every key of k (prepared for q) and ckey (the slot set's, or
 * NULL) lie in one Cluster slot: one call decides. */
int tb__rules_one_slot(const tb_request_t *q, const tb__call_t *k,
                       const char *ckey);
/* Decide q, whose keys lie in several slots, by one call per slot, with
 * a refund of what the others took when one refuses, or by the policy
 * when one fails. k is prepared (k->conc, k->slot_id set), t->start is
 * the decision's clock. */
void tb__rules_slots(tb_client_t *c, const tb_request_t *q, tb__call_t *k,
                     tb__trip_t *t, tb_result_t *res);
/* Add the bans a decision of q set (bit i: k->keys[i]) to the index of
 * q's prefix. Best effort: a failure leaves the bans, unlisted. */
void tb__rules_index(tb_client_t *c, const tb_request_t *q,
                     const tb__call_t *k, unsigned bans);


#endif /* TB_INT_H */
