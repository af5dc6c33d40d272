#!/usr/bin/python3
"""rules_bench.py -- what TBucketRule costs: one Apache (event MPM,
pinned with Redis on the last CPU, wrk on CPU 0) with three Locations
side by side:

  /a/  one limit (TBucketLimit), the plain case;
  /b/  that limit and two TBucketRules keyed by other expressions (three
       buckets of three client keys in one call: "3 rules against 1");
  /c/  the same three, one of them count=200: reserved before the
       handler and kept once the status (200) is known: a failed login,
       no call after the response;
  /d/  the same with count=401: the 200 does not count, the reservation
       is given back, one more call per request: a successful login.

wrk alternates the variants round by round (the order reverses every
round); the ratios are the medians of the per-round ratios. Apache's and
Redis's CPU per request come from /proc around each round; the Redis
calls per request and Redis's microseconds per call from INFO
commandstats over an exact number of requests (ab).

    /usr/bin/python3 bench/rules_bench.py [--build DIR] [--quick]

Prints a Markdown table and writes bench/results/rules.md; `make bench`
runs it.
"""
import sys

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
<Location /d/>
    TBucketEnable On
    TBucketKey "%{{HTTP:X-API-Key}}"
    TBucketLimit 1000000000 1000000000/s
    TBucketRule addr "%{{REMOTE_ADDR}}-%{{HTTP:X-API-Key}}" 1000000000 1000000000/s
    TBucketRule user "u-%{{HTTP:X-API-Key}}" 1000000000 1000000000/s count=401
</Location>
"""

VARIANTS = (("one", "/a/"), ("three", "/b/"), ("counted", "/c/"),
            ("uncounted", "/d/"))


def table(srv, rd, wcpu, res):
    rows = []
    for name, path in VARIANTS:
        rows += bench.round_rows(name, res[name])
        rows += bench.calls_rows(rd, srv, name, path, wcpu, ("evalsha",))
    for name in ("three", "counted", "uncounted"):
        ratio = bench.median([x["rps"] / o["rps"] for x, o in
                              zip(res[name], res["one"])])
        rows.append(("http.ratio.%s_over_one" % name, round(ratio, 3), "x"))
    return rows


def main():
    a, so, scpu, wcpu = bench.module_args("rules", __doc__)
    if so is None:
        return 1
    rounds, seconds = (2, 2) if a.quick else (5, 3)
    with bench.redis_and_server(
            "tbrules-", scpu, lambda tmp, rd: bench.Apache(
                tmp, "rules", scpu, LOCATIONS.format(so=so, url=rd.url))
            .start()) as (rd, srv):
        rows = table(srv, rd, wcpu, bench.alternating_rounds(
            srv, rd, VARIANTS, rounds, seconds, wcpu, "rules"))
    bench.write_figures("rules", "rules_bench.py: three TBucketRule buckets "
                        "(one of them count=) against one limit", rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
