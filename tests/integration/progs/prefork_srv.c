/* prefork_srv.c -- a pre-forking TCP daemon that holds its connections,
 * for the shim's local_concurrency tests.
 *
 *   prefork_srv [-p PORT] [-w WORKERS] [-m MAX] [-r]
 *
 * The parent listens on 127.0.0.1:PORT (0: any free port; non-blocking
 * listener, as Apache's prefork uses), forks WORKERS children (default
 * 3), prints "ready <port>" and then only watches them: a child that dies
 * is reaped, its count of open connections set to 0, a new child forked
 * in its place and "respawn <old pid> <new pid>" printed. Each child polls
 * the listener and accepts; it greets each connection with "OK <pid>\n"
 * and keeps it open until the client closes its end or sends "bye" (then
 * the client's next read sees the end only after the child's close); a
 * line "sleep MS" is answered "done\n" after MS milliseconds of the
 * child's time (its other connections wait), as a server that works on
 * a request before it answers. A child holding MAX
 * connections (default 64) stops accepting until one closes, so a test
 * can spread connections over several processes. With -r a child closes
 * its connections with the raw close system call, which no preloaded
 * close() wrapper sees (as a static binary or close_range() would).
 *
 * The children count the connections they hold in memory shared with the
 * parent: after each accept the child adds up every child's count, and
 * the largest sum seen is the peak -- the most connections the program
 * as a whole held at once. On SIGTERM the parent stops the children and
 * prints "served N peak P" (N connections accepted in all).
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
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "progs_listen.h"

#define MAX_WORKERS 16
#define MAX_HELD 256

typedef struct shared {
    long open[MAX_WORKERS];   /* Connections each child holds now.       */
    long peak;                /* Largest sum of open[] seen at an accept.*/
    long served;              /* Connections accepted in all.            */
} shared_t;

static volatile sig_atomic_t stop;
static shared_t *sh;
static int nworkers = 3, max_held = 64, raw_close;
static pid_t workers[MAX_WORKERS];
static pid_t parent;

static void on_term(int sig)
{
    (void)sig;
    stop = 1;
}

/* Count a connection child w accepted; the sum of every child's count is
 * read after its own is raised, so the last of any set of simultaneous
 * holders sees them all. */
static void count_open(int w)
{
    long sum = 0, peak;
    int i;

    __atomic_add_fetch(&sh->open[w], 1, __ATOMIC_SEQ_CST);
    __atomic_add_fetch(&sh->served, 1, __ATOMIC_SEQ_CST);
    for (i = 0; i < nworkers; i++) {
        sum += __atomic_load_n(&sh->open[i], __ATOMIC_SEQ_CST);
    }
    peak = __atomic_load_n(&sh->peak, __ATOMIC_SEQ_CST);
    while (sum > peak
           && !__atomic_compare_exchange_n(&sh->peak, &peak, sum, 0,
                                           __ATOMIC_SEQ_CST,
                                           __ATOMIC_SEQ_CST)) {
    }
}

static void worker(int w, int l)
{
    struct pollfd p[MAX_HELD + 1];
    char buf[256], *sleep_at;
    int held = 0, i, c, n;

    /* A parent killed outright takes its children with it: no test leaves
     * a worker behind. */
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) {
        _exit(0);
    }
    for (;;) {
        p[0].fd = held < max_held ? l : -1;
        p[0].events = POLLIN;
        p[0].revents = 0;
        if (poll(p, (nfds_t)held + 1, 1000) < 0) {
            continue;
        }
        /* Closed connections first, so that the held ones stay packed. */
        for (i = held; i >= 1; i--) {
            if (p[i].revents == 0) {
                continue;
            }
            n = (int)read(p[i].fd, buf, sizeof(buf) - 1);
            buf[n > 0 ? n : 0] = '\0';
            if (n > 0 && (sleep_at = strstr(buf, "sleep ")) != NULL) {
                usleep((useconds_t)atoi(sleep_at + 6) * 1000);
                if (write(p[i].fd, "done\n", 5) < 0) {
                    /* The client left; its close is seen by poll. */
                }
                continue;
            }
            if (n > 0 && !memmem(buf, (size_t)n, "bye", 3)) {
                continue;
            }
            /* Uncounted before the close: the shim gives the place back
             * inside close(), before the real close returns, and another
             * child may accept at once; counting after would see both. */
            __atomic_sub_fetch(&sh->open[w], 1, __ATOMIC_SEQ_CST);
            if (raw_close) {
                syscall(SYS_close, p[i].fd);
            }
            else {
                close(p[i].fd);
            }
            p[i] = p[held--];
        }
        if (p[0].revents == 0) {
            continue;
        }
        while (held < max_held && (c = accept(l, NULL, NULL)) >= 0) {
            count_open(w);
            n = snprintf(buf, sizeof(buf), "OK %ld\n", (long)getpid());
            if (write(c, buf, (size_t)n) < 0) {
                /* The client left first; its close is seen by poll. */
            }
            held++;
            p[held].fd = c;
            p[held].events = POLLIN;
            p[held].revents = 0;
        }
    }
}

