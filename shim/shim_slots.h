/* shim_slots.h -- the concurrency slots and local places held by
 * accepted connections.
 *
 * An inbound rule with `concurrency = N` takes a Redis slot, and one with
 * `local_concurrency = N` a place in a table shared by this host's
 * processes (shim_local.c), for each connection it lets through; both are
 * given back when the program closes that connection's fd, or earlier
 * when the connection's peer has gone and a new connection of the same
 * key finds the limit full (shim_slots_reclaim()). shim_slots.c keeps,
 * for this process, which fds hold something: a bitmap of fd numbers,
 * which the close() wrapper reads with one bit test, and a table of what
 * they hold, sized once at initialisation from the descriptor limit.
 * Nothing here allocates after that or talks to Redis: shim_core.c
 * releases the slot and shim_local.c gives back the place that
 * shim_slots_take() hands back. Only the shim's own files include this
 * (through shim_int.h); no symbol here is exported.
 */
#ifndef SHIM_SLOTS_H
#define SHIM_SLOTS_H

#include <arpa/inet.h>

#include "tb_shim.h"

#define SHIM_SLOT_FDS (1 << 20) /* fd numbers tracked: 0 .. 2^20 - 1, and
                                 * the largest table of held connections. */
#define SHIM_HELD_MIN 64        /* The smallest table of held connections.*/

/* A place in a rule's local table: what tb_inflight_give() needs. */
typedef struct shim_place {
    tb_inflight_t *table;           /* NULL: no place held.              */
    int i;                          /* The place's index in table.       */
    uint32_t tag;                   /* The taker's process id.           */
    tb_adapt_t *adapt;              /* auto: the cap to tell how long the
                                     * connection lasted, else NULL.     */
    uint64_t started_us;            /* auto: when it was accepted.       */
} shim_place_t;

/* What one accepted connection holds, and what giving it back needs: the
 * rule (its prefix and ttl), the client key (the peer's address as text,
 * or the rule's own key), the Redis slot and the local place. */
typedef struct shim_held {
    int fd;
    const shim_rule_t *rule;        /* NULL: a free entry.               */
    char peer[INET6_ADDRSTRLEN];    /* The key when the rule's is $peer. */
    tb_slot_t slot;                 /* Kind TB_SLOT_NONE: no Redis slot. */
    shim_place_t place;
    int gone;                       /* 1: its peer had gone and the slot
                                     * and place were given back early
                                     * (shim_slots_reclaim()); the
                                     * program has not closed it yet.   */
    int releasing;                  /* 1: the program closes it, and its
                                     * close() is giving back the slot
                                     * and place (shim_slots_take() to
                                     * shim_slots_done()).              */
} shim_held_t;

/* The fd numbers that hold a slot, one bit each (shim_slots.c). */
extern unsigned char shim_slot_bits[SHIM_SLOT_FDS / 8];

/* 1 when fd may hold a slot: the close() wrapper's whole cost for every
 * other fd. A plain read; shim_slots_take() decides under the lock. */
static inline int shim_slots_marked(int fd)
{
    return fd >= 0 && fd < SHIM_SLOT_FDS
           && ((__atomic_load_n(&shim_slot_bits[fd >> 3], __ATOMIC_RELAXED)
                >> (fd & 7)) & 1);
}

/* Make the table of held connections, once, at initialisation, when some
 * inbound rule has concurrency or local_concurrency: one entry per
 * descriptor the process may have open (RLIMIT_NOFILE's soft limit now,
 * rounded up to a power of two, SHIM_HELD_MIN .. SHIM_SLOT_FDS). TB_OK,
 * or TB_ERR with the reason in err: a table of SHIM_HELD_MIN entries is
 * used then. */
int shim_slots_start(char *err, size_t errlen);

/* The number of entries of the table (0 before shim_slots_start()). */
size_t shim_slots_size(void);

/* Remember what h->fd holds (h filled by the caller: the rule, the peer
 * for a $peer rule, the slot and the place). 0, or -1 when it cannot be
 * tracked (fd out of range, the table full): the caller gives both back
 * at once and refuses the connection. An entry left for the same fd
 * number (the program closed that fd by a path we do not see, dup2()
 * over it) is replaced: its local place is given back here, its Redis
 * slot expires by its ttl. Thread-safe. */
int shim_slots_hold(const shim_held_t *h);

/* The program closes fd: what it holds, copied into *out, and its entry
 * marked as being given back: 1, or 0 when fd holds nothing (or another
 * thread is closing it already). The caller gives back what *out holds
 * and then calls shim_slots_done(fd), before it closes fd; until then
 * shim_slots_reclaim() waits for that entry. Thread-safe. */
int shim_slots_take(int fd, shim_held_t *out);

/* What fd held has been given back: its entry is forgotten, and threads
 * waiting in shim_slots_reclaim() are woken. Thread-safe. */
void shim_slots_done(int fd);

/* A counter of the releases (shim_slots_done()) of rule r's connections
 * (with same_key, of the key of klen bytes; a few rules and keys share
 * one): read it before a decision, and shim_slots_reclaim() knows
 * whether one was given back meanwhile. Lock-free. */
uint32_t shim_slots_epoch(const shim_rule_t *r, const char *key,
                          size_t klen, int same_key);

/* A new connection of rule r (and, with same_key, of the key of klen
 * bytes) finds the limit full: look for a connection of that rule (and
 * key) this process holds that is gone. 1 when one is found, and the
 * decision is worth asking again:
 *  - another thread's close() gave one back after the caller read
 *    `epoch` (shim_slots_epoch(), before the decision); *out holds
 *    nothing;
 *  - another thread's close() of one was giving it back: waited for, at
 *    most SHIM_RELEASE_WAIT_MS; *out holds nothing;
 *  - the peer of one has gone (FIN or reset seen, POLLRDHUP) though the
 *    program has not closed it yet: what it holds is moved into *out for
 *    the caller to give back, and the entry stays, marked gone, so that
 *    its close() gives back nothing.
 * 0 when there is none, or when N + SHIM_GONE_EXTRA (8) of that rule and
 * key are marked gone already and not yet closed, N its limit
 * (concurrency with same_key, else local_concurrency): a client that
 * half-closes (shutdown) its connections can hold 2N + 8 at once, not get
 * around the limit. One poll() of at most SHIM_RECLAIM_POLL fds, no
 * wait. Thread-safe. */
int shim_slots_reclaim(const shim_rule_t *r, const char *key, size_t klen,
                       int same_key, uint32_t epoch, shim_held_t *out);

/* In a forked child: forget every slot and place. The fds are copies;
 * the slots and places are the parent's, which gives them back when it
 * closes its own. No lock is taken (the child has one thread), nothing is
 * allocated. */
void shim_slots_after_fork(void);

/* The key of a held slot for tb_request_t: the peer's address or the
 * rule's key; *len its length. */
const char *shim_held_key(const shim_held_t *h, size_t *len);

#endif /* SHIM_SLOTS_H */
