/* connect_loop.c -- what the shim adds to one connect() call.
 *
 *   connect_loop ebadf|cycle PORT N
 *
 * ebadf: N x connect(-1, 127.0.0.1:PORT): the kernel answers EBADF at
 *        once, so the figure is the wrapper's own path (guard, state,
 *        table look-up) plus one trivial system call.
 * cycle: listens on 127.0.0.1:PORT, then N x (socket, connect, accept,
 *        close, close): a whole loopback connection, so a matched rule's
 *        Redis round trip shows against a real connect. The client end is
 *        closed with SO_LINGER 0 so no TIME_WAIT piles up.
 * Run it plain, then under LD_PRELOAD with a config whose rule does not
 * match PORT, then with one that does (capacity and rate high enough that
 * nothing is refused). Prints "mode=.. n=.. ns_per_call=..". (bench/
 * shim_connect.c times the connect() alone, with percentiles.)
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

static long long now_ns(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

int main(int argc, char **argv)
{
    struct sockaddr_in a;
    struct linger lg = {1, 0};
    long long t0, t1;
    int n, i, l = -1, one = 1;

    if (argc != 4) {
        fprintf(stderr, "usage: connect_loop ebadf|cycle PORT N\n");
        return 2;
    }
    n = atoi(argv[3]);
    memset(&a, 0, sizeof(a));
    a.sin_family = AF_INET;
    a.sin_port = htons((unsigned short)atoi(argv[2]));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (strcmp(argv[1], "cycle") == 0) {
        l = socket(AF_INET, SOCK_STREAM, 0);
        setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
        if (bind(l, (struct sockaddr *)&a, sizeof(a)) != 0
            || listen(l, 128) != 0) {
            perror("connect_loop: listen");
            return 1;
        }
    }
    t0 = now_ns();
    for (i = 0; i < n; i++) {
        if (l < 0) {
            (void)connect(-1, (struct sockaddr *)&a, sizeof(a));
        }
        else {
            int s = socket(AF_INET, SOCK_STREAM, 0), c;

            if (connect(s, (struct sockaddr *)&a, sizeof(a)) != 0) {
                perror("connect_loop: connect");
                return 1;
            }
            c = accept(l, NULL, NULL);
            setsockopt(s, SOL_SOCKET, SO_LINGER, &lg, sizeof(lg));
            close(s);
            close(c);
        }
    }
    t1 = now_ns();
    printf("mode=%s n=%d ns_per_call=%.1f\n", argv[1], n,
           (double)(t1 - t0) / n);
    return 0;
}
