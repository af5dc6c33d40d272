"""tbtest/core.py -- helpers for the core's integration tests.

Drives the tb_driver test program (tests/integration/progs/tb_driver.c),
one long-lived libtb client per process, over its line protocol; computes
the Redis keys and cluster slots the core must use; loads the shared test
vectors. The `drivers` and `make_redis` fixtures (conftest.py) are built on
Driver and tbtest.env.Redis. Every process started here is stopped by PID,
and every wait is bounded.
"""
import hashlib
import os
import select
import signal
import subprocess
import time

from tbtest.env import ROOT, lua_script, parse_kv, prog, stop_pid

VECTORS = os.path.join(ROOT, "tests", "vectors", "token_bucket.tsv")
SETTLE_VECTORS = os.path.join(ROOT, "tests", "vectors",
                              "token_bucket_settle.tsv")


def script_text():
    """The token-bucket script as libtb embeds it (build/lua/)."""
    return lua_script("tb_bucket.lua")


def pct(key):
    """Percent-encode a key (bytes or str) for the driver's KEY argument."""
    if isinstance(key, str):
        key = key.encode()
    if key == b"":
        return "%"
    safe = set(b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
               b"0123456789-_.:")
    return "".join(chr(b) if b in safe else "%%%02X" % b for b in key)


def sanitized(key):
    """The documented sanitised form of a client key (tb.h)."""
    if isinstance(key, str):
        key = key.encode()
    raw = (len(key) <= 128 and not key.startswith(b"#")
           and all(0x21 <= b <= 0x7e and b not in b"{}" for b in key))
    if raw:
        return key
    return b"#" + hashlib.sha256(key).hexdigest()[:32].encode()


def redis_key(prefix, key, route=None):
    """The Redis key the core must use for a client key (tb.h)."""
    k = prefix.encode() + b"{" + sanitized(key) + b"}"
    if route:
        k += b":route:" + route.encode()
    return k


def crc16(data):
    """CRC16-XMODEM, as Redis Cluster's key hash."""
    crc = 0
    for b in data:
        crc ^= b << 8
        for _ in range(8):
            crc = ((crc << 1) ^ 0x1021) if crc & 0x8000 else crc << 1
            crc &= 0xffff
    return crc


def keyslot(key):
    """The cluster slot of a key (bytes or str): CRC16 of its hash tag."""
    if isinstance(key, str):
        key = key.encode()
    s = key.find(b"{")
    if s >= 0:
        e = key.find(b"}", s + 1)
        if e > s + 1:
            key = key[s + 1:e]
    return crc16(key) % 16384


class Driver:
    """One tb_driver process: send a command, get its one-line answer."""

    def __init__(self, args):
        self.args = [prog("tb_driver")] + [str(a) for a in args]
        self.proc = subprocess.Popen(self.args, stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE)
        self.buf = b""
        self.ready = self.line(timeout=10)

    @property
    def pid(self):
        return self.proc.pid

    def line(self, timeout=10.0):
        """The next output line, waiting at most timeout seconds."""
        deadline = time.monotonic() + timeout
        fd = self.proc.stdout.fileno()
        while b"\n" not in self.buf:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("tb_driver: no answer in %.1fs" % timeout)
            r, _, _ = select.select([fd], [], [], left)
            if r:
                chunk = os.read(fd, 65536)
                if not chunk:
                    raise EOFError("tb_driver exited (rc %s): %s" % (
                        self.proc.poll(), self.proc.stderr.read(4096)))
                self.buf += chunk
        out, self.buf = self.buf.split(b"\n", 1)
        return out.decode()

    def send(self, cmd):
        self.proc.stdin.write(cmd.encode() + b"\n")
        self.proc.stdin.flush()

    def raw(self, cmd, timeout=10.0):
        self.send(cmd)
        return self.line(timeout)

    def cmd(self, cmd, timeout=10.0):
        """Run a command that must succeed; its answer as a dict."""
        out = self.raw(cmd, timeout)
        assert out.startswith("ok"), "%s -> %s" % (cmd[:200], out)
        return parse_kv(out)

    def take(self, key, *buckets, now=None, timeout=10.0):
        """take KEY CAP RATE COST [ROUTE CAP RATE COST ...]"""
        parts = ["take" if now is None else "take_at %d" % now, pct(key)]
        parts += [repr(b) if isinstance(b, float) else str(b)
                  for b in buckets]
        return self.cmd(" ".join(parts), timeout)

    def stats(self):
        return self.cmd("stats")

    def breaker(self):
        return self.cmd("breaker")["state"]

    def stop(self):
        if self.proc.poll() is None:
            try:
                self.send("quit")
                self.proc.wait(timeout=5)
            except (OSError, subprocess.TimeoutExpired):
                pass
        stop_pid(self.proc, signal.SIGKILL)
        for f in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            try:
                f.close()
            except OSError:
                pass


def tsv_rows(path):
    """The fields of each row of a vector table: every line that is not
    blank or a # comment, split at tabs."""
    with open(path) as f:
        for line in f:
            line = line.rstrip("\n")
            if line and not line.startswith("#"):
                yield line.split("\t")


