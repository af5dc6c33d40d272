/* shim_slots.c -- which accepted connections hold a concurrency slot or
 * a local place.
 *
 * The close() wrapper runs for every fd the program closes, files and
 * pipes included, so the common answer -- "this fd holds nothing" -- is
 * one bit of a static bitmap indexed by fd number (128 KiB for 2^20 fds,
 * in zero pages until something is held). What fds hold -- a Redis slot,
 * a local place (shim_local.c) or both -- lives in a fixed table of
 * SHIM_MAX_HELD entries, open addressing on the fd number with linear
 * probing and backward-shift deletion, under one mutex taken only when
 * an entry is held or given back. Nothing is allocated.
 *
 * A slot or place belongs to the process that accepted the connection. A
 * forked child starts with none: its fds are copies, and the parent gives
 * them back when it closes its own copy. So a server that accepts in one
 * process and hands the connection to a child it forks (inetd style)
 * gives them back as soon as the parent closes its copy; servers that
 * handle a connection where they accepted it -- threads, event loops,
 * pre-forked children that accept themselves -- hold them for the
 * connection's life.
 */
#include <pthread.h>
#include <string.h>

#include "shim_slots.h"

#define MASK (SHIM_MAX_HELD - 1)

unsigned char shim_slot_bits[SHIM_SLOT_FDS / 8];

static shim_held_t held[SHIM_MAX_HELD];
static int nheld;
static int table_ready;
static pthread_mutex_t slots_lock = PTHREAD_MUTEX_INITIALIZER;

/* Entries are free when fd is -1; the table starts zeroed (fd 0), so it
 * is marked free on first use. Called with the lock held. */
static void ready(void)
{
    int i;

    if (!table_ready) {
        for (i = 0; i < SHIM_MAX_HELD; i++) {
            held[i].fd = -1;
        }
        table_ready = 1;
    }
}

static size_t home(int fd)
{
    return (size_t)fd & MASK;
}

static void set_bit(int fd, int on)
{
    unsigned char m = (unsigned char)(1u << (fd & 7));

    if (on) {
        __atomic_fetch_or(&shim_slot_bits[fd >> 3], m, __ATOMIC_RELAXED);
    }
    else {
        __atomic_fetch_and(&shim_slot_bits[fd >> 3], (unsigned char)~m,
                           __ATOMIC_RELAXED);
    }
}

int shim_slots_hold(const shim_held_t *h)
{
    size_t i;
    int fd = h->fd, rc = -1;

    if (fd < 0 || fd >= SHIM_SLOT_FDS) {
        return -1;
    }
    pthread_mutex_lock(&slots_lock);
    ready();
    if (nheld < SHIM_MAX_HELD) {
        /* An fd number is held at most once: the program closed the
         * earlier one through a path we do not see (dup2 over it), so
         * its entry is overwritten. The Redis slot expires by its ttl;
         * the local place has no ttl and would stay taken until this
         * process had exited and a taker found the table full, so it is
         * given back now (a lock-free swap). */
        for (i = home(fd); held[i].fd != -1 && held[i].fd != fd;
             i = (i + 1) & MASK) {
        }
        if (held[i].fd == -1) {
            nheld++;
        }
        else if (held[i].place.table != NULL) {
            (void)tb_inflight_give(held[i].place.table, held[i].place.i,
                                   held[i].place.tag);
        }
        held[i] = *h;
        set_bit(fd, 1);
        rc = 0;
    }
    pthread_mutex_unlock(&slots_lock);
    return rc;
}

/* Free entry i and shift later entries of the same run back into it, so
 * that a probe never stops early at a hole. Called with the lock held. */
static void delete_at(size_t i)
{
    size_t j = i, k;

    for (;;) {
        held[i].fd = -1;
        for (;;) {
            j = (j + 1) & MASK;
            if (held[j].fd == -1) {
                return;
            }
            k = home(held[j].fd);
            /* Entry j stays where it is when its home lies cyclically
             * in (i, j]. */
            if (i <= j ? (i < k && k <= j) : (i < k || k <= j)) {
                continue;
            }
            break;
        }
        held[i] = held[j];
        i = j;
    }
}

int shim_slots_take(int fd, shim_held_t *out)
{
    size_t i;
    int found = 0;

    if (fd < 0 || fd >= SHIM_SLOT_FDS) {
        return 0;
    }
    pthread_mutex_lock(&slots_lock);
    ready();
    for (i = home(fd); held[i].fd != -1; i = (i + 1) & MASK) {
        if (held[i].fd == fd) {
            *out = held[i];
            delete_at(i);
            nheld--;
            found = 1;
            break;
        }
    }
    set_bit(fd, 0);
    pthread_mutex_unlock(&slots_lock);
    return found;
}

void shim_slots_after_fork(void)
{
    int i;

    pthread_mutex_init(&slots_lock, NULL);
    if (!table_ready || nheld == 0) {
        return;
    }
    for (i = 0; i < SHIM_MAX_HELD; i++) {
        if (held[i].fd >= 0) {
            set_bit(held[i].fd, 0);
            held[i].fd = -1;
        }
    }
    nheld = 0;
}

const char *shim_held_key(const shim_held_t *h, size_t *len)
{
    if (h->rule->key_kind == SHIM_KEY_PEER) {
        *len = strlen(h->peer);
        return h->peer;
    }
    *len = h->rule->key_len;
    return h->rule->key;
}
