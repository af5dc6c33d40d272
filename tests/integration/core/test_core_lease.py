"""test_core_lease.py -- token leasing and hot-tenant shards in the core,
against a real redis-server.

tests/vectors/lease.tsv runs here against the token-bucket script as it
ships (build/lua/tb_bucket.lua: prelude and body) with its
optional last argument `want` (the C twin tb_bucket_lease() runs the same
rows in tests/unit/test_bucket.c), then through the C client
(tb_client_lease via tb_driver). The shard key form is checked for where
it lands (one slot per shard, computed with Redis's CRC16 because
CLUSTER KEYSLOT is refused by a non-cluster server) and for forgery.
"""
import hashlib
import os

import pytest

from tbtest.core import (info_commandstats, keyslot, num, sanitized,
                         script_text, tsv_rows)
from tbtest.env import ROOT

LEASE = os.path.join(ROOT, "tests", "vectors", "lease.tsv")
COLS = ("id exists tokens ts_ms now_ms capacity rate cost want allowed "
        "remaining retry_ms granted new_tokens new_ts_ms ttl_ms back").split()


def load_lease():
    """The rows, back "0" where the optional column is absent."""
    rows = []
    for parts in tsv_rows(LEASE):
        assert len(parts) in (len(COLS) - 1, len(COLS)), parts
        rows.append(dict(zip(COLS, parts + ["0"])))
    return rows


ROWS = load_lease()


def put_state(r, key, row):
    r.delete(key)
    if row["exists"] == "1":
        r.hset(key, mapping={"tokens": num(row["tokens"]),
                             "ts": row["ts_ms"]})


def check_state(r, key, row):
    """Written when allowed, or when tokens were given back."""
    h = r.hgetall(key)
    pttl = r.pttl(key)
    if row["allowed"] == "1" or float(row["back"]) > 0:
        assert float(h[b"tokens"]) == float(row["new_tokens"]), (row, h)
        assert int(h[b"ts"]) == int(row["new_ts_ms"]), (row, h)
        ttl = int(row["ttl_ms"])
        assert ttl - 1000 < pttl <= ttl, (row, pttl)
    elif row["exists"] == "1":
        assert float(h[b"tokens"]) == float(row["tokens"]), (row, h)
        assert pttl == -1
    else:
        assert h == {} and pttl == -2


def verdict(row):
    return [int(row[k]) for k in ("allowed", "remaining", "retry_ms")] + [
        0, int(row["granted"])]


# Every lease vector through EVAL of the script text: a five-element
# reply, and the state Redis keeps.
@pytest.mark.parametrize("row", ROWS, ids=[r["id"] for r in ROWS])
def test_core_020_01(redis_server, row):
    r = redis_server.client()
    key = "lease:{%s}" % row["id"]
    put_state(r, key, row)
    extra = [num(row["back"])] if float(row["back"]) > 0 else []
    reply = r.eval(script_text(), 1, key, row["now_ms"], num(row["capacity"]),
                   num(row["rate"]), num(row["cost"]), num(row["want"]),
                   *extra)
    assert [int(x) for x in reply] == verdict(row), row["id"]
    check_state(r, key, row)


# Without `want` the reply keeps four elements; a lease over two buckets,
# or a `want` that is not a number, is an error reply and writes nothing.
def test_core_020_02(redis_server):
    r = redis_server.client()
    src = script_text()
    assert len(r.eval(src, 1, "x:{a}", "1000", "10", "1", "1")) == 4
    import redis as redis_py
    with pytest.raises(redis_py.ResponseError):
        r.eval(src, 2, "x:{b}", "x:{b}:route:r", "1000", "10", "1", "1",
               "10", "1", "1", "5")
    with pytest.raises(redis_py.ResponseError):
        r.eval(src, 1, "x:{c}", "1000", "10", "1", "1", "lots")
    assert r.exists("x:{b}", "x:{b}:route:r", "x:{c}") == 0


