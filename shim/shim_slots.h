/* shim_slots.h -- the concurrency slots held by accepted connections.
 *
 * An inbound rule with `concurrency = N` takes a slot for each connection
 * it lets through; the slot is given back when the program closes that
 * connection's fd. shim_slots.c keeps, for this process, which fds hold
 * a slot: a bitmap of fd numbers, which the close() wrapper reads with
 * one bit test, and a fixed table of the slots themselves. Nothing here
 * allocates or talks to Redis: shim_core.c releases what
 * shim_slots_take() hands back. Only the shim's own files include this
 * (through shim_int.h); no symbol here is exported.
 */
#ifndef SHIM_SLOTS_H
#define SHIM_SLOTS_H

#include <arpa/inet.h>

#include "tb_shim.h"

#define SHIM_SLOT_FDS (1 << 20) /* fd numbers tracked: 0 .. 2^20 - 1.     */
#define SHIM_MAX_HELD 4096      /* Slots one process holds at once.       */

/* A slot and what its release needs: the rule (its prefix and ttl) and
 * the client key (the peer's address as text, or the rule's own key). */
typedef struct shim_held {
    int fd;                         /* -1: a free entry.                 */
    const shim_rule_t *rule;
    char peer[INET6_ADDRSTRLEN];    /* The key when the rule's is $peer. */
    tb_slot_t slot;
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

/* Remember that fd holds slot, taken under rule r for key (klen bytes;
 * kept only for a $peer rule, whose key is the peer's address; other
 * rules' keys are their own). 0, or -1 when it cannot be
 * tracked (fd out of range, table full): the caller releases it at once.
 * Thread-safe. */
int shim_slots_hold(int fd, const shim_rule_t *r, const char *key,
                    size_t klen, const tb_slot_t *slot);

/* The slot fd holds, moved into *out and forgotten: 1, or 0 when fd holds
 * none. Thread-safe. */
int shim_slots_take(int fd, shim_held_t *out);

/* In a forked child: forget every slot. The fds are copies; the slots
 * are the parent's, which releases them when it closes its own. No lock
 * is taken (the child has one thread), nothing is allocated. */
void shim_slots_after_fork(void);

/* The key of a held slot for tb_request_t: the peer's address or the
 * rule's key; *len its length. */
const char *shim_held_key(const shim_held_t *h, size_t *len);

#endif /* SHIM_SLOTS_H */