/* SIGTERM is blocked across the fork: a child the parent stops before
 * it has run a line must die of it, not run the parent's handler. */
static pid_t spawn(int w, int l)
{
    sigset_t term, old;
    pid_t pid;

    sigemptyset(&term);
    sigaddset(&term, SIGTERM);
    sigprocmask(SIG_BLOCK, &term, &old);
    pid = fork();
    if (pid == 0) {
        signal(SIGTERM, SIG_DFL);
        signal(SIGINT, SIG_DFL);
        sigprocmask(SIG_SETMASK, &old, NULL);
        worker(w, l);
        _exit(0);
    }
    sigprocmask(SIG_SETMASK, &old, NULL);
    return pid;
}

int main(int argc, char **argv)
{
    struct sigaction sa;
    int port = 0, l, o, w, status;
    pid_t pid;

    while ((o = getopt(argc, argv, "p:w:m:r")) != -1) {
        switch (o) {
        case 'p': port = atoi(optarg); break;
        case 'w': nworkers = atoi(optarg); break;
        case 'm': max_held = atoi(optarg); break;
        case 'r': raw_close = 1; break;
        default:
            fprintf(stderr, "usage: prefork_srv [-p PORT] [-w WORKERS] "
                    "[-m MAX] [-r]\n");
            return 2;
        }
    }
    if (nworkers < 1 || nworkers > MAX_WORKERS || max_held < 1
        || max_held > MAX_HELD) {
        fprintf(stderr, "prefork_srv: 1..%d workers, 1..%d held\n",
                MAX_WORKERS, MAX_HELD);
        return 2;
    }
    sh = mmap(NULL, sizeof(*sh), PROT_READ | PROT_WRITE,
              MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (sh == MAP_FAILED) {
        perror("prefork_srv: mmap");
        return 1;
    }
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = on_term;
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
    l = listen_loopback(port, "prefork_srv", &port);
    if (l < 0) {
        return 1;
    }
    fcntl(l, F_SETFL, fcntl(l, F_GETFL) | O_NONBLOCK);
    parent = getpid();
    for (w = 0; w < nworkers; w++) {
        workers[w] = spawn(w, l);
    }
    printf("ready %d\n", port);
    fflush(stdout);
    while (!stop) {
        /* Reaped here, so a dead child's pid is gone (no zombie) by the
         * time the respawn line says so. */
        pid = waitpid(-1, &status, 0);
        if (pid < 0) {
            continue;
        }
        for (w = 0; w < nworkers && workers[w] != pid; w++) {
        }
        if (w == nworkers) {
            continue;
        }
        __atomic_store_n(&sh->open[w], 0, __ATOMIC_SEQ_CST);
        if (stop) {
            workers[w] = 0;
            break;
        }
        workers[w] = spawn(w, l);
        printf("respawn %ld %ld\n", (long)pid, (long)workers[w]);
        fflush(stdout);
    }
    for (w = 0; w < nworkers; w++) {
        if (workers[w] > 0) {
            kill(workers[w], SIGTERM);
        }
    }
    while (waitpid(-1, NULL, 0) > 0 || errno == EINTR) {
    }
    printf("served %ld peak %ld\n", sh->served, sh->peak);
    fflush(stdout);
    return 0;
}