# Every vector through the C client (tb_client_lease, the injected now)
# into the key the client builds: granted, verdict and state match, and
# each lease is exactly one EVALSHA. Vectors with a cost or want the
# client refuses (fractional, zero) are checked to be refused.
def test_core_020_03(redis_server, drivers):
    r = redis_server.client()
    d = drivers(redis_server.url, prefix="L:")
    checked = 0
    for row in ROWS:
        client = "c-" + row["id"]
        key = b"L:{" + client.encode() + b"}"
        put_state(r, key, row)
        res = d.cmd("lease_at %s 0 0 %s %s %s %s %s %s" % (
            row["now_ms"], client, num(row["capacity"]), num(row["rate"]),
            num(row["cost"]), num(row["want"]), num(row["back"])))
        if float(row["cost"]) < 1:
            assert res["err"] == "arg" and res["granted"] == 0
            continue
        assert res["source"] == "redis", res
        got = [res["allowed"], res["remaining"], res["retry_ms"],
               res["binding"], res["granted"]]
        assert got == verdict(row), (row["id"], res)
        check_state(r, key, row)
        checked += 1
    assert checked >= len(ROWS) - 1
    assert info_commandstats(r).get("evalsha", 0) == checked


# The client refuses what a lease cannot be, before asking Redis: a
# fractional cost or want, want below cost, a shard out of range.
def test_core_020_04(redis_server, drivers):
    r = redis_server.client()
    d = drivers(redis_server.url)
    for args in ("0 0 k 10 1 1.5 5", "0 0 k 10 1 1 2.5", "0 0 k 10 1 3 2",
                 "0 0 k 10 1 0 5", "64 64 k 10 1 1 5", "65 3 k 10 1 1 5",
                 "4 -1 k 10 1 1 5"):
        res = d.cmd("lease " + args)
        assert res["err"] == "arg" and res["granted"] == 0, (args, res)
    assert info_commandstats(r).get("evalsha", 0) == 0
    assert r.dbsize() == 0


# When Redis cannot answer the policy decides this request only: no
# tokens are granted, whatever the policy says.
def test_core_020_05(drivers):
    for policy, allowed in (("open", 1), ("closed", 0), ("local", 1)):
        d = drivers("redis://127.0.0.1:1", policy=policy, timeout=50)
        res = d.cmd("lease 0 0 k 10 1 1 5")
        assert res["source"] == policy and res["allowed"] == allowed, res
        assert res["granted"] == 0, res


# A shard decision writes "<prefix>{<key> s<i>}" only; the K shards of a
# key land in K distinct slots (Redis's CRC16, and the core's tb_key_slot
# agrees); routes of a shard share its slot.
def test_core_020_06(redis_server, drivers):
    r = redis_server.client()
    d = drivers(redis_server.url, prefix="S:")
    for i in range(8):
        res = d.cmd("take_shard 8 %d tenant 80 8 1 rt 40 8 1" % i)
        assert res["allowed"] == 1 and res["source"] == "redis"
    keys = sorted(r.keys("*"))
    want = sorted([b"S:{tenant s%d}" % i for i in range(8)]
                  + [b"S:{tenant s%d}:route:rt" % i for i in range(8)])
    assert keys == want
    slots = {keyslot(b"S:{tenant s%d}" % i) for i in range(8)}
    assert len(slots) == 8
    for i in range(8):
        k = b"S:{tenant s%d}" % i
        assert keyslot(k + b":route:rt") == keyslot(k)
        assert d.cmd("slot " + k.decode().replace(" ", "%20"))["slot"] == \
            keyslot(k)
    # Over many keys, 8 shards almost always take 8 slots; the rare
    # collision is CRC16's, and only costs spreading, not correctness.
    distinct = sum(len({keyslot(b"{u%d s%d}" % (u, i)) for i in range(8)})
                   == 8 for u in range(2000))
    assert distinct >= 1980


# No client key reaches a shard: "tenant s3" (and friends) is hashed by
# tb_key_sanitize, so tenant's drained shard 3 stays drained and the
# attacker's requests land on keys of their own.
def test_core_020_07(redis_server, drivers):
    r = redis_server.client()
    d = drivers(redis_server.url, prefix="F:")
    assert d.cmd("take_shard 4 3 tenant 8 0.004 2")["allowed"] == 1
    assert d.cmd("take_shard 4 3 tenant 8 0.004 1")["allowed"] == 0
    for forged in ("tenant s3", "tenant%20s3", "tenant s3}", "{tenant s3}",
                   "tenant\ts3"):
        res = d.take(forged.replace("%20", " "), 2, 0.001, 1)
        assert res["allowed"] == 1, forged
    assert d.cmd("take_shard 4 3 tenant 8 0.004 1")["allowed"] == 0
    for k in r.keys("*"):
        if k != b"F:{tenant s3}":
            assert b" " not in k, k
            assert k.startswith(b"F:{#"), k
    h = hashlib.sha256(b"tenant s3").hexdigest()[:32].encode()
    assert sanitized("tenant s3") == b"#" + h
    assert r.exists(b"F:{#" + h + b"}") == 1
