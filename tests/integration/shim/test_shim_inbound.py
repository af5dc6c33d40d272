"""test_shim_inbound.py -- inbound rules: a real daemon under LD_PRELOAD,
its accept() limited by a shared bucket; a client opens many connections
quickly and counts which were served, closed or answered 429."""
import socket
import subprocess
import sys
import time

import pytest

from tbtest.env import free_port
from tbtest.shim import (Proc, bucket, cli, http_ask, http_daemon, in_rule,
                         inbound, plain_env, redis_clients, shim_env, tb_srv,
                         write_conf)


def rule(port, **kw):
    """Inbound rule "web" on port: capacity 5 at 2/s unless kw says."""
    return in_rule(port, **dict({"capacity": 5, "rate": "2/s"}, **kw))


def burst(progs, port, n, *flags):
    """tb_cli's n connections at once (flags added); its summary and the
    seconds it took."""
    t0 = time.monotonic()
    (s,), _ = cli(progs, ["-r"] + list(flags) + ["127.0.0.1", port, n],
                  plain_env())
    return s, time.monotonic() - t0


def within(served, capacity, rate, seconds):
    """The accepted count a bucket allows in `seconds`: capacity plus the
    refill, plus one for a token that lands on the boundary."""
    return served <= capacity + rate * seconds + 1


# test_shim_100_01: action `close`: the daemon serves at most capacity +
# rate*T of a quick burst; the rest are closed before it sees them, and the
# daemon's accept() goes on waiting (it serves again after a refill).
def test_shim_100_01(redis_server, progs, tmp_path):
    port = free_port()
    conf = write_conf(tmp_path / "s.conf", redis_server,
                      inbound(rule(port)))
    srv = tb_srv(progs, conf, port)
    try:
        s, took = burst(progs, port, 30)
        assert s["ok"] == 30              # the kernel completed every handshake
        assert s["served"] >= 5
        assert within(s["served"], 5, 2, took), (s, took)
        assert s["closed"] == 30 - s["served"] and s["r429"] == 0
        time.sleep(0.6)                   # one token back at 2/s
        (s2,), _ = cli(progs, ["-r", "127.0.0.1", port, 1], plain_env())
        assert s2["served"] == 1
    finally:
        out, err = srv.stop()
    assert "served %d" % (s["served"] + 1) in out
    assert bucket(redis_server, "tb:shim:in:web:{127.0.0.1}")
    assert err == ""


# test_shim_100_02: action `http429`: the refused get a minimal HTTP 429
# with Retry-After and Connection: close.
def test_shim_100_02(redis_server, progs, tmp_path):
    port = free_port()
    conf = write_conf(tmp_path / "s.conf", redis_server,
                      inbound(rule(port, action="http429")))
    srv = tb_srv(progs, conf, port, "-H")
    try:
        s, took = burst(progs, port, 25)
        assert 5 <= s["served"] and within(s["served"], 5, 2, took)
        assert s["r429"] == 25 - s["served"] and s["closed"] == 0
    finally:
        srv.stop()


# test_shim_100_03: a non-blocking listener with accept4() and a poll
# loop: refusals never block the loop; the daemon keeps serving.
def test_shim_100_03(redis_server, progs, tmp_path):
    port = free_port()
    conf = write_conf(tmp_path / "s.conf", redis_server,
                      inbound(rule(port, capacity=3, rate=5)))
    srv = tb_srv(progs, conf, port, "-n", "-4")
    try:
        s, took = burst(progs, port, 10, "-t", "4")
        assert 3 <= s["served"] and within(s["served"], 3, 5, took)
        assert s["served"] + s["closed"] == 40
        time.sleep(0.3)
        (s2,), _ = cli(progs, ["-r", "127.0.0.1", port, 1], plain_env())
        assert s2["served"] == 1
    finally:
        out, _ = srv.stop()
    assert "eagain" in out and int(out.split()[-1]) > 0


