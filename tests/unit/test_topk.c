/* test_topk.c -- unit tests for tb_topk.c, the heavy hitters behind the
 * status page's top keys: Space-Saving sketches per minute in one block
 * of caller memory.
 *
 * The block gets malloc'd memory with guard bytes after it (it must never
 * write past tb_topk_size()), or MAP_SHARED memory used by forked
 * children, as the module's segment is. Time is the now_ms argument.
 * Streams are made by a seeded xorshift, and every
 * count is checked against the true counts kept beside the block: exact
 * below m keys, within the reported bound above.
 */
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "tb.h"
#include "unit_common.h"

#define T0 1699999980000LL      /* A wall-clock ms on a minute boundary. */
#define MIN_MS 60000LL

typedef struct block {
    guarded_t g;
    tb_topk_t *t;
} block_t;

static void block_new(block_t *b, int k, int shared)
{
    size_t size = tb_topk_size(k);

    assert_true(size > 0);
    b->t = tb_topk_init(guarded_new(&b->g, size, shared), k);
    assert_non_null(b->t);
}

static void block_free(block_t *b)
{
    guarded_free(&b->g, "tb_topk");
}

/* A read of one window into freshly allocated rankings of n. */
typedef struct view {
    tb_topk_entry_t ref[TB_TOPK_MAX_K], dec[TB_TOPK_MAX_K];
    tb_topk_result_t res;
} view_t;

static view_t *read_window(tb_topk_t *t, int minutes, int64_t now_ms, int n)
{
    view_t *v = calloc(1, sizeof(*v));
    size_t len = tb_topk_scratch_size(t, minutes);
    tb_topk_query_t q;

    assert_non_null(v);
    assert_true(len > 0);
    memset(&q, 0, sizeof(q));
    q.minutes = minutes;
    q.now_ms = now_ms;
    q.n = n;
    q.by_refusals = v->ref;
    q.by_decisions = v->dec;
    q.scratch = malloc(len);
    assert_non_null(q.scratch);
    memset(q.scratch, 0x5a, len);
    assert_int_equal(tb_topk_read(t, &q, &v->res), TB_OK);
    free(q.scratch);
    return v;
}

static void note_key(tb_topk_t *t, const char *key, int refused,
                     int64_t now_ms)
{
    tb_topk_item_t it;

    memset(&it, 0, sizeof(it));
    it.key = key;
    it.key_len = strlen(key);
    tb_topk_note(t, &it, refused, now_ms);
}

static const tb_topk_entry_t *find_entry(const tb_topk_entry_t *e, int n,
                                         const char *key)
{
    int i;

    for (i = 0; i < n; i++) {
        if (strcmp(e[i].key, key) == 0) {
            return &e[i];
        }
    }
    return NULL;
}

static uint64_t rng_state = 88172645463325252ULL;

static uint64_t rng(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}

/* ---- Tests ------------------------------------------------------------ */

/* Sizes grow with k, bad k is refused, m is max(8k, 64), and an empty
 * block reads as empty. */
static void test_topk_size_and_init(void **state)
{
    block_t b;
    view_t *v;

    (void)state;
    assert_int_equal(tb_topk_size(0), 0);
    assert_int_equal(tb_topk_size(TB_TOPK_MAX_K + 1), 0);
    assert_true(tb_topk_size(20) < tb_topk_size(200));
    assert_null(tb_topk_init(NULL, 20));
    assert_null(tb_topk_init(&b, 0));
    assert_int_equal(tb_topk_k(NULL), 0);
    block_new(&b, 1, 0);
    assert_int_equal(tb_topk_k(b.t), 1);
    assert_int_equal(tb_topk_counters(b.t), 64);
    block_free(&b);
    block_new(&b, 20, 0);
    assert_int_equal(tb_topk_counters(b.t), 160);
    v = read_window(b.t, 15, T0, 20);
    assert_int_equal(v->res.n_refusals, 0);
    assert_int_equal(v->res.n_decisions, 0);
    assert_int_equal(v->res.decisions, 0);
    free(v);
    block_free(&b);
    block_new(&b, TB_TOPK_MAX_K, 0);
    assert_int_equal(tb_topk_counters(b.t), 8 * TB_TOPK_MAX_K);
    block_free(&b);
}

