"""test_status_series.py -- the status page's last 15 minutes: the whole
server's series in 10-second slots, kept in the shared memory segment
(decisions, refusals by kind, fallbacks, breaker, Redis errors and p99
latency), given by ?json and drawn as inline SVG in the HTML view, and
kept by a graceful restart.

Two children (event MPM, servers=2) answer, so the series must be the
server's, not one child's.
"""
import json
import os
import re
import subprocess

from tbtest.apache import http_get
from tbtest.env import BUILD, free_port

from test_status_html import assert_self_contained, figures

ALLOWED_TAGS = ("TB00105",)


def conf(redis_url, port, dead_port, prefix):
    """A TBucketLimit, a rule with a ban, a status page, and a vhost
    (down.test) whose Redis is a closed port under the closed policy."""
    return """
TBucketRedis {url} timeout=500
TBucketPrefix {prefix}
<Location /limited>
    TBucketEnable On
    TBucketLimit 3 1/h
</Location>
<Location /a>
    TBucketEnable On
    TBucketRule tight "%{{HTTP:X-User}}" 2 1/m ban=1m
</Location>
<Location /tbucket-status>
    SetHandler tbucket-status
    Require ip 127.0.0.1
</Location>
<VirtualHost 127.0.0.1:{port}>
    ServerName 127.0.0.1
</VirtualHost>
<VirtualHost 127.0.0.1:{port}>
    ServerName down.test
    TBucketRedis redis://127.0.0.1:{dead} timeout=200 connect_timeout=200
    TBucketFailurePolicy closed
    TBucketBreaker threshold=2 cooldown=60s
</VirtualHost>
""".format(url=redis_url, prefix=prefix, port=port, dead=dead_port)


def traffic(a):
    """5 on the limit (3 allowed, 2 refused), 4 for user mo (2 allowed,
    1 refused by the rule, which bans, then 1 banned), 4 on the dead
    Redis (fallback-closed; the breaker opens after 2 errors)."""
    for _ in range(5):
        http_get(a.url("/limited/ok.txt"))
    codes = [http_get(a.url("/a/ok.txt"), {"X-User": "mo"}).status_code
             for _ in range(4)]
    assert codes == [200, 200, 429, 429], codes
    for _ in range(4):
        http_get(a.url("/limited/ok.txt"), {"Host": "down.test"})


def series(a):
    doc = json.loads(http_get(a.url("/tbucket-status?json")).text)
    s = doc["series"]
    assert s["slots"] == 90 and s["slot_seconds"] == 10
    for name in ("decisions", "refused_limit", "refused_named",
                 "refused_ban", "shed", "refused_local", "fallback",
                 "redis_errors", "breaker_opens", "p99_us", "breaker_open",
                 "refused", "known"):
        assert len(s[name]) == 90, name
    return s


def assert_attack(s):
    """The series hold the traffic of traffic(), whichever slots it fell
    in (it may straddle a slot's border)."""
    assert sum(s["decisions"]) == 13, s["decisions"]
    assert sum(s["refused_limit"]) == 2
    assert sum(s["refused_named"]) == 1
    assert sum(s["refused_ban"]) == 1
    assert sum(s["refused"]) == 4
    assert sum(s["fallback"]) == 4
    assert sum(s["redis_errors"]) >= 2
    # Each child has its own breaker: one or both opened.
    assert 1 <= sum(s["breaker_opens"]) <= 2
    assert sum(s["bans_set"]) == 1
    assert any(s["breaker_open"])
    assert s["known"][-1] == 1
    # Calls to the working Redis were timed: loopback is under 250 ms.
    assert any(0 < p <= 250000 for p in s["p99_us"]), s["p99_us"]
    kinds = sorted(set(m["kind"] for m in s["marks"]))
    assert kinds == ["ban-wave", "breaker"], s["marks"]


# ?json's series count every decision of both children by kind, with the
# breaker's opening and the ban wave marked; the HTML view draws them as
# inline SVG (no script, no external resource) with the same marks.
def test_module_245_01(apache_factory, redis_server):
    a = apache_factory(servers=2)
    a.start(conf(redis_server.url, a.port, free_port(), "s1:"))
    before = series(a)
    assert sum(before["decisions"]) == 0
    traffic(a)
    s = series(a)
    assert_attack(s)
    page = http_get(a.url("/tbucket-status?view=html"))
    assert "default-src 'none'" in page.headers["Content-Security-Policy"]
    assert_self_contained(page.text)
    p = figures(page.text)
    charts = [at.get("data-series") for t, at in p.attrs
              if t == "svg" and "chart" in at.get("class", "")]
    assert charts == ["decisions", "refused", "fallback", "redis_errors",
                      "p99_us"], charts
    marks = {m["kind"]: 0 for m in s["marks"]}
    for m in s["marks"]:
        marks[m["kind"]] += 1
    assert page.text.count('class="mark breaker"') == 5 * marks["breaker"]
    assert page.text.count('class="mark banwave"') == 5 * marks["ban-wave"]
    assert re.search(r"breaker opened at \d\d:\d\d:\d\d", page.text)
    # One bar per slot that refused: each carries its count in a title.
    assert re.search(r"<title>\d\d:\d\d:\d\d 1 refused: ban</title>",
                     page.text)
    a.assert_log_clean(allowed=ALLOWED_TAGS)


