"""test_core_settle.py -- settling real costs and giving lease tokens back,
in the core, against a real redis-server.

tests/vectors/token_bucket_settle.tsv runs here against the token-bucket
script as it ships (build/lua/tb_bucket.lua) in its 'settle' mode with the
injected now (the C twin tb_bucket_settle() runs the same rows in
tests/unit/test_bucket.c), then through the C client (tb_client_settle via
tb_driver), which must reach the same buckets as the decision: main and
route keys, shards, the GCRA's suffixed key. Then what a debt does to the
decisions that follow, what the client refuses or skips without a call,
tb_client_give_back, and a settlement Redis cannot make.
"""
import pytest

from tbtest.core import (SETTLE_VECTORS, eval_vector, load_vectors, num,
                         pct, put_buckets, script_calls)

VECTORS = load_vectors(SETTLE_VECTORS)
IDS = [v[0] for v in VECTORS]


def check_state(r, keys, buckets, vid):
    """A settlement always writes, with the TTL of the refill."""
    for i, (k, b) in enumerate(zip(keys, buckets)):
        h = r.hgetall(k)
        assert float(h[b"tokens"]) == b["new_tokens"], (vid, i, h)
        assert int(h[b"ts"]) == b["new_ts_ms"], (vid, i, h)
        pttl = r.pttl(k)
        assert b["ttl_ms"] - 1000 < pttl <= b["ttl_ms"], (vid, i, pttl)


# Every settlement vector through EVAL of the script text in its settle
# mode: the reply and the state, TTL included.
@pytest.mark.parametrize("vec", VECTORS, ids=IDS)
def test_core_settle_vectors_lua(redis_server, vec):
    r = redis_server.client()
    keys = eval_vector(r, vec, "settle", "settle")
    check_state(r, keys, vec[2], vec[0])


# The same vectors through the client: the request names the main bucket
# and routes r1.. of one client key, each charged so that the real cost
# minus the charge is the vector's delta; one EVALSHA each, none when
# every delta is 0.
def test_core_settle_vectors_client(redis_server, drivers):
    r = redis_server.client()
    d = drivers(redis_server.url, prefix="S:")
    calls = skipped = 0
    for vid, now, buckets, verdict in VECTORS:
        client = "c-" + vid
        keys = ["S:{%s}" % client] + ["S:{%s}:route:r%d" % (client, i)
                                      for i in range(1, len(buckets))]
        put_buckets(r, keys, buckets)
        real = max(0.0, max(b["cost"] for b in buckets))
        parts = ["settle token-bucket 0 0", str(now), num(real), client]
        for i, b in enumerate(buckets):
            if i:
                parts.append("r%d" % i)
            parts += [num(b["capacity"]), num(b["rate"]),
                      num(real - b["cost"])]
        res = d.cmd(" ".join(parts))
        assert res["source"] == "redis" and res["rc"] == 0, (vid, res)
        if all(b["cost"] == 0 for b in buckets):
            assert res["redis_us"] == 0 and res["remaining"] == -1, res
            skipped += 1
            continue
        calls += 1
        got = [res["allowed"], res["remaining"], res["retry_ms"],
               res["binding"]]
        assert got == verdict, (vid, res)
        check_state(r, keys, buckets, vid)
    assert skipped == 1
    assert script_calls(r) == calls


# A debt refuses what follows until it is paid, with a retry that covers
# it, and the key lives long enough to remember it (Redis's own clock).
def test_core_settle_debt_refuses(redis_server, drivers):
    r = redis_server.client()
    d = drivers(redis_server.url, prefix="D:")
    assert d.take("k", 10, 1, 2)["allowed"] == 1
    res = d.cmd("settle token-bucket 0 0 - 1000 k 10 1 2")
    assert res["allowed"] == 0 and 9900 <= res["retry_ms"] <= 10000, res
    assert float(r.hget("D:{k}", "tokens")) <= -9.9
    assert 20000 < r.pttl("D:{k}") <= 21000
    res = d.take("k", 10, 1, 1)
    assert res["allowed"] == 0 and 10900 <= res["retry_ms"] <= 11000, res
    # A refund of more than was charged stops at the capacity.
    res = d.cmd("settle token-bucket 0 0 - 0 k 10 1 1000000")
    assert res["allowed"] == 1 and res["remaining"] == 10, res
    assert float(r.hget("D:{k}", "tokens")) == 10
    assert d.take("k", 10, 1, 10)["allowed"] == 1


