#!/usr/bin/python3
"""soak.py -- `make soak`: hours under faults. What a real deployment
runs, loaded steadily for a configurable length while a fault is
injected every minute, sampled every 10 s; then judged (soak_report.py).

    /usr/bin/python3 bench/soak.py [--build DIR] [--minutes N] [--san]
                                   [--scale X] [--out DIR]

The deployment (all on 127.0.0.1, free ports, temp dirs under /tmp, each
process started and stopped by PID through tests/integration/tbtest):

  redis     one redis-server loading build/tbucket_redis.so; every
            limiter asks it with engine=module. No persistence, so a
            restart (same port, same directory) starts empty.
  replica a prefork + mod_php (12 children)        } behind one haproxy,
  replica b event (3 x 8 threads) + php-fpm (6)    } round robin, with
            health checks, retries and redispatch (HAPROXY_DEFAULTS)
  shim      tb_srv -H under build/libtbucket_preload.so, one inbound
            rule (20 at 10/s per peer address, action http429)

Both replicas carry SITE: many distinct keys on /api/, hot keys under a
lease on /hot/, probe keys on /probe/, a PHP page under a concurrency
limit and a local one on /app/, a PHP login under TBucketRule ip and user
(count=401, ban=, known=30d with TBucketSecret; logins, a guesser the ip
rule bans, slow uploads of the login form, stuffers on one name whose
owner logs in as a known client), local shedding by priority, the
failure policy local.
The load is soak_load.py (its own process).

Faults, one a minute from minute 1 in this order, again and again
(FAULTS): Redis kill -9, then restarted on the same port and directory
3 s later (empty); Redis SIGSTOP for 2 s; a graceful restart of replica
a in even rounds and of b in odd ones; a hard restart (stop, then start)
of replica a; a flood of 48 connections for 5 s on the PHP page with new
keys. No fault in the last 30 s. So replica b's parent lives through the
run (judged by its slope, as the shim's host is) and its children about
10 minutes (judged against the noise band, soak_report.judge_growth),
while replica a is restarted one way or the other every round.

Every 10 s (sample()): RSS (VmRSS, RssAnon, RssShmem) and open
descriptors of every Apache parent and child, Redis, tb_srv, haproxy and
php-fpm; the status page of each replica (shared-memory tables: local
fallback entries, leases, top keys, local scopes in flight, concurrency,
pool); Redis INFO (keys, memory, clients) and the keys the generator
expects alive; new error-log lines (TB tags by count, crash or sanitizer
lines). Every 60 s a SCAN + PTTL of every key, by class. Everything goes
to OUT (default build/results/soak[_san]/); soak_report.py reads it back,
writes the verdicts and the plot, and its exit code is this one's.
"""
import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "tests", "integration"))
sys.path.insert(0, HERE)

SAMPLE_EVERY = 10.0
SCAN_EVERY = 60.0
FAULT_EVERY = 60.0
FAULTS = ("redis_kill9", "redis_sigstop", "graceful", "hard_restart",
          "flood")
REDIS_DOWN_S = 3.0
REDIS_STOP_S = 2.0
BREAKER_COOLDOWN_S = 2.0
# After Redis answers again: the breaker's cooldown, then this margin
# before the fault's fallback period is declared over.
FALLBACK_MARGIN_S = 3.0


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--build", default=None)
    p.add_argument("--minutes", type=float, default=None)
    p.add_argument("--san", action="store_true",
                   help="the sanitizer build (build/san), 10 min default")
    p.add_argument("--scale", type=float, default=None,
                   help="load scale (1.0; 0.5 with --san)")
    p.add_argument("--out", default=None)
    a = p.parse_args()
    if a.build is None:
        a.build = os.path.join(ROOT, "build", "san" if a.san else "")
    a.build = os.path.abspath(a.build)
    if a.minutes is None:
        a.minutes = 10.0 if a.san else 30.0
    if a.scale is None:
        a.scale = 0.5 if a.san else 1.0
    if a.out is None:
        a.out = os.path.join(ROOT, "build", "results",
                             "soak_san" if a.san else "soak")
    return a


ARGS = parse_args()
# tbtest reads these when it is imported.
os.environ["TB_BUILD"] = ARGS.build
if ARGS.san:
    os.environ["TB_ASAN"] = "1"

from tbtest.apache import Apache, metric, metric_sum  # noqa: E402
from tbtest.env import child_pids, free_port, prog, stop_pid  # noqa: E402
from tbtest.php import ModPhp, PhpFpm, install_pages  # noqa: E402
from tbtest.proof import (CRASH_RE, HAProxy, read_timed,  # noqa: E402
                          timed_log_conf)
