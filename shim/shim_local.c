/* shim_local.c -- `local_concurrency = N`: at most N connections of an
 * inbound rule open at once across the processes of one host program,
 * counted in shared memory, with no Redis call.
 *
 * At initialisation, before the program can fork, one anonymous
 * MAP_SHARED mapping is made, holding a tb_inflight table
 * (shared/tb_inflight.c) of N places for each inbound rule that sets
 * local_concurrency. The children of a forking daemon inherit the mapping
 * and so share the tables: the cap belongs to the program (an Apache
 * prefork parent and all its children), not to one process. Processes
 * started separately -- another instance of the program, or a program
 * the host exec()s -- map their own tables and each have their own N.
 *
 * A connection takes a place when it is accepted, tagged with the
 * accepting process's id, and gives it back when that process closes the
 * fd; shim_slots.c keeps which fd holds which place, and a forked child
 * holds none (its fds are copies). A process that dies holding places
 * (kill -9) leaves its words in the table and nothing else: when a taker
 * finds the table full it asks, for each owner, whether that process
 * still runs (kill(pid, 0)) and frees the places of those that do not. A
 * zombie still runs for kill(), so a dead child's places come back once
 * its parent has reaped it. Asking costs one system call per run of
 * places one process holds, about 0.3 us each (measured on a 2 vCPU
 * Debian 12 VM): with 256 prefork children that is some 80 us per refused
 * connection, so a table is searched for dead owners at most once every
 * SHIM_REAP_MS, by whichever process first finds it full.
 *
 * Left out: fairness (a refused connection is not queued), owners whose
 * process id is reused before their places are freed (those places stay
 * taken until the new process exits too), and connections closed by a
 * path the close() wrapper does not see (fclose() of an fdopen()ed
 * socket, close_range()): their place stays taken until the same fd
 * number is accepted again under a rule, or the process exits.
 *
 * Every call here is lock-free and allocates nothing; the tables are
 * written only with atomic operations.
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#include "shim_int.h"

#define SHIM_REAP_MS 100      /* Least time between searches of one table
                               * for dead owners, ms.                    */
#define LOCAL_ALIGN 64        /* Each table starts on its own cache line. */

/* The head of each rule's part of the mapping; the table follows it. */
typedef struct local_head {
    int64_t next_reap_ms;     /* CLOCK_MONOTONIC ms before which nobody
                               * searches this table for dead owners; the
                               * clock is the host's, so every process
                               * reads it alike.                         */
} local_head_t;

#define HEAD_SIZE LOCAL_ALIGN

typedef struct local_rule {
    local_head_t *head;
    tb_inflight_t *table;     /* NULL: no local cap (or no mapping).     */
    uint32_t n;               /* The rule's local_concurrency.           */
} local_rule_t;

/* Filled once by shim_local_start(), read-only afterwards. */
static const shim_rule_t *local_base;  /* The inbound rule table.        */
static int local_nrules;
static local_rule_t local_rules[SHIM_MAX_RULES];

static size_t round_up(size_t n)
{
    return (n + LOCAL_ALIGN - 1) / LOCAL_ALIGN * LOCAL_ALIGN;
}

int shim_local_start(const shim_conf_t *conf, char *err, size_t errlen)
{
    unsigned char *mem;
    size_t total = 0, off = 0;
    int i;

    for (i = 0; i < conf->nin; i++) {
        if (conf->in[i].local_concurrency > 0) {
            total += HEAD_SIZE + round_up(tb_inflight_size(
                         (uint32_t)conf->in[i].local_concurrency));
        }
    }
    if (total == 0) {
        return TB_OK;
    }
    /* Anonymous and shared: inherited by every child the program forks
     * after this, never seen by any other process. */
    mem = mmap(NULL, total, PROT_READ | PROT_WRITE,
               MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (mem == MAP_FAILED) {
        snprintf(err, errlen, "local_concurrency: cannot map %zu bytes of "
                 "shared memory: %s", total, strerror(errno));
        return TB_ERR;
    }
    for (i = 0; i < conf->nin; i++) {
        const shim_rule_t *r = &conf->in[i];

        if (r->local_concurrency <= 0) {
            continue;
        }
        local_rules[i].head = (local_head_t *)(void *)(mem + off);
        local_rules[i].n = (uint32_t)r->local_concurrency;
        local_rules[i].table = tb_inflight_init(mem + off + HEAD_SIZE,
                                                local_rules[i].n);
        off += HEAD_SIZE + round_up(tb_inflight_size(local_rules[i].n));
    }
    local_base = conf->in;
    local_nrules = conf->nin;
    return TB_OK;
}

/* 1 when this caller may search the table for dead owners now: the
 * first to move next_reap_ms past now wins, across processes. */
static int may_reap(local_head_t *h)
{
    int64_t now = shim_now_ms();
    int64_t next = __atomic_load_n(&h->next_reap_ms, __ATOMIC_RELAXED);

    return now >= next
           && __atomic_compare_exchange_n(&h->next_reap_ms, &next,
                                          now + SHIM_REAP_MS, 0,
                                          __ATOMIC_RELAXED,
                                          __ATOMIC_RELAXED);
}

int shim_local_take(const shim_rule_t *r, uint32_t tag, shim_place_t *p)
{
    local_rule_t *lr;
    int i;

    p->table = NULL;
    if (local_base == NULL || r < local_base
        || r >= local_base + local_nrules) {
        return 1;
    }
    lr = &local_rules[r - local_base];
    if (lr->table == NULL) {
        return 1;
    }
    /* The plain search first: dead owners are looked for only when it
     * finds the table full, and then at most once every SHIM_REAP_MS. */
    i = tb_inflight_take(lr->table, lr->n, tag, NULL);
    if (i == TB_INFLIGHT_FULL && may_reap(lr->head)) {
        i = tb_inflight_take(lr->table, lr->n, tag, tb_inflight_pid_alive);
    }
    if (i < 0) {
        return 0;
    }
    p->table = lr->table;
    p->i = i;
    p->tag = tag;
    return 1;
}

void shim_local_give(const shim_place_t *p)
{
    if (p->table != NULL) {
        (void)tb_inflight_give(p->table, p->i, p->tag);
    }
}
