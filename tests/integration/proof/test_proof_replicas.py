"""test_proof_replicas.py -- replica independence.

N = 1, 3 and 6 Apache replicas with the module share one Redis behind
haproxy. One client key is driven by wrk far above its limit for T = 3 s:
 - shared (Redis) limit, round-robin and pinned (`balance source`): the
   allowed count stays within capacity + rate*T (+ one cost) and reaches
   at least 95% of an ideal bucket over the same arrivals, whatever N;
 - the `local` policy with Redis absent and TBucketReplicas N: each
   replica allows capacity/N + rate/N*T, so round-robin gives about
   capacity + rate*T and a pinned client only capacity/N + rate/N*T;
 - a naive per-replica limit (`local`, TBucketReplicas 1): N times the
   limit under round-robin -- what the shared bucket prevents.
T is measured from the replicas' access logs (first to last request of
the key, microseconds); the upper bound takes the span in which the
decisions were made (first arrival to last end), which is longer when a
busy machine delays the first of them. Because a loaded 2-core machine stalls the client
now and then (and a stall just before the end of the window loses the
tokens that refilled during it), the lower bound is checked against an
ideal bucket replayed over the very arrival times the replicas logged
("ideal"): >= 95% of it (98% on an idle machine; beside busy loops on a
shared one 97.7% was seen, the decisions lagging the arrivals the replay
uses); the ratio to capacity + rate*T is recorded too.
Figures go to $TB_BUILD/results/replicas.tsv.
Then several wrk processes with one key against a single Apache, event
and prefork MPMs: the same bounds. And the shared limit through each
replica's coalescer (coalesce=on, prefork), N = 3 and 6: the same bounds.
"""

import pytest

from tbtest.env import free_port
from tbtest.proof import (timed_log_conf, read_timed, start_wrk, finish_wrk,
                          write_tsv, crash_lines, ideal, decision_span)

CAP = 40
# The lower bound, a share of the ideal bucket over the logged arrivals.
LOWER = 0.95
RATE = 100.0
T = 3
PATH = "/limited/ok.txt"
ROWS = []
HEADER = ["N", "scenario", "T_s", "requests", "allowed", "predicted",
          "upper_bound", "ratio", "ideal", "ratio_ideal",
          "per_replica_allowed"]


def body(redis_url, dead_port, n, local_ports):
    return """
TBucketRedis %(url)s timeout=1000
TBucketPrefix pr:
<Location /limited>
    TBucketEnable On
    TBucketKey "%%{HTTP:X-API-Key}"
    TBucketLimit %(cap)d %(rate)g/s
</Location>
Listen 127.0.0.1:%(p1)d
Listen 127.0.0.1:%(p2)d
<VirtualHost 127.0.0.1:%(p1)d>
    TBucketRedis redis://127.0.0.1:%(dead)d timeout=100 connect_timeout=100
    TBucketFailurePolicy local
    TBucketReplicas %(n)d
    TBucketBreaker threshold=1 cooldown=60s
    TBucketPrefix pl:
</VirtualHost>
<VirtualHost 127.0.0.1:%(p2)d>
    TBucketRedis redis://127.0.0.1:%(dead)d timeout=100 connect_timeout=100
    TBucketFailurePolicy local
    TBucketReplicas 1
    TBucketBreaker threshold=1 cooldown=60s
    TBucketPrefix pn:
</VirtualHost>
""" % {"url": redis_url, "dead": dead_port, "n": n, "cap": CAP,
       "rate": RATE, "p1": local_ports[0], "p2": local_ports[1]}