from tbtest.redismod import ModRedis, module_path  # noqa: E402
from tbtest.shim import (Proc, in_rule, inbound, shim_env,  # noqa: E402
                         write_conf)
import soak_load  # noqa: E402

L = soak_load.LIMITS

SITE = """
TBucketRedis redis://127.0.0.1:%(rport)d timeout=250 connect_timeout=250 \
    engine=module
TBucketFailurePolicy local
TBucketReplicas 2
TBucketBreaker threshold=3 cooldown=%(cooldown)ds
TBucketPrefix %(prefix)s
TBucketSecret %(secret)s
TBucketShed low=50 normal=75 high=90
RemoteIPHeader X-Forwarded-For
RemoteIPInternalProxy 127.0.0.1
%(timed)s
%(php)s
<Location /api/>
    TBucketEnable On
    TBucketKey "%%{HTTP:X-API-Key}"
    TBucketLimit %(api)s
    TBucketPriority low
</Location>
<Location /hot/>
    TBucketEnable On
    TBucketKey "%%{HTTP:X-API-Key}"
    TBucketLimit %(hot)s
    TBucketLease 20 ttl=1s
    TBucketPriority low
</Location>
<Location /probe/>
    TBucketEnable On
    TBucketKey "%%{HTTP:X-API-Key}"
    TBucketLimit %(probe)s
    TBucketPriority critical
</Location>
<Location /app/>
    TBucketEnable On
    TBucketKey "%%{HTTP:X-API-Key}"
    TBucketLimit %(app)s
    TBucketConcurrency %(conc)d ttl=%(conc_ttl)ds
    TBucketLocalConcurrency 6
    TBucketPriority normal
</Location>
<Location /login.php>
    TBucketEnable On
    TBucketRule ip   "%%{REMOTE_ADDR}" %(rule_ip)s count=401 ban=2m
    TBucketRule user "%%{FORM:log}" %(rule_user)s count=401 ban=1m \
        known=30d
    TBucketPriority high
</Location>
<Location /tbucket-status>
    SetHandler tbucket-status
</Location>
"""

LOGIN_PHP = r"""<?php
/* login.php: a legacy login, 200 for the right password, 401 else. */
$ok = isset($_POST['pwd']) && $_POST['pwd'] === 'right';
http_response_code($ok ? 200 : 401);
header('Content-Type: text/plain');
echo $ok ? "welcome\n" : "wrong password\n";
"""

# haproxy in front of the replicas: keep-alive both ways; a request whose
# connection fails, or whose server closes without an answer, is retried
# (L7 retries), on the other replica from the first retry; the first
# failed connection marks a replica down (observe layer4), so the next
# requests go to the other one at once, and a health check every second
# brings it back. With `retries 3`, `option redispatch 1` and health
# checks alone, a hard restart of a replica under load (wrk, 16
# connections, 6 rounds) ended hundreds of requests with haproxy's own
# 503: the retries all went to the dying replica, whose check had not
# yet failed; with these settings, none in 6 rounds.
HAPROXY_DEFAULTS = [
    "no option http-server-close",
    "option http-keep-alive",
    "timeout http-keep-alive 60s",
    "timeout client 60s",
    "timeout queue 30s",
    "option forwardfor",
    "retries 5",
    "option redispatch 1",
    "retry-on conn-failure empty-response junk-response",
    "option httpchk GET /ok.txt",
    "default-server inter 1s fall 2 rise 1 observe layer4 error-limit 1 "
    "on-error mark-down",
    "log global",
    "option httplog",
    "option dontlog-normal",
]
# Replica a (prefork, 12 children): 10 requests at once and at most one
# idle kept-alive connection, so a child is always free for the health
# check (an idle connection holds a prefork child; when haproxy's idle
# connections held them all, the check timed out and marked the replica
# down). Replica b (event, 24 threads): idle connections hold no thread.
SERVER_A = "check maxconn 8 pool-max-conn 1"
SERVER_B = "check maxconn 24"
# The slow uploads have a frontend and backend of their own (the same
# replicas, their state tracked from the web backend's checks, so no
# more checks; a's 10 places split 8 + 2 as before). haproxy forwards a
# slow body as it arrives, so it cannot resend one whose server
# connection closes under it. In the first two-hour run 5 uploads were
# lost that way to kept-alive server connections closed as the next
# request went out (the event MPM closes idle kept-alive connections
# when all its workers are busy, in a flood; a graceful restart closes
# them too). A new server connection per upload (http-server-close) is
# never an idle one. An upload in flight when its replica is stopped
# hard is still lost: soak_report.py counts those apart (at most one per
# upload worker and hard stop) and fails on any other loss.
UPLOAD_A = "track be_web/s0 maxconn 2"
UPLOAD_B = "track be_web/s1 maxconn 4"
UPLOAD_BACKEND = ["option http-server-close"]


