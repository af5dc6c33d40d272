"""test_redismod_engines.py -- the scripts and tbucket_redis.so on one
Redis: the same replies, the same stored bytes, the same expiry times.

Each step runs, in one MULTI (so that both engines see the same real
clock): TIME, the call on the script's keys, the same call on the
module's keys, TIME. The replies must be equal, every key's value
byte for byte (hash fields in order, strings, set members and scores),
and every key's PEXPIRETIME equal whenever the two TIMEs fall in the same
millisecond (otherwise within the difference), all read in one script. Then traces where the
engine changes from call to call on the same keys, so that each continues
what the other stored, against a trace of the script alone.
"""
import random
import zlib

import pytest

from tbtest.core import (SETTLE_VECTORS, load_vectors, put_buckets,
                         vector_argv)
from tbtest.redismod import (ALGOS, ENGINES, algo_rows, lease_rows, num,
                             script_text)


def ms(t):
    return t[0] * 1000 + t[1] // 1000


# Every key's type, value and PEXPIRETIME read in one script: Redis judges
# expiry at the script's start for all of them, so a key with a short TTL
# cannot expire between the lanes' reads.
SNAPSHOT = """
local out = {}
for i, k in ipairs(KEYS) do
  local t = redis.call('TYPE', k)['ok']
  local v = {}
  if t == 'hash' then v = redis.call('HGETALL', k)
  elseif t == 'string' then v = {redis.call('GET', k)}
  elseif t == 'zset' then v = redis.call('ZRANGE', k, 0, -1, 'WITHSCORES')
  end
  out[i] = {t, v, redis.call('PEXPIRETIME', k)}
end
return out
"""


class Lanes:
    """Keyspaces ("lanes") that run the same calls, each through an
    engine chosen per call, compared after every step."""

    def __init__(self, r, algo, names):
        self.r, self.algo, self.names = r, algo, names
        self.text = script_text(algo)
        self.skew = 0
        self.steps = self.exact = 0

    def keys(self, lane, suffixes):
        return ["{%s}:%s" % (lane, s) for s in suffixes]

    def step(self, engines, suffixes, argv, release=None):
        """One call in every lane (engines: lane -> 'script'|'module');
        release = (slot set suffix, id): a ZREM in every lane first."""
        p = self.r.pipeline(transaction=True)
        p.time()
        for lane in self.names:
            if release:
                p.zrem(self.keys(lane, [release[0]])[0], release[1])
            keys = self.keys(lane, suffixes)
            if engines[lane] == "script":
                p.eval(self.text, len(keys), *keys, *argv)
            else:
                p.execute_command(ENGINES[self.algo][0], len(keys), *keys,
                                  *argv)
        p.time()
        out = p.execute()
        skew = ms(out[-1]) - ms(out[0])
        self.skew = max(self.skew, skew)
        self.steps += 1
        self.exact += skew == 0
        replies = [x for x in out[1:-1] if isinstance(x, list)]
        return replies

    def compare(self, suffixes, why):
        keys = [self.keys(lane, [s])[0] for lane in self.names
                for s in suffixes]
        got = self.r.eval(SNAPSHOT, len(keys), *keys)
        n = len(suffixes)
        for j, s in enumerate(suffixes):
            t0, v0, e0 = got[j]
            for i in range(1, len(self.names)):
                t, v, e = got[i * n + j]
                k = keys[i * n + j]
                assert (t, v) == (t0, v0), (why, k, (t, v), (t0, v0))
                assert (e < 0) == (e0 < 0), (why, k, e, e0)
                assert abs(e - e0) <= self.skew, (why, k, e, e0, self.skew)


