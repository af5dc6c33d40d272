"""test_core_tls.py -- the core's TLS to Redis against real TLS servers.

redis-server with `port 0` and `tls-port`, certificates made by openssl at
test time (tbtls.py): decisions over rediss:// are made by Redis, once per
pooled connection a handshake; mutual TLS works with a client certificate
and fails over to the policy without one; a wrong CA, a wrong server name,
an expired certificate, plain redis:// at the TLS port and rediss:// at a
plaintext port each end in the declared policy within the timeouts, with
the error kind and reason a user sees; a stopped Redis bounds a TLS read
by the command timeout; a restarted Redis is found again;
Sentinel and Cluster speak TLS to every node with ?tls=on. Bad TLS files
are refused when the client is made, naming the setting and the file.
"""
import os
import subprocess
import time

from tbtest.core import Driver
from tbtest.env import Redis, free_port, wait_port, wait_until
from tbtest.ha import MASTER, REDIS_CLI, bounded, cluster_port
from tbtest.tls import TlsRedis

# Failures must end within connect timeout + command timeout and a margin
# for a loaded machine.
CTO_MS, TO_MS = 300, 300
BOUND_S = (CTO_MS + TO_MS) / 1000.0 + 0.7


def lasterr(d):
    """(kind, message) of the driver's client's last error."""
    out = d.raw("lasterr")
    assert out.startswith("ok kind="), out
    kind, _, msg = out[len("ok kind="):].partition(" ")
    return kind, msg


def fails_by_policy(d, kind, policy="closed"):
    """One decision that Redis cannot make: answered by the policy, with
    error kind `kind`, within BOUND_S. The error message."""
    t0 = time.monotonic()
    res = d.take("f", 10, 1, 1)
    wall = time.monotonic() - t0
    assert res["source"] == policy and res["err"] == kind, res
    assert res["allowed"] == (1 if policy == "open" else 0), res
    assert wall < BOUND_S, (wall, res)
    k, msg = lasterr(d)
    assert k == kind, (k, msg)
    return msg


def times_out(d, key, ms, what):
    """d's next take of key waits a timeout of ms and is decided by the
    open policy; the last error it reports starts with what."""
    res = d.take(key, 10, 1, 1)
    assert res["source"] == "open" and res["err"] == "timeout", res
    assert ms * 900 <= res["elapsed_us"] <= ms * 1000 + 250000, res
    kind, msg = lasterr(d)
    assert msg.startswith(what), msg


def start(drivers, url, *args, **opts):
    opts.setdefault("timeout", TO_MS)
    opts.setdefault("connect_timeout", CTO_MS)
    opts.setdefault("breaker_threshold", 100)
    return drivers(url, *args, **opts)


# Decisions over rediss:// with tls_ca are Redis's (the bucket is in
# Redis), and each pooled connection makes one handshake however many
# decisions it carries.
def test_core_040_01(tls_redis, pki, drivers):
    r = tls_redis()
    d = start(drivers, r.url, "--tls-ca", pki.ca_pem, pool=2)
    for k in range(40):
        res = d.take("tls", 100, 0.001, 1)
        assert res["source"] == "redis" and res["err"] == "none", res
        assert res["remaining"] == 99 - k
    assert abs(float(r.client().hget("tb:{tls}", "tokens")) - 60) < 0.1
    assert d.stats()["connects"] <= 2
    # The host name form: "localhost" is the certificate's DNS SAN.
    d2 = start(drivers, "rediss://localhost:%d" % r.port,
               "--tls-ca", pki.ca_pem)
    assert d2.take("tls", 100, 0.001, 1)["source"] == "redis"


# Mutual TLS: with tls_cert and tls_key Redis decides; without them the
# server refuses the client after the handshake and the policy answers,
# kind tls, with the server's alert as the reason.
def test_core_040_02(tls_redis, pki, drivers):
    r = tls_redis(auth_clients="yes")
    d = start(drivers, r.url, "--tls-ca", pki.ca_pem, "--tls-cert",
              pki.client_pem, "--tls-key", pki.client_key)
    assert d.take("m", 10, 1, 1)["source"] == "redis"
    bare = start(drivers, r.url, "--tls-ca", pki.ca_pem, policy="closed")
    msg = fails_by_policy(bare, "tls")
    assert "certificate required" in msg, msg


