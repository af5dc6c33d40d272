"""test_hostile_apache.py -- hostile client keys through Apache and the module:
a 1 MB X-API-Key (LimitRequestFieldSize raised to allow it), braces, '%'
sequences, bytes that are not UTF-8, a key that imitates a hashed key, an empty
key (falls back to the client IP), a NUL (refused by httpd itself), a cost
above the capacity. No child crashes, every Redis key keeps the prefix{...}
shape, and the victim's bucket does not move."""
import re

from tbtest.core import redis_key
from tbtest.load import http_head
from tbtest.proof import crash_lines

SAFE_KEY = re.compile(rb"^ha:(ip:)?\{([\x21-\x7a\x7c\x7e]{1,128}|#[0-9a-f]{32})\}"
                      rb"(:route:[A-Za-z0-9_.-]{1,64})?$")

BODY = """
LimitRequestFieldSize 1100000
LimitRequestLine 16384
TBucketRedis %s timeout=2000
TBucketPrefix ha:
<Location /limited>
    TBucketEnable On
    TBucketKey "%%{HTTP:X-API-Key}"
    TBucketLimit 5 1/h
</Location>
<Location /api/export>
    TBucketEnable On
    TBucketKey "%%{HTTP:X-API-Key}"
    TBucketLimit 5 1/h
    TBucketCost 10
</Location>
"""

HOSTILE = [
    b"a" * (1 << 20),
    b"{victim}",
    b"victim}",
    b"}{",
    b"%00",
    b"%25%30%30",
    b"victim%0d%0a",
    b"%s%s%n",
    b"\xff\xfe\xfd",
    b"\xc3\x28",
    b"vict\xc4\xb1m",
    b"#" + b"0" * 32,
    b"#victim",
    b"vic tim",
]


def raw_get(port, path, key, timeout=20):
    """One request with the key's exact bytes; (status, headers text)."""
    req = (b"GET " + path.encode() + b" HTTP/1.1\r\nHost: x\r\n"
           + (b"X-API-Key: " + key + b"\r\n" if key is not None else b"")
           + b"Connection: close\r\n\r\n")
    head = http_head(port, req, timeout)
    return int(head.split(" ", 2)[1]), head


def remaining(head):
    m = re.search(r"(?im)^X-RateLimit-Remaining: *(\d+)", head)
    return int(m.group(1)) if m else None


# test_hostile_002_01: hostile keys through Apache land on their own
# sanitised buckets; the victim's bucket and the IP bucket do not move.
def test_hostile_002_01(apache_factory, redis_server):
    r = redis_server.client()
    a = apache_factory(servers=2)
    a.start(BODY % redis_server.url)
    for _ in range(3):
        assert raw_get(a.port, "/limited/ok.txt", b"victim")[0] == 200
    victim = redis_key("ha:", "victim")
    before = r.hgetall(victim)
    for key in HOSTILE:
        st, head = raw_get(a.port, "/limited/ok.txt", key)
        assert st == 200, (key[:40], head)
        assert remaining(head) == 4, (key[:40], head)
        assert r.exists(redis_key("ha:", key)), key[:40]
    # an empty header and no header: both the client IP's bucket, under
    # its own "<prefix>ip:" namespace
    assert remaining(raw_get(a.port, "/limited/ok.txt", b"")[1]) == 4
    assert remaining(raw_get(a.port, "/limited/ok.txt", None)[1]) == 3
    assert r.exists(redis_key("ha:ip:", "127.0.0.1"))
    # NUL and other control bytes in a header are refused by httpd
    # (HttpProtocolOptions Strict) before the module runs
    for key in (b"victim\x00x", b"victim\x7f", b"\x01victim"):
        st, _ = raw_get(a.port, "/limited/ok.txt", key)
        assert st == 400, key
    # a cost (10) above the capacity (5): a clear refusal, no deduction
    st, head = raw_get(a.port, "/api/export/ok.txt", b"victim")
    assert st not in (200, 429), head
    assert r.hgetall(victim) == before, "the victim's bucket moved"
    keys = list(r.scan_iter(match="ha:*", count=1000))
    bad = [k for k in keys if not SAFE_KEY.match(k)]
    assert not bad, bad[:5]
    assert len(keys) == len(HOSTILE) + 2
    assert not crash_lines(a), crash_lines(a)
