"""test_rules.py -- TBucketRule: several limits per request, each keyed by
its own expression, charged before the handler or by the response's
status (count=), with bans every replica honours; %{FORM:field} keys; keys
decided after authentication; the tool's bans, ban and unban; the status
page's counts; the errors apache2 -t names.

The CGI login.cgi stands in for a legacy login: it answers the status its
query string names (401 for a failed login, 200, 302...), records every
request that reached it (its body's length and checksum) in a file, and
echoes the body back.
"""
import hashlib
import http.client
import os
import socket
import subprocess
import time

import pytest

from tbtest.apache import assert_refused, metric, metric_sum
from tbtest.env import BUILD, wait_until

LOGIN_CGI = r"""#!/bin/sh
body=$(cat)
sum=$(printf '%s' "$body" | sha256sum | cut -c1-16)
printf '%s %s %s\n' "${#body}" "$sum" "$REMOTE_ADDR" >> "$(dirname "$0")/../state/reached"
echo "Status: ${QUERY_STRING:-200}"
echo "Content-Type: text/plain"
echo
printf 'len=%s sum=%s user=%s\n' "${#body}" "$sum" "$REMOTE_USER"
"""


def events(text, rule, *names):
    """The status page's tbucket_limit_events_total of the limit rule,
    for each event named."""
    return [metric(text, "tbucket_limit_events_total", limit=rule, event=e)
            for e in names]


def tool(*args, timeout=20):
    return subprocess.run([os.path.join(BUILD, "tbucket")] + list(args),
                          capture_output=True, text=True, timeout=timeout)


def request(a, path, body=None, src="127.0.0.1", headers=None,
            ctype="application/x-www-form-urlencoded", conn=None):
    """One request from source address src (a fresh connection unless
    conn is given): (status, headers dict, body text)."""
    own = conn is None
    if own:
        conn = http.client.HTTPConnection("127.0.0.1", a.port, timeout=15,
                                          source_address=(src, 0))
    h = dict(headers or {})
    if body is not None:
        h.setdefault("Content-Type", ctype)
    if own:
        h.setdefault("Connection", "close")
    conn.request("POST" if body is not None else "GET", path,
                 body=body, headers=h)
    r = conn.getresponse()
    text = r.read().decode(errors="replace")
    out = (r.status, {k.lower(): v for k, v in r.getheaders()}, text)
    if own:
        conn.close()
    return out


def login(a, user, status=401, src="127.0.0.1", extra=""):
    body = "log=%s&pwd=secret%s" % (user, extra)
    return request(a, "/cgi-bin/login.cgi?%d" % status, body, src=src)


def reached(a):
    path = os.path.join(a.root, "state", "reached")
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [line.split() for line in f.read().splitlines()]


def site(redis, prefix, rules, extra="", where="/cgi-bin/login.cgi"):
    return """
TBucketRedis %s timeout=1000
TBucketPrefix %s
TBucketRefusalLog notice
LogFormat "%%h %%>s %%{TBUCKET_DECISION}e %%{TBUCKET_RULE}e %%U" rules
CustomLog logs/rules.log rules
<Location %s>
    TBucketEnable On
%s
</Location>
<Location /tbucket-status>
    SetHandler tbucket-status
</Location>
%s
""" % (redis.url, prefix, where, rules, extra)


def writable_state(a):
    """A directory the CGI (www-data) may write its record into."""
    os.makedirs(os.path.join(a.root, "state"), exist_ok=True)
    os.chmod(os.path.join(a.root, "state"), 0o777)


def start(apache_factory, body, mpm="event"):
    a = apache_factory(mpm=mpm)
    a.write_file("cgi-bin/login.cgi", LOGIN_CGI, 0o755)
    writable_state(a)
    return a.start(body)


RULES = """    TBucketRule ip   "%{REMOTE_ADDR}" 6 1/m count=401
    TBucketRule user "%{FORM:log}"    3 1/m count=401
    TBucketRule all  "all"            1000 100/s"""


