"""test_coalesce.py -- TBucketRedis ... coalesce=on: the host's coalescer
forked by Apache's parent carries the children's decisions to Redis on one
connection. The same decisions and replies as direct, under prefork and
event, with the scripts and with the Redis module; killed with -9, stopped
with SIGSTOP or its socket removed under load: no request waits beyond the
timeout, the failure policy decides, and it comes back by itself; a
graceful restart loses nothing; TLS, AUTH and SELECT are the coalescer's;
a bad value is refused at apache2 -t."""
import glob
import os
import pwd
import signal
import stat
import threading
import time

import pytest
import redis as redis_py

from tbtest.apache import http_get, tokens
from tbtest.env import Redis, child_pids, wait_until

TIMEOUT_MS = 200
# A request's worst wait when its child must connect: the connect, the
# setup and the command each bounded (connect_timeout + 2 x timeout),
# plus the slack a loaded CI runner needs to answer at all.
BOUND_S = 3 * TIMEOUT_MS / 1000.0 + 1.5
TAGS = ("TB00105", "TB00605")


def conf(url, prefix, limit="TBucketLimit 5 1/h", extra="", policy="open",
         coalesce="on"):
    return """
TBucketRedis %s timeout=%d connect_timeout=%d coalesce=%s %s
TBucketFailurePolicy %s
TBucketBreaker threshold=3 cooldown=300ms
TBucketPrefix %s
<Location /limited>
    TBucketEnable On
    TBucketKey "%%{HTTP:X-Key}"
    %s
</Location>
""" % (url, TIMEOUT_MS, TIMEOUT_MS, coalesce, extra, policy, prefix, limit)


def coalescers(a):
    """PIDs of a's coalescer processes (children of its parent)."""
    out = []
    for pid in child_pids(a.proc.pid):
        try:
            with open("/proc/%d/comm" % pid) as f:
                if f.read().strip() == "tbucket-coal":
                    out.append(pid)
        except OSError:
            continue
    return out


def one_coalescer(a, other_than=None, timeout=10.0):
    """The single coalescer of a, waiting (bounded) for one that is not
    other_than."""
    got = wait_until(lambda: [p for p in coalescers(a) if p != other_than]
                     if len(coalescers(a)) == 1 else None, timeout=timeout)
    assert got, "no coalescer: %r" % coalescers(a)
    return got[0]


def socket_of(a):
    paths = glob.glob(os.path.join(a.root, "run", "tbucket", "coal-*.sock"))
    assert len(paths) == 1, paths
    return paths[0]


def sequence(a, keys, n):
    """n requests per key, in turn; (status, remaining) of each."""
    out = []
    for i in range(n):
        for k in keys:
            r = http_get(a.url("/limited/ok.txt"), headers={"X-Key": k})
            out.append((r.status_code, r.headers.get("X-RateLimit-Remaining")))
    return out


def decisions(a, want_total):
    """The access log's decisions once it has want_total lines."""
    text = a.access_text(until=lambda t: t.count("\n") >= want_total)
    return [line.split()[2] for line in text.splitlines()]


class Load:
    """Bounded load from threads on fresh connections, each request's
    status and duration kept, while the test does something to the
    coalescer."""

    def __init__(self, a, threads=4, seconds=6.0, max_requests=4000):
        self.a, self.seconds, self.budget = a, seconds, max_requests
        self.results = []
        self.lock = threading.Lock()
        self.ts = [threading.Thread(target=self.worker, args=(i,))
                   for i in range(threads)]

    def worker(self, idx):
        deadline = time.monotonic() + self.seconds
        while time.monotonic() < deadline:
            with self.lock:
                if self.budget <= 0:
                    return
                self.budget -= 1
            t0 = time.monotonic()
            try:
                r = http_get(self.a.url("/limited/ok.txt"),
                             headers={"X-Key": "load-%d" % idx})
                code = r.status_code
            except Exception:  # noqa: BLE001 (a refused connection)
                code = None
            with self.lock:
                self.results.append((code, time.monotonic() - t0))

    def __enter__(self):
        for t in self.ts:
            t.start()
        return self

    def __exit__(self, *exc):
        for t in self.ts:
            t.join(timeout=self.seconds + 30)

    def slowest(self):
        return max(d for _, d in self.results)


