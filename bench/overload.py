#!/usr/bin/python3
"""overload.py -- `make bench`'s overload part: a flood of many clients,
each within its own rate limit, against a PHP site, with and without the
module's local protection, against mod_qos, and with CPU priority and
caps that tune themselves, side by side.

Two stacks, each on one CPU (taskset), the load generator and Redis on
the other:

  modphp   prefork MPM + mod_php, MaxRequestWorkers 8
  fpm      event MPM (4 children x 8 threads) + mod_proxy_fcgi + php-fpm
           (pm = static, pm.max_children 8), php-fpm on Apache's CPU

both with Debian's keep-alive defaults (KeepAlive On, MaxKeepAliveRequests
100, KeepAliveTimeout 5), PHP without opcache. The configurations
(columns; VARIANTS, PARTS):

  unloaded          the critical client alone (no limiter), every 100 ms
  no limiter        the module loaded, nothing enabled
  per-key           TBucketLimit 100 10/s by X-API-Key on /app/
  local protection  the same, plus TBucketShed low=50 normal=75 high=90
                    over the site, TBucketLocalConcurrency 2 on /app/ and
                    TBucketPriority critical (and no local cap) for
                    X-Partner: yes (today's defaults)
  mod_qos           Debian's mod_qos 11.63 instead (ov.qos_body()): at
                    most 2 requests in /app/ but the partner's, 503 beyond,
                    keep-alive closed from 80% of MaxRequestWorkers
  priority, cap N   local protection with /app/ classed low (the
                    partner's <If> makes it critical), TBucketCPUPriority
                    On low=10 critical=-10 (--cpu-priority), cap N = 1,
                    2, 4, 8; under php-fpm also the pool split: the
                    partner's requests to a pool of their own (2
                    workers, process.priority -10), the rest to the
                    app's (8 workers, process.priority 10)
  priority, auto    the same with TBucketLocalConcurrency auto
  auto, prio off    local protection with TBucketLocalConcurrency auto
                    and nothing else changed (no class, no CPU priority,
                    one pool)

The scenario is tests/integration/tbtest/overload.py: 64 keep-alive
connections flooding /app/heavy.php (about 25 ms of PHP CPU) over 10,000
API keys, and a critical client opening a new connection to the same
page (X-Partner: yes: never shed, outside the local cap; --critical-path
to ask for /health.php instead) every 100 ms with a 10 s timeout. Under
each auto column the cap (tbucket_local_limit) is read every 0.5 s from
1 s before the flood to the end of two phases after it (after_flood()):
4 s of the page at 16 a second, then 6 s of 12 connections on a page
that waits 10 ms without CPU. Also measured, each alone: the server CPU
of one rendered page (no limiter, 40 pages on one connection) and of one
request refused by local protection (its places held by sleeping
critical requests; up to 400 requests on new connections), with the
Redis calls it makes; and what CPU priority costs an unloaded request
(cpu_cost()).

Targets: on local protection, the critical client 100% answered, its p99
at most 8x its unloaded p99, a refused request at most 1/10 of a
rendered page's server CPU and no Redis call; with priority, the
critical p99 at most 2x its unloaded p99 under mod_php and 3x under
php-fpm; auto's flood pages per second at least 90% of the best cap's,
and its critical p99 no worse than the best cap's. A configuration that
`apache2 -t` refuses (a module without the directives) is reported as
not measured.

    /usr/bin/python3 bench/overload.py [--build DIR] [--quick]
                                       [--stacks modphp,fpm]
                                       [--part base|priority|all]

Writes bench/results/overload.md (the tables), overload.tsv (name,
value, unit) and overload-auto-trace.tsv (the auto caps' readings), and
prints the Markdown. Every server is started on a free loopback port in
a temp dir and stopped by PID; every load is bounded in time and in
requests. About 7 minutes (--part base: 2.5).
"""
import argparse
import datetime
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

import benchkit as bench
from tbtest import overload as ov
from tbtest.apache import Apache
from tbtest.php import ModPhp, PhpFpm, install_pages

STACKS = {
    "modphp": {"title": "prefork + mod_php (MaxRequestWorkers 8)",
               "mpm": "prefork", "servers": 8},
    "fpm": {"title": "event + php-fpm (pm.max_children 8; Apache 4 x 8 "
                     "threads)",
            "mpm": "event", "servers": 4, "children": 8},
}
KEEPALIVE = (100, 5)          # Debian's MaxKeepAliveRequests, timeout s
P99_FACTOR = 8.0
# The unloaded critical client sends every 100 ms, as under the flood: a
# rendered page takes about 25 ms of the server's one CPU, and sending
# faster would make the baseline itself a load (120 samples in the 12 s).
UNLOADED_INTERVAL = 0.1
# The critical client's interval under the flood (ov.run()'s default).
CRITICAL_INTERVAL = 0.1
SHED_SHARE = 0.10
# The priority targets: the critical p99 over the unloaded p99 with CPU
# priority (mod_php) and with the pool split (php-fpm); auto's flood
# pages against the best hand-tuned cap's.
PRIO_FACTOR = {"modphp": 2.0, "fpm": 3.0}
AUTO_PAGES_SHARE = 0.90
# The split's pools: the flood's (every request but the partner's) at
# nice 10, TBucketCPUPriority's default low step; the partner's own two
# workers at -10, the guide's critical step.
FLOOD_POOL_NICE = 10
CRITICAL_POOL_NICE = -10
CRITICAL_POOL = "critical"
PARTNER_EXPR = "%{HTTP:X-Partner} == 'yes'"

