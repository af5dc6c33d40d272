"""tbtest/overload.py -- the overload scenario: a flood of many clients,
each within its own rate limit, against a PHP site, and one critical
client that must still be answered. Shared by the tests and by
bench/overload.py (`make bench`).

The flood: F keep-alive connections (default 64), each sending GETs of
the heavy page back to back, every request with the next of K API keys
(X-API-Key, default 10,000 keys, taken in turn across all connections),
so no key comes near a per-key limit such as 100 10/s. A connection the
server closes (a response with `Connection: close`, the 100th request
under Debian's MaxKeepAliveRequests 100, an error) is opened again at
once: the flood ignores Retry-After. The connections are spread over a
few processes (threads in each), so that the flood's Python does not
hold up the critical client's.

The critical client: its own process, opening a NEW connection every
100 ms to a critical URL (default /health.php with `X-Partner: yes`),
each with a 10 s timeout; a request counts as answered on a 200.

run() starts the flood, waits a warm-up, runs the critical client for the
duration, then stops the flood (every load is bounded in time and in
requests; a request still in flight a moment past the end is cut). It
reads, before and after, the CPU time of the Apache processes (and of
php-fpm's, when given) from /proc, the Redis commands from INFO
commandstats and, when given, the module's status page, and reports:
critical answered / sent, p50, p99; flood requests by status; CPU
seconds; Redis calls. page_cost() and shed_cost() measure the server CPU
of one rendered page and of one shed request alone, without the flood.

CONFIGS gives the module configurations the bench compares ("none",
"per_key", "local"): config_body() writes one, "local" with a fixed or an
auto cap and, as options, CPU priority and the app's requests classed
low. qos_body() writes the same protection with mod_qos instead
(unpacked by scripts/fetch-qos.sh, qos_root()). CapTrace samples an
auto cap from the status page while a scenario runs; paced() sends a
page at a steady rate (the traffic after a flood).
"""
import http.client
import math
import multiprocessing
import os
import resource
import socket
import threading
import time

from tbtest.env import ROOT, child_pids, fetched

# ---- what the server side spends --------------------------------------

TICK_S = 1.0 / os.sysconf("SC_CLK_TCK")


def _tasks_cpu_ns(pid):
    """CPU time of every thread of process pid so far, in nanoseconds
    (the scheduler's own sum, /proc/PID/task/TID/schedstat: exact, where
    utime and stime count 10 ms ticks)."""
    total = 0
    try:
        tids = os.listdir("/proc/%d/task" % pid)
    except OSError:
        return 0
    for tid in tids:
        try:
            with open("/proc/%d/task/%s/schedstat" % (pid, tid)) as f:
                total += int(f.read().split()[0])
        except (OSError, ValueError, IndexError):
            pass
    return total


def tree_cpu_s(pid):
    """CPU seconds spent so far by the process pid and its children: the
    threads of pid and of each live child (schedstat), plus the cutime
    and cstime of the children pid has reaped. A child that exits
    between two readings is counted through its parent's cutime, to the
    tick, once reaped."""
    if not pid:
        return 0.0
    try:
        with open("/proc/%d/stat" % pid) as f:
            fields = f.read().rsplit(")", 1)[1].split()
        reaped = (int(fields[13]) + int(fields[14])) * TICK_S
    except (OSError, ValueError, IndexError):
        return 0.0
    ns = _tasks_cpu_ns(pid)
    for c in child_pids(pid):
        ns += _tasks_cpu_ns(c)
    return reaped + ns / 1e9


def redis_calls(client):
    """(commands, script calls) from INFO commandstats. Commands counts
    every command Redis ran, those a script runs inside included (the
    token-bucket script's TIME, HMGET, HSET, PEXPIRE); script calls are
    the EVALSHA, EVAL and FCALL calls, one per decision. INFO itself and
    CONFIG are left out, so two readings differ only by what others
    sent."""
    if client is None:
        return 0, 0
    st = client.info("commandstats")
    total = script = 0
    for k, v in st.items():
        name = k[len("cmdstat_"):]
        if name == "info" or name.startswith("config"):
            continue
        total += v["calls"]
        if name in ("evalsha", "eval", "fcall"):
            script += v["calls"]
    return total, script


