"""test_release.py -- a concurrency limit is given back before the
response's last byte leaves the server.

A client that sends each request only once it has the whole previous
answer must never be refused by a limit of 1: the slot of TBucketConcurrency
(a ZREM in Redis) and the place of TBucketLocalConcurrency (shared memory)
have to be free by then. Each test sends 300 such requests on fresh
connections (the next one can reach another worker while the first is
still finishing) and 300 on one kept-alive connection, to a Location that
answers 404, to a CGI and to a 404 answered by an ErrorDocument, and
fewer to PHP through Action (an internal redirect), to a redirect and
with no body (HEAD, 304), under prefork and event, and counts the
refusals: 429 from the shared limit, 503 from the local one."""
import http.client
import os
import time

import pytest

from tbtest.apache import PHP_CGI, http_get, metric
from tbtest.env import require

HELLO_CGI = r"""#!/bin/sh
printf 'Content-Type: text/plain\r\n\r\nhello %s\n' "$TBUCKET_DECISION"
"""

# One Location per limit (c: TBucketConcurrency, l: TBucketLocalConcurrency)
# and per kind of answer; the same CGI under two names, one per limit.
BODY = """
TBucketRedis {url} timeout=500
TBucketPrefix {prefix}
<Location /c/>
    TBucketEnable On
    TBucketConcurrency 1
</Location>
<Location /cgi-bin/c.cgi>
    TBucketEnable On
    TBucketConcurrency 1
</Location>
<Location /l/>
    TBucketEnable On
    TBucketLocalConcurrency 1
</Location>
<Location /cgi-bin/l.cgi>
    TBucketEnable On
    TBucketLocalConcurrency 1
</Location>
<Location /c/err/>
    ErrorDocument 404 /errdoc.html
</Location>
<Location /l/err/>
    ErrorDocument 404 /errdoc.html
</Location>
<LocationMatch "^/[cl]/moved">
    RewriteEngine On
    RewriteRule ^ /elsewhere [R=302,L]
</LocationMatch>
<Location /tbucket-status>
    SetHandler tbucket-status
</Location>
"""

# (method, path with {k} for the limit, status, a body that must be in
# the answer or None, requests per connection kind).
TARGETS = (
    ("GET", "/{k}/missing", 404, "Not Found", 300),
    ("GET", "/cgi-bin/{k}.cgi", 200, "hello allowed", 300),
    ("GET", "/{k}/err/missing", 404, "our error page", 300),
    ("GET", "/{k}/index.php", 200, '"script":"index.php"', 50),
    ("GET", "/{k}/moved", 302, "/elsewhere", 50),
    ("HEAD", "/{k}/missing", 404, None, 50),
    ("GET", "/{k}/ok.txt", 304, None, 50),
)
CGI_REQUESTS = 2 * 300


def start(apache_factory, redis_server, mpm):
    require(PHP_CGI, "php-cgi")
    a = apache_factory(mpm=mpm, servers=4)
    a.write_file("cgi-bin/c.cgi", HELLO_CGI, 0o755)
    a.write_file("cgi-bin/l.cgi", HELLO_CGI, 0o755)
    a.write_file("htdocs/errdoc.html", "our error page\n")
    with open(os.path.join(a.root, "htdocs/app/index.php")) as f:
        php = f.read()
    for k in ("c", "l"):
        a.write_file("htdocs/%s/ok.txt" % k, "ok\n")
        a.write_file("htdocs/%s/index.php" % k, php)
    return a.start(BODY.format(url=redis_server.url, prefix="rel:"))


def one(conn, method, path):
    """One request on conn; (status, body text)."""
    # Any current version matches *: the static file answers 304.
    headers = {"If-None-Match": "*"} if path.endswith(".txt") else {}
    conn.request(method, path, headers=headers)
    r = conn.getresponse()
    return r.status, r.read().decode(errors="replace")


def sequence(a, method, path, n, fresh):
    """n requests one after the other, each sent once the previous answer
    is read whole: each on a new connection (fresh) or all on one
    kept-alive connection (http.client opens another only when the
    server closed it). (statuses, bodies), in order. Bounded: every
    request has a 10 s timeout."""
    statuses, bodies = [], []
    conn = None
    for _ in range(n):
        if conn is None or fresh:
            conn = http.client.HTTPConnection("127.0.0.1", a.port,
                                              timeout=10)
        status, text = one(conn, method, path)
        statuses.append(status)
        bodies.append(text)
        if fresh:
            conn.close()
    conn.close()
    return statuses, bodies


# Sequential requests under a limit of 1 are never refused, whatever the
# answer and however they reach the server; every slot taken is given
# back, and an ErrorDocument's chain takes one.
@pytest.mark.slow
@pytest.mark.parametrize("mpm", ["prefork", "event"])
@pytest.mark.parametrize("kind", ["c", "l"])
def test_module_155_01(apache_factory, redis_server, mpm, kind):
    a = start(apache_factory, redis_server, mpm)
    wrong, sent = [], 0
    t0 = time.monotonic()
    for method, path, want, text, n in TARGETS:
        path = path.format(k=kind)
        for fresh in (True, False):
            statuses, bodies = sequence(a, method, path, n, fresh)
            sent += n
            odd = [s for s in statuses if s != want]
            if odd or (text and not all(text in b for b in bodies)):
                wrong.append("%s %s %s: %d of %d answered %s" % (
                    method, path, "fresh" if fresh else "kept-alive",
                    len(odd), n, sorted(set(odd))))
    took = time.monotonic() - t0
    assert not wrong, "\n".join(wrong) + "\n(%d requests in %.1f s)" % (
        sent, took)
    text = http_get(a.url("/tbucket-status")).text
    if kind == "c":
        ev = {e: metric(text, "tbucket_concurrency_slots_total",
                        vhost="127.0.0.1", event=e)
              for e in ("taken", "released", "refused", "release-failed")}
        assert ev["taken"] == ev["released"] == sent, ev
        assert ev["refused"] == ev["release-failed"] == 0, ev
        assert redis_server.client().keys("rel:*") == []
    else:
        for scope in ("<Location /l/>", "<Location /cgi-bin/l.cgi>"):
            assert metric(text, "tbucket_local_in_flight", scope=scope) == 0
        # The CGI's places are its own scope's.
        assert metric(text, "tbucket_local_taken_total",
                      scope="<Location /l/>") == sent - CGI_REQUESTS
        assert metric(text, "tbucket_local_taken_total",
                      scope="<Location /cgi-bin/l.cgi>") == CGI_REQUESTS
    a.assert_log_clean()
