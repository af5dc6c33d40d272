/* closer.c -- a daemon that closes every fd after start, for the shim tests.
 *
 *   closer HOST PORT N file|sock
 *
 * Makes N connections to HOST:PORT (so the shim has opened its Redis
 * connection), then closes fds 3..1023 as a daemon does, opens new files
 * on the freed numbers and makes N more connections. "file" opens a
 * listener, a temp file, another listener (the temp file lands on the
 * number the shim's Redis socket had); "sock" opens two listeners first
 * (a socket lands there). Then checks that nothing of the shim touched
 * them: the file is still empty and both listeners still listen. Prints
 * "ok1=.. ok2=.. intact=0|1".
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

static struct sockaddr_in dst;

static int connects(int n)
{
    int i, ok = 0;

    for (i = 0; i < n; i++) {
        int s = socket(AF_INET, SOCK_STREAM, 0);

        ok += connect(s, (struct sockaddr *)&dst, sizeof(dst)) == 0;
        close(s);
    }
    return ok;
}

static int listener(void)
{
    struct sockaddr_in a;
    int l = socket(AF_INET, SOCK_STREAM, 0);

    memset(&a, 0, sizeof(a));
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    bind(l, (struct sockaddr *)&a, sizeof(a));
    listen(l, 16);
    return l;
}

static int listening(int fd)
{
    int v = 0;
    socklen_t len = sizeof(v);

    return getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &v, &len) == 0 && v;
}

int main(int argc, char **argv)
{
    char path[] = "/tmp/closer.XXXXXX";
    struct stat st;
    int n, ok1, ok2, fd, l1, l2, f, intact;

    if (argc != 5) {
        fprintf(stderr, "usage: closer HOST PORT N file|sock\n");
        return 2;
    }
    memset(&dst, 0, sizeof(dst));
    dst.sin_family = AF_INET;
    inet_pton(AF_INET, argv[1], &dst.sin_addr);
    dst.sin_port = htons((unsigned short)atoi(argv[2]));
    n = atoi(argv[3]);
    ok1 = connects(n);
    for (fd = 3; fd < 1024; fd++) {
        close(fd);
    }
    if (strcmp(argv[4], "sock") == 0) {
        l1 = listener();
        l2 = listener();
        f = mkstemp(path);
    }
    else {
        l1 = listener();
        f = mkstemp(path);
        l2 = listener();
    }
    ok2 = connects(n);
    intact = fstat(f, &st) == 0 && st.st_size == 0 && listening(l1)
             && listening(l2);
    unlink(path);
    printf("ok1=%d ok2=%d intact=%d fds=%d,%d,%d\n", ok1, ok2, intact, l1, f,
           l2);
    return 0;
}