# The series live in the shared memory segment: a graceful restart (new
# children, a configuration reloaded) keeps them, and the new children
# count into the same slots.
def test_module_245_02(apache_factory, redis_server):
    a = apache_factory(servers=2)
    body = conf(redis_server.url, a.port, free_port(), "s2:")
    a.start(body)
    traffic(a)
    a.graceful(body)
    s = series(a)
    assert_attack(s)
    http_get(a.url("/limited/ok.txt"))
    assert sum(series(a)["decisions"]) == 14
    a.assert_log_clean(allowed=ALLOWED_TAGS)


# `tbucket top --once` on the real page: its summary counts the banned
# request among the outcomes, and a one-line sparkline shows the slots
# that refused (blocks in a UTF-8 locale, an ASCII ramp in C), each
# scaled to the most in a slot.
UTF8_RAMP = "\u2581\u2582\u2583\u2584\u2585\u2586\u2587\u2588"
ASCII_RAMP = "._-=+*#@"


def top_spark(url, lang):
    """`tbucket top URL --once` under LC_ALL=lang: (its output, the
    sparkline's 90 cells, the line's sum and most)."""
    p = subprocess.run([os.path.join(BUILD, "tbucket"), "top", url,
                        "--once"], capture_output=True, timeout=20,
                       env=dict(os.environ, LC_ALL=lang))
    assert p.returncode == 0, p.stderr
    out = p.stdout.decode("utf-8")
    line = [ln for ln in out.splitlines()
            if ln.startswith("refused, last 15 min: |")]
    assert len(line) == 1, out
    spark = line[0].split("|")[1]
    assert len(spark) == 90, spark
    m = re.search(r"\| now; (\d+) in all, at most (\d+) in 10 s$", line[0])
    assert m, line[0]
    return out, spark, int(m.group(1)), int(m.group(2))


def test_module_245_03(apache_factory, redis_server):
    a = apache_factory(servers=2)
    a.start(conf(redis_server.url, a.port, free_port(), "s3:"))
    traffic(a)
    url = a.url("/tbucket-status")
    page = json.loads(http_get(url + "?json").text)
    for lang, ramp in (("C.UTF-8", UTF8_RAMP), ("C", ASCII_RAMP)):
        out, spark, total, most = top_spark(url, lang)
        assert " rejected 3 " in out and " banned 1\n" in out, out
        # The scale is the page's: no refusal leaves a 15-minute series
        # within this test.
        assert (total, most) == (4, max(page["series"]["refused"])), spark
        # The 4 refusals fell in one slot, or in two side by side when
        # a slot's border fell among them (4, 3+1 or 2+2): the larger is
        # the ramp's top, the other 7/most of it, rounded.
        cells = [(i, c) for i, c in enumerate(spark) if c != " "]
        want = [ramp[-1]] + ([ramp[int((4 - most) * 7 / most + 0.5)]]
                             if most < 4 else [])
        assert sorted(c for _, c in cells) == sorted(want), (most, spark)
        assert cells[-1][0] - cells[0][0] == len(cells) - 1, spark
    # The scale itself, on a copy of the page whose refusals are chosen
    # (a static file: the tool reads any page with the JSON view's
    # shape): 1 and 2 of 100 show the ramp's lowest (at least one is
    # never a blank), 50 its middle, 100 its top, 0 a blank.
    shaped = [0] * 90
    shaped[10], shaped[40], shaped[41], shaped[89] = 1, 2, 50, 100
    page["series"]["refused"] = shaped
    a.write_file("htdocs/shaped.json", json.dumps(page))
    for lang, ramp in (("C.UTF-8", UTF8_RAMP), ("C", ASCII_RAMP)):
        _, spark, total, most = top_spark(a.url("/shaped.json"), lang)
        assert (total, most) == (153, 100), spark
        want = [" "] * 90
        want[10], want[40], want[41], want[89] = \
            ramp[0], ramp[0], ramp[4], ramp[7]
        assert spark == "".join(want), spark


