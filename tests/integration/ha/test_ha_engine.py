"""test_ha_engine.py -- the Redis module engine (tbucket_redis.so) behind
Redis Sentinel and Redis Cluster, and a module unloaded under the client.

The client asks each server once per connection whether it has the
module (COMMAND INFO tbucket.bucket) and then sends its script calls as
the module's commands (engine=auto where the server has it, engine=module
always; engine=script never). What a decision went through is read on
the servers (INFO commandstats: cmdstat_tbucket.bucket against
cmdstat_evalsha) and in the client (stats module_calls, `engine`). Under
auto a fresh pool's very first decision goes as a script: its
connection's setup has not said yet.

Sentinel: a primary and a replica that load the module, kill -9 of the
primary; the module replicates effects, so the bucket goes on on the
promoted replica, through the module there. A replica without the module:
auto goes on by script, module answers by the failure policy. Cluster:
three primaries with the module, keys of every node, a slot moved (MOVED)
and one being moved (ASK); a cluster where one node lacks it (mixed).
A single Redis whose module is unloaded (MODULE UNLOAD) under an auto
client: the scripts answer from the next decision on, the limit exact.
Every process is stopped by PID; every wait is bounded.
"""
import pytest

from tbtest.core import info_commandstats, keyslot, redis_key
from tbtest.ha import ClusterRig, SentinelRig, bounded, follow, kill9
from tbtest.redismod import module_path

COOLDOWN_MS = 300
MOD = "tbucket.bucket"
FEW = 0.000001  # a refill rate that adds no token during a test


def calls(node):
    """{command: calls} of a Redis object's INFO commandstats."""
    return info_commandstats(node.client())


def grew(before, after, cmd):
    return after.get(cmd, 0) - before.get(cmd, 0)


def takes(d, key, cap, n):
    """n decisions on key (capacity cap, no refill): their answers."""
    return [d.take(key, cap, FEW, 1) for _ in range(n)]


def exact(got, cap, spent_before=0):
    """Redis decided every one, and the remaining counts continue from
    spent_before tokens spent: cap - spent_before - 1, ... then refusals."""
    assert all(g["source"] == "redis" for g in got), got
    want = []
    left = cap - spent_before
    for _ in got:
        if left > 0:
            left -= 1
            want.append((1, left))
        else:
            want.append((0, 0))
    assert [(g["allowed"], g["remaining"]) for g in got] == want, got


def engine(d):
    e = d.cmd("engine")
    return e["engine"], e["mixed"]


# ---- Sentinel ---------------------------------------------------------

# Module on primary and replica: decisions go through the module, the
# replica gets their effects (not the command), and after kill -9 of the
# primary both drivers (module, auto) decide through the module on the
# promoted replica, each bucket going on where it was.
@pytest.mark.slow
def test_ha_013_01(tmp_path, drivers):
    rig = SentinelRig(tmp_path, module=module_path()).start()
    try:
        opts = dict(timeout=100, breaker_threshold=2,
                    breaker_cooldown=COOLDOWN_MS)
        dm = drivers(rig.url, engine="module", **opts)
        da = drivers(rig.url, engine="auto", **opts)
        before = calls(rig.primary)
        exact(takes(dm, "sm", 6, 3), 6)
        exact(takes(da, "sa", 6, 3), 6)
        after = calls(rig.primary)
        assert dm.stats()["module_calls"] == 3
        # auto: the first decision by script (setup not yet said), then
        # the module.
        assert da.stats()["module_calls"] >= 2
        assert grew(before, after, MOD) == 3 + da.stats()["module_calls"]
        assert grew(before, after, "evalsha") == 3 - da.stats()[
            "module_calls"]
        assert engine(dm) == ("module", 0) and engine(da) == ("module", 0)
        assert rig.primary.client().execute_command("WAIT", 1, 2000) == 1
        p, r = rig.primary.client(), rig.replica.client()
        for k in ("sm", "sa"):
            key = redis_key("tb:", k)
            assert r.hgetall(key) == p.hgetall(key) != {}
        # Effects replicated, never the command (it reads the clock).
        rep = calls(rig.replica)
        assert rep.get(MOD, 0) == 0 and rep.get("hset", 0) >= 6, rep
        old = rig.primary.port
        kill9(rig.primary)
        took, named, _ = follow(dm, rig, old, 20, probe="pm")
        follow(da, rig, old, 20, probe="pa")
        print("failover named after %.2fs, engine=module client followed "
              "%.2fs after the kill" % (named, took))
        new = rig.sentinels[0].master_addr()[1]
        assert new == rig.replica.port
        before = calls(rig.replica)
        exact(takes(dm, "sm", 6, 4), 6, 3)
        exact(takes(da, "sa", 6, 4), 6, 3)
        after = calls(rig.replica)
        assert grew(before, after, MOD) == 8, (before, after)
        assert grew(before, after, "evalsha") == 0
        assert grew(before, after, "eval") == 0
        assert engine(dm) == ("module", 0) and engine(da) == ("module", 0)
    finally:
        rig.stop()