# What each column runs: the module's configuration (ov.config_body's
# kind, or mod_qos), the local cap on /app/ (None: --local-concurrency),
# and prio: TBucketCPUPriority On with /app/ classed low (the partner's
# <If> raises it to critical), and under php-fpm the pool split too.
VARIANTS = {
    "unloaded": {"kind": "none"},
    "none": {"kind": "none"},
    "per_key": {"kind": "per_key"},
    "local": {"kind": "local", "lc": None},
    "qos": {"kind": "qos"},
    "cap1": {"kind": "local", "lc": 1, "prio": True},
    "prio": {"kind": "local", "lc": None, "prio": True},
    "auto": {"kind": "local", "lc": "auto", "prio": True, "trace": True},
    "cap4": {"kind": "local", "lc": 4, "prio": True},
    "cap8": {"kind": "local", "lc": 8, "prio": True},
    "auto_off": {"kind": "local", "lc": "auto", "trace": True},
}
# --part: base is the comparison of the first round (no limiter, the
# per-key limit alone, local protection); priority adds mod_qos, CPU
# priority or the pool split, the hand-tuned caps and auto. Auto runs
# between the caps, so that drift in the machine's load falls on both.
PARTS = {
    "base": ("none", "per_key", "local"),
    "priority": ("local", "qos", "cap1", "prio", "auto", "cap4", "cap8",
                 "auto_off"),
}
PARTS["all"] = PARTS["base"] + PARTS["priority"][1:]
CAPS = ("cap1", "prio", "cap4", "cap8")


def cap_name(col):
    """A hand-tuned cap's name in the targets table."""
    return "cap 2" if col == "prio" else "cap " + col[3:]
CPU_NAMES = {"modphp": "CPU priority", "fpm": "pool split"}


def column_name(stack, col, lc):
    """The header of a column."""
    prio = CPU_NAMES[stack]
    return {"unloaded": "unloaded", "none": "no limiter",
            "per_key": "per-key 100 10/s",
            "local": "local protection (cap %d)" % lc,
            "qos": "mod_qos (cap %d)" % lc,
            "prio": "%s, cap %d" % (prio, lc),
            "cap1": "%s, cap 1" % prio, "cap4": "%s, cap 4" % prio,
            "cap8": "%s, cap 8" % prio,
            "auto": "%s, auto" % prio,
            "auto_off": "auto, %s off" % prio}[col]


class NotMeasured(Exception):
    pass


def guarded(fn, *args, **kw):
    """fn(...), with the tests' helpers' pytest.fail (an exception outside
    Exception) turned into NotMeasured."""
    try:
        return fn(*args, **kw)
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException as e:   # noqa: B902 -- pytest's Failed
        raise NotMeasured("%s: %s" % (type(e).__name__, e)) from e


def fpm_of(stack, col, fpms):
    """The php-fpm a column talks to: the split one under prio."""
    if stack != "fpm":
        return None
    return fpms["split"] if VARIANTS[col].get("prio") else fpms["one"]


def config_of(args, stack, col, a, fpm, redis_url):
    """The config body of one column: the PHP front, then the module's
    (or mod_qos's) lines."""
    v = VARIANTS[col]
    if stack == "modphp":
        front = ModPhp(a).conf()
    else:
        install_pages(a)
        front = (fpm.split_conf(CRITICAL_POOL, PARTNER_EXPR)
                 if v.get("prio") else fpm.conf())
    prefix = "ov-%s-%s:" % (stack, col)
    if v["kind"] == "qos":
        root = guarded(ov.qos_root)
        return front + ov.qos_body(root, redis_url, prefix=prefix,
                                   cap=args.local_concurrency)
    lc = v.get("lc") or args.local_concurrency
    return front + ov.config_body(
        v["kind"], redis_url, prefix=prefix, local_concurrency=lc,
        cpu_priority=args.cpu_priority if v.get("prio") else None,
        app_priority="low" if v.get("prio") else None)


def start_apache(args, stack, col, fpm, redis_url):
    """Start one Apache of `stack` for column `col`; returns it, or
    raises NotMeasured when apache2 -t refuses the configuration."""
    spec = STACKS[stack]
    a = guarded(Apache, mpm=spec["mpm"], servers=spec["servers"],
                build=args.build, log_level="warn", keepalive=KEEPALIVE,
                cpus=args.server_cpu,
                modules=PhpFpm.MODULES if fpm else ())
    try:
        body = config_of(args, stack, col, a, fpm, redis_url)
        rc, out = a.configtest(body)
        if rc != 0:
            raise NotMeasured("apache2 -t refuses the configuration: %s" %
                              out.strip().splitlines()[-1][:200])
        guarded(a.start, body)
    except BaseException:
        a.cleanup()
        raise
    return a


def start_fpms(args, stack):
    """The php-fpm masters of the fpm stack: one pool of 8 (today's
    setup), and the split (the flood's 8 workers at nice
    FLOOD_POOL_NICE, the partner's 2 at CRITICAL_POOL_NICE). Both on the server's CPU;
    the one a column does not use idles."""
    if stack != "fpm":
        return {}
    n = STACKS[stack]["children"]
    fpms = {}
    try:
        fpms["one"] = guarded(PhpFpm(children=n, cpus=args.server_cpu).start)
        fpms["split"] = guarded(PhpFpm(
            cpus=args.server_cpu,
            pools=[("app", n, FLOOD_POOL_NICE),
                   (CRITICAL_POOL, 2, CRITICAL_POOL_NICE)]).start)
    except BaseException:
        for f in fpms.values():
            f.cleanup()
        raise
    return fpms


