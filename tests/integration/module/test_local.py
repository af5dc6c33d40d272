"""test_local.py -- local protection: TBucketLocalConcurrency,
TBucketPriority and TBucketShed, decided on this server without Redis.

The backend counts for itself: conc.cgi raises a counter under flock(1)
when it starts, keeps the highest value seen, sleeps, and lowers the
counter when it ends, so "never above N" is what the application saw,
not what the module says. Busy servers are made with requests that hold
their worker (busy.cgi). Each test reads the status page too: what the
module counts must agree with what the backend saw."""
import concurrent.futures
import contextlib
import json
import os
import re
import signal
import socket
import time

import pytest
import requests

from tbtest.apache import http_get, metric, wait_until

CONC_CGI = r"""#!/bin/sh
# conc.cgi?SECONDS: count this request in $STATE while it sleeps.
S=__STATE__
s=${QUERY_STRING:-1}
case "$s" in *[!0-9.]*) s=1 ;; esac
(
  flock 9
  n=$(($(cat $S/cur) + 1)); echo $n > $S/cur
  [ $n -gt $(cat $S/max) ] && echo $n > $S/max
  echo $PPID >> $S/pids
) 9>$S/lock
timeout 30 sleep "$s"
( flock 9; echo $(($(cat $S/cur) - 1)) > $S/cur ) 9>$S/lock
printf 'Content-Type: text/plain\r\n\r\nran %s\n' "$TBUCKET_DECISION"
"""

SLEEP_CGI = r"""#!/bin/sh
s=${QUERY_STRING:-1}
case "$s" in *[!0-9.]*) s=1 ;; esac
timeout 30 sleep "$s"
printf 'Content-Type: text/plain\r\n\r\nslept\n'
"""

FAIL_CGI = r"""#!/bin/sh
printf 'Status: 500 Internal Server Error\r\n'
printf 'Content-Type: text/plain\r\n\r\nboom\n'
"""

# Every scope enabled, and a Redis that never answers (nothing listens on
# port 1): what these tests see is decided locally.
NO_REDIS = """
TBucketEnable On
TBucketRedis redis://127.0.0.1:1 timeout=20
"""

# The status page, and busy.cgi, which holds workers for the shed tests:
# both critical, so that neither is shed itself.
STATUS = """
<Location /tbucket-status>
    SetHandler tbucket-status
    TBucketPriority critical
</Location>
<Location /cgi-bin/busy.cgi>
    TBucketPriority critical
</Location>
"""


def prepare(a):
    """The CGI scripts, and the state dirs of conc.cgi and busy.cgi (the
    same script, which holds a worker outside any local scope), writable
    by www-data."""
    state = os.path.join(a.root, "state")
    for d in (state, os.path.join(state, "busy")):
        os.makedirs(d, exist_ok=True)
        for name, text in (("cur", "0\n"), ("max", "0\n"), ("pids", ""),
                           ("lock", "")):
            with open(os.path.join(d, name), "w") as f:
                f.write(text)
    os.system("chown -R www-data:www-data %s" % state)
    a.write_file("cgi-bin/conc.cgi", CONC_CGI.replace("__STATE__", state),
                 0o755)
    a.write_file("cgi-bin/busy.cgi", CONC_CGI.replace(
        "__STATE__", os.path.join(state, "busy")), 0o755)
    a.write_file("cgi-bin/sleep.cgi", SLEEP_CGI, 0o755)
    a.write_file("cgi-bin/fail.cgi", FAIL_CGI, 0o755)
    return state


def backend(state, name):
    with open(os.path.join(state, name)) as f:
        return f.read()


def backend_int(state, name):
    """A counter of the backend's; the script rewrites it in place, so a
    read may find it empty or half written: read again."""
    for _ in range(100):
        try:
            return int(backend(state, name))
        except ValueError:
            time.sleep(0.01)
    return int(backend(state, name))


def status(a):
    return http_get(a.url("/tbucket-status")).text


def in_flight(a, scope):
    return metric(status(a), "tbucket_local_in_flight", scope=scope)


def flood(a, path, n, headers=None, timeout=20):
    """n concurrent GETs of path; their status codes."""
    def one(_):
        try:
            return http_get(a.url(path), headers=headers,
                            timeout=timeout).status_code
        except requests.RequestException:
            return 0
    with concurrent.futures.ThreadPoolExecutor(n) as ex:
        return list(ex.map(one, range(n)))


