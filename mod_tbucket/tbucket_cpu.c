/* tbucket_cpu.c -- CPU priority that follows request priority
 * (TBucketCPUPriority): while a worker serves a request whose priority
 * has a nice step other than 0, its thread runs that many nice steps
 * from the worker's own, and is put back when its connection ends or
 * before the thread reads another request, whichever comes first.
 *
 * Nice values, per thread (Linux gives each thread its own): graded,
 * inherited by a CGI that mod_cgi forks, and never starving a low
 * request that holds a lock a critical one waits for, as SCHED_IDLE
 * could. Putting a thread back needs RLIMIT_NICE, raised by the parent
 * before its children drop root; where it cannot be, a root parent's
 * helper does it (tbucket_nice.c). Why, and what it leaves out:
 * docs/design.md, "CPU priority".
 */
#include "apr_strings.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "httpd.h"
#include "http_config.h"
#include "http_connection.h"
#include "http_log.h"
#include "http_protocol.h"
#include "http_request.h"

#include "mod_tbucket.h"

APLOG_USE_MODULE(tbucket);

#define NICE_MIN (-20)
#define NICE_MAX 19
/* A low request's step when TBucketCPUPriority On names none: about a
 * tenth of a normal thread's CPU share when both want the CPU. */
#define LOW_STEP 10
/* How long a request waits for a move asked of the helper to land: up
 * to SETTLE_TRIES sleeps of SETTLE_NS nanoseconds (about 10 ms with the
 * kernel's timer slack; a helper that runs lands it in one or two). */
#define SETTLE_TRIES 100
#define SETTLE_NS 50000L

/* What the running configuration does, copied at check time from the
 * main server's record (where the directive puts TBucketCPUPriority's
 * settings), and the worker's own nice, read in each child. */
static struct {
    int step[TBUCKET_PRIOS];          /* All 0 when Off.                */
    int mode;                         /* How a thread is moved.         */
    int fd;                           /* MODE_HELPER: the helper's.     */
} cpu;

enum {
    MODE_NONE = 0,                    /* Every step is 0: nothing moves.*/
    MODE_DIRECT,                      /* setpriority, RLIMIT_NICE lets. */
    MODE_HELPER                       /* Asked of tbucket_nice.c's.     */
};
static int base_nice;

/* One worker thread's state, made on its first move and kept for its
 * life. word is serial << 8 | (step + 128): the step it runs at now, and
 * how many times it was moved, so that a give-back made for an earlier
 * request (perhaps from another thread, after write completion) leaves a
 * later one alone. */
typedef struct cpu_thread {
    pid_t tid;
    int pending;                      /* MODE_HELPER: a move asked of
                                       * the helper may not be done.    */
    uint64_t word;
} cpu_thread;

static __thread cpu_thread *self;

/* What a connection gives back when it ends: the thread and the word
 * its last moved request set; one per connection, in its pool and its
 * conn_config slot (the module's only use of that slot). */
typedef struct cpu_restore {
    cpu_thread *t;
    uint64_t word;
} cpu_restore;

#define STEP_OF(w) ((int)((w) & 0xff) - 128)
#define WORD(serial, step) (((serial) << 8) | (uint64_t)((step) + 128))

/* ---- Configuration -------------------------------------------------- */

void tbucket_cpu_pre_config(void)
{
    memset(&cpu, 0, sizeof(cpu));
    cpu.fd = -1;
}

#define STEP(p) (APR_OFFSETOF(tbucket_srv_conf, cpu_step) \
                 + (p) * sizeof(int))
#define STEP_OPT(name, p) { name, TBUCKET_V_INT, TBUCKET_AT_INT, STEP(p), \
    0, NICE_MIN, NICE_MAX, 0, NULL, "N",                                 \
    "nice steps from the worker's own, -20..19", NULL }

static const tbucket_value cpu_opts[] = {
    STEP_OPT("low", TBUCKET_PRIO_LOW),
    STEP_OPT("normal", TBUCKET_PRIO_NORMAL),
    STEP_OPT("high", TBUCKET_PRIO_HIGH),
    STEP_OPT("critical", TBUCKET_PRIO_CRITICAL),
    { NULL }
};

/* TBucketCPUPriority On [low=N] [normal=N] [high=N] [critical=N] | Off:
 * N nice steps from the worker's own, -20..19, into the main server's
 * record. */
