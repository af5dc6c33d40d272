"""tbtest/proof.py -- helpers for the proof tests: haproxy in front of
several Apaches, wrk load, access-log windows, Redis connection counts, the
ideal token bucket the measured counts are held against.

Reuses tbtest.apache.Apache (server roots, start/stop by PID) and
tbtest.env.Redis; adds only what those lack. The `haproxy_factory` fixture
(conftest.py) is built on HAProxy. Every process started here is stopped by
PID; every wait is bounded; everything listens on 127.0.0.1.
"""
import os
import re
import signal
import socket
import subprocess
import tempfile
import threading
import time

from tbtest.env import BUILD, free_port, require, stop_pid, wait_port
from tbtest.load import http_head

HAPROXY = "/usr/sbin/haproxy"
WRK = "/usr/bin/wrk"
# Each run writes its figures under the build dir, never into the tree;
# tests/results/ keeps the snapshot quoted in the README.
RESULTS = os.environ.get("TB_RESULTS", os.path.join(BUILD, "results"))

# Appended to an Apache config: a second access log with the request
# time in microseconds, status, decision and client key, and the decision
# as a response header (for clients that only see HTTP).
TIMED_LOG = """
LogFormat "%%{usec}t %%>s %%{TBUCKET_DECISION}e %%{X-API-Key}i %%P %%D" tbt
CustomLog %s tbt
Header always set X-TB-Decision "%%{TBUCKET_DECISION}e"
"""


def timed_log_conf(apache):
    apache.timed_log = os.path.join(apache.root, "logs", "timed.log")
    return TIMED_LOG % apache.timed_log


def read_timed(apache, key=None):
    """[(usec, status, decision, key, pid, duration usec)] from the timed
    access log: usec is when the request arrived, and its decision was
    made before usec + duration."""
    out = []
    try:
        with open(apache.timed_log, errors="replace") as f:
            for line in f:
                p = line.split()
                if len(p) < 5:
                    continue
                if key is not None and p[3] != key:
                    continue
                out.append((int(p[0]), int(p[1]), p[2], p[3], int(p[4]),
                            int(p[5]) if len(p) > 5 else 0))
    except FileNotFoundError:
        pass
    return out


def decision_span(recs):
    """Seconds from the first arrival to the end of the last request of
    read_timed() records: every decision was made inside it. A limit
    bound over the arrivals' span alone fails when the machine delays
    the first decisions (a busy runner): they fall after their arrival,
    and the bucket refilled meanwhile."""
    return (max(r[0] + r[5] for r in recs) - min(r[0] for r in recs)) / 1e6


class HAProxy:
    """haproxy -db (foreground) with generated frontends, stopped by PID.

    frontends: {name: (balance, [(host, port), ...][, [line, ...]])};
    each gets a free loopback port, available as .ports[name], and the
    optional third element is more lines for its backend (an option only
    that backend needs). A server may be a triple
    (host, port, options): options are appended to its server line
    ("check maxconn 12"). global_ and defaults are more lines for those
    sections, after ours, so they may override them ("no option
    http-server-close", "retries 3")."""

    def __init__(self, frontends, global_=(), defaults=()):
        require(HAPROXY, "haproxy")
        self.dir = tempfile.mkdtemp(prefix="tbh-", dir="/tmp")
        self.cfg = os.path.join(self.dir, "haproxy.cfg")
        self.ports = {}
        lines = [
            "global",
            "    maxconn 4096",
        ] + ["    " + g for g in global_] + [
            "defaults",
            "    mode http",
            "    timeout connect 2s",
            "    timeout client 30s",
            "    timeout server 30s",
            "    option http-server-close",
        ] + ["    " + d for d in defaults]
        for name, spec in frontends.items():
            balance, servers = spec[0], spec[1]
            port = free_port()
            self.ports[name] = port
            lines += [
                "frontend fe_%s" % name,
                "    bind 127.0.0.1:%d" % port,
                "    default_backend be_%s" % name,
                "backend be_%s" % name,
                "    balance %s" % balance,
            ] + ["    " + x for x in (spec[2] if len(spec) > 2 else ())]
            for i, srv in enumerate(servers):
                line = "    server s%d %s:%d" % (i, srv[0], srv[1])
                if len(srv) > 2 and srv[2]:
                    line += " " + srv[2]
                lines.append(line)
        with open(self.cfg, "w") as f:
            f.write("\n".join(lines) + "\n")
        self.proc = None

    def start(self):
        chk = subprocess.run([HAPROXY, "-c", "-f", self.cfg],
                             capture_output=True, text=True, timeout=30)
        assert chk.returncode == 0, chk.stdout + chk.stderr
        self.log = open(os.path.join(self.dir, "haproxy.log"), "wb")
        self.proc = subprocess.Popen([HAPROXY, "-db", "-f", self.cfg],
                                     stdout=self.log, stderr=self.log)
        for port in self.ports.values():
            assert wait_port(port, timeout=10), "haproxy not listening"
        return self

    def stop(self):
        stop_pid(self.proc, signal.SIGTERM)
        if self.proc is not None:
            self.log.close()
        self.proc = None