def hold(a, path, n, headers=None):
    """Start n requests of path in the background; returns the futures
    (their status codes) and the executor to shut down."""
    ex = concurrent.futures.ThreadPoolExecutor(n)
    futs = [ex.submit(lambda: http_get(a.url(path), headers=headers,
                                       timeout=40).status_code)
            for _ in range(n)]
    return ex, futs


def hold_busy(a, state, n, secs=3):
    """Hold n workers with busy.cgi requests of secs seconds; returns when
    the backend runs all n, and the busy count is older than its one
    millisecond, so the next request sees them. The shed tests leave a
    margin of a worker or two in their thresholds: a worker that has
    answered the previous request may still be logging it."""
    ex, futs = hold(a, "/cgi-bin/busy.cgi?%d" % secs, n)
    assert wait_until(lambda: backend_int(state, "busy/cur") == n,
                      timeout=5)
    time.sleep(0.01)
    return ex, futs


@contextlib.contextmanager
def waited(ex, futs):
    """A with-block around requests started by hold(): yields their
    futures, and waits for them on leaving."""
    try:
        yield futs
    finally:
        ex.shutdown(wait=True)


def held(a, path, n):
    """hold() as a with-block (waited())."""
    return waited(*hold(a, path, n))


@contextlib.contextmanager
def busy(a, state, n, secs=3):
    """hold_busy() as a with-block (waited()); on leaving, also until the
    server has let the held workers go (they may still be logging), so
    that what follows starts from an idle server: the status request
    itself is the one busy worker."""
    with waited(*hold_busy(a, state, n, secs)) as futs:
        yield futs
    assert wait_until(lambda: metric(status(a), "tbucket_workers_busy") <= 1,
                      timeout=10), status(a)


def server(apache_factory, servers, mpm="prefork", dirs=False):
    """An Apache with the CGI scripts of prepare() (and, with dirs, the
    directories of shed_body()'s priorities), not started; (it, the
    backend's state dir)."""
    a = apache_factory(mpm=mpm, servers=servers)
    state = prepare(a)
    if dirs:
        make_dirs(a)
    return a, state


def conc_body(n, extra=""):
    return NO_REDIS + """%s
<Location /cgi-bin/conc.cgi>
    TBucketLocalConcurrency %d
</Location>
%s
""" % (extra, n, STATUS)


SCOPE = "<Location /cgi-bin/conc.cgi>"


# Exact in-flight cap across prefork children: the backend never sees more
# than N at once, sees exactly N under a flood, and the rest get 503.
def test_module_150_01(apache_factory):
    a, state = server(apache_factory, 12)
    a.start(conc_body(3))
    codes = flood(a, "/cgi-bin/conc.cgi?1", 10)
    assert backend_int(state, "max") == 3
    assert codes.count(503) >= 1 and set(codes) <= {200, 503}
    assert codes.count(200) >= 3
    text = status(a)
    assert metric(text, "tbucket_local_in_flight", scope=SCOPE) == 0
    assert metric(text, "tbucket_local_limit", scope=SCOPE) == 3
    assert metric(text, "tbucket_local_taken_total",
                  scope=SCOPE) == codes.count(200)
    assert metric(text, "tbucket_local_refused_total",
                  scope=SCOPE) == codes.count(503)
    assert metric(text, "tbucket_decisions_total",
                  outcome="shed") == codes.count(503)
    assert backend_int(state, "cur") == 0
    a.assert_log_clean()


# The same across the threads and children of the event MPM.
def test_module_150_02(apache_factory):
    a, state = server(apache_factory, 2, mpm="event")
    a.start(conc_body(4))
    codes = flood(a, "/cgi-bin/conc.cgi?1", 12)
    assert backend_int(state, "max") == 4
    assert codes.count(503) >= 1 and codes.count(200) >= 4
    assert set(codes) <= {200, 503}
    assert in_flight(a, SCOPE) == 0
    a.assert_log_clean()