def vector_calls():
    """Every call of every vector table: (id, algo, [(suffixes, argv,
    preset)]), preset the token-bucket states to write first."""
    out = []
    for table, mode in ((load_vectors(), []),
                        (load_vectors(SETTLE_VECTORS), ["settle"])):
        for vid, now, buckets, _ in table:
            sfx = ["b%d" % i for i in range(len(buckets))]
            argv = [str(now)] + vector_argv(buckets) + mode
            out.append(("tb-%s%s" % (vid, "-settle" if mode else ""),
                        "token_bucket", [(sfx, argv, buckets)]))
    for row in lease_rows():
        b = {"exists": row["exists"] == "1",
             "tokens": None if row["tokens"] == "-" else float(row["tokens"]),
             "ts_ms": None if row["ts_ms"] == "-" else int(row["ts_ms"])}
        argv = [row["now_ms"], num(row["capacity"]), num(row["rate"]),
                num(row["cost"]), num(row["want"])]
        if float(row["back"]) > 0:
            argv.append(num(row["back"]))
        out.append(("lease-" + row["id"], "token_bucket",
                    [(["b0"], argv, [b])]))
    for algo in ALGOS:
        if algo == "token_bucket":
            continue
        cases = {}
        for row in algo_rows(algo):
            caps, rates, costs = (row[i].split("|") for i in (2, 3, 4))
            argv = [row[1]]
            for b in zip(caps, rates, costs):
                argv += list(b)
            sfx = ["b%d" % i for i in range(len(caps))]
            cases.setdefault(row[0], []).append((sfx, argv + row[10:11],
                                                 None))
        for name, calls in cases.items():
            out.append(("%s-%s" % (algo, name), algo, calls))
    return out


VECTOR_CALLS = vector_calls()


# Every vector of every table, script and module side by side: equal
# replies, byte-equal states, equal expiry times.
def test_redismod_002_01(mod_redis):
    r = mod_redis.client()
    for n, (vid, algo, calls) in enumerate(VECTOR_CALLS):
        lanes = Lanes(r, algo, ["s%d" % n, "m%d" % n])
        for sfx, argv, preset in calls:
            if preset:
                for lane in lanes.names:
                    put_buckets(r, lanes.keys(lane, sfx), preset)
            a, b = lanes.step({lanes.names[0]: "script",
                               lanes.names[1]: "module"}, sfx, argv)
            assert a == b, (vid, argv, a, b)
            lanes.compare(sfx, vid)
    assert sum(len(c) for _, _, c in VECTOR_CALLS) > 300


# A bad lease is refused by both with the script's own message, and
# writes nothing.
def test_redismod_002_02(mod_redis):
    import redis as redis_py
    r = mod_redis.client()
    for keys, argv in ((["x:{a}", "x:{a}:r"],
                        ["1000", "10", "1", "1", "10", "1", "1", "5"]),
                       (["x:{c}"], ["1000", "10", "1", "1", "lots"]),
                       (["x:{c}"], ["1000", "10", "1", "1", "5", "-1"])):
        msgs = []
        for fn in (lambda: r.eval(script_text("token_bucket"), len(keys),
                                  *keys, *argv),
                   lambda: r.execute_command("tbucket.bucket", len(keys),
                                             *keys, *argv)):
            with pytest.raises(redis_py.ResponseError) as e:
                fn()
            msgs.append(str(e.value))
        assert msgs[1] == "bad lease" and msgs[0].startswith("bad lease")
    assert r.dbsize() == 0


CAPS = [1, 2, 3.5, 5, 10, 100, 1000]
RATES = [0.5, 1, 2, 3, 7, 10, 250, 0.001]
# The window counters keep one limit per key in a trace: a window stored
# under a far smaller limit makes the script fail to set its TTL
# (test_redismod_002_04).
FIXED_LIMITS = ("fixed_window", "sliding_window")


