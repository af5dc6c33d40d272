"""test_coalesce_cluster.py -- TBucketRedis redis-cluster://... coalesce=on:
the host's coalescer keeps one connection and one pipeline per primary of
a real three-primary Redis Cluster (tbtest.ha's ClusterRig). The same
statuses and remaining counts as direct, each bucket on its slot's
primary, under prefork and event, with the scripts and with the Redis
module; rule buckets in several slots; a slot migrated under load (ASK,
then MOVED) with every request decided by Redis and the budget exact; a
primary killed with -9: its keys decided by the failure policy within
the timeout's bound, the other primaries' keys by Redis as before."""
import glob
import os
import signal
import socket
import threading
import time

import pytest

from tbtest.apache import http_get, tokens
from tbtest.core import keyslot
from tbtest.ha import ClusterRig, kill9
from tbtest.redismod import module_cluster, sanitizer_reports
from test_coalesce import sequence

TIMEOUT_MS = 200
# A request's worst wait when its child must connect: the connect, the
# setup and the command each bounded (connect_timeout + 2 x timeout),
# plus the slack a loaded CI runner needs to answer at all.
BOUND_S = 3 * TIMEOUT_MS / 1000.0 + 1.5


def conf(url, prefix, limit="TBucketLimit 5 1/h", extra="", policy="open",
         coalesce="on", breaker="threshold=3 cooldown=300ms",
         timeout_ms=TIMEOUT_MS):
    return """
TBucketRedis %s timeout=%d connect_timeout=%d coalesce=%s %s
TBucketFailurePolicy %s
TBucketBreaker %s
TBucketPrefix %s
<Location /limited>
    TBucketEnable On
    TBucketKey "%%{HTTP:X-Key}"
    %s
</Location>
""" % (url, timeout_ms, timeout_ms, coalesce, extra, policy, breaker, prefix,
       limit)


def spread_keys(rig, prefix, per_node=2):
    """per_node client keys whose buckets each primary owns."""
    keys = []
    for n in rig.nodes:
        for j in range(per_node):
            keys.append(rig.key_on(n.port, prefix="n%dk%d-" % (n.port, j),
                                   tb_prefix=prefix))
    return keys


def owner_client(rig, key):
    return rig.by_port(rig.owner(keyslot(key))).client()


def decisions(a, want_total):
    """The access log's decisions once it has want_total lines."""
    text = a.access_text(until=lambda t: t.count("\n") >= want_total,
                         timeout=20)
    return [line.split()[2] for line in text.splitlines()]


# Through the coalescer against a three-primary Cluster, under prefork and
# event: the same statuses and remaining counts as a direct Apache, each
# bucket on its slot's primary (all three hold some) and on no other.
@pytest.mark.parametrize("mpm", ["prefork", "event"])
def test_module_043_15(apache_factory, cluster, mpm):
    pfx = "c%s:" % mpm[0]
    keys = spread_keys(cluster, pfx)
    direct = apache_factory(mpm=mpm, servers=3)
    direct.start(conf(cluster.url, "d" + pfx, coalesce="off"))
    coal = apache_factory(mpm=mpm, servers=3)
    coal.start(conf(cluster.url, pfx))
    want = sequence(direct, keys, 7)
    assert want.count((429, "0")) == 2 * len(keys), want
    assert sequence(coal, keys, 7) == want
    held = {n.port: {x.decode() for x in n.client().keys(pfx + "{*")}
            for n in cluster.nodes}
    for k in keys:
        ck, dk = "%s{%s}" % (pfx, k), "d%s{%s}" % (pfx, k)
        port = cluster.owner(keyslot(ck))
        node = cluster.by_port(port).client()
        assert tokens(node, ck) == tokens(node, dk) is not None, k
        # On its slot's primary and on no other.
        assert [p for p, ks in held.items() if ck in ks] == [port], k
    assert all(len(ks) == 2 for ks in held.values()), held
    coal.assert_log_clean()


# The Redis module's engine through the coalescer on a Cluster whose
# primaries load it: every primary answers tbucket.bucket (none EVALSHA),
# and the decisions are the scripts' (five allowed, counting down).
def test_module_043_16(apache_factory, tmp_path):
    rig = module_cluster(tmp_path).start()
    try:
        keys = spread_keys(rig, "m:", per_node=1)
        a = apache_factory(mpm="prefork", servers=2)
        a.start(conf(rig.url, "m:", extra="engine=module"))
        got = sequence(a, keys, 7)
        per_key = [got[i::len(keys)] for i in range(len(keys))]
        for k, seen in zip(keys, per_key):
            assert seen == [(200, "4"), (200, "3"), (200, "2"), (200, "1"),
                            (200, "0"), (429, "0"), (429, "0")], k
            assert owner_client(rig, "m:{%s}" % k).hget(
                "m:{%s}" % k, "tokens") is not None
        for n in rig.nodes:
            stats = n.client().info("commandstats")
            assert stats["cmdstat_tbucket.bucket"]["calls"] >= 7, n.port
            assert "cmdstat_evalsha" not in stats
        a.assert_log_clean()
    finally:
        rig.stop()
    for n in rig.nodes:
        assert sanitizer_reports(n.dir) == []