def limit(name):
    cap, rate = L[name]
    return "%d %s" % (cap, ("%g/s" % rate) if rate >= 1
                      else "%g/m" % (rate * 60))


def site(rport, timed, php, secret):
    return SITE % {"secret": secret,
        "rport": rport, "cooldown": BREAKER_COOLDOWN_S,
        "prefix": soak_load.PREFIX, "timed": timed, "php": php,
        "api": limit("api"), "hot": limit("hot"), "probe": limit("probe"),
        "app": limit("app"), "conc": soak_load.APP_CONCURRENCY,
        "conc_ttl": soak_load.CONC_TTL, "rule_ip": limit("rule_ip"),
        "rule_user": limit("rule_user")}


def log(msg):
    sys.stderr.write("[soak %s] %s\n" % (time.strftime("%H:%M:%S"), msg))
    sys.stderr.flush()


class Rig:
    """Every server of the soak, started and stopped by PID."""

    def __init__(self, work):
        self.work = work
        self.redis = None
        self.a = self.b = self.fpm = self.haproxy = self.shim = None
        self.gen = None
        self.lock = threading.Lock()

    def start(self):
        # The key that signs known clients' cookies: one file for both
        # replicas, so a cookie one gave is known to the other.
        self.secret = os.path.join(self.work, "tbucket.secret")
        with open(os.open(self.secret, os.O_WRONLY | os.O_CREAT, 0o600),
                  "wb") as f:
            f.write(os.urandom(48))
        self.redis = ModRedis(os.path.join(self.work, "redis"),
                              module=module_path(ARGS.build),
                              extra=["maxclients 2000"]).start()
        self.a = Apache(mpm="prefork", servers=12, modules=["remoteip"])
        php = ModPhp(self.a)
        self._pages(self.a)
        self.a.start(site(self.redis.port, timed_log_conf(self.a),
                          php.conf(), self.secret))
        self.fpm = PhpFpm(children=6).start()
        self.b = Apache(mpm="event", servers=3,
                        modules=["remoteip"] + list(PhpFpm.MODULES))
        install_pages(self.b)
        self._pages(self.b)
        self.b.start(site(self.redis.port, timed_log_conf(self.b),
                          self.fpm.conf(), self.secret))
        self.haproxy = HAProxy(
            {"web": ("roundrobin", [
                ("127.0.0.1", self.a.port, SERVER_A),
                ("127.0.0.1", self.b.port, SERVER_B)]),
             "upload": ("roundrobin", [
                 ("127.0.0.1", self.a.port, UPLOAD_A),
                 ("127.0.0.1", self.b.port, UPLOAD_B)], UPLOAD_BACKEND)},
            global_=["log stdout format raw local0"],
            defaults=HAPROXY_DEFAULTS).start()
        self._start_shim()
        return self

    @staticmethod
    def _pages(a):
        a.write_file("htdocs/login.php", LOGIN_PHP)
        for d in ("hot", "probe"):
            a.write_file("htdocs/%s/ok.txt" % d, "ok\n")

    def _start_shim(self):
        d = os.path.join(self.work, "shim")
        os.makedirs(d, exist_ok=True)
        port = free_port()
        cap, rate = L["shim"]
        conf = write_conf(
            os.path.join(d, "shim.conf"), self.redis,
            inbound(in_rule(port, capacity=cap, rate="%g/s" % rate,
                            action="http429")),
            timeout_ms=250, connect_timeout_ms=250, engine="module",
            policy="local", breaker_threshold=3,
            breaker_cooldown_ms=int(BREAKER_COOLDOWN_S * 1000),
            prefix=soak_load.SHIM_PREFIX)
        self.shim_err = os.path.join(d, "stderr.log")
        with open(self.shim_err, "w") as err:
            self.shim = Proc([prog("tb_srv"), "-p", str(port), "-H"],
                             shim_env(conf), stderr=err)

    def apaches(self):
        return {"a": self.a, "b": self.b}

    def stop(self):
        """Stop everything we started, by PID, whatever failed before."""
        if self.gen is not None:
            stop_pid(self.gen, timeout=soak_load.REQUEST_TIMEOUT + 15)
        for name in ("shim", "haproxy", "b", "fpm", "a", "redis"):
            x = getattr(self, name)
            if x is None:
                continue
            try:
                x.stop()
            except Exception as e:  # the others still stop
                log("stopping %s: %r" % (name, e))


# ---- faults ----------------------------------------------------------------

