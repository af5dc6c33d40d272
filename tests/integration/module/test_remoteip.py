"""test_remoteip.py -- limits by client IP behind a load balancer.

Without a key (TBucketKey unset) a request is limited by its client IP,
which the module takes from r->useragent_ip: the address mod_remoteip
restores from X-Forwarded-For when the request came through a proxy it
trusts. Behind a trusted proxy each real client has its own bucket; when
the proxy is not trusted, a forged X-Forwarded-For changes nothing and all
requests share the connecting address's bucket.
"""
from tbtest.apache import http_get


def conf(redis, proxy):
    return """
LoadModule remoteip_module /usr/lib/apache2/modules/mod_remoteip.so
RemoteIPHeader X-Forwarded-For
RemoteIPInternalProxy %s
TBucketRedis %s timeout=1000
TBucketPrefix rip:
<Location /limited>
    TBucketEnable On
    TBucketLimit 2 1/h
</Location>
""" % (proxy, redis.url)


def codes(a, xff, n):
    return [http_get(a.url("/limited/ok.txt"),
                     {"X-Forwarded-For": xff}).status_code
            for _ in range(n)]


# test_module_140_01: behind a trusted proxy (loopback), two clients named
# by X-Forwarded-For get two requests each from their own buckets, stored
# under their own addresses.
def test_module_140_01(apache_factory, redis_server):
    a = apache_factory(mpm="event", servers=1)
    a.start(conf(redis_server, "127.0.0.1"))
    assert codes(a, "203.0.113.5", 3) == [200, 200, 429]
    assert codes(a, "203.0.113.6", 3) == [200, 200, 429]
    assert codes(a, "2001:db8::7", 3) == [200, 200, 429]
    keys = sorted(k.decode() for k in redis_server.client().keys("rip:*"))
    assert keys == ["rip:ip:{2001:db8::7}", "rip:ip:{203.0.113.5}",
                    "rip:ip:{203.0.113.6}"]
    a.assert_log_clean()


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
