/* algo_vectors.h -- reads tests/vectors/<algo>.tsv for the unit tests of
 * the algorithms' C twins (test_gcra.c, test_fwindow.c, test_swindow.c,
 * test_slog.c), and the vector hooks of the twins that keep their state
 * in an array (GCRA and the two windows).
 *
 * Each row is one call; rows of one case run in order on state that starts
 * missing. Columns: case, now_ms, capacity, rate, cost, allowed, remaining,
 * retry_ms, binding, state, and an optional op: "settle" marks a call of
 * the script's settle mode (r->settle; the costs are the differences to
 * settle). Per-bucket values are joined by '|'. The including file defines
 * av_reset() (a new case), av_take() (one call on its twin, refusing with
 * TB_ERR an op it has not) and av_state_ok() (does bucket i's state match
 * the text?), or AV_STATE and AV_TAKE for the array hooks (below).
 * The same rows run against the real scripts in
 * tests/integration/algorithms/test_algo_vectors.py.
 */
#ifndef ALGO_VECTORS_H
#define ALGO_VECTORS_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "tb_int.h"

typedef struct av_row {
    char name[64];
    int64_t now_ms;
    int n;
    int settle;
    tb_limit_t lim[TB_MAX_BUCKETS];
    double cost[TB_MAX_BUCKETS];
    tb_verdict_t want;
    char state[TB_MAX_BUCKETS][4096];
} av_row_t;

static void av_reset(int n);
static int av_take(const av_row_t *r, tb_verdict_t *v);
static int av_state_ok(int i, const char *text);

/* Split s at sep into at most max fields (in place). */
static int av_split(char *s, char sep, char **out, int max)
{
    int n = 0;

    while (n < max) {
        char *e = strchr(s, sep);

        out[n++] = s;
        if (!e) {
            break;
        }
        *e = '\0';
        s = e + 1;
    }
    return n;
}

static int av_parse(char *line, av_row_t *r)
{
    char *f[11], *caps[TB_MAX_BUCKETS], *rates[TB_MAX_BUCKETS];
    char *costs[TB_MAX_BUCKETS], *states[TB_MAX_BUCKETS];
    int i, n, nf;

    line[strcspn(line, "\r\n")] = '\0';
    if (line[0] == '#' || line[0] == '\0') {
        return 0;
    }
    nf = av_split(line, '\t', f, 11);
    if (nf < 10 || (nf == 11 && strcmp(f[10], "settle") != 0)
        || strchr(f[nf - 1], '\t')) {
        return -1;
    }
    r->settle = nf == 11;
    snprintf(r->name, sizeof(r->name), "%s", f[0]);
    r->now_ms = strtoll(f[1], NULL, 10);
    n = av_split(f[2], '|', caps, TB_MAX_BUCKETS);
    if (av_split(f[3], '|', rates, TB_MAX_BUCKETS) != n
        || av_split(f[4], '|', costs, TB_MAX_BUCKETS) != n
        || av_split(f[9], '|', states, TB_MAX_BUCKETS) != n) {
        return -1;
    }
    r->n = n;
    for (i = 0; i < n; i++) {
        r->lim[i].capacity = strtod(caps[i], NULL);
        r->lim[i].rate_per_sec = strtod(rates[i], NULL);
        r->cost[i] = strtod(costs[i], NULL);
        snprintf(r->state[i], sizeof(r->state[i]), "%s", states[i]);
    }
    r->want.allowed = atoi(f[5]);
    r->want.remaining = strtoll(f[6], NULL, 10);
    r->want.retry_ms = strtoll(f[7], NULL, 10);
    r->want.binding = atoi(f[8]);
    return 1;
}

/* Run every row of dir/<file>; returns the number of rows checked and
 * counts mismatches (printed) in *bad. */
