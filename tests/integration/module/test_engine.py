"""test_engine.py -- TBucketRedis engine=auto|script|module: the module
asks Redis with the Lua scripts or with tbucket_redis.so's commands, and
the status page says which.

Redis with the module is tbtest.redismod's ModRedis (module=None: a
server without it). Which engine answered is read from Redis's own
INFO commandstats: tbucket.bucket calls against EVALSHA/EVAL calls."""
import pytest

from tbtest.apache import http_get, metric, metric_sum
from tbtest.redismod import engine_calls as calls


def body(url, engine, policy="open"):
    return """
TBucketRedis %s timeout=500 %s
TBucketFailurePolicy %s
TBucketPrefix eng:
<Location /limited>
    TBucketEnable On
    TBucketKey "%%{HTTP:X-API-Key}"
    TBucketLimit 5 1/h
</Location>
<Location /tbucket-status>
    SetHandler tbucket-status
</Location>
""" % (url, ("engine=" + engine) if engine else "", policy)


def server(apache_factory, url, engine, policy="open"):
    """A prefork Apache of one child with body(url, engine, policy)."""
    a = apache_factory(mpm="prefork", servers=1)
    return a.start(body(url, engine, policy))


def engine_metric(a, r, **labels):
    """tbucket_redis_engine on a's status page for the Redis r."""
    text = http_get(a.url("/tbucket-status")).text
    return metric(text, "tbucket_redis_engine",
                  redis="redis://127.0.0.1:%d" % r.port, **labels)


def run_key(a, key, n):
    return [http_get(a.url("/limited/ok.txt"),
                     headers={"X-API-Key": key}).status_code
            for _ in range(n)]


# engine=module on a Redis with the module: every decision is a
# tbucket.bucket call (none a script), the limit is exact, and the status
# page says engine="module" and counts the module calls.
def test_module_170_01(apache_factory, mod_redis):
    a = server(apache_factory, mod_redis.url, "module")
    m0, s0 = calls(mod_redis)
    assert run_key(a, "k1", 7) == [200] * 5 + [429] * 2
    m1, s1 = calls(mod_redis)
    assert m1 - m0 == 7 and s1 == s0
    assert engine_metric(a, mod_redis, policy="open", engine="module") == 1
    text = http_get(a.url("/tbucket-status")).text
    redis = "redis://127.0.0.1:%d" % mod_redis.port
    assert metric(text, "tbucket_redis_module_calls_total", redis=redis,
                  policy="open") == 7
    html = http_get(a.url("/tbucket-status?view=html")).text
    assert 'data-engine="module"' in html
    a.assert_log_clean()


# engine=script never calls the module, even where it is loaded; both
# engines keep the same bucket, so a second server with engine=module
# continues it exactly (a fleet switched one server at a time).
def test_module_170_02(apache_factory, mod_redis):
    a = server(apache_factory, mod_redis.url, "script")
    b = server(apache_factory, mod_redis.url, "module")
    m0, s0 = calls(mod_redis)
    assert run_key(a, "shared", 3) == [200] * 3
    m1, s1 = calls(mod_redis)
    assert m1 == m0 and s1 - s0 == 3
    assert run_key(b, "shared", 3) == [200, 200, 429]
    assert run_key(a, "shared", 1) == [429]
    m2, s2 = calls(mod_redis)
    assert m2 - m1 == 3 and s2 - s1 == 1
    assert engine_metric(a, mod_redis, policy="open", engine="script") == 1
    a.assert_log_clean()
    b.assert_log_clean()


# engine=auto uses the module where it is loaded (from the connection's
# second call: its setup asks COMMAND INFO) and the scripts where not.
def test_module_170_03(apache_factory, mod_redis, plain_redis):
    a = server(apache_factory, mod_redis.url, None)
    assert run_key(a, "auto", 6) == [200] * 5 + [429]
    m, s = calls(mod_redis)
    assert m == 5 and s == 1
    assert engine_metric(a, mod_redis, policy="open", engine="module") == 1
    b = server(apache_factory, plain_redis.url, "auto")
    assert run_key(b, "auto", 6) == [200] * 5 + [429]
    assert calls(plain_redis) == (0, 6)
    assert engine_metric(b, plain_redis, policy="open",
                         engine="script") == 1
    a.assert_log_clean()
    b.assert_log_clean()


# engine=module against a Redis without the module: a failed connection,
# so the failure policy answers (open: allowed, closed: 429), the breaker
# opens with the reason in the log and on the status page's last failure.
@pytest.mark.parametrize("policy,want", [("open", 200), ("closed", 429)])
def test_module_170_04(apache_factory, plain_redis, policy, want):
    a = server(apache_factory, plain_redis.url, "module", policy)
    assert set(run_key(a, "nomod", 6)) == {want}
    assert calls(plain_redis) == (0, 0)
    log = a.read_log()
    assert "engine=module, but this Redis has no tbucket.bucket" in log
    html = http_get(a.url("/tbucket-status?view=html")).text
    assert "engine=module, but this Redis has no tbucket.bucket" in html
    text = http_get(a.url("/tbucket-status")).text
    assert metric(text, "tbucket_decisions_total",
                  outcome="fallback-" + policy) == 6
    assert metric_sum(text, "tbucket_breaker_opens_total") >= 1, text
    a.assert_log_clean(allowed=("TB00105",))


# apache2 -t refuses an unknown engine, naming the directive and value.
def test_module_170_05(apache_factory):
    a = apache_factory(mpm="prefork")
    rc, out = a.configtest("TBucketRedis redis://127.0.0.1:6379 "
                           "engine=lua\n")
    assert rc != 0
    assert "TBucketRedis: bad engine 'lua': expected auto, script or " \
        "module" in out, out
