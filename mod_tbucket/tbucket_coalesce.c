/* tbucket_coalesce.c -- the host's coalescers (TBucketRedis ...
 * coalesce=on): processes that carry every child's decisions to Redis as
 * pipelines on one connection, one per primary of a Cluster (the core's
 * tb_coalescer_run).
 *
 * The parent forks one per distinct Redis configuration in post_config,
 * as mod_cgid forks its daemon: it binds a unix socket in a directory of
 * the runtime dir that belongs to User (0700; the socket 0600), then
 * takes User's identity. A coalescer that dies is forked again from the
 * MPM's maintenance (other-child) callback; one whose configuration is
 * unchanged is kept across graceful restarts, so nothing in flight is
 * lost; one no longer configured is retired: it stops listening and
 * serves the old children still connected until they leave. It goes
 * with the parent (SIGTERM, and the parent-death signal). The children's
 * clients are unchanged but for their URL, "unix:" and the socket: what
 * the coalescer cannot answer in time, their breaker and failure policy
 * decide, as for Redis itself. Lines it logs go to stderr, which is the
 * main error log: none of the parent's other descriptors stay open in it.
 */
#include "apr_strings.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "httpd.h"
#include "http_config.h"
#include "http_log.h"
#include "ap_mpm.h"
#include "mod_unixd.h"
#include "unixd.h"

#include "mod_tbucket.h"

APLOG_USE_MODULE(tbucket);

#define REGISTRY_KEY "tbucket_coalescers"
/* How long a retired or stopped coalescer serves the children still
 * connected to it: a graceful restart's old children finish their
 * requests through it. */
#define LINGER_MS 30000

/* One coalescer as the parent knows it, in the process pool: it
 * outlives the module's reloads. */
typedef struct coal {
    struct coal *next;
    const char *key;          /* Its Redis configuration.              */
    const char *path;         /* Its socket.                           */
    apr_proc_t proc;          /* pid 0: not running.                   */
    int wanted;               /* Configured in this generation.        */
    int retired;              /* SIGTERM sent: let it drain and go.    */
    const tbucket_srv_conf *sc; /* This generation's (pconf).          */
    server_rec *s;
    apr_pool_t *pconf;
} coal;

typedef struct registry {
    coal *first;
} registry;

static volatile sig_atomic_t stop_now;

static void on_term(int sig)
{
    (void)sig;
    stop_now = 1;
}

static tbucket_srv_conf *srv_conf(const server_rec *s)
{
    return ap_get_module_config(s->module_config, &tbucket_module);
}

/* A line in the main error log from the coalescer, whose only log is
 * stderr. */
static void say(const char *level, const char *fmt, const char *a,
                const char *b)
{
    char line[512];
    int n = snprintf(line, sizeof(line), "[tbucket:%s] [pid %ld] ", level,
                     (long)getpid());

    if (n > 0 && (size_t)n < sizeof(line)) {
        snprintf(line + n, sizeof(line) - (size_t)n, fmt, a, b);
    }
    fprintf(stderr, "[%s] %s\n", "coalescer", line);
    fflush(stderr);
}

static registry *get_registry(apr_pool_t *pp)
{
    registry *r = NULL;

    apr_pool_userdata_get((void **)&r, REGISTRY_KEY, pp);
    if (!r) {
        r = apr_pcalloc(pp, sizeof(*r));
        apr_pool_userdata_set(r, REGISTRY_KEY, apr_pool_cleanup_null, pp);
    }
    return r;
}

/* What makes two coalescers the same: the Redis they reach and how. */
static const char *coal_key(apr_pool_t *p, const tbucket_srv_conf *sc)
{
    const tb_tls_options_t *t = &sc->tls;

    return apr_psprintf(p, "%s|%d|%d|%s|%s|%s|%s|%d",
                        sc->url ? sc->url : TB_DEFAULT_URL, sc->timeout_ms,
                        sc->connect_timeout_ms,
                        t->ca_file ? t->ca_file : "",
                        t->cert_file ? t->cert_file : "",
                        t->key_file ? t->key_file : "",
                        t->server_name ? t->server_name : "",
                        t->no_verify);
}

