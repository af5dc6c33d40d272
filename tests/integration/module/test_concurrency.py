"""test_module_concurrency.py -- TBucketConcurrency: at most N requests of
one key in flight across every server sharing the Redis.

Slow requests are a CGI script that sleeps (bounded by `timeout`) and a
PHP page run through mod_actions. Each test reads the slot set in Redis
("<prefix>{<key>}:conc") and the status page: a slot taken is released
exactly once, whatever the end of the request, so after every test the
set is empty and the slots released equal the slots taken."""
import concurrent.futures
import os
import signal
import socket
import time

import pytest
import requests

from tbtest.apache import PHP_CGI, http_get, metric
from tbtest.env import free_port, require, wait_until

SLOW_CGI = r"""#!/bin/sh
# slow.cgi?SECONDS: answers after sleeping that long (at most 10 s).
s=${QUERY_STRING:-1}
case "$s" in *[!0-9.]*) s=1 ;; esac
timeout 10 sleep "$s"
printf 'Content-Type: text/plain\r\n\r\nslept %s %s\n' "$s" "$TBUCKET_DECISION"
"""

FAIL_CGI = r"""#!/bin/sh
printf 'Status: 500 Internal Server Error\r\n'
printf 'Content-Type: text/plain\r\n\r\nboom\n'
"""

SLOW_PHP = r"""<?php
usleep(min((int)($_GET['ms'] ?? 0), 5000) * 1000);
echo getenv('TBUCKET_DECISION'), "\n";
"""

HTACCESS = """TBucketEnable On
TBucketKey "%{HTTP:X-API-Key}"
TBucketConcurrency 1
"""

STATUS = """
<Location /tbucket-status>
    SetHandler tbucket-status
    TBucketEnable Off
</Location>
"""


def body(redis_url, prefix, scope, extra="", server=""):
    return """
TBucketRedis %s timeout=500
TBucketPrefix %s
%s
<Location /cgi-bin>
    TBucketEnable On
    TBucketKey "%%{HTTP:X-API-Key}"
    %s
</Location>
<Location /app>
    TBucketEnable On
    TBucketKey "%%{HTTP:X-API-Key}"
    %s
</Location>
%s
%s
""" % (redis_url, prefix, server, scope, scope, extra, STATUS)


def prepare(a):
    a.write_file("cgi-bin/slow.cgi", SLOW_CGI, 0o755)
    a.write_file("cgi-bin/fail.cgi", FAIL_CGI, 0o755)
    a.write_file("htdocs/app/slow.php", SLOW_PHP)
    a.write_file("htdocs/ht/.htaccess", HTACCESS)
    a.write_file("htdocs/ht/slow.php", SLOW_PHP)
    return a


def get(a, path, key, timeout=15, session=None):
    """One request; (status, seconds, response)."""
    t0 = time.monotonic()
    if session is not None:
        r = session.get(a.url(path), headers={"X-API-Key": key},
                        timeout=timeout)
    else:
        r = http_get(a.url(path), {"X-API-Key": key}, timeout=timeout)
    return r.status_code, time.monotonic() - t0, r


def parallel(jobs):
    """Run (apache, path, key) jobs at once; results in job order."""
    with concurrent.futures.ThreadPoolExecutor(len(jobs)) as ex:
        futs = [ex.submit(get, a, p, k) for a, p, k in jobs]
        return [f.result() for f in futs]




def slots(a, **labels):
    """The status page's concurrency slot counters of a's vhost."""
    text = http_get(a.url("/tbucket-status")).text
    vh = "127.0.0.1"                # the main server's ServerName
    out = {ev: metric(text, "tbucket_concurrency_slots_total", vhost=vh,
                      event=ev)
           for ev in ("taken", "refused", "released", "release-failed")}
    out["in_flight"] = metric(text, "tbucket_concurrency_in_flight",
                              vhost=vh)
    for lim in ("rate", "concurrency"):
        out[lim] = metric(text, "tbucket_refusals_total", vhost=vh,
                          limit=lim)
    return out