# The replica lacks the module: after kill -9 of the primary, auto goes
# on by script on the promoted replica with the bucket intact (the
# module's effects replicated to a server without it); engine=module
# gets the failure policy there (closed: refused), its last error naming
# the missing module, and nothing reaches that server for it.
@pytest.mark.slow
def test_ha_013_02(tmp_path, drivers):
    rig = SentinelRig(tmp_path, module=module_path(),
                      without_module=("replica",)).start()
    try:
        opts = dict(timeout=100, breaker_threshold=2,
                    breaker_cooldown=COOLDOWN_MS)
        dm = drivers(rig.url, engine="module", policy="closed", **opts)
        da = drivers(rig.url, engine="auto", **opts)
        exact(takes(dm, "xm", 6, 2), 6)
        exact(takes(da, "xa", 6, 3), 6)
        assert engine(da) == ("module", 0)
        assert rig.primary.client().execute_command("WAIT", 1, 2000) == 1
        old = rig.primary.port
        kill9(rig.primary)
        follow(da, rig, old, 20)
        assert rig.sentinels[0].master_addr()[1] == rig.replica.port
        before = calls(rig.replica)
        exact(takes(da, "xa", 6, 4), 6, 3)
        after = calls(rig.replica)
        assert grew(before, after, "evalsha") == 4, (before, after)
        assert engine(da) == ("script", 0)

        def refused():
            r = dm.take("xm", 6, FEW, 1)
            assert (r["source"], r["allowed"]) == ("closed", 0), r
            return MOD in dm.raw("lasterr")
        bounded(refused, 10, step=0.05, what="engine=module's setup refused")
        before = calls(rig.replica)
        for r in takes(dm, "xm", 6, 5):
            assert (r["source"], r["allowed"]) == ("closed", 0), r
        after = calls(rig.replica)
        assert grew(before, after, "evalsha") == 0
        assert grew(before, after, "eval") == 0
        # The bucket the module driver spent stayed as replicated (4
        # tokens and the few millionths the refill rate added).
        tokens = float(rig.replica.client().hget(redis_key("tb:", "xm"),
                                                 "tokens"))
        assert 4 <= tokens < 4.001, tokens
    finally:
        rig.stop()


# ---- Cluster ----------------------------------------------------------

@pytest.fixture(scope="module")
def mod_cluster(tmp_path_factory):
    """Three primaries, each loading the module."""
    rig = ClusterRig(tmp_path_factory.mktemp("modcluster"),
                     module=module_path()).start()
    yield rig
    rig.stop()


@pytest.fixture(scope="module")
def mixed_cluster(tmp_path_factory):
    """Three primaries; the last (nodes[2]) without the module."""
    rig = ClusterRig(tmp_path_factory.mktemp("mixedcluster"),
                     module=module_path(), without_module=(2,)).start()
    yield rig
    rig.stop()


def all_calls(rig):
    return {n.port: calls(n) for n in rig.nodes}


def spent_two(rig, drivers, key):
    """A driver of engine=module (policy closed) that has spent 2 of
    key's 5 tokens, both decided by Redis: the start of a slot's move."""
    d = drivers(rig.url, engine="module", policy="closed")
    exact(takes(d, key, 5, 2), 5)
    return d


# engine=module on a cluster whose nodes all have the module: keys of
# every node decided through the module on their own node (per-node
# commandstats), limits exact, no script call anywhere; `engine` says
# module, not mixed, for engine=module and for auto.
def test_ha_013_03(mod_cluster, drivers):
    rig = mod_cluster
    d = drivers(rig.url, engine="module", policy="closed")
    before = all_calls(rig)
    for i, n in enumerate(rig.nodes):
        k = rig.key_on(n.port, "own%d-" % i)
        exact(takes(d, k, 3, 4), 3)
        assert n.client().exists(redis_key("tb:", k)) == 1
    after = all_calls(rig)
    for n in rig.nodes:
        assert grew(before[n.port], after[n.port], MOD) == 4, n.port
        assert grew(before[n.port], after[n.port], "evalsha") == 0
    st = d.stats()
    assert st["module_calls"] == st["redis_calls"] == st["decisions"] == 12
    assert engine(d) == ("module", 0)
    da = drivers(rig.url, engine="auto")
    for i, n in enumerate(rig.nodes):
        exact(takes(da, rig.key_on(n.port, "auto%d-" % i), 2, 3), 2)
    assert engine(da) == ("module", 0)


