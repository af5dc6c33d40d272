"""tbtest/shim.py -- helpers for the LD_PRELOAD shim tests (shim/).

The test programs (tests/integration/progs/) are built by make into
$TB_BUILD/progs; the `progs` fixture (conftest.py) maps PROG_NAMES to
their paths. Every program that should be limited runs with
LD_PRELOAD=<build>/libtbucket_preload.so and TBUCKET_CONFIG pointing at a
config written by the test. Servers are started by PID and
stopped by PID; every wait is bounded.
"""
import os
import select
import signal
import subprocess
import sys
import time

import pytest

from tbtest.apache import Apache
from tbtest.env import BUILD, ROOT, parse_kv, require, stop_pid

SHIM_SO = os.path.join(BUILD, "libtbucket_preload.so")
CURL = "/usr/bin/curl"
PHP_CGI = "/usr/bin/php-cgi8.2"

# The test programs make builds into $TB_BUILD/progs: a TCP/HTTP daemon,
# a client (tb_cli2 is a copy: a "$program" key must differ by name), a
# program that closes sockets in odd ways, one with calls from a library
# constructor, a connect() loop, a fake connect() for timing, a
# pre-forking daemon whose children hold their connections open, and an
# HTTP daemon with a thread per connection.
PROG_NAMES = ("tb_srv", "tb_cli", "tb_cli2", "closer", "ctor_main",
              "connect_loop", "libfakeconnect.so", "prefork_srv",
              "thread_srv")


def write_conf(path, redis, body="", **scalars):
    """Write a shim config: redis_url and timeouts first, then scalars
    (Python values become libconfig ones), then body (rules, verbatim)."""
    # Generous timeouts: on a loaded test machine a 50 ms Redis call can
    # time out, and the open policy would then let a connection through.
    # Tests about timeouts set their own.
    settings = {"redis_url": redis.url if redis else "redis://127.0.0.1:1",
                "timeout_ms": 1000, "connect_timeout_ms": 1000}
    settings.update(scalars)
    lines = []
    for k, v in settings.items():
        if isinstance(v, bool):
            v = "true" if v else "false"
        elif isinstance(v, str):
            v = '"%s"' % v
        lines.append("%s = %s;" % (k, v))
    with open(str(path), "w") as f:
        f.write("\n".join(lines) + "\n" + body + "\n")
    return str(path)


PLAIN_SHIM_SO = os.path.join(ROOT, "build", "libtbucket_preload.so")


def shim_env(conf, foreign=False, **extra):
    """The environment of a program run under the shim. Under `make asan`
    (TB_ASAN=1) our own C programs get the sanitizer build with its
    runtimes preloaded first; foreign programs (curl, php-cgi, python),
    which hang or fail with libasan preloaded, get the plain build."""
    env = dict(os.environ)
    env["LD_PRELOAD"] = SHIM_SO
    if os.environ.get("TB_ASAN") == "1":
        if foreign:
            if not os.path.exists(PLAIN_SHIM_SO):
                pytest.fail("%s is missing: run make first" % PLAIN_SHIM_SO)
            env["LD_PRELOAD"] = PLAIN_SHIM_SO
        else:
            cc = require("/usr/bin/gcc", "gcc")
            rt = [subprocess.run([cc, "-print-file-name=" + lib],
                                 stdout=subprocess.PIPE, text=True,
                                 check=True).stdout.strip()
                  for lib in ("libasan.so", "libubsan.so")]
            env["LD_PRELOAD"] = " ".join(rt + [SHIM_SO])
            env["ASAN_OPTIONS"] = "detect_leaks=0"
    if conf is None:
        env.pop("TBUCKET_CONFIG", None)
    else:
        env["TBUCKET_CONFIG"] = str(conf)
    env.update({k: str(v) for k, v in extra.items()})
    return env


def group(fields):
    """A rule's fields (a dict, in order) as a libconfig group: strings
    quoted, numbers as they are, None left out."""
    return "{ " + " ".join(
        "%s = %s;" % (k, '"%s"' % v if isinstance(v, str) else v)
        for k, v in fields.items() if v is not None) + " }"


def out_rule(port, **kw):
    """One outbound rule as libconfig text."""
    fields = {"name": "db", "host": "127.0.0.1", "port": port,
              "capacity": 3, "rate": "1/h"}
    fields.update(kw)
    return group(fields)


def in_rule(port, **kw):
    """One inbound rule "web" on port as libconfig text, kw its limits."""
    fields = {"name": "web", "port": port}
    fields.update(kw)
    return group(fields)


def outbound(*rules):
    return "outbound = (\n  " + ",\n  ".join(rules) + "\n);"


