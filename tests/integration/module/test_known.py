"""test_known.py -- known clients (known= on TBucketRule): nobody can lock
the owner out. A client that logged in as a user keeps a budget of its own
for that name while the name is under attack: by a signed cookie
(TBucketSecret) or, with known-by=address, by its address marked in Redis.

The login is a real PHP form (login.php of test_login_defence.py's kind)
under php-cgi (Action); the tokens are checked here with the same
HMAC-SHA-256 the module uses, so the tests can forge, expire and move
them as an attacker would.
"""
import hashlib
import hmac
import http.client
import os
import subprocess
import time
import urllib.parse

from tbtest.env import free_port

LOGIN_PHP = r"""<?php
$log = isset($_POST['log']) && is_string($_POST['log']) ? $_POST['log'] : '';
$pwd = isset($_POST['pwd']) && is_string($_POST['pwd']) ? $_POST['pwd'] : '';
file_put_contents(__DIR__ . '/../state/reached',
    sprintf("%s %s\n", $_SERVER['REMOTE_ADDR'], $log === '' ? '-' : bin2hex($log)),
    FILE_APPEND | LOCK_EX);
if ($log !== '' && $pwd === 'right') {
    header('Location: /welcome', true, 302);
} else {
    echo "bad login\n";
}
"""

RULE = ('    TBucketRule user "%%{FORMLOGIN:log}" 3 1/m count=200 ban=15m '
        'known=30d%s')


def secret_file(a, name="secret", data=None, mode=0o600):
    path = os.path.join(a.root, "conf", name)
    with open(path, "wb") as f:
        f.write(data if data is not None else os.urandom(48))
    os.chmod(path, mode)
    return path


def token(secret_path, rule, key, exp):
    """One cookie entry as the module signs it."""
    with open(secret_path, "rb") as f:
        k = hashlib.sha256(f.read()).digest()
    kh = hmac.new(k, b"k\0" + rule.encode() + b"\0" + key.encode(),
                  hashlib.sha256).digest()[:4].hex()
    msg = b"m\0%s\0%s\0%d" % (rule.encode(), key.encode(), exp)
    mac = hmac.new(k, msg, hashlib.sha256).digest()[:16].hex()
    return "%s-%d-%s" % (kh, exp, mac)


def prepare(a):
    a.write_file("htdocs/login.php", LOGIN_PHP)
    state = os.path.join(a.root, "state")
    os.makedirs(state, exist_ok=True)
    os.chmod(state, 0o777)
    return a


def conf(redis, prefix, secret, rule_extra="", extra="", secrets=None):
    return """
TBucketRedis %s timeout=1000
TBucketPrefix %s
TBucketSecret %s
%s
<Location "/login.php">
    TBucketEnable On
%s
</Location>
<Location "/tbucket-status">
    SetHandler tbucket-status
</Location>
""" % (redis.url, prefix, secrets or secret, extra, RULE % rule_extra)


def post(a, user, pwd, src="127.0.0.1", cookie=None, headers=None):
    """(status, Set-Cookie values) of one login from src."""
    h = {"Content-Type": "application/x-www-form-urlencoded",
         "Connection": "close"}
    if cookie:
        h["Cookie"] = cookie
    h.update(headers or {})
    conn = http.client.HTTPConnection("127.0.0.1", a.port, timeout=20,
                                      source_address=(src, 0))
    try:
        conn.request("POST", "/login.php", urllib.parse.urlencode(
            {"log": user, "pwd": pwd}), h)
        r = conn.getresponse()
        r.read()
        return r.status, r.msg.get_all("Set-Cookie") or []
    finally:
        conn.close()


def cookie_of(set_cookies, name="tbk_user"):
    for c in set_cookies:
        if c.startswith(name + "="):
            return c.split(";", 1)[0]
    return None


def attack(a, user, n, first=0):
    """n wrong passwords on user's name from n other addresses."""
    return [post(a, user, "guess%d" % i, src="127.0.5.%d" % (first + i + 1))[0]
            for i in range(n)]


