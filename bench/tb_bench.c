/* tb_bench.c -- the core alone: N threads calling tb_client_decide().
 *
 *   tb_bench -u URL [-t THREADS] [-n DECISIONS] [-d SECONDS]
 *            [-k one|thread|distinct] [-c CAPACITY] [-r RATE_PER_SEC]
 *            [-w WARMUP_PER_THREAD] [-T TIMEOUT_MS] [-A TLS_CA_FILE]
 *            [-p POOL] [-E auto|script|module]
 *
 * Each thread decides in a loop, for a count or a time, through one shared
 * client whose pool has a connection per thread (-p fewer, to batch as a
 * threaded MPM does); keys are one bucket, one per thread or a new one per
 * decision; the limit is one nothing reaches. It prints one key=value line
 * for bench/run.py. Under callgrind, run -t 1 with
 * --toggle-collect=bench_loop: only the decisions are counted. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "tb.h"

#define MAX_THREADS 512

typedef enum { KEYS_ONE, KEYS_THREAD, KEYS_DISTINCT } key_mode_t;

typedef struct bench {
    tb_client_t *client;
    key_mode_t keys;
    tb_take_t take;
    uint64_t per_thread;        /* Decisions per thread, 0: no bound.  */
    int64_t deadline_us;        /* Monotonic end, 0: no bound.         */
    uint64_t warmup;            /* Unmeasured decisions per thread.    */
    pthread_barrier_t ready;    /* Every thread has warmed up.         */
    pthread_barrier_t start;    /* The deadline is set: go.            */
} bench_t;

typedef struct worker {
    bench_t *b;
    int id;
    pthread_t tid;
    uint64_t done;
    uint64_t allowed;
    uint64_t rejected;
    uint64_t failed;            /* Answered by the policy, not Redis.  */
} worker_t;

