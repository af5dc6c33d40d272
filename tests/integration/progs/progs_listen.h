/* progs_listen.h -- the listening socket of the test daemons
 * (prefork_srv.c, thread_srv.c): 127.0.0.1:port, port 0 for any free one.
 */
#ifndef PROGS_LISTEN_H
#define PROGS_LISTEN_H

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>

/* The listener, its port in *bound; -1 after saying why, as who. */
static int listen_loopback(int port, const char *who, int *bound)
{
    struct sockaddr_in sin;
    socklen_t len = sizeof(sin);
    int one = 1, l;

    memset(&sin, 0, sizeof(sin));
    sin.sin_family = AF_INET;
    sin.sin_port = htons((unsigned short)port);
    sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    l = socket(AF_INET, SOCK_STREAM, 0);
    if (l < 0 || setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one))
        || bind(l, (struct sockaddr *)&sin, sizeof(sin)) != 0
        || listen(l, 1024) != 0
        || getsockname(l, (struct sockaddr *)&sin, &len) != 0) {
        fprintf(stderr, "%s: listen: %s\n", who, strerror(errno));
        return -1;
    }
    *bound = ntohs(sin.sin_port);
    return l;
}

#endif
