/* tb_shim.c -- the LD_PRELOAD wrappers: accept(), accept4(), connect(),
 * close() and dlopen(), and the shim's initialisation.
 *
 *   LD_PRELOAD=libtbucket_preload.so TBUCKET_CONFIG=/etc/tbucket/shim.conf \
 *       legacy-daemon
 *
 * Inbound rules limit the connections a program accepts, outbound rules
 * those it opens; every decision is one core call (shim_core.c). This
 * file owns the exported wrappers (the only symbols the .so exports,
 * tb_shim.map), what each does when a bucket refuses (close, http429 or
 * 503 without waiting on the client, fail or wait for outbound), the
 * resolution of real_* symbols, and initialisation through one
 * pthread_once. It never exits its host (one line on stderr and the call
 * goes through, but for a bad config under `strict`), preserves errno and
 * never allocates. shim/README.md names the other files; docs/design.md
 * ("Inside the shim", "File notes") has the behaviour in full. */
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "shim_int.h"

/* Marks the only symbols the .so exports; shim/tb_shim.map agrees. */
#define SHIM_EXPORT __attribute__((visibility("default")))

/* With _GNU_SOURCE glibc declares socket address arguments as transparent
 * unions; our definitions must match the prototypes. */
#if defined(__USE_GNU) && !defined(__cplusplus)
#define SA_CONST_PTR(a) ((a).__sockaddr__)
#define SA_PTR(a) ((a).__sockaddr__)
#else
#define SA_CONST_PTR(a) (a)
#define SA_PTR(a) (a)
#endif

#define SHIM_EX_CONFIG 78      /* sysexits.h EX_CONFIG.                  */
#define SHIM_MAX_REJECTS 256   /* Refusals in one non-blocking accept.   */
#define SHIM_MAX_WAIT_LOOPS 100000 /* Bound on `wait` iterations.        */

enum {
    ST_UNINIT = 0,
    ST_INITIALISING = 1,
    ST_READY = 2,
    ST_OFF = 3        /* No config, bad config or nothing to limit.       */
};

typedef int (*connect_fn)(int, const struct sockaddr *, socklen_t);
typedef int (*accept_fn)(int, struct sockaddr *, socklen_t *);
typedef int (*accept4_fn)(int, struct sockaddr *, socklen_t *, int);
typedef ssize_t (*write_fn)(int, const void *, size_t);
typedef int (*close_fn)(int);
typedef void *(*dlopen_fn)(const char *, int);

static connect_fn real_connect;
static accept_fn real_accept;
static accept4_fn real_accept4;
static write_fn real_write;
static close_fn real_close;
static dlopen_fn real_dlopen;

static int shim_state = ST_UNINIT;
static pthread_once_t shim_once = PTHREAD_ONCE_INIT;

/* Filled once by shim_init(), read-only afterwards, so the wrappers
 * consult it without a lock. */
static shim_conf_t shim_conf;

/* ---- Logging ------------------------------------------------------- */

/* One line on stderr, written with the real write(2) so that nothing of
 * ours runs inside it. A daemon may have put one of its TCP connections
 * on fd 2; we would rather lose a warning than write into it. */
void shim_warn(const char *fmt, ...)
{
    char line[SHIM_ERR_LEN + 128];
    struct sockaddr_storage ss;
    socklen_t sl = sizeof(ss);
    va_list ap;
    int saved = errno, n;

    if (getsockname(2, (struct sockaddr *)&ss, &sl) == 0
        && (ss.ss_family == AF_INET || ss.ss_family == AF_INET6)) {
        errno = saved;
        return;
    }
    n = snprintf(line, sizeof(line), "tbucket-shim[%ld]: ", (long)getpid());
    va_start(ap, fmt);
    n += vsnprintf(line + n, sizeof(line) - (size_t)n - 1, fmt, ap);
    va_end(ap);
    if (n > (int)sizeof(line) - 2) {
        n = (int)sizeof(line) - 2;
    }
    line[n++] = '\n';
    if (real_write != NULL) {
        (void)real_write(2, line, (size_t)n);
    }
    else {
        (void)syscall(SYS_write, 2, line, (size_t)n);
    }
    errno = saved;
}

