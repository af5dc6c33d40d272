/* tb_cli.c -- a small client for the shim tests: many connect()s, counted.
 *
 *   tb_cli [-t THREADS] [-n] [-r] [-d DELAY_MS] [-T SECONDS] [-F]
 *          [-R REDIS_PORT] HOST PORT N
 *
 * Each of THREADS threads (default 1) makes up to N connections to
 * HOST:PORT, stopping early after SECONDS if -T is given. -n connects on
 * a non-blocking socket (then polls up to 2 s); -r reads the server's
 * reply and classifies it (served "OK", "DOWN" from a server whose own
 * downstream refused, an HTTP 429, or closed without a word); -d sleeps between connections. -F: connect once, fork; the child
 * makes the N connections and reports, then the parent connects once more
 * and reports. -R lists the local ports of our sockets to that Redis port
 * ("redis_ports=..."): a forked child must not share its parent's.
 * "clobbered" counts successful blocking connects that changed errno;
 * "stalled" counts replies (-r) that never came: 2 s without a byte.
 * Prints one summary line per process:
 *   who=main ok=.. fail=.. served=.. r429=.. closed=.. stalled=..
 *   maxlat_us=.. elapsed_ms=.. errs=NAME:count,... redis_ports=...
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MAX_ERRS 8

static struct sockaddr_storage dst;
static socklen_t dstlen;
static int opt_n, opt_r, opt_delay_ms, opt_redis_port, count;
static double opt_secs;
static __thread int errno_clobbered;

typedef struct tally {
    int ok, fail, served, r429, closed, down, clobbered, stalled;
    long long maxlat_us;
    int errnos[MAX_ERRS], errcnt[MAX_ERRS], nerr;
} tally_t;

static long long now_us(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

static void add_err(tally_t *t, int e)
{
    int i;

    for (i = 0; i < t->nerr && t->errnos[i] != e; i++) {
    }
    if (i == t->nerr && t->nerr < MAX_ERRS) {
        t->errnos[t->nerr++] = e;
    }
    if (i < t->nerr) {
        t->errcnt[i]++;
    }
}

static int do_connect(int s)
{
    struct pollfd p;
    int err = 0;
    socklen_t len = sizeof(err);

    if (!opt_n) {
        int rc;

        /* A successful call must leave errno alone (the shim's own work
         * in between must not leak into it). */
        errno = 4242;
        rc = connect(s, (struct sockaddr *)&dst, dstlen);
        if (rc == 0 && errno != 4242) {
            errno_clobbered = 1;
        }
        return rc;
    }
    fcntl(s, F_SETFL, fcntl(s, F_GETFL) | O_NONBLOCK);
    if (connect(s, (struct sockaddr *)&dst, dstlen) == 0) {
        return 0;
    }
    if (errno != EINPROGRESS) {
        return -1;
    }
    p.fd = s;
    p.events = POLLOUT;
    if (poll(&p, 1, 2000) != 1) {
        errno = ETIMEDOUT;
        return -1;
    }
    getsockopt(s, SOL_SOCKET, SO_ERROR, &err, &len);
    if (err) {
        errno = err;
        return -1;
    }
    fcntl(s, F_SETFL, fcntl(s, F_GETFL) & ~O_NONBLOCK);
    return 0;
}

static void classify(int s, tally_t *t)
{
    char buf[256];
    ssize_t n;
    size_t got = 0;
    struct pollfd p = {s, POLLIN, 0};
    int pr = 1;

    (void)send(s, "GET / HTTP/1.1\r\nHost: x\r\n\r\n", 27, MSG_NOSIGNAL);
    while (got < sizeof(buf) - 1 && (pr = poll(&p, 1, 2000)) > 0
           && (n = read(s, buf + got, sizeof(buf) - 1 - got)) > 0) {
        got += (size_t)n;
    }
    buf[got] = '\0';
    if (pr == 0 && got == 0) {
        t->stalled++;
    }
    else if (strstr(buf, "429 Too Many Requests")
             && strstr(buf, "Retry-After:")) {
        t->r429++;
    }
    else if (strstr(buf, "DOWN")) {
        t->down++;
    }
    else if (strstr(buf, "OK")) {
        t->served++;
    }
    else {
        t->closed++;
    }
}

static void one(tally_t *t)
{
    int s = socket(dst.ss_family, SOCK_STREAM, 0);
    long long t0 = now_us(), lat;
    int rc = do_connect(s);

    lat = now_us() - t0;
    if (lat > t->maxlat_us) {
        t->maxlat_us = lat;
    }
    t->clobbered += errno_clobbered;
    errno_clobbered = 0;
    if (rc == 0) {
        t->ok++;
        if (opt_r) {
            classify(s, t);
        }
    }
    else {
        t->fail++;
        add_err(t, errno);
    }
    close(s);
}