static int64_t now_us(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

static size_t make_key(const worker_t *w, uint64_t i, char *buf, size_t len)
{
    int n;

    switch (w->b->keys) {
    case KEYS_ONE:
        n = snprintf(buf, len, "bench");
        break;
    case KEYS_THREAD:
        n = snprintf(buf, len, "bench-t%d", w->id);
        break;
    default:
        n = snprintf(buf, len, "bench-t%d-%llu", w->id,
                     (unsigned long long)i);
        break;
    }
    return n < 0 ? 0 : (size_t)n;
}

static void decide_one(worker_t *w, uint64_t i)
{
    char key[64];
    size_t len = make_key(w, i, key, sizeof(key));
    tb_result_t res;

    if (tb_client_decide(w->b->client, "bench:", key, len, &w->b->take, 1,
                         &res) != TB_OK) {
        w->failed++;
    }
    if (res.allowed) {
        w->allowed++;
    }
    else {
        w->rejected++;
    }
}

/* The measured loop, kept out of line so callgrind can toggle on it.
 * The clock is read every 64 decisions only. */
__attribute__((noinline)) void bench_loop(worker_t *w);
__attribute__((noinline)) void bench_loop(worker_t *w)
{
    bench_t *b = w->b;
    uint64_t i;

    for (i = 0; b->per_thread == 0 || i < b->per_thread; i++) {
        if (b->deadline_us && (i & 63) == 0 && now_us() >= b->deadline_us) {
            break;
        }
        decide_one(w, b->warmup + i);
    }
    w->done = i;
}

static void *run(void *arg)
{
    worker_t *w = arg;
    uint64_t i;

    for (i = 0; i < w->b->warmup; i++) {
        decide_one(w, i);
    }
    w->allowed = w->rejected = w->failed = 0;
    pthread_barrier_wait(&w->b->ready);
    pthread_barrier_wait(&w->b->start);
    bench_loop(w);
    return NULL;
}

static void usage(void)
{
    fprintf(stderr,
            "usage: tb_bench -u URL [-t THREADS] [-n DECISIONS] "
            "[-d SECONDS]\n"
            "                [-k one|thread|distinct] [-c CAPACITY] "
            "[-r RATE_PER_SEC]\n"
            "                [-w WARMUP_PER_THREAD] [-T TIMEOUT_MS] "
            "[-A TLS_CA_FILE] [-p POOL]\n"
            "                [-E auto|script|module]\n");
    exit(2);
}

/* The command line: what to run, into b and o (its url, pool and timeout
 * set at the end), and the threads, count and duration. */
typedef struct args {
    int threads;
    uint64_t total;
    double seconds;
} args_t;

static void parse_args(int argc, char **argv, bench_t *b, tb_options_t *o,
                       args_t *a)
{
    int timeout_ms = 5000, pool = 0, opt, e;

    while ((opt = getopt(argc, argv, "u:t:n:d:k:c:r:w:T:A:p:E:")) != -1) {
        switch (opt) {
        case 'u': o->url = optarg; break;
        case 't': a->threads = atoi(optarg); break;
        case 'n': a->total = strtoull(optarg, NULL, 10); break;
        case 'd': a->seconds = atof(optarg); break;
        case 'k':
            if (strcmp(optarg, "one") == 0) b->keys = KEYS_ONE;
            else if (strcmp(optarg, "thread") == 0) b->keys = KEYS_THREAD;
            else if (strcmp(optarg, "distinct") == 0) b->keys = KEYS_DISTINCT;
            else usage();
            break;
        case 'c': b->take.limit.capacity = atof(optarg); break;
        case 'r': b->take.limit.rate_per_sec = atof(optarg); break;
        case 'w': b->warmup = strtoull(optarg, NULL, 10); break;
        case 'T': timeout_ms = atoi(optarg); break;
        case 'A': o->tls.ca_file = optarg; break;
        case 'p': pool = atoi(optarg); break;
        case 'E':
            /* The engine asked for: callgrind compares the client's cost
             * of a script call with a module call on the same Redis. */
            e = tb_name_index(tb_engine_names, TB_ENGINE_COUNT, optarg, 0);
            if (e < 0) usage();
            o->engine = (tb_engine_t)e;
            break;
        default: usage();
        }
    }
    if (!o->url || a->threads < 1 || a->threads > MAX_THREADS
        || (a->total == 0 && a->seconds <= 0)) {
        usage();
    }
    o->pool_size = pool > 0 ? pool : a->threads;
    /* Generous: on a loaded 2-core machine a 50 ms timeout would turn
     * scheduling delays into policy answers and trip the breaker, and
     * with a load average of 25 one run of 50 threads saw Redis answer
     * later than 1 s. */
    o->timeout_ms = timeout_ms;
    o->breaker_threshold = 1000000;
}

int main(int argc, char **argv)
{
    static worker_t w[MAX_THREADS];
    bench_t b;
    tb_options_t o;
    args_t a = { 1, 0, 0 };
    char err[256];
    int threads, i;
    uint64_t done = 0, allowed = 0, rejected = 0, failed = 0;
    double seconds;
    int64_t t0, t1;

    memset(&b, 0, sizeof(b));
    b.keys = KEYS_ONE;
    b.take.limit.capacity = 1e9;
    b.take.limit.rate_per_sec = 1e9;
    b.take.cost = 1;
    b.warmup = 10;
    tb_options_init(&o);
    o.url = NULL;
    parse_args(argc, argv, &b, &o, &a);
    threads = a.threads;
    seconds = a.seconds;
    b.client = tb_client_create(&o, err, sizeof(err));
    if (!b.client) {
        fprintf(stderr, "tb_bench: %s\n", err);
        return 1;
    }
    b.per_thread = a.total ? (a.total + (uint64_t)threads - 1)
                             / (uint64_t)threads
                           : 0;
    pthread_barrier_init(&b.ready, NULL, (unsigned)threads + 1);
    pthread_barrier_init(&b.start, NULL, (unsigned)threads + 1);
    for (i = 0; i < threads; i++) {
        w[i].b = &b;
        w[i].id = i;
        if (pthread_create(&w[i].tid, NULL, run, &w[i]) != 0) {
            fprintf(stderr, "tb_bench: cannot start thread %d\n", i);
            return 1;
        }
    }
    /* Set the deadline between the two barriers: the second orders the
     * write before every thread's reads, and warm-up is not timed. */
    pthread_barrier_wait(&b.ready);
    t0 = now_us();
    b.deadline_us = seconds > 0 ? t0 + (int64_t)(seconds * 1e6) : 0;
    pthread_barrier_wait(&b.start);
    for (i = 0; i < threads; i++) {
        pthread_join(w[i].tid, NULL);
        done += w[i].done;
        allowed += w[i].allowed;
        rejected += w[i].rejected;
        failed += w[i].failed;
    }
    t1 = now_us();
    printf("threads=%d decisions=%llu seconds=%.3f per_sec=%.0f "
           "allowed=%llu rejected=%llu failed=%llu redis_calls=%llu\n",
           threads, (unsigned long long)done, (t1 - t0) / 1e6,
           done / ((t1 - t0) / 1e6), (unsigned long long)allowed,
           (unsigned long long)rejected, (unsigned long long)failed,
           (unsigned long long)tb_client_stats(b.client)->redis_calls);
    if (failed) {
        fprintf(stderr, "tb_bench: %llu decisions failed; last: %s\n",
                (unsigned long long)failed, b.client->errstr);
    }
    tb_client_free(b.client);
    return failed ? 1 : 0;
}