def settled(a):
    """slots(a) once every slot taken is released: a request whose
    response never ended (an aborted client, a killed child) releases when
    its pool goes, or never."""
    wait_until(lambda: slots(a)["in_flight"] == 0, 5)
    return slots(a)


def assert_all_released(a, n):
    """Once every slot is back: n were taken and n released."""
    st = settled(a)
    assert st["taken"] == st["released"] == n
    return st


# N=2 and six parallel slow requests of one key: exactly two run, four
# are refused at once (429, Retry-After: 1, the JSON body); another key
# is independent meanwhile; every slot comes back; the status page
# counts the slots and the refusals by limit.
@pytest.mark.slow
def test_module_conc_01(apache_factory, redis_server):
    a = prepare(apache_factory(servers=2))
    a.start(body(redis_server.url, "c1:", "TBucketConcurrency 2"))
    rc = redis_server.client()
    jobs = [(a, "/cgi-bin/slow.cgi?1.5", "k")] * 6
    jobs += [(a, "/cgi-bin/slow.cgi?1.5", "other")] * 2
    got = parallel(jobs)
    mine = got[:6]
    assert sorted(s for s, _, _ in mine) == [200, 200, 429, 429, 429, 429]
    for status, took, r in mine:
        if status == 429:
            # "At once": not after a slot came back, which is the 1.5 s
            # sleep of a running CGI whatever the CPU's speed (idle, the
            # refusal takes milliseconds; a busy machine adds scheduling
            # delay, not 1.5 s).
            assert took < 1.4, took
            assert r.headers["Retry-After"] == "1"
            assert r.json() == {"error": "too many concurrent requests",
                                "limit": 2}
            assert "X-RateLimit-Limit" not in r.headers
        else:
            assert took >= 1.4 and "allowed" in r.text
    assert [s for s, _, _ in got[6:]] == [200, 200]
    assert wait_until(lambda: rc.zcard("c1:{k}:conc") == 0, 5)
    assert rc.exists("c1:{other}:conc") == 0
    st = slots(a)
    assert (st["taken"], st["refused"], st["released"]) == (4, 4, 4)
    assert (st["in_flight"], st["release-failed"]) == (0, 0)
    assert (st["concurrency"], st["rate"]) == (4, 0)
    log = a.access_text(until=lambda t: t.count("/cgi-bin/slow.cgi") >= 8)
    assert log.count("429 rejected /cgi-bin/slow.cgi") == 4
    a.assert_log_clean()


# Whatever the end of a request its slot comes back: success, an error
# status from the handler, a 404 answered by a PHP ErrorDocument, a 403,
# PHP through Action (an internal redirect), a CGI that outlives
# CGIDScriptTimeout (504). With N=1 many sequential requests on one
# keep-alive connection never get a 429. A 500 closes the connection:
# the slot is back in Redis by the time the client has the answer, since
# the release comes before the response's last bytes leave (test_release
# sends hundreds on fresh connections). Slots released equal slots taken.
def test_module_conc_02(apache_factory, redis_server):
    require(PHP_CGI, "php-cgi")
    a = prepare(apache_factory(servers=1))
    a.start(body(redis_server.url, "c2:", "TBucketConcurrency 1", """
<Location /app>
    ErrorDocument 404 /app/index.php
</Location>
<Location /app/denied>
    Require all denied
</Location>
<Location /cgi-bin/slow.cgi>
    CGIDScriptTimeout 1
</Location>
"""))
    a.write_file("cgi-bin/bad.cgi", FAIL_CGI.replace("500 Internal Server "
                                                     "Error", "502 Bad "
                                                     "Gateway"), 0o755)
    rc = redis_server.client()
    paths = ["/cgi-bin/env.cgi", "/cgi-bin/bad.cgi", "/app/missing.php",
             "/app/denied/x.php", "/app/index.php", "/app/slow.php?ms=20"]
    seen = {}
    with requests.Session() as s:
        for i in range(8):
            for p in paths:
                status, _, _ = get(a, p, "seq", session=s)
                seen.setdefault(p, set()).add(status)
        # The handler times out: 504 after a second, and the slot is back.
        # Bounded against the CGI's 3 s sleep that the timeout cuts short
        # (a timer, not CPU: a slower machine adds little to the 1 s).
        status, took, _ = get(a, "/cgi-bin/slow.cgi?3", "seq", session=s)
        assert status == 504 and took < 2.5
        assert get(a, "/cgi-bin/env.cgi", "seq", session=s)[0] == 200
    assert seen == {"/cgi-bin/env.cgi": {200}, "/cgi-bin/bad.cgi": {502},
                    "/app/missing.php": {404}, "/app/denied/x.php": {403},
                    "/app/index.php": {200}, "/app/slow.php?ms=20": {200}}
    for i in range(5):
        assert get(a, "/cgi-bin/fail.cgi", "seq")[0] == 500
        assert rc.zcard("c2:{seq}:conc") == 0
    st = slots(a)
    assert st["taken"] == 8 * len(paths) + 2 + 5
    assert st["released"] == st["taken"] and st["refused"] == 0
    assert st["in_flight"] == 0 and st["release-failed"] == 0
    a.assert_log_clean(allowed=("AH01630", "Script timed out"))