def window(apaches, key, per_replica=None):
    """(allowed, T seconds, total, allowed per replica, ideal, the span
    of the decisions in seconds: tbtest.proof.decision_span) for one
    key; ideal replays the arrivals through one shared bucket, or through
    one bucket per replica of limit per_replica = (cap, rate). For the
    shared limit (no per_replica), allowed counts what Redis allowed:
    a request the failure policy answered (a Redis call past its timeout
    on a stalled machine; open by default) is not the shared limit's, and
    there may be at most 1% of those (the main server's Redis timeout is
    1 s, so only a stalled machine gets there; a breaker that opened
    would answer far more)."""
    recs = []
    per = []
    best = 0
    for a in apaches:
        mine = read_timed(a, key)
        recs += mine
        per.append(sum(1 for r in mine if r[1] == 200))
        if per_replica:
            best += ideal([r[0] for r in mine], *per_replica)
    assert recs, "no request of %s reached any replica" % key
    ts = [r[0] for r in recs]
    t = (max(ts) - min(ts)) / 1e6
    allowed = sum(1 for r in recs if r[1] == 200
                  and (per_replica or r[2] == "allowed"))
    bad = [r for r in recs if r[1] not in (200, 429)]
    assert not bad, bad[:5]
    if not per_replica:
        fallback = [r[2] for r in recs if r[2].startswith("fallback-")]
        assert len(fallback) <= 0.01 * len(recs), (
            key, len(fallback), len(recs), set(fallback),
            [a.read_log()[-1500:] for a in apaches])
        best = ideal([r[0] for r in recs], CAP, RATE)
    return allowed, t, len(recs), per, best, decision_span(recs)


@pytest.fixture(scope="module")
def rows():
    yield ROWS
    write_tsv("replicas.tsv", HEADER, ROWS)


# test_proof_001_01 (slow, ~20 s per N): one key through haproxy to N
# replicas; shared limit holds for any N, local limits behave as predicted.
@pytest.mark.slow
@pytest.mark.parametrize("n", [1, 3, 6])
def test_proof_001_01(n, rows, redis_server, apache_factory,
                      haproxy_factory):
    dead = free_port()
    apaches = []
    for _ in range(n):
        a = apache_factory(servers=2)  # 16 threads > 12 wrk connections
        lp = (free_port(), free_port())
        a.local_ports = lp
        a.start(body(redis_server.url, dead, n, lp) + timed_log_conf(a))
        apaches.append(a)
    h = haproxy_factory({
        "redis_rr": ("roundrobin", [("127.0.0.1", a.port) for a in apaches]),
        "redis_src": ("source", [("127.0.0.1", a.port) for a in apaches]),
        "local_rr": ("roundrobin",
                     [("127.0.0.1", a.local_ports[0]) for a in apaches]),
        "local_src": ("source",
                      [("127.0.0.1", a.local_ports[0]) for a in apaches]),
        "naive_rr": ("roundrobin",
                     [("127.0.0.1", a.local_ports[1]) for a in apaches]),
    })
    results = {}
    for fe in ("redis_rr", "redis_src", "local_rr", "local_src",
               "naive_rr"):
        key = "k-%d-%s" % (n, fe)
        w = finish_wrk(start_wrk(h.ports[fe], PATH, key, T, threads=2,
                                 conns=12))
        if fe.startswith("local"):
            per_rep = (CAP / n, RATE / n)
        elif fe == "naive_rr":
            per_rep = (CAP, RATE)
        else:
            per_rep = None
        allowed, t, total, per, best, span = window(apaches, key, per_rep)
        assert w["socket_errors"] == 0, w
        upper = CAP + RATE * span + 1
        if fe.startswith("redis"):
            predicted = CAP + RATE * t
        elif fe == "local_rr":
            predicted = CAP + RATE * t  # N * (CAP/N + RATE/N * t)
        elif fe == "local_src":
            predicted = CAP / n + RATE / n * t
        else:
            predicted = n * (CAP + RATE * t)
        results[fe] = (allowed, predicted, t, total, per)
        rows.append([n, fe, "%.3f" % t, total, allowed, "%.1f" % predicted,
                     "%.1f" % upper, "%.3f" % (allowed / predicted), best,
                     "%.3f" % (allowed / max(best, 1)),
                     ",".join(str(x) for x in per)])
        # far above the limit: at least 3x the allowed count was offered
        # (2x for the naive limit, N times larger)
        assert total > (2 if fe == "naive_rr" else 3) * allowed, (
            fe, total, allowed)
        if fe.startswith("redis"):
            assert allowed <= upper, (fe, allowed, upper)
            assert allowed >= LOWER * best, (fe, allowed, best)
        else:
            # each replica's own bucket; a few requests per replica may
            # be decided out of arrival order across threads.
            assert abs(allowed - best) <= 0.03 * best + 2 * n, (
                fe, allowed, best)
            assert abs(allowed - predicted) <= 0.1 * predicted + 2 * n, (
                fe, allowed, predicted)
    # haproxy spread round-robin over all replicas, source pinned one.
    per_rr = results["redis_rr"][4]
    assert all(x > 0 for x in per_rr), per_rr
    assert sum(1 for x in results["redis_src"][4] if x > 0) == 1
    if n > 1:
        # the contrast: a naive per-replica limit lets N times through
        assert results["naive_rr"][0] > 0.9 * n * results["redis_rr"][0]
        assert results["local_src"][0] < 1.2 * results["redis_rr"][0] / n
    for a in apaches:
        assert not crash_lines(a), crash_lines(a)