/* The process's life once forked: listen, become User, serve. */
static void coal_main(const coal *d, pid_t parent)
{
    const tbucket_srv_conf *sc = d->sc;
    tb_coalescer_options_t o;
    tb_coalescer_stats_t st;
    tb_coalescer_t *c;
    struct sigaction sa;
    struct rlimit nofile;
    sigset_t none;
    char err[TB_ERRSTR_LEN + 64], figures[160];
    int rc;

    prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (getppid() != parent) {
        _exit(0);
    }
    prctl(PR_SET_NAME, "tbucket-coal");
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = on_term;
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    /* A restart (SIGHUP, SIGUSR1, SIGWINCH to the process group) keeps
     * it: post_config decides whether it stays. */
    signal(SIGHUP, SIG_IGN);
    signal(SIGUSR1, SIG_IGN);
    signal(SIGWINCH, SIG_IGN);
    signal(SIGPIPE, SIG_IGN);
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
    /* None of the parent's listeners, logs or pipes: its stderr only. */
    close_range(3, ~0U, 0);
    /* A socket per child and configuration: as many as root may give. */
    if (getrlimit(RLIMIT_NOFILE, &nofile) == 0
        && nofile.rlim_cur < nofile.rlim_max) {
        nofile.rlim_cur = nofile.rlim_max;
        setrlimit(RLIMIT_NOFILE, &nofile);
    }
    memset(&o, 0, sizeof(o));
    o.url = sc->url ? sc->url : TB_DEFAULT_URL;
    o.path = d->path;
    o.timeout_ms = sc->timeout_ms;
    o.connect_timeout_ms = sc->connect_timeout_ms;
    o.tls_ctx = sc->tls_ctx;
    if (!(c = tb_coalescer_create(&o, err, sizeof(err)))) {
        say("error", "TB00602: cannot start: %s%s", err, "");
        _exit(1);
    }
    if (geteuid() == 0
        && chown(d->path, ap_unixd_config.user_id,
                 ap_unixd_config.group_id) != 0) {
        say("error", "TB00602: cannot give %s to User: %s", d->path,
            strerror(errno));
        _exit(1);
    }
    if (geteuid() == 0 && ap_unixd_setup_child() != 0) {
        _exit(1);
    }
    /* Again: a change of identity clears the parent-death signal. */
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (getppid() != parent) {
        _exit(0);
    }
    rc = tb_coalescer_run(c, &stop_now, LINGER_MS);
    tb_coalescer_stats(c, &st);
    snprintf(figures, sizeof(figures), "%llu commands in %llu writes, "
             "%llu failed", (unsigned long long)st.commands,
             (unsigned long long)st.batches,
             (unsigned long long)st.failed);
    say(rc == TB_OK ? "info" : "error", rc == TB_OK
        ? "TB00604: %s stopped (%s)" : "TB00603: %s lost its socket (%s)",
        d->path, figures);
    tb_coalescer_free(c);
    _exit(rc == TB_OK ? 0 : 1);
}

static void coal_maint(int reason, void *data, apr_wait_t status);

/* Fork d's process and watch it for this generation. */
static void coal_start(coal *d)
{
    pid_t parent = getpid(), pid = fork();

    if (pid == 0) {
        coal_main(d, parent);
        _exit(0);
    }
    if (pid < 0) {
        ap_log_error(APLOG_MARK, APLOG_EMERG, errno, d->s, TBLOGNO(00601)
                     "TBucketRedis coalesce=on: cannot fork the coalescer "
                     "for %s", d->path);
        d->proc.pid = 0;
        return;
    }
    d->proc.pid = pid;
    apr_proc_other_child_register(&d->proc, coal_maint, d, NULL, d->pconf);
}

/* The MPM's word on a coalescer: forked again when it died while
 * Apache runs on; a retired one is forgotten. */
static void coal_maint(int reason, void *data, apr_wait_t status)
{
    coal *d = data;
    int state = AP_MPMQ_STOPPING;

    (void)status;
    if (reason != APR_OC_REASON_DEATH && reason != APR_OC_REASON_LOST) {
        return;
    }
    apr_proc_other_child_unregister(d);
    d->proc.pid = 0;
    ap_mpm_query(AP_MPMQ_MPM_STATE, &state);
    if (d->retired || !d->wanted || state == AP_MPMQ_STOPPING) {
        return;
    }
    ap_log_error(APLOG_MARK, APLOG_WARNING, 0, d->s, TBLOGNO(00605)
                 "the coalescer of %s died: starting it again", d->path);
    coal_start(d);
}