def random_call(rnd, algo, now, limits):
    """A call the client could make: suffixes and ARGV. limits: suffix ->
    (capacity, rate) of the keys that keep theirs."""
    whole = algo == "sliding_log"
    n = rnd.choice([1, 1, 1, 2, 3, 8])
    lease = algo == "token_bucket" and n == 1 and rnd.random() < 0.25
    settle = (algo in ("token_bucket", "gcra") and not lease
              and rnd.random() < 0.2)
    argv = [str(now)]
    sfx = ["b%d" % rnd.randrange(4) if rnd.random() < 0.1 else "b%d" % i
           for i in range(n)]
    for i in range(n):
        cap, rate = rnd.choice(CAPS), rnd.choice(RATES)
        if algo in FIXED_LIMITS:
            cap, rate = limits.setdefault(sfx[i], (cap, rate))
        if whole or lease:
            cost = rnd.choice([0, 1, 1, 2, 3, int(cap) + 1])
            if lease:
                cost = max(cost, 1)
        elif settle:
            cost = rnd.choice([-3, -0.5, 0, 1, 2.5, 7, 30])
        else:
            cost = rnd.choice([0, 1, 1, 2, 0.25, 3.5, cap + 1])
        argv += [num(cap), num(rate), num(cost)]
    if lease:
        argv.append(num(float(argv[3]) + rnd.choice([0, 1, 5, 50])))
        if rnd.random() < 0.5:
            argv.append(num(rnd.choice([0.5, 1, 3, 40])))
    if settle:
        argv.append("settle")
    conc = rnd.random() < 0.3
    if conc:
        sfx.append("conc")
        argv += ["conc", str(rnd.choice([1, 2, 3])),
                 str(rnd.choice([300, 2000])), "id%d" % rnd.randrange(5)]
    return sfx, argv


# A random trace per algorithm (multi-bucket, fractional and over-capacity
# costs, settlements, leases with give-back, concurrency slots released by
# ZREM, the clock going backwards, a key named twice): a lane whose engine
# changes at random from call to call, a script-only lane and a
# module-only lane answer the same and store the same bytes, step by step.
@pytest.mark.parametrize("algo", ALGOS)
def test_redismod_002_03(mod_redis, algo):
    r = mod_redis.client()
    # A fixed trace per algorithm (hash() of a str differs per process).
    rnd = random.Random(zlib.crc32(algo.encode()))
    lanes = Lanes(r, algo, ["mixed", "script", "module"])
    now = 1_700_000_000_000 + rnd.randrange(100000)
    every = ["b%d" % i for i in range(8)] + ["conc"]
    switches = 0
    last = None
    limits = {}
    for step in range(300):
        now += rnd.choice([0, 0, 1, 10, 99, 250, 1000, 4000, -300])
        sfx, argv = random_call(rnd, algo, now, limits)
        eng = rnd.choice(["script", "module"])
        switches += eng != last
        last = eng
        release = None
        if rnd.random() < 0.15:
            release = ("conc", "id%d" % rnd.randrange(5))
        got = lanes.step({"mixed": eng, "script": "script",
                          "module": "module"}, sfx, argv, release)
        assert got[0] == got[1] == got[2], (step, sfx, argv, got)
        lanes.compare(every, (step, argv))
    assert switches > 100
    # Most steps ran within one millisecond, so the expiry times were
    # compared exactly (nearly all in a plain build, three in four under
    # ASan).
    assert lanes.exact >= 0.5 * lanes.steps, (lanes.exact, lanes.steps)


# A sliding log named twice in one call, under two windows: the script
# reads the first bucket's entries before the second bucket's trim
# removes them, and so does the module (it reads them right after each
# bucket's own trim, not when the decision asks).
def test_redismod_002_06(mod_redis):
    r = mod_redis.client()
    lanes = Lanes(r, "sliding_log", ["s", "m"])
    t0 = 1700000067973
    for lane in ("s", "m"):
        r.zadd("{%s}:b0" % lane, {"%d:%d" % (t0, i): t0 for i in (1, 2, 3)})
    argv = [str(t0 + 3830), "3.5", "0.5", "2", "10", "10", "0", "100",
            "250", "0"]
    got = lanes.step({"s": "script", "m": "module"}, ["b0", "b0", "b2"],
                     argv)
    assert got == [[0, 0, 3170, 0]] * 2, got
    lanes.compare(["b0", "b2"], argv)


