"""test_ha_cluster_replicas.py -- the replica-independence proof against a
real Redis Cluster, through the module and through the shim.

Three primaries; three Apache replicas with `TBucketRedis
redis-cluster://...` behind haproxy (round-robin). For each of three client
keys, chosen so that their buckets live on three different primaries, wrk
drives the key far above its limit for T = 3 s: the allowed count stays
within capacity + rate*T (+ one cost) and reaches 98% of an ideal bucket
replayed over the logged arrival times, exactly as with one Redis
(proof/test_proof_replicas.py), and each bucket sits on its slot's primary. The
shim, given a redis-cluster:// URL, shares one outbound bucket stored on
its slot's owner.
"""
import pytest

from tbtest.core import keyslot
from tbtest.proof import (timed_log_conf, read_timed, start_wrk, finish_wrk,
                          crash_lines, ideal, decision_span)

CAP = 40
RATE = 100.0
T = 3
PATH = "/limited/ok.txt"


def keys_on_every_primary(cluster, prefix):
    """One client key per primary: {port: key}."""
    want = {p for _, _, p, _ in cluster.slots()}
    found = {}
    for i in range(20000):
        k = "c%d" % i
        port = cluster.owner(keyslot("%s{%s}" % (prefix, k)))
        found.setdefault(port, k)
        if set(found) == want:
            return found
    raise AssertionError("no key for every primary: %r" % found)


# test_ha_012_01 (slow, ~20 s): 3 replicas behind haproxy sharing a Redis
# Cluster hold one client's limit, whichever primary holds its bucket.
@pytest.mark.slow
def test_ha_012_01(cluster, apache_factory, haproxy_factory):
    apaches = []
    for _ in range(3):
        a = apache_factory(servers=2)  # 16 threads > 12 wrk connections
        a.start("""
TBucketRedis %s timeout=200
TBucketPrefix cr:
<Location /limited>
    TBucketEnable On
    TBucketKey "%%{HTTP:X-API-Key}"
    TBucketLimit %d %g/s
</Location>
""" % (cluster.url, CAP, RATE) + timed_log_conf(a))
        apaches.append(a)
    h = haproxy_factory({
        "rr": ("roundrobin", [("127.0.0.1", a.port) for a in apaches])})
    for port, key in sorted(keys_on_every_primary(cluster, "cr:").items()):
        w = finish_wrk(start_wrk(h.ports["rr"], PATH, key, T, threads=2,
                                 conns=12))
        assert w["socket_errors"] == 0, w
        recs = []
        per = []
        for a in apaches:
            mine = read_timed(a, key)
            recs += mine
            per.append(sum(1 for r in mine if r[1] == 200))
        ts = [r[0] for r in recs]
        allowed = sum(1 for r in recs if r[1] == 200)
        assert not [r for r in recs if r[1] not in (200, 429)]
        best = ideal(ts, CAP, RATE)
        assert len(recs) > 3 * allowed, (len(recs), allowed)
        assert all(x > 0 for x in per), per
        span = decision_span(recs)      # first arrival to last end
        assert allowed <= CAP + RATE * span + 1, (port, allowed, span)
        assert allowed >= 0.98 * best, (port, allowed, best)
        # The bucket lives on its slot's primary (the others answer MOVED).
        assert cluster.by_port(port).client().exists("cr:{%s}" % key), key
    for a in apaches:
        assert not crash_lines(a), crash_lines(a)
        # No decision was left to the failure policy (TB00109 is debug;
        # the breaker opening, TB00105, is a warning and would show).
        a.assert_log_clean()


# test_ha_012_02: the shim given a redis-cluster:// URL shares one
# outbound bucket across processes, stored on its slot's primary.
def test_ha_012_02(cluster, progs, tmp_path):
    from tbtest.shim import (Proc, cli, out_rule, outbound, plain_env,
                             shim_env, write_conf)

    down = Proc([progs["tb_srv"]], plain_env())
    try:
        conf = write_conf(tmp_path / "s.conf", cluster, outbound(
            out_rule(down.port, capacity=5)))
        env = shim_env(conf)
        (a,), err1 = cli(progs, ["127.0.0.1", down.port, 3], env)
        (b,), err2 = cli(progs, ["127.0.0.1", down.port, 4], env)
        assert a["ok"] + b["ok"] == 5, (a, b)
        assert err1 == "" and err2 == "", (err1, err2)
        key = "tb:shim:out:db:{db}"
        owner = cluster.owner(keyslot(key))
        assert cluster.by_port(owner).client().exists(key), owner
    finally:
        down.stop()