# A CA that did not sign the server's certificate (and the system store,
# which does not hold the test CA), a tls_server_name the certificate does
# not carry, and an expired certificate: the handshake fails, kind tls,
# the verification error as the reason, the policy answers in time.
def test_core_040_03(tls_redis, pki, drivers):
    r = tls_redis()
    cases = [
        (["--tls-ca", pki.other_ca_pem], "certificate verify failed"),
        ([], "certificate verify failed"),
        (["--tls-ca", pki.ca_pem, "--tls-server-name", "redis.example"],
         "hostname mismatch"),
    ]
    for args, want in cases:
        d = start(drivers, r.url, *args, policy="closed")
        msg = fails_by_policy(d, "tls")
        assert msg.startswith("tls handshake: ") and want in msg, msg
    # An IP address is checked against the IP SANs (127.0.0.1 only).
    other = start(drivers, r.url, "--tls-ca", pki.ca_pem,
                  "--tls-server-name", "127.0.0.2", policy="closed")
    msg = fails_by_policy(other, "tls")
    assert "IP address mismatch" in msg, msg
    expired = tls_redis("expired", cert=pki.expired_pem, key=pki.expired_key)
    d = start(drivers, expired.url, "--tls-ca", pki.ca_pem, policy="closed")
    msg = fails_by_policy(d, "tls")
    assert "certificate has expired" in msg, msg
    # tls_verify off accepts it (encryption without authentication).
    d = start(drivers, expired.url, "--tls-verify", "off")
    assert d.take("v", 10, 1, 1)["source"] == "redis"


# Plain redis:// at a TLS port: Redis drops the connection at its first
# bytes; rediss:// at a plaintext port: the handshake gets no answer and
# times out: connect and handshake together within the connect timeout.
# Both end in the policy in time.
def test_core_040_04(tls_redis, pki, drivers, tmp_path):
    r = tls_redis()
    d = start(drivers, r.plain_url, policy="closed")
    msg = fails_by_policy(d, "io")
    assert "rediss://" in msg, msg
    plain = Redis(tmp_path / "plain").start()
    try:
        d = start(drivers, "rediss://127.0.0.1:%d" % plain.port,
                  "--tls-ca", pki.ca_pem, policy="open",
                  timeout=2000)
        times_out(d, "f", CTO_MS, "tls handshake: timed out")
    finally:
        plain.stop()


# A TLS Redis restarted on the same port: the dead connections fail once
# each, then new ones (new handshakes) decide again.
def test_core_040_05(tls_redis, pki, drivers):
    r = tls_redis()
    d = start(drivers, r.url, "--tls-ca", pki.ca_pem, pool=2)
    for k in range(3):
        assert d.take("rs", 10, 0.001, 1)["source"] == "redis"
    r.stop()
    r.start()
    seen = []

    def ok():
        seen.append(d.take("rs", 10, 0.001, 1))
        return seen[-1]["source"] == "redis"
    assert wait_until(ok, 10, step=0.05), seen[-3:]
    assert len(seen) <= 1 + 2, seen
    assert all(s["err"] in ("io", "none") for s in seen), seen
    assert seen[-1]["remaining"] == 9
    assert d.stats()["connects"] >= 2


# Bad files are refused when the client is made, naming the setting and
# the file; TLS settings with a plaintext URL are refused too.
def test_core_040_06(pki):
    url = "rediss://127.0.0.1:1"
    cases = [
        ([url, "--tls-ca", "/nonexistent/ca.pem"],
         "tls_ca '/nonexistent/ca.pem': No such file or directory"),
        ([url, "--tls-ca", pki.ca_key],
         "tls_ca '%s': no certificate or crl found" % pki.ca_key),
        ([url, "--tls-cert", pki.client_pem],
         "tls_cert '%s': needs tls_key" % pki.client_pem),
        ([url, "--tls-key", pki.client_key],
         "tls_key '%s': needs tls_cert" % pki.client_key),
        ([url, "--tls-cert", pki.client_pem, "--tls-key", pki.server_key],
         "tls_key '%s': does not match tls_cert '%s'"
         % (pki.server_key, pki.client_pem)),
        ([url, "--tls-cert", pki.client_pem, "--tls-key", pki.client_pem],
         "tls_key '%s': not an unencrypted PEM private key"
         % pki.client_pem),
        (["redis://127.0.0.1:1", "--tls-ca", pki.ca_pem],
         "need a TLS URL"),
    ]
    for args, want in cases:
        d = Driver(["--url"] + args)
        try:
            assert d.ready.startswith("error create: "), d.ready
            assert want in d.ready, (want, d.ready)
        finally:
            d.stop()