def run_stack(args, stack, rd, res):
    out = res.setdefault(stack, {"cols": {}, "notes": [], "traces": {}})
    fpms = {}
    try:
        fpms = start_fpms(args, stack)
        for col in ("unloaded",) + args.columns:
            name = column_name(stack, col, args.local_concurrency)
            a = None
            try:
                fpm = fpm_of(stack, col, fpms)
                a = start_apache(args, stack, col, fpm, rd.url)
                run_config(args, stack, col, a, fpm, rd, out)
                bad = a.bad_lines()
                if bad:
                    out["notes"].append("%s: %d error-log lines, first: %s"
                                        % (name, len(bad), bad[0][:200]))
            except NotMeasured as e:
                out["cols"][col] = None
                out["notes"].append("%s: not measured (%s)" % (name, e))
                bench.log("overload %s %s: NOT MEASURED %s" % (stack, col,
                                                                e))
            finally:
                if a is not None:
                    a.cleanup()
    except NotMeasured as e:
        out["notes"].append("stack not measured (%s)" % e)
        bench.log("overload %s: NOT MEASURED %s" % (stack, e))
    finally:
        for f in fpms.values():
            f.cleanup()


def cpu_busy_s(cpu):
    """Seconds CPU `cpu` has been busy (not idle or waiting on I/O), from
    /proc/stat, or None without a pinned CPU. Less the server's own CPU
    over a run, what other work took of the server's CPU: the machine is
    shared, and a run in which that is large is not like the others."""
    if cpu is None:
        return None
    with open("/proc/stat") as f:
        for line in f:
            tok = line.split()
            if tok[0] == "cpu%s" % cpu:
                ticks = [int(x) for x in tok[1:]]
                return (sum(ticks[:8]) - ticks[3] - ticks[4]) * ov.TICK_S
    return None


def run_config(args, stack, col, a, fpm, rd, out):
    fpm_pid = fpm.proc.pid if fpm else None
    common = dict(fpm_pid=fpm_pid, redis=rd.r, status_path=ov.STATUS_PATH,
                  cpus=args.client_cpu, critical_path=args.critical_path)
    name = column_name(stack, col, args.local_concurrency)
    if col == "unloaded":
        # The critical client alone, then a rendered page's cost.
        busy = cpu_busy_s(args.server_cpu)
        rep = ov.run(a.port, a.proc.pid, flood=0,
                     duration=args.unloaded_seconds,
                     critical_interval=UNLOADED_INTERVAL, **common)
        if busy is not None:
            rep["other_cpu_s"] = (cpu_busy_s(args.server_cpu) - busy
                                  - rep["server_cpu_s"])
        out["cols"]["unloaded"] = rep
        bench.log("overload %s unloaded: %s" % (stack, ov.summary(rep)))
        out["page"] = ov.page_cost(a.port, a.proc.pid, fpm_pid,
                                   n=args.page_requests,
                                   headers={"X-API-Key": "page"})
        bench.log("overload %s page: %s" % (stack, out["page"]))
        return
    trace = None
    if VARIANTS[col].get("trace"):
        trace = ov.CapTrace(a.port).start()
        time.sleep(1.0)
        trace.mark("flood")
    busy = cpu_busy_s(args.server_cpu)
    rep = ov.run(a.port, a.proc.pid, flood=args.flood, keys=args.keys,
                 duration=args.seconds, **common)
    if busy is not None:
        rep["other_cpu_s"] = (cpu_busy_s(args.server_cpu) - busy
                              - rep["server_cpu_s"])
    out["cols"][col] = rep
    bench.log("overload %s %s: %s" % (stack, col, ov.summary(rep)))
    if trace is not None:
        out["traces"][col] = after_flood(args, a, rd, trace)
        bench.log("overload %s %s trace: %s" % (
            stack, col, trace_summary(out["traces"][col])))
    kinds = rep["flood"]["error_kinds"]
    if kinds:
        out["notes"].append("%s: flood errors %s" % (
            name, ", ".join("%s %d" % kv for kv in sorted(kinds.items()))))
    if col == "local":
        time.sleep(0.5)
        out["shed"] = ov.shed_cost(a.port, a.proc.pid, fpm_pid, rd.r,
                                   hold=args.local_concurrency,
                                   n=args.shed_requests)
        bench.log("overload %s shed: %s" % (stack, out["shed"]))


def after_flood(args, a, rd, trace):
    """The two phases after the flood, the cap still read by trace:
    "light", the heavy page at args.after_rate a second (16: 40% of one
    CPU) on new connections; then "io", 12 keep-alive connections asking
    back to back for a page that waits 10 ms without CPU, which wants
    more places than the CPU-bound page did. Returns the trace's rows
    and what each phase's clients saw."""
    trace.mark("light")
    light = ov.paced(a.port, "/app/heavy.php", args.after_rate,
                     args.after_seconds, headers={"X-API-Key": "after"},
                     cpus=args.client_cpu)
    trace.mark("io")
    io = ov.run(a.port, a.proc.pid, redis=rd.r, flood=12, keys=1000,
                flood_path="/app/sleep.php?ms=10", critical_interval=0.5,
                duration=args.io_seconds, warmup=0.2, cpus=args.client_cpu)
    return {"rows": trace.stop(), "light": light,
            "io": {"per_s": io["flood"]["per_s"],
                   "by_status": io["flood"]["by_status"],
                   "p50_ms": io["flood"]["p50_ms"]}}


# ---- what CPU priority costs one request -------------------------------

CPU_COST_BODY = """TBucketRedis {url} timeout=500
TBucketPrefix ov-cpu:
TBucketCPUPriority On
<Location /p/>
    TBucketEnable On
    TBucketLocalConcurrency 1000
</Location>
<If "%{{HTTP:X-Low}} == 'yes'">
    TBucketPriority low
</If>
<Location /tbucket-status>
    SetHandler tbucket-status
    TBucketEnable Off
</Location>
"""


def comm_of(pid):
    try:
        with open("/proc/%d/comm" % pid) as f:
            return f.read().strip()
    except OSError:
        return ""


def requests_on_one(port, n, headers):
    """n GETs of /p/tiny.txt on one keep-alive connection: seconds."""
    conn = ov._connect(port, 10)
    t0 = time.monotonic()
    for _ in range(n):
        conn.request("GET", "/p/tiny.txt", headers=headers)
        r = conn.getresponse()
        r.read()
        if r.status != 200:
            raise NotMeasured("/p/tiny.txt answered %d" % r.status)
    dt = time.monotonic() - t0
    conn.close()
    return dt


