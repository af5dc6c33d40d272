"""test_remoteip.py -- limits by client IP behind a load balancer.

Without a key (TBucketKey unset) a request is limited by its client IP,
which the module takes from r->useragent_ip: the address mod_remoteip
restores from X-Forwarded-For when the request came through a proxy it
trusts. Behind a trusted proxy each real client has its own bucket (an
IPv6 client its /64, TBucketIPv6Prefix); when the proxy is not trusted, a
forged X-Forwarded-For changes nothing and all requests share the
connecting address's bucket.
"""
from tbtest.apache import http_get


def conf(redis, proxy, extra=""):
    return """
LoadModule remoteip_module /usr/lib/apache2/modules/mod_remoteip.so
RemoteIPHeader X-Forwarded-For
RemoteIPInternalProxy %s
TBucketRedis %s timeout=1000
TBucketPrefix rip:
%s
<Location /limited>
    TBucketEnable On
    TBucketLimit 2 1/h
</Location>
""" % (proxy, redis.url, extra)


def codes(a, xff, n):
    return [http_get(a.url("/limited/ok.txt"),
                     {"X-Forwarded-For": xff}).status_code
            for _ in range(n)]


# test_module_140_01: behind a trusted proxy (loopback), clients named by
# X-Forwarded-For get two requests each from their own buckets, stored
# under their own addresses; an IPv6 client under its /64, so another
# address of the same /64 (a rotating client) finds the bucket empty,
# while the next /64 has its own.
def test_module_140_01(apache_factory, redis_server):
    a = apache_factory(mpm="event", servers=1)
    a.start(conf(redis_server, "127.0.0.1"))
    assert codes(a, "203.0.113.5", 3) == [200, 200, 429]
    assert codes(a, "203.0.113.6", 3) == [200, 200, 429]
    assert codes(a, "2001:db8:1:2::7", 2) == [200, 200]
    assert codes(a, "2001:db8:1:2:aaaa:bbbb:cccc:dddd", 1) == [429]
    assert codes(a, "2001:db8:1:3::7", 3) == [200, 200, 429]
    keys = sorted(k.decode() for k in redis_server.client().keys("rip:*"))
    assert keys == ["rip:ip:{2001:db8:1:2::/64}", "rip:ip:{2001:db8:1:3::/64}",
                    "rip:ip:{203.0.113.5}", "rip:ip:{203.0.113.6}"]
    a.assert_log_clean()


# test_module_140_03: TBucketIPv6Prefix 128 keys each IPv6 address; 48
# keys a whole site. apache2 -t refuses a length out of 1..128, naming
# the directive and the value.
def test_module_140_03(apache_factory, redis_server):
    a = apache_factory(mpm="event", servers=1)
    a.start(conf(redis_server, "127.0.0.1", "TBucketIPv6Prefix 128"))
    assert codes(a, "2001:db8:1:2::7", 3) == [200, 200, 429]
    assert codes(a, "2001:db8:1:2::8", 3) == [200, 200, 429]
    a.stop()
    redis_server.client().flushall()
    a.start(conf(redis_server, "127.0.0.1", "TBucketIPv6Prefix 48"))
    assert codes(a, "2001:db8:1:2::7", 1) + codes(a, "2001:db8:1:ff::1", 2) \
        == [200, 200, 429]
    keys = [k.decode() for k in redis_server.client().keys("rip:*")]
    assert keys == ["rip:ip:{2001:db8:1::/48}"]
    for bad in ("0", "129", "-1", "64x", "sixty-four"):
        rc, out = a.configtest(conf(redis_server, "127.0.0.1",
                                    "TBucketIPv6Prefix %s" % bad))
        assert rc != 0, bad
        assert "TBucketIPv6Prefix" in out and bad in out, out


# test_module_140_02: when the connecting address is not a trusted proxy,
# X-Forwarded-For is the client's own claim and is ignored: forged
# addresses share the real address's bucket.
def test_module_140_02(apache_factory, redis_server):
    a = apache_factory(mpm="event", servers=1)
    a.start(conf(redis_server, "192.0.2.1"))
    assert codes(a, "203.0.113.5", 1) + codes(a, "203.0.113.6", 2) == [
        200, 200, 429]
    keys = [k.decode() for k in redis_server.client().keys("rip:*")]
    assert keys == ["rip:ip:{127.0.0.1}"]
    a.assert_log_clean()
