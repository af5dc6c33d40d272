"""test_proof_restart.py -- graceful restart under load and child memory.

 - wrk keeps a steady load (fresh connection per request) while the
   server is gracefully restarted twice (SIGUSR1, as `apachectl
   graceful`) with a new limit: no failed request, the new limit shows in
   X-RateLimit-Limit, and once the old generation is gone the module
   holds no more Redis connections than its pools (CLIENT LIST, and the
   children's sockets to Redis).
 - An event-MPM child's resident memory across TB_RSS_REQUESTS (default
   30,000; the figure asked for is 100,000) requests with distinct keys:
   growth after warm-up stays under 2 MB (a fresh connection per
   request). Figures in $TB_BUILD/results/rss.tsv.
"""
import os
import time

import pytest
import requests

from tbtest.proof import (RESULTS, start_wrk, finish_wrk, run_wrk,
                          module_clients, redis_sockets, rss_kb, write_tsv,
                          crash_lines)

POOL = 2
GRACEFUL = []


def body(url, cap):
    return """
TBucketRedis %s timeout=500 pool=%d
TBucketPrefix gr:
<Location /limited>
    TBucketEnable On
    TBucketKey "%%{HTTP:X-API-Key}"
    TBucketLimit %d 100000/s
</Location>
""" % (url, POOL, cap)


def limit_header(a):
    r = requests.get(a.url("/limited/ok.txt"),
                     headers={"X-API-Key": "probe", "Connection": "close"},
                     timeout=10)
    assert r.status_code == 200
    return r.headers.get("X-RateLimit-Limit")


def settle(a, rc, expected_children, timeout=15):
    """Wait (bounded) until the old generation is gone and every module
    connection Redis sees is held by a current child; returns the
    children's socket counts, or None."""
    port = rc.connection_pool.connection_kwargs["port"]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pids = a.child_pids()
        socks = redis_sockets(pids, port)
        if (len(pids) <= expected_children
                and sum(socks.values()) == len(module_clients(rc))):
            return socks
        time.sleep(0.2)
    return None


# test_proof_003_01 (slow, ~8 s): two graceful restarts under load with
# new limits: no failed request, new limit applies, no leaked connection.
@pytest.mark.slow
@pytest.mark.parametrize("mpm", ["event", "prefork"])
def test_proof_003_01(mpm, redis_server, apache_factory):
    rc = redis_server.client()
    a = apache_factory(mpm=mpm, servers=2)
    a.start(body(redis_server.url, 1000000))
    assert limit_header(a) == "1000000"
    # Load on a limited path and, as a baseline, on a path the module
    # does not handle, with a fresh connection per request. httpd itself
    # may reset a connection caught by a restart: with keep-alive that was
    # 1-6 wrk read errors per restart pair on either path (six runs of the
    # event MPM); with fresh connections, none in six runs of each MPM.
    # The module must add no failure beyond the baseline's spread.
    w = start_wrk(a.port, "/limited/ok.txt", "gload", 6, threads=1,
                  conns=4, close=True)
    base = start_wrk(a.port, "/ok.txt", "gload", 6, threads=1, conns=4,
                     close=True)
    time.sleep(1.5)
    a.graceful(body(redis_server.url, 2000000))
    assert limit_header(a) == "2000000"
    time.sleep(1.0)
    a.graceful(body(redis_server.url, 3000000))
    assert limit_header(a) == "3000000"
    res = finish_wrk(w)
    res_base = finish_wrk(base)
    GRACEFUL.append([mpm, res["requests"], res["non2xx"],
                     res.get("socket_detail", "none"), res_base["requests"],
                     res_base.get("socket_detail", "none"),
                     "%.0f" % res["latency_max_ms"]])
    write_tsv("graceful.tsv", ["mpm", "limited_requests", "limited_non2xx",
                               "limited_socket_errors", "baseline_requests",
                               "baseline_socket_errors", "latency_max_ms"],
              GRACEFUL)
    assert res["requests"] > 500, res
    assert res["non2xx"] == 0, res
    assert res["socket_errors"] <= res_base["socket_errors"] + 5, (
        res, res_base)
    with open(a.access_log) as f:
        statuses = set(line.split()[1] for line in f if line.strip())
    assert statuses == {"200"}, statuses
    # event: the worker children and the cgid daemon; prefork: httpd
    # raises MaxSpareServers to MinSpareServers + 1, so after the load's
    # fresh connections three idle children may stay
    socks = settle(a, rc, 3)
    assert socks is not None, "connections of old children remain: %r" % (
        ([(c["id"], c["cmd"], c["age"]) for c in module_clients(rc)],
         a.child_pids(), redis_sockets(a.child_pids(), redis_server.port)),)
    assert all(v <= POOL for v in socks.values()), socks
    assert len(module_clients(rc)) <= POOL * 2
    assert not crash_lines(a), crash_lines(a)
    assert "TB001" not in a.read_log().replace("TB00106", ""), \
        a.read_log()[-2000:]


