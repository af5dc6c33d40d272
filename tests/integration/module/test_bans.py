"""test_bans.py -- refusals and bans that must not hurt the innocent,
through a real Apache, Redis and Debian's fail2ban-regex.

A rule whose key is a constant ("all") is one bucket for every client: a
refusal by it is logged under a tag of its own (TB00162), never as the
TB00160 line fail2ban bans from, and a plain per-address rate beside it
keeps one address from emptying it. `tbucket unban` lets the key's
owner back in: it refills the key's bucket for the rule unless told to
keep it.
"""
import http.client
import os
import re
import subprocess

from tbtest.env import BUILD, fail2ban_hosts


def get(a, path, src):
    """One GET from source address src on a fresh connection: (status,
    body text)."""
    conn = http.client.HTTPConnection("127.0.0.1", a.port, timeout=15,
                                      source_address=(src, 0))
    conn.request("GET", path, headers={"Connection": "close"})
    r = conn.getresponse()
    body = r.read().decode(errors="replace")
    conn.close()
    return r.status, body


def site(redis, prefix, rules):
    return """
TBucketRedis %s timeout=1000
TBucketPrefix %s
TBucketRefusalLog notice
<Location /login/>
    TBucketEnable On
%s
</Location>
""" % (redis.url, prefix, rules)


def start(apache_factory, body):
    a = apache_factory()
    a.write_file("htdocs/login/ok.txt", "ok\n")
    return a.start(body)


def tag_lines(a, tag):
    return [ln for ln in a.read_log().splitlines() if tag + ":" in ln]


OTHERS = ["127.0.0.%d" % i for i in range(2, 6)]

# The address rule counts failures (401) only: the loop's 200s pass it.
DRAIN = """    TBucketRule ip  "%{REMOTE_ADDR}" 5 1/h count=401 ban=1h
    TBucketRule all "all" 20 1/h"""


# One address looping a request the address rule does not count empties
# the `all` bucket; other addresses are then refused by `all`, and the
# refusals are logged as TB00162 (rule all, the constant key), never as
# TB00160: fail2ban-regex with conf/fail2ban's filter matches none.
def test_module_250_01(apache_factory, redis_server):
    a = start(apache_factory, site(redis_server, "d1:", DRAIN))
    codes = [get(a, "/login/ok.txt", "127.0.0.9")[0] for _ in range(22)]
    assert codes == [200] * 20 + [429] * 2, codes
    for src in OTHERS:
        st, body = get(a, "/login/ok.txt", src)
        assert st == 429 and '"rule":"all"' in body, (src, st, body)
    lines = tag_lines(a, "TB00162")
    assert len(lines) == 2 + len(OTHERS), lines
    for src in OTHERS:
        assert any("client=%s " % src in ln and ln.endswith(
            "rule=all (a rule whose key is the same for every client, not "
            "this client's own doing)") for ln in lines), (src, lines)
    assert tag_lines(a, "TB00160") == []
    assert fail2ban_hosts(a.error_log) == []
    a.assert_log_clean(allowed=("TB00162",))


# The guide's pairing: a plain per-address rate (no count=) beside `all`
# refuses the looping address by its own rule before `all` is empty (a
# refused request charges no rule), so other addresses keep getting in;
# the loop's refusals are its own (TB00160 rule=addr), and fail2ban finds
# the looping address alone.
def test_module_250_02(apache_factory, redis_server):
    rules = DRAIN + '\n    TBucketRule addr "%{REMOTE_ADDR}" 5 1/h'
    a = start(apache_factory, site(redis_server, "d2:", rules))
    got = [get(a, "/login/ok.txt", "127.0.0.9") for _ in range(25)]
    assert [st for st, _ in got] == [200] * 5 + [429] * 20, got
    assert all('"rule":"addr"' in body for _, body in got[5:])
    for src in OTHERS:
        assert [get(a, "/login/ok.txt", src)[0] for _ in range(3)] == \
            [200] * 3, src
    left = float(redis_server.client().hget(b"d2:{all}:rule:all", "tokens"))
    assert 20 - 5 - 3 * len(OTHERS) - 0.1 < left < 20 - 5 - 3 * len(OTHERS) \
        + 0.1, left
    assert tag_lines(a, "TB00162") == []
    assert len(tag_lines(a, "TB00160")) == 20
    assert fail2ban_hosts(a.error_log) == ["127.0.0.9"] * 20
    a.assert_log_clean(allowed=("TB00160",))


# Only a key with no variable and no function is a constant: a key
# mixing a literal with a header is the client's, and its refusals stay
# TB00160 lines fail2ban reads.
def test_module_250_03(apache_factory, redis_server):
    rules = '    TBucketRule site "site-%{HTTP:X-Site}" 2 1/h'
    a = start(apache_factory, site(redis_server, "d3:", rules))
    codes = [get(a, "/login/ok.txt", "127.0.0.7")[0] for _ in range(3)]
    assert codes == [200, 200, 429], codes
    assert tag_lines(a, "TB00162") == []
    assert len(tag_lines(a, "TB00160")) == 1
    assert fail2ban_hosts(a.error_log) == ["127.0.0.7"]
