"""test_shim_release.py -- when an inbound connection's concurrency slot
or local place comes back, and what happens when the shim cannot keep
track of one.

A client that makes one request at a time must never be refused by a
limit of 1: the slot (`concurrency`, in Redis) and the place
(`local_concurrency`, in shared memory) of its last connection must be
free again by the time its next connection is decided, whichever end
closes first. The daemons are real servers under LD_PRELOAD: thread_srv
(a thread per connection beside a blocking accept()), the Python HTTP
daemon of tbtest.shim (an event loop) and prefork_srv (pre-forked workers
that accept from one listener). Refusals are answered (`http429`), so a
refused request reads "429" or "503" where a served one reads "200 OK".

The slots a process holds are kept in a table sized from its descriptor
limit; a connection the table has no room for is refused and counted."""
import resource
import socket

import pytest

from tbtest.env import free_port
from tbtest.shim import (Proc, http_ask, http_daemon, in_rule, shim_env,
                         write_conf)

N = 300

LIMITS = {"concurrency": {"concurrency": 1},
          "local_concurrency": {"local_concurrency": 1}}


def conf_for(tmp_path, redis_server, port, limit, **kw):
    """A config with one inbound rule on port: `limit` of 1, answered
    http429 (503 for a local refusal); kw more of the rule."""
    fields = dict(LIMITS[limit], action="http429", **kw)
    return write_conf(tmp_path / "s.conf", redis_server,
                      "inbound = ( %s );" % in_rule(port, **fields))


def limited_port(tmp_path, redis_server, limit, **kw):
    """A free port and conf_for() it: (port, config path)."""
    port = free_port()
    return port, conf_for(tmp_path, redis_server, port, limit, **kw)


