#!/usr/bin/env python3
"""demo_replicas.py -- `make demo-replicas`: the design's claim, on loopback.

Starts one redis-server, three Apache replicas with mod_tbucket and
haproxy (round robin) in front of them, all on free 127.0.0.1 ports in a
temp dir. One client sends a bounded, paced load through haproxy with one
API key; the script prints, per replica and in total, how many requests
were allowed and rejected, against what the configured limit allows
(capacity + rate x elapsed). Then it stops Redis and sends the same load
again, so the declared failure policy (local: each replica allows
limit/3) answers instead. A PNG of both phases is written when
python3-matplotlib is installed.

Every process is started by this script and stopped by its PID, also on
Ctrl-C or an error.

    python3 tools/demo_replicas.py [--build DIR] [--seconds S] [--pace N]
                                   [--capacity N] [--rate R] [--png FILE]
"""
import argparse
import http.client
import os
import shutil
import subprocess
import sys
import tempfile
import time

TOP = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Ports, processes by PID and Apache's command line and server root: the
# integration tests' helpers.
sys.path.insert(0, os.path.join(TOP, "tests", "integration"))
from tbtest.apache import (APACHE, apache2_argv,  # noqa: E402
                           server_root_conf)
from tbtest.env import free_port, stop_pid, wait_port  # noqa: E402

HAPROXY = "/usr/sbin/haproxy"
REDIS = "/usr/bin/redis-server"
MODDIR = "/usr/lib/apache2/modules"
REPLICAS = ("web1", "web2", "web3")
KEY = "demo-client"


def need(path, package):
    if not os.path.exists(path):
        sys.exit("demo-replicas: %s is missing: apt-get install %s"
                 % (path, package))


class Procs:
    """The processes we started, stopped by PID in reverse order."""

    def __init__(self):
        self.procs = []

    def start(self, name, argv, log, port):
        out = open(log, "ab")
        p = subprocess.Popen(argv, stdout=out, stderr=out,
                             stdin=subprocess.DEVNULL)
        out.close()
        self.procs.append((name, p))
        if not wait_port(port, 15):
            with open(log, errors="replace") as f:
                tail = f.read()[-2000:]
            raise RuntimeError("%s did not listen on %d:\n%s"
                               % (name, port, tail))
        return p

    def stop(self, p):
        stop_pid(p, timeout=15)

    def stop_all(self):
        for _, p in reversed(self.procs):
            self.stop(p)


def apache_conf(root, name, port, redis_port, so, capacity, rate):
    return """{head}
LoadModule mpm_event_module {mods}/mod_mpm_event.so
LoadModule authz_core_module {mods}/mod_authz_core.so
LoadModule mime_module {mods}/mod_mime.so
LoadModule tbucket_module {so}
TypesConfig /etc/mime.types
StartServers 1
ServerLimit 2
ThreadsPerChild 8
ThreadLimit 8
MinSpareThreads 8
MaxSpareThreads 16
MaxRequestWorkers 16
DocumentRoot "{root}/htdocs"
<Directory />
    Require all granted
</Directory>

# One Redis for every replica. When it stops answering, the breaker opens
# after 3 failures and each replica decides on limit/3 by itself.
TBucketRedis redis://127.0.0.1:{redis_port} timeout=50 connect_timeout=50
TBucketFailurePolicy local
TBucketReplicas 3
TBucketBreaker threshold=3 cooldown=60s
TBucketPrefix demo:

TBucketEnable On
TBucketKey "%{{HTTP:X-API-Key}}"
TBucketLimit {capacity} {rate}
LogFormat "%>s %{{TBUCKET_DECISION}}e" decision
CustomLog {root}/logs/access.log decision
""".format(head=server_root_conf(root, port, "warn tbucket:info"),
           root=root, redis_port=redis_port, so=so, mods=MODDIR,
           capacity=capacity, rate=rate)


def haproxy_conf(port, backends):
    lines = ["global", "    maxconn 512",
             "defaults", "    mode http", "    option http-server-close",
             "    timeout connect 2s", "    timeout client 10s",
             "    timeout server 10s",
             "frontend web", "    bind 127.0.0.1:%d" % port,
             "    default_backend replicas",
             "backend replicas", "    balance roundrobin",
             # The module answers a 429 itself, before mod_headers could
             # add anything: haproxy names the replica instead.
             "    http-response set-header X-Replica %s"]
    for name, p in backends:
        lines.append("    server %s 127.0.0.1:%d" % (name, p))
    return "\n".join(lines) + "\n"


