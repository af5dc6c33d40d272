"""test_login_defence.py -- the login defence against an attacker who has
read our code: the request shapes that once escaped count= rules, each
against a real PHP login form (login.php below) under the stacks that
deliver it differently: mod_php under prefork, php-fpm under event
(mod_proxy_fcgi), and php-cgi through Action (an internal redirect).

login.php stands in for a legacy login: it logs every attempt that reached
it (address, user name, the body's length) and answers 302 to alice's
right password, 200 with the form to anything else, as WordPress does.
Counts of attempts that reach PHP are judged against the bucket's bound,
capacity + rate x T.
"""
import concurrent.futures
import os
import socket
import subprocess
import time
import urllib.parse

import pytest

from tbtest.php import ModPhp, fpm_apache

LOGIN_PHP = r"""<?php
/* login.php: a legacy login. ?ms=N holds the attempt N ms first, as a
 * password hash would. */
$ms = isset($_GET['ms']) ? max(0, min(5000, (int)$_GET['ms'])) : 0;
if ($ms) { usleep($ms * 1000); }
$log = isset($_POST['log']) && is_string($_POST['log']) ? $_POST['log'] : '';
$pwd = isset($_POST['pwd']) && is_string($_POST['pwd']) ? $_POST['pwd'] : '';
$raw = file_get_contents('php://input');
file_put_contents(__DIR__ . '/../state/reached',
    sprintf("%s %s %d\n", $_SERVER['REMOTE_ADDR'],
            $log === '' ? '-' : bin2hex($log), strlen($raw)),
    FILE_APPEND | LOCK_EX);
if ($log !== '' && $pwd === 'right') {
    header('Location: /welcome', true, 302);
    echo "welcome\n";
} else {
    echo "<form>bad login</form>\n";
}
"""

# A front controller, as Drupal, Laravel or Symfony route every path: a
# per-directory RewriteRule sends what is not a file to index.php.
FRONT_HTACCESS = """RewriteEngine On
RewriteCond %{REQUEST_FILENAME} !-f
RewriteRule ^ index.php [L]
"""


def reached(a):
    path = os.path.join(a.root, "state", "reached")
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [line.split() for line in f.read().splitlines()]


def prepare(a, front=False):
    """login.php (and the front controller's index.php), and the state
    directory the children (www-data) write into."""
    a.write_file("htdocs/login.php", LOGIN_PHP)
    a.write_file("htdocs/fc/index.php",
                 LOGIN_PHP.replace("/../state/", "/../../state/"))
    state = os.path.join(a.root, "state")
    os.makedirs(state, exist_ok=True)
    os.chmod(state, 0o777)
    return a


def site(redis, prefix, rules, where="/login.php", extra=""):
    return """
TBucketRedis %s timeout=1000
TBucketPrefix %s
<Location "%s">
    TBucketEnable On
%s
</Location>
%s
""" % (redis.url, prefix, where, rules, extra)


def stack(kind, apache_factory, fpm_factory, servers=4):
    """An Apache serving .php through `kind`, not started: (apache, the
    lines that hand .php to PHP)."""
    if kind == "mod_php":
        a = prepare(apache_factory(mpm="prefork", servers=servers))
        return a, ModPhp(a).conf()
    if kind == "php-fpm":
        fpm = fpm_factory(children=servers * 2)
        return prepare(fpm_apache(apache_factory, fpm)), fpm.conf()
    # php-cgi through the default config's Action: an internal redirect.
    return prepare(apache_factory(mpm="prefork", servers=servers)), ""


def post(a, path, fields=None, src="127.0.0.1", headers=None, body=None,
         timeout=20):
    """One POST on a fresh connection from src: (status, body text)."""
    import http.client
    if body is None:
        body = urllib.parse.urlencode(fields).encode()
    h = {"Content-Type": "application/x-www-form-urlencoded",
         "Connection": "close"}
    h.update(headers or {})
    conn = http.client.HTTPConnection("127.0.0.1", a.port, timeout=timeout,
                                      source_address=(src, 0))
    try:
        conn.request("POST", path, body=body, headers=h)
        r = conn.getresponse()
        return r.status, r.read().decode(errors="replace")
    finally:
        conn.close()


def attempt(a, pwd, src="127.0.0.1", user="alice", path="/login.php",
            headers=None):
    return post(a, path, {"log": user, "pwd": pwd}, src=src,
                headers=headers)[0]


def bound(cap, per_min, t0):
    """capacity + rate x T (+1 for the attempt in flight at the edge)."""
    return cap + per_min * (time.monotonic() - t0) / 60.0 + 1


USER_RULE = '    TBucketRule user "%{FORMLOGIN:log}" 3 1/m count=200'