/* ---- Real functions ------------------------------------------------ */

/* Look `name` up in the objects after ours. A lookup that returns our own
 * wrapper (the .so loaded twice, or an odd link order) would recurse for
 * ever: refuse it and let the caller fall back to the system call. */
static void *load_sym(const char *name, const void *self)
{
    void *p = dlsym(RTLD_NEXT, name);

    if (p == self) {
        shim_warn("dlsym(RTLD_NEXT, \"%s\") returned our own wrapper; "
                  "using the system call", name);
        return NULL;
    }
    if (p == NULL) {
        shim_warn("dlsym(RTLD_NEXT, \"%s\") found nothing; using the "
                  "system call", name);
    }
    return p;
}

static void resolve_syms(void)
{
    real_write = (write_fn)load_sym("write", NULL);
    real_connect = (connect_fn)load_sym("connect", (void *)connect);
    real_accept = (accept_fn)load_sym("accept", (void *)accept);
    real_accept4 = (accept4_fn)load_sym("accept4", (void *)accept4);
    real_close = (close_fn)load_sym("close", (void *)close);
    __atomic_store_n(&real_dlopen,
                     (dlopen_fn)load_sym("dlopen", (void *)dlopen),
                     __ATOMIC_RELEASE);
}

/* The call_* helpers are the only way out to the system: real_* when
 * resolved, else the raw system call (no cancellation point then). */
static int call_connect(int fd, const struct sockaddr *sa, socklen_t len)
{
    if (real_connect != NULL) {
        return real_connect(fd, sa, len);
    }
    return (int)syscall(SYS_connect, fd, sa, len);
}

static int call_close(int fd)
{
    if (real_close != NULL) {
        return real_close(fd);
    }
    return (int)syscall(SYS_close, fd);
}

static int call_accept4(int fd, struct sockaddr *sa, socklen_t *len,
                        int flags, int plain)
{
    if (plain && real_accept != NULL) {
        return real_accept(fd, sa, len);
    }
    if (real_accept4 != NULL) {
        return real_accept4(fd, sa, len, flags);
    }
    return (int)syscall(SYS_accept4, fd, sa, len, flags);
}

/* ---- Initialisation ------------------------------------------------ */

static int env_flag(const char *name, int dflt)
{
    const char *v = getenv(name);

    if (v == NULL || *v == '\0') {
        return dflt;
    }
    return !(strcmp(v, "0") == 0 || strcmp(v, "false") == 0
             || strcmp(v, "no") == 0);
}

/* A bad config under strict: one line, then stop before main() runs. */
static void refuse(const char *msg) __attribute__((noreturn));
static void refuse(const char *msg)
{
    shim_warn("%s; refusing to start (strict = true)", msg);
    _exit(SHIM_EX_CONFIG);
}

/* A step of shim_load() that failed with err (prefixed with the config
 * file's path where path is not NULL): refused before main() under
 * strict, else one line saying what follows (then). */
static void load_failed(const char *path, const char *err, int strict,
                        const char *then)
{
    char msg[SHIM_ERR_LEN + 64];

    snprintf(msg, sizeof(msg), "%s%s%s", path ? path : "", path ? ": " : "",
             err);
    if (strict) {
        refuse(msg);
    }
    shim_warn("%s; %s", msg, then);
}

/* 1 when some inbound rule of conf keeps a slot or a place for the life
 * of a connection (concurrency, local_concurrency). */
static int holds_connections(const shim_conf_t *conf)
{
    int i;

    for (i = 0; i < conf->nin; i++) {
        if (conf->in[i].concurrency > 0
            || conf->in[i].local_concurrency != 0) {
            return 1;
        }
    }
    return 0;
}

