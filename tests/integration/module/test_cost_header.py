"""test_cost_header.py -- TBucketCostHeader in a real Apache against
a real Redis: the application reports what a request really cost (a CGI
script, PHP through php-cgi via Action, a proxied backend, a mod_lua note
set after the body) and the difference from the charged cost is settled
on every bucket the request was charged to, after the response; the
header never reaches the client.

The settlement runs in log_transaction, after the last byte went out, so
the tests wait (bounded) for Redis or the status page to show it.
"""
import time

from tbtest.apache import (PHP_CGI, http_get, metric, metric_sum, tokens,
                           wait_until)
from tbtest.core import info_commandstats
from tbtest.env import require

HDR = "X-Request-Cost"

# A CGI script that reports the cost given in its query string (percent
# decoded); "redir=PATH" answers with a local Location instead, which
# httpd follows as an internal redirect.
COST_CGI = r"""#!/usr/bin/python3
import os, sys, urllib.parse
q = urllib.parse.parse_qs(os.environ.get("QUERY_STRING", ""),
                          keep_blank_values=True)
out = sys.stdout
if "redir" in q:
    out.write("Location: %s\r\n\r\n" % q["redir"][0])
    sys.exit(0)
out.write("Content-Type: text/plain\r\n")
if "cost" in q:
    out.write("X-Request-Cost: %s\r\n" % q["cost"][0])
out.write("\r\ncgi done\n")
"""

# The README's example: an export that charges one token per 100 rows.
ROWS_PHP = r"""<?php
$rows = isset($_GET['rows']) ? intval($_GET['rows']) : 0;
header('X-Request-Cost: ' . max(1, (int)ceil($rows / 100)));
header('Content-Type: text/plain');
echo "exported $rows rows\n";
"""

# mod_lua: the note is set after the body has gone out.
NOTE_LUA = r"""
function handle(r)
  r.content_type = "text/plain"
  r:puts("streamed\n")
  r:flush()
  local args = r:parseargs()
  r.notes["tbucket-cost"] = args["cost"] or "0"
  return apache2.OK
end
"""


def conf(redis, a):
    return """
LoadModule lua_module /usr/lib/apache2/modules/mod_lua.so
LoadModule proxy_module /usr/lib/apache2/modules/mod_proxy.so
LoadModule proxy_http_module /usr/lib/apache2/modules/mod_proxy_http.so
TBucketRedis %(url)s timeout=500
TBucketPrefix c:
ScriptAlias /backend/ "%(root)s/cgi-bin/"
AddHandler lua-script .lua
<Location /cgi-bin>
    TBucketEnable On
    TBucketKey "%%{HTTP:X-Key}"
    TBucketLimit 100 1/h
    TBucketCost 10
    TBucketCostHeader %(hdr)s
</Location>
<Location /cgi-bin/route.cgi>
    TBucketRouteLimit export 50 1/h
</Location>
<Location /cgi-bin/plain.cgi>
    TBucketCostHeader Off
</Location>
<Location /cgi-bin/debt.cgi>
    TBucketLimit 10 1/s
    TBucketCost 1
</Location>
<Location /cgi-bin/shadow.cgi>
    TBucketLimit 10 1/h
    TBucketCost 1
    TBucketMode shadow
</Location>
<Location /cgi-bin/gcra.cgi>
    TBucketAlgorithm gcra
    TBucketLimit 10 1/s
    TBucketCost 1
</Location>
<Location /cgi-bin/window.cgi>
    TBucketAlgorithm fixed-window
    TBucketLimit 10 1/h
    TBucketCost 1
</Location>
<Location /cgi-bin/missing>
    ErrorDocument 404 /cgi-bin/cost.cgi?cost=7
</Location>
<Location /app>
    TBucketEnable On
    TBucketKey "%%{HTTP:X-Key}"
    TBucketLimit 1000 1/h
    TBucketCost 5
    TBucketCostHeader %(hdr)s
</Location>
<Location /lua>
    TBucketEnable On
    TBucketKey "%%{HTTP:X-Key}"
    TBucketLimit 100 1/h
    TBucketCost 2
    TBucketCostHeader %(hdr)s
</Location>
<Location /proxied>
    TBucketEnable On
    TBucketKey "%%{HTTP:X-Key}"
    TBucketLimit 100 1/h
    TBucketCost 10
    TBucketCostHeader %(hdr)s
    ProxyPass http://127.0.0.1:%(port)d/backend
</Location>
<Location /tbucket-status>
    SetHandler tbucket-status
</Location>
""" % {"url": redis.url, "root": a.root, "hdr": HDR, "port": a.port}


