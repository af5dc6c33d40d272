"""test_core_resilience.py -- the client when Redis goes away and returns.

Real failures, made with real signals: redis-server restarted on the same
port, stopped with SIGSTOP (every SIGSTOP has its SIGCONT in a finally),
killed; a listener whose backlog is full for the connect timeout. Checks
the timeouts' bounds, the breaker's opening and probing, and each failure
policy's answers and recovery. These tests take real time (under two
seconds each); every wait is bounded.
"""
import socket
import time

import pytest

from tbtest.env import wait_until

MARGIN_US = 50000  # What "a small margin" over a timeout may be.


def until_redis(d, key, *bucket, timeout=5.0):
    """Decide until Redis answers again (bounded); the answers seen."""
    seen = []

    def ok():
        seen.append(d.take(key, *bucket))
        return seen[-1]["source"] == "redis"
    assert wait_until(ok, timeout, step=0.05), seen[-3:]
    return seen


# After a Redis restart on the same port the client drops its dead
# connection and reconnects: at most one failed decision per pooled
# connection, then Redis decides again (with the script reloaded).
def test_core_003_01(redis_server, drivers):
    d = drivers(redis_server.url, pool=2, breaker_threshold=100)
    for k in range(3):
        assert d.take("rs", 10, 0.001, 1)["source"] == "redis"
    redis_server.stop()
    redis_server.start()
    seen = until_redis(d, "rs", 10, 0.001, 1)
    assert len(seen) <= 1 + 2
    assert all(s["err"] in ("io", "none") for s in seen), seen
    # The restarted Redis has no state: a full bucket again.
    assert seen[-1]["remaining"] == 9
    for k in range(5):
        assert d.take("rs", 10, 0.001, 1)["source"] == "redis"
    # A new connection (which loads the script again on connect, or
    # meets NOSCRIPT and answers it with EVAL).
    assert d.stats()["connects"] >= 2


# The command timeout is honoured when Redis is stopped with SIGSTOP: the
# call returns within timeout + a small margin, by the failure policy; and
# after SIGCONT Redis decides again.
def test_core_003_02(redis_server, drivers):
    timeout_ms = 100
    d = drivers(redis_server.url, timeout=timeout_ms, pool=1,
                breaker_threshold=100)
    assert d.take("stop", 10, 1, 1)["source"] == "redis"
    redis_server.sigstop()
    try:
        for k in range(3):
            t0 = time.monotonic()
            res = d.take("stop", 10, 1, 1, timeout=5)
            wall = time.monotonic() - t0
            assert res["err"] == "timeout", res
            assert res["source"] == "open" and res["allowed"] == 1
            assert res["elapsed_us"] >= timeout_ms * 1000 * 0.9, res
            assert res["elapsed_us"] <= timeout_ms * 1000 + MARGIN_US, res
            assert wall < (timeout_ms / 1000.0) + 0.5
        assert d.stats()["err_timeout"] == 3
    finally:
        redis_server.sigcont()
    until_redis(d, "stop", 10, 1, 1, timeout=3)


# The connect timeout is honoured against a listener whose accept queue
# is full (SYNs are dropped, so connect() itself hangs).
def test_core_003_03(drivers):
    lsock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    fillers = []
    try:
        lsock.bind(("127.0.0.1", 0))
        lsock.listen(0)
        port = lsock.getsockname()[1]
        for k in range(4):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.setblocking(False)
            s.connect_ex(("127.0.0.1", port))
            fillers.append(s)
        time.sleep(0.05)
        d = drivers("redis://127.0.0.1:%d" % port, timeout=1000,
                    connect_timeout=80, policy="closed",
                    breaker_threshold=100)
        for k in range(2):
            res = d.take("ct", 10, 1, 1, timeout=5)
            assert res["err"] == "timeout", res
            assert res["source"] == "closed" and res["allowed"] == 0
            assert res["elapsed_us"] <= 80000 + MARGIN_US, res
            assert res["elapsed_us"] >= 70000, res
    finally:
        for s in fillers:
            s.close()
        lsock.close()


