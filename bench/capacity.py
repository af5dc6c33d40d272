#!/usr/bin/python3
"""capacity.py -- what a decision costs Redis, direct and through the
host's coalescer (TBucketRedis ... coalesce=on), side by side in one run.

    bench/capacity.py --build BUILD [--quick]

One redis-server with tbucket_redis.so, alone on CPU 0; Apache (and its
coalescer) and wrk on CPU 1. For prefork with 8, 32 and 64 children (one
wrk connection per child) and for event (2 children x 32 threads, 64
connections), each direct and coalesced, each with the scripts
(engine=script) and with the Redis module (engine=module): wrk sends
requests with a new key each (a limit nothing reaches, so every decision
writes its bucket) for 4 s (2 with --quick). Redis's CPU from INFO cpu
(user + sys, I/O included, its idle cost taken out) over the decisions
it counted (INFO commandstats, exact), its busy share of the wall time,
decisions/s, the commands per read
(calls over INFO stats' total_reads_processed), wrk's p50 and p99, and
Apache's CPU per request (parent, children and coalescer, from /proc).
Then redis-benchmark -P 1, 4, 16 and 64 on the same two commands, new
keys: what Redis spends at each pipeline depth at that moment,
and at 64 the floor a perfect pipeline reaches. Writes bench/results/capacity.md and
.tsv. On a 2-vCPU machine shared with other work the absolute figures
move; the ratios within one run are what to read.
"""
import os
import shutil
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import benchkit as bk  # noqa: E402

REDIS_CPU, LOAD_CPU = "0", "1"
VARIANTS = (("prefork", 8), ("prefork", 32), ("prefork", 64), ("event", 64))
ENGINES = (("script", "evalsha"), ("module", "tbucket.bucket"))


def redis_cpu(rd):
    st = rd.r.info("cpu")
    return st["used_cpu_user"] + st["used_cpu_sys"]


def idle_cpu_per_s(rd, seconds=2.0):
    """Redis's own CPU per second with nothing to do (its cron, 10 Hz):
    taken out of each run's figure, so that a run slowed by other work
    on the machine does not charge it to the decisions."""
    c0, t0 = redis_cpu(rd), time.monotonic()
    time.sleep(seconds)
    return (redis_cpu(rd) - c0) / (time.monotonic() - t0)


def reads(rd):
    return rd.r.info("stats")["total_reads_processed"]


def start_apache(tmp, name, so, rd, mpm, conns, engine, coalesce):
    bk.PREFORK_CHILDREN = conns
    opts = " engine=%s coalesce=%s" % (engine, "on" if coalesce else "off")
    a = bk.Apache(tmp, name, LOAD_CPU, extra=bk.tb_conf(
        so, rd.url, opts, (("/b/", bk.UNREACHED, ()),)), mpm=mpm)
    return a.start()


def one_run(tmp, so, rd, variant, engine, coalesce, seconds, idle):
    """One Apache, one wrk run; the figures of the run as a dict."""
    mpm, conns = variant
    name = "%s%d-%s-%s" % (mpm, conns, engine[0],
                           "coal" if coalesce else "direct")
    a = start_apache(tmp, name, so, rd, mpm, conns, engine[0], coalesce)
    try:
        # Warm up: every child connected and set up before the count.
        bk.wrk(a.url("/b/ok.txt"), "distinct.lua", ["warm-" + name], 1,
               LOAD_CPU, threads=2, conns=conns)
        rd.r.config_resetstat()
        cpu0, reads0, t0 = redis_cpu(rd), reads(rd), time.monotonic()
        ticks0 = bk.cpu_ticks(a.pids())
        res = bk.wrk(a.url("/b/ok.txt"), "distinct.lua", [name], seconds,
                     LOAD_CPU, threads=2, conns=conns)
        wall = time.monotonic() - t0
        cpu = max(redis_cpu(rd) - cpu0 - idle * wall, 0.0)
        nreads = reads(rd) - reads0
        apache_us = (bk.cpu_ticks(a.pids()) - ticks0) * bk.TICK_US
        st = rd.r.info("commandstats").get("cmdstat_" + engine[1], {})
        calls = st.get("calls", 0)
        a.log_errors()
    finally:
        a.stop()
    return {"name": name, "calls": calls, "requests": res["requests"],
            "redis_us": 1e6 * cpu / calls if calls else float("nan"),
            "busy": cpu / wall, "rate": calls / wall,
            "depth": calls / nreads if nreads else float("nan"),
            "p50": res.get("p50", float("nan")),
            "p99": res.get("p99", float("nan")),
            "apache_us": apache_us / max(res["requests"], 1),
            "non2xx": res["non2xx"] + res["errors"]}


