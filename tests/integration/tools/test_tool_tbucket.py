"""test_tool_tbucket.py -- the `tbucket` command line against a real Redis.

Each test runs build/tbucket as a subprocess against the redis_server
fixture (its own redis-server on a free loopback port) and checks exit
codes, what it prints and what it leaves in Redis. Limits use slow rates
(per hour) so that no token comes back during a test and nothing sleeps.
"""
import glob
import hashlib
import os
import re
import subprocess
import time

import pytest

from tbtest.env import BUILD, free_port, wait_until
from tbtest.apache import http_get, limited_conf
from tbtest.shim import shim_env

TOOL = os.path.join(BUILD, "tbucket")

EX_OK = 0
EX_USAGE = 64
EX_DATAERR = 65
EX_UNAVAILABLE = 69
EX_TEMPFAIL = 75
EX_CONFIG = 78


def run(*args, url=None, env=None, timeout=20):
    if not os.path.exists(TOOL):
        pytest.fail("%s is missing: run make" % TOOL)
    argv = [TOOL] + list(args)
    if url is not None:
        argv += ["--url", url]
    e = dict(os.environ)
    e.pop("TBUCKET_CONFIG", None)
    e.update(env or {})
    return subprocess.run(argv, capture_output=True, text=True,
                          timeout=timeout, env=e)


def fields(out):
    """'a=1 b=2' words or 'a=1' lines into a dict."""
    return dict(w.split("=", 1) for w in out.split() if "=" in w)


# A connect() to a port nothing listens on, for a program under the shim:
# the shim spends a token, then the connection is refused.
CONNECT = ("import socket\n"
           "try:\n"
           "    socket.create_connection(('127.0.0.1', %d), timeout=2)\n"
           "except OSError:\n"
           "    pass\n")


def take(redis_server, key, *extra):
    return run("take", key, *extra, url=redis_server.url)


# take: exactly `capacity` allowed, then 75 with the retry-after.
def test_tool_001_01_take_until_rejected(redis_server):
    seen = []
    for _ in range(6):
        p = take(redis_server, "alice", "--capacity", "5", "--rate", "1/h")
        seen.append(p.returncode)
    assert seen == [EX_OK] * 5 + [EX_TEMPFAIL]
    f = fields(p.stdout)
    assert p.stdout.startswith("rejected ")
    # One token at 1/h is an hour away: Retry-After in whole seconds.
    assert 3590 <= int(f["retry_after"]) <= 3600
    assert 3590000 <= int(f["retry_after_ms"]) <= 3600000
    assert f["remaining"] == "0" and f["limit"] == "5"
    assert f["source"] == "redis"


# take: remaining counts down; the Redis hash is the module's key and shape.
def test_tool_001_02_take_state_in_redis(redis_server):
    for want in (4, 3):
        p = take(redis_server, "bob", "--capacity", "5", "--rate", "1/h")
        assert p.returncode == EX_OK, p.stderr
        assert fields(p.stdout)["remaining"] == str(want)
    r = redis_server.client()
    assert r.keys("*") == [b"rl:{bob}"]
    h = r.hgetall("rl:{bob}")
    assert 2.99 < float(h[b"tokens"]) < 3.01
    # TTL: ceil(capacity / rate * 1000) + 1000 ms, as the script sets it.
    assert 18000000 < r.pttl("rl:{bob}") <= 18001000


# take: --cost; a cost above the capacity is 65 and never touches Redis.
def test_tool_001_03_cost(redis_server):
    p = take(redis_server, "carol", "--capacity", "10", "--rate", "1/h",
             "--cost", "4")
    assert p.returncode == EX_OK and fields(p.stdout)["remaining"] == "6"
    p = take(redis_server, "carol", "--capacity", "10", "--rate", "1/h",
             "--cost", "7")
    assert p.returncode == EX_TEMPFAIL
    p = take(redis_server, "dave", "--capacity", "3", "--rate", "1/s",
             "--cost", "4")
    assert p.returncode == EX_DATAERR
    assert "exceeds capacity" in p.stderr
    assert redis_server.client().exists("rl:{dave}") == 0


