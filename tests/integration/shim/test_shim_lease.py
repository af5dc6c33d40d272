"""test_shim_lease.py -- `lease = N` on shim rules: the host's processes
spend tokens taken from a rule's bucket N at a time (at most; the core
sizes each lease by the key's traffic) without asking Redis, from one
table the program's forked children share, and the program's first
process gives the unspent ones back when it exits.

Redis calls are counted in INFO commandstats (EVALSHA and EVAL: one per
decision and per give-back), bucket state read with HGET on the bucket
key "<prefix><in|out>:<rule name>:{<key>}". Daemons are tb_srv and
prefork_srv, clients tb_cli, connect_loop and a small program compiled
here that forks into the background."""
import socket
import subprocess
import time

from tbtest.env import free_port, parse_kv, require
from tbtest.shim import (Proc, cli, group, plain_env, reset_calls, run,
                         script_calls, shim_env, stderr_lines, tb_srv,
                         write_conf)

IN_KEY = "tb:shim:in:web:{%s}"
OUT_KEY = "tb:shim:out:db:{db}"
CAPACITY = 1000


def in_rule(port, **kw):
    """Inbound rule "web": one bucket for every client (key "all"),
    CAPACITY tokens at 1/h (no refill worth counting), lease = 20."""
    fields = {"name": "web", "port": port, "key": "all",
              "capacity": CAPACITY, "rate": "1/h", "lease": 20}
    fields.update(kw)
    return "inbound = ( %s );" % group(fields)


def out_rule(port, **kw):
    """Outbound rule "db" to 127.0.0.1:port, as in_rule."""
    fields = {"name": "db", "host": "127.0.0.1", "port": port,
              "capacity": CAPACITY, "rate": "1/h", "lease": 20}
    fields.update(kw)
    return "outbound = ( %s );" % group(fields)


def call_bound(n, lease=20):
    """The most script calls n connections may make with `lease`: one per
    full lease, plus the ramp-up (each lease at most doubles the last:
    log2(20), about 5 calls), the give-back at exit and a few to spare."""
    return n / lease + 10


def tokens(redis, key):
    """The tokens stored in a bucket (HGET), or None when it is missing."""
    v = redis.client().hget(key, "tokens")
    return None if v is None else float(v)


def served_one(port, source="127.0.0.1"):
    """One connection to tb_srv from the address `source`: 1 when the
    daemon served it ("OK"), 0 when the shim closed it."""
    with socket.create_connection(("127.0.0.1", port), timeout=5,
                                  source_address=(source, 0)) as s:
        try:
            return 1 if s.recv(16).startswith(b"OK") else 0
        except ConnectionResetError:
            return 0


def hold_lease(redis, key, port, served, source="127.0.0.1"):
    """Connect from `source` until the host holds unspent tokens of key's
    lease, that is until the bucket in Redis has less than CAPACITY -
    served. Returns (served, the lease's unspent tokens)."""
    for _ in range(64):
        left = tokens(redis, key)
        if left is not None and left < CAPACITY - served - 0.5:
            # Whole tokens: the refill at 1/h adds a little to `left`.
            return served, round(CAPACITY - served - left)
        served += served_one(port, source)
    raise AssertionError("no lease held after 64 more connections")


def back_in_accept(srv, timeout=5.0):
    """Wait until tb_srv waits in accept() again (its wchan). The shim
    refuses a connection inside the program's accept() call and then
    calls accept() again; a SIGTERM that lands in between runs the
    program's handler but interrupts no system call, and the program
    goes on waiting in accept() for a connection that never comes."""
    path = "/proc/%d/wchan" % srv.proc.pid
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with open(path) as f:
                if "accept" in f.read():
                    return
        except OSError:
            return
        time.sleep(0.01)


def stopped(srv):
    """Stop a daemon by PID: (stdout, stderr, seconds from SIGTERM to
    its exit, exit status)."""
    if srv.argv[0].endswith("tb_srv"):
        back_in_accept(srv)
    t0 = time.monotonic()
    out, err = srv.stop()
    return out, err, time.monotonic() - t0, srv.proc.returncode