# MOVED: a slot moved with its keys (SETSLOT IMPORTING/MIGRATING, MIGRATE,
# SETSLOT NODE) while the client's map still names the old owner; the
# client follows the MOVED and decides through the module on the new
# owner, the bucket's count going on exactly. The slot then moves back.
def test_ha_013_04(mod_cluster, drivers):
    rig = mod_cluster
    src, dst = rig.nodes[0], rig.nodes[1]
    key = rig.key_on(src.port, "mv")
    slot = keyslot(redis_key("tb:", key))
    d = spent_two(rig, drivers, key)
    rig.migrate_slot(slot, src, dst)
    try:
        before = all_calls(rig)
        exact(takes(d, key, 5, 4), 5, 2)
        after = all_calls(rig)
        assert grew(before[dst.port], after[dst.port], MOD) == 4
        for n in rig.nodes:
            assert grew(before[n.port], after[n.port], "evalsha") == 0
        assert dst.client().exists(redis_key("tb:", key)) == 1
        assert src.cluster("COUNTKEYSINSLOT", slot) == 0
    finally:
        rig.migrate_slot(slot, dst, src)
    exact(takes(d, key, 5, 1), 5, 5)
    assert engine(d) == ("module", 0)
    # A call that met MOVED and went on to the new owner is one call.
    st = d.stats()
    assert st["module_calls"] == st["redis_calls"] == 2 + 4 + 1, st


# ASK: during a migration the old owner decides a key it still holds
# through the module, and answers ASK for one it does not; the client
# sends ASKING and the module's command to the importing node, where that
# bucket is made and goes on exactly. After the move both keys are
# decided on the new owner, counts exact. The slot then moves back.
def test_ha_013_05(mod_cluster, drivers):
    rig = mod_cluster
    src, dst = rig.nodes[2], rig.nodes[0]
    held = rig.key_on(src.port, "ask")
    slot = keyslot(redis_key("tb:", held))
    fresh = rig.key_in_slot(slot, held + "-")
    d = spent_two(rig, drivers, held)
    rig.migrate_begin(slot, src, dst)
    try:
        before = all_calls(rig)
        exact(takes(d, held, 5, 1), 5, 2)
        exact(takes(d, fresh, 3, 2), 3)
        after = all_calls(rig)
        assert grew(before[src.port], after[src.port], MOD) == 1
        assert grew(before[dst.port], after[dst.port], MOD) == 2
        assert grew(before[dst.port], after[dst.port], "asking") == 2
        # Only the new bucket is on the importing node, the held one
        # still on the old owner.
        assert dst.cluster("COUNTKEYSINSLOT", slot) == 1
        assert src.cluster("COUNTKEYSINSLOT", slot) == 1
        assert src.client().exists(redis_key("tb:", held)) == 1
        rig.migrate_end(slot, src, dst)
        before = all_calls(rig)
        exact(takes(d, held, 5, 3), 5, 3)
        exact(takes(d, fresh, 3, 2), 3, 2)
        after = all_calls(rig)
        assert grew(before[dst.port], after[dst.port], MOD) == 5
        for n in rig.nodes:
            assert grew(before[n.port], after[n.port], "evalsha") == 0
    finally:
        if rig.owner(slot) != dst.port:
            rig.migrate_end(slot, src, dst)
        rig.migrate_slot(slot, dst, src)
    # Every call went through the module; one a node answered MOVED or
    # ASK is still one call (tb.h: module_calls are "of redis_calls").
    st = d.stats()
    assert st["module_calls"] == st["redis_calls"] == 2 + 1 + 2 + 3 + 2, st


# A mixed fleet under auto: `engine` says mixed=1 once every node has
# been reached; keys on the node without the module go by EVALSHA there,
# the others through the module on theirs, every limit exact.
def test_ha_013_06(mixed_cluster, drivers):
    rig = mixed_cluster
    plain = rig.nodes[2]
    d = drivers(rig.url, engine="auto", policy="closed")
    keys = {n.port: rig.key_on(n.port, "mix%d-" % i)
            for i, n in enumerate(rig.nodes)}
    for n in rig.nodes:
        exact(takes(d, keys[n.port], 4, 1), 4)  # every node reached
    assert engine(d) == ("auto", 1)
    before = all_calls(rig)
    for n in rig.nodes:
        exact(takes(d, keys[n.port], 4, 4), 4, 1)
    after = all_calls(rig)
    for n in rig.nodes:
        b, a = before[n.port], after[n.port]
        if n is plain:
            assert (grew(b, a, "evalsha"), grew(b, a, MOD)) == (4, 0), a
        else:
            assert (grew(b, a, "evalsha"), grew(b, a, MOD)) == (0, 4), a
    assert d.stats()["redis_errors"] == 0


