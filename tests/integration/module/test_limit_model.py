"""test_limit_model.py -- one bucket model: `TBucketLimit [NAME] CAPACITY
RATE [key=] [cost=] [count=] [ban=] [known=] [known-by=] [algorithm=]`
declares every bucket; TBucketRouteLimit and TBucketRule are its aliases
and make the same records (the same decisions, the same Redis keys); one
merge by name with one maximum; one table of what cannot go together,
printed in the reference; what apache2 -t and the error log say about
limits that cannot apply.

The CGI login.cgi (test_rules.py's) answers the status its query string
names and records what reached it.
"""
import os
import re

import pytest

from tbtest.apache import assert_refused, metric
from tbtest.env import ROOT

from test_rules import (LOGIN_CGI, login, request, site, start,
                        writable_state)

# The same limits in the two spellings: the older directives, and the
# one directive with options.
OLD = """    TBucketLimit 50 1/h
    TBucketKey "%{HTTP:X-Client}"
    TBucketRouteLimit export 4 1/h
    TBucketRule ip   "%{REMOTE_ADDR}" 6 1/h count=401
    TBucketRule user "%{FORM:log}"    3 1/h count=401 ban=1h
    TBucketRule all  all              100 1/h cost=2"""
NEW = """    TBucketLimit 50 1/h
    TBucketKey "%{HTTP:X-Client}"
    TBucketLimit export 4 1/h
    TBucketLimit ip   6 1/h key=%{REMOTE_ADDR} count=401
    TBucketLimit user 3 1/h key="%{FORM:log}" count=401 ban=1h
    TBucketLimit all  100 1/h key=all cost=2"""


def drive(a):
    """The same requests against either spelling: statuses in order."""
    got = []
    for i in range(6):
        got.append(request(a, "/cgi-bin/login.cgi?401",
                           "log=alice&pwd=x%d" % i,
                           headers={"X-Client": "c1"})[0])
    for i in range(3):
        got.append(request(a, "/cgi-bin/login.cgi?200", "log=bob&pwd=ok",
                           headers={"X-Client": "c2"})[0])
    got.append(request(a, "/cgi-bin/login.cgi?200", "log=carol&pwd=ok",
                       src="127.0.0.2", headers={"X-Client": "c2"})[0])
    return got


def snapshot(c):
    """Every key of the Redis database with its fields, the tokens
    rounded (a 1/h refill between two runs is nothing) and the ban's
    and stamp's times left out."""
    out = {}
    for k in sorted(c.keys("*")):
        if c.type(k) != b"hash":
            out[k] = c.type(k)
            continue
        h = c.hgetall(k)
        out[k] = {f: (round(float(v), 1) if f == b"tokens" else "t")
                  for f, v in h.items()}
    return out


# An old-form and a new-form configuration, run in turn against one
# Redis with the same prefix: the same statuses, the same keys with the
# same fields and tokens.
def test_module_196_01(apache_factory, redis_server):
    c = redis_server.client()
    runs = []
    for body in (OLD, NEW):
        c.flushall()
        a = start(apache_factory, site(redis_server, "m:", body))
        try:
            runs.append((drive(a), snapshot(c)))
            a.assert_log_clean()
        finally:
            a.stop()
    assert runs[0][0] == runs[1][0], runs
    assert runs[0][1] == runs[1][1], runs
    # What the requests met: alice's name banned after three failures,
    # the export route empty after four calls of client c1's.
    assert runs[0][0][:6] == [401, 401, 401, 429, 429, 429], runs[0][0]
    keys = [k.decode() for k in runs[0][1]]
    assert any(":rule:user" in k and "alice" in k for k in keys), keys
    assert any(k.endswith(":route:export") and "c1" in k for k in keys), keys


