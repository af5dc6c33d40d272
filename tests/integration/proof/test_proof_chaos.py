"""test_proof_chaos.py -- Redis faults under steady load.

Three Apaches (event MPM, one child each) share one Redis, one per failure
policy (open, closed, local), each under a steady stream of requests from
its own prober thread (fresh connection per request, latency timed).
For each fault -- kill -9, SIGSTOP/SIGCONT, SCRIPT FLUSH, restart empty,
port blocked by a socket that never accepts -- the fault lasts 2.5 s and
then Redis comes back. Checked for every policy:
 - no request waits longer than connect_timeout + timeout + margin;
 - while the breaker is open, requests do not wait on Redis: only the
   breaker's threshold and one probe per cooldown may be slow;
 - during the fault every decision is the declared one (fallback-open
   200, fallback-closed 429, fallback-local 200);
 - after Redis returns, Redis decides again within one cooldown, and
   counts exactly (X-RateLimit-Remaining 99, 98, 97 on a fresh key);
 - no child crashed (error log), no connection leaked (CLIENT LIST and
   the child's sockets to Redis, at most the pool size).
Per-fault figures go to $TB_BUILD/results/chaos.tsv.
"""
import math
import time

import pytest
import requests

from tbtest.env import Redis, free_port
from tbtest.proof import (Prober, BlackHole, module_clients, redis_sockets,
                          write_tsv, crash_lines, timed_log_conf, read_timed)

TIMEOUT_MS = 100
CONNECT_MS = 100
COOLDOWN_S = 1.0
THRESHOLD = 3
POOL = 2
FAULT_S = 2.5
# What a request may wait beyond connect + command timeouts: the probe's
# own scheduling and httpd's work on a loaded machine. 0.25 s held alone;
# beside make test NOISE=1's busy loops a script_flush probe took 0.59 s.
# A wait the timeouts do not bound lasts the whole fault (FAULT_S, 2.5 s),
# so 0.95 s in all still tells the two apart.
MARGIN_S = 0.75
POLICIES = {"open": (200, "fallback-open"),
            "closed": (429, "fallback-closed"),
            "local": (200, "fallback-local")}
FAULTS = ["kill9", "sigstop", "script_flush", "restart_empty",
          "port_blocked"]
ROWS = []
HEADER = ["fault", "policy", "requests", "fault_requests",
          "declared_share", "slow_in_fault", "slow_allowed",
          "max_latency_ms", "bound_ms", "recovery_s", "cooldown_s",
          "redis_clients_after", "child_sockets_after"]


def body(url, policy):
    return """
TBucketRedis %s timeout=%d connect_timeout=%d pool=%d
TBucketFailurePolicy %s
TBucketReplicas 1
TBucketBreaker threshold=%d cooldown=%dms
TBucketPrefix c%s:
<Location /limited>
    TBucketEnable On
    TBucketKey "%%{HTTP:X-API-Key}"
    TBucketLimit 1000000 100000/s
</Location>
<Location /a>
    TBucketEnable On
    TBucketKey "%%{HTTP:X-API-Key}"
    TBucketLimit 100 1/h
</Location>
""" % (url, TIMEOUT_MS, CONNECT_MS, POOL, policy, THRESHOLD,
       int(COOLDOWN_S * 1000), policy)


@pytest.fixture(scope="module")
def rows():
    yield ROWS
    write_tsv("chaos.tsv", HEADER, ROWS)


class Rig:
    def __init__(self, tmp_path, apache_factory):
        self.tmp = tmp_path
        self.port = free_port()
        self.redis = Redis(tmp_path / "r0", port=self.port).start()
        self.gen = 0
        self.apaches = {}
        for pol in POLICIES:
            a = apache_factory(servers=1)
            a.start(body(self.redis.url, pol) + timed_log_conf(a))
            self.apaches[pol] = a
        self.hole = None

    def restart_redis(self):
        self.gen += 1
        self.redis = Redis(self.tmp / ("r%d" % self.gen),
                           port=self.port).start()

    def stop(self):
        if self.hole:
            self.hole.close()
        self.redis.stop()


@pytest.fixture
def rig(tmp_path, apache_factory):
    r = Rig(tmp_path, apache_factory)
    yield r
    r.stop()


def inject(rig, fault):
    if fault == "kill9":
        rig.redis.kill9()
    elif fault == "sigstop":
        rig.redis.sigstop()
    elif fault == "script_flush":
        rig.redis.client().script_flush()
    elif fault == "restart_empty":
        rig.redis.kill9()
        rig.restart_redis()
        rig.t_up = time.monotonic()
    elif fault == "port_blocked":
        rig.redis.kill9()
        rig.hole = BlackHole(rig.port)
        # fill the backlog so later connects time out
        import socket
        rig.fill = []
        for _ in range(4):
            s = socket.socket()
            s.setblocking(False)
            try:
                s.connect(("127.0.0.1", rig.port))
            except OSError:
                pass
            rig.fill.append(s)


def restore(rig, fault):
    if fault in ("kill9",):
        rig.restart_redis()
    elif fault == "sigstop":
        rig.redis.sigcont()
    elif fault == "port_blocked":
        for s in rig.fill:
            s.close()
        rig.hole.close()
        rig.hole = None
        rig.restart_redis()