def latency(tmp, so, rd, variant, engine, seconds):
    """The latency a decision gains through the coalescer, without
    queueing: one wrk connection (one request at a time), direct and
    then coalesced, same Apache, same engine. Returns the row: p50 and
    p99 of each, in ms, and the difference."""
    got = {}
    for coalesce in (False, True):
        mpm, conns = variant
        name = "lat-%s%d-%s-%s" % (mpm, conns, engine[0],
                                   "coal" if coalesce else "direct")
        a = start_apache(tmp, name, so, rd, mpm, conns, engine[0], coalesce)
        try:
            bk.wrk(a.url("/b/ok.txt"), "distinct.lua", ["warm-" + name], 1,
                   LOAD_CPU, threads=1, conns=1)
            got[coalesce] = bk.wrk(a.url("/b/ok.txt"), "distinct.lua",
                                   [name], seconds, LOAD_CPU, threads=1,
                                   conns=1)
            a.log_errors()
        finally:
            a.stop()
    d, c = got[False], got[True]
    return {"name": "%s %d, %s" % (variant[0], variant[1], engine[0]),
            "d50": d["p50"], "d99": d["p99"], "c50": c["p50"],
            "c99": c["p99"], "add50": c["p50"] - d["p50"],
            "add99": c["p99"] - d["p99"]}


def comm(pid):
    try:
        with open("/proc/%d/comm" % pid) as f:
            return f.read().strip()
    except OSError:
        return ""


def saturate(rd, target, engine, n, clients=64):
    """redis-benchmark -c clients -P 1 at target (["-p", port] for Redis
    itself, ["-s", socket] for a coalescer): every client with one call in
    flight, as many prefork children waiting on Redis at once with no
    Apache in the way, so that Redis (or the coalescer) is the limit.
    Redis CPU per call and commands per read over the exact calls."""
    rd.r.config_resetstat()
    cpu0, reads0, t0 = redis_cpu(rd), reads(rd), time.monotonic()
    bk.run(bk.pin(LOAD_CPU) + ["redis-benchmark"] + target + [
        "-n", str(n), "-c", str(clients), "-P", "1", "-r", "100000000",
        "--csv", "tbucket.bucket", "1", "sat:{__rand_int__}", "",
        "1000000000", "1000000000", "1"], 300)
    wall = time.monotonic() - t0
    cpu, nreads = redis_cpu(rd) - cpu0, reads(rd) - reads0
    calls = rd.r.info("commandstats")["cmdstat_" + engine[1]]["calls"]
    return {"calls": calls, "redis_us": 1e6 * cpu / calls,
            "depth": calls / nreads, "rate": calls / wall}


def ceiling(tmp, so, rd, n):
    """The module engine at saturation, 64 callers: straight to Redis,
    then through a coalescer (forked by an Apache that takes no traffic),
    with the coalescer's own CPU per call."""
    engine = ENGINES[1]
    rows = [("direct", saturate(rd, ["-p", str(rd.port)], engine, n))]
    a = start_apache(tmp, "ceiling", so, rd, "prefork", 8, engine[0], True)
    try:
        sock = None
        for _ in range(100):
            found = [os.path.join(d, f) for d, _, fs in os.walk(a.root)
                     for f in fs if f.startswith("coal-")]
            if found:
                sock = found[0]
                break
            time.sleep(0.1)
        coal = [p for p in a.pids() if comm(p) == "tbucket-coal"]
        ticks0 = bk.cpu_ticks(coal)
        row = saturate(rd, ["-s", sock], engine, n)
        row["coal_us"] = (bk.cpu_ticks(coal) - ticks0) * bk.TICK_US \
            / max(row["calls"], 1)
        rows.append(("coalesced", row))
    finally:
        a.stop()
    return rows


