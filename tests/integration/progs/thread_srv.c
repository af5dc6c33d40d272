/* thread_srv.c -- a threaded HTTP daemon for the shim tests: one thread
 * accepts, each connection is served by a thread of its own.
 *
 *   thread_srv [-p PORT]
 *
 * Listens on 127.0.0.1:PORT (0: any free port), prints "ready <port>" on
 * stdout, then accepts with a blocking accept() until SIGTERM. Each
 * connection's thread answers every request (up to a blank line) with
 * "HTTP/1.1 200 OK" and a Content-Length, keeps the connection open for
 * the next request, and closes it when the client closes its end or
 * after answering a request that says "Connection: close". So the
 * accepting thread decides on a client's next connection while another
 * thread may not have closed its last one yet, the case the shim's
 * release of slots and places must handle. On SIGTERM it prints "served
 * N" (connections accepted) and exits through exit(), so the shim's exit
 * handlers run.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

#include "progs_listen.h"

static volatile sig_atomic_t stop;

static void on_term(int sig)
{
    (void)sig;
    stop = 1;
}

/* Answer each whole request at the start of buf (*got bytes); what is
 * left moves to the front. 1 when one said "Connection: close". */
static int answer(int c, char *buf, size_t *got)
{
    static const char ok[] = "HTTP/1.1 200 OK\r\nContent-Length: 3\r\n"
                             "\r\nok\n";
    static const char bye[] = "HTTP/1.1 200 OK\r\nContent-Length: 3\r\n"
                              "Connection: close\r\n\r\nok\n";
    char *end;

    buf[*got] = '\0';
    while ((end = strstr(buf, "\r\n\r\n")) != NULL) {
        int close_it;

        *end = '\0';
        close_it = strcasestr(buf, "connection: close") != NULL;
        if (send(c, close_it ? bye : ok, close_it ? sizeof(bye) - 1
                                                  : sizeof(ok) - 1,
                 MSG_NOSIGNAL) < 0 || close_it) {
            return 1;
        }
        *got -= (size_t)(end + 4 - buf);
        memmove(buf, end + 4, *got + 1);
    }
    return 0;
}

static void *serve(void *arg)
{
    int c = (int)(long)arg;
    char buf[4096];
    size_t got = 0;
    ssize_t n;

    while ((n = recv(c, buf + got, sizeof(buf) - 1 - got, 0)) > 0) {
        got += (size_t)n;
        if (answer(c, buf, &got) || got == sizeof(buf) - 1) {
            break;
        }
    }
    close(c);
    return NULL;
}

int main(int argc, char **argv)
{
    struct sigaction sa;
    sigset_t term;
    pthread_attr_t attr;
    pthread_t t;
    long served = 0;
    int port = 0, l, o;

    while ((o = getopt(argc, argv, "p:")) != -1) {
        if (o != 'p') {
            fprintf(stderr, "usage: thread_srv [-p PORT]\n");
            return 2;
        }
        port = atoi(optarg);
    }
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = on_term;   /* No SA_RESTART: accept() returns EINTR. */
    sigaction(SIGTERM, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
    l = listen_loopback(port, "thread_srv", &port);
    if (l < 0) {
        return 1;
    }
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    /* SIGTERM is the accepting thread's: the serving threads are made
     * with it blocked, so that it interrupts accept(). */
    sigemptyset(&term);
    sigaddset(&term, SIGTERM);
    printf("ready %d\n", port);
    fflush(stdout);
    while (!stop) {
        int c = accept(l, NULL, NULL);

        if (c < 0) {
            continue;
        }
        served++;
        pthread_sigmask(SIG_BLOCK, &term, NULL);
        if (pthread_create(&t, &attr, serve, (void *)(long)c) != 0) {
            close(c);
        }
        pthread_sigmask(SIG_UNBLOCK, &term, NULL);
    }
    printf("served %ld\n", served);
    fflush(stdout);
    exit(0);
}