# Rules on different keys, alone and together: each address and each
# user has its own bucket; a request refused by one rule charges no other
# (all or nothing); the constant key is one bucket for everyone; a GET of
# the login page (no form field) is not counted by the user rule.
def test_module_180_01(apache_factory, redis_server):
    r = redis_server.client()
    a = start(apache_factory, site(redis_server, "r1:", RULES))
    for _ in range(3):
        assert login(a, "alice", src="127.0.0.2")[0] == 401
    st, h, body = login(a, "alice", src="127.0.0.2")
    assert st == 429 and '"rule":"user"' in body, (st, body)
    # The refusal charged neither the address nor everyone.
    ip = float(r.hget(b"r1:{127.0.0.2}:rule:ip", "tokens"))
    assert 2.9 < ip < 3.2, ip
    # Another address is refused for alice too (the user's bucket), and
    # its own address bucket stays whole.
    assert login(a, "alice", src="127.0.0.3")[0] == 429
    # (The address is decided before the body is read, then given back
    # when the user's rule refuses: absent or whole.)
    ip3 = r.hget(b"r1:{127.0.0.3}:rule:ip", "tokens")
    assert ip3 is None or float(ip3) == 6, ip3
    # The first address may still try other users, until its own 6.
    codes = [login(a, "u%d" % i, src="127.0.0.2")[0] for i in range(4)]
    assert codes == [401, 401, 401, 429], codes
    st, _, body = login(a, "zed", src="127.0.0.2")
    assert st == 429 and '"rule":"ip"' in body
    # GETs: no form field, the user rule does not apply; ip still does.
    assert request(a, "/cgi-bin/login.cgi?200", src="127.0.0.4")[0] == 200
    assert r.hget(b"r1:{all}:rule:all", "tokens") is not None
    assert len(reached(a)) == 3 + 3 + 1, reached(a)
    a.assert_log_clean(allowed=("TB00160",))


# count= with statuses and classes: only the statuses a rule names are
# charged (a successful login never is), a request is refused while the
# bucket holds less than its cost, and a refused request never reaches
# the handler. A client that waits for each answer is never one charge
# behind: on a kept-alive connection and on fresh ones alike, exactly
# capacity failures reach the CGI.
@pytest.mark.parametrize("mpm", ["event", "prefork"])
def test_module_180_02(apache_factory, redis_server, mpm):
    rules = """    TBucketRule fail "%{HTTP:X-Client}" 4 1/h count=401,403
    TBucketRule err  "%{HTTP:X-Client}" 3 1/h count=5xx"""
    a = start(apache_factory, site(redis_server, "r2:" + mpm, rules), mpm)
    path = "/cgi-bin/login.cgi"

    def go(status, who, conn=None):
        return request(a, "%s?%d" % (path, status), "x=1", conn=conn,
                       headers={"X-Client": who})[0]

    # Successes and other statuses are never charged.
    assert [go(s, "ok") for s in (200, 302, 404, 200) * 5] == \
        [200, 302, 404, 200] * 5
    # Failures on one kept-alive connection: exactly 4, then 429.
    conn = http.client.HTTPConnection("127.0.0.1", a.port, timeout=15)
    got = [go(401, "kept", conn) for _ in range(6)]
    conn.close()
    assert got == [401, 401, 401, 401, 429, 429], got
    # Fresh connections, a mix of counted statuses.
    got = [go(s, "fresh") for s in (403, 401, 403, 401, 401)]
    assert got == [403, 401, 403, 401, 429], got
    # A class: any 5xx counts toward err.
    got = [go(s, "c5") for s in (500, 503, 502, 500)]
    assert got == [500, 503, 502, 429], got
    # Reached: 20 + 4 + 4 + 3; the refusals never did.
    assert len(reached(a)) == 31, len(reached(a))
    text = request(a, "/tbucket-status")[2]
    assert events(text, "fail", "charged", "refused") == [8, 3]
    assert events(text, "err", "charged") == [3]


