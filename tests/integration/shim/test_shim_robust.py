"""test_shim_robust.py -- the shim inside hostile hosts: threads, fork,
fork-and-exec, library constructors, daemons that close every fd, bad
configs, and Redis going away under each failure policy."""
import os
import signal
import socket
import subprocess
import time

import pytest

from tbtest.env import free_port
from tbtest.shim import (Proc, bucket, cli, errs, out_rule, outbound, run,
                         shim_env, stderr_lines, write_conf)


def rule(port, **kw):
    """outbound = ( one rule "db" of capacity 10 unless kw says );"""
    return outbound(out_rule(port, **dict({"capacity": 10}, **kw)))


# test_shim_300_01: a threaded client: 8 threads race for 10 tokens; Redis
# decides atomically, so exactly 10 connects pass and nothing crashes.
def test_shim_300_01(redis_server, downstream, progs, tmp_path):
    conf = write_conf(tmp_path / "s.conf", redis_server,
                      rule(downstream.port), pool_size=4)
    (s,), err = cli(progs, ["-t", "8", "127.0.0.1", downstream.port, 20],
                    shim_env(conf))
    assert s["ok"] == 10 and errs(s) == {"ECONNREFUSED": 150}
    assert s["clobbered"] == 0
    assert err == ""


# test_shim_300_02: fork, then the child connects: it never speaks on the
# parent's Redis socket (its own local port), and the parent's connection
# still works afterwards; every decision reached Redis.
def test_shim_300_02(redis_server, downstream, progs, tmp_path):
    conf = write_conf(tmp_path / "s.conf", redis_server,
                      rule(downstream.port, capacity=100))
    lines, err = cli(progs, ["-F", "-R", redis_server.port, "127.0.0.1",
                             downstream.port, 5], shim_env(conf))
    child = [l for l in lines if l["who"] == "child"][0]
    parent = [l for l in lines if l["who"] == "parent"][0]
    assert child["ok"] == 5 and parent["ok"] == 2
    cports = set(str(child["redis_ports"]).split(","))
    pports = set(str(parent["redis_ports"]).split(","))
    assert cports and pports and "" not in cports | pports
    assert not (cports & pports), (cports, pports)
    b = bucket(redis_server, "tb:shim:out:db:{db}")
    assert 92.9 < b["tokens"] < 93.1      # 100 - (1 + 5 + 1)
    assert err == ""


# test_shim_300_03: fork-and-exec: our Redis socket is close-on-exec, so
# an exec'd program holds no socket it did not open.
def test_shim_300_03(redis_server, downstream, progs, tmp_path):
    conf = write_conf(tmp_path / "s.conf", redis_server,
                      rule(downstream.port))
    script = ("import os, socket, subprocess, sys\n"
              "s = socket.create_connection(('127.0.0.1', %d)); s.close()\n"
              "fds = subprocess.run(['/bin/ls', '-l', '/proc/self/fd'],\n"
              "    stdout=subprocess.PIPE, text=True, close_fds=False)"
              ".stdout\n"
              "print(fds)\n" % downstream.port)
    p = run(["/usr/bin/python3", "-c", script], shim_env(conf, foreign=True))
    assert "socket:" not in p.stdout, p.stdout
    assert bucket(redis_server, "tb:shim:out:db:{db}")["tokens"] < 10


# test_shim_300_04: connects made by a library constructor, before main()
# and possibly before the shim's own constructor, are already limited.
def test_shim_300_04(redis_server, downstream, progs, tmp_path):
    conf = write_conf(tmp_path / "s.conf", redis_server,
                      rule(downstream.port, capacity=1))
    p = run([progs["ctor_main"]],
            shim_env(conf, CTOR_PORT=downstream.port, CTOR_N=3))
    assert p.stdout.strip() == "ctor ok=1 fail=2"
    assert p.stderr == ""


