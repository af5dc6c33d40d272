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
import subprocess
import sys
import tempfile
import time

import benchkit
import tls_bench
from benchkit import (Apache, BUDGET_S, HERE, MISSES, NCPU, Peer, ROOT, ROWS,
                      Redis, THREADS_PER_CHILD, T_START, build_tools,
                      child_pids, embedded_sha, free_port, kv, log,
                      median, miss, module_conf, over_budget, pin, record,
                      redis_benchmark, run, script_path, script_text, sized,
                      tb_bench, wrk, measured_wrk)
from floor_bench import part_floor


# ---- part 1: the core against the Redis floor ---------------------------

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
    ("tb__redis_call", "run_script"),
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


def callgrind_run(rd, tool, tmp, n, engine):
    out = os.path.join(tmp, "callgrind.%s.out" % engine)
    cmd = ["valgrind", "--tool=callgrind", "--toggle-collect=bench_loop",
           "--callgrind-out-file=" + out, tool, "-u", rd.url, "-t", "1",
           "-n", str(n), "-k", "one", "-E", engine]
    run(pin("0" if NCPU > 1 else None) + cmd, 300)
    return out


def part_cpu(a, rd, tool, tmp):
    if not shutil.which("valgrind"):
        miss("callgrind", "valgrind is not installed")
        return
    n = a.callgrind_decisions
    # The headline figure is the script engine (the path every Redis
    # takes, and the one earlier rounds measured); the module engine's
    # client cost is recorded beside it.
    if rd.module:
        out = callgrind_run(rd, tool, tmp, n, "module")
        mtotal, _ = parse_callgrind(out)
        record("cpu.module_engine.instr_per_decision.total",
               round(mtotal / n), "instr")
    out = callgrind_run(rd, tool, tmp, n, "script")
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
                r = measured_wrk(srv, rd, srv.url(path), script,
                                 ["r%d%s" % (i, name)], a.http_seconds, wcpu)
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


# ---- part 6: the shim (part 5, the floor, is floor_bench.py) ----------

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
    a.top_functions = 10
    a.floor_seconds = 2
    a.perf_top = 12
    sized(a, rounds=(2, 3), http_rounds=(2, 3), floor_rounds=(2, 5),
          core_seconds=(1, 2), tls_seconds=(1, 2), http_seconds=(2, 3),
          perf_seconds=(2, 3), callgrind_decisions=(2000, 20000),
          mem_buckets=(10000, 50000), rss_requests=(20000, 100000),
          ab_requests=(2000, 5000), shim_calls=(1000, 5000))
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
    # The Redis module loaded when built: the floor part compares both
    # engines on the same server (engine=script and engine=module).
    module = os.path.join(a.build, "tbucket_redis.so")
    rd = Redis(tmp, a.redis_cpu,
               module=module if os.path.exists(module) else None).start()
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
                 (a, tool, tmp, benchkit)),
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