/* Load the config and create the core's client. ST_READY once the
 * client is handed to shim_core.c, ST_OFF when there is nothing to limit
 * or the config cannot be used (warned, or refused under strict). */
static int shim_load(void)
{
    char err[SHIM_ERR_LEN];
    const char *path = getenv("TBUCKET_CONFIG");
    int env_strict = env_flag("TBUCKET_STRICT", 0);
    tb_client_t *c;

    if (path == NULL || *path == '\0') {
        load_failed(NULL, "TBUCKET_CONFIG is not set", env_strict,
                    "running unlimited");
        return ST_OFF;
    }
    if (shim_conf_load(path, &shim_conf, err, sizeof(err)) != TB_OK) {
        load_failed(NULL, err, shim_conf.strict || env_strict,
                    "running unlimited");
        return ST_OFF;
    }
    if (shim_conf.nin == 0 && shim_conf.nout == 0) {
        return ST_OFF;
    }
    /* Here, in the constructor, the program has not forked yet: every
     * child it makes inherits the tables. */
    if (holds_connections(&shim_conf)
        && shim_slots_start(err, sizeof(err)) != TB_OK) {
        load_failed(path, err, shim_conf.strict || env_strict,
                    "connections past it are refused");
    }
    if (shim_local_start(&shim_conf, err, sizeof(err)) != TB_OK) {
        load_failed(path, err, shim_conf.strict || env_strict,
                    "local_concurrency is not enforced");
    }
    /* Before the client is made: it keeps the table it is given. */
    if (shim_lease_start(&shim_conf, err, sizeof(err)) != TB_OK) {
        load_failed(path, err, shim_conf.strict || env_strict,
                    "every connection asks Redis");
    }
    c = tb_client_create(&shim_conf.opts, err, sizeof(err));
    if (c == NULL) {
        load_failed(path, err, shim_conf.strict || env_strict,
                    "running unlimited");
        return ST_OFF;
    }
    if (shim_conf.opts.tls.no_verify) {
        shim_warn("%s: tls_verify = false: the Redis server's certificate "
                  "is not checked", path);
    }
    shim_core_start(c, shim_conf.opts.policy);
    shim_lease_arm();
    return ST_READY;
}

/* Called exactly once, through shim_once. The guard and the
 * INITIALISING state are set before anything else, so that a connect()
 * made by getaddrinfo() or by libconfig's file access cannot recurse into
 * us or wait on the pthread_once it is running under. */
static void shim_init(void)
{
    int saved = errno, st;

    shim_guard++;
    __atomic_store_n(&shim_state, ST_INITIALISING, __ATOMIC_RELEASE);
    resolve_syms();
    st = shim_load();
    __atomic_store_n(&shim_state, st, __ATOMIC_RELEASE);
    shim_guard--;
    errno = saved;
}

__attribute__((constructor)) static void shim_ctor(void)
{
    pthread_once(&shim_once, shim_init);
}

/* 1 when the wrappers should limit. The first call from a library
 * constructor that ran before ours initialises here. Another thread's
 * call during initialisation passes through rather than block. */
static inline int shim_active(void)
{
    int st = __atomic_load_n(&shim_state, __ATOMIC_ACQUIRE);

    if (__builtin_expect(st == ST_READY, 1)) {
        return 1;
    }
    if (st == ST_UNINIT) {
        int saved = errno;

        pthread_once(&shim_once, shim_init);
        errno = saved;
        return __atomic_load_n(&shim_state, __ATOMIC_ACQUIRE) == ST_READY;
    }
    return 0;
}

/* ---- Sockets and time ---------------------------------------------- */

static int is_stream_socket(int fd)
{
    int type = 0;
    socklen_t len = sizeof(type);

    return getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &len) == 0
           && type == SOCK_STREAM;
}

static int is_nonblocking(int fd)
{
    int fl = fcntl(fd, F_GETFL);

    return fl != -1 && (fl & O_NONBLOCK) != 0;
}