def closer(redis, downstream, progs, tmp_path, what, check=True):
    """The closer program (5 connects, every fd closed, `what` -- "file"
    or "sock" -- opened on the old number of our Redis socket, 5 more)
    under a rule of capacity 100; its CompletedProcess."""
    conf = write_conf(tmp_path / "s.conf", redis,
                      rule(downstream.port, capacity=100))
    return run([progs["closer"], "127.0.0.1", str(downstream.port), "5",
                what], shim_env(conf), check=check)


def assert_intact(p, redis):
    """closer's program was served 5 + 5 times, its fd left intact, and
    each connect took a token from Redis."""
    assert "ok1=5 ok2=5 intact=1" in p.stdout, p.stdout + p.stderr
    assert 89.9 < bucket(redis, "tb:shim:out:db:{db}")["tokens"] < 90.1


# test_shim_300_05: a daemon that closes every fd after start, then opens
# a file on the number of our Redis socket: the file is never written, the
# limit still holds, and decisions go on reaching Redis.
def test_shim_300_05(redis_server, downstream, progs, tmp_path):
    p = closer(redis_server, downstream, progs, tmp_path, "file")
    assert_intact(p, redis_server)
    assert len(stderr_lines(p.stderr)) <= 1


# test_shim_300_06: as 300_05, but a socket (a listener) lands on the old
# number: it must not be written to or closed by the shim.
def test_shim_300_06(redis_server, downstream, progs, tmp_path):
    assert_intact(closer(redis_server, downstream, progs, tmp_path, "sock"),
                  redis_server)


# test_shim_300_07: with the shim's fd check off, the core writes into the
# program's socket on the old number and gets EPIPE: the SIGPIPE that
# raises must not kill the host (tb_cli does not ignore SIGPIPE).
def test_shim_300_07(redis_server, downstream, progs, tmp_path):
    p = closer(redis_server, downstream, progs, tmp_path, "sock",
               check=False)
    assert p.returncode == 0, p.returncode
    assert "ok1=5 ok2=5" in p.stdout


# test_shim_300_14: the core must not write into, nor close, a socket the
# program put on its old Redis fd number (verify_fd compares the inode).
def test_shim_300_14(redis_server, downstream, progs, tmp_path):
    assert_intact(closer(redis_server, downstream, progs, tmp_path, "sock"),
                  redis_server)


# test_shim_300_08: the core handles a daemon that put a regular
# file on the old Redis fd number (it checks the fd is still a socket).
def test_shim_300_08(redis_server, downstream, progs, tmp_path):
    assert_intact(closer(redis_server, downstream, progs, tmp_path, "file"),
                  redis_server)


BAD_CONFIGS = [
    # (name, text, line, words in the message)
    ("syntax", 'redis_url = "redis://127.0.0.1:1";\noutbound = ( { port '
     '= ; } );\n', 2, ["syntax error"]),
    ("unknown", 'redis_url = "redis://127.0.0.1:1";\n\nredis_ulr = "x";\n',
     3, ["unknown setting", "redis_ulr"]),
    ("rate", 'outbound = (\n  { name = "db"; port = 5432;\n    capacity '
     '= 10;\n    rate = "ten/s"; }\n);\n', 4, ["rate"]),
    ("errno", 'outbound = ( { port = 1; capacity = 1; rate = 1;\n errno = '
     '"EWHATEVER"; } );\n', 2, ["EWHATEVER"]),
    ("host", 'outbound = ( { port = 1; capacity = 1; rate = 1;\n host = '
     '"no-such-host.invalid"; } );\n', 2, ["cannot resolve"]),
    ("nocap", 'inbound = (\n { port = 80; rate = 1; } );\n', 2,
     ["capacity"]),
]


# test_shim_300_09: an invalid config: exactly one stderr line naming the
# file, the line and the problem; the program runs, unlimited.
@pytest.mark.parametrize("name,text,line,words", BAD_CONFIGS,
                         ids=[c[0] for c in BAD_CONFIGS])
