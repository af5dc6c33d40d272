"""test_status_newcomer.py -- the status page and headers as a first-time
administrator reads them (the newcomer's report):

- TBucketRedis in the main server and in a virtual host: one entry per
  Redis URL and failure policy, each saying where it is configured
  (tbucket_redis_info's servers, and the HTML card);
- "decided without asking Redis (breaker open)" names the breaker, and
  the failure policy is a field of its own;
- tbucket_redis_engine says "failing" while every call fails, not the
  engine it last used;
- while the local failure policy decides, X-RateLimit-Limit (and the IETF
  fields) describe this server's share, capacity / TBucketReplicas.
"""
from tbtest.apache import http_get

CONF = """
TBucketRedis %(url)s timeout=100 connect_timeout=100
TBucketBreaker threshold=100 cooldown=60s
<VirtualHost *:%(port)d>
    ServerName shop.example
    TBucketRedis %(url)s timeout=100 connect_timeout=100
    TBucketBreaker threshold=100 cooldown=60s
    TBucketFailurePolicy local
    TBucketReplicas 4
    TBucketHeaders both
    <Location /limited>
        TBucketEnable On
        TBucketLimit 120 2/s
    </Location>
    <Location /tbucket-status>
        SetHandler tbucket-status
    </Location>
</VirtualHost>
"""


def test_module_210_01(apache_factory, redis_server):
    a = apache_factory(mpm="event", servers=1)
    a.start(CONF % {"url": redis_server.url, "port": a.port})
    r = http_get(a.url("/limited/ok.txt"))
    assert r.status_code == 200 and r.headers["X-RateLimit-Limit"] == "120"
    prom = http_get(a.url("/tbucket-status")).text
    infos = [ln for ln in prom.splitlines()
             if ln.startswith("tbucket_redis_info{")]
    assert len(infos) == 2, infos
    assert any('policy="open"' in ln and 'servers="main server"' in ln
               for ln in infos), infos
    assert any('policy="local"' in ln and 'servers="shop.example:' in ln
               for ln in infos), infos
    engines = [ln for ln in prom.splitlines()
               if ln.startswith("tbucket_redis_engine{")
               and 'policy="local"' in ln]
    assert len(engines) == 1 and 'engine="script"' in engines[0], engines
    html = http_get(a.url("/tbucket-status?view=html")).text
    assert "failure policy <b>local</b> &middot; configured in " \
           "shop.example:" in html
    assert "decided without asking Redis (breaker open)" in html
    assert "decided without Redis (open)" not in html

    # Redis gone: the local policy decides on this server's share, and
    # the headers say so; the engine gauge says the calls fail.
    redis_server.stop()
    r = http_get(a.url("/limited/ok.txt"))
    assert r.status_code == 200, r.status_code
    assert r.headers["X-RateLimit-Limit"] == "30", r.headers
    assert int(r.headers["X-RateLimit-Remaining"]) <= 29
    assert r.headers["RateLimit-Policy"] == '"default";q=30;w=60', r.headers
    prom = http_get(a.url("/tbucket-status")).text
    engines = [ln for ln in prom.splitlines()
               if ln.startswith("tbucket_redis_engine{")
               and 'policy="local"' in ln]
    assert 'engine="failing"' in engines[0], engines
    assert 'outcome="fallback-local"} 1' in prom, \
        [ln for ln in prom.splitlines() if "fallback-local" in ln]
