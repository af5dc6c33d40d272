"""test_lease.py -- TBucketLease in a real Apache against a real Redis: Redis
calls per request with and without leasing, the lease shared by every child of
a server, its accuracy cost over a window with one and with several Apache
servers, the metrics, and the configurations apache2 -t refuses.
(test_lease_giveback.py checks where unspent tokens go.)

The figures (calls per request, admitted vs capacity + rate x T) go to
$TB_RESULTS (build/results) as lease_*.tsv for the README.
"""
import math

import pytest

from tbtest.apache import (assert_refused, http_get, limited_conf,
                           metric_sum, tokens)
from tbtest.core import script_calls
from tbtest.load import blast, blast_servers
from tbtest.proof import write_tsv

def conf(redis, prefix, inner, key=True):
    return limited_conf(redis.url, prefix, inner, key="X-Key" if key else None)


# Redis calls per request fall by about N: a bucket too large to refuse
# anything, 600 requests from 4 connections (so several prefork children
# share the lease), calls counted by INFO commandstats. The lease grows
# with the key's traffic (sizes 1, 2, 4, ... N), so about log2(N) calls
# more than 600 / N; children that find the lease empty at the same
# moment each refill (a loaded machine makes that likelier), so the bound
# allows up to twice 600 / N.
@pytest.mark.slow
def test_module_010_01(apache_factory, redis_server):
    r = redis_server.client()
    rows = []
    for n in (0, 10, 50):
        a = apache_factory(mpm="prefork", servers=4)
        lease = "    TBucketLease %d ttl=10s\n" % n if n else ""
        a.start(conf(redis_server, "c%d:" % n,
                     "    TBucketLimit 100000 10000/s\n" + lease))
        http_get(a.url("/limited/ok.txt"), headers={"X-Key": "warm"})
        r.config_resetstat()
        res = blast([a.url("/limited/ok.txt")], threads=4, seconds=30,
                    headers={"X-Key": "k"}, max_requests=600)
        calls = script_calls(r)
        assert res.ok == 600 and res.errors == 0, res.codes
        per = calls / res.ok
        rows.append((n or "off", res.ok, calls, "%.4f" % per))
        text = http_get(a.url("/tbucket-status")).text
        if n:
            # Every refill is one call; the rest were spent locally.
            assert calls <= 2 * 600 / n + math.log2(n) + 4, rows
            hits = metric_sum(text, "tbucket_lease_hits_total")
            refills = metric_sum(text, "tbucket_lease_refills_total")
            granted = metric_sum(text,
                                 "tbucket_lease_tokens_granted_total")
            assert refills == calls + 1  # + the warm-up request
            # A request the client sent again (a kept-alive connection
            # closed under it, tbtest.client) may have been decided twice.
            assert 0 <= hits + refills - (res.ok + 1) <= res.retries
            # Granted: what was spent, and what the leases still hold:
            # at most one grant per connection that refilled at once.
            assert res.ok + 1 <= granted <= res.ok + 1 + 4 * n + res.retries
            assert "# TYPE tbucket_lease_hits_total counter" in text
            html = http_get(a.url("/tbucket-status?view=html")).text
            assert 'data-metric="tbucket_lease_hits_total"' in html
        else:
            assert calls == res.ok
        a.assert_log_clean()
        a.stop()
    write_tsv("lease_calls.tsv", ["lease", "requests", "script_calls",
                                  "calls_per_request"], rows)


def run_accuracy(apache_factory, redis_server, prefix, lease, replicas,
                 cap, rate, seconds, threads=4, paced=None):
    """Start `replicas` Apaches on one Redis, hammer one key (or pace it)
    round-robin over them; returns the load result."""
    inner = "    TBucketLimit %d %d/s\n" % (cap, rate)
    if lease:
        inner += "    TBucketLease %d ttl=%s\n" % lease
    return blast_servers(apache_factory, conf(redis_server, prefix, inner),
                         replicas, threads, seconds, key="acc", rate=paced,
                         light=paced is None)


# The accuracy cost: over a window T a hammered key gets at most
# capacity + rate x T without leasing, and at most replicas x N more
# with it (tokens leased before the window are spent inside it); paced
# below the rate, leases stay about one ttl of each server's traffic and
# expired ones give their tokens back, so nearly nothing is refused.
@pytest.mark.slow
def test_module_010_02(apache_factory, redis_server):
    cap, rate, seconds = 50, 50, 4.0
    rows = []
    cases = [(None, 1), ((20, "1s"), 1), (None, 3), ((20, "1s"), 3)]
    for i, (lease, replicas) in enumerate(cases):
        res = run_accuracy(apache_factory, redis_server, "a%d:" % i, lease,
                           replicas, cap, rate, seconds)
        bound = cap + rate * res.window
        slack = replicas * lease[0] if lease else 0
        assert res.errors == 0
        assert res.ok <= bound + slack + 1, (lease, replicas, res.ok, bound)
        # The limit binds: more was offered than the bucket and the leases
        # can admit (the hammer's light client outruns it on a busy
        # runner too).
        assert res.total > bound + slack + 1, (res.total, bound, slack)
        # Any 1 s inside the run: the bucket alone allows cap + rate; a
        # lease taken just before may add up to replicas x N.
        rows.append(("hammer", lease[0] if lease else "off", replicas,
                     res.total, res.ok, "%.2f" % res.window,
                     "%.1f" % bound, "%.3f" % (res.ok / bound),
                     res.max_in(1.0), cap + rate + slack))
    # Paced at 88% of the rate over 3 servers: nothing should be refused
    # without a lease, and next to nothing with one (a lease's unspent
    # tokens return when it expires).
    for i, lease in enumerate((None, (20, "200ms"), (20, "1s"))):
        res = run_accuracy(apache_factory, redis_server, "u%d:" % i, lease,
                           3, 20, 25, seconds, threads=2, paced=22)
        bound = 20 + 25 * res.window
        assert res.refused <= (0 if not lease else 2), res.codes
        rows.append(("paced 22/s (%s)" % (lease[1] if lease else "-"),
                     lease[0] if lease else "off", 3,
                     res.total, res.ok, "%.2f" % res.window, "%.1f" % bound,
                     "%.3f" % (res.ok / res.total), res.max_in(1.0),
                     20 + 25))
    write_tsv("lease_accuracy.tsv", ["traffic", "lease", "servers", "sent",
                                     "admitted", "window_s", "cap+rate*T",
                                     "ratio", "max_in_1s",
                                     "cap+rate*1s(+replicas*N)"], rows)