WRK_KEY_LUA = """
-- a fixed X-API-Key, or a distinct one per request when distinct is set
local counter = 0
local seq = 0
function setup(thread)
  seq = seq + 1
  thread:set("tid", seq)  -- a global in that thread's Lua state
end
function init(args)
  key = args[1]
  distinct = args[2] == "distinct"
end
function request()
  local k = key
  if distinct then
    counter = counter + 1
    k = key .. "-" .. tid .. "-" .. counter
  end
  -- wrk.format with a table of its own drops the command line's -H
  -- headers (Connection: close among them), so they are copied in
  local h = {}
  for name, value in pairs(wrk.headers) do h[name] = value end
  h["X-API-Key"] = k
  h["Host"] = "x"
  return wrk.format("GET", path, h)
end
"""


def wrk_script(dirpath, path):
    fn = os.path.join(dirpath, "key.lua")
    with open(fn, "w") as f:
        f.write('path = "%s"\n' % path + WRK_KEY_LUA)
    return fn


def parse_wrk(out):
    """requests, non-2xx, socket errors and latency max (ms) from wrk."""
    res = {"requests": 0, "non2xx": 0, "socket_errors": 0,
           "latency_max_ms": None}
    m = re.search(r"(\d+) requests in", out)
    if m:
        res["requests"] = int(m.group(1))
    m = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    if m:
        res["non2xx"] = int(m.group(1))
    m = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), "
                  r"timeout (\d+)", out)
    if m:
        res["socket_errors"] = sum(int(x) for x in m.groups())
        res["socket_detail"] = "connect %s read %s write %s timeout %s" % (
            m.groups())
    m = re.search(r"Latency\s+\S+\s+\S+\s+([\d.]+)(us|ms|s)", out)
    if m:
        v = float(m.group(1))
        res["latency_max_ms"] = v / 1000 if m.group(2) == "us" else (
            v * 1000 if m.group(2) == "s" else v)
    return res


def start_wrk(port, path, key, seconds, threads=2, conns=8, distinct=False,
              close=False, tmpdir=None):
    """Start wrk in the background; returns (Popen, tmpdir)."""
    require(WRK, "wrk")
    tmpdir = tmpdir or tempfile.mkdtemp(prefix="tbw-", dir="/tmp")
    args = [WRK, "-t%d" % threads, "-c%d" % conns, "-d%ds" % seconds,
            "--timeout", "10s", "-s", wrk_script(tmpdir, path)]
    if close:
        args += ["-H", "Connection: close"]
    args += ["http://127.0.0.1:%d%s" % (port, path), "--", key]
    if distinct:
        args.append("distinct")
    p = subprocess.Popen(args, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT)
    return p


def finish_wrk(p, timeout=60):
    try:
        out, _ = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        stop_pid(p, signal.SIGKILL)
        raise
    assert p.returncode == 0, out.decode(errors="replace")
    return parse_wrk(out.decode(errors="replace"))


def run_wrk(*a, **kw):
    return finish_wrk(start_wrk(*a, **kw))


def module_clients(rc):
    """Redis clients other than redis-py ones (ours run CLIENT LIST etc.):
    the module's connections."""
    out = []
    for c in rc.client_list():
        cmd = c.get("cmd", "")
        if cmd.startswith("client") or cmd in ("info", "ping", "dbsize",
                                               "script|flush", "config|set",
                                               "debug"):
            continue
        out.append(c)
    return out


