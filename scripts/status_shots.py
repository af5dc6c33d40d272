#!/usr/bin/python3
"""status_shots.py -- the three screenshots of docs/operations.md's
"Reading the page during an incident", from real runs: a real Redis and a
real Apache (tests/integration/tbtest starts both on free loopback ports
in temp dirs and stops them by PID), real traffic, and the status page's
HTML view taken by headless Chromium at 1280 pixels.

    TB_BUILD=build /usr/bin/python3 scripts/status_shots.py [login|flood|redis]...

Writes docs/status-incident-<name>.png. Each run lasts about two minutes,
all traffic to loopback, bounded in time.
"""
import os
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "integration"))

from tbtest.apache import Apache, http_get  # noqa: E402
from tbtest.env import Redis, chromium  # noqa: E402

STATUS = """
<Location /tbucket-status>
    SetHandler tbucket-status
    Require ip 127.0.0.1
</Location>
"""

SLOW_CGI = "#!/bin/sh\nsleep 1\necho Content-Type: text/plain\necho\necho ok\n"


def pace(seconds, fn, per_second):
    """Call fn() about per_second times a second for seconds."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        t0 = time.monotonic()
        for _ in range(per_second):
            fn()
        time.sleep(max(0.0, 1.0 - (time.monotonic() - t0)))


def login(a, r):
    """Normal logins, then an attack trying 40 user names from one
    address: the user rule refuses, then bans each name."""
    a.start("""
TBucketRedis %s timeout=200
TBucketPrefix shot:
<Location /login>
    TBucketEnable On
    TBucketRule ip "%%{REMOTE_ADDR}" 100 10/s
    TBucketRule user "%%{HTTP:X-User}" 3 1/m ban=10m
</Location>
%s""" % (r.url, STATUS))
    users = iter(range(10 ** 6))
    pace(30, lambda: http_get(a.url("/login/ok.txt"),
                              {"X-User": "u%d" % next(users)}), 3)
    n = [0]

    def attack():
        n[0] += 1
        http_get(a.url("/login/ok.txt"), {"X-User": "victim%d" % (n[0] % 40)})
    pace(60, attack, 12)
    pace(20, lambda: http_get(a.url("/login/ok.txt"),
                              {"X-User": "u%d" % next(users)}), 3)


def flood(a, r):
    """A slow page (1 s, priority low, at most 4 in flight) flooded by
    16 clients while normal pages are asked: the low ones are shed or
    refused by the local cap, the server keeps serving."""
    a.write_file("cgi-bin/slow.cgi", SLOW_CGI, 0o755)
    a.start("""
TBucketRedis %s timeout=200
TBucketPrefix shot:
TBucketShed low=25 normal=90
<Location /cgi-bin/slow.cgi>
    TBucketPriority low
    TBucketLocalConcurrency 4
</Location>
<Location /limited>
    TBucketEnable On
    TBucketLimit 100 50/s
</Location>
%s""" % (r.url, STATUS))
    normal = lambda: http_get(a.url("/limited/ok.txt"))  # noqa: E731
    pace(30, normal, 5)
    stop = time.monotonic() + 60

    def flooder():
        while time.monotonic() < stop:
            try:
                http_get(a.url("/cgi-bin/slow.cgi"), timeout=5)
            except Exception:
                time.sleep(0.1)
    threads = [threading.Thread(target=flooder) for _ in range(16)]
    for t in threads:
        t.start()
    pace(60, normal, 5)
    for t in threads:
        t.join(timeout=10)
    pace(20, normal, 5)


def redis_down(a, r):
    """Steady traffic under the local policy; Redis stopped for 40 s,
    then started again: the breaker opens, local decides, then Redis
    decides again."""
    a.start("""
TBucketRedis %s timeout=50 connect_timeout=50
TBucketFailurePolicy local
TBucketBreaker threshold=3 cooldown=5s
TBucketPrefix shot:
<Location /limited>
    TBucketEnable On
    TBucketKey "%%{HTTP:X-Key}"
    TBucketLimit 20 5/s
</Location>
%s""" % (r.url, STATUS))
    keys = iter(range(10 ** 6))
    hit = lambda: http_get(a.url("/limited/ok.txt"),  # noqa: E731
                           {"X-Key": "k%d" % (next(keys) % 8)})
    pace(40, hit, 10)
    r.stop()
    pace(40, hit, 10)
    r.start()
    pace(30, hit, 10)


RUNS = {"login": (login, "prefork", 4), "flood": (flood, "prefork", 8),
        "redis": (redis_down, "event", 2)}


def shoot(name):
    fn, mpm, servers = RUNS[name]
    r = Redis(tempfile.mkdtemp(prefix="tbshot-")).start()
    a = Apache(mpm=mpm, servers=servers)
    try:
        fn(a, r)
        out = os.path.join(ROOT, "docs", "status-incident-%s.png" % name)
        rc, _, err = chromium(["--screenshot=" + out,
                               "--window-size=1280,1500", "--hide-scrollbars",
                               a.url("/tbucket-status?view=html")])
        if rc:
            raise RuntimeError(err[-2000:])
        print(out)
    finally:
        a.stop()
        a.cleanup()
        r.stop()


if __name__ == "__main__":
    for n in sys.argv[1:] or sorted(RUNS):
        shoot(n)