static int av_run(const char *file, int *bad)
{
    char path[512], line[16384], last[64] = "";
    const char *dir = getenv("TB_TEST_VECTORS");
    FILE *fp;
    av_row_t r;
    int rows = 0, lineno = 0;

    *bad = 0;
    snprintf(path, sizeof(path), "%s/%s", dir ? dir : "tests/vectors", file);
    fp = fopen(path, "r");
    if (!fp) {
        fprintf(stderr, "cannot open %s\n", path);
        *bad = 1;
        return 0;
    }
    while (fgets(line, sizeof(line), fp) && lineno < 100000) {
        tb_verdict_t v;
        int i, rc;

        lineno++;
        rc = av_parse(line, &r);
        if (rc == 0) {
            continue;
        }
        if (rc > 0 && strcmp(last, r.name) != 0) {
            av_reset(r.n); /* A new case starts with no keys. */
        }
        if (rc < 0 || av_take(&r, &v) != TB_OK) {
            fprintf(stderr, "%s:%d: bad row\n", path, lineno);
            (*bad)++;
            continue;
        }
        rows++;
        if (v.allowed != r.want.allowed || v.remaining != r.want.remaining
            || v.retry_ms != r.want.retry_ms || v.binding != r.want.binding) {
            fprintf(stderr, "%s:%d (%s): got %d %lld %lld %d, want %d %lld "
                    "%lld %d\n", path, lineno, r.name, v.allowed,
                    (long long)v.remaining, (long long)v.retry_ms, v.binding,
                    r.want.allowed, (long long)r.want.remaining,
                    (long long)r.want.retry_ms, r.want.binding);
            (*bad)++;
        }
        for (i = 0; i < r.n; i++) {
            if (!av_state_ok(i, r.state[i])) {
                fprintf(stderr, "%s:%d (%s): bucket %d state, want %s\n",
                        path, lineno, r.name, i, r.state[i]);
                (*bad)++;
            }
        }
        snprintf(last, sizeof(last), "%s", r.name);
    }
    fclose(fp);
    return rows;
}

/* The vector test of a twin: every row of dir/<file> matches, and there
 * are at least min_rows of them. */
static void av_check(const char *file, int min_rows)
{
    int bad, rows = av_run(file, &bad);

    assert_true(rows >= min_rows);
    assert_int_equal(bad, 0);
}

#ifdef AV_TAKE
/* The hooks of a twin that keeps its buckets' states in an array (GCRA,
 * the fixed and the sliding window): the including file defines AV_STATE
 * (the state's type), AV_TAKE (the twin) and, when the script has a
 * settle mode, AV_SETTLE before including this header, then defines
 * av_state_ok() -- unless it defines AV_WINDOW (the two windows), for
 * which av_state_ok() is here. */
static AV_STATE av_st[TB_MAX_BUCKETS];

static void av_reset(int n)
{
    (void)n;
    memset(av_st, 0, sizeof(av_st));
}

static int av_take(const av_row_t *r, tb_verdict_t *v)
{
    if (r->settle) {
#ifdef AV_SETTLE
        return AV_SETTLE(av_st, r->lim, r->cost, r->n, r->now_ms, av_st, v);
#else
        return TB_ERR; /* The script has no settle mode. */
#endif
    }
    return AV_TAKE(av_st, r->lim, r->cost, r->n, r->now_ms, av_st, v);
}

/* One call of the twin on one bucket, which must succeed; returns
 * whether it was allowed. */
static int take1(AV_STATE *st, double cap, double rate, double cost,
                 int64_t now, tb_verdict_t *v)
{
    tb_limit_t l = { cap, rate };

    assert_int_equal(AV_TAKE(st, &l, &cost, 1, now, st, v), TB_OK);
    return v->allowed;
}

#ifdef AV_WINDOW
/* Does window i's state match the text "w,cur,prev" ("-": no key)? The
 * fixed window stores prev 0. */
static int av_state_ok(int i, const char *text)
{
    const tb_window_t *st = &av_st[i];
    double w, cur, prev;

    if (strcmp(text, "-") == 0) {
        return !st->exists;
    }
    return sscanf(text, "%lf,%lf,%lf", &w, &cur, &prev) == 3 && st->exists
           && st->w == w && st->cur == cur && st->prev == prev;
}
#endif /* AV_WINDOW */
#endif /* AV_TAKE */

#endif /* ALGO_VECTORS_H */
