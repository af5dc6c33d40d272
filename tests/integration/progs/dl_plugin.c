/* dl_plugin.c -- the plugin dl_main opens: N blocking connect()s to
 * HOST:PORT (IPv4), each closed at once; returns how many succeeded. */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

int plugin_connects(const char *host, int port, int n);

int plugin_connects(const char *host, int port, int n)
{
    struct sockaddr_in in;
    int i, ok = 0;

    memset(&in, 0, sizeof(in));
    in.sin_family = AF_INET;
    in.sin_port = htons((unsigned short)port);
    if (inet_pton(AF_INET, host, &in.sin_addr) != 1) {
        return 0;
    }
    for (i = 0; i < n; i++) {
        int s = socket(AF_INET, SOCK_STREAM, 0);

        if (s >= 0 && connect(s, (struct sockaddr *)&in, sizeof(in)) == 0) {
            ok++;
        }
        if (s >= 0) {
            close(s);
        }
    }
    return ok;
}
