"""test_config.py -- directives: parsing, refusal by apache2 -t, warnings,
and the merge of server and directory settings."""
import pytest

from tbtest.apache import assert_refused, http_get, tokens

FULL = """
TBucketRedis redis://127.0.0.1:6379 timeout=40 connect_timeout=80 pool=2
TBucketFailurePolicy local
TBucketReplicas 3
TBucketBreaker threshold=4 cooldown=2s
TBucketPrefix ok:
<Location /a>
    TBucketEnable On
    TBucketKey "%{HTTP:X-API-Key}"
    TBucketLimit 10 2.5/s
    TBucketCost 2
    TBucketTenant gold 100 10/m
    TBucketTenant silver 50 1/h
    TBucketRouteLimit export 20 1/m
    TBucketMode shadow
    TBucketHeaders both
</Location>
<If "%{REQUEST_METHOD} == 'POST'">
    TBucketCost 3
</If>
"""


# Every directive with a good value passes apache2 -t.
def test_module_001_01(apache_factory):
    a = apache_factory()
    rc, out = a.configtest(FULL)
    assert rc == 0, out
    assert "Syntax OK" in out
    assert "TB0" not in out


BAD = [
    ("TBucketAlgorithm leaky-bucket", "TBucketAlgorithm", "'leaky-bucket'"),
    # httpd's expression scanner would exit() on this; we refuse it first.
    ("TBucketKey \"%{HTTP:'X}\"", "TBucketKey", "%{HTTP:'X}"),
    ("TBucketLimit 1000000000 0.000001/s", "TBucketLimit",
     "'1000000000 0.000001/s'"),
    ("TBucketLimit 0 1/s", "TBucketLimit", "'0'"),
    ("TBucketLimit 10 -1/s", "TBucketLimit", "'-1/s'"),
    ("TBucketLimit 10 0/s", "TBucketLimit", "'0/s'"),
    ("TBucketLimit 10 fast", "TBucketLimit", "'fast'"),
    ("TBucketLimit 1.5 1/s", "TBucketLimit", "'1.5'"),
    ("TBucketCost -1", "TBucketCost", "'-1'"),
    ("TBucketMode loud", "TBucketMode", "'loud'"),
    ("TBucketHeaders fancy", "TBucketHeaders", "'fancy'"),
    ("TBucketTenant gold 0 1/s", "TBucketTenant", "'0'"),
    ("TBucketTenant gold 10 1/x", "TBucketTenant", "'1/x'"),
    ("TBucketRouteLimit bad{name} 5 1/s", "TBucketRouteLimit",
     "'bad{name}'"),
    ("TBucketRouteLimit export 5 never", "TBucketRouteLimit", "'never'"),
    ('TBucketKey "%{HTTP:X-API-Key"', "TBucketKey", "%{HTTP:X-API-Key"),
    ("TBucketEnable maybe", "TBucketEnable", ""),
]

BAD_SERVER = [
    ("TBucketFailurePolicy sometimes", "TBucketFailurePolicy",
     "'sometimes'"),
    ("TBucketRedis http://127.0.0.1:6379", "TBucketRedis",
     "'http://127.0.0.1:6379'"),
    ("TBucketRedis redis://127.0.0.1:notaport", "TBucketRedis",
     "redis://127.0.0.1:notaport"),
    ("TBucketRedis redis://127.0.0.1 timeout=0", "TBucketRedis", "'0'"),
    ("TBucketRedis redis://127.0.0.1 timeout=soon", "TBucketRedis",
     "'soon'"),
    ("TBucketRedis redis://127.0.0.1 pool=0", "TBucketRedis", "'0'"),
    ("TBucketRedis redis://127.0.0.1 retries=3", "TBucketRedis",
     "'retries=3'"),
    ("TBucketReplicas 0", "TBucketReplicas", "'0'"),
    ("TBucketBreaker threshold=0", "TBucketBreaker", "'0'"),
    ("TBucketBreaker cooldown=later", "TBucketBreaker", "'later'"),
    ("TBucketBreaker", "TBucketBreaker", ""),
    ("TBucketPrefix {x}", "TBucketPrefix", "'{x}'"),
    ("<Location /x>\nTBucketRedis redis://127.0.0.1\n</Location>",
     "TBucketRedis", "not allowed"),
    ("<Location /x>\nTBucketPrefix p:\n</Location>", "TBucketPrefix",
     "not allowed"),
]


# apache2 -t refuses each bad directory-scope value, naming directive and
# value.
@pytest.mark.parametrize("line,directive,value", BAD)
def test_module_001_02(apache_factory, line, directive, value):
    assert_refused(apache_factory(), "<Location /x>\nTBucketEnable On\n%s\n"
                   "</Location>\n" % line, directive, value)


