/* shim_local.c -- `local_concurrency = N` or "auto": at most N (or a
 * cap set from how long connections last, shared/tables/tb_adapt.c,
 * counting only those whose client did not set the pace)
 * connections of an inbound rule open at once across the processes of
 * one host program, counted in shared memory, with no Redis call.
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
#include <netinet/in.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <time.h>

#include <linux/tcp.h>

#include "shim_int.h"

#define SHIM_REAP_MS 100      /* Least time between searches of one table
                               * for dead owners, ms.                    */
#define LOCAL_ALIGN 64        /* Each table starts on its own cache line. */
#define PACED_SLACK_MS 10     /* The client's share of a connection that
                               * never drops its sample: TCP_INFO's times
                               * are in jiffies (4 ms at HZ=250).       */

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
    tb_adapt_t *adapt;        /* auto: the cap; NULL for a fixed N.      */
    uint32_t n;               /* The rule's N, or auto's max.            */
} local_rule_t;

/* Filled once by shim_local_start(), read-only afterwards. */
static const shim_rule_t *local_base;  /* The inbound rule table.        */
static int local_nrules;
static local_rule_t local_rules[SHIM_MAX_RULES];

static size_t round_up(size_t n)
{
    return (n + LOCAL_ALIGN - 1) / LOCAL_ALIGN * LOCAL_ALIGN;
}

/* The places of rule r's table (auto: its max), 0 for no local cap. */
static uint32_t places_of(const shim_rule_t *r)
{
    if (r->local_concurrency == SHIM_LOCAL_AUTO) {
        return (uint32_t)r->local_max;
    }
    return r->local_concurrency > 0 ? (uint32_t)r->local_concurrency : 0;
}

/* Bytes of rule r's part of the mapping: head, auto's cap, table. */
static size_t part_size(const shim_rule_t *r)
{
    if (!places_of(r)) {
        return 0;
    }
    return HEAD_SIZE + (r->local_concurrency == SHIM_LOCAL_AUTO
                        ? round_up(tb_adapt_size()) : 0)
           + round_up(tb_inflight_size(places_of(r)));
}

int shim_local_start(const shim_conf_t *conf, char *err, size_t errlen)
{
    unsigned char *mem;
    size_t total = 0, off = 0;
    int i;

    for (i = 0; i < conf->nin; i++) {
        total += part_size(&conf->in[i]);
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
        local_rule_t *lr = &local_rules[i];
        size_t at = off + HEAD_SIZE;

        if (!part_size(r)) {
            continue;
        }
        lr->head = (local_head_t *)(void *)(mem + off);
        lr->n = places_of(r);
        if (r->local_concurrency == SHIM_LOCAL_AUTO) {
            lr->adapt = tb_adapt_init(mem + at, (uint32_t)r->local_min,
                                      lr->n);
            at += round_up(tb_adapt_size());
        }
        lr->table = tb_inflight_init(mem + at, lr->n);
        off += part_size(r);
    }
    local_base = conf->in;
    local_nrules = conf->nin;
    return TB_OK;
}

/* The rule's entry, or NULL when it has no local cap. */
static local_rule_t *rule_of(const shim_rule_t *r)
{
    if (local_base == NULL || r < local_base
        || r >= local_base + local_nrules
        || local_rules[r - local_base].table == NULL) {
        return NULL;
    }
    return &local_rules[r - local_base];
}

/* Microseconds of the monotonic clock, as the core reads it. */
static uint64_t now_us(void)
{
    return (uint64_t)tb_clock_monotonic_us();
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
    local_rule_t *lr = rule_of(r);
    uint32_t n;
    int i;

    p->table = NULL;
    p->adapt = NULL;
    if (lr == NULL) {
        return 1;
    }
    n = lr->adapt ? tb_adapt_cap(lr->adapt) : lr->n;
    /* The plain search first: dead owners are looked for only when it
     * finds the table full, and then at most once every SHIM_REAP_MS. */
    i = tb_inflight_take(lr->table, n, tag, NULL);
    if (i == TB_INFLIGHT_FULL && may_reap(lr->head)) {
        i = tb_inflight_take(lr->table, n, tag, tb_inflight_pid_alive);
    }
    if (i < 0) {
        return 0;
    }
    p->table = lr->table;
    p->i = i;
    p->tag = tag;
    if (lr->adapt) {
        tb_adapt_taken(lr->adapt, tb_inflight_count(lr->table));
        p->adapt = lr->adapt;
        p->started_us = now_us();
    }
    return 1;
}

/* Whether connection fd, accepted life_ms before, tells auto anything
 * about the program: 1 when the client said its piece at once and the
 * program answered it, 0 when the client set the pace. The shim sees
 * accept and close, not the reads and writes between: the kernel's
 * TCP_INFO says when data last came in and went out. The client's share
 * is the time from the accept to its last byte (an upload paced a byte
 * at a time, a request sent late, a second request on a kept-alive
 * connection) and the time from the program's last answer to the close
 * (a connection held open idle after it). A connection whose client
 * spoke last (the program answered nothing after it), that carried no
 * data either way, or whose client's share is over PACED_SLACK_MS and
 * half its life gives no sample; any other gives its whole life, to the
 * microsecond. Not TCP, or a kernel without tcpi_data_segs_out (before
 * 4.6): its whole life, as before there was a way to tell. */
static int answered_at_once(int fd, uint64_t life_ms)
{
    struct tcp_info ti;
    socklen_t len = sizeof(ti);
    uint64_t client_ms;

    memset(&ti, 0, sizeof(ti));
    if (fd < 0 || getsockopt(fd, IPPROTO_TCP, TCP_INFO, &ti, &len) != 0
        || len < offsetof(struct tcp_info, tcpi_data_segs_out)
                 + sizeof(ti.tcpi_data_segs_out)) {
        return 1;
    }
    if (!ti.tcpi_data_segs_in || !ti.tcpi_data_segs_out
        || ti.tcpi_last_data_sent > ti.tcpi_last_data_recv) {
        return 0;
    }
    client_ms = life_ms > ti.tcpi_last_data_recv
                ? life_ms - ti.tcpi_last_data_recv : 0;
    client_ms += ti.tcpi_last_data_sent;
    return client_ms <= PACED_SLACK_MS || client_ms * 2 <= life_ms;
}

void shim_local_give(const shim_place_t *p, int fd)
{
    uint64_t now;

    if (p->table == NULL || !tb_inflight_give(p->table, p->i, p->tag)
        || !p->adapt) {
        return;
    }
    now = now_us();
    if (now >= p->started_us
        && answered_at_once(fd, (now - p->started_us) / 1000)) {
        tb_adapt_sample(p->adapt, p->started_us, now);
    }
}