# --route NAME takes from "<prefix>{key}:route:NAME"; --prefix changes it.
def test_tool_001_04_route_and_prefix(redis_server):
    p = take(redis_server, "erin", "--capacity", "2", "--rate", "1/h",
             "--route", "export", "--prefix", "t4:")
    assert p.returncode == EX_OK, p.stderr
    assert redis_server.client().keys("*") == [b"t4:{erin}:route:export"]


# A hostile key is hashed exactly as the module hashes it (tb_key_build).
def test_tool_001_05_hostile_key(redis_server):
    key = "a}b{c\r\nX-Evil: 1"
    p = take(redis_server, key, "--capacity", "2", "--rate", "1/h")
    assert p.returncode == EX_OK, p.stderr
    digest = hashlib.sha256(key.encode()).hexdigest()[:32]
    assert redis_server.client().keys("*") == [
        ("rl:{#%s}" % digest).encode()]


# reset deletes the bucket: a drained client is allowed again.
def test_tool_001_06_reset(redis_server):
    for _ in range(2):
        take(redis_server, "frank", "--capacity", "1", "--rate", "1/h")
    assert take(redis_server, "frank", "--capacity", "1",
                "--rate", "1/h").returncode == EX_TEMPFAIL
    p = run("reset", "frank", url=redis_server.url)
    assert p.returncode == EX_OK and "rl:{frank}" in p.stdout
    assert redis_server.client().exists("rl:{frank}") == 0
    assert take(redis_server, "frank", "--capacity", "1",
                "--rate", "1/h").returncode == EX_OK


# inspect: stored tokens, age and TTL; with the limit, tokens refilled now.
def test_tool_001_07_inspect(redis_server):
    for _ in range(2):
        take(redis_server, "gina", "--capacity", "5", "--rate", "1/h")
    p = run("inspect", "gina", url=redis_server.url)
    assert p.returncode == EX_OK, p.stderr
    f = fields(p.stdout)
    assert f["key"] == "rl:{gina}" and f["exists"] == "yes"
    assert 2.99 < float(f["tokens"]) <= 3.01
    assert 0 <= int(f["age_ms"]) < 5000
    assert 18000000 - 10000 < int(f["ttl_ms"]) <= 18001000
    assert "tokens_now" not in f
    p = run("inspect", "gina", "--capacity", "5", "--rate", "1/h",
            "--cost", "4", url=redis_server.url)
    f = fields(p.stdout)
    assert 3.0 <= float(f["tokens_now"]) < 3.01
    assert f["remaining_now"] == "3"
    assert f["ttl_after_take_ms"] == "18001000"
    assert f["would_allow"] == "no"
    assert 3590000 < int(f["retry_after_ms"]) <= 3600000
    # Read-only: inspecting twice changed nothing in Redis.
    assert 2.99 < float(redis_server.client().hget("rl:{gina}",
                                                   "tokens")) <= 3.01


# inspect of a missing key: a full bucket, TTL -2.
def test_tool_001_08_inspect_missing(redis_server):
    p = run("inspect", "nobody", "--capacity", "7", "--rate", "2/s",
            url=redis_server.url)
    assert p.returncode == EX_OK, p.stderr
    f = fields(p.stdout)
    assert f["exists"] == "no" and f["ttl_ms"] == "-2"
    assert float(f["tokens_now"]) == 7.0 and f["would_allow"] == "yes"
    assert redis_server.client().keys("*") == []


# Redis unreachable: --policy fail (default) 69, open 0, closed 75.
def test_tool_001_09_redis_down_policies():
    url = "redis://user:s3cret@127.0.0.1:%d" % free_port()
    lim = ["--capacity", "5", "--rate", "1/s", "--timeout", "200ms"]
    p = run("take", "k", *lim, url=url)
    assert p.returncode == EX_UNAVAILABLE
    assert "s3cret" not in p.stderr and "***" in p.stderr
    p = run("take", "k", *lim, "--policy", "open", url=url)
    assert p.returncode == EX_OK
    assert fields(p.stdout)["source"] == "open"
    p = run("take", "k", *lim, "--policy", "closed", url=url)
    assert p.returncode == EX_TEMPFAIL
    assert int(fields(p.stdout)["retry_after"]) >= 1
    assert run("inspect", "k", url=url).returncode == EX_UNAVAILABLE
    assert run("reset", "k", url=url).returncode == EX_UNAVAILABLE


