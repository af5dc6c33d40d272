"""test_core_rules.py -- rule buckets in the core (TBucketRule's engine),
against a real redis-server, through the C client (tb_driver).

A decision may hold buckets of several client keys (an address, a user
name, everyone), all or nothing; a held bucket must hold its cost but is
charged only later (tb_client_charge); a banning bucket that refuses bans
its key, and every later decision that has the bucket is refused at once
with the ban's time left, touching nothing. Each runs with the scripts
and with the Redis module engine, which must leave the same state. Then
the index of bans (list, ban, unban), expiry, and a Redis Cluster whose
rule keys lie in different slots: one call per slot, with a refund when
another slot refuses.
"""
import time

import pytest

from tbtest.core import keyslot, pct, sanitized
from tbtest.env import wait_until


def rule_key(prefix, key, rule):
    return prefix.encode() + b"{" + sanitized(key) + b"}:rule:" + \
        rule.encode()


def rules(d, key, *buckets, conc=0, now=None):
    """rules NOW CONC KEY [NAME RKEY CAP RATE COST HOLD BAN ...]: each
    bucket a tuple (name, rkey or None, cap, rate, cost, hold, ban_ms)."""
    parts = ["rules", "-" if now is None else str(now), str(conc), pct(key)]
    for name, rkey, cap, rate, cost, hold, ban in buckets:
        parts += [name or "-", "-" if rkey is None else pct(rkey),
                  str(cap), str(rate), str(cost), str(hold), str(ban)]
    return d.cmd(" ".join(parts))


def tokens(r, k):
    v = r.hget(k, "tokens")
    return None if v is None else float(v)


@pytest.fixture(params=["script", "module"])
def engine_redis(request, mod_redis):
    """The module's Redis; the client forced to one engine or the other."""
    return mod_redis, request.param


# Rules on different keys, decided together: a request is refused when
# any refuses, and then no bucket is charged; each key's bucket is its
# own (the same address under two user names shares the ip bucket).
def test_core_rules_01(engine_redis, drivers):
    srv, engine = engine_redis
    r = srv.client()
    d = drivers(srv.url, "--engine", engine, prefix="R:")

    def login(ip, user):
        return rules(d, ip, ("ip", ip, 3, 0.001, 1, 0, 0),
                     ("user", user, 2, 0.001, 1, 0, 0))

    assert login("1.1.1.1", "alice")["allowed"] == 1
    assert login("1.1.1.1", "alice")["allowed"] == 1
    res = login("1.1.1.1", "alice")
    assert res["allowed"] == 0 and res["binding"] == 1, res
    assert res["banned"] == 0 and res["bans_set"] == 0
    # Refused by user: the ip bucket kept its third token.
    assert tokens(r, rule_key("R:", "1.1.1.1", "ip")) == pytest.approx(1,
                                                                   abs=0.01)
    # The same address under another user: ip binds next.
    assert login("1.1.1.1", "bob")["allowed"] == 1
    res = login("1.1.1.1", "carol")
    assert res["allowed"] == 0 and res["binding"] == 0, res
    assert tokens(r, rule_key("R:", "carol", "user")) is None
    # A constant key is one bucket for everyone; a route and the main
    # bucket of the request key ride in the same call.
    res = rules(d, "k1", (None, None, 5, 1, 1, 0, 0),
                ("api", None, 5, 1, 1, 0, 0), ("all", "all", 1, 0.001, 1, 0, 0))
    assert res["allowed"] == 1, res
    res = rules(d, "k2", (None, None, 5, 1, 1, 0, 0),
                ("all", "all", 1, 0.001, 1, 0, 0))
    assert res["allowed"] == 0 and res["binding"] == 1, res
    assert r.exists(b"R:{k2}") == 0
    assert r.exists(b"R:{k1}:route:api") == 1
    if engine == "module":
        assert d.stats()["module_calls"] > 0
    else:
        assert d.stats()["module_calls"] == 0