/* Sleep ms milliseconds of monotonic time, resuming after signals. */
static void sleep_ms(int64_t ms)
{
    struct timespec until;

    clock_gettime(CLOCK_MONOTONIC, &until);
    until.tv_sec += (time_t)(ms / 1000);
    until.tv_nsec += (long)(ms % 1000) * 1000000L;
    if (until.tv_nsec >= 1000000000L) {
        until.tv_sec++;
        until.tv_nsec -= 1000000000L;
    }
    while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &until, NULL)
           == EINTR) {
    }
}

/* ---- Outbound ------------------------------------------------------ */

/* connect() for a destination that matched rule r: spend a token first,
 * as the head comment describes. errno is the caller's unless we fail. */
static int limited_connect(int fd, const struct sockaddr *sa, socklen_t len,
                           const shim_rule_t *r)
{
    int saved = errno, nonblock, loops;
    int64_t deadline;
    tb_result_t res;

    if (!is_stream_socket(fd) || shim_fds_is_ours(fd)) {
        errno = saved;
        return call_connect(fd, sa, len);
    }
    /* Only `nonblocking = "fail"` treats a non-blocking socket apart. */
    nonblock = !r->nonblock_wait && is_nonblocking(fd);
    deadline = shim_now_ms() + r->max_wait_ms;
    for (loops = 0; loops < SHIM_MAX_WAIT_LOOPS; loops++) {
        shim_decide(r, r->key, r->key_len, &res);
        if (res.allowed) {
            errno = saved;
            return call_connect(fd, sa, len);
        }
        if (nonblock) {
            errno = r->nonblock_errno;
            return -1;
        }
        if (r->on_limit != SHIM_ON_WAIT || res.retry_ms < 0) {
            break;
        }
        {
            int64_t wait = res.retry_ms > 0 ? res.retry_ms : 1;

            if (shim_now_ms() + wait > deadline) {
                break;
            }
            sleep_ms(wait);
        }
    }
    errno = r->fail_errno;
    return -1;
}

SHIM_EXPORT int connect(int fd, __CONST_SOCKADDR_ARG addr, socklen_t len)
{
    const struct sockaddr *sa = SA_CONST_PTR(addr);
    const shim_rule_t *r;

    if (shim_guard) {
        /* The core opening a Redis socket, or our own initialisation. */
        int rc = call_connect(fd, sa, len);

        shim_core_connected(fd, rc);
        return rc;
    }
    if (!shim_active() || shim_conf.nout == 0
        || (r = shim_match(shim_conf.out, shim_conf.nout,
                           shim_conf.out_ports, sa, len)) == NULL) {
        return call_connect(fd, sa, len);
    }
    return limited_connect(fd, sa, len, r);
}

/* ---- Inbound ------------------------------------------------------- */

/* The rule for an accepted connection, matched on its local address (the
 * one the client reached). One getsockname() per accept when there are
 * inbound rules at all. */
static const shim_rule_t *match_accepted(int cfd)
{
    struct sockaddr_storage local;
    socklen_t len = sizeof(local);

    if (getsockname(cfd, (struct sockaddr *)&local, &len) != 0) {
        return NULL;
    }
    return shim_match(shim_conf.in, shim_conf.nin, shim_conf.in_ports,
                      (const struct sockaddr *)&local, len);
}

/* Read, without waiting, what the client of cfd has sent so far (up to
 * 8 KiB): closing a socket with unread data sends a reset. */
static void drain_request(int cfd)
{
    char buf[512];
    int i;

    for (i = 0; i < 16 && recv(cfd, buf, sizeof(buf), MSG_DONTWAIT) > 0;
         i++) {
    }
}

/* Answer a refused connection with a minimal HTTP response and close
 * it: `status` is 429 (the client is over its limit) or 503 (this server
 * is full), `reason` its phrase, retry_ms the wait to announce.
 *
 * Nothing here waits for the client. The request is read as far as it
 * has arrived, before the answer and again after it, so that a close
 * with unread data does not reset the connection; a request that arrives
 * later still gets a reset, after our answer, which a Linux client reads
 * first. Waiting for it instead would let an address that opens idle
 * connections stall an event loop for the whole wait of every refusal:
 * with a 10 ms wait and 1,000 such connections a second, another
 * client's request took 3.6 s (test_shim_100_09 measures it). */