def remaining(a, key):
    r = requests.get(a.url("/a/ok.txt"), headers={"X-API-Key": key,
                                                 "Connection": "close"},
                     timeout=10)
    return r.status_code, r.headers.get("X-RateLimit-Remaining"), \
        r.headers.get("X-TB-Decision")


# test_proof_002_01 (slow, ~6 s per fault): each fault against each
# failure policy under load; see the module docstring for the checks.
@pytest.mark.slow
@pytest.mark.parametrize("fault", FAULTS)
def test_proof_002_01(fault, rig, rows):
    probers = {pol: Prober(a.port, "/limited/ok.txt", "probe-" + fault)
               for pol, a in rig.apaches.items()}
    for p in probers.values():
        p.start()
    try:
        time.sleep(0.6)
        t_f = time.monotonic()
        inject(rig, fault)
        time.sleep(FAULT_S)
        t_r = time.monotonic()
        restore(rig, fault)
        t_back = time.monotonic()
        deadline = t_back + COOLDOWN_S + 2.0
        while time.monotonic() < deadline:
            done = all(any(s[3] == "allowed" for s in p.between(t_back, 1e18))
                       for p in probers.values())
            if done:
                break
            time.sleep(0.05)
        time.sleep(0.3)
    finally:
        for p in probers.values():
            p.stop()

    bound = (CONNECT_MS + TIMEOUT_MS) / 1000.0 + MARGIN_S
    for pol, p in probers.items():
        a = rig.apaches[pol]
        status, decl = POLICIES[pol]
        assert not p.errors, (pol, p.errors[:3])
        assert p.samples, pol
        # samples that completed before the fault / began after it began
        # and completed before Redis was restored (a half-open probe may
        # straddle the restore and be answered by Redis)
        before = [x for x in p.samples if x[0] + x[1] < t_f]
        # Before the fault Redis decides. On a stalled machine (a shared
        # runner) a call may pass the 100 ms timeout: it then gets the
        # policy's declared answer, never anything else, and rarely.
        ok = [s for s in before if s[3] == "allowed" and s[2] == 200]
        odd = [s for s in before if s not in ok and not (
            s[2] == status and (s[3] == decl or pol == "closed"))]
        assert before and not odd, (pol, odd[:3])
        assert len(ok) >= 0.9 * len(before), (pol, len(ok), len(before))
        lat_max = max(s[1] for s in p.samples)
        fault_win = [x for x in p.between(t_f + 0.3, t_r)
                     if x[0] + x[1] < t_r]
        slow = [s for s in fault_win if s[1] > 0.05]
        probes = int(math.ceil(FAULT_S / COOLDOWN_S)) + 1
        slow_ok = THRESHOLD + probes + 2
        if fault == "script_flush":
            declared = [s for s in fault_win
                        if s[3] == "allowed" and s[2] == 200]
            recovery = 0.0
        elif fault == "restart_empty":
            # Redis is back at once (empty, no script): each request is
            # decided by Redis or, while the breaker is open, the policy.
            declared = [s for s in fault_win
                        if (s[3] == "allowed" and s[2] == 200)
                        or (s[2] == status
                            and (s[3] == decl or pol == "closed"))]
        elif pol == "closed":
            # The module's 429 skips httpd's error filters, so `Header
            # always set X-TB-Decision` is missing on it (reported): take
            # the status here and the decision from the access log.
            declared = [s for s in fault_win if s[2] == status]
            logged = [r[2] for r in read_timed(a, "probe-" + fault)
                      if r[1] == 429]
            assert logged and set(logged) == {decl}, set(logged)
        else:
            declared = [s for s in fault_win
                        if s[3] == decl and s[2] == status]
        if fault != "script_flush":
            back = rig.t_up if fault == "restart_empty" else t_back
            after = [s for s in p.between(back, 1e18)
                     if s[3] == "allowed"]
            assert after, "%s/%s: Redis never decided again" % (fault, pol)
            recovery = after[0][0] - back
        # counting is exact again on a fresh key
        got = [remaining(a, "count-%s-%s" % (fault, pol)) for _ in range(3)]
        time.sleep(0.2)
        rc = rig.redis.client()
        clients = len(module_clients(rc))
        socks = redis_sockets(a.child_pids(), rig.port)
        rows.append([fault, pol, len(p.samples), len(fault_win),
                     "%.3f" % (len(declared) / max(len(fault_win), 1)),
                     len(slow), slow_ok, "%.0f" % (lat_max * 1000),
                     "%.0f" % (bound * 1000), "%.2f" % recovery,
                     COOLDOWN_S, clients,
                     ",".join(str(v) for v in socks.values())])
        assert lat_max <= bound, (fault, pol, lat_max)
        assert fault_win, (fault, pol)
        assert len(declared) == len(fault_win), (
            fault, pol, [s for s in fault_win if s not in declared][:5])
        assert len(slow) <= slow_ok, (fault, pol, len(slow))
        assert recovery <= COOLDOWN_S + 0.5, (fault, pol, recovery)
        assert [g[1] for g in got] == ["99", "98", "97"], (fault, pol, got)
        assert all(g[2] == "allowed" for g in got), got
        assert all(v <= POOL for v in socks.values()), socks
        assert not crash_lines(a), crash_lines(a)
    # all three servers: at most a full pool each
    assert len(module_clients(rig.redis.client())) <= POOL * len(POLICIES)
