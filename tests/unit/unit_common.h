/* unit_common.h -- what several unit tests share: a request of one key
 * and its takes, memory for the tables that live in caller memory
 * (tb_inflight, tb_local, tb_lease, tb_topk) with guard bytes after it,
 * and the threads and forked children that hammer those tables at once.
 *
 * A table must never write past the size its *_size() function gives:
 * guarded_new() fills that size and UNIT_GUARD more bytes with 0xa5, and
 * guarded_check() fails the test, naming the table, when a guard byte
 * changed. Shared memory (MAP_SHARED, anonymous) is for tests whose
 * forked children use the table, as the shim and the module do. Include
 * after <cmocka.h>.
 */
#ifndef UNIT_COMMON_H
#define UNIT_COMMON_H

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>

#include "tb.h"

#define UNIT_GUARD 256
#define UNIT_MAX_THREADS 16

/* t: a take of cost tokens from a bucket of capacity and rate (tokens
 * per second), without a route. */
static inline void unit_take(tb_take_t *t, double capacity, double rate,
                             double cost)
{
    memset(t, 0, sizeof(*t));
    t->limit.capacity = capacity;
    t->limit.rate_per_sec = rate;
    t->cost = cost;
}

/* q: a request of key under prefix for the n takes at t, every other
 * field zero. */
static inline void unit_request(tb_request_t *q, const char *prefix,
                                const char *key, tb_take_t *t, int n)
{
    memset(q, 0, sizeof(*q));
    q->prefix = prefix;
    q->key = key;
    q->key_len = strlen(key);
    q->takes = t;
    q->ntakes = n;
}

typedef struct guarded {
    unsigned char *mem;
    size_t size;                      /* The table's; the guard follows. */
    int shared;                       /* mmap'd MAP_SHARED, not malloc'd. */
} guarded_t;

/* size bytes and the guard, all 0xa5, in g->mem; also returned. */
static inline unsigned char *guarded_new(guarded_t *g, size_t size,
                                         int shared)
{
    g->size = size;
    g->shared = shared;
    if (shared) {
        g->mem = mmap(NULL, size + UNIT_GUARD, PROT_READ | PROT_WRITE,
                      MAP_SHARED | MAP_ANONYMOUS, -1, 0);
        assert_true(g->mem != MAP_FAILED);
    }
    else {
        g->mem = malloc(size + UNIT_GUARD);
        assert_non_null(g->mem);
    }
    memset(g->mem, 0xa5, size + UNIT_GUARD);
    return g->mem;
}

/* Fails the test when what (the table's name) wrote into the guard. */
static inline void guarded_check(const guarded_t *g, const char *what)
{
    size_t i;

    for (i = g->size; i < g->size + UNIT_GUARD; i++) {
        if (g->mem[i] != 0xa5) {
            fail_msg("%s wrote past its %zu bytes (offset %zu)", what,
                     g->size, i);
        }
    }
}

/* guarded_check(), then the memory is given back. */
static inline void guarded_free(guarded_t *g, const char *what)
{
    guarded_check(g, what);
    if (g->shared) {
        munmap(g->mem, g->size + UNIT_GUARD);
    }
    else {
        free(g->mem);
    }
}

/* fn in n threads (at most UNIT_MAX_THREADS) at once, the k-th on
 * (char *)args + k * size (size 0: every one on args); returns once all
 * have ended: 0, or -1 when one could not be started (the test fails on
 * it; a forked child exits with an error). */
static inline int unit_threads(int n, void *(*fn)(void *), void *args,
                               size_t size)
{
    pthread_t th[UNIT_MAX_THREADS];
    int k, started;

    for (started = 0; started < n && started < UNIT_MAX_THREADS;
         started++) {
        if (pthread_create(&th[started], NULL, fn,
                           (char *)args + (size_t)started * size) != 0) {
            break;
        }
    }
    for (k = 0; k < started; k++) {
        pthread_join(th[k], NULL);
    }
    return started == n ? 0 : -1;
}

/* Waits for the n children in pids; fails the test unless every one
 * exited with status 0. */
static inline void unit_wait_children(const pid_t *pids, int n)
{
    int p, status;

    for (p = 0; p < n; p++) {
        assert_int_equal(waitpid(pids[p], &status, 0), pids[p]);
        assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    }
}

#endif /* UNIT_COMMON_H */