# GCRA: the same request settles its suffixed key; a shard settles its own
# sub-bucket (limits divided by K as for the decision).
def test_core_settle_gcra_and_shards(redis_server, drivers):
    r = redis_server.client()
    d = drivers(redis_server.url, prefix="G:")
    run = "run gcra 0 0 5000 g 4 2 1"
    assert d.cmd(run)["allowed"] == 1
    assert float(r.get("G:{g}:gcra")) == 5500
    res = d.cmd("settle gcra 0 0 5000 7 g 4 2 1")
    assert res["allowed"] == 0 and res["retry_ms"] == 1500, res
    assert float(r.get("G:{g}:gcra")) == 8500
    res = d.cmd(run.replace("5000", "6000"))
    assert res["allowed"] == 0 and res["retry_ms"] == 1000, res
    assert d.cmd(run.replace("5000", "7000"))["allowed"] == 1
    res = d.cmd("settle gcra 0 0 7000 0 g 4 2 1")
    assert float(r.get("G:{g}:gcra")) == 8500 and res["allowed"] == 1
    # Shard 2 of 4: a sub-bucket of capacity 2, rate 0.5.
    assert d.cmd("run token-bucket 4 2 - t 8 2 1")["allowed"] == 1
    res = d.cmd("settle token-bucket 4 2 - 3 t 8 2 1")
    assert res["allowed"] == 0 and res["limit"] == 2, res
    assert round(float(r.hget("G:{t s2}", "tokens")), 1) == -1.0
    assert r.exists("G:{t}") == 0


# What the client refuses or does without a call: window algorithms
# keep what they charged, a real cost out of range, a request that is no
# request; the same cost makes no call.
def test_core_settle_refusals(redis_server, drivers):
    r = redis_server.client()
    d = drivers(redis_server.url, prefix="R:")
    for algo in ("fixed-window", "sliding-window", "sliding-log"):
        res = d.cmd("settle %s 0 0 - 5 w 10 1 1" % algo)
        assert res["err"] == "arg" and res["source"] == "error", res
    for real in ("-1", "1000000001", "nan"):
        res = d.cmd("settle token-bucket 0 0 - %s w 10 1 1" % real)
        assert res["err"] == "arg" and res["rc"] == -1, res
    res = d.cmd("settle token-bucket 0 0 - 5 w 0.5 1 1")
    assert res["err"] == "arg", res
    res = d.cmd("settle token-bucket 0 0 - 3 w 10 1 3 rt 5 1 3")
    assert res["rc"] == 0 and res["redis_us"] == 0, res
    assert script_calls(r) == 0 and r.dbsize() == 0


# Giving lease tokens back: up to the capacity, to the exact key, with
# the TTL of the refill; a flushed script cache is no obstacle (NOSCRIPT
# is answered by EVAL of the token bucket's text).
def test_core_settle_give_back(redis_server, drivers):
    r = redis_server.client()
    d = drivers(redis_server.url, prefix="B:")
    assert d.take("g", 100, 1 / 3600.0, 60)["allowed"] == 1
    r.script_flush()
    res = d.cmd("give_back %s 100 0.000277 25" % pct("B:{g}"))
    assert res["source"] == "redis" and res["allowed"] == 1, res
    assert round(float(r.hget("B:{g}", "tokens")), 1) == 65.0
    res = d.cmd("give_back %s 100 0.000277 1000" % pct("B:{g}"))
    assert res["remaining"] == 100
    assert float(r.hget("B:{g}", "tokens")) == 100
    assert 0 < r.pttl("B:{g}") <= 1000
    assert d.stats()["noscript_reloads"] == 1
    for bad in ("%s 100 1 -1" % pct("B:{g}"), "% 100 1 5",
                "%s 0 1 5" % pct("B:{g}")):
        assert d.cmd("give_back " + bad)["err"] == "arg", bad


# Redis gone: nothing is settled, the error says so, and the failure
# counts toward the breaker like a decision's.
def test_core_settle_redis_down(drivers):
    d = drivers("redis://127.0.0.1:1", timeout=50, breaker_threshold=2)
    for _ in range(2):
        res = d.cmd("settle token-bucket 0 0 - 5 k 10 1 1")
        assert res["source"] == "error" and res["err"] == "io", res
    assert d.breaker() == "open"
    res = d.cmd("settle token-bucket 0 0 - 5 k 10 1 1")
    assert res["err"] == "breaker", res
    st = d.stats()
    assert st["decisions"] == 0 and st["redis_errors"] == 2