# An aborted client releases: the connection is closed while the CGI
# still runs; the slot comes back when the request ends, and the next
# request is admitted.
@pytest.mark.slow
def test_module_conc_03(apache_factory, redis_server):
    a = prepare(apache_factory(servers=1))
    a.start(body(redis_server.url, "c3:", "TBucketConcurrency 1"))
    rc = redis_server.client()
    s = socket.create_connection(("127.0.0.1", a.port), timeout=5)
    s.sendall(b"GET /cgi-bin/slow.cgi?1 HTTP/1.1\r\nHost: x\r\n"
              b"X-API-Key: ab\r\n\r\n")
    assert wait_until(lambda: rc.zcard("c3:{ab}:conc") == 1, 5)
    assert get(a, "/cgi-bin/env.cgi", "ab")[0] == 429
    s.close()
    assert wait_until(lambda: rc.zcard("c3:{ab}:conc") == 0, 6)
    assert get(a, "/cgi-bin/env.cgi", "ab")[0] == 200
    assert_all_released(a, 2)
    a.assert_log_clean(allowed=("AH01215",))


# A kill -9'ed prefork child's slot frees itself within ttl (2 s here;
# apache2 -t warns that it is shorter than Timeout): refused before,
# admitted after.
@pytest.mark.slow
def test_module_conc_04(apache_factory, redis_server):
    a = prepare(apache_factory(mpm="prefork", servers=3))
    a.start(body(redis_server.url, "c4:",
                 "TBucketConcurrency 1 ttl=2s"))
    startup = a.read_log() + a.read_stderr()
    assert "TB00101" in startup and "shorter than Timeout" in startup
    rc = redis_server.client()
    ex = concurrent.futures.ThreadPoolExecutor(1)
    fut = ex.submit(lambda: get(a, "/cgi-bin/slow.cgi?4", "kill"))
    assert wait_until(lambda: rc.zcard("c4:{kill}:conc") == 1, 5)
    member = rc.zrange("c4:{kill}:conc", 0, -1)[0].decode()
    taken_at = time.monotonic()
    pid = int(member.split(".")[1])
    assert pid in a.child_pids()
    os.kill(pid, signal.SIGKILL)
    try:
        fut.result(timeout=10)
    except Exception:
        pass                      # the connection died with the child
    ex.shutdown()
    assert get(a, "/cgi-bin/env.cgi", "kill")[0] == 429
    assert wait_until(lambda: get(a, "/cgi-bin/env.cgi", "kill")[0] == 200,
                      4, step=0.2)
    assert time.monotonic() - taken_at >= 1.5
    a.assert_log_clean(allowed=("TB00101", "AH00052", "AH01215"))


