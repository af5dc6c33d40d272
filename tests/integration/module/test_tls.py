"""test_module_tls.py -- the module over TLS to a real TLS redis-server.

TBucketRedis rediss://... with tls_ca, tls_cert and tls_key against a
Redis that asks for client certificates: Redis decides, under prefork and
event, with a key file readable by root only (the parent reads it before
the children drop to www-data), across a graceful restart. A failing
handshake is answered by the policy, logged once per breaker transition
with its reason and counted under kind "tls" on the status page.
tls_verify=off is warned about at startup. apache2 -t refuses a missing
or unreadable file, a certificate without its key, a key that does not
match, and tls_* options on a plaintext URL, naming the directive and the
file.
"""
import os
import stat
import time

import pytest

from tbtest.apache import http_get, metric

BREAKER_TAGS = ("TB00105",)


def body(url, opts, policy="closed", limit="TBucketLimit 3 1/h"):
    return """
TBucketRedis %s timeout=300 connect_timeout=300 %s
TBucketFailurePolicy %s
TBucketBreaker threshold=2 cooldown=30s
TBucketPrefix tls:
<Location /limited>
    TBucketEnable On
    %s
</Location>
<Location /tbucket-status>
    SetHandler tbucket-status
</Location>
""" % (url, opts, policy, limit)


def mtls(pki):
    return "tls_ca=%s tls_cert=%s tls_key=%s" % (
        pki.ca_pem, pki.client_pem, pki.client_key)


# Mutual TLS: Redis decides (three allowed, then 429) under prefork and
# event; the key is mode 0600 in a root-only directory, which no child
# (www-data) could read; a graceful restart reads the files again and
# goes on deciding with the same bucket.
@pytest.mark.parametrize("mpm", ["prefork", "event"])
def test_module_020_01(apache_factory, tls_redis, pki, mpm):
    assert stat.S_IMODE(os.stat(pki.client_key).st_mode) == 0o600
    r = tls_redis(auth_clients="yes")
    a = apache_factory(mpm=mpm, servers=1)
    a.start(body(r.url, mtls(pki)))
    got = [http_get(a.url("/limited/ok.txt")).status_code for _ in range(4)]
    assert got == [200, 200, 200, 429], got
    assert r.client().keys("tls:*")
    a.graceful()
    assert http_get(a.url("/limited/ok.txt")).status_code == 429
    text = http_get(a.url("/tbucket-status")).text
    assert metric(text, "tbucket_redis_errors_total", kind="tls",
                  redis="rediss://127.0.0.1:%d" % r.port,
                  policy="closed") == 0
    a.assert_log_clean()


# A server certificate the CA did not sign: the closed policy answers
# every request within the timeouts, the breaker's opening is logged once
# with kind and reason, and the status page counts kind "tls".
def test_module_020_02(apache_factory, tls_redis, pki):
    r = tls_redis()
    a = apache_factory(mpm="prefork", servers=1)
    a.start(body(r.url, "tls_ca=%s" % pki.other_ca_pem))
    for _ in range(5):
        t0 = time.monotonic()
        assert http_get(a.url("/limited/ok.txt")).status_code == 429
        assert time.monotonic() - t0 < 2.0
    log = a.read_log()
    assert 1 <= log.count("TB00105") <= 2, log
    assert ("(tls: tls handshake: certificate verify failed: "
            "self-signed certificate in certificate chain)") in log, log
    text = http_get(a.url("/tbucket-status")).text
    assert metric(text, "tbucket_redis_errors_total", kind="tls",
                  redis="rediss://127.0.0.1:%d" % r.port,
                  policy="closed") >= 2
    a.assert_log_clean(BREAKER_TAGS)


# tls_verify=off works (encryption without authentication) and is warned
# about once at startup, naming the Redis.
def test_module_020_03(apache_factory, tls_redis):
    r = tls_redis()
    a = apache_factory(servers=1)
    a.start(body(r.url, "tls_verify=off"))
    assert http_get(a.url("/limited/ok.txt")).status_code == 200
    log = a.read_log()
    assert log.count("TB00131") == 1, log
    assert ("TBucketRedis rediss://127.0.0.1:%d has tls_verify=off"
            % r.port) in log
    a.assert_log_clean(("TB00131",))


# apache2 -t refuses what cannot work, naming TBucketRedis, the setting
# and the file.
def test_module_020_04(apache_factory, pki, tmp_path):
    a = apache_factory()
    url = "rediss://127.0.0.1:6380"
    cases = [
        ("tls_ca=/nonexistent/ca.pem",
         "TBucketRedis: tls_ca '/nonexistent/ca.pem': No such file or "
         "directory"),
        ("tls_ca=%s" % tmp_path,
         "TBucketRedis: tls_ca '%s': Is a directory" % tmp_path),
        ("tls_ca=%s tls_cert=%s" % (pki.ca_pem, pki.client_pem),
         "TBucketRedis: tls_cert '%s': needs tls_key" % pki.client_pem),
        ("tls_cert=%s tls_key=/nonexistent/k.pem" % pki.client_pem,
         "TBucketRedis: tls_key '/nonexistent/k.pem': No such file"),
        ("tls_cert=%s tls_key=%s" % (pki.client_pem, pki.server_key),
         "TBucketRedis: tls_key '%s': does not match tls_cert '%s'"
         % (pki.server_key, pki.client_pem)),
        ("tls_verify=maybe", "TBucketRedis: bad tls_verify 'maybe'"),
        ("tls_server_name=a/b", "tls_server_name 'a/b'"),
    ]
    for opts, want in cases:
        rc, out = a.configtest("TBucketRedis %s %s\n" % (url, opts))
        assert rc != 0 and want in out, (opts, out)
    rc, out = a.configtest("TBucketRedis redis://127.0.0.1:6379 tls_ca=%s\n"
                           % pki.ca_pem)
    assert rc != 0 and "the tls_* options need a TLS URL" in out, out
    # A relative path is under ServerRoot.
    rc, out = a.configtest("TBucketRedis %s tls_ca=conf/nothere.pem\n" % url)
    assert rc != 0 and "'%s/conf/nothere.pem'" % a.root in out, out
    rc, out = a.configtest("TBucketRedis %s tls_ca=%s\n" % (url, pki.ca_pem))
    assert rc == 0, out
