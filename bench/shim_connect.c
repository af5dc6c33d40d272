/* shim_connect.c -- the time of one connect(), for the shim benchmark.
 *
 * Listens on 127.0.0.1:PORT itself, then N times: socket(), connect() to
 * that port (timed alone, CLOCK_MONOTONIC around the call), accept() and
 * close both ends. The client end is closed with SO_LINGER 0 (a reset), so
 * no TIME_WAIT piles up and thousands of runs never run out of ephemeral
 * ports. bench/run.py runs it plain and under LD_PRELOAD of the shim with
 * a rule on another port (unmatched) or on this port (matched) and
 * compares the per-call figures. Prints one key=value line:
 * mean_ns, p50_ns, p99_ns over the N calls.
 *
 * Usage: shim_connect PORT N
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

static int64_t now_ns(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static int cmp_i64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;

    return x < y ? -1 : x > y;
}

int main(int argc, char **argv)
{
    struct sockaddr_in sa;
    struct linger lg = { 1, 0 };
    int port, n, i, one = 1, lfd;
    int64_t *t, sum = 0;

    if (argc != 3 || (port = atoi(argv[1])) <= 0 || (n = atoi(argv[2])) <= 0) {
        fprintf(stderr, "usage: shim_connect PORT N\n");
        return 2;
    }
    t = calloc((size_t)n, sizeof(*t));
    memset(&sa, 0, sizeof(sa));
    sa.sin_family = AF_INET;
    sa.sin_port = htons((uint16_t)port);
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    lfd = socket(AF_INET, SOCK_STREAM, 0);
    setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (!t || lfd < 0 || bind(lfd, (struct sockaddr *)&sa, sizeof(sa)) != 0
        || listen(lfd, 128) != 0) {
        perror("shim_connect: listen");
        return 1;
    }
    for (i = 0; i < n; i++) {
        int s = socket(AF_INET, SOCK_STREAM, 0), a;
        int64_t t0, t1;

        if (s < 0) {
            perror("shim_connect: socket");
            return 1;
        }
        t0 = now_ns();
        if (connect(s, (struct sockaddr *)&sa, sizeof(sa)) != 0) {
            perror("shim_connect: connect");
            return 1;
        }
        t1 = now_ns();
        t[i] = t1 - t0;
        sum += t[i];
        a = accept(lfd, NULL, NULL);
        if (a >= 0) {
            close(a);
        }
        setsockopt(s, SOL_SOCKET, SO_LINGER, &lg, sizeof(lg));
        close(s);
    }
    qsort(t, (size_t)n, sizeof(*t), cmp_i64);
    printf("calls=%d mean_ns=%lld p50_ns=%lld p99_ns=%lld\n", n,
           (long long)(sum / n), (long long)t[n / 2],
           (long long)t[(int64_t)n * 99 / 100]);
    free(t);
    close(lfd);
    return 0;
}
