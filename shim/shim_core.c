/* shim_core.c -- calling the core safely from inside someone else's
 * process: the re-entrancy guard, SIGPIPE, fork, the Redis sockets of
 * our own, and the calls the shim makes (decide, hold, release, and the
 * give-back of a drained lease).
 *
 * The wrappers (tb_shim.c) never call libtb themselves: each core call
 * goes through here with a thread-local guard raised (the core's own
 * connect() and close() then pass straight through, and its sockets are
 * marked close-on-exec), cancellation held off, SIGPIPE blocked (name
 * resolution inside a core call can raise it), a fork check, and the core
 * told to verify its fds (a daemon may close them all). Concurrency slots
 * and local places are held with shim_slots.c until the program closes
 * the connection. Nothing here allocates; docs/design.md ("Inside the
 * shim", "File notes") has the details. */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "shim_int.h"

#define SHIM_MAX_FDS 64        /* Redis fds we keep track of.            */

SHIM_TLS int shim_guard;
/* Set only for the length of a core call (core_enter() to core_leave()):
 * a guarded connect() then is the core's Redis connection, not one made
 * during initialisation (NSS). */
static SHIM_TLS int shim_in_core;

/* Set once by shim_core_start(), before the wrappers limit; read with
 * shim_client_get(). Never freed: it serves the process to its end, and
 * a forked child keeps it (tb_client_after_fork() drops the parent's
 * connections). */
static tb_client_t *shim_client;
static tb_policy_t shim_policy;

/* Protects the fd table and the pid. Taken only on the matched path and
 * never across a call into the core. */
static pthread_mutex_t shim_lock = PTHREAD_MUTEX_INITIALIZER;

typedef struct shim_fd {
    int fd;
    dev_t dev;
    ino_t ino;
} shim_fd_t;

static shim_fd_t shim_fds[SHIM_MAX_FDS];
static int shim_nfds;
static pid_t shim_pid;
static int shim_warned_redis;
static int shim_warned_slots;
/* Connections this process refused because it had no room to keep what
 * they held (shim_hold()); a forked child starts at 0. Written at exit. */
static unsigned long shim_refused_untracked;

static tb_client_t *shim_client_get(void)
{
    return __atomic_load_n(&shim_client, __ATOMIC_ACQUIRE);
}

/* ---- Fork ---------------------------------------------------------- */

/* Runs in the child after fork(): the parent's Redis connections must not
 * be spoken on, so the core drops them; our locks and flags start fresh.
 * No allocation and no Redis traffic here. */
static void shim_atfork_child(void)
{
    tb_client_t *c = shim_client_get();

    pthread_mutex_init(&shim_lock, NULL);
    shim_guard = 0;
    shim_in_core = 0;
    shim_nfds = 0;
    shim_pid = getpid();
    shim_refused_untracked = 0;
    shim_slots_after_fork();
    if (c != NULL) {
        tb_client_after_fork(c);
    }
}

/* The exit handler: how many connections this process refused for want
 * of room in its table, when there were any; a program's only trace of
 * them beside the first one's warning. */
static void report_at_exit(void)
{
    unsigned long n = __atomic_load_n(&shim_refused_untracked,
                                      __ATOMIC_RELAXED);

    if (n > 0) {
        shim_warn("%lu connections refused: no room to keep their "
                  "concurrency slot or place (a table of %zu connections, "
                  "sized from RLIMIT_NOFILE at start)", n,
                  shim_slots_size());
    }
}

void shim_core_start(tb_client_t *c, tb_policy_t policy)
{
    shim_policy = policy;
    shim_pid = getpid();
    __atomic_store_n(&shim_client, c, __ATOMIC_RELEASE);
    pthread_atfork(NULL, NULL, shim_atfork_child);
    if (shim_slots_size() > 0 && atexit(report_at_exit) != 0) {
        shim_warn("cannot register the exit handler; connections refused "
                  "for want of room are not counted at exit");
    }
}

int shim_core_pid_matches(void)
{
    return getpid() == shim_pid;
}

/* ---- Our own fds --------------------------------------------------- */

/* Remember fd as a Redis connection of ours. Called from a guarded
 * connect(), that is from inside the core. */
