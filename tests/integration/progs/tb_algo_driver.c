/* tb_algo_driver.c -- drives the real client (libtb) with one algorithm,
 * for the algorithm integration tests and bench/algo_figures.py.
 *
 *   tb_algo_driver URL ALGO CAPACITY RATE COST DURATION_MS PREFIX KEY
 *                  [--flush-after N] [--max-calls N]
 *
 * Decides KEY as fast as it can for DURATION_MS (and at most --max-calls
 * decisions, default 1,000,000), then prints one line:
 *   allowed=A rejected=R errors=E first_ms=F last_ms=L noscript=N
 * where F and L are CLOCK_REALTIME ms just before the first and after the
 * last decision. With --flush-after N it sends SCRIPT FLUSH on a separate
 * connection after N decisions, so the next one meets NOSCRIPT.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <hiredis/hiredis.h>

#include "tb.h"

static int64_t real_ms(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static int flush_scripts(const char *url)
{
    tb_redis_addr_t a;
    char err[160];
    redisContext *ctx;
    redisReply *r;

    if (tb_url_parse(url, &a, err, sizeof(err)) != TB_OK) {
        return -1;
    }
    ctx = redisConnect(a.host, a.port);
    if (!ctx || ctx->err) {
        return -1;
    }
    r = redisCommand(ctx, "SCRIPT FLUSH");
    if (r) {
        freeReplyObject(r);
    }
    redisFree(ctx);
    return r ? 0 : -1;
}

int main(int argc, char **argv)
{
    tb_options_t o;
    tb_client_t *c;
    tb_take_t take;
    tb_request_t q;
    tb_result_t res;
    tb_algo_t algo;
    char err[256];
    long long allowed = 0, rejected = 0, errors = 0, calls = 0;
    long long flush_after = -1, max_calls = 1000000;
    int64_t first, last, deadline;
    int i;

    if (argc < 9 || tb_algo_parse(argv[2], &algo) != TB_OK) {
        fprintf(stderr, "usage: %s URL ALGO CAPACITY RATE COST DURATION_MS "
                        "PREFIX KEY [--flush-after N] [--max-calls N]\n",
                argv[0]);
        return 2;
    }
    for (i = 9; i + 1 < argc; i += 2) {
        if (strcmp(argv[i], "--flush-after") == 0) {
            flush_after = atoll(argv[i + 1]);
        }
        else if (strcmp(argv[i], "--max-calls") == 0) {
            max_calls = atoll(argv[i + 1]);
        }
    }
    tb_options_init(&o);
    o.url = argv[1];
    o.timeout_ms = 2000;
    o.policy = TB_POLICY_CLOSED;
    c = tb_client_create(&o, err, sizeof(err));
    if (!c) {
        fprintf(stderr, "client: %s\n", err);
        return 1;
    }
    memset(&take, 0, sizeof(take));
    take.limit.capacity = atof(argv[3]);
    take.limit.rate_per_sec = atof(argv[4]);
    take.cost = atof(argv[5]);
    memset(&q, 0, sizeof(q));
    q.prefix = argv[7];
    q.key = argv[8];
    q.key_len = strlen(argv[8]);
    q.takes = &take;
    q.ntakes = 1;
    q.algo = algo;
    first = real_ms();
    deadline = first + atoll(argv[6]);
    do {
        if (calls == flush_after && flush_scripts(argv[1]) != 0) {
            fprintf(stderr, "SCRIPT FLUSH failed\n");
        }
        if (tb_client_run(c, &q, &res) != TB_OK) {
            errors++;
            if (errors == 1) {
                fprintf(stderr, "decide: %s\n", c->errstr);
            }
        }
        else if (res.allowed) {
            allowed++;
        }
        else {
            rejected++;
        }
        calls++;
        last = real_ms();
    } while (last < deadline && calls < max_calls);
    printf("allowed=%lld rejected=%lld errors=%lld first_ms=%lld "
           "last_ms=%lld noscript=%llu\n", allowed, rejected, errors,
           (long long)first, (long long)last,
           (unsigned long long)tb_client_stats(c)->noscript_reloads);
    tb_client_free(c);
    return 0;
}
