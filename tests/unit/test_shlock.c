/* test_shlock.c -- the spin lock of tables in shared memory (tb_shlock.c):
 * a holder that died is taken over after TB_SHLOCK_STEAL_US, a lock that
 * passes between live holders never is (the bug that made test_local's
 * hammer miscount once in fifteen runs), a late holder's release frees
 * nothing, and threads hammering one word lose no update.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "base/tb_base.h"
#include "unit_common.h"

static void sleep_us(long us)
{
    struct timespec ts = { us / 1000000, (us % 1000000) * 1000 };

    nanosleep(&ts, NULL);
}

static void test_shlock_counts(void **state)
{
    uint32_t word = 0, mine;
    int stolen = -1;

    (void)state;
    mine = tb__shlock_take(&word, &stolen);
    assert_int_equal(mine, 1);
    assert_int_equal(stolen, 0);
    assert_int_equal(word, 1);
    tb__shlock_release(&word, mine);
    assert_int_equal(word, 2);
    mine = tb__shlock_take(&word, &stolen);
    assert_int_equal(mine, 3);
    tb__shlock_release(&word, mine);
    /* A second release of the same holding frees nothing more. */
    tb__shlock_release(&word, mine);
    assert_int_equal(word, 4);
}

/* A child takes the lock in shared memory and exits holding it: the
 * parent waits about TB_SHLOCK_STEAL_US, then takes it over. */
static void test_shlock_dead_holder_taken_over(void **state)
{
    uint32_t *word, mine;
    int stolen = -1, status;
    tb_monotime_us t0, waited;
    pid_t pid;

    (void)state;
    word = mmap(NULL, sizeof(*word), PROT_READ | PROT_WRITE,
                MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    assert_true(word != MAP_FAILED);
    *word = 0;
    pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        int s;

        tb__shlock_take(word, &s);
        _exit(s == 0 ? 0 : 1);
    }
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    assert_int_equal(*word, 1);
    t0 = tb_clock_monotonic_us();
    mine = tb__shlock_take(word, &stolen);
    waited = tb_clock_monotonic_us() - t0;
    assert_int_equal(stolen, 1);
    assert_int_equal(mine, 3);
    assert_true(waited >= TB_SHLOCK_STEAL_US);
    /* The dead holder's release, had it come late, frees nothing. */
    tb__shlock_release(word, 1);
    assert_int_equal(*word, 3);
    tb__shlock_release(word, mine);
    assert_int_equal(*word, 4);
    munmap(word, sizeof(*word));
}

/* Holders that come and go: every few ms the word shows a new holder
 * (a release and another's take), for four times the steal time. The
 * waiter must wait them all out and get the lock when it is freed, not
 * take it from a live holder because its own wait grew long. */
typedef struct relay {
    uint32_t *word;
    int hands;
    tb_monotime_us max_gap;         /* The longest time one holder held. */
} relay_t;

static void *relay_main(void *arg)
{
    relay_t *r = arg;
    tb_monotime_us last = tb_clock_monotonic_us(), now;
    int i;

    for (i = 0; i < r->hands; i++) {
        sleep_us(4000);
        __atomic_add_fetch(r->word, 2, __ATOMIC_ACQ_REL);
        now = tb_clock_monotonic_us();
        if (now - last > r->max_gap) {
            r->max_gap = now - last;
        }
        last = now;
    }
    __atomic_add_fetch(r->word, 1, __ATOMIC_RELEASE);
    return NULL;
}

static void test_shlock_live_holders_not_taken_over(void **state)
{
    uint32_t word = 1, mine;
    relay_t r = { &word, 4 * TB_SHLOCK_STEAL_US / 4000, 0 };
    tb_monotime_us t0, waited;
    pthread_t th;
    int stolen = -1;

    (void)state;
    assert_int_equal(pthread_create(&th, NULL, relay_main, &r), 0);
    t0 = tb_clock_monotonic_us();
    mine = tb__shlock_take(&word, &stolen);
    waited = tb_clock_monotonic_us() - t0;
    pthread_join(th, NULL);
    /* Only a relay thread that stalled for the whole steal time (one
     * holder held that long) makes a take-over right: on a crowded
     * machine say so; otherwise the take-over is the bug. */
    if (stolen) {
        print_message("taken over after %lld us; the longest hold %lld us\n",
                      (long long)waited, (long long)r.max_gap);
        assert_true(r.max_gap >= TB_SHLOCK_STEAL_US);
        return;
    }
    assert_true(waited >= 3 * TB_SHLOCK_STEAL_US);
    assert_int_equal(mine & 1u, 1);
    tb__shlock_release(&word, mine);
}

/* Threads increment one plain counter under the lock: no update lost. */
typedef struct hammer {
    uint32_t *word;
    volatile uint64_t *counter;
    int rounds, steals;
} hammer_t;

static void *hammer_main(void *arg)
{
    hammer_t *h = arg;
    int left = h->rounds, stolen;

    while (left-- > 0) {
        uint32_t mine = tb__shlock_take(h->word, &stolen);

        *h->counter = *h->counter + 1;    /* a read, then a write */
        h->steals += stolen;
        tb__shlock_release(h->word, mine);
    }
    return NULL;
}

static void test_shlock_threads_lose_nothing(void **state)
{
    uint32_t word = 0;
    uint64_t counter = 0;
    hammer_t h[4];
    int k, steals = 0;

    (void)state;
    for (k = 0; k < 4; k++) {
        h[k].word = &word;
        h[k].counter = &counter;
        h[k].rounds = 200000;
        h[k].steals = 0;
    }
    assert_int_equal(unit_threads(4, hammer_main, h, sizeof(h[0])), 0);
    for (k = 0; k < 4; k++) {
        steals += h[k].steals;
    }
    if (steals) {
        /* Only a holder descheduled for 100 ms is taken over (a loaded
         * machine); each take-over can lose at most the one increment
         * its holder had read, never more. */
        print_message("%d take-overs: a holder was descheduled\n", steals);
        assert_true(counter <= 4 * 200000);
        assert_true(counter >= 4 * 200000 - (uint64_t)steals);
        return;
    }
    assert_int_equal(counter, 4 * 200000);
    assert_int_equal(word, 2u * 4 * 200000);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_shlock_counts),
        cmocka_unit_test(test_shlock_dead_holder_taken_over),
        cmocka_unit_test(test_shlock_live_holders_not_taken_over),
        cmocka_unit_test(test_shlock_threads_lose_nothing),
    };

    return cmocka_run_group_tests_name("shlock", tests, NULL, NULL);
}
