/* tbucket_shm_int.h -- the layout of mod_tbucket's shared memory
 * segment, for the files that read it: tbucket_shm.c (the segment,
 * its counters and tables), tbucket_shm_records.c (the records that
 * configurations name: local scopes and rules) and tbucket_ring.c (the
 * last 15 minutes, from the totals of all of them). Nothing else includes
 * it; other files reach the segment through mod_tbucket.h's functions.
 */
#ifndef TBUCKET_SHM_INT_H
#define TBUCKET_SHM_INT_H

#include "mod_tbucket.h"
#include "tbucket_ring.h"

#define SHM_USERDATA_KEY "mod_tbucket_shm"
#define SHM_MAGIC 0x74627537u         /* "tbu7": auto local scopes.     */
#define MAX_VHOSTS 256                /* Slots; the last one is "other". */
#define MAX_CLIENTS 64                /* Stats slots, one per Redis URL
                                       * and policy.                    */
#define LOCAL_ENTRIES 16384           /* Buckets in the local table.    */
#define LEASE_ENTRIES 4096            /* Leases held at once.           */
#define FAILURE_READ_TRIES 1000       /* Reads of a record being written
                                       * before giving up.              */
#define MAX_LOCAL_SCOPES 256          /* Scope records, all generations.*/
#define INFLIGHT_POOL (1u << 21)      /* Bytes for the scopes' in-flight
                                       * tables: about 500,000 places.  */
#define REFUSING_PLACES 4096          /* Refused requests answered at
                                       * once that the busy count can
                                       * tell apart.                    */
#define MAX_COUNT_RECS 256            /* Count records, all generations. */

/* A count record: found by name at every configuration load, so a scope
 * or a limit that a restart keeps keeps its counts. The same records
 * count the scopes that set an unnamed TBucketLimit (by outcome) and each
 * named limit (by tbucket_limit_event), in two arrays. */
typedef struct tbucket_count_rec {
    char name[TBUCKET_NAME_LEN];
    uint64_t generation;              /* Last load that had the rule.   */
    uint64_t outcome[TBUCKET_OUTCOMES];
} tbucket_count_rec;

/* A local scope's record. Found by name at every configuration load, so
 * a scope that a restart keeps keeps its table and the places its
 * requests of the old generation still hold. */
typedef struct tbucket_scope_rec {
    char name[TBUCKET_NAME_LEN];
    uint32_t limit;                   /* N of the newest configuration. */
    uint32_t adaptive;                /* 1: auto, the cap is adapt's.   */
    uint64_t off;                     /* Its table, in bytes from the
                                       * segment's start; 0 unused.    */
    uint64_t adapt_off;               /* Its tb_adapt_t, once auto.     */
    uint64_t generation;              /* Last load that had the scope.  */
    uint64_t taken;                   /* Places taken.                  */
    uint64_t refused;                 /* Requests refused, table full.  */
} tbucket_scope_rec;

/* The segment. Slots are only added, by the parent, while no child of
 * the new generation exists yet; children only do atomic adds. */
typedef struct tbucket_shm {
    uint32_t magic;
    uint32_t nvhosts;                 /* Slots in use.                  */
    uint32_t nclients;
    uint32_t pad;
    uint64_t generation;              /* Config loads since start.      */
    uint64_t lease_returned;          /* Lease tokens given back.       */
    uint64_t cpu_set[TBUCKET_PRIOS];  /* TBucketCPUPriority: threads
                                       * moved to a priority's step.    */
    uint64_t cpu_failed;              /* Moves the kernel refused.      */
    tbucket_vhost_stats vhosts[MAX_VHOSTS];
    tbucket_client_stats clients[MAX_CLIENTS];
    size_t local_entries;
    size_t local_off;                 /* Bytes from the segment start.  */
    size_t lease_entries;             /* The lease table.               */
    size_t lease_off;                 /* Bytes from the segment start.  */
    /* Local protection. The busy count is written by whichever child
     * finds it older than it may be (tbucket_local.c), so a stamp and a
     * value in two words: a reader may pair a new stamp with the old
     * value, a millisecond's difference. */
    uint64_t busy_stamp;              /* apr_time_t of the last count.  */
    uint64_t busy;                    /* Workers busy with a request.   */
    uint32_t nscopes;                 /* Scope records in use.          */
    uint32_t pad2;
    uint64_t refusing_off;            /* The table of requests refused
                                       * and still being answered.      */
    uint64_t pool_off;                /* The tables' pool.              */
    uint64_t pool_used;               /* Bytes of it given out; never
                                       * given back while the segment
                                       * lives (old generations may
                                       * still hold places).            */
    tbucket_scope_rec scopes[MAX_LOCAL_SCOPES];
    uint64_t top_off;                 /* The heavy hitters, 0: none.    */
    uint64_t top_bytes;
    uint32_t ncounted;                /* Scope records in use.          */
    uint32_t nnamed;                  /* Named limits' records in use.  */
    tbucket_count_rec counted[MAX_COUNT_RECS];
    tbucket_count_rec named[MAX_COUNT_RECS];
    tbucket_ring ring;                /* The last 15 minutes
                                       * (tbucket_ring.c).              */
} tbucket_shm;

/* This parent's segment, or NULL before the first post_config. Set in
 * the parent before any child of the generation exists, so children
 * inherit it and only read it. */
extern tbucket_shm *tbucket_shm_seg;

/* size bytes (8-aligned) from the segment's pool of tables, or a table
 * of cap in-flight places made there: the offset, or 0 when the pool is
 * spent. Parent only; never given back while the segment lives. */
uint64_t tbucket_shm_pool_take(tbucket_shm *seg, size_t size);
uint64_t tbucket_shm_pool_table(tbucket_shm *seg, uint32_t cap);

#endif /* TBUCKET_SHM_INT_H */