# The system calls counted: every one, and those a move can make (the
# worker's getpriority, setpriority and send to the helper; the helper's
# receive, its check of the thread's /proc entry, and setpriority).
SYSCALLS = ("getpriority", "setpriority", "sendto", "recvmsg", "newfstatat")
PERF_EVENTS = (["raw_syscalls:sys_enter", "context-switches"]
               + ["syscalls:sys_enter_%s" % n for n in SYSCALLS])


def perf_counts(groups, fn, seconds_max=60):
    """System calls and context switches of each group of processes
    ({name: [pid, ...]}) while fn() runs: perf stat on their tracepoints,
    one perf per group, attached before and stopped after (counting in
    the kernel, so a traced process runs at its own pace, where strace
    would slow the helper enough for workers to find their last move
    not done yet). Returns {name: {event: count}}."""
    procs = {}
    for name, pids in groups.items():
        if not pids:
            continue
        fd, path = tempfile.mkstemp(prefix="tbperf-", suffix=".csv")
        os.close(fd)
        argv = ["perf", "stat", "-x", ",", "-o", path,
                "-e", ",".join(PERF_EVENTS),
                "-p", ",".join(str(p) for p in pids)]
        procs[name] = (subprocess.Popen(argv, stdout=subprocess.DEVNULL,
                                        stderr=subprocess.DEVNULL), path)
    try:
        time.sleep(0.5)             # attached to every process
        fn()
        time.sleep(0.2)
    finally:
        for p, _ in procs.values():
            p.send_signal(signal.SIGINT)
        for p, _ in procs.values():
            try:
                p.wait(seconds_max)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(5)
    out = {}
    for name, (_, path) in procs.items():
        got = {}
        with open(path) as f:
            for line in f:
                tok = line.strip().split(",")
                if len(tok) > 2 and tok[0].isdigit():
                    ev = tok[2].split(":")[-1].replace("sys_enter_", "")
                    got["syscalls" if ev == "sys_enter" else ev] = \
                        int(tok[0])
        os.unlink(path)
        out[name] = got
    return out


def cpu_cost(args, rd):
    """What TBucketCPUPriority costs an unloaded request: a prefork
    Apache with CPU priority on, a 3-byte file under a scope with local
    protection, asked for as a normal request and as a low one (an <If>
    on X-Low) on one keep-alive connection. The system calls and
    context switches of the workers and of the helper per request (perf
    stat, n requests of each kind), then wall and server CPU per request
    over alternated rounds without perf."""
    a = guarded(Apache, mpm="prefork", servers=2, build=args.build,
                log_level="warn", cpus=args.server_cpu)
    try:
        a.write_file("htdocs/p/tiny.txt", "ok\n")
        body = CPU_COST_BODY.format(url=rd.url)
        rc, outp = a.configtest(body)
        if rc != 0:
            raise NotMeasured("apache2 -t refuses TBucketCPUPriority On: %s"
                              % outp.strip().splitlines()[-1][:200])
        guarded(a.start, body)
        requests_on_one(a.port, 20, {})
        kids = a.child_pids()
        helper = [p for p in kids if comm_of(p) == "tbucket-nice"]
        workers = [p for p in kids if p not in helper]
        res = {"mode": "helper" if helper else "direct", "n": args.cost_n,
               "rounds": args.cost_rounds, "timed_n": args.cost_timed_n}
        kinds = (("normal", {}), ("low", {"X-Low": "yes"}))
        for kind, h in kinds:
            requests_on_one(a.port, 20, h)
            c = perf_counts({"worker": workers, "helper": helper},
                            lambda h=h: requests_on_one(a.port, args.cost_n,
                                                        h))
            if not c.get("worker"):
                raise NotMeasured("perf stat counted nothing (package "
                                  "linux-perf)")
            for who, got in c.items():
                res["%s.%s" % (kind, who)] = got
        timing = {k: {"wall": [], "cpu": []} for k, _ in kinds}
        for rnd in range(args.cost_rounds):
            order = kinds if rnd % 2 == 0 else kinds[::-1]
            for kind, h in order:
                c0 = ov.tree_cpu_s(a.proc.pid)
                dt = requests_on_one(a.port, args.cost_timed_n, h)
                c1 = ov.tree_cpu_s(a.proc.pid)
                timing[kind]["wall"].append(1e6 * dt / args.cost_timed_n)
                timing[kind]["cpu"].append(1e6 * (c1 - c0)
                                           / args.cost_timed_n)
        res["timing"] = {k: {m: statistics.median(v) for m, v in d.items()}
                         for k, d in timing.items()}
        res["changes"] = ov.metric_total(
            ov._status_text(a.port, ov.STATUS_PATH),
            "tbucket_cpu_priority_changes_total", priority="low")
        bad = a.bad_lines()
        if bad:
            res["log"] = "%d error-log lines, first: %s" % (len(bad),
                                                            bad[0][:200])
        return res
    finally:
        a.cleanup()


# ---- output -------------------------------------------------------------

def fmt(x, nd=1):
    if x is None:
        return "-"
    if isinstance(x, float):
        return ("%%.%df" % nd) % x
    return str(x)


