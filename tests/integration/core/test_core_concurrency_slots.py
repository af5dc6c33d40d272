"""test_core_concurrency_slots.py -- concurrency limits in the core.

The slots of a client key are a sorted set "<prefix>{<key>}:conc" (members
slot ids, scores their expiry in ms). A decision with a concurrency limit
is the same script call as the buckets: every algorithm's script as it
ships (build/lua/) takes the optional slot set and four arguments, prunes
expired slots, refuses a full set before any bucket is read, and takes the
slot only when every bucket allowed the request. The client (tb_driver)
sends one EVALSHA per decision and one ZREM per release. Clocks are
injected where expiry matters; nothing here sleeps for a ttl.
"""
import pytest

from tbtest.core import info_commandstats
from tbtest.env import lua_script

SCRIPTS = ("tb_bucket.lua", "tb_gcra.lua", "tb_swindow.lua",
           "tb_fwindow.lua", "tb_slog.lua")
NOW = 1700000000000


def run(r, script, keys, now, buckets, conc=None):
    """EVAL the shipped script; conc is (set key, N, ttl_ms, slot id)."""
    argv = [str(now)]
    for b in buckets:
        argv += [str(x) for x in b]
    keys = list(keys)
    if conc:
        keys.append(conc[0])
        argv += ["conc", str(conc[1]), str(conc[2]), conc[3]]
    return r.eval(lua_script(script).decode(), len(keys), *keys, *argv)


# Every algorithm: a full slot set refuses before any bucket is touched
# (binding n, wait 1000 ms), a refusing bucket takes no slot, and an
# allowed request takes both; the reply grows {grant, slots held}.
@pytest.mark.parametrize("script", SCRIPTS)
def test_core_conc_001_all_or_nothing(redis_server, script):
    r = redis_server.client()
    cs = "t:{a}:conc"
    b = "t:{a}"
    one = [(5, 1, 1)]
    assert run(r, script, [b], NOW, one, (cs, 2, 60000, "s1")) \
        == [1, 4, 0, 0, 0, 1]
    assert run(r, script, [b], NOW, one, (cs, 2, 60000, "s2")) \
        == [1, 3, 0, 0, 0, 2]
    before = {k: r.dump(k) for k in r.keys("t:{a}*") if k != cs.encode()}
    # Full: refused by the slots, bound to index n = 1, nothing written.
    rep = run(r, script, [b], NOW, one, (cs, 2, 60000, "s3"))
    assert rep[0] == 0 and rep[2] == 1000 and rep[3] == 1 and rep[5] == 2
    assert {k: r.dump(k) for k in r.keys("t:{a}*")
            if k != cs.encode()} == before
    assert r.zrange(cs, 0, -1) == [b"s1", b"s2"]
    # A bucket that refuses (cost > what is left) takes no slot.
    r.zrem(cs, "s2")
    rep = run(r, script, [b], NOW, [(5, 1, 4)], (cs, 2, 60000, "s4"))
    assert rep[0] == 0 and rep[3] == 0 and rep[5] == 1
    assert r.zrange(cs, 0, -1) == [b"s1"]
    # Scores are the expiry on the script's clock; the set lives as long
    # as its latest slot.
    assert r.zscore(cs, "s1") == NOW + 60000
    assert 59000 < r.pttl(cs) <= 60000


# Without the concurrency arguments every script answers exactly as it
# did: four elements, no set written (the vectors check the rest).
@pytest.mark.parametrize("script", SCRIPTS)
def test_core_conc_002_absent_means_unchanged(redis_server, script):
    r = redis_server.client()
    assert run(r, script, ["u:{a}"], NOW, [(5, 1, 1)]) == [1, 4, 0, 0]
    assert r.keys("*conc*") == []


# The limit alone (no bucket), expiry by the script's clock: a slot is
# pruned once its ttl has passed, so a dead holder frees it.
def test_core_conc_003_alone_and_expiry(redis_server):
    r = redis_server.client()
    cs = "e:{k}:conc"
    assert run(r, "tb_bucket.lua", [], NOW, [], (cs, 1, 2000, "a")) \
        == [1, -1, 0, 0, 0, 1]
    assert run(r, "tb_bucket.lua", [], NOW + 1999, [], (cs, 1, 2000, "b")) \
        == [0, -1, 1000, 0, 0, 1]
    assert run(r, "tb_bucket.lua", [], NOW + 2000, [], (cs, 1, 2000, "c")) \
        == [1, -1, 0, 0, 0, 1]
    assert r.zrange(cs, 0, -1) == [b"c"]
    # A lease and a slot in one call: the grant stays the fifth element.
    rep = run(r, "tb_bucket.lua", ["e:{l}"], NOW, [(10, 1, 1), (5,)],
              ("e:{l}:conc", 3, 2000, "x"))
    assert rep == [1, 5, 0, 0, 5, 1]