# A refusal is a 503 with Retry-After (TBucketShedRetryAfter), the module's
# JSON body, decision "shed" in the access log and the environment, and
# the connection closed even though the client asked to keep it.
def test_module_150_03(apache_factory):
    a, _ = server(apache_factory, 6)
    a.start(conc_body(1, "TBucketShedRetryAfter 7"))
    ex, futs = hold(a, "/cgi-bin/conc.cgi?2", 1)
    assert wait_until(lambda: in_flight(a, SCOPE) == 1, timeout=5)
    with requests.Session() as s:
        r = s.get(a.url("/cgi-bin/conc.cgi?0"), timeout=10)
    assert r.status_code == 503
    assert r.headers["Retry-After"] == "7"
    assert r.headers["Connection"].lower() == "close"
    assert r.json() == {"error": "too many requests in flight here",
                        "limit": 1, "retry_after": 7}
    ex.shutdown()
    assert [f.result() for f in futs] == [200]
    log = a.access_text(until=lambda t: " 200 allowed " in t)
    assert re.search(r" 503 shed /cgi-bin/conc.cgi ", log)
    assert re.search(r" 200 allowed /cgi-bin/conc.cgi ", log)
    a.assert_log_clean()


# Places are given back however the request ends: a 500 from the backend,
# an internal redirect (PHP through mod_actions takes one place for the
# chain), a client that hangs up while the backend still runs.
def test_module_150_04(apache_factory):
    a, _ = server(apache_factory, 6)
    a.start(NO_REDIS + """<Location /cgi-bin/fail.cgi>
    TBucketLocalConcurrency 1
</Location>
<Location /app>
    TBucketLocalConcurrency 1
</Location>
<Location /cgi-bin/conc.cgi>
    TBucketLocalConcurrency 1
</Location>
""" + STATUS)
    for _ in range(3):
        assert http_get(a.url("/cgi-bin/fail.cgi")).status_code == 500
    for _ in range(3):
        r = http_get(a.url("/app/index.php"))
        assert r.status_code == 200
        assert r.json()["TBUCKET_DECISION"] == "allowed"
    text = status(a)
    assert metric(text, "tbucket_local_taken_total",
                  scope="<Location /cgi-bin/fail.cgi>") == 3
    assert metric(text, "tbucket_local_taken_total",
                  scope="<Location /app>") == 3
    # The client hangs up; the place is given back when the CGI ends.
    s = socket.create_connection(("127.0.0.1", a.port))
    s.sendall(b"GET /cgi-bin/conc.cgi?1 HTTP/1.1\r\nHost: x\r\n\r\n")
    assert wait_until(lambda: in_flight(a, SCOPE) == 1, timeout=5)
    s.close()
    assert wait_until(lambda: in_flight(a, SCOPE) == 0, timeout=8)
    for scope in ("<Location /cgi-bin/fail.cgi>", "<Location /app>"):
        assert in_flight(a, scope) == 0
    assert http_get(a.url("/cgi-bin/conc.cgi?0")).status_code == 200
    a.assert_log_clean()


def worker_children(a):
    """The children that serve requests: under event, those with
    threads (not mod_cgid's daemon)."""
    out = set()
    for p in a.child_pids():
        try:
            if len(os.listdir("/proc/%d/task" % p)) > 1:
                out.add(p)
        except OSError:
            continue
    return out


def kill_holders(a, state, mpm):
    """kill -9 the children serving conc.cgi: under prefork the CGI's
    parent; under event every worker child (the CGI runs under mod_cgid's
    daemon, which must live)."""
    if mpm == "prefork":
        pids = {int(p) for p in backend(state, "pids").split()}
        victims = pids & set(a.child_pids())
    else:
        victims = worker_children(a)
    for pid in victims:
        os.kill(pid, signal.SIGKILL)
    return victims


# A child killed outright (SIGKILL) while it holds places: the parent
# frees them when it reaps it, and the scope admits N again.
@pytest.mark.slow
@pytest.mark.parametrize("mpm", ["prefork", "event"])
def test_module_150_05(apache_factory, mpm):
    a, state = server(apache_factory, 6 if mpm == "prefork" else 2, mpm=mpm)
    a.start(conc_body(2))
    ex, futs = hold(a, "/cgi-bin/conc.cgi?4", 2)
    assert wait_until(lambda: in_flight(a, SCOPE) == 2, timeout=5)
    # The scripts have started (and written their parents' pids).
    assert wait_until(lambda: backend_int(state, "cur") == 2,
                      timeout=5)
    assert http_get(a.url("/cgi-bin/conc.cgi?0")).status_code == 503
    victims = kill_holders(a, state, mpm)
    assert victims
    # The parent reaps within its one-second maintenance loop, and makes
    # new children.
    assert wait_until(lambda: in_flight(a, SCOPE) == 0, timeout=8)
    ex.shutdown(wait=True)
    assert wait_until(lambda: backend_int(state, "cur") == 0, timeout=8)
    codes = flood(a, "/cgi-bin/conc.cgi?1", 2)
    assert codes == [200, 200]
    a.assert_log_clean(allowed=("AH00052", "AH00051", "AH00024"))