def stack_rows(stack, r, columns):
    """(figure, {column: text}, target, verdict) rows and the TSV rows of
    one stack."""
    cols = r["cols"]
    tsv = []
    rows = []
    base = cols.get("unloaded")
    base_p99 = base["critical"]["p99_ms"] if base else None
    page = r.get("page")

    def col(fn):
        return {c: (fn(cols[c]) if cols.get(c) else None) for c in columns}

    def add(name, key, values, unit, target="", verdict="", nd=1):
        rows.append((name, {c: fmt(v, nd) for c, v in values.items()},
                     target, verdict))
        for c, v in values.items():
            if v is not None:
                tsv.append(("overload.%s.%s.%s" % (stack, c, key),
                            round(v, 3) if isinstance(v, float) else v,
                            unit))

    answered = col(lambda x: x["critical"]["answered"])
    sent = col(lambda x: x["critical"]["sent"])
    share = {c: (answered[c] / sent[c] if sent[c] else None)
             for c in columns}
    loc = cols.get("local")
    verdict = ""
    if loc:
        verdict = "met" if share["local"] == 1.0 else "MISSED"
    rows.append(("critical answered / sent",
                 {c: ("%d/%d" % (answered[c], sent[c])
                      if sent[c] is not None else "-") for c in columns},
                 "100%", verdict))
    for c in columns:
        if share[c] is not None:
            tsv.append(("overload.%s.%s.critical.answered_share" % (stack, c),
                        round(share[c], 4), "x"))
            tsv.append(("overload.%s.%s.critical.sent" % (stack, c),
                        sent[c], "requests"))
    add("critical p50 (ms)", "critical.p50", col(
        lambda x: x["critical"]["p50_ms"]), "ms", nd=2)
    add("critical p99 (ms)", "critical.p99", col(
        lambda x: x["critical"]["p99_ms"]), "ms", nd=2)
    slow = col(lambda x: x["critical"]["slowest"][:2] or None)
    rows.append(("critical slowest two: ms (s into the run)",
                 {c: (" ".join("%.0f (%.1f)" % (ms, i * CRITICAL_INTERVAL)
                               for i, ms, _ in slow[c]) if slow[c] else "-")
                  for c in columns}, "", ""))
    add("critical TCP connect p99 (ms)", "critical.connect_p99", col(
        lambda x: x["critical"]["connect_p99_ms"]), "ms", nd=2)
    ratio = col(lambda x: (x["critical"]["p99_ms"] / base_p99
                           if base_p99 and x["critical"]["p99_ms"]
                           else None))
    verdict = ""
    if loc:
        v = ratio["local"]
        verdict = "met" if v is not None and v <= P99_FACTOR else "MISSED"
    add("critical p99 / unloaded p99", "critical.p99_over_unloaded", ratio,
        "x", "<= %g" % P99_FACTOR, verdict, nd=2)
    for st in (200, 429, 503):
        add("flood %d" % st, "flood.%d" % st,
            col(lambda x, st=st: x["flood"]["by_status"].get(st, 0)),
            "requests")
    add("flood other statuses", "flood.other", col(
        lambda x: sum(v for k, v in x["flood"]["by_status"].items()
                      if k not in (200, 429, 503))), "requests")
    add("flood errors (reset, timeout)", "flood.errors",
        col(lambda x: x["flood"]["errors"]), "requests")
    add("flood answered / s", "flood.per_s", col(
        lambda x: x["flood"]["per_s"]), "req/s")
    add("flood pages rendered (200s) / s", "flood.pages_per_s", col(
        lambda x: x["flood"].get("pages_per_s")), "pages/s")
    add("flood p99 (ms)", "flood.p99", col(
        lambda x: x["flood"]["p99_ms"]), "ms")
    add("Apache CPU (s)", "apache_cpu", col(
        lambda x: x["apache_cpu_s"]), "s", nd=2)
    add("other work on the server's CPU (s)", "other_cpu", col(
        lambda x: x.get("other_cpu_s")), "s", nd=2)
    if stack == "fpm":
        add("php-fpm CPU (s)", "fpm_cpu", col(
            lambda x: x["fpm_cpu_s"]), "s", nd=2)
    add("Apache CPU per answered flood request (ms)",
        "apache_cpu_per_request", col(
            lambda x: x["apache_cpu_ms_per_request"]), "ms", nd=3)
    if page and stack == "fpm":
        # Only where the pages' CPU is php-fpm's: under mod_php a page's
        # CPU under load varies by more than all the 503s cost together.
        add("Apache CPU per 503 under the flood, by subtraction (ms)",
            "apache_cpu_per_503_est", col(
                lambda x: ov.shed_estimate(x, page["apache_ms"])), "ms",
            nd=3)
    add("load generator CPU (s)", "client_cpu", col(
        lambda x: x["client_cpu_s"]), "s", nd=2)
    add("Redis script calls (decisions)", "redis_script_calls", col(
        lambda x: x["redis_script_calls"]), "calls")
    add("Redis script calls per answered flood request",
        "redis_script_calls_per_request", col(
            lambda x: x["redis_script_calls_per_flood_request"]), "calls",
        nd=3)
    add("Redis commands (a script's own included)", "redis_commands", col(
        lambda x: x["redis_commands"]), "commands")
    add("status page: tbucket_shed_total", "status_shed", col(
        lambda x: x.get("status_shed")), "requests", nd=0)
    add("status page: tbucket_local_refusals_total", "status_local_refused",
        col(lambda x: x.get("status_local_refused")), "requests", nd=0)
    add('status page: tbucket_decisions_total{outcome="shed"}',
        "status_decisions_shed", col(
            lambda x: x.get("status_decisions_shed")), "requests", nd=0)
    return rows, tsv


