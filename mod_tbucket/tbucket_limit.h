/* tbucket_limit.h -- the one bucket record of mod_tbucket: what a named
 * TBucketLimit (and its aliases TBucketRouteLimit and TBucketRule)
 * declares, and the events each named limit counts. Included by
 * mod_tbucket.h before the scope record that holds them;
 * tbucket_limits.c reads the directives into it. */
#ifndef TBUCKET_LIMIT_H
#define TBUCKET_LIMIT_H

/* ---- Limits: TBucketLimit [NAME], and its aliases ---------------- */

/* known-by=: how a limit's known clients are recognised. */
#define TBUCKET_KNOWN_COOKIE 1
#define TBUCKET_KNOWN_ADDRESS 2

/* Named limits one scope may hold after the merge: with the scope's
 * unnamed limit, every bucket a request can take in one call. Past it,
 * the outermost are dropped and check_config names them. */
#define TBUCKET_MAX_LIMITS (TB_MAX_BUCKETS - 1)
/* The statuses count= may name: 100 .. 599, a bit each. */
#define TBUCKET_STATUS_BITS 500

/* TBucketLimit NAME CAPACITY RATE [key=EXPR] [cost=N] [count=...]
 * [ban=D] [known=D] [known-by=...]: one more bucket of a scope, decided
 * with the scope's others in the same call. Without key= it is keyed by
 * the scope's TBucketKey, in "<prefix>{key}:route:NAME" (the form
 * TBucketRouteLimit NAME CAPACITY RATE declares); with key= by its own
 * expression (an address, a user name from the form, everyone), in
 * "<prefix>{key}:rule:NAME" (TBucketRule NAME KEY CAPACITY RATE ...).
 * Made by the directive in the configuration pool; read-only after. An
 * "Off" limit only removes an outer limit of its name in the merge. */
typedef struct tbucket_limit {
    const char *name;                 /* tbucket_limit_name_valid.     */
    const char *directive;            /* The one that declared it, for
                                       * messages: an alias speaks its
                                       * own name.                      */
    int off;                          /* NAME Off.                      */
    const ap_expr_info_t *key;        /* key=, or NULL: the scope's
                                       * TBucketKey (own_key 0).        */
    unsigned int own_key:1;           /* key= given: "rule" keys.       */
    unsigned int part:3;              /* tbucket_limit_part, kept.      */
    unsigned int cost_set:1;          /* cost= given, else the scope's
                                       * TBucketCost.                   */
    const char *key_text;             /* key= as written, for messages. */
    const char *count_text;           /* count= as written, likewise.   */
    int algo;                         /* algorithm=: -1, or refused on a
                                       * named limit (the scope's).     */
    unsigned int key_addr:1;          /* Exactly %{REMOTE_ADDR}: keyed
                                       * by the client's network, as
                                       * TBucketKey's default is.       */
    unsigned int key_late:1;          /* Needs authentication or another
                                       * module: decided in fixups.     */
    unsigned int key_user:1;          /* A name the client chooses (a
                                       * form field, a header, the
                                       * user): ban= can lock its owner
                                       * out without known=.            */
    unsigned int key_body:1;          /* Reads the form body
                                       * (%{FORM:...}, %{FORMLOGIN:...}):
                                       * decided once what needs no
                                       * body has passed.               */
    unsigned int key_const:1;         /* Names nothing of the request
                                       * (a constant such as "all"):
                                       * its refusals are no client's
                                       * doing, and are not logged for
                                       * fail2ban (tbucket_expr_constant). */
    tb_limit_t limit;
    double cost;                      /* cost=, default 1.              */
    int counted;                      /* count= given: held before the
                                       * handler, charged by status.   */
    unsigned char count[(TBUCKET_STATUS_BITS + 7) / 8];
    int64_t ban_ms;                   /* ban=, 0: none.                 */
    int64_t known_ms;                 /* known=, 0: none.               */
    int known_by;                     /* known-by=: TBUCKET_KNOWN_*.    */
    const char *cookie;               /* "tbk_NAME", made at config
                                       * time.                          */
    int slot;                         /* Its counters in the segment
                                       * (by name), -1 before
                                       * post_config or when none.     */
} tbucket_limit;

/* What happens to a TBucketRule, in the metrics' label order. */
typedef enum {
    TBUCKET_LIMIT_EV_APPLIED = 0,         /* Decisions it was part of.      */
    TBUCKET_LIMIT_EV_REFUSED,             /* Refusals it bound (no ban).    */
    TBUCKET_LIMIT_EV_BANNED,              /* Refusals while its ban held.   */
    TBUCKET_LIMIT_EV_BANS,                /* Bans it set.                   */
    TBUCKET_LIMIT_EV_CHARGED,             /* count= charges after the
                                       * response.                      */
    TBUCKET_LIMIT_EV_KNOWN,               /* Decisions of known clients, on
                                       * a bucket of their own.         */
    TBUCKET_LIMIT_EV_MARKED,              /* Clients made known (a success
                                       * under known=).                 */
    TBUCKET_LIMIT_EV_SPARED,              /* Known clients let in while the
                                       * name was banned for the rest.  */
    TBUCKET_LIMIT_EVENTS
} tbucket_limit_event;

extern const char *const tbucket_limit_event_names[TBUCKET_LIMIT_EVENTS];

#endif /* TBUCKET_LIMIT_H */