def ceiling_table(rows, floors):
    best = min(f["redis_us"] for e, f in floors if e == "module")
    lines = ["| 64 callers, module engine | Redis µs/decision | × best "
             "floor | commands/read | decisions/s | coalescer µs/decision |",
             "| --- | ---: | ---: | ---: | ---: | ---: |"]
    for name, r in rows:
        lines.append("| %s | %.2f | %.2f | %.1f | %.0f | %s |" % (
            name, r["redis_us"], r["redis_us"] / best, r["depth"],
            r["rate"], "%.2f" % r["coal_us"] if "coal_us" in r else ""))
    return lines


def latency_table(rows):
    lines = ["| one connection | direct p50 / p99 ms | coalesced p50 / p99 "
             "ms | added p50 / p99 µs |", "| --- | ---: | ---: | ---: |"]
    for r in rows:
        lines.append("| %s | %.3f / %.3f | %.3f / %.3f | %.0f / %.0f |" % (
            r["name"], r["d50"], r["d99"], r["c50"], r["c99"],
            1000 * r["add50"], 1000 * r["add99"]))
    return lines


def floor(rd, sha, engine, n, depth=64):
    """redis-benchmark -P depth -c 50: Redis CPU per call. Keys drawn
    from 1e8, so that almost every call makes its bucket, as every
    request of the runs does (on 1e5 keys, most calls update one: 1.5 us
    less per call at depth 64)."""
    head = (["evalsha", sha, "1"] if engine[0] == "script"
            else ["tbucket.bucket", "1"])
    rd.r.config_resetstat()
    cpu0, reads0 = redis_cpu(rd), reads(rd)
    bk.run(bk.pin(LOAD_CPU) + [
        "redis-benchmark", "-p", str(rd.port), "-n", str(n), "-c", "50",
        "-P", str(depth), "-r", "100000000", "--csv"] + head
        + ["bench:{__rand_int__}", "", "1000000000", "1000000000", "1"], 300)
    cpu, nreads = redis_cpu(rd) - cpu0, reads(rd) - reads0
    calls = rd.r.info("commandstats")["cmdstat_" + engine[1]]["calls"]
    return {"name": "redis-benchmark -P %d" % depth, "calls": calls,
            "redis_us": 1e6 * cpu / calls, "depth": calls / nreads}


def table(rows, floors):
    lines = ["| run | engine | decisions | Redis µs/decision | Redis busy "
             "| decisions/s | commands/read | p50 ms | p99 ms | Apache µs/req "
             "| non-2xx+errors |",
             "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: "
             "| ---: | ---: |"]
    for engine, r in rows:
        lines.append("| %s | %s | %d | %.2f | %.0f%% | %.0f | %.1f | %.2f "
                     "| %.2f | %.0f | %d |" % (
                         r["name"], engine, r["calls"], r["redis_us"],
                         100 * r["busy"], r["rate"], r["depth"], r["p50"],
                         r["p99"], r["apache_us"], r["non2xx"]))
    for engine, f in floors:
        lines.append("| %s | %s | %d | %.2f | | | %.1f | | | | |" % (
            f["name"], engine, f["calls"], f["redis_us"], f["depth"]))
    return lines


