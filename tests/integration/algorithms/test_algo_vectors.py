"""test_algo_vectors.py -- the algorithm scripts in a real Redis, by vector.

Each script as it ships (build/lua/tb_<algo>.lua: shared/algo/tb_prelude.lua
and the body shared/algo/tb_<algo>.lua, the text libtb embeds) is sent with EVAL (as
the client does after NOSCRIPT) with an injected clock, row by row from
tests/vectors/<algo>.tsv (rows marked settle call GCRA's settle mode); the
reply and the state left in Redis must match the row exactly, as they must
for the C twins in tests/unit/test_<algo>.c.
Also checked here: every key written has a TTL, and the sliding log's exact
count on a random trace.
"""
import random

import pytest

from tbtest.env import lua_script
from tbtest.redismod import algo_expected, algo_rows, algo_state

SCRIPTS = {
    "gcra": "tb_gcra.lua",
    "fixed_window": "tb_fwindow.lua",
    "sliding_window": "tb_swindow.lua",
    "sliding_log": "tb_slog.lua",
}


def script(algo):
    return lua_script(SCRIPTS[algo]).decode()


def call(r, text, keys, now, buckets, op=None):
    argv = ["" if now is None else str(now)]
    for cap, rate, cost in buckets:
        argv += [cap, rate, cost]
    if op:
        argv.append(op)
    return r.eval(text, len(keys), *keys, *argv)


@pytest.mark.parametrize("algo", sorted(SCRIPTS))
def test_algo_vectors_match_lua(redis_server, algo):
    """Every vector row, replayed on the real script with injected now."""
    r = redis_server.client()
    text = script(algo)
    case, keys, checked, settled = None, [], 0, 0
    for row in algo_rows(algo):
        (name, now, caps, rates, costs, allowed, remaining, retry, binding,
         states) = row[:10]
        op = row[10] if len(row) > 10 else None
        caps, rates, costs = caps.split("|"), rates.split("|"), costs.split("|")
        if name != case:
            case = name
            keys = ["v:%s:%s:{k}:%d" % (algo, name, i)
                    for i in range(len(caps))]
        got = call(r, text, keys, now, zip(caps, rates, costs), op)
        want = [int(allowed), int(remaining), int(retry), int(binding)]
        assert got == want, "%s/%s at %s: got %r, want %r" % (
            algo, name, now, got, want)
        for key, want in zip(keys, states.split("|")):
            assert algo_state(r, algo, key) == algo_expected(algo, want), \
                "%s/%s at %s: state of %s" % (algo, name, now, key)
            if r.exists(key):
                assert r.pttl(key) > 0, "%s has no TTL" % key
        checked += 1
        settled += op == "settle"
    assert checked >= 40
    # GCRA's rows include settlements and the debts they leave.
    assert settled >= 8 if algo == "gcra" else settled == 0


@pytest.mark.parametrize("algo", sorted(SCRIPTS))
def test_algo_redis_clock(redis_server, algo):
    """Without an injected clock the script reads TIME and sets a TTL."""
    r = redis_server.client()
    got = call(r, script(algo), ["clock:{k}"], None, [("5", "10", "1")])
    assert got == [1, 4, 0, 0]
    ttl = r.pttl("clock:{k}")
    assert 0 < ttl <= 5 / 10 * 1000 * 2 + 1000 + 10


def test_algo_sliding_log_exact_in_redis(redis_server):
    """The log admits iff the units in (now - W, now] plus cost fit."""
    r = redis_server.client()
    text = script("sliding_log")
    rnd = random.Random(7)
    hist, t = [], 0
    for _ in range(1500):
        t += rnd.randrange(0, 60)
        cost = rnd.randrange(1, 4)
        inwin = sum(1 for h in hist if h > t - 1000)
        got = call(r, text, ["exact:{k}"], t, [("25", "25", str(cost))])
        assert got[0] == (1 if inwin + cost <= 25 else 0)
        if got[0]:
            hist += [t] * cost
        else:
            nxt = call(r, text, ["probe:{k}"], 0, [("25", "25", "0")])
            assert nxt[0] == 1
        assert r.zcard("exact:{k}") == sum(1 for h in hist if h > t - 1000)