class Faults(threading.Thread):
    """One fault a minute, in turn, recorded in faults.tsv: kind, target,
    start and end (wall seconds), and for Redis faults the end of the
    declared fallback period (Redis answering again, plus the breaker's
    cooldown and FALLBACK_MARGIN_S)."""

    def __init__(self, rig, t0, t_end, out):
        super().__init__(daemon=True)
        self.rig, self.t0, self.t_end = rig, t0, t_end
        self.stop_ev = threading.Event()
        self.f = open(os.path.join(out, "faults.tsv"), "w")
        self.f.write("kind\ttarget\tt_start\tt_end\tfallback_until\tnote\n")
        self.errors = []

    def run(self):
        n = 0
        while True:
            at = self.t0 + FAULT_EVERY * (n + 1)
            if at > self.t_end - 30 or self.stop_ev.wait(
                    max(0.0, at - time.time())):
                return
            kind = FAULTS[n % len(FAULTS)]
            rnd = n // len(FAULTS)
            try:
                self.inject(kind, rnd)
            except Exception as e:   # recorded; the soak goes on
                self.errors.append("%s: %r" % (kind, e))
                log("fault %s failed: %r" % (kind, e))
            n += 1

    def record(self, kind, target, t_start, t_end, fallback=None, note=""):
        self.f.write("%s\t%s\t%.3f\t%.3f\t%s\t%s\n" % (
            kind, target, t_start, t_end,
            "%.3f" % fallback if fallback else "", note))
        self.f.flush()
        log("fault %s %s: %.1f s %s" % (kind, target, t_end - t_start, note))

    def inject(self, kind, rnd):
        rig = self.rig
        t = time.time()
        if kind == "redis_kill9":
            with rig.lock:
                rig.redis.kill9()
            time.sleep(REDIS_DOWN_S)
            with rig.lock:
                rig.redis.start()
            t1 = time.time()
            self.record(kind, "redis", t, t1, t1 + BREAKER_COOLDOWN_S
                        + FALLBACK_MARGIN_S, "restarted empty")
        elif kind == "redis_sigstop":
            rig.redis.sigstop()
            time.sleep(REDIS_STOP_S)
            rig.redis.sigcont()
            t1 = time.time()
            self.record(kind, "redis", t, t1, t1 + BREAKER_COOLDOWN_S
                        + FALLBACK_MARGIN_S)
        elif kind == "graceful":
            name = "a" if rnd % 2 == 0 else "b"
            rig.apaches()[name].graceful()
            self.record(kind, name, t, time.time())
        elif kind == "hard_restart":
            with rig.lock:
                rig.a.stop()
                rig.a.start()
            self.record(kind, "a", t, time.time())
        elif kind == "flood":
            os.kill(rig.gen.pid, signal.SIGUSR1)
            time.sleep(soak_load.FLOOD_SECONDS)
            self.record(kind, "web", t, time.time())


# ---- sampling ---------------------------------------------------------------

def proc_info(pid):
    """(start, VmRSS, RssAnon, RssShmem in kB, open fds, CPU time) or
    None; start and CPU time (user + system) in clock ticks."""
    try:
        with open("/proc/%d/stat" % pid) as f:
            st = f.read().rsplit(")", 1)[1].split()
        start, cpu = int(st[19]), int(st[11]) + int(st[12])
        mem = {}
        with open("/proc/%d/status" % pid) as f:
            for line in f:
                if line.startswith(("VmRSS:", "RssAnon:", "RssShmem:")):
                    k, v = line.split(":", 1)
                    mem[k] = int(v.split()[0])
        fds = len(os.listdir("/proc/%d/fd" % pid))
    except (OSError, ValueError, IndexError):
        return None
    return (start, mem.get("VmRSS", 0), mem.get("RssAnon", 0),
            mem.get("RssShmem", 0), fds, cpu)


def roles(rig):
    """[(role, pid)] of every process to sample."""
    out = []
    for name, a in rig.apaches().items():
        p = a.proc
        if p is None or p.poll() is not None:
            continue
        out.append(("%s-parent" % name, p.pid))
        out += [("%s-child" % name, c) for c in child_pids(p.pid)]
    for role, p in (("redis", rig.redis.proc), ("shim", rig.shim.proc),
                    ("haproxy", rig.haproxy.proc), ("fpm-master",
                                                     rig.fpm.proc)):
        if p is not None and p.poll() is None:
            out.append((role, p.pid))
    out += [("fpm-worker", c) for c in rig.fpm.pids()[1:]]
    return out


