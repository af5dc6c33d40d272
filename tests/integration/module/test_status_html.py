"""test_status_html.py -- the tbucket-status page's HTML view (?view=html): the
same figures as the Prometheus text, escaped, and rendered by a real browser
(headless Chromium, Debian package chromium).

Every figure of the HTML view sits in an element carrying data-metric and
data-labels (the sample's name and its Prometheus labels), so each one can
be matched to a line of the text view. One Apache child (event MPM,
StartServers 1) answers both views, so even the per-process gauges
(breaker state, pool figures) must agree.

With TB_UPDATE_DOCS=1 the browser test also copies its screenshot to
docs/status-html.png.
"""
import html
import os
import re
import shutil
import struct
import time
from html.parser import HTMLParser

import requests

from tbtest.apache import http_get
from tbtest.env import BUILD, CHROMIUM, ROOT, chromium, free_port, require


# A ServerName that would run script, break out of an attribute and smuggle
# an entity if the page printed it raw. Apache accepts it as a name.
HOSTILE = "<script>alert(\"x\")</script><img src=x onerror=alert(1)>&amp;'tb"

# The breaker opening (TB00105) is logged at warn by design: the vhost
# below points at a closed port to make it open.
ALLOWED_TAGS = ("TB00105",)

# The metric families the page must offer, each with HELP and TYPE.
REQUIRED_FAMILIES = (
    "tbucket_decisions_total", "tbucket_vhost_decisions_total",
    "tbucket_redis_latency_seconds", "tbucket_redis_errors_total",
    "tbucket_breaker_state", "tbucket_breaker_opens_total",
    "tbucket_breaker_closes_total", "tbucket_fallback_decisions_total",
    "tbucket_pool_size", "tbucket_pool_connections_in_use",
    "tbucket_pool_connections_open",
)


def conf(redis_url, port, dead_port, prefix):
    """Limits on the main server's Redis, a shadow scope, a status page,
    and a hostile-named vhost (reached as down.test) whose Redis is a
    closed port, so errors, fallbacks and a breaker transition exist."""
    hostile = HOSTILE.replace('"', '\\"')
    return """
TBucketRedis {url} timeout=500
TBucketPrefix {prefix}
<Location /limited>
    TBucketEnable On
    TBucketLimit 3 1/h
</Location>
<Location /shadow>
    TBucketEnable On
    TBucketLimit 1 1/h
    TBucketMode shadow
</Location>
<Location /tbucket-status>
    SetHandler tbucket-status
    Require ip 127.0.0.1
</Location>
<VirtualHost 127.0.0.1:{port}>
    ServerName 127.0.0.1
</VirtualHost>
<VirtualHost 127.0.0.1:{port}>
    ServerName "{hostile}"
    ServerAlias down.test
    TBucketRedis redis://127.0.0.1:{dead} timeout=200 connect_timeout=200
    TBucketFailurePolicy closed
    TBucketBreaker threshold=2 cooldown=60s
</VirtualHost>
""".format(url=redis_url, prefix=prefix, port=port, hostile=hostile,
           dead=dead_port)


def start(apache_factory, redis_server, prefix):
    """One child, so one process answers every view; some traffic."""
    a = apache_factory(servers=1)
    a.start(conf(redis_server.url, a.port, free_port(), prefix))
    for _ in range(5):
        http_get(a.url("/limited/ok.txt"))
    for _ in range(2):
        http_get(a.url("/shadow/ok.txt"))
    for _ in range(4):
        http_get(a.url("/limited/ok.txt"), {"Host": "down.test"})
    return a


def prom_samples(text):
    """{'name{labels}': 'value'} of a Prometheus text page, and the
    families that have a HELP and a TYPE line."""
    samples, helped, typed = {}, set(), set()
    for line in text.splitlines():
        if line.startswith("# HELP "):
            helped.add(line.split()[2])
        elif line.startswith("# TYPE "):
            typed.add(line.split()[2])
        elif line:
            head, _, value = line.rpartition(" ")
            samples[head] = value
    return samples, helped & typed


