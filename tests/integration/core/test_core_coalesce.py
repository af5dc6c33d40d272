"""test_core_coalesce.py -- exactness through the host's coalescer, across
processes: several tb_batch processes (tests/integration/progs/tb_batch.c),
each many threads on one client, send their decisions at once to the unix
socket of the coalescer an Apache with `coalesce=on` forked, as its
children would. The coalescer interleaves every process's commands into
its pipelines on one Redis connection; each caller must still get exactly
its own result: against the sequential model, the shared vectors and the
stored state, as test_core_batch checks them inside one process.
"""
import glob
import os
import socket
import subprocess
import time

import pytest

from tbtest.core import check_after, load_vectors, put_buckets, vector_take
from tbtest.env import parse_kv, prog, wait_until

PROCS = 4


@pytest.fixture
def socket_url(apache_factory, redis_server):
    """unix:PATH of a coalescer (prefork Apache, coalesce=on, no traffic)
    in front of redis_server."""
    a = apache_factory(mpm="prefork")
    a.start("TBucketRedis %s timeout=2000 coalesce=on\n" % redis_server.url)
    paths = wait_until(lambda: glob.glob(os.path.join(
        a.root, "run", "tbucket", "coal-*.sock")), timeout=10)
    assert paths and len(paths) == 1, paths
    # Its connection to Redis made before the processes start: a first
    # run of a fresh sanitizer build was slow enough there for a call to
    # meet the failure policy.
    assert wait_until(lambda: ping(paths[0]), timeout=10)
    yield "unix:" + paths[0]
    a.assert_log_clean()


def ping(path):
    """PING through the coalescer's socket answered by Redis."""
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(2)
            s.connect(path)
            s.sendall(b"*1\r\n$4\r\nPING\r\n")
            return s.recv(64) == b"+PONG\r\n"
    except OSError:
        return False


def batches(url, argvs, stdins=None):
    """One tb_batch per argv, all at once; each one's lines as dicts."""
    procs = []
    for i, args in enumerate(argvs):
        cmd = [prog("tb_batch"), "-u", url, "-t", "2000", "-c", "2000",
               "-p", "1", "--"] + [str(x) for x in args]
        procs.append(subprocess.Popen(
            cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True))
    out = []
    for i, p in enumerate(procs):
        stdout, stderr = p.communicate(
            input=stdins[i] if stdins else "", timeout=120)
        assert p.returncode == 0, stderr
        out.append([parse_kv(x) for x in stdout.splitlines()])
    return out


def only_redis_and_coalescer(r):
    # The test's own client r and the coalescer's one connection: none of
    # the processes reached Redis on its own.
    clients = r.client_list()
    assert len(clients) == 2, clients


# Four processes of eight threads on one key, the clock held still:
# exactly capacity allowed in all, their `remaining` figures capacity-1
# .. 0 each exactly once across the processes (a reply handed to another
# caller, in another process, would repeat or lose one), and every
# refusal carries the model's wait.
def test_core_031_01(socket_url, redis_server):
    outs = batches(socket_url, [("hammer", 8, 40, "one", 100, 1, 1,
                                 5000000)] * PROCS)
    res = [x for lines in outs for x in lines if "seq" in x]
    assert len(res) == PROCS * 8 * 40
    assert all(x["source"] == "redis" for x in res)
    allowed = sorted(x["remaining"] for x in res if x["allowed"] == 1)
    assert allowed == list(range(100))
    assert all(x["retry_ms"] == 1000 and x["remaining"] == 0
               for x in res if x["allowed"] == 0)
    only_redis_and_coalescer(redis_server.client())


# Each thread of each process on a key of its own (a prefix per
# process): every sequence is exactly the sequential model of its bucket,
# in its own order.
def test_core_031_02(socket_url, redis_server):
    procs = []
    for i in range(PROCS):
        procs.append(subprocess.Popen(
            [prog("tb_batch"), "-u", socket_url, "-t", "2000", "-c", "2000",
             "-p", "1", "-x", "p%d:" % i, "--", "hammer", "6", "30", "own",
             "20", "2", "1", "7000000"], stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True))
    want = [(1, 19 - i, 0) for i in range(20)] + [(0, 0, 500)] * 10
    for i, p in enumerate(procs):
        stdout, stderr = p.communicate(timeout=120)
        assert p.returncode == 0, stderr
        lines = [parse_kv(x) for x in stdout.splitlines()]
        for t in range(6):
            seq = [x for x in lines if x.get("t") == t and "seq" in x]
            got = [(x["allowed"], x["remaining"], x["retry_ms"])
                   for x in seq]
            assert got == want, (i, t)
    assert len(redis_server.client().keys("p*")) == PROCS * 6
    only_redis_and_coalescer(redis_server.client())


# The shared vectors, dealt over four processes of four threads sending
# at once through the coalescer: every verdict and every stored state as
# the sequential client and the C twin have them.
def test_core_031_03(socket_url, redis_server):
    r = redis_server.client()
    vectors = load_vectors()
    rows, keys = [[] for _ in range(PROCS)], []
    for n, (vid, now, buckets, verdict) in enumerate(vectors):
        client = "c-" + vid
        row_keys, args = vector_take("B:", client, buckets)
        put_buckets(r, row_keys, buckets)
        keys.append(row_keys)
        rows[n % PROCS].append("%d %s %s" % (now, client, args))
    t0 = time.monotonic()
    outs = batches(socket_url, [("rows", 4)] * PROCS,
                   ["\n".join(x) + "\n" for x in rows])
    for p, lines in enumerate(outs):
        got = {x["row"]: x for x in lines if "row" in x}
        assert len(got) == len(rows[p])
        for i in range(len(rows[p])):
            n = i * PROCS + p
            vid, now, buckets, verdict = vectors[n]
            x = got[i]
            assert x["source"] == "redis", (vid, x)
            assert [x["allowed"], x["remaining"], x["retry_ms"],
                    x["binding"]] == verdict, (vid, x)
            # The TTL counts down from the call, made at most this long
            # ago (every process's rows are checked after all are done).
            check_after(r, keys[n], buckets, verdict, vid,
                        slack_ms=1000 + 1000 * (time.monotonic() - t0))
    only_redis_and_coalescer(r)
