#!/usr/bin/python3
"""benchkit.py -- what every part of `make bench` shares: the results table,
bounded commands, CPU pinning and accounting, Redis and Apache started on
free loopback ports by PID, the peers, tb_bench, redis-benchmark and wrk.

run.py, floor_bench.py, tls_bench.py, conc.py and overload.py import it;
it measures nothing by itself.
"""

import argparse
import contextlib
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
# Ports, processes by PID, redis-server and the head of an Apache config:
# the integration tests' helpers.
sys.path.insert(0, os.path.join(ROOT, "tests", "integration"))
from tbtest.apache import server_root_conf  # noqa: E402
from tbtest.env import (Redis as TestRedis, child_pids,  # noqa: E402
                        free_port, stop_pid, wait_port)

MODDIR = "/usr/lib/apache2/modules"
NCPU = os.cpu_count() or 1
T_START = time.monotonic()
BUDGET_S = 560          # Stop starting new parts past this (10 min cap).

ROWS = []               # (name, value, unit, target, verdict)
MISSES = []             # Lines for the "not measured" list.


# ---- small helpers ----------------------------------------------------

def log(msg):
    sys.stderr.write("[bench %5.1fs] %s\n" % (time.monotonic() - T_START,
                                              msg))
    sys.stderr.flush()


def record(name, value, unit, target="", verdict=""):
    ROWS.append((name, value, unit, target, verdict))


def miss(what, why):
    MISSES.append("%s: %s" % (what, why))
    log("NOT MEASURED %s: %s" % (what, why))


def over_budget():
    return time.monotonic() - T_START > BUDGET_S


def sized(args, **sizes):
    """Set each of sizes on args (the parsed command line): a size is a
    (quick, full) pair, its first value for a --quick run."""
    for name, (quick, full) in sizes.items():
        setattr(args, name, quick if args.quick else full)


def pin(cpus):
    """A taskset prefix, or nothing when cpus is None."""
    return ["taskset", "-c", cpus] if cpus else []


def run(cmd, timeout, env=None, check=True):
    """Run a bounded command; return its stdout."""
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       text=True, timeout=timeout, env=env)
    if check and p.returncode != 0:
        raise RuntimeError("%s exited %d: %s" % (
            " ".join(cmd[:6]), p.returncode, (p.stderr or p.stdout)[-400:]))
    return p.stdout


def kv(line):
    """Parse 'a=1 b=2.5' into a dict of floats."""
    return {k: float(v) for k, v in re.findall(r"(\w+)=([-0-9.e+]+)", line)}


def median(xs):
    return statistics.median(xs) if xs else float("nan")


def rss_kb(pid):
    try:
        with open("/proc/%d/status" % pid) as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def cpu_split(pids):
    """(utime, stime) of the processes, in clock ticks."""
    user = system = 0
    for p in pids:
        try:
            with open("/proc/%d/stat" % p) as f:
                fields = f.read().rsplit(")", 1)[1].split()
            user += int(fields[11])
            system += int(fields[12])
        except (OSError, IndexError, ValueError):
            pass
    return user, system


def cpu_ticks(pids):
    """utime + stime of the processes, in clock ticks."""
    return sum(cpu_split(pids))


TICK_US = 1e6 / os.sysconf("SC_CLK_TCK")


def threads(pids):
    """Every thread id of the processes (perf reports samples by thread)."""
    out = set()
    for p in pids:
        try:
            out.update(int(t) for t in os.listdir("/proc/%d/task" % p))
        except OSError:
            pass
    return out


# ---- servers ------------------------------------------------------------

class Redis(TestRedis):
    """The tests' redis-server, pinned to cpus (None: not pinned), with a
    client `r` whose timeout allows long calls (FLUSHALL, SCRIPT LOAD)."""

    def __init__(self, tmp, cpus, module=None):
        super().__init__(os.path.join(tmp, "redis"), prefix=pin(cpus),
                         extra=["loadmodule %s" % module] if module else None)
        self.module = module
        self.r = self.client(socket_timeout=30)

    def script_calls(self):
        """(calls, usec) of decisions since the last RESETSTAT: EVALSHA +
        EVAL, and the Redis module's tbucket.* commands (engine=module)."""
        st = self.r.info("commandstats")
        calls = usec = 0
        for k in st:
            if k in ("cmdstat_evalsha", "cmdstat_eval") \
                    or k.startswith("cmdstat_tbucket."):
                calls += st[k]["calls"]
                usec += st[k]["usec"]
        return calls, usec



