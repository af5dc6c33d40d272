"""test_shim_clients_inbound.py -- inbound rules in front of real servers:
nginx (2 workers, epoll, `multi_accept on`, non-blocking listener) and
Apache prefork (blocking accept in each child), flooded with new
connections far above the limit under `http429` and `close`. The server
admits no more than the bucket allows, never stalls (a second client
from another loopback address is served all along), and every refused
client gets its 429 or a closed connection."""
import socket
import threading
import time

import pytest

from tbtest.nginx import Nginx
from tbtest.shim import ShimApache, cli, plain_env, shim_env, write_conf

FLOOD_SECS = 2.0
FLOOD_THREADS = 8
PROBE_ADDR = "127.0.0.2"


def in_rule(port, action, capacity, rate):
    return ('inbound = ( { name = "web"; port = %d; key = "$peer"; '
            'capacity = %d; rate = %d; action = "%s"; } );'
            % (port, capacity, rate, action))


def probe(port, stop, out):
    """Every 100 ms, one GET from PROBE_ADDR (its own $peer bucket, never
    empty at this pace): its latency shows whether the server stalls."""
    while not stop.is_set() and len(out) < 200:
        t0 = time.monotonic()
        status = "error"
        try:
            with socket.socket() as s:
                s.settimeout(3)
                s.bind((PROBE_ADDR, 0))
                s.connect(("127.0.0.1", port))
                s.sendall(b"GET / HTTP/1.0\r\nHost: x\r\n\r\n")
                data = b""
                while len(data) < 4096:
                    chunk = s.recv(4096)
                    if not chunk:
                        break
                    data += chunk
                status = data.split(b" ", 2)[1].decode() if data else "eof"
        except OSError as e:
            status = type(e).__name__
        out.append((status, time.monotonic() - t0))
        stop.wait(0.1)


def flood(progs, port):
    """FLOOD_THREADS clients opening new connections back to back for
    FLOOD_SECS (at most 20000 each), every one sending a GET and sorting
    the reply: served, 429, closed, or stalled (2 s of silence). A probe
    from another address runs alongside. Returns (summary, probes, s)."""
    stop = threading.Event()
    probes = []
    t = threading.Thread(target=probe, args=(port, stop, probes),
                         daemon=True)
    t.start()
    t0 = time.monotonic()
    try:
        (s,), _ = cli(progs, ["-r", "-t", FLOOD_THREADS, "-T", FLOOD_SECS,
                              "127.0.0.1", port, 20000], plain_env(),
                      timeout=60)
    finally:
        took = time.monotonic() - t0
        stop.set()
        t.join(10)
    return s, probes, took


def check_flood(what, s, probes, took, admitted, capacity, rate, action):
    bound = capacity + rate * took
    refused = s["ok"] - s["served"]
    slow = max(d for _, d in probes)
    print("\n%s: %d new connections in %.2f s (%.0f/s), admitted %d, "
          "bound %.1f; refused %d: %d got 429, %d closed, %d stalled; "
          "probe %d/%d served, slowest %.0f ms"
          % (what, s["ok"] + s["fail"], took, (s["ok"] + s["fail"]) / took,
             admitted, bound, refused, s["r429"], s["closed"], s["stalled"],
             sum(1 for st, _ in probes if st == "200"), len(probes),
             slow * 1000))
    assert s["fail"] == 0, s
    assert s["ok"] >= 10 * bound, s          # far above the limit
    assert s["served"] == admitted, (s, admitted)
    # The readiness check before the flood took one token of the bucket.
    assert capacity - 1 <= admitted <= bound, (admitted, bound)
    assert s["stalled"] == 0, s
    if action == "http429":
        assert (s["r429"], s["closed"]) == (refused, 0), s
    else:
        assert (s["closed"], s["r429"]) == (refused, 0), s
    assert len(probes) >= 5 and all(st == "200" for st, _ in probes), \
        probes
    # A server that stalls leaves the probe waiting for seconds; on a
    # loaded 2-core machine a served probe took up to 0.5 s.
    assert slow < 1.5, probes


# test_shim_320_01 (slow, ~2 s of flood each): nginx under an inbound rule
# keyed on the peer: the flood is admitted within capacity + rate x T, the
# rest get a 429 or a closed connection, and a client from 127.0.0.2 is
# served throughout with no stall.
@pytest.mark.slow
@pytest.mark.parametrize("action", ["http429", "close"])
def test_shim_320_01(redis_server, progs, tmp_path, action):
    capacity, rate = 20, 10
    n = Nginx(None)
    try:
        conf = write_conf(tmp_path / "s.conf", redis_server,
                          in_rule(n.port, action, capacity, rate))
        n.env = shim_env(conf, foreign=True)
        n.start()
        s, probes, took = flood(progs, n.port)
        seen = n.requests()
        err = n.read(n.error_log)
    finally:
        n.cleanup()
    admitted = sum(1 for r in seen if r[1] == "127.0.0.1" and r[2] == 200)
    check_flood("nginx " + action, s, probes, took, admitted, capacity,
                rate, action)
    assert "[emerg]" not in err and "[alert]" not in err, err


# test_shim_320_02 (slow, ~2 s of flood each): the same against Apache
# prefork (4 children, each in a blocking accept()).
@pytest.mark.slow
@pytest.mark.parametrize("action", ["http429", "close"])
def test_shim_320_02(redis_server, progs, tmp_path, action):
    capacity, rate = 20, 10
    a = ShimApache(None, mpm="prefork", servers=4)
    try:
        a.shim_conf = write_conf(tmp_path / "s.conf", redis_server,
                                 in_rule(a.port, action, capacity, rate))
        a.start("KeepAlive Off\n")
        s, probes, took = flood(progs, a.port)
        # (the lines check_flood counts as admitted: the flood's, not the
        # probe's, which comes from another address)
        seen = [l.split() for l in a.access_text(
            until=lambda t: t.count("127.0.0.1 200 ") >= s["served"]
        ).splitlines()]
        a.assert_log_clean()
    finally:
        a.cleanup()
    admitted = sum(1 for l in seen if l[:2] == ["127.0.0.1", "200"])
    check_flood("apache prefork " + action, s, probes, took, admitted,
                capacity, rate, action)