# The named form with every option, beside both aliases in one scope:
# each bucket does what its options say, and the status page counts
# each named limit under its name.
def test_module_196_02(apache_factory, redis_server):
    body = """    TBucketLimit 100 1/h
    TBucketRouteLimit route 50 1/h
    TBucketRule all all 100 1/h
    TBucketLimit pair 2 1/h key="%{REMOTE_ADDR}-%{FORM:log}" cost=1 count=401,403 ban=10m known=1d known-by=address
    TBucketLimit heavy 9 1/h cost=3"""
    a = start(apache_factory, site(redis_server, "m2:", body))
    got = [login(a, "dave") for _ in range(3)]
    assert [g[0] for g in got] == [401, 401, 429], got
    # The refusal names the limit (in the body's field "rule", as before).
    assert '"rule":"pair"' in got[2][2], got[2]
    # pair banned dave from 127.0.0.1; another address is its own pair.
    assert login(a, "dave", src="127.0.0.2")[0] == 401
    # heavy costs 3 of 9 per request from this key (the address): three
    # requests took it all, the fourth is refused.
    got = [request(a, "/cgi-bin/login.cgi?200", src="127.0.0.3")[0]
           for _ in range(4)]
    assert got == [200, 200, 200, 429], got
    text = request(a, "/tbucket-status")[2]
    assert metric(text, "tbucket_limit_events_total", limit="pair",
                  event="ban") == 1
    assert metric(text, "tbucket_limit_events_total", limit="heavy",
                  event="refused") == 1
    a.assert_log_clean()


# Merging by name whatever the spelling: an inner TBucketLimit NAME
# replaces an outer TBucketRule of the name, NAME Off removes one.
def test_module_196_03(apache_factory, redis_server):
    body = """    TBucketRule a "%{REMOTE_ADDR}" 1 1/h
    TBucketRouteLimit b 1 1/h
    TBucketLimit 100 1/h"""
    extra = """<Location /cgi-bin/login.cgi/x>
    TBucketLimit a 3 1/h key=%{REMOTE_ADDR}
    TBucketLimit b Off
</Location>"""
    a = start(apache_factory, site(redis_server, "m3:", body, extra))
    outer = [request(a, "/cgi-bin/login.cgi?200")[0] for _ in range(2)]
    inner = [request(a, "/cgi-bin/login.cgi/x?200", src="127.0.0.2")[0]
             for _ in range(4)]
    assert outer == [200, 429], outer
    assert inner == [200, 200, 200, 429], inner
    a.assert_log_clean()


def combos():
    """The rows {a, b, why} of tbucket_check.c's table."""
    with open(os.path.join(ROOT, "mod_tbucket", "tbucket_check.c")) as f:
        src = f.read()
    table = src[src.index("static const tbucket_combo combos[]"):]
    table = table[:table.index("{ NULL }")]
    rows = []
    for m in re.finditer(r'\{\s*((?:"[^"]*"\s*)+),\s*((?:"[^"]*"\s*)+),'
                         r'\s*((?:"[^"]*"\s*)+),', table):
        rows.append(tuple("".join(re.findall(r'"([^"]*)"', g))
                          for g in m.groups()))
    return rows


def reference():
    with open(os.path.join(ROOT, "docs", "reference.txt")) as f:
        return " ".join(f.read().split())


# The reference prints every row of the table, with its why.
def test_module_196_04():
    rows = combos()
    assert len(rows) >= 10, rows
    text = reference()
    for a, b, why in rows:
        assert " ".join(("%s | %s | %s" % (a, b, why)).split()) in text, \
            (a, b, why)