STATUS_FIELDS = (
    ("local_entries", "tbucket_local_entries_used", False),
    ("local_entries_max", "tbucket_local_entries_max", False),
    ("lease_entries", "tbucket_lease_entries_used", False),
    ("top_counters", "tbucket_top_keys_counters", False),
    ("top_memory", "tbucket_top_keys_memory_bytes", False),
    ("local_in_flight", "tbucket_local_in_flight", True),
    ("conc_in_flight", "tbucket_concurrency_in_flight", True),
    ("pool_open", "tbucket_pool_connections_open", True),
    ("workers_busy", "tbucket_workers_busy", True),
    ("fallback_total", "tbucket_fallback_decisions_total", True),
)


def status_page(a):
    """The figures of STATUS_FIELDS from a replica's status page, plus
    the number of top-key series; {} when it does not answer."""
    try:
        with urllib.request.urlopen(a.url("/tbucket-status"),
                                    timeout=3) as r:
            text = r.read().decode(errors="replace")
    except Exception:
        return {}
    out = {}
    for name, fam, summed in STATUS_FIELDS:
        out[name] = metric_sum(text, fam) if summed else metric(text, fam)
    out["top_series"] = sum(1 for line in text.splitlines()
                            if line.startswith("tbucket_top_key_refusals{"))
    return out


def redis_info(rig, section=None):
    """Keys, memory, clients and uptime from INFO; {} when Redis fails."""
    try:
        with rig.lock:
            c = rig.redis.client(socket_timeout=2)
        info = c.info(section) if section else c.info()
        if section:
            info.update(c.info("server"))
    except Exception:
        return {}
    db = info.get("db0", {})
    return {"keys": db.get("keys", 0), "expires": db.get("expires", 0),
            "used_memory": info.get("used_memory"),
            "used_memory_startup": info.get("used_memory_startup"),
            "uptime": info.get("uptime_in_seconds"),
            "clients": info.get("connected_clients")}


# Redis keys by class: (class, pattern, the longest TTL in s a write
# gives it, the generator's kind of key, soak_load.KEYS). A rule's ban
# (ban=2m, ban=1m) is shorter than its bucket's TTL here.
KEY_CLASSES = (
    ("api", re.compile(r"^sk:\{d\d+\}$"), soak_load.ttl("api"), "api"),
    ("hot", re.compile(r"^sk:\{hot\d+\}$"), soak_load.ttl("hot"), "hot"),
    ("probe", re.compile(r"^sk:\{probe\d+\}$"), soak_load.ttl("probe"),
     "probe"),
    ("app", re.compile(r"^sk:\{(app\d+|greedy|f\d+)\}$"),
     soak_load.ttl("app"), "app"),
    ("conc", re.compile(r"^sk:\{[^}]*\}:conc$"), soak_load.CONC_TTL,
     "app"),
    ("rule_ip", re.compile(r"^sk:\{[^}]*\}:rule:ip$"),
     soak_load.ttl("rule_ip"), "login"),
    ("rule_user", re.compile(r"^sk:\{[^}]*\}:rule:user$"),
     soak_load.ttl("rule_user"), "login"),
    ("shim", re.compile(r"^sk:shim:"), soak_load.ttl("shim"), "shim"),
    # The index of bans (tbucket bans), as long as the longest ban.
    ("bans", re.compile(r"^sk:bans$"), 120, ""),
    # smoke(): the key "smoke" on /api/, /probe/ and /app/.
    ("smoke", re.compile(r"^sk:\{smoke\}"), soak_load.ttl("api"), ""),
)


def scan_keys(rig):
    """Every key by class (KEY_CLASSES, else "other"): count, the largest
    PTTL in seconds, how many have no TTL, and the key of the largest
    PTTL. None when Redis fails."""
    try:
        with rig.lock:
            c = rig.redis.client(socket_timeout=10)
        by = {}
        batch = []

        def flush():
            ttls = c.pipeline(transaction=False)
            for k in batch:
                ttls.pttl(k)
            for k, ms in zip(batch, ttls.execute()):
                name = next((c[0] for c in KEY_CLASSES
                             if c[1].match(k)), "other")
                d = by.setdefault(name, [0, -1.0, 0, k])
                d[0] += 1
                if ms == -1:
                    d[2] += 1
                if ms / 1000.0 > d[1]:
                    d[1], d[3] = ms / 1000.0, k
            del batch[:]

        for k in c.scan_iter(count=1000):
            batch.append(k.decode(errors="replace"))
            if len(batch) >= 1000:
                flush()
        flush()
        return by
    except Exception:
        return None


class LogTail:
    """New lines of a file that only grows (an error log, stderr)."""

    def __init__(self, path):
        self.path, self.pos = path, 0

    def lines(self):
        try:
            with open(self.path, errors="replace") as f:
                f.seek(self.pos)
                text = f.read()
                self.pos = f.tell()
        except FileNotFoundError:
            return []
        return text.splitlines()


