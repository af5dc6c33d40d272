"""test_redismod_load.py -- loading tbucket_redis.so: what Redis sees of it
(MODULE LIST, COMMAND INFO), what the .so exports, what a server without
it answers, and an emergency unload with the script engine going on.
"""
import json
import os
import subprocess

import pytest
import redis as redis_py

from tbtest.env import ROOT
from tbtest.redismod import ALGOS, ENGINES, module, module_path, script


# MODULE LIST names it (version from VERSION); COMMAND INFO shows every
# command as write, denyoom, module, movablekeys, like EVAL's keys.
def test_redismod_007_01(mod_servers):
    r = mod_servers("r", module=module_path()).start().client()
    mods = r.execute_command("MODULE", "LIST")
    assert [m[1] for m in mods] == [b"tbucket"]
    with open(os.path.join(ROOT, "VERSION")) as f:
        major, minor, patch = (int(x) for x in f.read().split("."))
    assert mods[0][3] == major * 10000 + minor * 100 + patch
    for algo in ALGOS:
        info = r.execute_command("COMMAND", "INFO", ENGINES[algo][0])
        assert set(info[ENGINES[algo][0]]["flags"]) >= {"write", "denyoom",
                                                   "module", "movablekeys"}


# The .so exports RedisModule_OnLoad and nothing else of its own.
def test_redismod_007_02():
    out = subprocess.run(["nm", "-D", "--defined-only", module_path()],
                         capture_output=True, text=True, check=True).stdout
    syms = [line.split()[-1] for line in out.splitlines()
            if line.split()[1] in ("T", "D", "B", "W")]
    assert syms == ["RedisModule_OnLoad"], syms


# A server without the module answers an unknown-command error (the
# client's cue to use the scripts); loading it twice, or with
# arguments, is refused at start.
def test_redismod_007_03(mod_servers, tmp_path):
    r = mod_servers("plain", module=None).start().client()
    with pytest.raises(redis_py.ResponseError, match="unknown command"):
        r.execute_command("tbucket.bucket", 1, "k", "", "5", "1", "1")
    so = module_path()
    for name, kw in (("twice", {"extra": ["loadmodule %s" % so]}),
                     ("args", {"module_args": "extra"})):
        bad = mod_servers(name, module=so, **kw)
        with pytest.raises(RuntimeError):
            bad.start()
        assert "tbucket" in bad.log()


# An emergency unload (MODULE UNLOAD) leaves every key as the module
# wrote it, and the scripts carry on from there: the same replies as a
# server that never had the module.
def test_redismod_007_04(mod_servers):
    s = mod_servers("s", module=module_path(),
                extra=["enable-module-command local"]).start()
    ref = mod_servers("ref", module=None).start()
    r, q = s.client(), ref.client()
    for algo in ALGOS:
        for now in (1000, 1200):
            argv = [str(now), "5", "2", "2"]
            assert module(r, algo, ["{u}:" + algo], argv) == \
                script(q, algo, ["{u}:" + algo], argv)
    assert r.execute_command("MODULE", "UNLOAD", "tbucket") == b"OK"
    with pytest.raises(redis_py.ResponseError, match="unknown command"):
        module(r, "token_bucket", ["{u}:token_bucket"], ["1300", "5", "2",
                                                         "2"])
    for algo in ALGOS:
        argv = ["1700", "5", "2", "2"]
        assert script(r, algo, ["{u}:" + algo], argv) == \
            script(q, algo, ["{u}:" + algo], argv)


def cli_json(port, *args):
    """A reply as redis-cli --json gives it (redis-py parses every COMMAND
    reply as COMMAND INFO's old form, without the key specs)."""
    out = subprocess.run(["redis-cli", "-p", str(port), "--json"]
                         + list(args), capture_output=True, text=True,
                         check=True).stdout
    return json.loads(out)


# Every command declares its keys as EVAL does, in a key spec (numkeys at
# argv[1], then that many keys, read, updated and used for the reply), so
# COMMAND INFO shows them and a server, proxy or Cluster client finds the
# keys of a pipelined call without the getkeys callback; COMMAND DOCS
# says what each does; the keys found agree with numkeys.
def test_redismod_007_05(mod_servers):
    s = mod_servers("r", module=module_path()).start()
    for algo in ALGOS:
        name = ENGINES[algo][0]
        info = cli_json(s.port, "COMMAND", "INFO", name)[0]
        assert info[0] == name
        # name, arity, flags, first, last, step, acl, tips, key specs
        assert info[8] == [{
            "flags": ["RW", "access", "update"],
            "begin_search": {"type": "index", "spec": {"index": 1}},
            "find_keys": {"type": "keynum", "spec": {
                "keynumidx": 0, "firstkey": 1, "keystep": 1}}}], info
        docs = cli_json(s.port, "COMMAND", "DOCS", name)
        assert algo in docs[name]["summary"], docs
        keys = cli_json(s.port, "COMMAND", "GETKEYSANDFLAGS", name, "3", "a",
                        "{a}b", "{a}c", "", "5", "1", "1", "1", "1")
        assert [k[0] for k in keys] == ["a", "{a}b", "{a}c"], keys
