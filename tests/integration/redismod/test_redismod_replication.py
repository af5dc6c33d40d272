"""test_redismod_replication.py -- what tbucket_redis.so replicates: the
effects of a call (HSET, SET .. PXAT, ZADD, ZREMRANGEBYSCORE, PEXPIREAT),
never the command, which reads the clock.

A replica without the module holds exactly the primary's values and
expiry times (PEXPIRETIME, to the millisecond); so does a server restarted
from the primary's AOF, also without the module (an AOF holding a
tbucket.* command would not load there). The script engine's calls ride
along on keys of their own, and replicate the same way.
"""
import random
import time

import pytest

from tbtest.redismod import ALGOS, dump, module, module_path, script


def trace(r, seed, steps=150):
    """Calls of every algorithm through both engines on Redis's own clock
    (settlements, leases, slots, several buckets); the keys written."""
    rnd = random.Random(seed)
    keys = set()
    for step in range(steps):
        algo = rnd.choice(ALGOS)
        engine = rnd.choice(["script", "module"])
        tag = "{%s-%s-%d}" % (engine[0], algo, rnd.randrange(3))
        n = rnd.choice([1, 1, 2])
        ks = ["%s:%d" % (tag, i) for i in range(n)]
        argv = [""]
        for _ in range(n):
            # Slow refills: TTLs of minutes, so no key expires between
            # the snapshots of the servers compared.
            argv += [rnd.choice(["5", "10", "2.5"]),
                     rnd.choice(["0.01", "0.03"]), rnd.choice(["1", "2"])]
        if algo == "token_bucket" and n == 1 and rnd.random() < 0.3:
            argv += ["4", "1"]
        elif algo in ("token_bucket", "gcra") and rnd.random() < 0.2:
            argv[3::3] = [rnd.choice(["-1", "3"]) for _ in range(n)]
            argv.append("settle")
        if rnd.random() < 0.3:
            ks.append(tag + ":conc")
            argv += ["conc", "2", "60000", "id%d" % rnd.randrange(3)]
        (script if engine == "script" else module)(r, algo, ks, argv)
        keys.update(ks)
        if rnd.random() < 0.1:
            r.zrem(tag + ":conc", "id%d" % rnd.randrange(3))
    return sorted(keys)


def lasting(r, keys, margin_ms=30000):
    """The keys that outlive the test by margin_ms (a settlement that
    refills a bucket gives it a TTL of 1 s: it may expire between two
    snapshots, on either engine)."""
    t = r.time()
    now = t[0] * 1000 + t[1] // 1000
    return [k for k in keys if r.pexpiretime(k) > now + margin_ms]


def snapshot(r, keys):
    return {k: (dump(r, k), r.pexpiretime(k)) for k in keys}


def wait_link(replica, timeout=10):
    deadline = time.monotonic() + timeout
    while replica.client().info("replication").get(
            "master_link_status") != "up":
        assert time.monotonic() < deadline, "the replica did not sync"
        time.sleep(0.02)


def wait_synced(primary, replica, timeout=10):
    p = primary.client()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        off = p.info("replication").get("master_repl_offset")
        if replica.client().info("replication").get(
                "slave_repl_offset") == off and off:
            return
        time.sleep(0.02)
    pytest.fail("the replica did not catch up")


# A replica without the module, attached before the calls, holds every
# key's bytes and expiry time exactly as the primary.
def test_redismod_004_01(mod_servers):
    primary = mod_servers("primary", module=module_path(),
                          extra=["repl-diskless-sync-delay 0"]).start()
    replica = mod_servers("replica", module=None,
                          extra=["replicaof 127.0.0.1 %d"
                                 % primary.port]).start()
    r = primary.client()
    wait_link(replica)
    keys = trace(r, 11)
    wait_synced(primary, replica)
    keys = lasting(r, keys)
    want = snapshot(r, keys)
    assert len(keys) > 20
    assert all(v[1] > 0 for v in want.values())
    assert snapshot(replica.client(), keys) == want
    # The replica saw effects streamed, never a tbucket command.
    stats = replica.client().info("commandstats")
    assert stats["cmdstat_exec"]["calls"] > 50, stats
    assert not [k for k in stats if "tbucket" in k], stats
    assert "cmdstat_hset" in stats and "cmdstat_pexpireat" in stats, sorted(stats)


# A replica attached after the calls (full sync) holds the same too.
def test_redismod_004_02(mod_servers):
    primary = mod_servers("primary", module=module_path(),
                          extra=["repl-diskless-sync-delay 0"]).start()
    keys = lasting(primary.client(), trace(primary.client(), 12, steps=60))
    assert len(keys) > 10, keys
    replica = mod_servers("replica", module=None,
                          extra=["replicaof 127.0.0.1 %d"
                                 % primary.port]).start()
    wait_link(replica)
    wait_synced(primary, replica)
    assert snapshot(replica.client(), keys) == snapshot(primary.client(),
                                                        keys)


# The AOF: restarted from it, without the module, the server holds every
# key's bytes and expiry time as before; restarted with the module again,
# the buckets go on.
def test_redismod_004_03(mod_servers):
    s = mod_servers("aof", module=module_path(),
                    extra=["appendonly yes", "appendfsync always"]).start()
    keys = lasting(s.client(), trace(s.client(), 13))
    want = snapshot(s.client(), keys)
    assert len(keys) > 20
    s.restart(module=None)
    assert snapshot(s.client(), keys) == want
    assert "tbucket" not in s.client().execute_command("MODULE", "LIST") \
        .__repr__()
    s.restart(module=module_path())
    assert snapshot(s.client(), keys) == want
    got = module(s.client(), "token_bucket", ["aof:{x}"], ["", "5", "1", "1"])
    assert got == [1, 4, 0, 0]