# A graceful restart keeps the count: requests of the old generation
# still hold their places, the new generation sees them, and when they
# end the scope is empty again.
# Prefork starts the new generation's children a few per second, so the
# flood waits for three of them beside the two held old ones; a child
# may still be in its child_init, so each flood request holds its place
# 2 s, long enough for the other two to be accepted and decided. (Under
# ASan, with 1 s and no wait, one child served two of the flood's
# requests in turn and the second found the first's place free again.)
@pytest.mark.slow
def test_module_150_06(apache_factory):
    a, state = server(apache_factory, 6)
    a.start(conc_body(3))
    ex, futs = hold(a, "/cgi-bin/conc.cgi?8", 2)
    assert wait_until(lambda: in_flight(a, SCOPE) == 2, timeout=5)
    a.graceful()
    assert in_flight(a, SCOPE) == 2
    assert wait_until(lambda: len(a.child_pids()) >= 5, timeout=10)
    codes = flood(a, "/cgi-bin/conc.cgi?2", 3)
    assert in_flight(a, SCOPE) == 2, "the held requests ended too soon"
    assert sorted(codes) == [200, 503, 503]
    ex.shutdown(wait=True)
    assert [f.result() for f in futs] == [200, 200]
    assert backend_int(state, "max") == 3
    assert wait_until(lambda: in_flight(a, SCOPE) == 0, timeout=5)
    assert flood(a, "/cgi-bin/conc.cgi?0", 3) == [200] * 3
    a.assert_log_clean()


# Nested scopes each count: the server-wide scope caps the sum, the
# inner one its own share; Off in an inner section leaves them all.
def test_module_150_07(apache_factory):
    a, state = server(apache_factory, 12)
    a.start(NO_REDIS + """TBucketLocalConcurrency 3
<Location /cgi-bin/conc.cgi>
    TBucketLocalConcurrency 2
</Location>
<Location /cgi-bin/sleep.cgi>
    TBucketLocalConcurrency Off
</Location>
<Location /tbucket-status>
    SetHandler tbucket-status
    TBucketLocalConcurrency Off
</Location>
""")
    codes = flood(a, "/cgi-bin/conc.cgi?1", 6)
    assert backend_int(state, "max") == 2 and codes.count(200) >= 2
    ex, futs = hold(a, "/cgi-bin/conc.cgi?2", 2)
    assert wait_until(lambda: in_flight(a, "server") == 2, timeout=5)
    # The server-wide scope has one place left: a static file takes it.
    assert http_get(a.url("/ok.txt")).status_code == 200
    assert in_flight(a, SCOPE) == 2
    # Off: not counted anywhere, never refused.
    assert flood(a, "/cgi-bin/sleep.cgi?0", 4) == [200] * 4
    ex.shutdown(wait=True)
    assert wait_until(lambda: in_flight(a, "server") == 0, timeout=5)
    a.assert_log_clean()


def shed_body(extra=""):
    return NO_REDIS + """TBucketShed low=30 normal=60 high=90
<Location /low>
    TBucketPriority low
</Location>
<Location /high>
    TBucketPriority high
</Location>
<Location /crit>
    TBucketPriority critical
</Location>
<If "%%{HTTP:X-Partner} == 'yes'">
    TBucketPriority critical
</If>
%s
""" % extra + STATUS


def make_dirs(a):
    for d in ("low", "high", "crit"):
        a.write_file("htdocs/%s/ok.txt" % d, "ok\n")