# apache2 -t refuses each bad server-scope value, naming directive and
# value.
@pytest.mark.parametrize("line,directive,value", BAD_SERVER)
def test_module_001_03(apache_factory, line, directive, value):
    assert_refused(apache_factory(), line + "\n", directive, value)


# A bad Redis URL is refused without echoing its password.
def test_module_001_04(apache_factory):
    a = apache_factory()
    rc, out = a.configtest(
        "TBucketRedis redis://user:hunter2secret@127.0.0.1:99999\n")
    assert rc != 0, out
    assert "TBucketRedis" in out
    assert "hunter2secret" not in out


# A mistyped scheme is refused without echoing the password either.
@pytest.mark.parametrize("url", ["redis:/u:s3cretpw@h:6379",
                                 "rediss//u:s3cretpw@h",
                                 "u:s3cretpw@h:6379"])
def test_module_001_21(apache_factory, url):
    a = apache_factory()
    rc, out = a.configtest("TBucketRedis %s\n" % url)
    assert rc != 0, out
    assert "TBucketRedis" in out
    assert "s3cretpw" not in out, out


# A cost that can never fit its bucket is a warning at apache2 -t, also
# when limit and cost are set in different scopes.
def test_module_001_05(apache_factory):
    a = apache_factory()
    rc, out = a.configtest("""
TBucketEnable On
TBucketLimit 5 1/s
<Location /export>
    TBucketCost 10
</Location>
<Location /report>
    TBucketRouteLimit report 3 1/m
    TBucketCost 4
</Location>
""")
    assert rc == 0, out
    assert "TB00101" in out
    assert "TBucketCost 10 exceeds the capacity 5" in out
    assert "/export" in out
    assert "TBucketRouteLimit report" in out


# TBucketEnable On without any TBucketLimit is a warning, not an error.
def test_module_001_06(apache_factory):
    a = apache_factory()
    rc, out = a.configtest("<Location /x>\nTBucketEnable On\n</Location>\n")
    assert rc == 0, out
    assert "TB00101" in out and "without a TBucketLimit" in out


# A TBucketKey that spells out the client address is a warning naming the
# scope and the way out (leave the key unset); a key that only uses the
# address among other things, and a scope that is not enabled, are not.
def test_module_001_12(apache_factory):
    a = apache_factory()
    rc, out = a.configtest("""
<Location /x>
    TBucketEnable On
    TBucketKey "%{REMOTE_ADDR}"
    TBucketLimit 5 1/s
</Location>
<Location /y>
    TBucketEnable On
    TBucketKey "%{REMOTE_ADDR}-%{HTTP:X-App}"
    TBucketLimit 5 1/s
</Location>
<Location /z>
    TBucketKey "%{remote_addr}"
</Location>
""")
    assert rc == 0, out
    lines = [l for l in out.splitlines() if "REMOTE_ADDR" in l]
    assert len(lines) == 1, out
    assert "TB00101" in lines[0] and "/x" in lines[0], lines
    assert "leave TBucketKey unset" in lines[0], lines


# A virtual host inherits the main server's Redis and prefix unless it
# sets its own.
def test_module_001_07(apache_factory, redis_server):
    a = apache_factory()
    body = """
TBucketRedis %(url)s timeout=500
TBucketPrefix main:
<VirtualHost 127.0.0.1:%(port)d>
    ServerName one.test
    TBucketEnable On
    TBucketLimit 5 1/m
</VirtualHost>
<VirtualHost 127.0.0.1:%(port)d>
    ServerName two.test
    TBucketPrefix two:
    TBucketEnable On
    TBucketLimit 5 1/m
</VirtualHost>
""" % {"url": redis_server.url, "port": a.port}
    a.start(body)
    assert http_get(a.url("/ok.txt"), {"Host": "one.test"}).status_code == 200
    assert http_get(a.url("/ok.txt"), {"Host": "two.test"}).status_code == 200
    rc = redis_server.client()
    assert tokens(rc, "main:ip:{127.0.0.1}") == 4
    assert tokens(rc, "two:ip:{127.0.0.1}") == 4
    a.assert_log_clean()