# Each row of the table, tried: apache2 -t refuses it naming the
# directive, the scope (for a scope's pair) and why.
REFUSED = {
    ("TBucketLease", "a named limit without key="):
        "TBucketLimit 10 1/s\nTBucketLease 5\nTBucketLimit x 5 1/s",
    ("TBucketLease", "TBucketAlgorithm other than token-bucket"):
        "TBucketLimit 10 1/s\nTBucketLease 5\nTBucketAlgorithm gcra",
    ("TBucketConcurrency", "TBucketLease"):
        "TBucketLimit 10 1/s\nTBucketConcurrency 2\nTBucketLease 5",
    ("TBucketConcurrency", "TBucketShards"):
        "TBucketLimit 16 8/s\nTBucketConcurrency 2\nTBucketShards 4",
    ("key=", "TBucketAlgorithm other than token-bucket"):
        "TBucketLimit u 5 1/m key=%{REMOTE_ADDR}\nTBucketAlgorithm gcra",
    ("key=", "TBucketShards"):
        "TBucketLimit u 5 1/m key=%{REMOTE_ADDR}\nTBucketShards 4",
    ("known-by=cookie", "a server without TBucketSecret"):
        "TBucketLimit u 5 1/m key=%{FORM:log} count=200 known=1d",
    ("count=, ban= or known=", "a named limit without key="):
        "TBucketLimit u 5 1/m count=401",
    ("key=, count=, ban= or known=", "the unnamed TBucketLimit"):
        "TBucketLimit 5 1/m ban=1h",
    ("known=", "a limit without count="):
        "TBucketLimit u 5 1/m key=%{FORM:log} known=1d",
    ("algorithm=", "a named limit"):
        "TBucketLimit u 5 1/m algorithm=gcra",
}


@pytest.mark.parametrize("row", combos(), ids=lambda r: r[0] + "+" + r[1])
def test_module_196_05(apache_factory, row):
    a, b, why = row
    assert (a, b) in REFUSED, "a table row without its case here: %r" % (
        row,)
    lines = REFUSED[(a, b)]
    out = assert_refused(apache_factory(), "<Location /x>\nTBucketEnable "
                         "On\n%s\n</Location>\n" % lines)
    assert why in " ".join(out.split()), out
    assert "TBucket" in out


# Everything the table does not list goes together: a named limit with
# each algorithm the scope's own bucket may have, and one keyed by
# TBucketKey beside a key of its own under shards.
def test_module_196_06(apache_factory):
    for lines in ("TBucketLimit 10 1/s algorithm=gcra\nTBucketLimit x 5 1/s",
                  "TBucketLimit 16 8/s\nTBucketShards 4\nTBucketLimit x 8 1/s",
                  "TBucketLimit 10 1/s cost=2\nTBucketLimit u 5 1/s "
                  "key=%{REMOTE_ADDR} count=401 ban=1m"):
        rc, out = apache_factory().configtest(
            "<Location /x>\nTBucketEnable On\n%s\n</Location>\n" % lines)
        assert rc == 0 and "TB0" not in out, (lines, out)


# The option parser's refusals name the directive, the option and the
# value, in the one form every directive uses.
BAD = [
    ("TBucketLimit u 5 1/m color=red", "TBucketLimit: unknown option "
     "'color=red' (expected key=EXPR"),
    ("TBucketLimit u 5 1/m key=%{HTTP:X", "TBucketLimit: bad key"),
    ("TBucketLimit u 5 1/m key=all cost=9", "TBucketLimit: bad cost '9'"),
    ("TBucketLimit u 5 1/m key=all ban=3x", "TBucketLimit: bad ban '3x'"),
    ("TBucketLimit u 5 1/m key=all count=99", "TBucketLimit: bad count"),
    ("TBucketLimit u 0 1/m", "bad capacity '0'"),
    ("TBucketLimit u 5 soon", "bad rate 'soon'"),
    ("TBucketLimit 5 1/m algorithm=best", "TBucketLimit: bad algorithm "
     "'best'"),
    ("TBucketLimit", "TBucketLimit: expected CAPACITY RATE"),
    ("TBucketLimit bad/name 5 1/m", "TBucketLimit: bad name 'bad/name'"),
    ("TBucketLimit %s 5 1/m key=all" % ("n" * 33), "bad name"),
    ("TBucketLimit x 5 1/m\nTBucketRule x all 5 1/m", "TBucketRule: bad "
     "name 'x': a limit of that name is set in this scope already"),
]


@pytest.mark.parametrize("line,words", BAD, ids=[w for _, w in BAD])
def test_module_196_07(apache_factory, line, words):
    assert_refused(apache_factory(), "<Location /x>\nTBucketEnable On\n%s\n"
                   "</Location>\n" % line, words)


