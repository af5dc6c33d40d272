/* tb_bans.h -- the part of libtb's public header about bans: the index
 * Redis keeps of them, and what the tools do with them (list, narrowed to
 * a rule or a key; ban by hand; unban, which also refills the key's
 * bucket). Included by tb.h, which hosts include alone; shared/tb_rules.c
 * implements it. */
#ifndef TB_BANS_H
#define TB_BANS_H

#ifndef TB_H
#error "include tb.h, not tb_bans.h"
#endif

/* The index of bans under a prefix is the sorted set "<prefix>bans"
 * (members the banned buckets' full keys, scores the bans' ends in ms of
 * Redis's clock), which no client key can name: theirs start with
 * "<prefix>{". It lives as long as its latest ban. */
#define TB_BANS_SUFFIX "bans"

/* An active ban, as tb_client_bans() lists it. */
typedef struct tb_ban {
    char rule[TB_NAME_MAX + 1];    /* The rule that set it.             */
    char key[TB_KEY_RAW_MAX + 2];  /* The client key as stored: the
                                    * sanitised form (tb_key_sanitize). */
    int64_t left_ms;               /* Time left, > 0.                   */
} tb_ban_t;

/* The active bans under prefix, at most max of them, newest first (the
 * latest-ending first: with bans of one length, the last set first),
 * into out; *n their number. Reads the index, not the keyspace: one call
 * for the index and one per ban listed (a ban lifted by tb_client_unban,
 * or expired, is left out). TB_OK, or TB_ERR with c->err and c->errstr. */
int tb_client_bans(tb_client_t *c, const char *prefix, tb_ban_t *out,
                   int max, int *n);

/* The members of the index one call of a filtered listing matches
 * inside Redis (about 6 ms of Redis's time): a listing of a big index
 * is several calls, each short, so that decisions are not held up. */
#define TB_BANS_PAGE 10000

/* Which bans tb_client_bans_query() lists, and what it found. Zero it,
 * then set the filters. */
typedef struct tb_bans_query {
    const char *rule;              /* Only this rule's bans, or NULL.   */
    const char *key;               /* Only this client key's (key_len
                                    * bytes, as a ban names it; stored
                                    * sanitised), or NULL.              */
    size_t key_len;
    int64_t size;                  /* Out: bans in the index.           */
    int64_t matched;               /* Out: those that match (all of
                                    * them without a filter).           */
} tb_bans_query_t;

/* tb_client_bans() narrowed by q (may be NULL: every ban), which also
 * gets the counts: a rule and a key together are one lookup; one of
 * them is matched inside Redis, TB_BANS_PAGE members a call, newest
 * first (a ban added meanwhile may be counted twice, never missed). Bans
 * listed are out[0 .. *n - 1]; matched - *n more match but are not
 * listed. */
int tb_client_bans_query(tb_client_t *c, const char *prefix,
                         tb_bans_query_t *q, tb_ban_t *out, int max, int *n);

/* Ban client key `key` (len bytes) by rule `rule` under prefix for ban_ms
 * (1 .. TB_MAX_BAN_MS) from now, as a refusal by a rule with ban= does
 * (a longer ban already there is kept), and list it. TB_OK or TB_ERR. */
int tb_client_ban(tb_client_t *c, const char *prefix, const char *rule,
                  const char *key, size_t len, int64_t ban_ms);

/* Lift that ban and refill the key's bucket for that rule (it is
 * deleted: a missing bucket is full at the next decision), so that the
 * key's owner gets in at once: a bucket left empty, or in debt after
 * parallel attempts, would refuse the next try and ban again. With
 * TB_UNBAN_KEEP_BUCKET in flags the bucket is left as it is. *found (may
 * be NULL) is 1 when there was a ban. TB_OK or TB_ERR. */
#define TB_UNBAN_KEEP_BUCKET 1u
int tb_client_unban(tb_client_t *c, const char *prefix, const char *rule,
                    const char *key, size_t len, unsigned flags, int *found);

#endif /* TB_BANS_H */
