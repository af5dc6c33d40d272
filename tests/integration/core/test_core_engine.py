"""test_core_engine.py -- the client's engines against one real Redis: the
Lua scripts (EVALSHA) or the commands of the Redis module tbucket_redis.so
(tbucket.bucket, tbucket.gcra, ...), chosen by tb_options_t.engine.

script never calls the module, even where it is loaded; module calls only
the module, and a server without it fails the connection's setup, so that
every decision is the failure policy's, the last error naming the missing
module; auto asks each new connection (COMMAND INFO tbucket.bucket) and
uses the module where the server has it -- from the second decision of a
fresh pool, the first being chosen before the connection's setup said.
Both engines keep the same state, so that drivers of either engine share
a bucket exactly. What went where is read on the server (INFO
commandstats) and in the client (stats module_calls, `engine`).
"""
import pytest

from tbtest.core import info_commandstats, redis_key
from tbtest.redismod import ENGINES, dump

FEW = 0.000001  # a refill rate that adds no token during a test
MOD_CMDS = sorted(c for c, _ in ENGINES.values())
# tb_driver's algorithm names (TBucketAlgorithm) and their commands.
ALGO_CMDS = [("token-bucket", "tbucket.bucket"), ("gcra", "tbucket.gcra"),
             ("sliding-window", "tbucket.swindow"),
             ("fixed-window", "tbucket.fwindow"),
             ("sliding-log", "tbucket.slog")]


def calls(srv):
    return info_commandstats(srv.client())


def module_calls_seen(cs):
    """Calls of every tbucket.* command in an INFO commandstats."""
    return sum(cs.get(c, 0) for c in MOD_CMDS)


def engine(d):
    e = d.cmd("engine")
    return e["engine"], e["mixed"]


def every_algo(d, tag):
    """Two decisions with each algorithm (Redis's clock); all allowed."""
    for name, _ in ALGO_CMDS:
        for want in (4, 3):
            r = d.cmd("run %s 0 0 - %s%s 5 %r 1" % (name, tag, name, FEW))
            assert (r["source"], r["allowed"], r["remaining"]) == (
                "redis", 1, want), (name, r)


# engine=script on a server that has the module: never a tbucket.* call,
# not even the setup's COMMAND INFO; every algorithm by EVALSHA.
def test_core_engine_001_01(mod_redis, drivers):
    d = drivers(mod_redis.url, engine="script")
    assert engine(d) == ("script", 0)
    every_algo(d, "s")
    cs = calls(mod_redis)
    assert module_calls_seen(cs) == 0, cs
    assert "command|info" not in cs, cs
    assert cs["evalsha"] == 10
    st = d.stats()
    assert (st["module_calls"], st["redis_calls"]) == (0, 10), st
    assert engine(d) == ("script", 0)


# engine=module on a server that has it: every decision (the first one
# too) is the algorithm's own tbucket.* command, never EVALSHA or EVAL;
# module_calls counts each of them.
def test_core_engine_001_02(mod_redis, drivers):
    d = drivers(mod_redis.url, engine="module")
    every_algo(d, "m")
    cs = calls(mod_redis)
    for _, cmd in ALGO_CMDS:
        assert cs.get(cmd) == 2, (cmd, cs)
    assert cs.get("evalsha", 0) == cs.get("eval", 0) == 0, cs
    assert cs.get("command|info") == 1
    st = d.stats()
    assert st["module_calls"] == st["redis_calls"] == st["decisions"] == 10
    assert engine(d) == ("module", 0)


# engine=module on a server without the module: the connection's setup
# fails, so every decision is the failure policy's (open: allowed,
# source=open; closed: refused, source=closed), the last error names the
# missing module, and nothing reaches Redis but the setup.
@pytest.mark.parametrize("policy,allowed", [("open", 1), ("closed", 0)])
def test_core_engine_001_03(redis_server, drivers, policy, allowed):
    d = drivers(redis_server.url, engine="module", policy=policy,
                breaker_threshold=1000)
    for k in range(4):
        r = d.take("nm", 5, 1, 1)
        assert (r["source"], r["allowed"], r["err"]) == (
            policy, allowed, "reply"), r
    err = d.raw("lasterr")
    assert err.startswith("ok kind=reply ") and "tbucket.bucket" in err \
        and "tbucket_redis.so" in err, err
    cs = calls(redis_server)
    assert cs.get("evalsha", 0) == cs.get("eval", 0) == 0, cs
    # A failed setup each time a connection was tried, nothing else.
    assert 1 <= cs.get("command|info", 0) <= 4, cs
    assert redis_server.client().dbsize() == 0
    st = d.stats()
    assert st["fallback_" + policy] == 4 and st["module_calls"] == 0, st
    assert st["redis_errors"] == 4 and st["connects"] == 0, st


def six_from_ten(d):
    """Six decisions on a bucket of 10, each made by Redis, exact."""
    for want in range(9, 3, -1):
        r = d.take("au", 10, FEW, 1)
        assert (r["source"], r["remaining"]) == ("redis", want), r


# engine=auto: with the module, every decision after the fresh pool's
# first (which may go by script) goes through the module, `engine` turning
# from auto to module; without it (COMMAND INFO answers nil) every decision is
# EVALSHA, no error, and `engine` says script.
def test_core_engine_001_04(mod_redis, redis_server, drivers):
    d = drivers(mod_redis.url, engine="auto")
    assert engine(d) == ("auto", 0)
    six_from_ten(d)
    cs = calls(mod_redis)
    assert cs.get("evalsha", 0) <= 1, cs
    assert cs.get("evalsha", 0) + cs.get("tbucket.bucket", 0) == 6, cs
    assert engine(d) == ("module", 0)
    assert d.stats()["module_calls"] == cs["tbucket.bucket"]
    p = drivers(redis_server.url, engine="auto")
    assert engine(p) == ("auto", 0)
    six_from_ten(p)
    cs = calls(redis_server)
    assert cs.get("evalsha") == 6 and cs.get("command|info") == 1, cs
    st = p.stats()
    assert st["module_calls"] == st["redis_errors"] == 0, st
    assert engine(p) == ("script", 0)


