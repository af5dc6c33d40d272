"""test_restart.py -- every MPM, graceful restarts that change limits, and no
leaked Redis connections across generations."""
import concurrent.futures
import time

import pytest

from tbtest.apache import http_get

MPMS = ["prefork", "worker", "event"]


def body(url, limit):
    return """
TBucketRedis %s timeout=500
TBucketPrefix g:
<Location /limited>
    TBucketEnable On
    TBucketKey "%%{HTTP:X-API-Key}"
    TBucketLimit %s
</Location>
""" % (url, limit)


def module_conns(rc):
    """Redis connections made by the module (their last command is one of
    the core's), by id."""
    ids = set()
    for c in rc.client_list():
        if c.get("cmd", "").split("|")[0] in ("evalsha", "eval", "auth",
                                               "select", "script"):
            ids.add(c["id"])
    return ids


def burst(a, n, key):
    def one(_):
        return http_get(a.url("/limited/ok.txt"),
                        {"X-API-Key": key}).status_code

    with concurrent.futures.ThreadPoolExecutor(8) as ex:
        return list(ex.map(one, range(n)))


# Limits are enforced the same way under prefork, worker and event.
@pytest.mark.parametrize("mpm", MPMS)
def test_module_006_01(apache_factory, redis_server, mpm):
    a = apache_factory(mpm=mpm, servers=2)
    a.start(body(redis_server.url, "10 1/h"))
    codes = burst(a, 16, "m-" + mpm)
    assert codes.count(200) == 10 and codes.count(429) == 6, codes
    a.assert_log_clean()


# A graceful restart (apachectl graceful) applies new limits at once.
def test_module_006_02(apache_factory, redis_server):
    a = apache_factory()
    a.start(body(redis_server.url, "2 1/h"))
    assert burst(a, 3, "x").count(429) == 1
    a.graceful(body(redis_server.url, "5 1/h"))
    r = http_get(a.url("/limited/ok.txt"), {"X-API-Key": "y"})
    assert r.headers["X-RateLimit-Limit"] == "5"
    assert burst(a, 5, "y").count(200) == 4
    a.assert_log_clean()


# Graceful restarts do not leak Redis connections: the old generation's
# connections close and the total stays within children x pool.
@pytest.mark.parametrize("mpm", MPMS)
def test_module_006_03(apache_factory, redis_server, mpm):
    a = apache_factory(mpm=mpm, servers=2)
    a.start(body(redis_server.url, "1000 1/s"))
    rc = redis_server.client()
    # pool 1 per child; prefork keeps a few spare children, a threaded
    # server at most ServerLimit (2).
    bound = 2 if mpm != "prefork" else 6
    burst(a, 40, "c")
    before = module_conns(rc)
    assert 1 <= len(before) <= bound
    for gen in range(3):
        a.graceful(body(redis_server.url, "%d 1/s" % (1000 + gen)))
        burst(a, 40, "c")
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            now = module_conns(rc)
            if not (now & before) and len(now) <= bound:
                break
            time.sleep(0.1)
        assert not (now & before), "old generation kept its connections"
        assert len(now) <= bound, now
        before = now
    a.assert_log_clean()
