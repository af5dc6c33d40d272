/* tb_srv.c -- a small legacy-style TCP/HTTP daemon for the shim tests.
 *
 *   tb_srv [-a ADDR] [-p PORT] [-f] [-H] [-n] [-4] [-R] [-o HOST:PORT]
 *
 * Listens on ADDR:PORT (127.0.0.1:0 by default; "::1" for IPv6), prints
 * "ready <port>" on stdout once listening, then serves until SIGTERM:
 * each accepted connection gets "OK\n" (or, with -H, reads the request and
 * answers "HTTP/1.1 200 OK"), then is closed. -f forks a child per
 * connection; -n uses a non-blocking listener and a poll loop; -4 calls
 * accept4() instead of accept(); -R sets SO_REUSEPORT so two daemons can
 * share one port; -o makes each connection's handler first connect() to
 * HOST:PORT (a downstream) and answer "OK\n" or "DOWN\n" by the outcome.
 * On SIGTERM it prints "served N eagain M" and exits.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

static volatile sig_atomic_t stop;
static long served, eagain;
static int opt_http, opt_fork, opt_nonblock, opt_accept4;
static struct sockaddr_storage down;
static socklen_t downlen;

static void on_term(int sig)
{
    (void)sig;
    stop = 1;
}

static int make_addr(const char *host, int port, struct sockaddr_storage *ss,
                     socklen_t *len)
{
    struct sockaddr_in *in = (struct sockaddr_in *)ss;
    struct sockaddr_in6 *in6 = (struct sockaddr_in6 *)ss;

    memset(ss, 0, sizeof(*ss));
    if (inet_pton(AF_INET, host, &in->sin_addr) == 1) {
        in->sin_family = AF_INET;
        in->sin_port = htons((unsigned short)port);
        *len = sizeof(*in);
        return 0;
    }
    if (inet_pton(AF_INET6, host, &in6->sin6_addr) == 1) {
        in6->sin6_family = AF_INET6;
        in6->sin6_port = htons((unsigned short)port);
        *len = sizeof(*in6);
        return 0;
    }
    return -1;
}

/* Connect to the downstream once; 1 on success. */
static int downstream(void)
{
    int s = socket(down.ss_family, SOCK_STREAM, 0), ok;

    ok = s >= 0 && connect(s, (struct sockaddr *)&down, downlen) == 0;
    if (s >= 0) {
        close(s);
    }
    return ok;
}

static void handle(int c)
{
    char buf[2048];
    const char *reply = "OK\n";
    size_t got = 0;
    ssize_t n;

    if (downlen > 0 && !downstream()) {
        reply = "DOWN\n";
    }
    if (opt_http) {
        struct pollfd p = {c, POLLIN, 0};

        while (got < sizeof(buf) - 1 && poll(&p, 1, 1000) > 0
               && (n = read(c, buf + got, sizeof(buf) - 1 - got)) > 0) {
            got += (size_t)n;
            buf[got] = '\0';
            if (strstr(buf, "\r\n\r\n")) {
                break;
            }
        }
        snprintf(buf, sizeof(buf), "HTTP/1.1 200 OK\r\nContent-Length: %zu"
                 "\r\nConnection: close\r\n\r\n%s", strlen(reply), reply);
        reply = buf;
    }
    if (write(c, reply, strlen(reply)) < 0) {
        /* The client left first: nothing to tell it. */
    }
    close(c);
}

static void serve_one(int c)
{
    pid_t pid;

    served++;
    if (!opt_fork) {
        handle(c);
        return;
    }
    pid = fork();
    if (pid == 0) {
        handle(c);
        _exit(0);
    }
    close(c);
    while (waitpid(-1, NULL, WNOHANG) > 0) {
    }
}

static int do_accept(int l)
{
    struct sockaddr_storage peer;
    socklen_t plen = sizeof(peer);

    return opt_accept4 ? accept4(l, (struct sockaddr *)&peer, &plen, 0)
                       : accept(l, (struct sockaddr *)&peer, &plen);
}

int main(int argc, char **argv)
{
    struct sockaddr_storage ss;
    socklen_t len;
    struct sigaction sa;
    const char *host = "127.0.0.1";
    int port = 0, reuse = 0, one = 1, l, c, o;
    char *colon;

    while ((o = getopt(argc, argv, "a:p:fHn4Ro:")) != -1) {
        switch (o) {
        case 'a': host = optarg; break;
        case 'p': port = atoi(optarg); break;
        case 'f': opt_fork = 1; break;
        case 'H': opt_http = 1; break;
        case 'n': opt_nonblock = 1; break;
        case '4': opt_accept4 = 1; break;
        case 'R': reuse = 1; break;
        case 'o':
            colon = strrchr(optarg, ':');
            if (!colon) {
                return 2;
            }
            *colon = '\0';
            if (make_addr(optarg, atoi(colon + 1), &down, &downlen) != 0) {
                return 2;
            }
            break;
        default:
            fprintf(stderr, "usage: tb_srv [-a ADDR] [-p PORT] [-fHn4R] "
                    "[-o HOST:PORT]\n");
            return 2;
        }
    }
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = on_term;   /* No SA_RESTART: accept() returns EINTR. */
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
    if (make_addr(host, port, &ss, &len) != 0) {
        return 2;
    }
    l = socket(ss.ss_family, SOCK_STREAM, 0);
    setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (reuse) {
        setsockopt(l, SOL_SOCKET, SO_REUSEPORT, &one, sizeof(one));
    }
    if (l < 0 || bind(l, (struct sockaddr *)&ss, len) != 0
        || listen(l, 1024) != 0) {
        perror("tb_srv: listen");
        return 1;
    }
    len = sizeof(ss);
    getsockname(l, (struct sockaddr *)&ss, &len);
    port = ntohs(ss.ss_family == AF_INET
                     ? ((struct sockaddr_in *)&ss)->sin_port
                     : ((struct sockaddr_in6 *)&ss)->sin6_port);
    if (opt_nonblock) {
        fcntl(l, F_SETFL, fcntl(l, F_GETFL) | O_NONBLOCK);
    }
    printf("ready %d\n", port);
    fflush(stdout);
    while (!stop) {
        if (opt_nonblock) {
            struct pollfd p = {l, POLLIN, 0};

            if (poll(&p, 1, 100) <= 0) {
                continue;
            }
            while ((c = do_accept(l)) >= 0) {
                serve_one(c);
            }
            if (errno == EAGAIN || errno == EWOULDBLOCK) {
                eagain++;
            }
            continue;
        }
        c = do_accept(l);
        if (c >= 0) {
            serve_one(c);
        }
    }
    printf("served %ld eagain %ld\n", served, eagain);
    fflush(stdout);
    return 0;
}
