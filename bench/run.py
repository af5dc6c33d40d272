#!/usr/bin/python3
"""run.py -- `make bench`: the cost of a shared limit, measured side by side.

One run, on loopback, with servers of our own on free ports in temp dirs,
every load bounded in count and in time, every server stopped by PID:

  core     bench/tb_bench.c (N threads calling tb_client_decide) against
           redis-benchmark running EVALSHA of the same script at the same
           concurrency, alternated; Redis usec per call from INFO
           commandstats for our script and for bench/plain_bucket.lua.
  cpu      callgrind on tb_bench: user-space instructions per decision,
           split by object and by function.
  memory   Redis bytes per bucket.
  floor    the one-round-trip floor: Apache alone on one CPU, wrk and
           Redis on the other, 32 connections and 32 keys; bare Apache,
           bench/mod_floor.c (one blocking PING per request) and the
           module (exact decisions; with a lease of 100; pool sizes
           1/2/4/8), alternated round by round, under the event and the
           prefork MPM; script calls per request; perf stat (system calls,
           context switches, batch size) and perf record (kernel share,
           top symbols) on the Apache CPU.
  shim     connect() plain, unmatched and matched under the LD_PRELOAD shim.
  tls      tb_bench over rediss:// against redis:// to one Redis listening
           on both (bench/tls_bench.py): decisions/s and their ratio.
  http     wrk against Apache (event MPM) with Redis on the Apache CPU:
           bare, module under a limit nothing reaches (hot keys and
           distinct keys), module rejecting everything; and the Flask
           reference peer, all alternated round by round; Redis calls per
           request with ab (leases and cost headers too); Apache child RSS
           with and without the module after 100,000 requests with
           distinct keys.

Absolute figures drift on a shared 2-core machine; ratios measured in the
same run hold. Writes bench/results/latest.tsv (name, value, unit) and
latest.md, and prints the Markdown table. A part whose binary is not built
yet (the module, the floor module, the shim) is reported as not measured,
never faked.

    /usr/bin/python3 bench/run.py [--build DIR] [--quick] [--only PART,...]
"""
import argparse
import datetime
import os
import platform
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

import tls_bench

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

    def __init__(self, tmp, cpus):
        super().__init__(os.path.join(tmp, "redis"), prefix=pin(cpus))
        self.r = self.client(socket_timeout=30)

    def script_calls(self):
        """(calls, usec) of EVALSHA + EVAL since the last RESETSTAT."""
        st = self.r.info("commandstats")
        calls = usec = 0
        for k in ("cmdstat_evalsha", "cmdstat_eval"):
            if k in st:
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
        with open(os.path.join(build, "shared", "tb_script.c")) as f:
            m = re.search(r'tb_script_sha1\[41\] = "([0-9a-f]{40})"', f.read())
            return m.group(1) if m else None
    except OSError:
        return None


# ---- part 1: the core against the Redis floor ---------------------------

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


def part_core(a, rd, tool, sha):
    conc = a.concurrency
    rounds = a.rounds
    secs = a.core_seconds
    ours = ["", "1000000000", "1000000000", "1"]
    layouts = [("pinned", "0", "1"), ("shared", None, None)]
    for layout, ccpu, rcpu in layouts:
        subprocess.run(["taskset", "-pc", rcpu or "0-%d" % (NCPU - 1),
                        str(rd.proc.pid)], stdout=subprocess.DEVNULL)
        for keys in ("one", "distinct"):
            rb, tb = [], []
            for i in range(rounds):
                # Alternate which goes first, so drift hits both alike.
                order = ("rb", "tb") if i % 2 == 0 else ("tb", "rb")
                for which in order:
                    if which == "rb":
                        # About secs seconds' worth at the last rate seen.
                        n = int((rb[-1] if rb else 25000) * secs)
                        rb.append(redis_benchmark(rd, ccpu, conc, n, sha,
                                                  keys, ours))
                    else:
                        tb.append(tb_bench(tool, rd, ccpu, conc, secs,
                                           keys=keys)["per_sec"])
            log("core %s %s: redis-benchmark %s tb_bench %s" % (
                layout, keys, [int(x) for x in rb], [int(x) for x in tb]))
            tag = "core.%s.%s" % (layout, keys)
            record(tag + ".redis_benchmark", round(median(rb)), "ops/s")
            record(tag + ".tb_bench", round(median(tb)), "decisions/s")
            # The median of per-round ratios: each pair ran back to back,
            # so drift between rounds cancels.
            ratio = median([t / r for t, r in zip(tb, rb)])
            record(tag + ".ratio", round(ratio, 3), "x",
                   ">= 0.90" if layout == "pinned" else "",
                   ("met" if ratio >= 0.9 else "MISSED")
                   if layout == "pinned" else "")
    subprocess.run(["taskset", "-pc", a.redis_cpu or "0-%d" % (NCPU - 1),
                    str(rd.proc.pid)], stdout=subprocess.DEVNULL)

    # Redis time per call: our script, the plain one, and our script as
    # tb_bench sends it; same concurrency, one key and distinct keys.
    with open(os.path.join(HERE, "plain_bucket.lua"), "rb") as f:
        plain_sha = rd.r.script_load(f.read())
    plain = ["1000000000", "1000000000", "1"]
    # About two seconds per run at the rate seen above.
    n = max(5000, int(median(rb) * (0.5 if a.quick else 2)))
    cpu = "0" if NCPU > 1 else None
    for keys in ("one", "distinct"):
        per = {"ours": [], "plain": []}
        for i in range(a.rounds):
            pair = (("ours", sha, ours), ("plain", plain_sha, plain))
            for name, s, args in (pair if i % 2 == 0 else pair[::-1]):
                rd.r.config_resetstat()
                redis_benchmark(rd, cpu, conc, n, s, keys, args)
                calls, usec = rd.script_calls()
                per[name].append(usec / calls)
        log("usec_per_call %s: ours %s plain %s" % (
            keys, [round(x, 2) for x in per["ours"]],
            [round(x, 2) for x in per["plain"]]))
        ours_us, plain_us = median(per["ours"]), median(per["plain"])
        record("redis.usec_per_call.ours.%s" % keys, round(ours_us, 2), "us")
        record("redis.usec_per_call.plain.%s" % keys, round(plain_us, 2),
               "us")
        ratio = ours_us / plain_us
        record("redis.usec_per_call.ratio.%s" % keys, round(ratio, 3), "x",
               "<= 1.20", "met" if ratio <= 1.2 else "MISSED")
    rd.r.config_resetstat()
    res = tb_bench(tool, rd, cpu, conc, count=n)
    calls, usec = rd.script_calls()
    record("redis.usec_per_call.tb_bench", round(usec / calls, 2), "us")
    record("redis.calls_per_decision.tb_bench",
           round(calls / (res["decisions"] + res["threads"] * 10), 3),
           "calls")


