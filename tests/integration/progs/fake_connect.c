/* fake_connect.c -- a connect() that never enters the kernel.
 *
 * Preloaded after the shim (LD_PRELOAD="shim.so libfakeconnect.so"), it is
 * what the shim's dlsym(RTLD_NEXT, "connect") finds: the shim passes calls
 * on to the next interposer rather than straight to libc. connect_loop's
 * "ebadf" mode then times the wrapper itself, free of system-call noise:
 * preloaded alone it is the baseline.
 */
#include <errno.h>
#include <sys/socket.h>

int fake_connect_calls;

int connect(int fd, const struct sockaddr *addr, socklen_t len)
{
    (void)fd;
    (void)addr;
    (void)len;
    fake_connect_calls++;
    errno = EBADF;
    return -1;
}
