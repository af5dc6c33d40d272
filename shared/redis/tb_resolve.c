/* tb_resolve.c -- host names to addresses within a connect's deadline.
 *
 * getaddrinfo() takes no timeout: a name server that does not answer
 * holds its caller for the resolver's own timeouts (5 s a try by default,
 * times the attempts and the servers), and a connect is one step of a
 * decision that must not outlast its deadline. So an IP literal is
 * converted at once (AI_NUMERICHOST: no lookup, no thread), and a name is
 * looked up by a thread of its own while the caller waits for it on a
 * condition variable no later than the connect's deadline. A caller that
 * gives up leaves the lookup to finish; whichever of the two lets go last
 * frees it.
 *
 * Names are looked up on every connect, not once at configuration time:
 * a Redis whose name moves to another address on failover (as managed
 * services do) is found again by the next connection, and a client made
 * while the name server is away still works once it is back. The connect
 * timeout covers the lookup and the connect together, so a name must
 * resolve within it; with the default 50 ms, use a local resolver cache,
 * /etc/hosts or an IP address when the name servers are far.
 *
 * The thread blocks every signal, so no handler of the host's runs in it
 * and a SIGPIPE from the resolver's TCP fallback is never delivered, and
 * it runs getaddrinfo() alone. A lookup in flight when the process forks
 * is left behind in the child (its thread is not there), a few hundred
 * bytes that are never freed.
 */
#include <netdb.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "redis/tb_redis_int.h"

/* One lookup, shared by the caller and its thread. */
typedef struct lookup {
    pthread_mutex_t mu;
    pthread_cond_t cv;     /* Signalled when done.                     */
    int refs;              /* Under mu: the caller and the thread.     */
    int done;
    int rc;                /* getaddrinfo()'s result.                  */
    struct addrinfo *res;  /* Its addresses, until the caller takes them.*/
    char host[256];
    char service[16];
} lookup_t;

static void hints_for(struct addrinfo *h, int flags)
{
    memset(h, 0, sizeof(*h));
    h->ai_family = AF_UNSPEC;
    h->ai_socktype = SOCK_STREAM;
    h->ai_flags = flags;
}

/* Takes l->mu held: drop one reference, and free l with the last. */
static void let_go(lookup_t *l)
{
    int last = --l->refs == 0;

    pthread_mutex_unlock(&l->mu);
    if (last) {
        if (l->res) {
            freeaddrinfo(l->res);
        }
        pthread_cond_destroy(&l->cv);
        pthread_mutex_destroy(&l->mu);
        free(l);
    }
}

static void *lookup_main(void *arg)
{
    lookup_t *l = arg;
    struct addrinfo hints, *res = NULL;
    int rc;

    hints_for(&hints, 0);
    rc = getaddrinfo(l->host, l->service, &hints, &res);
    pthread_mutex_lock(&l->mu);
    l->rc = rc;
    l->res = rc == 0 ? res : NULL;
    l->done = 1;
    pthread_cond_signal(&l->cv);
    let_go(l);
    return NULL;
}

/* Start l's thread, detached, with every signal blocked. 0, or -1 with
 * *e. */
static int start(lookup_t *l, tb__error_t *e)
{
    pthread_attr_t attr;
    sigset_t all, old;
    pthread_t t;
    int rc;

    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    rc = pthread_create(&t, &attr, lookup_main, l);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    pthread_attr_destroy(&attr);
    if (rc != 0) {
        tb__set_error(e, TB_ERR_IO, "resolve %.100s: no thread: %s",
                      l->host, strerror(rc));
        return -1;
    }
    return 0;
}

/* A lookup of host:service, not started; NULL with *e. */
static lookup_t *lookup_new(const char *host, const char *service,
                            tb__error_t *e)
{
    lookup_t *l;

    if (strlen(host) >= sizeof(l->host)) {
        tb__set_error(e, TB_ERR_ARG, "resolve: host name too long");
        return NULL;
    }
    if (!(l = calloc(1, sizeof(*l)))) {
        tb__set_error(e, TB_ERR_OOM, "resolve: out of memory");
        return NULL;
    }
    strcpy(l->host, host);
    snprintf(l->service, sizeof(l->service), "%s", service);
    pthread_mutex_init(&l->mu, NULL);
    tb__cond_init(&l->cv);
    l->refs = 2;
    return l;
}

int tb__resolve(const char *host, int port, tb_monotime_us deadline,
                struct addrinfo **res, tb__error_t *e)
{
    struct addrinfo hints;
    struct timespec until;
    char service[16];
    lookup_t *l;
    int rc;

    *res = NULL;
    snprintf(service, sizeof(service), "%d", port);
    hints_for(&hints, AI_NUMERICHOST);
    if (getaddrinfo(host, service, &hints, res) == 0) {
        return TB_OK;
    }
    *res = NULL;
    if (!(l = lookup_new(host, service, e))) {
        return TB_ERR;
    }
    if (start(l, e) < 0) {
        l->refs = 1;
        pthread_mutex_lock(&l->mu);
        let_go(l);
        return TB_ERR;
    }
    until = tb__timespec_at(deadline);
    pthread_mutex_lock(&l->mu);
    while (!l->done
           && pthread_cond_timedwait(&l->cv, &l->mu, &until) == 0) {
    }
    if (!l->done) {
        tb__set_error(e, TB_ERR_TIMEOUT, "resolve %.100s: timed out", host);
        let_go(l);
        return TB_ERR;
    }
    rc = l->rc;
    *res = l->res;
    l->res = NULL;
    let_go(l);
    if (rc != 0) {
        tb__set_error(e, TB_ERR_IO, "resolve %.100s: %s", host,
                      gai_strerror(rc));
        return TB_ERR;
    }
    return TB_OK;
}