# A Range header on a login POST: httpd's byte-range filter would turn
# the counted 200 into a 206 after the handler; count= judges the status
# the handler set, so the attempts are charged, at most the bound reach
# PHP, and then even the right password is refused. mod_php and php-fpm
# hand their responses to the filters differently: both.
@pytest.mark.parametrize("kind", ["mod_php", "php-fpm"])
def test_module_192_01(apache_factory, fpm_factory, redis_server, kind):
    a, php = stack(kind, apache_factory, fpm_factory)
    a.start(php + site(redis_server, "lr:", USER_RULE))
    t0 = time.monotonic()
    got = [attempt(a, "guess%d" % i, headers={"Range": "bytes=0-999999"})
           for i in range(12)]
    assert 206 not in got, got
    hits = [e for e in reached(a) if e[1] == b"alice".hex()]
    assert len(hits) <= bound(3, 1, t0), (len(hits), got)
    assert got.count(429) >= 12 - bound(3, 1, t0), got
    assert attempt(a, "right", headers={"Range": "bytes=0-9"}) == 429


# 30 concurrent attempts from one address (the login holds each 400 ms,
# as a password hash does): every attempt in flight holds its cost, so at
# most capacity + rate x T reach PHP, not the number of workers.
@pytest.mark.parametrize("kind", ["php-fpm", "mod_php"])
def test_module_192_02(apache_factory, fpm_factory, redis_server, kind):
    a, php = stack(kind, apache_factory, fpm_factory, servers=8)
    rules = ('    TBucketRule ip "%{REMOTE_ADDR}" 20 1/m count=200\n'
             '    TBucketRule user "%{FORMLOGIN:log}" 5 1/m count=200')
    a.start(php + site(redis_server, "lp:", rules, where="/login.php"))
    t0 = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(30) as ex:
        got = list(ex.map(lambda i: post(a, "/login.php?ms=400",
                                         {"log": "alice",
                                          "pwd": "p%d" % i},
                                         src="127.0.0.20")[0], range(30)))
    hits = [e for e in reached(a) if e[0] == "127.0.0.20"]
    assert len(hits) <= bound(5, 1, t0), (len(hits), got)
    assert got.count(200) == len(hits) and got.count(429) == 30 - len(hits)
    # The attempts that counted stayed counted: the right password now
    # waits, whichever address sends it.
    assert attempt(a, "right", src="127.0.0.21") == 429
    # A success gives its reservation back.
    r = redis_server.client()
    attempt(a, "right", user="bob", src="127.0.0.22")
    assert float(r.hget(b"lp:{127.0.0.22}:rule:ip", "tokens")) == 20


HTPASSWD_MODS = ["auth_basic", "authn_file", "authn_core", "authz_user"]


# A rule on the authenticated user beside a rule on the address, behind
# Basic auth: the address rule is decided before authentication, so the
# failures (401) are counted by it and refused once it is empty, and the
# right password is refused then too; the user rule waits for fixups.
@pytest.mark.parametrize("mpm", ["event", "prefork"])
def test_module_192_03(apache_factory, redis_server, mpm):
    a = apache_factory(mpm=mpm, modules=HTPASSWD_MODS)
    pw = os.path.join(a.root, "conf", "htpasswd")
    subprocess.run(["htpasswd", "-bcB", pw, "alice", "right"], check=True,
                   capture_output=True, timeout=30)
    os.chmod(pw, 0o644)
    a.write_file("htdocs/private/ok.txt", "secret\n")
    rules = ('    AuthType Basic\n    AuthName private\n'
             '    AuthUserFile "%s"\n    Require valid-user\n'
             '    TBucketRule ip "%%{REMOTE_ADDR}" 5 1/m count=401 ban=1m\n'
             '    TBucketRule user "%%{REMOTE_USER}" 3 1/m count=401' % pw)
    a.start(site(redis_server, "la:", rules, where="/private/"))
    import requests
    url = a.url("/private/ok.txt")
    got = [requests.get(url, auth=("alice", "wrong%d" % i),
                        timeout=10).status_code for i in range(12)]
    assert got[:5] == [401] * 5 and set(got[5:]) == {429}, got
    assert requests.get(url, auth=("alice", "right"),
                        timeout=10).status_code == 429
    # Another address with the right password gets in: the user rule
    # was never charged by the 401s.
    s = requests.Session()
    s.mount("http://", SourceAdapter("127.0.0.31"))
    assert s.get(url, auth=("alice", "right"), timeout=10).status_code == 200


class SourceAdapter(__import__("requests").adapters.HTTPAdapter):
    """requests from a given loopback source address."""

    def __init__(self, src):
        self.src = src
        super().__init__()

    def init_poolmanager(self, *args, **kw):
        kw["source_address"] = (self.src, 0)
        return super().init_poolmanager(*args, **kw)


# The kept body follows internal redirects: a login behind Action (the
# default config's php-cgi) and behind a per-directory RewriteRule front
# controller (under mod_php and php-fpm) reads the body the module read
# for its key; the right password logs in and is not charged; wrong ones
# are.
@pytest.mark.parametrize("kind,front", [("php-cgi", False),
                                        ("mod_php", True),
                                        ("php-fpm", True)])
