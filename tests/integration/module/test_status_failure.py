"""test_status_failure.py -- the status page says why Redis last failed.

For each Redis configuration the page keeps the failure that last opened a
breaker, in any child: the time, the error kind and the reason (the core's
errstr, the same text as the TB00105 log line). The Prometheus text has
tbucket_redis_last_failure_timestamp_seconds{redis,policy,kind}; the HTML
view shows time, kind and reason, escaped. Against real servers: a TLS
redis-server whose certificate the configured CA did not sign, or whose
name is not the configured tls_server_name; a plain redis-server stopped
(io), then restarted and frozen with SIGSTOP (timeout); a redis-server
with requirepass and a wrong password (auth); and a hostile endpoint on a
loopback socket that answers every command with an error reply carrying
markup and a control character, as a compromised or impostor Redis could.
One Apache child (event MPM, StartServers 1), so one breaker opens.
"""
import re
import socket
import threading
import time
from html.parser import HTMLParser

import pytest

from tbtest.apache import http_get, metric, wait_until
from tbtest.env import Redis

FAMILY = "tbucket_redis_last_failure_timestamp_seconds"
# TB00105: the breaker opened (with kind and reason); TB00106: it closed.
BREAKER_TAGS = ("TB00105", "TB00106")


def body(url, opts="", policy="closed", cooldown="60s", timeout=300):
    return """
TBucketRedis %s timeout=%d connect_timeout=%d %s
TBucketFailurePolicy %s
TBucketBreaker threshold=2 cooldown=%s
TBucketPrefix lf:
<Location /limited>
    TBucketEnable On
    TBucketLimit 100 100/s
</Location>
<Location /tbucket-status>
    SetHandler tbucket-status
    Require ip 127.0.0.1
</Location>
""" % (url, timeout, timeout, opts, policy, cooldown)


def failures(text):
    """[(labels dict, value)] of the last-failure family in a text page."""
    got = []
    for line in text.splitlines():
        if not line.startswith(FAMILY + "{"):
            continue
        head, _, value = line.rpartition(" ")
        labels = dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', head))
        got.append((labels, float(value)))
    return got


class Card(HTMLParser):
    """What an HTML page says of last failures: the text of each
    code.kind and code.reason, the data-metric figures of the family,
    and every start tag (to catch injected markup)."""

    def __init__(self, page):
        super().__init__(convert_charrefs=True)
        self.kinds, self.reasons, self.figures, self.tags = [], [], {}, []
        self._into = None
        self.feed(page)
        self.close()

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        self.tags.append(tag)
        if tag == "code" and a.get("class") in ("kind", "reason"):
            self._into = (a["class"], [])
        elif a.get("data-metric") == FAMILY:
            self._into = ("figure:" + a.get("data-labels", ""), [])

    def handle_data(self, data):
        if self._into:
            self._into[1].append(data)

    def handle_endtag(self, tag):
        if not self._into or tag not in ("code", "span", "td"):
            return
        what, parts = self._into
        text = "".join(parts)
        if what == "kind":
            self.kinds.append(text)
        elif what == "reason":
            self.reasons.append(text)
        else:
            self.figures[what[len("figure:"):]] = text.strip()
        self._into = None


def logged_reasons(a, label):
    """The (kind, reason) of each TB00105 line about one Redis."""
    pat = re.compile(r"TB00105: Redis %s is failing \((\w+): (.*)\): "
                     r"breaker open" % re.escape(label))
    return pat.findall(a.read_log())


def pages(a):
    text = http_get(a.url("/tbucket-status")).text
    page = http_get(a.url("/tbucket-status?view=html")).text
    return text, page