/* Fewer keys than counters: every count is exact, the bounds are 0, and
 * the rankings come out largest first with allowed and refused split. */
static void test_topk_exact_below_m(void **state)
{
    block_t b;
    view_t *v;
    char key[32];
    int i, j;

    (void)state;
    block_new(&b, 20, 0);
    /* Key i: 3i + 1 decisions, i of them refused. */
    for (i = 0; i < 100; i++) {
        snprintf(key, sizeof(key), "key-%03d", i);
        for (j = 0; j < 3 * i + 1; j++) {
            note_key(b.t, key, j < i, T0 + 1000 + j);
        }
    }
    v = read_window(b.t, 1, T0 + 30000, 20);
    assert_int_equal(v->res.decisions_bound, 0);
    assert_int_equal(v->res.refusals_bound, 0);
    assert_int_equal(v->res.n_decisions, 20);
    assert_int_equal(v->res.n_refusals, 20);
    for (i = 0; i < 20; i++) {
        const tb_topk_entry_t *d = &v->dec[i], *r = &v->ref[i];
        int want = 99 - i;

        snprintf(key, sizeof(key), "key-%03d", want);
        assert_string_equal(d->key, key);
        assert_string_equal(d->limit, "default");
        assert_int_equal(d->decisions, 3 * want + 1);
        assert_int_equal(d->decisions_err, 0);
        assert_int_equal(d->allowed, 2 * want + 1);
        assert_int_equal(d->refused, want);
        assert_int_equal(d->refusals, want);
        assert_int_equal(d->refusals_err, 0);
        assert_string_equal(r->key, key);
        assert_int_equal(r->refusals, want);
        assert_int_equal(r->decisions, 3 * want + 1);
        assert_true(r->last_refusal_ms >= T0 + 1000);
    }
    /* key-000 was never refused: it is in no refusal ranking. */
    assert_null(find_entry(v->ref, v->res.n_refusals, "key-000"));
    assert_int_equal(v->res.decisions, 3 * 99 * 100 / 2 + 100);
    assert_int_equal(v->res.refusals, 99 * 100 / 2);
    free(v);
    block_free(&b);
}

/* More keys than counters, in random order: a key's estimate is never
 * below its true count and at most its reported error above it, and that
 * error is at most the window's bound, itself at most N / m. */
static void test_topk_bound_under_eviction(void **state)
{
    enum { KEYS = 2000, N = 40000 };
    static uint32_t truth[KEYS];
    block_t b;
    view_t *v;
    char key[32];
    int i, m;

    (void)state;
    memset(truth, 0, sizeof(truth));
    block_new(&b, 20, 0);
    m = tb_topk_counters(b.t);
    for (i = 0; i < N; i++) {
        /* Half the stream on 40 keys, half spread over all of them. */
        int k = (int)(rng() % 2 ? rng() % 40 : rng() % KEYS);

        snprintf(key, sizeof(key), "e%d", k);
        truth[k]++;
        note_key(b.t, key, 0, T0 + 5000);
    }
    v = read_window(b.t, 1, T0 + 5000, 20);
    assert_int_equal(v->res.decisions, N);
    assert_true(v->res.decisions_bound > 0);
    assert_true(v->res.decisions_bound <= (uint64_t)(N / m));
    assert_int_equal(v->res.n_decisions, 20);
    for (i = 0; i < v->res.n_decisions; i++) {
        const tb_topk_entry_t *e = &v->dec[i];
        int k = atoi(e->key + 1);

        assert_true(e->decisions >= truth[k]);
        assert_true(e->decisions - truth[k] <= e->decisions_err);
        assert_true(e->decisions_err <= v->res.decisions_bound);
        assert_true(e->allowed <= truth[k]);
        /* Every one of the 20 is one of the 40 heavy keys. */
        assert_true(k < 40);
        if (i) {
            assert_true(e->decisions <= v->dec[i - 1].decisions);
        }
    }
    free(v);
    block_free(&b);
}

