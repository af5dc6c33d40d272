/* test_coalesce.c -- unit tests for tb_coalesce.c's process, with real
 * unix sockets and no Redis.
 *
 * A coalescer runs in a forked child. With Redis unreachable it answers
 * each command with an error reply at once, in order, so a client stays
 * in step; a denied command closes the client; and with its descriptors
 * used up it does not spin on a listener it cannot accept from (its CPU
 * time stays low while connections wait), and serves again once they
 * are gone. SIGTERM ends it with no client left.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include <signal.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tb.h"

static volatile sig_atomic_t stop_flag;

static void on_term(int sig)
{
    (void)sig;
    stop_flag = 1;
}

/* Fork a coalescer on path (Redis at a port nothing listens on) with at
 * most nofile descriptors (0: as inherited). Its pid. */
static pid_t start(const char *path, rlim_t nofile)
{
    pid_t pid = fork();

    assert_true(pid >= 0);
    if (pid == 0) {
        tb_coalescer_options_t o;
        tb_coalescer_t *c;
        struct rlimit rl = { nofile, nofile };
        char err[256];

        memset(&o, 0, sizeof(o));
        o.url = "redis://127.0.0.1:1";
        o.path = path;
        o.timeout_ms = 200;
        signal(SIGTERM, on_term);
        if (!(c = tb_coalescer_create(&o, err, sizeof(err)))) {
            _exit(2);
        }
        if (nofile && setrlimit(RLIMIT_NOFILE, &rl) != 0) {
            _exit(3);
        }
        _exit(tb_coalescer_run(c, &stop_flag, 1000) == TB_OK ? 0 : 1);
    }
    return pid;
}

static int dial(const char *path)
{
    struct sockaddr_un sun;
    int fd, i;

    memset(&sun, 0, sizeof(sun));
    sun.sun_family = AF_UNIX;
    snprintf(sun.sun_path, sizeof(sun.sun_path), "%s", path);
    for (i = 0; i < 200; i++) {
        fd = socket(AF_UNIX, SOCK_STREAM, 0);
        if (fd >= 0 && connect(fd, (struct sockaddr *)&sun, sizeof(sun)) == 0) {
            struct timeval tv = { 5, 0 };

            setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
            return fd;
        }
        close(fd);
        usleep(10000);
    }
    fail_msg("cannot connect to %s", path);
    return -1;
}

/* What the peer sends until len bytes, EOF or its timeout (5 s). */
static size_t read_all(int fd, char *buf, size_t len)
{
    size_t got = 0;
    ssize_t n;

    while (got < len && (n = recv(fd, buf + got, len - got, 0)) > 0) {
        got += (size_t)n;
    }
    return got;
}

/* n whole lines ("\r\n"-ended) into buf (NUL-terminated): their bytes. */
static size_t read_lines(int fd, char *buf, size_t len, int n)
{
    size_t got = 0;
    ssize_t k;
    int seen = 0;

    while (seen < n && got + 1 < len
           && (k = recv(fd, buf + got, 1, 0)) == 1) {
        seen += got > 0 && buf[got - 1] == '\r' && buf[got] == '\n';
        got++;
    }
    buf[got] = '\0';
    return got;
}

/* SIGTERM, and the exit waited for 5 s at most (then SIGKILL, and the
 * test fails): no coalescer outlives its test. */
static void stop(pid_t pid)
{
    int status = 0, i;
    pid_t got = 0;

    assert_int_equal(kill(pid, SIGTERM), 0);
    for (i = 0; i < 500 && got == 0; i++) {
        got = waitpid(pid, &status, WNOHANG);
        if (got == 0) {
            usleep(10000);
        }
    }
    if (got == 0) {
        kill(pid, SIGKILL);
        waitpid(pid, &status, 0);
        fail_msg("the coalescer did not stop on SIGTERM");
    }
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
}

static double cpu_s(pid_t pid)
{
    char path[64], buf[1024], *p;
    unsigned long ut = 0, st = 0;
    FILE *f;
    int i;

    snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
    f = fopen(path, "r");
    assert_non_null(f);
    assert_non_null(fgets(buf, sizeof(buf), f));
    fclose(f);
    p = strrchr(buf, ')');
    for (i = 0; p && i < 12; i++) {
        p = strchr(p + 1, ' ');
    }
    assert_non_null(p);
    assert_int_equal(sscanf(p, " %lu %lu", &ut, &st), 2);
    return (double)(ut + st) / (double)sysconf(_SC_CLK_TCK);
}

static void tmp_path(char *out, size_t len)
{
    snprintf(out, len, "/tmp/tbcoal-%d.sock", (int)getpid());
}

/* Redis away: two pipelined commands get two error replies, in order;
 * a denied command closes the client. */
static void test_coalesce_errors_in_order(void **unused)
{
    static const char two[] = "*1\r\n$4\r\nPING\r\n*1\r\n$4\r\nPING\r\n";
    static const char sel[] = "*2\r\n$6\r\nSELECT\r\n$1\r\n1\r\n";
    char path[64], buf[512];
    size_t got;
    pid_t pid;
    int fd;

    (void)unused;
    tmp_path(path, sizeof(path));
    pid = start(path, 0);
    fd = dial(path);
    assert_int_equal(send(fd, two, sizeof(two) - 1, 0), sizeof(two) - 1);
    got = read_lines(fd, buf, sizeof(buf), 2);
    assert_true(got > 32);
    assert_memory_equal(buf, "-ERR coalescer: ", 16);
    assert_memory_equal(strstr(buf, "\r\n") + 2, "-ERR coalescer: ", 16);
    assert_memory_equal(buf + got - 2, "\r\n", 2);
    close(fd);
    fd = dial(path);
    assert_int_equal(send(fd, sel, sizeof(sel) - 1, 0), sizeof(sel) - 1);
    assert_int_equal(read_all(fd, buf, sizeof(buf)), 0);
    close(fd);
    stop(pid);
}

/* Out of descriptors with connections waiting: no spin; then it serves
 * again. */
static void test_coalesce_no_spin_without_fds(void **unused)
{
    static const char ping[] = "*1\r\n$4\r\nPING\r\n";
    char path[64], buf[256];
    int fds[24], i, fd;
    double before, spent;
    pid_t pid;

    (void)unused;
    tmp_path(path, sizeof(path));
    pid = start(path, 12);
    for (i = 0; i < 24; i++) {
        fds[i] = dial(path);
    }
    usleep(300000);
    before = cpu_s(pid);
    sleep(2);
    spent = cpu_s(pid) - before;
    for (i = 0; i < 24; i++) {
        close(fds[i]);
    }
    usleep(500000);
    fd = dial(path);
    assert_int_equal(send(fd, ping, sizeof(ping) - 1, 0), sizeof(ping) - 1);
    assert_true(read_lines(fd, buf, sizeof(buf), 1) > 16);
    assert_memory_equal(buf, "-ERR coalescer: ", 16);
    close(fd);
    stop(pid);
    /* A loop spinning on its listener takes a whole CPU: 2 s here. */
    assert_true(spent < 0.5);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_coalesce_errors_in_order),
        cmocka_unit_test(test_coalesce_no_spin_without_fds),
    };

    signal(SIGPIPE, SIG_IGN);
    return cmocka_run_group_tests(tests, NULL, NULL);
}