APACHE_CONF = """{head}
LoadModule authz_core_module {moddir}/mod_authz_core.so
{mpm}
KeepAlive On
MaxKeepAliveRequests 0
KeepAliveTimeout 30
Timeout 10
DocumentRoot "{root}/htdocs"
<Directory />
    AllowOverride None
    Require all denied
</Directory>
<Directory "{root}/htdocs">
    AllowOverride None
    Require all granted
</Directory>
{extra}
"""

# Event: 2 children x 32 threads, no spare-thread reaping.
EVENT_CONF = """LoadModule mpm_event_module {moddir}/mod_mpm_event.so
StartServers 2
ServerLimit 2
ThreadsPerChild {threads}
ThreadLimit {threads}
MinSpareThreads 1
MaxSpareThreads {maxthreads}
MaxRequestWorkers {maxthreads}
MaxConnectionsPerChild 0"""

# Prefork: every child started at once and kept, enough for 32 keep-alive
# connections (each holds a child) and a few spare.
PREFORK_CONF = """LoadModule mpm_prefork_module {moddir}/mod_mpm_prefork.so
StartServers {children}
MinSpareServers 1
MaxSpareServers {children}
ServerLimit {children}
MaxRequestWorkers {children}
MaxConnectionsPerChild 0"""

PREFORK_CHILDREN = 40

# A limit nothing reaches: every decision allows and writes its bucket.
UNREACHED = "1000000000 1000000000/s"


def tb_conf(so, url, options, locations):
    """mod_tbucket loaded and pointed at url (`TBucketRedis url options`,
    timeout 500 ms so that a loaded machine does not turn into fail-open
    answers), limiting each location (path, TBucketLimit, more
    directives) by its X-API-Key."""
    out = ["LoadModule tbucket_module %s" % so,
           "TBucketRedis %s timeout=500%s" % (url, options),
           "TBucketPrefix bench:"]
    for path, limit, more in locations:
        out += ["<Location %s>" % path, "    TBucketEnable On",
                '    TBucketKey "%{HTTP:X-API-Key}"',
                "    TBucketLimit %s" % limit]
        out += ["    " + d for d in more]
        out.append("</Location>")
    return "\n".join(out) + "\n"


def module_conf(so, url, threads):
    """The http part's module server: /b/ allows all, /c/ refuses all
    after the first request, /d/ the same in shadow mode, /e/ allows all
    through leases of 50, /f/ allows all and settles a cost header."""
    return tb_conf(so, url, " pool=%d" % threads, (
        ("/b/", UNREACHED, ()),
        ("/c/", "1 1/h", ()),
        ("/d/", "1 1/h", ("TBucketMode shadow",)),
        ("/e/", UNREACHED, ("TBucketLease 50 ttl=10s",)),
        ("/f/", UNREACHED, ("TBucketCostHeader X-Request-Cost",))))

THREADS_PER_CHILD = 32
# Directories of the served file, one per <Location> of the configs.
HTDOCS = ("a", "b", "c", "d", "e", "f", "l")


