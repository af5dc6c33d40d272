"""test_core_vectors.py -- the shared test vectors against the real script.

tests/vectors/token_bucket.tsv is also run against the C twin
tb_bucket_take() by tests/unit/test_bucket.c; here the same rows run
against the assembled script (shared/algo/tb_prelude.lua +
shared/algo/tb_bucket.lua, as build/lua/tb_bucket.lua ships) inside a real
redis-server with the injected now (ARGV[1]), so C and Lua can never drift
apart. Then again through the C client (tb_driver take_at), which checks how
the client formats its arguments (a double must reach Lua unchanged).
"""
import hashlib

import pytest

from tbtest.core import (check_after, eval_vector, info_commandstats,
                         load_vectors, put_buckets, script_text, vector_take)

VECTORS = load_vectors()
IDS = [v[0] for v in VECTORS]


# Every vector through EVAL of the script text, with the injected now.
@pytest.mark.parametrize("vec", VECTORS, ids=IDS)
def test_core_001_01(redis_server, vec):
    vid, now, buckets, verdict = vec
    r = redis_server.client()
    keys = eval_vector(r, vec, "vec")
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
    failures = []
    for vid, now, buckets, verdict in VECTORS:
        client = "c-" + vid
        keys, args = vector_take("v:", client, buckets)
        put_buckets(r, keys, buckets)
        res = d.cmd("take_at %d %s %s" % (now, client, args))
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