def lease_calls(redis, tmp_path, rule, run_one):
    """Script calls of run_one(conf, port), which returns them, under
    rule(port, lease=20) and under the same rule without a lease: {20:
    calls, None: calls}. Redis is emptied after each."""
    calls = {}
    for lease in (20, None):
        port = free_port()
        conf = write_conf(tmp_path / ("s%s.conf" % lease), redis,
                          rule(port, lease=lease))
        reset_calls(redis)
        calls[lease] = run_one(conf, port)
        redis.client().flushall()
    return calls


def check_calls(calls, n, what):
    """n of what made n script calls without a lease, about n/20 with."""
    print("\n%d %s: %d script calls with lease = 20 (%.3f per one), %d "
          "without" % (n, what, calls[20], calls[20] / float(n),
                       calls[None]))
    assert calls[None] == n, calls
    assert calls[20] <= call_bound(n), calls


# Inbound: 200 connections through a rule with lease = 20 make about
# 200/20 script calls, against one per connection without a lease.
def test_shim_510_01(redis_server, progs, tmp_path):
    def serve(conf, port):
        srv = tb_srv(progs, conf, port)
        try:
            (s,), _ = cli(progs, ["-r", "127.0.0.1", port, 200],
                          plain_env())
            calls = script_calls(redis_server)
        finally:
            _, err, _, _ = stopped(srv)
        assert s["served"] == 200, s
        assert err == "", err
        return calls

    check_calls(lease_calls(redis_server, tmp_path, in_rule, serve), 200,
                "inbound connections")


# The limit still holds with leases: 120 connections against capacity 50
# serve 50 at most (a lease comes out of the bucket), and every refused
# one is closed.
def test_shim_510_02(redis_server, progs, tmp_path):
    port = free_port()
    conf = write_conf(tmp_path / "s.conf", redis_server,
                      in_rule(port, capacity=50))
    srv = tb_srv(progs, conf, port)
    try:
        (s,), _ = cli(progs, ["-r", "127.0.0.1", port, 120], plain_env())
    finally:
        out, err, _, _ = stopped(srv)
    print("\ncapacity 50, lease 20, 120 connections: served %d"
          % s["served"])
    assert 49 <= s["served"] <= 50, s
    assert s["closed"] == 120 - s["served"], s
    assert "served %d" % s["served"] in out
    assert err == "", err
    assert tokens(redis_server, IN_KEY % "all") < 1


def bye(s):
    """Close a prefork_srv connection once the worker has closed its end
    (it closes on "bye"), so that the worker is free for the next one."""
    s.sendall(b"bye\n")
    s.settimeout(5)
    assert s.recv(16) == b""
    s.close()


# A prefork daemon's children share one lease per key: 300 connections
# handed round-robin to 3 workers (each holds one at a time) with
# lease = 100 make about 300/100 calls whichever child accepts (a table
# per child would make each child ramp its own lease up: 20 calls or
# more), and the parent, exiting after its children, gives the unspent
# tokens back.
def test_shim_510_03(redis_server, progs, tmp_path):
    port = free_port()
    conf = write_conf(tmp_path / "s.conf", redis_server,
                      in_rule(port, lease=100, lease_ttl="5s"))
    srv = Proc([progs["prefork_srv"], "-p", str(port), "-w", "3", "-m",
                "1"], shim_env(conf))
    window, pids = [], []
    try:
        reset_calls(redis_server)
        for _ in range(300):
            # All three busy: the one freed takes the next connection.
            if len(window) == 3:
                bye(window.pop(0))
            s = socket.create_connection(("127.0.0.1", port), timeout=5)
            greeting = s.recv(64).split()
            assert greeting[:1] == [b"OK"], greeting
            pids.append(int(greeting[1]))
            window.append(s)
        for s in window:
            bye(s)
        window = []
        calls = script_calls(redis_server)
        before = tokens(redis_server, IN_KEY % "all")
    finally:
        for s in window:
            s.close()
        out, err, _, _ = stopped(srv)
    per_child = {p: pids.count(p) for p in set(pids)}
    after = tokens(redis_server, IN_KEY % "all")
    print("\nprefork, 3 children, 300 connections, lease = 100: %d script "
          "calls (%.3f per connection); served per child %s; bucket %.1f "
          "before the exit, %.1f after" % (calls, calls / 300.0,
                                           sorted(per_child.values()),
                                           before, after))
    assert sorted(per_child.values()) == [100, 100, 100], per_child
    assert calls <= call_bound(300, 100), calls
    assert "served 300" in out
    assert err == "", err
    assert abs(after - (CAPACITY - 300)) < 0.5, after