TAG_RE = re.compile(r"\b(TB\d{5}|AH\d{5})\b")
MAIN_COLS = (["t", "wall", "load1", "cpus_busy", "redis_up", "redis_keys",
              "redis_expires", "expected_keys", "redis_used_memory",
              "redis_clients"]
             + ["%s_%s" % (r, f[0]) for r in "ab" for f in STATUS_FIELDS]
             + ["a_top_series", "b_top_series", "req_per_s",
                "lost_total", "crash_lines", "tb_tags"])


class Sampler:
    """The 10-s samples (soak.tsv, procs.tsv), the 60-s key scans
    (scan.tsv), error-log tags (tags.json) and crash lines (crash.txt)."""

    def __init__(self, rig, t0, out):
        self.rig, self.t0, self.out = rig, t0, out
        self.main = open(os.path.join(out, "soak.tsv"), "w")
        self.main.write("\t".join(MAIN_COLS) + "\n")
        self.procs = open(os.path.join(out, "procs.tsv"), "w")
        self.procs.write("t\trole\tpid\tstart\trss_kb\tanon_kb\tshmem_kb"
                         "\tfds\tcpu_ticks\n")
        self.scan = open(os.path.join(out, "scan.tsv"), "w")
        self.scan.write("t\tclass\tkeys\tmax_pttl_s\tno_ttl\tttl_s\tkind"
                        "\texample\n")
        self.tails = {n: LogTail(a.error_log)
                      for n, a in rig.apaches().items()}
        self.tails["a-stderr"] = LogTail(os.path.join(rig.a.root, "logs",
                                                      "stderr.log"))
        self.tails["b-stderr"] = LogTail(os.path.join(rig.b.root, "logs",
                                                      "stderr.log"))
        self.tails["shim"] = LogTail(rig.shim_err)
        self.tails["redis"] = LogTail(os.path.join(rig.redis.dir,
                                                   "redis.log"))
        self.tags = {}
        self.crash = []
        self.last_scan = 0.0
        self.cpu_last = None

    def cpus_busy(self):
        """CPUs busy since the last sample, over the whole machine (other
        work included), from /proc/stat."""
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:]]
        idle, total = v[3] + v[4], sum(v[:8])
        last, self.cpu_last = self.cpu_last, (idle, total)
        if last is None or total == last[1]:
            return ""
        return "%.2f" % ((1 - (idle - last[0]) / (total - last[1]))
                         * (os.cpu_count() or 1))

    def logs(self):
        for name, tail in self.tails.items():
            for line in tail.lines():
                for tag in TAG_RE.findall(line):
                    key = "%s %s" % (name[0], tag)
                    self.tags[key] = self.tags.get(key, 0) + 1
                if CRASH_RE.search(line) or (
                        name == "redis" and ("crashed by signal" in line
                                             or "BUG REPORT" in line)):
                    self.crash.append("%s: %s" % (name, line))

    def active(self):
        """The generator's last figures of keys alive ({} if none)."""
        try:
            with open(os.path.join(self.out, "gen", "active")) as f:
                return json.load(f)
        except (OSError, ValueError):
            return {}

    def gen_figures(self):
        """(expected alive keys, requests/s of the last stats line, lost
        so far) from the generator's files."""
        gdir = os.path.join(self.out, "gen")
        expected = self.active().get("total", "")
        rate, lost = "", 0
        try:
            with open(os.path.join(gdir, "stats.jsonl")) as f:
                lines = f.read().splitlines()
            for line in lines:
                d = json.loads(line)
                lost += sum(sum(c["lost"].values())
                            for c in d["classes"].values())
            if lines:
                d = json.loads(lines[-1])
                rate = round(sum(c["sent"] for c in d["classes"].values())
                             / soak_load.STATS_EVERY, 1)
        except (OSError, ValueError):
            pass
        return expected, rate, lost

    def sample(self):
        now = time.time()
        t = round(now - self.t0, 1)
        for role, pid in roles(self.rig):
            info = proc_info(pid)
            if info:
                self.procs.write("%s\t%s\t%d\t%d\t%d\t%d\t%d\t%d\t%d\n" % (
                    (t, role, pid) + info))
        self.procs.flush()
        ri = redis_info(self.rig)
        st = {n: status_page(a) for n, a in self.rig.apaches().items()}
        self.logs()
        expected, rate, lost = self.gen_figures()
        row = [t, "%.3f" % now, "%.2f" % os.getloadavg()[0],
               self.cpus_busy(), 1 if ri else 0, ri.get("keys", ""),
               ri.get("expires", ""),
               expected, ri.get("used_memory", ""), ri.get("clients", "")]
        for r in "ab":
            row += [st[r].get(f[0], "") for f in STATUS_FIELDS]
        row += [st["a"].get("top_series", ""), st["b"].get("top_series", ""),
                rate, lost, len(self.crash),
                sum(v for k, v in self.tags.items() if " TB" in k)]
        self.main.write("\t".join(str(x) for x in row) + "\n")
        self.main.flush()
        if now - self.last_scan >= SCAN_EVERY:
            self.last_scan = now
            self.scan_once(t)

    def scan_once(self, t):
        """One SCAN + PTTL: per class of key, the keys, the largest PTTL,
        those without a TTL, the class's TTL, and the keys the generator
        expects alive of its kind (KEY_CLASSES), read just before."""
        act = self.active().get("by", {})
        by = scan_keys(self.rig)
        mem = redis_info(self.rig, "memory")
        if by is None:
            self.scan.write("%s\tERROR\t\t\t\t\t\t\n" % t)
            self.scan.flush()
            return
        meta = {n: (ttl, kind) for n, _, ttl, kind in KEY_CLASSES}
        for name, (n, mx, nottl, example) in sorted(by.items()):
            ttl, kind = meta.get(name, ("", ""))
            self.scan.write("%s\t%s\t%d\t%.3f\t%d\t%s\t%s\t%s\n" % (
                t, name, n, mx, nottl, ttl, kind, example))
        for kind, n in sorted(act.items()):
            self.scan.write("%s\texpected:%s\t%d\t\t\t\t%s\t\n" % (
                t, kind, n, kind))
        if mem.get("used_memory"):
            # Redis's own accounting of what it holds beyond what it
            # started with, and how long this Redis has run.
            self.scan.write("%s\tmemory:used\t%d\t%s\t\t\t\t\n" % (
                t, mem["used_memory"] - mem["used_memory_startup"],
                mem["uptime"]))
        self.scan.flush()

    def close(self):
        self.logs()
        with open(os.path.join(self.out, "tags.json"), "w") as f:
            json.dump(self.tags, f, indent=1, sort_keys=True)
        with open(os.path.join(self.out, "crash.txt"), "w") as f:
            f.write("\n".join(self.crash) + ("\n" if self.crash else ""))
        for f in (self.main, self.procs, self.scan):
            f.close()


