"""test_redismod_hostile.py -- tbucket_redis.so under hostile input: every
tbucket.* command answers an error reply, and Redis goes on answering.

Wrong arity, numkeys out of range, NaN, infinities, negative costs, huge
values, NUL bytes, trailing arguments, bad leases and slot arguments,
WRONGTYPE keys (nothing written then); stored state written by hand
(garbage, infinities, hexadecimal) that the module reads without
crashing, as the script reads it where both can; and a bounded random
mix of all of these. Run with TB_BUILD pointing at a sanitizer build
(make SANITIZER=address,undefined), the server runs the ASan/UBSan module
with the runtimes preloaded into redis-server alone, and every test
checks that no report was written.
"""
import random

import pytest
import redis as redis_py

from tbtest.redismod import ALGOS, ENGINES, module, script

CMDS = [ENGINES[a][0] for a in ALGOS]
BAD_NUMBERS = ["nan", "NaN", "inf", "-inf", "1e999", "-1e999", "", " ",
               "abc", "0x", "1.2.3", "1\x002", "9" * 600, "--1", "1e",
               "0x1p9999"]


@pytest.fixture
def mod_redis(mod_redis):
    """conftest's, which must still answer at the end of the test."""
    yield mod_redis
    assert mod_redis.client().ping()


def bad_calls(cmd):
    """Argument lists (after the command name) that must be refused."""
    ok = ["1", "{h}:k", "1000", "10", "1", "1"]
    out = [[], ["x"], ["1.5"], ["-1"], ["99"], ["1"], ["0"], ["1", "{h}:k"],
           ["1", "{h}:k", ""], ["1", "{h}:k", "", "10", "1"],
           ["2", "{h}:a", "{h}:b", "", "10", "1", "1"],
           ["01", "{h}:k", "", "10", "1", "1"],
           ["9223372036854775808", "{h}:k"],
           # More keys than TB_MAX_BUCKETS (16) buckets and a slot set,
           # and one bucket too many without a slot set.
           ["18"] + ["{h}:%d" % i for i in range(18)] + [""]
           + ["5", "1", "1"] * 18,
           ["17"] + ["{h}:%d" % i for i in range(17)] + [""]
           + ["5", "1", "1"] * 17,
           ok + ["junk", "more", "args"],
           ["1", "{h}:k"] + [""] * 1000]
    for i in range(2, 6):
        for bad in BAD_NUMBERS:
            args = list(ok)
            args[i] = bad
            if i == 2 and bad in ("", " "):
                continue  # "" is Redis's clock; " " is refused below.
            out.append(args)
    for clock in ("1.5", "1e300", "-1e300", "abc", " "):
        out.append(["1", "{h}:k", clock, "10", "1", "1"])
    for cap, rate, cost in (("0", "1", "1"), ("1e10", "1", "1"),
                            ("10", "0", "1"), ("10", "1e10", "1"),
                            ("10", "1e-7", "1"), ("1e9", "1e-6", "1"),
                            ("10", "1", "-1"), ("10", "1", "1e10"),
                            ("-5", "1", "1"), ("10", "-1", "1")):
        out.append(["1", "{h}:k", "", cap, rate, cost])
    # Concurrency arguments.
    for n, ttl, slot in (("x", "1000", "a"), ("1", "0", "a"),
                         ("1", "1.5", "a"), ("1", "1e12", "a"),
                         ("1", "-5", "a"), ("nan", "1000", "a"),
                         ("1", "1000", "s" * 1000)):
        out.append(["2", "{h}:k", "{h}:c", "", "10", "1", "1", "conc", n,
                    ttl, slot])
    out.append(["0", "", "conc", "1", "1000", "a"])
    # Modes the command has not, or malformed.
    out.append(ok + ["settle", "extra"])
    if cmd != "tbucket.bucket":
        out.append(ok + ["7"])
    if cmd not in ("tbucket.bucket", "tbucket.gcra"):
        out.append(ok + ["settle"])
    else:
        out.append(ok[:5] + ["1e10", "settle"])
    if cmd == "tbucket.bucket":
        for lease in (["x"], ["5", "-1"], ["0.5"], ["1e10"], ["5", "nan"],
                      ["5", "1e10"], ["5", "1", "9"]):
            out.append(ok + lease)
        out.append(["2", "{h}:a", "{h}:b", "", "10", "1", "1", "10", "1",
                    "1", "5"])
        # 'rules' (TBucketRule): two arguments per bucket, held 0 or 1,
        # a ban in whole ms up to 30 days.
        for rules in (["rules"], ["rules", "0"], ["rules", "0", "0", "0"],
                      ["rules", "2", "0"], ["rules", "x", "0"],
                      ["rules", "1", "-1"], ["rules", "1", "1.5"],
                      ["rules", "0", "nan"], ["rules", "0", "2592000001"],
                      ["rules", "0", "x"]):
            out.append(ok + rules)
    if cmd == "tbucket.slog":
        out.append(["1", "{h}:k", "", "10", "1", "1.5"])
        out.append(["1", "{h}:k", "", "100001", "1000", "1"])
    return out


# Every malformed call of every command is an error reply and writes
# nothing; the server answers PING after each.
@pytest.mark.parametrize("cmd", CMDS)
def test_redismod_005_01(mod_redis, cmd):
    r = mod_redis.client()
    calls = bad_calls(cmd)
    for args in calls:
        with pytest.raises(redis_py.ResponseError):
            r.execute_command(cmd, *args)
        assert r.ping()
    assert r.dbsize() == 0
    assert len(calls) > 70


