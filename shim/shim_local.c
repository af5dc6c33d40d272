/* shim_local.c -- `local_concurrency = N`: at most N connections of an
 * inbound rule open at once across the processes of one host program,
 * counted in shared memory, with no Redis call.
 *
 * One anonymous MAP_SHARED mapping, made before the program can fork,
 * holds a tb_inflight table of N places per rule, so the cap belongs to
 * the program and all its forked children. A connection takes a place
 * when accepted (tagged with the process id) and gives it back when that
 * process closes it; places of a process that died are found and freed,
 * at most once every SHIM_REAP_MS, by whichever process finds the table
 * full. Lock-free, no allocation; docs/design.md ("File notes") says what
 * is left out. */
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