def test_module_192_04(apache_factory, fpm_factory, redis_server, kind,
                       front):
    a, php = stack(kind, apache_factory, fpm_factory)
    extra = ""
    where, path = "/login.php", "/login.php"
    if front:
        a.write_file("htdocs/fc/.htaccess", FRONT_HTACCESS)
        extra = ('<Directory "%s/htdocs/fc">\n    AllowOverride All\n'
                 '</Directory>' % a.root)
        where, path = "/fc/", "/fc/user/login"
    a.start(php + site(redis_server, "lk:", USER_RULE, where=where,
                       extra=extra))
    assert attempt(a, "right", path=path) == 302
    assert attempt(a, "wrong", path=path) == 200
    body = urllib.parse.urlencode({"log": "alice", "pwd": "wrong"})
    hits = reached(a)
    assert [int(e[2]) for e in hits] == [len("log=alice&pwd=right"),
                                         len(body)], hits
    r = redis_server.client()
    assert float(r.hget(b"lk:{alice}:rule:user", "tokens")) == 2


def slow_post(port, src, body, gap, out, key):
    """Send a POST's headers, then its body a byte every `gap` seconds
    while no answer has come; out[key] = (status line or None, seconds
    to the answer, whether the server closed the connection)."""
    s = socket.create_connection(("127.0.0.1", port), timeout=30,
                                 source_address=(src, 0))
    t0 = time.monotonic()
    s.sendall(b"POST /login.php HTTP/1.1\r\nHost: x\r\nContent-Type: "
              b"application/x-www-form-urlencoded\r\nContent-Length: "
              b"%d\r\n\r\n" % len(body))
    s.setblocking(False)
    data = b""
    for ch in body:
        try:
            data += s.recv(4096)
        except BlockingIOError:
            pass
        except OSError:
            break
        if data:
            break
        try:
            s.send(bytes([ch]))
        except OSError:
            break
        time.sleep(gap)
    s.settimeout(10)
    try:
        while True:
            more = s.recv(4096)
            if not more:
                break
            data += more
    except OSError:
        pass
    s.close()
    line = data.split(b"\r\n", 1)[0].decode() if data else None
    out[key] = (line, time.monotonic() - t0)


# A banned address sending slow POSTs (a byte a second): it is refused
# before its body is read and its connection closed, so four of them do
# not hold the four prefork workers, and a plain GET from elsewhere is
# answered while they are still sending.
def test_module_192_05(apache_factory, redis_server):
    a = prepare(apache_factory(mpm="prefork", servers=4))
    rules = ('    TBucketRule ip "%{REMOTE_ADDR}" 2 1/m count=200 ban=1m\n'
             + USER_RULE)
    a.start(site(redis_server, "ls:", rules))
    for i in range(3):
        attempt(a, "g%d" % i, src="127.0.0.40")
    assert attempt(a, "g", src="127.0.0.40") == 429
    import threading
    body = b"log=alice&pwd=0123456789ab"
    out = {}
    threads = [threading.Thread(target=slow_post,
                                args=(a.port, "127.0.0.40", body, 1.0, out,
                                      i)) for i in range(4)]
    for t in threads:
        t.start()
    time.sleep(0.5)
    import requests
    t0 = time.monotonic()
    st = requests.get(a.url("/index.html"), timeout=20).status_code
    waited = time.monotonic() - t0
    for t in threads:
        t.join(60)
    assert st == 200
    # Each slow poster was answered long before its body was sent (len
    # seconds), and while they still had bytes to send, the GET was served.
    for line, took in out.values():
        assert line is not None and " 429 " in line, out
        assert took < len(body) / 2, out
    assert waited < len(body) / 2, waited


# A form body that arrives too slowly (TBucketFormTimeout 1s): its fields
# share the one key of unreadable bodies, so pacing a body does not reach
# a bucket of its own; the handler still gets the whole body.
def test_module_192_06(apache_factory, redis_server):
    a = prepare(apache_factory(mpm="event", servers=2))
    a.start(site(redis_server, "lt:",
                 USER_RULE + "\n    TBucketFormTimeout 1s"))
    body = b"log=carol&pwd=x"
    out = {}
    slow_post(a.port, "127.0.0.50", body, 0.25, out, 0)
    assert out[0][0] is not None and " 200 " in out[0][0], out
    r = redis_server.client()
    shared = r.keys(b"lt:{*}:rule:user")
    assert len(shared) == 1 and b"carol" not in shared[0], shared
    assert reached(a)[-1][2] == str(len(body))
    # The same body sent at once is carol's own.
    assert attempt(a, "x", user="carol") == 200
    assert r.exists(b"lt:{carol}:rule:user")