def assert_one_failure(a, redis, policy, kind, t0, t1):
    """The text view has one last failure for this Redis, of this kind,
    timed within [t0, t1]; the HTML view shows the same figure, the kind
    and the logged reason (which it returns)."""
    text, page = pages(a)
    got = failures(text)
    assert len(got) == 1, got
    labels, when = got[0]
    assert labels == {"redis": redis, "policy": policy, "kind": kind}, got
    assert t0 - 1 <= when <= t1 + 1, (t0, when, t1)
    c = Card(page)
    assert c.kinds == [kind], c.kinds
    logged = logged_reasons(a, redis)
    assert logged and logged[-1][0] == kind, logged
    assert c.reasons == [logged[-1][1]], (c.reasons, logged)
    key = 'kind="%s",policy="%s",redis="%s"' % (kind, policy, redis)
    assert [v for k, v in c.figures.items()
            if ",".join(sorted(k.split(","))) == key] \
        == ["%.6f" % when], c.figures
    assert time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(int(when))) \
        in page
    return c.reasons[0], when


# A rediss:// Redis that fails verification: the closed policy answers,
# the first failure (threshold 2) records nothing, the second opens the
# breaker and records kind tls with OpenSSL's reason, and the requests
# skipped while it stays open do not touch the record.
@pytest.mark.parametrize("opts, want", [
    ("tls_ca={other_ca}", "tls handshake: certificate verify failed: "
     "self-signed certificate in certificate chain"),
    ("tls_ca={ca} tls_server_name=wrong.example",
     "tls handshake: certificate verify failed: hostname mismatch"),
], ids=["other-ca", "server-name"])
def test_module_021_01(apache_factory, tls_redis, pki, opts, want):
    r = tls_redis()
    a = apache_factory(servers=1)
    a.start(body(r.url, opts.format(other_ca=pki.other_ca_pem,
                                    ca=pki.ca_pem)))
    text, page = pages(a)
    assert failures(text) == []
    assert "none recorded" in page and Card(page).reasons == []
    t0 = time.time()
    assert http_get(a.url("/limited/ok.txt")).status_code == 429
    assert failures(pages(a)[0]) == []
    assert http_get(a.url("/limited/ok.txt")).status_code == 429
    t1 = time.time()
    reason, when = assert_one_failure(a, r.url, "closed", "tls", t0, t1)
    assert reason == want, reason
    for _ in range(3):
        assert http_get(a.url("/limited/ok.txt")).status_code == 429
    text, _ = pages(a)
    assert failures(text)[0][1] == when
    assert metric(text, "tbucket_breaker_skips_total", redis=r.url,
                  policy="closed") == 3
    assert metric(text, "tbucket_redis_errors_total", redis=r.url,
                  policy="closed", kind="tls") == 2
    a.assert_log_clean(BREAKER_TAGS)


# A plain Redis stopped: kind io, "Connection refused"; restarted, the
# breaker closes after its cooldown and the record stays; frozen by
# SIGSTOP, the next opening replaces it with kind timeout and a later time.
def test_module_021_02(apache_factory, redis_server):
    a = apache_factory(servers=1)
    a.start(body(redis_server.url, policy="open", cooldown="1s"))
    assert http_get(a.url("/limited/ok.txt")).status_code == 200
    assert failures(pages(a)[0]) == []
    redis_server.stop()
    t0 = time.time()
    for _ in range(2):
        assert http_get(a.url("/limited/ok.txt")).status_code == 200
    t1 = time.time()
    reason, t_io = assert_one_failure(a, redis_server.url, "open", "io",
                                      t0, t1)
    assert "Connection refused" in reason, reason

    redis_server.start()

    def closed():
        http_get(a.url("/limited/ok.txt"))
        return metric(pages(a)[0], "tbucket_breaker_closes_total",
                      redis=redis_server.url, policy="open") == 1
    assert wait_until(closed, timeout=10, step=0.2)
    assert failures(pages(a)[0])[0][1] == t_io

    redis_server.sigstop()
    try:
        t0 = time.time()
        for _ in range(2):
            assert http_get(a.url("/limited/ok.txt")).status_code == 200
        t1 = time.time()
        reason, t_to = assert_one_failure(a, redis_server.url, "open",
                                          "timeout", t0, t1)
    finally:
        redis_server.sigcont()
    assert t_to > t_io
    assert "timed out" in reason, reason
    a.assert_log_clean(BREAKER_TAGS)