# Shedding by priority on a deliberately busy server (10 workers, 5 held
# by slow requests: with the asking one, 6 of 10 busy): low (30%) and
# normal (60%) are shed, high (90%) and critical served, with a margin of
# three workers still logging earlier requests; with two held, only low
# is.
def test_module_151_01(apache_factory):
    a, state = server(apache_factory, 10, dirs=True)
    a.start(shed_body())
    with busy(a, state, 5, 3) as futs:
        got = {p: http_get(a.url("/%s/ok.txt" % p)).status_code
               for p in ("low", "high", "crit")}
        got["normal"] = http_get(a.url("/ok.txt")).status_code
        assert got == {"low": 503, "normal": 503, "high": 200, "crit": 200}
        r = http_get(a.url("/ok.txt"))
        assert r.json() == {"error": "server busy", "retry_after": 1}
        assert r.headers["Retry-After"] == "1"
        assert r.headers["Connection"].lower() == "close"
    # The held requests were normal and ran: shedding starts at the
    # threshold, it does not evict.
    assert [f.result() for f in futs] == [200] * 5
    with busy(a, state, 2, 3) as futs:
        assert http_get(a.url("/low/ok.txt")).status_code == 503
        assert http_get(a.url("/ok.txt")).status_code == 200
    text = status(a)
    assert metric(text, "tbucket_shed_total", vhost="127.0.0.1",
                  priority="low") == 2
    assert metric(text, "tbucket_shed_total", vhost="127.0.0.1",
                  priority="normal") == 2
    assert metric(text, "tbucket_shed_total", vhost="127.0.0.1",
                  priority="critical") == 0
    assert metric(text, "tbucket_shed_threshold_percent", vhost="127.0.0.1",
                  priority="normal") == 60
    assert metric(text, "tbucket_workers_max") == 10
    # Idle again: nothing is shed.
    assert http_get(a.url("/low/ok.txt")).status_code == 200
    a.assert_log_clean(allowed=("AH00161",))


# A priority set in <If> (a partner's header) and in a Location; the same
# URL is shed without the header and served with it.
def test_module_151_02(apache_factory):
    a, state = server(apache_factory, 10, dirs=True)
    a.start(shed_body())
    with busy(a, state, 5, 3):
        assert http_get(a.url("/ok.txt")).status_code == 503
        assert http_get(a.url("/ok.txt"),
                        headers={"X-Partner": "yes"}).status_code == 200
        assert http_get(a.url("/low/ok.txt"),
                        headers={"X-Partner": "yes"}).status_code == 200
    a.assert_log_clean()


# Keep-alive idle workers are not busy: clients parked on kept-alive
# connections under prefork do not make the server shed.
def test_module_151_03(apache_factory):
    a, _ = server(apache_factory, 10, dirs=True)
    a.start(shed_body("KeepAliveTimeout 5"))
    socks = []
    for _ in range(5):
        s = socket.create_connection(("127.0.0.1", a.port))
        s.sendall(b"GET /ok.txt HTTP/1.1\r\nHost: x\r\n\r\n")
        first = s.recv(4096)
        assert b"200 OK" in first
        assert b"Connection: close" not in first, first
        socks.append(s)
    try:
        time.sleep(0.01)
        # 5 of 10 workers hold a kept-alive connection (were they busy,
        # low's 30% would shed); only the asking one is busy.
        assert http_get(a.url("/low/ok.txt")).status_code == 200
        # They were kept alive all along: each answers a second request.
        for s in socks:
            s.sendall(b"GET /ok.txt HTTP/1.1\r\nHost: x\r\n\r\n")
            assert b"200 OK" in s.recv(4096)
    finally:
        for s in socks:
            s.close()
    a.assert_log_clean()


# While the server is at or above its lowest threshold, a 429 from the
# shared limit closes its connection too; below it, it keeps it.
def test_module_151_04(apache_factory, redis_server):
    a, state = server(apache_factory, 6, dirs=True)
    a.start("""
TBucketEnable On
TBucketRedis %s timeout=500
TBucketShed low=50 normal=90
<Location /high>
    TBucketKey "%%{HTTP:X-API-Key}"
    TBucketLimit 1 1/h
    TBucketPriority high
</Location>
""" % redis_server.url + STATUS)
    h = {"X-API-Key": "k1"}
    with requests.Session() as s:
        assert s.get(a.url("/high/ok.txt"), headers=h).status_code == 200
        r = s.get(a.url("/high/ok.txt"), headers=h)
        assert r.status_code == 429
        assert "close" not in r.headers.get("Connection", "").lower()
    with busy(a, state, 3, 3):
        with requests.Session() as s:
            r = s.get(a.url("/high/ok.txt"), headers=h)
        assert r.status_code == 429
        assert r.headers["Connection"].lower() == "close"
    a.assert_log_clean()


