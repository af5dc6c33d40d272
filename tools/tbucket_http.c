/* tbucket_http.c -- the tool's HTTP client: one plain HTTP/1.0 GET of a
 * status page's JSON view (tbucket top), bounded by a deadline in every
 * step (resolve, connect, write, read) and by TOP_BODY_MAX bytes. No TLS:
 * an ssh tunnel reaches a remote page. */
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "tbucket_tool.h"

#define TOP_BODY_MAX (16 * 1024 * 1024) /* Bytes of a status page, at most. */

int tool_http_url_parse(const char *url, http_url_t *u)
{
    const char *p, *end, *slash, *colon;
    size_t hl;

    memset(u, 0, sizeof(*u));
    if (strncmp(url, "http://", 7) != 0) {
        return -1;
    }
    p = url + 7;
    slash = strchr(p, '/');
    end = slash ? slash : p + strlen(p);
    if (end == p || (size_t)(end - p) >= sizeof(u->hostport)) {
        return -1;
    }
    memcpy(u->hostport, p, (size_t)(end - p));
    if (*p == '[') {
        const char *rb = memchr(p, ']', (size_t)(end - p));

        if (!rb) {
            return -1;
        }
        hl = (size_t)(rb - p - 1);
        memcpy(u->host, p + 1, hl < sizeof(u->host) ? hl : 0);
        colon = rb + 1 < end && rb[1] == ':' ? rb + 1 : NULL;
    }
    else {
        colon = memchr(p, ':', (size_t)(end - p));
        hl = (size_t)((colon ? colon : end) - p);
        if (hl >= sizeof(u->host)) {
            return -1;
        }
        memcpy(u->host, p, hl);
    }
    if (!u->host[0]) {
        return -1;
    }
    if (colon) {
        size_t pl = (size_t)(end - colon - 1);

        if (pl < 1 || pl >= sizeof(u->port)
            || strspn(colon + 1, "0123456789") < pl) {
            return -1;
        }
        memcpy(u->port, colon + 1, pl);
    }
    else {
        strcpy(u->port, "80");
    }
    snprintf(u->path, sizeof(u->path), "%s%sview=json",
             slash ? slash : "/", slash && strchr(slash, '?') ? "&" : "?");
    /* Request bytes: no space, control character or non-ASCII. */
    for (p = u->path; *p; p++) {
        if ((unsigned char)*p <= 0x20 || (unsigned char)*p >= 0x7f) {
            return -1;
        }
    }
    return 0;
}

int64_t tool_mono_ms(void)
{
    return tb_clock_monotonic_us() / 1000;
}

/* Wait until fd is ready for events or the deadline passes: 1, 0 on
 * timeout, -1 on error. */
static int wait_fd(int fd, short events, int64_t deadline_ms)
{
    struct pollfd pfd;
    int rc;

    for (;;) {
        int64_t left = deadline_ms - tool_mono_ms();

        if (left <= 0) {
            return 0;
        }
        pfd.fd = fd;
        pfd.events = events;
        rc = poll(&pfd, 1, (int)left);
        if (rc >= 0 || errno != EINTR) {
            return rc > 0 ? 1 : rc;
        }
    }
}

/* A connected socket to u, or -1 with a message in err. */
static int http_connect(const http_url_t *u, int64_t deadline_ms, char *err,
                        size_t errlen)
{
    struct addrinfo hints, *ai = NULL, *a;
    int fd = -1, rc, soerr;
    socklen_t sl = sizeof(soerr);

    memset(&hints, 0, sizeof(hints));
    hints.ai_socktype = SOCK_STREAM;
    if ((rc = getaddrinfo(u->host, u->port, &hints, &ai)) != 0) {
        snprintf(err, errlen, "%.100s: %s", u->host, gai_strerror(rc));
        return -1;
    }
    snprintf(err, errlen, "%.100s:%s: no address", u->host, u->port);
    for (a = ai; a && fd < 0; a = a->ai_next) {
        fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC,
                    a->ai_protocol);
        if (fd < 0) {
            continue;
        }
        fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
        if (connect(fd, a->ai_addr, a->ai_addrlen) == 0
            || (errno == EINPROGRESS && wait_fd(fd, POLLOUT, deadline_ms) > 0
                && getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &sl) == 0
                && (errno = soerr) == 0)) {
            break;
        }
        snprintf(err, errlen, "connect %.100s:%s: %s", u->host, u->port,
                 errno == EINPROGRESS ? "timed out" : strerror(errno));
        close(fd);
        fd = -1;
    }
    freeaddrinfo(ai);
    return fd;
}

/* GET u's JSON view within timeout_ms: its body (malloc'd, NUL-ended),
 * or NULL with a message in err. HTTP/1.0, so the body ends with the
 * connection and is never chunked. */
char *tool_http_get(const http_url_t *u, int timeout_ms, char *err,
                    size_t errlen)
{
    int64_t deadline = tool_mono_ms() + timeout_ms;
    char req[1600], *buf = NULL, *body;
    size_t len = 0, cap = 0, sent = 0, reqlen;
    int fd = http_connect(u, deadline, err, errlen);
    ssize_t n;

    if (fd < 0) {
        return NULL;
    }
    reqlen = (size_t)snprintf(req, sizeof(req), "GET %s HTTP/1.0\r\nHost: "
                              "%s\r\nAccept: application/json\r\n"
                              "User-Agent: tbucket-top\r\n\r\n", u->path,
                              u->hostport);
    while (sent < reqlen) {
        if (wait_fd(fd, POLLOUT, deadline) <= 0) {
            snprintf(err, errlen, "sending the request timed out");
            goto fail;
        }
        n = send(fd, req + sent, reqlen - sent, MSG_NOSIGNAL);
        if (n < 0 && errno != EAGAIN && errno != EINTR) {
            snprintf(err, errlen, "send: %s", strerror(errno));
            goto fail;
        }
        sent += n > 0 ? (size_t)n : 0;
    }
    for (;;) {
        if (len + 65536 + 1 > cap) {
            char *nb;

            if (cap >= TOP_BODY_MAX) {
                snprintf(err, errlen, "the page is larger than %d bytes",
                         TOP_BODY_MAX);
                goto fail;
            }
            cap = cap ? 2 * cap : 131072;
            if (!(nb = realloc(buf, cap))) {
                snprintf(err, errlen, "out of memory");
                goto fail;
            }
            buf = nb;
        }
        if (wait_fd(fd, POLLIN, deadline) <= 0) {
            snprintf(err, errlen, "no full answer within %d ms", timeout_ms);
            goto fail;
        }
        n = recv(fd, buf + len, cap - len - 1, 0);
        if (n == 0) {
            break;
        }
        if (n < 0 && errno != EAGAIN && errno != EINTR) {
            snprintf(err, errlen, "recv: %s", strerror(errno));
            goto fail;
        }
        len += n > 0 ? (size_t)n : 0;
    }
    close(fd);
    buf[len] = '\0';
    if (strncmp(buf, "HTTP/1.", 7) != 0 || len < 12
        || strncmp(buf + 9, "200", 3) != 0) {
        snprintf(err, errlen, "the server answered %.40s",
                 len ? strtok(buf, "\r\n") : "nothing");
        free(buf);
        return NULL;
    }
    if (!(body = strstr(buf, "\r\n\r\n"))) {
        snprintf(err, errlen, "no end to the response's header");
        free(buf);
        return NULL;
    }
    memmove(buf, body + 4, len - (size_t)(body + 4 - buf) + 1);
    return buf;

fail:
    close(fd);
    free(buf);
    return NULL;
}