# A stopped Redis: the timeout bounds the wait.
def test_tool_001_10_timeout(redis_server):
    redis_server.sigstop()
    try:
        t0 = time.monotonic()
        p = take(redis_server, "k", "--capacity", "5", "--rate", "1/s",
                 "--timeout", "300ms")
        took = time.monotonic() - t0
    finally:
        redis_server.sigcont()
    assert p.returncode == EX_UNAVAILABLE
    assert took < 3.0


# Usage errors are 64 and name the problem.
@pytest.mark.parametrize("args,needle", [
    ([], "no command"),
    (["frob", "k"], "unknown command"),
    (["take"], "KEY"),
    (["take", "k", "--rate", "1/s"], "--capacity"),
    (["take", "k", "--capacity", "0", "--rate", "1/s"], "--capacity"),
    (["take", "k", "--capacity", "5", "--rate", "-1/s"], "--rate"),
    (["take", "k", "--capacity", "5", "--rate", "1/s", "--cost", "x"],
     "--cost"),
    (["take", "k", "--capacity", "5", "--rate", "1/s", "--policy", "local"],
     "--policy"),
    (["take", "k", "--capacity", "5", "--rate", "1/s", "--route", "a b"],
     "--route"),
    (["take", "k", "--capacity", "5", "--rate", "1/s", "--prefix", "{x"],
     "--prefix"),
    (["inspect", "k", "--capacity", "5"], "--rate"),
    (["take", "k", "--bogus"], "bad option"),
])
def test_tool_001_11_usage(args, needle):
    p = run(*args)
    assert p.returncode == EX_USAGE, (p.stdout, p.stderr)
    assert needle in p.stderr
    assert "usage:" in p.stderr


# The Redis address from a shim config file (--config or $TBUCKET_CONFIG);
# --url wins over the file.
def test_tool_001_12_config_file(redis_server, tmp_path):
    conf = tmp_path / "shim.conf"
    conf.write_text('redis_url = "%s";\ntimeout_ms = 500;\n'
                    % redis_server.url)
    lim = ["--capacity", "5", "--rate", "1/h"]
    p = run("take", "cfg", *lim, "--config", str(conf))
    assert p.returncode == EX_OK, p.stderr
    p = run("take", "cfg", *lim, env={"TBUCKET_CONFIG": str(conf)})
    assert p.returncode == EX_OK, p.stderr
    assert fields(p.stdout)["remaining"] == "3"
    dead = "redis://127.0.0.1:%d" % free_port()
    p = run("take", "cfg", *lim, "--config", str(conf), url=dead)
    assert p.returncode == EX_UNAVAILABLE


# A bad or missing config file is 78 with file and line.
def test_tool_001_13_bad_config(tmp_path):
    bad = tmp_path / "bad.conf"
    bad.write_text('redis_url = "redis://127.0.0.1:1";\nx = ;\n')
    p = run("take", "k", "--capacity", "1", "--rate", "1", "--config",
            str(bad))
    assert p.returncode == EX_CONFIG
    assert re.search(r"bad\.conf:2:", p.stderr), p.stderr
    p = run("take", "k", "--capacity", "1", "--rate", "1", "--config",
            str(tmp_path / "missing.conf"))
    assert p.returncode == EX_CONFIG and "cannot read" in p.stderr


# --rule takes a shim rule's bucket: its prefix, limit and fixed key.
def test_tool_001_14_shim_rule(redis_server, tmp_path):
    conf = tmp_path / "shim.conf"
    conf.write_text(
        'redis_url = "%s";\nprefix = "t14:";\n'
        'outbound = ( { name = "legacydb"; host = "127.0.0.1"; port = 5432;'
        ' capacity = 2; rate = "1/h"; } );\n'
        'inbound = ( { port = 8080; capacity = 3; rate = 1; } );\n'
        % redis_server.url)
    codes = [run("take", "--config", str(conf), "--rule",
                 "out:legacydb").returncode for _ in range(3)]
    assert codes == [EX_OK, EX_OK, EX_TEMPFAIL]
    # An inbound rule is keyed by the peer: the KEY is required.
    p = run("take", "--config", str(conf), "--rule", "in1")
    assert p.returncode == EX_USAGE
    p = run("take", "10.1.2.3", "--config", str(conf), "--rule", "in1")
    assert p.returncode == EX_OK
    assert sorted(redis_server.client().keys("*")) == [
        b"t14:in:in1:{10.1.2.3}", b"t14:out:legacydb:{legacydb}"]
    p = run("take", "--config", str(conf), "--rule", "nosuch")
    assert p.returncode == EX_CONFIG and "nosuch" in p.stderr