def test_shim_300_09(downstream, progs, tmp_path, name, text, line, words):
    conf = tmp_path / ("%s.conf" % name)
    conf.write_text(text)
    (s,), err = cli(progs, ["127.0.0.1", downstream.port, 5],
                    shim_env(conf))
    assert s["ok"] == 5
    lines = stderr_lines(err)
    assert len(lines) == 1, lines
    assert "%s:%d:" % (conf, line) in lines[0], lines[0]
    for w in words + ["running unlimited"]:
        assert w in lines[0], lines[0]


# test_shim_300_10: a missing config file, and TBUCKET_CONFIG unset: one
# line each, the program runs.
def test_shim_300_10(downstream, progs, tmp_path):
    missing = tmp_path / "nope.conf"
    for env in (shim_env(missing), shim_env(None)):
        (s,), err = cli(progs, ["127.0.0.1", downstream.port, 3], env)
        assert s["ok"] == 3
        lines = stderr_lines(err)
        assert len(lines) == 1 and "running unlimited" in lines[0], lines
    assert str(missing) in cli(progs, ["127.0.0.1", downstream.port, 1],
                               shim_env(missing))[1]


# test_shim_300_11: strict = true with an invalid rule, or TBUCKET_STRICT=1
# with a missing file: the program is refused before main() (exit 78) with
# one line on stderr.
def test_shim_300_11(downstream, progs, tmp_path):
    conf = tmp_path / "strict.conf"
    conf.write_text('strict = true;\noutbound = ( { port = 1;\n capacity '
                    '= 0; rate = 1; } );\n')
    for env in (shim_env(conf),
                shim_env(tmp_path / "nope.conf", TBUCKET_STRICT=1)):
        p = run([progs["tb_cli"], "127.0.0.1", str(downstream.port), "1"],
                env, check=False)
        assert p.returncode == 78
        assert p.stdout == ""
        lines = stderr_lines(p.stderr)
        assert len(lines) == 1 and "refusing to start" in lines[0], lines
    assert "%s:3:" % conf in run(
        [progs["tb_cli"], "127.0.0.1", str(downstream.port), "1"],
        shim_env(conf), check=False).stderr


# test_shim_300_12: the shim's own Redis connection is never counted, even
# when a rule covers the Redis address itself.
def test_shim_300_12(redis_server, downstream, progs, tmp_path):
    conf = write_conf(tmp_path / "s.conf", redis_server,
                      "outbound = (\n"
                      "  { name = \"redis\"; host = \"127.0.0.1\"; port = %d;"
                      " capacity = 1; rate = \"1/h\"; },\n"
                      "  { name = \"db\"; host = \"127.0.0.1\"; port = %d;"
                      " capacity = 3; rate = \"1/h\"; }\n);"
                      % (redis_server.port, downstream.port), pool_size=2)
    (s,), err = cli(progs, ["-t", "2", "127.0.0.1", downstream.port, 5],
                    shim_env(conf))
    assert s["ok"] == 3 and s["fail"] == 7
    keys = [k.decode() for k in redis_server.client().keys("*")]
    assert keys == ["tb:shim:out:db:{db}"]
    assert err == ""