def cost_rows(stack, r):
    """Rows for the page and shed costs: (figure, value, unit, target,
    verdict)."""
    out = []
    page, shed = r.get("page"), r.get("shed")
    if page:
        out.append(("%s.page.apache_cpu" % stack, round(page["apache_ms"], 3),
                    "ms", "", ""))
        if stack == "fpm":
            out.append(("%s.page.fpm_cpu" % stack, round(page["fpm_ms"], 3),
                        "ms", "", ""))
        out.append(("%s.page.server_cpu" % stack, round(page["server_ms"], 3),
                    "ms", "", ""))
        out.append(("%s.page.wall" % stack, round(page["wall_ms"], 2), "ms",
                    "", ""))
    if shed:
        refused = shed["statuses"].get(503, 0)
        out.append(("%s.shed.requests" % stack, shed["sent"], "requests",
                    "", ""))
        out.append(("%s.shed.refused_503" % stack, refused, "requests",
                    "= requests", "met" if refused == shed["sent"]
                    else "MISSED"))
        server = shed["apache_ms"] + shed["fpm_ms"]
        out.append(("%s.shed.apache_cpu" % stack, round(shed["apache_ms"], 4),
                    "ms", "", ""))
        out.append(("%s.shed.server_cpu" % stack, round(server, 4), "ms",
                    "", ""))
        if page and page["server_ms"] > 0:
            ratio = server / page["server_ms"]
            out.append(("%s.shed.over_page_server_cpu" % stack,
                        round(ratio, 4), "x", "<= %.2f" % SHED_SHARE,
                        "met" if ratio <= SHED_SHARE else "MISSED"))
        if page and page["apache_ms"] > 0:
            out.append(("%s.shed.over_page_apache_cpu" % stack,
                        round(shed["apache_ms"] / page["apache_ms"], 4), "x",
                        "", ""))
        out.append(("%s.shed.redis_commands_per_request" % stack,
                    round(shed["redis_commands_per_request"], 4),
                    "commands", "= 0",
                    "met" if shed["redis_commands"] == 0 else "MISSED"))
    return out


def trace_summary(tr):
    """One line on an auto cap's trace: its value before the flood, its
    lowest, median and last under it, and its highest and last in each
    phase after."""
    by = {}
    for row in tr["rows"]:
        if row.get("limit") is not None:
            by.setdefault(row["phase"], []).append(row)
    parts = []
    if by.get("before"):
        parts.append("before %d" % by["before"][-1]["limit"])
    fl = [r["limit"] for r in by.get("flood", [])]
    if fl:
        t0 = by["flood"][0]["t_s"]
        low = next(r["t_s"] - t0 for r in by["flood"]
                   if r["limit"] <= min(fl) + 1)
        parts.append("flood: %d within %.1f s, then min %d median %g "
                     "last %d" % (min(fl) + 1, low, min(fl),
                                  statistics.median(fl), fl[-1]))
    for ph in ("light", "io"):
        rows = by.get(ph, [])
        if rows:
            top = max(r["limit"] for r in rows)
            t_top = next(r["t_s"] for r in rows if r["limit"] == top)
            parts.append("%s: max %d (at +%.1f s) last %d" % (
                ph, top, t_top - rows[0]["t_s"], rows[-1]["limit"]))
    missing = sum(1 for row in tr["rows"] if row.get("limit") is None)
    if missing:
        parts.append("%d readings without an answer" % missing)
    return "; ".join(parts)


def target_rows(res):
    """The priority targets: (target, stack, figure, today's, mod_qos,
    verdict) rows and their TSV rows."""
    rows, tsv = [], []

    def rep(stack, col):
        return res.get(stack, {}).get("cols", {}).get(col)

    def p99(stack, col):
        r = rep(stack, col)
        return r["critical"]["p99_ms"] if r else None

    def ratio(stack, col):
        u, x = p99(stack, "unloaded"), p99(stack, col)
        return x / u if u and x else None

    def pages(stack, col):
        r = rep(stack, col)
        return r["flood"].get("pages_per_s") if r else None

    for stack in ("modphp", "fpm"):
        if stack not in res:
            continue
        lim = PRIO_FACTOR[stack]
        v = ratio(stack, "prio")
        u = rep(stack, "unloaded")
        if not rep(stack, "prio"):
            continue
        rows.append(("%s: critical p99 / unloaded <= %g" % (
            CPU_NAMES[stack], lim), stack,
            "%s (%s / %s ms; other work during unloaded: %s s)" % (
                fmt(v, 2), fmt(p99(stack, "prio")), fmt(p99(stack,
                                                          "unloaded")),
                fmt(u.get("other_cpu_s") if u else None, 2)),
            fmt(ratio(stack, "local"), 2), fmt(ratio(stack, "qos"), 2),
            "" if v is None else ("met" if v <= lim else "MISSED")))
        if v is not None:
            tsv.append(("overload.%s.target.prio_p99_over_unloaded" % stack,
                        round(v, 3), "x"))
        caps = [(c, pages(stack, c), p99(stack, c)) for c in CAPS
                if rep(stack, c) and rep(stack, c)["critical"]["p99_ms"]]
        a_pages, a_p99 = pages(stack, "auto"), p99(stack, "auto")
        if not caps or a_pages is None or a_p99 is None:
            continue
        # The best hand-tuned cap: the one an operator would keep for
        # this scenario, the lowest critical p99; beside it, the cap
        # that rendered the most flood pages.
        best = min(caps, key=lambda c: c[2])
        most = max(caps, key=lambda c: c[1] or 0)
        share = a_pages / best[1] if best[1] else None
        rows.append((
            "auto: flood pages/s >= %.0f%% of the best cap's"
            % (100 * AUTO_PAGES_SHARE), stack,
            "%s / %s (%s) = %s; of the most (%s, %s): %s" % (
                fmt(a_pages), fmt(best[1]), cap_name(best[0]),
                fmt(share, 2), cap_name(most[0]), fmt(most[1]),
                fmt(a_pages / most[1], 2) if most[1] else "-"),
            fmt(pages(stack, "local")), fmt(pages(stack, "qos")),
            "" if share is None else
            ("met" if share >= AUTO_PAGES_SHARE else "MISSED")))
        rows.append(("auto: critical p99 <= the best cap's", stack,
                     "%s vs %s ms (%s) = %s" % (
                         fmt(a_p99), fmt(best[2]), cap_name(best[0]),
                         fmt(a_p99 / best[2], 2)),
                     fmt(p99(stack, "local")), fmt(p99(stack, "qos")),
                     "met" if a_p99 <= best[2] else "MISSED"))
        if share is not None:
            tsv.append(("overload.%s.target.auto_pages_share" % stack,
                        round(share, 3), "x"))
        tsv.append(("overload.%s.target.auto_p99_over_best_cap" % stack,
                    round(a_p99 / best[2], 3), "x"))
    return rows, tsv