/* A Zipf-like stream over 10,000 keys, spread over three minutes, some
 * keys refused: the true top 10 by decisions and by refusals all appear
 * in the 15-minute rankings, each count within the bound. */
static void test_topk_zipf_top10(void **state)
{
    enum { KEYS = 10000, N = 120000 };
    static double cdf[KEYS];
    static uint32_t dec[KEYS], ref[KEYS];
    uint32_t order[10];
    block_t b;
    view_t *v;
    double sum = 0;
    char key[32];
    int i, j, w;

    (void)state;
    memset(dec, 0, sizeof(dec));
    memset(ref, 0, sizeof(ref));
    for (i = 0; i < KEYS; i++) {
        sum += 1.0 / (i + 1);
        cdf[i] = sum;
    }
    block_new(&b, 20, 0);
    for (i = 0; i < N; i++) {
        double u = (double)(rng() >> 11) / 9007199254740992.0 * sum;
        int lo = 0, hi = KEYS - 1, refused;

        while (lo < hi) {
            int mid = (lo + hi) / 2;

            if (cdf[mid] < u) {
                lo = mid + 1;
            }
            else {
                hi = mid;
            }
        }
        /* Keys whose rank is a multiple of 3 are refused 3 times in 4,
         * so the refusal ranking differs from the decision one. */
        refused = lo % 3 == 0 && rng() % 4 != 0;
        snprintf(key, sizeof(key), "z%d", lo);
        dec[lo]++;
        ref[lo] += refused;
        note_key(b.t, key, refused, T0 + (int64_t)i * 3 * MIN_MS / N);
    }
    v = read_window(b.t, 15, T0 + 3 * MIN_MS, 20);
    assert_int_equal(v->res.decisions, N);
    for (w = 0; w < 2; w++) {
        const uint32_t *truth = w ? ref : dec;
        const tb_topk_entry_t *got = w ? v->ref : v->dec;
        int n = w ? v->res.n_refusals : v->res.n_decisions;
        uint64_t bound = w ? v->res.refusals_bound : v->res.decisions_bound;

        /* The true top 10 of this ranking. */
        for (j = 0; j < 10; j++) {
            uint32_t best = 0;

            order[j] = KEYS;
            for (i = 0; i < KEYS; i++) {
                int taken = 0, q;

                for (q = 0; q < j; q++) {
                    taken |= order[q] == (uint32_t)i;
                }
                if (!taken && truth[i] > best) {
                    best = truth[i];
                    order[j] = (uint32_t)i;
                }
            }
        }
        for (j = 0; j < 10; j++) {
            const tb_topk_entry_t *e;
            uint64_t est;

            snprintf(key, sizeof(key), "z%u", order[j]);
            e = find_entry(got, n, key);
            assert_non_null(e);
            est = w ? e->refusals : e->decisions;
            assert_true(est >= truth[order[j]]);
            assert_true(est - truth[order[j]] <= bound);
        }
    }
    free(v);
    block_free(&b);
}

/* Windows: the 1-minute window is this minute and the one before, the
 * 15-minute one fifteen before; a slot reused after 16 minutes starts
 * empty; a clock that goes back counts in the newest minute. */
