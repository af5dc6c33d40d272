"""test_topkeys.py -- who is limited right now: the top keys, the rules,
the refusal line and fail2ban, through a real Apache and Redis.

The top keys are Space-Saving sketches in the module's shared memory
(TBucketTopKeys, shared/tb_topk.c): a count is never below the true one
and at most the window's bound above it, which the JSON view reports. The
tests send known traffic (keys by X-API-Key, clients by source address
127.0.0.N on loopback), count the truth on the client side and compare.
The HTML view is also rendered by headless Chromium, the Prometheus text
is checked against the exposition format's rules (written down below:
Debian's promtool comes only with the prometheus server package, which
would start a server listening on every interface), the refusal lines are
fed to Debian's fail2ban-regex, and `tbucket top` is driven in tmux.
"""
import http.client
import os
import random
import re
import signal
import subprocess
import threading
import time
from html.parser import HTMLParser

import pytest

from tbtest.apache import http_get
from tbtest.env import BUILD, chromium, fail2ban_hosts, require

TMUX = "/usr/bin/tmux"
TOOL = os.path.join(BUILD, "tbucket")

# Keys a client chooses: markup, quotes, a backslash, a percent sign; no
# space (a key with one is hashed, which test 161_03 checks too).
HOSTILE = ['<img/src=x/onerror=alert(1)>', '"><script>alert(2)</script>',
           'k\\"q%41']


def conf(redis, extra="", limit="30 1/h", status=True):
    """Limits keyed by X-API-Key (the client IP when absent) under
    /limited, a shadow rule under /shadow, the status page."""
    return """
TBucketRedis {url} timeout=1000
{extra}
<Location /limited>
    TBucketEnable On
    TBucketKey "%{{HTTP:X-API-Key}}"
    TBucketLimit {limit}
</Location>
<Location /shadow>
    TBucketEnable On
    TBucketLimit 2 1/h
    TBucketMode shadow
</Location>
{status}
""".format(url=redis.url, extra=extra, limit=limit,
           status="""<Location /tbucket-status>
    SetHandler tbucket-status
    Require ip 127.0.0.1
</Location>""" if status else "")


class Client:
    """One keep-alive connection from a chosen loopback source address."""

    def __init__(self, port, source="127.0.0.1"):
        self.port = port
        self.source = source
        self.conn = None

    def get(self, path, headers=None):
        for attempt in (0, 1):
            if self.conn is None:
                self.conn = http.client.HTTPConnection(
                    "127.0.0.1", self.port, timeout=10,
                    source_address=(self.source, 0))
            try:
                self.conn.request("GET", path, headers=headers or {})
                r = self.conn.getresponse()
                r.read()
                if r.getheader("Connection", "").lower() == "close":
                    self.close()
                return r.status
            except (http.client.HTTPException, OSError):
                self.close()
                if attempt:
                    raise
        return None

    def close(self):
        if self.conn is not None:
            self.conn.close()
            self.conn = None


def status_json(a):
    r = http_get(a.url("/tbucket-status?view=json"))
    assert r.status_code == 200
    return r.json()


def window(page, minutes):
    return [w for w in page["top"]["windows"] if w["minutes"] == minutes][0]


def zipf_keys(n_keys, n, s, seed):
    """n draws from a Zipf-like law over n_keys keys (weight 1/rank^s)."""
    rnd = random.Random(seed)
    weights = [1.0 / (i + 1) ** s for i in range(n_keys)]
    return ["z%04d" % i for i in rnd.choices(range(n_keys), weights, k=n)]