# ---- part 2: client CPU per decision under callgrind ---------------------

def parse_callgrind(path):
    """Self cost (first event, Ir) by (object, function), and the total."""
    names = {"ob": {}, "fn": {}}
    ob = fn = None
    self_cost = {}
    total = 0
    skip_next = False
    cur = {"ob": None, "fn": None}

    def name(kind, rest):
        m = re.match(r"\((\d+)\)(?: (.*))?", rest)
        if not m:
            return rest
        if m.group(2) is not None:
            names[kind][m.group(1)] = m.group(2)
        return names[kind].get(m.group(1), "?")

    with open(path) as f:
        for line in f:
            line = line.rstrip("\n")
            if not line:
                continue
            if line.startswith("ob="):
                cur["ob"] = name("ob", line[3:])
            elif line.startswith("fn="):
                cur["fn"] = name("fn", line[3:])
            elif line.startswith(("cob=", "cfn=")):
                # Register the name; the callee does not change cur.
                name(line[1:3], line[4:])
            elif line.startswith("calls="):
                skip_next = True
            elif line.startswith(("summary:", "totals:")):
                total = int(line.split()[1])
            elif line[0] in "0123456789+-*":
                if skip_next:
                    skip_next = False
                    continue
                parts = line.split()
                if len(parts) > 1:
                    k = (cur["ob"], cur["fn"])
                    self_cost[k] = self_cost.get(k, 0) + int(parts[1])
    return total, self_cost


# (function, label) whose inclusive cost is reported per decision: the
# steps of one decision in the core as it is; a name the build no longer
# has is left out of the table.
INCLUSIVE_STEPS = (
    ("tb_client_run", "tb_client_run"),
    ("tb_key_build_shard", "key_build"),
    ("tb__fmt_num", "format_numbers"),
    ("tb__run_script", "run_script"),
    ("tb__pool_call", "pool_call"),
    ("tb__buf_argv", "resp_encode"),
    ("tb__conn_write", "conn_write"),
    ("tb__conn_read", "conn_read"),
    ("redisReaderFeed", "hiredis_reader_feed"),
    ("redisReaderGetReply", "hiredis_reader_get_reply"),
    ("freeReplyObject", "hiredis_free_reply"),
    ("calloc", "calloc"),
    ("malloc", "malloc"),
    ("free", "free"),
)


def inclusive_costs(path):
    """Inclusive Ir by bare function name (without gcc's .constprop.N and
    similar suffixes), from callgrind_annotate."""
    out = run(["callgrind_annotate", "--inclusive=yes", "--threshold=100",
               path], 120, check=False)
    incl = {}
    for line in out.splitlines():
        m = re.match(r"\s*([0-9,]+) \([^)]*\)\s+\S*?:?([A-Za-z_][\w.]*)"
                     r"(?: \[.*\])?\s*$", line)
        if m:
            fn = m.group(2).split(".")[0]
            incl[fn] = max(incl.get(fn, 0), int(m.group(1).replace(",", "")))
    return incl


def part_cpu(a, rd, tool, tmp):
    if not shutil.which("valgrind"):
        miss("callgrind", "valgrind is not installed")
        return
    n = a.callgrind_decisions
    out = os.path.join(tmp, "callgrind.out")
    cmd = ["valgrind", "--tool=callgrind", "--toggle-collect=bench_loop",
           "--callgrind-out-file=" + out, tool, "-u", rd.url, "-t", "1",
           "-n", str(n), "-k", "one"]
    run(pin("0" if NCPU > 1 else None) + cmd, 300)
    total, cost = parse_callgrind(out)
    keep = os.path.join(HERE, "results", "callgrind.latest.out")
    shutil.copyfile(out, keep)
    per = total / n
    record("cpu.instr_per_decision.total", round(per), "instr", "<= 5000",
           "met" if per <= 5000 else "MISSED")
    by_ob = {}
    for (ob, fn), c in cost.items():
        short = os.path.basename(ob or "?")
        if short == os.path.basename(tool):
            short = "libtb"
        elif short.startswith("libhiredis"):
            short = "hiredis"
        elif short.startswith("libc.so") or short.startswith("libc-"):
            short = "libc"
        elif short.startswith("ld-linux"):
            short = "ld.so"
        by_ob[short] = by_ob.get(short, 0) + c
    for short in ("libtb", "hiredis", "libc"):
        record("cpu.instr_per_decision.%s" % short,
               round(by_ob.get(short, 0) / n), "instr")
    ours = by_ob.get("libtb", 0) + by_ob.get("hiredis", 0)
    record("cpu.instr_per_decision.libtb_plus_hiredis", round(ours / n),
           "instr")
    top = sorted(cost.items(), key=lambda kvp: -kvp[1])[:a.top_functions]
    for (ob, fn), c in top:
        record("cpu.fn.%s" % fn, round(c / n), "instr")
    # Inclusive costs of the steps of one decision (callgrind_annotate).
    incl = inclusive_costs(out)
    for fn, label in INCLUSIVE_STEPS:
        if fn in incl:
            record("cpu.incl.%s" % label, round(incl[fn] / n), "instr")
    log("callgrind: %d instr/decision total, by object %s" % (
        total / n, {k: round(v / n) for k, v in by_ob.items()}))


# ---- part 3: memory -----------------------------------------------------

def part_redis_memory(a, rd, tool):
    n = a.mem_buckets
    rd.r.flushall()
    before = rd.r.info("memory")["used_memory"]
    # A long TTL (capacity 1e6 at 1/s): nothing expires while we count.
    tb_bench(tool, rd, None, 4, count=n, keys="distinct",
             extra=["-c", "1000000", "-r", "1", "-w", "0"])
    after = rd.r.info("memory")["used_memory"]
    nkeys = rd.r.dbsize()
    samples = []
    for _ in range(50):
        k = rd.r.randomkey()
        if k:
            samples.append(rd.r.memory_usage(k, samples=0))
    record("redis.bytes_per_bucket.used_memory",
           round((after - before) / max(nkeys, 1)), "bytes")
    record("redis.bytes_per_bucket.memory_usage", round(median(samples)),
           "bytes")
    record("redis.buckets_counted", nkeys, "keys")
    rd.r.flushall()