static void fds_record(int fd)
{
    struct stat st;
    int i;

    if (fstat(fd, &st) != 0) {
        return;
    }
    /* Our socket must not leak into a program the host execs. */
    (void)fcntl(fd, F_SETFD, fcntl(fd, F_GETFD) | FD_CLOEXEC);
    pthread_mutex_lock(&shim_lock);
    for (i = 0; i < shim_nfds && shim_fds[i].fd != fd; i++) {
    }
    if (i == shim_nfds && shim_nfds < SHIM_MAX_FDS) {
        shim_nfds++;
    }
    if (i < shim_nfds) {
        shim_fds[i].fd = fd;
        shim_fds[i].dev = st.st_dev;
        shim_fds[i].ino = st.st_ino;
    }
    pthread_mutex_unlock(&shim_lock);
}

void shim_core_connected(int fd, int rc)
{
    if (shim_in_core && (rc == 0 || errno == EINPROGRESS)) {
        int saved = errno;

        fds_record(fd);
        errno = saved;
    }
}

/* 0 when the fd is open and still the socket we recorded, 1 when it was
 * closed, 2 when its number now names another file. */
static int fd_state(const shim_fd_t *e)
{
    struct stat st;

    if (fstat(e->fd, &st) != 0) {
        return 1;
    }
    return st.st_dev == e->dev && st.st_ino == e->ino ? 0 : 2;
}

int shim_fds_is_ours(int fd)
{
    int i, found = 0;

    pthread_mutex_lock(&shim_lock);
    for (i = 0; i < shim_nfds && !found; i++) {
        found = shim_fds[i].fd == fd && fd_state(&shim_fds[i]) == 0;
    }
    pthread_mutex_unlock(&shim_lock);
    return found;
}

/* Forget entries whose fd is closed: the core closed a connection during
 * the last call. Called with shim_lock held. */
static void fds_prune_closed(void)
{
    int i = 0;

    while (i < shim_nfds) {
        if (fd_state(&shim_fds[i]) == 1) {
            shim_fds[i] = shim_fds[--shim_nfds];
        }
        else {
            i++;
        }
    }
}

/* ---- One core call ------------------------------------------------- */

/* SIGPIPE blocked for this thread around a core call (see the head
 * comment for what can still raise it there), and one that the call
 * raised swallowed; a SIGPIPE already pending before is the program's
 * and is left alone. */
typedef struct sigpipe_guard {
    sigset_t old;
    int was_pending;
} sigpipe_guard_t;

static void sigpipe_block(sigpipe_guard_t *g)
{
    sigset_t set, pending;

    sigemptyset(&set);
    sigaddset(&set, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &set, &g->old);
    g->was_pending = sigpending(&pending) == 0
                     && sigismember(&pending, SIGPIPE);
}

static void sigpipe_restore(sigpipe_guard_t *g)
{
    static const struct timespec zero = {0, 0};
    sigset_t set, pending;

    if (!g->was_pending && sigpending(&pending) == 0
        && sigismember(&pending, SIGPIPE)) {
        sigemptyset(&set);
        sigaddset(&set, SIGPIPE);
        while (sigtimedwait(&set, NULL, &zero) == -1 && errno == EINTR) {
        }
    }
    pthread_sigmask(SIG_SETMASK, &g->old, NULL);
}

/* A call into the core: the guard raised for the whole call, so the
 * core's connect() and close() go straight to libc, cancellation held
 * off so that a cancelled thread cannot leave a core lock taken, and
 * SIGPIPE blocked. */
typedef struct core_call {
    sigpipe_guard_t sp;
    int cancel;
} core_call_t;

pid_t shim_core_adopt_pid(void)
{
    pid_t pid = getpid();
    tb_client_t *c;

    pthread_mutex_lock(&shim_lock);
    if (pid != shim_pid) {
        /* A child made without fork() (raw clone): no atfork ran. */
        shim_pid = pid;
        shim_nfds = 0;
        shim_refused_untracked = 0;
        shim_slots_after_fork();
        c = shim_client_get();
        if (c != NULL) {
            tb_client_after_fork(c);
        }
    }
    pthread_mutex_unlock(&shim_lock);
    return pid;
}

static tb_client_t *core_enter(core_call_t *cc)
{
    shim_guard++;
    pthread_setcancelstate(PTHREAD_CANCEL_DISABLE, &cc->cancel);
    sigpipe_block(&cc->sp);
    (void)shim_core_adopt_pid();
    shim_in_core = 1;
    return shim_client_get();
}

static void core_leave(core_call_t *cc)
{
    shim_in_core = 0;
    if (shim_nfds > 0) {
        pthread_mutex_lock(&shim_lock);
        fds_prune_closed();
        pthread_mutex_unlock(&shim_lock);
    }
    sigpipe_restore(&cc->sp);
    pthread_setcancelstate(cc->cancel, NULL);
    shim_guard--;
}

/* ---- Decide, hold, release ----------------------------------------- */

