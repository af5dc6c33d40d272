"""test_shim_local.py -- inbound `local_concurrency = N`: at most N
connections of a rule open at once across every process of one host
program, counted in shared memory without Redis.

The daemon is prefork_srv (tests/integration/progs) under LD_PRELOAD: a
parent that forks workers, each accepting from the shared listener, greeting
a connection with "OK <pid>" and holding it until the client closes. The
workers count the connections they hold in a shared mapping of the
program's own (not the shim's), and the parent prints the largest total
seen ("peak") when stopped: what the program itself held, beside what the
clients saw. A connection the shim refuses is closed before the program
sees it, or answered 503. No test here needs Redis except those about a
rule that also asks it."""
import os
import select
import signal
import socket
import subprocess
import threading
import time

from tbtest.env import BUILD, free_port
from tbtest.shim import (Proc, ShimApache, assert_strict_refusal, in_rule,
                         shim_env, write_conf)

TOOL = os.path.join(BUILD, "tbucket")


def group(port, **kw):
    """One inbound rule as libconfig text: "web", N = 3 unless kw says."""
    return in_rule(port, **dict({"local_concurrency": 3}, **kw))


def rule(port, **kw):
    return "inbound = ( %s );" % group(port, **kw)


def prefork(progs, conf, port, workers=3, max_held=64):
    """prefork_srv on port under the shim with config conf."""
    return Proc([progs["prefork_srv"], "-p", str(port), "-w", str(workers),
                 "-m", str(max_held)], shim_env(conf))


def stop(srv):
    """Stop the daemon; (its summary as a dict, its stderr)."""
    out, err = srv.stop()
    summary = {}
    for line in out.splitlines():
        words = line.split()
        if words[:1] == ["served"]:
            summary = dict(zip(words[::2], map(int, words[1::2])))
    return summary, err


class Served:
    """A with-block around a prefork_srv of the tests: the sockets put in
    .held are closed and the daemon stopped on leaving, also when the
    test fails; then .summary and .err hold what stop() read."""

    def __init__(self, srv, port):
        self.srv = srv
        self.port = port
        self.held = []

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        close_all(self.held)
        self.summary, self.err = stop(self.srv)

    def take(self, n=1):
        """n connections the program gets, held open; the pids of the
        workers that got them."""
        pids = []
        for _ in range(n):
            what, pid, s = open_conn(self.port)
            assert what == "OK", what
            self.held.append(s)
            pids.append(pid)
        return pids

    def check(self, served, peak=None):
        """The program served `served` connections, held at most `peak`
        at once, and wrote nothing on stderr."""
        if peak is not None:
            assert self.summary["peak"] == peak, self.summary
        assert self.summary["served"] == served, self.summary
        assert self.err == "", self.err


def local_daemon(progs, tmp_path, workers=3, max_held=64, redis=None,
                 scalars=None, **kw):
    """prefork_srv on a free port under rule(port, **kw) as a Served;
    scalars are more settings of the config."""
    port = free_port()
    conf = write_conf(tmp_path / "s.conf", redis, rule(port, **kw),
                      **(scalars or {}))
    return Served(prefork(progs, conf, port, workers, max_held), port)


def open_conn(port, http=False):
    """One connection: ("OK", worker pid, socket) when the program got
    it, else (what the shim answered, or "closed", None, None)."""
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    if http:
        s.sendall(b"GET / HTTP/1.1\r\nHost: localhost\r\n\r\n")
    return read_greeting(s)


def read_greeting(s):
    """open_conn() on a connected socket s."""
    try:
        data = s.recv(256)
        if data.startswith(b"OK "):
            return "OK", int(data.split()[1]), s
        while data:
            chunk = s.recv(4096)
            if not chunk:
                break
            data += chunk
    except ConnectionResetError:
        data = b""
    s.close()
    return (data.decode(errors="replace") or "closed"), None, None


def refused(port, http=False):
    """1 when a new connection is not served (closed or answered)."""
    what, _, s = open_conn(port, http)
    if s is not None:
        s.close()
    return what != "OK"


