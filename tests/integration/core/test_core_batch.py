"""test_core_batch.py -- many threads on one client: the core's batching.

tb_batch (tests/integration/progs/tb_batch.c) runs many threads on one
tb_client_t against a real redis-server. When every pooled connection is
busy, a thread's decision joins the batch queued behind one, and the
batch's first member writes all of it at once and reads every reply. These
tests check that each caller gets exactly its own result (against the
sequential model and the shared vectors), that the limit holds with
Redis's clock, and that a stopped Redis, a killed connection and a fork
with batches in flight lose no waiter, leak no fd and keep every call
within its deadline.
"""
import os
import signal
import subprocess
import threading
import time

from tbtest.core import check_after, load_vectors, put_buckets, vector_take
from tbtest.env import parse_kv, prog


def batch(url, *args, opts=(), stdin=None, timeout=60):
    """Run tb_batch; its lines as dicts, and the stats line. Timeouts are
    generous unless a test sets its own: on a loaded two-core machine a
    50 ms default would let the policy answer where the test checks
    Redis's answers."""
    cmd = ([prog("tb_batch"), "-u", url, "-t", "2000", "-c", "2000"] + list(opts)
           + ["--"]
           + [str(a) for a in args])
    p = subprocess.run(cmd, input=stdin, capture_output=True, text=True,
                       timeout=timeout)
    assert p.returncode == 0, p.stderr
    lines = [parse_kv(x) for x in p.stdout.splitlines()]
    stats = [x for x, raw in zip(lines, p.stdout.splitlines())
             if raw.startswith("stats ")][0]
    return lines, stats


# Sixteen threads on one key with the clock held still: exactly capacity
# decisions are allowed, their `remaining` figures are capacity-1 .. 0,
# each exactly once (a reply given to the wrong caller would repeat or
# lose one), and every refusal carries the model's wait. The decisions
# shared writes: fewer writes than calls.
def test_core_030_01(redis_server):
    lines, stats = batch(redis_server.url, "hammer", 16, 40, "one", 100, 1,
                         1, 5000000, opts=("-p", "2"))
    res = [x for x in lines if "seq" in x]
    assert len(res) == 640
    assert all(x["source"] == "redis" for x in res)
    allowed = sorted(x["remaining"] for x in res if x["allowed"] == 1)
    assert allowed == list(range(100))
    assert all(x["retry_ms"] == 1000 and x["remaining"] == 0
               for x in res if x["allowed"] == 0)
    assert stats["calls"] == 640
    assert stats["batches"] < stats["calls"]


# Each thread on a key of its own: every thread's sequence is exactly the
# sequential model of its bucket, in its own order.
def test_core_030_02(redis_server):
    lines, stats = batch(redis_server.url, "hammer", 12, 30, "own", 20, 2,
                         1, 7000000, opts=("-p", "1"))
    for t in range(12):
        seq = [x for x in lines if x.get("t") == t and "seq" in x]
        got = [(x["allowed"], x["remaining"], x["retry_ms"]) for x in seq]
        want = [(1, 19 - i, 0) for i in range(20)]
        want += [(0, 0, 500)] * 10
        assert got == want, t
    assert stats["batches"] < stats["calls"]


# The shared vectors, all at once from eight threads through one
# connection: every verdict and every stored state as the sequential
# client and the C twin have them.
def test_core_030_03(redis_server):
    r = redis_server.client()
    vectors = load_vectors()
    rows, keys = [], []
    for vid, now, buckets, verdict in vectors:
        client = "b-" + vid
        row_keys, args = vector_take("B:", client, buckets)
        put_buckets(r, row_keys, buckets)
        keys.append(row_keys)
        rows.append("%d %s %s" % (now, client, args))
    lines, stats = batch(redis_server.url, "rows", 8, opts=("-p", "1"),
                         stdin="\n".join(rows) + "\n")
    got = {x["row"]: x for x in lines if "row" in x}
    assert len(got) == len(vectors)
    for i, (vid, now, buckets, verdict) in enumerate(vectors):
        x = got[i]
        assert x["source"] == "redis", (vid, x)
        assert [x["allowed"], x["remaining"], x["retry_ms"],
                x["binding"]] == verdict, (vid, x)
        check_after(r, keys[i], buckets, verdict, vid)
    assert stats["calls"] == len(vectors)