# Directory settings merge outer to inner: an inner <Location> that sets
# only a cost keeps the outer key and limit; TBucketEnable Off switches it
# off; routes of outer and inner scopes are all taken.
def test_module_001_08(apache_factory, redis_server):
    a = apache_factory()
    a.start("""
TBucketRedis %s timeout=500
TBucketPrefix m8:
<Location /deep>
    TBucketEnable On
    TBucketKey "%%{HTTP:X-API-Key}"
    TBucketLimit 50 1/h
    TBucketRouteLimit outer 40 1/h
</Location>
<Location /deep/inner>
    TBucketCost 3
    TBucketRouteLimit inner 30 1/h
</Location>
<Location /free>
    TBucketEnable On
    TBucketLimit 50 1/h
</Location>
<Location /free/ok.txt>
    TBucketEnable Off
</Location>
""" % redis_server.url)
    rc = redis_server.client()
    r = http_get(a.url("/deep/inner/ok.txt"), {"X-API-Key": "k8"})
    assert r.status_code == 200
    assert tokens(rc, "m8:{k8}") == 47
    assert tokens(rc, "m8:{k8}:route:outer") == 37
    assert tokens(rc, "m8:{k8}:route:inner") == 27
    r = http_get(a.url("/deep/ok.txt"), {"X-API-Key": "k8"})
    assert tokens(rc, "m8:{k8}") == 46
    assert tokens(rc, "m8:{k8}:route:inner") == 27
    r = http_get(a.url("/free/ok.txt"))
    assert r.status_code == 200
    assert "X-RateLimit-Limit" not in r.headers
    assert rc.keys("m8:*127.0.0.1*") == []
    a.assert_log_clean()


# .htaccess under AllowOverride Limit may set the limit of its directory.
def test_module_001_09(apache_factory, redis_server):
    a = apache_factory()
    a.write_file("htdocs/b/.htaccess",
                 "TBucketEnable On\nTBucketLimit 2 1/h\n")
    a.start("TBucketRedis %s timeout=500\nTBucketPrefix m9:\n"
            % redis_server.url)
    codes = [http_get(a.url("/b/ok.txt")).status_code for _ in range(3)]
    assert codes == [200, 200, 429]
    a.assert_log_clean()


# A key expression on REMOTE_USER is evaluated after authentication.
def test_module_001_10(apache_factory, redis_server):
    import base64
    import hashlib
    a = apache_factory()
    a.write_file("conf/htpasswd", "alice:{SHA}%s\n" % base64.b64encode(
        hashlib.sha1(b"pw").digest()).decode())
    a.start("""
LoadModule auth_basic_module /usr/lib/apache2/modules/mod_auth_basic.so
LoadModule authn_core_module /usr/lib/apache2/modules/mod_authn_core.so
LoadModule authn_file_module /usr/lib/apache2/modules/mod_authn_file.so
LoadModule authz_user_module /usr/lib/apache2/modules/mod_authz_user.so
TBucketRedis %s timeout=500
TBucketPrefix m10:
<Location /a>
    AuthType Basic
    AuthName test
    AuthUserFile %s/conf/htpasswd
    Require valid-user
    TBucketEnable On
    TBucketKey "%%{REMOTE_USER}"
    TBucketLimit 5 1/h
</Location>
""" % (redis_server.url, a.root))
    r = http_get(a.url("/a/ok.txt"), auth=("alice", "pw"))
    assert r.status_code == 200
    assert tokens(redis_server.client(), "m10:{alice}") == 4
    a.assert_log_clean()


# More named limits than one decision can take, across scopes, is a
# warning naming the section and the limits dropped (the outermost),
# whichever spelling declared them.
def test_module_001_11(apache_factory):
    a = apache_factory()
    outer = "\n".join("TBucketRouteLimit r%d 5 1/s" % i for i in range(10))
    inner = "\n".join("TBucketLimit s%d 5 1/s" % i for i in range(4)) + \
        '\nTBucketRule u1 "%{REMOTE_ADDR}" 5 1/s' + \
        '\nTBucketRule u2 "%{REMOTE_ADDR}" 5 1/s'
    rc, out = a.configtest("TBucketEnable On\nTBucketLimit 5 1/s\n%s\n"
                           "<Location /many>\n%s\n</Location>\n"
                           % (outer, inner))
    assert rc == 0, out
    assert "more than 15 named limits apply in <Location /many>: the " \
        "outermost (r0) are dropped there" in out, out
    rc, out = a.configtest("TBucketEnable On\nTBucketLimit 5 1/s\n%s\n"
                           "<Location /many>\n%s\n</Location>\n"
                           % (outer, "\n".join(inner.split("\n")[:5])))
    assert rc == 0 and "named limits apply" not in out, out


# TBucketAlgorithm sliding-log with a capacity the log cannot hold is a
# warning at apache2 -t (the limit and the algorithm in different scopes).
def test_module_001_20(apache_factory):
    a = apache_factory()
    rc, out = a.configtest("""
TBucketEnable On
TBucketLimit 200000 100/s
<Location /log>
    TBucketAlgorithm sliding-log
</Location>
""")
    assert rc == 0, out
    assert "sliding-log" in out and "100000" in out, out