# Bans across replicas: a refusal by a rule with ban= bans the key on
# every replica at once, with Retry-After the ban's time left and the
# decision "banned"; nothing is charged while it holds; it expires on its
# own; tbucket lists it and unban lifts it (and refills the bucket).
def test_module_180_03(apache_factory, redis_server):
    rules = """    TBucketRule ip "%{REMOTE_ADDR}" 2 1/s count=401 ban=3s
    TBucketRule user "%{FORM:log}" 2 1/m count=401 ban=1h"""
    body = site(redis_server, "r3:", rules)
    a, b = start(apache_factory, body), start(apache_factory, body)
    r = redis_server.client()
    assert login(a, "bob", src="127.0.0.5")[0] == 401
    assert login(b, "bob", src="127.0.0.5")[0] == 401
    st, h, text = login(a, "bob", src="127.0.0.5")
    # The address is decided before the body is read: its refusal bans it
    # (3 s) and bob's bucket is not reached.
    assert st == 429 and h["retry-after"] == "3", (st, h, text)
    assert '"rule":"ip"' in text
    # From another address, bob's empty bucket refuses and bans him.
    st, h, text = login(a, "bob", src="127.0.0.6")
    assert st == 429 and h["retry-after"] == "3600", (st, h, text)
    assert '"rule":"user"' in text
    for srv in (a, b):
        st, h, text = login(srv, "bob", src="127.0.0.6")
        assert st == 429 and '"error":"banned"' in text, text
        assert 3590 <= int(h["retry-after"]) <= 3600, h
    # What the address's bucket reserved was given back each time.
    ip6 = r.hget(b"r3:{127.0.0.6}:rule:ip", "tokens")
    assert ip6 is None or float(ip6) == 2, ip6
    # The address ban (3 s) expires; bob's stays.
    out = tool("bans", "--url", redis_server.url, "--prefix", "r3:")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()[1:]
    assert any(x.split()[:2] == ["user", "bob"] for x in lines), lines
    assert any(x.split()[:2] == ["ip", "127.0.0.5"] for x in lines), lines
    wait_until(lambda: login(b, "carol", 200, src="127.0.0.5")[0] == 200,
               timeout=6)
    assert login(b, "bob", 200, src="127.0.0.7")[0] == 429
    # Unban: bob may try again at once, on every replica.
    out = tool("unban", "user", "bob", "--url", redis_server.url,
               "--prefix", "r3:")
    assert out.returncode == 0 and "unbanned" in out.stdout, out
    # His bucket was refilled too: his next login gets in.
    assert login(b, "bob", 302, src="127.0.0.8")[0] == 302
    # A ban by hand holds on every replica too.
    out = tool("ban", "ip", "127.0.0.9", "1h", "--url", redis_server.url,
               "--prefix", "r3:")
    assert out.returncode == 0, out
    for srv in (a, b):
        assert login(srv, "dan", 200, src="127.0.0.9")[0] == 429
    wait_until(lambda: " 429 banned user " in open(os.path.join(
        a.root, "logs", "rules.log")).read())
    bad = tool("ban", "ip", "x", "10y", "--url", redis_server.url)
    assert bad.returncode == 64 and "DURATION" in bad.stderr


def chunked(a, path, parts, delay=0.0, ctype=None):
    """POST parts as a chunked body, sleeping delay between them."""
    s = socket.create_connection(("127.0.0.1", a.port), timeout=15)
    head = ("POST %s HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
            "Content-Type: %s\r\nTransfer-Encoding: chunked\r\n\r\n"
            % (path, ctype or "application/x-www-form-urlencoded"))
    s.sendall(head.encode())
    for p in parts:
        time.sleep(delay)
        s.sendall(b"%x\r\n%s\r\n" % (len(p), p))
    s.sendall(b"0\r\n\r\n")
    data = b"".join(iter(lambda: s.recv(65536), b""))
    s.close()
    status = int(data.split(b" ", 2)[1])
    return status, data.split(b"\r\n\r\n", 1)[1].decode()