static void reject_http(int cfd, int status, const char *reason,
                        int64_t retry_ms)
{
    char buf[512];
    /* Whole seconds, rounded up. retry_ms is -1 when the cost exceeds the
     * capacity and waiting can never help: say a minute rather than
     * invite an immediate retry. */
    long long secs = retry_ms > 0 ? (retry_ms + 999) / 1000
                                  : (retry_ms < 0 ? 60 : 1);
    int n;

    drain_request(cfd);
    /* The body is the reason phrase and a newline. */
    n = snprintf(buf, sizeof(buf),
                 "HTTP/1.1 %d %s\r\n"
                 "Retry-After: %lld\r\n"
                 "Content-Type: text/plain\r\n"
                 "Content-Length: %zu\r\n"
                 "Connection: close\r\n"
                 "\r\n"
                 "%s\n", status, reason, secs, strlen(reason) + 1, reason);
    (void)send(cfd, buf, (size_t)n, MSG_DONTWAIT | MSG_NOSIGNAL);
    (void)shutdown(cfd, SHUT_WR);
    drain_request(cfd);
    (void)close(cfd);
}

/* A refused connection gets the rule's action: closed, or answered 429
 * (over the Redis limit, retry_ms from the decision) or 503 (`local`:
 * the rule's local_concurrency places are all held). */
static void refuse_conn(int cfd, const shim_rule_t *r, int local,
                        int64_t retry_ms)
{
    if (r->action != SHIM_ACT_HTTP429) {
        (void)close(cfd);
    }
    else if (local) {
        reject_http(cfd, 503, "Service Unavailable", 1000);
    }
    else {
        reject_http(cfd, 429, "Too Many Requests", retry_ms);
    }
}

/* A local place of rule r for the connection about to be decided, into
 * *place (table NULL: the rule has no local cap). When all N are held
 * and one of this process's connections of the rule has lost its peer,
 * that one's place is given back first (shim_reclaim_gone()). 1, or 0
 * when every place is held. */
static int take_place(const shim_rule_t *r, shim_place_t *place)
{
    uint32_t tag = (uint32_t)shim_core_adopt_pid();
    uint32_t epoch = shim_slots_epoch(r, NULL, 0, 0);

    return shim_local_take(r, tag, place)
           || (shim_reclaim_gone(r, NULL, 0, 0, epoch)
               && shim_local_take(r, tag, place));
}

/* Decide on the connection cfd, accepted under rule r from `peer` (plen
 * bytes): the local place first, so that a connection the host is full
 * for costs no Redis call, then Redis when the rule asks it, giving the
 * place back if Redis refuses. A refusal by the key's concurrency is
 * asked again once when one of this process's connections of that key
 * has lost its peer and gave its slot back: a client that reads its
 * answer and connects again before the program has closed the last
 * connection is not refused by its own limit. 1 when the connection goes
 * to the program, holding what it took until the program closes it; 0
 * when it was refused, answered and closed. */
