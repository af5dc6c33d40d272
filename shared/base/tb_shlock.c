/* tb_shlock.c -- the spin lock of the tables in shared memory (the local
 * and lease tables, tb_local.c; the top keys' slots, tb_topk.c): one
 * 32-bit word that Apache's children, their threads and the shim's
 * processes take for a few hundred instructions at a time.
 *
 * A child can die holding it (killed by a signal, or by Apache's own
 * timeout), and nobody would ever release it, so a waiter takes the lock
 * over from a holder that has held it far longer than any critical
 * section takes (TB_SHLOCK_STEAL_US). What must not be taken over is a
 * live holder: under contention a waiter can lose the lock to others for
 * longer than that while every one of them holds it for microseconds.
 * So the word counts: even when free, odd while held, one more on every
 * take and on every release. A waiter times the holder it sees, not its
 * own wait, and starts again each time the word shows a new holder; it
 * takes over only a value that has not changed for the whole time. A
 * take-over adds two (a new holder, still odd), and a release is a
 * compare-and-swap of the holder's own value: a holder that was only
 * descheduled and comes back late frees nothing it no longer holds.
 *
 * The first version timed the waiter's own wait: with four threads
 * taking one table's lock back to back on two CPUs, a waiter starved for
 * 100 ms took the lock from a live holder, two threads updated a table
 * at once and a concurrency count went wrong (test_local's hammer, about
 * one run in fifteen).
 */
#include <sched.h>

#include "tb_base.h"

uint32_t tb__shlock_wait(uint32_t *word, int *stolen)
{
    tb_monotime_us since = 0;
    uint32_t seen = 0, v;
    int spins = 0;

    for (;;) {
        v = __atomic_load_n(word, __ATOMIC_RELAXED);
        if (!(v & 1u)) {
            if (__atomic_compare_exchange_n(word, &v, v + 1, 0,
                                            __ATOMIC_ACQUIRE,
                                            __ATOMIC_RELAXED)) {
                *stolen = 0;
                return v + 1;
            }
            continue;
        }
        if (v != seen) {
            /* Another holder: its time starts now. */
            seen = v;
            since = 0;
            spins = 0;
        }
        if (++spins < 64) {
            continue;
        }
        if (!since) {
            since = tb_clock_monotonic_us();
        }
        else if (tb_clock_monotonic_us() - since > TB_SHLOCK_STEAL_US
                 && __atomic_compare_exchange_n(word, &v, v + 2, 0,
                                                __ATOMIC_ACQUIRE,
                                                __ATOMIC_RELAXED)) {
            *stolen = 1;
            return v + 2;
        }
        sched_yield();
    }
}