# A held bucket must hold its cost but is not charged; the charge comes
# later (tb_client_charge) and may go into debt, which the next decision
# waits out.
def test_core_rules_02(engine_redis, drivers):
    srv, engine = engine_redis
    r = srv.client()
    d = drivers(srv.url, "--engine", engine, prefix="H:")
    fail = ("fail", "u1", 2, 0.001, 1, 1, 0)
    for _ in range(5):
        assert rules(d, "x", fail)["allowed"] == 1
    # Nothing charged: the bucket was never written.
    assert r.exists(rule_key("H:", "u1", "fail")) == 0
    res = d.cmd("charge - fail u1 2 0.001 1")
    assert res["source"] == "redis" and res["rc"] == 0, res
    assert tokens(r, rule_key("H:", "u1", "fail")) == pytest.approx(1,
                                                                abs=0.01)
    # Three charges of parallel requests: into debt, down to -capacity.
    for _ in range(3):
        d.cmd("charge - fail u1 2 0.001 1")
    assert tokens(r, rule_key("H:", "u1", "fail")) == pytest.approx(-2,
                                                                abs=0.01)
    res = rules(d, "x", fail)
    assert res["allowed"] == 0 and res["retry_ms"] > 2900 * 1000, res
    # The held bucket's check refuses, and charges nothing more.
    assert tokens(r, rule_key("H:", "u1", "fail")) == pytest.approx(-2,
                                                                abs=0.01)


# A banning bucket that refuses bans its key: the refusal says so (its
# wait is the ban), later decisions are refused at once as banned with
# the ban's time left and charge nothing, other keys are untouched; the
# ban expires on its own.
def test_core_rules_03(engine_redis, drivers):
    srv, engine = engine_redis
    r = srv.client()
    d = drivers(srv.url, "--engine", engine, prefix="B:")

    def attempt(ip, user="u"):
        return rules(d, ip, ("ip", ip, 2, 1, 1, 0, 1500),
                     ("user", user, 100, 100, 1, 0, 0))

    assert attempt("6.6.6.6")["allowed"] == 1
    assert attempt("6.6.6.6")["allowed"] == 1
    res = attempt("6.6.6.6")
    assert res["allowed"] == 0 and res["bans_set"] == 1, res
    assert res["banned"] == 0 and 1400 <= res["retry_ms"] <= 1500, res
    k = rule_key("B:", "6.6.6.6", "ip")
    assert r.pttl(k) > 1000
    user_before = tokens(r, rule_key("B:", "u", "user"))
    res = attempt("6.6.6.6")
    assert res["allowed"] == 0 and res["banned"] == 1, res
    assert res["bans_set"] == 0 and 1000 < res["retry_ms"] <= 1500, res
    assert tokens(r, rule_key("B:", "u", "user")) == user_before
    # Another address is free, and shares nothing with the banned one.
    assert attempt("7.7.7.7")["allowed"] == 1
    listed = d.cmd("bans 10")
    assert listed["n"] == 1 and listed["ban"].startswith("ip,6.6.6.6,"), \
        listed
    # The ban ends on its own, and the refilled bucket allows again.
    t0 = time.monotonic()
    seen = []
    wait_until(lambda: seen.append(attempt("6.6.6.6")) or
               seen[-1]["banned"] == 0, timeout=4)
    assert time.monotonic() - t0 > 0.5
    assert seen[-1]["allowed"] == 1, seen[-1]
    assert d.cmd("bans 10")["n"] == 0


# A ban made by hand (tbucket ban) holds on every rule bucket of its key,
# banning or not; unban lifts it; the index lists only live bans, and no
# client key can name the index.
def test_core_rules_04(engine_redis, drivers):
    srv, engine = engine_redis
    r = srv.client()
    d = drivers(srv.url, "--engine", engine, prefix="M:")
    user = ("user", "mallory", 5, 1, 1, 0, 0)
    assert rules(d, "a", user)["allowed"] == 1
    assert d.cmd("ban user mallory 60000")["rc"] == 0
    assert d.cmd("ban user eve 60000")["rc"] == 0
    res = rules(d, "a", user)
    assert res["allowed"] == 0 and res["banned"] == 1, res
    assert 58000 < res["retry_ms"] <= 60000
    got = d.raw("bans 10")
    assert "ban=user,mallory," in got and "ban=user,eve," in got, got
    assert r.type(b"M:bans") == b"zset" and 0 < r.pttl(b"M:bans") <= 60000
    res = d.cmd("unban user mallory")
    assert res["found"] == 1
    assert d.cmd("unban user mallory")["found"] == 0
    assert rules(d, "a", user)["allowed"] == 1
    got = d.raw("bans 10")
    assert "mallory" not in got and "ban=user,eve," in got, got
    # A client key "bans" is a bucket like any other, never the index.
    assert rules(d, "bans", ("user", "bans", 5, 1, 1, 0, 0))["allowed"] == 1
    assert r.type(b"M:bans") == b"zset"
    # Bad arguments are refused, not sent.
    assert d.cmd("ban bad/name x 1000")["rc"] == -1
    assert d.cmd("ban user x 0")["rc"] == -1


