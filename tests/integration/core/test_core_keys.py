"""test_core_keys.py -- untrusted client keys against a real Redis.

A client key comes from a request and may hold braces, CR/LF, NUL bytes or
be a megabyte long. The core must pass keys binary-safe (argv, never an
interpolated command), replace unsafe ones with a stable hash, keep one
client's buckets in one cluster slot, and never let one client's key reach
another client's bucket. The expected key names are computed here from the
rule in tb.h, independently of the C code.
"""
from tbtest.core import keyslot, pct, redis_key

HOSTILE = [
    b"victim}", b"{victim}", b"victim\x00", b"victim\r\n", b"victim ",
    b"victim}:route:admin", b"victim:route:admin", b"}victim{", b"victim{",
    b"victim\r\n*1\r\n$8\r\nFLUSHALL\r\n", b"\x00", b"", b"#", b"%",
    b"#" + b"0" * 32, b"v" * 129, b"victim\xff", b"VICTIM", b"victim\t",
    b"a" * (1 << 20),
]


# Hostile keys never touch another client's bucket: the victim's drained
# bucket stays drained while every attacker gets a fresh bucket of its own,
# and Redis holds exactly the keys the rule in tb.h names.
def test_core_005_01(redis_server, drivers):
    r = redis_server.client()
    d = drivers(redis_server.url)
    assert d.take("victim", 2, 0.001, 2)["allowed"] == 1
    assert d.take("victim", 2, 0.001, 1)["allowed"] == 0
    for k in HOSTILE:
        res = d.take(k, 2, 0.001, 1, timeout=30)
        assert res["source"] == "redis", (k[:40], res)
        assert res["allowed"] == 1 and res["remaining"] == 1, (k[:40], res)
    assert d.take("victim", 2, 0.001, 1)["allowed"] == 0
    want = {redis_key("tb:", k) for k in HOSTILE + [b"victim"]}
    assert set(r.keys("*")) == want
    for key in want:
        assert key.count(b"{") == 1 and key.count(b"}") == 1, key
        assert len(key) <= 3 + 2 + 128, key


# Keys are binary-safe: NUL, CR/LF and a 1 MB key each reach exactly the
# hashed key computed from all of their bytes; a second call finds the same
# bucket (the hash is stable).
def test_core_005_02(redis_server, drivers):
    r = redis_server.client()
    d = drivers(redis_server.url)
    for k in [b"a\x00b", b"a\x00c", b"line\r\nbreak", b"x" * (1 << 20),
              b"x" * (1 << 20 - 1) + b"y", b"plain-key.42"]:
        rk = redis_key("tb:", k)
        assert d.take(k, 5, 0.001, 1, timeout=30)["remaining"] == 4
        assert d.take(k, 5, 0.001, 1, timeout=30)["remaining"] == 3
        assert 3 <= float(r.hget(rk, "tokens")) < 3.01, k[:20]
    assert r.dbsize() == 6


# One client's main and route buckets share a cluster hash slot (and the
# key names follow tb.h); the driver's `key` command agrees with the rule.
def test_core_005_03(redis_server, drivers):
    r = redis_server.client()
    d = drivers(redis_server.url, prefix="rl:")
    for k in [b"203.0.113.9", b"a{b}c", b"\x00\x01"]:
        d.take(k, 10, 1, 1, "search", 5, 1, 1, "upload", 2, 1, 1)
        keys = [redis_key("rl:", k)] + [redis_key("rl:", k, x)
                                        for x in ("search", "upload")]
        assert all(r.exists(x) for x in keys), keys
        assert len({keyslot(x) for x in keys}) == 1
        for route in (None, "search"):
            got = d.cmd("key %s%s" % (pct(k), " " + route if route else ""))
            assert bytes.fromhex(got["key"]) == redis_key("rl:", k, route)


# A key written to look like a protocol command is data: nothing runs, no
# other key is lost.
def test_core_005_04(redis_server, drivers):
    r = redis_server.client()
    r.set("canary", "alive")
    d = drivers(redis_server.url)
    for k in [b"x\r\n*1\r\n$8\r\nFLUSHALL\r\n", b"*1\r\n$8\r\nFLUSHDB\r\n",
              b"x\r\nDEL canary\r\n"]:
        assert d.take(k, 3, 1, 1)["source"] == "redis"
    assert r.get("canary") == b"alive"
    assert r.dbsize() == 4