# A real Redis refusing the password: kind auth, Redis's own WRONGPASS
# text as the reason, and the password in neither view.
def test_module_021_03(apache_factory, tmp_path):
    rd = Redis(tmp_path / "pw", password="r1ghtpw").start()
    try:
        a = apache_factory(servers=1)
        url = "redis://:wr0ngpw@127.0.0.1:%d" % rd.port
        label = "redis://***@127.0.0.1:%d" % rd.port
        a.start(body(url))
        t0 = time.time()
        for _ in range(2):
            assert http_get(a.url("/limited/ok.txt")).status_code == 429
        reason, _ = assert_one_failure(a, label, "closed", "auth", t0,
                                       time.time())
        assert reason == ("AUTH refused: WRONGPASS invalid username-password "
                          "pair or user is disabled."), reason
        text, page = pages(a)
        assert "wr0ngpw" not in text + page
        assert "wr0ngpw" not in a.read_log()
        a.assert_log_clean(BREAKER_TAGS)
    finally:
        rd.stop()


HOSTILE = "<script>alert(1)</script><img src=x onerror=alert(2)>&amp;\"'\x1b!"


def resp_commands(buf):
    """How many complete RESP commands (arrays of bulk strings) buf
    starts with, and the bytes they take."""
    n = used = 0
    while buf[used:used + 1] == b"*":
        end = buf.find(b"\r\n", used)
        if end < 0:
            break
        pos, argc = end + 2, int(buf[used + 1:end])
        for _ in range(argc):
            end = buf.find(b"\r\n", pos)
            if end < 0:
                return n, used
            pos = end + 2 + int(buf[pos + 1:end]) + 2
            if pos > len(buf):
                return n, used
        n, used = n + 1, pos
    return n, used


class ErrorServer:
    """A loopback endpoint that speaks RESP and answers every command with
    the error reply `-ERR <text>`. Stopped by stop()."""

    def __init__(self, text):
        self.reply = b"-ERR " + text.encode() + b"\r\n"
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.running = True
        self.threads = [threading.Thread(target=self._accept, daemon=True)]
        self.threads[0].start()

    def _accept(self):
        while self.running:
            try:
                conn, _ = self.sock.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            t = threading.Thread(target=self._serve, args=(conn,),
                                 daemon=True)
            self.threads.append(t)
            t.start()

    def _serve(self, conn):
        conn.settimeout(0.2)
        buf = b""
        with conn:
            while self.running:
                try:
                    data = conn.recv(65536)
                except socket.timeout:
                    continue
                except OSError:
                    return
                if not data:
                    return
                buf += data
                n, used = resp_commands(buf)
                buf = buf[used:]
                if n:
                    conn.sendall(self.reply * n)

    def stop(self):
        self.running = False
        self.sock.close()
        for t in self.threads:
            t.join(timeout=2)


# A reason with markup and a control character, from the network: the
# HTML view shows it as text (no injected element, '<' escaped), the
# control character as '?', and the text view carries only the kind.
def test_module_021_04(apache_factory):
    srv = ErrorServer(HOSTILE)
    try:
        a = apache_factory(servers=1)
        url = "redis://127.0.0.1:%d" % srv.port
        a.start(body(url))
        t0 = time.time()
        for _ in range(2):
            assert http_get(a.url("/limited/ok.txt")).status_code == 429
        text, page = pages(a)
        got = failures(text)
        assert [g[0]["kind"] for g in got] == ["reply"], got
        assert t0 - 1 <= got[0][1] <= time.time() + 1
        c = Card(page)
        assert c.reasons == ["SCRIPT LOAD refused: ERR "
                             + HOSTILE.replace("\x1b", "?")], c.reasons
        assert "script" not in c.tags and "img" not in c.tags, c.tags
        assert "&lt;script&gt;alert(1)&lt;/script&gt;&lt;img" in page
        assert "&amp;amp;" in page
        assert "<script" not in page and "<img" not in page
        assert "<script" not in text and "\x1b" not in text + page
        a.assert_log_clean(BREAKER_TAGS)
    finally:
        srv.stop()