# When the host exits, the unspent tokens of its lease go back to the
# bucket in Redis: the bucket holds CAPACITY - served again.
def test_shim_510_04(redis_server, progs, tmp_path):
    port = free_port()
    conf = write_conf(tmp_path / "s.conf", redis_server,
                      in_rule(port, lease_ttl="60s"))
    srv = tb_srv(progs, conf, port)
    try:
        (s,), _ = cli(progs, ["-r", "127.0.0.1", port, 50], plain_env())
        served, unspent = hold_lease(redis_server, IN_KEY % "all", port,
                                     s["served"])
    finally:
        out, err, took, rc = stopped(srv)
    after = tokens(redis_server, IN_KEY % "all")
    print("\nserved %d; the lease held %.0f unspent tokens; bucket %.1f "
          "after the exit (%.3f s)" % (served, unspent, after, took))
    assert unspent >= 1
    assert "served %d" % served in out
    assert abs(after - (CAPACITY - served)) < 0.5, (after, served)
    assert rc == 0 and err == "", (rc, err)


# A C program that connects, forks into the background (its first process
# exits at once, leaving the child to run) and connects on from the child.
BACKGROUND_C = r"""
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

static int conn(int port)
{
    struct sockaddr_in a;
    int s = socket(AF_INET, SOCK_STREAM, 0), ok;

    memset(&a, 0, sizeof(a));
    a.sin_family = AF_INET;
    a.sin_port = htons((unsigned short)port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ok = connect(s, (struct sockaddr *)&a, sizeof(a)) == 0;
    close(s);
    return ok;
}

int main(int argc, char **argv)
{
    int port = atoi(argv[1]), n1 = atoi(argv[2]), n2 = atoi(argv[3]);
    int i, ok = 0;
    pid_t first = getpid();

    for (i = 0; i < n1; i++) {
        ok += conn(port);
    }
    printf("first ok=%d\n", ok);
    fflush(stdout);
    if (fork() != 0) {
        exit(0);
    }
    for (i = 0; i < 500 && getppid() == first; i++) {
        usleep(10000);
    }
    ok = 0;
    for (i = 0; i < n2; i++) {
        ok += conn(port);
    }
    printf("child ok=%d orphan=%d\n", ok, getppid() != first);
    return 0;
}
"""


# A program that forks into the background keeps its leases: its first
# process exits while its child still runs, and leaves the table to the
# child (a drain would turn leases off for it): 40 + 200 connections
# make about 240/20 calls, not 200 more.
def test_shim_510_05(redis_server, progs, tmp_path):
    cc = require("/usr/bin/gcc", "gcc")
    src = tmp_path / "background.c"
    src.write_text(BACKGROUND_C)
    exe = str(tmp_path / "background")
    subprocess.run([cc, "-O1", "-o", exe, str(src)], check=True,
                   timeout=60)
    down = Proc([progs["tb_srv"]], plain_env())
    try:
        conf = write_conf(tmp_path / "s.conf", redis_server,
                          out_rule(down.port, lease_ttl="5s"))
        reset_calls(redis_server)
        p = run([exe, str(down.port), "40", "200"], shim_env(conf))
        calls = script_calls(redis_server)
    finally:
        down.stop()
    lines = [parse_kv(l) for l in p.stdout.splitlines()]
    print("\nforked into the background: %d script calls for 240 "
          "connections" % calls)
    assert lines[0]["ok"] == 40 and lines[1]["ok"] == 200, p.stdout
    assert lines[1]["orphan"] == 1, p.stdout
    assert calls <= call_bound(240), calls
    assert p.stderr == "", p.stderr


# Outbound: connect_loop's 400 connects through a rule with lease = 20
# make about 400/20 calls, against 400 without a lease.
def test_shim_510_06(redis_server, progs, tmp_path):
    def connect(conf, port):
        p = run([progs["connect_loop"], "cycle", str(port), "400"],
                shim_env(conf))
        calls = script_calls(redis_server)
        assert p.stderr == "", p.stderr
        # Every unspent token back when the program exited.
        assert abs(tokens(redis_server, OUT_KEY) - (CAPACITY - 400)) < 0.5
        return calls

    check_calls(lease_calls(redis_server, tmp_path, out_rule, connect), 400,
                "outbound connects")