# A lease is spent by every child: 31 requests (new connections, so
# prefork hands them to several children) make a handful of Redis calls
# (the lease doubles with each refill: 1, 2, 4, 8, 16); a refill's
# remaining header is the bucket's plus the new lease's, a hit's the
# lease's remainder; a graceful restart gives the rest back.
def test_module_010_03(apache_factory, redis_server):
    r = redis_server.client()
    a = apache_factory(mpm="prefork", servers=3)
    body = conf(redis_server, "s:", "    TBucketLimit 100 1/h\n"
                "    TBucketLease 30 ttl=30s\n")
    a.start(body)
    pids = set()
    seen = []
    for _ in range(31):
        resp = http_get(a.url("/limited/ok.txt"), headers={"X-Key": "one"})
        assert resp.status_code == 200
        seen.append(int(resp.headers["X-RateLimit-Remaining"]))
    calls = script_calls(r)
    assert 4 <= calls <= 6, calls
    refills = [i for i, v in enumerate(seen) if v == 100 - (i + 1)]
    assert len(refills) == calls and refills[0] == 0, seen
    assert all(v == 100 - (i + 1) or v < 16 for i, v in enumerate(seen))
    for line in open(a.access_log):
        pids.add(line.split()[-1])
    assert len(pids) >= 2
    a.graceful(body)
    assert tokens(r, "s:{one}") == 69.0
    a.assert_log_clean()


# The lease never hides the limit: a bucket of 10 with lease 4 admits
# exactly 10 (the last lease is cut to what the bucket holds), then 429
# with Retry-After; a Redis that cannot answer gives no lease.
def test_module_010_04(apache_factory, redis_server):
    a = apache_factory()
    a.start(conf(redis_server, "e:", "    TBucketLimit 10 1/h\n"
                 "    TBucketLease 4\n"))
    codes = [http_get(a.url("/limited/ok.txt"),
                      headers={"X-Key": "x"}).status_code
             for _ in range(12)]
    assert codes == [200] * 10 + [429] * 2
    resp = http_get(a.url("/limited/ok.txt"), headers={"X-Key": "x"})
    assert resp.headers["Retry-After"] == "3600"
    a.assert_log_clean()


BAD = [
    ("TBucketLease 0", "TBucketLease", "'0'"),
    ("TBucketLease abc", "TBucketLease", "'abc'"),
    ("TBucketLease 5 ttl=0", "TBucketLease", "'0'"),
    ("TBucketLease 5 ttl=2m", "TBucketLease", "'2m'"),
    ("TBucketLease 5 size=3", "TBucketLease", "size=3"),
    ("TBucketLease Off ttl=1s", "TBucketLease", "Off"),
    ("TBucketLimit 10 1/s\nTBucketLease 5\nTBucketRouteLimit x 5 1/s",
     "TBucketLease", "TBucketRouteLimit"),
    ("TBucketLimit 10 1/s\nTBucketLease 5\nTBucketAlgorithm gcra",
     "TBucketLease", "gcra"),
]


# apache2 -t refuses bad values and a lease it cannot honour.
@pytest.mark.parametrize("line,directive,value", BAD)
def test_module_010_05(apache_factory, line, directive, value):
    assert_refused(apache_factory(), "<Location /x>\nTBucketEnable On\n%s\n"
                   "</Location>\n" % line, directive, value)


# Good forms pass; Off in an inner scope turns an outer lease off there,
# so routes may apply in it.
def test_module_010_06(apache_factory):
    a = apache_factory()
    rc, out = a.configtest("""
<Location /x>
    TBucketEnable On
    TBucketLimit 10 1/s
    TBucketLease 5 ttl=250ms
</Location>
<Location /x/y>
    TBucketLease Off
    TBucketRouteLimit r 5 1/s
</Location>
""")
    assert rc == 0, out
    assert "TB0" not in out, out
    rc, out = a.configtest("<Location /x>\nTBucketLimit 10 1/s\n"
                           "TBucketCost 8\nTBucketLease 5\n</Location>\n")
    assert rc == 0 and "TB00101" in out and "each lease" in out, out