# Two Apaches sharing one Redis admit N in total: six parallel slow
# requests, three to each, and N=2.
@pytest.mark.slow
def test_module_conc_05(apache_factory, redis_server):
    a = prepare(apache_factory(servers=1))
    b = prepare(apache_factory(servers=1))
    conf = body(redis_server.url, "c5:", "TBucketConcurrency 2")
    a.start(conf)
    b.start(conf)
    got = parallel([(a, "/cgi-bin/slow.cgi?1.5", "k")] * 3
                   + [(b, "/cgi-bin/slow.cgi?1.5", "k")] * 3)
    seen = [(s, round(took, 2)) for s, took, _ in got]
    assert [s for s, _ in seen].count(200) == 2, seen
    assert [s for s, _ in seen].count(429) == 4, seen
    ta, tb = settled(a), settled(b)
    assert ta["taken"] + tb["taken"] == 2, (ta, tb)
    assert ta["refused"] + tb["refused"] == 4, (ta, tb)
    assert ta["released"] + tb["released"] == 2, (ta, tb, a.read_log()[-2000:],
                                                   b.read_log()[-2000:])


# With a rate limit in the same scope, one script call decides both, all
# or nothing: refused by concurrency takes no token; refused by the rate
# limit holds no slot; the status page names the limit that refused.
@pytest.mark.slow
def test_module_conc_06(apache_factory, redis_server):
    a = prepare(apache_factory(servers=2))
    a.start(body(redis_server.url, "c6:",
                 "TBucketConcurrency 1\n    TBucketLimit 3 1/h"))
    rc = redis_server.client()
    got = parallel([(a, "/cgi-bin/slow.cgi?1", "k")] * 2)
    assert sorted(s for s, _, _ in got) == [200, 429]
    refused = [r for s, _, r in got if s == 429][0]
    assert refused.json()["error"] == "too many concurrent requests"
    assert refused.headers["X-RateLimit-Limit"] == "3"
    assert round(float(rc.hget("c6:{k}", "tokens"))) == 2
    assert wait_until(lambda: rc.zcard("c6:{k}:conc") == 0, 5)
    with requests.Session() as s:       # one connection: see conc_02
        assert get(a, "/cgi-bin/env.cgi", "k", session=s)[0] == 200
        assert get(a, "/cgi-bin/env.cgi", "k", session=s)[0] == 200
        status, _, r = get(a, "/cgi-bin/env.cgi", "k", session=s)
    assert status == 429 and r.json()["error"] == "rate limited"
    assert int(r.headers["Retry-After"]) > 1
    assert rc.zcard("c6:{k}:conc") == 0
    st = assert_all_released(a, 3)
    assert (st["concurrency"], st["rate"]) == (1, 1)


# Shadow mode counts and logs the would-be refusal and refuses nothing;
# .htaccess (AllowOverride Limit) sets a limit for PHP run through
# Action, whose internal redirect takes no second slot.
@pytest.mark.slow
def test_module_conc_07(apache_factory, redis_server):
    require(PHP_CGI, "php-cgi")
    a = prepare(apache_factory(servers=2))
    a.start(body(redis_server.url, "c7:",
                 "TBucketConcurrency 1\n    TBucketMode shadow"))
    rc = redis_server.client()
    got = parallel([(a, "/cgi-bin/slow.cgi?1", "sh")] * 2)
    assert [s for s, _, _ in got] == [200, 200]
    texts = sorted(r.text.split()[-1] for _, _, r in got)
    assert texts == ["allowed", "shadow-rejected"]
    assert "too many concurrent requests" in a.read_log()
    st = slots(a)
    assert (st["refused"], st["concurrency"], st["taken"]) == (1, 1, 1)
    # .htaccess: one PHP request at a time for a key.
    got = parallel([(a, "/ht/slow.php?ms=1000", "ht")] * 2)
    assert sorted(s for s, _, _ in got) == [200, 429]
    ok = [r for s, _, r in got if s == 200][0]
    assert ok.text.strip() == "allowed"
    assert wait_until(lambda: rc.zcard("c7:{ht}:conc") == 0, 5)
    assert get(a, "/ht/slow.php", "ht")[0] == 200
    assert_all_released(a, 3)
    a.assert_log_clean(allowed=("TB00110",))