# --rule reaches the very bucket the shim takes from, read by the shim's
# own loader: also a fixed key that must be hashed (a space and braces),
# and a connect() under the shim and a take by the tool share one bucket.
def test_tool_001_17_rule_key_as_shim(redis_server, tmp_path):
    port = free_port()
    conf = tmp_path / "shim.conf"
    conf.write_text(
        'redis_url = "%s";\nprefix = "t17:";\ntimeout_ms = 2000;\n'
        'outbound = ( { host = "127.0.0.1"; port = %d; capacity = 5;'
        ' rate = "1/h"; key = "odd key{x}"; } );\n'
        % (redis_server.url, port))
    # Nothing listens on the port: the shim spends a token, then the
    # connection is refused.
    subprocess.run(["/usr/bin/python3", "-c", CONNECT % port], timeout=20,
                   env=shim_env(conf, foreign=True), check=True)
    r = redis_server.client()
    shim_keys = r.keys("*")
    assert len(shim_keys) == 1 and shim_keys[0].startswith(b"t17:out:out1:")
    p = run("take", "--config", str(conf), "--rule", "out1")
    assert p.returncode == EX_OK, p.stderr
    assert fields(p.stdout)["remaining"] == "3"
    assert r.keys("*") == shim_keys


# Tool and core agree: what the tool takes, a second tool process with a
# different cost sees (one shared bucket, no per-process state).
def test_tool_001_15_quiet_and_shared(redis_server):
    p = take(redis_server, "hank", "--capacity", "3", "--rate", "1/h", "-q")
    assert p.returncode == EX_OK and p.stdout == ""
    p = take(redis_server, "hank", "--capacity", "3", "--rate", "1/h",
             "--cost", "2", "-q")
    assert p.returncode == EX_OK and p.stdout == ""
    p = take(redis_server, "hank", "--capacity", "3", "--rate", "1/h", "-q")
    assert p.returncode == EX_TEMPFAIL and p.stdout == ""


# --algorithm: the module's other algorithms, under their suffixed keys.
def test_tool_001_16_algorithm(redis_server):
    lim = ["--capacity", "2", "--rate", "1/h", "--algorithm", "gcra"]
    codes = [take(redis_server, "ivy", *lim).returncode for _ in range(3)]
    assert codes == [EX_OK, EX_OK, EX_TEMPFAIL]
    assert redis_server.client().keys("*") == [b"rl:{ivy}:gcra"]
    p = run("reset", "ivy", "--algorithm", "gcra", url=redis_server.url)
    assert p.returncode == EX_OK
    assert redis_server.client().keys("*") == []
    p = run("inspect", "ivy", "--algorithm", "gcra", url=redis_server.url)
    assert p.returncode == EX_USAGE
    p = run("take", "ivy", "--capacity", "2", "--rate", "1", "--algorithm",
            "leaky")
    assert p.returncode == EX_USAGE and "--algorithm" in p.stderr


# ---- with the Apache module: one bucket, two clients ---------------------

def module_conf(redis_server, prefix):
    return limited_conf(redis_server.url, prefix, "    TBucketLimit 3 1/h",
                        key="X-API-Key", status=False) + """
<Location /api/export>
    TBucketEnable On
    TBucketKey "%{HTTP:X-API-Key}"
    TBucketLimit 100 1/h
    TBucketRouteLimit export 2 1/h
</Location>
"""


