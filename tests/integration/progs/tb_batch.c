/* tb_batch.c -- many threads on one client, for the tests of the core's
 * batching (tb_pool.c): exact results per caller, bounds under a stopped
 * or killed Redis, no lost waiter, no leaked fd, fork with a batch in
 * flight.
 *
 *   tb_batch [-u URL] [-t TIMEOUT_MS] [-c CONNECT_MS] [-p POOL]
 *            [-P open|closed|local] [-b BREAKER_THRESHOLD] [-x PREFIX]
 *            MODE ARGS...
 *
 * Modes (every output line is "key=value ..."):
 *   rows THREADS
 *       Read decisions from stdin, one per line in tb_driver's take_at
 *       syntax (NOW_MS KEY CAP RATE COST [ROUTE CAP RATE COST]...), and
 *       make them from THREADS threads started together (row i by thread
 *       i % THREADS, in row order). Prints "row=i allowed= remaining=
 *       retry_ms= binding= source=" per row, in row order.
 *   hammer THREADS COUNT one|own CAP RATE COST NOW_MS
 *       Each thread makes COUNT decisions on one shared key or a key of
 *       its own ("k<i>"), with Redis's clock replaced by NOW_MS (>= 0) or
 *       not (-1). Prints "t= seq= allowed= remaining= retry_ms= source="
 *       per decision.
 *   loop THREADS DURATION_MS CAP RATE COST
 *       Each thread decides on its own key until DURATION_MS have passed.
 *       Prints per thread the decisions made, the longest one (us) and
 *       the count by source, then the process's open fds before the
 *       client existed, at the end, and after tb_client_free.
 *   fork THREADS DURATION_MS
 *       loop, and half way through the main thread forks: the child makes
 *       one decision on the inherited client (with other threads' batches
 *       in flight at the fork) and exits 0 if Redis decided it. Prints
 *       the child's exit status.
 * Then the client's counters: "stats calls= batches= connects= errors=
 * breaker_opens= breaker=", and the fds left after tb_client_free.
 */
#include <dirent.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "driver_common.h"
#include "tb.h"

#define MAX_THREADS 256
#define MAX_ROWS 4096

static tb_client_t *client;
static const char *prefix = "B:";
static pthread_barrier_t start;

/* One decision's outcome, as printed. */
typedef struct outcome {
    tb_result_t res;
    int64_t elapsed_us;
} outcome_t;

/* A row of stdin: a decision with an injected clock. */
typedef struct row {
    char key[TB_KEY_RAW_MAX + 1];
    char routes[TB_MAX_BUCKETS][TB_NAME_MAX + 1];
    tb_take_t takes[TB_MAX_BUCKETS];
    int n;
    int64_t now_ms;
    outcome_t out;
} row_t;

static row_t rows[MAX_ROWS];
static int nrows;

typedef struct job {
    int id;
    int threads;
    /* hammer */
    int count;
    int own_key;
    tb_take_t take;
    int64_t now_ms;
    outcome_t *outs;
    /* loop */
    int64_t until_us;
    int64_t made;
    int64_t longest_us;
    int64_t allowed;
    int64_t by_source[5];
} job_t;

static int count_fds(void)
{
    DIR *d = opendir("/proc/self/fd");
    struct dirent *de;
    int n = 0;

    if (!d) {
        return -1;
    }
    while ((de = readdir(d))) {
        n += de->d_name[0] != '.';
    }
    closedir(d);
    return n - 1; /* the directory's own fd */
}

static void decide(const char *key, const tb_take_t *takes, int n,
                   const int64_t *now_ms, outcome_t *o)
{
    tb_request_t q;
    int64_t t0 = tb_clock_monotonic_us();

    request_init(&q, prefix, key, strlen(key), takes, n);
    q.now_ms = now_ms;
    tb_client_run(client, &q, &o->res);
    o->elapsed_us = tb_clock_monotonic_us() - t0;
}

static void *rows_thread(void *arg)
{
    job_t *j = arg;
    int i;

    pthread_barrier_wait(&start);
    for (i = j->id; i < nrows; i += j->threads) {
        decide(rows[i].key, rows[i].takes, rows[i].n, &rows[i].now_ms,
               &rows[i].out);
    }
    return NULL;
}

static void *hammer_thread(void *arg)
{
    job_t *j = arg;
    char key[32];
    int i;

    snprintf(key, sizeof(key), j->own_key ? "k%d" : "one", j->id);
    pthread_barrier_wait(&start);
    for (i = 0; i < j->count; i++) {
        decide(key, &j->take, 1, j->now_ms >= 0 ? &j->now_ms : NULL,
               &j->outs[i]);
    }
    return NULL;
}