# A window key stored under a far smaller limit, read under a larger one
# (a limit changed on a live key): the window lies far ahead for both
# engines, which answer the same; an allowed call would need a TTL that
# the script fails to set (PEXPIRE of 1e17 ms and more), and both answer
# an error (the module without writing).
@pytest.mark.parametrize("algo", FIXED_LIMITS)
def test_redismod_002_04(mod_redis, algo):
    import redis as redis_py
    r = mod_redis.client()
    now = "1700000000000"
    small = [now, "1", "250", "1"]
    lanes = Lanes(r, algo, ["s", "m"])
    both = {"s": "script", "m": "module"}
    assert lanes.step(both, ["b0"], small) == [[1, 0, 0, 0]] * 2
    big = [now, "100", "0.001"]
    for cost, want in (("101", [0, 99, -1, 0]), ("100", [0, 99, None, 0])):
        got = lanes.step(both, ["b0"], big + [cost])
        if want[2] is None:
            # The wait of a window 4e19 ms ahead is garbage in the
            # script's integer reply; the module's is held at 2^62.
            assert got[0][:2] == got[1][:2] == want[:2]
        else:
            assert got == [want] * 2
    for eng in ("script", "module"):
        keys = lanes.keys("s" if eng == "script" else "m", ["b0"])
        with pytest.raises(redis_py.ResponseError):
            if eng == "script":
                r.eval(script_text(algo), 1, *keys, *(big + ["1"]))
            else:
                r.execute_command(ENGINES[algo][0], 1, *keys,
                                  *(big + ["1"]))
    assert float(r.hget("{m}:b0", "w")) == 1700000000000 // 4


def random_rules_call(rnd, now):
    """A 'rules' call (TBucketRule's buckets, held and banning) or a
    settlement of the same keys, as the client makes them."""
    n = rnd.choice([1, 2, 3, 4])
    sfx = ["b%d" % rnd.randrange(4) for _ in range(n)]
    sfx = list(dict.fromkeys(sfx))
    n = len(sfx)
    settle = rnd.random() < 0.25
    argv = [str(now)]
    for _ in range(n):
        cap, rate = rnd.choice([1, 2, 3, 5]), rnd.choice([0.5, 1, 2, 10])
        cost = rnd.choice([1, 1, 2, cap + 1]) if not settle \
            else rnd.choice([1, 2, 3])
        argv += [num(cap), num(rate), num(cost)]
    if settle:
        return sfx, argv + ["settle"]
    argv.append("rules")
    for _ in range(n):
        argv += [rnd.choice(["0", "0", "1"]),
                 str(rnd.choice([0, 0, 300, 1500, 7000]))]
    if rnd.random() < 0.3:
        sfx.append("conc")
        argv += ["conc", str(rnd.choice([1, 2])), "2000",
                 "id%d" % rnd.randrange(3)]
    return sfx, argv


# TBucketRule's 'rules' mode: a random trace of held and banning buckets,
# settlements (the charge of held ones, which never end a ban early) and
# concurrency slots: mixed, script-only and module-only lanes answer the
# same (8 elements: the banned and newly banned buckets too) and store
# the same bytes (the ban field included) with the same expiry times.
def test_redismod_002_07(mod_redis):
    r = mod_redis.client()
    rnd = random.Random(31)
    lanes = Lanes(r, "token_bucket", ["mixed", "script", "module"])
    now = 1_700_000_000_000
    every = ["b%d" % i for i in range(4)] + ["conc"]
    bans = refused_banned = 0
    for step in range(400):
        now += rnd.choice([0, 1, 10, 99, 250, 1000, 4000, -300])
        sfx, argv = random_rules_call(rnd, now)
        release = ("conc", "id%d" % rnd.randrange(3)) \
            if rnd.random() < 0.2 else None
        got = lanes.step({"mixed": rnd.choice(["script", "module"]),
                          "script": "script", "module": "module"}, sfx,
                         argv, release)
        assert got[0] == got[1] == got[2], (step, sfx, argv, got)
        if "rules" in argv:
            assert len(got[0]) == 8, got
            bans += got[0][7] != 0
            refused_banned += got[0][6] != 0
        lanes.compare(every, (step, argv))
    assert bans > 10 and refused_banned > 10, (bans, refused_banned)