static int admit(int cfd, const shim_rule_t *r,
                 const struct sockaddr_storage *peer, socklen_t plen)
{
    char ipbuf[TB_IP_KEY_LEN];
    const char *key = "";
    size_t klen = 0;
    shim_place_t place;
    tb_result_t res;

    place.table = NULL;
    if (r->local_concurrency != 0 && !take_place(r, &place)) {
        refuse_conn(cfd, r, 1, 0);
        return 0;
    }
    memset(&res.slot, 0, sizeof(res.slot));
    if (shim_rule_uses_redis(r)) {
        uint32_t epoch;

        klen = shim_inbound_key(r, peer, plen, shim_conf.ipv6_bits, ipbuf,
                                sizeof(ipbuf), &key);
        epoch = shim_slots_epoch(r, key, klen, 1);
        shim_decide(r, key, klen, &res);
        if (!res.allowed && res.refused_by == TB_LIMIT_CONCURRENCY
            && shim_reclaim_gone(r, key, klen, 1, epoch)) {
            shim_decide(r, key, klen, &res);
        }
        if (!res.allowed) {
            shim_local_give(&place, cfd);
            refuse_conn(cfd, r, 0, res.retry_ms);
            return 0;
        }
    }
    if ((res.slot.kind != TB_SLOT_NONE || place.table != NULL)
        && shim_hold(cfd, r, key, klen, &res.slot, &place) != 0) {
        /* No room to keep them: given back; the server is full. */
        refuse_conn(cfd, r, 1, 0);
        return 0;
    }
    return 1;
}

/* accept()/accept4() under the inbound rules. The peer address is always
 * fetched (the key may need it) and copied out to the caller's buffer
 * with accept()'s truncation rules. */
/* 1 when a signal pending now, and not blocked by the program's mask
 * old, has a handler installed without SA_RESTART: had it arrived in the
 * program's own accept(), that accept() would have failed with EINTR. */
static int interrupting_signal_pending(const sigset_t *old)
{
    struct sigaction sa;
    sigset_t pending;
    int sig;

    if (sigpending(&pending) != 0) {
        return 0;
    }
    for (sig = 1; sig < NSIG; sig++) {
        if (sigismember(&pending, sig) == 1 && sigismember(old, sig) != 1
            && sigaction(sig, NULL, &sa) == 0
            && sa.sa_handler != SIG_DFL && sa.sa_handler != SIG_IGN
            && !(sa.sa_flags & SA_RESTART)) {
            return 1;
        }
    }
    return 0;
}

/* Decide on an accepted connection with the program's signals held, so
 * that a signal arriving while a refused connection is handled is not
 * lost in the accept() that follows: a program whose SIGTERM handler
 * only sets a flag relies on that accept() failing with EINTR, and
 * without this would wait in it for the next client. The signal is
 * delivered when the mask is restored; *interrupted says whether the
 * program's accept() must now fail with EINTR (a handler without
 * SA_RESTART), as the kernel's would. 1 when the connection goes to the
 * program. */
static int admit_held(int cfd, const shim_rule_t *r,
                      const struct sockaddr_storage *peer, socklen_t plen,
                      int *interrupted)
{
    sigset_t all, old;
    int ok;

    sigfillset(&all);
    *interrupted = 0;
    if (pthread_sigmask(SIG_BLOCK, &all, &old) != 0) {
        return admit(cfd, r, peer, plen);
    }
    ok = admit(cfd, r, peer, plen);
    if (!ok) {
        *interrupted = interrupting_signal_pending(&old);
    }
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    return ok;
}

static int limited_accept(int fd, struct sockaddr *addr, socklen_t *alen,
                          int flags, int plain)
{
    struct sockaddr_storage peer;
    socklen_t plen;
    int saved = errno, cfd, rejects = 0, nonblock = -1, interrupted;

    for (;;) {
        const shim_rule_t *r;

        plen = sizeof(peer);
        cfd = call_accept4(fd, (struct sockaddr *)&peer, &plen, flags, plain);
        if (cfd < 0) {
            return cfd;
        }
        if ((r = match_accepted(cfd)) == NULL
            || admit_held(cfd, r, &peer, plen, &interrupted)) {
            break;
        }
        if (interrupted) {
            errno = EINTR;
            return -1;
        }
        if (nonblock < 0) {
            nonblock = is_nonblocking(fd);
        }
        if (nonblock && ++rejects >= SHIM_MAX_REJECTS) {
            errno = EAGAIN;
            return -1;
        }
    }
    if (addr != NULL && alen != NULL) {
        memcpy(addr, &peer, plen < *alen ? plen : *alen);
        *alen = plen;
    }
    errno = saved;
    return cfd;
}