# With Redis's own clock, eight threads deciding for 2 s on one key each
# never admit more than capacity + rate x T per key.
def test_core_030_04(redis_server):
    t0 = time.monotonic()
    lines, stats = batch(redis_server.url, "loop", 8, 2000, 30, 50, 1,
                         opts=("-p", "2"))
    elapsed = time.monotonic() - t0
    per = [x for x in lines if "made" in x]
    assert len(per) == 8
    for x in per:
        assert x["redis"] == x["made"]
        assert 30 <= x["allowed"] <= 30 + 50 * elapsed + 1, x
    assert stats["batches"] < stats["calls"]


# Redis stopped (SIGSTOP) with batches in flight: every decision still
# returns within the connect and command timeouts (connect, setup and
# command are each bounded), the open policy answers the ones Redis did
# not, and decisions go back to Redis once it runs again.
def test_core_030_05(redis_server):
    pid = redis_server.proc.pid

    def pause():
        time.sleep(0.6)
        os.kill(pid, signal.SIGSTOP)
        time.sleep(0.6)
        os.kill(pid, signal.SIGCONT)

    th = threading.Thread(target=pause)
    th.start()
    try:
        lines, stats = batch(redis_server.url, "loop", 8, 2500, 1e9, 1e9, 1,
                             opts=("-p", "2", "-t", "50", "-c", "50"))
    finally:
        th.join()
        os.kill(pid, signal.SIGCONT)
    per = [x for x in lines if "made" in x]
    assert len(per) == 8
    # connect 50 + setup 50 + command 50, and scheduling slack on a busy
    # two-core machine.
    assert max(x["longest_us"] for x in per) < 400000, per
    assert sum(x["open"] for x in per) >= 8
    assert sum(x["redis"] for x in per) > 0
    assert stats["errors"] > 0


# The server kills our connections over and over while eight threads
# decide: every decision comes back (Redis or the policy), none hangs,
# and the client ends with no more fds than its pool, and none after
# tb_client_free.
def test_core_030_06(redis_server):
    r = redis_server.client()
    stop = threading.Event()

    def killer():
        while not stop.is_set():
            try:
                r.execute_command("CLIENT", "KILL", "TYPE", "normal",
                                  "SKIPME", "yes")
            except Exception:  # noqa: BLE001 -- a racing kill is fine
                pass
            time.sleep(0.03)

    th = threading.Thread(target=killer)
    th.start()
    try:
        lines, stats = batch(redis_server.url, "loop", 8, 2000, 1e9, 1e9, 1,
                             opts=("-p", "3", "-t", "200"))
    finally:
        stop.set()
        th.join()
    per = [x for x in lines if "made" in x]
    assert len(per) == 8 and all(x["made"] > 0 for x in per)
    fds = [x for x in lines if "fds_before" in x][0]
    assert fds["fds_end"] <= fds["fds_before"] + 3
    freed = [x for x in lines if "fds_after_free" in x][0]
    assert freed["fds_after_free"] == fds["fds_before"]
    assert stats["connects"] > 1 and stats["errors"] > 0


# fork() while other threads have batches in flight: the child's first
# decision on the inherited client is made by Redis on a connection of
# its own, and the parent carries on.
def test_core_030_07(redis_server):
    lines, stats = batch(redis_server.url, "fork", 8, 1500,
                         opts=("-p", "2"))
    assert [x for x in lines if "child_exit" in x][0]["child_exit"] == 0
    per = [x for x in lines if "made" in x]
    assert all(x["made"] > 0 and x["redis"] == x["made"] for x in per)
    fds = [x for x in lines if "fds_before" in x][0]
    assert fds["fds_end"] <= fds["fds_before"] + 2


# A batch that fails is one failure for the breaker, however many
# decisions rode on it: with Redis stopped and a threshold of 10, thirty
# threads deciding at once on one connection fail in a handful of
# batches (two when they all start together, a few more when a loaded
# machine staggers them) and the breaker stays closed, where one failure
# per decision would have opened it three times over.
def test_core_030_08(redis_server):
    pid = redis_server.proc.pid
    os.kill(pid, signal.SIGSTOP)
    try:
        lines, stats = batch(redis_server.url, "hammer", 30, 1, "own", 10,
                             1, 1, -1, opts=("-p", "1", "-b", "10",
                                             "-t", "100", "-c", "100"))
    finally:
        os.kill(pid, signal.SIGCONT)
    res = [x for x in lines if "seq" in x]
    assert len(res) == 30 and all(x["source"] == "open" for x in res)
    assert stats["errors"] == 30
    assert stats["breaker_opens"] == 0 and stats["breaker"] == "closed"
