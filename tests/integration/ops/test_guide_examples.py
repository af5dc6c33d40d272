"""test_guide_examples.py -- every complete configuration of docs/guide.md
runs as written, with the files and commands the guide gives.

The guide marks each fenced block the test may use with an HTML comment
on the line before it:

  <!-- example: NAME -->   a complete configuration (an apache block):
                           the test of that name starts it and checks
                           what the text around it promises;
  <!-- fragment -->        an apache block that is part of a
                           configuration, never run alone;
  <!-- file: PATH -->      a file an example serves (PATH absolute);
  <!-- commands: NAME -->  shell commands an example's test runs.

An apache block with neither mark fails test_guide_001_01, so none is
forgotten, and so does an example without a test here or a test without
its example.

An example runs in a Debian-like Apache of our own (DebianApache): the
parts of Debian 12's apache2.conf, mods-enabled/ and sites-enabled/ that
the examples rely on, rebuilt in a temp server root (tbtest.apache's
conventions: no systemd, no /etc, our own port, stopped by PID). The
guide's text is changed only by these mechanical substitutions, and
nothing else:

  *:80 (VirtualHost)         -> *:PORT, the Apache's free loopback port
  redis.internal:6379        -> 127.0.0.1:RPORT, the test's redis-server
  /var/www/...               -> TMP/var/www/..., TMP the Apache's root
  SITE=http://127.0.0.1      -> SITE=http://127.0.0.1:PORT (commands)
  "sudo "                    -> "" (commands; the tests run as root)
"""
import http.client
import json
import os
import re
import subprocess
import threading
import time

import pytest

from tbtest.apache import (MODDIR, Apache, metric, metric_sum,
                           server_root_conf)
from tbtest.env import ROOT, require
from tbtest.php import ModPhp, php_root

GUIDE = os.path.join(ROOT, "docs", "guide.md")
MARK = re.compile(r"^<!--\s*(example|fragment|file|commands)"
                  r"(?::\s*(\S+))?\s*-->$")
FENCE = re.compile(r"^\s*```(\w*)\s*$")
CURL = "/usr/bin/curl"

# The modules a fresh Debian 12 apache2 enables (mods-enabled/), the MPM
# aside; mod_php (php8.2) is added by the examples that need it.
DEBIAN_MODULES = ("access_compat", "alias", "auth_basic", "authn_core",
                  "authn_file", "authz_core", "authz_host", "authz_user",
                  "autoindex", "deflate", "dir", "env", "filter", "mime",
                  "negotiation", "reqtimeout", "setenvif", "status")

# What apache2.conf and the default mods-enabled/*.conf of Debian 12 set
# that the examples rely on, with /var/www moved under TMP; the prefork
# sizes are mpm_prefork.conf's, which a site may override. The
# DocumentRoot is apache2's built-in default; the access log's format is
# ours, for the tests to read.
DEBIAN_CONF = """
Timeout 300
KeepAlive On
MaxKeepAliveRequests 100
KeepAliveTimeout 5
HostnameLookups Off
<Directory />
    Options FollowSymLinks
    AllowOverride None
    Require all denied
</Directory>
<Directory /usr/share>
    AllowOverride None
    Require all granted
</Directory>
<Directory {tmp}/var/www/>
    Options Indexes FollowSymLinks
    AllowOverride None
    Require all granted
</Directory>
AccessFileName .htaccess
<FilesMatch "^\\.ht">
    Require all denied
</FilesMatch>
TypesConfig /etc/mime.types
DirectoryIndex index.html index.cgi index.pl index.php index.xhtml index.htm
<IfModule mpm_prefork_module>
    StartServers 5
    MinSpareServers 5
    MaxSpareServers 10
    MaxRequestWorkers 150
    MaxConnectionsPerChild 0
</IfModule>
DocumentRoot {tmp}/var/www/html
LogFormat "%h %>s %{{TBUCKET_DECISION}}e %U %P" tb
CustomLog {log} tb
"""