static void test_topk_window_rollover(void **state)
{
    uint64_t want;
    block_t b;
    view_t *v;
    int i;

    (void)state;
    block_new(&b, 4, 0);
    /* Minute i (0..19): key "m<i>" i + 1 times, and "all" once. */
    for (i = 0; i < 20; i++) {
        char key[16];
        int j;

        snprintf(key, sizeof(key), "m%d", i);
        for (j = 0; j <= i; j++) {
            note_key(b.t, key, 1, T0 + i * MIN_MS + 10 * j);
        }
        note_key(b.t, "all", 0, T0 + i * MIN_MS + 59000);
    }
    v = read_window(b.t, 1, T0 + 19 * MIN_MS + 30000, 4);
    assert_int_equal(v->res.n_decisions, 3);
    assert_string_equal(v->dec[0].key, "m19");
    assert_int_equal(v->dec[0].decisions, 20);
    assert_string_equal(v->dec[1].key, "m18");
    assert_string_equal(v->dec[2].key, "all");
    assert_int_equal(v->dec[2].decisions, 2);
    assert_int_equal(v->dec[2].refusals, 0);
    assert_int_equal(v->res.decisions, 20 + 19 + 2);
    free(v);
    /* 15 minutes: minutes 4..19; minute 3 is gone. */
    v = read_window(b.t, 15, T0 + 19 * MIN_MS + 30000, 4);
    assert_string_equal(v->ref[0].key, "m19");
    free(v);
    v = read_window(b.t, 15, T0 + 19 * MIN_MS, 1);
    want = 16;                  /* "all", once in each of 16 minutes. */
    for (i = 4; i <= 19; i++) {
        want += (uint64_t)i + 1;
    }
    assert_int_equal(v->res.decisions, want);
    assert_int_equal(v->res.refusals, want - 16);
    free(v);
    /* Twenty minutes later: minute 39 empties the slot of minute 7, and
     * the window holds nothing older than minute 24. */
    note_key(b.t, "late", 0, T0 + 39 * MIN_MS);
    v = read_window(b.t, 15, T0 + 39 * MIN_MS, 4);
    assert_int_equal(v->res.decisions, 1);
    assert_string_equal(v->dec[0].key, "late");
    free(v);
    /* The clock goes back ten minutes: the note lands in minute 39. */
    note_key(b.t, "late", 1, T0 + 29 * MIN_MS);
    v = read_window(b.t, 1, T0 + 29 * MIN_MS, 4);
    assert_int_equal(v->res.decisions, 2);
    assert_int_equal(v->dec[0].decisions, 2);
    assert_int_equal(v->dec[0].refusals, 1);
    assert_int_equal(v->dec[0].last_refusal_ms, T0 + 29 * MIN_MS);
    free(v);
    block_free(&b);
}

/* Keys are shown as the core stores them: hostile ones hashed, IP keys
 * after "ip:"; key, virtual host and limit together name a counter. */
static void test_topk_hostile_keys(void **state)
{
    static const char nul_key[] = "a\0b";
    char long_key[300], want[TB_KEY_BUF];
    tb_topk_item_t it;
    block_t b;
    view_t *v;

    (void)state;
    block_new(&b, 8, 0);
    memset(long_key, 'x', sizeof(long_key));
    memset(&it, 0, sizeof(it));
    it.key = long_key;
    it.key_len = sizeof(long_key);
    tb_topk_note(b.t, &it, 1, T0);
    it.key = nul_key;
    it.key_len = 3;
    tb_topk_note(b.t, &it, 1, T0);
    tb_topk_note(b.t, &it, 1, T0);
    it.key = "203.0.113.9";
    it.key_len = strlen(it.key);
    it.ip = 1;
    it.vhost = 3;
    it.limit = "export";
    tb_topk_note(b.t, &it, 0, T0);
    it.vhost = 4;
    tb_topk_note(b.t, &it, 0, T0);
    it.limit = NULL;
    tb_topk_note(b.t, &it, 0, T0);
    it.key = NULL;
    it.key_len = 1;
    tb_topk_note(b.t, &it, 0, T0);    /* Refused: no key, a length. */
    tb_topk_note(NULL, &it, 0, T0);
    tb_topk_note(b.t, NULL, 0, T0);
    v = read_window(b.t, 1, T0, 8);
    assert_int_equal(v->res.decisions, 6);
    assert_int_equal(v->res.n_decisions, 5);
    tb_key_sanitize(nul_key, 3, want);
    assert_string_equal(v->dec[0].key, want);
    assert_int_equal(v->dec[0].decisions, 2);
    tb_key_sanitize(long_key, sizeof(long_key), want);
    assert_non_null(find_entry(v->dec, 5, want));
    assert_int_equal(v->res.n_refusals, 2);
    assert_string_equal(v->dec[2].key, "ip:203.0.113.9");
    assert_string_equal(v->dec[2].limit, "default");
    assert_int_equal(v->dec[2].vhost, 4);
    assert_string_equal(v->dec[3].limit, "export");
    assert_int_equal(v->dec[3].vhost, 3);
    assert_string_equal(v->dec[4].limit, "export");
    assert_int_equal(v->dec[4].vhost, 4);
    free(v);
    block_free(&b);
}

