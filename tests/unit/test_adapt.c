/* test_adapt.c -- unit tests for tb_adapt.c, the concurrency cap that
 * sets itself from latency.
 *
 * A small simulated server drives it: N CPUs shared equally by the
 * requests running (processor sharing, in steps of 1 ms), each request
 * some milliseconds of waiting (I/O) and then of CPU, and closed-loop
 * clients that send again as soon as they are answered or refused (a
 * refused one waits 1 ms). The cap decides who gets in, as the module's
 * in-flight table does. Time is the simulation's, so nothing sleeps and
 * every run is the same; the noise test draws from a fixed seed.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "tb.h"
#include "unit_common.h"

#define MAX_CLIENTS 256
#define TICK_US 1000

typedef struct client {
    int running;
    uint64_t started_us, next_us;
    double io_left_us, cpu_left_us;
} client_t;

typedef struct sim {
    tb_adapt_t *a;
    guarded_t g;
    int cpus, clients;
    double io_us, cpu_us;            /* One request's needs.           */
    int slow_every;                  /* Every Nth request 10x (0: no). */
    uint64_t now_us;
    client_t c[MAX_CLIENTS];
    /* Over the current phase: */
    uint64_t done, refused, cpu_busy_us, ticks;
    uint32_t cap_lo, cap_hi, changes, last_cap;
    int ranged;                      /* cap_lo and cap_hi are set.     */
    unsigned seed;
} sim_t;

static void sim_new(sim_t *s, uint32_t min, uint32_t max)
{
    memset(s, 0, sizeof(*s));
    s->a = tb_adapt_init(guarded_new(&s->g, tb_adapt_size(), 0), min, max);
    assert_non_null(s->a);
    s->now_us = 1000000;
    s->seed = 12345;
}

static void sim_free(sim_t *s)
{
    guarded_free(&s->g, "tb_adapt");
}

static void sim_load(sim_t *s, int clients, int cpus, double io_ms,
                     double cpu_ms)
{
    s->clients = clients;
    s->cpus = cpus;
    s->io_us = io_ms * 1000;
    s->cpu_us = cpu_ms * 1000;
}

/* sim_new() with its load: clients, cpus, each request's ms of waiting
 * then of CPU. */
static void sim_start(sim_t *s, uint32_t min, uint32_t max, int clients,
                      int cpus, double io_ms, double cpu_ms)
{
    sim_new(s, min, max);
    sim_load(s, clients, cpus, io_ms, cpu_ms);
}

static int in_flight(const sim_t *s)
{
    int i, n = 0;

    for (i = 0; i < MAX_CLIENTS; i++) {
        n += s->c[i].running;
    }
    return n;
}

static void start_or_refuse(sim_t *s, client_t *c)
{
    int n = in_flight(s);

    if ((uint32_t)n >= tb_adapt_cap(s->a)) {
        s->refused++;
        c->next_us = s->now_us + TICK_US;
        return;
    }
    c->running = 1;
    c->started_us = s->now_us;
    /* +-20%: identical requests started together would stay in step. */
    c->io_left_us = s->io_us * (0.8 + 0.4 * (rand_r(&s->seed) % 1000)
                                / 1000.0);
    c->cpu_left_us = s->cpu_us * (0.8 + 0.4 * (rand_r(&s->seed) % 1000)
                                  / 1000.0);
    if (s->slow_every && rand_r(&s->seed) % s->slow_every == 0) {
        c->io_left_us *= 10;
        c->cpu_left_us *= 10;
    }
    tb_adapt_taken(s->a, (uint32_t)n + 1);
}

/* One millisecond: clients that are due send, running requests move on
 * (waiting first, then their share of the CPUs), finished ones sample. */
