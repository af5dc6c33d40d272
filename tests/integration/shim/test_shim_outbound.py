"""test_shim_outbound.py -- outbound rules: connect() limited by a shared
bucket, with real programs (a C client, curl, php-cgi) under LD_PRELOAD."""
import time

import pytest

from tbtest.shim import (CURL, PHP_CGI, Proc, bucket, cli, errs, out_rule,
                         outbound, plain_env, require, run,
                         shim_env, write_conf)


# test_shim_200_01: `fail` lets exactly `capacity` connects through, then
# refuses with ECONNREFUSED; the bucket lives in Redis under the rule name.
def test_shim_200_01(redis_server, downstream, progs, tmp_path):
    conf = write_conf(tmp_path / "s.conf", redis_server,
                      outbound(out_rule(downstream.port)))
    (s,), err = cli(progs, ["-r", "127.0.0.1", downstream.port, 10],
                    shim_env(conf))
    assert s["ok"] == 3 and s["served"] == 3
    assert s["fail"] == 7 and errs(s) == {"ECONNREFUSED": 7}
    assert s["clobbered"] == 0            # errno kept across shim work
    b = bucket(redis_server, "tb:shim:out:db:{db}")
    assert 0 <= b["tokens"] < 1
    assert err == ""


# test_shim_200_02: a configured errno is what a refused connect returns.
def test_shim_200_02(redis_server, downstream, progs, tmp_path):
    conf = write_conf(tmp_path / "s.conf", redis_server, outbound(
        out_rule(downstream.port, capacity=1, errno="ETIMEDOUT")))
    (s,), _ = cli(progs, ["127.0.0.1", downstream.port, 4], shim_env(conf))
    assert s["ok"] == 1 and errs(s) == {"ETIMEDOUT": 3}


# test_shim_200_03: `wait` sleeps the retry-after and lets every connect
# through, paced at the refill rate.
def test_shim_200_03(redis_server, downstream, progs, tmp_path):
    conf = write_conf(tmp_path / "s.conf", redis_server, outbound(
        out_rule(downstream.port, capacity=2, rate="20/s", on_limit="wait",
                 max_wait_ms=2000)))
    t0 = time.monotonic()
    (s,), _ = cli(progs, ["127.0.0.1", downstream.port, 10], shim_env(conf))
    took = time.monotonic() - t0
    assert s["ok"] == 10 and s["fail"] == 0
    # 8 connects beyond the burst at 20/s: at least 0.4 s minus rounding.
    assert 0.3 <= took < 5.0, took


# test_shim_200_04: `wait` gives up at once when the wait would overrun
# max_wait_ms, with the rule's errno, and never sleeps past the bound.
def test_shim_200_04(redis_server, downstream, progs, tmp_path):
    conf = write_conf(tmp_path / "s.conf", redis_server, outbound(
        out_rule(downstream.port, capacity=1, rate="1/s", on_limit="wait",
                 max_wait_ms=200)))
    (s,), _ = cli(progs, ["127.0.0.1", downstream.port, 4], shim_env(conf))
    assert s["ok"] == 1 and errs(s) == {"ECONNREFUSED": 3}
    assert s["maxlat_us"] < 250000


# test_shim_200_05: `nonblocking = "fail"` (for event loops) never puts a
# non-blocking socket to sleep: a `wait` rule refuses at once with EAGAIN.
def test_shim_200_05(redis_server, downstream, progs, tmp_path):
    conf = write_conf(tmp_path / "s.conf", redis_server, outbound(
        out_rule(downstream.port, capacity=2, rate="1/s", on_limit="wait",
                 max_wait_ms=3000, nonblocking="fail")))
    (s,), _ = cli(progs, ["-n", "127.0.0.1", downstream.port, 6],
                  shim_env(conf))
    assert s["ok"] == 2 and errs(s) == {"EAGAIN": 4}
    assert s["elapsed_ms"] < 500


# test_shim_200_06: by default on_limit decides for a non-blocking socket
# as for a blocking one (programs that use O_NONBLOCK only to time the
# connect): `wait` waits, and `fail` fails with the rule's errno.
def test_shim_200_06(redis_server, downstream, progs, tmp_path):
    conf = write_conf(tmp_path / "s.conf", redis_server, outbound(
        out_rule(downstream.port, capacity=1, rate="20/s", on_limit="wait",
                 max_wait_ms=2000)))
    (s,), _ = cli(progs, ["-n", "127.0.0.1", downstream.port, 5],
                  shim_env(conf))
    assert s["ok"] == 5
    assert s["elapsed_ms"] >= 150
    conf = write_conf(tmp_path / "f.conf", redis_server, outbound(
        out_rule(downstream.port, name="f", capacity=1, on_limit="fail")))
    (s,), _ = cli(progs, ["-n", "127.0.0.1", downstream.port, 3],
                  shim_env(conf))
    assert s["ok"] == 1 and errs(s) == {"ECONNREFUSED": 2}


