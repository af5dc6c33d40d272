/* evloop_probe.c -- can a connect() tell that it runs in an event loop?
 *
 *   EVLOOP_PORT=8081 EVLOOP_LOG=/tmp/probe.log \
 *       LD_PRELOAD=build/evloop_probe.so some-client
 *
 * A measuring tool, never loaded by the shim: it wraps connect() and the
 * epoll wait calls of a real program and, at each connect() to
 * EVLOOP_PORT, logs the signals the shim could use to recognise an event
 * loop (the fd already in an epoll set, this thread having waited in
 * epoll, O_NONBLOCK) and what reading them cost. bench/evloop_probe.py
 * runs the clients and tabulates; docs/design.md ("File notes") gives the
 * line format. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <arpa/inet.h>
#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define EXPORT __attribute__((visibility("default")))

typedef int (*connect_fn)(int, const struct sockaddr *, socklen_t);
typedef int (*epoll_wait_fn)(int, struct epoll_event *, int, int);
typedef int (*epoll_pwait_fn)(int, struct epoll_event *, int, int,
                              const sigset_t *);

static __thread int waited_in_epoll;

/* Read once at load: nginx clears the environment of its workers. */
static int want_port = -1;
static char log_path[512];

__attribute__((constructor)) static void probe_init(void)
{
    const char *p = getenv("EVLOOP_PORT"), *l = getenv("EVLOOP_LOG");

    want_port = p != NULL ? atoi(p) : -1;
    snprintf(log_path, sizeof(log_path), "%s", l != NULL ? l : "");
}

static int64_t now_ns(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* 1 when one of "tfd: N" lines of an epoll fd's fdinfo names fd. */
static int epoll_has(const char *fdname, int fd)
{
    char path[320], line[256];
    FILE *f;
    int found = 0, tfd;

    snprintf(path, sizeof(path), "/proc/self/fdinfo/%s", fdname);
    if ((f = fopen(path, "re")) == NULL) {
        return 0;
    }
    while (!found && fgets(line, sizeof(line), f) != NULL) {
        found = sscanf(line, "tfd: %d", &tfd) == 1 && tfd == fd;
    }
    fclose(f);
    return found;
}

/* Scan every fd of the process for epoll instances holding fd. */
static int fd_in_any_epoll(int fd, int *nepoll, int *nfds)
{
    char link[320], target[64];
    struct dirent *e;
    DIR *d = opendir("/proc/self/fd");
    int found = 0;
    ssize_t n;

    *nepoll = *nfds = 0;
    if (d == NULL) {
        return 0;
    }
    while ((e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.') {
            continue;
        }
        (*nfds)++;
        snprintf(link, sizeof(link), "/proc/self/fd/%s", e->d_name);
        n = readlink(link, target, sizeof(target) - 1);
        if (n <= 0) {
            continue;
        }
        target[n] = '\0';
        if (strcmp(target, "anon_inode:[eventpoll]") == 0) {
            (*nepoll)++;
            found |= epoll_has(e->d_name, fd);
        }
    }
    closedir(d);
    return found;
}

static void record(int fd)
{
    char line[256], prog[32];
    int fl = fcntl(fd, F_GETFL), nepoll, nfds, in, out, len;
    int64_t t0 = now_ns(), took;
    size_t i;

    in = fd_in_any_epoll(fd, &nepoll, &nfds);
    took = now_ns() - t0;
    /* nginx rewrites argv[0] as "nginx: worker process". */
    snprintf(prog, sizeof(prog), "%s", program_invocation_short_name);
    for (i = 0; prog[i] != '\0'; i++) {
        prog[i] = prog[i] == ' ' ? '_' : prog[i];
    }
    len = snprintf(line, sizeof(line), "prog=%s pid=%d fd=%d nonblock=%d "
                   "in_epoll=%d epoll_thr=%d epoll_fds=%d fds=%d "
                   "scan_ns=%lld\n", prog,
                   (int)getpid(), fd, fl != -1 && (fl & O_NONBLOCK) != 0,
                   in, waited_in_epoll, nepoll, nfds, (long long)took);
    if (log_path[0] == '\0'
        || (out = open(log_path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC,
                       0666)) < 0) {
        return;
    }
    (void)write(out, line, (size_t)len);
    close(out);
}

static int port_of(const struct sockaddr *sa)
{
    if (sa->sa_family == AF_INET) {
        return ntohs(((const struct sockaddr_in *)sa)->sin_port);
    }
    if (sa->sa_family == AF_INET6) {
        return ntohs(((const struct sockaddr_in6 *)sa)->sin6_port);
    }
    return -1;
}

EXPORT int connect(int fd, const struct sockaddr *sa, socklen_t len)
{
    static connect_fn real;
    int saved = errno;

    if (real == NULL) {
        real = (connect_fn)dlsym(RTLD_NEXT, "connect");
    }
    if (want_port > 0 && sa != NULL && port_of(sa) == want_port) {
        record(fd);
    }
    errno = saved;
    return real(fd, sa, len);
}

EXPORT int epoll_wait(int epfd, struct epoll_event *ev, int max, int ms)
{
    static epoll_wait_fn real;

    if (real == NULL) {
        real = (epoll_wait_fn)dlsym(RTLD_NEXT, "epoll_wait");
    }
    waited_in_epoll = 1;
    return real(epfd, ev, max, ms);
}

EXPORT int epoll_pwait(int epfd, struct epoll_event *ev, int max, int ms,
                       const sigset_t *mask)
{
    static epoll_pwait_fn real;

    if (real == NULL) {
        real = (epoll_pwait_fn)dlsym(RTLD_NEXT, "epoll_pwait");
    }
    waited_in_epoll = 1;
    return real(epfd, ev, max, ms, mask);
}