# The client: N slots, then refused by concurrency with a one-second
# retry; a release frees exactly one; one EVALSHA per decision, one ZREM
# per release, nothing else; ids name their process.
def test_core_conc_004_client_take_release(redis_server, drivers):
    r = redis_server.client()
    d = drivers(redis_server.url, pool=1)
    d.take("warm", 10, 1, 1)
    r.config_resetstat()
    a = d.cmd("conc 2 0 k")
    b = d.cmd("conc 2 0 k")
    assert a["allowed"] == b["allowed"] == 1
    assert a["remaining"] == 1 and b["remaining"] == 0
    assert a["slot_id"].split(".")[1] == str(d.pid)
    c = d.cmd("conc 2 0 k")
    assert c["allowed"] == 0 and c["refused_by"] == "concurrency"
    assert c["retry_ms"] == 1000 and c["handle"] == -1 and c["limit"] == 2
    members = sorted(m.decode() for m in r.zrange("tb:{k}:conc", 0, -1))
    assert members == sorted([a["slot_id"], b["slot_id"]])
    # The default ttl is 60 s.
    assert 59000 < r.pttl("tb:{k}:conc") <= 60000
    assert d.cmd("release %d" % a["handle"])["rc"] == 0
    assert r.zrange("tb:{k}:conc", 0, -1) == [b["slot_id"].encode()]
    assert d.cmd("conc 2 0 k")["allowed"] == 1
    cs = info_commandstats(r)
    assert cs.pop("evalsha") == 4
    assert cs.pop("zrem") == 1
    # The script's own commands, and this test's (zrange, pttl, info).
    for inner in ("zremrangebyscore", "zcard", "zadd", "pttl", "pexpire",
                  "time", "zrange", "config|resetstat", "info"):
        cs.pop(inner, None)
    assert cs == {}
    # Different keys are independent.
    assert d.cmd("conc 2 0 other")["allowed"] == 1


# With buckets: a request refused by concurrency takes no token, one
# refused by a bucket holds no slot, across routes too (all or nothing).
def test_core_conc_005_client_with_buckets(redis_server, drivers):
    r = redis_server.client()
    d = drivers(redis_server.url)
    h = d.cmd("conc 1 0 k 10 0.001 1 rt 3 0.001 1")
    assert h["allowed"] == 1 and h["remaining"] == 2
    full = d.cmd("conc 1 0 k 10 0.001 1 rt 3 0.001 1")
    assert full["allowed"] == 0 and full["refused_by"] == "concurrency"
    assert round(float(r.hget("tb:{k}", "tokens"))) == 9
    assert round(float(r.hget("tb:{k}:route:rt", "tokens"))) == 2
    d.cmd("release %d" % h["handle"])
    for k in range(2):
        x = d.cmd("conc 5 0 k 10 0.001 1 rt 3 0.001 1")
        assert x["allowed"] == 1
    over = d.cmd("conc 5 0 k 10 0.001 1 rt 3 0.001 1")
    assert over["allowed"] == 0 and over["refused_by"] == "rate"
    assert over["binding"] == 1 and over["in_flight"] == 2
    assert r.zcard("tb:{k}:conc") == 2


# Slots expire on Redis's clock when never released; two processes share
# one limit, and their ids differ.
def test_core_conc_006_expiry_and_processes(redis_server, drivers):
    r = redis_server.client()
    d1 = drivers(redis_server.url)
    d2 = drivers(redis_server.url)
    t = NOW
    a = d1.cmd("conc_at %d 2 1500 p" % t)
    b = d2.cmd("conc_at %d 2 1500 p" % (t + 10))
    assert a["allowed"] == b["allowed"] == 1
    assert a["slot_id"] != b["slot_id"]
    assert d1.cmd("conc_at %d 2 1500 p" % (t + 20))["allowed"] == 0
    assert d2.cmd("conc_at %d 2 1500 p" % (t + 1499))["allowed"] == 0
    # a expired at t + 1500: pruned, its place taken.
    c = d2.cmd("conc_at %d 2 1500 p" % (t + 1500))
    assert c["allowed"] == 1 and c["in_flight"] == 2
    assert sorted(r.zrange("tb:{p}:conc", 0, -1)) == sorted(
        [b["slot_id"].encode(), c["slot_id"].encode()])
    # Releasing an expired slot is harmless.
    assert d1.cmd("release %d" % a["handle"])["rc"] == 0
    assert r.zcard("tb:{p}:conc") == 2


# Redis down: the release reports the failure (the slot would expire);
# decisions follow the policy (unit tests cover each policy's slots).
def test_core_conc_007_release_when_down(redis_server, drivers):
    d = drivers(redis_server.url, timeout=200, breaker_threshold=1000)
    h = d.cmd("conc 1 0 down")
    redis_server.stop()
    rel = d.cmd("release %d" % h["handle"])
    assert rel["rc"] == -1 and rel["err"] in ("io", "timeout")
    x = d.cmd("conc 1 0 down")
    assert x["source"] == "open" and x["allowed"] == 1 and x["handle"] == -1