# test_shim_200_07: curl run in a loop, one process each, shares one
# bucket across processes; refused runs fail to connect (exit 7).
def test_shim_200_07(redis_server, http_downstream, tmp_path):
    require(CURL, "curl")
    conf = write_conf(tmp_path / "s.conf", redis_server, outbound(
        out_rule(http_downstream.port, capacity=3)))
    codes = []
    for _ in range(8):
        p = run([CURL, "-s", "-o", "/dev/null", "--max-time", "5",
                 "http://127.0.0.1:%d/" % http_downstream.port],
                shim_env(conf, foreign=True), timeout=20, check=False)
        codes.append(p.returncode)
    assert codes.count(0) == 3
    assert codes.count(7) == 5, codes


# test_shim_200_08: curl (which connects non-blocking) under a `wait` rule
# with the default settings waits for its token instead of failing; the
# runs are paced by the refill rate.
def test_shim_200_08(redis_server, http_downstream, tmp_path):
    require(CURL, "curl")
    conf = write_conf(tmp_path / "s.conf", redis_server, outbound(
        out_rule(http_downstream.port, capacity=1, rate="5/s",
                 on_limit="wait", max_wait_ms=3000)))
    t0 = time.monotonic()
    for _ in range(4):
        p = run([CURL, "-s", "--max-time", "5",
                 "http://127.0.0.1:%d/" % http_downstream.port],
                shim_env(conf, foreign=True), timeout=20)
        assert p.stdout == "OK\n"
    # 3 tokens beyond the first at 5/s: about 0.6 s.
    assert time.monotonic() - t0 >= 0.45


PHP_SCRIPT = r"""<?php
$port = (int)getenv("DOWN_PORT");
$n = (int)getenv("DOWN_N");
$ok = 0; $fail = 0;
for ($i = 0; $i < $n; $i++) {
    $s = @fsockopen("127.0.0.1", $port, $en, $es, 2);
    if ($s) { $ok++; fclose($s); } else { $fail++; }
}
echo "who=php ok=$ok fail=$fail\n";
"""


# test_shim_200_09: php-cgi running a script that opens sockets to the
# protected downstream is limited the same way, and shares the bucket with
# other programs under the same rule.
def test_shim_200_09(redis_server, downstream, progs, tmp_path):
    require(PHP_CGI, "php-cgi")
    conf = write_conf(tmp_path / "s.conf", redis_server,
                      outbound(out_rule(downstream.port, capacity=6)))
    script = tmp_path / "down.php"
    script.write_text(PHP_SCRIPT)
    env = shim_env(conf, foreign=True, DOWN_PORT=downstream.port, DOWN_N=5)
    p = run([PHP_CGI, "-q", str(script)], env, timeout=30)
    assert "who=php ok=5 fail=0" in p.stdout, p.stdout + p.stderr
    p = run([PHP_CGI, "-q", str(script)], env, timeout=30)
    assert "who=php ok=1 fail=4" in p.stdout, p.stdout + p.stderr
    (s,), _ = cli(progs, ["127.0.0.1", downstream.port, 2], shim_env(conf))
    assert s["ok"] == 0


# test_shim_200_10: IPv6 destinations match, and a hostname in a rule is
# resolved at load time ("localhost" covers 127.0.0.1 and ::1).
def test_shim_200_10(redis_server, progs, tmp_path):
    srv6 = Proc([progs["tb_srv"], "-a", "::1"], plain_env())
    try:
        conf = write_conf(tmp_path / "s.conf", redis_server, outbound(
            out_rule(srv6.port, host="::1", capacity=2),
            out_rule(srv6.port + 1 if srv6.port < 65535 else 1,
                     name="other", host="localhost", capacity=1)))
        (s,), _ = cli(progs, ["::1", srv6.port, 5], shim_env(conf))
        assert s["ok"] == 2 and errs(s) == {"ECONNREFUSED": 3}
    finally:
        srv6.stop()
    srv4 = Proc([progs["tb_srv"]], plain_env())
    try:
        conf = write_conf(tmp_path / "h.conf", redis_server, outbound(
            out_rule(srv4.port, name="byname", host="localhost",
                     capacity=2)))
        (s,), _ = cli(progs, ["127.0.0.1", srv4.port, 5], shim_env(conf))
        assert s["ok"] == 2
        assert bucket(redis_server, "tb:shim:out:byname:{byname}")
    finally:
        srv4.stop()


# test_shim_200_11: key "$program" gives each program its own bucket.
def test_shim_200_11(redis_server, downstream, progs, tmp_path):
    conf = write_conf(tmp_path / "s.conf", redis_server, outbound(
        out_rule(downstream.port, capacity=2, key="$program")))
    (a,), _ = cli(progs, ["127.0.0.1", downstream.port, 3], shim_env(conf))
    (b,), _ = cli(progs, ["127.0.0.1", downstream.port, 3], shim_env(conf),
                  name="tb_cli2")
    assert a["ok"] == 2 and b["ok"] == 2
    keys = sorted(k.decode() for k in redis_server.client().keys("tb:*"))
    assert keys == ["tb:shim:out:db:{tb_cli2}", "tb:shim:out:db:{tb_cli}"]


