"""test_shim_clients_dlopen.py -- libraries opened with RTLD_DEEPBIND, as
PHP opens every extension (pdo_pgsql, pgsql, curl), are limited like the
rest of the program, and the shim's dlopen() keeps the caller's identity:
a plugin found only through the program's RUNPATH still loads."""

import pytest

from tbtest.env import free_port, prog
from tbtest.shim import Proc, plain_env, run, shim_env, write_conf


@pytest.fixture(scope="module")
def dl_progs():
    """dl_main, built by make with RUNPATH $ORIGIN/plug, and the plugin
    in plug/ only."""
    return prog("dl_main")


def dl_env(conf):
    """The shim's environment for dl_main. Under `make asan` it is the
    plain build: the sanitizer runtime, preloaded first, refuses
    RTLD_DEEPBIND itself before any other dlopen() runs."""
    return shim_env(conf, foreign=True)


def outcome(dl_main, args, env):
    p = run([dl_main] + [str(a) for a in args], env, timeout=60,
            check=False)
    return p.stdout.strip()


# test_shim_330_01: a plugin opened with RTLD_DEEPBIND binds connect() to
# libc before the global scope; under an outbound rule its connects are
# limited all the same (2 of 5 under capacity 2), as without the flag.
def test_shim_330_01(redis_server, progs, dl_progs, tmp_path):
    srv = Proc([progs["tb_srv"]], plain_env())
    try:
        conf = write_conf(tmp_path / "s.conf", redis_server,
                          'outbound = ( { name = "dl"; host = "127.0.0.1"; '
                          'port = %d; capacity = 2; rate = "1/h"; } );'
                          % srv.port)
        assert outcome(dl_progs, ["-d", "libtbplug.so", "127.0.0.1",
                                  srv.port, 5], plain_env()) == "ok=5 fail=0"
        assert outcome(dl_progs, ["-d", "libtbplug.so", "127.0.0.1",
                                  srv.port, 5],
                       dl_env(conf)) == "ok=2 fail=3"
        redis_server.client().delete("tb:shim:out:dl:{dl}")
        assert outcome(dl_progs, ["libtbplug.so", "127.0.0.1", srv.port, 5],
                       dl_env(conf)) == "ok=2 fail=3"
    finally:
        srv.stop()


# test_shim_330_02: the shim's dlopen() forwards as a tail call, so glibc
# still sees the program as the caller and searches its RUNPATH for a
# bare name: the plugin loads under the shim, with and without
# RTLD_DEEPBIND, with outbound rules and with none.
def test_shim_330_02(redis_server, dl_progs, tmp_path):
    port = free_port()
    rules = write_conf(tmp_path / "r.conf", redis_server,
                       'outbound = ( { name = "dl"; host = "127.0.0.1"; '
                       'port = %d; capacity = 1; rate = "1/h"; } );' % port)
    none = write_conf(tmp_path / "n.conf", redis_server, "")
    for conf in (rules, none):
        for flag in (["-d"], []):
            got = outcome(dl_progs, flag + ["libtbplug.so", "127.0.0.1",
                                            free_port(), 1], dl_env(conf))
            assert got == "ok=0 fail=1", (conf, flag, got)
