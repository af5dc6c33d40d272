"""test_redismod_slots.py -- concurrency slots, leases and settlements
through tbucket_redis.so's commands, on their own.

The vector tables and the engine comparison cover these modes row by row;
here each is walked through as a client uses it: slots taken, refused,
released with ZREM and pruned at their expiry; a slot set and buckets
decided all or nothing; a lease granted and its rest given back; a debt
left by a settlement refusing what follows.
"""
import pytest

from tbtest.redismod import ALGOS, module

WAIT = 1000  # The prelude's CONC_WAIT, TB_CONCURRENCY_RETRY_MS.


def conc(n, ttl, slot):
    return ["conc", str(n), str(ttl), slot]


# A slot set alone (no bucket): two slots, a refusal with the constant
# wait bound past the buckets (index 0 here), a release by ZREM, then the
# expiry prunes the rest; the set lives as long as its latest slot.
@pytest.mark.parametrize("algo", ALGOS)
def test_redismod_003_01(mod_redis, algo):
    r = mod_redis.client()
    k = ["{c}:conc"]
    assert module(r, algo, k, ["1000"] + conc(2, 5000, "a")) == \
        [1, -1, 0, 0, 0, 1]
    assert module(r, algo, k, ["1001"] + conc(2, 5000, "b")) == \
        [1, -1, 0, 0, 0, 2]
    assert module(r, algo, k, ["1002"] + conc(2, 5000, "c")) == \
        [0, -1, WAIT, 0, 0, 2]
    assert r.zrange(k[0], 0, -1, withscores=True) == [(b"a", 6000.0),
                                                     (b"b", 6001.0)]
    assert 4000 < r.pttl(k[0]) <= 5000
    assert r.zrem(k[0], "a") == 1
    assert module(r, algo, k, ["1003"] + conc(2, 5000, "c")) == \
        [1, -1, 0, 0, 0, 2]
    # At 6001 slot b (expiry 6001) and everything before have gone.
    assert module(r, algo, k, ["6001"] + conc(2, 5000, "d")) == \
        [1, -1, 0, 0, 0, 2]
    assert [m for m, _ in r.zrange(k[0], 0, -1, withscores=True)] == \
        [b"c", b"d"]


# Buckets and a slot set, all or nothing: a bucket that refuses takes no
# slot; a full set takes no token (and binds at index n with its wait,
# unless a bucket waits longer).
def test_redismod_003_02(mod_redis):
    r = mod_redis.client()
    k = ["{t}:b0", "{t}:b1", "{t}:conc"]
    args = ["0", "2", "1", "1", "10", "1", "1"]
    assert module(r, "token_bucket", k, args + conc(1, 9000, "x")) == \
        [1, 1, 0, 0, 0, 1]
    # The set is full: nothing deducted (b0 still holds 1 token).
    assert module(r, "token_bucket", k, args + conc(1, 9000, "y")) == \
        [0, 1, WAIT, 2, 0, 1]
    assert r.hget("{t}:b0", "tokens") == b"1"
    r.zrem("{t}:conc", "x")
    assert module(r, "token_bucket", k, args + conc(1, 9000, "y")) == \
        [1, 0, 0, 0, 0, 1]
    r.zrem("{t}:conc", "y")
    # b0 is empty: it refuses (wait 1000 ms, a tie with nothing), no slot.
    assert module(r, "token_bucket", k, args + conc(1, 9000, "z")) == \
        [0, 0, 1000, 0, 0, 0]
    assert r.zcard("{t}:conc") == 0
    # Full set and an empty bucket that waits longer: the bucket binds.
    module(r, "token_bucket", ["{t}:conc"], ["0"] + conc(1, 9000, "w"))
    assert module(r, "token_bucket", k,
                  ["0", "2", "0.25", "1", "10", "1", "1"]
                  + conc(1, 9000, "v")) == [0, 0, 4000, 0, 0, 1]


# A lease: the grant, what remains, and the unspent rest given back up to
# the capacity before the next decision (written even when refused).
def test_redismod_003_03(mod_redis):
    r = mod_redis.client()
    k = ["{l}:b"]
    assert module(r, "token_bucket", k, ["0", "100", "1", "1", "30"]) == \
        [1, 70, 0, 0, 30]
    assert module(r, "token_bucket", k, ["0", "100", "1", "1", "80"]) == \
        [1, 0, 0, 0, 70]
    # Refused (nothing left), but the 12 tokens given back are kept.
    assert module(r, "token_bucket", k,
                  ["0", "100", "1", "13", "20", "12"]) == [0, 12, 1000, 0, 0]
    assert r.hget("{l}:b", "tokens") == b"12"
    assert 88000 < r.pttl("{l}:b") <= 89000
    assert module(r, "token_bucket", k,
                  ["0", "100", "1", "1", "5", "200"]) == [1, 95, 0, 0, 5]


# Settlements: a debt (tokens below 0) refuses what follows until it is
# paid; a refund stops at the capacity; GCRA's TAT moves the same way.
def test_redismod_003_04(mod_redis):
    r = mod_redis.client()
    k = ["{s}:b"]
    assert module(r, "token_bucket", k, ["0", "10", "1", "2"]) == [1, 8, 0, 0]
    assert module(r, "token_bucket", k, ["0", "10", "1", "15", "settle"]) \
        == [0, 0, 7000, 0]
    assert r.hget("{s}:b", "tokens") == b"-7"
    assert module(r, "token_bucket", k, ["1000", "10", "1", "1"]) == \
        [0, 0, 7000, 0]
    assert module(r, "token_bucket", k,
                  ["1000", "10", "1", "-100", "settle"]) == [1, 10, 0, 0]
    g = ["{s}:g"]
    assert module(r, "gcra", g, ["5000", "4", "2", "1"]) == [1, 3, 0, 0]
    # A debt of 500 + 7 * 500 ms, 2000 past the tolerance.
    assert module(r, "gcra", g, ["5000", "4", "2", "7", "settle"]) == \
        [0, 0, 2000, 0]
    assert r.get("{s}:g") == b"9000"
    assert module(r, "gcra", g, ["6000", "4", "2", "1"]) == [0, 0, 1500, 0]


# The slot set and a bucket may not be one key (the script would write the
# bucket, then fail on the set); nothing is written.
def test_redismod_003_05(mod_redis):
    import redis as redis_py
    r = mod_redis.client()
    with pytest.raises(redis_py.ResponseError, match="slot set"):
        module(r, "token_bucket", ["{x}", "{x}"],
               ["0", "5", "1", "1"] + conc(1, 1000, "a"))
    assert r.dbsize() == 0