def inbound(*rules):
    return "inbound = (\n  " + ",\n  ".join(rules) + "\n);"


def plain_env():
    env = dict(os.environ)
    env.pop("LD_PRELOAD", None)
    env.pop("TBUCKET_CONFIG", None)
    return env


def errs(summary):
    """The errs=NAME:n,... field as a dict."""
    e = summary.get("errs", "")
    if not e or isinstance(e, int):
        return {}
    return {k: int(v) for k, v in (x.split(":") for x in e.split(","))}


class Proc:
    """A server started by PID; reads its "ready <port>" line. stderr: a
    file to write the server's stderr to instead of a pipe (a server that
    runs for long may write more than a pipe holds)."""

    def __init__(self, argv, env, ready_timeout=10.0, preexec_fn=None,
                 stderr=None):
        self.argv = argv
        self.proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE,
                                     stderr=stderr or subprocess.PIPE,
                                     text=True, preexec_fn=preexec_fn)
        self.port = None
        words = self.wait_line("ready ", ready_timeout)
        if words is None:
            self.stop()
            raise RuntimeError("%s did not become ready: %s" % (
                argv, self.proc.stderr.read() if self.proc.stderr
                else "see " + getattr(stderr, "name", "its stderr")))
        self.port = int(words[1])

    def wait_line(self, prefix, timeout=10.0):
        """The words of the next line of stdout that starts with prefix,
        lines before it skipped; None when none comes within timeout."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            r, _, _ = select.select([self.proc.stdout], [], [],
                                    max(0.0, deadline - time.monotonic()))
            if not r:
                break
            line = self.proc.stdout.readline()
            if not line:
                break
            if line.startswith(prefix):
                return line.split()
        return None

    def stop(self):
        """SIGTERM by PID; return (stdout, stderr) of the rest."""
        stop_pid(self.proc)
        try:
            out, err = self.proc.communicate(timeout=10)
        except (ValueError, subprocess.TimeoutExpired):
            out, err = "", ""
        return out or "", err or ""


class ShimApache(Apache):
    """An Apache of tbtest.apache's whose processes run under the shim
    with the config conf (settable until start())."""

    def __init__(self, conf, **kw):
        self.shim_conf = conf
        super().__init__(**kw)

    def _env(self):
        # scripts/apache2.sh preloads the sanitizer runtimes a `make asan`
        # module needs, then TB_APACHE_PRELOAD: the shim of this build.
        env = shim_env(self.shim_conf)
        env["TB_APACHE_PRELOAD"] = SHIM_SO
        return env


def tb_srv(progs, conf, port, *flags):
    """tb_srv (flags added) on port under the shim with config conf."""
    return Proc([progs["tb_srv"], "-p", str(port)] + list(flags),
                shim_env(conf))


def run(argv, env, timeout=60, check=True):
    """Run a program to completion (bounded); return CompletedProcess."""
    p = subprocess.run(argv, env=env, stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, text=True, timeout=timeout)
    if check and p.returncode != 0:
        raise AssertionError("%s exited %d: %s" % (argv, p.returncode,
                                                   p.stderr))
    return p


def assert_strict_refusal(progs, conf, why):
    """tb_srv under the config conf with TBUCKET_STRICT=1 is refused
    before main() (exit 78), its one line naming the file and why."""
    r = subprocess.run([progs["tb_srv"], "-p", "0"],
                       env=shim_env(conf, TBUCKET_STRICT=1),
                       capture_output=True, text=True, timeout=20)
    assert r.returncode == 78, (conf, r.stderr)
    assert why in r.stderr, r.stderr
    assert os.path.basename(conf) + ":" in r.stderr, r.stderr


def cli(progs, args, env, timeout=60, name="tb_cli"):
    """Run tb_cli; return its summary lines as dicts (the last one for a
    single process) and stderr."""
    p = run([progs[name]] + [str(a) for a in args], env, timeout=timeout)
    lines = [parse_kv(l) for l in p.stdout.splitlines() if l.startswith("who=")]
    return lines, p.stderr


def bucket(redis, key):
    """The stored hash of a bucket key: {'tokens': float, 'ts': int}, or
    {} when missing."""
    h = redis.client().hgetall(key)
    return {k.decode(): float(v) for k, v in h.items()}


def redis_clients(redis):
    """Connections Redis sees, excluding the one asking."""
    return [c for c in redis.client().client_list()
            if c.get("cmd") != "client|list"]


def stderr_lines(text):
    return [l for l in text.splitlines() if l.strip()]


# ---- Real clients under one shared outbound rule ------------------------

def wait_rule(name, port, capacity, rate_per_sec, max_wait_ms=10000):
    """One outbound `wait` rule with every other setting at its default,
    as a new user would write it."""
    return ('outbound = ( { name = "%s"; host = "127.0.0.1"; port = %d; '
            'capacity = %d; rate = "%d/s"; on_limit = "wait"; '
            'max_wait_ms = %d; } );'
            % (name, port, capacity, rate_per_sec, max_wait_ms))


def run_workers(workers, timeout=60):
    """Run each worker in its own thread. A worker is a callable taking a
    threading.Barrier: it gets ready (a script process started and
    waiting), waits on the barrier, works and returns (ok, fail, error).
    The clock starts when every worker is ready, so that interpreter
    start-up is not counted as load. Returns the results (None for a
    worker that did not finish within timeout) and the seconds from the
    start to the last end."""
    import threading
    results = [None] * len(workers)
    barrier = threading.Barrier(len(workers) + 1, timeout=timeout)

    def body(i, w):
        try:
            results[i] = w(barrier)
        except Exception as e:          # reported through the result
            barrier.abort()
            results[i] = (0, 1, repr(e))

    threads = [threading.Thread(target=body, args=(i, w), daemon=True)
               for i, w in enumerate(workers)]
    for t in threads:
        t.start()
    try:
        barrier.wait()
    except threading.BrokenBarrierError:
        pass
    t0 = time.monotonic()
    for t in threads:
        t.join(max(0.0, t0 + timeout - time.monotonic()))
    return results, time.monotonic() - t0


def process_loop(argv, env, n, duration, ok=lambda p: p.returncode == 0,
                 call_timeout=30):
    """A worker that runs argv up to n times in a row (one process per
    call), starting no call after `duration` seconds; returns (ok, fail,
    last error)."""
    def work(barrier):
        good = bad = 0
        err = ""
        barrier.wait()
        end = time.monotonic() + duration
        for _ in range(n):
            if time.monotonic() >= end:
                break
            try:
                p = subprocess.run(argv, env=env, stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE, text=True,
                                   timeout=call_timeout)
            except subprocess.TimeoutExpired:
                bad += 1
                break
            if ok(p):
                good += 1
            else:
                bad += 1
                err = p.stderr.strip()[-300:]
        return good, bad, err
    return work


def script_worker(argv, env, timeout):
    """A worker that is one process looping by itself: it prints "ready",
    waits for a line on stdin, loops, and prints "ok=N fail=M" last.
    Returns (ok, fail, stderr)."""
    def work(barrier):
        p = subprocess.Popen(argv, env=env, stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True)
        try:
            ready = p.stdout.readline()
            barrier.wait()
            p.stdin.write("go\n")
            p.stdin.flush()
            out, err = p.communicate(timeout=timeout)
        except BaseException:
            stop_pid(p, signal.SIGKILL)
            raise
        lines = [l for l in out.splitlines() if l.startswith("ok=")]
        if not ready.startswith("ready") or p.returncode != 0 or not lines:
            return 0, 1, ready + out[-300:] + err[-300:]
        kv = parse_kv(lines[-1])
        return kv["ok"], kv["fail"], err.strip()[-300:]
    return work


PHP = "/usr/bin/php"


def php_loop(body, setup=""):
    """A PHP script for script_worker: prints "ready", waits for a line on
    stdin, runs `setup` once, then `body` (which counts $ok and $fail) up
    to $N times and for at most $SECS seconds, and prints the tally."""
    return ('<?php\necho "ready\\n";\nfgets(STDIN);\n'
            '$n = (int)getenv("N");\n'
            '$end = microtime(true) + (float)getenv("SECS");\n' + setup
            + '$ok = 0; $fail = 0;\n'
            'for ($i = 0; $i < $n && microtime(true) < $end; $i++) {\n'
            + body + '}\necho "ok=$ok fail=$fail\\n";\n')


def check_shared_limit(what, admitted, capacity, rate, seconds, span=None):
    """Assert that a downstream accepted no more than a bucket allows in
    `seconds` (capacity + rate x T) and at least 0.9 of it: a `wait` rule
    both holds the limit and uses it. With span (seconds between the first
    and the last connection the downstream saw) the tighter bound
    capacity + rate x span + 1 holds too (one token of jitter between a
    decision and its accept). Prints the figures; returns the ratio."""
    bound = capacity + rate * seconds
    ratio = admitted / bound
    print("\n%s: admitted %d, bound %.1f (capacity %d + %g/s x %.2f s), "
          "ratio %.3f%s" % (what, admitted, bound, capacity, rate, seconds,
                           ratio, "" if span is None else
                           ", server span %.2f s" % span))
    assert admitted <= bound, (what, admitted, bound)
    assert ratio >= 0.9, (what, admitted, bound)
    if span is not None:
        assert admitted <= capacity + rate * span + 1, (what, admitted,
                                                        span)
    return ratio


# ---- Counting the shim's Redis calls -------------------------------------

def reset_calls(redis):
    """Zero Redis's command statistics (CONFIG RESETSTAT)."""
    redis.client().config_resetstat()