def percentile(xs, q):
    """The nearest-rank q-quantile (0 < q <= 1) of xs, or None."""
    if not xs:
        return None
    s = sorted(xs)
    return s[max(0, min(len(s) - 1, int(math.ceil(q * len(s))) - 1))]


def _status_text(port, path, timeout=5):
    try:
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
        c.request("GET", path, headers={"Connection": "close"})
        r = c.getresponse()
        body = r.read().decode("utf-8", "replace")
        c.close()
        return body if r.status == 200 else ""
    except (OSError, http.client.HTTPException):
        return ""


def metric_total(text, name, **labels):
    """The sum of the samples of one metric family whose labels include
    `labels` (a Prometheus text page)."""
    total = 0.0
    for line in text.splitlines():
        if line.startswith("#") or not line.startswith(name):
            continue
        head, _, value = line.rpartition(" ")
        n, _, rest = head.partition("{")
        if n != name:
            continue
        got = dict(kv.split("=", 1) for kv in rest.rstrip("}").split(",")
                   if "=" in kv)
        if all(got.get(k, "").strip('"') == v for k, v in labels.items()):
            try:
                total += float(value)
            except ValueError:
                pass
    return total


class Probe:
    """Readings of the server side before and after a phase: CPU of the
    Apache tree and of an optional php-fpm tree, Redis calls, and the
    module's counters of requests shed (busy) and refused by a local
    scope, from its status page (when status_path)."""

    def __init__(self, port, apache_pid, fpm_pid=None, redis=None,
                 status_path=None):
        self.port = port
        self.apache_pid = apache_pid
        self.fpm_pid = fpm_pid
        self.redis = redis
        self.status_path = status_path

    def read(self):
        calls, script = redis_calls(self.redis)
        out = {"t": time.monotonic(),
               "apache_cpu_s": tree_cpu_s(self.apache_pid),
               "fpm_cpu_s": tree_cpu_s(self.fpm_pid),
               "redis_commands": calls, "redis_script_calls": script}
        if self.status_path:
            text = _status_text(self.port, self.status_path)
            out["status_shed"] = metric_total(text, "tbucket_shed_total")
            out["status_local_refused"] = metric_total(
                text, "tbucket_local_refusals_total")
            out["status_decisions_shed"] = metric_total(
                text, "tbucket_decisions_total", outcome="shed")
        return out

    @staticmethod
    def delta(a, b):
        return {k: b[k] - a[k] for k in a if k in b}


# ---- the clients -------------------------------------------------------

def _connect(port, timeout):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    c.connect()
    c.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return c


def _pin(cpus):
    if cpus:
        cpuset = set()
        for part in str(cpus).split(","):
            lo, _, hi = part.partition("-")
            cpuset.update(range(int(lo), int(hi or lo) + 1))
        os.sched_setaffinity(0, cpuset)