# Rule buckets in two slots on two primaries, through the coalescer: the
# children split the call per slot as direct (no CROSSSLOT), each rule's
# bucket is charged on its own primary, and a refusal charges nowhere.
def test_module_043_17(apache_factory, cluster):
    limit = """TBucketRule ip "%{HTTP:X-IP}" 3 1/h
    TBucketRule user "%{HTTP:X-User}" 5 1/h"""
    a = apache_factory(mpm="event", servers=1)
    a.start(conf(cluster.url, "rc:", limit=limit, policy="closed"))
    ip = None
    for i in range(2000):
        k1 = "rc:{10.1.%d.1}:rule:ip" % i
        k2 = "rc:{u%d}:rule:user" % i
        if cluster.owner(keyslot(k1)) != cluster.owner(keyslot(k2)):
            ip, user, kip, kuser = "10.1.%d.1" % i, "u%d" % i, k1, k2
            break
    assert ip
    h = {"X-IP": ip, "X-User": user, "X-Key": "x"}
    got = [http_get(a.url("/limited/ok.txt"), headers=h).status_code
           for _ in range(5)]
    assert got == [200, 200, 200, 429, 429], got
    assert float(owner_client(cluster, kip).hget(kip, "tokens")) < 0.01
    assert 1.9 < float(owner_client(cluster, kuser).hget(kuser,
                                                         "tokens")) < 2.1
    a.assert_log_clean()


def one_node_down_rig(rig, apache_factory, tb_prefix, down, up):
    """For a node taken down: the others keep serving (full coverage
    off), a key on node 2 (the victim) and one on each other node, and a
    prefork Apache with the closed policy and a breaker that never opens
    (one breaker per child, not per node: it would send every key to the
    policy). (victim, its key, the others' keys, the Apache)."""
    for n in rig.nodes:
        n.client().config_set("cluster-require-full-coverage", "no")
    victim = rig.nodes[2]
    key = rig.key_on(victim.port, prefix=down, tb_prefix=tb_prefix)
    others = [rig.key_on(rig.nodes[i].port, prefix="%s%d-" % (up, i),
                         tb_prefix=tb_prefix) for i in (0, 1)]
    a = apache_factory(mpm="prefork", servers=4)
    a.start(conf(rig.url, tb_prefix, limit="TBucketLimit 100000 1/h",
                 policy="closed", breaker="threshold=1000000"))
    return victim, key, others, a


class Hammer:
    """Threads that request one key each in turn until stopped (bounded
    in count and time), keeping each status."""

    def __init__(self, a, keys, seconds=30.0, max_requests=6000):
        self.a, self.keys, self.budget = a, keys, max_requests
        self.deadline = time.monotonic() + seconds
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.results = []
        self.ts = [threading.Thread(target=self.worker, args=(k,))
                   for k in keys]

    def worker(self, key):
        while not self.stop.is_set() and time.monotonic() < self.deadline:
            with self.lock:
                if self.budget <= 0:
                    return
                self.budget -= 1
            t0 = time.monotonic()
            try:
                code = http_get(self.a.url("/limited/ok.txt"),
                                headers={"X-Key": key}).status_code
            except Exception:  # noqa: BLE001 (a refused connection)
                code = None
            with self.lock:
                self.results.append((key, code, time.monotonic() - t0))

    def __enter__(self):
        for t in self.ts:
            t.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        for t in self.ts:
            t.join(timeout=60)

    def count(self, key=None):
        with self.lock:
            return len([r for r in self.results if key in (None, r[0])])


