/* tb_conn.c -- one Redis connection: a socket that the core owns,
 * bounded by deadlines, with hiredis's reader parsing the replies, in
 * plaintext or over TLS.
 *
 * Every step is bounded by a deadline on the monotonic clock: the connect
 * (the host name's lookup, tb_resolve.c, then all its addresses in turn,
 * within one connect deadline), each write and each read. Nothing here
 * blocks past the deadline it is given (give or take the kernel's timer
 * slack), and nothing retries: a connection that saw an I/O error or a
 * timeout is in error for good and its owner frees it (a timed-out
 * command may still run on the server and answer later).
 *
 * The connect waits in poll(2) on a non-blocking socket. The socket is
 * then made blocking (plaintext and TLS alike): writes pass MSG_DONTWAIT
 * and wait in poll(2) only when the socket buffer is full, and a read,
 * which always waits a round trip, is one blocking recv(2) bounded by
 * SO_RCVTIMEO rather than poll(2) and then recv(2): one system call per
 * reply instead of two. SO_RCVTIMEO is set again only when the time left
 * differs from it by more than RCVTIMEO_SLACK_US, so a steady stream of
 * commands with the same timeout sets it once.
 *
 * hiredis is used only where it is best, parsing replies (redisReader);
 * commands are encoded by tb_resp.c into a buffer of the caller's, and
 * written with send(MSG_NOSIGNAL), so a dead Redis cannot raise SIGPIPE in
 * the host. Sockets are close-on-exec, and the connection remembers the
 * device and inode of its socket, so that a host that closed the fd and
 * reused its number (daemons do) is detected before we write to it.
 *
 * TLS (tb_tls.c) has its own write loop over the same poll-with-deadline
 * and shares the read loop, taken on one test of c->ssl, so the plaintext
 * path does no more than it did. The handshake follows the connect within
 * the connect deadline. A TLS read blocks in recv(2) under the same
 * SO_RCVTIMEO (SSL_read returns bytes it already holds without a system
 * call); should the session need to write first, the reader waits for
 * POLLOUT and reads again. Measured (make bench, part tls, TLS over
 * plaintext decisions/s): one thread 0.836 -> 0.859, 50 threads on 4
 * connections 0.944 -> 0.963 with the blocking read.
 */
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

#include "redis/tb_redis_int.h"

/* Bytes read from the socket at a time; as hiredis's redisBufferRead. */
#define READ_CHUNK 16384

/* How far a read's SO_RCVTIMEO may stray from the time left before it is
 * set again: below the kernel's timer granularity on most systems. */
#define RCVTIMEO_SLACK_US 2000

/* ---- Replies ---------------------------------------------------------
 *
 * The reader builds hiredis's redisReply trees, laid out to cost one
 * allocation per array rather than one per element: an array's block
 * holds the array, its element pointers and its elements, so a script's
 * reply of four or five integers is one malloc and one free (hiredis's
 * own functions made six callocs, a fifth of a decision's instructions).
 * Strings and nested arrays' elements have blocks of their own. Such a
 * tree must be freed with tb__reply_free(), never freeReplyObject().
 */

/* The reply for task: the parent's slot for an element, else a block of
 * its own with room for `extra` bytes after it. */
static redisReply *new_reply(const redisReadTask *task, int type,
                             size_t extra)
{
    redisReply *r;

    if (task->parent) {
        redisReply *parent = task->parent->obj;

        r = (redisReply *)(parent->element + parent->elements) + task->idx;
        parent->element[task->idx] = r;
    }
    else if (!(r = malloc(sizeof(*r) + extra))) {
        return NULL;
    }
    r->type = type;
    r->integer = 0;
    r->len = 0;
    r->str = NULL;
    r->elements = 0;
    r->element = NULL;
    return r;
}

static void *create_string(const redisReadTask *task, char *str, size_t len)
{
    char *s = malloc(len + 1);
    redisReply *r;

    if (!s || !(r = new_reply(task, task->type, 0))) {
        free(s);
        return NULL;
    }
    memcpy(s, str, len);
    s[len] = '\0';
    r->str = s;
    r->len = len;
    return r;
}

static void *create_array(const redisReadTask *task, int elements)
{
    size_t n = elements > 0 ? (size_t)elements : 0;
    size_t room = n * (sizeof(redisReply *) + sizeof(redisReply));
    redisReply **el = NULL;
    redisReply *r;

    if (task->parent && n) {
        /* An element's struct is in its parent's block: its own elements
         * get a block of their own. */
        if (!(el = malloc(room))) {
            return NULL;
        }
    }
    if (!(r = new_reply(task, REDIS_REPLY_ARRAY, task->parent ? 0 : room))) {
        free(el);
        return NULL;
    }
    r->elements = n;
    r->element = n ? (task->parent ? el : (redisReply **)(r + 1)) : NULL;
    if (n) {
        memset(r->element, 0, n * sizeof(redisReply *));
    }
    return r;
}

