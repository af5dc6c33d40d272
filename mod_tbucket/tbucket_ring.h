/* tbucket_ring.h -- the last 15 minutes of the whole server, slot by
 * slot: the ring in the shared memory segment and the series read from
 * it. The ring's layout is here because the segment (tbucket_shm_int.h)
 * holds one; tbucket_ring.c alone writes it.
 */
#ifndef TBUCKET_RING_H
#define TBUCKET_RING_H

#include "apr_time.h"

#include "tb.h"

#define TBUCKET_RING_SLOTS 90         /* 15 minutes ...                 */
#define TBUCKET_RING_SLOT_S 10        /* ... of 10-second slots.        */

/* What each slot counts, in the order of tbucket_ring_names. */
typedef enum {
    TBUCKET_RS_DECISIONS = 0,         /* Every decision, all outcomes.  */
    TBUCKET_RS_LIMIT,                 /* Refused by a TBucketLimit.     */
    TBUCKET_RS_NAMED,                 /* Refused by a named limit.      */
    TBUCKET_RS_BAN,                   /* Refused while a ban held.      */
    TBUCKET_RS_SHED,                  /* Shed by priority.              */
    TBUCKET_RS_LOCAL,                 /* Refused by a local cap.        */
    TBUCKET_RS_FALLBACK,              /* Decided by the policy.         */
    TBUCKET_RS_ERRORS,                /* Failed Redis calls.            */
    TBUCKET_RS_OPENS,                 /* Breakers that opened.          */
    TBUCKET_RS_SKIPS,                 /* Decisions an open breaker made
                                       * without asking Redis.          */
    TBUCKET_RS_BANS_SET,              /* Bans named limits set.         */
    TBUCKET_RS_CALLS,                 /* Redis calls timed (latency).   */
    TBUCKET_RS_COUNTS
} tbucket_ring_count;

extern const char *const tbucket_ring_names[TBUCKET_RS_COUNTS];

/* The server's totals since the segment was made, as one slot's start
 * keeps them: a slot's figures are the next snapshot's minus its own. */
typedef struct tbucket_ring_totals {
    uint64_t v[TBUCKET_RS_COUNTS];
    uint64_t lat[TB_LAT_BUCKETS];
} tbucket_ring_totals;

/* In the segment: made zero with it, kept across graceful restarts. */
typedef struct tbucket_ring {
    uint64_t newest;                  /* Slot number (seconds / 10) of
                                       * the newest snapshot.           */
    uint64_t stamp[TBUCKET_RING_SLOTS]; /* The slot number each entry
                                       * holds; 0 while being written.  */
    tbucket_ring_totals snap[TBUCKET_RING_SLOTS];
} tbucket_ring;

/* The series of the last TBUCKET_RING_SLOTS slots, oldest first; the
 * last slot is the current one, still filling. */
typedef struct tbucket_ring_series {
    apr_time_t start;                 /* Start of the oldest slot.      */
    uint64_t v[TBUCKET_RS_COUNTS][TBUCKET_RING_SLOTS];
    int64_t p99_us[TBUCKET_RING_SLOTS]; /* Upper bound of the bucket the
                                       * 99th percentile call fell in;
                                       * -1: no call; 0: above the last
                                       * bound.                         */
    unsigned char breaker[TBUCKET_RING_SLOTS]; /* 1: a breaker was open
                                       * at some moment of the slot.    */
    unsigned char known[TBUCKET_RING_SLOTS]; /* 1: the slot's figures
                                       * were taken (else none came).   */
} tbucket_ring_series;

/* Once per decision, after it is counted: starts a slot's snapshot when
 * the decision is the first of a slot. A load and a compare otherwise.
 * Thread- and process-safe. */
void tbucket_ring_tick(void);

/* The series at now, into *out: 1, or 0 before the segment exists.
 * Starts the current slot's snapshot if no decision has yet. */
int tbucket_ring_read(apr_time_t now, tbucket_ring_series *out);

#endif /* TBUCKET_RING_H */