class Apache:
    """apache2 -DFOREGROUND under setsid, in a 0755 temp server root, with
    the event or the prefork MPM; `extra` is appended to the config."""

    def __init__(self, tmp, name, cpus, extra="", mpm="event"):
        self.root = os.path.join(tmp, "httpd-" + name)
        # Serves mod_tbucket's counters at /tbucket-status.
        self.status = "SetHandler tbucket-status" in extra
        self.port = free_port()
        self.cpus = cpus
        self.proc = None
        for d in HTDOCS:
            os.makedirs(os.path.join(self.root, "htdocs", d), exist_ok=True)
            with open(os.path.join(self.root, "htdocs", d, "ok.txt"),
                      "w") as f:
                f.write("ok\n")
        for d in ("logs", "run"):
            os.makedirs(os.path.join(self.root, d), exist_ok=True)
        mpm_conf = (EVENT_CONF if mpm == "event" else PREFORK_CONF).format(
            moddir=MODDIR, threads=THREADS_PER_CHILD,
            maxthreads=2 * THREADS_PER_CHILD, children=PREFORK_CHILDREN)
        self.conf = os.path.join(self.root, "httpd.conf")
        with open(self.conf, "w") as f:
            f.write(APACHE_CONF.format(
                head=server_root_conf(self.root, self.port),
                root=self.root, moddir=MODDIR, mpm=mpm_conf, extra=extra))
        # The children run as www-data: every parent needs o+x.
        for dirpath, dirs, files in os.walk(self.root):
            os.chmod(dirpath, 0o755)
            for fn in files:
                os.chmod(os.path.join(dirpath, fn), 0o644)

    def start(self):
        cmd = pin(self.cpus) + ["/usr/sbin/apache2", "-f", self.conf,
                                "-DFOREGROUND"]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.PIPE,
                                     start_new_session=True)
        if not wait_port(self.port, 10):
            err = self.proc.stderr.read() if self.proc.poll() is not None \
                else ""
            raise RuntimeError("apache2 did not listen: %s %s" % (
                err[-300:], self.error_log()[-300:]))
        return self

    def error_log(self):
        try:
            with open(os.path.join(self.root, "logs", "error.log")) as f:
                return f.read()
        except OSError:
            return ""

    def log_errors(self):
        """Log how many error-or-worse lines the error log holds."""
        errs = [l for l in self.error_log().splitlines()
                if re.search(r"\[(\w+:)?(error|crit|alert|emerg)\]", l)]
        if errs:
            log("apache %s error log: %d error lines, first: %s" % (
                os.path.basename(self.root), len(errs), errs[0][:200]))

    def pids(self):
        return [self.proc.pid] + child_pids(self.proc.pid)

    def child_rss_kb(self):
        kids = child_pids(self.proc.pid)
        return [rss_kb(p) for p in kids]

    def url(self, path):
        return "http://127.0.0.1:%d%s" % (self.port, path)

    def stop(self):
        # SIGTERM to the parent only; it stops its own children.
        stop_pid(self.proc, timeout=15)


class Peer:
    """The Flask reference under gunicorn (sync workers)."""

    def __init__(self, tmp, cpus, redis_url, limit, workers, script):
        self.port = free_port()
        self.script = script
        self.cpus = cpus
        self.redis_url = redis_url
        self.limit = limit
        self.workers = workers
        self.proc = None
        self.log = os.path.join(tmp, "gunicorn.log")

    def start(self):
        env = dict(os.environ, TB_PEER_REDIS=self.redis_url,
                   TB_PEER_LIMIT=self.limit, TB_PEER_PREFIX="peer:",
                   TB_PEER_SCRIPT=self.script)
        cmd = pin(self.cpus) + [
            sys.executable, "-m", "gunicorn", "-w", str(self.workers),
            "-b", "127.0.0.1:%d" % self.port, "--chdir",
            os.path.join(HERE, "peers"), "--log-level", "warning",
            "--error-logfile", self.log, "flask_peer:app"]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL, env=env,
                                     start_new_session=True)
        if not wait_port(self.port, 20):
            raise RuntimeError("gunicorn did not listen; see " + self.log)
        return self

    def url(self, path):
        return "http://127.0.0.1:%d%s" % (self.port, path)

    def pids(self):
        return [self.proc.pid] + child_pids(self.proc.pid)

    def stop(self):
        stop_pid(self.proc, timeout=15)


# ---- building -----------------------------------------------------------

def build_tools(build):
    """Compile tb_bench and shim_connect against the built libtb."""
    out = os.path.join(build, "bench")
    os.makedirs(out, exist_ok=True)
    cc = os.environ.get("CC", "cc")
    warn = ["-Wall", "-Wextra", "-Wstrict-prototypes", "-Wmissing-prototypes",
            "-Wwrite-strings", "-Wshadow", "-Werror"]
    libtb = os.path.join(build, "libtb.a")
    if not os.path.exists(libtb):
        raise RuntimeError("%s is missing: run make" % libtb)
    tb_bench = os.path.join(out, "tb_bench")
    run([cc, "-O2", "-g", "-std=c99", "-D_GNU_SOURCE", "-pthread"] + warn
        + ["-I" + os.path.join(ROOT, "shared"),
           os.path.join(HERE, "tb_bench.c"), libtb, "-lhiredis", "-lssl",
           "-lcrypto", "-lm",
           "-o", tb_bench], 120)
    shim_connect = os.path.join(out, "shim_connect")
    run([cc, "-O2", "-g", "-std=c99", "-D_GNU_SOURCE"] + warn
        + [os.path.join(HERE, "shim_connect.c"), "-o", shim_connect], 60)
    return tb_bench, shim_connect


