"""test_hostile_core.py -- hostile client keys against the core and a real
Redis, through the tb_driver test program (one libtb client).

Keys of 0 bytes and 1 MB, with CR/LF, NUL, braces, '%' sequences, bytes
that are not UTF-8, keys that imitate a hashed key or another client's
key: no crash, each lands on its documented Redis key (tb.h: raw when
safe, else '#' + 32 hex of SHA-256), every Redis key stays inside the
prefix{...} shape, and no other client's bucket moves. Then thousands of
distinct keys per second: Redis memory per key is bounded and every key
expires by its TTL (figures in $TB_BUILD/results/hostile_keys.tsv).
"""
import os
import re
import time

import pytest

from tbtest.env import wait_until
from tbtest.core import pct, redis_key
from tbtest.proof import RESULTS

PREFIX = "hz:"
H1 = 1 / 3600.0  # one token an hour
SAFE_KEY = re.compile(rb"^hz:\{([\x21-\x7a\x7c\x7e]{0,128}|#[0-9a-f]{32})\}"
                      rb"(:route:[A-Za-z0-9_.-]{1,64})?$")
HOSTILE = [
    b"",
    b"a" * (1 << 20),
    b"a" * 128,
    b"a" * 129,
    b"victim\r\nSET x 1",
    b"victim\r\n",
    b"\r\n*1\r\n$8\r\nFLUSHALL\r\n",
    b"victim\x00",
    b"\x00victim",
    b"\x00",
    b"{victim}",
    b"victim}",
    b"}{victim",
    b"{",
    b"%",
    b"%00",
    b"%25%30%30",
    b"victim%00",
    b"%s%s%s%n",
    b"\xff\xfe\xfd",
    b"\xc3\x28",
    b"vict\xc4\xb1m",
    b"#" + b"0" * 32,
    b"#victim",
    b" victim",
    b"victim ",
    b"\tvictim",
    b"\x7f",
    b"victim\x1b[2J",
]


def all_keys(r):
    return sorted(r.scan_iter(match=PREFIX + "*", count=1000))


# test_hostile_001_01: every hostile key is decided, lands on its
# documented Redis key, and never touches the victim's bucket.
def test_hostile_001_01(redis_server, drivers):
    r = redis_server.client()
    d = drivers(redis_server.url, prefix=PREFIX, timeout=2000)
    victim = redis_key(PREFIX, "victim")
    for _ in range(3):
        assert d.take("victim", 10, H1, 1)["allowed"] == 1
    before = r.hgetall(victim)
    ttl_before = r.pttl(victim)
    assert float(before[b"tokens"]) == pytest.approx(7, abs=0.01)

    for key in HOSTILE:
        out = d.take(key, 5, H1, 1, timeout=30)
        assert out["allowed"] == 1 and out["source"] == "redis", (key[:40],
                                                                  out)
        want = redis_key(PREFIX, key)
        assert r.exists(want), (key[:40], want)
        if key and want != victim:
            # the driver agrees with the documented form
            got = d.cmd("key " + pct(key), timeout=30)["key"]
            assert bytes.fromhex(got) == want
    # A second round: each hostile key has its own bucket (4 left).
    for key in HOSTILE:
        assert d.take(key, 5, H1, 1, timeout=30)["remaining"] == 3, key[:40]

    after = r.hgetall(victim)
    assert after == before, "the victim's bucket moved"
    assert r.pttl(victim) <= ttl_before
    keys = all_keys(r)
    bad = [k for k in keys if not SAFE_KEY.match(k)]
    assert not bad, bad[:5]
    # One bucket per distinct key (no two hostile keys share one), plus
    # the victim's.
    assert len(keys) == len(set(redis_key(PREFIX, k) for k in HOSTILE)) + 1
    assert len(keys) == len(HOSTILE) + 1
    # Nothing outside the prefix was written (no injected command ran).
    assert r.dbsize() == len(keys)
    assert d.stats()["redis_errors"] == 0