def start(apache_factory, redis_server):
    a = apache_factory(mpm="prefork", servers=2,
                       log_level="warn tbucket:debug")
    for name in ("cost", "route", "plain", "debt", "shadow", "gcra",
                 "window", "redir"):
        a.write_file("cgi-bin/%s.cgi" % name, COST_CGI, 0o755)
    a.write_file("htdocs/app/rows.php", ROWS_PHP)
    a.write_file("htdocs/lua/note.lua", NOTE_LUA)
    return a.start(conf(redis_server, a))


def calls(r):
    s = info_commandstats(r)
    return s.get("evalsha", 0) + s.get("eval", 0)


def get(a, path, key, **kw):
    return http_get(a.url(path), {"X-Key": key}, **kw)


def status(a, name):
    return metric_sum(http_get(a.url("/tbucket-status")).text, name)


def done(a):
    """Reports handled so far: valid ones plus ignored ones."""
    return (status(a, "tbucket_cost_reports_total")
            + status(a, "tbucket_cost_invalid_total"))


# Debit and refund on the main bucket, exactly once each; the same cost
# or no report makes no extra call; the header never reaches the client.
def test_module_cost_01(apache_factory, redis_server):
    a = start(apache_factory, redis_server)
    r = redis_server.client()
    resp = get(a, "/cgi-bin/cost.cgi?cost=12", "k1")
    assert resp.status_code == 200 and HDR not in resp.headers
    assert resp.headers["X-RateLimit-Remaining"] == "90"
    assert wait_until(lambda: tokens(r, "c:{k1}") == 88)
    resp = get(a, "/cgi-bin/cost.cgi?cost=3", "k1")
    assert resp.headers["X-RateLimit-Remaining"] == "78"
    assert wait_until(lambda: tokens(r, "c:{k1}") == 85)
    assert wait_until(lambda: done(a) == 2)
    before = calls(r)
    get(a, "/cgi-bin/cost.cgi?cost=10", "k1")
    get(a, "/cgi-bin/cost.cgi?cost=%2010.0%09", "k1")
    get(a, "/cgi-bin/cost.cgi", "k1")
    assert wait_until(lambda: done(a) == 4)
    time.sleep(0.2)
    assert calls(r) - before == 3
    assert tokens(r, "c:{k1}") == 55
    # Fractional costs settle exactly.
    get(a, "/cgi-bin/cost.cgi?cost=10.25", "k1")
    assert wait_until(lambda: tokens(r, "c:{k1}") == 44.75)
    # (counted once Redis has answered: a moment after the tokens moved)
    assert wait_until(lambda: status(a, "tbucket_cost_settled_total") == 3)
    assert status(a, "tbucket_cost_tokens_debited_total") == 2
    assert status(a, "tbucket_cost_tokens_refunded_total") == 7
    html = http_get(a.url("/tbucket-status?view=html")).text
    assert 'data-metric="tbucket_cost_settled_total"' in html
    a.assert_log_clean()


