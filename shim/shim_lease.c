/* shim_lease.c -- the host's lease table: `lease = N` on a rule lets the
 * program's processes spend tokens taken from the rule's bucket in one
 * call without asking Redis again, and gives back what is left when the
 * program ends.
 *
 * Leases are the core's; the shim owns where the table lives (one
 * anonymous MAP_SHARED mapping made before the program can fork, so a
 * forking daemon's children share it) and its end: when the first
 * process exits normally, every lease's unspent tokens go back to Redis,
 * bounded by SHIM_LEASE_DRAIN_MS. Tokens of a program that ends any other
 * way refill on their own; docs/design.md ("File notes") lists what is
 * left out. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "shim_int.h"

#define SHIM_LEASE_ENTRIES 4096  /* Keys holding a lease at once, as the
                                  * module's table.                      */
#define SHIM_LEASE_DRAIN_MS 1000 /* Time after which a drain gives no
                                  * more tokens back; the call under way
                                  * then is bounded by the client's
                                  * timeouts.                            */

/* Set once by shim_lease_start(), read-only afterwards. */
static tb_lease_t *lease_table;
static pid_t lease_pid;       /* The process that made the mapping.     */

typedef struct drain {
    int64_t deadline_ms;      /* CLOCK_MONOTONIC ms.                    */
    size_t given;             /* Leases whose tokens went back.          */
    size_t lost;              /* Leases Redis did not take back.         */
    size_t late;              /* Leases left after the deadline.         */
    int last_err;             /* TB_ERR_* of the last lost one.          */
} drain_t;

/* tb_lease_drain's give(): one lease's tokens back to their bucket. */
static void drain_give(void *arg, const tb_lease_info_t *info, double tokens)
{
    drain_t *d = arg;
    int err = TB_ERR_NONE;

    if (shim_now_ms() >= d->deadline_ms) {
        d->late++;
        return;
    }
    if (shim_give_back(info->key, &info->limit, tokens, &err) == TB_OK) {
        d->given++;
        return;
    }
    d->lost++;
    d->last_err = err;
}

/* 1 when this process has children, running or not yet reaped. WNOWAIT
 * leaves the program's children to the program: none is reaped here. */
static int has_children(void)
{
    siginfo_t si;

    memset(&si, 0, sizeof(si));
    return waitid(P_ALL, 0, &si, WEXITED | WNOHANG | WNOWAIT) == 0;
}

/* The exit handler. It runs in every process that inherited it; only the
 * first process drains, and not from inside a core call of its own (a
 * signal handler that calls exit() may have interrupted one, with a lock
 * of the client held by this very thread). */
static void lease_at_exit(void)
{
    int saved = errno;
    drain_t d;

    if (lease_table == NULL || getpid() != lease_pid || shim_guard > 0
        || has_children()) {
        errno = saved;
        return;
    }
    memset(&d, 0, sizeof(d));
    d.deadline_ms = shim_now_ms() + SHIM_LEASE_DRAIN_MS;
    (void)tb_lease_drain(lease_table, drain_give, &d);
    if (d.lost > 0 || d.late > 0) {
        shim_warn("leases: the unspent tokens of %zu leases were not given "
                  "back to Redis (%s); their buckets refill on their own",
                  d.lost + d.late,
                  d.lost > 0 ? tb_err_name(d.last_err)
                             : "the drain ran out of time");
    }
    errno = saved;
}

int shim_lease_start(shim_conf_t *conf, char *err, size_t errlen)
{
    size_t size;
    void *mem;
    int i;

    for (i = 0; i < conf->nin && conf->in[i].lease == 0; i++) {
    }
    if (i == conf->nin) {
        for (i = 0; i < conf->nout && conf->out[i].lease == 0; i++) {
        }
        if (i == conf->nout) {
            return TB_OK;
        }
    }
    size = tb_lease_size(SHIM_LEASE_ENTRIES);
    /* Anonymous and shared: inherited by every child the program forks
     * after this, never seen by any other process. */
    mem = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS,
               -1, 0);
    if (mem == MAP_FAILED) {
        snprintf(err, errlen, "lease: cannot map %zu bytes of shared "
                 "memory: %s", size, strerror(errno));
        /* Without a table the core would take a rule's lease in its raw
         * form, handing tokens back to a caller that keeps none: no rule
         * asks for one then. */
        for (i = 0; i < conf->nin; i++) {
            conf->in[i].lease = 0;
        }
        for (i = 0; i < conf->nout; i++) {
            conf->out[i].lease = 0;
        }
        return TB_ERR;
    }
    lease_table = tb_lease_init(mem, SHIM_LEASE_ENTRIES);
    lease_pid = getpid();
    conf->opts.leases = lease_table;
    conf->opts.lease_owner = 0;
    return TB_OK;
}

void shim_lease_arm(void)
{
    /* Registered after the client exists, so that it runs before any
     * exit handler that making the client registered (OpenSSL's cleanup,
     * for a TLS connection): the drain still needs the connection. */
    if (lease_table != NULL && atexit(lease_at_exit) != 0) {
        shim_warn("leases: cannot register the exit handler; unspent "
                  "tokens are not given back when the program ends");
    }
}