def load_vectors(path=VECTORS):
    """A vector table (token_bucket.tsv's layout): a list of (id, now_ms,
    buckets, verdict). In SETTLE_VECTORS a bucket's "cost" is its delta."""
    cols = ("id i exists tokens ts_ms now_ms capacity rate_per_sec cost "
            "allowed remaining retry_ms binding new_tokens new_ts_ms "
            "ttl_ms").split()
    vecs = []
    for parts in tsv_rows(path):
        assert len(parts) == len(cols), parts
        row = dict(zip(cols, parts))
        b = {
            "exists": row["exists"] == "1",
            "tokens": None if row["tokens"] == "-"
            else float(row["tokens"]),
            "ts_ms": None if row["ts_ms"] == "-" else int(row["ts_ms"]),
            "capacity": float(row["capacity"]),
            "rate": float(row["rate_per_sec"]),
            "cost": float(row["cost"]),
            "new_tokens": float(row["new_tokens"]),
            "new_ts_ms": int(row["new_ts_ms"]),
            "ttl_ms": int(row["ttl_ms"]),
        }
        verdict = [int(row[k]) for k in
                   ("allowed", "remaining", "retry_ms", "binding")]
        if int(row["i"]) == 0:
            vecs.append((row["id"], int(row["now_ms"]), [b], verdict))
        else:
            vid, now, buckets, v = vecs[-1]
            assert vid == row["id"] and now == int(row["now_ms"])
            assert v == verdict and len(buckets) == int(row["i"])
            buckets.append(b)
    return vecs


def put_buckets(r, keys, buckets):
    """Write each existing bucket's state (a load_vectors bucket) as the
    token-bucket script stores it; delete the others."""
    for k, b in zip(keys, buckets):
        r.delete(k)
        if b["exists"]:
            r.hset(k, mapping={"tokens": num(b["tokens"]),
                               "ts": str(b["ts_ms"])})


def vector_argv(buckets):
    """A vector's buckets as the script's arguments after now: capacity,
    rate and cost of each."""
    argv = []
    for b in buckets:
        argv += [num(b["capacity"]), num(b["rate"]), num(b["cost"])]
    return argv


def eval_vector(r, vec, tag, *mode):
    """Run vector vec (a load_vectors row) through EVAL of the script text
    with its injected now (and the optional mode argument, "settle"), on
    keys tag:{id}:i that hold the vector's states before; asserts that the
    reply is the vector's verdict and returns the keys."""
    vid, now, buckets, verdict = vec
    keys = ["%s:{%s}:%d" % (tag, vid, i) for i in range(len(buckets))]
    put_buckets(r, keys, buckets)
    argv = [str(now)] + vector_argv(buckets) + list(mode)
    reply = r.eval(script_text(), len(keys), *(keys + argv))
    assert [int(x) for x in reply] == verdict, vid
    return keys


def vector_take(prefix, client, buckets):
    """A vector's buckets as one decision of the client for client key
    `client`: the main bucket, then routes r1, r2... Returns the Redis
    keys the client must use and the driver's words after the key
    (CAP RATE COST [ROUTE CAP RATE COST ...])."""
    keys, words = [], []
    for i, b in enumerate(buckets):
        route = "r%d" % i if i else None
        keys.append(redis_key(prefix, client, route))
        words += ([route] if route else []) + vector_argv([b])
    return keys, " ".join(words)


def num(x):
    """A double as the shortest string that reads back to the same value."""
    return repr(float(x))


def info_commandstats(r):
    """{'evalsha': calls, ...} from INFO commandstats."""
    out = {}
    for k, v in r.info("commandstats").items():
        if k.startswith("cmdstat_"):
            out[k[len("cmdstat_"):]] = int(v["calls"])
    return out


def script_calls(r):
    """The script calls (EVALSHA and EVAL) r, a redis-py client, has
    answered, from INFO commandstats."""
    s = info_commandstats(r)
    return s.get("evalsha", 0) + s.get("eval", 0)




def check_after(r, keys, buckets, verdict, vid, slack_ms=1000):
    """The hash and its TTL after the call: written only when allowed.
    slack_ms: how long before this check the call may have been made."""
    for i, (k, b) in enumerate(zip(keys, buckets)):
        h = r.hgetall(k)
        pttl = r.pttl(k)
        if verdict[0] == 1:
            assert float(h[b"tokens"]) == b["new_tokens"], (vid, i, h)
            assert int(h[b"ts"]) == b["new_ts_ms"], (vid, i, h)
            # PTTL counts down in real time from the TTL just set.
            assert b["ttl_ms"] - slack_ms < pttl <= b["ttl_ms"], \
                (vid, i, pttl)
        elif b["exists"]:
            assert float(h[b"tokens"]) == b["tokens"], (vid, i, h)
            assert int(h[b"ts"]) == b["ts_ms"], (vid, i, h)
            assert pttl == -1, (vid, i, pttl)
        else:
            assert h == {} and pttl == -2, (vid, i, h, pttl)
