"""test_failure.py -- Redis down, slow or back: the three failure policies, the
breaker, the timeout, and the shared local table under prefork."""
import concurrent.futures
import math
import time

from tbtest.apache import http_get, metric, metric_sum
from tbtest.env import Redis

BREAKER_TAGS = ("TB00105",)


def body(redis_url, policy, extra="", limit="TBucketLimit 6 1/h"):
    return """
TBucketRedis %s timeout=100 connect_timeout=100
TBucketFailurePolicy %s
TBucketBreaker threshold=2 cooldown=300ms
TBucketPrefix f:
%s
<Location /cgi-bin>
    TBucketEnable On
    %s
</Location>
""" % (redis_url, policy, extra, limit)


def decision(a):
    r = http_get(a.url("/cgi-bin/env.cgi"))
    if r.status_code == 200:
        return r.status_code, r.json()["TBUCKET_DECISION"]
    return r.status_code, None


def wait_decision(a, want, timeout=10.0):
    """Poll (bounded) until a request is decided as `want`."""
    deadline = time.monotonic() + timeout
    got = None
    while time.monotonic() < deadline:
        got = decision(a)
        if got[1] == want:
            return got
        time.sleep(0.1)
    raise AssertionError("never decided %s; last %r" % (want, got))


# open: with Redis killed requests pass as fallback-open; when Redis
# returns the module uses it again; the breaker's transitions are logged
# once each per child, not per request.
def test_module_004_01(apache_factory, redis_server):
    a = apache_factory(servers=1)
    a.start(body(redis_server.url, "open"))
    assert decision(a) == (200, "allowed")
    redis_server.kill9()
    got = [decision(a) for _ in range(10)]
    assert got == [(200, "fallback-open")] * 10
    redis_server.start()
    wait_decision(a, "allowed")
    log = a.read_log()
    assert 1 <= log.count("TB00105") <= 2
    assert "breaker open, the open policy decides" in log
    assert log.count("TB00106") == log.count("TB00105")
    a.assert_log_clean(allowed=BREAKER_TAGS)


# closed: with Redis killed requests get 429 with a Retry-After; recovery
# when Redis returns.
def test_module_004_02(apache_factory, redis_server):
    a = apache_factory()
    a.start(body(redis_server.url, "closed"))
    assert decision(a) == (200, "allowed")
    redis_server.kill9()
    for _ in range(5):
        r = http_get(a.url("/cgi-bin/env.cgi"))
        assert r.status_code == 429
        assert int(r.headers["Retry-After"]) >= 1
        assert r.json()["error"] == "rate limited"
    redis_server.start()
    wait_decision(a, "allowed")
    a.assert_log_clean(allowed=BREAKER_TAGS)


# local: with Redis killed a local bucket of capacity/replicas decides
# (6/2 = 3 here), and the application sees fallback-local.
def test_module_004_03(apache_factory, redis_server):
    a = apache_factory(servers=1)
    a.start(body(redis_server.url, "local", "TBucketReplicas 2"))
    redis_server.kill9()
    got = [decision(a) for _ in range(5)]
    assert got == [(200, "fallback-local")] * 3 + [(429, None)] * 2
    redis_server.start()
    wait_decision(a, "allowed")
    a.assert_log_clean(allowed=BREAKER_TAGS)


# Apache starts and serves by its policy while Redis has never been up,
# and picks Redis up when it starts.
def test_module_004_04(apache_factory, tmp_path):
    rd = Redis(tmp_path / "late")
    a = apache_factory()
    a.start(body(rd.url, "closed"))
    r = http_get(a.url("/cgi-bin/env.cgi"))
    assert r.status_code == 429
    try:
        rd.start()
        wait_decision(a, "allowed")
    finally:
        rd.stop()
    a.assert_log_clean(allowed=BREAKER_TAGS)


# A stopped (unresponsive) Redis costs at most about the timeout per
# request, and nothing once the breaker is open.
def test_module_004_05(apache_factory, redis_server):
    a = apache_factory(servers=1)
    a.start(body(redis_server.url, "open", limit="TBucketLimit 6 1/h\n"
                 "TBucketKey \"%{HTTP:X-API-Key}\"") + """
<Location /tbucket-status>
    SetHandler tbucket-status
</Location>
""")
    assert decision(a) == (200, "allowed")
    redis_server.sigstop()
    try:
        times = []
        for _ in range(6):
            t0 = time.monotonic()
            r = http_get(a.url("/cgi-bin/env.cgi"))
            times.append(time.monotonic() - t0)
            assert r.json()["TBUCKET_DECISION"] == "fallback-open"
        # Bounded by the 100 ms timeout (plus CGI time on a busy box)
        # against the wait for a stopped Redis, which has no end.
        assert max(times) < 2.0, times
        # After two failures the breaker is open: Redis is not asked but
        # by one probe per 300 ms cooldown. Idle, the four requests after
        # the opening end within one cooldown (three skip Redis); a busy
        # machine's CGIs may outlast it, so the probes are counted from
        # the time those requests took, not assumed.
        probes = math.ceil(sum(times[1:]) / 0.3)
        text = http_get(a.url("/tbucket-status")).text
        assert metric_sum(text, "tbucket_breaker_opens_total") >= 1, text
        assert metric(text, "tbucket_breaker_skips_total",
                      redis=redis_server.url, policy="open") \
            >= 4 - probes, (times, text)
    finally:
        redis_server.sigcont()
    wait_decision(a, "allowed")
    a.assert_log_clean(allowed=BREAKER_TAGS)


# local under prefork with many children: all children share one table in
# shared memory, so together they allow capacity/replicas, not N times it.
def test_module_004_06(apache_factory, redis_server):
    a = apache_factory(mpm="prefork", servers=16)
    a.start(body(redis_server.url, "local", "TBucketReplicas 4",
                 limit="TBucketLimit 40 1/h"))
    # Let all children come up before Redis goes away.
    deadline = time.monotonic() + 10
    while len(a.child_pids()) < 16 and time.monotonic() < deadline:
        time.sleep(0.05)
    redis_server.kill9()

    def one(_):
        return http_get(a.url("/cgi-bin/env.cgi")).status_code

    with concurrent.futures.ThreadPoolExecutor(16) as ex:
        codes = list(ex.map(one, range(64)))
    assert codes.count(200) == 10, codes
    assert codes.count(429) == 54
    with open(a.access_log) as f:
        pids = {line.split()[-1] for line in f if "fallback-local" in line}
    assert len(pids) > 1, "requests did not spread over children"
    a.assert_log_clean(allowed=BREAKER_TAGS)