const char *tbucket_cpu_set(cmd_parms *cmd, void *dummy, const char *args)
{
    tbucket_srv_conf *sc = ap_get_module_config(cmd->server->module_config,
                                                &tbucket_module);
    const char *err = ap_check_cmd_context(cmd, GLOBAL_ONLY);
    const char *first;

    (void)dummy;
    if (err) {
        return err;
    }
    memset(sc->cpu_step, 0, sizeof(sc->cpu_step));
    sc->cpu_on = 0;
    first = ap_getword_conf(cmd->temp_pool, &args);
    if (!strcasecmp(first, "off") && !*args) {
        return NULL;
    }
    if (strcasecmp(first, "on")) {
        /* All of it: "Off low=5" is refused for what follows Off. */
        return apr_psprintf(cmd->pool, "TBucketCPUPriority: expected On "
                            "[low=N] [normal=N] [high=N] [critical=N] or "
                            "Off, not '%s%s%s'", first, *args ? " " : "",
                            args);
    }
    sc->cpu_on = 1;
    sc->cpu_step[TBUCKET_PRIO_LOW] = LOW_STEP;
    return tbucket_options(cmd, cpu_opts, sc, NULL, args, NULL);
}

/* The parent's nice value, which its children start with. */
static int base_nice_of_parent(void)
{
    int v;

    errno = 0;
    v = getpriority(PRIO_PROCESS, 0);
    return v == -1 && errno ? 0 : v;
}

/* The lowest nice value a worker may need: its own, or below it for a
 * negative step. */
static int lowest_nice(int base)
{
    int k, lo = 0;

    for (k = 0; k < TBUCKET_PRIOS; k++) {
        lo = cpu.step[k] < lo ? cpu.step[k] : lo;
    }
    return base + lo < NICE_MIN ? NICE_MIN : base + lo;
}

/* 1 when this process has CAP_SYS_NICE in effect (bit 23 of CapEff). */
static int can_sys_nice(void)
{
    char line[128];
    unsigned long long eff = 0;
    FILE *f = fopen("/proc/self/status", "r");
    int found = 0;

    while (f && !found && fgets(line, sizeof(line), f)) {
        found = sscanf(line, "CapEff: %llx", &eff) == 1;
    }
    if (f) {
        fclose(f);
    }
    return found && (eff >> 23 & 1);
}

/* RLIMIT_NICE of at least need, raised if the process may: 1, or 0
 * with *rl the limit as it is. */
static int nice_limit(rlim_t need, struct rlimit *rl)
{
    struct rlimit want;

    if (getrlimit(RLIMIT_NICE, rl) != 0) {
        return 0;
    }
    if (rl->rlim_cur == RLIM_INFINITY || rl->rlim_cur >= need) {
        return 1;
    }
    want.rlim_cur = need;
    want.rlim_max = rl->rlim_max != RLIM_INFINITY && rl->rlim_max < need
                    ? need : rl->rlim_max;
    return setrlimit(RLIMIT_NICE, &want) == 0;
}

const char *tbucket_cpu_check(apr_pool_t *p, server_rec *main_s)
{
    const tbucket_srv_conf *sc = ap_get_module_config(main_s->module_config,
                                                      &tbucket_module);
    struct rlimit rl;
    int base, k, any = 0;
    rlim_t need;

    for (k = 0; k < TBUCKET_PRIOS; k++) {
        cpu.step[k] = sc->cpu_on ? sc->cpu_step[k] : 0;
        any |= cpu.step[k] != 0;
    }
    cpu.mode = MODE_NONE;
    if (!any) {
        return NULL;
    }
    errno = 0;
    base = getpriority(PRIO_PROCESS, 0);
    if (base == -1 && errno) {
        return apr_psprintf(p, "TBucketCPUPriority On: cannot read this "
                            "process's nice value: %s", strerror(errno));
    }
    /* An unprivileged thread may lower its nice value to 20 - limit. */
    need = (rlim_t)(20 - lowest_nice(base));
    if (nice_limit(need, &rl)) {
        cpu.mode = MODE_DIRECT;
        return NULL;
    }
    if (geteuid() == 0 && can_sys_nice()) {
        cpu.mode = MODE_HELPER;
        return NULL;
    }
    return apr_psprintf(p, "TBucketCPUPriority On: a worker that has "
                        "lowered its priority can only raise it back to "
                        "nice %d with RLIMIT_NICE >= %lu, and this Apache "
                        "(uid %ld) has %lu (hard %lu) and may not raise it "
                        "(nor, not being root with CAP_SYS_NICE, start a "
                        "helper that could): start Apache as root, raise "
                        "the limit first (ulimit -e %lu; systemd: "
                        "LimitNICE=%lu), or set TBucketCPUPriority Off",
                        lowest_nice(base), (unsigned long)need,
                        (long)geteuid(), (unsigned long)rl.rlim_cur,
                        (unsigned long)rl.rlim_max, (unsigned long)need,
                        (unsigned long)need);
}