class Figures(HTMLParser):
    """The data-metric elements of a page, as 'name{labels}' -> [text],
    plus every start tag seen (to catch injected markup)."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.figures = {}
        self.tags = []
        self.attrs = []
        self._open = None

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        self.tags.append(tag)
        self.attrs.append((tag, a))
        if "data-metric" in a:
            labels = a.get("data-labels", "")
            key = a["data-metric"] + ("{%s}" % labels if labels else "")
            self._open = (tag, key, [])

    def handle_data(self, data):
        if self._open:
            self._open[2].append(data)

    def handle_endtag(self, tag):
        if self._open and tag == self._open[0]:
            _, key, parts = self._open
            self.figures.setdefault(key, []).append("".join(parts).strip())
            self._open = None


def figures(page):
    p = Figures()
    p.feed(page)
    p.close()
    return p


# Gauges of the moment: two scrapes a few milliseconds apart may differ
# (the other scrape's worker may still be busy logging).
MOMENTARY = ("tbucket_workers_busy",)


def assert_same_figures(html_page, text_page):
    """Each figure of the HTML equals its Prometheus sample, and each
    Prometheus sample is somewhere in the HTML."""
    samples, _ = prom_samples(text_page)
    got = figures(html_page).figures
    for key, values in got.items():
        assert key in samples, "HTML figure not in the text view: " + key
        if key.split("{")[0] in MOMENTARY:
            continue
        for v in values:
            assert v == samples[key], (key, v, samples[key])
    missing = sorted(set(samples) - set(got))
    assert not missing, "text samples not in the HTML view: %r" % missing


def assert_self_contained(page):
    """No script, no external resource, no inline event handler."""
    p = figures(page)
    assert "script" not in p.tags
    for tag, attrs in p.attrs:
        assert tag not in ("link", "iframe", "object", "embed", "img"), tag
        assert not any(k.startswith("on") for k in attrs), (tag, attrs)
        assert "src" not in attrs, (tag, attrs)
        href = attrs.get("href", "")
        assert not re.match(r"^[a-z]+:|^//", href), href


# The HTML view has every figure of the text view, equal, after traffic
# that moves decisions, errors, fallbacks, the breaker and the histogram.
def test_module_008_01(apache_factory, redis_server):
    a = start(apache_factory, redis_server, "h1:")
    text = http_get(a.url("/tbucket-status"))
    page = http_get(a.url("/tbucket-status?view=html"))
    assert page.status_code == 200
    assert page.headers["Content-Type"] == "text/html; charset=utf-8"
    assert "default-src 'none'" in page.headers["Content-Security-Policy"]
    assert page.headers["Cache-Control"] == "no-store"
    assert text.headers["Content-Type"].startswith("text/plain; version=0.0.4")
    samples, described = prom_samples(text.text)
    for fam in REQUIRED_FAMILIES:
        assert fam in described, fam
    for head in samples:
        fam = re.sub(r"\{.*", "", head)
        base = re.sub(r"_(bucket|sum|count)$", "", fam)
        assert fam in described or base in described, head
    assert_same_figures(page.text, text.text)
    assert_self_contained(page.text)

    # The figures the traffic made, as the page shows them.
    f = figures(page.text).figures
    ok = 'redis="%s",policy="open"' % redis_server.url
    # /shadow takes from the same per-client bucket, which /limited emptied.
    assert f['tbucket_decisions_total{outcome="allowed"}'][0] == "3"
    assert f['tbucket_decisions_total{outcome="rejected"}'][0] == "2"
    assert f['tbucket_decisions_total{outcome="shadow-rejected"}'][0] == "2"
    assert f['tbucket_decisions_total{outcome="fallback-closed"}'][0] == "4"
    assert f["tbucket_redis_calls_total{%s}" % ok][0] == "7"
    assert f['tbucket_redis_latency_seconds_bucket{%s,le="+Inf"}' % ok] \
        == ["7", "7"]  # the bar table and the table of every figure
    down = [k for k in f if k.startswith("tbucket_breaker_opens_total{")
            and 'policy="closed"' in k]
    assert len(down) == 1 and f[down[0]][0] == "1"
    io = [k for k in f if k.startswith("tbucket_redis_errors_total{")
          and 'policy="closed"' in k and 'kind="io"' in k]
    assert len(io) == 1 and int(f[io[0]][0]) >= 1
    fb = [k for k in f if k.startswith("tbucket_fallback_decisions_total{")
          and 'policy="closed"' in k and 'fallback="closed"' in k]
    assert len(fb) == 1 and f[fb[0]][0] == "4"
    assert f["tbucket_pool_size{%s}" % ok][0] == "1"
    assert "tbucket_pool_connections_in_use{%s}" % ok in f
    assert ">open</span>" in page.text      # the down vhost's breaker
    assert ">closed</span>" in page.text    # the working one
    assert "Redis <code>%s</code>" % redis_server.url in page.text

    # HEAD, an explicit text view and an unknown view.
    head = requests.head(a.url("/tbucket-status?view=html"), timeout=10)
    assert head.status_code == 200 and not head.content
    assert head.headers["Content-Type"] == "text/html; charset=utf-8"
    plain = http_get(a.url("/tbucket-status?view=text"))
    assert plain.headers["Content-Type"].startswith("text/plain")
    assert http_get(a.url("/tbucket-status?view=<x>")).status_code == 400
    a.assert_log_clean(allowed=ALLOWED_TAGS)


# A hostile ServerName is text on the page, never markup: escaped by
# ap_escape_html in text and attributes, and the Redis password is
# redacted in both views.
def test_module_008_02(apache_factory, redis_server):
    a = apache_factory(servers=1)
    body = conf(redis_server.url, a.port, free_port(), "h2:")
    body = re.sub(r"TBucketRedis redis://127\.0\.0\.1:(\d+) timeout=200",
                  r"TBucketRedis redis://u:pa<ss>wd@127.0.0.1:\1 timeout=200",
                  body)
    assert "pa<ss>wd" in body
    a.start(body)
    http_get(a.url("/limited/ok.txt"), {"Host": "down.test"})
    page = http_get(a.url("/tbucket-status?view=html")).text
    text = http_get(a.url("/tbucket-status")).text
    for raw in ("<script", "<img", "onerror=alert(1)>", "&amp;'tb"):
        assert raw not in page, raw
    assert html.escape(HOSTILE, quote=True).replace("&#x27;", "'") in page
    p = figures(page)
    assert_self_contained(page)
    names = [v for t, a_ in p.attrs for v in [a_.get("data-labels", "")]
             if HOSTILE.replace('"', '\\"') in v]
    assert names, "the hostile vhost's figures keep its name in data-labels"
    assert "pa<ss>wd" not in page and "pa<ss>wd" not in text
    assert "pa&lt;ss&gt;wd" not in page
    assert "u:***@127.0.0.1" in page
    # The Prometheus view escapes the same name its own way.
    assert 'vhost="%s:%d"' % (HOSTILE.replace('"', '\\"'), a.port) in text
    assert_same_figures(page, text)
    a.assert_log_clean(allowed=ALLOWED_TAGS)


def png_size(path):
    with open(path, "rb") as f:
        head = f.read(24)
    assert head[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG: %r" % head[:8]
    return struct.unpack(">II", head[16:24])


# A real browser renders the page: the DOM it builds holds the same
# figures as the text view and the hostile name as text only, and a
# screenshot of it is saved (docs/status-html.png with TB_UPDATE_DOCS=1).
def test_module_008_03(apache_factory, redis_server, tmp_path):
    require(CHROMIUM, "chromium")
    a = start(apache_factory, redis_server, "h3:")
    url = a.url("/tbucket-status?view=html")
    text = http_get(a.url("/tbucket-status")).text

    rc, dom, err = chromium(["--dump-dom", url])
    assert rc == 0, err[-2000:]
    assert "<h1>mod_tbucket status</h1>" in dom, dom[:500]
    assert_same_figures(dom, text)
    p = figures(dom)
    assert "script" not in p.tags and "img" not in p.tags
    f = p.figures
    assert f['tbucket_decisions_total{outcome="allowed"}'][0] == "3"
    assert f['tbucket_decisions_total{outcome="fallback-closed"}'][0] == "4"
    assert html.escape(HOSTILE, quote=False) in dom

    shot = tmp_path / "status-html.png"
    t0 = time.monotonic()
    rc, _, err = chromium(["--screenshot=%s" % shot, "--window-size=1000,900",
                           "--hide-scrollbars", url])
    assert rc == 0, err[-2000:]
    assert shot.exists(), err[-2000:]
    assert png_size(str(shot)) == (1000, 900)
    assert shot.stat().st_size > 20000, "screenshot looks blank"
    keep = os.path.join(BUILD, "status-html.png")
    shutil.copyfile(str(shot), keep)
    if os.environ.get("TB_UPDATE_DOCS") == "1":
        shutil.copyfile(str(shot), os.path.join(ROOT, "docs",
                                                "status-html.png"))
    assert time.monotonic() - t0 < 90
    a.assert_log_clean(allowed=ALLOWED_TAGS)
