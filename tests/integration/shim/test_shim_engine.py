"""test_shim_engine.py -- the shim's `engine` setting: inbound decisions
asked of Redis with the scripts or with tbucket_redis.so's commands, the
same buckets either way. Which engine answered is read from Redis's own
INFO commandstats."""
import os

import pytest

from tbtest.env import BUILD, free_port
from tbtest.redismod import ModRedis, module_path
from tbtest.shim import (Proc, cli, plain_env, run, shim_env, stderr_lines,
                         write_conf)


@pytest.fixture
def mod_redis(tmp_path):
    r = ModRedis(str(tmp_path / "mod"), module=module_path()).start()
    yield r
    r.stop()


@pytest.fixture
def plain_redis(tmp_path):
    r = ModRedis(str(tmp_path / "plain"), module=None).start()
    yield r
    r.stop()


def calls(r):
    st = r.client().info("commandstats")
    mod = st.get("cmdstat_tbucket.bucket", {}).get("calls", 0)
    scr = sum(st.get(k, {}).get("calls", 0)
              for k in ("cmdstat_evalsha", "cmdstat_eval"))
    return mod, scr


def rule(port):
    return ('inbound = ( { name = "web"; port = %d; capacity = 4; '
            'rate = "1/h"; } );' % port)


def serve(progs, conf, port, n):
    srv = Proc([progs["tb_srv"], "-p", str(port)], shim_env(conf))
    try:
        (s,), _ = cli(progs, ["-r", "127.0.0.1", port, n], plain_env())
    finally:
        out, err = srv.stop()
    return s, err


# test_shim_520_01: engine = "module": every connection is decided by
# tbucket.bucket, none by a script, and the limit is exact.
def test_shim_520_01(mod_redis, progs, tmp_path):
    port = free_port()
    conf = write_conf(tmp_path / "s.conf", mod_redis, rule(port),
                      engine="module")
    s, err = serve(progs, conf, port, 7)
    assert s["served"] == 4 and s["closed"] == 3
    assert calls(mod_redis) == (7, 0)
    assert err == ""


# test_shim_520_02: engine = "script" on a Redis with the module, then
# "auto" on the same bucket: the scripts, then the module (from the
# connection's second call), one exact limit across both.
def test_shim_520_02(mod_redis, progs, tmp_path):
    port = free_port()
    conf = write_conf(tmp_path / "s.conf", mod_redis, rule(port),
                      engine="script")
    s, _ = serve(progs, conf, port, 2)
    assert s["served"] == 2 and calls(mod_redis) == (0, 2)
    conf = write_conf(tmp_path / "a.conf", mod_redis, rule(port))
    s, err = serve(progs, conf, port, 4)
    assert s["served"] == 2 and s["closed"] == 2
    assert calls(mod_redis) == (3, 3)
    assert err == ""


# test_shim_520_03: engine = "module" against a Redis without it: the
# failure policy decides (closed: every connection refused), with one
# warning naming the missing module.
def test_shim_520_03(plain_redis, progs, tmp_path):
    port = free_port()
    conf = write_conf(tmp_path / "s.conf", plain_redis, rule(port),
                      engine="module", policy="closed")
    s, err = serve(progs, conf, port, 3)
    assert s["served"] == 0
    assert calls(plain_redis) == (0, 0)
    lines = stderr_lines(err)
    assert len(lines) == 1 and "closed" in lines[0], err


# test_shim_520_04: a bad engine is refused by the loader, naming it (the
# tool reads configs with the same loader).
def test_shim_520_04(tmp_path):
    conf = write_conf(tmp_path / "s.conf", None, rule(free_port()),
                      engine="lua")
    p = run([os.path.join(BUILD, "tbucket"), "reset", "k", "--config", conf],
            plain_env(), check=False)
    assert p.returncode == 78
    assert 'engine "lua" must be "auto", "script" or "module"' in p.stderr