static void sim_tick(sim_t *s)
{
    int i, on_cpu = 0;
    double share;
    uint32_t cap;
    tb_adapt_view_t view;

    for (i = 0; i < s->clients; i++) {
        if (!s->c[i].running && s->c[i].next_us <= s->now_us) {
            start_or_refuse(s, &s->c[i]);
        }
    }
    for (i = 0; i < MAX_CLIENTS; i++) {
        on_cpu += s->c[i].running && s->c[i].io_left_us <= 0;
    }
    share = on_cpu > s->cpus ? (double)s->cpus / on_cpu : 1.0;
    s->cpu_busy_us += (uint64_t)((on_cpu < s->cpus ? on_cpu : s->cpus)
                                 * TICK_US);
    s->now_us += TICK_US;
    for (i = 0; i < MAX_CLIENTS; i++) {
        client_t *c = &s->c[i];

        if (!c->running) {
            continue;
        }
        if (c->io_left_us > 0) {
            c->io_left_us -= TICK_US;
        }
        else {
            c->cpu_left_us -= TICK_US * share;
        }
        if (c->io_left_us <= 0 && c->cpu_left_us <= 0) {
            c->running = 0;
            c->next_us = s->now_us;
            s->done++;
            tb_adapt_sample(s->a, c->started_us, s->now_us);
        }
    }
    cap = tb_adapt_cap(s->a);
    tb_adapt_view(s->a, &view);
    if (getenv("ADAPT_TRACE") && s->now_us % 250000 == 0) {
        tb_adapt_view_t v;

        tb_adapt_view(s->a, &v);
        fprintf(stderr, "t=%.2f cap=%u limit=%.2f floor=%llu last=%llu "
                "peak=%u probing=%d inflight=%d\n", s->now_us / 1e6, cap,
                v.limit, (unsigned long long)v.floor_us,
                (unsigned long long)v.last_us, v.last_peak, v.probing,
                in_flight(s));
    }
    s->changes += s->ticks && cap != s->last_cap;
    /* A probe's window at min is not where the cap settled. */
    if (!view.probing) {
        s->cap_lo = !s->ranged || cap < s->cap_lo ? cap : s->cap_lo;
        s->cap_hi = !s->ranged || cap > s->cap_hi ? cap : s->cap_hi;
        s->ranged = 1;
    }
    s->last_cap = cap;
    s->ticks++;
}

/* Run for ms milliseconds; the phase counters start again. */
static void sim_run(sim_t *s, int ms, int count)
{
    int i;

    if (count) {
        s->done = s->refused = s->cpu_busy_us = s->ticks = 0;
        s->changes = 0;
        s->ranged = 0;
    }
    for (i = 0; i < ms; i++) {
        sim_tick(s);
    }
}

/* 20 s to settle, then 20 s counted. */
static void sim_settle(sim_t *s)
{
    sim_run(s, 20000, 1);
    sim_run(s, 20000, 1);
}

/* Five more seconds in which no client is refused. */
static void assert_serves_all(sim_t *s)
{
    sim_run(s, 5000, 1);
    assert_int_equal(s->refused, 0);
}

/* Within ms milliseconds the cap grows to cap or more, and then serves
 * every client (assert_serves_all()). */
static void assert_grows_to(sim_t *s, int ms, uint32_t cap)
{
    sim_run(s, ms, 1);
    assert_true(tb_adapt_cap(s->a) >= cap);
    assert_serves_all(s);
}

/* The CPUs' busy share over the phase. */
static double busy(const sim_t *s)
{
    return (double)s->cpu_busy_us / ((double)s->ticks * TICK_US * s->cpus);
}

/* A flood of CPU-bound pages on one CPU (25 ms each, 64 clients), as
 * PHP pinned to one CPU, max 64 as a server's 64 workers: the cap comes
 * down to two or three, which keeps the CPU busy, and stays there. */
static void test_adapt_cpu_bound_one_cpu(void **state)
{
    sim_t s;
    tb_adapt_view_t v;

    (void)state;
    sim_start(&s, 1, 64, 64, 1, 0, 25);
    sim_settle(&s);
    assert_true(s.cap_hi <= 3);
    assert_true(s.cap_lo >= 2);
    /* Settled: the cap moved a few times in 20 s (a probe is two). */
    assert_true(s.changes <= 12);
    assert_true(busy(&s) >= 0.95);
    assert_int_equal(tb_adapt_view(s.a, &v), TB_OK);
    assert_true(v.floor_us >= 24000 && v.floor_us <= 30000);
    assert_true(v.downs >= 1);
    assert_true(v.windows > 40);
    sim_free(&s);
}

/* Four CPUs: the cap settles a little above four (1.25 N + 1), never
 * oscillating far, the CPUs kept busy. */
static void test_adapt_cpu_bound_four_cpus(void **state)
{
    sim_t s;

    (void)state;
    sim_start(&s, 1, 64, 64, 4, 2, 20);
    sim_settle(&s);
    assert_true(s.cap_lo >= 4);
    assert_true(s.cap_hi <= 9);
    assert_true(s.cap_hi - s.cap_lo <= 3);
    assert_true(busy(&s) >= 0.9);
    sim_free(&s);
}

/* Requests that mostly wait (1 ms of CPU after 50 ms of I/O): latency
 * does not rise with concurrency, so a cap cut low by bounds grows again
 * once they are raised, until no client is refused. */
