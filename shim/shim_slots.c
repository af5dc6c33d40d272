/* shim_slots.c -- which accepted connections hold a concurrency slot or
 * a local place.
 *
 * close() runs for every fd, so "this fd holds nothing" is one bit of a
 * static bitmap; what an fd holds lives in a table with open addressing on
 * the fd number, under one mutex taken only when an entry is held, given
 * back or reclaimed, with a 32-bit tag per entry so a key's entries are
 * found by reading 4 bytes each. The table is sized at start from
 * RLIMIT_NOFILE's soft limit (a connection is an fd), a private mapping
 * touched only as used; a connection with no room is refused, never let
 * through uncounted. A slot belongs to the accepting process: a forked
 * child holds none. */
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <time.h>

#include "shim_slots.h"

#define SHIM_RECLAIM_POLL 64   /* Connections of one key looked at by one
                                * shim_slots_reclaim().                 */
#define SHIM_RELEASE_WAIT_MS 50 /* Longest wait of shim_slots_reclaim()
                                 * for a release under way in another
                                 * thread, ms: the default timeout_ms.  */
#define SHIM_GONE_EXTRA 8      /* Connections of one key counted as gone
                                * and not yet closed, beyond its limit N
                                * (see shim_slots_reclaim()).          */
#define TAG_USED 0x80000000u   /* Set in every tag of a used entry.     */
#define TAG_RULE 0xffff0000u   /* The used bit and the rule's bits.     */
#define EPOCHS 256             /* Release counters, by tag.             */

unsigned char shim_slot_bits[SHIM_SLOT_FDS / 8];

/* The table: `size` entries (a power of two) and their tags, set once by
 * shim_slots_start(); `top` is one past the highest index ever used, so
 * a search by tag reads no further. */
static shim_held_t *held;
static uint32_t *tags;
static size_t size, mask, top, nheld;
static pthread_mutex_t slots_lock = PTHREAD_MUTEX_INITIALIZER;
/* Signalled when a close() has given an entry back (shim_slots_done());
 * on CLOCK_MONOTONIC, set by shim_slots_start(). */
static pthread_cond_t slots_released = PTHREAD_COND_INITIALIZER;

/* Bumped under the lock each time a close() has given back an entry:
 * epochs[key_epoch(tag)] for its key and epochs[rule_epoch(tag)] for its
 * rule (a few keys share a counter; a shared one only costs a decision
 * asked again). */
static uint32_t epochs[EPOCHS];

/* The table used when the mapping cannot be made. */
static shim_held_t held_min[SHIM_HELD_MIN];
static uint32_t tags_min[SHIM_HELD_MIN];

/* Entries for the current soft descriptor limit: a power of two, at
 * least SHIM_HELD_MIN, at most SHIM_SLOT_FDS (an unlimited limit too). */
static size_t table_size(void)
{
    struct rlimit rl;
    size_t want = SHIM_SLOT_FDS, n = SHIM_HELD_MIN;

    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY
        && rl.rlim_cur < (rlim_t)SHIM_SLOT_FDS) {
        want = (size_t)rl.rlim_cur;
    }
    while (n < want) {
        n <<= 1;
    }
    return n;
}

int shim_slots_start(char *err, size_t errlen)
{
    size_t n = table_size();
    unsigned char *mem;
    pthread_condattr_t ca;

    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&slots_released, &ca);
    pthread_condattr_destroy(&ca);

    /* Private: a forked child gets a copy, and forgets it (after_fork).
     * No swap is reserved for pages never touched. */
    mem = mmap(NULL, n * (sizeof(shim_held_t) + sizeof(uint32_t)),
               PROT_READ | PROT_WRITE,
               MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (mem == MAP_FAILED) {
        snprintf(err, errlen, "cannot map the table of %zu held "
                 "connections: %s; it holds %d", n, strerror(errno),
                 SHIM_HELD_MIN);
        held = held_min;
        tags = tags_min;
        size = SHIM_HELD_MIN;
        mask = size - 1;
        return TB_ERR;
    }
    held = (shim_held_t *)(void *)mem;
    tags = (uint32_t *)(void *)(mem + n * sizeof(shim_held_t));
    size = n;
    mask = n - 1;
    return TB_OK;
}

size_t shim_slots_size(void)
{
    return size;
}