def _flood_proc(out, port, path, first, nthreads, nconn, nkeys, stop_at,
                max_requests, timeout, cpus):
    """One flood process: nthreads connections, the global connection
    numbers first..first+nthreads-1 of nconn. Sends its counts back on
    the pipe `out`."""
    _pin(cpus)
    lock = threading.Lock()
    counts = {}
    lat = []
    state = {"sent": 0, "errors": 0, "reconnects": 0, "cut": 0}
    kinds = {}
    live = {}

    def worker(idx):
        n = 0
        conn = None
        while time.monotonic() < stop_at:
            with lock:
                if state["sent"] >= max_requests:
                    break
                state["sent"] += 1
            # Key of the n-th request of connection idx: every key in
            # turn across all connections.
            key = "flood-%05d" % ((idx + n * nconn) % nkeys)
            n += 1
            t0 = time.monotonic()
            try:
                if conn is None:
                    conn = _connect(port, timeout)
                    live[idx] = conn
                    with lock:
                        state["reconnects"] += 1
                conn.request("GET", path, headers={"X-API-Key": key})
                r = conn.getresponse()
                r.read()
                t1 = time.monotonic()
                with lock:
                    counts[r.status] = counts.get(r.status, 0) + 1
                    if len(lat) < 200000:
                        lat.append(t1 - t0)
                if r.will_close:
                    conn.close()
                    conn = None
            except (OSError, http.client.HTTPException) as e:
                with lock:
                    if time.monotonic() >= stop_at:
                        state["cut"] += 1
                    else:
                        state["errors"] += 1
                        kind = type(e).__name__
                        kinds[kind] = kinds.get(kind, 0) + 1
                if conn is not None:
                    conn.close()
                conn = None
                # A refused or reset connection: do not spin on it.
                time.sleep(0.005)
        if conn is not None:
            conn.close()
        live.pop(idx, None)

    threads = [threading.Thread(target=worker, args=(first + i,),
                                daemon=True) for i in range(nthreads)]
    for t in threads:
        t.start()
    # A request still waiting at the end is cut a moment later: shut its
    # socket down so that its thread returns.
    while time.monotonic() < stop_at + 0.5 and any(t.is_alive()
                                                   for t in threads):
        time.sleep(0.05)
    for conn in list(live.values()):
        try:
            conn.sock.shutdown(socket.SHUT_RDWR)
        except (OSError, AttributeError):
            pass
    for t in threads:
        t.join(timeout + 1)
    state["reconnects"] -= nthreads     # the first connects
    ru = resource.getrusage(resource.RUSAGE_SELF)
    out.send({"counts": counts, "lat": lat, "kinds": kinds,
              "cpu_s": ru.ru_utime + ru.ru_stime, **state})
    out.close()


def _critical_proc(out, port, path, headers, interval, duration, timeout,
                   cpus):
    """The critical client: a new connection every interval seconds for
    duration seconds, one request each; sends the results back."""
    _pin(cpus)
    results = []
    lock = threading.Lock()

    def one(i):
        t0 = time.monotonic()
        t_conn = None
        status = None
        err = None
        try:
            c = http.client.HTTPConnection("127.0.0.1", port,
                                           timeout=timeout)
            c.connect()
            t_conn = time.monotonic() - t0
            h = {"Connection": "close"}
            h.update(headers)
            c.request("GET", path, headers=h)
            r = c.getresponse()
            r.read()
            status = r.status
            c.close()
        except socket.timeout:
            err = "timeout"
        except (OSError, http.client.HTTPException) as e:
            err = type(e).__name__
        with lock:
            results.append((i, status, err, time.monotonic() - t0, t_conn))

    threads = []
    start = time.monotonic()
    n = int(duration / interval)
    for i in range(n):
        pause = start + i * interval - time.monotonic()
        if pause > 0:
            time.sleep(pause)
        t = threading.Thread(target=one, args=(i,), daemon=True)
        t.start()
        threads.append(t)
    for t in threads:
        t.join(timeout + 2)
    ru = resource.getrusage(resource.RUSAGE_SELF)
    with lock:
        got = list(results)
    out.send({"results": got, "started": len(threads),
              "cpu_s": ru.ru_utime + ru.ru_stime})
    out.close()


def _spawn(target, args):
    ctx = multiprocessing.get_context("fork")
    rx, tx = ctx.Pipe(duplex=False)
    p = ctx.Process(target=target, args=(tx,) + args, daemon=True)
    p.start()
    tx.close()
    return p, rx


def _collect(p, rx, timeout):
    """The result a child sent, waiting at most timeout seconds; a child
    that does not finish is stopped by its PID."""
    got = None
    if rx.poll(timeout):
        try:
            got = rx.recv()
        except EOFError:
            got = None
    p.join(2)
    if p.is_alive():
        p.kill()
        p.join(2)
    return got