# sites-available/000-default.conf as Debian 12 ships it, without its
# ErrorLog and CustomLog lines (the server root's logs serve).
DEFAULT_SITE = """
<VirtualHost *:80>
    ServerAdmin webmaster@localhost
    DocumentRoot /var/www/html
</VirtualHost>
"""


# ---- the guide's marked blocks -------------------------------------------

def guide_blocks():
    """Every fenced block of the guide: (language, mark kind or None, mark
    argument, text, line number of the opening fence)."""
    with open(GUIDE, encoding="utf-8") as f:
        lines = f.read().splitlines()
    blocks, i = [], 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        j = i - 1
        while j >= 0 and not lines[j].strip():
            j -= 1
        mark = MARK.match(lines[j].strip()) if j >= 0 else None
        end = i + 1
        while end < len(lines) and not lines[end].lstrip().startswith("```"):
            end += 1
        blocks.append((m.group(1), mark.group(1) if mark else None,
                       mark.group(2) if mark else None,
                       "\n".join(lines[i + 1:end]) + "\n", i + 1))
        i = end + 1
    return blocks


def marked(kind, name=None):
    """The text of the one block marked kind (and name), or all of them as
    {name: text} when name is None."""
    found = {b[2]: b[3] for b in guide_blocks() if b[1] == kind}
    if name is None:
        return found
    assert name in found, "docs/guide.md has no <!-- %s: %s -->" % (kind,
                                                                   name)
    return found[name]


# ---- the substitutions ---------------------------------------------------

def site_text(text, port, redis_port, tmp):
    """An example's configuration as it runs here (module docstring)."""
    assert "<VirtualHost *:80>" in text
    text = text.replace("<VirtualHost *:80>", "<VirtualHost *:%d>" % port)
    text = text.replace("redis.internal:6379", "127.0.0.1:%d" % redis_port)
    return text.replace("/var/www/", tmp + "/var/www/")


def commands_text(text, port, tmp):
    """Shell commands of the guide as they run here."""
    assert "SITE=http://127.0.0.1 " in text or "SITE=" not in text
    text = text.replace("SITE=http://127.0.0.1 ",
                        "SITE=http://127.0.0.1:%d " % port)
    text = text.replace("sudo ", "")
    return text.replace("/var/www/", tmp + "/var/www/")


class DebianApache(Apache):
    """An Apache laid out as Debian 12's: DEBIAN_MODULES and the MPM
    loaded, DEBIAN_CONF, then the body as sites-enabled/ (the sites in
    the order given), all under its temp root. tmp is that root, what
    /var/www moves under."""

    def __init__(self, **kw):
        kw.setdefault("mpm", "prefork")
        super().__init__(**kw)
        self.tmp = self.root

    def config_text(self, body, mpm=None):
        mpm = mpm or self.mpm
        lines = [server_root_conf(self.root, self.port, self.log_level),
                 "LoadModule mpm_%s_module %s/mod_mpm_%s.so"
                 % (mpm, MODDIR, mpm)]
        for m in DEBIAN_MODULES:
            lines.append("LoadModule %s_module %s/mod_%s.so" % (m, MODDIR, m))
        for m in self.modules:
            lines.append("LoadModule %s %s" % tuple(m))
        lines.append("LoadModule tbucket_module %s" % self.so)
        lines.append(DEBIAN_CONF.format(tmp=self.tmp, log=self.access_log))
        return "\n".join(lines) + "\n" + body + "\n"

    def write_guide_file(self, path, text):
        """A file the guide names, at TMP + its path."""
        assert path.startswith("/var/www/"), path
        return self.write_file(path.lstrip("/"), text)


def with_mod_php(a):
    """mod_php in a DebianApache, as `apt install libapache2-mod-php8.2`
    enables it: the package's own php8.2.conf, with our php.ini."""
    php = ModPhp(a)
    conf = os.path.join(php_root(), "etc/apache2/mods-available/php8.2.conf")
    with open(conf) as f:
        return f.read() + '\nPHPIniDir "%s"\n' % php.ini_dir