# A key of the wrong type, wherever it stands among the keys: WRONGTYPE,
# and nothing written (not even the slot set's expired slots pruned).
@pytest.mark.parametrize("algo", ALGOS)
def test_redismod_005_02(mod_redis, algo):
    r = mod_redis.client()
    r.set("{w}:str", "x")
    r.rpush("{w}:list", "x")
    r.sadd("{w}:set", "x")
    r.hset("{w}:hash", "tokens", "1")
    r.zadd("{w}:conc", {"old": 1})
    wrong = ["{w}:str", "{w}:list", "{w}:set", "{w}:hash", "{w}:conc"]
    good = {"token_bucket": "{w}:hash", "sliding_window": "{w}:hash",
            "fixed_window": "{w}:hash", "gcra": "{w}:str",
            "sliding_log": "{w}:conc"}[algo]
    before = {k: r.dump(k) for k in wrong}
    one, two = ["1000", "10", "1", "1"], ["1000"] + ["10", "1", "1"] * 2
    slot = ["conc", "5", "1000", "a"]
    calls = []
    for bad in wrong:
        if bad != good:
            calls += [([bad], one), (["{w}:new", bad], two),
                      ([bad, "{w}:conc"], one + slot)]
        if bad != "{w}:conc":
            calls.append((["{w}:new", bad], one + slot))
    for keys, argv in calls:
        with pytest.raises(redis_py.ResponseError, match="WRONGTYPE"):
            module(r, algo, keys, argv)
    assert {k: r.dump(k) for k in wrong} == before
    assert not r.exists("{w}:new")


# Stored state written by hand: what tonumber() reads the same way
# (hexadecimal, white space, exponents) both engines read the same;
# garbage and non-finite values leave the module answering (a missing
# bucket), never crashing.
def test_redismod_005_03(mod_redis):
    r = mod_redis.client()
    same = [(" 5 ", "1000"), ("0x5", "1000"), ("5e0", " 1000"),
            ("2.5", "0x3e8"), ("-3", "1000"), ("1e300", "1000")]
    for i, (tokens, ts) in enumerate(same):
        got = []
        for eng in ("s", "m"):
            k = "{st%d%s}" % (i, eng)
            r.hset(k, mapping={"tokens": tokens, "ts": ts})
            call = script if eng == "s" else module
            got.append(call(r, "token_bucket", [k], ["1500", "10", "1", "1"]))
            got.append(r.hgetall(k))
        assert got[0] == got[2] and got[1] == got[3], (tokens, ts, got)
    garbage = ["abc", "inf", "-inf", "nan", "1e999", "-1e300", "", "\x00",
               "1.5", "9" * 400, "-0"]
    for algo in ALGOS:
        for g in garbage:
            k = "{g}:%s" % algo
            r.delete(k)
            if algo == "token_bucket":
                r.hset(k, mapping={"tokens": g, "ts": g})
            elif algo == "gcra":
                r.set(k, g)
            elif algo == "sliding_log":
                r.zadd(k, {"a": float("inf"), "b": 1e300, "c": -1e300,
                           "d": 1e15})
            else:
                r.hset(k, mapping={"w": g, "cur": g, "prev": g, "n": g})
            for now in ("1000", "", "9007199254740992", "-9007199254740992"):
                got = module(r, algo, [k], [now, "10", "1", "1"])
                assert isinstance(got, list) and len(got) == 4, (algo, g)
                got = module(r, algo, [k], [now, "1", "1e-6", "1"])
                assert got[0] in (0, 1) and got[2] >= -1
    # A slot set holding scores no script writes.
    r.zadd("{g}:conc", {"x": float("inf"), "y": float("-inf"), "z": 1e300})
    got = module(r, "token_bucket", ["{g}:conc"],
                 ["1000", "conc", "5", "1000", "n"])
    assert got == [1, -1, 0, 0, 0, 3]


def mutate(rnd, args):
    args = list(args)
    for _ in range(rnd.randrange(1, 4)):
        op = rnd.randrange(6)
        i = rnd.randrange(len(args)) if args else 0
        if op == 0 and args:
            args[i] = rnd.choice(BAD_NUMBERS + ["0", "1", "-1", "1e9",
                                                "settle", "conc", ""])
        elif op == 1 and args:
            del args[i]
        elif op == 2:
            args.insert(i, rnd.choice(["conc", "settle", "5", "{f}:k"]))
        elif op == 3 and args:
            args[i] = bytes(rnd.randrange(256) for _ in range(
                rnd.randrange(8)))
        elif op == 4:
            args += rnd.choice([["conc", "2", "1000", "i"], ["7", "2"],
                                ["settle"]])
        else:
            args = args[:rnd.randrange(len(args) + 1)]
    return args


# A bounded random mix: valid calls mutated (arguments replaced, dropped,
# added, random bytes) against every command and a few shared keys of
# every type. Each answers a reply or an error, and the server lives.
def test_redismod_005_04(mod_redis):
    r = mod_redis.client()
    rnd = random.Random(5)
    r.set("{f}:s", "1")
    r.hset("{f}:h", "w", "5")
    seeds = [["1", "{f}:k", "", "10", "1", "1"],
             ["2", "{f}:k", "{f}:c", "0", "5", "2", "1", "conc", "2", "100",
              "i"],
             ["1", "{f}:k", "1000", "100", "1", "2", "50", "3"],
             ["2", "{f}:k", "{f}:h", "5", "3", "1", "1", "3", "1", "1",
              "settle"],
             ["1", "{f}:s", "", "10", "1", "1"]]
    answered = errors = 0
    for _ in range(3000):
        cmd = rnd.choice(CMDS)
        args = mutate(rnd, rnd.choice(seeds))
        try:
            r.execute_command(cmd, *args)
            answered += 1
        except redis_py.ResponseError:
            errors += 1
    assert r.ping()
    assert answered > 100 and errors > 1000, (answered, errors)