# Junk is ignored: a debug line, a count on the status page, no call; the
# header is still taken out of the response.
def test_module_cost_02(apache_factory, redis_server):
    a = start(apache_factory, redis_server)
    r = redis_server.client()
    junk = ["abc", "-5", "1e3", "5,7", "0x10", "1000000001", "inf", "nan",
            "1.", ".5", "%2B3", "12abc", "", "99999999999"]
    a.mark_log()
    for i, v in enumerate(junk):
        resp = get(a, "/cgi-bin/cost.cgi?cost=" + v, "k2-%d" % i)
        assert resp.status_code == 200 and HDR not in resp.headers, v
    assert wait_until(lambda: status(a, "tbucket_cost_invalid_total")
                      == len(junk))
    assert status(a, "tbucket_cost_settled_total") == 0
    assert calls(r) == len(junk)
    for i in range(len(junk)):
        assert tokens(r, "c:{k2-%d}" % i) == 90
    assert a.log_since_mark().count("TB00401") == len(junk)
    a.assert_log_clean()


# Route buckets settle with the main bucket, in the same call; without
# the directive (Off here) the header is the application's business.
def test_module_cost_03(apache_factory, redis_server):
    a = start(apache_factory, redis_server)
    r = redis_server.client()
    get(a, "/cgi-bin/route.cgi?cost=30", "k3")
    assert wait_until(lambda: tokens(r, "c:{k3}:route:export") == 20)
    assert tokens(r, "c:{k3}") == 70
    before = calls(r)
    get(a, "/cgi-bin/route.cgi?cost=4", "k3")
    assert wait_until(lambda: tokens(r, "c:{k3}:route:export") == 16)
    assert tokens(r, "c:{k3}") == 66
    assert calls(r) - before == 2
    resp = get(a, "/cgi-bin/plain.cgi?cost=40", "k3p")
    assert resp.headers[HDR] == "40"
    time.sleep(0.3)
    assert tokens(r, "c:{k3p}") == 90
    assert wait_until(lambda: status(a, "tbucket_cost_reports_total") == 2)
    a.assert_log_clean()


# PHP through Action (an internal redirect to php-cgi) reports by rows;
# mod_lua's note, set after the body, settles too; a proxied backend's
# header is settled at the proxy and hidden from the client.
def test_module_cost_04(apache_factory, redis_server):
    require(PHP_CGI, "php-cgi")
    a = start(apache_factory, redis_server)
    r = redis_server.client()
    resp = get(a, "/app/rows.php?rows=2500", "k4")
    assert resp.status_code == 200 and "2500 rows" in resp.text
    assert HDR not in resp.headers
    assert resp.headers["X-RateLimit-Remaining"] == "995"
    assert wait_until(lambda: tokens(r, "c:{k4}") == 975)
    get(a, "/app/rows.php?rows=20", "k4")
    assert wait_until(lambda: tokens(r, "c:{k4}") == 974)
    resp = get(a, "/lua/note.lua?cost=9", "k4l")
    assert resp.text == "streamed\n"
    assert wait_until(lambda: tokens(r, "c:{k4l}") == 91)
    resp = get(a, "/proxied/cost.cgi?cost=25", "k4p")
    assert resp.status_code == 200 and resp.text == "cgi done\n"
    assert HDR not in resp.headers
    assert wait_until(lambda: tokens(r, "c:{k4p}") == 75)
    a.assert_log_clean()


# A debt floors at -capacity; while it lasts requests are refused with a
# Retry-After that covers it, the key lives until it is paid, and a
# refused request settles nothing.
def test_module_cost_05(apache_factory, redis_server):
    a = start(apache_factory, redis_server)
    r = redis_server.client()
    get(a, "/cgi-bin/debt.cgi?cost=1000", "k5")
    assert wait_until(lambda: (tokens(r, "c:{k5}") or 0) <= -9.9)
    assert 19000 < r.pttl("c:{k5}") <= 21000
    before = calls(r)
    resp = get(a, "/cgi-bin/debt.cgi?cost=500", "k5")
    assert resp.status_code == 429 and HDR not in resp.headers
    assert int(resp.headers["Retry-After"]) in (10, 11)
    time.sleep(0.3)
    assert calls(r) - before == 1
    assert tokens(r, "c:{k5}") <= -9.0
    a.assert_log_clean()