def accept_eventually(port, timeout=5.0):
    """A connection the program gets within timeout, retried while the
    shim refuses (a place comes back once the program has closed its
    end); its (pid, socket)."""
    deadline = time.monotonic() + timeout
    while True:
        what, pid, s = open_conn(port)
        if what == "OK":
            return pid, s
        assert time.monotonic() < deadline, "still refused: %r" % what
        time.sleep(0.02)


def bye(s):
    """Close a served connection and return once the program has closed
    its end (prefork_srv closes on "bye")."""
    s.sendall(b"bye\n")
    s.settimeout(5)
    assert s.recv(16) == b""
    s.close()


def close_all(socks):
    for s in socks:
        s.close()


def greeted(progs, conf, port, n, *flags, **env):
    """tb_srv (flags added) on port under the shim with config conf (env
    added to its environment), sent n connections one after the other,
    each greeted "OK"; its (stdout, stderr) once stopped."""
    srv = Proc([progs["tb_srv"], "-p", str(port)] + list(flags),
               shim_env(conf, **env))
    try:
        for _ in range(n):
            s = socket.create_connection(("127.0.0.1", port), timeout=5)
            assert s.recv(16) == b"OK\n"
            s.close()
    finally:
        out, err = srv.stop()
    return out, err


def tool(*args):
    """The tbucket tool run with args; its CompletedProcess."""
    return subprocess.run([TOOL] + list(args), capture_output=True,
                          text=True, timeout=20)


# Four workers that hold one connection each, N = 3: three connections are
# served by three different processes, and the fourth worker, idle, is
# refused every connection it accepts: the cap is the program's, not a
# process's. The program never held more than 3.
def test_shim_500_01(progs, tmp_path):
    with local_daemon(progs, tmp_path, workers=4, max_held=1) as d:
        assert len(set(d.take(3))) == 3
        for _ in range(4):
            assert open_conn(d.port)[0] == "closed"
    d.check(served=3, peak=3)


# A burst: 40 connections opened at once against 3 workers, N = 5. Exactly
# 5 are served; the other 35 are closed unseen by the program.
def test_shim_500_02(progs, tmp_path):
    with local_daemon(progs, tmp_path, local_concurrency=5) as d:
        for _ in range(40):
            d.held.append(socket.create_connection(("127.0.0.1", d.port),
                                                   timeout=5))
        results = [read_greeting(s) for s in d.held]
        ok = [r for r in results if r[0] == "OK"]
        assert len(ok) == 5, [r[0] for r in results]
        assert all(r[0] == "closed" for r in results if r[0] != "OK")
    d.check(served=5, peak=5)


# Closing gives the place back, once: in one worker with N = 2, a closed
# connection's place serves the next one, and no more than that (a place
# given back twice would let a third connection in). The program closes
# first ("bye"): a connection the client closed first may be counted as
# gone before the program closes it (test_shim_release.py), and the
# program would hold one more than N for that moment.
def test_shim_500_03(progs, tmp_path):
    with local_daemon(progs, tmp_path, workers=1, local_concurrency=2) as d:
        d.take(2)
        assert refused(d.port)
        for _ in range(5):
            bye(d.held.pop(0))
            d.held.append(accept_eventually(d.port)[1])
            assert refused(d.port)
        for s in d.held:
            bye(s)
        d.held[:] = [accept_eventually(d.port)[1]]
        d.held.append(accept_eventually(d.port)[1])
        assert refused(d.port)
    d.check(served=9, peak=2)


# kill -9 of a worker holding places: the places are not leaked. Once the
# parent has reaped it, a taker that finds the table full frees the dead
# worker's places, and connections are served up to N again -- not beyond.
def test_shim_500_04(progs, tmp_path):
    with local_daemon(progs, tmp_path, workers=2, local_concurrency=4) as d:
        pids = d.take(4)
        assert refused(d.port)
        victim = max(set(pids), key=pids.count)
        lost = pids.count(victim)
        os.kill(victim, signal.SIGKILL)
        respawn = d.srv.wait_line("respawn")
        assert respawn and respawn[1] == str(victim), respawn
        for pid, s in zip(pids, list(d.held)):
            if pid == victim:
                s.settimeout(5)
                try:
                    assert s.recv(16) == b""
                except ConnectionResetError:
                    pass
        for _ in range(lost):
            pid, s = accept_eventually(d.port)
            # The dead child's places came back to live processes.
            assert pid != victim, pid
            d.held.append(s)
        assert refused(d.port)
        assert len(d.held) - lost == 4
    d.check(served=4 + lost, peak=4)


