/* rm_command.h -- the pure half of tbucket_redis.so: a tbucket.* command's
 * arguments read as the Lua scripts read them, the stored state decoded as
 * they decode it, and the decision made by the core's C twins.
 *
 * Nothing here calls Redis: tbucket_redis.c reads the keys, hands their
 * text to the decoders, runs rm_decide() and writes back what the
 * outcome says; tests/fuzz/fuzz_rmcall.c drives the same functions with
 * hostile bytes. The math is the twins' (shared/algo/tb_bucket.c,
 * tb_gcra.c, tb_fwindow.c, tb_swindow.c, tb_slog.c); this file only
 * chooses which twin runs, and folds a full concurrency slot set into the
 * verdict the way shared/algo/tb_prelude.lua does.
 */
#ifndef RM_COMMAND_H
#define RM_COMMAND_H

#include <stddef.h>
#include <stdint.h>

#include "tb.h"
#include "algo/tb_algo_int.h"
#include "base/tb_base.h"

/* KEYS of one call: TB_MAX_BUCKETS buckets and the slot set. */
#define RM_MAX_KEYS (TB_MAX_BUCKETS + 1)
/* The longest command: name, numkeys, the keys, the clock, three numbers
 * per bucket, the optional ones ('rules' and two per bucket, more than
 * the lease's two) and the four concurrency arguments. */
#define RM_MAX_ARGS (2 + RM_MAX_KEYS + 1 + 5 * TB_MAX_BUCKETS + 1 + 4)
/* The longest slot id accepted (the client's are under TB_SLOT_ID_LEN). */
#define RM_MAX_SLOT_ID 512
/* The largest clock, in ms, a caller may inject (2^53: every whole number
 * up to it is exact in a double, as the scripts hold it). */
#define RM_MAX_CLOCK_MS 9007199254740992.0

/* The longest TTL a script can set: PEXPIRE takes its argument as
 * Redis formats a Lua number, "%.17g", which has an exponent from 1e17
 * on, and refuses it. */
#define RM_MAX_TTL_MS 1e17

/* One argument of a command: bytes, not NUL-terminated. */
typedef struct rm_arg {
    const char *p;
    size_t len;
} rm_arg_t;

/* A parsed call. The keys stay where they were: bucket i is argv[2 + i],
 * the slot set (conc) argv[2 + n]. */
typedef struct rm_call {
    tb_algo_t algo;
    int numkeys;                  /* KEYS: n buckets, then the slot set.  */
    int n;                        /* Buckets, 0 .. TB_MAX_BUCKETS.        */
    int has_now;                  /* ARGV[1] gave a clock (tests).        */
    int64_t now_ms;               /* That clock, in ms.                   */
    tb_limit_t lim[TB_MAX_BUCKETS];
    double cost[TB_MAX_BUCKETS];  /* Tokens; with settle the difference
                                   * to settle, in -1e9 .. 1e9.           */
    int settle;                   /* 'settle' (token bucket, GCRA).       */
    int lease;                    /* A lease size was given (token
                                   * bucket, one bucket).                 */
    double want;                  /* The lease size, tokens.              */
    double back;                  /* Tokens of an expired lease given
                                   * back before the decision, >= 0.      */
    int rules;                    /* 'rules' (token bucket): TBucketRule's
                                   * buckets, held and banning.           */
    unsigned hold;                /* Bit i: bucket i is checked, not
                                   * charged.                             */
    double ban_ms[TB_MAX_BUCKETS];/* A refusal by bucket i bans it this
                                   * long (ms, whole, 0: never).          */
    int conc;                     /* 'conc' N ttl id were given.          */
    double conc_limit;            /* N: slots in flight at most.          */
    int64_t conc_ttl_ms;          /* A slot's life, 1 ..
                                   * TB_MAX_CONCURRENCY_TTL_MS.          */
    rm_arg_t slot_id;        /* The member the slot is taken as.     */
} rm_call_t;

/* The command name of an algorithm ("tbucket.bucket", ...). */
const char *rm_command_name(tb_algo_t algo);

/* numkeys of a command as EVAL reads it: 0 .. argc - 2. -1 when it is not
 * a whole number in range (the getkeys callback then names no key). */
