"""test_once.py -- a request is counted exactly once through PHP (php-cgi via
mod_actions, an internal redirect), CGI, sub-requests and ErrorDocument, and
the application sees TBUCKET_* under their own names."""

from tbtest.apache import PHP_CGI, http_get, tokens
from tbtest.env import require

BODY = """
TBucketRedis %s timeout=500
TBucketPrefix %s
<Location /app>
    TBucketEnable On
    TBucketKey "%%{HTTP:X-API-Key}"
    TBucketLimit 100 1/h
</Location>
<Location /app/export.php>
    TBucketCost 10
</Location>
<Location /cgi-bin>
    TBucketEnable On
    TBucketKey "%%{HTTP:X-API-Key}"
    TBucketLimit 100 1/h
</Location>
"""


# PHP through mod_actions: N requests take N tokens, and PHP sees the
# decision under the exact names on the final request.
def test_module_003_01(apache_factory, redis_server):
    require(PHP_CGI, "php-cgi")
    a = apache_factory()
    a.start(BODY % (redis_server.url, "o1:"))
    rc = redis_server.client()
    for i in range(1, 6):
        r = http_get(a.url("/app/index.php"), {"X-API-Key": "php"})
        assert r.status_code == 200, r.text
        env = r.json()
        assert env["TBUCKET_DECISION"] == "allowed"
        assert env["TBUCKET_REMAINING"] == str(100 - i)
        assert env["REDIRECT_STATUS"] == "200"
        assert r.headers["X-RateLimit-Remaining"] == str(100 - i)
        assert tokens(rc, "o1:{php}") == 100 - i
    r = http_get(a.url("/app/export.php"), {"X-API-Key": "php"})
    assert r.json()["TBUCKET_REMAINING"] == "85"
    assert tokens(rc, "o1:{php}") == 85
    a.assert_log_clean()


# A CGI script is counted once and sees TBUCKET_DECISION and
# TBUCKET_REMAINING.
def test_module_003_02(apache_factory, redis_server):
    a = apache_factory()
    a.start(BODY % (redis_server.url, "o2:"))
    rc = redis_server.client()
    for i in range(1, 4):
        r = http_get(a.url("/cgi-bin/env.cgi"), {"X-API-Key": "cgi"})
        assert r.json() == {"TBUCKET_DECISION": "allowed",
                            "TBUCKET_REMAINING": str(100 - i),
                            "script": "env.cgi"}
    assert tokens(rc, "o2:{cgi}") == 97
    a.assert_log_clean()


# mod_dir's index sub-requests and its internal redirect to index.php
# count once.
def test_module_003_03(apache_factory, redis_server):
    require(PHP_CGI, "php-cgi")
    a = apache_factory()
    a.start(BODY % (redis_server.url, "o3:"))
    r = http_get(a.url("/app/"), {"X-API-Key": "dir"})
    assert r.status_code == 200
    assert r.json()["TBUCKET_DECISION"] == "allowed"
    assert tokens(redis_server.client(), "o3:{dir}") == 99
    a.assert_log_clean()


# An ErrorDocument redirect (404 -> a PHP page) counts once, and the error
# page sees the decision; a rejected PHP request never runs PHP and the
# access log records the decision.
def test_module_003_04(apache_factory, redis_server):
    require(PHP_CGI, "php-cgi")
    a = apache_factory()
    a.start(BODY % (redis_server.url, "o4:") + """
<Location /app>
    ErrorDocument 404 /app/index.php
</Location>
<Location /app/small>
    TBucketLimit 1 1/h
</Location>
""")
    rc = redis_server.client()
    r = http_get(a.url("/app/missing.php"), {"X-API-Key": "err"})
    assert r.status_code == 404
    assert r.json()["TBUCKET_DECISION"] == "allowed"
    assert tokens(rc, "o4:{err}") == 99
    assert http_get(a.url("/app/small/x.php"),
                    {"X-API-Key": "rj"}).status_code == 404
    r = http_get(a.url("/app/small/x.php"), {"X-API-Key": "rj"})
    assert r.status_code == 429
    assert r.json()["error"] == "rate limited"
    log = a.access_text(until=lambda t: "429 rejected" in t)
    assert "429 rejected /app/small/x.php" in log
    a.assert_log_clean()
