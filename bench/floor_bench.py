#!/usr/bin/python3
"""floor_bench.py -- the floor part of `make bench`: the one-round-trip
floor against bare Apache and the module.

Apache alone on one CPU, wrk and Redis on the other, 32 connections and 32
keys; bare Apache, bench/mod_floor.c (one blocking PING per request) and
the module (exact decisions; with a lease of 100; pool sizes 1/2/4/8),
alternated round by round, under the event and the prefork MPM; script
calls per request; perf stat (system calls, context switches, batch size)
and perf record (kernel share, top symbols) on the Apache CPU. Called by
run.py as part_floor().
"""

import os
import re
import shutil
import subprocess
import time

from benchkit import (Apache, HERE, NCPU, TICK_US, UNREACHED, cpu_split,
                      cpu_ticks, log, median, miss, over_budget, pin, record,
                      run, tb_conf, threads, wrk)


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


def has_redis_module(rd):
    """1 when the bench's Redis loaded tbucket_redis.so."""
    for entry in rd.r.execute_command("MODULE", "LIST"):
        fields = dict(zip(entry[::2], entry[1::2]))
        if fields.get(b"name") in (b"tbucket", "tbucket"):
            return 1
    return 0


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


# A decision is a script call or, with engine=module, tbucket.bucket.
FLOOR_CMDS = ("cmdstat_evalsha", "cmdstat_eval", "cmdstat_ping",
              "cmdstat_tbucket.bucket")


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
            r["script_calls_n"] = (c1[0] + c1[1] + c1[3]
                                   - c0[0] - c0[1] - c0[3])
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
        # The module with the scripts (the figures before the Redis module
        # existed), and with the Redis module's commands when it is loaded.
        mod = start("module", floor_tb_conf(so, rd.url, " engine=script"))
        default_pool = pool_size_of(mod)
        if default_pool is not None:
            record(tag + ".module.pool_size", default_pool, "connections")
        variants = [("bare", bare, "/a/ok.txt"),
                    ("floor", floor, "/a/ok.txt"),
                    ("module", mod, "/b/ok.txt")]
        pairs = [("module", "floor"), ("module", "bare"), ("floor", "bare")]
        targets = {("module", "floor"): 0.97}
        if has_redis_module(rd):
            eng = start("engine", floor_tb_conf(so, rd.url,
                                                " engine=module"))
            variants.append(("rmodule", eng, "/b/ok.txt"))
            pairs += [("rmodule", "module"), ("rmodule", "floor"),
                      ("rmodule", "bare")]
        if mpm == "event":
            variants.append(("lease", mod, "/l/ok.txt"))
            pairs.append(("lease", "bare"))
            # module / bare: the product's standing 0.85, not an earlier
            # round's 0.75, so a run between the two reads MISSED.
            targets = {("module", "floor"): 1.10, ("module", "bare"): 0.85,
                       ("lease", "bare"): 0.95, ("rmodule", "module"): 1.0}
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