# Active bans, newest first: the rule, the key, the time left and the
# key's refusals under the rule in the last 15 minutes; in ?json too. A
# key whose ban was lifted (tbucket unban) leaves the list; with none,
# the page says so instead of showing an empty table.
def test_module_245_04(apache_factory, redis_server):
    a = apache_factory(servers=2)
    dead = free_port()
    a.start(conf(redis_server.url, a.port, dead, "s4:"))
    page = http_get(a.url("/tbucket-status?view=html")).text
    assert "No active ban." in page and 'class="bans"' not in page
    traffic(a)
    for _ in range(3):
        http_get(a.url("/a/ok.txt"), {"X-User": "zed"})
    doc = json.loads(http_get(a.url("/tbucket-status?json")).text)
    bans = doc["bans"]
    assert [(b["limit"], b["key"]) for b in bans] == [("tight", "zed"),
                                                     ("tight", "mo")], bans
    assert 0 < bans[1]["left_ms"] <= bans[0]["left_ms"] <= 60000
    assert bans[1]["refused_15m"] == 2 and bans[0]["refused_15m"] == 1
    assert doc["bans_more"] is False
    # The dead Redis: refused the call, or was not asked (its breaker
    # opened in the answering child); the page says which.
    note = doc["bans_note"]
    assert note in ("redis://127.0.0.1:%d did not answer: connect: "
                    "Connection refused" % dead,
                    "not asked of redis://127.0.0.1:%d: its breaker is "
                    "open" % dead), note
    page = http_get(a.url("/tbucket-status?view=html")).text
    rows = re.findall(r"<tr><td><code>(\w+)</code></td><td class=\"k\">"
                      r"<code>(\w+)</code></td><td class=\"n\">((?:1 min )?\d+ s)</td>"
                      r"<td class=\"n\">(\d+)</td></tr>", page)
    assert [(r[0], r[1], r[3]) for r in rows] == [("tight", "zed", "1"),
                                                  ("tight", "mo", "2")], rows
    p = subprocess.run([os.path.join(BUILD, "tbucket"), "--url",
                        redis_server.url, "--prefix", "s4:", "unban",
                        "tight", "zed"], capture_output=True, timeout=20)
    assert p.returncode == 0, p.stderr
    doc = json.loads(http_get(a.url("/tbucket-status?json")).text)
    assert [b["key"] for b in doc["bans"]] == ["mo"]
    a.assert_log_clean(allowed=ALLOWED_TAGS)


def families(text):
    """{family: {"help", "type", "samples": {labels: value}}} of a
    Prometheus text page; labels as a sorted tuple of (name, value)."""
    fams = {}
    for line in text.splitlines():
        m = re.match(r"# (HELP|TYPE) (\w+) (.*)$", line)
        if m:
            f = fams.setdefault(m.group(2), {"samples": {}})
            f[m.group(1).lower()] = m.group(3)
            continue
        m = re.match(r"(\w+)(?:\{(.*)\})? (\S+)$", line)
        if m and m.group(1) in fams:
            labels = tuple(sorted(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"',
                                             m.group(2) or "")))
            fams[m.group(1)]["samples"][labels] = float(m.group(3))
    return fams


# Each deprecated name is served beside its new one until 0.3.0 with the
# same values: the two renamed families (label renamed, HELP naming the
# new family and 0.3.0, same type) in the text and JSON views, ?json's
# series refused_rule beside refused_named and each ban's rule beside
# its limit.
def test_module_245_05(apache_factory, redis_server):
    a = apache_factory(servers=2)
    a.start(conf(redis_server.url, a.port, free_port(), "s5:"))
    traffic(a)
    fams = families(http_get(a.url("/tbucket-status")).text)
    doc = json.loads(http_get(a.url("/tbucket-status?json")).text)
    in_json = {m["name"]: m for m in doc["metrics"]}
    for new, label, old in (("tbucket_scope_decisions_total", "scope",
                             "tbucket_rule_decisions_total"),
                            ("tbucket_limit_events_total", "limit",
                             "tbucket_rule_events_total")):
        want = {tuple(sorted(("rule" if k == label else k, v)
                             for k, v in labels)): value
                for labels, value in fams[new]["samples"].items()}
        assert want and any(want.values()), (new, fams[new])
        assert fams[old]["samples"] == want, (old, fams[old], want)
        assert fams[old]["type"] == fams[new]["type"] == "counter"
        assert new in fams[old]["help"] and "0.3.0" in fams[old]["help"]
        assert "deprecated" in fams[old]["help"].lower(), fams[old]["help"]
        renamed = [{"rule" if k == label else k: v
                    for k, v in s["labels"].items()}
                   for s in in_json[new]["samples"]]
        assert [s["labels"] for s in in_json[old]["samples"]] == renamed
        assert [s["value"] for s in in_json[old]["samples"]] == \
            [s["value"] for s in in_json[new]["samples"]]
    assert fams["tbucket_limit_events_total"]["samples"][
        (("event", "ban"), ("limit", "tight"))] == 1
    assert fams["tbucket_scope_decisions_total"]["samples"][
        (("outcome", "rejected"), ("scope", "<Location /limited>"))] == 2
    s = doc["series"]
    assert s["refused_rule"] == s["refused_named"] and \
        sum(s["refused_named"]) == 1, s
    assert doc["bans"] and all(b["rule"] == b["limit"] == "tight"
                               for b in doc["bans"]), doc["bans"]
    a.assert_log_clean(allowed=ALLOWED_TAGS)
