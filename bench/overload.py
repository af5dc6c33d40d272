#!/usr/bin/python3
"""overload.py -- `make bench`'s overload part: a flood of many clients,
each within its own rate limit, against a PHP site, with and without the
module's local protection, side by side.

Two stacks, each on one CPU (taskset), the load generator and Redis on
the other:

  modphp   prefork MPM + mod_php, MaxRequestWorkers 8
  fpm      event MPM (4 children x 8 threads) + mod_proxy_fcgi + php-fpm
           (pm = static, pm.max_children 8), php-fpm on Apache's CPU

both with Debian's keep-alive defaults (KeepAlive On, MaxKeepAliveRequests
100, KeepAliveTimeout 5), PHP without opcache, and four configurations:

  unloaded          the critical client alone (no limiter), every 25 ms
  no limiter        the module loaded, nothing enabled
  per-key           TBucketLimit 100 10/s by X-API-Key on /app/
  local protection  the same, plus TBucketShed low=50 normal=75 high=90
                    over the site, TBucketLocalConcurrency 4 on /app/ and
                    TBucketPriority critical (and no local cap) for
                    X-Partner: yes

The scenario is tests/integration/tbtest/overload.py: 64 keep-alive
connections flooding /app/heavy.php (about 25 ms of PHP CPU) over 10,000
API keys, and a critical client opening a new connection to the same
page (X-Partner: yes: never shed, outside the local cap; --critical-path
to ask for /health.php instead) every 100 ms with a 10 s timeout. Also measured, each
alone: the server CPU of one rendered page (no limiter, 40 pages on one
connection) and of one request refused by local protection (its places
held by sleeping critical requests; up to 400 requests on new
connections), with the Redis calls it makes.

Targets, judged on local protection: the critical client 100% answered,
its p99 at most 8x its unloaded p99; a refused request costs at most 1/10
of a rendered page's server CPU and no Redis call. A configuration that
`apache2 -t` refuses (a module without the directives) is reported as not
measured.

    /usr/bin/python3 bench/overload.py [--build DIR] [--quick]
                                       [--stacks modphp,fpm]

Writes bench/results/overload.md (the tables) and overload.tsv (name,
value, unit) and prints the Markdown. Every server is started on a free
loopback port in a temp dir and stopped by PID; every load is bounded in
time and in requests. About 2.5 minutes.
"""
import argparse
import datetime
import os
import shutil
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
SHED_SHARE = 0.10

COLUMNS = ("unloaded", "none", "per_key", "local")
COLUMN_NAMES = {"unloaded": "unloaded", "none": "no limiter",
                "per_key": "per-key 100 10/s", "local": "local protection"}


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


def start_apache(args, a, stack, fpm, kind, redis_url):
    """Start one Apache of `stack` with configuration `kind`; returns it,
    or raises NotMeasured when apache2 -t refuses the configuration."""
    if stack == "modphp":
        php = ModPhp(a)
        front = php.conf()
    else:
        install_pages(a)
        front = fpm.conf()
    body = front + ov.config_body(kind, redis_url, prefix="ov-%s-%s:" % (
        stack, kind), local_concurrency=args.local_concurrency)
    rc, out = a.configtest(body)
    if rc != 0:
        raise NotMeasured("apache2 -t refuses the configuration: %s" %
                          out.strip().splitlines()[-1][:200])
    a.start(body)
    return a


def run_stack(args, stack, rd, tmp, res):
    spec = STACKS[stack]
    out = res.setdefault(stack, {"cols": {}, "notes": []})
    fpm = None
    try:
        if stack == "fpm":
            fpm = guarded(PhpFpm(children=spec["children"],
                                 cpus=args.server_cpu).start)
        for kind in ("none", "per_key", "local"):
            a = None
            try:
                a = guarded(Apache, mpm=spec["mpm"], servers=spec["servers"],
                            build=args.build, log_level="warn",
                            keepalive=KEEPALIVE, cpus=args.server_cpu,
                            modules=PhpFpm.MODULES if fpm else ())
                guarded(start_apache, args, a, stack, fpm, kind, rd.url)
                run_config(args, stack, kind, a, fpm, rd, out)
                bad = a.bad_lines()
                if bad:
                    out["notes"].append("%s: %d error-log lines, first: %s"
                                        % (COLUMN_NAMES[kind], len(bad),
                                           bad[0][:200]))
            except NotMeasured as e:
                out["cols"][kind] = None
                out["notes"].append("%s: not measured (%s)" % (
                    COLUMN_NAMES[kind], e))
                bench.log("overload %s %s: NOT MEASURED %s" % (stack, kind,
                                                                e))
            finally:
                if a is not None:
                    a.cleanup()
    except NotMeasured as e:
        out["notes"].append("stack not measured (%s)" % e)
        bench.log("overload %s: NOT MEASURED %s" % (stack, e))
    finally:
        if fpm is not None:
            fpm.cleanup()