# What both engines store is the same, byte for byte, on a trace of bans,
# held buckets and charges (the ban field in the hash, the TTL that
# outlives the ban, a settlement that never ends a ban early).
def test_core_rules_05(mod_redis, drivers):
    r = mod_redis.client()
    ds = drivers(mod_redis.url, "--engine", "script", prefix="S:")
    dm = drivers(mod_redis.url, "--engine", "module", prefix="S:")
    t = 1_700_000_000_000
    trace = []
    for i in range(40):
        lane_now = t + i * 37
        trace.append((lane_now, [("ip", "9.9.9.9", 3, 1, 1, 0, 2000),
                                 ("user", "u%d" % (i % 2), 4, 0.5, 2, 1,
                                  500 * (i % 3))]))
    out = {}
    for name, d in (("script", ds), ("module", dm)):
        r.flushall()
        got = []
        for now, bs in trace:
            res = rules(d, "req", *bs, now=now)
            got.append((res["allowed"], res["remaining"], res["retry_ms"],
                        res["binding"], res["banned"], res["bans_set"]))
            if res["allowed"]:
                d.cmd("charge %d user %s 4 0.5 2" % (now, bs[1][1]))
        state = {}
        for k in sorted(r.keys(b"S:{*")):
            state[k] = (r.hgetall(k), r.pttl(k) > 0)
        out[name] = (got, state)
    assert out["script"] == out["module"]
    assert any(g[5] for g in out["script"][0]), "no ban was set"
    assert any(g[4] for g in out["script"][0]), "no ban refused"


def keys_on_two_slots(cluster, prefix):
    """An address and a user whose rule buckets lie on different
    primaries."""
    for i in range(1000):
        ip, user = "10.0.0.%d" % i, "user%d" % i
        a = cluster.owner(keyslot(rule_key(prefix, ip, "ip")))
        b = cluster.owner(keyslot(rule_key(prefix, user, "user")))
        if a != b:
            return ip, user
    raise AssertionError("no pair on two nodes")


# Redis Cluster with rule keys on different slots: each bucket lives on
# its own slot's primary; a refusal in one slot gives back what the other
# slot took, so a refused request charges nothing; a ban holds there too.
def test_core_rules_06(cluster, drivers):
    d = drivers(cluster.url, prefix="C:")
    ip, user = keys_on_two_slots(cluster, "C:")
    kip, kuser = rule_key("C:", ip, "ip"), rule_key("C:", user, "user")

    def node_of(k):
        return cluster.by_port(cluster.owner(keyslot(k))).client()

    def attempt():
        return rules(d, "req", ("ip", ip, 5, 0.001, 1, 0, 0),
                     ("user", user, 2, 0.001, 1, 0, 60000))

    assert attempt()["allowed"] == 1
    assert attempt()["allowed"] == 1
    assert tokens(node_of(kip), kip) == pytest.approx(3, abs=0.01)
    res = attempt()
    assert res["source"] == "redis" and res["allowed"] == 0, res
    assert res["binding"] == 1 and res["bans_set"] == 2, res
    # The ip bucket, in the other slot, was refunded.
    assert tokens(node_of(kip), kip) == pytest.approx(3, abs=0.01)
    res = attempt()
    assert res["allowed"] == 0 and res["banned"] == 2, res
    assert tokens(node_of(kip), kip) == pytest.approx(3, abs=0.01)
    assert "ban=user,%s," % user in d.raw("bans 10")
    # A charge of buckets in two slots is a call per slot.
    d.cmd("unban user %s keep" % user)
    res = d.cmd("charge - ip %s 5 0.001 1 user %s 2 0.001 1" % (ip, user))
    assert res["rc"] == 0, res
    assert tokens(node_of(kip), kip) == pytest.approx(2, abs=0.01)
    assert tokens(node_of(kuser), kuser) == pytest.approx(-1, abs=0.01)
    # A concurrency limit rides with the slot of the request key.
    res = rules(d, "req", ("ip", ip, 5, 0.001, 1, 0, 0), conc=1)
    assert res["allowed"] == 1 and res["handle"] >= 0, res
    res = rules(d, "req", ("ip", ip, 5, 0.001, 1, 0, 0), conc=1)
    assert res["allowed"] == 0 and res["refused_by"] == "concurrency"
    # Refused by the slot set: the ip bucket is not charged.
    assert tokens(node_of(kip), kip) == pytest.approx(1, abs=0.01)