# test_shim_100_04: two daemon processes on one port (SO_REUSEPORT) under
# one rule share one limit: together they serve no more than one bucket
# allows, and both talk to Redis.
def test_shim_100_04(redis_server, progs, tmp_path):
    port = free_port()
    conf = write_conf(tmp_path / "s.conf", redis_server,
                      inbound(rule(port, capacity=6, rate=1)))
    a = tb_srv(progs, conf, port, "-R")
    b = tb_srv(progs, conf, port, "-R")
    try:
        s, took = burst(progs, port, 15, "-t", "4")
        assert 6 <= s["served"] and within(s["served"], 6, 1, took)
        assert len(redis_clients(redis_server)) >= 2
    finally:
        out_a, _ = a.stop()
        out_b, _ = b.stop()
    served = [int(o.split()[1]) for o in (out_a, out_b)]
    assert sum(served) == s["served"]


# test_shim_100_05: IPv6: a daemon on ::1 under a rule with address "::1";
# the key is the peer's network, its /64 by default (`ipv6_prefix`), or
# its whole address with ipv6_prefix = 128.
@pytest.mark.parametrize("bits,key", [(None, "::/64"), (128, "::1"),
                                      (8, "::/8")])
def test_shim_100_05(redis_server, progs, tmp_path, bits, key):
    port = free_port()
    extra = {} if bits is None else {"ipv6_prefix": bits}
    conf = write_conf(tmp_path / "s.conf", redis_server,
                      inbound(rule(port, address="::1", capacity=2,
                                      rate="1/h")), **extra)
    srv = Proc([progs["tb_srv"], "-a", "::1", "-p", str(port)],
               shim_env(conf))
    try:
        (s,), _ = cli(progs, ["-r", "::1", port, 6], plain_env())
        assert s["served"] == 2 and s["closed"] == 4
    finally:
        srv.stop()
    keys = [k.decode() for k in redis_server.client().keys("tb:shim:*")]
    assert keys == ["tb:shim:in:web:{%s}" % key]


# test_shim_100_08: an ipv6_prefix out of 1..128 or not a number stops a
# strict program with the file, the line and the setting named.
@pytest.mark.parametrize("bad", ["0", "129", '"64"'])
def test_shim_100_08(redis_server, progs, tmp_path, bad):
    conf = tmp_path / "bad.conf"
    write_conf(conf, redis_server, inbound(rule(free_port())))
    conf.write_text(conf.read_text() + "ipv6_prefix = %s;\n" % bad)
    r = subprocess.run([progs["tb_srv"], "-p", "0"],
                       env=shim_env(str(conf), TBUCKET_STRICT=1),
                       capture_output=True, text=True, timeout=20)
    assert r.returncode == 78, r.stderr
    assert "'ipv6_prefix'" in r.stderr and "bad.conf:" in r.stderr, r.stderr


# test_shim_100_06: a rule whose local address does not match is not
# applied, and a fixed key names one bucket for every peer.
def test_shim_100_06(redis_server, progs, tmp_path):
    port = free_port()
    conf = write_conf(tmp_path / "s.conf", redis_server, inbound(
        rule(port, name="elsewhere", address="127.0.0.2", capacity=1),
        rule(port, name="shared", address="127.0.0.1", capacity=3,
             rate="1/h", key="all-clients")))
    srv = tb_srv(progs, conf, port)
    try:
        (s,), _ = cli(progs, ["-r", "127.0.0.1", port, 5], plain_env())
        assert s["served"] == 3
    finally:
        srv.stop()
    keys = [k.decode() for k in redis_server.client().keys("*")]
    assert keys == ["tb:shim:in:shared:{all-clients}"]


# test_shim_100_07: a forking daemon: the parent's accept() is limited, and
# each forked child connects to a downstream under an outbound rule on its
# own Redis connection; the children together stay within that bucket.
def test_shim_100_07(redis_server, progs, tmp_path):
    down = Proc([progs["tb_srv"]], plain_env())
    port = free_port()
    conf = write_conf(tmp_path / "s.conf", redis_server,
                      inbound(rule(port, capacity=8, rate="1/h")) + "\n"
                      + "outbound = ( { name = \"down\"; host = "
                      "\"127.0.0.1\"; port = %d; capacity = 4; "
                      "rate = \"1/h\"; } );" % down.port)
    srv = tb_srv(progs, conf, port, "-f", "-o", "127.0.0.1:%d" % down.port)
    try:
        (s,), _ = cli(progs, ["-r", "127.0.0.1", port, 12], plain_env())
        assert s["served"] == 4 and s["down"] == 4 and s["closed"] == 4
        b = bucket(redis_server, "tb:shim:out:down:{down}")
        assert b["tokens"] < 1
    finally:
        _, err = srv.stop()
        down_out, _ = down.stop()
    assert "served 4 " in down_out
    assert err == ""


