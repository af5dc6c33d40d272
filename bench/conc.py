#!/usr/bin/python3
"""conc.py -- what a concurrency limit costs: req/s of one Apache with a
rate limit alone, and with the same rate limit plus a concurrency limit
that nothing reaches (TBucketConcurrency 1000000), side by side.

Both are Locations of one Apache (event MPM, 2 children x 32 threads,
pinned with Redis on the last CPU, wrk on CPU 0), so the two variants
share every server, connection and cache; wrk alternates them round by
round (the order reverses every round) and the ratio is the median of
the per-round ratios. A rate-limited request is one EVALSHA; with the
concurrency limit it is the same EVALSHA (the slot is taken in it) plus
one ZREM after the response: the Redis calls per request and Redis's
time per call are counted with INFO commandstats over an exact number of
requests (ab). CPU time per request (Apache's processes, Redis) is read
from /proc around each round: on a machine other work loads, it moves
less than req/s does.

    /usr/bin/python3 bench/conc.py [--build DIR] [--quick]

Prints a Markdown table and writes bench/results/conc.md. Uses the
helpers of bench/run.py (Redis, wrk, pinning); `make bench` runs it after
run.py.
"""
import os
import subprocess
import sys
import time

import benchkit as bench

CONF = """ServerRoot "{root}"
ServerName 127.0.0.1
Listen 127.0.0.1:{port}
PidFile {root}/run/httpd.pid
DefaultRuntimeDir {root}/run
Mutex file:{root}/run default
ScoreBoardFile {root}/run/scoreboard
ErrorLog {root}/logs/error.log
LogLevel warn
User www-data
Group www-data
LoadModule mpm_event_module {moddir}/mod_mpm_event.so
LoadModule authz_core_module {moddir}/mod_authz_core.so
StartServers 2
ServerLimit 2
ThreadsPerChild 32
ThreadLimit 32
MinSpareThreads 1
MaxSpareThreads 64
MaxRequestWorkers 64
KeepAlive On
MaxKeepAliveRequests 0
Timeout 10
DocumentRoot "{root}/htdocs"
<Directory "{root}/htdocs">
    Require all granted
</Directory>
LoadModule tbucket_module {so}
TBucketRedis {url} timeout=500 pool=32
TBucketPrefix bench:
<Location /rate/>
    TBucketEnable On
    TBucketKey "%{{HTTP:X-API-Key}}"
    TBucketLimit 1000000000 1000000000/s
</Location>
<Location /conc/>
    TBucketEnable On
    TBucketKey "%{{HTTP:X-API-Key}}"
    TBucketLimit 1000000000 1000000000/s
    TBucketConcurrency 1000000
</Location>
"""


class Apache:
    def __init__(self, tmp, cpus, so, url):
        self.root = os.path.join(tmp, "httpd-conc")
        self.port = bench.free_port()
        self.cpus = cpus
        for d in ("logs", "run", "htdocs/rate", "htdocs/conc"):
            os.makedirs(os.path.join(self.root, d), exist_ok=True)
        for d in ("rate", "conc"):
            with open(os.path.join(self.root, "htdocs", d, "ok.txt"),
                      "w") as f:
                f.write("ok\n")
        self.conf = os.path.join(self.root, "httpd.conf")
        with open(self.conf, "w") as f:
            f.write(CONF.format(root=self.root, port=self.port,
                                moddir=bench.MODDIR, so=so, url=url))
        for dirpath, dirs, files in os.walk(self.root):
            os.chmod(dirpath, 0o755)
            for fn in files:
                os.chmod(os.path.join(dirpath, fn), 0o644)
        self.proc = None

    def start(self):
        self.proc = subprocess.Popen(
            bench.pin(self.cpus) + ["/usr/sbin/apache2", "-f", self.conf,
                                    "-DFOREGROUND"],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
            start_new_session=True)
        if not bench.wait_port(self.port, 10):
            raise RuntimeError("apache2 did not listen")
        return self

    def url(self, path):
        return "http://127.0.0.1:%d%s" % (self.port, path)

    def pids(self):
        return [self.proc.pid] + bench.child_pids(self.proc.pid)

    def stop(self):
        bench.stop_pid(self.proc, timeout=15)


def main():
    a, so, scpu, wcpu = bench.module_args("conc", __doc__)
    if so is None:
        return 1
    rounds, seconds = (2, 2) if a.quick else (5, 3)
    rows = []
    with bench.redis_and_server(
            "tbconc-", scpu,
            lambda tmp, rd: Apache(tmp, scpu, so, rd.url).start()) as (rd,
                                                                        srv):
        variants = (("rate", "/rate/"), ("conc", "/conc/"))
        res = bench.alternating_rounds(srv, rd, variants, rounds, seconds,
                                       wcpu, "conc")
        for name, _ in variants:
            rows += bench.round_rows(name, res[name])
        ratio = bench.median([c["rps"] / r["rps"] for c, r in
                              zip(res["conc"], res["rate"])])
        rows.append(("http.ratio.conc_over_rate", round(ratio, 3), "x"))
        for name, path in variants:
            # Requests wrk left in flight release their slots after it
            # stops.
            time.sleep(0.5)
            rows += bench.calls_rows(rd, srv, name, path, wcpu,
                                     ("evalsha", "zrem"))
        left = len(rd.r.keys("bench:*:conc"))
        rows.append(("redis.conc_sets_left", left, "keys"))
    bench.write_figures("conc", "conc.py: a concurrency limit nothing reaches "
                        "against the rate limit alone", rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