/* ---- Concurrency: threads, then processes ----------------------------- */

typedef struct hammer {
    tb_topk_t *t;
    int id;
    int n;
} hammer_t;

/* n notes over 50 keys ("h0".."h49"), every fifth one refused, all in
 * one minute. */
static void *hammer_main(void *arg)
{
    hammer_t *h = arg;
    char key[16];
    int i;

    for (i = 0; i < h->n; i++) {
        snprintf(key, sizeof(key), "h%d", (i + h->id) % 50);
        note_key(h->t, key, i % 5 == 0, T0 + 1000 + i % 50000);
    }
    return NULL;
}

/* hammer_main in nthreads threads at once on t, the k-th with id
 * first + k * step, each making n notes; 0 once all have ended, -1 when
 * one could not be started. */
static int run_hammers(tb_topk_t *t, int nthreads, int first, int step,
                       int n)
{
    hammer_t h[UNIT_MAX_THREADS];
    int k;

    for (k = 0; k < nthreads && k < UNIT_MAX_THREADS; k++) {
        h[k].t = t;
        h[k].id = first + k * step;
        h[k].n = n;
    }
    return unit_threads(nthreads, hammer_main, h, sizeof(h[0]));
}

/* The counts hammer_main made, n notes by each of `workers`. */
static void assert_hammered(tb_topk_t *t, int workers, int n)
{
    view_t *v = read_window(t, 1, T0 + 1000, 20);
    int i;

    assert_int_equal(v->res.decisions, (uint64_t)workers * n);
    assert_int_equal(v->res.refusals, (uint64_t)workers * (n / 5));
    assert_int_equal(v->res.decisions_bound, 0);
    /* 50 keys, 20 shown: every shown one checked. */
    assert_int_equal(v->res.n_decisions, 20);
    for (i = 0; i < v->res.n_decisions; i++) {
        assert_int_equal(v->dec[i].decisions, (uint64_t)workers * n / 50);
        assert_int_equal(v->dec[i].allowed + v->dec[i].refused,
                         v->dec[i].decisions);
    }
    free(v);
}

/* Eight threads at once: no note is lost. */
static void test_topk_threads(void **state)
{
    enum { THREADS = 8, N = 20000 };
    block_t b;

    (void)state;
    block_new(&b, 20, 0);
    assert_int_equal(run_hammers(b.t, THREADS, 0, 50, N), 0);
    assert_hammered(b.t, THREADS, N);
    block_free(&b);
}

/* Forked processes with two threads each, in shared memory, as Apache's
 * children: no note is lost. */
