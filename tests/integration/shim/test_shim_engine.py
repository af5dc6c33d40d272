"""test_shim_engine.py -- the shim's `engine` setting: inbound decisions
asked of Redis with the scripts or with tbucket_redis.so's commands, the
same buckets either way. Which engine answered is read from Redis's own
INFO commandstats."""
import os

from tbtest.env import BUILD, free_port
from tbtest.redismod import engine_calls as calls
from tbtest.shim import (cli, plain_env, run, stderr_lines, tb_srv,
                         write_conf)


def rule(port):
    return ('inbound = ( { name = "web"; port = %d; capacity = 4; '
            'rate = "1/h"; } );' % port)


def engine_conf(tmp_path, redis, port, name="s.conf", **scalars):
    """A config of rule(port) on redis, scalars (engine, policy) added."""
    return write_conf(tmp_path / name, redis, rule(port), **scalars)


def serve(progs, conf, port, n):
    """n connections to tb_srv under conf: tb_cli's summary, tb_srv's
    stderr."""
    srv = tb_srv(progs, conf, port)
    try:
        (s,), _ = cli(progs, ["-r", "127.0.0.1", port, n], plain_env())
    finally:
        out, err = srv.stop()
    return s, err


def check(s, err, redis, served, closed, want_calls):
    """tb_srv served `served` connections, the shim closed `closed`,
    redis ran want_calls (module calls, script calls), and tb_srv wrote
    nothing on stderr."""
    assert s["served"] == served and s["closed"] == closed
    assert calls(redis) == want_calls
    assert err == ""


# test_shim_520_01: engine = "module": every connection is decided by
# tbucket.bucket, none by a script, and the limit is exact.
def test_shim_520_01(mod_redis, progs, tmp_path):
    port = free_port()
    conf = engine_conf(tmp_path, mod_redis, port, engine="module")
    s, err = serve(progs, conf, port, 7)
    check(s, err, mod_redis, 4, 3, (7, 0))


# test_shim_520_02: engine = "script" on a Redis with the module, then
# "auto" on the same bucket: the scripts, then the module (from the
# connection's second call), one exact limit across both.
def test_shim_520_02(mod_redis, progs, tmp_path):
    port = free_port()
    conf = engine_conf(tmp_path, mod_redis, port, engine="script")
    s, _ = serve(progs, conf, port, 2)
    assert s["served"] == 2 and calls(mod_redis) == (0, 2)
    conf = engine_conf(tmp_path, mod_redis, port, "a.conf")
    s, err = serve(progs, conf, port, 4)
    check(s, err, mod_redis, 2, 2, (3, 3))


# test_shim_520_03: engine = "module" against a Redis without it: the
# failure policy decides (closed: every connection refused), with one
# warning naming the missing module.
def test_shim_520_03(plain_redis, progs, tmp_path):
    port = free_port()
    conf = engine_conf(tmp_path, plain_redis, port, engine="module",
                       policy="closed")
    s, err = serve(progs, conf, port, 3)
    assert s["served"] == 0
    assert calls(plain_redis) == (0, 0)
    lines = stderr_lines(err)
    assert len(lines) == 1 and "closed" in lines[0], err


# test_shim_520_04: a bad engine is refused by the loader, naming it (the
# tool reads configs with the same loader).
def test_shim_520_04(tmp_path):
    conf = engine_conf(tmp_path, None, free_port(), engine="lua")
    p = run([os.path.join(BUILD, "tbucket"), "reset", "k", "--config", conf],
            plain_env(), check=False)
    assert p.returncode == 78
    assert 'engine "lua" must be "auto", "script" or "module"' in p.stderr
