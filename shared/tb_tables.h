/* tb_tables.h -- the part of libtb's public header about the tables a
 * host keeps in memory of its own (shared memory, for the module and the
 * shim): their lock, the local buckets and leases, the in-flight table of
 * local protection, the heavy hitters. Included by tb.h, which hosts
 * include alone; shared/tables/ implements it. */
#ifndef TB_TABLES_H
#define TB_TABLES_H

#ifndef TB_H
#error "include tb.h, not tb_tables.h"
#endif

/* ==== Locks in shared memory ========================================= */

/* The lock of a table that threads and forked processes share (tb_local,
 * tb_lease and tb_topk inside their blocks; a host's own records): a
 * process-shared robust mutex (tb_shlock.c), opaque here so that this
 * header needs no <pthread.h>. Waiters sleep until the holder releases
 * it, however long the holder is descheduled or stopped; a holder that
 * dies holding it (killed, or exiting from a signal handler) hands it to
 * the next taker with TB_SHLOCK_RECOVERED, since what it guarded may be
 * half written: that taker repairs the data before its release. The
 * lock must be in memory every user maps at the same offset of the same
 * object (MAP_SHARED, inherited by fork), initialised once, by whoever
 * makes that memory, before anyone else uses it, and never again while
 * it lives: a process may hold it. */
typedef struct tb_shlock {
    uint64_t opaque[8];                 /* A pthread_mutex_t, 8-aligned. */
} tb_shlock_t;

#define TB_SHLOCK_RECOVERED 1   /* Held, from a holder that died.        */
#define TB_SHLOCK_BUSY 2        /* tb_shlock_try: another holder has it. */

/* Make l a free lock. TB_OK, or TB_ERR when the system has no robust
 * process-shared mutexes. */
int tb_shlock_init(tb_shlock_t *l);
/* Take l, waiting as long as its holder holds it. TB_OK, or
 * TB_SHLOCK_RECOVERED (held, see above); TB_ERR when l cannot be taken
 * (never initialised), and it is then not held. */
int tb_shlock_take(tb_shlock_t *l);
/* tb_shlock_take without the wait: TB_SHLOCK_BUSY when another holder
 * has l. */
int tb_shlock_try(tb_shlock_t *l);
/* Release l, held by the calling thread. */
void tb_shlock_release(tb_shlock_t *l);

/* ==== Tables in caller memory: local buckets and leases ============== */

/* A fixed-size table of local buckets for the `local` failure policy. It
 * never grows: when a key's probe window is full the least recently used
 * entry is evicted. The storage is one contiguous, pointer-free block that
 * the caller may supply (for example shared memory inherited by forked
 * children); a lock inside it (tb_shlock_t) serialises access across
 * threads and processes. */
typedef struct tb_local tb_local_t;

/* Bytes needed for a table of `entries` entries (rounded up to a power of
 * two, at least 64). */
size_t tb_local_size(size_t entries);
/* Initialise a table in caller memory of tb_local_size(entries) bytes,
 * its lock included: once, before anyone uses it (tb_shlock_t). */
tb_local_t *tb_local_init(void *mem, size_t entries);
/* Entries in use, for metrics. */
size_t tb_local_used(tb_local_t *t);

/* Tokens a server took from a shared bucket in one call (a lease) and
 * spends locally until they run out or expire. Same storage rules as the
 * local table (one pointer-free block, fixed size, LRU eviction within a
 * probe window, a lock that a dead holder cannot wedge) and the same
 * entry identity: 16 bytes of SHA-256 of the full Redis key. Times are
 * milliseconds of one clock shared by every user of the table (the
 * module uses tb_clock_now_us() / 1000: CLOCK_MONOTONIC is system-wide).
 *
 * Each entry also keeps what giving its tokens back needs (the bucket's
 * full key and limit, and the host's tag for where that bucket lives) and
 * the key's recent traffic through this table, which sizes the next
 * lease: about one ttl of it. Unspent tokens go back to the shared
 * bucket: those of an expired lease in the call that next refills the
 * key (tb_lease_plan, tb_request_t.lease_back), every lease's when the
 * host drains the table (tb_lease_drain, tb_client_give_back). An entry
 * evicted to make room for another key loses its tokens. */
