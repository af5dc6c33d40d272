"""test_status.py -- the tbucket-status page: Prometheus text, server-wide
counters that only move forward, and no Redis password."""
import re

from tbtest.apache import http_get, limited_conf, metric
from tbtest.env import Redis

STATUS = """
<Location /tbucket-status>
    SetHandler tbucket-status
    Require ip 127.0.0.1
</Location>
"""


def check_format(text):
    """Every sample belongs to a family declared by HELP and TYPE."""
    typed = {}
    helped = set()
    for line in text.splitlines():
        if line.startswith("# HELP "):
            helped.add(line.split()[2])
        elif line.startswith("# TYPE "):
            _, _, name, kind = line.split()
            typed[name] = kind
        elif line:
            m = re.match(r"^([a-z_]+)(\{[^}]*\})? (\d+(\.\d+)?)$", line)
            assert m, "bad sample line: %r" % line
            name = m.group(1)
            base = re.sub(r"_(bucket|sum|count)$", "", name)
            fam = name if name in typed else base
            assert fam in typed and fam in helped, line
            assert fam.startswith("tbucket_")
            if typed[fam] == "counter":
                assert name.endswith("_total"), name
    for name in ("tbucket_decisions_total", "tbucket_redis_latency_seconds",
                 "tbucket_redis_errors_total", "tbucket_breaker_state",
                 "tbucket_fallback_decisions_total", "tbucket_pool_size",
                 "tbucket_pool_connections_open"):
        assert name in typed, name


def conf(url, prefix):
    return limited_conf(url, prefix, "    TBucketLimit 3 1/h", key=None,
                        status=False) + STATUS


# The page is valid Prometheus text and its figures move with requests.
def test_module_005_01(apache_factory, redis_server):
    a = apache_factory()
    a.start(conf(redis_server.url, "s1:"))
    page = http_get(a.url("/tbucket-status"))
    assert page.status_code == 200
    assert page.headers["Content-Type"].startswith("text/plain; version=0.0.4")
    check_format(page.text)
    assert metric(page.text, "tbucket_decisions_total",
                  outcome="allowed") == 0
    for _ in range(5):
        http_get(a.url("/limited/ok.txt"))
    text = http_get(a.url("/tbucket-status")).text
    check_format(text)
    assert metric(text, "tbucket_decisions_total", outcome="allowed") == 3
    assert metric(text, "tbucket_decisions_total", outcome="rejected") == 2
    labels = {"redis": redis_server.url, "policy": "open"}
    assert metric(text, "tbucket_redis_calls_total", **labels) == 5
    assert metric(text, "tbucket_redis_latency_seconds_count",
                  **labels) == 5
    assert metric(text, "tbucket_redis_latency_seconds_bucket",
                  le="+Inf", **labels) == 5
    assert metric(text, "tbucket_breaker_state", **labels) == 0
    assert metric(text, "tbucket_pool_size", **labels) == 1
    a.assert_log_clean()


# Counters are server-wide: whichever prefork child answers, each scrape
# shows every request made so far and never less than the one before.
def test_module_005_02(apache_factory, redis_server):
    a = apache_factory(mpm="prefork", servers=4)
    a.start(conf(redis_server.url, "s2:").replace("3 1/h", "100 1/h"))
    last = 0
    for i in range(1, 16):
        http_get(a.url("/limited/ok.txt"))
        text = http_get(a.url("/tbucket-status")).text
        now = metric(text, "tbucket_decisions_total", outcome="allowed")
        assert now == i
        assert now >= last
        last = now
    with open(a.access_log) as f:
        pids = {line.split()[-1] for line in f}
    assert len(pids) > 1
    a.assert_log_clean()


# A graceful restart keeps the counters: they never go backwards.
def test_module_005_03(apache_factory, redis_server):
    a = apache_factory()
    a.start(conf(redis_server.url, "s3:"))
    for _ in range(4):
        http_get(a.url("/limited/ok.txt"))
    before = http_get(a.url("/tbucket-status")).text
    a.graceful()
    http_get(a.url("/limited/ok.txt"))
    after = http_get(a.url("/tbucket-status")).text
    for outcome, n in (("allowed", 3), ("rejected", 2)):
        assert metric(after, "tbucket_decisions_total",
                      outcome=outcome) == n
    assert metric(after, "tbucket_config_generation") == metric(
        before, "tbucket_config_generation") + 1
    a.assert_log_clean()


# A Redis password never appears on the status page or in the error log,
# at the most verbose LogLevel, whether AUTH succeeds or fails.
def test_module_005_04(apache_factory, tmp_path):
    rd = Redis(tmp_path / "acl",
               extra=["user tbuser on >s3cr3tpw ~* +@all"]).start()
    try:
        a = apache_factory(log_level="trace8")
        good = "redis://tbuser:s3cr3tpw@127.0.0.1:%d" % rd.port
        a.start(conf(good, "s4:") + """
<VirtualHost 127.0.0.1:%d>
    ServerName 127.0.0.1
</VirtualHost>
<VirtualHost 127.0.0.1:%d>
    ServerName wrong.test
    TBucketRedis redis://tbuser:wr0ngpw@127.0.0.1:%d timeout=500
    TBucketEnable On
    TBucketLimit 3 1/h
</VirtualHost>
""" % (a.port, a.port, rd.port))
        assert http_get(a.url("/limited/ok.txt")).status_code == 200
        assert rd.client().keys("s4:*")
        http_get(a.url("/ok.txt"), {"Host": "wrong.test"})
        text = http_get(a.url("/tbucket-status")).text
        check_format(text)
        assert "s3cr3tpw" not in text and "wr0ngpw" not in text
        assert "tbuser:***@" in text
        assert metric(text, "tbucket_redis_errors_total", kind="auth",
                      redis="redis://tbuser:***@127.0.0.1:%d" % rd.port,
                      policy="open") >= 1
        log = a.read_log()
        assert "s3cr3tpw" not in log and "wr0ngpw" not in log
        with open(a.access_log) as f:
            assert "s3cr3tpw" not in f.read()
    finally:
        rd.stop()