# A token taken by the tool is missing for the module, and back; reset by
# the tool refills the module's bucket.
def test_tool_002_01_shares_module_bucket(apache_factory, redis_server):
    a = apache_factory()
    a.start(module_conf(redis_server, "ts:"))
    hdr = {"X-API-Key": "k1"}
    lim = ["--capacity", "3", "--rate", "1/h", "--prefix", "ts:"]
    assert run("take", "k1", *lim, url=redis_server.url).returncode == EX_OK
    r = http_get(a.url("/limited/ok.txt"), headers=hdr)
    assert r.status_code == 200
    assert r.headers["X-RateLimit-Remaining"] == "1"
    p = run("inspect", "k1", *lim, url=redis_server.url)
    assert fields(p.stdout)["remaining_now"] == "1"
    assert run("take", "k1", *lim, url=redis_server.url).returncode == EX_OK
    r = http_get(a.url("/limited/ok.txt"), headers=hdr)
    assert r.status_code == 429
    p = run("take", "k1", *lim, url=redis_server.url)
    assert p.returncode == EX_TEMPFAIL
    assert fields(p.stdout)["retry_after"] == r.headers["Retry-After"]
    assert run("reset", "k1", "--prefix", "ts:",
               url=redis_server.url).returncode == EX_OK
    r = http_get(a.url("/limited/ok.txt"), headers=hdr)
    assert r.status_code == 200
    assert r.headers["X-RateLimit-Remaining"] == "2"
    a.assert_log_clean()


# --route reaches the module's TBucketRouteLimit bucket of the same client.
def test_tool_002_02_shares_route_bucket(apache_factory, redis_server):
    a = apache_factory()
    a.start(module_conf(redis_server, "tr:"))
    hdr = {"X-API-Key": "k2"}
    p = run("take", "k2", "--capacity", "2", "--rate", "1/h", "--prefix",
            "tr:", "--route", "export", url=redis_server.url)
    assert p.returncode == EX_OK
    assert http_get(a.url("/api/export/ok.txt"),
                    headers=hdr).status_code == 200
    assert http_get(a.url("/api/export/ok.txt"),
                    headers=hdr).status_code == 429
    keys = sorted(redis_server.client().keys("*"))
    assert keys == [b"tr:{k2}", b"tr:{k2}:route:export"]
    a.assert_log_clean()


# The tool and the shim reach Redis through the host's coalescer
# (coalesce=on) by its unix socket, as the children do: a token the tool
# takes there, and one a connect() under the shim takes, are missing for
# the module, and Redis sees only the coalescer's connection.
def test_tool_002_03_through_coalescer(apache_factory, redis_server,
                                       tmp_path):
    a = apache_factory(mpm="prefork")
    a.start(module_conf(redis_server, "tc:").replace(
        "timeout=500", "timeout=500 coalesce=on"))
    # The coalescer binds its socket once forked: wait for it (bounded).
    paths = wait_until(lambda: glob.glob(os.path.join(
        a.root, "run", "tbucket", "coal-*.sock")), timeout=10)
    assert paths and len(paths) == 1, paths
    url = "unix:" + paths[0]
    lim = ["--capacity", "3", "--rate", "1/h", "--prefix", "tc:"]
    assert run("take", "k3", *lim, url=url).returncode == EX_OK
    r = http_get(a.url("/limited/ok.txt"), headers={"X-API-Key": "k3"})
    assert (r.status_code, r.headers["X-RateLimit-Remaining"]) == (200, "1")
    assert run("take", "k3", *lim, url=url).returncode == EX_OK
    p = run("take", "k3", *lim, url=url)
    assert p.returncode == EX_TEMPFAIL, (p.stdout, p.stderr)
    r = http_get(a.url("/limited/ok.txt"), headers={"X-API-Key": "k3"})
    assert r.status_code == 429
    # A shim rule's bucket, taken by a connect() under the shim and by the
    # tool's --rule, both through the socket.
    port = free_port()
    conf = tmp_path / "shim.conf"
    conf.write_text(
        'redis_url = "%s";\nprefix = "tc:";\ntimeout_ms = 2000;\n'
        'outbound = ( { host = "127.0.0.1"; port = %d; capacity = 3;'
        ' rate = "1/h"; } );\n' % (url, port))
    subprocess.run(["/usr/bin/python3", "-c", CONNECT % port], timeout=20,
                   env=shim_env(conf, foreign=True), check=True)
    p = run("take", "--config", str(conf), "--rule", "out1")
    assert p.returncode == EX_OK and fields(p.stdout)["remaining"] == "1", \
        (p.stdout, p.stderr)
    keys = sorted(redis_server.client().keys("*"))
    assert len(keys) == 2 and keys[0].startswith(b"tc:out:out1:") \
        and keys[1] == b"tc:{k3}", keys
    clients = redis_server.client().client_list()
    # The test's own client and the coalescer's connection.
    assert len(clients) == 2, clients
    a.assert_log_clean()
