"""test_algo_client.py -- the algorithms through the real client.

tb_algo_driver (tests/integration/progs/tb_algo_driver.c) decides through
libtb's tb_client_decide_algo(): EVALSHA of the right script, NOSCRIPT
answered by EVAL of the right text, per-algorithm key suffixes with a TTL,
and the multi-process concurrency bound: several processes hammer one key
for a fixed time T and the total allowed must not exceed what the
algorithm permits in T (and must come near it, or the test proves
nothing).
"""
import math
import subprocess

import pytest

from tbtest.env import prog

ALGOS = ["token-bucket", "gcra", "sliding-window", "fixed-window",
         "sliding-log"]
SUFFIX = {"token-bucket": "", "gcra": ":gcra", "sliding-window": ":swin",
          "fixed-window": ":fwin", "sliding-log": ":slog"}


def driver(url, algo, cap, rate, cost, ms, prefix, key, *extra, timeout=30):
    exe = prog("tb_algo_driver")
    out = subprocess.run([exe, url, algo, str(cap), str(rate), str(cost),
                          str(ms), prefix, key] + [str(x) for x in extra],
                         capture_output=True, text=True, timeout=timeout,
                         check=True).stdout
    return {k: int(v) for k, v in (f.split("=") for f in out.split())}


@pytest.mark.parametrize("algo", ALGOS)
def test_algo_client_burst_key_and_ttl(redis_server, algo):
    """A fresh key admits exactly CAPACITY at once, under its own key."""
    # 5 per 500 s: no window boundary can fall inside the run.
    res = driver(redis_server.url, algo, 5, 0.01, 1, 10000, "b:", "client",
                 "--max-calls", 12)
    assert (res["allowed"], res["rejected"], res["errors"]) == (5, 7, 0)
    r = redis_server.client()
    assert r.keys("b:*") == [("b:{client}" + SUFFIX[algo]).encode()]
    assert r.pttl("b:{client}" + SUFFIX[algo]) > 0


@pytest.mark.parametrize("algo", ALGOS)
def test_algo_client_noscript_reload(redis_server, algo):
    """After SCRIPT FLUSH the client sends this algorithm's text by EVAL."""
    res = driver(redis_server.url, algo, 100, 1, 1, 10000, "n:", "client",
                 "--flush-after", 3, "--max-calls", 6)
    assert res["errors"] == 0 and res["allowed"] == 6
    assert res["noscript"] == 1
    r = redis_server.client()
    assert r.keys("n:*") == [("n:{client}" + SUFFIX[algo]).encode()]


def permitted(algo, cap, rate, span_ms):
    """The most the algorithm admits within span_ms, and a floor to reach."""
    win = cap * 1000.0 / rate
    if algo in ("token-bucket", "gcra"):
        most = cap + rate * span_ms / 1000.0 + 1
        return most, 0.9 * (cap + rate * span_ms / 1000.0)
    full = math.floor(span_ms / win)
    if algo == "sliding-log":
        return cap * (full + 1), 0.9 * cap * full
    # Fixed and sliding window: at most CAPACITY per fixed window, and a
    # span touches at most floor(T / W) + 2 of them.
    return cap * (full + 2), 0.8 * cap * full


@pytest.mark.parametrize("algo", ALGOS)
def test_algo_client_concurrency_bound(redis_server, algo):
    """4 processes, one key, 1.5 s: allowed <= what the algorithm permits."""
    exe = prog("tb_algo_driver")
    cap, rate, nproc, ms = 50, 200, 4, 1500
    procs = [subprocess.Popen([exe, redis_server.url, algo, str(cap),
                               str(rate), "1", str(ms), "c:", "shared",
                               "--max-calls", "400000"],
                              stdout=subprocess.PIPE, text=True)
             for _ in range(nproc)]
    outs = []
    for p in procs:
        out, _ = p.communicate(timeout=30)
        assert p.returncode == 0
        outs.append({k: int(v) for k, v in (f.split("=") for f in out.split())})
    allowed = sum(o["allowed"] for o in outs)
    calls = allowed + sum(o["rejected"] for o in outs)
    assert sum(o["errors"] for o in outs) == 0
    span = max(o["last_ms"] for o in outs) - min(o["first_ms"] for o in outs)
    most, least = permitted(algo, cap, rate, span + 2)
    print("%s: %d allowed of %d in %d ms (bound %.0f)" % (
        algo, allowed, calls, span, most))
    assert calls > 4 * allowed, "not saturated: the bound proves nothing"
    assert allowed <= most
    assert allowed >= least