# Named limits where TBucketEnable On is nowhere: a warning names the
# limit and the scope. The guide's POST-only <If> (the limits in an <If>
# inside the section that enables) draws no warning that "requests there
# are not limited".
def test_module_196_08(apache_factory):
    rc, out = apache_factory().configtest(
        "<Location /wp-login.php>\nTBucketLimit ip 5 1/m "
        "key=%{REMOTE_ADDR} count=200\n</Location>\n")
    assert rc == 0 and "TBucketLimit ip" in out and \
        "TBucketEnable On nowhere" in out, out
    rc, out = apache_factory().configtest("""
TBucketSecret %s
<Location "/wp-login.php">
    TBucketEnable On
    <If "%%{REQUEST_METHOD} == 'POST'">
        TBucketRule ip   "%%{REMOTE_ADDR}"    20 1/m count=200 ban=1h
        TBucketRule user "%%{FORMLOGIN:log}"   5 1/m count=200 ban=15m known=30d
    </If>
</Location>
""" % secret_file(apache_factory))
    assert rc == 0 and "TB00101" not in out, out


def secret_file(apache_factory):
    a = apache_factory()
    path = os.path.join(a.root, "conf", "tbucket.secret")
    with open(path, "wb") as f:
        f.write(os.urandom(48))
    os.chmod(path, 0o600)
    return path


# At run time: a limit on a form field that none of its first 20 posts
# had is logged once (the plain-PHP example's %{FORMLOGIN:user} copied
# onto WordPress, whose field is log); a counted limit applied 200 times
# and never charged is logged once (count= names a status the page never
# answers).
def test_module_196_09(apache_factory, redis_server):
    body = """    TBucketLimit wrongfield 1000 100/s key=%{FORMLOGIN:user} count=401
    TBucketLimit neverhit 1000 100/s key=%{REMOTE_ADDR} count=418"""
    # One child: the hints are counted per child.
    a = apache_factory(mpm="event", servers=1)
    a.write_file("cgi-bin/login.cgi", LOGIN_CGI, 0o755)
    writable_state(a)
    a.start(site(redis_server, "m9:", body))
    for _ in range(25):
        login(a, "alice", status=401)
    log = a.read_log()
    assert "TB00176" in log and "wrongfield" in log and \
        "%{FORMLOGIN:user}" in log, log[-2000:]
    for _ in range(210):
        request(a, "/cgi-bin/login.cgi?200", "log=x")
    log = a.read_log()
    assert "TB00177" in log and "neverhit" in log and "count=418" in log, \
        log[-2000:]
    # wrongfield counts 401, and its field was never there: it never
    # applied, so it says nothing about charges.
    assert log.count("TB00177") == 1 and log.count("TB00176") == 1, log


# In .htaccess a limit needs AllowOverride Limit, or an AllowOverrideList
# naming its directives: without either, the request gets httpd's 500
# and the error log says which AllowOverride the directory lacks (httpd's
# own "not allowed here" names neither); with either, it limits.
def test_module_196_10(apache_factory, redis_server):
    a = apache_factory()
    for d in ("fi", "ol", "lim"):
        # A key of each directory's own: one bucket each.
        a.write_file("htdocs/%s/.htaccess" % d, "TBucketEnable On\n"
                     "TBucketKey %s\nTBucketLimit 2 1/h\n" % d)
        a.write_file("htdocs/%s/ok.txt" % d, "ok\n")
    a.start("""
TBucketRedis %s timeout=1000
TBucketPrefix m10:
<Directory "%s/htdocs/fi">
    AllowOverride FileInfo
</Directory>
<Directory "%s/htdocs/ol">
    AllowOverride None
    AllowOverrideList TBucketEnable TBucketKey TBucketLimit
</Directory>
""" % (redis_server.url, a.root, a.root))
    assert request(a, "/fi/ok.txt")[0] == 500
    log = a.read_log()
    assert 'TBucketEnable in .htaccess needs "AllowOverride Limit" (or ' \
        '"AllowOverrideList TBucketEnable")' in log, log[-2000:]
    for d in ("ol", "lim"):
        got = [request(a, "/%s/ok.txt" % d)[0] for _ in range(3)]
        assert got == [200, 200, 429], (d, got)
