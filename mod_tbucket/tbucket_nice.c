/* tbucket_nice.c -- the helper that sets worker threads' nice values for
 * TBucketCPUPriority where the workers may not raise their own back (no
 * RLIMIT_NICE headroom and no way to give them one: a container without
 * CAP_SYS_RESOURCE), while Apache's parent runs as root with CAP_SYS_NICE.
 *
 * The parent forks it once and keeps it across restarts (it dies with
 * the parent). Children send it datagrams {thread id, nice} on one
 * socket, so a thread's changes are applied in the order they were
 * asked. It checks each against the sender's kernel-given credentials:
 * the worker's uid, a thread of the sender's own process, a nice value
 * in the configured range. Nothing else is ever done with root's power.
 */
#include "apr_strings.h"

#include <errno.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "httpd.h"
#include "http_config.h"
#include "http_log.h"
#include "unixd.h"

#include "mod_tbucket.h"

APLOG_USE_MODULE(tbucket);

#define HELPER_KEY "tbucket_nice_helper"
#define NICE_TOP (-20)

typedef struct nice_msg {
    int32_t tid;
    int32_t nice;
} nice_msg;

/* The helper as the parent knows it, in the process pool: it outlives
 * the module's own reloads. */
typedef struct nice_helper {
    pid_t pid;
    int fd;                           /* Children send on this end.     */
    int lo, hi;                       /* The range it accepts.          */
    uid_t uid;                        /* The workers' uid.              */
} nice_helper;

/* One request: applied when its sender may ask for it. */
static void serve_one(const nice_msg *m, const struct ucred *cr, int lo,
                      int hi, uid_t uid)
{
    char path[64];
    struct stat st;

    if (cr->uid != uid || m->nice < lo || m->nice > hi || m->tid <= 0) {
        return;
    }
    /* The thread must be the sender's own: a worker moves only itself. */
    snprintf(path, sizeof(path), "/proc/%d/task/%d", (int)cr->pid,
             (int)m->tid);
    if (stat(path, &st) == 0) {
        setpriority(PRIO_PROCESS, (id_t)m->tid, m->nice);
    }
}

/* The helper's life: read, check, apply, until the parent dies. */
static void helper_main(int fd, int lo, int hi, uid_t uid, pid_t parent)
{
    int one = 1;
    nice_msg m;
    char cbuf[CMSG_SPACE(sizeof(struct ucred))];
    struct iovec iov = { &m, sizeof(m) };
    struct msghdr mh;
    struct cmsghdr *c;
    ssize_t n;

    prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (getppid() != parent) {
        _exit(0);
    }
    prctl(PR_SET_NAME, "tbucket-nice");
    signal(SIGTERM, SIG_DFL);
    signal(SIGHUP, SIG_IGN);
    signal(SIGUSR1, SIG_IGN);
    signal(SIGWINCH, SIG_IGN);
    /* None of the parent's listeners, logs or pipes: only the socket. */
    if (dup2(fd, 3) == 3) {
        close_range(4, ~0U, 0);
        fd = 3;
    }
    setsockopt(fd, SOL_SOCKET, SO_PASSCRED, &one, sizeof(one));
    /* At the top of the nice scale: a move waits for the helper, and a
     * helper that shares the CPU with the flood it lowers delays the
     * critical request's own move. It does a few microseconds a
     * message, so it takes little from anyone. */
    setpriority(PRIO_PROCESS, 0, NICE_TOP);
    for (;;) {
        memset(&mh, 0, sizeof(mh));
        mh.msg_iov = &iov;
        mh.msg_iovlen = 1;
        mh.msg_control = cbuf;
        mh.msg_controllen = sizeof(cbuf);
        n = recvmsg(fd, &mh, 0);
        if (n < 0 && errno == EINTR) {
            continue;
        }
        if (n <= 0) {
            _exit(0);
        }
        c = CMSG_FIRSTHDR(&mh);
        if (n == sizeof(m) && c && c->cmsg_level == SOL_SOCKET
            && c->cmsg_type == SCM_CREDENTIALS) {
            struct ucred cr;

            memcpy(&cr, CMSG_DATA(c), sizeof(cr));
            serve_one(&m, &cr, lo, hi, uid);
        }
    }
}

/* Stop an earlier helper whose range or uid no longer fits. */
static void stop_helper(nice_helper *h)
{
    if (h->pid > 0) {
        kill(h->pid, SIGTERM);
        waitpid(h->pid, NULL, 0);
    }
    if (h->fd >= 0) {
        close(h->fd);
    }
    h->pid = 0;
    h->fd = -1;
}

int tbucket_nice_helper(server_rec *main_s, int lo, int hi)
{
    apr_pool_t *pp = main_s->process->pool;
    uid_t uid = ap_unixd_config.user_id;
    nice_helper *h = NULL;
    int sv[2];
    pid_t pid;

    apr_pool_userdata_get((void **)&h, HELPER_KEY, pp);
    if (h && h->pid > 0 && h->lo == lo && h->hi == hi && h->uid == uid
        && kill(h->pid, 0) == 0) {
        return h->fd;
    }
    if (!h) {
        h = apr_pcalloc(pp, sizeof(*h));
        h->fd = -1;
        apr_pool_userdata_set(h, HELPER_KEY, apr_pool_cleanup_null, pp);
    }
    stop_helper(h);
    /* CLOEXEC: a CGI that a worker forks must not be able to ask. */
    if (socketpair(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0, sv) != 0) {
        ap_log_error(APLOG_MARK, APLOG_EMERG, errno, main_s, TBLOGNO(00181)
                     "TBucketCPUPriority: no socket for the priority "
                     "helper");
        return -1;
    }
    pid = fork();
    if (pid == 0) {
        close(sv[0]);
        helper_main(sv[1], lo, hi, uid, getppid());
        _exit(0);
    }
    close(sv[1]);
    if (pid < 0) {
        close(sv[0]);
        ap_log_error(APLOG_MARK, APLOG_EMERG, errno, main_s, TBLOGNO(00182)
                     "TBucketCPUPriority: cannot fork the priority helper");
        return -1;
    }
    h->pid = pid;
    h->fd = sv[0];
    h->lo = lo;
    h->hi = hi;
    h->uid = uid;
    return h->fd;
}

int tbucket_nice_ask(int fd, pid_t tid, int nice)
{
    nice_msg m;

    m.tid = (int32_t)tid;
    m.nice = (int32_t)nice;
    return send(fd, &m, sizeof(m), MSG_DONTWAIT | MSG_NOSIGNAL)
           == (ssize_t)sizeof(m) ? 0 : -1;
}
