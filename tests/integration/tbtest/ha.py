"""tbtest/ha.py -- Redis Sentinel and Redis Cluster rigs for the HA tests.

Real servers only: redis-server as primary, replica, sentinel
(`redis-server sentinel.conf --sentinel`, on a writable copy it rewrites)
and cluster node (`--cluster-enabled yes`, joined with `redis-cli --cluster
create`), each optionally loading the Redis module (module=PATH: a
`loadmodule` line in every redis-server's config, sentinels aside). Every
port is a free loopback port, every process is stopped by PID at
teardown, and every wait is bounded.
"""
import os
import signal
import subprocess
import time

from tbtest.core import keyslot, redis_key
from tbtest.env import (REDIS_SERVER, Redis, free_port, require, stop_pid,
                        wait_port)
from tbtest.redismod import sanitizer_runtimes

REDIS_CLI = "/usr/bin/redis-cli"
MASTER = "mymaster"


def load_module(redis, so):
    """Make redis (a tbtest.env.Redis not yet started) load the Redis
    module so; a sanitizer build's runtimes are preloaded into that
    redis-server only, as tbtest.redismod.ModRedis does."""
    redis.extra.append("loadmodule %s" % so)
    libs = sanitizer_runtimes(so)
    if libs:
        redis.prefix = ["env", "LD_PRELOAD=" + " ".join(libs),
                        "ASAN_OPTIONS=detect_leaks=0:log_path=%s/asan"
                        % redis.dir,
                        "UBSAN_OPTIONS=print_stacktrace=1:log_path=%s/ubsan"
                        % redis.dir] + list(redis.prefix)
    return redis


