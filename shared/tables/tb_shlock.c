/* tb_shlock.c -- the lock of the tables in shared memory (the local and
 * lease tables, tb_local.c; the top keys' slots, tb_topk.c; the module's
 * failure records): a process-shared robust mutex that Apache's
 * children, their threads and the shim's processes take for a few
 * hundred instructions at a time.
 *
 * A holder can die holding it (killed by a signal, or a prefork child
 * exiting from its SIGTERM handler), and nobody would ever release it.
 * A robust mutex is the kernel's answer: the thread's robust list names
 * the mutexes it holds, the kernel marks each one when the thread dies,
 * and the next taker gets EOWNERDEAD, holding the lock. Nothing else can
 * take a lock from its holder, so one that is only slow (descheduled for
 * a long time on a crowded machine, or stopped with SIGSTOP) keeps it
 * and its waiters sleep until it releases. An earlier lock of our own
 * took over from a holder that had held it for 100 ms, which such a
 * holder did: two processes then wrote one table at once.
 *
 * After EOWNERDEAD the taker makes the mutex consistent at once, so that
 * a release leaves it usable (the alternative, ENOTRECOVERABLE, would
 * wedge the table for good), and reports TB_SHLOCK_RECOVERED: the data
 * may be half written, and each table says how it repairs it (tb_local.c,
 * tb_topk.c). A taker that itself dies while repairing leaves the mutex
 * marked again, and the next one repairs from the start.
 *
 * Cost: a take and a release, uncontended, are about 10 ns on this kind
 * of machine, against 5 ns for the spin word they replace, and about 140
 * instructions more (glibc's robust path; docs/benchmarks.md has the
 * figures); a decision's round trip to Redis takes tens of microseconds.
 */
#include <errno.h>
#include <pthread.h>

#include "tables/tb_tables_int.h"

/* tb_shlock_t is opaque storage for a pthread_mutex_t: it must fit. */
typedef char tb__shlock_fits[sizeof(pthread_mutex_t) <= sizeof(tb_shlock_t)
                             ? 1 : -1];

static pthread_mutex_t *mutex_of(tb_shlock_t *l)
{
    return (pthread_mutex_t *)(void *)l->opaque;
}

int tb_shlock_init(tb_shlock_t *l)
{
    pthread_mutexattr_t attr;
    int rc;

    if (!l || pthread_mutexattr_init(&attr) != 0) {
        return TB_ERR;
    }
    rc = pthread_mutexattr_setpshared(&attr, PTHREAD_PROCESS_SHARED);
    if (rc == 0) {
        rc = pthread_mutexattr_setrobust(&attr, PTHREAD_MUTEX_ROBUST);
    }
    if (rc == 0) {
        rc = pthread_mutex_init(mutex_of(l), &attr);
    }
    pthread_mutexattr_destroy(&attr);
    return rc == 0 ? TB_OK : TB_ERR;
}

/* What a lock call's result means for the caller: held (TB_OK), held
 * from a dead holder (made consistent here), busy, or not held. */
static int outcome(pthread_mutex_t *m, int rc)
{
    switch (rc) {
    case 0:
        return TB_OK;
    case EOWNERDEAD:
        if (pthread_mutex_consistent(m) != 0) {
            pthread_mutex_unlock(m);
            return TB_ERR;
        }
        return TB_SHLOCK_RECOVERED;
    case EBUSY:
        return TB_SHLOCK_BUSY;
    default:
        /* ENOTRECOVERABLE (released without being made consistent,
         * which this file never does) or EINVAL (never initialised). */
        return TB_ERR;
    }
}

int tb_shlock_take(tb_shlock_t *l)
{
    return l ? outcome(mutex_of(l), pthread_mutex_lock(mutex_of(l)))
             : TB_ERR;
}

int tb_shlock_try(tb_shlock_t *l)
{
    return l ? outcome(mutex_of(l), pthread_mutex_trylock(mutex_of(l)))
             : TB_ERR;
}

void tb_shlock_release(tb_shlock_t *l)
{
    if (l) {
        pthread_mutex_unlock(mutex_of(l));
    }
}