static void test_adapt_grows_when_latency_holds(void **state)
{
    sim_t s;

    (void)state;
    sim_start(&s, 1, 4, 32, 1, 50, 1);
    sim_run(&s, 3000, 1);
    assert_true(s.cap_hi <= 4);
    assert_int_equal(tb_adapt_bounds(s.a, 1, 100), TB_OK);
    assert_grows_to(&s, 20000, 32);
    sim_free(&s);
}

/* A flood, then the flood stops and the application's own traffic (32
 * clients waiting on I/O) comes back: the cap that fell under the flood
 * recovers. */
static void test_adapt_recovers_after_flood(void **state)
{
    sim_t s;
    uint32_t low;

    (void)state;
    sim_start(&s, 2, 64, 64, 1, 0, 25);
    sim_run(&s, 20000, 1);
    low = tb_adapt_cap(s.a);
    assert_true(low <= 4);
    /* Clients beyond 32 stop sending: their next time is far away. */
    sim_load(&s, 32, 1, 50, 1);
    assert_grows_to(&s, 30000, 32);
    sim_free(&s);
}

/* Noise: one request in ten takes ten times as long, without load
 * behind it. The cap never collapses towards 1; it stays where the
 * clients need it. */
static void test_adapt_noise_does_not_collapse(void **state)
{
    sim_t s;

    (void)state;
    sim_start(&s, 1, 64, 16, 4, 20, 1);
    s.slow_every = 10;
    sim_run(&s, 5000, 1);
    sim_run(&s, 30000, 1);
    assert_true(s.cap_lo >= 16);
    assert_int_equal(s.refused, 0);
    sim_free(&s);
}

/* Starting under a flood (no floor seen without a queue): the cap binds
 * at max, so the limiter probes at min, learns the floor and comes down;
 * while the probe runs, the cap is min. */
static void test_adapt_probe_from_a_flood(void **state)
{
    sim_t s;
    tb_adapt_view_t v;
    int i, probing = 0;

    (void)state;
    sim_start(&s, 1, 16, 64, 1, 0, 10);
    for (i = 0; i < 3000; i++) {
        sim_tick(&s);
        assert_int_equal(tb_adapt_view(s.a, &v), TB_OK);
        if (v.probing) {
            probing = 1;
            assert_int_equal(tb_adapt_cap(s.a), 1);
        }
    }
    assert_true(probing);
    assert_true(v.probes >= 1);
    assert_true(v.floor_us >= 9000 && v.floor_us <= 15000);
    sim_run(&s, 10000, 1);
    assert_true(tb_adapt_cap(s.a) <= 3);
    sim_free(&s);
}

/* A window in which no place was taken (a cut left more running than
 * the new cap: every sample is from the queue the cut was made for) is
 * not a run at the bottom: the floor stays what was measured without a
 * queue, and the cap keeps coming down. Driven by hand: 8 requests of
 * 50 ms at 2 in flight, then 8 of 900 ms with no take in their window. */
static void test_adapt_drain_keeps_floor(void **state)
{
    guarded_t g;
    tb_adapt_t *a = tb_adapt_init(guarded_new(&g, tb_adapt_size(), 0), 1,
                                  32);
    tb_adapt_view_t v;
    uint64_t now = 1000000;
    int i;

    (void)state;
    assert_non_null(a);
    for (i = 0; i < 8; i++, now += 40000) {
        tb_adapt_taken(a, 2);
        tb_adapt_sample(a, now - 50000, now);
    }
    assert_int_equal(tb_adapt_view(a, &v), TB_OK);
    assert_int_equal(v.windows, 1);
    assert_true(v.floor_us >= 45000 && v.floor_us <= 55000);
    for (i = 0; i < 8; i++, now += 40000) {
        tb_adapt_sample(a, now - 900000, now);
    }
    assert_int_equal(tb_adapt_view(a, &v), TB_OK);
    assert_int_equal(v.windows, 2);
    assert_true(v.last_us >= 800000);
    assert_true(v.floor_us >= 45000 && v.floor_us <= 55000);
    assert_true(tb_adapt_cap(a) < 32);
    guarded_free(&g, "tb_adapt");
}

/* One window closed by hand: 8 requests of lat_us each, 40 ms apart,
 * each taken with peak in flight. */
static void hand_window(tb_adapt_t *a, uint64_t *now, uint64_t lat_us,
                        uint32_t peak)
{
    int i;

    for (i = 0; i < 8; i++, *now += 40000) {
        tb_adapt_taken(a, peak);
        tb_adapt_sample(a, *now - lat_us, *now);
    }
}

