/* ctor_lib.c -- a library whose constructor connects before main() runs.
 *
 * Built as libctor.so and linked into ctor_main. The constructor makes
 * CTOR_N connections to 127.0.0.1:CTOR_PORT; the shim must already limit
 * them, although its own constructor may not have run yet.
 */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

int ctor_ok, ctor_fail;

__attribute__((constructor)) static void early(void)
{
    struct sockaddr_in a;
    const char *p = getenv("CTOR_PORT"), *n = getenv("CTOR_N");
    int i, count = n ? atoi(n) : 3;

    if (!p) {
        return;
    }
    memset(&a, 0, sizeof(a));
    a.sin_family = AF_INET;
    a.sin_port = htons((unsigned short)atoi(p));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    for (i = 0; i < count; i++) {
        int s = socket(AF_INET, SOCK_STREAM, 0);

        if (connect(s, (struct sockaddr *)&a, sizeof(a)) == 0) {
            ctor_ok++;
        }
        else {
            ctor_fail++;
        }
        close(s);
    }
}