def get(a, path, host=None, source=None, headers=None, timeout=10):
    """One request on a fresh connection, from the source address given
    (default 127.0.0.1): (status, {lower-case header: value}, body
    text, seconds)."""
    h = {"Connection": "close"}
    if host:
        h["Host"] = host
    h.update(headers or {})
    start = time.monotonic()
    c = http.client.HTTPConnection("127.0.0.1", a.port, timeout=timeout,
                                   source_address=(source, 0) if source
                                   else None)
    try:
        c.request("GET", path, headers=h)
        r = c.getresponse()
        body = r.read().decode("utf-8", "replace")
        return (r.status, {k.lower(): v for k, v in r.getheaders()}, body,
                time.monotonic() - start)
    finally:
        c.close()


# ---- the marks -----------------------------------------------------------

# Every apache block of the guide is marked an example or a fragment,
# every example has its test here and every test its example; file and
# commands marks name absolute paths and unique names.
def test_guide_001_01():
    blocks = guide_blocks()
    unmarked = [line for lang, kind, _, _, line in blocks
                if lang == "apache" and kind not in ("example", "fragment")]
    assert not unmarked, ("apache blocks of docs/guide.md without "
                          "<!-- example: NAME --> or <!-- fragment --> "
                          "before them, at lines %s" % unmarked)
    for kind in ("example", "file", "commands"):
        named = [b[2] for b in blocks if b[1] == kind]
        assert len(named) == len(set(named)), (kind, named)
    names = [b[2] for b in blocks if b[1] == "example"]
    for lang, kind, arg, _, line in blocks:
        if kind == "example":
            assert lang == "apache", line
        if kind == "file":
            assert arg and arg.startswith("/var/www/"), line
        if kind == "commands":
            assert lang == "sh" and arg, line
        if kind == "fragment":
            assert arg is None, line
    assert set(names) == set(EXAMPLE_TESTS), (
        "examples without a test: %s; tests without an example: %s" % (
            sorted(set(names) - set(EXAMPLE_TESTS)),
            sorted(set(EXAMPLE_TESTS) - set(names))))


# ---- example: api-key ----------------------------------------------------

API_USER = "user limiter on >s3cret ~* &* +@all"


def tbucket_conf_with_status():
    """conf/tbucket.conf (mods-available/tbucket.conf) with its commented
    status page block uncommented, as docs/operations.md suggests."""
    with open(os.path.join(ROOT, "conf", "tbucket.conf")) as f:
        text = f.read()
    out = re.sub(r"(?m)^(\s*)#(\s*)(</?Location|SetHandler|TBucketEnable "
                 r"Off|Require local)", r"\1\2\3", text)
    assert out.count('<Location "/tbucket-status">') == 1, out
    return out


def until_refused(send, most):
    """send() (a request: status, headers, body, seconds) until it is
    refused with 429, at most `most` times: (the answers, the most a
    bucket of RATE 10/s could have refilled meanwhile, whole tokens)."""
    got, start = [], time.monotonic()
    while len(got) < most:
        got.append(send())
        if got[-1][0] == 429:
            break
    return got, int((time.monotonic() - start) * 10) + 1