/* A reload with the same bounds (a graceful restart) keeps the cap it
 * learnt. The cap lags the estimate (it moves when the estimate passes
 * its next integer by HYSTERESIS), so it is not always the estimate
 * rounded: a floor of about 50 ms, a cut from 32, then a window (8 in
 * flight, the cap not bound: no probe) whose latency nudges the
 * estimate past a half without moving the cap. The cut's and the
 * nudge's latencies are searched for: the histogram's medians come in
 * steps. */
static void test_adapt_bounds_keep_cap(void **state)
{
    uint64_t mem[256], now, cut, lat;
    tb_adapt_t *a = NULL;
    tb_adapt_view_t v;
    uint32_t cap = 0;
    int found = 0;

    (void)state;
    for (cut = 100000; cut < 300000 && !found; cut += 5000) {
        for (lat = 40000; lat < 120000 && !found; lat += 1000) {
            a = tb_adapt_init(mem, 1, 32);
            now = 1000000;
            hand_window(a, &now, 50000, 2);
            hand_window(a, &now, cut, 20);
            hand_window(a, &now, lat, 8);
            assert_int_equal(tb_adapt_view(a, &v), TB_OK);
            cap = tb_adapt_cap(a);
            found = v.windows == 3 && !v.probing && cap > 3
                    && (uint32_t)(v.limit + 0.5) != cap;
        }
    }
    assert_true(found);
    assert_int_equal(tb_adapt_bounds(a, 1, 32), TB_OK);
    assert_int_equal(tb_adapt_cap(a), cap);
    /* New bounds clamp it. */
    assert_int_equal(tb_adapt_bounds(a, 1, cap - 2), TB_OK);
    assert_int_equal(tb_adapt_cap(a), cap - 2);
}

/* Bounds and bad arguments. */
static void test_adapt_bounds(void **state)
{
    sim_t s;
    uint64_t mem[256];             /* 8-byte aligned, as it must be. */
    tb_adapt_view_t v;

    (void)state;
    assert_true(tb_adapt_size() <= sizeof(mem));
    assert_null(tb_adapt_init(NULL, 1, 2));
    assert_null(tb_adapt_init(mem, 0, 2));
    assert_null(tb_adapt_init(mem, 3, 2));
    assert_null(tb_adapt_init(mem, 1, TB_INFLIGHT_MAX + 1));
    assert_int_equal(tb_adapt_cap(NULL), 0);
    memset(mem, 0, sizeof(mem));
    assert_int_equal(tb_adapt_cap((tb_adapt_t *)mem), 0);
    assert_int_equal(tb_adapt_view((tb_adapt_t *)mem, &v), TB_ERR);
    tb_adapt_sample(NULL, 0, 1);
    tb_adapt_taken(NULL, 1);

    sim_new(&s, 2, 10);
    assert_int_equal(tb_adapt_cap(s.a), 10);
    assert_int_equal(tb_adapt_bounds(s.a, 0, 5), TB_ERR);
    assert_int_equal(tb_adapt_bounds(s.a, 6, 5), TB_ERR);
    assert_int_equal(tb_adapt_bounds(s.a, 2, 5), TB_OK);
    assert_int_equal(tb_adapt_cap(s.a), 5);
    assert_int_equal(tb_adapt_bounds(s.a, 7, 9), TB_OK);
    assert_int_equal(tb_adapt_cap(s.a), 7);
    /* A heavy flood cannot take it below min, nor light traffic above
     * max. */
    sim_load(&s, 64, 1, 0, 25);
    sim_run(&s, 20000, 1);
    assert_true(s.cap_lo >= 7 && s.cap_hi <= 9);
    sim_load(&s, 32, 1, 50, 1);
    sim_run(&s, 20000, 1);
    assert_true(s.cap_hi <= 9);
    /* A sample that ends before it began is ignored. */
    tb_adapt_sample(s.a, 10, 5);
    sim_free(&s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_adapt_cpu_bound_one_cpu),
        cmocka_unit_test(test_adapt_cpu_bound_four_cpus),
        cmocka_unit_test(test_adapt_grows_when_latency_holds),
        cmocka_unit_test(test_adapt_recovers_after_flood),
        cmocka_unit_test(test_adapt_noise_does_not_collapse),
        cmocka_unit_test(test_adapt_probe_from_a_flood),
        cmocka_unit_test(test_adapt_drain_keeps_floor),
        cmocka_unit_test(test_adapt_bounds_keep_cap),
        cmocka_unit_test(test_adapt_bounds),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