static void test_topk_fork(void **state)
{
    enum { PROCS = 3, N = 20000 };
    pid_t pids[PROCS];
    block_t b;
    int p;

    (void)state;
    block_new(&b, 20, 1);
    for (p = 0; p < PROCS; p++) {
        pids[p] = fork();
        assert_true(pids[p] >= 0);
        if (pids[p] == 0) {
            _exit(run_hammers(b.t, 2, p * 2, 1, N) ? 2 : 0);
        }
    }
    unit_wait_children(pids, PROCS);
    assert_hammered(b.t, PROCS * 2, N);
    block_free(&b);
}

/* A child killed in the middle of its notes may die holding a slot's
 * lock: the next writer or reader gets it (the slot emptied), and the
 * block stays readable and writable. */
static void test_topk_dead_holder(void **state)
{
    volatile uint64_t *progress;
    block_t b;
    int round;

    (void)state;
    block_new(&b, 4, 1);
    progress = mmap(NULL, sizeof(*progress), PROT_READ | PROT_WRITE,
                    MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    assert_true(progress != MAP_FAILED);
    for (round = 0; round < 20; round++) {
        uint64_t want;
        pid_t pid;
        int status;
        view_t *v;

        *progress = 0;
        pid = fork();
        assert_true(pid >= 0);
        if (pid == 0) {
            char key[16];
            uint64_t i;

            for (i = 0;; i++) {
                snprintf(key, sizeof(key), "d%d", (int)(i % 300));
                note_key(b.t, key, (int)(i & 1), T0);
                __atomic_store_n(progress, i + 1, __ATOMIC_RELEASE);
            }
        }
        want = 1000u + 37u * (unsigned)round;
        while (__atomic_load_n(progress, __ATOMIC_ACQUIRE) < want) {
            sched_yield();
        }
        kill(pid, SIGKILL);
        assert_int_equal(waitpid(pid, &status, 0), pid);
        note_key(b.t, "after", 1, T0);
        v = read_window(b.t, 1, T0, 4);
        assert_non_null(find_entry(v->dec, v->res.n_decisions, "after"));
        assert_true(v->res.decisions >= 1);
        free(v);
    }
    munmap((void *)progress, sizeof(*progress));
    block_free(&b);
}

/* Bad queries are refused and write nothing. */
static void test_topk_bad_arguments(void **state)
{
    tb_topk_query_t q;
    tb_topk_result_t res;
    tb_topk_entry_t e[2];
    char scratch[64];
    block_t b;

    (void)state;
    block_new(&b, 2, 0);
    memset(&q, 0, sizeof(q));
    q.minutes = 1;
    q.n = 2;
    q.by_decisions = e;
    assert_int_equal(tb_topk_read(b.t, &q, &res), TB_ERR);  /* scratch */
    q.scratch = scratch;
    q.n = 3;
    assert_int_equal(tb_topk_read(b.t, &q, &res), TB_ERR);  /* n > k */
    q.n = 2;
    q.minutes = TB_TOPK_SLOTS;
    assert_int_equal(tb_topk_read(b.t, &q, &res), TB_ERR);
    q.minutes = 0;
    assert_int_equal(tb_topk_read(b.t, &q, &res), TB_ERR);
    assert_int_equal(tb_topk_read(NULL, &q, &res), TB_ERR);
    assert_int_equal(tb_topk_scratch_size(b.t, 0), 0);
    assert_int_equal(tb_topk_scratch_size(NULL, 1), 0);
    assert_true(tb_topk_scratch_size(b.t, 15) > tb_topk_scratch_size(b.t, 1));
    block_free(&b);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_topk_size_and_init),
        cmocka_unit_test(test_topk_exact_below_m),
        cmocka_unit_test(test_topk_bound_under_eviction),
        cmocka_unit_test(test_topk_zipf_top10),
        cmocka_unit_test(test_topk_window_rollover),
        cmocka_unit_test(test_topk_hostile_keys),
        cmocka_unit_test(test_topk_threads),
        cmocka_unit_test(test_topk_fork),
        cmocka_unit_test(test_topk_dead_holder),
        cmocka_unit_test(test_topk_bad_arguments),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
