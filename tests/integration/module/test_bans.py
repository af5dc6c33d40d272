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

# A legacy login: answers the status its query string names (401 for a
# failed login, 302 for a good one).
LOGIN_CGI = r"""#!/bin/sh
cat >/dev/null
echo "Status: ${QUERY_STRING:-200}"
echo "Content-Type: text/plain"
echo
echo done
"""


def get(a, path, src, body=None):
    """One GET (a POST of the form body, when given) from source address
    src on a fresh connection: (status, body text)."""
    conn = http.client.HTTPConnection("127.0.0.1", a.port, timeout=15,
                                      source_address=(src, 0))
    h = {"Connection": "close"}
    if body is not None:
        h["Content-Type"] = "application/x-www-form-urlencoded"
    conn.request("POST" if body is not None else "GET", path, body=body,
                 headers=h)
    r = conn.getresponse()
    body = r.read().decode(errors="replace")
    conn.close()
    return r.status, body


def site(redis, prefix, rules, where="/login/"):
    return """
TBucketRedis %s timeout=1000
TBucketPrefix %s
TBucketRefusalLog notice
<Location %s>
    TBucketEnable On
%s
</Location>
""" % (redis.url, prefix, where, rules)


def start(apache_factory, body):
    a = apache_factory()
    a.write_file("htdocs/login/ok.txt", "ok\n")
    a.write_file("cgi-bin/login.cgi", LOGIN_CGI, 0o755)
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
def test_module_251_01(apache_factory, redis_server):
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
            "rule=all (a limit whose key is the same for every client, not "
            "this client's own doing)") for ln in lines), (src, lines)
    assert tag_lines(a, "TB00160") == []
    assert fail2ban_hosts(a.error_log) == []
    a.assert_log_clean(allowed=("TB00162",))


# The guide's pairing: a plain per-address rate (no count=) beside `all`
# refuses the looping address by its own rule before `all` is empty (a
# refused request charges no rule), so other addresses keep getting in;
# the loop's refusals are its own (TB00160 rule=addr), and fail2ban finds
# the looping address alone.
def test_module_251_02(apache_factory, redis_server):
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
def test_module_251_03(apache_factory, redis_server):
    rules = '    TBucketRule site "site-%{HTTP:X-Site}" 2 1/h'
    a = start(apache_factory, site(redis_server, "d3:", rules))
    codes = [get(a, "/login/ok.txt", "127.0.0.7")[0] for _ in range(3)]
    assert codes == [200, 200, 429], codes
    assert tag_lines(a, "TB00162") == []
    assert len(tag_lines(a, "TB00160")) == 1
    assert fail2ban_hosts(a.error_log) == ["127.0.0.7"]


def tool(*args):
    return subprocess.run([os.path.join(BUILD, "tbucket")] + list(args),
                          capture_output=True, text=True, timeout=20)


def login(a, user, status, src):
    return get(a, "/cgi-bin/login.cgi?%d" % status, src,
               "log=%s&pwd=x" % user)


# tbucket unban lets the owner back in: after an attack on alice's name
# her rule bucket is empty and banned; --keep-bucket lifts the ban alone,
# and her next correct login is refused (and banned again) by the empty
# bucket; a plain unban also refills the bucket, and her next correct
# login gets through at once.
def test_module_251_04(apache_factory, redis_server):
    rules = '    TBucketRule user "%{FORM:log}" 3 1/h count=401 ban=1h'
    a = start(apache_factory, site(redis_server, "u1:", rules,
                                   "/cgi-bin/login.cgi"))
    r = redis_server.client()
    url = ["--url", redis_server.url, "--prefix", "u1:"]
    codes = [login(a, "alice", 401, "127.0.0.%d" % i)[0]
             for i in range(20, 25)]
    assert codes == [401] * 3 + [429] * 2, codes
    bucket = b"u1:{alice}:rule:user"
    assert r.hget(bucket, "ban") is not None
    assert float(r.hget(bucket, "tokens")) < 0.01
    # Only the ban lifted: the empty bucket refuses her and bans again.
    out = tool("unban", "user", "alice", "--keep-bucket", *url)
    assert out.returncode == 0, out
    assert out.stdout.startswith("user alice: unbanned; its bucket kept"), \
        out.stdout
    assert "without --keep-bucket refills it" in out.stdout
    st, body = login(a, "alice", 302, "127.0.0.30")
    assert st == 429 and '"rule":"user"' in body, (st, body)
    assert r.hget(bucket, "ban") is not None
    # The plain unban refills: her next correct login gets in.
    out = tool("unban", "user", "alice", *url)
    assert out.returncode == 0, out
    assert out.stdout.strip() == "user alice: unbanned; its bucket refilled"
    assert r.exists(bucket) == 0
    assert login(a, "alice", 302, "127.0.0.30")[0] == 302
    listed = tool("bans", *url)
    assert listed.returncode == 0 and "alice" not in listed.stdout
    # Unbanning a key that is not banned says so, and still refills.
    assert [login(a, "bob", 401, "127.0.0.31")[0] for _ in range(3)] == \
        [401] * 3
    out = tool("unban", "user", "bob", *url)
    assert out.stdout.strip() == "user bob: was not banned; its bucket " \
                                 "refilled"
    assert login(a, "bob", 302, "127.0.0.31")[0] == 302


# TBucketKey set to a constant is one bucket for every client too: its
# refusals are TB00162 lines (no rule=), and fail2ban finds none; an
# inner scope keyed by the header again is the client's (TB00160).
def test_module_251_05(apache_factory, redis_server):
    body = """
TBucketRedis %s timeout=1000
TBucketPrefix k1:
TBucketRefusalLog notice
<Location /login/>
    TBucketEnable On
    TBucketKey "everyone"
    TBucketLimit 3 1/h
</Location>
<Location /login/own/>
    TBucketKey "%%{HTTP:X-Who}"
</Location>
""" % redis_server.url
    a = start(apache_factory, body)
    a.write_file("htdocs/login/own/ok.txt", "ok\n")
    codes = [get(a, "/login/ok.txt", "127.0.0.%d" % i)[0]
             for i in range(2, 7)]
    assert codes == [200] * 3 + [429] * 2, codes
    lines = tag_lines(a, "TB00162")
    assert len(lines) == 2 and all(
        'key="everyone"' in ln and "rule=" not in ln for ln in lines), lines
    assert tag_lines(a, "TB00160") == []
    assert fail2ban_hosts(a.error_log) == []
    codes = [get(a, "/login/own/ok.txt", "127.0.0.8")[0] for _ in range(4)]
    assert codes == [200] * 3 + [429], codes
    assert len(tag_lines(a, "TB00160")) == 1
    assert fail2ban_hosts(a.error_log) == ["127.0.0.8"]