# test_proof_001_02 (slow, ~8 s): several wrk processes, one key, one
# Apache, event and prefork MPMs: the same bounds as above.
@pytest.mark.slow
@pytest.mark.parametrize("mpm", ["event", "prefork"])
def test_proof_001_02(mpm, rows, redis_server, apache_factory):
    a = apache_factory(mpm=mpm, servers=4)
    a.start(body(redis_server.url, free_port(), 1, (free_port(),
                                                   free_port()))
            + timed_log_conf(a))
    key = "conc-" + mpm
    procs = [start_wrk(a.port, PATH, key, T, threads=1, conns=4)
             for _ in range(3)]
    ws = [finish_wrk(p) for p in procs]
    # Under a loaded machine the event MPM may close an idle keep-alive
    # connection as wrk reuses it (a read error on the client, no request
    # lost on the server: window() checks every logged status): allow a
    # few, one in 200 (beside busy loops on a shared machine 5 of 4,831
    # were seen; wrk does not send again as a browser would); a crashed
    # child is caught below.
    errs = sum(w["socket_errors"] for w in ws)
    assert errs <= max(3, sum(w["requests"] for w in ws) // 200), ws
    allowed, t, total, _, best, span = window([a], key)
    pids = set(r[4] for r in read_timed(a, key))
    upper = CAP + RATE * span + 1
    predicted = CAP + RATE * t
    rows.append(["1", "concurrency-%s-3wrk" % mpm, "%.3f" % t, total,
                 allowed, "%.1f" % predicted, "%.1f" % upper,
                 "%.3f" % (allowed / predicted), best,
                 "%.3f" % (allowed / max(best, 1)), "pids=%d" % len(pids)])
    assert total > 3 * allowed
    assert allowed <= upper, (allowed, upper)
    assert allowed >= LOWER * best, (allowed, best)
    if mpm == "prefork":
        assert len(pids) >= 2, "prefork used one child only"
    assert not crash_lines(a), crash_lines(a)


# test_proof_001_03 (slow, ~15 s per N): the shared limit through each
# replica's coalescer (coalesce=on, prefork: the MPM it serves), one key
# round-robin over N replicas: the same bounds as test_proof_001_01's.
@pytest.mark.slow
@pytest.mark.parametrize("n", [3, 6])
def test_proof_001_03(n, rows, redis_server, apache_factory,
                      haproxy_factory):
    dead = free_port()
    apaches = []
    for _ in range(n):
        a = apache_factory(mpm="prefork", servers=6)
        lp = (free_port(), free_port())
        a.start(body(redis_server.url + " coalesce=on", dead, n, lp)
                + timed_log_conf(a))
        apaches.append(a)
    h = haproxy_factory({
        "coal_rr": ("roundrobin", [("127.0.0.1", a.port) for a in apaches])})
    key = "k-%d-coal" % n
    w = finish_wrk(start_wrk(h.ports["coal_rr"], PATH, key, T, threads=2,
                             conns=12))
    assert w["socket_errors"] == 0, w
    allowed, t, total, per, best, span = window(apaches, key)
    upper = CAP + RATE * span + 1
    rows.append([n, "coal_rr", "%.3f" % t, total, allowed,
                 "%.1f" % (CAP + RATE * t), "%.1f" % upper,
                 "%.3f" % (allowed / (CAP + RATE * t)), best,
                 "%.3f" % (allowed / max(best, 1)),
                 ",".join(str(x) for x in per)])
    assert total > 3 * allowed, (total, allowed)
    assert allowed <= upper, (allowed, upper)
    assert allowed >= LOWER * best, (allowed, best)
    assert all(x > 0 for x in per), per
    # Redis saw the replicas' coalescers, one connection each.
    assert redis_server.client().info("clients")["connected_clients"] \
        == n + 1
    for a in apaches:
        assert not crash_lines(a), crash_lines(a)
