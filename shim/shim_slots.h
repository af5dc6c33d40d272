/* shim_slots.h -- the concurrency slots and local places held by
 * accepted connections.
 *
 * An inbound rule with `concurrency = N` takes a Redis slot, and one with
 * `local_concurrency = N` a place in a table shared by this host's
 * processes (shim_local.c), for each connection it lets through; both are
 * given back when the program closes that connection's fd. shim_slots.c
 * keeps, for this process, which fds hold something: a bitmap of fd
 * numbers, which the close() wrapper reads with one bit test, and a fixed
 * table of what they hold. Nothing here allocates or talks to Redis:
 * shim_core.c releases the slot and shim_local.c gives back the place
 * that shim_slots_take() hands back. Only the shim's own files include
 * this (through shim_int.h); no symbol here is exported.
 */
#ifndef SHIM_SLOTS_H
#define SHIM_SLOTS_H

#include <arpa/inet.h>

#include "tb_shim.h"

#define SHIM_SLOT_FDS (1 << 20) /* fd numbers tracked: 0 .. 2^20 - 1.     */
#define SHIM_MAX_HELD 4096      /* Slots one process holds at once.       */

/* A place in a rule's local table: what tb_inflight_give() needs. */
typedef struct shim_place {
    tb_inflight_t *table;           /* NULL: no place held.              */
    int i;                          /* The place's index in table.       */
    uint32_t tag;                   /* The taker's process id.           */
} shim_place_t;

/* What one accepted connection holds, and what giving it back needs: the
 * rule (its prefix and ttl), the client key (the peer's address as text,
 * or the rule's own key), the Redis slot and the local place. */
typedef struct shim_held {
    int fd;                         /* -1: a free entry.                 */
    const shim_rule_t *rule;
    char peer[INET6_ADDRSTRLEN];    /* The key when the rule's is $peer. */
    tb_slot_t slot;                 /* Kind TB_SLOT_NONE: no Redis slot. */
    shim_place_t place;
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

/* Remember what h->fd holds (h filled by the caller: the rule, the peer
 * for a $peer rule, the slot and the place). 0, or -1 when it cannot be
 * tracked (fd out of range, table full): the caller gives both back at
 * once. An entry left for the same fd number (the program closed that fd
 * by a path we do not see, dup2() over it) is replaced: its local place
 * is given back here, its Redis slot expires by its ttl. Thread-safe. */
int shim_slots_hold(const shim_held_t *h);

/* What fd holds, moved into *out and forgotten: 1, or 0 when fd holds
 * nothing. Thread-safe. */
int shim_slots_take(int fd, shim_held_t *out);

/* In a forked child: forget every slot and place. The fds are copies;
 * the slots and places are the parent's, which gives them back when it
 * closes its own. No lock is taken (the child has one thread), nothing is
 * allocated. */
void shim_slots_after_fork(void);

/* The key of a held slot for tb_request_t: the peer's address or the
 * rule's key; *len its length. */
const char *shim_held_key(const shim_held_t *h, size_t *len);

#endif /* SHIM_SLOTS_H */