# Both engines on one Redis: a script driver and a module driver take in
# turn from one bucket, and the remaining counts form one exact sequence
# (10 tokens: 9, 8, ..., 0, then refusals), half of them by each engine.
def test_core_engine_001_05(mod_redis, drivers):
    ds = [drivers(mod_redis.url, engine="script"),
          drivers(mod_redis.url, engine="module")]
    got = [ds[i % 2].take("both", 10, FEW, 1) for i in range(14)]
    assert all(g["source"] == "redis" for g in got), got
    assert [(g["allowed"], g["remaining"]) for g in got] == \
        [(1, n) for n in range(9, -1, -1)] + [(0, 0)] * 4, got
    cs = calls(mod_redis)
    assert (cs.get("evalsha"), cs.get("tbucket.bucket")) == (7, 7), cs


def trace(n):
    """n driver commands on a clock of our own (ms): the token bucket
    with a route and fractional refill, leases with give-back,
    settlements, GCRA and the windows, a concurrency slot set."""
    out, now = [], 1700000000000
    for i in range(n):
        now += (37 * i) % 120
        kind, j = i % 6, i // 6
        if kind in (0, 1):
            out.append("take_at %d tr 6 2.5 1.5 api 4 1.25 1" % now)
        elif kind == 2:
            out.append("lease_at %d 0 0 le 12 3.5 1 4 %d" % (now, j % 3))
        elif kind == 3:
            out.append("settle token-bucket 0 0 %d %s tr 6 2.5 1.5 api 4 "
                       "1.25 1" % (now, ["0.5", "2", "4.25"][j % 3]))
        elif kind == 4:
            name = ALGO_CMDS[1 + j % 4][0]
            out.append("run %s 0 0 %d al%s 3 2 1" % (name, now, name))
        else:
            out.append("conc_at %d 3 2000 cc 8 2 1" % now)
    return out


def answer(line):
    """A driver's answer without what differs from run to run."""
    return " ".join(w for w in line.split() if w.split("=")[0] not in
                    ("elapsed_us", "redis_us", "slot_id", "handle"))


def state(r, prefix):
    """Every key under prefix (prefix removed) and its value; a slot
    set's members (random ids) as their scores only."""
    out = {}
    for k in r.keys(prefix + b"*"):
        v = dump(r, k)
        if v[0] == "zset":
            v = ("zset", sorted(s for _, s in v[1]))
        out[k[len(prefix):]] = v
    return out


# Engines interleaved on one Redis, call by call (a script driver and a
# module driver in turn, each continuing what the other stored) over a
# trace of every kind of call on a clock of our own, answer the same as a
# script driver alone, and leave the same bytes in Redis.
def test_core_engine_001_06(mod_redis, drivers):
    lanes = {"s:": [drivers(mod_redis.url, engine="script", prefix="s:")],
             "m:": [drivers(mod_redis.url, engine="module", prefix="m:")],
             "x:": [drivers(mod_redis.url, engine="script", prefix="x:"),
                    drivers(mod_redis.url, engine="module", prefix="x:")]}
    got = {p: [] for p in lanes}
    for i, cmd in enumerate(trace(60)):
        for p, ds in lanes.items():
            got[p].append(answer(ds[i % len(ds)].raw(cmd)))
    assert all(a.startswith("ok") and "source=redis" in a
               for a in got["s:"]), got["s:"]
    assert any("allowed=0" in a for a in got["s:"])
    assert got["m:"] == got["s:"]
    assert got["x:"] == got["s:"]
    r = mod_redis.client()
    ref = state(r, b"s:")
    assert len(ref) >= 8, ref
    assert state(r, b"m:") == ref
    assert state(r, b"x:") == ref
    assert lanes["m:"][0].stats()["module_calls"] == 60
    assert lanes["x:"][1].stats()["module_calls"] == 30
    assert lanes["x:"][0].stats()["module_calls"] == 0


# stats module_calls: with engine=module and one connection, every call
# (one- and three-bucket decisions alike) is one module call, as Redis
# counts them; script counts none; auto all but the first at most.
def test_core_engine_001_07(mod_redis, drivers):
    srv = mod_redis
    dm = drivers(srv.url, engine="module", pool=1)
    for k in range(20):
        dm.take("mc%d" % (k % 4), 1000, 100, 1)
    for k in range(10):
        dm.take("mc", 1000, 100, 1, "a", 50, 5, 1, "b", 20, 2, 2)
    st = dm.stats()
    assert st["module_calls"] == st["redis_calls"] == 30, st
    assert calls(srv)["tbucket.bucket"] == 30
    ds = drivers(srv.url, engine="script", pool=1)
    da = drivers(srv.url, engine="auto", pool=1)
    for k in range(10):
        ds.take("mc", 1000, 100, 1)
        da.take("mc", 1000, 100, 1, "a", 50, 5, 1)
    assert ds.stats()["module_calls"] == 0
    st = da.stats()
    assert st["redis_calls"] == 10 and st["module_calls"] >= 9, st
    cs = calls(srv)
    assert cs["tbucket.bucket"] == 30 + st["module_calls"], cs
    assert cs["evalsha"] == 10 + 10 - st["module_calls"], cs
    assert redis_key("tb:", "mc") in srv.client().keys("tb:*")
