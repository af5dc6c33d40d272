"""test_status_layout.py -- the HTML view's tables as a person reads them:
no priority listed twice without its site, no empty table where a
sentence says why, "Limits" and "Scopes" sections that do not say "no
limit" above limits, and, laid out by a real browser (headless Chromium) at 1280 pixels,
site names on one line and no table wider than the page.

The layout is measured in the browser: the page is saved with a small
script appended (a copy, read from a file, which no Content-Security-
Policy header covers), the script writes what it measured into the DOM,
and --dump-dom returns it.
"""
import json
import re

from tbtest.apache import http_get
from tbtest.env import CHROMIUM, chromium, require

from test_engine import body as engine_body

SITES = ("www.a-rather-long-site-name.example.org", "shop.example.net")


def conf(redis_url, port, shed=""):
    """Two named sites besides the main server; shed sets TBucketShed on
    the main server. A TBucketRule and no TBucketLimit."""
    vhosts = "".join("""
<VirtualHost 127.0.0.1:{port}>
    ServerName {name}
</VirtualHost>""".format(port=port, name=n) for n in SITES)
    return """
TBucketRedis {url} timeout=500
TBucketPrefix lay:
{shed}
<Location /a>
    TBucketEnable On
    TBucketRule tight "%{{HTTP:X-User}}" 2 1/m ban=1m
</Location>
<Location /tbucket-status>
    SetHandler tbucket-status
    Require ip 127.0.0.1
</Location>
{vhosts}
""".format(url=redis_url, port=port, shed=shed, vhosts=vhosts)


def prio_tables(page):
    """Each table of the local protection section: its header cells and
    the site of each row."""
    section = page[page.index("<h2>Local protection</h2>"):]
    section = section[:section.index("<h3>local scopes</h3>")]
    out = []
    for table in re.findall(r"<table class=\"prios\">(.*?)</table>",
                            section, re.S):
        head = re.findall(r"<th[^>]*>([^<]*)</th>", table)
        sites = re.findall(r"<td class=\"site\"><code>([^<]*)</code>", table)
        out.append((head, sites))
    return section, out


# Every per-priority table of local protection has one row per site
# (named) and one column per priority: no priority listed twice, none
# without its site. Without TBucketShed, "shed at busy %" is a sentence,
# not an empty table; with it, the site that sheds has its row.
def test_module_246_01(apache_factory, redis_server):
    a = apache_factory(servers=1)
    a.start(conf(redis_server.url, a.port))
    page = http_get(a.url("/tbucket-status?view=html")).text
    section, tables = prio_tables(page)
    assert "No site sheds (TBucketShed is not set)." in section
    assert len(tables) == 2, section
    sites = ["%s:%d" % (n, a.port) for n in SITES]
    for head, rows in tables:
        assert head == ["site", "low", "normal", "high", "critical"], head
        assert len(rows) == len(set(rows)), rows
        assert set(sites) <= set(rows), rows
    a.stop()

    b = apache_factory(servers=1)
    b.start(conf(redis_server.url, b.port, "TBucketShed low=50 normal=90"))
    page = http_get(b.url("/tbucket-status?view=html")).text
    section, tables = prio_tables(page)
    assert "TBucketShed is not set" not in section
    head, rows = tables[0]
    assert head == ["site", "low", "normal", "high", "critical"]
    assert len(rows) == len(set(rows)) and rows, rows
    m = re.search(r"<tr><td class=\"site\"><code>[^<]*</code></td>"
                  r"<td[^>]*>50</td><td[^>]*>90</td>"
                  r"<td class=\"n zero\">&ndash;</td>"
                  r"<td class=\"n zero\">&ndash;</td></tr>", section)
    assert m, section