def script_calls(redis):
    """Script calls Redis has run since reset_calls(): EVALSHA and EVAL,
    from INFO commandstats, one per decision, settlement or give-back.
    Failed calls are left out, so that the first EVALSHA, answered
    NOSCRIPT and retried as EVAL by the core, counts once."""
    stats = redis.client().info("commandstats")
    return sum(stats.get("cmdstat_" + c, {}).get("calls", 0)
               - stats.get("cmdstat_" + c, {}).get("failed_calls", 0)
               for c in ("evalsha", "eval"))


# ---- A small HTTP daemon in Python: an event loop ------------------------

HTTP_DAEMON = r'''
import os, resource, selectors, signal, socket, sys
port = int(sys.argv[1])
# The descriptor limit the program raises itself once the shim has started
# (as nginx's worker_rlimit_nofile or a JVM does): the soft one, up to the
# hard one.
if os.environ.get("SRV_NOFILE"):
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    resource.setrlimit(resource.RLIMIT_NOFILE,
                       (int(os.environ["SRV_NOFILE"]), hard))
# exit(), not death by the signal: the shim's exit handlers run.
signal.signal(signal.SIGTERM, lambda *a: sys.exit(0))
ls = socket.socket()
ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
ls.bind(("127.0.0.1", port))
ls.listen(1024)
ls.setblocking(False)
sel = selectors.DefaultSelector()
sel.register(ls, selectors.EVENT_READ)
bufs = {}
served = 0
OK = b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n%s\r\nok\n"

def answer(c, buf):
    """Answer each whole request in buf; (rest of buf, 1 to close)."""
    while b"\r\n\r\n" in buf:
        req, buf = buf.split(b"\r\n\r\n", 1)
        close = b"connection: close" in req.lower()
        c.sendall(OK % (b"Connection: close\r\n" if close else b""))
        if close:
            return buf, 1
    return buf, 0

def accept_all():
    global served
    while True:
        try:
            c, _ = ls.accept()
        except BlockingIOError:
            return
        served += 1
        c.setblocking(False)
        bufs[c] = b""
        sel.register(c, selectors.EVENT_READ)

def readable(c):
    try:
        data = c.recv(4096)
        bufs[c], done = answer(c, bufs[c] + data) if data else (b"", 1)
    except OSError:
        done = 1
    if done:
        sel.unregister(c)
        del bufs[c]
        c.close()

print("ready", port, flush=True)
try:
    while True:
        for key, _ in sel.select():
            accept_all() if key.fileobj is ls else readable(key.fileobj)
finally:
    print("served", served, flush=True)
'''


