"""test_http2.py -- the module behind mod_http2: requests that arrive as
HTTP/2 streams (h2c with prior knowledge, as a TLS-terminating proxy or a
modern client speaks to a legacy PHP server) are limited, answered with
429 and the rate-limit headers, and give their concurrency slot back
when the stream ends, as HTTP/1.1 requests do.

Here a second stream on one h2c connection (curl 7.88, sequential or
-Z) failed with "Error in the HTTP2 framing layer" just the same without
the module, so each request is its own curl run, its own connection.
"""
import json
import subprocess

from tbtest.apache import http_get, metric, wait_until
from tbtest.env import require

CURL = "/usr/bin/curl"


def conf(redis):
    return """
LoadModule http2_module /usr/lib/apache2/modules/mod_http2.so
Protocols h2c http/1.1
TBucketRedis %s timeout=1000
TBucketPrefix h2:
<Location /limited>
    TBucketEnable On
    TBucketKey "%%{HTTP:X-Key}"
    TBucketLimit 3 1/h
</Location>
<Location /a>
    TBucketEnable On
    TBucketKey "%%{HTTP:X-Key}"
    TBucketLimit 1000 1/h
    TBucketConcurrency 1
</Location>
<Location /tbucket-status>
    SetHandler tbucket-status
</Location>
""" % redis.url


def h2_get(url, key):
    """One GET over HTTP/2 (h2c, prior knowledge): (version, status,
    headers with lower-case names, body)."""
    p = subprocess.run([require(CURL, "curl"), "-sS", "-i",
                        "--http2-prior-knowledge", "--max-time", "10",
                        "-H", "X-Key: " + key, url],
                       capture_output=True, text=True, timeout=30)
    assert p.returncode == 0, p.stderr
    head, _, body = p.stdout.replace("\r\n", "\n").partition("\n\n")
    lines = head.split("\n")
    version, status = lines[0].split()[:2]
    headers = dict((k.strip().lower(), v.strip()) for k, v in
                   (l.split(":", 1) for l in lines[1:] if ":" in l))
    return version, int(status), headers, body


# test_module_130_01: three requests of one key over HTTP/2 pass with the
# rate-limit headers, the fourth is refused with 429, Retry-After and the
# JSON body; another key is untouched.
def test_module_130_01(apache_factory, redis_server):
    a = apache_factory(mpm="event", servers=1)
    a.start(conf(redis_server))
    for left in (2, 1, 0):
        v, status, h, _ = h2_get(a.url("/limited/ok.txt"), "k")
        assert (v, status) == ("HTTP/2", 200)
        assert (h["x-ratelimit-limit"], h["x-ratelimit-remaining"]) == (
            "3", str(left))
    v, status, h, body = h2_get(a.url("/limited/ok.txt"), "k")
    assert (v, status) == ("HTTP/2", 429)
    assert int(h["retry-after"]) > 1000
    assert json.loads(body)["error"]
    assert h2_get(a.url("/limited/ok.txt"), "other")[1] == 200
    a.assert_log_clean()


# test_module_130_02: with at most one request of a key in flight, twenty
# HTTP/2 requests one after another are all admitted: each stream took a
# slot and gave it back when it ended, and no slot is left in Redis.
def test_module_130_02(apache_factory, redis_server):
    a = apache_factory(mpm="event", servers=1)
    a.start(conf(redis_server))
    got = [h2_get(a.url("/a/ok.txt"), "c")[1] for _ in range(20)]
    assert got == [200] * 20
    def events():
        text = http_get(a.url("/tbucket-status")).text
        return {e: metric(text, "tbucket_concurrency_slots_total",
                          vhost="127.0.0.1", event=e)
                for e in ("taken", "released", "refused")}

    # The last stream's slot goes back as its pool is destroyed, just
    # after curl has its response.
    want = {"taken": 20, "released": 20, "refused": 0}
    assert wait_until(lambda: events() == want), events()
    assert redis_server.client().keys("h2:*conc*") == []
    a.assert_log_clean()