# Outbound, the limit holds: tb_cli's 80 connects against capacity 30
# succeed 30 times, the rest fail with ECONNREFUSED, and the bucket is
# empty after the exit (nothing is given back that was spent).
def test_shim_510_07(redis_server, progs, tmp_path):
    down = Proc([progs["tb_srv"]], plain_env())
    try:
        conf = write_conf(tmp_path / "s.conf", redis_server,
                          out_rule(down.port, capacity=30))
        (s,), err = cli(progs, ["127.0.0.1", down.port, 80], shim_env(conf))
    finally:
        down.stop()
    assert s["ok"] == 30 and s["fail"] == 50, s
    assert s["errs"] == "ECONNREFUSED:50", s
    assert err == "", err
    assert tokens(redis_server, OUT_KEY) < 1


# Every refusal of the loader names the setting and its value: a lease on
# a rule without a bucket, with concurrency, another algorithm or a cost
# that is not a whole number >= 1; bad numbers, words, fractions and
# ranges of lease and lease_ttl; a lease_ttl without a lease.
def test_shim_510_08(progs, tmp_path):
    port = 7
    bucket = {"capacity": 10, "rate": "5/s"}
    cases = [
        (dict(lease=20), "'lease' = 20 needs a bucket"),
        (dict(concurrency=5, lease=20), "'lease' = 20 needs a bucket"),
        (dict(local_concurrency=5, lease=20), "'lease' = 20 needs a bucket"),
        (dict(capacity=10, lease=20), "'lease' = 20 needs a bucket"),
        (dict(bucket, concurrency=5, lease=20),
         "'lease' = 20 cannot go with 'concurrency' = 5"),
        (dict(bucket, algorithm="gcra", lease=20),
         "'lease' = 20 needs algorithm \"token-bucket\", not \"gcra\""),
        (dict(bucket, algorithm="sliding-window", lease=3),
         "not \"sliding-window\""),
        (dict(bucket, cost=0, lease=20),
         "'lease' = 20 needs a whole 'cost' of at least 1, not 0"),
        (dict(bucket, cost=0.5, lease=20), "at least 1, not 0.5"),
        (dict(bucket, cost=1.5, lease=20), "at least 1, not 1.5"),
        (dict(bucket, lease=0), "'lease' = 0 is out of range 1..1000000"),
        (dict(bucket, lease=-3), "'lease' = -3 is out of range"),
        (dict(bucket, lease=1000001), "'lease' = 1000001 is out of range"),
        (dict(bucket, lease="ten"), "'lease' = \"ten\" must be a whole "
                                    "number"),
        (dict(bucket, lease=2.5), "'lease' = 2.5 must be a whole number"),
        (dict(bucket, lease=20, lease_ttl=0),
         "'lease_ttl' = 0 is out of range 1..60000"),
        (dict(bucket, lease=20, lease_ttl=60001),
         "'lease_ttl' = 60001 is out of range"),
        (dict(bucket, lease=20, lease_ttl="61s"),
         "'lease_ttl' = 61000 ms is out of range 1..60000"),
        (dict(bucket, lease=20, lease_ttl="0ms"), "'lease_ttl'"),
        (dict(bucket, lease=20, lease_ttl="soon"), "'lease_ttl'"),
        (dict(bucket, lease=20, lease_ttl=1.5),
         "'lease_ttl' = 1.5 must be a whole number"),
        (dict(bucket, lease_ttl="2s"), "'lease_ttl' needs 'lease'"),
    ]
    for i, (fields, want) in enumerate(cases):
        for direction in ("inbound", "outbound"):
            if direction == "outbound" and "concurrency" in str(fields):
                continue        # inbound-only settings
            f = {"name": "r%d" % i, "port": port}
            f.update(fields)
            conf = write_conf(tmp_path / ("c%d.conf" % i), None,
                              "%s = ( %s );" % (direction, group(f)),
                              strict=True)
            p = run([progs["tb_srv"], "-p", "0"], shim_env(conf),
                    timeout=30, check=False)
            assert p.returncode == 78, (fields, direction, p.returncode,
                                        p.stderr)
            assert want in p.stderr and "c%d.conf:" % i in p.stderr, \
                (fields, direction, p.stderr)