int tbucket_cpu_post_config(server_rec *main_s)
{
    int hi = 0, k;

    if (cpu.mode != MODE_HELPER) {
        return OK;
    }
    /* The helper accepts from the lowest nice a step needs to the
     * highest: nothing a worker could ask beyond its configuration. */
    for (k = 0; k < TBUCKET_PRIOS; k++) {
        hi = cpu.step[k] > hi ? cpu.step[k] : hi;
    }
    hi += base_nice_of_parent();
    cpu.fd = tbucket_nice_helper(main_s, lowest_nice(base_nice_of_parent()),
                                 hi > NICE_MAX ? NICE_MAX : hi);
    if (cpu.fd < 0) {
        return HTTP_INTERNAL_SERVER_ERROR;
    }
    ap_log_error(APLOG_MARK, APLOG_INFO, 0, main_s, TBLOGNO(00183)
                 "TBucketCPUPriority: workers may not raise their own "
                 "priority back (RLIMIT_NICE cannot be raised here), so a "
                 "root helper moves their threads");
    return OK;
}

void tbucket_cpu_child_init(void)
{
    errno = 0;
    base_nice = getpriority(PRIO_PROCESS, 0);
    if (base_nice == -1 && errno) {
        base_nice = 0;
    }
}

/* ---- The request path ----------------------------------------------- */

static cpu_thread *thread_state(void)
{
    if (!self && (self = calloc(1, sizeof(*self))) != NULL) {
        self->tid = (pid_t)syscall(SYS_gettid);
        self->word = WORD(0, 0);
    }
    return self;
}

static int nice_of(int step)
{
    int v = base_nice + step;

    return v < NICE_MIN ? NICE_MIN : v > NICE_MAX ? NICE_MAX : v;
}

/* Move thread t from nice `from` to `to`. With the helper, a move up
 * the nice scale (less CPU) is made at once by the thread itself, so
 * that a CGI forked next inherits it, once the helper's last move for
 * it is seen done; a move down goes through the helper, and so does any
 * move while one may be pending there: the helper keeps their order.
 * 0, or -1 when refused. Async-signal-safe. */
static int apply(cpu_thread *t, int from, int to)
{
    if (cpu.mode == MODE_HELPER) {
        if (to >= from && t->pending) {
            errno = 0;
            t->pending = getpriority(PRIO_PROCESS, (id_t)t->tid) != from;
        }
        if (to < from || t->pending) {
            t->pending = 1;
            return tbucket_nice_ask(cpu.fd, t->tid, to);
        }
    }
    return setpriority(PRIO_PROCESS, (id_t)t->tid, to);
}

/* Put t back at the worker's own nice if it still runs at word: from
 * any thread (setpriority takes a thread id), async-signal-safe. */
static void restore(cpu_thread *t, uint64_t word)
{
    uint64_t back = WORD(word >> 8, 0);

    if (STEP_OF(word) != 0
        && __atomic_compare_exchange_n(&t->word, &word, back, 0,
                                       __ATOMIC_ACQ_REL, __ATOMIC_RELAXED)) {
        apply(t, nice_of(STEP_OF(word)), base_nice);
    }
}

static apr_status_t restore_at_end(void *data)
{
    cpu_restore *c = data;

    restore(c->t, c->word);
    return APR_SUCCESS;
}

/* Give t back when connection c ends, unless a request read before then
 * (cpu_pre_read_request) or another connection on the thread
 * (cpu_pre_connection) puts it back first. Not at the response's end:
 * the response's last write, its log line and, for a connection that
 * closes (every 503 does), the lingering close are the request's work
 * too, and under a flood of refused reconnections they were most of
 * what the flood took at the workers' own nice. One record per
 * connection, so a long keep-alive connection does not grow its pool. */
static void restore_at_close(conn_rec *conn, cpu_thread *t, uint64_t word)
{
    cpu_restore *c = ap_get_module_config(conn->conn_config,
                                          &tbucket_module);

    if (!c) {
        c = apr_palloc(conn->pool, sizeof(*c));
        ap_set_module_config(conn->conn_config, &tbucket_module, c);
        apr_pool_pre_cleanup_register(conn->pool, c, restore_at_end);
    }
    else if (c->t != t) {
        /* The event MPM served the connection's last moved request on
         * another thread, now idle: it goes back now, not never. */
        restore(c->t, c->word);
    }
    c->t = t;
    c->word = word;
}