# action = "http429": a local refusal answers 503 Service Unavailable with
# Retry-After: 1 and Connection: close (the server is full; the client is
# not over a limit of its own).
def test_shim_500_05(progs, tmp_path):
    with local_daemon(progs, tmp_path, workers=2, local_concurrency=1,
                      action="http429") as d:
        what, _, s = open_conn(d.port, http=True)
        assert what == "OK"
        d.held.append(s)
        for _ in range(3):
            answer = open_conn(d.port, http=True)[0]
            head, _, body = answer.partition("\r\n\r\n")
            lines = head.split("\r\n")
            assert lines[0] == "HTTP/1.1 503 Service Unavailable", answer
            assert "Retry-After: 1" in lines[1:], answer
            assert "Connection: close" in lines[1:], answer
            assert "Content-Length: %d" % len(body) in lines[1:], answer
            assert body == "Service Unavailable\n"
    d.check(served=1)


# With no Redis at all (nothing listens on redis_url, and the policy is
# closed), a rule with local_concurrency alone still serves N and refuses
# the rest: it never asks Redis, so nothing is reported either.
def test_shim_500_06(progs, tmp_path):
    with local_daemon(progs, tmp_path, workers=2, local_concurrency=2,
                      scalars={"policy": "closed", "strict": True}) as d:
        d.take(2)
        assert refused(d.port)
        bye(d.held.pop())
        d.held.append(accept_eventually(d.port)[1])
        assert refused(d.port)
    d.check(served=3, peak=2)


def redis_calls(rc):
    """Commands Redis has run, the INFO calls asking excepted."""
    stats = rc.info("commandstats")
    return sum(v["calls"] for k, v in stats.items()
               if k not in ("cmdstat_info",))


# With a rate too, the local cap is asked first: a connection it refuses
# makes no Redis call (Redis's command count and the bucket do not move),
# and one it lets through takes its token as before.
def test_shim_500_07(redis_server, progs, tmp_path):
    rc = redis_server.client()
    key = "tb:shim:in:web:{all}"
    with local_daemon(progs, tmp_path, workers=2, redis=redis_server,
                      local_concurrency=2, capacity=100, rate="1/h",
                      key="all", action="http429") as d:
        d.take(2)
        assert round(float(rc.hget(key, "tokens"))) == 98
        before = redis_calls(rc)
        for _ in range(10):
            answer = open_conn(d.port, http=True)[0]
            assert answer.startswith("HTTP/1.1 503 "), answer
        assert redis_calls(rc) == before
        assert round(float(rc.hget(key, "tokens"))) == 98
        bye(d.held.pop())
        d.held.append(accept_eventually(d.port)[1])
        assert redis_calls(rc) > before
        assert round(float(rc.hget(key, "tokens"))) == 97
    d.check(served=3, peak=2)


# A place taken is given back when Redis then refuses: with a Redis
# `concurrency = 1` under a local 2, and with an empty bucket under a
# local 3, every refusal is Redis's 429 -- a place kept by a refused
# connection would turn the next refusal into the local 503.
def test_shim_500_08(redis_server, progs, tmp_path):
    p1, p2 = free_port(), free_port()
    body = "inbound = ( %s,\n  %s );" % (
        group(p1, local_concurrency=2, concurrency=1, key="all",
              action="http429"),
        group(p2, name="api", local_concurrency=3, capacity=1, rate="1/h",
              key="all", action="http429"))
    conf = write_conf(tmp_path / "s.conf", redis_server, body)
    with Served(prefork(progs, conf, p1, workers=2), p1) as d1, \
            Served(prefork(progs, conf, p2, workers=2), p2) as d2:
        d1.take()
        rc = redis_server.client()
        for _ in range(6):
            answer = open_conn(p1, http=True)[0]
            assert answer.startswith("HTTP/1.1 429 "), answer
        assert rc.zcard("tb:shim:in:web:{all}:conc") == 1
        d1.held.pop().close()
        d1.held.append(accept_eventually(p1)[1])
        d2.take()
        for _ in range(6):
            answer = open_conn(p2, http=True)[0]
            assert answer.startswith("HTTP/1.1 429 "), answer
    d1.check(served=2)
    d2.check(served=1)