def rate_per_sec(text):
    num, _, unit = text.partition("/")
    return float(num) / {"": 1, "s": 1, "m": 60, "h": 3600}[unit]


def load(port, seconds, pace):
    """One client, `pace` requests per second for `seconds`, each on a
    new connection so that haproxy spreads them. Returns a list of
    (t, replica, status, decision)."""
    n = int(seconds * pace)
    out = []
    t0 = time.monotonic()
    for i in range(n):
        due = t0 + i / pace
        now = time.monotonic()
        if due > now:
            time.sleep(due - now)
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        try:
            c.request("GET", "/api/ok.txt", headers={"X-API-Key": KEY})
            r = c.getresponse()
            r.read()
            out.append((time.monotonic() - t0, r.getheader("X-Replica", "?"),
                        r.status))
        except OSError:
            out.append((time.monotonic() - t0, "?", 0))
        finally:
            c.close()
    return out, time.monotonic() - t0


def access_log(top, name):
    return os.path.join(top, name, "logs", "access.log")


def log_sizes(top):
    """Where each replica's access log ends now: a phase reads on from
    there."""
    out = {}
    for name in REPLICAS:
        try:
            out[name] = os.path.getsize(access_log(top, name))
        except OSError:
            out[name] = 0
    return out


def decisions(top, since):
    """{replica: {TBUCKET_DECISION: count}} from the access logs, which
    Apache writes for the module's own 429 responses too."""
    out = {}
    for name in REPLICAS:
        kinds = {}
        with open(access_log(top, name), errors="replace") as f:
            f.seek(since[name])
            for line in f:
                parts = line.split()
                if len(parts) == 2:
                    kinds[parts[1]] = kinds.get(parts[1], 0) + 1
        out[name] = kinds
    return out


def report(title, rows, elapsed, capacity, rate, kinds):
    print("\n%s: %d requests in %.1f s" % (title, len(rows), elapsed))
    print("  %-8s %8s %9s   %s" % ("replica", "allowed", "rejected",
                                   "TBUCKET_DECISION"))
    total_ok = total_no = 0
    for name in REPLICAS:
        mine = [r for r in rows if r[1] == name]
        ok = sum(1 for r in mine if r[2] == 200)
        no = sum(1 for r in mine if r[2] == 429)
        total_ok += ok
        total_no += no
        print("  %-8s %8d %9d   %s" % (name, ok, no, ", ".join(
            "%s %d" % kv for kv in sorted(kinds[name].items()))))
    lost = sum(1 for r in rows if r[2] not in (200, 429))
    if lost:
        print("  %-8s %8s %9s   %d failed or other status" % ("-", "", "",
                                                               lost))
    limit = capacity + rate * elapsed
    print("  %-8s %8d %9d   limit: %g + %g/s x %.1f s = %d" % (
        "total", total_ok, total_no, capacity, rate, elapsed, int(limit)))
    return total_ok, total_no, limit