# test_proof_004_01 (slow, ~10 s by default): child RSS across many
# requests with distinct keys stays flat.
@pytest.mark.slow
def test_proof_004_01(redis_server, apache_factory):
    total = int(os.environ.get("TB_RSS_REQUESTS", "30000"))
    a = apache_factory(mpm="event", servers=1)
    a.start(body(redis_server.url, 10))
    # warm-up: pools, connections, allocator arenas.
    # A fresh connection per request (as in the graceful test): each
    # connection's pool is made and freed, so they are inside the figure,
    # and the event MPM has no keep-alive queue to cut. With keep-alive,
    # about once in 20,000 requests on a loaded CI machine the MPM closed
    # a kept-alive connection as wrk sent on it (one wrk read error, every
    # response a 200), httpd's choice when it runs short of workers. (Until
    # tbtest's wrk script carried wrk.headers, `close=True` never reached
    # the server, which is why the first attempt at this still failed.)
    # 6 connections for 8 threads.
    run_wrk(a.port, "/limited/ok.txt", "warm", 2, threads=2, conns=6,
            distinct=True, close=True)
    # the child that serves (the other child of an event server is the
    # cgid daemon): from the access log's %P
    with open(a.access_log) as f:
        served = set(int(line.split()[-1]) for line in f if line.strip())
    assert len(served) == 1, served
    child = served.pop()
    rss0 = rss_kb(child)
    done = 0
    samples = [(0, rss0)]
    t0 = time.monotonic()
    while done < total and time.monotonic() - t0 < 120:
        w = run_wrk(a.port, "/limited/ok.txt", "rss%d" % len(samples), 2,
                    threads=2, conns=6, distinct=True, close=True)
        assert w["non2xx"] == 0 and w["socket_errors"] == 0, w
        done += w["requests"]
        samples.append((done, rss_kb(child)))
    elapsed = time.monotonic() - t0
    assert child in a.child_pids(), "the child was replaced"
    rss1 = samples[-1][1]
    tag = "_asan" if os.environ.get("TB_ASAN") == "1" else ""
    write_tsv("rss.tsv", ["requests", "rss_kb"], samples)
    with open(os.path.join(RESULTS, "rss_summary%s.tsv" % tag), "w") as f:
        f.write("requests\tseconds\treq_per_s\trss_after_warmup_kb\t"
                "rss_end_kb\tgrowth_kb\tredis_keys\n")
        f.write("%d\t%.1f\t%.0f\t%d\t%d\t%d\t%d\n" % (
            done, elapsed, done / elapsed, rss0, rss1, rss1 - rss0,
            redis_server.client().dbsize()))
    assert done >= total, (done, total)
    if os.environ.get("TB_ASAN") != "1":
        # (under `make asan` the quarantine grows RSS by design: there the
        # run is for ASan's sake, the figure comes from the plain build)
        assert rss1 - rss0 < 2048, samples
    assert not crash_lines(a), crash_lines(a)