# ---- the run ----------------------------------------------------------------

def smoke(rig):
    """One request of each kind before the load: the rig answers as
    configured (else the soak would measure a broken deployment)."""
    web = "http://127.0.0.1:%d" % rig.haproxy.ports["web"]
    checks = [
        ("GET", web + "/api/ok.txt", {"X-API-Key": "smoke"}, None, 200),
        ("GET", web + "/probe/ok.txt", {"X-API-Key": "smoke"}, None, 200),
        ("GET", web + "/app/heavy.php?rows=5", {"X-API-Key": "smoke"},
         None, 200),
        ("POST", web + "/login.php", {"X-API-Key": "smoke"},
         b"log=smoke&pwd=right", 200),
        ("GET", "http://127.0.0.1:%d/" % rig.shim.port, {}, None, 200),
    ]
    for method, url, headers, body, want in checks * 2:  # both replicas
        req = urllib.request.Request(url, data=body, headers=headers,
                                     method=method)
        try:
            with urllib.request.urlopen(req, timeout=10) as r:
                got = r.status
        except urllib.error.HTTPError as e:
            got = e.code
        if got != want:
            raise RuntimeError("smoke: %s %s gave %s, not %s" % (
                method, url, got, want))
    calls = rig.redis.client().info("commandstats")
    if not any(k.startswith("cmdstat_tbucket.") for k in calls):
        raise RuntimeError("smoke: no tbucket.* command reached Redis "
                           "(engine=module): %s" % sorted(calls))


def start_gen(rig, out, seconds):
    gdir = os.path.join(out, "gen")
    os.makedirs(gdir, exist_ok=True)
    cfg = {"web_port": rig.haproxy.ports["web"],
           "upload_port": rig.haproxy.ports["upload"], "shim_port": rig.shim.port,
           "seconds": seconds, "scale": ARGS.scale, "out": gdir, "seed": 1}
    path = os.path.join(gdir, "config.json")
    with open(path, "w") as f:
        json.dump(cfg, f)
    err = open(os.path.join(gdir, "stderr.log"), "w")
    rig.gen = subprocess.Popen(["/usr/bin/python3",
                                os.path.join(HERE, "soak_load.py"), path],
                               stdout=err, stderr=err)
    err.close()