def verdicts(rows, floors):
    out = []
    for engine, f in [x for x in floors if x[1]["name"].endswith(" 64")]:
        best = [r for e, r in rows if e == engine and "coal" in r["name"]]
        direct = [r for e, r in rows if e == engine
                  and "direct" in r["name"]]
        for r in best:
            out.append("- %s, %s: %.2fx the -P 64 floor (target <= 1.5x "
                       "for the module engine)" % (
                           r["name"], engine, r["redis_us"] / f["redis_us"]))
        if direct and best:
            worst = max(d["redis_us"] for d in direct)
            out.append("- %s: Redis cores for 1M decisions/s: %.1f direct "
                       "(worst run), %.1f coalesced (best run), %.1f at the "
                       "floor" % (engine, worst, min(
                           r["redis_us"] for r in best), f["redis_us"]))
    return out


def main():
    args, so, _, _ = bk.module_args("capacity", __doc__)
    if not so:
        return
    seconds = 2 if args.quick else 4
    n = 100000 if args.quick else 400000
    build = os.path.dirname(so)
    mod = os.path.join(build, "tbucket_redis.so")
    tmp = tempfile.mkdtemp(prefix="tbcap-", dir="/tmp")
    # The children and the coalescer run as www-data.
    os.chmod(tmp, 0o755)
    rd = bk.Redis(tmp, REDIS_CPU, module=mod).start()
    rows, floors, lat, sat, idle = [], [], [], [], 0.0
    load0 = os.getloadavg()[0]
    try:
        sha = rd.r.script_load(bk.script_text(build))
        idle = idle_cpu_per_s(rd)
        for variant in VARIANTS:
            for engine in ENGINES:
                for coalesce in (False, True):
                    rows.append((engine[0], one_run(
                        tmp, so, rd, variant, engine, coalesce,
                        seconds, idle)))
                    bk.log("capacity %s" % rows[-1][1]["name"])
        for variant in (("prefork", 8), ("event", 64)):
            for engine in ENGINES:
                lat.append(latency(tmp, so, rd, variant, engine, seconds))
                bk.log("latency %s" % lat[-1]["name"])
        sat = ceiling(tmp, so, rd, n)
        bk.log("capacity ceiling")
        for engine in ENGINES:
            # The pipeline depths the runs reach, for reading them on a
            # machine whose load moves every figure; -P 64 last.
            for depth in (1, 4, 16):
                floors.append((engine[0], floor(rd, sha, engine, n // 4,
                                                depth)))
            floors.append((engine[0], floor(rd, sha, engine, n)))
    finally:
        rd.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    text = ["# Capacity: Redis CPU per decision, direct and coalesced",
            "", "Load average %.2f at the start, %.2f at the end; Redis "
            "alone on CPU %s, Apache and wrk on CPU %s, %d s per run; "
            "Redis's idle CPU (%.2f ms/s) taken out of each run." % (
                load0, os.getloadavg()[0], REDIS_CPU, LOAD_CPU, seconds,
                1000 * idle),
            ""] + table(rows, floors) + [""] + verdicts(rows, floors) + [
                "", "The latency a decision gains, one request at a time "
                "(no queueing; the target is <= 200 µs at p99 on an idle "
                "machine):", ""] + latency_table(lat) + [
                "", "At saturation: redis-benchmark -c 64 -P 1 (64 callers, "
                "one call each in flight, no Apache), straight to Redis and "
                "through a coalescer; x best floor is against the lowest "
                "redis-benchmark figure of the run:", ""] + ceiling_table(
                    sat, floors)
    os.makedirs(os.path.join(HERE, "results"), exist_ok=True)
    with open(os.path.join(HERE, "results", "capacity.md"), "w") as f:
        f.write("\n".join(text) + "\n")
    with open(os.path.join(HERE, "results", "capacity.tsv"), "w") as f:
        f.write("run\tengine\tcalls\tredis_us\tdepth\n")
        for engine, r in rows + floors:
            f.write("%s\t%s\t%d\t%.3f\t%.2f\n" % (
                r["name"], engine, r["calls"], r["redis_us"], r["depth"]))
    print("\n".join(text))


if __name__ == "__main__":
    main()
