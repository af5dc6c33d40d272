"""test_ha_cluster.py -- the core against a real Redis Cluster.

Three primaries made with `redis-server --cluster-enabled yes` and
`redis-cli --cluster create` on free loopback ports; the core's URL names
two of them (redis-cluster://a,b) and must learn the third from CLUSTER
SLOTS. Checks the hash slot against CLUSTER KEYSLOT, decisions on keys of
every node (each key stored on its slot's primary), a slot migration
(SETSLOT IMPORTING/MIGRATING + MIGRATE + SETSLOT NODE) under load with no
decision left to the failure policy and the bucket's budget exact across
the move, and, with replicas, a CLUSTER FAILOVER. Every process is stopped
by PID; every wait is bounded.
"""
import random
import threading
import time

import pytest

from tbtest.core import keyslot, pct, redis_key
from tbtest.ha import ClusterRig, bounded, kill9


def key_on(cluster, port, prefix="k"):
    """A client key whose bucket slot the primary on port owns."""
    for i in range(10000):
        k = "%s%d" % (prefix, i)
        if cluster.owner(keyslot(redis_key("tb:", k))) == port:
            return k
    raise AssertionError("no key for %d" % port)


def exhaust(d, key, cap):
    got = [d.take(key, cap, 0.001, 1) for _ in range(cap + 1)]
    assert all(g["source"] == "redis" for g in got), got
    assert [g["allowed"] for g in got] == [1] * cap + [0], got


# The client's slot is Redis's: CLUSTER KEYSLOT agrees on random keys and
# on every hash-tag corner (empty tag, unclosed brace, second tag, binary).
def test_core_011_01(cluster, drivers):
    d = drivers(cluster.url)
    node = cluster.nodes[0].client()
    rnd = random.Random(6)
    keys = [b"", b"foo", b"123456789", b"{user1000}.following", b"{}x",
            b"x{}", b"{", b"}{a}", b"a{b", b"{{a}}", b"a{b}c{d}", b"{a}{b}",
            b"\x00\xff{\x01}", b"tb:{alice}:route:api"]
    keys += [bytes(rnd.randrange(256) for _ in range(rnd.randrange(1, 40)))
             for _ in range(300)]
    for k in keys:
        got = d.cmd("slot " + pct(k) if k else "slot %")["slot"]
        assert got == node.execute_command("CLUSTER", "KEYSLOT", k), k
        assert got == keyslot(k), k


# Decisions on keys owned by each of the three primaries, the third known
# only from the map: each bucket lives on its slot's primary, routes
# included (same slot), and every limit holds.
def test_core_011_02(cluster, drivers):
    d = drivers(cluster.url)
    for n in cluster.nodes:
        k = key_on(cluster, n.port, "own")
        exhaust(d, k, 3)
        assert n.client().exists(redis_key("tb:", k)) == 1
        r = d.take(k + "x", 5, 0.001, 1, "api", 2, 0.001, 1)
        assert r["source"] == "redis" and r["allowed"] == 1
        owner = cluster.by_port(cluster.owner(keyslot(
            redis_key("tb:", k + "x"))))
        assert owner.client().exists(redis_key("tb:", k + "x", "api")) == 1
    pool = d.cmd("pool")
    assert pool["open"] >= 3, pool


def migrate_slot(cluster, slot, src, dst, pause=0.0):
    """Move one slot from src to dst the way redis-cli does; pause seconds
    between the steps so that load runs through each state."""
    sid, did = cluster.node_id(src), cluster.node_id(dst)
    dst.cluster("SETSLOT", slot, "IMPORTING", sid)
    src.cluster("SETSLOT", slot, "MIGRATING", did)
    time.sleep(pause)
    sc = src.client()
    for _ in range(1000):
        keys = sc.execute_command("CLUSTER", "GETKEYSINSLOT", slot, 100)
        if not keys:
            break
        sc.execute_command("MIGRATE", "127.0.0.1", dst.port, "", 0, 5000,
                           "KEYS", *keys)
    time.sleep(pause)
    # The importing node first, then the old owner, as redis-cli does: the
    # other order bounces MOVED between the two for a moment.
    for n in [dst, src] + [n for n in cluster.nodes if n not in (src, dst)]:
        n.cluster("SETSLOT", slot, "NODE", did)