# One address opening idle connections at a steady pace: they connect and
# never send a byte, and stay open until the end (seconds), at most `most`
# of them. Non-blocking connects, so that a full backlog does not slow the
# flood down. Prints "opened N" at the end.
FLOOD = r"""
import resource, socket, sys, time
port, rate, most, secs = (int(sys.argv[1]), float(sys.argv[2]),
                          int(sys.argv[3]), float(sys.argv[4]))
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
if hard != resource.RLIM_INFINITY:
    most = min(most, hard - 64)
resource.setrlimit(resource.RLIMIT_NOFILE, (most + 64, hard))
held, t0 = [], time.monotonic()
while time.monotonic() - t0 < secs:
    wait = t0 + len(held) / rate - time.monotonic()
    if len(held) >= most:
        wait = t0 + secs - time.monotonic()
    if wait > 0:
        time.sleep(wait)
        continue
    s = socket.socket()
    s.setblocking(False)
    s.bind(("127.0.0.2", 0))
    try:
        s.connect(("127.0.0.1", port))
    except BlockingIOError:
        pass
    held.append(s)
print("opened", len(held), flush=True)
"""


def timed_requests(port, n, pause):
    """n requests from 127.0.0.1, each on a new connection, pause seconds
    apart: their status lines and latencies (s); a timeout counts 15 s."""
    status, lat = [], []
    for _ in range(n):
        t0 = time.monotonic()
        try:
            with socket.create_connection(("127.0.0.1", port),
                                          timeout=15) as s:
                status.append(http_ask(s, close=True))
        except OSError as e:
            status.append(repr(e))
        lat.append(time.monotonic() - t0)
        time.sleep(pause)
    return status, lat


# test_shim_100_09: action `http429` under an event loop (selectors on a
# non-blocking listener): one address flooding idle connections, refused
# by its concurrency limit, never stalls the loop; another client's
# requests stay fast (the worst under 1 s, where a 429 that waited for
# each idle client's request cost seconds).
@pytest.mark.slow
def test_shim_100_09(redis_server, tmp_path):
    port = free_port()
    conf = write_conf(tmp_path / "s.conf", redis_server,
                      inbound(rule(port, capacity=None, rate=None,
                                   concurrency=2, action="http429")))
    srv = http_daemon(tmp_path, conf, port)
    (tmp_path / "flood.py").write_text(FLOOD)
    flood = None
    try:
        quiet, quiet_lat = timed_requests(port, 20, 0.02)
        flood = subprocess.Popen([sys.executable, str(tmp_path / "flood.py"),
                                  str(port), "1000", "3000", "4"],
                                 stdout=subprocess.PIPE, text=True,
                                 env=plain_env())
        time.sleep(0.5)
        loaded, lat = timed_requests(port, 40, 0.05)
        opened = int(flood.communicate(timeout=60)[0].split()[1])
    finally:
        if flood is not None and flood.poll() is None:
            flood.kill()
            flood.wait()
        out, err = srv.stop()
    print("\nunloaded: median %.1f ms, worst %.1f ms; under a flood of %d "
          "idle connections: median %.1f ms, worst %.1f ms"
          % (1000 * sorted(quiet_lat)[10], 1000 * max(quiet_lat), opened,
             1000 * sorted(lat)[20], 1000 * max(lat)))
    assert quiet == ["HTTP/1.1 200 OK"] * 20
    assert loaded == ["HTTP/1.1 200 OK"] * 40, loaded
    assert opened >= 2000, opened
    assert max(lat) < 1.0, lat
    assert err == "", err