# test_hostile_001_02: a cost above the capacity is refused with
# retry_ms = -1 ("never"), writes nothing and leaves the bucket alone.
def test_hostile_001_02(redis_server, drivers):
    r = redis_server.client()
    d = drivers(redis_server.url, prefix=PREFIX)
    assert d.take("c1", 5, H1, 1)["allowed"] == 1
    before = r.hgetall(redis_key(PREFIX, "c1"))
    out = d.take("c1", 5, H1, 6)
    assert out["allowed"] == 0 and out["retry_ms"] == -1
    out = d.take("fresh", 5, H1, 1e9)
    assert out["allowed"] == 0 and out["retry_ms"] == -1
    assert not r.exists(redis_key(PREFIX, "fresh"))
    assert r.hgetall(redis_key(PREFIX, "c1")) == before
    # Route bucket too big: the main bucket is not deducted either.
    out = d.take("c1", 5, H1, 1, "big", 2, H1, 3)
    assert out["allowed"] == 0 and out["retry_ms"] == -1
    assert r.hgetall(redis_key(PREFIX, "c1")) == before


def churn(d, n, tag, batch=500):
    """n decisions on n distinct keys, pipelined; returns keys/second."""
    t0 = time.monotonic()
    for start in range(0, n, batch):
        count = min(batch, n - start)
        lines = "".join("take %s-%d 2 2 1\n" % (tag, i)
                        for i in range(start, start + count))
        d.proc.stdin.write(lines.encode())
        d.proc.stdin.flush()
        for _ in range(count):
            out = d.line(timeout=30)
            assert out.startswith("ok allowed=1"), out
    return n / (time.monotonic() - t0)


# test_hostile_001_03 (slow, ~8 s): 20,000 distinct keys as fast as one
# client can: memory per key is bounded and every key expires by its TTL
# (capacity 2 at 2/s: TTL 2 s), taking Redis back to its starting size.
@pytest.mark.slow
def test_hostile_001_03(redis_server, drivers):
    n = int(os.environ.get("TB_HOSTILE_KEYS", "20000"))
    r = redis_server.client()
    d = drivers(redis_server.url, prefix=PREFIX)
    d.take("warm", 2, 2, 1)
    time.sleep(2.2)
    base = r.info("memory")["used_memory"]
    rate = churn(d, n, "churn")
    peak = r.info("memory")["used_memory"]
    keys = r.dbsize()
    sample = [k for _, k in zip(range(200), r.scan_iter(match="hz:*"))]
    ttls = [r.pttl(k) for k in sample]
    # every key has a TTL within the bucket's (0: expiring now; -2:
    # already gone); none lives forever (-1)
    odd = [(k, t) for k, t in zip(sample, ttls)
           if not (t == -2 or 0 <= t <= 2000)]
    assert not odd, odd
    per_key = (peak - base) / max(keys, 1)
    # a small hash per key: well under 300 bytes each
    assert per_key < 300, per_key
    t0 = time.monotonic()
    assert wait_until(lambda: r.dbsize() == 0, timeout=12, step=0.1), \
        "keys did not expire: %d left" % r.dbsize()
    gone_s = time.monotonic() - t0
    end = r.info("memory")["used_memory"]
    assert end - base < 0.1 * (peak - base) + 200000, (base, peak, end)
    os.makedirs(RESULTS, exist_ok=True)
    name = "hostile_keys%s.tsv" % ("_asan" if os.environ.get("TB_ASAN")
                                   == "1" else "")
    with open(os.path.join(RESULTS, name), "w") as f:
        f.write("keys\tkeys_per_s\tused_memory_base\tused_memory_peak\t"
                "bytes_per_key\tall_expired_after_s\tused_memory_end\n")
        f.write("%d\t%.0f\t%d\t%d\t%.0f\t%.1f\t%d\n" % (
            n, rate, base, peak, per_key, gone_s, end))
