/* test_inflight.c -- unit tests for tb_inflight.c, the lock-free table of
 * owner words behind local concurrency limits ("at most N in flight
 * across the processes of one host").
 *
 * The table lives in caller memory: most tests give it malloc'd memory
 * with guard bytes after it (it must never write past
 * tb_inflight_size()); the fork tests give it MAP_SHARED memory used by
 * forked children, as the shim does. Whether an owner still runs is asked
 * of a fake alive() with a table of dead tags, so no test needs a process
 * to die, except the one that forks children and waits for them. Threads
 * and processes hammer one table to show that the cap is exact: every
 * count is checked against holders counted beside the table. Nothing
 * sleeps; every loop has a fixed count.
 */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "tb.h"
#include "unit_common.h"

typedef struct table {
    guarded_t g;
    tb_inflight_t *t;
} table_t;

static void table_new(table_t *tab, uint32_t cap)
{
    size_t size = tb_inflight_size(cap);

    assert_true(size > 0);
    tab->t = tb_inflight_init(guarded_new(&tab->g, size, 0), cap);
    assert_non_null(tab->t);
}

static void table_free(table_t *tab)
{
    guarded_free(&tab->g, "tb_inflight");
}

/* A table in memory shared with forked children. */
static tb_inflight_t *shared_new(uint32_t cap, size_t extra, void **mem,
                                 size_t *size)
{
    tb_inflight_t *t;

    *size = tb_inflight_size(cap) + extra;
    *mem = mmap(NULL, *size, PROT_READ | PROT_WRITE,
                MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    assert_true(*mem != MAP_FAILED);
    /* The table first, 4-byte aligned; the test's counters after it. */
    t = tb_inflight_init(*mem, cap);
    assert_non_null(t);
    return t;
}

/* ---- A fake alive(): tags listed in dead_tags have exited. ----------- */

static uint32_t dead_tags[8];
static int ndead;
static int alive_calls;

static void set_dead(int n, ...)
{
    va_list ap;
    int i;

    va_start(ap, n);
    for (i = 0; i < n; i++) {
        dead_tags[i] = va_arg(ap, uint32_t);
    }
    va_end(ap);
    ndead = n;
    alive_calls = 0;
}

static int fake_alive(uint32_t tag)
{
    int i;

    alive_calls++;
    for (i = 0; i < ndead; i++) {
        if (dead_tags[i] == tag) {
            return 0;
        }
    }
    return 1;
}

/* The shim's alive(): the process runs (EPERM: as another user). */
static int pid_alive(uint32_t tag)
{
    return kill((pid_t)tag, 0) == 0 || errno == EPERM;
}

/* ---- Tests ---------------------------------------------------------- */

static void test_inflight_size_and_init(void **state)
{
    unsigned char mem[64];
    table_t tab;

    (void)state;
    assert_int_equal(tb_inflight_size(0), 0);
    assert_int_equal(tb_inflight_size(TB_INFLIGHT_MAX + 1), 0);
    assert_true(tb_inflight_size(1) >= sizeof(uint32_t));
    /* One word per place: the size grows by 4 bytes a place. */
    assert_int_equal(tb_inflight_size(100) - tb_inflight_size(99),
                     sizeof(uint32_t));
    assert_null(tb_inflight_init(NULL, 4));
    assert_null(tb_inflight_init(mem, 0));
    assert_null(tb_inflight_init(mem, TB_INFLIGHT_MAX + 1));
    table_new(&tab, 7);
    assert_int_equal(tb_inflight_cap(tab.t), 7);
    assert_int_equal(tb_inflight_count(tab.t), 0);
    table_free(&tab);
}

/* Every place can be taken once; the next taker is refused; a place given
 * back is taken again; count follows. */
static void test_inflight_take_give_count(void **state)
{
    table_t tab;
    int got[4], seen = 0, i, j;

    (void)state;
    table_new(&tab, 4);
    for (i = 0; i < 4; i++) {
        got[i] = tb_inflight_take(tab.t, 4, 100, NULL);
        assert_in_range(got[i], 0, 3);
        for (j = 0; j < i; j++) {
            assert_int_not_equal(got[i], got[j]);
        }
        seen |= 1 << got[i];
        assert_int_equal(tb_inflight_count(tab.t), (uint32_t)i + 1);
    }
    assert_int_equal(seen, 0xf);
    assert_int_equal(tb_inflight_take(tab.t, 4, 100, NULL),
                     TB_INFLIGHT_FULL);
    /* Only the holder's tag gives a place back, and only once. */
    assert_int_equal(tb_inflight_give(tab.t, got[2], 101), 0);
    assert_int_equal(tb_inflight_give(tab.t, got[2], 100), 1);
    assert_int_equal(tb_inflight_give(tab.t, got[2], 100), 0);
    assert_int_equal(tb_inflight_count(tab.t), 3);
    assert_int_equal(tb_inflight_take(tab.t, 4, 200, NULL), got[2]);
    assert_int_equal(tb_inflight_take(tab.t, 4, 200, NULL),
                     TB_INFLIGHT_FULL);
    for (i = 0; i < 4; i++) {
        assert_int_equal(tb_inflight_give(tab.t, got[i],
                                          i == 2 ? 200 : 100), 1);
    }
    assert_int_equal(tb_inflight_count(tab.t), 0);
    table_free(&tab);
}

/* The largest table works end to end. */
static void test_inflight_largest_table(void **state)
{
    table_t tab;
    uint32_t i;

    (void)state;
    table_new(&tab, TB_INFLIGHT_MAX);
    for (i = 0; i < 1000; i++) {
        assert_true(tb_inflight_take(tab.t, TB_INFLIGHT_MAX, 9, NULL) >= 0);
    }
    assert_int_equal(tb_inflight_count(tab.t), 1000);
    assert_int_equal(tb_inflight_reap(tab.t, 9), 1000);
    assert_int_equal(tb_inflight_count(tab.t), 0);
    table_free(&tab);
}

/* ---- The cap is exact under threads ---------------------------------- */

typedef struct hammer {
    tb_inflight_t *t;
    uint32_t n;
    uint32_t tag;
    int calls;
    long *holders;            /* Held now, counted beside the table.     */
    long *most;               /* Largest *holders seen.                  */
    long *taken;              /* Successful takes.                       */
    int keep;                 /* 1: never give back.                     */
} hammer_t;

static void note_most(long *most, long now)
{
    long m = __atomic_load_n(most, __ATOMIC_SEQ_CST);

    while (now > m
           && !__atomic_compare_exchange_n(most, &m, now, 0,
                                           __ATOMIC_SEQ_CST,
                                           __ATOMIC_SEQ_CST)) {
    }
}

static void *hammer_main(void *arg)
{
    hammer_t *h = arg;
    int k;

    for (k = 0; k < h->calls; k++) {
        int i = tb_inflight_take(h->t, h->n, h->tag, NULL);

        if (i < 0) {
            if (i != TB_INFLIGHT_FULL) {
                abort();
            }
            continue;
        }
        __atomic_add_fetch(h->taken, 1, __ATOMIC_SEQ_CST);
        note_most(h->most, __atomic_add_fetch(h->holders, 1,
                                              __ATOMIC_SEQ_CST));
        if (h->keep) {
            continue;
        }
        /* The count of holders goes down before the place is free, so
         * that it never runs ahead of the table. */
        __atomic_sub_fetch(h->holders, 1, __ATOMIC_SEQ_CST);
        if (tb_inflight_give(h->t, i, h->tag) != 1) {
            abort();
        }
    }
    return NULL;
}

static void run_threads(hammer_t *proto, int nthreads)
{
    hammer_t h[8];
    int k;

    for (k = 0; k < nthreads; k++) {
        h[k] = *proto;
    }
    assert_int_equal(unit_threads(nthreads, hammer_main, h, sizeof(h[0])),
                     0);
}

static void test_inflight_threads_exact_cap(void **state)
{
    table_t tab;
    long holders = 0, most = 0, taken = 0;
    hammer_t h;

    (void)state;
    table_new(&tab, 3);
    memset(&h, 0, sizeof(h));
    h.t = tab.t;
    h.n = 3;
    h.tag = 42;
    h.calls = 20000;
    h.holders = &holders;
    h.most = &most;
    h.taken = &taken;
    run_threads(&h, 4);
    assert_true(most <= 3);
    assert_true(taken > 0);
    assert_int_equal(holders, 0);
    assert_int_equal(tb_inflight_count(tab.t), 0);
    /* Takers that never give: exactly cap succeed, whatever the race. */
    h.keep = 1;
    h.calls = 1000;
    taken = 0;
    run_threads(&h, 4);
    assert_int_equal(taken, 3);
    assert_int_equal(tb_inflight_count(tab.t), 3);
    table_free(&tab);
}

/* ---- ...and under processes sharing the memory ----------------------- */

typedef struct counters {
    long holders;
    long most;
    long taken;
} counters_t;

/* Fork nproc children, each running two hammer threads tagged with its
 * pid, on a table in shared memory; wait for them all. */
static void fork_hammers(tb_inflight_t *t, uint32_t n, counters_t *c,
                         int nproc, int calls, int keep)
{
    pid_t pids[4];
    int p;

    for (p = 0; p < nproc; p++) {
        pids[p] = fork();
        assert_true(pids[p] >= 0);
        if (pids[p] == 0) {
            hammer_t h;

            memset(&h, 0, sizeof(h));
            h.t = t;
            h.n = n;
            h.tag = (uint32_t)getpid();
            h.calls = calls;
            h.holders = &c->holders;
            h.most = &c->most;
            h.taken = &c->taken;
            h.keep = keep;
            _exit(unit_threads(2, hammer_main, &h, 0) ? 2 : 0);
        }
    }
    unit_wait_children(pids, nproc);
}

static void test_inflight_fork_exact_cap(void **state)
{
    void *mem;
    size_t size, off = (tb_inflight_size(5) + 63) / 64 * 64;
    tb_inflight_t *t;
    counters_t *c;

    (void)state;
    t = shared_new(5, off + sizeof(counters_t), &mem, &size);
    c = (counters_t *)(void *)((unsigned char *)mem + off);
    fork_hammers(t, 5, c, 3, 20000, 0);
    assert_true(c->most <= 5);
    assert_true(c->taken > 0);
    assert_int_equal(c->holders, 0);
    assert_int_equal(tb_inflight_count(t), 0);
    /* Children that keep what they take and exit: exactly 5 places are
     * taken in all, and stay taken by the dead until reaped. */
    c->taken = 0;
    fork_hammers(t, 5, c, 4, 500, 1);
    assert_int_equal(c->taken, 5);
    assert_int_equal(tb_inflight_count(t), 5);
    assert_int_equal(tb_inflight_take(t, 5, (uint32_t)getpid(), NULL),
                     TB_INFLIGHT_FULL);
    /* Those children have been waited for, so their pids are gone: the
     * shim's own question (kill(pid, 0)) frees their places, and the
     * parent takes one. */
    assert_true(tb_inflight_take(t, 5, (uint32_t)getpid(), pid_alive)
                >= 0);
    assert_int_equal(tb_inflight_count(t), 1);
    munmap(mem, size);
}

/* ---- Reaping --------------------------------------------------------- */

static void test_inflight_reap_by_tag(void **state)
{
    table_t tab;
    int i, a, b;

    (void)state;
    table_new(&tab, 8);
    for (i = 0; i < 3; i++) {
        assert_true(tb_inflight_take(tab.t, 8, 11, NULL) >= 0);
    }
    a = tb_inflight_take(tab.t, 8, 22, NULL);
    b = tb_inflight_take(tab.t, 8, 22, NULL);
    assert_true(a >= 0 && b >= 0);
    assert_int_equal(tb_inflight_reap(tab.t, 11), 3);
    assert_int_equal(tb_inflight_reap(tab.t, 11), 0);
    assert_int_equal(tb_inflight_reap(tab.t, 33), 0);
    assert_int_equal(tb_inflight_count(tab.t), 2);
    /* A place reaped and taken again belongs to its new owner: the old
     * owner's late give changes nothing. */
    assert_int_equal(tb_inflight_reap(tab.t, 22), 2);
    assert_true(tb_inflight_take(tab.t, 8, 44, NULL) >= 0);
    for (i = 0; i < 7; i++) {
        (void)tb_inflight_take(tab.t, 8, 44, NULL);
    }
    assert_int_equal(tb_inflight_count(tab.t), 8);
    assert_int_equal(tb_inflight_give(tab.t, a, 22), 0);
    assert_int_equal(tb_inflight_give(tab.t, b, 22), 0);
    assert_int_equal(tb_inflight_count(tab.t), 8);
    assert_int_equal(tb_inflight_reap(tab.t, 44), 8);
    table_free(&tab);
}

/* reap_dead frees exactly the places of owners alive() calls gone, and
 * asks about a live owner once per run of its places. */
static void test_inflight_reap_dead(void **state)
{
    table_t tab;
    int i;

    (void)state;
    table_new(&tab, 9);
    /* A fresh table hands places out in order: 0-2 to 1, 3-5 to 2, 6-8
     * to 3. */
    for (i = 0; i < 9; i++) {
        assert_int_equal(tb_inflight_take(tab.t, 9, (uint32_t)(i / 3 + 1),
                                          NULL), i);
    }
    set_dead(1, (uint32_t)2);
    assert_int_equal(tb_inflight_reap_dead(tab.t, fake_alive), 3);
    assert_int_equal(tb_inflight_count(tab.t), 6);
    set_dead(0);
    assert_int_equal(tb_inflight_reap_dead(tab.t, fake_alive), 0);
    assert_int_equal(alive_calls, 2);
    assert_int_equal(tb_inflight_reap(tab.t, 1), 3);
    assert_int_equal(tb_inflight_reap(tab.t, 3), 3);
    table_free(&tab);
}

/* A taker that finds the table full and is given alive() frees the dead
 * owners' places and takes one; without alive() it is refused. */
static void test_inflight_take_reaps_when_full(void **state)
{
    table_t tab;
    int i, got;

    (void)state;
    table_new(&tab, 4);
    for (i = 0; i < 4; i++) {
        assert_true(tb_inflight_take(tab.t, 4, i < 2 ? 5 : 6, NULL) >= 0);
    }
    set_dead(1, (uint32_t)5);
    assert_int_equal(tb_inflight_take(tab.t, 4, 7, NULL), TB_INFLIGHT_FULL);
    assert_int_equal(alive_calls, 0);
    got = tb_inflight_take(tab.t, 4, 7, fake_alive);
    assert_in_range(got, 0, 3);
    assert_true(alive_calls > 0);
    /* Both of the dead owner's places were freed; one is 7's now. */
    assert_int_equal(tb_inflight_count(tab.t), 3);
    assert_true(tb_inflight_take(tab.t, 4, 7, NULL) >= 0);
    /* Full of live owners: alive() frees nothing, the taker is refused. */
    assert_int_equal(tb_inflight_take(tab.t, 4, 8, fake_alive),
                     TB_INFLIGHT_FULL);
    assert_int_equal(tb_inflight_count(tab.t), 4);
    /* alive() is asked only when the table is full. */
    assert_int_equal(tb_inflight_give(tab.t, got, 7), 1);
    alive_calls = 0;
    assert_int_equal(tb_inflight_take(tab.t, 4, 8, fake_alive), got);
    assert_int_equal(alive_calls, 0);
    table_free(&tab);
}

/* A limit lowered below the table's cap takes only the first n places;
 * places already held beyond n stay held until given back. */
static void test_inflight_lower_n_below_cap(void **state)
{
    table_t tab;
    int i, got;

    (void)state;
    table_new(&tab, 8);
    for (i = 0; i < 3; i++) {
        got = tb_inflight_take(tab.t, 3, 1, NULL);
        assert_in_range(got, 0, 2);
    }
    assert_int_equal(tb_inflight_take(tab.t, 3, 1, NULL), TB_INFLIGHT_FULL);
    assert_int_equal(tb_inflight_count(tab.t), 3);
    /* Raised again: the rest of the table is there. */
    for (i = 0; i < 5; i++) {
        got = tb_inflight_take(tab.t, 8, 2, NULL);
        assert_in_range(got, 3, 7);
    }
    assert_int_equal(tb_inflight_take(tab.t, 8, 2, NULL), TB_INFLIGHT_FULL);
    /* Lowered to 2 with place 0 free: 0 is taken, nothing beyond 1. */
    assert_int_equal(tb_inflight_give(tab.t, 0, 1), 1);
    assert_int_equal(tb_inflight_take(tab.t, 2, 3, NULL), 0);
    assert_int_equal(tb_inflight_take(tab.t, 2, 3, NULL), TB_INFLIGHT_FULL);
    assert_int_equal(tb_inflight_give(tab.t, 7, 2), 1);
    assert_int_equal(tb_inflight_take(tab.t, 2, 3, NULL), TB_INFLIGHT_FULL);
    assert_int_equal(tb_inflight_count(tab.t), 7);
    table_free(&tab);
}

static void test_inflight_bad_arguments(void **state)
{
    table_t tab;
    int i;

    (void)state;
    table_new(&tab, 4);
    assert_int_equal(tb_inflight_take(NULL, 1, 1, NULL), TB_INFLIGHT_BAD);
    assert_int_equal(tb_inflight_take(tab.t, 1, 0, NULL), TB_INFLIGHT_BAD);
    assert_int_equal(tb_inflight_take(tab.t, 0, 1, NULL), TB_INFLIGHT_BAD);
    assert_int_equal(tb_inflight_take(tab.t, 5, 1, NULL), TB_INFLIGHT_BAD);
    i = tb_inflight_take(tab.t, 4, 1, NULL);
    assert_true(i >= 0);
    assert_int_equal(tb_inflight_give(NULL, i, 1), 0);
    assert_int_equal(tb_inflight_give(tab.t, -1, 1), 0);
    assert_int_equal(tb_inflight_give(tab.t, 4, 1), 0);
    assert_int_equal(tb_inflight_give(tab.t, i, 0), 0);
    assert_int_equal(tb_inflight_count(tab.t), 1);
    assert_int_equal(tb_inflight_count(NULL), 0);
    assert_int_equal(tb_inflight_cap(NULL), 0);
    assert_int_equal(tb_inflight_reap(NULL, 1), 0);
    assert_int_equal(tb_inflight_reap(tab.t, 0), 0);
    assert_int_equal(tb_inflight_reap_dead(NULL, fake_alive), 0);
    assert_int_equal(tb_inflight_reap_dead(tab.t, NULL), 0);
    assert_int_equal(tb_inflight_count(tab.t), 1);
    assert_int_equal(tb_inflight_give(tab.t, i, 1), 1);
    table_free(&tab);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_inflight_size_and_init),
        cmocka_unit_test(test_inflight_take_give_count),
        cmocka_unit_test(test_inflight_largest_table),
        cmocka_unit_test(test_inflight_threads_exact_cap),
        cmocka_unit_test(test_inflight_fork_exact_cap),
        cmocka_unit_test(test_inflight_reap_by_tag),
        cmocka_unit_test(test_inflight_reap_dead),
        cmocka_unit_test(test_inflight_take_reaps_when_full),
        cmocka_unit_test(test_inflight_lower_n_below_cap),
        cmocka_unit_test(test_inflight_bad_arguments),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