# A slot migrated under load through the coalescer (IMPORTING/MIGRATING:
# the old owner answers ASK for a key it no longer holds; MIGRATE; SETSLOT
# NODE: MOVED): no request fails, every one is decided by Redis (the
# closed policy would refuse with 503), the budget is spent exactly once,
# and the bucket ends on the new owner.
@pytest.mark.slow
def test_module_043_18(apache_factory, tmp_path):
    rig = ClusterRig(tmp_path).start()
    try:
        key = rig.key_on(rig.nodes[0].port, prefix="mig", tb_prefix="g:")
        other = rig.key_on(rig.nodes[1].port, prefix="stay", tb_prefix="g:")
        slot = keyslot("g:{%s}" % key)
        src = rig.by_port(rig.owner(slot))
        dst = next(n for n in rig.nodes if n.port != src.port)
        new = rig.key_in_slot(slot, prefix="fresh", tb_prefix="g:")
        a = apache_factory(mpm="event", servers=2)
        a.start(conf(rig.url, "g:", limit="TBucketLimit 100000 1/h",
                     policy="closed"))
        with Hammer(a, [key, key, other]) as h:
            assert wait_for(lambda: h.count() >= 100)
            rig.migrate_begin(slot, src, dst)
            # A key of the slot that src does not hold: src answers ASK,
            # the coalescer sends ASKING and the call to dst.
            fresh = sequence(a, [new], 3)
            n0 = h.count(key)
            assert wait_for(lambda: h.count(key) >= n0 + 50)
            rig.migrate_end(slot, src, dst)
            n1 = h.count(key)
            assert wait_for(lambda: h.count(key) >= n1 + 50)
        assert fresh == [(200, "99999"), (200, "99998"), (200, "99997")]
        assert dst.client().exists("g:{%s}" % new) == 1
        # The redirects were the coalescer's to follow: ASKING on dst,
        # MOVED and ASK answered by src.
        assert dst.client().info("commandstats")["cmdstat_asking"][
            "calls"] >= 3
        errs = errorstats(src)
        assert errs.get("MOVED", 0) >= 1 and errs.get("ASK", 0) >= 3, errs
        codes = {c for _, c, _ in h.results}
        assert codes == {200}, codes
        total = len(h.results) + 3
        got = decisions(a, total)
        assert len(got) == total and set(got) == {"allowed"}, set(got)
        assert rig.owner(slot) == dst.port
        bucket = "g:{%s}" % key
        assert dst.client().exists(bucket) == 1
        assert src.client().execute_command(
            "CLUSTER", "COUNTKEYSINSLOT", slot) == 0
        assert round(100000 - float(dst.client().hget(bucket, "tokens"))) \
            == h.count(key)
        a.assert_log_clean()
    finally:
        rig.stop()


def errorstats(node):
    """{error prefix: count} of INFO errorstats."""
    out = {}
    for k, v in node.client().info("errorstats").items():
        v = v if isinstance(v, dict) else dict(
            [str(v).split("=", 1)])
        out[k[len("errorstat_"):]] = int(v["count"])
    return out