def tls_conf(pki):
    return ["tls-cert-file %s" % pki.server_pem,
            "tls-key-file %s" % pki.server_key,
            "tls-ca-cert-file %s" % pki.ca_pem,
            "tls-auth-clients no"]


# Sentinel over TLS (?tls=on): the sentinel is asked over TLS and names a
# TLS primary, which decides; without ?tls=on the sentinel is unreachable
# and the policy answers.
def test_core_040_07(tls_redis, pki, drivers, tmp_path):
    primary = tls_redis("primary")
    d = str(tmp_path / "sentinel")
    os.makedirs(d)
    port = free_port()
    conf = os.path.join(d, "sentinel.conf")
    with open(conf, "w") as f:
        f.write("\n".join(["bind 127.0.0.1", "port 0", "tls-port %d" % port,
                           "tls-replication yes", "dir %s" % d,
                           "daemonize no", "logfile %s/s.log" % d,
                           "sentinel monitor %s 127.0.0.1 %d 1"
                           % (MASTER, primary.port)] + tls_conf(pki)) + "\n")
    proc = subprocess.Popen(["/usr/bin/redis-server", conf, "--sentinel"],
                            stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        assert wait_port(port, 10)
        url = "redis-sentinel://127.0.0.1:%d/%s" % (port, MASTER)
        t = start(drivers, url + "?tls=on", "--tls-ca", pki.ca_pem)
        res = t.take("s", 10, 0.001, 1)
        assert res["source"] == "redis" and res["remaining"] == 9, res
        tokens = float(primary.client().hget("tb:{s}", "tokens"))
        assert abs(tokens - 9) < 0.1
        plain = start(drivers, url, policy="closed")
        msg = fails_by_policy(plain, "io")
        assert msg.startswith("sentinel 127.0.0.1:%d" % port), msg
    finally:
        proc.terminate()
        proc.wait(timeout=10)


# Cluster over TLS (?tls=on, tls-cluster yes): the slot map comes over
# TLS and every node (two seeds, the third learnt from the map) decides
# over TLS.
def test_core_040_08(pki, drivers, tmp_path):
    nodes = []
    try:
        for i in range(3):
            n = TlsRedis(tmp_path / ("node%d" % i), pki, port=cluster_port(),
                         extra=["cluster-enabled yes", "tls-cluster yes",
                                "cluster-config-file nodes.conf",
                                "cluster-node-timeout 2000"])
            nodes.append(n.start())
        out = subprocess.run(
            [REDIS_CLI, "--tls", "--cacert", pki.ca_pem, "--cluster",
             "create"] + ["127.0.0.1:%d" % n.port for n in nodes]
            + ["--cluster-yes"], stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, timeout=30)
        assert out.returncode == 0, out.stdout.decode()[-2000:]
        bounded(lambda: all(b"cluster_state:ok" in n.client()
                            .execute_command("CLUSTER", "INFO")
                            for n in nodes), 20, what="TLS cluster ok")
        url = "redis-cluster://%s?tls=on" % ",".join(
            "127.0.0.1:%d" % n.port for n in nodes[:2])
        d = start(drivers, url, "--tls-ca", pki.ca_pem)
        keys = ["k%d" % i for i in range(30)]
        for k in keys:
            res = d.take(k, 10, 1, 1)
            assert res["source"] == "redis", res
        held = sum(n.client().dbsize() for n in nodes)
        assert held == len(keys)
        assert all(n.client().dbsize() > 0 for n in nodes)
    finally:
        for n in nodes:
            n.stop()


# Redis stopped (SIGSTOP) under an open TLS connection: the decision's
# read (one blocking recv under SO_RCVTIMEO, inside SSL_read) gives up at
# the command timeout, kind timeout, and the policy answers; the next
# decision's fresh connection times out in its handshake within the
# connect timeout; after SIGCONT Redis decides again.
def test_core_040_09(tls_redis, pki, drivers):
    r = tls_redis()
    d = start(drivers, r.url, "--tls-ca", pki.ca_pem, pool=1)
    assert d.take("st", 10, 1, 1)["source"] == "redis"
    r.sigstop()
    try:
        times_out(d, "st", TO_MS, "tls read: ")
        times_out(d, "st", CTO_MS, "tls handshake: timed out")
    finally:
        r.sigcont()
    assert wait_until(
        lambda: d.take("st", 10, 1, 1)["source"] == "redis", 10, step=0.05)