# The same requests through the coalescer as direct, under prefork and
# event: the same statuses and remaining counts, the same buckets in Redis;
# and the coalesced Redis sees one connection whatever the children.
@pytest.mark.parametrize("mpm", ["prefork", "event"])
def test_module_043_01(apache_factory, redis_server, make_redis, mpm):
    other = make_redis("direct")
    direct = apache_factory(mpm=mpm, servers=3)
    direct.start(conf(other.url, "x:", coalesce="off"))
    coal = apache_factory(mpm=mpm, servers=3)
    coal.start(conf(redis_server.url, "x:"))
    keys = ["k1", "k2", "k3"]
    want = sequence(direct, keys, 7)
    assert want.count((429, "0")) == 6, want
    assert sequence(coal, keys, 7) == want
    rc, rd = redis_server.client(), other.client()
    for k in keys:
        assert tokens(rc, "x:{%s}" % k) == tokens(rd, "x:{%s}" % k)
        assert rc.hget("x:{%s}" % k, "tokens") is not None
    # Only the coalescer (and this test) speaks to Redis.
    assert rc.info("clients")["connected_clients"] == 2
    one_coalescer(coal)
    path = socket_of(coal)
    st, dst = os.stat(path), os.stat(os.path.dirname(path))
    assert stat.S_IMODE(st.st_mode) == 0o600
    assert stat.S_IMODE(dst.st_mode) == 0o700
    assert st.st_uid == dst.st_uid == pwd.getpwnam("www-data").pw_uid
    coal.assert_log_clean()
    direct.assert_log_clean()


# The Redis module's engine through the coalescer: its command answers
# (tbucket.bucket in commandstats), and the decisions are the scripts'.
def test_module_043_02(apache_factory, mod_redis):
    a = apache_factory(mpm="prefork", servers=2)
    a.start(conf(mod_redis.url, "m:", extra="engine=module"))
    got = sequence(a, ["k1"], 7)
    assert got == [(200, "4"), (200, "3"), (200, "2"), (200, "1"),
                   (200, "0"), (429, "0"), (429, "0")]
    stats = mod_redis.client().info("commandstats")
    assert stats["cmdstat_tbucket.bucket"]["calls"] >= 7
    assert "cmdstat_evalsha" not in stats
    a.assert_log_clean()


# A flushed script cache through the coalescer: NOSCRIPT sends the text
# again, the count goes on exactly. (One child with one connection, which
# loaded the scripts before the flush.)
def test_module_043_03(apache_factory, redis_server):
    a = apache_factory(mpm="event", servers=1)
    a.start(conf(redis_server.url, "n:", extra="engine=script"))
    assert sequence(a, ["k1"], 2) == [(200, "4"), (200, "3")]
    redis_server.client().script_flush()
    assert sequence(a, ["k1"], 4) == [(200, "2"), (200, "1"), (200, "0"),
                                      (429, "0")]
    stats = redis_server.client().info("commandstats")
    assert stats["cmdstat_eval"]["calls"] >= 1
    a.assert_log_clean()