typedef struct tb_local tb_lease_t;

size_t tb_lease_size(size_t entries);
tb_lease_t *tb_lease_init(void *mem, size_t entries);
/* Spend cost tokens of key's lease. 1 when a lease valid at now_ms held
 * them (*left: the tokens it keeps; cost counts as the key's traffic),
 * 0 when the caller must ask Redis. -1 on bad arguments. */
int tb_lease_spend(tb_lease_t *t, const char *key, double cost,
                   int64_t now_ms, double *left);

/* A lease's bucket: what the table keeps to size, store and give back
 * its tokens. Borrowed for the call. */
typedef struct tb_lease_info {
    const char *key;      /* The bucket's full Redis key, shorter than
                           * TB_KEY_BUF (tb_key_build_shard's form).  */
    tb_limit_t limit;     /* Its limit (a shard's, for a split key).   */
    int64_t ttl_ms;       /* How long a grant may be spent, and the
                           * span of traffic a lease is sized on:
                           * 1 .. 86400000.                            */
    int owner;            /* The host's tag for where the bucket lives
                           * (the module: its Redis configuration's
                           * slot), handed back by tb_lease_drain.     */
} tb_lease_info_t;

/* What tb_lease_plan decided for one refill. */
typedef struct tb_lease_plan {
    double want;          /* Tokens to ask for, the cost included
                           * (tb_request_t.lease): floor of the key's
                           * traffic over about one ttl, this request
                           * included, within cost .. max.             */
    double back;          /* Unspent tokens of the key's expired lease,
                           * taken out of the table: return them in the
                           * same call (tb_request_t.lease_back), or
                           * tb_lease_store them if it fails.          */
    uint64_t epoch;       /* The table's drain count when planned.     */
} tb_lease_plan_t;

/* A request tb_lease_spend could not pay: count cost as the key's
 * traffic (making its entry if there is none), size the lease and take
 * an expired lease's tokens out. TB_OK, or TB_ERR on bad arguments
 * (cost < 0, max < cost, max > TB_MAX_LEASE, a bad info). */
int tb_lease_plan(tb_lease_t *t, const tb_lease_info_t *info, double cost,
                  double max, int64_t now_ms, tb_lease_plan_t *plan);

/* Keep tokens as key's lease until now_ms + info->ttl_ms: a grant beyond
 * the cost, or plan->back that a failed call did not return. A lease
 * still valid keeps its tokens too (two children that refilled at once
 * lose nothing) and takes the later expiry. 1 when kept; 0 when the table
 * was drained since the plan (the host is stopping or restarting): the
 * caller gives the tokens back itself; -1 on bad arguments. */
int tb_lease_store(tb_lease_t *t, const tb_lease_info_t *info,
                   const tb_lease_plan_t *plan, double tokens,
                   int64_t now_ms);

/* Add tokens to key's lease if one is valid at now_ms (a settlement that
 * gives tokens back): 1 when added, 0 when there is none (the caller
 * returns them to Redis), -1 on bad arguments. */
int tb_lease_credit(tb_lease_t *t, const char *key, double tokens,
                    int64_t now_ms);

/* A lease's tokens taken out by tb_lease_drain: info is valid for the
 * call only. */
typedef void (*tb_lease_give_fn)(void *arg, const tb_lease_info_t *info,
                                 double tokens);

/* Empty the table for a host that stops or restarts: bump its drain
 * count (grants planned before are no longer stored: tb_lease_store
 * answers 0), remove every entry and hand each one that holds tokens,
 * expired or not, to give(arg, ...), which is called without the lock
 * held. Returns the number handed. Any process may drain while others
 * spend. */