static void *run(void *arg)
{
    tally_t *t = arg;
    long long end = now_us() + (long long)(opt_secs * 1e6);
    int i;

    for (i = 0; i < count; i++) {
        if (opt_secs > 0 && now_us() > end) {
            break;
        }
        one(t);
        if (opt_delay_ms > 0) {
            usleep((useconds_t)opt_delay_ms * 1000);
        }
    }
    return NULL;
}

static void merge(tally_t *into, const tally_t *t)
{
    int i, j;

    into->ok += t->ok;
    into->fail += t->fail;
    into->served += t->served;
    into->r429 += t->r429;
    into->closed += t->closed;
    into->down += t->down;
    into->clobbered += t->clobbered;
    into->stalled += t->stalled;
    if (t->maxlat_us > into->maxlat_us) {
        into->maxlat_us = t->maxlat_us;
    }
    for (i = 0; i < t->nerr; i++) {
        for (j = 0; j < t->errcnt[i]; j++) {
            add_err(into, t->errnos[i]);
        }
    }
}

static void report(const char *who, const tally_t *t, long long t0)
{
    char errs[256] = "", ports[256] = "";
    size_t n = 0, m = 0;
    int i, fd;

    for (i = 0; i < t->nerr; i++) {
        n += (size_t)snprintf(errs + n, sizeof(errs) - n, "%s%s:%d",
                              i ? "," : "", strerrorname_np(t->errnos[i]),
                              t->errcnt[i]);
    }
    for (fd = 0; opt_redis_port && fd < 1024 && m < sizeof(ports) - 8; fd++) {
        struct sockaddr_in peer, self;
        socklen_t pl = sizeof(peer), sl = sizeof(self);

        if (getpeername(fd, (struct sockaddr *)&peer, &pl) == 0
            && peer.sin_family == AF_INET
            && ntohs(peer.sin_port) == opt_redis_port
            && getsockname(fd, (struct sockaddr *)&self, &sl) == 0) {
            m += (size_t)snprintf(ports + m, sizeof(ports) - m, "%s%d",
                                  m ? "," : "", ntohs(self.sin_port));
        }
    }
    printf("who=%s ok=%d fail=%d served=%d r429=%d closed=%d down=%d "
           "stalled=%d clobbered=%d maxlat_us=%lld "
           "elapsed_ms=%lld errs=%s redis_ports=%s\n", who, t->ok, t->fail,
           t->served, t->r429, t->closed, t->down, t->stalled, t->clobbered,
           t->maxlat_us, (now_us() - t0) / 1000, errs, ports);
    fflush(stdout);
}

int main(int argc, char **argv)
{
    struct sockaddr_in *in = (struct sockaddr_in *)&dst;
    struct sockaddr_in6 *in6 = (struct sockaddr_in6 *)&dst;
    int threads = 1, forkmode = 0, i, o, port;
    pthread_t tid[64];
    tally_t tl[64], total;
    long long t0 = now_us();

    while ((o = getopt(argc, argv, "t:nrd:T:FR:")) != -1) {
        switch (o) {
        case 't': threads = atoi(optarg); break;
        case 'n': opt_n = 1; break;
        case 'r': opt_r = 1; break;
        case 'd': opt_delay_ms = atoi(optarg); break;
        case 'T': opt_secs = atof(optarg); break;
        case 'F': forkmode = 1; break;
        case 'R': opt_redis_port = atoi(optarg); break;
        default: return 2;
        }
    }
    if (argc - optind != 3 || threads < 1 || threads > 64) {
        fprintf(stderr, "usage: tb_cli [-t T] [-nrF] [-d MS] [-T S] "
                "[-R PORT] HOST PORT N\n");
        return 2;
    }
    port = atoi(argv[optind + 1]);
    count = atoi(argv[optind + 2]);
    memset(&dst, 0, sizeof(dst));
    if (inet_pton(AF_INET, argv[optind], &in->sin_addr) == 1) {
        in->sin_family = AF_INET;
        in->sin_port = htons((unsigned short)port);
        dstlen = sizeof(*in);
    }
    else if (inet_pton(AF_INET6, argv[optind], &in6->sin6_addr) == 1) {
        in6->sin6_family = AF_INET6;
        in6->sin6_port = htons((unsigned short)port);
        dstlen = sizeof(*in6);
    }
    else {
        return 2;
    }
    memset(&total, 0, sizeof(total));
    if (forkmode) {
        pid_t pid;

        one(&total);
        pid = fork();
        if (pid == 0) {
            memset(&total, 0, sizeof(total));
            run(&total);
            report("child", &total, t0);
            _exit(0);
        }
        waitpid(pid, NULL, 0);
        one(&total);
        report("parent", &total, t0);
        return 0;
    }
    memset(tl, 0, sizeof(tl));
    for (i = 0; i < threads; i++) {
        pthread_create(&tid[i], NULL, run, &tl[i]);
    }
    for (i = 0; i < threads; i++) {
        pthread_join(tid[i], NULL);
        merge(&total, &tl[i]);
    }
    report("main", &total, t0);
    return 0;
}