# Redis down: open admits every request, closed refuses them, local
# counts this server's slots against ceil(N / replicas) = 2 of N=3 and
# gives them back when the requests end.
@pytest.mark.slow
def test_module_conc_08(apache_factory):
    dead = "redis://127.0.0.1:%d" % free_port()
    a = prepare(apache_factory(servers=2))

    def conf(policy):
        return body(dead, "c8:", "TBucketConcurrency 3", server="""
TBucketFailurePolicy %s
TBucketReplicas 2
TBucketBreaker threshold=1000 cooldown=1s
""" % policy)

    a.start(conf("open"))
    got = parallel([(a, "/cgi-bin/slow.cgi?0.5", "p")] * 4)
    assert [s for s, _, _ in got] == [200] * 4
    assert {r.text.split()[-1] for _, _, r in got} == {"fallback-open"}
    a.graceful(conf("closed"))
    status, _, r = get(a, "/cgi-bin/env.cgi", "p")
    assert status == 429 and int(r.headers["Retry-After"]) >= 1
    a.graceful(conf("local"))
    got = parallel([(a, "/cgi-bin/slow.cgi?1", "p")] * 4)
    assert sorted(s for s, _, _ in got) == [200, 200, 429, 429]
    settled(a)
    assert get(a, "/cgi-bin/env.cgi", "p")[0] == 200
    settled(a)
    got = parallel([(a, "/cgi-bin/slow.cgi?0.5", "p")] * 2)
    assert [s for s, _, _ in got] == [200, 200]
    assert_all_released(a, 5)
    a.assert_log_clean(allowed=("TB00105",))


# apache2 -t refuses 0, negatives, junk, a zero or bad ttl, unknown
# options, and TBucketConcurrency with TBucketShards or TBucketLease;
# it accepts Off and warns about a ttl shorter than Timeout.
def test_module_conc_09(apache_factory, redis_server):
    a = apache_factory()

    def t(line, extra=""):
        return a.configtest("""
<Location /x>
    TBucketEnable On
    %s
    %s
</Location>
""" % (line, extra))

    for bad, why in (("0", "bad limit '0'"), ("-3", "bad limit '-3'"),
                     ("abc", "bad limit 'abc'"), ("", "expected the"),
                     ("2 ttl=0", "bad ttl '0'"),
                     ("2 ttl=-1s", "bad ttl '-1s'"),
                     ("2 ttl=soon", "bad ttl 'soon'"),
                     ("2 foo=1", "unknown option 'foo=1'"),
                     ("1000001", "bad limit '1000001'"),
                     ("Off ttl=1s", "Off takes no options")):
        rc, out = t("TBucketConcurrency %s" % bad)
        assert rc != 0, bad
        assert "TBucketConcurrency" in out and why in out, (bad, out)
    rc, out = t("TBucketConcurrency 2", "TBucketShards 4\nTBucketLimit 8 8/s")
    assert rc != 0 and "TBucketShards 4 applies there" in out
    rc, out = t("TBucketConcurrency 2", "TBucketLease 5\nTBucketLimit 8 8/s")
    assert rc != 0 and "TBucketLease applies there" in out
    rc, out = t("TBucketConcurrency 2 ttl=2s")
    assert rc == 0 and "shorter than Timeout 10s" in out, out
    rc, out = t("TBucketConcurrency 2 ttl=1m")
    assert rc == 0 and "TB00101" not in out, out
    rc, out = t("TBucketConcurrency Off")
    assert rc == 0 and "TBucketEnable On without a TBucketLimit" in out