def script_path(build):
    """The token-bucket script as it ships: prelude + body, by make."""
    return os.path.join(build, "lua", "tb_bucket.lua")


def script_text(build):
    with open(script_path(build), "rb") as f:
        return f.read()


def embedded_sha(build):
    try:
        with open(os.path.join(build, "shared", "algo", "tb_script.c")) as f:
            m = re.search(r'tb_script_sha1\[41\] = "([0-9a-f]{40})"', f.read())
            return m.group(1) if m else None
    except OSError:
        return None


# ---- load generators ----------------------------------------------------

def redis_benchmark(rd, cpus, conc, n, sha, keys, args):
    """EVALSHA through redis-benchmark; returns ops/s."""
    key = "bench:{__rand_int__}" if keys == "distinct" else "bench:{rb}"
    cmd = pin(cpus) + ["redis-benchmark", "-p", str(rd.port), "-c",
                       str(conc), "-n", str(n), "--csv"]
    if keys == "distinct":
        cmd += ["-r", "100000000"]
    cmd += ["evalsha", sha, "1", key] + args
    out = run(cmd, 120)
    row = [l for l in out.splitlines() if l.startswith('"evalsha')]
    return float(row[-1].split(",")[1].strip('"'))


def tb_bench(tool, rd, cpus, threads, seconds=None, count=None,
             keys="one", extra=()):
    cmd = pin(cpus) + [tool, "-u", rd.url, "-t", str(threads), "-k", keys]
    if seconds:
        cmd += ["-d", str(seconds)]
    if count:
        cmd += ["-n", str(count)]
    out = run(cmd + list(extra), 120)
    return kv(out)


def wrk(url, script, args, seconds, cpus, threads=2, conns=50):
    cmd = pin(cpus) + ["wrk", "-t", str(threads), "-c", str(conns), "-d",
                       "%ds" % seconds, "--latency", "--timeout", "5s",
                       "-s", os.path.join(HERE, "wrk", script), url,
                       "--"] + list(args)
    out = run(cmd, seconds + 60)
    res = {"rps": float(re.search(r"Requests/sec:\s+([0-9.]+)",
                                  out).group(1))}
    m = re.search(r"(\d+) requests in", out)
    res["requests"] = int(m.group(1)) if m else 0
    for pct in ("50", "99"):
        m = re.search(r"^\s+%s%%\s+([0-9.]+)(us|ms|s)\s*$" % pct, out, re.M)
        if m:
            mult = {"us": 1e-3, "ms": 1.0, "s": 1e3}[m.group(2)]
            res["p" + pct] = float(m.group(1)) * mult
    m = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    res["non2xx"] = int(m.group(1)) if m else 0
    m = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), "
                  r"timeout (\d+)", out)
    res["errors"] = sum(int(x) for x in m.groups()) if m else 0
    return res


def write_figures(name, title, rows):
    """Print a table of (figure, value, unit) rows under title and keep it
    in bench/results/NAME.md."""
    lines = [title + " (load average at the end %.2f)" % os.getloadavg()[0],
             "", "| figure | value | unit |", "| --- | ---: | --- |"]
    lines += ["| %s | %s | %s |" % r for r in rows]
    text = "\n".join(lines) + "\n"
    os.makedirs(os.path.join(HERE, "results"), exist_ok=True)
    with open(os.path.join(HERE, "results", name + ".md"), "w") as f:
        f.write(text)
    print(text)


def module_args(name, doc):
    """The options of a module bench (--build, --quick), the module's path
    (None, said, when it is not built) and the CPUs of Redis and Apache
    (the last one) and of the load generator (the first)."""
    ap = argparse.ArgumentParser(description=doc.split("\n")[0])
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--quick", action="store_true")
    a = ap.parse_args()
    so = os.path.join(os.path.abspath(a.build), "mod_tbucket.so")
    if not os.path.exists(so):
        print("%s: %s is not built: not measured" % (name, so))
        so = None
    ncpu = os.cpu_count() or 1
    scpu, wcpu = (str(ncpu - 1), "0") if ncpu > 1 else (None, None)
    return a, so, scpu, wcpu