# test_shim_200_12: a connect that matches no rule never reaches Redis.
def test_shim_200_12(redis_server, downstream, progs, tmp_path):
    other = downstream.port + 1 if downstream.port < 65535 else 1
    conf = write_conf(tmp_path / "s.conf", redis_server,
                      outbound(out_rule(other, capacity=1)))
    rc = redis_server.client()
    before = rc.info("stats")["total_connections_received"]
    (s,), err = cli(progs, ["127.0.0.1", downstream.port, 20],
                    shim_env(conf))
    assert s["ok"] == 20
    assert rc.dbsize() == 0
    assert rc.info("stats")["total_connections_received"] == before
    assert err == ""


# test_shim_200_13: the system calls of an unmatched connect() are the
# program's own: strace sees one connect per call and nothing the shim
# added (no getsockopt, fcntl, getsockname, no socket to Redis).
def test_shim_200_13(redis_server, downstream, progs, tmp_path):
    strace = require("/usr/bin/strace", "strace")
    other = downstream.port + 1 if downstream.port < 65535 else 1
    conf = write_conf(tmp_path / "s.conf", redis_server,
                      outbound(out_rule(other, capacity=1)))
    log = tmp_path / "strace.txt"
    run([strace, "-f", "-o", str(log), "-e",
         "trace=connect,getsockopt,fcntl,getsockname,socket",
         progs["tb_cli"], "127.0.0.1", str(downstream.port), "7"],
        shim_env(conf), timeout=60)
    calls = [l.split("(")[0].split()[-1] for l in log.read_text().splitlines()
             if "(" in l and "resumed" not in l]
    assert calls.count("connect") == 7, calls
    assert calls.count("socket") == 7, calls
    assert not {"getsockopt", "fcntl", "getsockname"} & set(calls), calls


# test_shim_200_30: a rule's `algorithm` picks the script: each algorithm
# admits exactly `capacity` connects from a fresh key, under its own key.
@pytest.mark.parametrize("algo,suffix", [
    ("gcra", ":gcra"), ("fixed-window", ":fwin"),
    ("sliding-window", ":swin"), ("sliding-log", ":slog")])
def test_shim_200_30(redis_server, downstream, progs, tmp_path, algo,
                     suffix):
    conf = write_conf(tmp_path / "s.conf", redis_server, outbound(
        out_rule(downstream.port, algorithm=algo)))
    (s,), err = cli(progs, ["127.0.0.1", downstream.port, 6],
                    shim_env(conf))
    assert s["ok"] == 3 and s["fail"] == 3, s
    assert redis_server.client().exists("tb:shim:out:db:{db}" + suffix)
    assert not redis_server.client().exists("tb:shim:out:db:{db}")
    assert err == ""


# test_shim_200_31: an unknown algorithm is one clear line naming it, and
# the program still runs unlimited.
def test_shim_200_31(redis_server, downstream, progs, tmp_path):
    conf = write_conf(tmp_path / "s.conf", redis_server, outbound(
        out_rule(downstream.port, algorithm="leaky")))
    (s,), err = cli(progs, ["127.0.0.1", downstream.port, 5],
                    shim_env(conf))
    assert s["ok"] == 5
    lines = [l for l in err.splitlines() if l.strip()]
    assert len(lines) == 1 and "leaky" in lines[0] and "algorithm" in lines[0]


LOCALE_HOST = r"""
import locale, os, socket, time
locale.setlocale(locale.LC_ALL, "")
ok = fail = 0
t0 = time.monotonic()
for _ in range(int(os.environ["N"])):
    try:
        socket.create_connection(("127.0.0.1", int(os.environ["PORT"])),
                                 timeout=5).close()
        ok += 1
    except OSError:
        fail += 1
print("ok=%d fail=%d secs=%.3f point=%s" % (
    ok, fail, time.monotonic() - t0, locale.localeconv()["decimal_point"]))
"""


# test_shim_200_32: a host that sets its locale from a German environment
# (setlocale(LC_ALL, ""), as most daemons do) still has its connects
# decided by Redis under a rule whose rate is not a whole number per
# second ("90/m"): before the fix the shim sent "1,5" and every connect
# went to the failure policy (open: all let through).
def test_shim_200_32(redis_server, downstream, tmp_path, locale_dir):
    locpath, name = locale_dir
    conf = write_conf(tmp_path / "s.conf", redis_server, outbound(
        out_rule(downstream.port, rate="90/m")))
    env = shim_env(conf, foreign=True, LOCPATH=locpath, LANG=name,
                   LC_ALL=name, N=8, PORT=downstream.port)
    script = tmp_path / "host.py"
    script.write_text(LOCALE_HOST)
    p = run(["/usr/bin/python3", str(script)], env)
    s = dict(kv.split("=", 1) for kv in p.stdout.split())
    assert s["point"] == ",", s
    # capacity 3, then 1.5 tokens a second.
    assert 3 <= int(s["ok"]) <= 3 + int(1.5 * float(s["secs"])), s
    assert int(s["ok"]) + int(s["fail"]) == 8
    b = bucket(redis_server, "tb:shim:out:db:{db}")
    assert 0 <= b["tokens"] < 1, b