size_t tb_lease_drain(tb_lease_t *t, tb_lease_give_fn give, void *arg);

/* The drain count: a host that saw it change stops taking leases. */
uint64_t tb_lease_epoch(tb_lease_t *t);

/* Entries in use, for metrics. */
size_t tb_lease_used(tb_lease_t *t);

/* At most N holders at once, across threads and processes: a table of
 * owner words in caller memory (shared memory inherited by forked
 * children), one word per place. Taking a place swaps a free word for the
 * taker's tag (its process id); the number in flight is the number of
 * words held, so a holder that dies leaves no count behind, only its
 * words, which tb_inflight_reap frees. Lock-free; every call is
 * async-signal-safe (atomic loads and compare-and-swaps only, and the
 * alive callback's own calls). */
typedef struct tb_inflight tb_inflight_t;

#define TB_INFLIGHT_MAX 1048576       /* Places in one table, at most.  */
#define TB_INFLIGHT_FULL (-1)         /* tb_inflight_take: no place.    */
#define TB_INFLIGHT_BAD (-2)          /* tb_inflight_take: bad call.    */

/* 1 when the process with this tag still runs (kill(pid, 0) succeeds or
 * fails with EPERM). */
typedef int (*tb_inflight_alive_fn)(uint32_t tag);

/* Bytes for a table of cap places (1 .. TB_INFLIGHT_MAX), 0 otherwise. */
size_t tb_inflight_size(uint32_t cap);
/* Initialise a table of cap places in mem (tb_inflight_size(cap) bytes,
 * 4-byte aligned): every place free. NULL on bad arguments. */
tb_inflight_t *tb_inflight_init(void *mem, uint32_t cap);
/* The table's places (0 for NULL). */
uint32_t tb_inflight_cap(const tb_inflight_t *t);
/* Take one of the first n places (n <= the table's cap, so a limit can
 * be lowered without a new table) for tag (non-zero). Returns its index,
 * TB_INFLIGHT_FULL when all n are held, or TB_INFLIGHT_BAD. When alive is
 * given and all are held, places of dead owners are freed first and the
 * search made once more. */
int tb_inflight_take(tb_inflight_t *t, uint32_t n, uint32_t tag,
                     tb_inflight_alive_fn alive);
/* Give back place i if tag still holds it: 1, else 0 (its owner was
 * reaped meanwhile, or a bad call). */
int tb_inflight_give(tb_inflight_t *t, int i, uint32_t tag);
/* Places held now, a snapshot: exact when nobody takes or gives. */
uint32_t tb_inflight_count(const tb_inflight_t *t);
/* Free every place tag holds (a process that exited); the number freed. */
uint32_t tb_inflight_reap(tb_inflight_t *t, uint32_t tag);
/* Free every place whose owner alive() says is gone; the number freed. */
uint32_t tb_inflight_reap_dead(tb_inflight_t *t, tb_inflight_alive_fn alive);
/* The alive() of tags that are process ids, for every host: kill(pid, 0)
 * succeeds or fails with EPERM. errno is left as it was. */
int tb_inflight_pid_alive(uint32_t tag);

/* ==== A cap that sets itself ========================================= */

/* The cap of an in-flight table set from latency (tb_adapt.c): a
 * gradient limiter in caller memory, shared like the tables above. Each
 * finished request gives one sample (when it began and ended); every
 * quarter second or so the median latency is compared with the lowest seen
 * without a queue (the floor), and the cap grows while latency stays
 * near the floor and shrinks when it rises, by at most half or double a
 * window, smoothed, within [min, max]. When the cap binds and the floor
 * is older than 30 s (or was never seen), one window runs at min to
 * measure it again (a probe). Lock-free and async-signal-safe; times are
 * a monotonic clock's microseconds, the caller's. */
typedef struct tb_adapt tb_adapt_t;