def calls_per_request(rd, url, key, n, cpus, cmds):
    """Redis's calls per request of each command of cmds over exactly n
    requests by ab (8 at a time, X-API-Key: key), and its microseconds
    per call: {cmd: calls, cmd + "_usec": us}."""
    rd.r.config_resetstat()
    out = run(pin(cpus) + ["ab", "-q", "-k", "-n", str(n), "-c", "8", "-s",
                           "10", "-H", "X-API-Key: " + key, url], 120)
    done = int(re.search(r"Complete requests:\s+(\d+)", out).group(1))
    # The last releases and charges come after the last responses.
    time.sleep(0.2)
    st = rd.r.info("commandstats")
    res = {}
    for cmd in cmds:
        c = st.get("cmdstat_" + cmd, {})
        res[cmd] = c.get("calls", 0) / done
        res[cmd + "_usec"] = c.get("usec_per_call", 0.0)
    return res


def measured_wrk(srv, rd, url, script, args, seconds, cpus):
    """wrk as wrk() runs it, with the server's and Redis's CPU per
    request added (server_cpu_us, redis_cpu_us)."""
    pids = srv.pids()
    s0, r0 = cpu_ticks(pids), cpu_ticks([rd.proc.pid])
    r = wrk(url, script, args, seconds, cpus)
    s1, r1 = cpu_ticks(pids), cpu_ticks([rd.proc.pid])
    req = max(r["requests"], 1)
    r["server_cpu_us"] = (s1 - s0) * TICK_US / req
    r["redis_cpu_us"] = (r1 - r0) * TICK_US / req
    return r


def alternating_rounds(srv, rd, variants, rounds, seconds, cpus, tag):
    """measured_wrk (thread_key.lua) on each (name, path) of variants for
    seconds, rounds times, the order reversed every other round so that
    neither always runs first on a warm machine: {name: [results]}."""
    for name, path in variants:
        wrk(srv.url(path + "ok.txt"), "thread_key.lua", ["warm" + name], 1,
            cpus)
    res = {name: [] for name, _ in variants}
    for i in range(rounds):
        order = variants if i % 2 == 0 else tuple(reversed(variants))
        for name, path in order:
            r = measured_wrk(srv, rd, srv.url(path + "ok.txt"),
                             "thread_key.lua", ["r%d%s" % (i, name)],
                             seconds, cpus)
            res[name].append(r)
            log("%s: %-7s round %d: %8.0f req/s p99 %.2f ms non-2xx %d"
                % (tag, name, i, r["rps"], r.get("p99", -1), r["non2xx"]))
    return res


def round_rows(name, rs):
    """The figures of one variant's rounds (measured_wrk results) as
    (figure, value, unit) rows: median requests/s, p99 and CPU per
    request of the server and of Redis."""
    return [("http.%s.rps" % name, round(median([r["rps"] for r in rs])),
             "req/s"),
            ("http.%s.p99" % name, round(median([r.get("p99", 0)
                                                 for r in rs]), 3), "ms"),
            ("http.%s.server_cpu_per_request" % name,
             round(median([r["server_cpu_us"] for r in rs]), 1), "us"),
            ("http.%s.redis_cpu_per_request" % name,
             round(median([r["redis_cpu_us"] for r in rs]), 1), "us")]


def calls_rows(rd, srv, name, path, cpus, cmds):
    """Redis's calls per request and microseconds per call of each of
    cmds, over 2,000 requests of path, as rows."""
    c = calls_per_request(rd, srv.url(path + "ok.txt"), "ab-%s-%d" % (
        path.strip("/"), os.getpid()), 2000, cpus, cmds)
    rows = []
    for cmd in cmds:
        rows.append(("redis.%s.%s_per_request" % (name, cmd),
                     round(c[cmd], 3), "calls"))
        if c[cmd]:
            rows.append(("redis.%s.%s_usec_per_call" % (name, cmd),
                         round(c[cmd + "_usec"], 2), "us"))
    return rows


@contextlib.contextmanager
def redis_and_server(prefix, cpus, make_server):
    """A temp dir (0755, so that Apache's children may enter it), a Redis
    on cpus and the server make_server(tmp, redis) starts: (redis,
    server), both stopped by PID and the dir removed on leaving."""
    tmp = tempfile.mkdtemp(prefix=prefix, dir="/tmp")
    os.chmod(tmp, 0o755)
    rd = Redis(tmp, cpus).start()
    srv = None
    try:
        srv = make_server(tmp, rd)
        yield rd, srv
    finally:
        if srv is not None:
            srv.stop()
        rd.stop()
        shutil.rmtree(tmp, ignore_errors=True)