def wait_for(cond, timeout=30.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(0.02)
    return False


# A primary killed with -9 under load through the coalescer: requests for
# its keys are decided by the closed policy (429) within the timeout's
# bound; those for the other primaries' keys go on, decided by Redis and
# counted exactly. (The breaker is off: it is one per child, not per
# node, so it would send every key to the policy while open; and
# cluster-require-full-coverage no keeps the others serving once the
# cluster marks the node failed.)
@pytest.mark.slow
def test_module_043_19(apache_factory, tmp_path):
    rig = ClusterRig(tmp_path).start()
    try:
        victim, dead, live, a = one_node_down_rig(rig, apache_factory, "v:",
                                                  "dead", "live")
        assert sequence(a, [dead] + live, 2) == [(200, "99999")] * 3 + [
            (200, "99998")] * 3
        kill9(victim)
        with Hammer(a, [dead] + live, seconds=6.0, max_requests=3000) as h:
            assert wait_for(lambda: h.count(dead) >= 30)
        # 429 from the closed policy: the limit is far from reached.
        dead_codes = [c for k, c, _ in h.results if k == dead]
        assert set(dead_codes) == {429}, set(dead_codes)
        got = decisions(a, len(h.results) + 6)
        assert got.count("fallback-closed") == len(dead_codes)
        assert got.count("allowed") == len(h.results) + 6 - len(dead_codes)
        assert max(d for _, _, d in h.results) < BOUND_S
        for k in live:
            codes = {c for kk, c, _ in h.results if kk == k}
            assert codes == {200}, (k, codes)
            used = 100000 - float(owner_client(rig, "v:{%s}" % k).hget(
                "v:{%s}" % k, "tokens"))
            assert round(used) == h.count(k) + 2, k
    finally:
        rig.stop()


def raw_key_on(rig, port, prefix):
    """A plain key (no hash tag) that the primary on port owns."""
    owners = rig.slots()
    for i in range(20000):
        k = "%s%d" % (prefix, i)
        if any(s <= keyslot(k) <= e and p == port for s, e, p, _ in owners):
            return k
    raise AssertionError("no key for %d" % port)


def resp(*args):
    out = b"*%d\r\n" % len(args)
    for x in args:
        x = x if isinstance(x, bytes) else str(x).encode()
        out += b"$%d\r\n%s\r\n" % (len(x), x)
    return out


# SPIN_LUA busies its node for about 100 ms of Redis's own clock.
SPIN_LUA = ("local t = redis.call('TIME') "
            "local t0 = t[1] * 1000000 + t[2] "
            "repeat t = redis.call('TIME') "
            "until t[1] * 1000000 + t[2] - t0 > 100000 "
            "return 'slow'")


# One client of the socket pipelines four commands for three primaries
# and none: a script that keeps the first primary busy, GETs on the other
# two, PING. The later ones are answered first by their nodes, yet the
# client reads the replies in the order it sent the commands.
def test_module_043_20(apache_factory, cluster):
    ports = [n.port for n in cluster.nodes]
    ka, kb, kc = (raw_key_on(cluster, p, "ord%d-" % i)
                  for i, p in enumerate(ports))
    cluster.by_port(ports[1]).client().set(kb, "b")
    cluster.by_port(ports[2]).client().set(kc, "c")
    a = apache_factory(mpm="prefork", servers=1)
    # A timeout far above the script's 100 ms: the slow reply is a reply.
    a.start(conf(cluster.url, "o:", timeout_ms=3000))
    assert sequence(a, ["k1"], 1) == [(200, "4")]
    paths = glob.glob(os.path.join(a.root, "run", "tbucket", "coal-*.sock"))
    assert len(paths) == 1, paths
    want = b"$4\r\nslow\r\n$1\r\nb\r\n$1\r\nc\r\n+PONG\r\n"
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(10)
    s.connect(paths[0])
    s.sendall(resp("EVAL", SPIN_LUA, 1, ka) + resp("GET", kb)
              + resp("GET", kc) + resp("PING"))
    got = b""
    while len(got) < len(want):
        part = s.recv(4096)
        if not part:
            break
        got += part
    s.close()
    assert got == want
    a.assert_log_clean()


# A primary stopped (SIGSTOP) under load through the coalescer: its
# pipeline gets no reply, so after the timeout its commands are answered
# with errors and the closed policy decides them (429), each request
# within the timeout's bound; the other primaries' keys are decided by
# Redis meanwhile and counted exactly; with SIGCONT Redis decides the
# stopped primary's keys again. Prefork: a child of a threaded MPM sends
# its threads' commands on one connection, whose replies come back in
# order, so one queued behind a command of the stopped primary waits for
# that one's timeout too (design.md, the coalescer).
@pytest.mark.slow
def test_module_043_21(apache_factory, tmp_path):
    rig = ClusterRig(tmp_path).start()
    try:
        victim, slow, live, a = one_node_down_rig(rig, apache_factory, "w:",
                                                  "stopped", "go")
        assert sequence(a, [slow] + live, 1) == [(200, "99999")] * 3
        os.kill(victim.proc.pid, signal.SIGSTOP)
        try:
            with Hammer(a, [slow] + live, seconds=8.0,
                        max_requests=3000) as h:
                assert wait_for(lambda: h.count(slow) >= 5
                                and h.count(live[0]) >= 20, timeout=8.0)
        finally:
            os.kill(victim.proc.pid, signal.SIGCONT)
        slow_codes = {c for k, c, _ in h.results if k == slow}
        assert slow_codes == {429}, slow_codes
        assert max(d for _, _, d in h.results) < BOUND_S
        for k in live:
            assert {c for kk, c, _ in h.results if kk == k} == {200}, k
            used = 100000 - float(owner_client(rig, "w:{%s}" % k).hget(
                "w:{%s}" % k, "tokens"))
            assert round(used) == h.count(k) + 1, k
        # Back: Redis decides the stopped primary's keys again.
        assert wait_for(lambda: sequence(a, [slow], 1)[0][0] == 200,
                        timeout=10.0)
    finally:
        rig.stop()


# Keys a client chooses, as an attacker would send them, through the
# coalescer to a Cluster: hash-tag braces of its own (to steer the slot),
# an empty tag, braces reversed, a key of 4,000 bytes, bytes above 0x7f.
# Each gets its own bucket and exactly its budget (2), closed policy so
# a call the coalescer routed wrong (CROSSSLOT, MOVED left unanswered)
# would show as 429 early or a bucket in the wrong place.
@pytest.mark.slow
def test_module_043_22(apache_factory, tmp_path):
    rig = ClusterRig(tmp_path).start()
    try:
        a = apache_factory(mpm="prefork", servers=3)
        a.start(conf(rig.url, "h:", limit="TBucketLimit 2 1/h",
                     policy="closed"))
        keys = ["{victim}x", "{}", "}{", "a{b}c{d}", "x" * 4000,
                "caf\xe9", "{victim}y"]
        got = sequence(a, keys, 3)
        want = [(200, "1")] * len(keys) + [(200, "0")] * len(keys) + [
            (429, "0")] * len(keys)
        assert got == want, got
        # Every bucket lies on the node that owns its slot.
        found = 0
        for n in rig.nodes:
            for k in n.client().keys("h:*"):
                assert rig.owner(keyslot(k.decode("latin-1"))) == n.port, k
                found += 1
        assert found == len(keys), found
        a.assert_log_clean()
    finally:
        rig.stop()
