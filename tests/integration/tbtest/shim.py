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
import time

import pytest

from tbtest.env import BUILD, ROOT, require, stop_pid

SHIM_SO = os.path.join(BUILD, "libtbucket_preload.so")
CURL = "/usr/bin/curl"
PHP_CGI = "/usr/bin/php-cgi8.2"

# The test programs make builds into $TB_BUILD/progs: a TCP/HTTP daemon,
# a client (tb_cli2 is a copy: a "$program" key must differ by name), a
# program that closes sockets in odd ways, one with calls from a library
# constructor, a connect() loop and a fake connect() for timing.
PROG_NAMES = ("tb_srv", "tb_cli", "tb_cli2", "closer", "ctor_main",
              "connect_loop", "libfakeconnect.so")


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


def out_rule(port, **kw):
    """One outbound rule as libconfig text."""
    fields = {"name": "db", "host": "127.0.0.1", "port": port,
              "capacity": 3, "rate": "1/h"}
    fields.update(kw)
    parts = []
    for k, v in fields.items():
        parts.append('%s = %s;' % (k, '"%s"' % v if isinstance(v, str)
                                   else v))
    return "{ " + " ".join(parts) + " }"


def outbound(*rules):
    return "outbound = (\n  " + ",\n  ".join(rules) + "\n);"


def plain_env():
    env = dict(os.environ)
    env.pop("LD_PRELOAD", None)
    env.pop("TBUCKET_CONFIG", None)
    return env


def parse_kv(line):
    """'who=main ok=3 errs=A:1,B:2' -> dict, numbers as int."""
    out = {}
    for tok in line.split():
        if "=" not in tok:
            continue
        k, v = tok.split("=", 1)
        try:
            out[k] = int(v)
        except ValueError:
            out[k] = v
    return out


def errs(summary):
    """The errs=NAME:n,... field as a dict."""
    e = summary.get("errs", "")
    if not e or isinstance(e, int):
        return {}
    return {k: int(v) for k, v in (x.split(":") for x in e.split(","))}


class Proc:
    """A server started by PID; reads its "ready <port>" line."""

    def __init__(self, argv, env, ready_timeout=10.0):
        self.argv = argv
        self.proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True)
        self.port = None
        deadline = time.monotonic() + ready_timeout
        while time.monotonic() < deadline:
            r, _, _ = select.select([self.proc.stdout], [], [],
                                    max(0.0, deadline - time.monotonic()))
            if not r:
                break
            line = self.proc.stdout.readline()
            if not line:
                break
            if line.startswith("ready "):
                self.port = int(line.split()[1])
                return
        self.stop()
        raise RuntimeError("%s did not become ready: %s" %
                           (argv, self.proc.stderr.read()))

    def stop(self):
        """SIGTERM by PID; return (stdout, stderr) of the rest."""
        stop_pid(self.proc)
        try:
            out, err = self.proc.communicate(timeout=10)
        except (ValueError, subprocess.TimeoutExpired):
            out, err = "", ""
        return out or "", err or ""


def run(argv, env, timeout=60, check=True):
    """Run a program to completion (bounded); return CompletedProcess."""
    p = subprocess.run(argv, env=env, stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, text=True, timeout=timeout)
    if check and p.returncode != 0:
        raise AssertionError("%s exited %d: %s" % (argv, p.returncode,
                                                   p.stderr))
    return p


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
