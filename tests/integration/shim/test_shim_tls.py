"""test_shim_tls.py -- the shim and the tbucket tool over TLS to Redis.

A real TLS redis-server that asks for client certificates (tbtls.py): the
shim's outbound bucket is kept over rediss:// with tls_ca, tls_cert and
tls_key from its config, also across fork (the child makes its own TLS
connection, never speaks on its parent's); a wrong CA is answered by the
policy; tls_verify = false is warned about; a bad TLS file is reported
like any bad config (unlimited, or refused under strict). The tool takes
--tls-* flags or its config's tls_* settings and reports a TLS failure.
"""
import os
import subprocess

from tbtest.env import BUILD
from tbtest.shim import cli, errs, shim_env, write_conf

TOOL = os.path.join(BUILD, "tbucket")


def rule(port, capacity=3):
    return ('outbound = ( { name = "db"; host = "127.0.0.1"; port = %d; '
            'capacity = %d; rate = "1/h"; } );' % (port, capacity))


def tls_settings(pki, **extra):
    s = {"tls_ca": pki.ca_pem, "tls_cert": pki.client_pem,
         "tls_key": pki.client_key}
    s.update(extra)
    return s


# Mutual TLS from the shim's config: exactly `capacity` connects pass and
# the bucket is in the TLS Redis; a forked child reconnects on its own
# TLS connection (its Redis socket differs from its parent's).
def test_shim_400_01(tls_redis, pki, downstream, progs, tmp_path):
    r = tls_redis(auth_clients="yes")
    conf = write_conf(tmp_path / "s.conf", r, rule(downstream.port),
                      **tls_settings(pki))
    (s,), err = cli(progs, ["127.0.0.1", downstream.port, 5],
                    shim_env(conf))
    assert s["ok"] == 3 and errs(s) == {"ECONNREFUSED": 2}, (s, err)
    assert r.client().hget("tb:shim:out:db:{db}", "tokens") is not None
    r.client().delete("tb:shim:out:db:{db}")
    conf = write_conf(tmp_path / "f.conf", r, rule(downstream.port, 100),
                      **tls_settings(pki))
    lines, err = cli(progs, ["-F", "-R", r.port, "127.0.0.1",
                             downstream.port, 3], shim_env(conf))
    child = [l for l in lines if l["who"] == "child"][0]
    parent = [l for l in lines if l["who"] == "parent"][0]
    assert child["ok"] == 3 and parent["ok"] == 2, lines
    tokens = float(r.client().hget("tb:shim:out:db:{db}", "tokens"))
    assert 94.9 < tokens < 95.1, tokens
    assert parent["redis_ports"] and child["redis_ports"], lines
    assert not (set(str(parent["redis_ports"]).split(","))
                & set(str(child["redis_ports"]).split(","))), lines
    assert err == "", err


# A CA that did not sign the server's certificate: the closed policy
# refuses every connect; tls_verify = false lets them through by the
# bucket and is warned about on stderr.
def test_shim_400_02(tls_redis, pki, downstream, progs, tmp_path):
    r = tls_redis()
    conf = write_conf(tmp_path / "bad.conf", r, rule(downstream.port),
                      policy="closed", tls_ca=pki.other_ca_pem,
                      timeout_ms=300, connect_timeout_ms=300)
    (s,), err = cli(progs, ["127.0.0.1", downstream.port, 3],
                    shim_env(conf))
    assert s["ok"] == 0 and errs(s) == {"ECONNREFUSED": 3}, s
    conf = write_conf(tmp_path / "nv.conf", r, rule(downstream.port),
                      tls_verify=False)
    (s,), err = cli(progs, ["127.0.0.1", downstream.port, 4],
                    shim_env(conf))
    assert s["ok"] == 3, s
    assert "tls_verify = false: the Redis server's certificate is not " \
           "checked" in err, err


# A missing TLS file is a bad config: one line naming the setting and
# the file, then unlimited, or exit 78 under strict; TLS settings with a
# plaintext URL likewise.
def test_shim_400_03(tls_redis, pki, downstream, progs, tmp_path):
    r = tls_redis()
    conf = write_conf(tmp_path / "m.conf", r, rule(downstream.port, 1),
                      tls_ca="/nonexistent/ca.pem")
    (s,), err = cli(progs, ["127.0.0.1", downstream.port, 3],
                    shim_env(conf))
    assert s["ok"] == 3, s
    assert ("tls_ca '/nonexistent/ca.pem': No such file or directory; "
            "running unlimited") in err, err
    p = subprocess.run([progs["tb_cli"], "127.0.0.1", str(downstream.port),
                        "1"], env=shim_env(conf, TBUCKET_STRICT=1),
                       capture_output=True, text=True, timeout=30)
    assert p.returncode == 78 and "tls_ca" in p.stderr, p.stderr
    conf = write_conf(tmp_path / "p.conf", None, rule(downstream.port, 1),
                      redis_url="redis://127.0.0.1:%d" % r.port,
                      tls_ca=pki.ca_pem)
    (s,), err = cli(progs, ["127.0.0.1", downstream.port, 2],
                    shim_env(conf))
    assert "need a TLS URL" in err, err


def tool(*args, env=None):
    e = dict(os.environ)
    e.pop("TBUCKET_CONFIG", None)
    e.update(env or {})
    return subprocess.run([TOOL] + list(args), capture_output=True,
                          text=True, timeout=30, env=e)


# The tool over TLS: flags, or the tls_* settings of a shim config; a
# wrong CA is "Redis unavailable" (69) with the TLS reason; --tls-verify
# off warns.
def test_shim_400_04(tls_redis, pki, tmp_path):
    r = tls_redis(auth_clients="yes")
    flags = ["--url", r.url, "--tls-ca", pki.ca_pem, "--tls-cert",
             pki.client_pem, "--tls-key", pki.client_key]
    got = [tool("take", "t", "--capacity", "2", "--rate", "1/h",
                *flags).returncode for _ in range(3)]
    assert got == [0, 0, 75], got
    conf = write_conf(tmp_path / "t.conf", r, "", **tls_settings(pki))
    p = tool("inspect", "t", env={"TBUCKET_CONFIG": conf})
    assert p.returncode == 0 and "tokens=0" in p.stdout, (p.stdout, p.stderr)
    p = tool("take", "t", "--capacity", "2", "--rate", "1/h", "--url",
             r.url, "--tls-ca", pki.other_ca_pem, "--timeout", "500ms")
    assert p.returncode == 69, (p.returncode, p.stderr)
    assert "certificate verify failed" in p.stderr, p.stderr
    p = tool("reset", "t", "--url", r.url, "--tls-verify", "off",
             "--tls-cert", pki.client_pem, "--tls-key", pki.client_key)
    assert p.returncode == 0, p.stderr
    assert "--tls-verify off" in p.stderr, p.stderr
    p = tool("take", "t", "--capacity", "2", "--rate", "1/h", "--url",
             r.url, "--tls-ca", "/nonexistent/ca.pem")
    assert p.returncode != 0 and "tls_ca '/nonexistent/ca.pem'" in p.stderr