# ---- part 4: HTTP --------------------------------------------------------

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


def syscall_counts(a, tmp, variants, wcpu):
    """System calls per request in the Apache children (strace -c -f), to
    show where the module's time goes: strace slows everything, but the
    counts per request stay put."""
    for name, srv, path, script in variants:
        if name not in ("a", "b_hot", "c_429") or not isinstance(srv, Apache):
            continue
        out = os.path.join(tmp, "strace-" + name)
        cmd = ["strace", "-c", "-f", "-o", out]
        for k in child_pids(srv.proc.pid):
            cmd += ["-p", str(k)]
        st = subprocess.Popen(cmd, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
        try:
            time.sleep(1.0)
            r = wrk(srv.url(path), script, ["strace" + name], 2, wcpu,
                    conns=10)
        finally:
            st.send_signal(signal.SIGINT)
            try:
                st.wait(timeout=30)
            except subprocess.TimeoutExpired:
                st.kill()
                st.wait()
        calls = {}
        try:
            with open(out) as f:
                for line in f:
                    m = re.match(r"\s*[0-9.]+\s+[0-9.]+\s+\d+\s+(\d+)"
                                 r"(?:\s+\d+)?\s+(\w+)\s*$", line)
                    if m and m.group(2) != "total":
                        calls[m.group(2)] = int(m.group(1))
        except OSError:
            continue
        req = max(r["requests"], 1)
        record("http.%s.syscalls_per_req" % name,
               round(sum(calls.values()) / req, 2), "calls")
        top = sorted(calls.items(), key=lambda kv: -kv[1])[:8]
        log("strace %s: %d requests; per request: %s" % (
            name, req, ", ".join("%s %.2f" % (k, v / req) for k, v in top)))
        for k in ("getpid", "read", "write", "futex"):
            record("http.%s.syscalls_per_req.%s" % (name, k),
                   round(calls.get(k, 0) / req, 2), "calls")


def ab_count(url, n, key, cpus):
    """Exactly n requests with one key; returns (complete, non2xx)."""
    cmd = pin(cpus) + ["ab", "-q", "-k", "-n", str(n), "-c", "8", "-s", "10",
                       "-H", "X-API-Key: " + key, url]
    out = run(cmd, 120)
    done = int(re.search(r"Complete requests:\s+(\d+)", out).group(1))
    m = re.search(r"Non-2xx responses:\s+(\d+)", out)
    return done, int(m.group(1)) if m else 0


def part_http(a, rd, tmp, build, tool):
    so = os.path.join(build, "mod_tbucket.so")
    have_mod = os.path.exists(so)
    if not have_mod:
        miss("http b/c/d, calls per request, module RSS",
             "%s is not built" % so)
    acpu, wcpu = a.server_cpu, a.client_cpu
    servers = []
    try:
        bare = Apache(tmp, "bare", acpu).start()
        servers.append(bare)
        mod = None
        if have_mod:
            mod = Apache(tmp, "mod", acpu, module_conf(
                so, rd.url, THREADS_PER_CHILD)).start()
            servers.append(mod)
        peer = None
        try:
            import flask  # noqa: F401
            import gunicorn  # noqa: F401
            peer = Peer(tmp, acpu, rd.url, "1000000000 1000000000",
                        a.peer_workers, script_path(build)).start()
            servers.append(peer)
        except Exception as e:
            miss("flask peer", "cannot start (%s): apt-get install "
                 "python3-flask gunicorn python3-redis" % e)

        # Memory first (doubles as warm-up): 100,000 distinct-key
        # requests to each Apache, bounded by count and by time.
        per_thread = a.rss_requests // 2
        for srv, path, tag in ((bare, "/a/ok.txt", "bare"),
                               (mod, "/b/ok.txt", "module")):
            if srv is None:
                continue
            r = wrk(srv.url(path), "distinct_count.lua",
                    ["rss" + tag, str(per_thread)], 45, wcpu)
            kids = srv.child_rss_kb()
            record("apache.child_rss.%s.after_requests" % tag,
                   r["requests"], "requests")
            record("apache.child_rss.%s" % tag,
                   round(sum(kids) / max(len(kids), 1) / 1024.0, 1), "MiB")
            log("rss %s after %d requests: children %s kB" % (
                tag, r["requests"], kids))
        if mod is not None:
            rs = [x for x in ROWS if x[2] == "MiB"
                  and x[0].startswith("apache.child_rss")]
            if len(rs) == 2:
                record("apache.child_rss.delta", round(rs[1][1] - rs[0][1], 1),
                       "MiB")

        # Redis calls per HTTP request, exact counts from ab: one per
        # decision (b, c, d; f has a cost header that reports nothing,
        # so no settlement call), about 1/50 with TBucketLease 50 (e; the
        # lease doubles up to 50 first).
        if mod is not None:
            for var, path in (("b", "/b/ok.txt"), ("c", "/c/ok.txt"),
                              ("d", "/d/ok.txt"), ("e", "/e/ok.txt"),
                              ("f", "/f/ok.txt")):
                rd.r.config_resetstat()
                done, non2xx = ab_count(mod.url(path), a.ab_requests,
                                        "ab-%s-%d" % (var, os.getpid()),
                                        wcpu)
                calls, _ = rd.script_calls()
                per = calls / done
                if var == "e":
                    ok = per <= 2.0 / 50
                    target = "<= 2/50"
                else:
                    ok = abs(per - 1) < 0.005
                    target = "= 1.00"
                record("http.redis_calls_per_request.%s" % var,
                       round(per, 3), "calls", target,
                       "met" if ok else "MISSED")
                log("ab %s: %d requests, %d non-2xx, %d script calls" % (
                    var, done, non2xx, calls))

        variants = [("a", bare, "/a/ok.txt", "thread_key.lua")]
        if mod is not None:
            variants += [("b_hot", mod, "/b/ok.txt", "thread_key.lua"),
                         ("c_429", mod, "/c/ok.txt", "thread_key.lua")]
        variants += [("a_lua", bare, "/a/ok.txt", "distinct.lua")]
        if mod is not None:
            variants += [("b_distinct", mod, "/b/ok.txt", "distinct.lua")]
        if peer is not None:
            variants += [("flask", peer, "/b/ok.txt", "thread_key.lua")]
        results = {v[0]: [] for v in variants}
        # Warm every server and bucket once, untimed.
        for name, srv, path, script in variants:
            wrk(srv.url(path), script, ["warm" + name], 1, wcpu)
        for i in range(a.http_rounds):
            if over_budget():
                miss("http rounds %d.." % (i + 1), "time budget spent")
                break
            order = variants if i % 2 == 0 else list(reversed(variants))
            for name, srv, path, script in order:
                pids = srv.pids()
                s0, r0 = cpu_ticks(pids), cpu_ticks([rd.proc.pid])
                r = wrk(srv.url(path), script, ["r%d%s" % (i, name)],
                        a.http_seconds, wcpu)
                s1, r1 = cpu_ticks(pids), cpu_ticks([rd.proc.pid])
                req = max(r["requests"], 1)
                r["server_cpu_us"] = (s1 - s0) * TICK_US / req
                r["redis_cpu_us"] = (r1 - r0) * TICK_US / req
                results[name].append(r)
                log("wrk %-10s round %d: %8.0f req/s p50 %.2f ms p99 %.2f "
                    "ms non-2xx %d errors %d cpu/req server %.1f us redis "
                    "%.1f us" % (
                        name, i, r["rps"], r.get("p50", -1),
                        r.get("p99", -1), r["non2xx"], r["errors"],
                        r["server_cpu_us"], r["redis_cpu_us"]))
        med = {}
        for name, rs in results.items():
            if not rs:
                continue
            med[name] = median([r["rps"] for r in rs])
            record("http.%s.rps" % name, round(med[name]), "req/s")
            record("http.%s.p50" % name,
                   round(median([r.get("p50", 0) for r in rs]), 3), "ms")
            record("http.%s.p99" % name,
                   round(median([r.get("p99", 0) for r in rs]), 3), "ms")
            record("http.%s.server_cpu_per_req" % name,
                   round(median([r["server_cpu_us"] for r in rs]), 1), "us")
            record("http.%s.redis_cpu_per_req" % name,
                   round(median([r["redis_cpu_us"] for r in rs]), 1), "us")
            tot = sum(r["requests"] for r in rs)
            bad = sum(r["non2xx"] for r in rs)
            record("http.%s.non2xx_share" % name, round(bad / max(tot, 1), 4),
                   "fraction")
        def round_ratio(num, den):
            """Median over rounds of num/den within the round."""
            return median([x["rps"] / y["rps"] for x, y in
                           zip(results[num], results[den])])

        for num, den, target in (("b_hot", "a", ">= 0.85"),
                                 ("b_distinct", "a_lua", ">= 0.85"),
                                 ("c_429", "a", "")):
            if results.get(num) and results.get(den):
                ratio = round_ratio(num, den)
                record("http.ratio.%s_over_%s" % (num, den), round(ratio, 3),
                       "x", target,
                       ("met" if ratio >= 0.85 else "MISSED")
                       if target else "")
        if results.get("c_429") and results.get("b_hot"):
            ratio = round_ratio("c_429", "b_hot")
            record("http.ratio.c_429_over_b_hot", round(ratio, 3), "x",
                   ">= 1.00", "met" if ratio >= 1.0 else "MISSED")
        if results.get("flask") and results.get("b_hot"):
            ratio = round_ratio("b_hot", "flask")
            record("http.ratio.b_hot_over_flask", round(ratio, 2), "x",
                   ">= 8", "met" if ratio >= 8 else "MISSED")
        if not shutil.which("strace"):
            miss("system calls per request", "strace is not installed")
        elif not over_budget():
            syscall_counts(a, tmp, variants, wcpu)
        for srv in (bare, mod):
            if srv is not None:
                srv.log_errors()
    finally:
        for s in reversed(servers):
            s.stop()


# ---- part 5: the one-round-trip floor (bare, PING, mod_tbucket) ---------

FLOOR_CONF = """LoadModule floor_module {so}
FloorRedis 127.0.0.1 {port}
"""

def floor_tb_conf(so, url, options):
    """The floor part's module server: /b/ decides every request in Redis
    (exact), /l/ spends leases of 100 tokens; the status page says which
    pool size the module chose and how many batches it wrote."""
    return tb_conf(so, url, options, (
        ("/b/", UNREACHED, ()),
        ("/l/", UNREACHED, ("TBucketLease 100",)))) + (
        "<Location /tbucket-status>\n    SetHandler tbucket-status\n"
        "</Location>\n")


FLOOR_CONNS = 32
FLOOR_WRK_THREADS = 2
POOL_SIZES = (1, 2, 4, 8)


def floor_wrk(srv, path, tag, seconds, cpus):
    return wrk(srv.url(path), "keys32.lua", [tag, str(FLOOR_WRK_THREADS)],
               seconds, cpus, threads=FLOOR_WRK_THREADS, conns=FLOOR_CONNS)


def floor_wrk_cmd(srv, path, tag, seconds):
    """The same load as floor_wrk, as a command line for perf to run."""
    return ["wrk", "-t", str(FLOOR_WRK_THREADS), "-c", str(FLOOR_CONNS),
            "-d", "%ds" % seconds, "-s",
            os.path.join(HERE, "wrk", "keys32.lua"), srv.url(path), "--",
            tag, str(FLOOR_WRK_THREADS)]


def status_metrics(srv, names):
    """{name: value summed over its label sets} from a mod_tbucket
    server's status page; {} when it cannot be read."""
    import urllib.request
    try:
        with urllib.request.urlopen(srv.url("/tbucket-status"),
                                    timeout=5) as f:
            text = f.read().decode()
    except OSError:
        return {}
    out = {}
    for name in names:
        for m in re.finditer(r"^%s(?:\{[^}]*\})? ([0-9.e+]+)$" % name, text,
                             re.M):
            out[name] = out.get(name, 0) + float(m.group(1))
    return out


def pool_size_of(srv):
    """The pool size a mod_tbucket server's children chose, or None."""
    v = status_metrics(srv, ("tbucket_pool_size",)).get("tbucket_pool_size")
    return int(v) if v is not None else None


BATCH_METRICS = ("tbucket_redis_calls_total", "tbucket_redis_batches_total")


def batch_size(before, after):
    """Script calls per write between two status_metrics() readings, or
    None (a core without the batch counter, or no calls)."""
    calls, writes = (after.get(k, 0) - before.get(k, 0)
                     for k in BATCH_METRICS)
    return calls / writes if writes > 0 and calls > 0 else None


FLOOR_CMDS = ("cmdstat_evalsha", "cmdstat_eval", "cmdstat_ping")


def settled_calls(rd):
    """Script and PING calls so far, read once they have not moved for
    0.15 s (at most 3 s): requests that were in flight when wrk stopped
    finish within a moment, and must not count for the next run."""
    last, still = None, 0
    deadline = time.monotonic() + 3.0
    while time.monotonic() < deadline and still < 3:
        st = rd.r.info("commandstats")
        now = tuple(st[k]["calls"] if k in st else 0 for k in FLOOR_CMDS)
        still = still + 1 if now == last else 0
        last = now
        time.sleep(0.05)
    return last


def floor_rounds(a, rd, variants, wcpu, tag):
    """Every variant once per round, the order reversed every other round;
    per run req/s, latency, CPU per request, and the Redis calls it made."""
    results = {v[0]: [] for v in variants}
    for name, srv, path in variants:
        floor_wrk(srv, path, name, 1, wcpu)
    rd.r.config_resetstat()
    for i in range(a.floor_rounds):
        if over_budget():
            miss("%s rounds %d.." % (tag, i + 1), "time budget spent")
            break
        order = variants if i % 2 == 0 else list(reversed(variants))
        for name, srv, path in order:
            pids = srv.pids()
            c0 = settled_calls(rd)
            k0 = status_metrics(srv, BATCH_METRICS) if srv.status else {}
            s0, r0 = cpu_split(pids), cpu_ticks([rd.proc.pid])
            r = floor_wrk(srv, path, name, a.floor_seconds, wcpu)
            s1, r1 = cpu_split(pids), cpu_ticks([rd.proc.pid])
            c1 = settled_calls(rd)
            if srv.status:
                r["batch"] = batch_size(
                    k0, status_metrics(srv, BATCH_METRICS))
            req = max(r["requests"], 1)
            du, ds = s1[0] - s0[0], s1[1] - s0[1]
            r["server_cpu_us"] = (du + ds) * TICK_US / req
            r["sys_share"] = 100.0 * ds / max(du + ds, 1)
            r["redis_cpu_us"] = (r1 - r0) * TICK_US / req
            r["script_calls_n"] = c1[0] + c1[1] - c0[0] - c0[1]
            r["script_calls"] = r["script_calls_n"] / req
            r["pings"] = (c1[2] - c0[2]) / req
            results[name].append(r)
            if not r["requests"]:
                # Seen once under a load average of 29: every connection
                # of a prefork server unanswered for the whole run.
                miss("%s.%s round %d" % (tag, name, i),
                     "no response in %d s; the round's ratios leave it out"
                     % a.floor_seconds)
            log("%s %-7s round %d: %6.0f req/s p50 %.2f ms p99 %.2f ms "
                "non-2xx %d errors %d cpu/req apache %.1f us redis %.1f us "
                "scripts %d for %d requests batch %s" % (
                    tag, name, i, r["rps"], r.get("p50", -1),
                    r.get("p99", -1), r["non2xx"], r["errors"],
                    r["server_cpu_us"], r["redis_cpu_us"],
                    r["script_calls_n"], r["requests"],
                    "%.2f" % r["batch"] if r.get("batch") else "-"))
    return results


def record_floor(tag, results, pairs, targets):
    """Medians per variant and the median per-round ratio of each pair."""
    for name, rs in results.items():
        if not rs:
            continue
        t = "%s.%s" % (tag, name)
        record(t + ".rps", round(median([r["rps"] for r in rs])), "req/s")
        record(t + ".p50", round(median([r.get("p50", 0) for r in rs]), 3),
               "ms")
        record(t + ".p99", round(median([r.get("p99", 0) for r in rs]), 3),
               "ms")
        record(t + ".apache_cpu_per_req",
               round(median([r["server_cpu_us"] for r in rs]), 1), "us")
        record(t + ".apache_sys_share",
               round(median([r["sys_share"] for r in rs]), 1), "%")
        record(t + ".redis_cpu_per_req",
               round(median([r["redis_cpu_us"] for r in rs]), 1), "us")
        tot = sum(r["requests"] for r in rs)
        bad = sum(r["non2xx"] + r["errors"] for r in rs)
        record(t + ".non2xx_or_error_share", round(bad / max(tot, 1), 4),
               "fraction")
        if name == "floor":
            record(t + ".pings_per_req",
                   round(median([r["pings"] for r in rs]), 3), "calls")
        elif name != "bare":
            # wrk counts answered requests; up to one more per connection
            # was in flight when it stopped and reached Redis.
            calls = median([r["script_calls"] for r in rs])
            exact = name != "lease"
            ok = all(r["requests"] <= r["script_calls_n"]
                     <= r["requests"] + FLOOR_CONNS for r in rs)
            record(t + ".script_calls_per_req", round(calls, 3), "calls",
                   "= 1.00" if exact else "",
                   ("met" if ok else "MISSED") if exact else "")
            batches = [r["batch"] for r in rs if r.get("batch")]
            if batches:
                record(t + ".batch_size", round(median(batches), 2),
                       "calls/write")
    # Each pair by req/s, and by Apache CPU per request (den's over
    # num's): the ratio the req/s would show if the Apache CPU were all
    # Apache's, which moves far less than req/s when other work shares
    # that CPU. The rows are grouped by kind.
    cpu_rows = []
    for num, den in pairs:
        both = [(x, y) for x, y in zip(results.get(num, []),
                                        results.get(den, []))
                if x["requests"] and y["requests"]]
        if not both:
            continue
        ratio = median([x["rps"] / y["rps"] for x, y in both])
        want = targets.get((num, den))
        record("%s.ratio.%s_over_%s" % (tag, num, den), round(ratio, 3), "x",
               ">= %.2f" % want if want else "",
               ("met" if ratio >= want else "MISSED") if want else "")
        cpu = median([y["server_cpu_us"] / max(x["server_cpu_us"], 1e-9)
                      for x, y in both])
        cpu_rows.append(("%s.cpu_ratio.%s_over_%s" % (tag, num, den),
                         round(cpu, 3), "x"))
    for row in cpu_rows:
        record(*row)


def perf_stat_args(events, out):
    return ["perf", "stat", "-x", ",", "-o", out, "-e", ",".join(events)]


def parse_perf_stat(path):
    """{event: count} from a `perf stat -x ,` output file."""
    counts = {}
    try:
        with open(path) as f:
            for line in f:
                parts = line.strip().split(",")
                if len(parts) > 3 and parts[0] and not line.startswith("#"):
                    try:
                        counts[parts[2]] = float(parts[0])
                    except ValueError:
                        pass
    except OSError:
        pass
    return counts


PERF_CPU_EVENTS = ("context-switches", "raw_syscalls:sys_enter")
PERF_PROC_EVENTS = ("task-clock", "context-switches", "raw_syscalls:sys_enter",
                    "syscalls:sys_enter_sendto", "syscalls:sys_enter_recvfrom",
                    "syscalls:sys_enter_poll", "syscalls:sys_enter_futex")


def floor_perf_stat(a, rd, tmp, tag, name, srv, path, wcpu):
    """Under load: context switches and system calls per request on the
    Apache CPU (perf stat -C, everything that ran there) and in the Apache
    processes alone (perf stat -p), and the batch size: script calls per
    sendto(2) of the core. The two perf stats nest around one wrk run, so
    each counts exactly while wrk runs, and wrk's count is the requests."""
    secs = a.perf_seconds
    base = os.path.join(tmp, "perf-%s-%s" % (tag, name))
    pids = ",".join(str(p) for p in srv.pids())
    cmd = pin(wcpu) + perf_stat_args(PERF_CPU_EVENTS, base + ".cpu") + [
        "-C", a.server_cpu, "--"] + perf_stat_args(
            PERF_PROC_EVENTS, base + ".proc") + ["-p", pids, "--"] + \
        floor_wrk_cmd(srv, path, name, secs)
    c0 = settled_calls(rd)
    out = run(cmd, secs + 60)
    c1 = settled_calls(rd)
    calls = c1[0] + c1[1] - c0[0] - c0[1]
    m = re.search(r"(\d+) requests in", out)
    if not m:
        miss("%s.%s perf stat" % (tag, name), "wrk gave no count")
        return
    req = max(int(m.group(1)), 1)
    cpu = parse_perf_stat(base + ".cpu")
    proc = parse_perf_stat(base + ".proc")
    t = "%s.%s" % (tag, name)
    if not cpu or not proc:
        miss(t + " perf stat", "perf stat gave no counts (linux-perf?)")
        return
    record(t + ".cpu1.cs_per_req",
           round(cpu.get("context-switches", 0) / req, 2), "switches")
    record(t + ".cpu1.syscalls_per_req",
           round(cpu.get("raw_syscalls:sys_enter", 0) / req, 2), "calls")
    record(t + ".apache.cpu_per_req",
           round(proc.get("task-clock", 0) * 1000 / req, 1), "us")
    record(t + ".apache.cs_per_req",
           round(proc.get("context-switches", 0) / req, 2), "switches")
    record(t + ".apache.syscalls_per_req",
           round(proc.get("raw_syscalls:sys_enter", 0) / req, 2), "calls")
    for ev in ("sendto", "recvfrom", "poll", "futex"):
        record("%s.apache.%s_per_req" % (t, ev),
               round(proc.get("syscalls:sys_enter_" + ev, 0) / req, 3),
               "calls")
    sends = proc.get("syscalls:sys_enter_sendto", 0)
    if calls and sends:
        record(t + ".apache.script_calls_per_sendto", round(calls / sends, 2),
               "calls")
    log("perf stat %s: %d requests; CPU %s per request: %s; apache per "
        "request: %s; script calls %d" % (
            t, req, a.server_cpu,
            {k: round(v / req, 2) for k, v in cpu.items()},
            {k: round(v / req, 3) for k, v in proc.items()}, calls))


def floor_perf_record(a, tmp, tag, name, srv, path, wcpu):
    """perf record -C on the Apache CPU under load: the Apache processes'
    kernel share and top symbols (self), and how busy the CPU was."""
    secs = a.perf_seconds
    data = os.path.join(tmp, "perf-%s-%s.data" % (tag, name))
    pids = srv.pids()
    wk = subprocess.Popen(pin(wcpu) + floor_wrk_cmd(srv, path, name, secs + 2),
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        time.sleep(1.0)
        run(pin(wcpu) + ["perf", "record", "-q", "-C", a.server_cpu, "-g",
                         "-e", "cpu-clock", "-o", data, "--", "sleep",
                         str(secs)], secs + 60)
        wk.wait(timeout=secs + 60)
    finally:
        if wk.poll() is None:
            wk.kill()
            wk.wait()
    report = ["perf", "report", "-i", data, "--stdio", "--no-children",
              "-g", "none", "--percentage", "relative"]
    by_pid = run(report + ["--sort", "pid"], 120, check=False)
    ours = idle = 0.0
    tids = threads(pids)
    for m in re.finditer(r"^\s+([0-9.]+)%\s+(\d+):(\S*)", by_pid, re.M):
        if int(m.group(2)) in tids:
            ours += float(m.group(1))
        elif int(m.group(2)) == 0:
            idle += float(m.group(1))
    t = "%s.%s.perf" % (tag, name)
    record(t + ".apache_share_of_cpu", round(ours, 1), "%")
    record(t + ".idle_share_of_cpu", round(idle, 1), "%")
    syms = run(report + ["--sort", "dso,sym", "--pid",
                         ",".join(str(p) for p in pids)], 120, check=False)
    kernel = user = 0.0
    top = []
    by_dso = {}
    for m in re.finditer(r"^\s+([0-9.]+)%\s+(\S+)\s+\[(.)\]\s+(\S+)", syms,
                         re.M):
        pct, dso, kind, sym = float(m.group(1)), m.group(2), m.group(3), \
            m.group(4)
        if kind == "k":
            kernel += pct
        else:
            user += pct
            short = re.sub(r"\.so.*$", "", os.path.basename(dso))
            by_dso[short] = by_dso.get(short, 0) + pct
        top.append((pct, sym))
    record(t + ".apache_kernel_share", round(kernel, 1), "%")
    record(t + ".apache_user_share", round(user, 1), "%")
    for short in sorted(by_dso, key=lambda k: -by_dso[k])[:6]:
        record("%s.user.%s" % (t, short), round(by_dso[short], 1), "%")
    for pct, sym in top[:a.perf_top]:
        record("%s.sym.%s" % (t, sym), round(pct, 1), "%")
    log("perf record %s: apache %.1f%% of CPU %s (idle %.1f%%), kernel "
        "%.1f%% user %.1f%% of its samples; top %s" % (
            t, ours, a.server_cpu, idle, kernel, user,
            ", ".join("%s %.1f" % (s, p) for p, s in top[:8])))


def part_floor(a, rd, tmp, build):
    so = os.path.join(build, "mod_tbucket.so")
    floor_so = os.path.join(build, "bench", "mod_floor.so")
    for need in (so, floor_so):
        if not os.path.exists(need):
            miss("floor", "%s is not built (make bench builds it)" % need)
            return
    if not a.server_cpu:
        miss("floor", "needs two CPUs and --pin split")
        return
    # The layout of the floor: Redis beside wrk on CPU 0, Apache alone on
    # CPU 1, so the Apache CPU pays only the client side of each trip.
    rcpu, acpu, wcpu = "0", a.server_cpu, a.client_cpu
    subprocess.run(["taskset", "-a", "-pc", rcpu, str(rd.proc.pid)],
                   stdout=subprocess.DEVNULL)
    have_perf = shutil.which("perf") is not None
    if not have_perf:
        miss("floor perf figures", "perf is not installed (linux-perf)")
    try:
        for mpm in ("event", "prefork"):
            if over_budget():
                miss("floor.%s" % mpm, "time budget spent")
                continue
            floor_mpm(a, rd, tmp, so, floor_so, mpm, acpu, wcpu, have_perf)
    finally:
        subprocess.run(["taskset", "-a", "-pc",
                        a.redis_cpu or "0-%d" % (NCPU - 1),
                        str(rd.proc.pid)], stdout=subprocess.DEVNULL)


def floor_mpm(a, rd, tmp, so, floor_so, mpm, acpu, wcpu, have_perf):
    tag = "floor.%s" % mpm
    servers = []

    def start(name, extra):
        srv = Apache(tmp, "%s-%s" % (mpm, name), acpu, extra, mpm).start()
        servers.append(srv)
        return srv

    try:
        bare = start("bare", "")
        floor = start("floor", FLOOR_CONF.format(so=floor_so, port=rd.port))
        mod = start("module", floor_tb_conf(so, rd.url, ""))
        default_pool = pool_size_of(mod)
        if default_pool is not None:
            record(tag + ".module.pool_size", default_pool, "connections")
        variants = [("bare", bare, "/a/ok.txt"),
                    ("floor", floor, "/a/ok.txt"),
                    ("module", mod, "/b/ok.txt")]
        pairs = [("module", "floor"), ("module", "bare"), ("floor", "bare")]
        targets = {("module", "floor"): 0.97}
        if mpm == "event":
            variants.append(("lease", mod, "/l/ok.txt"))
            pairs.append(("lease", "bare"))
            targets = {("module", "floor"): 1.10, ("module", "bare"): 0.75,
                       ("lease", "bare"): 0.95}
            # The pool sweep; the default size is the module variant.
            for n in POOL_SIZES:
                if n == default_pool:
                    continue
                srv = start("pool%d" % n, floor_tb_conf(
                    so, rd.url, " pool=%d" % n))
                variants.append(("pool%d" % n, srv, "/b/ok.txt"))
        results = floor_rounds(a, rd, variants, wcpu, tag)
        if mpm == "event" and default_pool in POOL_SIZES:
            results["pool%d" % default_pool] = results["module"]
        for n in POOL_SIZES if mpm == "event" else ():
            pairs += [("pool%d" % n, "bare"), ("pool%d" % n, "floor")]
        record_floor(tag, results, pairs, targets)
        if have_perf:
            for name, srv, path in variants[:3]:
                if not over_budget():
                    floor_perf_stat(a, rd, tmp, tag, name, srv, path, wcpu)
            if mpm == "event":
                for name, srv, path in variants[1:3]:
                    if not over_budget():
                        floor_perf_record(a, tmp, tag, name, srv, path, wcpu)
        for srv in servers:
            srv.log_errors()
    finally:
        for s in reversed(servers):
            s.stop()


# ---- part 6: the shim ---------------------------------------------------

def part_shim(a, rd, tmp, build, shim_connect):
    so = os.path.join(build, "libtbucket_preload.so")
    if not os.path.exists(so):
        miss("shim connect()", "%s is not built" % so)
        return
    port = free_port()
    other = free_port()
    confs = {}
    for name, rule_port in (("unmatched", other), ("matched", port)):
        path = os.path.join(tmp, "shim-%s.conf" % name)
        with open(path, "w") as f:
            f.write('redis_url = "%s";\ntimeout_ms = 500;\n'
                    'outbound = (\n  { name = "bench"; port = %d; '
                    'capacity = 1000000000; rate = 1000000000; }\n);\n'
                    % (rd.url, rule_port))
        confs[name] = path
    n = a.shim_calls
    cpu = "0" if NCPU > 1 else None
    res = {"plain": [], "unmatched": [], "matched": []}
    for i in range(a.rounds):
        for name in ("plain", "unmatched", "matched"):
            env = dict(os.environ)
            if name != "plain":
                env["LD_PRELOAD"] = so
                env["TBUCKET_CONFIG"] = confs[name]
            if name == "matched":
                rd.r.config_resetstat()
            out = run(pin(cpu) + [shim_connect, str(port), str(n)], 120,
                      env=env)
            r = kv(out)
            if name == "matched":
                calls, _ = rd.script_calls()
                r["calls"] = calls
            res[name].append(r)
    for name in ("plain", "unmatched", "matched"):
        record("shim.connect.%s.mean" % name,
               round(median([r["mean_ns"] for r in res[name]]) / 1000.0, 2),
               "us")
        record("shim.connect.%s.p50" % name,
               round(median([r["p50_ns"] for r in res[name]]) / 1000.0, 2),
               "us")
    # Judged on the medians: on a loaded machine the means carry the
    # scheduler's outliers, which no shim adds or removes.
    p50 = {k: median([r["p50_ns"] for r in v]) / 1000.0
           for k, v in res.items()}
    mean = {k: median([r["mean_ns"] for r in v]) / 1000.0
            for k, v in res.items()}
    d_un = p50["unmatched"] - p50["plain"]
    record("shim.connect.unmatched_minus_plain.p50", round(d_un, 2), "us",
           "<= 1.00", "met" if d_un <= 1.0 else "MISSED")
    record("shim.connect.unmatched_minus_plain.mean",
           round(mean["unmatched"] - mean["plain"], 2), "us")
    record("shim.connect.matched_minus_plain.p50",
           round(p50["matched"] - p50["plain"], 2), "us")
    record("shim.connect.matched_minus_plain.mean",
           round(mean["matched"] - mean["plain"], 2), "us")
    calls = median([r["calls"] for r in res["matched"]])
    record("shim.connect.matched.redis_calls_per_connect",
           round(calls / n, 3), "calls")


# ---- output -------------------------------------------------------------

def machine():
    cpu = "?"
    try:
        with open("/proc/cpuinfo") as f:
            m = re.search(r"model name\s*:\s*(.*)", f.read())
            cpu = m.group(1).strip() if m else cpu
    except OSError:
        pass
    try:
        with open("/etc/debian_version") as f:
            deb = "Debian " + f.read().strip()
    except OSError:
        deb = platform.system()
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return "%s, %s, %d vCPU (%s), %.1f GiB, kernel %s" % (
        platform.node(), deb, NCPU, cpu, mem, platform.release())


def write_results(a, started):
    res_dir = os.path.join(HERE, "results")
    os.makedirs(res_dir, exist_ok=True)
    tsv = os.path.join(res_dir, "latest.tsv")
    with open(tsv + ".tmp", "w") as f:
        f.write("name\tvalue\tunit\n")
        for name, value, unit, _, _ in ROWS:
            f.write("%s\t%s\t%s\n" % (name, value, unit))
    os.replace(tsv + ".tmp", tsv)
    lines = ["mod_tbucket bench, %s UTC, %.0f s" % (
                 started.strftime("%Y-%m-%d %H:%M"),
                 time.monotonic() - T_START),
             "",
             "Machine: %s." % machine(),
             "Load average (1 min) at start %.2f, at end %.2f; redis-benchmark "
             "PING at start: %s ops/s (an idle machine of this kind: about "
             "100k)." % (a.load_start, os.getloadavg()[0], a.ping_rate),
             "Pinning: %s." % a.pin_text,
             "",
             "| figure | value | unit | target | |",
             "| --- | ---: | --- | --- | --- |"]
    for name, value, unit, target, verdict in ROWS:
        lines.append("| %s | %s | %s | %s | %s |" % (name, value, unit,
                                                      target, verdict))
    if MISSES:
        lines += ["", "Not measured:"] + ["- " + m for m in MISSES]
    text = "\n".join(lines) + "\n"
    with open(os.path.join(res_dir, "latest.md"), "w") as f:
        f.write(text)
    print(text)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--quick", action="store_true",
                    help="short runs, for trying the driver")
    ap.add_argument("--only", default="core,cpu,memory,floor,shim,tls,http")
    ap.add_argument("--pin", default="split", choices=("split", "none"),
                    help="split: Redis and the servers on the last CPU, "
                         "load generators on CPU 0; none: no taskset")
    a = ap.parse_args()
    a.build = os.path.abspath(a.build)
    a.concurrency = 50
    a.rounds = 2 if a.quick else 3
    a.http_rounds = 2 if a.quick else 3
    a.core_seconds = 1 if a.quick else 2
    a.tls_seconds = 1 if a.quick else 2
    a.http_seconds = 2 if a.quick else 3
    a.callgrind_decisions = 2000 if a.quick else 20000
    a.top_functions = 10
    a.mem_buckets = 10000 if a.quick else 50000
    a.rss_requests = 20000 if a.quick else 100000
    a.ab_requests = 2000 if a.quick else 5000
    a.shim_calls = 1000 if a.quick else 5000
    a.floor_rounds = 2 if a.quick else 5
    a.floor_seconds = 2
    a.perf_seconds = 2 if a.quick else 3
    a.perf_top = 12
    a.peer_workers = 2 * NCPU + 1
    if a.pin == "split" and NCPU > 1:
        a.server_cpu = a.redis_cpu = str(NCPU - 1)
        a.client_cpu = "0"
        a.pin_text = ("Redis, apache2 and gunicorn on CPU %d, wrk/ab on "
                      "CPU 0 (taskset); core: see core.pinned/core.shared; "
                      "floor: Redis and wrk on CPU 0, apache2 on CPU %d"
                      % (NCPU - 1, NCPU - 1))
    else:
        a.server_cpu = a.redis_cpu = a.client_cpu = None
        a.pin_text = "none (every process on every CPU)"
    parts = set(a.only.split(","))
    started = datetime.datetime.utcnow()
    a.load_start = os.getloadavg()[0]
    a.ping_rate = "?"

    tool, shim_connect = build_tools(a.build)
    tmp = tempfile.mkdtemp(prefix="tbbench-", dir="/tmp")
    os.chmod(tmp, 0o755)
    rd = Redis(tmp, a.redis_cpu).start()
    try:
        sha = rd.r.script_load(script_text(a.build))
        # How fast is the machine right now? Others may be loading it.
        try:
            out = run(["redis-benchmark", "-p", str(rd.port), "-c", "50",
                       "-n", "50000", "-t", "ping", "--csv"], 60)
            a.ping_rate = "%.0f" % float(
                out.splitlines()[-1].split(",")[1].strip('"'))
        except Exception:
            pass
        want = embedded_sha(a.build)
        if want and want != sha:
            raise RuntimeError("SCRIPT LOAD gave %s, libtb embeds %s" % (
                sha, want))
        for part, fn, args in (
                ("core", part_core, (a, rd, tool, sha)),
                ("cpu", part_cpu, (a, rd, tool, tmp)),
                ("memory", part_redis_memory, (a, rd, tool)),
                ("floor", part_floor, (a, rd, tmp, a.build)),
                ("shim", part_shim, (a, rd, tmp, a.build, shim_connect)),
                ("tls", tls_bench.part_tls,
                 (a, tool, tmp, sys.modules[__name__])),
                ("http", part_http, (a, rd, tmp, a.build, tool))):
            if part not in parts:
                continue
            if over_budget():
                miss(part, "time budget (%d s) spent" % BUDGET_S)
                continue
            log("part %s" % part)
            try:
                fn(*args)
            except Exception as e:  # Report, and go on with the rest.
                miss(part, "failed: %s" % e)
    finally:
        rd.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    write_results(a, started)
    return 0


if __name__ == "__main__":
    sys.exit(main())