# An inetd-style daemon (tb_srv -f) accepts in the parent and serves in a
# child it forks: the place belongs to the parent, which gives it back
# when it closes its copy; the child's copy holds nothing, so its close
# gives nothing back twice. With N = 1 every connection is served.
def test_shim_500_09(progs, tmp_path):
    port = free_port()
    conf = write_conf(tmp_path / "s.conf", None,
                      rule(port, local_concurrency=1))
    out, err = greeted(progs, conf, port, 5, "-f")
    assert "served 5" in out and err == "", (out, err)


# The config: local_concurrency alone is a rule; 0, a negative, a word, a
# fraction and more than 1048576 are refused naming the setting and the
# value; outbound rules do not take it. The tbucket tool reads the same
# files with the same loader: it refuses the bad ones alike and works
# with the good one.
def test_shim_500_10(redis_server, progs, tmp_path):
    port = free_port()
    bad = (
        (rule(port, local_concurrency=0),
         "'local_concurrency' = 0 is out of range 1..1048576"),
        (rule(port, local_concurrency=-3),
         "'local_concurrency' = -3 is out of range 1..1048576"),
        (rule(port, local_concurrency="many"),
         "'local_concurrency' = \"many\" must be a whole number or "
         "\"auto\""),
        (rule(port, local_concurrency=4, local_concurrency_max=8),
         "'local_concurrency_min' and 'local_concurrency_max' need "
         "local_concurrency = \"auto\""),
        (rule(port, local_concurrency="auto", local_concurrency_min=5,
              local_concurrency_max=3),
         "local_concurrency_min = 5 is more than local_concurrency_max = 3"),
        (rule(port, local_concurrency="auto", local_concurrency_max=0),
         "'local_concurrency_max' = 0 is out of range 1..1048576"),
        (rule(port, local_concurrency=2.5),
         "'local_concurrency' = 2.5 must be a whole number"),
        (rule(port, local_concurrency=1048577),
         "'local_concurrency' = 1048577 is out of range 1..1048576"),
        (rule(port, local_concurrency=5, capacity=5),
         "needs both 'capacity' and 'rate'"),
        ("outbound = ( { port = %d; capacity = 1; rate = 1; "
         "local_concurrency = 2; } );" % port,
         "unknown setting 'local_concurrency' in an outbound rule"))
    for body, why in bad:
        conf = write_conf(tmp_path / "bad.conf", redis_server, body)
        assert_strict_refusal(progs, conf, why)
        t = tool("reset", "k", "--config", conf)
        assert t.returncode == 78 and why in t.stderr, (body, t.stderr)
    # Not strict: one line, and the program runs unlimited.
    conf = write_conf(tmp_path / "bad.conf", redis_server,
                      rule(port, local_concurrency=0))
    out, err = greeted(progs, conf, port, 3)
    assert "served 3" in out
    assert "'local_concurrency' = 0 is out of range" in err
    assert "running unlimited" in err
    assert len(err.strip().splitlines()) == 1, err
    # The largest value is a rule, with Redis concurrency or alone; the
    # tool takes the rule's prefix (no bucket: KEY and limits come from
    # the command line).
    conf = write_conf(tmp_path / "ok.conf", redis_server,
                      rule(port, local_concurrency=1048576))
    out, err = greeted(progs, conf, port, 1, TBUCKET_STRICT=1)
    assert "served 1" in out and err == "", (out, err)
    rc = redis_server.client()
    rc.hset("tb:shim:in:web:{k}", "tokens", 1)
    t = tool("reset", "k", "--config", conf, "--rule", "web")
    assert t.returncode == 0, t.stderr
    assert not rc.exists("tb:shim:in:web:{k}")
    t = tool("take", "k", "--config", conf, "--rule", "in:web",
             "--capacity", "2", "--rate", "1/s")
    assert t.returncode == 0 and t.stdout.startswith("allowed"), t
    assert rc.exists("tb:shim:in:web:{k}")