int rm_numkeys(int argc, const rm_arg_t *argv);

/* Parse a whole tbucket.<algo> command (argv[0] is its name) into *c.
 * TB_OK, or TB_ERR with the error reply in err: EVAL's own messages for
 * numkeys, the script's "ERR bad lease" for a lease it refuses, else
 * "ERR tbucket.<algo>: <why>". Accepts what the client sends and what the
 * script accepts of it; refuses what the script would fail on or turn into
 * nonsense (not a number, NaN, infinities, limits tb_limit_check()
 * refuses, costs out of range, trailing arguments the script ignores). */
int rm_parse(tb_algo_t algo, int argc, const rm_arg_t *argv,
                  rm_call_t *c, char *err, size_t errlen);

/* Read a number as Lua 5.1's tonumber() does (strtod in the C locale,
 * hexadecimal, surrounding white space). 1 with *out set, 0 for what
 * tonumber() turns into nil, and for embedded NULs. */
int rm_lua_number(const char *p, size_t len, double *out);

/* Numbers are written as Redis 7.0 writes a Lua number handed to
 * redis.call(), "%.17g" in the C locale, so that the stored bytes are the
 * script's: tb__fmt_num (base/tb_cnum.c). */

/* The state of bucket i as read from its key. */
typedef struct rm_state {
    tb_bucket_t bucket;   /* Token bucket: hash fields tokens, ts.        */
    tb_gcra_t gcra;       /* GCRA: the string's TAT.                      */
    tb_window_t window;   /* Windows: hash fields w, n or w, cur, prev.   */
    double count;         /* Sliding log: members left after the trim.    */
    double ban_until;     /* Token bucket, 'rules' and 'settle': the hash
                           * field ban (ms of the clock), -1 when absent
                           * or not a number.                             */
} rm_state_t;

/* Decode a key's fields, each NULL (p NULL) when missing, as the scripts
 * do: a field tonumber() cannot read makes the whole bucket a missing
 * one. Fields that read as infinities, NaN or (for a stamp) not a whole
 * number within +-2^53 count as missing too: only a hand-written key
 * holds them, and the twins' arithmetic is defined on finite numbers. */
void rm_decode_bucket(const rm_arg_t *tokens,
                           const rm_arg_t *ts, tb_bucket_t *b);
/* The ban field as tonumber() reads it: -1 when missing or not a finite
 * number. */
double rm_decode_ban(const rm_arg_t *ban);
void rm_decode_gcra(const rm_arg_t *tat, tb_gcra_t *g);
/* prev is NULL for the fixed window, which does not read it. */
void rm_decode_window(const rm_arg_t *w, const rm_arg_t *cur,
                           const rm_arg_t *prev, tb_window_t *st);

/* The sliding log's read of one entry: the score of entry k (0-based,
 * oldest first) of bucket i's set, after the trim. */
typedef double rm_nth_fn(void *ctx, int i, int64_t k);

/* What a call decided and what it writes. */
typedef struct rm_outcome {
    tb_verdict_t v;        /* allowed, remaining, retry_ms, binding: the
                            * reply's first four elements.               */
    int64_t granted;       /* Lease: the reply's fifth, 0 when refused.  */
    int store[TB_MAX_BUCKETS];  /* 1: write st[i] with ttl_ms[i] (sliding
                                 * log: append cost[i] members).         */
    rm_state_t st[TB_MAX_BUCKETS];
    int64_t ttl_ms[TB_MAX_BUCKETS];
    /* 'rules': the banned buckets that refused (bit i), and those this
     * call bans: bucket i's field ban becomes now + c->ban_ms[i], its TTL
     * at least that long. */
    unsigned banned;
    unsigned ban_set;
} rm_outcome_t;

/* The decision of call c on the states in[] at now_ms, the slot set full
 * (conc_full) or not. For the sliding log in[i].count is the count after
 * the trim and nth() reads the entries the twin asks for. TB_OK, or
 * TB_ERR when a twin refused its arguments (rm_parse() lets no such
 * call through). */
int rm_decide(const rm_call_t *c, const rm_state_t *in,
                   int64_t now_ms, int conc_full, rm_nth_fn *nth,
                   void *nth_ctx, rm_outcome_t *o);

#endif /* RM_COMMAND_H */