def probe_records(rig, out):
    """The probe keys' requests as the replicas logged them (server time,
    status, decision) into probes_http.tsv."""
    with open(os.path.join(out, "probes_http.tsv"), "w") as f:
        f.write("usec\tstatus\tdecision\tkey\treplica\n")
        for name, a in rig.apaches().items():
            for rec in read_timed(a):
                if rec[3].startswith("probe"):
                    f.write("%d\t%d\t%s\t%s\t%s\n" % (rec[:4] + (name,)))


def finish(rig, out, sampler, faults):
    """After the load: what lived, what the sanitizers said, the logs."""
    from tbtest.redismod import sanitizer_reports
    alive = {"shim": rig.shim.proc.poll() is None,
             "haproxy": rig.haproxy.proc.poll() is None,
             "a-parent": rig.a.proc.poll() is None,
             "b-parent": rig.b.proc is not None and rig.b.proc.poll() is None,
             "redis": rig.redis.proc.poll() is None,
             "fpm": rig.fpm.proc.poll() is None,
             "gen_rc": rig.gen.returncode,
             "fault_errors": faults.errors}
    with open(os.path.join(out, "alive.json"), "w") as f:
        json.dump(alive, f, indent=1)
    reports = sanitizer_reports(rig.redis.dir)
    with open(os.path.join(out, "crash.txt"), "a") as f:
        for r in reports:
            f.write("redis sanitizer report: %s\n" % r[:2000])
    probe_records(rig, out)
    logs = os.path.join(out, "logs")
    os.makedirs(logs, exist_ok=True)
    for name, path in (("a-error.log", rig.a.error_log),
                       ("b-error.log", rig.b.error_log),
                       ("haproxy.log", os.path.join(rig.haproxy.dir,
                                                    "haproxy.log")),
                       ("redis.log", os.path.join(rig.redis.dir,
                                                  "redis.log")),
                       ("shim-stderr.log", rig.shim_err)):
        if os.path.exists(path):
            shutil.copy(path, os.path.join(logs, name))


def run(rig, out):
    seconds = ARGS.minutes * 60
    warmup = min(300.0, seconds / 6)
    meta = {"minutes": ARGS.minutes, "san": ARGS.san, "scale": ARGS.scale,
            "build": ARGS.build, "warmup_s": warmup, "nproc": os.cpu_count(),
            "load_start": os.getloadavg(), "limits": L,
            "classes": soak_load.CLASSES, "faults": FAULTS,
            "breaker_cooldown_s": BREAKER_COOLDOWN_S,
            "fallback_margin_s": FALLBACK_MARGIN_S,
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    t0 = time.time()
    meta["t0"] = t0
    start_gen(rig, out, seconds)
    sampler = Sampler(rig, t0, out)
    faults = Faults(rig, t0, t0 + seconds, out)
    faults.start()
    n = 0
    try:
        while time.time() < t0 + seconds:
            sampler.sample()
            if rig.gen.poll() is not None:
                raise RuntimeError("the load generator exited %d: see %s"
                                   % (rig.gen.returncode, out + "/gen"))
            n += 1
            time.sleep(max(0.0, t0 + n * SAMPLE_EVERY - time.time()))
    finally:
        faults.stop_ev.set()
        faults.join(timeout=60)
        try:
            rig.gen.wait(timeout=soak_load.REQUEST_TIMEOUT + 30)
        except subprocess.TimeoutExpired:
            stop_pid(rig.gen)
        sampler.sample()
        meta["t_end"] = time.time()
        meta["load_end"] = os.getloadavg()
        with open(os.path.join(out, "meta.json"), "w") as f:
            json.dump(meta, f, indent=1)
        sampler.close()
        faults.f.close()
        finish(rig, out, sampler, faults)


def main():
    out = ARGS.out
    shutil.rmtree(out, ignore_errors=True)
    os.makedirs(out)
    work = tempfile.mkdtemp(prefix="tb-soak-", dir="/tmp")
    os.chmod(work, 0o755)
    rig = Rig(work)
    log("%s minutes, scale %g, build %s, out %s" % (
        ARGS.minutes, ARGS.scale, ARGS.build, out))
    try:
        rig.start()
        smoke(rig)
        log("rig up: haproxy %d, replicas %d (prefork) %d (event), redis "
            "%d, shim %d" % (rig.haproxy.ports["web"], rig.a.port,
                             rig.b.port, rig.redis.port, rig.shim.port))
        run(rig, out)
    finally:
        rig.stop()
        for x in (rig.a, rig.b, rig.fpm):
            if x is not None:
                shutil.rmtree(x.root, ignore_errors=True)
        if rig.haproxy is not None:
            shutil.rmtree(rig.haproxy.dir, ignore_errors=True)
        shutil.rmtree(work, ignore_errors=True)
    import soak_report
    return soak_report.main([out])


if __name__ == "__main__":
    sys.exit(main())