def bounded(pred, timeout, step=0.05, what="condition"):
    """Poll pred() until it is true; fail the test after timeout s."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        try:
            last = pred()
            if last:
                return last
        except Exception as e:  # a server that is still starting
            last = e
        time.sleep(step)
    raise AssertionError("%s not reached in %.1fs (last: %r)"
                         % (what, timeout, last))


def bounded_all(items, check, timeout, what):
    """bounded(), polling every 0.1 s, until check(x) holds for every x
    of items (the servers of a rig)."""
    return bounded(lambda: all(check(x) for x in items), timeout, step=0.1,
                   what=what)


class Sentinel:
    """One sentinel process watching MASTER."""

    def __init__(self, tmpdir, master_port, down_after_ms=1000):
        self.dir = str(tmpdir)
        os.makedirs(self.dir, exist_ok=True)
        self.port = free_port()
        self.conf = os.path.join(self.dir, "sentinel.conf")
        with open(self.conf, "w") as f:
            f.write("\n".join([
                "bind 127.0.0.1",
                "port %d" % self.port,
                "dir %s" % self.dir,
                "daemonize no",
                "logfile %s" % os.path.join(self.dir, "sentinel.log"),
                "sentinel monitor %s 127.0.0.1 %d 2" % (MASTER, master_port),
                "sentinel down-after-milliseconds %s %d"
                % (MASTER, down_after_ms),
                "sentinel failover-timeout %s 10000" % MASTER,
                "sentinel parallel-syncs %s 1" % MASTER,
            ]) + "\n")
        self.proc = None

    def start(self):
        self.proc = subprocess.Popen([REDIS_SERVER, self.conf, "--sentinel"],
                                     stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL)
        assert wait_port(self.port, 10), "sentinel did not listen"
        return self

    def client(self):
        import redis
        return redis.Redis(host="127.0.0.1", port=self.port,
                           socket_timeout=2, decode_responses=True)

    def master_addr(self):
        """(host, port) this sentinel names now."""
        r = self.client().execute_command(
            "SENTINEL", "get-master-addr-by-name", MASTER)
        return (r[0], int(r[1])) if r else None

    def stop(self):
        stop_pid(self.proc)


class SentinelRig:
    """A primary, one replica and three sentinels (quorum 2); with
    module=PATH both redis-servers load the Redis module, but those named
    in without_module ("primary", "replica")."""

    def __init__(self, tmp_path, down_after_ms=1000, module=None,
                 without_module=()):
        require(REDIS_SERVER, "redis-server")
        self.primary = Redis(tmp_path / "primary")
        self.replica = Redis(tmp_path / "replica")
        for name in ("primary", "replica"):
            if module and name not in without_module:
                load_module(getattr(self, name), module)
        self.sentinels = []
        self.tmp = tmp_path
        self.down_after_ms = down_after_ms

    def start(self):
        self.primary.start()
        self.replica.extra.append("replicaof 127.0.0.1 %d" % self.primary.port)
        self.replica.start()
        bounded(lambda: self.replica.client().info("replication")
                .get("master_link_status") == "up", 10, what="replica sync")
        for i in range(3):
            self.sentinels.append(Sentinel(self.tmp / ("sentinel%d" % i),
                                           self.primary.port,
                                           self.down_after_ms).start())

        def settled(s):
            m = s.client().execute_command("SENTINEL", "MASTER", MASTER)
            m = dict(zip(m[::2], m[1::2]))
            return (int(m["num-other-sentinels"]) == 2
                    and int(m["num-slaves"]) == 1)
        # Sentinels find each other through hello messages every ~2 s.
        bounded_all(self.sentinels, settled, 15, "sentinels discovering")
        return self

    @property
    def url(self):
        return "redis-sentinel://%s/%s" % (
            ",".join("127.0.0.1:%d" % s.port for s in self.sentinels), MASTER)

    def node(self, port):
        """The Redis object (primary or replica) listening on port."""
        return self.primary if self.primary.port == port else self.replica

    def stop(self):
        for s in self.sentinels:
            s.stop()
        self.replica.stop()
        self.primary.stop()


def cluster_port():
    """A free port P <= 55535 whose bus port P + 10000 is free too."""
    import socket
    for _ in range(200):
        p = free_port()
        if p > 55535:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("127.0.0.1", p + 10000))
            except OSError:
                continue
        return p
    raise AssertionError("no free cluster port pair")


class ClusterNode(Redis):
    """A redis-server with cluster mode on."""

    def __init__(self, tmpdir, node_timeout_ms=2000):
        super().__init__(tmpdir, port=cluster_port(), extra=[
            "cluster-enabled yes",
            "cluster-config-file nodes.conf",
            "cluster-node-timeout %d" % node_timeout_ms,
        ])

    def cluster(self, *args):
        return self.client(decode_responses=True).execute_command(
            "CLUSTER", *args)


class ClusterRig:
    """N primaries (and as many replicas with replicas=1); with
    module=PATH every node loads the Redis module, but those whose index
    in nodes is in without_module."""

    def __init__(self, tmp_path, primaries=3, replicas=0,
                 node_timeout_ms=2000, module=None, without_module=()):
        require(REDIS_SERVER, "redis-server")
        require(REDIS_CLI, "redis-tools")
        self.nodes = [ClusterNode(tmp_path / ("node%d" % i), node_timeout_ms)
                      for i in range(primaries * (1 + replicas))]
        self.replicas = replicas
        for i, n in enumerate(self.nodes):
            if module and i not in without_module:
                load_module(n, module)

    def start(self):
        for n in self.nodes:
            n.start()
        cmd = [REDIS_CLI, "--cluster", "create"]
        cmd += ["127.0.0.1:%d" % n.port for n in self.nodes]
        cmd += ["--cluster-replicas", str(self.replicas), "--cluster-yes"]
        out = subprocess.run(cmd, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, timeout=30)
        assert out.returncode == 0, out.stdout.decode()[-2000:]

        def ok(n):
            if "cluster_state:ok" not in n.cluster("INFO"):
                return False
            rows = self.slots(n)
            return not self.replicas or (len(rows) >= 3 and all(
                len(r[3]) >= self.replicas for r in rows))
        bounded_all(self.nodes, ok, 20, "cluster_state:ok on every node")
        return self

    @property
    def url(self):
        # Two seeds: the client must learn the third node from the map.
        return "redis-cluster://%s" % ",".join(
            "127.0.0.1:%d" % n.port for n in self.nodes[:2])

    def slots(self, node=None):
        """[(start, end, primary_port, [replica ports])] from CLUSTER
        SLOTS as one node sees it."""
        node = node or self.nodes[0]
        out = []
        for row in node.cluster("SLOTS"):
            out.append((int(row[0]), int(row[1]), int(row[2][1]),
                        [int(r[1]) for r in row[3:]]))
        return sorted(out)

    def owner(self, slot, node=None):
        for s, e, p, _ in self.slots(node):
            if s <= slot <= e:
                return p
        return None

    def key_on(self, port, prefix="k", tb_prefix="tb:"):
        """A client key whose bucket (tb_prefix{key}) the primary on port
        owns."""
        owners = self.slots()
        for i in range(20000):
            k = "%s%d" % (prefix, i)
            slot = keyslot(redis_key(tb_prefix, k))
            if any(s <= slot <= e and p == port for s, e, p, _ in owners):
                return k
        raise AssertionError("no key for %d" % port)

    def key_in_slot(self, slot, prefix="k", tb_prefix="tb:"):
        """A client key whose bucket is in slot."""
        for i in range(400000):
            k = "%s%d" % (prefix, i)
            if keyslot(redis_key(tb_prefix, k)) == slot:
                return k
        raise AssertionError("no key for slot %d" % slot)

    def by_port(self, port):
        for n in self.nodes:
            if n.port == port:
                return n
        raise KeyError(port)

    def node_id(self, node):
        return node.cluster("MYID")

    def migrate_begin(self, slot, src, dst):
        """The first step of moving slot from src to dst, as redis-cli
        does: dst IMPORTING, then src MIGRATING. src now answers ASK for
        a key of the slot it does not hold."""
        dst.cluster("SETSLOT", slot, "IMPORTING", self.node_id(src))
        src.cluster("SETSLOT", slot, "MIGRATING", self.node_id(dst))

    def migrate_end(self, slot, src, dst):
        """The rest: MIGRATE every key of the slot, then SETSLOT NODE on
        the importing node first, the old owner next and the others, as
        redis-cli does (the other order bounces MOVED between the two for
        a moment)."""
        sc = src.client()
        for _ in range(1000):
            keys = sc.execute_command("CLUSTER", "GETKEYSINSLOT", slot, 100)
            if not keys:
                break
            sc.execute_command("MIGRATE", "127.0.0.1", dst.port, "", 0,
                               5000, "KEYS", *keys)
        did = self.node_id(dst)
        for n in [dst, src] + [n for n in self.nodes if n not in (src, dst)]:
            n.cluster("SETSLOT", slot, "NODE", did)

    def migrate_slot(self, slot, src, dst):
        """Move one slot from src to dst (its keys with it)."""
        self.migrate_begin(slot, src, dst)
        self.migrate_end(slot, src, dst)

    def stop(self):
        for n in self.nodes:
            n.stop()


def follow(d, rig, old_port, deadline_s, sources=("redis", "open"),
           probe="probe"):
    """Decide (tb_driver d) every 20 ms on a new probe key (probe0,
    probe1, ...: give each driver its own probe) until one lands
    on the primary the sentinels of rig name instead of old_port (its
    bucket is there); every answer's source must be in sources. (seconds
    until then, seconds until the sentinels named it, every answer seen).
    A decision Redis made is not enough: a demoted primary keeps
    accepting writes until the sentinels reconfigure it."""
    t0 = time.monotonic()
    seen, named_at, new = [], None, None
    for i in range(int(deadline_s / 0.02)):
        if time.monotonic() - t0 > deadline_s:
            break
        if named_at is None:
            try:
                a = rig.sentinels[0].master_addr()
                if a and a[1] != old_port:
                    named_at, new = time.monotonic() - t0, a[1]
            except Exception:
                pass
        key = "%s%d" % (probe, i)
        r = d.take(key, 1000000, 1000000, 1)
        took = time.monotonic() - t0
        seen.append(r)
        assert r["source"] in sources, r
        if (r["source"] == "redis" and new is not None
                and rig.node(new).client().exists(redis_key("tb:", key))):
            return took, named_at, seen
        time.sleep(0.02)
    raise AssertionError("did not follow in %ss: %r" % (deadline_s, seen[-3:]))


def kill9(redis):
    """SIGKILL a redis-server we started and reap it."""
    if redis.proc and redis.proc.poll() is None:
        os.kill(redis.proc.pid, signal.SIGKILL)
        redis.proc.wait(timeout=5)