def send_keys(port, keys, threads=4):
    """Send one request per key to /limited with that X-API-Key, from
    threads keep-alive connections; returns {key: [decisions, refused]}."""
    truth = {}
    lock = threading.Lock()
    errors = []

    def worker(part):
        c = Client(port)
        try:
            for k in part:
                code = c.get("/limited/ok.txt", {"X-API-Key": k})
                with lock:
                    t = truth.setdefault(k, [0, 0])
                    t[0] += 1
                    t[1] += code == 429
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)
        finally:
            c.close()

    ts = [threading.Thread(target=worker, args=(keys[i::threads],))
          for i in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(120)
    assert not errors, errors
    return truth


def assert_within(entries, truth, field, bound, top, what):
    """Each of the true top `top` keys by `what` is in entries, and its
    estimate lies in [true, true + bound]."""
    idx = 0 if what == "decisions" else 1
    best = sorted(truth, key=lambda k: (-truth[k][idx], k))[:top]
    got = {e["key"]: e for e in entries}
    for k in best:
        assert k in got, (k, truth[k], [e["key"] for e in entries])
        est = got[k][field]
        assert truth[k][idx] <= est <= truth[k][idx] + bound, \
            (k, truth[k], est, bound)


# test_module_161_01: a skewed stream over 2,000 keys through Apache and
# Redis, more keys decided (about 1,000) and refused (about 200) than the
# sketches have counters (160): the true top 10 by decisions and by
# refusals are all in the page's rankings, each count between the true
# one and the true one plus the bound the page reports.
def test_module_161_01(apache_factory, redis_server):
    a = apache_factory(servers=2)
    a.start(conf(redis_server, limit="3 1/h"))
    keys = zipf_keys(2000, 6000, 1.1, seed=161)
    t0 = time.monotonic()
    truth = send_keys(a.port, keys)
    page = status_json(a)
    assert page["top"]["k"] == 20 and page["top"]["counters"] == 160
    for minutes in ((1, 15) if time.monotonic() - t0 < 50 else (15,)):
        w = window(page, minutes)
        assert w["decisions"] == len(keys)
        assert w["refusals"] == sum(v[1] for v in truth.values())
        # Counters were taken over (a bound above 0), within N / m.
        assert 0 < w["decisions_bound"] <= len(keys) // 160
        assert 0 < w["refusals_bound"] <= w["refusals"] // 160
        assert len(w["by_decisions"]) == 20 and len(w["by_refusals"]) == 20
        assert_within(w["by_decisions"], truth, "decisions",
                      w["decisions_bound"], 10, "decisions")
        assert_within(w["by_refusals"], truth, "refusals",
                      w["refusals_bound"], 10, "refusals")
        for e in w["by_decisions"]:
            assert e["allowed"] + e["refused"] <= e["decisions"]
            assert e["limit"] == "default" and e["vhost"]
    a.assert_log_clean()


# test_module_161_02: the top keys survive a graceful restart and are per
# server (a second Apache on the same Redis sees none of the first's
# keys); their memory is fixed by TBucketTopKeys and reported; a restart
# asking for more keys keeps the table (and says so), Off stops counting.
def test_module_161_02(apache_factory, redis_server):
    a = apache_factory(servers=1)
    b = apache_factory(servers=1)
    a.start(conf(redis_server))
    b.start(conf(redis_server, limit="1000 1/s"))
    send_keys(a.port, ["only-a"] * 5 + ["also-a"] * 3, threads=1)
    send_keys(b.port, ["only-b"] * 4, threads=1)
    before = window(status_json(a), 15)["by_decisions"]
    assert [(e["key"], e["decisions"]) for e in before] == \
        [("only-a", 5), ("also-a", 3)]
    assert [e["key"] for e in window(status_json(b), 15)["by_decisions"]] \
        == ["only-b"]
    mem = status_json(a)["top"]["memory_bytes"]
    assert 0 < mem < 2 * 1024 * 1024

    # Graceful restart, same configuration: the same figures.
    a.graceful()
    assert window(status_json(a), 15)["by_decisions"] == before
    # Thousands of new keys: the memory stays what it was.
    send_keys(a.port, ["n%d" % i for i in range(3000)])
    text = http_get(a.url("/tbucket-status")).text
    assert "tbucket_top_keys_memory_bytes %d\n" % mem in text
    # More keys asked on a restart: the table keeps its size, a notice
    # says why; Off stops counting and shows nothing.
    a.mark_log()
    a.graceful(conf(redis_server, "TBucketTopKeys 200"))
    assert "TB00202" in a.log_since_mark()
    assert status_json(a)["top"]["k"] == 20
    a.graceful(conf(redis_server, "TBucketTopKeys Off"))
    send_keys(a.port, ["while-off"] * 3, threads=1)
    assert status_json(a)["top"] is None
    a.graceful(conf(redis_server, "TBucketTopKeys 5"))
    page = status_json(a)
    assert page["top"]["k"] == 5
    assert "while-off" not in [e["key"] for e in
                               window(page, 15)["by_decisions"]]

    # K = 200 from the start: ten times the counters, about ten times
    # the memory; bad values are refused naming the directive.
    a.stop()
    a.start(conf(redis_server, "TBucketTopKeys 200"))
    top = status_json(a)["top"]
    assert top["k"] == 200 and top["counters"] == 1600
    assert 9 * mem < top["memory_bytes"] < 11 * mem
    for bad in ("0", "1001", "-1", "twenty"):
        rc, out = a.configtest(conf(redis_server, "TBucketTopKeys " + bad))
        assert rc != 0 and "TBucketTopKeys" in out, (bad, out)
    rc, out = a.configtest(conf(redis_server, "<VirtualHost 127.0.0.1:%d>\n"
                                "TBucketTopKeys 10\n</VirtualHost>" % a.port))
    assert rc != 0 and "TBucketTopKeys" in out, out
    a.assert_log_clean()
    b.assert_log_clean()


# ---- The Prometheus text, by the exposition format's rules ------------

NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*$")
LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\\n]|\\[\\"n])*)"')
VALUE = re.compile(r"^(?:[+-]?(?:\d+\.?\d*(?:[eE][+-]?\d+)?|\.\d+)"
                   r"|[+-]?Inf|NaN)$")
TYPES = ("counter", "gauge", "histogram", "summary", "untyped")


def check_exposition(text):
    """The text format 0.0.4 (prometheus.io/docs/instrumenting/
    exposition_formats): lines end with \\n; '# HELP name text' with only
    \\\\ and \\n escapes; '# TYPE name type' once per family, before its
    samples; samples 'name{l="v",...} value', a family's samples
    together, names and label names by the grammar, label values with
    only \\\\, \\" and \\n escapes, no label twice, no series twice,
    values Go floats. Histograms: cumulative buckets ending in +Inf equal
    to _count. Returns {series: value}."""
    assert text.endswith("\n") and "\r" not in text
    typed, helped, done, series = {}, set(), set(), {}
    current = None
    buckets = {}
    for n, line in enumerate(text[:-1].split("\n"), 1):
        where = "line %d: %r" % (n, line)
        if line.startswith("# HELP "):
            parts = line.split(" ", 3)
            assert NAME.match(parts[2]) and parts[2] not in helped, where
            assert not re.search(r"\\[^\\n]", parts[3] if len(parts) > 3
                                 else ""), where
            helped.add(parts[2])
            continue
        if line.startswith("# TYPE "):
            _, _, name, typ = line.split(" ")
            assert NAME.match(name) and typ in TYPES, where
            assert name not in typed and name not in done, where
            if current:
                done.add(current)
            typed[name], current = typ, name
            continue
        assert not line.startswith("#") and line, where
        m = re.match(r"([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})? (\S+)$", line)
        assert m, where
        name, labels, value = m.group(1), m.group(3), m.group(4)
        assert VALUE.match(value), where
        base = re.sub(r"_(bucket|sum|count)$", "", name)
        family = name if name in typed else base
        assert family == current, "%s (family %s)" % (where, current)
        pairs = []
        if labels is not None:
            rest = labels
            while rest:
                lm = LABEL.match(rest)
                assert lm, where
                pairs.append((lm.group(1), lm.group(2)))
                rest = rest[lm.end():]
                if rest:
                    assert rest.startswith(","), where
                    rest = rest[1:]
        names = [p[0] for p in pairs]
        assert len(set(names)) == len(names), where
        assert not any(p.startswith("__") for p in names), where
        key = (name, tuple(sorted(pairs)))
        assert key not in series, "duplicate series: " + where
        series[key] = float(value)
        if typed[family] == "histogram" and name.endswith("_bucket"):
            other = tuple(p for p in sorted(pairs) if p[0] != "le")
            buckets.setdefault((family, other), []).append(
                (dict(pairs)["le"], float(value)))
    for (family, other), bs in buckets.items():
        vals = [v for _, v in bs]
        assert vals == sorted(vals) and bs[-1][0] == "+Inf", bs
        assert series[(family + "_count", other)] == vals[-1]
    return series


def unescape(v):
    return re.sub(r"\\(.)", lambda m: "\n" if m.group(1) == "n"
                  else m.group(1), v)


def top_refusals(a):
    """{key: value} of tbucket_top_key_refusals, label values read back,
    after checking the whole page against the format's rules."""
    series = check_exposition(http_get(a.url("/tbucket-status")).text)
    return {unescape(dict(labels)["key"]): v
            for (name, labels), v in series.items()
            if name == "tbucket_top_key_refusals"}


# test_module_161_04: the Prometheus text passes the format's rules with
# hostile keys in it: tbucket_top_key_refusals has one series per refused
# key, at most K of them, label values escaped and read back exactly,
# values equal to the JSON view's refusals.
def test_module_161_04(apache_factory, redis_server):
    keys = []
    for i, k in enumerate(HOSTILE + ["r%d" % i for i in range(6)]):
        keys += [k] * (3 + i)
    a = apache_factory(servers=1)
    a.start(conf(redis_server, limit="2 1/h"))
    send_keys(a.port, keys, threads=1)
    got = top_refusals(a)
    want = {e["key"]: e["refusals"]
            for e in window(status_json(a), 1)["by_refusals"]}
    assert got == want and len(got) == 9 and set(HOSTILE) <= set(got)
    a.stop()
    redis_server.client().flushall()
    a.start(conf(redis_server, "TBucketTopKeys 4", limit="2 1/h"))
    send_keys(a.port, keys, threads=1)
    # The four most refused: r5..r2 (9..6 refusals each).
    assert top_refusals(a) == {"r5": 9, "r4": 8, "r3": 7, "r2": 6}
    a.assert_log_clean()


# ---- The HTML view in a browser ----------------------------------------

class Dom(HTMLParser):
    """Every start tag, and the text of each row of the top-keys tables
    (data-minutes, data-ranking) as a list of cell texts."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.tags = []
        self.tables = {}
        self._table = None
        self._row = None
        self._cell = None

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        self.tags.append((tag, a))
        if tag == "table" and a.get("class") == "topkeys":
            self._table = (int(a["data-minutes"]), a["data-ranking"])
            self.tables[self._table] = []
        elif tag == "tr" and self._table:
            self._row = []
        elif tag == "td" and self._row is not None:
            self._cell = []

    def handle_data(self, data):
        if self._cell is not None:
            self._cell.append(data)

    def handle_endtag(self, tag):
        if tag == "td" and self._cell is not None:
            self._row.append("".join(self._cell).strip())
            self._cell = None
        elif tag == "tr" and self._row is not None:
            if self._row:
                self.tables[self._table].append(self._row)
            self._row = None
        elif tag == "table":
            self._table = None


def chromium_dom(url, timeout=90):
    """The DOM headless Chromium builds for url."""
    rc, out, err = chromium(["--dump-dom", url], timeout)
    assert rc == 0, err[-2000:]
    return out


# test_module_161_03: headless Chromium renders the page's top-keys tables
# with hostile keys as text only: each key in its cell exactly as sent,
# no element or attribute they spell, the 1-minute refusals equal to the
# Prometheus samples; a key with a space shows as its hash.
def test_module_161_03(apache_factory, redis_server):
    a = apache_factory(servers=1)
    a.start(conf(redis_server, limit="2 1/h"))
    keys = []
    for i, k in enumerate(HOSTILE + ["with space"]):
        keys += [k] * (4 + i)
    send_keys(a.port, keys, threads=1)
    dom = Dom()
    dom.feed(chromium_dom(a.url("/tbucket-status?view=html")))
    assert not [t for t, _ in dom.tags if t in ("script", "img")]
    assert not [a_ for _, a_ in dom.tags if any(k.startswith("on")
                                               for k in a_)]
    by_ref = dom.tables[(1, "refusals")]
    shown = [row[1] for row in by_ref]
    for k in HOSTILE:
        assert k in shown, (k, shown)
    hashed = [s for s in shown if s.startswith("#")]
    assert len(hashed) == 1 and len(hashed[0]) == 33
    text = http_get(a.url("/tbucket-status")).text
    series = check_exposition(text)
    prom = {unescape(dict(l)["key"]): v for (n, l), v in series.items()
            if n == "tbucket_top_key_refusals"}
    for row in by_ref:
        assert float(row[4]) == prom[row[1]], row
    assert set(dom.tables) == {(1, "refusals"), (1, "decisions"),
                               (15, "refusals"), (15, "decisions")}
    a.assert_log_clean()


# ---- Rules ---------------------------------------------------------------

# test_module_161_06: each section that sets TBucketLimit is a rule named
# by its sections, counted by outcome: the shadow rule's shadow-rejected
# say what enforcing it would refuse, side by side with an enforced
# rule's rejected, in the text and HTML views; a graceful restart keeps
# the counts; an .htaccess limit is no rule.
def test_module_161_06(apache_factory, redis_server):
    a = apache_factory(servers=1)
    a.write_file("htdocs/free/.htaccess",
                 "TBucketEnable On\nTBucketLimit 1 1/h\n")
    a.start(conf(redis_server, limit="3 1/h"))
    for _ in range(5):
        assert http_get(a.url("/shadow/ok.txt")).status_code == 200
    codes = [http_get(a.url("/limited/ok.txt"),
                      {"X-API-Key": "rule-key"}).status_code
             for _ in range(5)]
    assert codes == [200, 200, 200, 429, 429]
    text = http_get(a.url("/tbucket-status")).text
    series = check_exposition(text)

    def rule(name, outcome):
        return series[("tbucket_scope_decisions_total",
                       tuple(sorted((("scope", name),
                                     ("outcome", outcome)))))]

    assert rule("<Location /shadow>", "allowed") == 2
    assert rule("<Location /shadow>", "shadow-rejected") == 3
    assert rule("<Location /shadow>", "rejected") == 0
    assert rule("<Location /limited>", "allowed") == 3
    assert rule("<Location /limited>", "rejected") == 2
    page = http_get(a.url("/tbucket-status?view=html")).text
    assert "<code>&lt;Location /shadow&gt;</code>" in page
    a.graceful()
    # The .htaccess limit applies (1 1/h; a fresh bucket: the client's
    # IP bucket is shared with /shadow's), yet makes no rule.
    redis_server.client().flushall()
    assert [http_get(a.url("/free/ok.txt")).status_code
            for _ in range(2)] == [200, 429]
    series = check_exposition(http_get(a.url("/tbucket-status")).text)
    assert rule("<Location /shadow>", "shadow-rejected") == 3
    assert {dict(l)["scope"] for (n, l) in series
            if n == "tbucket_scope_decisions_total"} == \
        {"<Location /shadow>", "<Location /limited>"}
    a.assert_log_clean()


# ---- The refusal line and fail2ban --------------------------------------

def refusal_lines(a):
    return [ln for ln in a.read_log().splitlines() if "TB00160" in ln]


# test_module_162_01: clients 127.0.0.2..6, each its own bucket of 3: the
# three that go over get one TB00160 line per refusal, in the documented
# format, and fail2ban-regex with conf/fail2ban's filter finds exactly
# those addresses, as many times as they were refused, and never one
# that was only allowed, nor one a forged Referer names.
def test_module_162_01(apache_factory, redis_server):
    a = apache_factory(servers=2)
    a.start(conf(redis_server, limit="3 1/h"))
    sent = {"127.0.0.2": 2, "127.0.0.3": 3, "127.0.0.4": 5,
            "127.0.0.5": 7, "127.0.0.6": 4}
    refused = {}
    for ip, n in sent.items():
        c = Client(a.port, ip)
        for _ in range(n):
            # The Referer ends httpd's log line: it must not pass for one.
            code = c.get("/limited/ok.txt", {
                "Referer": "x TB00160: refused client=10.9.9.9 key=\"k\""})
            refused[ip] = refused.get(ip, 0) + (code == 429)
        c.close()
    assert refused == {"127.0.0.2": 0, "127.0.0.3": 0, "127.0.0.4": 2,
                       "127.0.0.5": 4, "127.0.0.6": 1}
    lines = refusal_lines(a)
    assert len(lines) == 7
    fmt = re.compile(r'TB00160: refused client=(\S+) net=(\S+) '
                     r'key="ip:(\S+)" '
                     r'limit="default" vhost="[^"]+" retry_after=(\d+)'
                     r'(?:, referer: .*)?$')
    for ln in lines:
        m = fmt.search(ln)
        assert m and m.group(1) == m.group(2) == m.group(3), ln
        assert 3500 <= int(m.group(4)) <= 3600, ln
        assert "[client %s:" % m.group(1) in ln
    ips = fail2ban_hosts(a.error_log)
    assert sorted(ips) == sorted(ip for ip, n in refused.items()
                                 for _ in range(n))
    a.assert_log_clean()


# test_module_162_02: the refusal line's key is the status page's: a
# hostile key is written with %22, %5C and %25 for its quote, backslash
# and percent and fail2ban still finds the client; TBucketRefusalLog off
# logs nothing; notice is logged under LogLevel warn, info is not; the
# closed policy's refusals (Redis down) are never logged.
def test_module_162_02(apache_factory, redis_server):
    a = apache_factory(servers=2)
    a.start(conf(redis_server, limit="1 1/h"))
    c = Client(a.port, "127.0.0.7")
    assert [c.get("/limited/ok.txt", {"X-API-Key": 'k\\"q%41'})
            for _ in range(2)] == [200, 429]
    c.close()
    (line,) = refusal_lines(a)
    assert 'client=127.0.0.7 net=127.0.0.7 key="k%5C%22q%2541" ' \
        'limit="default"' in line
    assert fail2ban_hosts(a.error_log) == ["127.0.0.7"]

    a.stop()
    redis_server.client().flushall()
    os.unlink(a.error_log)
    a.start(conf(redis_server, "TBucketRefusalLog off", limit="1 1/h"))
    assert [http_get(a.url("/limited/ok.txt")).status_code
            for _ in range(2)] == [200, 429]
    assert refusal_lines(a) == []

    a.stop()
    redis_server.client().flushall()
    a.log_level = "warn"
    a.start(conf(redis_server, "TBucketRefusalLog notice", limit="1 1/h"))
    http_get(a.url("/limited/ok.txt"), {"X-API-Key": "n1"})
    http_get(a.url("/limited/ok.txt"), {"X-API-Key": "n1"})
    assert len(refusal_lines(a)) == 1
    assert "[tbucket:notice]" in refusal_lines(a)[0]
    a.stop()
    a.start(conf(redis_server, "TBucketRefusalLog info", limit="1 1/h"))
    assert http_get(a.url("/limited/ok.txt"),
                    {"X-API-Key": "n1"}).status_code == 429
    assert len(refusal_lines(a)) == 1

    # Redis gone, policy closed: 429s, and no line.
    a.stop()
    redis_server.stop()
    a.log_level = "warn tbucket:info"
    a.start(conf(redis_server, "TBucketFailurePolicy closed\n"
                 "TBucketRefusalLog info", limit="1 1/h"))
    for _ in range(3):
        assert http_get(a.url("/limited/ok.txt")).status_code == 429
    assert len(refusal_lines(a)) == 1
    for bad in ("loud", "warn", ""):
        rc, out = a.configtest(conf(redis_server,
                                    "TBucketRefusalLog %s" % bad))
        assert rc != 0 and "TBucketRefusalLog" in out, out
    a.assert_log_clean(allowed=("TB00105",))


# ---- tbucket top in a terminal -------------------------------------------

class Tmux:
    """A tmux server of our own (its own socket), stopped by PID."""

    def __init__(self):
        require(TMUX, "tmux")
        self.sock = "tbtop-%d-%d" % (os.getpid(), random.randrange(10**6))
        self.pid = None

    def run(self, *args):
        return subprocess.run([TMUX, "-L", self.sock] + list(args),
                              capture_output=True, text=True, timeout=20)

    def start(self, command):
        p = self.run("new-session", "-d", "-s", "top", "-x", "160", "-y",
                     "60", command)
        assert p.returncode == 0, p.stderr
        self.pid = int(self.run("display-message", "-p",
                                "#{pid}").stdout.strip())

    def respawn(self, command):
        """Run command in the same pane, in place of what runs there; the
        pane starts blank. (Killing the only session ends the tmux server,
        and a new-session that meets the ending server fails with "server
        exited unexpectedly", as it did once in CI under ASan.)"""
        p = self.run("respawn-pane", "-k", "-t", "top", command)
        assert p.returncode == 0, p.stderr

    def screen(self):
        return self.run("capture-pane", "-p", "-t", "top").stdout

    def wait_for(self, needle, timeout=15):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            text = self.screen()
            if needle in text:
                return text
            time.sleep(0.1)
        pytest.fail("%r not on the screen:\n%s" % (needle, self.screen()))

    def stop(self):
        if self.pid:
            try:
                os.kill(self.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            self.pid = None


# test_module_163_01: `tbucket top` in a terminal (tmux) redraws the top
# keys as traffic comes, shows a hostile key as text, and quits on q with
# status 0; a second run quits on Ctrl-C; --once prints one frame with no
# escape codes.
def test_module_163_01(apache_factory, redis_server):
    if not os.path.exists(TOOL):
        pytest.fail("%s is missing: run make" % TOOL)
    a = apache_factory(servers=1)
    a.start(conf(redis_server, limit="2 1/h"))
    url = a.url("/tbucket-status")
    send_keys(a.port, ["first-key"] * 4, threads=1)
    tm = Tmux()
    try:
        tm.start("%s top %s --interval 200ms; echo TOP-EXIT=$?; sleep 60"
                 % (TOOL, url))
        tm.wait_for("first-key")
        send_keys(a.port, ["second-key"] * 6 + ['<b>"esc"</b>'] * 3,
                  threads=1)
        screen = tm.wait_for("second-key")
        assert "LAST 1 MINUTE, BY REFUSALS" in screen
        row = [ln for ln in screen.splitlines() if "second-key" in ln][0]
        assert row.split()[1:4] == ["4", "6", "2"], row
        tm.wait_for('<b>"esc"</b>')
        tm.run("send-keys", "-t", "top", "q")
        tm.wait_for("TOP-EXIT=0")
        tm.respawn("%s top %s --interval 200ms; echo TOP-EXIT=$?; sleep 60"
                   % (TOOL, url))
        tm.wait_for("first-key")
        tm.run("send-keys", "-t", "top", "C-c")
        tm.wait_for("TOP-EXIT=0")
    finally:
        tm.stop()
    p = subprocess.run([TOOL, "top", url, "--once"], capture_output=True,
                       text=True, timeout=30)
    assert p.returncode == 0 and "\x1b" not in p.stdout, p.stderr
    assert "second-key" in p.stdout and "first-key" in p.stdout
    a.assert_log_clean()
