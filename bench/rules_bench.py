#!/usr/bin/python3
"""rules_bench.py -- what TBucketRule costs: one Apache (event MPM,
pinned with Redis on the last CPU, wrk on CPU 0) with three Locations
side by side:

  /a/  one limit (TBucketLimit), the plain case;
  /b/  that limit and two TBucketRules keyed by other expressions (three
       buckets of three client keys in one call: "3 rules against 1");
  /c/  the same three, one of them count=200: held before the handler
       and charged once the status is known, one more call per request.

wrk alternates the variants round by round (the order reverses every
round); the ratios are the medians of the per-round ratios. Apache's and
Redis's CPU per request come from /proc around each round; the Redis
calls per request and Redis's microseconds per call from INFO
commandstats over an exact number of requests (ab).

    /usr/bin/python3 bench/rules_bench.py [--build DIR] [--quick]

Prints a Markdown table and writes bench/results/rules.md; `make bench`
runs it.
"""
import argparse
import os
import re
import shutil
import sys
import tempfile

import benchkit as bench

LOCATIONS = """
LoadModule tbucket_module {so}
TBucketRedis {url} timeout=500 pool=32
TBucketPrefix bench:
<Location /a/>
    TBucketEnable On
    TBucketKey "%{{HTTP:X-API-Key}}"
    TBucketLimit 1000000000 1000000000/s
</Location>
<Location /b/>
    TBucketEnable On
    TBucketKey "%{{HTTP:X-API-Key}}"
    TBucketLimit 1000000000 1000000000/s
    TBucketRule addr "%{{REMOTE_ADDR}}-%{{HTTP:X-API-Key}}" 1000000000 1000000000/s
    TBucketRule user "u-%{{HTTP:X-API-Key}}" 1000000000 1000000000/s
</Location>
<Location /c/>
    TBucketEnable On
    TBucketKey "%{{HTTP:X-API-Key}}"
    TBucketLimit 1000000000 1000000000/s
    TBucketRule addr "%{{REMOTE_ADDR}}-%{{HTTP:X-API-Key}}" 1000000000 1000000000/s
    TBucketRule user "u-%{{HTTP:X-API-Key}}" 1000000000 1000000000/s count=200
</Location>
"""

VARIANTS = (("one", "/a/"), ("three", "/b/"), ("counted", "/c/"))


def calls_per_request(rd, srv, path, n, cpus):
    """EVALSHA calls per request over exactly n requests, and Redis's
    microseconds per call."""
    rd.r.config_resetstat()
    out = bench.run(bench.pin(cpus) + [
        "ab", "-q", "-k", "-n", str(n), "-c", "8", "-s", "10", "-H",
        "X-API-Key: ab-%s-%d" % (path.strip("/"), os.getpid()),
        srv.url(path + "ok.txt")], 120)
    done = int(re.search(r"Complete requests:\s+(\d+)", out).group(1))
    c = rd.r.info("commandstats").get("cmdstat_evalsha", {})
    return c.get("calls", 0) / done, c.get("usec_per_call", 0.0)


def rounds_of(srv, rd, wcpu, rounds, seconds):
    res = {name: [] for name, _ in VARIANTS}
    for i in range(rounds):
        order = VARIANTS if i % 2 == 0 else tuple(reversed(VARIANTS))
        for name, path in order:
            pids = srv.pids()
            s0, r0 = bench.cpu_ticks(pids), bench.cpu_ticks([rd.proc.pid])
            r = bench.wrk(srv.url(path + "ok.txt"), "thread_key.lua",
                          ["r%d%s" % (i, name)], seconds, wcpu)
            s1, r1 = bench.cpu_ticks(pids), bench.cpu_ticks([rd.proc.pid])
            req = max(r["requests"], 1)
            r["server_us"] = (s1 - s0) * bench.TICK_US / req
            r["redis_us"] = (r1 - r0) * bench.TICK_US / req
            res[name].append(r)
            bench.log("rules: %-7s round %d: %8.0f req/s non-2xx %d"
                      % (name, i, r["rps"], r["non2xx"]))
    return res


def table(srv, rd, wcpu, res):
    rows = []
    for name, path in VARIANTS:
        rows.append(("http.%s.rps" % name,
                     round(bench.median([r["rps"] for r in res[name]])),
                     "req/s"))
        for k in ("server_us", "redis_us"):
            rows.append(("http.%s.%s_cpu_per_request" % (name, k[:-3]),
                         round(bench.median([r[k] for r in res[name]]), 1),
                         "us"))
        calls, usec = calls_per_request(rd, srv, path, 2000, wcpu)
        rows.append(("redis.%s.calls_per_request" % name, round(calls, 3),
                     "calls"))
        rows.append(("redis.%s.usec_per_call" % name, round(usec, 2), "us"))
    for name in ("three", "counted"):
        ratio = bench.median([x["rps"] / o["rps"] for x, o in
                              zip(res[name], res["one"])])
        rows.append(("http.ratio.%s_over_one" % name, round(ratio, 3), "x"))
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default=os.path.join(bench.ROOT, "build"))
    ap.add_argument("--quick", action="store_true")
    a = ap.parse_args()
    so = os.path.join(os.path.abspath(a.build), "mod_tbucket.so")
    if not os.path.exists(so):
        print("rules: %s is not built: not measured" % so)
        return 1
    rounds, seconds = (2, 2) if a.quick else (5, 3)
    ncpu = os.cpu_count() or 1
    scpu, wcpu = (str(ncpu - 1), "0") if ncpu > 1 else (None, None)
    tmp = tempfile.mkdtemp(prefix="tbrules-", dir="/tmp")
    os.chmod(tmp, 0o755)
    rd = bench.Redis(tmp, scpu).start()
    srv = None
    try:
        srv = bench.Apache(tmp, "rules", scpu, LOCATIONS.format(
            so=so, url=rd.url)).start()
        for name, path in VARIANTS:
            bench.wrk(srv.url(path + "ok.txt"), "thread_key.lua",
                      ["warm" + name], 1, wcpu)
        rows = table(srv, rd, wcpu, rounds_of(srv, rd, wcpu, rounds,
                                              seconds))
    finally:
        if srv is not None:
            srv.stop()
        rd.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    lines = ["rules_bench.py: three TBucketRule buckets (one of them count=) "
             "against one limit (load average at the end %.2f)"
             % os.getloadavg()[0], "",
             "| figure | value | unit |", "| --- | ---: | --- |"]
    lines += ["| %s | %s | %s |" % r for r in rows]
    text = "\n".join(lines) + "\n"
    os.makedirs(os.path.join(bench.HERE, "results"), exist_ok=True)
    with open(os.path.join(bench.HERE, "results", "rules.md"), "w") as f:
        f.write(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