static void *create_integer(const redisReadTask *task, long long value)
{
    redisReply *r = new_reply(task, REDIS_REPLY_INTEGER, 0);

    if (r) {
        r->integer = value;
    }
    return r;
}

static void *create_nil(const redisReadTask *task)
{
    return new_reply(task, REDIS_REPLY_NIL, 0);
}

/* Free what r owns; top: r is a block of its own. */
static void release(redisReply *r, int top)
{
    size_t i;

    if (r->type == REDIS_REPLY_ARRAY) {
        for (i = 0; i < r->elements; i++) {
            if (r->element[i]) {
                release(r->element[i], 0);
            }
        }
        if (!top) {
            free(r->element);
        }
    }
    else {
        free(r->str);
    }
    if (top) {
        free(r);
    }
}

void tb__reply_free(void *reply)
{
    if (reply) {
        release(reply, 1);
    }
}

static redisReplyObjectFunctions reply_functions = {
    create_string, create_array, create_integer, create_nil,
    tb__reply_free
};

struct tb__conn {
    int fd;
    dev_t dev;              /* Which socket fd was when we opened it. */
    ino_t ino;
    redisReader *reader;
    tb__buf_t out;          /* Scratch for tb__conn_command().        */
    struct ssl_st *ssl;     /* The TLS session, or NULL: plaintext.   */
    tb_monotime_us rcvtimeo; /* SO_RCVTIMEO now set (us); 0: none yet,
                              * and the socket is still non-blocking. */
};

/* Milliseconds left until deadline for poll(2): 0 when past, at most a
 * day (poll takes an int). */
static int ms_left(tb_monotime_us deadline)
{
    tb_monotime_us left = deadline - tb_clock_monotonic_us();

    if (left <= 0) {
        return 0;
    }
    left = (left + 999) / 1000;
    return left > 86400000 ? 86400000 : (int)left;
}

/* Wait for events on fd until deadline. 1 ready, 0 timed out, -1 error
 * (errno). EINTR waits again for what is left. */
static int wait_fd(int fd, short events, tb_monotime_us deadline)
{
    struct pollfd pfd;
    int rc;

    for (;;) {
        pfd.fd = fd;
        pfd.events = events;
        pfd.revents = 0;
        rc = poll(&pfd, 1, ms_left(deadline));
        if (rc > 0) {
            return 1;
        }
        if (rc == 0) {
            return 0;
        }
        if (errno != EINTR) {
            return -1;
        }
    }
}

static void set_io_error(tb__error_t *e, const char *during, int errnum)
{
    tb__set_error(e, TB_ERR_IO, "%s: %s", during, strerror(errnum));
}

static void set_timeout(tb__error_t *e, const char *during)
{
    tb__set_error(e, TB_ERR_TIMEOUT, "%s: timed out", during);
}

static int set_flags(int fd)
{
    int fl = fcntl(fd, F_GETFL);

    if (fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0) {
        return -1;
    }
    /* A CGI child or an exec'd program must not inherit our socket. */
    fl = fcntl(fd, F_GETFD);
    return fl < 0 || fcntl(fd, F_SETFD, fl | FD_CLOEXEC) < 0 ? -1 : 0;
}

/* Connect fd to sa by deadline. 0, or -1 with *e. */
static int connect_fd(int fd, const struct sockaddr *sa, socklen_t salen,
                      tb_monotime_us deadline, tb__error_t *e)
{
    int rc, soerr = 0;
    socklen_t len = sizeof(soerr);

    do {
        rc = connect(fd, sa, salen);
    } while (rc < 0 && errno == EINTR);
    if (rc == 0) {
        return 0;
    }
    if (errno != EINPROGRESS) {
        set_io_error(e, "connect", errno);
        return -1;
    }
    rc = wait_fd(fd, POLLOUT, deadline);
    if (rc == 0) {
        set_timeout(e, "connect");
        return -1;
    }
    if (rc < 0 || getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &len) < 0) {
        set_io_error(e, "connect", errno);
        return -1;
    }
    if (soerr) {
        set_io_error(e, "connect", soerr);
        return -1;
    }
    return 0;
}