def run_through_outage(redis, progs, port, conf, outage):
    """Connect every 25 ms for 2 s; take Redis away after 0.5 s. Returns the
    summaries before and after (two runs of the client, one process each
    would not share a breaker, so one process spans the outage)."""
    cmd = [progs["tb_cli"], "-d", "25", "-T", "2.0", "127.0.0.1", str(port),
           "400"]
    p = subprocess.Popen(cmd, env=shim_env(conf), stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    try:
        time.sleep(0.5)
        outage()
        out, err = p.communicate(timeout=30)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    from tbtest.shim import parse_kv
    return parse_kv(out.strip().splitlines()[-1]), err


POLICIES = [("open", "stop"), ("closed", "stop"), ("local", "stop"),
            ("open", "sigstop"), ("closed", "sigstop"), ("local", "sigstop")]


# test_shim_300_13: Redis stopped (or frozen by SIGSTOP) mid-run, under each
# failure policy: every connect stays bounded by the timeout and the
# breaker, and the policy decides: open lets all through, closed refuses
# all, local limits on a local bucket of capacity/replicas.
@pytest.mark.slow
@pytest.mark.parametrize("policy,how", POLICIES,
                         ids=["%s-%s" % p for p in POLICIES])
def test_shim_300_13(redis_server, downstream, progs, tmp_path, policy, how):
    # capacity 8: Redis allows the first 8 before the outage (about 20
    # attempts are made in 0.5 s), so "after" behaviour is visible.
    conf = write_conf(tmp_path / "s.conf", redis_server,
                      rule(downstream.port, capacity=8),
                      policy=policy, timeout_ms=50,
                      connect_timeout_ms=50, breaker_threshold=3,
                      breaker_cooldown_ms=500, replicas=2)
    outage = redis_server.stop if how == "stop" else redis_server.sigstop
    try:
        s, err = run_through_outage(redis_server, progs, downstream.port,
                                    conf, outage)
    finally:
        if how == "sigstop":
            redis_server.sigcont()
    attempts = s["ok"] + s["fail"]
    assert attempts >= 30
    # Bounded: the 50 ms command timeout plus the connect timeout, never
    # more, whatever Redis does.
    assert s["maxlat_us"] < 400000, s
    if policy == "open":
        # Only Redis's refusals before the outage failed: at most the 20
        # or so attempts of the first 0.5 s, less the 8 allowed.
        assert s["ok"] >= 28 and s["fail"] <= 16, s
    elif policy == "closed":
        assert s["ok"] == 8
    else:
        # Local bucket: capacity 8 / replicas 2 = 4 more after the outage.
        assert s["ok"] == 8 + 4, s
    assert len(stderr_lines(err)) == 1 and policy in err


# test_shim_300_15: the commented example conf/shim.conf loads cleanly (no
# stderr line) and its outbound rule limits connects to localhost:5432.
def test_shim_300_15(redis_server, progs, tmp_path):
    from tbtest.env import ROOT
    text = open(os.path.join(ROOT, "conf", "shim.conf")).read()
    text = text.replace('redis_url = "redis://127.0.0.1:6379";',
                        'redis_url = "%s";' % redis_server.url)
    conf = tmp_path / "example.conf"
    conf.write_text(text)
    (s,), err = cli(progs, ["-n", "127.0.0.1", "5432", 1], shim_env(conf))
    assert err == ""
    keys = [k.decode() for k in redis_server.client().keys("*")]
    assert keys == ["tb:shim:out:legacy-db:{legacy-db}"]


# test_shim_300_16: a SIGTERM that arrives while the shim is refusing a
# connection is not lost: tb_srv's handler (no SA_RESTART) relies on its
# accept() failing with EINTR, and it exits at once instead of waiting in
# the shim's next accept() for another client. Redis is stopped (SIGSTOP)
# so that the refusal (closed policy) takes the 1 s command timeout and
# the signal surely lands inside it.
def test_shim_300_16(redis_server, progs, tmp_path):
    port = free_port()
    conf = write_conf(tmp_path / "s.conf", redis_server,
                      "inbound = ( { name = \"web\"; port = %d; "
                      "capacity = 5; rate = \"1/s\"; } );" % port,
                      policy="closed", timeout_ms=1000)
    srv = Proc([progs["tb_srv"], "-p", str(port)], shim_env(conf))
    redis_pid = redis_server.proc.pid
    os.kill(redis_pid, signal.SIGSTOP)
    try:
        c = socket.create_connection(("127.0.0.1", port), timeout=5)
        time.sleep(0.3)
        # Still running, held in the shim's refusal: the exit below is
        # the signal's doing.
        assert srv.proc.poll() is None
        os.kill(srv.proc.pid, signal.SIGTERM)
        try:
            srv.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pytest.fail("tb_srv did not exit on SIGTERM: the signal was "
                        "lost in the shim's accept()")
        c.close()
    finally:
        os.kill(redis_pid, signal.SIGCONT)
        srv.stop()