# A mixed fleet under engine=module: keys on the module's nodes are
# decided there exactly; keys on the node without it get the failure
# policy (closed: refused; open: allowed), source= saying so, the last
# error naming the missing module, and nothing is written there.
def test_ha_013_07(mixed_cluster, drivers):
    rig = mixed_cluster
    plain = rig.nodes[2]
    for policy, allowed in (("closed", 0), ("open", 1)):
        d = drivers(rig.url, engine="module", policy=policy,
                    breaker_threshold=1000)
        before = all_calls(rig)
        for i, n in enumerate(rig.nodes[:2]):
            exact(takes(d, rig.key_on(n.port, "m%s%d-" % (policy, i)), 3,
                        4), 3)
        k = rig.key_on(plain.port, "m%s-" % policy)
        for r in takes(d, k, 3, 4):
            assert (r["source"], r["allowed"], r["err"]) == (
                policy, allowed, "reply"), r
        assert MOD in d.raw("lasterr")
        after = all_calls(rig)
        b, a = before[plain.port], after[plain.port]
        assert grew(b, a, "evalsha") == grew(b, a, "eval") == 0, a
        assert plain.client().exists(redis_key("tb:", k)) == 0
        for n in rig.nodes[:2]:
            assert grew(before[n.port], after[n.port], MOD) == 4
        st = d.stats()
        assert st["fallback_" + policy] == 4, st
        print("engine=module, mixed fleet: engine says %s mixed=%d"
              % engine(d))


# ---- The module unloaded ----------------------------------------------

# MODULE UNLOAD under an auto client: the next decisions are still
# Redis's (EVALSHA now, none left to the policy), the bucket's count goes
# on exactly across the switch, and `engine` says script; after MODULE
# LOAD the open connection stays on the scripts, a new one (after CLIENT
# KILL) finds the module again.
def test_ha_013_08(mod_servers, drivers):
    # Through the fixture: stopped by PID, and its log checked for
    # sanitizer reports and crashes.
    srv = mod_servers("redis", module=module_path(),
                      extra=["enable-module-command yes"]).start()
    r = srv.client()
    d = drivers(srv.url, engine="auto", pool=1)
    exact(takes(d, "u", 12, 3), 12)
    assert engine(d) == ("module", 0)
    mc = d.stats()["module_calls"]
    assert mc >= 2
    assert r.execute_command("MODULE", "UNLOAD", "tbucket") == b"OK"
    before = calls(srv)
    exact(takes(d, "u", 12, 4), 12, 3)
    after = calls(srv)
    assert grew(before, after, "evalsha") == 4, after
    st = d.stats()
    assert st["fallback_open"] == st["redis_errors"] == 0, st
    assert engine(d) == ("script", 0)
    after_switch = st["module_calls"]
    assert r.execute_command("MODULE", "LOAD", srv.module) == b"OK"
    assert calls(srv).get(MOD, 0) == 0
    exact(takes(d, "u", 12, 1), 12, 7)
    assert d.stats()["module_calls"] == after_switch
    r.execute_command("CLIENT", "KILL", "TYPE", "normal", "SKIPME",
                      "yes")
    # At most one decision per pooled connection meets the dead one.
    first = d.take("u", 12, FEW, 1)
    spent = 8 + (first["source"] == "redis")
    before = calls(srv)
    exact(takes(d, "u", 12, 3), 12, spent)
    after = calls(srv)
    # The decision that opened the new connection may still go as a
    # script (chosen before its setup said); the next ones do not.
    assert grew(before, after, MOD) + grew(before, after, "evalsha") \
        == 3, after
    assert grew(before, after, MOD) >= 2, after
    before = calls(srv)
    exact(takes(d, "u", 12, 2), 12, spent + 3)
    assert grew(before, calls(srv), MOD) == 2
    assert engine(d) == ("module", 0)
    # Decisions the scripts made are not module calls (tb.h: "of
    # redis_calls, those made to the Redis module instead of a
    # script"), the one that met "unknown command" first included:
    # the count is the module's calls before the unload and after the
    # load.
    st = d.stats()
    assert st["module_calls"] == mc + calls(srv)[MOD], (mc, st)