def http_daemon(tmp_path, conf, port, preexec_fn=None, **env):
    """The Python HTTP daemon above on port under the shim with config
    conf: one thread, a selectors loop on a non-blocking listener that
    accepts until EAGAIN. Each request gets "200 OK" with a
    Content-Length; a request saying "Connection: close" is answered and
    closed by the daemon, else the connection stays open until the client
    closes it. SRV_NOFILE=N in env makes it raise its own (soft)
    descriptor limit to N after the shim started; preexec_fn runs in the
    child before it starts (a descriptor limit to start with). On SIGTERM
    it exits and prints "served N"."""
    path = tmp_path / "http_daemon.py"
    path.write_text(HTTP_DAEMON)
    return Proc([sys.executable, str(path), str(port)],
                shim_env(conf, foreign=True, **env), preexec_fn=preexec_fn)


def http_ask(sock, close=False):
    """One GET on the connected socket sock: the status line of the
    answer ("closed" when there was none), read by its Content-Length
    (or to the end, for the shim's own answers)."""
    sock.sendall(b"GET / HTTP/1.1\r\nHost: t\r\n%s\r\n"
                 % (b"Connection: close\r\n" if close else b""))
    data = b""
    try:
        while b"\r\n\r\n" not in data:
            chunk = sock.recv(4096)
            if not chunk:
                break
            data += chunk
        head, _, body = data.partition(b"\r\n\r\n")
        length = 0
        for line in head.split(b"\r\n")[1:]:
            k, _, v = line.partition(b":")
            if k.strip().lower() == b"content-length":
                length = int(v)
        while len(body) < length:
            chunk = sock.recv(4096)
            if not chunk:
                break
            body += chunk
    except ConnectionResetError:
        pass
    return data.split(b"\r\n")[0].decode(errors="replace") or "closed"