# "Limit an API by key", as written: the Redis URL's user, password and
# database are used (a redis-server with that ACL user); with Debian's
# 000-default enabled before it, a request for 127.0.0.1 never reaches
# it (the status page is a 404, no limit applies), as the guide warns;
# after a2dissite 000-default each key has 100 requests of burst (and
# what 10/s refills meanwhile), the next gets 429 with Retry-After, the
# JSON body and both kinds of rate-limit headers, another key is served,
# and the status page answers 127.0.0.1. The other way operations.md
# gives, tbucket.conf's status block uncommented, serves the page on
# 000-default too.
def test_guide_001_02(make_redis):
    r = make_redis("api", extra=[API_USER])
    a = DebianApache()
    try:
        a.write_guide_file("/var/www/html/index.html", "<p>It works!</p>\n")
        site = site_text(marked("example", "api-key"), a.port, r.port, a.tmp)
        assert "redis://limiter:s3cret@127.0.0.1:%d/2" % r.port in site
        default = site_text(DEFAULT_SITE, a.port, r.port, a.tmp)
        a.start(default + site)
        status, _, _, _ = get(a, "/tbucket-status")
        assert status == 404
        got = [get(a, "/", headers={"X-API-Key": "k-1"}) for _ in range(3)]
        assert [g[0] for g in got] == [200] * 3
        assert all("x-ratelimit-limit" not in g[1] for g in got)
        a.graceful(tbucket_conf_with_status() + default + site)
        status, _, text, _ = get(a, "/tbucket-status")
        assert status == 200 and "tbucket_decisions_total" in text

        # a2dissite 000-default
        a.graceful(site)
        got, refill = until_refused(
            lambda: get(a, "/", headers={"X-API-Key": "k-1"}), 200)
        codes = [g[0] for g in got]
        assert codes[-1] == 429 and set(codes[:-1]) == {200}, codes
        assert 100 <= len(codes) - 1 <= 100 + refill, (len(codes), refill)
        ok, refused = got[0], got[-1]
        assert "It works!" in ok[2]
        assert ok[1]["x-ratelimit-limit"] == "100"
        assert ok[1]["x-ratelimit-remaining"] == "99"
        assert "ratelimit-policy" in ok[1] and "ratelimit" in ok[1]
        assert int(refused[1]["retry-after"]) >= 1
        assert refused[1]["x-ratelimit-remaining"] == "0"
        body = json.loads(refused[2])
        assert body["error"] == "rate limited" and body["retry_after"] >= 1
        assert get(a, "/", headers={"X-API-Key": "k-2"})[0] == 200
        # The buckets are in database 2, under the default prefix.
        c = r.client(username="limiter", password="s3cret", db=2)
        assert c.keys("rl:*k-1*") and c.keys("rl:*k-2*")
        status, _, text, _ = get(a, "/tbucket-status")
        assert status == 200
        assert metric(text, "tbucket_decisions_total",
                      outcome="rejected") == 1
        a.assert_log_clean()
    finally:
        a.cleanup()


# ---- example: php-local --------------------------------------------------

SHOP = "shop.example.com"
PARTNER = {"X-Partner-Key": "k-7f3a9c"}


def php_site(a, redis_server):
    """The php-local example with mod_php and its files in place, Debian's
    000-default still enabled before it; the Apache started."""
    php_conf = with_mod_php(a)
    for path, text in marked("file").items():
        a.write_guide_file(path, text)
    a.write_guide_file("/var/www/html/index.html", "<p>It works!</p>\n")
    files = commands_text(marked("commands", "flood-files"), a.port, a.tmp)
    p = subprocess.run(["sh", "-ec", files], capture_output=True, text=True,
                       timeout=30)
    assert p.returncode == 0, p.stderr
    site = site_text(marked("example", "php-local"), a.port,
                     redis_server.port, a.tmp)
    default = site_text(DEFAULT_SITE, a.port, redis_server.port, a.tmp)
    return a.start(php_conf + default + site)


def check_one_address(a):
    """From one address, the shop's pages have 120 requests of burst and
    then 429 with its headers; the health check from that same address is
    still served."""
    got, refill = until_refused(
        lambda: get(a, "/shop/index.php", host=SHOP, source="127.0.0.2"),
        300)
    codes = [g[0] for g in got]
    assert codes[-1] == 429 and set(codes[:-1]) == {200}, codes
    assert 120 <= len(codes) - 1 <= 120 + refill, (len(codes), refill)
    # The page shows the decision. The example's Redis timeout is 50 ms:
    # on a loaded runner a slower answer is decided by the example's
    # policy, local (a CI run at load 12: some pages said fallback-local),
    # which is what the guide promises; most are Redis's.
    said = [re.search(r"limiter: ([a-z-]+),", g[2]).group(1)
            for g in got[:-1]]
    assert set(said) <= {"allowed", "fallback-local"}, said
    assert said.count("allowed") * 2 >= len(said), said
    h, body = got[-1][1], got[-1][2]
    assert int(h["retry-after"]) >= 1 and h["x-ratelimit-limit"] == "120"
    assert h["x-ratelimit-remaining"] == "0"
    assert json.loads(body)["error"] == "rate limited"
    for _ in range(3):
        status, _, body, _ = get(a, "/shop/health.php", host=SHOP,
                                 source="127.0.0.2")
        assert (status, body) == (200, "ok\n")