/* A connected socket to a unix path, or -1 with *e. */
static int open_unix(const char *path, tb_monotime_us deadline,
                     tb__error_t *e)
{
    struct sockaddr_un sun;
    int fd;

    memset(&sun, 0, sizeof(sun));
    sun.sun_family = AF_UNIX;
    if (strlen(path) >= sizeof(sun.sun_path)) {
        tb__set_error(e, TB_ERR_ARG, "unix socket path too long");
        return -1;
    }
    strcpy(sun.sun_path, path);
    fd = socket(AF_UNIX, SOCK_STREAM, 0);
    if (fd < 0) {
        set_io_error(e, "socket", errno);
        return -1;
    }
    if (set_flags(fd) < 0
        || connect_fd(fd, (struct sockaddr *)&sun, sizeof(sun), deadline,
                      e) < 0) {
        if (e->err == TB_ERR_NONE) {
            set_io_error(e, "fcntl", errno);
        }
        close(fd);
        return -1;
    }
    return fd;
}

/* A connected TCP socket to host:port: the name looked up and each of its
 * addresses tried in turn, all within the one deadline; or -1 with *e
 * (the lookup's error, or the last address's). */
static int open_tcp(const char *host, int port, tb_monotime_us deadline,
                    tb__error_t *e)
{
    struct addrinfo *res = NULL, *ai;
    int fd = -1, one = 1;

    if (tb__resolve(host, port, deadline, &res, e) != TB_OK) {
        return -1;
    }
    tb__set_error(e, TB_ERR_IO, "connect: no address for %.100s", host);
    for (ai = res; ai; ai = ai->ai_next) {
        fd = socket(ai->ai_family, ai->ai_socktype, ai->ai_protocol);
        if (fd < 0) {
            set_io_error(e, "socket", errno);
            continue;
        }
        e->err = TB_ERR_NONE;
        if (set_flags(fd) == 0
            && connect_fd(fd, ai->ai_addr, ai->ai_addrlen, deadline, e)
                   == 0) {
            break;
        }
        if (e->err == TB_ERR_NONE) {
            set_io_error(e, "fcntl", errno);
        }
        close(fd);
        fd = -1;
        if (e->err == TB_ERR_TIMEOUT) {
            break; /* The deadline is spent for every address. */
        }
    }
    freeaddrinfo(res);
    if (fd >= 0) {
        /* Commands are small and answered at once: no Nagle delay. A
         * dead peer behind a silent network is found by keepalive. */
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
        setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof(one));
    }
    return fd;
}

/* Wait for events on fd by deadline for step (a message's prefix). 0, or
 * -1 with *e. */
static int wait_step(int fd, short events, tb_monotime_us deadline,
                     const char *step, tb__error_t *e)
{
    int rc = wait_fd(fd, events, deadline);

    if (rc > 0) {
        return 0;
    }
    if (rc == 0) {
        set_timeout(e, step);
    }
    else {
        set_io_error(e, step, errno);
    }
    return -1;
}

/* The TLS handshake on c's connected socket, by deadline. */
static int tls_start(tb__conn_t *c, const tb_tls_t *tls, const char *host,
                     tb_monotime_us deadline, tb__error_t *e)
{
    short events = 0;
    int rc;

    if (!(c->ssl = tb__tls_session(tls, c->fd, host, e))) {
        return -1;
    }
    while ((rc = tb__tls_handshake(c->ssl, &events, e)) == 0) {
        if (wait_step(c->fd, events, deadline, "tls handshake", e) < 0) {
            if (e->err == TB_ERR_TIMEOUT) {
                /* A plaintext Redis waits for the end of a line that
                 * our ClientHello never sends. */
                tb__set_error(e, TB_ERR_TIMEOUT, "tls handshake: timed "
                              "out (does this port speak TLS?)");
            }
            return -1;
        }
    }
    return rc > 0 ? 0 : -1;
}

tb__conn_t *tb__conn_open(const char *host, int port, const char *path,
                          const tb_tls_t *tls, tb_monotime_us deadline,
                          tb__error_t *e)
{
    tb__conn_t *c;
    struct stat st;

    e->err = TB_ERR_NONE;
    c = calloc(1, sizeof(*c));
    if (!c
        || !(c->reader = redisReaderCreateWithFunctions(&reply_functions))) {
        free(c);
        tb__set_error(e, TB_ERR_OOM, "connect: out of memory");
        return NULL;
    }
    c->fd = path && path[0] ? open_unix(path, deadline, e)
                            : open_tcp(host, port, deadline, e);
    if (c->fd < 0) {
        redisReaderFree(c->reader);
        free(c);
        return NULL;
    }
    if (fstat(c->fd, &st) == 0) {
        c->dev = st.st_dev;
        c->ino = st.st_ino;
    }
    if (tls && tls_start(c, tls, host, deadline, e) < 0) {
        tb__conn_free(c);
        return NULL;
    }
    return c;
}