/* What a status page shows of one. */
typedef struct tb_adapt_view {
    uint32_t cap, min, max;
    uint32_t last_peak;           /* Most in flight in the last window.  */
    double limit;                 /* The estimate behind cap.            */
    uint64_t floor_us;            /* Lowest latency without a queue.     */
    uint64_t last_us;             /* Median latency of the last window.  */
    int probing;                  /* 1 while a probe runs at min.        */
    uint64_t windows, ups, downs; /* Windows closed; cap raises, cuts.   */
    uint64_t probes;
} tb_adapt_view_t;

/* Bytes of one (8-byte aligned memory). */
size_t tb_adapt_size(void);
/* Make one in mem, its cap at max (nothing learnt yet refuses nothing
 * the server could carry); NULL unless 1 <= min <= max <= TB_INFLIGHT_MAX. */
tb_adapt_t *tb_adapt_init(void *mem, uint32_t min, uint32_t max);
/* New bounds for a live one (a reloaded configuration): what it learnt
 * is kept, clamped. TB_OK or TB_ERR. */
int tb_adapt_bounds(tb_adapt_t *a, uint32_t min, uint32_t max);
/* The cap now: the n to give tb_inflight_take (0 for NULL). */
uint32_t tb_adapt_cap(const tb_adapt_t *a);
/* A place was taken; in_flight is the table's count after it. */
void tb_adapt_taken(tb_adapt_t *a, uint32_t in_flight);
/* A request that took a place at started_us gave it back at now_us. */
void tb_adapt_sample(tb_adapt_t *a, uint64_t started_us, uint64_t now_us);
/* Fill v: TB_OK, or TB_ERR for memory that holds none. */
int tb_adapt_view(const tb_adapt_t *a, tb_adapt_view_t *v);

/* ==== Heavy hitters ================================================== */

/* Who is being limited: the keys with the most refusals and the most
 * decisions over the last minute and the last fifteen, in a fixed block
 * of caller memory (tb_topk.c). Same storage rules as the tables above:
 * one pointer-free block that the caller may place in memory shared by
 * forked processes, a lock per minute (tb_shlock_t) that a dead holder
 * cannot wedge, no allocation.
 *
 * Each minute has a slot, a ring of TB_TOPK_SLOTS; a slot holds two
 * Space-Saving sketches (Metwally, Agrawal and El Abbadi, 2005) of m =
 * max(8k, 64) counters, one counting every decision and one counting
 * refusals only. A key already counted adds one to its counter; a new
 * key takes a free counter, or else the counter with the smallest count
 * c_min, inheriting c_min + 1 (so c_min is its largest possible
 * over-count). Hence in one slot a count is never below the key's true
 * count and at most c_min above it, and c_min <= N / m for N events in
 * the slot: below m distinct keys in a minute every count is exact.
 * Reading merges the slots of a window: a key's estimate adds, for each
 * slot whose counters were all in use and that no longer holds the key,
 * that slot's c_min (what the key may have had there), so the estimate
 * is never below the true count and at most the sum of the slots'
 * c_min above it, which the read reports (N / m over the window at
 * most).
 *
 * Writers touch the current minute's slot only; the first writer of a
 * new minute empties the slot it reuses (the one of TB_TOPK_SLOTS
 * minutes before). Times are wall-clock milliseconds (Unix time), so
 * every process sees the same minutes. A clock that goes back keeps
 * counting in the newest minute seen. */

#define TB_TOPK_MAX_K 1000                /* k at most.                  */
#define TB_TOPK_SLOTS 16                  /* Minutes kept.               */
/* The key as shown (tb_key_show): its sanitised form (tb_key_sanitize),
 * after "ip:" for a client keyed by its address, or "key:" for another
 * that starts like one; NUL included. */
#define TB_TOPK_KEY_LEN (TB_KEY_RAW_MAX + 5)

typedef struct tb_topk tb_topk_t;

/* Bytes for a block of k (1 .. TB_TOPK_MAX_K), 0 otherwise. */
size_t tb_topk_size(int k);
/* Initialise a block of tb_topk_size(k) bytes at mem (8-byte aligned):
 * every slot empty, its locks free; once, before anyone uses it
 * (tb_shlock_t). NULL on bad arguments. */