def run_config(args, stack, kind, a, fpm, rd, out):
    fpm_pid = fpm.proc.pid if fpm else None
    common = dict(fpm_pid=fpm_pid, redis=rd.r, status_path=ov.STATUS_PATH,
                  cpus=args.client_cpu, critical_path=args.critical_path)
    if kind == "none":
        # The critical client alone, then a rendered page's cost.
        rep = ov.run(a.port, a.proc.pid, flood=0,
                     duration=args.unloaded_seconds,
                     critical_interval=UNLOADED_INTERVAL, **common)
        out["cols"]["unloaded"] = rep
        bench.log("overload %s unloaded: %s" % (stack, ov.summary(rep)))
        out["page"] = ov.page_cost(a.port, a.proc.pid, fpm_pid,
                                   n=args.page_requests,
                                   headers={"X-API-Key": "page"})
        bench.log("overload %s page: %s" % (stack, out["page"]))
    rep = ov.run(a.port, a.proc.pid, flood=args.flood, keys=args.keys,
                 duration=args.seconds, **common)
    out["cols"][kind] = rep
    bench.log("overload %s %s: %s" % (stack, kind, ov.summary(rep)))
    kinds = rep["flood"]["error_kinds"]
    if kinds:
        out["notes"].append("%s: flood errors %s" % (
            COLUMN_NAMES[kind], ", ".join("%s %d" % kv
                                          for kv in sorted(kinds.items()))))
    if kind == "local":
        time.sleep(0.5)
        out["shed"] = ov.shed_cost(a.port, a.proc.pid, fpm_pid, rd.r,
                                   hold=args.local_concurrency,
                                   n=args.shed_requests)
        bench.log("overload %s shed: %s" % (stack, out["shed"]))


# ---- output -------------------------------------------------------------

def fmt(x, nd=1):
    if x is None:
        return "-"
    if isinstance(x, float):
        return ("%%.%df" % nd) % x
    return str(x)


def stack_rows(stack, r):
    """(figure, {column: text}, target, verdict) rows and the TSV rows of
    one stack."""
    cols = r["cols"]
    tsv = []
    rows = []
    base = cols.get("unloaded")
    base_p99 = base["critical"]["p99_ms"] if base else None
    page = r.get("page")

    def col(fn):
        return {c: (fn(cols[c]) if cols.get(c) else None) for c in COLUMNS}

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
             for c in COLUMNS}
    loc = cols.get("local")
    verdict = ""
    if loc:
        verdict = "met" if share["local"] == 1.0 else "MISSED"
    rows.append(("critical answered / sent",
                 {c: ("%d/%d" % (answered[c], sent[c])
                      if sent[c] is not None else "-") for c in COLUMNS},
                 "100%", verdict))
    for c in COLUMNS:
        if share[c] is not None:
            tsv.append(("overload.%s.%s.critical.answered_share" % (stack, c),
                        round(share[c], 4), "x"))
            tsv.append(("overload.%s.%s.critical.sent" % (stack, c),
                        sent[c], "requests"))
    add("critical p50 (ms)", "critical.p50", col(
        lambda x: x["critical"]["p50_ms"]), "ms", nd=2)
    add("critical p99 (ms)", "critical.p99", col(
        lambda x: x["critical"]["p99_ms"]), "ms", nd=2)
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
    add("flood p99 (ms)", "flood.p99", col(
        lambda x: x["flood"]["p99_ms"]), "ms")
    add("Apache CPU (s)", "apache_cpu", col(
        lambda x: x["apache_cpu_s"]), "s", nd=2)
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


def write(args, res, started, t0):
    lines = ["overload.py: a flood of 64 keep-alive connections over "
             "10,000 API keys on a 25 ms PHP page, and a critical client "
             "(a new connection every 100 ms to %s, 10 s "
             "timeout), %s UTC, %.0f s" % (args.critical_path,
                                           started.strftime("%Y-%m-%d %H:%M"),
                                           time.monotonic() - t0),
             "",
             "Load average (1 min) at start %.2f, at end %.2f. Pinning: %s. "
             "Flood %d s after 1 s of warm-up, %d connections, %d keys; "
             "unloaded %d s, a request every %d ms; "
             "TBucketLocalConcurrency %d." % (
                 args.load_start, os.getloadavg()[0], args.pin_text,
                 args.seconds, args.flood, args.keys,
                 args.unloaded_seconds, UNLOADED_INTERVAL * 1000,
                 args.local_concurrency)]
    tsv = []
    for stack in args.stacks:
        r = res.get(stack)
        if r is None:
            continue
        rows, t = stack_rows(stack, r)
        tsv += t
        lines += ["", "### %s" % STACKS[stack]["title"], "",
                  "| figure | " + " | ".join(COLUMN_NAMES[c]
                                            for c in COLUMNS)
                  + " | target (local protection) | |",
                  "| --- |" + " ---: |" * len(COLUMNS) + " --- | --- |"]
        for name, vals, target, verdict in rows:
            lines.append("| %s | %s | %s | %s |" % (
                name, " | ".join(vals[c] for c in COLUMNS), target,
                verdict))
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
    text = "\n".join(lines) + "\n"
    res_dir = os.path.join(bench.HERE, "results")
    os.makedirs(res_dir, exist_ok=True)
    with open(os.path.join(res_dir, "overload.md"), "w") as f:
        f.write(text)
    with open(os.path.join(res_dir, "overload.tsv.tmp"), "w") as f:
        f.write("name\tvalue\tunit\n")
        for name, value, unit in tsv:
            f.write("%s\t%s\t%s\n" % (name, value, unit))
    os.replace(os.path.join(res_dir, "overload.tsv.tmp"),
               os.path.join(res_dir, "overload.tsv"))
    print(text)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default=os.path.join(bench.ROOT, "build"))
    ap.add_argument("--quick", action="store_true",
                    help="short runs, for trying the driver")
    ap.add_argument("--stacks", default="modphp,fpm")
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
                         "workers on one CPU)")
    args = ap.parse_args()
    args.build = os.path.abspath(args.build)
    args.stacks = [s for s in args.stacks.split(",") if s in STACKS]
    args.flood = 64
    args.keys = 10000
    args.seconds = 4 if args.quick else 12
    args.unloaded_seconds = args.seconds
    args.page_requests = 20 if args.quick else 40
    args.shed_requests = 400
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
            run_stack(args, stack, rd, tmp, res)
    finally:
        rd.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    write(args, res, started, t0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