/* Before a blocking plaintext read: make the socket blocking (once) and
 * its SO_RCVTIMEO close to left, the time to the deadline. 0, or -1 with
 * *e. */
static int set_rcvtimeo(tb__conn_t *c, tb_monotime_us left, tb__error_t *e)
{
    struct timeval tv;
    int fl;

    if (c->rcvtimeo && left + RCVTIMEO_SLACK_US >= c->rcvtimeo
        && left <= c->rcvtimeo + RCVTIMEO_SLACK_US) {
        return 0;
    }
    tv.tv_sec = (time_t)(left / 1000000);
    tv.tv_usec = (suseconds_t)(left % 1000000);
    if (setsockopt(c->fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv)) < 0) {
        set_io_error(e, "setsockopt", errno);
        return -1;
    }
    if (!c->rcvtimeo) {
        fl = fcntl(c->fd, F_GETFL);
        if (fl < 0 || fcntl(c->fd, F_SETFL, fl & ~O_NONBLOCK) < 0) {
            set_io_error(e, "fcntl", errno);
            return -1;
        }
    }
    c->rcvtimeo = left;
    return 0;
}

void tb__conn_free(tb__conn_t *c)
{
    if (!c) {
        return;
    }
    if (c->ssl) {
        tb__tls_end(c->ssl);
    }
    if (c->fd >= 0) {
        close(c->fd);
    }
    redisReaderFree(c->reader);
    tb__buf_free(&c->out);
    free(c);
}

void tb__conn_forget(tb__conn_t *c)
{
    if (c) {
        c->fd = -1;
        tb__conn_free(c);
    }
}

void tb__conn_abandon(tb__conn_t *c)
{
    if (c && c->fd >= 0) {
        close(c->fd);
        c->fd = -1;
    }
}

int tb__conn_is_ours(const tb__conn_t *c)
{
    struct stat st;

    return c->fd >= 0 && fstat(c->fd, &st) == 0 && S_ISSOCK(st.st_mode)
           && st.st_dev == c->dev && st.st_ino == c->ino;
}

static int tls_write(tb__conn_t *c, const char *buf, size_t len,
                     tb_monotime_us deadline, tb__error_t *e)
{
    size_t done = 0;
    short events = 0;
    long n;

    while (done < len) {
        n = tb__tls_write(c->ssl, buf + done, len - done, &events, e);
        if (n > 0) {
            done += (size_t)n;
        }
        else if (n < 0
                 || wait_step(c->fd, events, deadline, "tls write", e) < 0) {
            if (e->err == TB_ERR_IO) {
                tb__tls_why_closed(c->ssl, e);
            }
            return TB_ERR;
        }
    }
    return TB_OK;
}

int tb__conn_write(tb__conn_t *c, const char *buf, size_t len,
                   tb_monotime_us deadline, tb__error_t *e)
{
    size_t done = 0;
    ssize_t n;

    if (c->ssl) {
        return tls_write(c, buf, len, deadline, e);
    }
    while (done < len) {
        n = send(c->fd, buf + done, len - done, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n > 0) {
            done += (size_t)n;
            continue;
        }
        if (n < 0 && errno == EINTR) {
            continue;
        }
        if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK) {
            set_io_error(e, "write", errno);
            return TB_ERR;
        }
        if (wait_step(c->fd, POLLOUT, deadline, "write", e) < 0) {
            return TB_ERR;
        }
    }
    return TB_OK;
}

/* Take one complete reply from what was read: 1 with *r, 0 when more
 * bytes are needed, -1 on a protocol error (with *e). */
static int take_reply(tb__conn_t *c, redisReply **r, tb__error_t *e)
{
    void *rep = NULL;

    if (redisReaderGetReply(c->reader, &rep) != REDIS_OK) {
        tb__set_error(e, TB_ERR_PROTOCOL, "protocol: %.100s",
                      c->reader->errstr);
        return -1;
    }
    *r = rep;
    return rep != NULL;
}

/* What a recv() that returned n <= 0 means: 0 nothing yet (EAGAIN, the
 * timeout, a signal), -1 EOF or an error (with *e). */
