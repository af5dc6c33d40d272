"""test_core_script.py -- script caching and round trips against Redis.

The client sends EVALSHA with the embedded script's digest; when Redis
answers NOSCRIPT (after SCRIPT FLUSH, a restart or a failover) it retries
once with EVAL, which also loads the script again, and counts the reload.
Every decision is exactly one script call, however many buckets it takes.
"""
from tbtest.core import info_commandstats


# NOSCRIPT after SCRIPT FLUSH is answered by EVAL, counted once, and the
# decision is still Redis's; the next decision is back on EVALSHA.
def test_core_002_01(redis_server, drivers):
    r = redis_server.client()
    d = drivers(redis_server.url)
    assert d.take("ns", 5, 1, 1)["remaining"] == 4
    assert d.stats()["noscript_reloads"] == 0
    r.script_flush()
    r.config_resetstat()
    res = d.take("ns", 5, 1, 1)
    assert res["source"] == "redis" and res["allowed"] == 1
    assert res["remaining"] == 3
    assert d.stats()["noscript_reloads"] == 1
    cs = info_commandstats(r)
    assert cs.get("eval") == 1
    assert cs.get("evalsha") == 1
    res = d.take("ns", 5, 1, 1)
    assert res["remaining"] == 2
    assert d.stats()["noscript_reloads"] == 1
    cs = info_commandstats(r)
    assert cs.get("eval") == 1 and cs.get("evalsha") == 2
    # Repeated flushes: one reload each, never an error for the caller.
    for k in range(5):
        r.script_flush()
        res = d.take("ns2", 100, 1, 1)
        assert res["source"] == "redis" and res["err"] == "none"
    assert d.stats()["noscript_reloads"] == 6
    assert d.stats()["redis_errors"] == 0


# Exactly one round trip per decision: with the connection made and the
# script cached, N decisions (single and multi-bucket) are N EVALSHA
# calls and nothing else reaches Redis.
def test_core_002_02(redis_server, drivers):
    r = redis_server.client()
    d = drivers(redis_server.url, pool=1)
    d.take("warm", 10, 1, 1)
    r.config_resetstat()
    for k in range(40):
        d.take("rt%d" % (k % 3), 1000, 100, 1)
    for k in range(10):
        d.take("rt", 1000, 100, 1, "a", 50, 5, 1, "b", 20, 2, 2)
    cs = info_commandstats(r)
    assert cs.pop("evalsha") == 50
    # Redis 7 also counts the commands the script runs, and our own.
    assert cs.pop("hmget") == 40 + 10 * 3
    for inner in ("hset", "pexpire", "time", "config|resetstat", "info"):
        cs.pop(inner, None)
    assert cs == {}
    st = d.stats()
    assert st["redis_calls"] == 51 and st["decisions"] == 51


# A multi-bucket decision is atomic in Redis: the route bucket refusing
# leaves the main bucket untouched.
def test_core_002_03(redis_server, drivers):
    r = redis_server.client()
    d = drivers(redis_server.url)
    res = d.take("mb", 10, 0.001, 1, "search", 1, 0.001, 1)
    assert res["allowed"] == 1 and res["binding"] == 1
    res = d.take("mb", 10, 0.001, 1, "search", 1, 0.001, 1)
    assert res["allowed"] == 0 and res["binding"] == 1
    assert res["retry_ms"] > 0
    assert float(r.hget("tb:{mb}", "tokens")) == 9
    # A cost above a route's capacity: "never", not a wait.
    res = d.take("mb", 10, 0.001, 1, "big", 2, 1, 3)
    assert res["allowed"] == 0 and res["retry_ms"] == -1
    assert res["binding"] == 1


# A host that switches to a locale with a decimal comma (setlocale(LC_ALL,
# ...) as a daemon or a PHP script may do at any time) still gets Redis's
# decisions for fractional rates and costs, and exact settlements: the
# client writes its numbers in the C locale, never "2,5". Before the fix
# every such decision went to the failure policy (open here).
def test_core_002_07(redis_server, drivers, locale_dir, monkeypatch):
    locpath, name = locale_dir
    monkeypatch.setenv("LOCPATH", locpath)
    r = redis_server.client()
    d = drivers(redis_server.url, policy="open")
    assert d.cmd("locale " + name)["point"] == ","
    now = 1700000000000
    res = d.cmd("take_at %d loc 10 2.5 0.5 export 4 1.5 1.25" % now)
    assert (res["source"], res["allowed"]) == ("redis", 1), res
    main = [k for k in r.keys("*loc*") if b"route" not in k]
    route = [k for k in r.keys("*loc*") if b"route" in k]
    assert len(main) == 1 and len(route) == 1
    assert float(r.hget(main[0], "tokens")) == 9.5
    assert float(r.hget(route[0], "tokens")) == 2.75
    # Half a second later: 9.5 + 1.25 - 0.5 = 10 (capped) and
    # 2.75 + 0.75 - 1.25 = 2.25.
    res = d.cmd("take_at %d loc 10 2.5 0.5 export 4 1.5 1.25" % (now + 500))
    assert res["source"] == "redis", res
    assert float(r.hget(main[0], "tokens")) == 9.5
    assert float(r.hget(route[0], "tokens")) == 2.25
    # The real cost was 1.75 on both: 1.25 more on the main bucket and 0.5
    # more on the route, settled at the same instant.
    res = d.cmd("settle token-bucket 0 0 %d 1.75 loc 10 2.5 0.5 export 4 "
                "1.5 1.25" % (now + 500))
    assert res["source"] == "redis", res
    assert float(r.hget(main[0], "tokens")) == 8.25
    assert float(r.hget(route[0], "tokens")) == 1.75
    assert d.stats()["redis_errors"] == 0
