"""test_shim_clients_pg.py -- the shim in front of PostgreSQL: processes of
psql and of PHP with pdo_pgsql (both libpq, which connects non-blocking)
share one outbound `wait` rule written with the defaults, and Postgres
itself counts the connections it received (log_connections)."""
import glob
import os
import pwd
import re
import shutil
import signal
import subprocess
import tempfile
import time
from datetime import datetime

import pytest

from tbtest.env import free_port, require, stop_pid
from tbtest.shim import (PHP, check_shared_limit, php_loop, process_loop,
                         run_workers, script_worker, shim_env, wait_rule,
                         write_conf)

PSQL = "/usr/bin/psql"

PDO_SCRIPT = php_loop(r"""
    try {
        $db = new PDO(getenv("DSN"), "postgres", "",
                      array(PDO::ATTR_TIMEOUT => 15,
                            PDO::ATTR_ERRMODE => PDO::ERRMODE_EXCEPTION));
        if ($db->query("SELECT 1")->fetchColumn() == 1) { $ok++; }
        else { $fail++; }
        $db = null;
    } catch (PDOException $e) {
        $fail++;
        fwrite(STDERR, $e->getMessage() . "\n");
    }
""")

RECEIVED = re.compile(r"^(\S+ \S+) \S+ \[\d+\] LOG:  connection received: "
                      r"host=127\.0\.0\.1 ")


def pg_bin(name):
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/" + name))
    if not found:
        pytest.fail("%s is missing: apt-get install postgresql" % name)
    return found[-1]


class Postgres:
    """A PostgreSQL cluster of our own: initdb in a temp dir, postgres in
    the foreground on a free loopback port (its unix socket in the temp
    dir too), stopped by PID. As root both run as the `postgres` user,
    which owns the temp dir: the server refuses to run as root."""

    def __init__(self):
        self.dir = tempfile.mkdtemp(prefix="tbpg-", dir="/tmp")
        self.port = free_port()
        self.log = os.path.join(self.dir, "postgres.log")
        self.as_user = {}
        if os.geteuid() == 0:
            try:
                pw = pwd.getpwnam("postgres")
            except KeyError:
                pytest.fail("no postgres user: apt-get install postgresql")
            os.chown(self.dir, pw.pw_uid, pw.pw_gid)
            self.as_user = {"user": pw.pw_uid, "group": pw.pw_gid}
        self.proc = None

    def start(self):
        data = os.path.join(self.dir, "data")
        p = subprocess.run(
            [pg_bin("initdb"), "-D", data, "-U", "postgres", "--auth=trust",
             "--no-sync", "--locale=C", "-E", "UTF8"], cwd=self.dir,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            timeout=120, **self.as_user)
        assert p.returncode == 0, p.stdout
        with open(self.log, "w") as out:
            self.proc = subprocess.Popen(
                [pg_bin("postgres"), "-D", data, "-p", str(self.port),
                 "-k", self.dir, "-c", "listen_addresses=127.0.0.1",
                 "-c", "log_connections=on", "-c", "fsync=off",
                 "-c", "max_connections=100", "-c", "shared_buffers=16MB"],
                cwd=self.dir, stdout=out, stderr=subprocess.STDOUT,
                **self.as_user)
        # Ask over the unix socket, so that the readiness checks are not
        # among the TCP connections the test counts.
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError("postgres exited: " + self.read_log())
            r = subprocess.run([pg_bin("pg_isready"), "-h", self.dir, "-p",
                                str(self.port), "-U", "postgres"],
                               stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL, timeout=10)
            if r.returncode == 0:
                return self
            time.sleep(0.1)
        raise RuntimeError("postgres did not start: " + self.read_log())

    def read_log(self):
        with open(self.log, errors="replace") as f:
            return f.read()

    def received(self):
        """Times of the TCP connections the server received, in order."""
        return [datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S.%f")
                for m in map(RECEIVED.match, self.read_log().splitlines())
                if m]

    def stop(self):
        # SIGINT is Postgres's fast shutdown.
        stop_pid(self.proc, signal.SIGINT, timeout=20)
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture
def postgres():
    require(PSQL, "postgresql")
    pg = Postgres().start()
    yield pg
    pg.stop()


# test_shim_340_01 (slow, ~4.5 s of load): three psql loops and four PHP
# processes with pdo_pgsql connect to Postgres for 4 s under one outbound
# rule `capacity = 5; rate = "5/s"; on_limit = "wait"`, nothing else
# set. Every connect waits for its token instead of failing, and the
# connections Postgres received stay within capacity + rate x T and reach
# at least 0.9 of it (the clients offer more than the rate all along).
@pytest.mark.slow
def test_shim_340_01(redis_server, postgres, tmp_path):
    require(PHP, "php-cli")
    # A low rate: on a loaded 2-core machine one PDO connect took 200 ms
    # (5/s per process), and the clients must offer more than the rate.
    capacity, rate, secs, most = 5, 5, 4.0, 100
    conf = write_conf(tmp_path / "s.conf", redis_server,
                      wait_rule("pg", postgres.port, capacity, rate))
    script = tmp_path / "pdo.php"
    script.write_text(PDO_SCRIPT)
    env = shim_env(conf, foreign=True, PGCONNECT_TIMEOUT=15,
                   PGAPPNAME="tbpsql", N=most, SECS=secs,
                   DSN="pgsql:host=127.0.0.1;port=%d;dbname=postgres"
                   % postgres.port)
    psql = [PSQL, "-h", "127.0.0.1", "-p", str(postgres.port), "-U",
            "postgres", "-d", "postgres", "-AXqtc", "SELECT 1"]
    workers = [process_loop(psql, env, most, secs) for _ in range(3)]
    workers += [script_worker([PHP, str(script)], env, 60)
                for _ in range(4)]
    before = len(postgres.received())
    results, took = run_workers(workers, timeout=90)
    times = postgres.received()[before:]
    assert None not in results, results
    for kind, res in (("psql", results[:3]), ("pdo_pgsql", results[3:])):
        ok = sum(r[0] for r in res)
        fail = sum(r[1] for r in res)
        print("\n%s: %d connects ok, %d failed" % (kind, ok, fail))
        assert ok > 0 and fail == 0, (kind, res)
    assert len(times) == sum(r[0] for r in results)
    span = (times[-1] - times[0]).total_seconds() if times else 0.0
    check_shared_limit("postgres (psql + pdo_pgsql)", len(times), capacity,
                       rate, took, span)
    assert redis_server.client().exists("tb:shim:out:pg:{pg}")