# %{FORM:field}: the field of an exact, a chunked and a slow body is the
# key, and the handler gets every byte; a body over TBucketFormLimit, not
# a form, with a NUL, or naming the field twice or as an array shares one
# key (padding or decoys cannot evade the rule); an absent field or no
# body leaves the rule out; PHP's reading of %-encoded names is ours.
def test_module_180_04(apache_factory, redis_server):
    rules = """    TBucketRule user "%{FORM:log}" 2 1/h count=401
    TBucketFormLimit 256"""
    a = start(apache_factory, site(redis_server, "r4:", rules))
    r = redis_server.client()

    def users():
        return sorted(k for k in r.keys(b"r4:{*}:rule:user"))

    body = "pwd=x&log=erin&z=" + "q" * 100
    st, _, text = request(a, "/cgi-bin/login.cgi?401", body)
    assert st == 401
    assert "len=%d sum=%s" % (len(body), hashlib.sha256(
        body.encode()).hexdigest()[:16]) in text
    assert users() == [b"r4:{erin}:rule:user"]
    # Chunked, and slow (pieces a quarter second apart).
    st, text = chunked(a, "/cgi-bin/login.cgi?401",
                       [b"log=fr", b"ank&pwd=", b"y"])
    assert st == 401 and "len=15" in text, text
    st, text = chunked(a, "/cgi-bin/login.cgi?401",
                       [b"log=gi", b"na&p", b"wd=1"], delay=0.25)
    assert st == 401 and "len=14" in text, text
    assert b"r4:{frank}:rule:user" in users()
    assert b"r4:{gina}:rule:user" in users()
    # Encoded names: PHP's $_POST['log'] is the key.
    assert request(a, "/cgi-bin/login.cgi?401", "l%6fg=hank&pwd=1")[0] \
        == 401
    assert b"r4:{hank}:rule:user" in users()
    # Over the limit, not a form, a NUL: one shared key for all of them,
    # so two padded tries and a third in JSON exhaust it together.
    pad = "log=ivan&pwd=x&pad=" + "p" * 400
    assert request(a, "/cgi-bin/login.cgi?401", pad)[0] == 401
    st, _, text = request(a, "/cgi-bin/login.cgi?401",
                          pad.replace("ivan", "jack"))
    assert st == 401 and "len=%d" % len(pad) in text
    st, _, text = request(a, "/cgi-bin/login.cgi?401", '{"log":"kim"}',
                          ctype="application/json")
    assert st == 429 and '"rule":"user"' in text, text
    st, _, _ = request(a, "/cgi-bin/login.cgi?401", "log=lu%00cy&p=1")
    assert st == 429
    # A field given twice (in spellings PHP merges) or as an array: the
    # shared key too, never either value's.
    for body in ("log=decoy&l%6fg=ivan", "log%00x=decoy&log=ivan",
                 "log[]=ivan"):
        assert request(a, "/cgi-bin/login.cgi?401", body)[0] == 429, body
    assert b"r4:{decoy}:rule:user" not in users()
    assert b"r4:{ivan}:rule:user" not in users()
    assert len(users()) == 5, users()
    # No field, no body: the rule does not apply.
    assert request(a, "/cgi-bin/login.cgi?401", "pwd=only")[0] == 401
    assert request(a, "/cgi-bin/login.cgi?401")[0] == 401
    assert len(users()) == 5
    a.assert_log_clean(allowed=("TB00160",))


# %{FORMLOGIN:field}: the spellings an application folds into one user
# (case, spaces around) are one key; those it folds in ways not followed
# (markup, entities, accents, invisible characters) share another.
def test_module_180_05(apache_factory, redis_server):
    rules = '    TBucketRule user "%{FORMLOGIN:log}" 3 1/h count=401'
    a = start(apache_factory, site(redis_server, "r5:", rules))
    got = [login(a, u)[0] for u in ("Admin", "+admin+", "++ADMIN",
                                    "ADMIN")]
    assert got == [401, 401, 401, 429], got
    assert redis_server.client().keys(b"r5:{*") == [b"r5:{admin}:rule:user"]
    got = [login(a, u)[0] for u in ("ad%3Cb%3Emin", "%C3%A1dmin",
                                    "admin%26x%3B", "ad%E2%80%8Bmin")]
    assert got == [401, 401, 401, 429], got
    assert len(redis_server.client().keys(b"r5:{*")) == 2


# Keys that need authentication or another module are decided after it:
# a rule on %{REMOTE_USER} behind mod_auth_basic, and one on an ENV
# variable a per-directory RewriteRule sets (in fixups). Both are counted
# per user, and the first's refusal names it.
def test_module_180_06(apache_factory, redis_server):
    a = apache_factory(modules=("auth_basic", "authn_file", "authn_core",
                                "authz_user"))
    a.write_file("cgi-bin/login.cgi", LOGIN_CGI, 0o755)
    writable_state(a)
    htpasswd = os.path.join(a.root, "conf", "htpasswd")
    subprocess.run(["htpasswd", "-cbB", htpasswd, "alice", "pw1"],
                   check=True, capture_output=True)
    subprocess.run(["htpasswd", "-bB", htpasswd, "bob", "pw2"], check=True,
                   capture_output=True)
    rules = """    AuthType Basic
    AuthName "t"
    AuthUserFile %s
    Require valid-user
    TBucketRule user "%%{REMOTE_USER}" 2 1/h
    RewriteEngine On
    RewriteRule ^ - [E=TENANT:t-%%{HTTP:X-Tenant}]
    TBucketRule tenant "%%{ENV:TENANT}" 3 1/h""" % htpasswd
    a.start(site(redis_server, "r6:", rules))
    import base64

    def get(user, pw, tenant="x"):
        cred = base64.b64encode(("%s:%s" % (user, pw)).encode()).decode()
        return request(a, "/cgi-bin/login.cgi?200", headers={
            "Authorization": "Basic " + cred, "X-Tenant": tenant})

    assert [get("alice", "pw1", "a")[0] for _ in range(3)] == [200, 200,
                                                               429]
    st, _, text = get("alice", "pw1", "b")
    assert st == 429 and '"rule":"user"' in text
    # A failed authentication never reaches the rules.
    assert get("alice", "wrong")[0] == 401
    # Tenant a has one of its 3 left; bob's own user bucket is full.
    assert [get("bob", "pw2", "a")[0] for _ in range(2)] == [200, 429]
    st, _, text = get("bob", "pw2", "c")
    assert st == 200
    # Refused requests wrote nothing (alice's try as tenant b).
    keys = sorted(redis_server.client().keys(b"r6:{*"))
    assert keys == [b"r6:{alice}:rule:user", b"r6:{bob}:rule:user",
                    b"r6:{t-a}:rule:tenant", b"r6:{t-c}:rule:tenant"], keys