/* Wait, bounded, until a move asked of the helper has landed on t: the
 * handler runs next, and a CGI that mod_cgi forks keeps the nice value
 * its thread has at the fork for its whole life. Without the wait, one
 * critical CGI in six forked before the helper's move to its negative
 * step, and a CGI pipelined after a low request on the same prefork
 * worker could run at low's step. Nothing to do without the helper. */
static void settle(cpu_thread *t)
{
    struct timespec pause = { 0, SETTLE_NS };
    int want, k;

    if (!t || !t->pending) {
        return;
    }
    want = nice_of(STEP_OF(__atomic_load_n(&t->word, __ATOMIC_ACQUIRE)));
    for (k = 0; k < SETTLE_TRIES; k++) {
        errno = 0;
        if (getpriority(PRIO_PROCESS, (id_t)t->tid) == want && !errno) {
            t->pending = 0;
            return;
        }
        nanosleep(&pause, NULL);
    }
}

void tbucket_cpu_enter(request_rec *r, request_rec *root,
                       const tbucket_dir_conf *dc)
{
    tbucket_priority prio = tbucket_dir_priority(dc);
    cpu_thread *t = self;
    uint64_t word;

    if (cpu.mode == MODE_NONE) {
        return;
    }
    if (cpu.step[prio] == (t ? STEP_OF(t->word) : 0)
        || !(t = thread_state())) {
        settle(t);
        return;
    }
    word = __atomic_load_n(&t->word, __ATOMIC_ACQUIRE);
    if (apply(t, nice_of(STEP_OF(word)), nice_of(cpu.step[prio])) != 0) {
        ap_log_rerror(APLOG_MARK, APLOG_DEBUG, errno, r, TBLOGNO(00180)
                      "TBucketCPUPriority: nice %d for a %s request "
                      "refused", nice_of(cpu.step[prio]),
                      tbucket_priority_names[prio]);
        tbucket_count_cpu(prio, 1);
        return;
    }
    word = WORD((word >> 8) + 1, cpu.step[prio]);
    __atomic_store_n(&t->word, word, __ATOMIC_RELEASE);
    tbucket_count_cpu(prio, 0);
    settle(t);
    if (cpu.step[prio] != 0) {
        restore_at_close(root->connection, t, word);
    }
}

/* The last fixup, for requests the decision path never saw (a scope
 * without TBucketEnable On): r is let through (every refusal ends the
 * phase before), so its thread takes its priority's step for the
 * response, and has it (settle) before the handler runs. A thread
 * already at the step costs one load. */
static int cpu_fixups(request_rec *r)
{
    request_rec *root;

    if (cpu.mode == MODE_NONE || r->main) {
        return DECLINED;
    }
    for (root = r; root->prev; root = root->prev) {
    }
    tbucket_cpu_enter(r, root, ap_get_module_config(r->per_dir_config,
                                                    &tbucket_module));
    return DECLINED;
}

/* Put this thread back if it still runs at a request's step. One load
 * when it does not. */
static void restore_self(void)
{
    cpu_thread *t = self;

    if (t) {
        restore(t, __atomic_load_n(&t->word, __ATOMIC_ACQUIRE));
    }
}

/* A request is about to be read on this thread (never a sub-request or
 * an internal redirect: httpd runs this hook from ap_read_request only):
 * the thread is put back before it reads, whatever it served before. */
static void cpu_pre_read_request(request_rec *r, conn_rec *c)
{
    (void)r;
    (void)c;
    restore_self();
}

/* A new connection on this thread (the event MPM's thread may take one
 * while the connection of its last low request waits in keep-alive): its
 * TLS handshake and first read run at the worker's own nice. */
static int cpu_pre_connection(conn_rec *c, void *csd)
{
    (void)c;
    (void)csd;
    restore_self();
    return OK;
}

void tbucket_cpu_register(void)
{
    ap_hook_fixups(cpu_fixups, NULL, NULL, APR_HOOK_REALLY_LAST);
    ap_hook_pre_read_request(cpu_pre_read_request, NULL, NULL,
                             APR_HOOK_MIDDLE);
    ap_hook_pre_connection(cpu_pre_connection, NULL, NULL,
                           APR_HOOK_REALLY_FIRST);
}