# A program that closes a connection by a path the close() wrapper does
# not see (the raw system call here; close_range() or fclose() of an
# fdopen()ed socket alike) leaves the place taken, but the next
# connection accepted on that fd number gives it back: with N = 2,
# connections one after the other are served without end.
def test_shim_500_11(progs, tmp_path):
    port = free_port()
    conf = write_conf(tmp_path / "s.conf", None,
                      rule(port, local_concurrency=2))
    srv = Proc([progs["prefork_srv"], "-p", str(port), "-w", "1", "-r"],
               shim_env(conf))
    with Served(srv, port) as d:
        for _ in range(6):
            what, _, s = open_conn(port)
            assert what == "OK"
            bye(s)
    d.check(served=6)


def readable(socks, wait):
    """The sockets of socks with something to read within wait seconds."""
    r, _, _ = select.select(socks, [], [], wait)
    return r


def half_request(port, timeout=5.0):
    """A connection with half a request sent that Apache holds, waiting
    for the rest: retried while the shim answers at once (the place of
    a connection Apache is just closing may not be back yet)."""
    deadline = time.monotonic() + timeout
    while True:
        s = socket.create_connection(("127.0.0.1", port), timeout=5)
        s.sendall(b"GET /ok.txt HTTP/1.0\r\n")
        if not readable([s], 0.5):
            return s
        answer = read_greeting(s)[0]
        assert time.monotonic() < deadline, answer
        time.sleep(0.05)


# Apache prefork, the daemon the setting is for: its children share the
# N = 2 places. Two clients that send half a request are held by two
# children, which wait for the rest; a third is answered 503 by the shim
# at once. Completed, the two are served, and once Apache has closed them
# the places serve new clients.
def test_shim_500_12(tmp_path):
    a = ShimApache(None, mpm="prefork", servers=4)
    socks = []
    try:
        a.shim_conf = write_conf(tmp_path / "s.conf", None,
                                 rule(a.port, local_concurrency=2,
                                      action="http429"))
        a.start("KeepAlive Off\n")
        socks = [half_request(a.port), half_request(a.port)]
        s = socket.create_connection(("127.0.0.1", a.port), timeout=5)
        s.sendall(b"GET /ok.txt HTTP/1.0\r\n")
        assert readable([s], 5.0) == [s]
        answer = read_greeting(s)[0]
        assert answer.startswith("HTTP/1.1 503 Service Unavailable\r\n")
        assert "\r\nRetry-After: 1\r\n" in answer
        assert readable(socks, 0.3) == []
        for s in socks:
            s.sendall(b"Host: x\r\n\r\n")
            answer = read_greeting(s)[0]
            assert answer.startswith("HTTP/1.1 200 ") and \
                answer.endswith("\r\n\r\nok\n"), answer
        for _ in range(4):
            deadline = time.monotonic() + 5
            while True:
                s = socket.create_connection(("127.0.0.1", a.port),
                                             timeout=5)
                s.sendall(b"GET /ok.txt HTTP/1.0\r\nHost: x\r\n\r\n")
                answer = read_greeting(s)[0]
                if answer.startswith("HTTP/1.1 200 "):
                    break
                assert time.monotonic() < deadline, answer
                time.sleep(0.02)
        seen = [line.split() for line in a.access_text(
            until=lambda t: t.count(" 200 ") >= 6).splitlines()]
        a.assert_log_clean()
    finally:
        close_all(socks)
        a.cleanup()
    # The two held at once were in two processes: prefork serves one
    # connection per child.
    assert [line[1] for line in seen] == ["200"] * 6, seen
    assert len({line[4] for line in seen[:2]}) == 2, seen


def answered(s):
    """Wait for the program's "done" on s, then close our end and return
    once the program has closed its own."""
    s.settimeout(5)
    data = b""
    while not data.endswith(b"done\n"):
        chunk = s.recv(64)
        assert chunk, "closed before done: %r" % data
        data += chunk
    answered_close(s)


def answered_close(s):
    """Close our end of s and return once the program has closed its
    own."""
    s.shutdown(socket.SHUT_WR)
    assert s.recv(16) == b""
    s.close()


def hold_round(port, n, secs, queue=False):
    """n connections opened at once, each asking the program to work secs
    seconds before it answers (with queue, secs for each one the program
    got, as a server on one CPU would take longer the more it serves at
    once), then closed once answered: how many the program got."""
    got = []
    for _ in range(n):
        what, _, s = open_conn(port)
        if what == "OK":
            got.append(s)
    ms = int(secs * 1000 * (len(got) if queue else 1))
    for s in got:
        s.sendall(b"sleep %d\n" % ms)
    for s in got:
        answered(s)
    return len(got)