# The coalescer killed with -9 under load: no request waits beyond the
# timeout's bound, the open policy decides meanwhile, and the parent
# starts it again by itself (prefork and event); decisions are Redis's
# again after.
@pytest.mark.slow
@pytest.mark.parametrize("mpm", ["prefork", "event"])
def test_module_043_04(apache_factory, redis_server, mpm):
    a = apache_factory(mpm=mpm, servers=2 if mpm == "event" else 4)
    a.start(conf(redis_server.url, "q:", limit="TBucketLimit 100000 1/s"))
    first = one_coalescer(a)
    with Load(a, seconds=5.0) as load:
        time.sleep(1.0)
        os.kill(first, signal.SIGKILL)
    second = one_coalescer(a, other_than=first)
    assert second != first
    assert load.slowest() < BOUND_S, load.slowest()
    assert {c for c, _ in load.results} == {200}
    a.mark_log()
    n = len(a.access_text().splitlines())
    http_get(a.url("/limited/ok.txt"), headers={"X-Key": "after"})
    assert decisions(a, n + 1)[-1] == "allowed"
    assert "TB00605" in a.read_log()
    assert tokens(redis_server.client(), "q:{after}") is not None
    a.assert_log_clean(allowed=TAGS)


# The coalescer stopped (SIGSTOP) under load: requests wait no longer
# than the timeout's bound, the closed policy refuses meanwhile, and with
# SIGCONT Redis decides again.
@pytest.mark.slow
def test_module_043_05(apache_factory, redis_server):
    a = apache_factory(mpm="prefork", servers=4)
    a.start(conf(redis_server.url, "s:", limit="TBucketLimit 100000 1/s",
                 policy="closed"))
    pid = one_coalescer(a)
    with Load(a, seconds=4.0) as load:
        time.sleep(0.5)
        os.kill(pid, signal.SIGSTOP)
        time.sleep(2.0)
        refused_while_stopped = sum(1 for c, _ in load.results if c == 429)
        os.kill(pid, signal.SIGCONT)
    assert load.slowest() < BOUND_S, load.slowest()
    assert refused_while_stopped > 0
    assert {c for c, _ in load.results} <= {200, 429}
    assert one_coalescer(a) == pid
    ok = wait_until(lambda: http_get(
        a.url("/limited/ok.txt"), headers={"X-Key": "z"}).status_code == 200,
        timeout=10)
    assert ok
    a.assert_log_clean(allowed=TAGS)


# Its socket removed under load: the coalescer puts it back by itself
# (same process), and the requests meanwhile are decided by the policy
# within the bound.
@pytest.mark.slow
def test_module_043_06(apache_factory, redis_server):
    a = apache_factory(mpm="prefork", servers=4)
    a.start(conf(redis_server.url, "u:", limit="TBucketLimit 100000 1/s"))
    pid = one_coalescer(a)
    path = socket_of(a)
    before = os.stat(path).st_ino
    with Load(a, seconds=4.0) as load:
        time.sleep(0.5)
        os.unlink(path)
    assert wait_until(lambda: os.path.exists(path)
                      and os.stat(path).st_ino != before, timeout=5)
    assert load.slowest() < BOUND_S, load.slowest()
    assert {c for c, _ in load.results} == {200}
    assert one_coalescer(a) == pid
    n = len(a.access_text().splitlines())
    # New children's connections reach the socket put back.
    a.graceful()
    http_get(a.url("/limited/ok.txt"), headers={"X-Key": "back"})
    assert decisions(a, n + 1)[-1] == "allowed"
    assert tokens(redis_server.client(), "u:{back}") is not None
    a.assert_log_clean(allowed=TAGS)