/* The directory of the sockets: User's own, 0700, so that only User
 * (and root) can reach them. NULL, logged, when it cannot be made. */
static const char *socket_dir(apr_pool_t *pconf, server_rec *s)
{
    const char *dir = ap_runtime_dir_relative(pconf, "tbucket");

    if (!dir || (mkdir(dir, 0700) != 0 && errno != EEXIST)
        || chmod(dir, 0700) != 0
        || (geteuid() == 0 && chown(dir, ap_unixd_config.user_id,
                                    ap_unixd_config.group_id) != 0)) {
        ap_log_error(APLOG_MARK, APLOG_EMERG, errno, s, TBLOGNO(00601)
                     "TBucketRedis coalesce=on: cannot make the socket "
                     "directory %s", dir ? dir : "(runtime dir)");
        return NULL;
    }
    return dir;
}

/* The registry's entry for sc's Redis configuration, made when new. */
static coal *coal_for(registry *r, apr_pool_t *pp, const char *dir,
                      const char *key)
{
    coal *d;
    const char *p;
    unsigned long long h = 14695981039346656037ULL;

    for (d = r->first; d; d = d->next) {
        if (!d->retired && strcmp(d->key, key) == 0) {
            return d;
        }
    }
    for (p = key; *p; p++) {
        h = (h ^ (unsigned char)*p) * 1099511628211ULL;
    }
    d = apr_pcalloc(pp, sizeof(*d));
    d->key = apr_pstrdup(pp, key);
    d->path = apr_psprintf(pp, "%s/coal-%016" APR_UINT64_T_HEX_FMT ".sock",
                           dir, (apr_uint64_t)h);
    d->next = r->first;
    r->first = d;
    return d;
}

/* Mark the coalescers this configuration wants, and give each server
 * that coalesces the URL of its socket. */
static int want_coalescers(apr_pool_t *pconf, server_rec *main_s,
                           registry *r)
{
    apr_pool_t *pp = main_s->process->pool;
    const char *dir = NULL;
    server_rec *s;

    for (s = main_s; s; s = s->next) {
        tbucket_srv_conf *sc = srv_conf(s);
        coal *d;

        if (sc->coalesce != 1) {
            continue;
        }
        if (!dir && !(dir = socket_dir(pconf, main_s))) {
            return HTTP_INTERNAL_SERVER_ERROR;
        }
        d = coal_for(r, pp, dir, coal_key(pconf, sc));
        if (strlen(d->path) >= 108) {
            ap_log_error(APLOG_MARK, APLOG_EMERG, 0, main_s, TBLOGNO(00601)
                         "TBucketRedis coalesce=on: the socket path %s is "
                         "too long for a unix socket: a shorter "
                         "DefaultRuntimeDir", d->path);
            return HTTP_INTERNAL_SERVER_ERROR;
        }
        d->wanted = 1;
        d->sc = sc;
        sc->coalesce_url = apr_pstrcat(pconf, "unix:", d->path, NULL);
    }
    return OK;
}

int tbucket_coalesce_post_config(apr_pool_t *pconf, server_rec *main_s)
{
    registry *r = get_registry(main_s->process->pool);
    coal *d;
    int rc;

    for (d = r->first; d; d = d->next) {
        d->wanted = 0;
    }
    if ((rc = want_coalescers(pconf, main_s, r)) != OK) {
        return rc;
    }
    for (d = r->first; d; d = d->next) {
        d->s = main_s;
        d->pconf = pconf;
        if (!d->wanted && !d->retired && d->proc.pid > 0) {
            /* Its configuration is gone: it drains and exits. */
            kill(d->proc.pid, SIGTERM);
            d->retired = 1;
        }
        if (d->wanted && (d->proc.pid <= 0 || kill(d->proc.pid, 0) != 0)) {
            coal_start(d);
        }
        else if (d->proc.pid > 0) {
            apr_proc_other_child_register(&d->proc, coal_maint, d, NULL,
                                          pconf);
        }
    }
    return OK;
}