def plot(path, phases, capacity, rate):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("\n(no PNG: apt-get install python3-matplotlib)")
        return
    fig, axes = plt.subplots(1, len(phases), figsize=(6 * len(phases), 4),
                             squeeze=False)
    for ax, (title, rows, elapsed) in zip(axes[0], phases):
        ts = [0.0]
        for name in REPLICAS:
            xs, ys, n = [0.0], [0], 0
            for t, rep, status in rows:
                if rep == name and status == 200:
                    n += 1
                    xs.append(t)
                    ys.append(n)
            ax.step(xs, ys, where="post", label="allowed by %s" % name)
        xs, ys, n = [0.0], [0], 0
        for t, _, status in rows:
            if status == 200:
                n += 1
                xs.append(t)
                ys.append(n)
        ax.step(xs, ys, where="post", color="black", linewidth=2,
                label="allowed, total")
        ts = [i * elapsed / 50 for i in range(51)]
        ax.plot(ts, [capacity + rate * t for t in ts], "r--",
                label="limit: capacity + rate x t")
        ax.set_title(title)
        ax.set_xlabel("seconds")
        ax.set_ylabel("requests allowed")
        ax.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    print("\nplot: %s" % path)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default=os.path.join(TOP, "build"))
    ap.add_argument("--seconds", type=float, default=6.0)
    ap.add_argument("--pace", type=float, default=40.0,
                    help="requests per second from the one client")
    ap.add_argument("--capacity", type=int, default=20)
    ap.add_argument("--rate", default="5/s")
    ap.add_argument("--png", default=None)
    a = ap.parse_args()
    if not (0 < a.seconds <= 60 and 0 < a.pace <= 500):
        sys.exit("demo-replicas: --seconds 0..60 and --pace 0..500")
    so = os.path.join(a.build, "mod_tbucket.so")
    need(so, "(run make)")
    need(APACHE, "apache2")
    need(HAPROXY, "haproxy")
    need(REDIS, "redis-server")
    rate = rate_per_sec(a.rate)
    png = a.png or os.path.join(a.build, "demo-replicas.png")

    top = tempfile.mkdtemp(prefix="tbdemo-", dir="/tmp")
    os.chmod(top, 0o755)
    procs = Procs()
    try:
        redis_port = free_port()
        rdir = os.path.join(top, "redis")
        os.makedirs(rdir)
        redis = procs.start("redis-server", [
            REDIS, "--bind", "127.0.0.1", "--port", str(redis_port),
            "--dir", rdir, "--save", "", "--appendonly", "no"],
            os.path.join(rdir, "redis.log"), redis_port)
        backends = []
        for name in REPLICAS:
            root = os.path.join(top, name)
            for d in ("run", "logs", "htdocs/api"):
                os.makedirs(os.path.join(root, d))
            for d, _, _ in os.walk(root):
                os.chmod(d, 0o755)
            with open(os.path.join(root, "htdocs/api/ok.txt"), "w") as f:
                f.write("ok\n")
            os.chmod(os.path.join(root, "htdocs/api/ok.txt"), 0o644)
            port = free_port()
            conf = os.path.join(root, "httpd.conf")
            with open(conf, "w") as f:
                f.write(apache_conf(root, name, port, redis_port, so,
                                    a.capacity, a.rate))
            # setsid: prefork/event signal their whole process group on
            # shutdown, which must not include this script.
            procs.start(name, ["setsid"] + apache2_argv(so, "-f", conf,
                                                        "-DFOREGROUND"),
                        os.path.join(root, "logs", "stderr.log"), port)
            backends.append((name, port))
        hport = free_port()
        hconf = os.path.join(top, "haproxy.cfg")
        with open(hconf, "w") as f:
            f.write(haproxy_conf(hport, backends))
        procs.start("haproxy", [HAPROXY, "-db", "-f", hconf],
                    os.path.join(top, "haproxy.log"), hport)

        print("mod_tbucket demo: 3 Apache replicas behind haproxy "
              "(round robin), one Redis, one client")
        print("limit: TBucketLimit %d %s, key X-API-Key: %s; "
              "TBucketFailurePolicy local, TBucketReplicas 3"
              % (a.capacity, a.rate, KEY))
        print("load: %g requests/s for %g s per phase, through haproxy on "
              "127.0.0.1:%d" % (a.pace, a.seconds, hport))

        since = log_sizes(top)
        rows1, el1 = load(hport, a.seconds, a.pace)
        ok1, _, lim1 = report("phase 1, Redis up", rows1, el1, a.capacity,
                              rate, decisions(top, since))
        procs.stop(redis)
        print("\nredis-server stopped (pid %d)" % redis.pid)
        since = log_sizes(top)
        rows2, el2 = load(hport, a.seconds, a.pace)
        ok2, _, lim2 = report("phase 2, Redis down: policy local, "
                              "limit/3 per replica", rows2, el2,
                              a.capacity, rate, decisions(top, since))
        print("\nphase 1 allowed %d of a limit of %d: one shared bucket, "
              "whichever replica answers." % (ok1, int(lim1)))
        print("phase 2 allowed %d of a limit of %d: each replica on "
              "limit/3 of its own." % (ok2, int(lim2)))
        plot(png, [("Redis up (shared bucket)", rows1, el1),
                   ("Redis down (local, limit/3 each)", rows2, el2)],
             a.capacity, rate)
        return 0
    except KeyboardInterrupt:
        return 130
    finally:
        procs.stop_all()
        shutil.rmtree(top, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