void shim_decide(const shim_rule_t *r, const char *key, size_t len,
                 tb_result_t *res)
{
    core_call_t cc;
    tb_request_t q;
    tb_client_t *c = core_enter(&cc);

    memset(&q, 0, sizeof(q));
    q.prefix = r->prefix;
    q.key = key;
    q.key_len = len;
    q.takes = &r->take;
    q.ntakes = r->take.limit.capacity > 0 ? 1 : 0;
    q.algo = r->algo;
    q.concurrency = r->concurrency;
    q.concurrency_ttl_ms = r->concurrency_ttl_ms;
    /* The core pays from the key's lease, or takes the next one in the
     * call that decides (shim_lease.c made the table). */
    q.lease = r->lease;
    q.lease_ttl_ms = r->lease_ttl_ms;
    tb_client_run(c, &q, res);
    if (res->err != TB_ERR_NONE
        && !__atomic_exchange_n(&shim_warned_redis, 1, __ATOMIC_RELAXED)) {
        shim_warn("Redis could not decide for rule \"%s\" (%s); policy "
                  "\"%s\" applies (further errors are not reported)",
                  r->name, tb_err_name(res->err),
                  tb_policy_name(shim_policy));
    }
    core_leave(&cc);
}

/* The local place first: it costs no system call, and so is free again
 * before the Redis round trip. A failure of the Redis release is not
 * reported: the slot expires by its ttl, and a Redis that fails is
 * reported by the next decision. */
void shim_release(const shim_held_t *h)
{
    core_call_t cc;
    tb_request_t q;
    tb_client_t *c;

    shim_local_give(&h->place, h->fd);
    if (h->slot.kind == TB_SLOT_NONE) {
        return;
    }
    c = core_enter(&cc);
    memset(&q, 0, sizeof(q));
    q.prefix = h->rule->prefix;
    q.key = shim_held_key(h, &q.key_len);
    q.concurrency_ttl_ms = h->rule->concurrency_ttl_ms;
    (void)tb_client_release(c, &q, &h->slot);
    core_leave(&cc);
}

int shim_give_back(const char *rkey, const tb_limit_t *lim, double tokens,
                   int *err)
{
    core_call_t cc;
    tb_result_t res;
    tb_client_t *c = core_enter(&cc);
    int rc = TB_ERR;

    *err = TB_ERR_ARG;
    if (c != NULL) {
        rc = tb_client_give_back(c, rkey, lim, tokens, &res);
        *err = rc == TB_OK ? TB_ERR_NONE : res.err;
    }
    core_leave(&cc);
    return rc;
}

/* A slot or place that cannot be tracked (an fd past SHIM_SLOT_FDS, the
 * table of held connections full, a $peer key too long to keep) is given
 * back at once and the caller refuses the connection: letting it through
 * uncounted would lift the limit for everyone once the table is full.
 * The first such case is reported, and every one counted for the line
 * written at exit. */
int shim_hold(int cfd, const shim_rule_t *r, const char *key, size_t klen,
              const tb_slot_t *slot, const shim_place_t *place)
{
    shim_held_t h;
    int kept = -1;

    memset(&h, 0, sizeof(h));
    h.fd = cfd;
    h.rule = r;
    h.slot = *slot;
    h.place = *place;
    /* Only a $peer key is kept; the others are the rule's own. */
    if (r->key_kind != SHIM_KEY_PEER || klen < sizeof(h.peer)) {
        if (r->key_kind == SHIM_KEY_PEER) {
            memcpy(h.peer, key, klen);
        }
        kept = shim_slots_hold(&h);
    }
    if (kept == 0) {
        return 0;
    }
    __atomic_add_fetch(&shim_refused_untracked, 1, __ATOMIC_RELAXED);
    if (!__atomic_exchange_n(&shim_warned_slots, 1, __ATOMIC_RELAXED)) {
        shim_warn("rule \"%s\": no room to keep the concurrency slot or "
                  "place of fd %d (a table of %zu connections, sized from "
                  "RLIMIT_NOFILE at start); such connections are refused, "
                  "and counted at exit (further cases are not reported)",
                  r->name, cfd, shim_slots_size());
    }
    snprintf(h.peer, sizeof(h.peer), "%.*s", (int)klen, key);
    shim_release(&h);
    return -1;
}

int shim_reclaim_gone(const shim_rule_t *r, const char *key, size_t klen,
                      int same_key, uint32_t epoch)
{
    shim_held_t h;

    if (!shim_slots_reclaim(r, key, klen, same_key, epoch, &h)) {
        return 0;
    }
    shim_release(&h);
    return 1;
}