def run(port, apache_pid, fpm_pid=None, redis=None, status_path=None,
        flood=64, keys=10000, flood_path="/app/heavy.php",
        critical_path="/health.php", critical_headers=None,
        critical_interval=0.1, critical_timeout=10.0, duration=15.0,
        warmup=1.0, flood_procs=2, max_flood_requests=500000,
        cpus=None):
    """The scenario against 127.0.0.1:port (flood=0: the critical client
    alone, "unloaded"). apache_pid (and fpm_pid) are the parents whose
    process trees' CPU is read; redis a redis-py client of the Redis the
    module uses; status_path the module's status page, if any; cpus the
    CPUs of the load generator's processes ("0"), or None. Returns the
    report (a dict; see summary())."""
    if critical_headers is None:
        critical_headers = {"X-Partner": "yes"}
    probe = Probe(port, apache_pid, fpm_pid, redis, status_path)
    before = probe.read()
    floods = []
    stop_at = time.monotonic() + warmup + duration + 0.2
    if flood > 0:
        procs = max(1, min(flood_procs, flood))
        per = [flood // procs + (1 if i < flood % procs else 0)
               for i in range(procs)]
        first = 0
        for i, nthreads in enumerate(per):
            floods.append(_spawn(_flood_proc, (
                port, flood_path, first, nthreads, flood, keys, stop_at,
                max_flood_requests // procs, critical_timeout, cpus)))
            first += nthreads
        time.sleep(warmup)
    crit = _spawn(_critical_proc, (port, critical_path, critical_headers,
                                   critical_interval, duration,
                                   critical_timeout, cpus))
    crit_res = _collect(*crit, duration + critical_timeout + 10) or {}
    flood_res = [_collect(p, rx, max(0.0, stop_at - time.monotonic())
                          + critical_timeout + 5) for p, rx in floods]
    after = probe.read()
    return report(before, after, crit_res, flood_res, flood, keys,
                  flood_s=(warmup + duration + 0.2) if flood > 0 else None)


def report(before, after, crit, flood_res, flood, keys, flood_s=None):
    """The report of one run() from its readings and its clients'
    results; flood_s, the seconds the flood sent for, gives its pages
    (200s) per second."""
    d = Probe.delta(before, after)
    crit_res = crit.get("results", [])
    ok_lat = [r[3] for r in crit_res if r[1] == 200]
    conn_lat = [r[4] for r in crit_res if r[4] is not None]
    crit_status = {}
    for _, st, err, _, _ in crit_res:
        k = st if st is not None else (err or "error")
        crit_status[k] = crit_status.get(k, 0) + 1
    started = crit.get("started", len(crit_res))
    if started > len(crit_res):
        crit_status["unfinished"] = started - len(crit_res)
    counts = {}
    lat = []
    fl = {"sent": 0, "errors": 0, "reconnects": 0, "cut": 0, "lost": 0,
          "cpu_s": crit.get("cpu_s", 0.0)}
    kinds = {}
    for r in flood_res:
        if r is None:
            fl["lost"] += 1
            continue
        for k, v in r["counts"].items():
            counts[k] = counts.get(k, 0) + v
        for k, v in r["kinds"].items():
            kinds[k] = kinds.get(k, 0) + v
        lat += r["lat"]
        for k in ("sent", "errors", "reconnects", "cut", "cpu_s"):
            fl[k] += r[k]
    answered = sum(counts.values())
    wall = d["t"]
    rep = {
        "wall_s": wall,
        "critical": {
            "sent": started, "answered": len(ok_lat),
            "by_status": crit_status,
            "p50_ms": _ms(percentile(ok_lat, 0.50)),
            "p99_ms": _ms(percentile(ok_lat, 0.99)),
            "max_ms": _ms(max(ok_lat) if ok_lat else None),
            # The TCP handshake alone: a SYN the server side dropped
            # shows as a second or more here.
            "connect_p99_ms": _ms(percentile(conn_lat, 0.99)),
            # (request number, ms, status) of the slowest five.
            "slowest": [(r[0], _ms(r[3]), r[1])
                        for r in sorted(crit_res, key=lambda r: -r[3])[:5]],
        },
        "flood": {
            "connections": flood, "keys": keys, "answered": answered,
            "by_status": counts, "errors": fl["errors"],
            "error_kinds": kinds,
            "reconnects": fl["reconnects"], "cut_at_end": fl["cut"],
            "lost_processes": fl["lost"],
            "per_s": answered / wall if wall > 0 else 0.0,
            "pages_per_s": (counts.get(200, 0) / flood_s
                            if flood_s else None),
            "p50_ms": _ms(percentile(lat, 0.50)),
            "p99_ms": _ms(percentile(lat, 0.99)),
        },
        "apache_cpu_s": d["apache_cpu_s"],
        "fpm_cpu_s": d["fpm_cpu_s"],
        "server_cpu_s": d["apache_cpu_s"] + d["fpm_cpu_s"],
        # The load generator's own CPU (flood and critical processes):
        # near wall_s x its CPUs, it was the bottleneck, and its own
        # latencies count in the critical client's.
        "client_cpu_s": fl["cpu_s"],
        "redis_commands": d["redis_commands"],
        "redis_script_calls": d["redis_script_calls"],
    }
    shed = counts.get(503, 0)
    rep["flood"]["shed"] = shed
    rep["apache_cpu_ms_per_request"] = (
        1000.0 * d["apache_cpu_s"] / answered if answered else None)
    rep["redis_script_calls_per_flood_request"] = (
        d["redis_script_calls"] / answered if answered else None)
    for k in ("status_shed", "status_local_refused",
              "status_decisions_shed"):
        if k in d:
            rep[k] = d[k]
    return rep


def shed_estimate(rep, page_apache_ms, other_apache_ms=0.0):
    """Apache CPU per shed (503) request under the flood, by subtraction:
    (Apache CPU - 200s x a rendered page's Apache CPU - other answers x
    other_apache_ms) / 503s, in ms; None without 503s."""
    fl = rep["flood"]
    shed = fl["by_status"].get(503, 0)
    if not shed:
        return None
    ok = fl["by_status"].get(200, 0) + rep["critical"]["answered"]
    other = fl["answered"] - shed - fl["by_status"].get(200, 0)
    rest = (1000.0 * rep["apache_cpu_s"] - ok * page_apache_ms
            - other * other_apache_ms)
    return rest / shed


def _ms(x):
    return None if x is None else round(1000.0 * x, 2)


def summary(rep):
    """One line for a log."""
    c, f = rep["critical"], rep["flood"]
    return ("critical %d/%d answered p50 %s p99 %s ms; flood %d answered "
            "(%s) %.0f/s errors %d; Apache CPU %.2f s, php-fpm %.2f s, "
            "client %.2f s; Redis script calls %d, commands %d" % (
                c["answered"], c["sent"], c["p50_ms"], c["p99_ms"],
                f["answered"], " ".join("%s=%d" % kv for kv in
                                        sorted(f["by_status"].items())),
                f["per_s"], f["errors"], rep["apache_cpu_s"],
                rep["fpm_cpu_s"], rep["client_cpu_s"],
                rep["redis_script_calls"], rep["redis_commands"]))


# ---- the cost of one page and of one shed request ----------------------

def page_cost(port, apache_pid, fpm_pid=None, path="/app/heavy.php", n=40,
              headers=None):
    """Server CPU of one rendered page: n requests one after the other
    on one keep-alive connection, nothing else running. Returns
    {apache_ms, fpm_ms, server_ms, statuses, wall_ms}."""
    probe = Probe(port, apache_pid, fpm_pid)
    conn = _connect(port, 10)
    statuses = {}
    # One untimed request: the first loads what the child loads once.
    conn.request("GET", path, headers=dict(headers or {}))
    conn.getresponse().read()
    a = probe.read()
    for i in range(n):
        conn.request("GET", path, headers=dict(headers or {}))
        r = conn.getresponse()
        r.read()
        statuses[r.status] = statuses.get(r.status, 0) + 1
        if r.will_close:
            conn.close()
            conn = _connect(port, 10)
    b = probe.read()
    conn.close()
    d = Probe.delta(a, b)
    return {"apache_ms": 1000.0 * d["apache_cpu_s"] / n,
            "fpm_ms": 1000.0 * d["fpm_cpu_s"] / n,
            "server_ms": 1000.0 * (d["apache_cpu_s"] + d["fpm_cpu_s"]) / n,
            "wall_ms": 1000.0 * d["t"] / n, "statuses": statuses}


def shed_cost(port, apache_pid, fpm_pid=None, redis=None, hold=6,
              hold_path="/app/sleep.php?ms=4000", hold_headers=None,
              path="/app/heavy.php", n=400, conns=2, seconds=2.5):
    """Server CPU and Redis calls of one locally refused request, alone:
    `hold` requests of hold_path (critical but inside the local cap, by
    hold_headers; config_body) keep workers
    busy and take the local concurrency places without CPU, then `conns`
    clients send up to n requests of path, each on a new connection, for
    at most `seconds`. Returns {sent, statuses, apache_ms, fpm_ms,
    redis_commands, redis_commands_per_request} (CPU per request sent;
    every Redis command, a script's nested ones included); statuses
    says whether they were refused (503) at all."""
    if hold_headers is None:
        hold_headers = {"X-Hold": "yes"}
    holders = []

    def holder():
        try:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=15)
            h = {"Connection": "close"}
            h.update(hold_headers)
            c.request("GET", hold_path, headers=h)
            c.getresponse().read()
            c.close()
        except (OSError, http.client.HTTPException):
            pass

    for _ in range(hold):
        t = threading.Thread(target=holder, daemon=True)
        t.start()
        holders.append(t)
        time.sleep(0.02)
    time.sleep(0.5)
    probe = Probe(port, apache_pid, fpm_pid, redis)
    a = probe.read()
    lock = threading.Lock()
    statuses = {}
    sent = [0]
    stop_at = time.monotonic() + seconds

    def client(i):
        while time.monotonic() < stop_at:
            with lock:
                if sent[0] >= n:
                    return
                sent[0] += 1
                k = sent[0]
            try:
                c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
                c.request("GET", path, headers={
                    "X-API-Key": "shed-%05d" % k, "Connection": "close"})
                r = c.getresponse()
                r.read()
                c.close()
                st = r.status
            except (OSError, http.client.HTTPException) as e:
                st = type(e).__name__
            with lock:
                statuses[st] = statuses.get(st, 0) + 1

    cl = [threading.Thread(target=client, args=(i,), daemon=True)
          for i in range(conns)]
    for t in cl:
        t.start()
    for t in cl:
        t.join(seconds + 12)
    b = probe.read()
    for t in holders:
        t.join(15)
    d = Probe.delta(a, b)
    k = max(1, sent[0])
    return {"sent": sent[0], "statuses": statuses,
            "apache_ms": 1000.0 * d["apache_cpu_s"] / k,
            "fpm_ms": 1000.0 * d["fpm_cpu_s"] / k,
            "redis_commands": d["redis_commands"],
            "redis_commands_per_request": d["redis_commands"] / k}


# ---- the configurations compared ---------------------------------------

STATUS_PATH = "/tbucket-status"

CONFIGS = ("none", "per_key", "local")

CONFIG_NAMES = {"none": "no limiter", "per_key": "per-key TBucketLimit",
                "local": "local protection"}


def config_body(kind, redis_url, prefix="ov:", limit="100 10/s",
                local_concurrency=4, shed="low=50 normal=75 high=90",
                app="/app/", cpu_priority=None, app_priority=None):
    """The module's part of the Apache config for one configuration:
    "none" loads the module and enables nothing (the status page
    only); "per_key" limits app by X-API-Key with `limit`; "local" adds
    TBucketShed `shed` for the whole site, TBucketLocalConcurrency
    local_concurrency on app (a number, or "auto" and its options), and
    TBucketPriority critical (outside the local cap) for requests with
    X-Partner: yes. For "local" also: cpu_priority, the arguments of
    TBucketCPUPriority ("On"), and app_priority, the TBucketPriority of
    app's other requests ("low")."""
    out = ["TBucketRedis %s timeout=500" % redis_url,
           "TBucketPrefix %s" % prefix]
    if kind == "local":
        out += ["TBucketShed %s" % shed,
                "TBucketShedRetryAfter 1",
                "<Location />",
                "    TBucketEnable On",
                "</Location>"]
        if cpu_priority:
            out.append("TBucketCPUPriority %s" % cpu_priority)
    if kind in ("per_key", "local"):
        out += ["<Location %s>" % app,
                "    TBucketEnable On",
                '    TBucketKey "%{HTTP:X-API-Key}"',
                "    TBucketLimit %s" % limit]
        if kind == "local":
            out.append("    TBucketLocalConcurrency %s" % local_concurrency)
            if app_priority:
                out.append("    TBucketPriority %s" % app_priority)
        out.append("</Location>")
    if kind == "local":
        # The partner is never shed, and passes the app's local cap:
        # <If> merges after <Location>, so Off here leaves it.
        # shed_cost's holders are critical too (never shed themselves) but
        # stay inside the cap, whose places they hold.
        out += ["<If \"%{HTTP:X-Partner} == 'yes'\">",
                "    TBucketPriority critical",
                "    TBucketLocalConcurrency Off",
                "</If>",
                "<ElseIf \"%{HTTP:X-Hold} == 'yes'\">",
                "    TBucketPriority critical",
                "</ElseIf>"]
    out += ["<Location %s>" % STATUS_PATH,
            "    SetHandler tbucket-status",
            "    TBucketEnable Off",
            "</Location>"]
    return "\n".join(out) + "\n"


# ---- mod_qos, the same protection by another module --------------------

QOS_DIR = os.environ.get("TB_QOS_DIR", "/var/cache/tbucket-qos")
FETCH_QOS = os.path.join(ROOT, "scripts", "fetch-qos.sh")
QOS_SO = "usr/lib/apache2/modules/mod_qos.so"
QOS_PCRE = "lib/x86_64-linux-gnu/libpcre.so.3"


def qos_root():
    """The directory Debian's libapache2-mod-qos (and the libpcre3 it
    calls) is unpacked into, after running scripts/fetch-qos.sh if it
    is missing; raises RuntimeError, naming the package, if it cannot
    be had."""
    root, failed = fetched(FETCH_QOS, QOS_DIR, (QOS_SO, QOS_PCRE))
    if failed:
        raise RuntimeError(
            "libapache2-mod-qos is not unpacked in %s and "
            "scripts/fetch-qos.sh failed (rc %d): %s" % (
                QOS_DIR, failed.returncode,
                (failed.stdout + failed.stderr)[-500:]))
    return root


def qos_body(root, redis_url, prefix="ov:", cap=2, app="/app/",
             close_share="80%"):
    """mod_qos's best per-server setup for the scenario, with mod_tbucket
    loaded but limiting nothing (config_body "none": its status page
    only). Every request but the partner's (X-Partner: yes) gets
    QS_Cond=limited; QS_CondLocRequestLimitMatch lets at most `cap` of
    them into app at once (it counts the partner's too, and refuses only
    the limited: "Every request matching the defined pattern is counted,
    but the defined limitation is only enforced for those requests
    matching the specified condition", mod_qos's manual); refusals get
    503 instead of mod_qos's default 500; QS_SrvMaxConnClose closes
    keep-alive once close_share of MaxRequestWorkers connections are
    open, so a refused flood connection does not keep a prefork
    worker. mod_qos is loaded from root (qos_root()), libpcre3 first."""
    pattern = "^%s" % app
    return config_body("none", redis_url, prefix=prefix) + "\n".join([
        "LoadFile %s" % os.path.join(root, QOS_PCRE),
        "LoadModule qos_module %s" % os.path.join(root, QOS_SO),
        'SetEnvIf Request_URI "." QS_Cond=limited',
        'SetEnvIf X-Partner "^yes$" !QS_Cond',
        'QS_CondLocRequestLimitMatch "%s" %d limited' % (pattern, cap),
        "QS_SrvMaxConnClose %s" % close_share,
        "QS_ErrorResponseCode 503",
    ]) + "\n"


# ---- an auto cap seen from outside, and steady traffic -----------------

def parse_metrics(text):
    """[(name, {label: value}, float value)] of a Prometheus text page."""
    out = []
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        head, _, value = line.rpartition(" ")
        name, _, rest = head.partition("{")
        labels = dict((k, v.strip('"')) for k, v in (
            kv.split("=", 1) for kv in rest.rstrip("}").split(",")
            if "=" in kv))
        try:
            out.append((name, labels, float(value)))
        except ValueError:
            pass
    return out


def auto_scope_reading(text):
    """The first auto local scope's reading on a status page: {scope,
    limit, in_flight, window_ms, floor_ms, up, down, probe}, or None."""
    rows = parse_metrics(text)
    scope = next((lb.get("scope") for n, lb, _ in rows
                  if n == "tbucket_local_auto_bounds"), None)
    if scope is None:
        return None
    got = {"scope": scope}
    for name, lb, v in rows:
        if lb.get("scope") != scope:
            continue
        if name == "tbucket_local_limit":
            got["limit"] = int(v)
        elif name == "tbucket_local_in_flight":
            got["in_flight"] = int(v)
        elif name == "tbucket_local_auto_latency_seconds":
            got["%s_ms" % lb.get("kind")] = round(v * 1000.0, 2)
        elif name == "tbucket_local_auto_changes_total":
            got[lb.get("direction")] = int(v)
    return got


class CapTrace:
    """A thread that reads the status page every `interval` seconds and
    keeps the auto scope's reading (auto_scope_reading()) with the time
    since start() and the phase mark() last named. A reading that takes
    longer than the interval (the status request waits for a worker like
    any other) is kept, and the next one starts at the next tick."""

    def __init__(self, port, path=STATUS_PATH, interval=0.5, timeout=2.0):
        self.port = port
        self.path = path
        self.interval = interval
        self.timeout = timeout
        self.rows = []
        self.phase = "before"
        self._stop = threading.Event()
        self._thread = None
        self.t0 = None

    def start(self):
        self.t0 = time.monotonic()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()
        return self

    def mark(self, phase):
        self.phase = phase

    def _loop(self):
        k = 0
        while not self._stop.is_set():
            t = time.monotonic()
            phase = self.phase
            text = _status_text(self.port, self.path, self.timeout)
            got = auto_scope_reading(text) if text else None
            row = {"t_s": round(t - self.t0, 2), "phase": phase,
                   "read_ms": round(1000.0 * (time.monotonic() - t), 1)}
            row.update(got or {"limit": None})
            self.rows.append(row)
            k = max(k + 1, int((time.monotonic() - self.t0)
                               / self.interval) + 1)
            self._stop.wait(max(0.0, self.t0 + k * self.interval
                                - time.monotonic()))

    def stop(self):
        self._stop.set()
        if self._thread is not None:
            self._thread.join(self.timeout + 1)
        return self.rows


def paced(port, path, rate, seconds, headers=None, cpus=None, timeout=10.0):
    """Requests of path at a steady `rate` a second for `seconds`, each
    on a new connection (the critical client's loop, without its
    header): {sent, answered, p50_ms, p99_ms}."""
    p, rx = _spawn(_critical_proc, (port, path, dict(headers or {}),
                                    1.0 / rate, seconds, timeout, cpus))
    got = _collect(p, rx, seconds + timeout + 10) or {}
    res = got.get("results", [])
    ok = [r[3] for r in res if r[1] == 200]
    return {"sent": got.get("started", 0), "answered": len(ok),
            "p50_ms": _ms(percentile(ok, 0.50)),
            "p99_ms": _ms(percentile(ok, 0.99))}