# A slot moves under load: two drivers hammer one bucket (budget 2000,
# no refill) while its slot migrates. Every decision is Redis's (none is
# left to the policy), the budget is spent exactly once, and after the map
# settles the bucket is on the new owner and a new limit holds there.
@pytest.mark.slow
def test_core_011_03(cluster, drivers):
    src = cluster.nodes[0]
    dst = cluster.nodes[1]
    key = key_on(cluster, src.port, "mig")
    slot = keyslot(redis_key("tb:", key))
    ds = [drivers(cluster.url, timeout=200, policy="closed")
          for _ in range(2)]
    for d in ds:
        d.take(key, 2000, 0.000001, 1)  # connect and learn the map
    asks0 = cluster.nodes[1].client().info("commandstats").get(
        "cmdstat_asking", {}).get("calls", 0)
    for d in ds:
        d.send("hammer %s 2000 0.000001 1 3000" % key)
    t = threading.Thread(target=migrate_slot,
                         args=(cluster, slot, src, dst, 0.8))
    t.start()
    outs = [d.line(timeout=15) for d in ds]
    t.join(timeout=15)
    assert not t.is_alive()
    res = [dict(kv.split("=") for kv in o.split()[1:]) for o in outs]
    total = sum(int(r["total"]) for r in res)
    allowed = sum(int(r["allowed"]) for r in res)
    redis = sum(int(r["redis"]) for r in res)
    print("migration: %d decisions, %d by Redis, %d allowed" % (
        total, redis, allowed))
    assert redis == total, res
    # Both warm-up takes spent a token each.
    assert total > 2000 and allowed == 1998, res
    asks = cluster.nodes[1].client().info("commandstats").get(
        "cmdstat_asking", {}).get("calls", 0) - asks0
    print("ASKING calls on the importing node: %d" % asks)
    assert cluster.owner(slot) == dst.port
    assert dst.client().exists(redis_key("tb:", key)) == 1
    assert src.cluster("COUNTKEYSINSLOT", slot) == 0
    for d in ds:
        r = d.take(key, 2000, 0.000001, 1)
        assert (r["source"], r["allowed"]) == ("redis", 0)
    exhaust(ds[0], key + "new", 4) if keyslot(
        redis_key("tb:", key + "new")) else None
    # Move it back so the module-scoped cluster is as it was.
    migrate_slot(cluster, slot, dst, src)
    r = ds[1].take(key, 2000, 0.000001, 1)
    assert (r["source"], r["allowed"]) == ("redis", 0)


# With replicas: CLUSTER FAILOVER on a replica demotes its primary; the
# client follows the MOVED it gets from the demoted node (reloading the
# scripts on the new primary as it connects) and the bucket's state moved
# with replication, so the limit still holds.
@pytest.mark.slow
def test_core_011_04(tmp_path, drivers):
    rig = ClusterRig(tmp_path, primaries=3, replicas=1).start()
    try:
        d = drivers(rig.url, timeout=200, policy="closed")
        start, end, pport, reps = rig.slots()[0]
        old = rig.by_port(pport)
        replica = rig.by_port(reps[0])
        key = key_on(rig, pport, "fo")
        for _ in range(3):
            assert d.take(key, 5, 0.000001, 1)["allowed"] == 1
        old.client().execute_command("WAIT", 1, 2000)
        t0 = time.monotonic()
        replica.cluster("FAILOVER")
        bounded(lambda: rig.owner(start, replica) == replica.port, 15,
                what="replica promoted")
        seen = []
        bounded(lambda: seen.append(d.take(key, 5, 0.000001, 1)) or
                seen[-1]["source"] == "redis", 10, step=0.02,
                what="client follows")
        took = time.monotonic() - t0
        print("CLUSTER FAILOVER: client decided on the new primary %.2fs "
              "after the command; answers %s" % (
                  took, [s["source"] for s in seen]))
        # 3 before + the one that followed: one token left, then none.
        assert seen[-1]["allowed"] == 1
        r = d.take(key, 5, 0.000001, 1)
        assert (r["source"], r["allowed"]) == ("redis", 1)
        r = d.take(key, 5, 0.000001, 1)
        assert (r["source"], r["allowed"]) == ("redis", 0)
        assert old.client().info("replication")["role"] == "slave"
        assert replica.client().exists(redis_key("tb:", key)) == 1
        assert all(s["source"] in ("redis", "closed") for s in seen)
    finally:
        rig.stop()


# With replicas: kill -9 a primary. The cluster promotes its replica after
# cluster-node-timeout (2 s) and an election; the client, whose breaker
# opened meanwhile (the policy, closed, answered), refreshes its map on
# the first probe after the promotion and decides on the new primary
# within the promotion time plus one breaker cooldown.
@pytest.mark.slow
def test_core_011_05(tmp_path, drivers):
    cooldown_ms = 300
    rig = ClusterRig(tmp_path, primaries=3, replicas=1).start()
    try:
        d = drivers(rig.url, timeout=100, policy="closed",
                    breaker_threshold=2, breaker_cooldown=cooldown_ms)
        start, end, pport, reps = rig.slots()[-1]
        victim = rig.by_port(pport)
        replica = rig.by_port(reps[0])
        witness = next(n for n in rig.nodes if n not in (victim, replica))
        key = key_on(rig, pport, "kill")
        for _ in range(2):
            assert d.take(key, 4, 0.000001, 1)["allowed"] == 1
        victim.client().execute_command("WAIT", 1, 2000)
        t0 = time.monotonic()
        kill9(victim)
        seen, promoted = [], None
        for _ in range(1000):
            if time.monotonic() - t0 > 20:
                break
            if promoted is None and rig.owner(start, witness) == replica.port:
                promoted = time.monotonic() - t0
            seen.append(d.take(key, 4, 0.000001, 1))
            if seen[-1]["source"] == "redis" and promoted is not None:
                break
            time.sleep(0.02)
        took = time.monotonic() - t0
        print("kill -9 of a cluster primary: promoted after %.2fs, client "
              "decided on the new primary %.2fs after the kill" % (
                  promoted or -1, took))
        assert seen[-1]["source"] == "redis", seen[-3:]
        assert all(s["source"] in ("redis", "closed") for s in seen)
        assert took <= promoted + cooldown_ms / 1000.0 + 0.45, (
            took, promoted)
        # 2 before, the decision that followed: one token left, then none.
        assert seen[-1]["allowed"] == 1
        assert d.take(key, 4, 0.000001, 1)["allowed"] == 1
        r = d.take(key, 4, 0.000001, 1)
        assert (r["source"], r["allowed"]) == ("redis", 0)
    finally:
        rig.stop()
