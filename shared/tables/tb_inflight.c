/* tb_inflight.c -- at most N holders at once, across threads and processes.
 *
 * A local concurrency limit ("at most N requests of this scope in flight
 * on this server") is a table of N owner words in memory the caller
 * shares between processes. Taking a place is one compare-and-swap of a
 * free word (0) to the taker's owner tag, its process id; giving it back
 * is the swap the other way. There is no separate counter: the number in
 * flight is the number of words that hold an owner, so a holder that dies
 * at any instruction leaves either its word or nothing, never a count
 * that disagrees with the words. Whoever learns that a process died (the
 * module's parent when it reaps a child, a taker that finds the table
 * full and checks its owners) frees that process's words, and the table
 * is exact again.
 *
 * What it leaves out: fairness (a taker that finds no free word is
 * refused, not queued), and owners that reuse a dead process's id before
 * anyone frees its words (that place stays taken until the new process
 * exits too).
 */
#include <errno.h>
#include <signal.h>
#include <string.h>

#include "tables/tb_tables_int.h"

struct tb_inflight {
    uint32_t cap;                     /* Words in owner[].              */
    uint32_t hint;                    /* Where the next search starts:
                                       * spreads takers over the words,
                                       * a hint only.                   */
    uint32_t owner[];                 /* 0: free, else the holder's tag.*/
};

size_t tb_inflight_size(uint32_t cap)
{
    if (cap == 0 || cap > TB_INFLIGHT_MAX) {
        return 0;
    }
    return sizeof(tb_inflight_t) + (size_t)cap * sizeof(uint32_t);
}

tb_inflight_t *tb_inflight_init(void *mem, uint32_t cap)
{
    tb_inflight_t *t = mem;

    if (!mem || !tb_inflight_size(cap)) {
        return NULL;
    }
    memset(t, 0, tb_inflight_size(cap));
    t->cap = cap;
    return t;
}

uint32_t tb_inflight_cap(const tb_inflight_t *t)
{
    return t ? t->cap : 0;
}

/* One pass over the first n words from start; the index taken or -1. */
static int take_pass(tb_inflight_t *t, uint32_t n, uint32_t tag,
                     uint32_t start)
{
    uint32_t i, k;

    for (k = 0; k < n; k++) {
        uint32_t free_word = 0;

        i = (start + k) % n;
        /* A plain load first: a full table costs n reads, not n
         * read-for-ownership cache misses. */
        if (__atomic_load_n(&t->owner[i], __ATOMIC_RELAXED) != 0) {
            continue;
        }
        if (__atomic_compare_exchange_n(&t->owner[i], &free_word, tag, 0,
                                        __ATOMIC_ACQ_REL,
                                        __ATOMIC_RELAXED)) {
            return (int)i;
        }
    }
    return -1;
}

int tb_inflight_take(tb_inflight_t *t, uint32_t n, uint32_t tag,
                     tb_inflight_alive_fn alive)
{
    uint32_t start;
    int i;

    if (!t || tag == 0 || n == 0 || n > t->cap) {
        return TB_INFLIGHT_BAD;
    }
    start = __atomic_fetch_add(&t->hint, 1, __ATOMIC_RELAXED) % n;
    i = take_pass(t, n, tag, start);
    if (i < 0 && alive && tb_inflight_reap_dead(t, alive) > 0) {
        i = take_pass(t, n, tag, start);
    }
    return i < 0 ? TB_INFLIGHT_FULL : i;
}

int tb_inflight_give(tb_inflight_t *t, int i, uint32_t tag)
{
    uint32_t held = tag;

    if (!t || i < 0 || (uint32_t)i >= t->cap || tag == 0) {
        return 0;
    }
    /* Only the holder's own tag is cleared: a word the owner's reaper
     * already freed, and perhaps gave to another taker, stays theirs. */
    return __atomic_compare_exchange_n(&t->owner[i], &held, 0, 0,
                                       __ATOMIC_RELEASE, __ATOMIC_RELAXED);
}

uint32_t tb_inflight_count(const tb_inflight_t *t)
{
    uint32_t i, n = 0;

    for (i = 0; t && i < t->cap; i++) {
        n += __atomic_load_n(&t->owner[i], __ATOMIC_RELAXED) != 0;
    }
    return n;
}

uint32_t tb_inflight_reap(tb_inflight_t *t, uint32_t tag)
{
    uint32_t i, n = 0;

    for (i = 0; t && tag && i < t->cap; i++) {
        uint32_t held = tag;

        if (__atomic_load_n(&t->owner[i], __ATOMIC_RELAXED) == tag
            && __atomic_compare_exchange_n(&t->owner[i], &held, 0, 0,
                                           __ATOMIC_RELEASE,
                                           __ATOMIC_RELAXED)) {
            n++;
        }
    }
    return n;
}

int tb_inflight_pid_alive(uint32_t tag)
{
    int saved = errno, alive;

    /* EPERM: it runs, under another user. A zombie still counts until
     * its parent reaps it. */
    alive = kill((pid_t)tag, 0) == 0 || errno == EPERM;
    errno = saved;
    return alive;
}

uint32_t tb_inflight_reap_dead(tb_inflight_t *t, tb_inflight_alive_fn alive)
{
    uint32_t i, n = 0, live = 0, dead = 0;

    for (i = 0; t && alive && i < t->cap; i++) {
        uint32_t held = __atomic_load_n(&t->owner[i], __ATOMIC_RELAXED);

        /* One process usually holds runs of words: ask about an owner
         * once per run, since asking may be a system call. */
        if (!held || held == live) {
            continue;
        }
        if (held != dead && alive(held)) {
            live = held;
            continue;
        }
        dead = held;
        if (__atomic_compare_exchange_n(&t->owner[i], &held, 0, 0,
                                        __ATOMIC_RELEASE,
                                        __ATOMIC_RELAXED)) {
            n++;
        }
    }
    return n;
}