# "Limits" lists the named limits (a TBucketRule here) by their events,
# then "Scopes" says in a sentence that no section sets TBucketLimit,
# never "no limit" above the limits.
def test_module_246_02(apache_factory, redis_server):
    a = apache_factory(servers=1)
    a.start(conf(redis_server.url, a.port))
    http_get(a.url("/a/ok.txt"), {"X-User": "mo"})
    page = http_get(a.url("/tbucket-status?view=html")).text
    limits = page[page.index('<h2 id="limits">Limits</h2>'):]
    scopes = limits[limits.index('<h2 id="scopes">Scopes</h2>'):]
    limits = limits[:len(limits) - len(scopes)]
    scopes = scopes[:scopes.index("<h2", 5)]
    assert "no named limit" not in limits.lower(), limits
    assert "<th>limit</th>" in limits and "<code>tight</code>" in limits
    assert "No scope sets TBucketLimit." in scopes, scopes
    assert "<table>" not in scopes, scopes
    assert "Rules" not in page and "TBucketRule</h3>" not in page


MEASURE = """<script>
(function () {
  var doc = document.documentElement, out = {width: doc.clientWidth,
      scroll: doc.scrollWidth, wrapped: [], wide: []};
  var h2 = Array.prototype.filter.call(document.querySelectorAll('h2'),
      function (e) { return e.textContent === 'Decisions by virtual host'; });
  var el = h2[0].nextElementSibling;
  var table = el.tagName === 'TABLE' ? el : el.querySelector('table');
  Array.prototype.forEach.call(table.querySelectorAll('tr td:first-child code'),
      function (c) { if (c.getClientRects().length > 1)
                       out.wrapped.push(c.textContent); });
  Array.prototype.forEach.call(document.querySelectorAll('table'),
      function (t) { var r = t.getBoundingClientRect();
        var box = t.parentElement.getBoundingClientRect();
        if (r.right > doc.clientWidth + 0.5 && box.right > doc.clientWidth + 0.5)
          out.wide.push(t.rows[0].textContent.slice(0, 60)); });
  document.body.setAttribute('data-layout', JSON.stringify(out));
})();
</script>"""


# At 1280 pixels, laid out by Chromium: the per-site table's site names
# keep to one line each, and no table makes the page wider than the
# window (a wide one scrolls inside its own box).
def test_module_246_03(apache_factory, redis_server, tmp_path):
    require(CHROMIUM, "chromium")
    a = apache_factory(servers=1)
    a.start(conf(redis_server.url, a.port))
    for n in SITES:
        http_get(a.url("/a/ok.txt"), {"Host": n, "X-User": "mo"})
    page = http_get(a.url("/tbucket-status?view=html")).text
    copy = tmp_path / "page.html"
    copy.write_text(page.replace("</body>", MEASURE + "</body>"))
    rc, dom, err = chromium(["--window-size=1280,900", "--hide-scrollbars",
                             "--dump-dom", "file://%s" % copy])
    assert rc == 0, err[-2000:]
    m = re.search(r'data-layout="([^"]*)"', dom)
    assert m, dom[-2000:]
    out = json.loads(m.group(1).replace("&quot;", '"'))
    assert out["width"] == 1280, out
    assert out["wrapped"] == [], out
    assert out["wide"] == [] and out["scroll"] <= out["width"], out


# The engine is read from the calls of every child: on a Redis with the
# module, the page says "module" and how many calls went to it, whichever
# child answers (one that made no call itself says so, not just
# "unknown").
def test_module_246_04(apache_factory, mod_redis):
    a = apache_factory(mpm="prefork", servers=2)
    a.start(engine_body(mod_redis.url, "module"))
    for i in range(6):
        http_get(a.url("/limited/ok.txt"), {"X-API-Key": "u%d" % i})
    for _ in range(4):
        page = http_get(a.url("/tbucket-status?view=html")).text
        redis = 'redis=&quot;%s&quot;' % mod_redis.url
        assert 'data-engine-calls="module"' in page, page
        m = re.search(r'data-engine-calls="module">module: <span class="n" '
                      r'data-metric="tbucket_redis_module_calls_total" '
                      r'data-labels="%s,policy=&quot;open&quot;">(\d+)</span>'
                      r' of <span class="n" data-metric="tbucket_redis_calls_'
                      r'total" data-labels="[^"]*">(\d+)</span>' % redis,
                      page)
        assert m and m.group(1) == m.group(2) and int(m.group(1)) >= 6, page
        e = re.search(r'data-engine="(\w+)">([^<]*)<', page)
        assert e.group(1) in ("module", "unknown"), e.group(0)
        if e.group(1) == "unknown":
            assert e.group(2) == "unknown (no call from this process yet)"