# Shadow mode settles what it admitted, into debt too, and counts what it
# would have refused as unsettled; GCRA settles its TAT; a window
# algorithm keeps its charge.
def test_module_cost_06(apache_factory, redis_server):
    a = start(apache_factory, redis_server)
    r = redis_server.client()
    get(a, "/cgi-bin/shadow.cgi?cost=100", "k6")
    assert wait_until(lambda: tokens(r, "c:{k6}") == -10)
    resp = get(a, "/cgi-bin/shadow.cgi?cost=5", "k6")
    assert resp.status_code == 200 and HDR not in resp.headers
    assert wait_until(lambda: status(a, "tbucket_cost_unsettled_total") == 1)
    assert tokens(r, "c:{k6}") == -10
    text = http_get(a.url("/tbucket-status")).text
    assert metric(text, "tbucket_decisions_total",
                  outcome="shadow-rejected") == 1
    t0 = time.time() * 1000
    get(a, "/cgi-bin/gcra.cgi?cost=6", "k6g")
    # Six tokens at 1/s: the TAT is 6 s ahead.
    assert wait_until(lambda: r.exists("c:{k6g}:gcra")
                      and float(r.get("c:{k6g}:gcra")) - t0 > 5500)
    resp = get(a, "/cgi-bin/window.cgi?cost=9", "k6w")
    assert HDR not in resp.headers
    assert wait_until(lambda: status(a, "tbucket_cost_unsettled_total") == 2)
    assert r.hget("c:{k6w}:fwin", "n") == b"1"
    a.assert_log_clean()


# A chain of internal redirects settles once, from the final response: a
# CGI's local Location, and an ErrorDocument served by a CGI.
def test_module_cost_07(apache_factory, redis_server):
    a = start(apache_factory, redis_server)
    r = redis_server.client()
    resp = get(a, "/cgi-bin/redir.cgi?redir=/cgi-bin/cost.cgi%3Fcost%3D4",
               "k7")
    assert resp.status_code == 200 and resp.text == "cgi done\n"
    assert HDR not in resp.headers
    assert wait_until(lambda: tokens(r, "c:{k7}") == 96)
    resp = get(a, "/cgi-bin/missing/x", "k7e")
    assert resp.status_code == 404 and HDR not in resp.headers
    assert wait_until(lambda: tokens(r, "c:{k7e}") == 93)
    assert wait_until(lambda: status(a, "tbucket_cost_settled_total") == 2)
    time.sleep(0.2)
    assert status(a, "tbucket_cost_settled_total") == 2
    assert tokens(r, "c:{k7}") == 96
    # mod_cgi logs the missing script behind the 404.
    a.assert_log_clean(allowed=("AH02811",))


# The directive's values: apache2 -t refuses a name that is no header
# name, accepts Off, and warns where the algorithm cannot settle.
def test_module_cost_08(apache_factory):
    a = apache_factory()
    for bad in ("'X Cost'", "X:Cost", "\"\"", "X(Cost)"):
        rc, out = a.configtest("<Location /x>\nTBucketCostHeader %s\n"
                               "</Location>\n" % bad)
        assert rc != 0 and "TBucketCostHeader" in out, (bad, out)
    rc, out = a.configtest("<Location /x>\nTBucketCostHeader X-Cost\n"
                           "</Location>\n<Location /x/y>\n"
                           "TBucketCostHeader Off\n</Location>\n")
    assert rc == 0 and "TB0" not in out, out
    # A window algorithm cannot settle: a warning, not a refusal.
    rc, out = a.configtest("<Location /x>\nTBucketLimit 10 1/s\n"
                           "TBucketAlgorithm sliding-log\n"
                           "TBucketCostHeader X-Cost\n</Location>\n")
    assert rc == 0 and "TB00101" in out and "not settled" in out, out