# Local protection needs no Redis: with Redis unreachable, under every
# failure policy, local limits and shedding still refuse with 503 (not
# the policy's 429), and a shed request makes no Redis call at all.
@pytest.mark.parametrize("policy", ["open", "closed", "local"])
def test_module_152_01(apache_factory, policy):
    a, state = server(apache_factory, 10, dirs=True)
    a.start(NO_REDIS + """TBucketFailurePolicy %s
TBucketShed low=50
<Location /cgi-bin/conc.cgi>
    TBucketLocalConcurrency 2
</Location>
<Location /low>
    TBucketPriority low
    TBucketLimit 100 100/s
</Location>
""" % policy + STATUS)
    codes = flood(a, "/cgi-bin/conc.cgi?1", 6)
    assert backend_int(state, "max") == 2
    assert codes.count(503) >= 1 and codes.count(200) >= 2
    # Idle: the policy answers the shared limit.
    want = 429 if policy == "closed" else 200
    assert http_get(a.url("/low/ok.txt")).status_code == want
    with busy(a, state, 6, 2):
        assert http_get(a.url("/low/ok.txt")).status_code == 503
    a.assert_log_clean(allowed=("TB00105",))


def redis_calls(client):
    stats = client.info("commandstats")
    return sum(v["calls"] for k, v in stats.items()
               if k in ("cmdstat_evalsha", "cmdstat_eval"))


# Refused locally costs no round trip: with a reachable Redis, shed and
# locally refused requests send nothing to it, admitted ones one call.
def test_module_152_02(apache_factory, redis_server):
    a, state = server(apache_factory, 10, dirs=True)
    a.start("""
TBucketEnable On
TBucketRedis %s timeout=500
TBucketShed low=30
TBucketLimit 100 100/s
<Location /cgi-bin/conc.cgi>
    TBucketLocalConcurrency 1
</Location>
<Location /low>
    TBucketPriority low
</Location>
""" % redis_server.url + STATUS)
    c = redis_server.client()
    with held(a, "/cgi-bin/conc.cgi?2", 1):
        assert wait_until(lambda: in_flight(a, SCOPE) == 1, timeout=5)
        with busy(a, state, 3, 2):
            before = redis_calls(c)
            codes = [http_get(a.url("/cgi-bin/conc.cgi?0")).status_code
                     for _ in range(5)]
            codes += [http_get(a.url("/low/ok.txt")).status_code
                      for _ in range(5)]
            assert codes == [503] * 10
            assert redis_calls(c) == before
    before = redis_calls(c)
    assert http_get(a.url("/ok.txt")).status_code == 200
    assert redis_calls(c) == before + 1
    a.assert_log_clean()


# .htaccess may lower a priority, never raise it: a customer's "critical"
# is shed like normal, their "low" is shed at low's threshold; a local
# limit there is refused (its places are made at startup).
def test_module_153_01(apache_factory):
    a, state = server(apache_factory, 10)
    a.write_file("htdocs/raise/.htaccess", "TBucketPriority critical\n")
    a.write_file("htdocs/raise/ok.txt", "ok\n")
    a.write_file("htdocs/lower/.htaccess", "TBucketPriority low\n")
    a.write_file("htdocs/lower/ok.txt", "ok\n")
    a.write_file("htdocs/place/.htaccess", "TBucketLocalConcurrency 5\n")
    a.write_file("htdocs/place/ok.txt", "ok\n")
    a.start(NO_REDIS + """TBucketShed low=25 normal=70
""" + STATUS)
    assert http_get(a.url("/raise/ok.txt")).status_code == 200
    assert http_get(a.url("/place/ok.txt")).status_code == 500
    with busy(a, state, 3, 3):
        # 4 of 10 busy: low (25%) is shed, normal (70%) is not.
        assert http_get(a.url("/lower/ok.txt")).status_code == 503
        assert http_get(a.url("/ok.txt")).status_code == 200
    with busy(a, state, 7, 3):
        assert http_get(a.url("/raise/ok.txt")).status_code == 503
    a.assert_log_clean(allowed=("TBucketLocalConcurrency not allowed here",))


