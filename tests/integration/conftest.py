"""conftest.py -- the shared fixtures of the integration tests.

Puts the helper package tbtest/ on sys.path and makes its servers and
programs fixtures: a redis-server per test, factories for Apaches,
haproxies, tb_driver clients and extra redis-servers, redis-servers with
and without tbucket_redis.so, the paths of the test programs and the
shim tests' downstream servers, a test PKI with TLS redis-servers, a
locale with a decimal comma, and the WordPress rig the login tests
share. Each fixture stops what it started, by PID. A run that holds the
packaging tests starts their `make deb` at once, in the background.
"""
import os
import shutil
import sys
import tempfile

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tbtest.apache import Apache  # noqa: E402
from tbtest.core import Driver  # noqa: E402
from tbtest.debbuild import SHARED as DEB_BUILD  # noqa: E402
from tbtest.ha import ClusterRig  # noqa: E402
from tbtest.env import (BUILD, Redis, comma_locale, factory,  # noqa: E402
                         prog)
from tbtest.proof import HAProxy  # noqa: E402
from tbtest.redismod import (ModRedis, module_path,  # noqa: E402
                             sanitizer_reports)
from tbtest.shim import PROG_NAMES, SHIM_SO, Proc, plain_env  # noqa: E402
from tbtest.tls import TlsRedis, make_pki  # noqa: E402
from tbtest.wordpress import SHARED as WORDPRESS  # noqa: E402


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "slow: runs in real time for seconds (timeouts, windows)")


def pytest_collection_finish(session):
    """Start `make deb` in the background if the packaging tests will run
    (tbtest/debbuild.py says why)."""
    if any("test_packaging_deb.py" in item.nodeid for item in session.items):
        DEB_BUILD.start()


def pytest_sessionfinish(session, exitstatus):
    DEB_BUILD.stop()


@pytest.fixture
def redis_server(tmp_path):
    """A fresh redis-server on a free loopback port, stopped by PID."""
    r = Redis(tmp_path / "redis").start()
    yield r
    r.stop()


@pytest.fixture
def make_redis(tmp_path):
    """A factory for extra redis-servers (own settings), stopped by PID."""
    def create(name="extra", extra=None, port=None):
        return Redis(tmp_path / name, port=port, extra=extra)

    yield from factory(create, Redis.stop, then=Redis.start)


@pytest.fixture
def build_dir():
    return BUILD


@pytest.fixture
def apache_factory():
    """Make Apaches on demand; each is stopped by PID and its temp root
    removed at teardown."""
    yield from factory(Apache, Apache.cleanup)


@pytest.fixture
def fpm_factory():
    """Start php-fpm pools on demand; each is stopped by PID and its
    temp dir removed at teardown."""
    from tbtest.php import PhpFpm
    yield from factory(PhpFpm, PhpFpm.cleanup, then=PhpFpm.start)


@pytest.fixture
def haproxy_factory():
    """Start haproxies on demand; each is stopped by PID at teardown."""
    yield from factory(HAProxy, HAProxy.stop, then=HAProxy.start)


@pytest.fixture
def drivers():
    """A factory for tb_driver processes, all stopped at teardown. The
    command timeout is 1 s unless a test sets its own (as the shim
    tests' write_conf and tb_batch do): the client's 50 ms default is a
    production bound, and on a busy shared runner a call can pass it,
    leaving the failure policy to answer where a test checks Redis's."""
    def create(url, *args, **opts):
        opts.setdefault("timeout", 1000)
        argv = ["--url", url] + list(args)
        for k, v in opts.items():
            argv += ["--" + k.replace("_", "-"), v]
        return Driver(argv)

    def ready(d):
        assert d.ready.startswith("ok ready"), d.ready
        return d

    yield from factory(create, Driver.stop, then=ready)


@pytest.fixture(scope="session")
def progs():
    """{name: path} of the shim tests' programs, which make builds."""
    if not os.path.exists(SHIM_SO):
        pytest.fail("%s is missing: run make first" % SHIM_SO)
    return {n: prog(n) for n in PROG_NAMES}


@pytest.fixture
def downstream(progs):
    """A plain (unlimited) TCP server, tb_srv: the protected downstream
    of the shim's outbound tests."""
    p = Proc([progs["tb_srv"]], plain_env())
    yield p
    p.stop()


@pytest.fixture
def http_downstream(progs):
    """The same answering HTTP (tb_srv -H)."""
    p = Proc([progs["tb_srv"], "-H"], plain_env())
    yield p
    p.stop()


@pytest.fixture
def mod_servers(tmp_path):
    """A factory for redis-servers that load tbucket_redis.so
    (tbtest.redismod's ModRedis; module=None: a server without it), not
    started; each is stopped by PID at teardown, and must have written
    no sanitizer report and no crash."""
    def finish(r):
        r.stop()
        assert sanitizer_reports(r.dir) == []
        if os.path.exists(os.path.join(r.dir, "redis.log")):
            assert "crashed" not in r.log().lower()

    yield from factory(lambda name, **kw: ModRedis(tmp_path / name, **kw),
                       finish)


@pytest.fixture
def mod_redis(mod_servers):
    """A started redis-server with the module make built."""
    return mod_servers("mod", module=module_path()).start()


@pytest.fixture
def plain_redis(mod_servers):
    """A started redis-server of the same kind without the module."""
    return mod_servers("plain", module=None).start()


@pytest.fixture(scope="session")
def pki(tmp_path_factory):
    """The test PKI (tbtest/tls.py), made once per session."""
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture
def tls_redis(tmp_path, pki):
    """A factory for TLS-only redis-servers; each stopped by PID."""
    yield from factory(lambda name="tls", **kw: TlsRedis(tmp_path / name,
                                                         pki, **kw),
                       TlsRedis.stop, then=TlsRedis.start)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """A Redis Cluster of three primaries (tbtest/ha.py's ClusterRig), one
    per test module that asks for it, stopped by PID after its last test."""
    rig = ClusterRig(tmp_path_factory.mktemp("cluster")).start()
    yield rig
    rig.stop()


@pytest.fixture(scope="session")
def locale_dir():
    """(LOCPATH, name) of a locale whose decimal point is a comma, in a
    directory Apache's children (www-data) can read too."""
    d = tempfile.mkdtemp(prefix="tbloc-", dir="/tmp")
    os.chmod(d, 0o755)
    yield d, comma_locale(d)
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def wp(request):
    """The WordPress rig (tbtest/wordpress.py) shared by the login tests'
    files: installed once for a run of consecutive tests that ask for it,
    stopped by PID after the last of them (pytest_runtest_teardown); each
    file reads the replicas' logs from its own first test on."""
    return WORDPRESS.get(request.node.fspath.strpath)


def uses_shared_wp(item):
    """Whether a test takes conftest's wp (a module may define its own)."""
    return item is not None and "wp" in getattr(item, "fixturenames", ()) \
        and not hasattr(getattr(item, "module", None), "wp")


def pytest_runtest_teardown(item, nextitem):
    if uses_shared_wp(item) and not uses_shared_wp(nextitem):
        WORDPRESS.stop()