def cpu_cost_lines(c):
    """Markdown lines and TSV rows for cpu_cost()'s result."""
    lines = ["", "### What TBucketCPUPriority costs an unloaded request", "",
             "prefork, a 3-byte file under a local scope, one keep-alive "
             "connection, the server on its own CPU; mode %s; %d requests "
             "of each kind under perf stat (system-call tracepoints), "
             "then wall and Apache CPU (workers + helper) per request, "
             "medians of %d alternated rounds of %d." % (
                 c["mode"], c["n"], c["rounds"], c["timed_n"]), "",
             "| per request | normal | low | low - normal |",
             "| --- | ---: | ---: | ---: |"]
    tsv = []
    for who in ("worker", "helper"):
        if "normal.%s" % who not in c and "low.%s" % who not in c:
            continue
        for ev in ("syscalls",) + SYSCALLS + ("context-switches",):
            n0 = c.get("normal.%s" % who, {}).get(ev, 0) / c["n"]
            n1 = c.get("low.%s" % who, {}).get(ev, 0) / c["n"]
            if ev not in ("syscalls", "context-switches") and not n0 \
                    and not n1:
                continue
            label = ("system calls, all" if ev == "syscalls" else
                     "context switches" if ev == "context-switches"
                     else "`%s`" % ev)
            lines.append("| %s: %s | %.2f | %.2f | %s%+.2f%s |" % (
                who, label, n0, n1, "**" if ev == "syscalls" else "",
                n1 - n0, "**" if ev == "syscalls" else ""))
            tsv.append(("overload.cpu_cost.%s.%s_delta" % (who, ev),
                        round(n1 - n0, 3), "per request"))
    t = c["timing"]
    for m, label in (("wall", "wall, client side (µs)"),
                     ("cpu", "Apache CPU (µs)")):
        lines.append("| %s | %.1f | %.1f | %+.1f |" % (
            label, t["normal"][m], t["low"][m],
            t["low"][m] - t["normal"][m]))
        for k in ("normal", "low"):
            tsv.append(("overload.cpu_cost.%s.%s" % (k, m),
                        round(t[k][m], 2), "us"))
    lines.append("")
    lines.append("Low requests moved (tbucket_cpu_priority_changes_total): "
                 "%d." % c.get("changes", 0))
    if c.get("log"):
        lines.append("Error log: %s." % c["log"])
    return lines, tsv


def trace_lines(args, res):
    """The auto traces: a summary line each, and the TSV rows for
    results/overload-auto-trace.tsv."""
    lines, rows = [], []
    for stack in args.stacks:
        for col, tr in sorted(res.get(stack, {}).get("traces", {}).items()):
            lines.append("- %s, %s: %s. Light: %s of %s pages answered "
                         "at %g/s, p50 %s ms; io: %.0f answers/s (%s), "
                         "p50 %s ms." % (
                             STACKS[stack]["title"].split(" (")[0],
                             column_name(stack, col, args.local_concurrency),
                             trace_summary(tr), tr["light"]["answered"],
                             tr["light"]["sent"], args.after_rate,
                             fmt(tr["light"]["p50_ms"]), tr["io"]["per_s"],
                             " ".join("%s=%d" % kv for kv in sorted(
                                 tr["io"]["by_status"].items())),
                             fmt(tr["io"]["p50_ms"])))
            for row in tr["rows"]:
                rows.append([stack, col] + [row.get(k) for k in TRACE_KEYS])
    return lines, rows


TRACE_KEYS = ("t_s", "phase", "limit", "in_flight", "window_ms", "floor_ms",
              "up", "down", "probe", "read_ms")


def stack_lines(args, stack, r, columns):
    """The Markdown of one stack and its TSV rows."""
    rows, tsv = stack_rows(stack, r, columns)
    lines = ["", "### %s" % STACKS[stack]["title"], "",
             "| figure | " + " | ".join(
                 column_name(stack, c, args.local_concurrency)
                 for c in columns) + " | target (local protection) | |",
             "| --- |" + " ---: |" * len(columns) + " --- | --- |"]
    for name, vals, target, verdict in rows:
        lines.append("| %s | %s | %s | %s |" % (
            name, " | ".join(vals[c] for c in columns), target, verdict))
    costs = cost_rows(stack, r)
    if costs:
        lines += ["", "| cost alone | value | unit | target | |",
                  "| --- | ---: | --- | --- | --- |"]
        for name, value, unit, target, verdict in costs:
            lines.append("| %s | %s | %s | %s | %s |" % (
                name, value, unit, target, verdict))
            tsv.append(("overload." + name, value, unit))
    if r["notes"]:
        lines += [""] + ["- " + n for n in r["notes"]]
    return lines, tsv