# The owner logs in, gets a cookie; an attack from many addresses bans her
# name; with her cookie she still logs in (a bucket of her own), without
# it she is refused as any unknown client; the cookie is HttpOnly,
# SameSite=Lax, Path=/, not Secure over plain HTTP.
def test_module_193_01(apache_factory, redis_server):
    a = prepare(apache_factory(mpm="prefork", servers=4))
    sec = secret_file(a)
    a.start(conf(redis_server, "kn:", sec))
    st, sc = post(a, "alice", "right", src="127.0.0.60")
    assert st == 302, st
    raw = [c for c in sc if c.startswith("tbk_user=")][0]
    assert "HttpOnly" in raw and "SameSite=Lax" in raw and "Path=/" in raw
    assert "Secure" not in raw and "Max-Age=2592000" in raw, raw
    jar = cookie_of(sc)
    got = attack(a, "alice", 8)
    assert got[:3] == [200] * 3 and set(got[3:]) == {429}, got
    # Her browser, from anywhere, logs in; the ban did not reach her.
    for i in range(3):
        assert post(a, "alice", "right", src="127.0.0.6%d" % i,
                    cookie=jar)[0] == 302
    # Her own failures count on her own bucket.
    assert post(a, "alice", "typo", cookie=jar)[0] == 200
    # A new browser of hers shares the unknown budget: refused.
    assert post(a, "alice", "right", src="127.0.0.70")[0] == 429
    r = redis_server.client()
    assert r.hget(b"kn:{alice}:rule:user", "ban") is not None
    text = post_status(a)
    # Her four decisions were known ones; three came while her name was
    # banned for everyone else (the typo too).
    known = [l for l in text.splitlines()
             if 'rule="user"' in l and 'event="known"' in l]
    spared = [l for l in text.splitlines()
              if 'rule="user"' in l and 'event="spared"' in l]
    assert known and known[0].split()[-1] == "4", known
    assert spared and spared[0].split()[-1] == "4", spared


def post_status(a):
    import requests
    return requests.get(a.url("/tbucket-status"), timeout=10).text


# Cookies an attacker can make: a forged HMAC, an expired entry, another
# name's entry, another rule's entry, garbage: all unknown (refused while
# the name is banned). A valid entry made with the secret works, also
# beside other names' entries (a family computer), and the cookie the
# module sets keeps the other names.
def test_module_193_02(apache_factory, redis_server):
    a = prepare(apache_factory(mpm="prefork", servers=4))
    sec = secret_file(a)
    a.start(conf(redis_server, "kc:", sec))
    attack(a, "alice", 5)
    now = int(time.time())
    good = token(sec, "user", "alice", now + 3600)
    bad = [good[:-1] + ("0" if good[-1] != "0" else "1"),
           token(sec, "user", "alice", now - 10),
           token(sec, "user", "bob", now + 3600),
           token(sec, "ip", "alice", now + 3600),
           "not-a-token", "x" * 5000]
    for c in bad:
        assert post(a, "alice", "right", cookie="tbk_user=" + c)[0] == 429, c
    # A valid entry under a cookie name that only looks like the rule's.
    for jar in ("xtbk_user=" + good, "tbk_userx=" + good, "tbk_ip=" + good,
                "a=tbk_user=" + good):
        assert post(a, "alice", "right", cookie=jar)[0] == 429, jar
    other = token(sec, "user", "bob", now + 3600)
    st, sc = post(a, "alice", "right",
                  cookie="tbk_user=%s.%s" % (other, good))
    assert st == 302
    kept = cookie_of(sc)
    assert other in kept and "alice" not in kept, kept


# Rotation: with TBucketSecret NEW OLD, cookies signed by the old secret
# still make their client known, and new cookies are signed by the new.
def test_module_193_03(apache_factory, redis_server):
    a = prepare(apache_factory(mpm="prefork", servers=4))
    old, new = secret_file(a, "old"), secret_file(a, "new")
    a.start(conf(redis_server, "kr:", old))
    jar = cookie_of(post(a, "alice", "right")[1])
    a.graceful(conf(redis_server, "kr:", new, secrets="%s %s" % (new, old)))
    attack(a, "alice", 5)
    st, sc = post(a, "alice", "right", cookie=jar)
    assert st == 302
    entry = cookie_of(sc).split("=", 1)[1].split(".")[0]
    exp = int(entry.split("-")[1])
    assert entry == token(new, "user", "alice", exp)


# known-by=address: a client that keeps no cookies (a script) is known by
# its address once it logged in; the attack from other addresses does
# not lock it out; other addresses stay unknown.
def test_module_193_04(apache_factory, redis_server):
    a = prepare(apache_factory(mpm="prefork", servers=4))
    sec = secret_file(a)
    a.start(conf(redis_server, "ka:", sec, " known-by=address"))
    assert post(a, "alice", "right", src="127.0.0.80")[0] == 302
    r = redis_server.client()
    assert r.exists(b"ka:{alice}:rule:user:known:127.0.0.80")
    assert 0 < r.pttl(b"ka:{alice}:rule:user:known:127.0.0.80") <= 30 * 86400000
    attack(a, "alice", 6)
    for _ in range(3):
        assert post(a, "alice", "right", src="127.0.0.80")[0] == 302
    assert post(a, "alice", "right", src="127.0.0.81")[0] == 429