static size_t home(int fd)
{
    return (size_t)fd & mask;
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

/* The tag of an entry of rule r and key (klen bytes; only a $peer key
 * tells entries of one rule apart): the used bit, 15 bits of the rule's
 * address and 16 bits of an FNV-1a hash of the key. Equal tags are
 * candidates only; the entry itself decides. */
static uint32_t tag_of(const shim_rule_t *r, const char *key, size_t klen)
{
    uint32_t h = 2166136261u;
    uintptr_t a = (uintptr_t)r;

    if (r->key_kind == SHIM_KEY_PEER) {
        size_t i;

        for (i = 0; i < klen; i++) {
            h = (h ^ (unsigned char)key[i]) * 16777619u;
        }
    }
    a ^= a >> 17;
    return TAG_USED | (uint32_t)((a >> 4) & 0x7fff) << 16 | (h & 0xffff);
}

static size_t key_epoch(uint32_t tag)
{
    return (tag ^ (tag >> 16)) & (EPOCHS - 1);
}

static size_t rule_epoch(uint32_t tag)
{
    return ((tag >> 16) * 31u) & (EPOCHS - 1);
}

uint32_t shim_slots_epoch(const shim_rule_t *r, const char *key,
                          size_t klen, int same_key)
{
    uint32_t t = tag_of(r, key, klen);

    return __atomic_load_n(&epochs[same_key ? key_epoch(t) : rule_epoch(t)],
                           __ATOMIC_ACQUIRE);
}

int shim_slots_hold(const shim_held_t *h)
{
    size_t i, probes;
    size_t klen;
    const char *key = shim_held_key(h, &klen);
    int fd = h->fd, rc = -1;

    if (fd < 0 || fd >= SHIM_SLOT_FDS || held == NULL) {
        return -1;
    }
    pthread_mutex_lock(&slots_lock);
    /* An fd number is held at most once: the program closed the earlier
     * one through a path we do not see (dup2 over it), so its entry is
     * overwritten. The Redis slot expires by its ttl; the local place
     * has no ttl and would stay taken until this process had exited and
     * a taker found the table full, so it is given back now (a lock-free
     * swap). The search is bounded: a full table has no free entry. */
    for (i = home(fd), probes = 0;
         probes < size && held[i].rule != NULL && held[i].fd != fd;
         i = (i + 1) & mask, probes++) {
    }
    if (probes < size) {
        if (held[i].rule == NULL) {
            nheld++;
        }
        else if (held[i].place.table != NULL) {
            (void)tb_inflight_give(held[i].place.table, held[i].place.i,
                                   held[i].place.tag);
        }
        held[i] = *h;
        held[i].gone = 0;
        held[i].releasing = 0;
        tags[i] = tag_of(h->rule, key, klen);
        if (i >= top) {
            top = i + 1;
        }
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
        held[i].rule = NULL;
        tags[i] = 0;
        for (;;) {
            j = (j + 1) & mask;
            if (held[j].rule == NULL) {
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
        tags[i] = tags[j];
        i = j;
    }
}

/* The index of fd's entry, or size when it holds none. Called with the
 * lock held. */
static size_t find(int fd)
{
    size_t i, probes;

    for (i = home(fd), probes = 0; probes < size && held[i].rule != NULL;
         i = (i + 1) & mask, probes++) {
        if (held[i].fd == fd) {
            return i;
        }
    }
    return size;
}

int shim_slots_take(int fd, shim_held_t *out)
{
    size_t i;
    int found = 0;

    if (fd < 0 || fd >= SHIM_SLOT_FDS || held == NULL) {
        return 0;
    }
    pthread_mutex_lock(&slots_lock);
    i = find(fd);
    if (i < size && held[i].gone) {
        /* Given back already (shim_slots_reclaim()): nothing to wait
         * for. */
        delete_at(i);
        nheld--;
        i = size;
    }
    if (i < size && !held[i].releasing) {
        *out = held[i];
        held[i].releasing = 1;
        found = 1;
    }
    else if (i == size) {
        set_bit(fd, 0);
    }
    pthread_mutex_unlock(&slots_lock);
    return found;
}

void shim_slots_done(int fd)
{
    size_t i;

    pthread_mutex_lock(&slots_lock);
    i = find(fd);
    if (i < size && held[i].releasing) {
        __atomic_add_fetch(&epochs[key_epoch(tags[i])], 1, __ATOMIC_RELEASE);
        __atomic_add_fetch(&epochs[rule_epoch(tags[i])], 1,
                           __ATOMIC_RELEASE);
        delete_at(i);
        nheld--;
        set_bit(fd, 0);
        pthread_cond_broadcast(&slots_released);
    }
    pthread_mutex_unlock(&slots_lock);
}

/* 1 when entry e is of rule r and, with same_key, of key (klen bytes). */
static int entry_matches(const shim_held_t *e, const shim_rule_t *r,
                         const char *key, size_t klen, int same_key)
{
    size_t elen;
    const char *ekey;

    if (e->rule != r) {
        return 0;
    }
    if (!same_key) {
        return 1;
    }
    ekey = shim_held_key(e, &elen);
    return elen == klen && memcmp(ekey, key, klen) == 0;
}

/* What a search of the table finds for one rule (and key). */
typedef struct search {
    struct pollfd p[SHIM_RECLAIM_POLL];
    size_t at[SHIM_RECLAIM_POLL];
    int np;                    /* Connections to ask about.             */
    int gone;                  /* Those marked gone already.            */
    int releasing;             /* One's close() is giving it back.      */
} search_t;

/* Search the table for the entries of rule r (and, with same_key, of key,
 * klen bytes). Called with the lock held. */
static void search(const shim_rule_t *r, const char *key, size_t klen,
                   int same_key, search_t *s)
{
    uint32_t want = tag_of(r, key, klen);
    uint32_t m = same_key ? 0xffffffffu : TAG_RULE;
    size_t i;

    s->np = s->gone = s->releasing = 0;
    for (i = 0; i < top; i++) {
        if ((tags[i] & m) != (want & m)
            || !entry_matches(&held[i], r, key, klen, same_key)) {
            continue;
        }
        s->gone += held[i].gone;
        s->releasing |= held[i].releasing;
        if (!held[i].gone && !held[i].releasing
            && s->np < SHIM_RECLAIM_POLL) {
            s->p[s->np].fd = held[i].fd;
            s->p[s->np].events = POLLRDHUP;
            s->p[s->np].revents = 0;
            s->at[s->np++] = i;
        }
    }
}

/* Wait, at most SHIM_RELEASE_WAIT_MS, until no entry of the rule (and
 * key) is being given back by a close() in another thread. Called with
 * the lock held, which the wait lets go of. */
static void wait_released(const shim_rule_t *r, const char *key,
                          size_t klen, int same_key, search_t *s)
{
    struct timespec until;

    clock_gettime(CLOCK_MONOTONIC, &until);
    until.tv_nsec += SHIM_RELEASE_WAIT_MS * 1000000L;
    if (until.tv_nsec >= 1000000000L) {
        until.tv_sec++;
        until.tv_nsec -= 1000000000L;
    }
    while (s->releasing
           && pthread_cond_timedwait(&slots_released, &slots_lock, &until)
              != ETIMEDOUT) {
        search(r, key, klen, same_key, s);
    }
}

/* Three ways a connection held here can turn out to be gone. Another
 * thread's close() may have given it back since the caller read the
 * epoch, before its decision: the decision may have reached Redis before
 * that release. Its close() may be under way: then we wait for that
 * release (bounded). Or the program has not closed it yet although its
 * peer has: a client that reads an answer by its Content-Length and
 * connects again does not wait for the server's close.
 *
 * The last is bounded, because a peer that has sent its FIN may only
 * have half-closed (shutdown(SHUT_WR)) and still wait for an answer the
 * program is working on: counted as gone without a bound, such
 * connections would get around the limit altogether. A program that is
 * merely slow to close finished connections needs some room beyond N:
 * with a busy loop competing for the 2 CPUs of the test machine, a client
 * making one request at a time found up to 5 of its finished connections
 * still open in thread_srv: with no room beyond N, 24 to 31% of its
 * requests were refused, with 1 to 4 more 0.3 to 2.2%, with 8 none of
 * 3,000.
 *
 * The poll() is made under the lock, with no wait: the close() wrapper
 * marks an entry under this lock before it closes the fd, so every fd
 * polled here is still the accepted connection, never a number the
 * program has reused meanwhile. */
int shim_slots_reclaim(const shim_rule_t *r, const char *key, size_t klen,
                       int same_key, uint32_t epoch, shim_held_t *out)
{
    search_t s;
    int found = 0, changed;

    if (held == NULL) {
        return 0;
    }
    memset(out, 0, sizeof(*out));
    pthread_mutex_lock(&slots_lock);
    search(r, key, klen, same_key, &s);
    if (s.releasing) {
        wait_released(r, key, klen, same_key, &s);
    }
    /* A release seen through the epoch may have been another
     * connection's, counted late: the peer-closed ones are looked at all
     * the same. */
    changed = shim_slots_epoch(r, key, klen, same_key) != epoch;
    if (s.gone < (same_key ? r->concurrency
                           : r->local_concurrency > 0 ? r->local_concurrency
                                                      : r->local_max)
                 + SHIM_GONE_EXTRA
        && s.np > 0 && poll(s.p, (nfds_t)s.np, 0) > 0) {
        int k;

        for (k = 0; k < s.np && !found; k++) {
            if (s.p[k].revents & (POLLRDHUP | POLLHUP | POLLERR)) {
                shim_held_t *e = &held[s.at[k]];

                *out = *e;
                e->gone = 1;
                e->slot.kind = TB_SLOT_NONE;
                e->place.table = NULL;
                found = 1;
            }
        }
    }
    pthread_mutex_unlock(&slots_lock);
    return found || changed;
}

void shim_slots_after_fork(void)
{
    size_t i;
    pthread_condattr_t ca;

    pthread_mutex_init(&slots_lock, NULL);
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&slots_released, &ca);
    pthread_condattr_destroy(&ca);
    if (held == NULL || nheld == 0) {
        return;
    }
    /* The tags say which entries are used: 4 bytes read per entry, and
     * only the used ones written (copied, in this child). */
    for (i = 0; i < top; i++) {
        if (tags[i] != 0) {
            set_bit(held[i].fd, 0);
            held[i].rule = NULL;
            tags[i] = 0;
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