# Graceful restarts under load lose nothing: with the configuration
# unchanged the coalescer is kept, with a new one a second coalescer
# takes new children while the first drains the old ones; every request
# is decided by Redis (no fallback), and Redis counted each one; under
# prefork and event.
@pytest.mark.slow
@pytest.mark.parametrize("mpm", ["prefork", "event"])
def test_module_043_07(apache_factory, redis_server, mpm):
    a = apache_factory(mpm=mpm, servers=2 if mpm == "event" else 4)
    body = conf(redis_server.url, "g:", limit="TBucketLimit 100000 1/h")
    a.start(body)
    first = one_coalescer(a)
    with Load(a, seconds=6.0) as load:
        time.sleep(1.0)
        a.graceful()
        assert one_coalescer(a) == first
        time.sleep(1.0)
        a.graceful(body.replace("coalesce=on", "coalesce=on pool=1"))
        time.sleep(1.0)
        a.graceful(body.replace("timeout=%d " % TIMEOUT_MS,
                                "timeout=%d " % (TIMEOUT_MS + 1)))
        time.sleep(1.0)
    assert first not in coalescers(a) or wait_until(
        lambda: first not in coalescers(a), timeout=40)
    assert len(coalescers(a)) == 1
    codes = [c for c, _ in load.results]
    assert set(codes) == {200}, set(codes)
    got = decisions(a, len(codes))
    assert got.count("allowed") == len(got) >= len(codes)
    used = 0
    r = redis_server.client()
    for i in range(4):
        left = tokens(r, "g:{load-%d}" % i)
        used += 0 if left is None else round(100000 - left)
    assert used == len(got)
    a.assert_log_clean(allowed=TAGS)


# A bad coalesce= value is refused at apache2 -t, naming it;
# coalesce=on with Cluster is accepted.
def test_module_043_08(apache_factory):
    a = apache_factory()
    rc, out = a.configtest(conf("redis://127.0.0.1:6379", "b:")
                           .replace("coalesce=on", "coalesce=maybe"))
    assert rc != 0 and "coalesce" in out and "maybe" in out, out
    rc, out = a.configtest(conf("redis-cluster://127.0.0.1:7000", "b:"))
    assert rc == 0, out
    rc, out = a.configtest(conf("redis://127.0.0.1:6379", "b:"))
    assert rc == 0, out


# TLS ends in the coalescer: mutual TLS to a Redis that asks for client
# certificates, the children on the plain unix socket; Redis decides
# (three allowed, then 429) and sees one connection.
def test_module_043_09(apache_factory, tls_redis, pki):
    r = tls_redis(auth_clients="yes")
    a = apache_factory(mpm="prefork", servers=2)
    a.start(conf(r.url, "t:", limit="TBucketLimit 3 1/h",
                 extra="tls_ca=%s tls_cert=%s tls_key=%s" % (
                     pki.ca_pem, pki.client_pem, pki.client_key)))
    got = sequence(a, ["k1"], 4)
    assert [c for c, _ in got] == [200, 200, 200, 429], got
    rc = r.client()
    assert tokens(rc, "t:{k1}") is not None
    assert rc.info("clients")["connected_clients"] == 2
    a.assert_log_clean()


# AUTH and SELECT are the coalescer's: a password and a database in the
# URL, the buckets land in that database.
def test_module_043_10(apache_factory, tmp_path):
    rd = Redis(tmp_path / "auth", password="s3cret").start()
    try:
        a = apache_factory(mpm="prefork", servers=2)
        a.start(conf("redis://:s3cret@127.0.0.1:%d/3" % rd.port, "a:"))
        assert sequence(a, ["k1"], 2) == [(200, "4"), (200, "3")]
        assert tokens(rd.client(db=3), "a:{k1}") == 3.0
        assert rd.client(db=0).dbsize() == 0
        a.assert_log_clean()
    finally:
        rd.stop()


# Redis gone behind the coalescer: the coalescer answers each command
# with an error at once, so the children's breakers open and the open
# policy decides without waiting; Redis back, Redis decides again.
def test_module_043_11(apache_factory, redis_server):
    a = apache_factory(mpm="prefork", servers=2)
    a.start(conf(redis_server.url, "r:", limit="TBucketLimit 100000 1/h"))
    n = len(sequence(a, ["k1"], 2))
    redis_server.kill9()
    times = []
    for _ in range(8):
        t0 = time.monotonic()
        assert http_get(a.url("/limited/ok.txt"),
                        headers={"X-Key": "k1"}).status_code == 200
        times.append(time.monotonic() - t0)
    assert max(times) < BOUND_S, times
    got = decisions(a, n + 8)
    assert got[n:] == ["fallback-open"] * 8, got
    assert "coalescer" in a.read_log()
    redis_server.start()
    assert wait_until(lambda: http_get(a.url("/limited/ok.txt"), headers={
        "X-Key": "k2"}).status_code == 200 and decisions(
            a, 0)[-1] == "allowed", timeout=10)
    a.assert_log_clean(allowed=TAGS)