static int recv_nothing(ssize_t n, tb__error_t *e)
{
    if (n == 0) {
        tb__set_error(e, TB_ERR_IO, "read: connection closed by server");
        return -1;
    }
    if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) {
        return 0;
    }
    set_io_error(e, "read", errno);
    return -1;
}

/* Read what the socket holds into the reader; with flags MSG_DONTWAIT
 * without waiting, with 0 for as long as SO_RCVTIMEO says. 1 read
 * something, 0 nothing yet (EAGAIN, or the timeout), -1 error or EOF
 * (with *e). */
static int read_some(tb__conn_t *c, int flags, tb__error_t *e)
{
    char buf[READ_CHUNK];
    ssize_t n;

    n = recv(c->fd, buf, sizeof(buf), flags);
    if (n > 0) {
        if (redisReaderFeed(c->reader, buf, (size_t)n) != REDIS_OK) {
            tb__set_error(e, TB_ERR_OOM, "read: out of memory");
            return -1;
        }
        return 1;
    }
    return recv_nothing(n, e);
}

/* read_some over TLS: with block, waiting as long as SO_RCVTIMEO says. 1
 * read something, 0 nothing yet (*events says what to wait for: POLLIN
 * after a blocking read ran out of time), -1 error or EOF (with *e). */
static int tls_read_some(tb__conn_t *c, int block, short *events,
                         tb__error_t *e)
{
    char buf[READ_CHUNK];
    long n = tb__tls_read(c->ssl, buf, sizeof(buf), block, events, e);

    if (n <= 0) {
        return n < 0 ? -1 : 0;
    }
    if (redisReaderFeed(c->reader, buf, (size_t)n) != REDIS_OK) {
        tb__set_error(e, TB_ERR_OOM, "read: out of memory");
        return -1;
    }
    return 1;
}

int tb__conn_read(tb__conn_t *c, tb_monotime_us deadline, redisReply **r,
                  tb__error_t *e)
{
    tb_monotime_us left;
    short events = POLLIN;
    int rc;

    for (;;) {
        rc = take_reply(c, r, e);
        if (rc != 0) {
            return rc > 0 ? TB_OK : TB_ERR;
        }
        /* Nothing buffered: a reply takes a round trip, so block in
         * recv rather than try one that would say EAGAIN. A signal
         * (EINTR) or the timeout comes back here to look at the clock. */
        left = deadline - tb_clock_monotonic_us();
        if (left <= 0) {
            set_timeout(e, c->ssl ? "tls read" : "read");
            return TB_ERR;
        }
        if (set_rcvtimeo(c, left, e) < 0) {
            return TB_ERR;
        }
        if (!c->ssl) {
            rc = read_some(c, 0, e);
        }
        else if (events == POLLOUT) {
            /* The session must write first (a key update's answer):
             * writes never block, so wait for room, then read again. */
            rc = wait_step(c->fd, POLLOUT, deadline, "tls read", e);
            events = POLLIN;
        }
        else {
            rc = tls_read_some(c, 1, &events, e);
        }
        if (rc < 0) {
            return TB_ERR;
        }
    }
}

int tb__conn_poll(tb__conn_t *c, redisReply **r)
{
    tb__error_t e;
    short events;
    int rc = take_reply(c, r, &e);

    if (rc != 0) {
        return rc;
    }
    rc = c->ssl ? tls_read_some(c, 0, &events, &e)
                : read_some(c, MSG_DONTWAIT, &e);
    if (rc <= 0) {
        return rc;
    }
    return take_reply(c, r, &e);
}

int tb__conn_fd(const tb__conn_t *c)
{
    return c->fd;
}

long tb__conn_recv(tb__conn_t *c, char *buf, size_t len, tb__error_t *e)
{
    short events = 0;
    ssize_t n;

    if (c->ssl) {
        n = tb__tls_read(c->ssl, buf, len, 0, &events, e);
        return n < 0 ? -1 : n;
    }
    n = recv(c->fd, buf, len, MSG_DONTWAIT);
    if (n > 0) {
        return n;
    }
    return recv_nothing(n, e);
}

int tb__conn_command(tb__conn_t *c, const tb__cmd_t *cmd,
                     tb_monotime_us deadline, redisReply **r,
                     tb__error_t *e)
{
    c->out.len = 0;
    if (tb__buf_cmd(&c->out, cmd) != TB_OK) {
        tb__set_error(e, TB_ERR_OOM, "%s: out of memory", cmd->argv[0]);
        return TB_ERR;
    }
    if (tb__conn_write(c, c->out.p, c->out.len, deadline, e) != TB_OK) {
        return TB_ERR;
    }
    return tb__conn_read(c, deadline, r, e);
}