# The headers describe the most restrictive rule; the 429 body, the
# TB00160 line and TBUCKET_RULE (the access log) name the refusing rule;
# the status page counts each rule's events and the top keys show the
# rule's key.
def test_module_180_07(apache_factory, redis_server):
    rules = """    TBucketRule wide "%{REMOTE_ADDR}" 50 1/m
    TBucketRule tight "%{HTTP:X-User}" 2 1/m ban=1m
    TBucketHeaders both"""
    a = start(apache_factory, site(redis_server, "r7:", rules))
    st, h, _ = request(a, "/cgi-bin/login.cgi", headers={"X-User": "mo"})
    assert st == 200 and h["x-ratelimit-limit"] == "2", h
    assert h["x-ratelimit-remaining"] == "1"
    assert h["ratelimit-policy"].startswith('"tight";q=2'), h
    request(a, "/cgi-bin/login.cgi", headers={"X-User": "mo"})
    st, h, text = request(a, "/cgi-bin/login.cgi", headers={"X-User": "mo"})
    assert st == 429 and h["retry-after"] == "60"
    assert text.strip() == '{"error":"rate limited","rule":"tight",' \
                           '"retry_after":60}'
    st, h, text = request(a, "/cgi-bin/login.cgi", headers={"X-User": "mo"})
    assert '"error":"banned"' in text and h["x-ratelimit-remaining"] == "0"
    log = a.read_log()
    assert 'net=127.0.0.1 key="mo" limit="tight"' in log
    assert "rule=tight" in log
    assert "rule=tight banned" in log
    wait_until(lambda: " 429 banned tight " in open(
        os.path.join(a.root, "logs", "rules.log")).read())
    text = request(a, "/tbucket-status")[2]
    assert events(text, "tight", "applied", "ban", "banned") == [4, 1, 1]
    html = request(a, "/tbucket-status?view=html")[2]
    assert '<h2 id="limits">Limits</h2>' in html
    assert "<code>tight</code>" in html
    top = request(a, "/tbucket-status?json")[2]
    assert '"mo"' in top, top[:2000]


BAD = [
    ('TBucketRule "bad name" all 5 1/m', "bad name 'bad name'"),
    ("TBucketRule %s all 5 1/m" % ("x" * 33), "bad name"),
    ("TBucketRule ip all 5 1/m\nTBucketRule ip all 6 1/m",
     "already"),
    ("TBucketRule ip all 5 1/m color=red", "unknown option 'color=red'"),
    ("TBucketRule ip all 5 1/m count=abc", "bad count 'abc'"),
    ("TBucketRule ip all 5 1/m count=600", "bad count '600'"),
    ("TBucketRule ip all 5 1/m count=6xx", "bad count '6xx'"),
    ("TBucketRule ip all 5 1/m ban=0", "bad ban '0'"),
    ("TBucketRule ip all 5 1/m ban=-1s", "bad ban '-1s'"),
    ("TBucketRule ip all 5 1/m ban=10y", "bad ban '10y'"),
    ("TBucketRule ip all 5 1/m ban=31d", "bad ban '31d'"),
    ("TBucketRule ip all 5 1/m cost=6", "bad cost '6'"),
    ("TBucketRule ip all 0 1/m", "bad capacity '0'"),
    ("TBucketRule ip all 5 fast", "bad rate 'fast'"),
    ("TBucketRule ip all 5", "expected NAME KEY CAPACITY RATE"),
    ('TBucketRule ip "%{HTTP:X-A" 5 1/m', "bad key"),
    ("TBucketFormLimit 0", "TBucketFormLimit: bad size '0'"),
    # One maximum for every named limit of a scope, whatever spells it.
    ("\n".join("TBucketRule r%d all 5 1/m" % i for i in range(16)),
     "at most 15 named limits"),
    ("TBucketRule ip all 5 1/m\nTBucketAlgorithm gcra",
     "TBucketAlgorithm gcra applies there"),
    ("TBucketRule ip all 5 1/m\nTBucketShards 4",
     "TBucketShards 4 applies there"),
]