def redis_sockets(pids, redis_port):
    """Established TCP sockets from the given PIDs to 127.0.0.1:port,
    read from /proc (no ss/lsof needed)."""
    inodes = set()
    with open("/proc/net/tcp") as f:
        next(f)
        for line in f:
            p = line.split()
            rem = p[2]
            state = p[3]
            rport = int(rem.split(":")[1], 16)
            if rport == redis_port and state == "01":
                inodes.add(p[9])
    count = {}
    for pid in pids:
        n = 0
        try:
            for fd in os.listdir("/proc/%d/fd" % pid):
                try:
                    t = os.readlink("/proc/%d/fd/%s" % (pid, fd))
                except OSError:
                    continue
                if t.startswith("socket:[") and t[8:-1] in inodes:
                    n += 1
        except OSError:
            continue
        count[pid] = n
    return count


def rss_kb(pid, field="VmRSS"):
    """A memory field of /proc/PID/status in KB (VmRSS, or RssAnon: the
    process's own heap, without the shared memory it maps); None if the
    field is absent."""
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return None


class BlackHole:
    """A listening socket on a port that never accepts: connects queue up
    (then time out once the backlog is full), commands never answer."""

    def __init__(self, port):
        self.s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        deadline = time.monotonic() + 5
        while True:
            try:
                self.s.bind(("127.0.0.1", port))
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        self.s.listen(0)

    def close(self):
        self.s.close()


class Prober:
    """One thread sending GETs back to back on fresh connections, timing
    each: [(t_start_monotonic, latency_s, status, decision)]."""

    def __init__(self, port, path, key):
        self.port, self.path, self.key = port, path, key
        self.samples = []
        self.errors = []
        self._stop = threading.Event()
        self.t = threading.Thread(target=self._run, daemon=True)

    def _one(self):
        req = ("GET %s HTTP/1.1\r\nHost: x\r\nX-API-Key: %s\r\n"
               "Connection: close\r\n\r\n" % (self.path, self.key)).encode()
        t0 = time.monotonic()
        head = http_head(self.port, req)
        lat = time.monotonic() - t0
        status = int(head.split(" ", 2)[1]) if head.startswith("HTTP/") \
            else 0
        m = re.search(r"(?im)^X-TB-Decision: *(\S*)", head)
        return t0, lat, status, m.group(1) if m else ""

    def _run(self):
        while not self._stop.is_set():
            try:
                self.samples.append(self._one())
            except OSError as e:
                self.errors.append((time.monotonic(), repr(e)))
                time.sleep(0.01)

    def start(self):
        self.t.start()
        return self

    def stop(self):
        self._stop.set()
        self.t.join(timeout=15)

    def between(self, t0, t1):
        return [s for s in self.samples if t0 <= s[0] < t1]


def ideal(ts_us, cap, rate):
    """Requests an ideal token bucket allows for these arrival times."""
    ts_us = sorted(ts_us)
    if not ts_us:
        return 0
    tokens, last, allowed = float(cap), ts_us[0], 0
    for t in ts_us:
        tokens = min(cap, tokens + (t - last) / 1e6 * rate)
        last = t
        if tokens >= 1:
            tokens -= 1
            allowed += 1
    return allowed


def write_tsv(name, header, rows):
    """RESULTS/NAME (NAME_asan.tsv under `make asan`, so the plain
    build's figures are not overwritten)."""
    os.makedirs(RESULTS, exist_ok=True)
    if os.environ.get("TB_ASAN") == "1":
        name = name.replace(".tsv", "_asan.tsv")
    path = os.path.join(RESULTS, name)
    with open(path, "w") as f:
        f.write("\t".join(header) + "\n")
        for r in rows:
            f.write("\t".join(str(x) for x in r) + "\n")
    return path


# An error-log or stderr line that means a process crashed or a
# sanitizer fired.
CRASH_RE = re.compile(r"Segmentation fault|exit signal|AH00052|"
                      r"AddressSanitizer|runtime error:|double free|"
                      r"\bSIGSEGV\b|\babort")


def crash_lines(apache):
    """Error-log lines that mean a child crashed or a sanitizer fired."""
    bad = []
    for line in (apache.read_log() + apache.read_stderr()).splitlines():
        if CRASH_RE.search(line):
            bad.append(line)
    return bad