def write(args, res, started, t0):
    lines = ["overload.py: a flood of 64 keep-alive connections over "
             "10,000 API keys on a 25 ms PHP page, and a critical client "
             "(a new connection every 100 ms to %s, 10 s "
             "timeout), %s UTC, %.0f s, --part %s" % (
                 args.critical_path, started.strftime("%Y-%m-%d %H:%M"),
                 time.monotonic() - t0, args.part),
             "",
             "Load average (1 min) at start %.2f, at end %.2f. Pinning: %s. "
             "Flood %d s after 1 s of warm-up, %d connections, %d keys; "
             "unloaded %d s, a request every %d ms; "
             "TBucketLocalConcurrency %d (and mod_qos's cap). %s and "
             "auto class /app/ low (TBucketPriority low; the partner's "
             "<If> makes it critical) with TBucketCPUPriority %s; "
             "under php-fpm they also route the partner to a pool of its "
             "own (2 workers, process.priority %d) and the rest to the "
             "app's (8, process.priority %d)." % (
                 args.load_start, os.getloadavg()[0], args.pin_text,
                 args.seconds, args.flood, args.keys,
                 args.unloaded_seconds, UNLOADED_INTERVAL * 1000,
                 args.local_concurrency, "The priority columns",
                 args.cpu_priority, CRITICAL_POOL_NICE, FLOOD_POOL_NICE)]
    tsv = []
    columns = ("unloaded",) + args.columns
    for stack in args.stacks:
        r = res.get(stack)
        if r is None:
            continue
        more, t = stack_lines(args, stack, r, columns)
        lines += more
        tsv += t
    trows, ttsv = target_rows(res)
    tsv += ttsv
    if trows:
        lines += ["", "### Priority targets", "",
                  "| target | stack | figure | local protection (cap %d) "
                  "| mod_qos | |" % args.local_concurrency,
                  "| --- | --- | --- | ---: | ---: | --- |"]
        for row in trows:
            lines.append("| %s |" % " | ".join(row))
    tlines, trace_rows = trace_lines(args, res)
    if tlines:
        lines += ["", "### The auto caps (tbucket_local_limit every 0.5 s; "
                  "results/overload-auto-trace.tsv)", ""] + tlines
    if res.get("cpu_cost"):
        more, t = cpu_cost_lines(res["cpu_cost"])
        lines += more
        tsv += t
    elif res.get("cpu_cost_note"):
        lines += ["", "CPU priority's cost: not measured (%s)."
                  % res["cpu_cost_note"]]
    text = "\n".join(lines) + "\n"
    res_dir = os.path.join(bench.HERE, "results")
    os.makedirs(res_dir, exist_ok=True)
    with open(os.path.join(res_dir, "overload.md"), "w") as f:
        f.write(text)
    write_tsv(os.path.join(res_dir, "overload.tsv"),
              ("name", "value", "unit"), tsv)
    if trace_rows:
        write_tsv(os.path.join(res_dir, "overload-auto-trace.tsv"),
                  ("stack", "column") + TRACE_KEYS, trace_rows)
    print(text)


def write_tsv(path, head, rows):
    with open(path + ".tmp", "w") as f:
        f.write("\t".join(head) + "\n")
        for row in rows:
            f.write("\t".join("" if v is None else str(v) for v in row)
                    + "\n")
    os.replace(path + ".tmp", path)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default=os.path.join(bench.ROOT, "build"))
    ap.add_argument("--quick", action="store_true",
                    help="short runs, for trying the driver")
    ap.add_argument("--stacks", default="modphp,fpm")
    ap.add_argument("--cpu-priority", default="On low=10 critical=-10",
                    help="TBucketCPUPriority's value in the priority "
                         "columns (default the guide's: On low=10 "
                         "critical=-10)")
    ap.add_argument("--part", default="all", choices=sorted(PARTS),
                    help="base: no limiter, per-key, local protection; "
                         "priority: local protection, mod_qos, CPU "
                         "priority or the pool split, caps 1 2 4 8, auto "
                         "and the cost of CPU priority; all: both")
    ap.add_argument("--critical-path", default="/app/heavy.php",
                    help="what the critical client asks for (with "
                         "X-Partner: yes): the rendered page, as in the "
                         "scenario; /health.php for a health check")
    # 2 for PHP pinned to one CPU: a CPU-bound page renders no sooner
    # with more of them in flight, it only waits longer (bench/README.md:
    # with 4 the critical page's p99 was 7.7-13.7x its unloaded p99, with
    # 2 3.9-6.1x, and the flood got as many pages).
    ap.add_argument("--local-concurrency", type=int, default=2,
                    help="TBucketLocalConcurrency on /app/ (of 8 PHP "
                         "workers on one CPU), and mod_qos's cap")
    args = ap.parse_args()
    args.build = os.path.abspath(args.build)
    args.stacks = [s for s in args.stacks.split(",") if s in STACKS]
    args.columns = PARTS[args.part]
    args.flood = 64
    args.keys = 10000
    args.shed_requests = 400
    args.after_rate = 16.0
    bench.sized(args, seconds=(4, 12), page_requests=(20, 40),
                after_seconds=(2, 4), io_seconds=(3, 6), cost_n=(100, 300),
                cost_timed_n=(200, 500), cost_rounds=(2, 4))
    args.unloaded_seconds = args.seconds
    ncpu = os.cpu_count() or 1
    if ncpu > 1:
        args.server_cpu, args.client_cpu = str(ncpu - 1), "0"
        args.pin_text = ("apache2 and php-fpm on CPU %d; the load "
                         "generator's processes and Redis on CPU 0"
                         % (ncpu - 1))
    else:
        args.server_cpu = args.client_cpu = None
        args.pin_text = "none (one CPU)"
    args.load_start = os.getloadavg()[0]
    started = datetime.datetime.utcnow()
    t0 = time.monotonic()
    so = os.path.join(args.build, "mod_tbucket.so")
    if not os.path.exists(so):
        print("overload: %s is not built: not measured" % so)
        return 1
    tmp = tempfile.mkdtemp(prefix="tbover-", dir="/tmp")
    os.chmod(tmp, 0o755)
    rd = bench.Redis(tmp, args.client_cpu).start()
    res = {}
    try:
        for stack in args.stacks:
            bench.log("overload: stack %s" % stack)
            run_stack(args, stack, rd, res)
        if args.part != "base":
            try:
                res["cpu_cost"] = cpu_cost(args, rd)
                bench.log("overload cpu cost: %s" % res["cpu_cost"])
            except NotMeasured as e:
                res["cpu_cost_note"] = str(e)
                bench.log("overload cpu cost: NOT MEASURED %s" % e)
    finally:
        rd.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    write(args, res, started, t0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