def rounds_until(port, n, secs, queue, done, timeout=30):
    """hold_round() again and again until done(the counts so far); the
    counts."""
    got = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not done(got):
        got.append(hold_round(port, n, secs, queue))
    return got


# local_concurrency = "auto": the cap starts at local_concurrency_max and
# learns from how long connections last. Connections that last longer
# the more are open at once (the program works 20 ms before it answers
# for each one it holds, six tried at a time, one per worker) bring it
# down to two or three (after a probe at min: no floor was measured
# yet), not to the probe's one; connections that last 20 ms however many
# are open bring it back up to five or six. It
# never lets more than max (6) in at once, nor refuses below min (1).
def test_shim_500_20(progs, tmp_path):
    with local_daemon(progs, tmp_path, workers=6, max_held=1,
                      local_concurrency="auto", local_concurrency_min=1,
                      local_concurrency_max=6) as d:
        down = rounds_until(d.port, 6, 0.02, True,
                            lambda g: len(g) >= 60)
        assert max(down[-20:]) <= 3 and max(down[-20:]) >= 2, down
        up = rounds_until(d.port, 6, 0.02, False,
                          lambda g: len(g) >= 5 and min(g[-5:]) >= 5)
        assert len(up) >= 5 and min(up[-5:]) >= 5, up
        assert min(down + up) >= 1 and max(down + up) <= 6, (down, up)
    assert d.summary["peak"] <= 6, d.summary
    assert d.err == "", d.err


def paced(port, nbytes, gap, hold):
    """One connection whose client sets the pace: nbytes sent a byte every
    gap seconds before its request (an upload), or the request at once
    and the answer held hold seconds before the close; 1 when the
    program got it."""
    what, _, s = open_conn(port)
    if what != "OK":
        return 0
    for _ in range(nbytes):
        time.sleep(gap)
        s.sendall(b"x")
    s.sendall(b"sleep 20\n")
    s.settimeout(5)
    assert s.recv(16) == b"done\n"
    time.sleep(hold)
    answered_close(s)
    return 1


# "auto" learns from what the program takes, not from what its clients
# hold: beside one client that asks for 20 ms of work every 0.4 s, three
# clients upload a byte every 0.15 s (8 bytes, 1.2 s) before asking, and
# two ask at once and then hold the answered connection 1.2 s, again and
# again for 6 s. Every connection of the light client is served, and at
# the end the program gets at least half of max (8) of 8 connections
# opened at once. When the cap learnt whole lifetimes, the held
# connections read as 60 times the floor and cut it to 1 or 2.
def test_shim_500_21(progs, tmp_path):
    light, slow = [], []
    stop = threading.Event()
    with local_daemon(progs, tmp_path, workers=12, max_held=1,
                      local_concurrency="auto", local_concurrency_min=1,
                      local_concurrency_max=8) as d:
        def client():
            while not stop.is_set():
                what, _, s = open_conn(d.port)
                light.append(what)
                if s is not None:
                    s.sendall(b"sleep 20\n")
                    answered(s)
                stop.wait(0.4)

        def holder(upload):
            t_end = time.monotonic() + 6
            while time.monotonic() < t_end:
                got = paced(d.port, 8 if upload else 0, 0.15,
                            0 if upload else 1.2)
                slow.append(got)
                if not got:
                    time.sleep(0.05)

        light_t = threading.Thread(target=client)
        light_t.start()
        time.sleep(1)
        holders = [threading.Thread(target=holder, args=(i < 3,))
                   for i in range(5)]
        for t in holders:
            t.start()
        for t in holders:
            t.join(timeout=30)
        stop.set()
        light_t.join(timeout=15)
        assert not any(t.is_alive() for t in holders + [light_t])
        assert len(light) >= 10 and set(light) == {"OK"}, (light, slow)
        assert sum(slow) >= 15, slow
        got = hold_round(d.port, 8, 0.02)
        assert got >= 4, (got, light, slow)
    assert d.err == "", d.err
