/* dl_main.c -- a program that opens a plugin with dlopen() and lets it
 * connect, for the shim's dlopen tests.
 *
 *   dl_main [-d] PLUGIN HOST PORT N
 *
 * Opens PLUGIN (a bare name is searched through this program's RUNPATH,
 * as glibc does for the object that calls dlopen) with RTLD_NOW, plus
 * RTLD_DEEPBIND with -d, as PHP opens its extensions. Then calls the
 * plugin's plugin_connects(HOST, PORT, N), which makes N connections
 * with its own references to connect(). Prints "ok=.. fail=..", or
 * "dlopen: <error>" and exits 3.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int (*connects_fn)(const char *, int, int);

int main(int argc, char **argv)
{
    int deep = argc > 1 && strcmp(argv[1], "-d") == 0, n, ok;
    char **a = argv + deep;
    void *h;
    connects_fn f;

    if (argc - deep != 5) {
        fprintf(stderr, "usage: dl_main [-d] PLUGIN HOST PORT N\n");
        return 2;
    }
    h = dlopen(a[1], RTLD_NOW | (deep ? RTLD_DEEPBIND : 0));
    if (h == NULL) {
        printf("dlopen: %s\n", dlerror());
        return 3;
    }
    f = (connects_fn)dlsym(h, "plugin_connects");
    if (f == NULL) {
        printf("dlopen: no plugin_connects\n");
        return 3;
    }
    n = atoi(a[4]);
    ok = f(a[2], atoi(a[3]), n);
    printf("ok=%d fail=%d\n", ok, n - ok);
    return 0;
}
