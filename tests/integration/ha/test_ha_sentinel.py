"""test_ha_sentinel.py -- the core behind Redis Sentinel.

A real primary, one replica and three sentinels (quorum 2,
down-after-milliseconds 1000) on free loopback ports; the core's URL is
redis-sentinel://s1,s2,s3/mymaster. The client must find the primary
through the sentinels, skip a dead sentinel, and follow a failover -- a
killed primary, or a demoted one that answers READONLY -- within the
failover time plus one breaker cooldown, without being restarted, with
every decision in between made by Redis or by the declared policy.
"""
import time

import pytest

from tbtest.core import redis_key
from tbtest.env import free_port
from tbtest.ha import MASTER, SentinelRig, bounded, follow, kill9

COOLDOWN_MS = 300


@pytest.fixture
def rig(tmp_path):
    """A rig of the test's own: the failover tests change its topology."""
    r = SentinelRig(tmp_path).start()
    yield r
    r.stop()


@pytest.fixture(scope="module")
def steady(tmp_path_factory):
    """A rig shared by the tests that leave its topology alone."""
    r = SentinelRig(tmp_path_factory.mktemp("steady")).start()
    yield r
    r.stop()


def exhaust(d, key, cap):
    """cap decisions pass, the next is refused: the limit holds."""
    got = [d.take(key, cap, 0.001, 1) for _ in range(cap + 1)]
    assert all(g["source"] == "redis" for g in got), got
    assert [g["allowed"] for g in got] == [1] * cap + [0], got


# Decisions through the sentinels land on the primary, limits hold, and a
# refused first sentinel only sends the client to the next one.
def test_core_010_01(steady, drivers):
    rig = steady
    d = drivers(rig.url)
    exhaust(d, "alice", 5)
    key = redis_key("tb:", "alice")
    assert rig.primary.client().exists(key) == 1
    dead = "127.0.0.1:%d" % free_port()
    url = rig.url.replace("redis-sentinel://", "redis-sentinel://%s," % dead)
    d2 = drivers(url)
    exhaust(d2, "bob", 3)
    assert rig.primary.client().exists(redis_key("tb:", "bob")) == 1


# An unknown master name is a failure the policy answers (open here,
# closed when declared), not a crash or a hang.
def test_core_010_02(steady, drivers):
    rig = steady
    url = rig.url.replace("/" + MASTER, "/nosuchmaster")
    d = drivers(url, timeout=100)
    r = d.take("k", 5, 1, 1)
    assert (r["source"], r["allowed"], r["err"]) == ("open", 1, "reply")
    d2 = drivers(url, timeout=100, policy="closed")
    r = d2.take("k", 5, 1, 1)
    assert (r["source"], r["allowed"]) == ("closed", 0)


# kill -9 the primary: the sentinels promote the replica (about 2 s) and
# the client follows within the failover time plus one breaker cooldown;
# meanwhile every answer is Redis's or the declared policy's (open), and
# after it decisions are correct on the new primary.
@pytest.mark.slow
def test_core_010_03(rig, drivers):
    d = drivers(rig.url, timeout=100, breaker_threshold=2,
                breaker_cooldown=COOLDOWN_MS)
    exhaust(d, "before", 3)
    old = rig.primary.port
    t_kill = time.monotonic()
    kill9(rig.primary)
    took, named, seen = follow(d, rig, old, 20)
    # The follow time is counted from the kill; the failover from the
    # kill to the first poll that saw the new name (20 ms grain).
    print("sentinel failover %.2fs, client followed %.2fs after the kill"
          % (named, took))
    assert took <= named + COOLDOWN_MS / 1000.0 + 0.35, (took, named)
    assert any(s["source"] == "open" for s in seen)
    assert time.monotonic() - t_kill < 20
    new = rig.sentinels[0].master_addr()[1]
    assert new == rig.replica.port
    exhaust(d, "after", 4)
    assert rig.replica.client().exists(redis_key("tb:", "after")) == 1
    assert d.breaker() == "closed"


# A graceful SENTINEL FAILOVER demotes the live primary: the client's
# pooled connections to it get READONLY, which sends it back to the
# sentinels; it then decides on the new primary.
@pytest.mark.slow
def test_core_010_04(rig, drivers):
    d = drivers(rig.url, timeout=200, pool=2, breaker_threshold=3,
                breaker_cooldown=COOLDOWN_MS)
    exhaust(d, "pre", 2)
    old = rig.primary.port
    t0 = time.monotonic()
    rig.sentinels[0].client().execute_command("SENTINEL", "FAILOVER", MASTER)
    took, named, seen = follow(d, rig, old, 20)
    print("graceful failover named after %.2fs, client followed %.2fs"
          % (named, took))
    assert took <= named + COOLDOWN_MS / 1000.0 + 0.35, (took, named)
    bounded(lambda: rig.primary.client().info("replication")["role"]
            == "slave", 15, what="old primary demoted")
    # Every answer after the new name has Redis deciding on the replica
    # that was promoted, never the demoted node (which refuses writes).
    exhaust(d, "post", 3)
    assert rig.replica.client().exists(redis_key("tb:", "post")) == 1
    assert time.monotonic() - t0 < 25