def during_flood(a, until):
    """While the cap is full: a plain request for a PHP page gets 503 at
    once, with Retry-After, the JSON body and a closed connection; the
    partner's key is served. Asks until the first 503 or the monotonic
    time until. Returns (the 503, the partner's status)."""
    seen = []
    refused = probe_cap(a, until, seen)
    if not refused:
        page = get(a, "/tbucket-status", host=SHOP)[2]
        busy = [l for l in page.splitlines() if l.startswith(
            ("tbucket_local_in_flight", "tbucket_workers_busy"))]
        raise AssertionError(("no 503 for /shop/ while the flood ran", seen,
                              busy))
    partner = get(a, "/shop/slow.php", host=SHOP, source="127.0.0.4",
                  headers=PARTNER)
    # The health check, asked as the guide's loop asks it, while the cap
    # is still full (the holders keep it so until the guide's commands
    # end): a Python request, no process to start per ask.
    health = []
    for _ in range(3):
        status, _, body, took = get(a, "/shop/health.php", host=SHOP)
        health.append((status, body, round(took, 3)))
        time.sleep(0.2)
    return refused, partner, health


def start_holders(a, stop, got, until):
    """Twenty-four more flooders (hold_pages) from 127.0.0.70-93, their
    statuses into got, until stop is set or the monotonic time until."""
    holders = [threading.Thread(target=hold_pages,
                                args=(a, n, stop, until, got), daemon=True)
               for n in range(70, 94)]
    for t in holders:
        t.start()
    return holders


def hold_pages(a, n, stop, until, got):
    """One more flooder, from 127.0.0.n, asking for the slow page again as
    soon as it has its answer until stop is set or the monotonic time
    until. The guide's 60 curl loops keep the cap full on an idle 2-vCPU
    machine; on a shared CI runner their curls start slowly and kept 20
    of 24 places busy (a CI run: 9 probes, all 200), and on a machine
    loaded by other work 6. Twenty-four of these (threads, no fork per
    request), while the probe asks, fill the cap whatever the curls
    manage; they run for the whole flood, so the cap is full and the
    busy share past 50 % whenever the flood's own samples look."""
    while not stop.is_set() and time.monotonic() < until:
        try:
            status = get(a, "/shop/slow.php", host=SHOP,
                         source="127.0.0.%d" % n)[0]
        except OSError:
            status = None
        got.append(status)
        if status != 200:
            stop.wait(0.1)


def probe_cap(a, until, seen):
    """Asks for the slow page from 127.0.0.3 until the first 503 of the
    full cap or the monotonic time until; appends (status, seconds) of
    each to seen. A 503 for a busy server (30 of 40 workers busy: the
    flood's refusals and the holders' beside 24 pages, a moment on a slow
    machine) is the guide's other refusal: noted, asked again. Returns
    (headers, body, seconds) of the cap's 503, or None."""
    while time.monotonic() < until:
        status, h, body, took = get(a, "/shop/slow.php", host=SHOP,
                                    source="127.0.0.3")
        seen.append((status, round(took, 2)))
        if status == 503 and "in flight" in body:
            return (h, body, took)
        assert status in (200, 503), (status, body)
        time.sleep(0.1)
    return None


