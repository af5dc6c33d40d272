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
import os
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
        c = bench.calls_per_request(
            rd, srv.url(path + "ok.txt"), "ab-%s-%d" % (
                path.strip("/"), os.getpid()), 2000, wcpu, ("evalsha",))
        calls, usec = c["evalsha"], c["evalsha_usec"]
        rows.append(("redis.%s.calls_per_request" % name, round(calls, 3),
                     "calls"))
        rows.append(("redis.%s.usec_per_call" % name, round(usec, 2), "us"))
    for name in ("three", "counted"):
        ratio = bench.median([x["rps"] / o["rps"] for x, o in
                              zip(res[name], res["one"])])
        rows.append(("http.ratio.%s_over_one" % name, round(ratio, 3), "x"))
    return rows


def main():
    a, so, scpu, wcpu = bench.module_args("rules", __doc__)
    if so is None:
        return 1
    rounds, seconds = (2, 2) if a.quick else (5, 3)
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
    bench.write_figures("rules", "rules_bench.py: three TBucketRule buckets "
                        "(one of them count=) against one limit", rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