SHIM_EXPORT int accept(int fd, __SOCKADDR_ARG addr, socklen_t *alen)
{
    struct sockaddr *sa = SA_PTR(addr);

    if (shim_guard || !shim_active() || shim_conf.nin == 0) {
        return call_accept4(fd, sa, alen, 0, 1);
    }
    return limited_accept(fd, sa, alen, 0, 1);
}

SHIM_EXPORT int accept4(int fd, __SOCKADDR_ARG addr, socklen_t *alen,
                        int flags)
{
    struct sockaddr *sa = SA_PTR(addr);

    if (shim_guard || !shim_active() || shim_conf.nin == 0) {
        return call_accept4(fd, sa, alen, flags, 0);
    }
    return limited_accept(fd, sa, alen, flags, 0);
}

/* ---- close --------------------------------------------------------- */

/* close() of an accepted connection that holds a concurrency slot or a
 * local place: its entry is marked as being given back, the place and the
 * slot are given back, the entry is forgotten (before the fd is closed,
 * so that a connection accepted on the same fd number by another thread
 * right after the close is not confused with this one), and then the fd
 * is closed (its result and errno are the program's). Another thread
 * whose new connection of the same key is refused meanwhile waits for
 * this release and asks again (shim_slots_reclaim()).
 *
 * Given back before the close, because the close is what the client can
 * see: its FIN tells a client that reads to the end that the answer is
 * complete, and a client that makes one request at a time connects again
 * at once. Given back after the close, the slot would still be held
 * during the Redis call that releases it, and the next connection,
 * accepted by another process or thread meanwhile, would be refused by
 * the client's own limit of 1: 1 to 4 of 300 requests through a server
 * of three pre-forked processes were (test_shim_530_03). The price is
 * that for the length of the release the program may accept one
 * connection more than its limit while this fd, about to be closed, is
 * still open.
 *
 * Every other fd costs the guard and one bit test. A guarded call (the
 * core closing its own Redis socket) and a child made without fork() go
 * straight through. */
SHIM_EXPORT int close(int fd)
{
    shim_held_t h;
    int saved;

    if (shim_guard || !shim_slots_marked(fd) || !shim_core_pid_matches()
        || !shim_slots_take(fd, &h)) {
        return call_close(fd);
    }
    saved = errno;
    shim_release(&h);
    shim_slots_done(fd);
    errno = saved;
    return call_close(fd);
}

/* ---- dlopen -------------------------------------------------------- */

/* dlopen() without RTLD_DEEPBIND while outbound rules are loaded. A
 * library opened with that flag binds its undefined symbols to its own
 * dependencies before the global scope, so libc's connect() wins over
 * ours: PHP opens every extension so, and pdo_pgsql, pgsql and curl
 * (libpq, libcurl) would connect around every rule. PHP itself drops
 * the flag in its sanitizer builds; nothing else changes.
 *
 * The forwarding call must stay a tail call (a jump): glibc reads the
 * return address to find the calling object, whose RUNPATH it searches
 * for a bare file name. The optimize attribute keeps it one in -O0
 * builds; test_shim_330_02 loads a plugin through a RUNPATH. Before
 * initialisation (and if the lookup failed) real_dlopen is resolved
 * here. */
SHIM_EXPORT __attribute__((optimize("O2", "optimize-sibling-calls")))
void *dlopen(const char *file, int flags)
{
    dlopen_fn real = __atomic_load_n(&real_dlopen, __ATOMIC_ACQUIRE);

    if (__builtin_expect(real == NULL, 0)) {
        real = (dlopen_fn)dlsym(RTLD_NEXT, "dlopen");
        if (real == NULL || real == dlopen) {
            return NULL;
        }
    }
    if ((flags & RTLD_DEEPBIND) != 0
        && __atomic_load_n(&shim_state, __ATOMIC_ACQUIRE) == ST_READY
        && shim_conf.nout > 0) {
        flags &= ~RTLD_DEEPBIND;
    }
    return real(file, flags);
}