def one_request(port, server_closes):
    """One request on a new connection; its status line. The client
    closes first (after reading the answer by its Content-Length), or the
    server does (Connection: close; the client then reads to the end)."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        status = http_ask(s, close=server_closes)
        if server_closes and status.startswith("HTTP/1.1 200"):
            while s.recv(4096):
                pass
    return status


def thread_srv(progs, conf, port):
    """thread_srv on port under the shim with config conf."""
    return Proc([progs["thread_srv"], "-p", str(port)], shim_env(conf))


def sequential(srv, port, server_closes):
    """N requests one after the other through srv, stopped after them:
    none may be refused, and the daemon says nothing on stderr."""
    try:
        statuses = [one_request(port, server_closes) for _ in range(N)]
    finally:
        out, err = srv.stop()
    assert refusals(statuses) == [], (len(refusals(statuses)),
                                      refusals(statuses)[:3], err[-500:])
    assert err == "", err
    return out


def refusals(statuses):
    return [s for s in statuses if s != "HTTP/1.1 200 OK"]


# test_shim_530_01: N requests one after the other, each on a new
# connection the client closes first after reading the answer, to a
# daemon with a thread per connection (the accepting thread decides while
# the serving thread has not yet seen the end): none is refused by a
# limit of 1.
@pytest.mark.parametrize("limit", sorted(LIMITS))
def test_shim_530_01(redis_server, progs, tmp_path, limit):
    port, conf = limited_port(tmp_path, redis_server, limit)
    out = sequential(thread_srv(progs, conf, port), port, False)
    assert "served %d" % N in out


# test_shim_530_02: the same against an event loop (selectors on a
# non-blocking listener), the client closing first, then the daemon.
@pytest.mark.parametrize("server_closes", [False, True])
@pytest.mark.parametrize("limit", sorted(LIMITS))
def test_shim_530_02(redis_server, tmp_path, limit, server_closes):
    port, conf = limited_port(tmp_path, redis_server, limit)
    out = sequential(http_daemon(tmp_path, conf, port), port, server_closes)
    assert "served %d" % N in out


# test_shim_530_03: the daemon closes first (prefork_srv closes on "bye",
# the client waits for the end) and the next connection is accepted by
# another of its three processes: the slot and the place are free before
# the client can see the end. Then the thread daemon with Connection:
# close, where another thread accepts.
@pytest.mark.parametrize("limit", sorted(LIMITS))
def test_shim_530_03(redis_server, progs, tmp_path, limit):
    port, conf = limited_port(tmp_path, redis_server, limit, key="all")
    srv = Proc([progs["prefork_srv"], "-p", str(port), "-w", "3"],
               shim_env(conf))
    got = []
    try:
        for _ in range(N):
            with socket.create_connection(("127.0.0.1", port),
                                          timeout=5) as s:
                data = s.recv(256)
                got.append(data.split(b" ")[0].decode(errors="replace")
                           or "closed")
                if data.startswith(b"OK "):
                    s.sendall(b"bye\n")
                    assert s.recv(16) == b""
    finally:
        out, err = srv.stop()
    bad = [g for g in got if g != "OK"]
    assert bad == [], (len(bad), bad[:3])
    assert "served %d " % N in out, out
    assert err == "", err
    port, conf = limited_port(tmp_path, redis_server, limit)
    sequential(thread_srv(progs, conf, port), port, True)


# test_shim_530_04: N requests on one kept-alive connection: one slot,
# held for the connection's life, and no request refused; a second
# connection meanwhile is.
@pytest.mark.parametrize("limit", sorted(LIMITS))
def test_shim_530_04(redis_server, progs, tmp_path, limit):
    port, conf = limited_port(tmp_path, redis_server, limit)
    srv = thread_srv(progs, conf, port)
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
            statuses = [http_ask(s) for _ in range(N)]
            second = one_request(port, False)
    finally:
        out, err = srv.stop()
    assert refusals(statuses) == []
    assert second.startswith("HTTP/1.1 429" if limit == "concurrency"
                             else "HTTP/1.1 503"), second
    assert err == "", err


def idle_from(port, addrs, per_addr):
    """per_addr idle connections from each loopback address of addrs
    (the client never sends); the sockets."""
    socks = []
    for a in addrs:
        for _ in range(per_addr):
            s = socket.socket()
            s.bind((a, 0))
            s.settimeout(5)
            s.connect(("127.0.0.1", port))
            socks.append(s)
    return socks


def kept(socks):
    """How many of the idle connections socks the daemon kept: neither
    answered nor closed. Call it once every one was decided (the event
    loop accepts in order: a later connection was answered)."""
    n = 0
    for s in socks:
        s.setblocking(False)
        try:
            s.recv(64, socket.MSG_PEEK)
        except BlockingIOError:
            n += 1
        except ConnectionResetError:
            pass
    return n


def http_daemon_limited(tmp_path, conf, port, start, later):
    """http_daemon started with a (soft) descriptor limit of `start`, as
    `ulimit -Sn` sets it, which it raises to `later` itself."""
    def limit():
        hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
        resource.setrlimit(resource.RLIMIT_NOFILE, (start, hard))
    return http_daemon(tmp_path, conf, port, preexec_fn=limit,
                       SRV_NOFILE=later)


# test_shim_530_05: the table of held slots is sized from the descriptor
# limit the program starts with (64 here); a program that raises its
# limit later (as nginx and the JVM do) and then holds more connections
# than that has them refused -- the rule's action -- and counted, never
# let through uncounted. A client with `concurrency = 2` then gets none
# of 20 connections; stopped, the daemon's shim says how many it refused.
def test_shim_530_05(redis_server, tmp_path):
    port = free_port()
    conf = write_conf(tmp_path / "s.conf", redis_server,
                      "inbound = ( %s );" % in_rule(port, concurrency=2,
                                                   action="http429"))
    srv = http_daemon_limited(tmp_path, conf, port, 64, 1024)
    rc = redis_server.client()
    socks = []
    try:
        socks = idle_from(port, ["127.0.%d.%d" % (1 + i // 200, 2 + i % 200)
                                 for i in range(40)], 2)
        client = idle_from(port, ["127.0.9.9"], 20)
        one_request(port, True)
        held = kept(socks)
        answers = [s.recv(64).split(b"\r\n")[0] for s in client]
        socks += client
        slots = rc.zcard("tb:shim:in:web:{127.0.9.9}:conc")
    finally:
        for s in socks:
            s.close()
        out, err = srv.stop()
    assert held == 64, held
    assert answers == [b"HTTP/1.1 503 Service Unavailable"] * 20, answers
    assert slots == 0
    lines = err.splitlines()
    assert len(lines) == 2, err
    assert ('rule "web": no room to keep the concurrency slot or place of '
            'fd ') in lines[0], err
    assert ("%d connections refused: no room to keep their concurrency "
            "slot or place (a table of 64 connections" % (80 - held + 20 + 1)
            in lines[1]), err


# test_shim_530_06: the same client past 4,096 held connections (4,200
# idle ones from 2,100 addresses, in a daemon whose descriptor limit is
# 5,000): its `concurrency = 2` still holds.
@pytest.mark.slow
def test_shim_530_06(redis_server, tmp_path):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 5000:
        pytest.fail("RLIMIT_NOFILE hard limit %d < 5000: raise it" % hard)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 5000), hard))
    port = free_port()
    conf = write_conf(tmp_path / "s.conf", redis_server,
                      "inbound = ( %s );" % in_rule(port, concurrency=2,
                                                   action="http429"))
    srv = http_daemon(tmp_path, conf, port)
    rc = redis_server.client()
    socks = []
    try:
        socks = idle_from(port, ["127.%d.%d.%d" % (1 + i // 40000,
                                                   1 + i // 200 % 200,
                                                   2 + i % 200)
                                 for i in range(2100)], 2)
        # The loop accepts in order: once this is answered, every idle
        # connection before it was decided.
        assert one_request(port, True) == "HTTP/1.1 200 OK"
        keys = len(rc.keys("tb:shim:in:web:*"))
        client = idle_from(port, ["127.0.250.9"], 20)
        socks += client
        one_request(port, True)
        held = kept(client)
        slots = rc.zcard("tb:shim:in:web:{127.0.250.9}:conc")
    finally:
        for s in socks:
            s.close()
        out, err = srv.stop()
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    assert (keys, held, slots) == (2100, 2, 2)
    assert err == "", err
