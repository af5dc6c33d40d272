"""tbtest/ha.py -- Redis Sentinel and Redis Cluster rigs for the HA tests.

Real servers only: redis-server as primary, replica, sentinel
(`redis-server sentinel.conf --sentinel`, on a writable copy it rewrites)
and cluster node (`--cluster-enabled yes`, joined with `redis-cli --cluster
create`). Every port is a free loopback port, every process is stopped by
PID at teardown, and every wait is bounded.
"""
import os
import signal
import subprocess
import time

from tbtest.env import (REDIS_SERVER, Redis, free_port, require, stop_pid,
                        wait_port)

REDIS_CLI = "/usr/bin/redis-cli"
MASTER = "mymaster"


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
    """A primary, one replica and three sentinels (quorum 2)."""

    def __init__(self, tmp_path, down_after_ms=1000):
        require(REDIS_SERVER, "redis-server")
        self.primary = Redis(tmp_path / "primary")
        self.replica = Redis(tmp_path / "replica")
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

        def settled():
            for s in self.sentinels:
                m = s.client().execute_command("SENTINEL", "MASTER", MASTER)
                m = dict(zip(m[::2], m[1::2]))
                if (int(m["num-other-sentinels"]) != 2
                        or int(m["num-slaves"]) != 1):
                    return False
            return True
        # Sentinels find each other through hello messages every ~2 s.
        bounded(settled, 15, step=0.1, what="sentinels discovering")
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
    """N primaries (and as many replicas with replicas=1)."""

    def __init__(self, tmp_path, primaries=3, replicas=0,
                 node_timeout_ms=2000):
        require(REDIS_SERVER, "redis-server")
        require(REDIS_CLI, "redis-tools")
        self.nodes = [ClusterNode(tmp_path / ("node%d" % i), node_timeout_ms)
                      for i in range(primaries * (1 + replicas))]
        self.replicas = replicas

    def start(self):
        for n in self.nodes:
            n.start()
        cmd = [REDIS_CLI, "--cluster", "create"]
        cmd += ["127.0.0.1:%d" % n.port for n in self.nodes]
        cmd += ["--cluster-replicas", str(self.replicas), "--cluster-yes"]
        out = subprocess.run(cmd, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, timeout=30)
        assert out.returncode == 0, out.stdout.decode()[-2000:]

        def ok():
            for n in self.nodes:
                info = n.cluster("INFO")
                if "cluster_state:ok" not in info:
                    return False
                rows = self.slots(n)
                if self.replicas and (len(rows) < 3 or any(
                        len(r[3]) < self.replicas for r in rows)):
                    return False
            return True
        bounded(ok, 20, step=0.1, what="cluster_state:ok on every node")
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

    def by_port(self, port):
        for n in self.nodes:
            if n.port == port:
                return n
        raise KeyError(port)

    def node_id(self, node):
        return node.cluster("MYID")

    def stop(self):
        for n in self.nodes:
            n.stop()


def kill9(redis):
    """SIGKILL a redis-server we started and reap it."""
    if redis.proc and redis.proc.poll() is None:
        os.kill(redis.proc.pid, signal.SIGKILL)
        redis.proc.wait(timeout=5)