static void *loop_thread(void *arg)
{
    job_t *j = arg;
    outcome_t o;
    char key[32];

    snprintf(key, sizeof(key), "loop%d", j->id);
    pthread_barrier_wait(&start);
    while (tb_clock_monotonic_us() < j->until_us) {
        decide(key, &j->take, 1, NULL, &o);
        j->made++;
        j->allowed += o.res.allowed;
        if (o.elapsed_us > j->longest_us) {
            j->longest_us = o.elapsed_us;
        }
        j->by_source[o.res.source]++;
    }
    return NULL;
}

static void print_outcome(const outcome_t *o)
{
    printf("allowed=%d remaining=%lld retry_ms=%lld binding=%d source=%s "
           "err=%s elapsed_us=%lld\n", o->res.allowed,
           (long long)o->res.remaining, (long long)o->res.retry_ms,
           o->res.binding, tb_source_name(o->res.source),
           o->res.err ? tb_err_name(o->res.err) : "none",
           (long long)o->elapsed_us);
}

static int parse_row(char *line, row_t *r)
{
    char *tok[3 + 4 * TB_MAX_BUCKETS], *save = NULL, *t;
    int n = 0, i;

    for (t = strtok_r(line, " \t\n", &save); t && n < (int)(sizeof(tok)
                                                             / sizeof(*tok));
         t = strtok_r(NULL, " \t\n", &save)) {
        tok[n++] = t;
    }
    if (n < 5 || (n - 5) % 4 != 0) {
        return -1;
    }
    r->now_ms = atoll(tok[0]);
    snprintf(r->key, sizeof(r->key), "%s", tok[1]);
    r->n = 1 + (n - 5) / 4;
    for (i = 0; i < r->n; i++) {
        char **f = i == 0 ? tok + 2 : tok + 5 + 4 * (i - 1) + 1;

        memset(&r->takes[i], 0, sizeof(r->takes[i]));
        r->takes[i].limit.capacity = atof(f[0]);
        r->takes[i].limit.rate_per_sec = atof(f[1]);
        r->takes[i].cost = atof(f[2]);
        if (i > 0) {
            snprintf(r->routes[i], sizeof(r->routes[i]), "%s",
                     tok[5 + 4 * (i - 1)]);
            r->takes[i].name = r->routes[i];
            r->takes[i].kind = TB_TAKE_NAMED;
        }
    }
    return 0;
}

static int run_threads(int threads, void *(*fn)(void *), job_t *jobs)
{
    pthread_t tid[MAX_THREADS];
    int i;

    pthread_barrier_init(&start, NULL, (unsigned)threads);
    for (i = 0; i < threads; i++) {
        jobs[i].id = i;
        jobs[i].threads = threads;
        if (pthread_create(&tid[i], NULL, fn, &jobs[i]) != 0) {
            fprintf(stderr, "pthread_create failed\n");
            exit(2);
        }
    }
    for (i = 0; i < threads; i++) {
        pthread_join(tid[i], NULL);
    }
    pthread_barrier_destroy(&start);
    return 0;
}

static void usage(void)
{
    fprintf(stderr, "usage: tb_batch [-u URL] [-t MS] [-c MS] [-p POOL] "
                    "[-P POLICY] [-x PREFIX] rows|hammer|loop|fork ...\n");
    exit(2);
}

