"""test_core_vectors.py -- the shared test vectors against the real script.

tests/vectors/token_bucket.tsv is also run against the C twin
tb_bucket_take() by tests/unit/test_bucket.c; here the same rows run
against the assembled script (shared/tb_prelude.lua + shared/tb_bucket.lua,
as build/lua/tb_bucket.lua ships) inside a real redis-server with the injected
now (ARGV[1]), so C and Lua can never drift apart. Then again through the
C client (tb_driver take_at), which checks how the client formats its
arguments (a double must reach Lua unchanged).
"""
import hashlib

import pytest

from tbcore import (drivers, load_vectors, num, redis_key,  # noqa: F401
                    info_commandstats, script_text)

VECTORS = load_vectors()
IDS = [v[0] for v in VECTORS]


def setup_state(r, keys, buckets):
    """Write each existing bucket's state as the script stores it."""
    for k, b in zip(keys, buckets):
        r.delete(k)
        if b["exists"]:
            r.hset(k, mapping={"tokens": num(b["tokens"]),
                               "ts": str(b["ts_ms"])})


def check_after(r, keys, buckets, verdict, vid):
    """The hash and its TTL after the call: written only when allowed."""
    for i, (k, b) in enumerate(zip(keys, buckets)):
        h = r.hgetall(k)
        pttl = r.pttl(k)
        if verdict[0] == 1:
            assert float(h[b"tokens"]) == b["new_tokens"], (vid, i, h)
            assert int(h[b"ts"]) == b["new_ts_ms"], (vid, i, h)
            # PTTL counts down in real time from the TTL just set.
            assert b["ttl_ms"] - 1000 < pttl <= b["ttl_ms"], (vid, i, pttl)
        elif b["exists"]:
            assert float(h[b"tokens"]) == b["tokens"], (vid, i, h)
            assert int(h[b"ts"]) == b["ts_ms"], (vid, i, h)
            assert pttl == -1, (vid, i, pttl)
        else:
            assert h == {} and pttl == -2, (vid, i, h, pttl)


# Every vector through EVAL of the script text, with the injected now.
@pytest.mark.parametrize("vec", VECTORS, ids=IDS)
def test_core_001_01(redis_server, vec):
    vid, now, buckets, verdict = vec
    r = redis_server.client()
    keys = ["vec:{%s}:%d" % (vid, i) for i in range(len(buckets))]
    setup_state(r, keys, buckets)
    argv = [str(now)]
    for b in buckets:
        argv += [num(b["capacity"]), num(b["rate"]), num(b["cost"])]
    reply = r.eval(script_text(), len(keys), *(keys + argv))
    assert [int(x) for x in reply] == verdict, vid
    check_after(r, keys, buckets, verdict, vid)


# The table is not trivially small and covers multi-bucket calls.
def test_core_001_02():
    assert len(VECTORS) >= 40
    assert sum(len(b) > 1 for _, _, b, _ in VECTORS) >= 5
    assert any(v[3][2] == -1 for v in VECTORS)


# The script the library embeds is build/lua/tb_bucket.lua, byte for byte:
# after one decision Redis holds exactly that file's SHA-1.
def test_core_001_03(redis_server, drivers):
    sha = hashlib.sha1(script_text()).hexdigest()
    r = redis_server.client()
    assert r.script_exists(sha) == [False]
    d = drivers(redis_server.url)
    assert d.take("embed", 10, 1, 1)["source"] == "redis"
    assert r.script_exists(sha) == [True]


# Every vector through the C client (tb_client_decide_at via tb_driver),
# into the keys the client builds: the reply and the stored state match.
def test_core_001_04(redis_server, drivers):
    r = redis_server.client()
    d = drivers(redis_server.url, prefix="v:")
    routes = ["r%d" % i for i in range(8)]
    failures = []
    for vid, now, buckets, verdict in VECTORS:
        client = "c-" + vid
        keys = [redis_key("v:", client, None if i == 0 else routes[i])
                for i in range(len(buckets))]
        setup_state(r, keys, buckets)
        args = []
        for i, b in enumerate(buckets):
            if i:
                args.append(routes[i])
            args += [num(b["capacity"]), num(b["rate"]), num(b["cost"])]
        res = d.cmd("take_at %d %s %s" % (now, client, " ".join(args)))
        got = [res["allowed"], res["remaining"], res["retry_ms"],
               res["binding"]]
        if res["source"] != "redis" or got != verdict:
            failures.append((vid, res, verdict))
            continue
        try:
            check_after(r, keys, buckets, verdict, vid)
        except (AssertionError, KeyError) as e:
            failures.append((vid, "state after the call", repr(e),
                             sorted(r.keys("*%s*" % client))))
    assert failures == []
    # One EVALSHA per decision, nothing else per decision.
    stats = info_commandstats(r)
    assert stats.get("evalsha", 0) == len(VECTORS)