# Secure: over TLS, and behind a proxy mod_remoteip trusts that says
# X-Forwarded-Proto: https; not from a proxy it does not trust.
def test_module_193_05(apache_factory, redis_server, tmp_path):
    a = prepare(apache_factory(mpm="event", servers=1,
                               modules=["ssl", "socache_shmcb", "remoteip"]))
    sec = secret_file(a)
    crt, key = str(tmp_path / "c.pem"), str(tmp_path / "k.pem")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048",
                    "-nodes", "-keyout", key, "-out", crt, "-days", "1",
                    "-subj", "/CN=localhost"], check=True,
                   capture_output=True, timeout=60)
    tls_port = free_port()
    extra = """RemoteIPHeader X-Forwarded-For
RemoteIPInternalProxy 127.0.0.1
Listen 127.0.0.1:%d
<VirtualHost 127.0.0.1:%d>
    SSLEngine on
    SSLCertificateFile %s
    SSLCertificateKeyFile %s
    <Location "/login.php">
        TBucketEnable On
    </Location>
</VirtualHost>""" % (tls_port, tls_port, crt, key)
    a.start(conf(redis_server, "ks:", sec, extra=extra))
    import ssl
    ctx = ssl._create_unverified_context()
    conn = http.client.HTTPSConnection("127.0.0.1", tls_port, context=ctx,
                                       timeout=20)
    conn.request("POST", "/login.php", "log=alice&pwd=right",
                 {"Content-Type": "application/x-www-form-urlencoded"})
    r = conn.getresponse()
    r.read()
    raw = [c for c in r.msg.get_all("Set-Cookie") or []
           if c.startswith("tbk_user=")]
    assert r.status == 302 and raw and "Secure" in raw[0], (r.status, raw)
    st, sc = post(a, "bob", "right", headers={
        "X-Forwarded-For": "203.0.113.9", "X-Forwarded-Proto": "https"})
    assert st == 302 and "Secure" in [c for c in sc
                                      if c.startswith("tbk_user=")][0]
    st, sc = post(a, "carol", "right", src="127.0.0.2", headers={
        "X-Forwarded-For": "203.0.113.9", "X-Forwarded-Proto": "https"})
    assert st == 302 and "Secure" not in [c for c in sc
                                          if c.startswith("tbk_user=")][0]


# apache2 -t: TBucketSecret refuses a missing file, a short one and one
# others can read, naming the directive and the file; known= without
# count= and a bad known-by= are refused; known= without TBucketSecret is
# refused; ban= on a form field without known= draws a warning.
def test_module_193_06(apache_factory, redis_server):
    a = prepare(apache_factory())
    good = secret_file(a)
    short = secret_file(a, "short", b"x" * 31)
    world = secret_file(a, "world", mode=0o644)
    base = "TBucketRedis %s\n" % redis_server.url
    for line, word in (("TBucketSecret /nonexistent/s", "/nonexistent/s"),
                       ("TBucketSecret %s" % short, short),
                       ("TBucketSecret %s" % world, world)):
        rc, out = a.configtest(base + line)
        assert rc != 0 and "TBucketSecret" in out and word in out, out
    rule = ('<Location /x>\nTBucketEnable On\n'
            'TBucketRule user "%%{FORM:log}" 3 1/m %s\n</Location>')
    for opts, word in (("known=30d", "known"),
                       ("count=200 known=3x", "3x"),
                       ("count=200 known=30d known-by=pigeon", "pigeon")):
        rc, out = a.configtest(base + "TBucketSecret %s\n" % good
                               + rule % opts)
        assert rc != 0 and "TBucketRule" in out and word in out, out
    rc, out = a.configtest(base + rule % "count=200 known=30d")
    assert rc != 0 and "TBucketSecret" in out, out
    rc, out = a.configtest(base + rule % "count=200 ban=15m")
    assert rc == 0 and "known=" in out and "lock" in out, out
    rc, out = a.configtest(base + "TBucketSecret %s\n" % good
                           + rule % "count=200 ban=15m known=30d")
    assert rc == 0 and "lock" not in out, out
