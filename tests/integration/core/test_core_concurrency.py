"""test_core_concurrency.py -- several processes hammer one bucket.

The shared limit must hold across processes: over a window of T seconds
the total let through is at most capacity + rate*T (+ one cost for the
boundary) and, with the callers busy the whole time, at least 99% of it.

T is measured, not assumed: each tb_driver reports the wall-clock time
just before its first decision and just after its last, and T is the span
from the earliest first to the latest last; every decision the script saw
happened inside it (Redis's TIME and the drivers read the same clock). To
keep start skew small the drivers connect and load the script first, and
then get their `hammer` commands back to back.
"""

PROCS = 4
CAP = 50
RATE = 200.0
COST = 1
WINDOW_MS = 3000


# PROCS processes, one key, WINDOW_MS each: capacity + rate*T (+ one cost)
# at most, 99% of it at least, every decision made by Redis.
def test_core_006_01(redis_server, drivers):
    ds = [drivers(redis_server.url, timeout=500, breaker_threshold=1000)
          for k in range(PROCS)]
    for k, d in enumerate(ds):
        assert d.take("warm-%d" % k, 10, 1, 1)["source"] == "redis"
    for d in ds:
        d.send("hammer shared %d %r %d %d" % (CAP, RATE, COST, WINDOW_MS))
    out = [d.line(timeout=WINDOW_MS / 1000.0 + 20) for d in ds]
    res = []
    for line in out:
        assert line.startswith("ok"), line
        res.append(dict(kv.split("=") for kv in line.split()[1:]))
    first = min(int(x["first_us"]) for x in res)
    last = max(int(x["last_us"]) for x in res)
    skew = max(int(x["first_us"]) for x in res) - first
    t = (last - first) / 1e6
    allowed = sum(int(x["allowed"]) for x in res)
    total = sum(int(x["total"]) for x in res)
    redis = sum(int(x["redis"]) for x in res)
    # Redis's clock is read in whole ms: allow one more ms of refill.
    upper = CAP + RATE * (t + 0.001) + COST
    lower = 0.99 * (CAP + RATE * t)
    report = ("T=%.4fs skew=%.1fms allowed=%d bounds=[%.1f, %.1f] "
              "decisions=%d" % (t, skew / 1000.0, allowed, lower, upper,
                                total))
    print(report)
    assert redis == total, report
    assert skew < 500000, report
    assert WINDOW_MS / 1000.0 <= t < WINDOW_MS / 1000.0 + 1.0, report
    assert total > 10 * (CAP + RATE * t), report  # Really contended.
    assert allowed <= upper, report
    assert allowed >= lower, report
    # The bucket's state agrees: never above capacity, never negative.
    tokens = float(redis_server.client().hget("tb:{shared}", "tokens"))
    assert 0 <= tokens <= CAP