# Leases with coalesce=on: the children take them through the coalescer,
# and when Apache stops (SIGTERM, which its coalescer receives too) the
# parent's drain gives every unspent token back to Redis itself.
def test_module_043_12(apache_factory, redis_server):
    a = apache_factory(mpm="prefork", servers=3)
    a.start(conf(redis_server.url, "l:", limit="TBucketLimit 100 1/h\n"
                 "    TBucketLease 50 ttl=30s"))
    for _ in range(20):
        assert http_get(a.url("/limited/ok.txt"),
                        headers={"X-Key": "g"}).status_code == 200
    r = redis_server.client()
    assert 80 - tokens(r, "l:{g}") >= 5
    a.stop()
    assert tokens(r, "l:{g}") == 80
    log = a.read_log()
    assert "TB00501" in log and "TB00502" not in log, log[-2000:]


# Sentinel through the coalescer: it decides on the primary the sentinels
# name and, after the primary is killed, follows the failover by itself
# (the children never see the sentinels): a new key's bucket lands on the
# new primary within failover time and cooldowns.
@pytest.mark.slow
def test_module_043_13(apache_factory, tmp_path):
    from tbtest.ha import SentinelRig, kill9
    rig = SentinelRig(tmp_path).start()
    try:
        a = apache_factory(mpm="prefork", servers=2)
        a.start(conf(rig.url, "s:", limit="TBucketLimit 100000 1/h"))
        assert sequence(a, ["k1"], 1) == [(200, "99999")]
        assert tokens(rig.primary.client(), "s:{k1}") == 99999.0
        kill9(rig.primary)
        new = rig.replica.client()

        def moved():
            key = "m%d" % int(time.monotonic() * 1000)
            http_get(a.url("/limited/ok.txt"), headers={"X-Key": key})
            try:
                return new.hget("s:{%s}" % key, "tokens") is not None
            except redis_py.RedisError:
                # The replica answers errors of its own while it is being
                # promoted (a loaded run saw one): ask again.
                return False
        assert wait_until(moved, timeout=30, step=0.2)
        assert len(coalescers(a)) == 1
        a.assert_log_clean(allowed=TAGS)
    finally:
        rig.stop()


# A client of the socket that sends a command which would change or hold
# the shared connection (SELECT, MULTI, BLPOP) or bytes that are not RESP
# is closed without a reply; the others' commands pass through, and the
# children's decisions go on in the same database.
def test_module_043_14(apache_factory, redis_server):
    import socket
    a = apache_factory(mpm="prefork", servers=2)
    a.start(conf(redis_server.url, "d:"))
    assert sequence(a, ["k1"], 1) == [(200, "4")]
    path = socket_of(a)

    def ask(raw):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(5)
        s.connect(path)
        s.sendall(raw)
        try:
            got = s.recv(100)
        except ConnectionResetError:
            got = b""
        s.close()
        return got

    assert ask(b"*1\r\n$4\r\nPING\r\n") == b"+PONG\r\n"
    for bad in (b"*2\r\n$6\r\nselect\r\n$1\r\n1\r\n",
                b"*1\r\n$5\r\nMULTI\r\n",
                b"*3\r\n$5\r\nBLPOP\r\n$1\r\nq\r\n$1\r\n0\r\n",
                b"PING\r\n"):
        assert ask(bad) == b"", bad
    assert sequence(a, ["k1"], 1) == [(200, "3")]
    assert tokens(redis_server.client(), "d:{k1}") == 3.0
    a.assert_log_clean()