# The breaker opens after N consecutive failures, then answers without
# calling Redis; after the cooldown one probe goes through: a failed probe
# reopens it, a successful one closes it. The cooldown (1 s) must outlast
# the 20 decisions asked while it is open, a few ms idle: it is a bound
# on the test's own pace, so it is long enough for a busy runner.
def test_core_003_04(redis_server, drivers):
    cool_s = 1.0
    d = drivers(redis_server.url, breaker_threshold=3,
                breaker_cooldown=int(cool_s * 1000), policy="closed",
                timeout=100)
    assert d.take("br", 10, 1, 1)["source"] == "redis"
    redis_server.kill9()
    for k in range(3):
        assert d.breaker() == "closed"
        res = d.take("br", 10, 1, 1)
        assert res["err"] == "io" and res["source"] == "closed", res
    assert d.breaker() == "open"
    st = d.stats()
    assert st["breaker_opens"] == 1 and st["redis_calls"] == 4
    t_open = time.monotonic()
    for k in range(20):
        res = d.take("br", 10, 1, 1)
        assert res["err"] == "breaker" and res["source"] == "closed"
        assert 0 < res["retry_ms"] <= cool_s * 1000
        assert res["redis_us"] == 0
    assert d.stats()["redis_calls"] == 4
    assert d.stats()["breaker_skips"] == 20
    # The probe after the cooldown, with Redis still down: one call, open.
    time.sleep(max(0.0, cool_s + 0.05 - (time.monotonic() - t_open)))
    res = d.take("br", 10, 1, 1)
    assert res["err"] == "io", res
    assert d.stats()["redis_calls"] == 5
    assert d.breaker() == "open"
    assert d.take("br", 10, 1, 1)["err"] == "breaker"
    # Redis back; the next probe closes the breaker.
    redis_server.start()
    time.sleep(cool_s + 0.05)
    res = d.take("br", 10, 1, 1)
    assert res["source"] == "redis" and res["err"] == "none", res
    assert d.breaker() == "closed"
    st = d.stats()
    assert st["breaker_closes"] == 1 and st["breaker_opens"] == 1
    assert d.take("br", 10, 1, 1)["source"] == "redis"


# Each failure policy with Redis killed: open allows, closed rejects with a
# retry-after, local admits capacity/replicas from its own bucket; when
# Redis returns, Redis decides again. (The cooldown, 1 s, outlasts the
# eight decisions, so that the last is the breaker's on a busy runner
# too.)
@pytest.mark.parametrize("policy", ["open", "closed", "local"])
def test_core_003_05(redis_server, drivers, policy):
    d = drivers(redis_server.url, policy=policy, replicas=2,
                breaker_threshold=2, breaker_cooldown=1000, timeout=100)
    res = d.take("pol", 6, 0.001, 1)
    assert res["source"] == "redis" and res["remaining"] == 5
    redis_server.kill9()
    seen = [d.take("pol", 6, 0.001, 1) for k in range(8)]
    assert all(s["source"] == policy for s in seen), seen
    assert all(s["err"] in ("io", "breaker") for s in seen), seen
    assert seen[0]["err"] == "io" and seen[-1]["err"] == "breaker"
    allowed = sum(s["allowed"] for s in seen)
    if policy == "open":
        assert allowed == 8
    elif policy == "closed":
        assert allowed == 0
        assert all(s["retry_ms"] > 0 for s in seen)
    else:
        assert allowed == 3  # 6 / 2 replicas
        assert seen[-1]["retry_ms"] > 0
    st = d.stats()
    assert st["fallback_" + policy] == 8
    redis_server.start()
    seen = until_redis(d, "pol", 6, 0.001, 1, timeout=3)
    assert seen[-1]["remaining"] == 5  # Redis restarted empty.
    assert d.breaker() == "closed"


# A Redis error reply (the key holds a string) is an error for that
# decision, answered by the policy with err=reply; the connection stays
# usable for the next decision.
def test_core_003_06(redis_server, drivers):
    r = redis_server.client()
    r.set("tb:{str}", "not a hash")
    d = drivers(redis_server.url, pool=1, breaker_threshold=100)
    res = d.take("str", 10, 1, 1)
    assert res["err"] == "reply" and res["source"] == "open", res
    assert d.stats()["err_reply"] == 1
    res = d.take("fine", 10, 1, 1)
    assert res["source"] == "redis" and res["remaining"] == 9
    assert r.get("tb:{str}") == b"not a hash"