# apache2 -t names the directive and the bad value.
@pytest.mark.parametrize("lines,words", BAD, ids=[w for _, w in BAD])
def test_module_180_08(apache_factory, redis_server, lines, words):
    a = apache_factory()
    body = site(redis_server, "r8:", "    " + lines.replace("\n", "\n    "))
    out = assert_refused(a, body, words)
    assert "TBucket" in out


# A rule named Off in an inner scope removes the outer rule; an inner rule
# of the same name replaces it.
def test_module_180_09(apache_factory, redis_server):
    rules = """    TBucketRule a "%{HTTP:X-U}" 1 1/h
    TBucketRule b "%{HTTP:X-U}" 1 1/h"""
    extra = """
<Location /cgi-bin/login.cgi/free>
    TBucketRule a Off
    TBucketRule b "%{HTTP:X-U}" 5 1/h
</Location>"""
    a = start(apache_factory, site(redis_server, "r9:", rules, extra))
    h = {"X-U": "z"}
    assert request(a, "/cgi-bin/login.cgi", headers=h)[0] == 200
    assert request(a, "/cgi-bin/login.cgi", headers=h)[0] == 429
    h = {"X-U": "y"}
    got = [request(a, "/cgi-bin/login.cgi/free", headers=h)[0]
           for _ in range(6)]
    assert got == [200] * 5 + [429], got
    keys = redis_server.client().keys(b"r9:{y}*")
    assert keys == [b"r9:{y}:rule:b"], keys


# Redis Cluster with rule keys on different slots: each rule's bucket on
# its own primary; a refused request is charged nowhere; bans hold.
def test_module_180_10(apache_factory, cluster):
    from tbtest.core import keyslot

    class Url:
        url = cluster.url

    rules = """    TBucketRule ip "%{HTTP:X-IP}" 3 1/h ban=1h
    TBucketRule user "%{HTTP:X-User}" 5 1/h"""
    a = start(apache_factory, site(Url, "rc:", rules))
    ip = user = None
    for i in range(2000):
        k1 = b"rc:{10.0.%d.1}:rule:ip" % i
        k2 = b"rc:{u%d}:rule:user" % i
        if cluster.owner(keyslot(k1)) != cluster.owner(keyslot(k2)):
            ip, user, kip, kuser = "10.0.%d.1" % i, "u%d" % i, k1, k2
            break
    assert ip
    h = {"X-IP": ip, "X-User": user}
    got = [request(a, "/cgi-bin/login.cgi", headers=h)[0] for _ in range(5)]
    assert got == [200, 200, 200, 429, 429], got

    def tokens(k):
        node = cluster.by_port(cluster.owner(keyslot(k))).client()
        return float(node.hget(k, "tokens"))

    assert tokens(kip) < 0.01
    assert 1.9 < tokens(kuser) < 2.1
    st, hd, text = request(a, "/cgi-bin/login.cgi", headers=h)
    assert '"error":"banned"' in text and int(hd["retry-after"]) > 3500
    assert 1.9 < tokens(kuser) < 2.1


# The Redis module engine and the scripts, in turn on the same buckets:
# the same answers and the same state.
def test_module_180_11(apache_factory, mod_redis):
    r = mod_redis.client()
    states = {}
    for engine in ("script", "module"):
        r.flushall()

        class Url:
            url = mod_redis.url + " engine=" + engine

        a = start(apache_factory, site(Url, "re:", RULES.replace(
            "1000 100/s", "1000 1/h")))
        got = [login(a, "nina", src="127.0.0.2")[0] for _ in range(5)]
        got += [login(a, "oz%d" % i, src="127.0.0.2")[0] for i in range(5)]
        text = request(a, "/tbucket-status")[2]
        calls = metric_sum(text, "tbucket_redis_module_calls_total")
        a.stop()
        states[engine] = (got, sorted(
            (k, round(float(r.hget(k, "tokens")), 1))
            for k in r.keys(b"re:{*")))
        assert (calls > 0) == (engine == "module"), (engine, calls)
    assert states["script"] == states["module"], states
    assert states["script"][0] == [401, 401, 401, 429, 429,
                                   401, 401, 401, 429, 429]