tb_topk_t *tb_topk_init(void *mem, int k);
/* The block's k and m (counters per sketch), 0 for NULL. */
int tb_topk_k(const tb_topk_t *t);
int tb_topk_counters(const tb_topk_t *t);

/* What one decision is counted under: the key, the virtual host and the
 * limit; the three together name a counter. Zero it, then fill it. */
typedef struct tb_topk_item {
    const char *key;        /* The client key as the host got it
                             * (key_len bytes, untrusted, may hold NUL):
                             * shown as tb_key_build stores it.        */
    size_t key_len;
    int ip;                 /* 1: a client keyed by its address (shown
                             * as "ip:" + key).                        */
    uint32_t vhost;         /* The host's number for a virtual host.    */
    const char *limit;      /* The binding bucket: a name of at most
                             * TB_NAME_MAX bytes (a route's), or NULL
                             * for the main bucket ("default").        */
    size_t limit_len;       /* strlen(limit) when the host knows it;
                             * 0: measured here.                       */
} tb_topk_item_t;

/* Count one decision of item at now_ms, refused (1) or allowed (0).
 * Thread- and process-safe; bounded time (a hash of the key, one lock,
 * a short probe); nothing when t is NULL. */
void tb_topk_note(tb_topk_t *t, const tb_topk_item_t *item, int refused,
                  int64_t now_ms);

/* One key of a window, as read. decisions and refusals are estimates:
 * never below the true counts, at most their _err above them. allowed
 * and refused are what the key's counters saw while they held the key:
 * never above the true counts. */
typedef struct tb_topk_entry {
    char key[TB_TOPK_KEY_LEN];
    char limit[TB_NAME_MAX + 1];  /* "default" or a route name.          */
    uint32_t vhost;
    uint64_t decisions, decisions_err;
    uint64_t refusals, refusals_err;
    uint64_t allowed, refused;
    int64_t last_refusal_ms;      /* Wall clock; 0: none seen.           */
} tb_topk_entry_t;

/* What to read: a window and the two rankings wanted. */
typedef struct tb_topk_query {
    int minutes;                  /* The window: the minute of now_ms
                                   * and this many before it (1: at
                                   * least the last 60 s; 15).  1 ..
                                   * TB_TOPK_SLOTS - 1.                 */
    int64_t now_ms;
    int n;                        /* Entries wanted per ranking, 0 .. k. */
    tb_topk_entry_t *by_refusals; /* n entries, or NULL.                 */
    tb_topk_entry_t *by_decisions;/* n entries, or NULL.                 */
    void *scratch;                /* tb_topk_scratch_size(t, minutes)
                                   * bytes, 8-byte aligned, the
                                   * caller's.                           */
} tb_topk_query_t;

/* What a read found: the rankings' lengths and the window's totals. */
typedef struct tb_topk_result {
    int n_refusals, n_decisions;  /* Entries written.                    */
    uint64_t decisions;           /* Decisions counted in the window.    */
    uint64_t refusals;            /* Refusals counted in the window.     */
    uint64_t decisions_bound;     /* The largest over-count of any key's */
    uint64_t refusals_bound;      /* estimate (the slots' c_min summed). */
} tb_topk_result_t;

/* Scratch bytes a read of t over a window of `minutes` needs: about
 * the memory of the window's slots (0 on bad arguments). */
size_t tb_topk_scratch_size(const tb_topk_t *t, int minutes);

/* Read q's window: the keys with the most refusals (those refused at
 * least once while counted) and with the most decisions, largest first
 * (ties by key). Locks each slot of the window in turn, only to copy
 * it. TB_OK, or TB_ERR on bad arguments. */
int tb_topk_read(tb_topk_t *t, const tb_topk_query_t *q,
                 tb_topk_result_t *res);

#endif /* TB_TABLES_H */
