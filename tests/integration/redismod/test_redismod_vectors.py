"""test_redismod_vectors.py -- every vector table of tests/vectors/ against
tbucket_redis.so's commands in a real redis-server.

The same rows run against the C twins (tests/unit/test_*.c) and the
scripts (core/test_core_vectors.py, core/test_core_lease.py,
core/test_core_settle.py, algorithms/test_algo_vectors.py); here each is
sent as the tbucket.* command with the script's own KEYS and ARGV (the
injected clock in ARGV[1]), and the reply, the stored state and its TTL
must be the row's. Then a call on Redis's own clock.
"""
import pytest

from tbtest.core import (SETTLE_VECTORS, check_after, load_vectors,
                         put_buckets, vector_argv)
from tbtest.redismod import (ALGOS, algo_expected, algo_rows, algo_state,
                             lease_rows, module, num)

TAKES = load_vectors()
SETTLES = load_vectors(SETTLE_VECTORS)
LEASES = lease_rows()
WINDOW_ALGOS = [a for a in ALGOS if a != "token_bucket"]


def run_vector(r, vec, tag, *mode):
    vid, now, buckets, verdict = vec
    keys = ["%s:{%s}:%d" % (tag, vid, i) for i in range(len(buckets))]
    put_buckets(r, keys, buckets)
    reply = module(r, "token_bucket", keys,
                   [str(now)] + vector_argv(buckets) + list(mode))
    assert reply == verdict, (vid, reply)
    return keys


# Every token-bucket vector (token_bucket.tsv) through tbucket.bucket: the
# reply, and the hash and TTL written only when allowed.
@pytest.mark.parametrize("vec", TAKES, ids=[v[0] for v in TAKES])
def test_redismod_001_01(mod_redis, vec):
    r = mod_redis.client()
    keys = run_vector(r, vec, "m")
    check_after(r, keys, vec[2], vec[3], vec[0])


# Every settlement vector (token_bucket_settle.tsv) through tbucket.bucket
# ... settle: always written, with the TTL of the refill.
@pytest.mark.parametrize("vec", SETTLES, ids=[v[0] for v in SETTLES])
def test_redismod_001_02(mod_redis, vec):
    r = mod_redis.client()
    keys = run_vector(r, vec, "s", "settle")
    for i, (k, b) in enumerate(zip(keys, vec[2])):
        h = r.hgetall(k)
        assert float(h[b"tokens"]) == b["new_tokens"], (vec[0], i, h)
        assert int(h[b"ts"]) == b["new_ts_ms"], (vec[0], i, h)
        assert b["ttl_ms"] - 1000 < r.pttl(k) <= b["ttl_ms"], (vec[0], i)


# Every lease vector (lease.tsv) through tbucket.bucket with `want` (and
# `back`): the five-element reply and the state, written when allowed or
# when tokens were given back.
@pytest.mark.parametrize("row", LEASES, ids=[x["id"] for x in LEASES])
def test_redismod_001_03(mod_redis, row):
    r = mod_redis.client()
    key = "lease:{%s}" % row["id"]
    r.delete(key)
    if row["exists"] == "1":
        r.hset(key, mapping={"tokens": num(row["tokens"]),
                             "ts": row["ts_ms"]})
    extra = [num(row["back"])] if float(row["back"]) > 0 else []
    reply = module(r, "token_bucket", [key],
                   [row["now_ms"], num(row["capacity"]), num(row["rate"]),
                    num(row["cost"]), num(row["want"])] + extra)
    want = [int(row[k]) for k in ("allowed", "remaining", "retry_ms")]
    assert reply == want + [0, int(row["granted"])], (row["id"], reply)
    h, pttl = r.hgetall(key), r.pttl(key)
    if row["allowed"] == "1" or float(row["back"]) > 0:
        assert float(h[b"tokens"]) == float(row["new_tokens"]), (row, h)
        assert int(h[b"ts"]) == int(row["new_ts_ms"]), (row, h)
        assert int(row["ttl_ms"]) - 1000 < pttl <= int(row["ttl_ms"])
    elif row["exists"] == "1":
        assert float(h[b"tokens"]) == float(row["tokens"]) and pttl == -1
    else:
        assert h == {} and pttl == -2


# Every row of gcra.tsv (settlements included), fixed_window.tsv,
# sliding_window.tsv and sliding_log.tsv through its command, in order
# on keys that start missing: reply, state, and a TTL on every key.
@pytest.mark.parametrize("algo", WINDOW_ALGOS)
def test_redismod_001_04(mod_redis, algo):
    r = mod_redis.client()
    case, keys, checked = None, [], 0
    for row in algo_rows(algo):
        name, now, caps, rates, costs = row[:5]
        want = [int(x) for x in row[5:9]]
        op = row[10:11]
        caps, rates, costs = caps.split("|"), rates.split("|"), costs.split("|")
        if name != case:
            case = name
            keys = ["m:%s:%s:{k}:%d" % (algo, name, i)
                    for i in range(len(caps))]
        argv = [now]
        for b in zip(caps, rates, costs):
            argv += list(b)
        got = module(r, algo, keys, argv + op)
        assert got == want, (algo, name, now, got, want)
        for key, text in zip(keys, row[9].split("|")):
            assert algo_state(r, algo, key) == algo_expected(algo, text), \
                (algo, name, now, key)
            if r.exists(key):
                assert r.pttl(key) > 0, key
        checked += 1
    assert checked >= 40


# Without an injected clock each command decides on Redis's own clock
# (TIME's milliseconds) and sets a TTL within the script's.
@pytest.mark.parametrize("algo", ALGOS)
def test_redismod_001_05(mod_redis, algo):
    r = mod_redis.client()
    t0 = r.time()
    got = module(r, algo, ["clock:{k}"], ["", "5", "10", "1"])
    assert got == [1, 4, 0, 0]
    assert 0 < r.pttl("clock:{k}") <= 5 / 10 * 1000 * 2 + 1000
    now0 = t0[0] * 1000 + t0[1] // 1000
    if algo == "token_bucket":
        assert 0 <= int(r.hget("clock:{k}", "ts")) - now0 < 1000
    if algo == "sliding_log":
        (_, score), = r.zrange("clock:{k}", 0, -1, withscores=True)
        assert 0 <= score - now0 < 1000