# The status page in all three views: busy workers, thresholds, sheds
# by priority, each local scope's places.
def test_module_153_02(apache_factory):
    a, _ = server(apache_factory, 6, dirs=True)
    a.start(conc_body(2, "TBucketShed low=10 high=90") + """
<Location /low>
    TBucketPriority low
</Location>
""")
    ex, futs = hold(a, "/cgi-bin/conc.cgi?2", 2)
    try:
        assert wait_until(lambda: in_flight(a, SCOPE) == 2, timeout=5)
        assert http_get(a.url("/low/ok.txt")).status_code == 503
        j = http_get(a.url("/tbucket-status?json")).json()
        fams = {f["name"]: f for f in j["metrics"]}
        s = [x for x in fams["tbucket_local_in_flight"]["samples"]
             if x["labels"] == {"scope": SCOPE}]
        assert s and s[0]["value"] == 2
        assert fams["tbucket_workers_max"]["samples"][0]["value"] == 6
        assert fams["tbucket_workers_busy"]["samples"][0]["value"] >= 2
        html = http_get(a.url("/tbucket-status?view=html")).text
        assert "Local protection" in html
        assert ('data-metric="tbucket_local_in_flight" data-labels="scope='
                '&quot;&lt;Location /cgi-bin/conc.cgi&gt;&quot;">2<') in html
        assert ('data-metric="tbucket_shed_threshold_percent" data-labels='
                '"vhost=&quot;127.0.0.1&quot;,priority=&quot;low&quot;">10<'
                in html)
        text = status(a)
        assert metric(text, "tbucket_shed_total", vhost="127.0.0.1",
                      priority="low") == 1
        assert http_get(a.url("/tbucket-status?view=bogus")).status_code \
            == 400
        json.dumps(j)
    finally:
        ex.shutdown(wait=True)
    a.assert_log_clean()


BAD = [
    ("TBucketLocalConcurrency 0", "TBucketLocalConcurrency: bad limit '0'"),
    ("TBucketLocalConcurrency -3", "TBucketLocalConcurrency: bad limit '-3'"),
    ("TBucketLocalConcurrency many",
     "TBucketLocalConcurrency: bad limit 'many'"),
    ("TBucketLocalConcurrency 100001",
     "TBucketLocalConcurrency: bad limit '100001'"),
    ("TBucketPriority urgent", "TBucketPriority: bad priority 'urgent'"),
    ("TBucketPriority", "TBucketPriority takes one argument"),
    ("TBucketShed critical=50", "TBucketShed: critical requests are never"),
    ("TBucketShed low=0", "TBucketShed: bad low '0'"),
    ("TBucketShed normal=101", "TBucketShed: bad normal '101'"),
    ("TBucketShed high=-5", "TBucketShed: bad high '-5'"),
    ("TBucketShed low=half", "TBucketShed: bad low 'half'"),
    ("TBucketShed medium=50", "TBucketShed: unknown option 'medium=50'"),
    ("TBucketShed 50", "TBucketShed: unknown option '50'"),
    ("TBucketShed", "TBucketShed: expected low=P"),
    ("TBucketShedRetryAfter 0", "TBucketShedRetryAfter: bad seconds '0'"),
    ("TBucketShedRetryAfter soon",
     "TBucketShedRetryAfter: bad seconds 'soon'"),
    ("<Location /x>\nTBucketShed low=50\n</Location>",
     "TBucketShed not allowed in <Location> context"),
]


# apache2 -t refuses every bad value and names the directive and value.
@pytest.mark.parametrize("line,msg", BAD)
def test_module_154_01(apache_factory, line, msg):
    a = apache_factory(mpm="prefork")
    rc, out = a.configtest("TBucketEnable On\n" + line + "\n")
    assert rc != 0
    assert msg in out, out


# A scope with only local directives is a valid enabled scope: no warning
# that requests are not limited; TBucketShed where nothing is enabled is.
def test_module_154_02(apache_factory):
    a = apache_factory(mpm="prefork")
    rc, out = a.configtest("""
<Location /a>
    TBucketEnable On
    TBucketLocalConcurrency 4
</Location>
""")
    assert rc == 0 and "TB00101" not in out, out
    rc, out = a.configtest("TBucketEnable On\nTBucketShed low=50\n")
    assert rc == 0 and "TB00101" not in out, out
    rc, out = a.configtest("TBucketShed low=50\n")
    assert rc == 0 and "TBucketShed in the main server, but TBucketEnable "\
        "On nowhere there" in out, out
