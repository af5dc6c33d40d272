"""test_shim_concurrency.py -- inbound `concurrency = N`: at most N
connections of one key open at once, released when the program closes
the accepted connection.

The daemon is a small threaded Python server run under LD_PRELOAD: it
greets each connection it accepts with "hi", keeps it until the client
closes its end, then closes it (close() is what gives the slot back). The
slot set is read in Redis: "<prefix>in:<rule>:{<key>}:conc"."""
import socket
import sys

from tbtest.env import free_port, wait_until
from tbtest.shim import (Proc, assert_strict_refusal, in_rule, shim_env,
                         write_conf)

SERVER = r"""
import socket, sys, threading
ls = socket.socket()
ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
ls.bind(("127.0.0.1", int(sys.argv[1])))
ls.listen(64)
print("ready", ls.getsockname()[1], flush=True)

def serve(c):
    try:
        c.sendall(b"hi\n")
        while c.recv(64):
            pass
    except OSError:
        pass
    c.close()

while True:
    c, _ = ls.accept()
    threading.Thread(target=serve, args=(c,), daemon=True).start()
"""


def rule(port, **kw):
    return "inbound = ( %s );" % in_rule(port, **dict({"concurrency": 2},
                                                      **kw))


def daemon(tmp_path, conf, port):
    path = tmp_path / "srv.py"
    path.write_text(SERVER)
    return Proc([sys.executable, str(path), str(port)],
                shim_env(conf, foreign=True))


def connect(port):
    """A client connection: ("hi", sock) when the daemon got it, else
    (what the shim answered, None)."""
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    data = s.recv(64)
    if data == b"hi\n":
        return "hi", s
    s.close()
    return data.decode(errors="replace").split("\r\n")[0] or "closed", None




# N=2: two connections are served and held; the third is closed by the
# shim (or answered 429); closing one gives its slot back, and another
# connection is served; closing all empties the set.
def test_shim_conc_01(redis_server, tmp_path):
    port = free_port()
    conf = write_conf(tmp_path / "s.conf", redis_server, rule(port))
    srv = daemon(tmp_path, conf, port)
    rc = redis_server.client()
    key = "tb:shim:in:web:{127.0.0.1}:conc"
    try:
        a, sa = connect(port)
        b, sb = connect(port)
        assert (a, b) == ("hi", "hi")
        assert rc.zcard(key) == 2
        assert connect(port) == ("closed", None)
        assert rc.zcard(key) == 2
        sa.close()
        assert wait_until(lambda: rc.zcard(key) == 1)
        c, sc = connect(port)
        assert c == "hi"
        for s in (sb, sc):
            s.close()
        assert wait_until(lambda: rc.zcard(key) == 0)
        # Slots expire by the rule's ttl (60 s by default).
        d, sd = connect(port)
        assert 59000 < rc.pttl(key) <= 60000
        sd.close()
        assert wait_until(lambda: rc.zcard(key) == 0)
    finally:
        out, err = srv.stop()
    assert "tbucket-shim" not in err, err


# With a bucket too, one decision takes both or neither: a connection
# refused by concurrency (answered 429) takes no token, and one refused
# by the bucket holds no slot.
def test_shim_conc_02(redis_server, tmp_path):
    port = free_port()
    conf = write_conf(tmp_path / "s.conf", redis_server,
                      rule(port, concurrency=1, capacity=2, rate="1/h",
                           action="http429"))
    srv = daemon(tmp_path, conf, port)
    rc = redis_server.client()
    key = "tb:shim:in:web:{127.0.0.1}"
    try:
        a, sa = connect(port)
        assert a == "hi"
        refused, _ = connect(port)
        assert refused == "HTTP/1.1 429 Too Many Requests"
        assert round(float(rc.hget(key, "tokens"))) == 1
        sa.close()
        assert wait_until(lambda: rc.zcard(key + ":conc") == 0)
        b, sb = connect(port)
        assert b == "hi"
        sb.close()
        assert wait_until(lambda: rc.zcard(key + ":conc") == 0)
        # The bucket is empty now: refused, and no slot is taken.
        assert connect(port)[0] == "HTTP/1.1 429 Too Many Requests"
        assert rc.zcard(key + ":conc") == 0
    finally:
        srv.stop()


# A forking daemon (tb_srv -f): the parent closes its copy of each
# connection right after fork and that close gives the slot back; the
# child's close of its copy releases nothing twice. Every connection is
# served and no slot is left behind.
def test_shim_conc_03(redis_server, progs, tmp_path):
    port = free_port()
    conf = write_conf(tmp_path / "s.conf", redis_server,
                      rule(port, concurrency=1, key="all"))
    srv = Proc([progs["tb_srv"], "-p", str(port), "-f"], shim_env(conf))
    rc = redis_server.client()
    try:
        for i in range(5):
            s = socket.create_connection(("127.0.0.1", port), timeout=5)
            assert s.recv(16) == b"OK\n"
            s.close()
            assert wait_until(lambda: rc.zcard(
                "tb:shim:in:web:{all}:conc") == 0)
    finally:
        out, err = srv.stop()
    assert "served 5" in out and err == ""


# The config: concurrency alone is a rule; 0, a negative or a bad ttl
# is refused with the file and line; outbound rules do not take it.
def test_shim_conc_04(redis_server, progs, tmp_path):
    port = free_port()
    for body, why in (
            (rule(port, concurrency=0), "'concurrency' = 0 is out of range"),
            (rule(port, concurrency=-2), "'concurrency' = -2 is out of "
                                          "range"),
            (rule(port, concurrency_ttl_ms=0), "'concurrency_ttl_ms' = 0"),
            (rule(port, concurrency_ttl_ms="soon"), "'concurrency_ttl_ms'"),
            (rule(port, capacity=5), "needs both 'capacity' and 'rate' "
                                     "(or 'concurrency')"),
            ("outbound = ( { port = %d; capacity = 1; rate = 1; "
             "concurrency = 2; } );" % port,
             "unknown setting 'concurrency' in an outbound rule")):
        conf = write_conf(tmp_path / "bad.conf", redis_server, body)
        assert_strict_refusal(progs, conf, why)
    conf = write_conf(tmp_path / "ok.conf", redis_server,
                      rule(port, concurrency_ttl_ms="2s"))
    srv = daemon(tmp_path, conf, port)
    try:
        a, sa = connect(port)
        assert a == "hi"
        assert 1000 < redis_server.client().pttl(
            "tb:shim:in:web:{127.0.0.1}:conc") <= 2000
        sa.close()
    finally:
        out, err = srv.stop()
    assert err == "", err