int main(int argc, char **argv)
{
    static job_t jobs[MAX_THREADS];
    tb_options_t o;
    char err[TB_ERRSTR_LEN], line[4096];
    const tb_stats_t *s;
    int opt, threads, i, k, fds0, status = -1;

    tb_options_init(&o);
    o.pool_size = 2;
    /* A generous breaker unless told: the tests count policy answers
     * themselves. */
    o.breaker_threshold = 1000000;
    while ((opt = getopt(argc, argv, "u:t:c:p:P:b:x:")) != -1) {
        if (opt == 'x') {
            prefix = optarg;
        }
        else if (client_option(&o, opt, optarg) != 1) {
            usage();
        }
    }
    if (argc - optind < 2) {
        usage();
    }
    threads = atoi(argv[optind + 1]);
    if (threads < 1 || threads > MAX_THREADS) {
        usage();
    }
    fds0 = count_fds();
    client = tb_client_create(&o, err, sizeof(err));
    if (!client) {
        fprintf(stderr, "client: %s\n", err);
        return 2;
    }
    if (strcmp(argv[optind], "rows") == 0) {
        while (nrows < MAX_ROWS && fgets(line, sizeof(line), stdin)) {
            if (parse_row(line, &rows[nrows]) == 0) {
                nrows++;
            }
        }
        run_threads(threads, rows_thread, jobs);
        for (i = 0; i < nrows; i++) {
            printf("row=%d ", i);
            print_outcome(&rows[i].out);
        }
    }
    else if (strcmp(argv[optind], "hammer") == 0 && argc - optind == 8) {
        for (i = 0; i < threads; i++) {
            jobs[i].count = atoi(argv[optind + 2]);
            jobs[i].own_key = strcmp(argv[optind + 3], "own") == 0;
            jobs[i].take.limit.capacity = atof(argv[optind + 4]);
            jobs[i].take.limit.rate_per_sec = atof(argv[optind + 5]);
            jobs[i].take.cost = atof(argv[optind + 6]);
            jobs[i].now_ms = atoll(argv[optind + 7]);
            jobs[i].outs = calloc((size_t)jobs[i].count, sizeof(outcome_t));
        }
        run_threads(threads, hammer_thread, jobs);
        for (i = 0; i < threads; i++) {
            for (k = 0; k < jobs[i].count; k++) {
                printf("t=%d seq=%d ", i, k);
                print_outcome(&jobs[i].outs[k]);
            }
            free(jobs[i].outs);
        }
    }
    else if ((strcmp(argv[optind], "loop") == 0 && argc - optind == 6)
             || (strcmp(argv[optind], "fork") == 0
                 && argc - optind == 3)) {
        int forking = argv[optind][0] == 'f';
        int64_t dur_us = atoll(argv[optind + 2]) * 1000;
        pthread_t tid[MAX_THREADS];

        for (i = 0; i < threads; i++) {
            jobs[i].id = i;
            jobs[i].threads = threads;
            jobs[i].until_us = tb_clock_monotonic_us() + dur_us;
            jobs[i].take.limit.capacity = forking ? 1e9
                                                  : atof(argv[optind + 3]);
            jobs[i].take.limit.rate_per_sec = forking
                ? 1e9 : atof(argv[optind + 4]);
            jobs[i].take.cost = forking ? 1 : atof(argv[optind + 5]);
        }
        pthread_barrier_init(&start, NULL, (unsigned)threads + 1);
        for (i = 0; i < threads; i++) {
            pthread_create(&tid[i], NULL, loop_thread, &jobs[i]);
        }
        pthread_barrier_wait(&start);
        if (forking) {
            pid_t pid;

            usleep((useconds_t)(dur_us / 2));
            pid = fork();
            if (pid == 0) {
                outcome_t oc;
                tb_take_t t;

                memset(&t, 0, sizeof(t));
                t.limit.capacity = 1e9;
                t.limit.rate_per_sec = 1e9;
                t.cost = 1;
                decide("child", &t, 1, NULL, &oc);
                _exit(oc.res.source == TB_SRC_REDIS ? 0 : 1);
            }
            waitpid(pid, &status, 0);
            printf("child_exit=%d\n",
                   WIFEXITED(status) ? WEXITSTATUS(status) : 128);
        }
        for (i = 0; i < threads; i++) {
            pthread_join(tid[i], NULL);
            printf("t=%d made=%lld allowed=%lld longest_us=%lld redis=%lld "
                   "open=%lld closed=%lld local=%lld\n", i,
                   (long long)jobs[i].made, (long long)jobs[i].allowed,
                   (long long)jobs[i].longest_us,
                   (long long)jobs[i].by_source[TB_SRC_REDIS],
                   (long long)jobs[i].by_source[TB_SRC_OPEN],
                   (long long)jobs[i].by_source[TB_SRC_CLOSED],
                   (long long)jobs[i].by_source[TB_SRC_LOCAL]);
        }
        pthread_barrier_destroy(&start);
        printf("fds_before=%d fds_end=%d\n", fds0, count_fds());
    }
    else {
        usage();
    }
    s = tb_client_stats(client);
    printf("stats calls=%llu batches=%llu connects=%llu errors=%llu "
           "breaker_opens=%llu breaker=%s\n",
           (unsigned long long)tb_stats_get(&s->redis_calls),
           (unsigned long long)tb_stats_get(&s->batches),
           (unsigned long long)tb_stats_get(&s->connects),
           (unsigned long long)tb_stats_get(&s->redis_errors),
           (unsigned long long)tb_stats_get(&s->breaker_opens),
           tb_breaker_state_name(tb_client_breaker_state(client)));
    tb_client_free(client);
    printf("fds_after_free=%d\n", count_fds());
    return 0;
}