# What the loader accepts: a lease on both directions, beside
# local_concurrency, below the cost, and lease_ttl as a number of ms or a
# duration string, at both ends of its range.
def test_shim_510_09(progs, tmp_path):
    port = free_port()
    bucket = {"capacity": 10, "rate": "5/s"}
    rules = [
        ("inbound", dict(bucket, lease=1, lease_ttl=1)),
        ("inbound", dict(bucket, lease=1000000, lease_ttl="60s")),
        ("inbound", dict(bucket, local_concurrency=4, lease=20,
                         lease_ttl="250ms")),
        ("inbound", dict(bucket, cost=5, lease=2, lease_ttl=60000)),
        ("outbound", dict(bucket, lease=20, lease_ttl="2s")),
        ("outbound", dict(bucket, algorithm="token-bucket", cost=2,
                          lease=7)),
    ]
    for i, (direction, fields) in enumerate(rules):
        f = {"name": "r%d" % i, "port": port if direction == "inbound"
             else 9}
        f.update(fields)
        conf = write_conf(tmp_path / ("ok%d.conf" % i), None,
                          "%s = ( %s );" % (direction, group(f)),
                          strict=True)
        srv = Proc([progs["tb_srv"], "-p", "0"], shim_env(conf))
        out, err = srv.stop()
        assert srv.proc.returncode == 0 and err == "", (fields, err)


# Redis unreachable from the start: the failure policy decides every
# connection ("open" serves them, "closed" refuses them), one warning
# line, and the host exits at once and cleanly (no lease holds a token).
def test_shim_510_10(progs, tmp_path):
    for policy, served in (("open", 20), ("closed", 0)):
        port = free_port()
        conf = write_conf(tmp_path / ("%s.conf" % policy), None,
                          in_rule(port), policy=policy, timeout_ms=200,
                          connect_timeout_ms=200)
        srv = tb_srv(progs, conf, port)
        try:
            (s,), _ = cli(progs, ["-r", "127.0.0.1", port, 20], plain_env())
        finally:
            out, err, took, rc = stopped(srv)
        assert s["served"] == served, (policy, s)
        assert "served %d" % served in out
        lines = stderr_lines(err)
        assert len(lines) == 1 and "policy \"%s\" applies" % policy \
            in lines[0], lines
        assert rc == 0 and took < 2.0, (rc, took)


# Redis stopped while the host holds leases: connections the leases
# cover are still served under policy "closed" (no Redis call), the next
# one is refused by the policy; at exit the give-backs to the hung Redis
# end within about a second (SHIM_LEASE_DRAIN_MS, then one call's
# timeout), with one warning line.
def test_shim_510_11(redis_server, progs, tmp_path):
    port = free_port()
    sources = ["127.0.0.%d" % i for i in range(1, 7)]
    conf = write_conf(tmp_path / "s.conf", redis_server,
                      in_rule(port, key="$peer", lease_ttl="60s"),
                      policy="closed", timeout_ms=600,
                      connect_timeout_ms=600, breaker_threshold=1000)
    srv = tb_srv(progs, conf, port)
    held = {}
    try:
        # One lease per peer address, each holding unspent tokens.
        for src in sources:
            served = sum(served_one(port, src) for _ in range(30))
            _, held[src] = hold_lease(redis_server, IN_KEY % src, port,
                                      served, src)
        redis_server.sigstop()
        src = sources[0]
        for _ in range(held[src]):
            assert served_one(port, src) == 1
        assert served_one(port, src) == 0
    finally:
        out, err, took, rc = stopped(srv)
        redis_server.sigcont()
    lines = stderr_lines(err)
    print("\nRedis stopped: %d lease tokens served without it; exit took "
          "%.2f s; %s" % (held[sources[0]], took, lines))
    # Five leases hold tokens: 3 s of timeouts without the bound.
    assert rc == 0 and took < 2.2, (rc, took, err)
    assert len(lines) == 2, lines
    assert "policy \"closed\" applies" in lines[0], lines
    assert "were not given back to Redis" in lines[1], lines