def parse_flood(out):
    """The flood commands' output: health and media (status, seconds),
    the status page's samples ({name{labels}: [values]}), the codes the
    flood got ({code: count})."""
    health, media, samples, codes = [], [], {}, {}
    for line in out.splitlines():
        words = line.split()
        if words[:1] in (["health"], ["media"]):
            (health if words[0] == "health" else media).append(
                (int(words[1]), float(words[2].rstrip("s"))))
        elif line.startswith("tbucket_"):
            samples.setdefault(words[0], []).append(float(words[-1]))
        elif len(words) == 2 and words[0].isdigit():
            codes[words[1]] = int(words[0])
    return health, media, samples, codes


def series(samples, name):
    return [v for k, vs in samples.items() if k.split("{")[0] == name
            for v in vs]


# "Local protection" and "Try local protection under a flood", as
# written, with Debian's 000-default still before the site (the requests
# name shop.example.com, as the guide's commands do): the pages the guide
# shows are served at the paths it gives; one address gets 429 with its
# headers after its burst while the health check from it is served; the
# guide's flood commands (60 addresses for 15 s) run as they are: the
# flood gets 200s and 503s and no 429, never more than 24 PHP pages run
# at once, images are shed, the health check is served every time in
# well under a second (no worker to fork: a fork round of prefork takes
# a second), a plain PHP request gets 503 at once and the partner's key
# is served.
@pytest.mark.slow
def test_guide_001_03(redis_server):
    require(CURL, "curl")
    a = DebianApache()
    try:
        php_site(a, redis_server)
        status, _, body, _ = get(a, "/shop/", host=SHOP)
        assert status == 200 and "<h1>Shop</h1>" in body, body
        assert get(a, "/shop/health.php", host=SHOP)[:3:2] == (200, "ok\n")
        assert get(a, "/media/logo.png", host=SHOP)[0] == 200
        assert get(a, "/shop/index.php")[0] == 404   # 000-default
        check_one_address(a)

        script = commands_text(marked("commands", "flood"), a.port, a.tmp)
        work = os.path.join(a.root, "flood")
        os.makedirs(work)
        proc = subprocess.Popen(["sh", "-c", script], cwd=work,
                                stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        stop, held = threading.Event(), []
        holders = start_holders(a, stop, held, time.monotonic() + 40)
        try:
            time.sleep(4)
            # Before the flood's 15 s are over, with a second to spare.
            refused, partner, health_now = during_flood(
                a, time.monotonic() + 10)
            out, err = proc.communicate(timeout=60)
        finally:
            stop.set()
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
            for t in holders:
                t.join(timeout=15)
        assert proc.returncode == 0, err
        h, body, took = refused
        assert h["retry-after"] == "1" and h["connection"] == "close"
        assert json.loads(body)["error"] == "too many requests in flight here"
        # "At once": not queued behind the flood, where it would wait for
        # a worker to finish a page (slow.php sleeps 1 s, whatever the
        # CPU's speed); the refusal itself is milliseconds.
        assert took < 1.0, took
        assert partner[0] == 200 and partner[2] == "done\n", partner

        # Served, at once, each of three times the test asked it while
        # the cap was full.
        assert all(s == 200 and b == "ok\n" and t < 1.0
                   for s, b, t in health_now), health_now
        health, media, samples, codes = parse_flood(out)
        # The guide's health loop asks about once a second, idle (13-14
        # samples in 15 s), but each turn also starts three curls beside
        # the 60 flooding ones: on a machine twice as slow it makes fewer
        # turns, and beside two busy loops and a soak it made 2 (a run
        # asserting 3 failed there). What matters is that the check was
        # asked during the flood and served every time; the test's own
        # three asks above are the "several times".
        assert health and {s for s, _ in health} == {200}, out
        # Served without waiting for a worker behind the flood (that wait
        # is at least one slow page, 1 s of sleep, not of CPU); idle, the
        # slowest is 0.006-0.13 s.
        assert max(t for _, t in health) < 1.0, health
        assert 503 in {s for s, _ in media}, media
        # The flood (the guide's curls and the test's holders together)
        # is served at the cap and refused with 503 beyond it, never 429.
        assert set(codes) <= {"200", "503"} and "503" in codes, codes
        assert set(held) <= {200, 503}, set(held)
        # 24 workers each finishing a 1-s page: about 360 in 15 s, more
        # than half of them even when the machine is twice as slow.
        assert codes.get("200", 0) + held.count(200) >= 100, (codes,
                                                               len(held))
        in_flight = series(samples, "tbucket_local_in_flight")
        assert in_flight and max(in_flight) <= 24, in_flight
        assert max(in_flight) >= 20, in_flight
        assert series(samples, "tbucket_local_refusals_total"), out

        _, _, text, _ = get(a, "/tbucket-status", host=SHOP)
        # Images (low) are shed from half the workers busy. The guide also
        # sheds normal requests from 75%: the flood's refused curls hold a
        # worker each for a moment, so on a slow or shared machine a few
        # PHP requests are shed too (a CI run saw 1 beside 5 low). Never a
        # critical one: the health check is always served.
        shop = "%s:%d" % (SHOP, a.port)
        low = metric(text, "tbucket_shed_total", vhost=shop, priority="low")
        normal = metric(text, "tbucket_shed_total", vhost=shop,
                        priority="normal")
        assert low > 0 and metric_sum(text, "tbucket_shed_total") == \
            low + normal, text
        assert metric(text, "tbucket_local_refusals_total",
                      vhost="%s:%d" % (SHOP, a.port),
                      priority="normal") > 0
        assert metric(text, "tbucket_workers_max") == 40
        # The example's Redis timeout is 50 ms. The flood keeps both CPUs
        # busy, and on a shared machine a Redis answer can take longer (a
        # NOISE=1 run beside a soak: SCRIPT LOAD timed out); the breaker
        # then opens with a warning, TB00105, and the local policy
        # decides, as the guide says. Nothing above needs Redis.
        a.assert_log_clean(allowed=("TB00105",))
    finally:
        a.cleanup()


EXAMPLE_TESTS = {
    "api-key": test_guide_001_02,
    "php-local": test_guide_001_03,
}


# ---- apache2 -t on every fragment ------------------------------------------

# Fragments that need what a test machine does not have (TLS files,
# another module's socket, a cluster's names, a second MPM section):
# their TBucket lines are checked by their own tests elsewhere.
NOT_ALONE = ("tls_", "proxy:", "RemoteIP", "redis-cluster", "rediss://",
             "IfModule", "LogFormat")

# The context the guide gives the fragments it shows inside a site: the
# api-key example's virtual host, which enables limits and sets one, and
# the login section's TBucketSecret (set once per server).
FRAGMENT_SITE = """TBucketRedis redis://127.0.0.1:1 timeout=30
TBucketEnable On
TBucketLimit 100 10/s
%s
"""


# No guide fragment draws a warning from apache2 -t (a limit that cannot
# apply, a scope that limits nothing, a combination that does not work):
# an admin who copies one into the site it describes sees "Syntax OK"
# alone. The login fragments' TBucketSecret points at a real secret file.
def test_guide_001_04():
    frags = [b[3] for b in guide_blocks() if b[1] == "fragment"
             and b[0] == "apache" and "TBucket" in b[3]
             and not any(w in b[3] for w in NOT_ALONE)]
    assert len(frags) >= 8, frags
    a = Apache()
    try:
        secret = os.path.join(a.root, "conf", "tbucket.secret")
        with open(secret, "wb") as f:
            f.write(os.urandom(48))
        os.chmod(secret, 0o600)
        for text in frags:
            if "TBucketSecret" not in text:
                text = "TBucketSecret %s\n%s" % (secret, text)
            body = FRAGMENT_SITE % text.replace(
                "/etc/apache2/tbucket.secret", secret)
            rc, out = a.configtest(body)
            assert rc == 0 and "TB00" not in out, (text, out)
    finally:
        a.cleanup()
