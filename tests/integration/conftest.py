"""conftest.py -- the shared fixtures of the integration tests.

Puts the helper package tbtest/ on sys.path and makes its servers and
programs fixtures: a redis-server per test, factories for Apaches,
haproxies, tb_driver clients and extra redis-servers, the paths of the
test programs, a test PKI with TLS redis-servers, and a locale with a
decimal comma. Each fixture stops what it started, by PID.
"""
import os
import shutil
import sys
import tempfile

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tbtest.apache import Apache  # noqa: E402
from tbtest.core import Driver  # noqa: E402
from tbtest.env import BUILD, Redis, comma_locale, prog  # noqa: E402
from tbtest.proof import HAProxy  # noqa: E402
from tbtest.shim import PROG_NAMES, SHIM_SO  # noqa: E402
from tbtest.tls import TlsRedis, make_pki  # noqa: E402


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "slow: runs in real time for seconds (timeouts, windows)")


@pytest.fixture
def redis_server(tmp_path):
    """A fresh redis-server on a free loopback port, stopped by PID."""
    r = Redis(tmp_path / "redis").start()
    yield r
    r.stop()


@pytest.fixture
def make_redis(tmp_path):
    """A factory for extra redis-servers (own settings), stopped by PID."""
    started = []

    def start(name="extra", extra=None, port=None):
        r = Redis(tmp_path / name, port=port, extra=extra)
        started.append(r)
        return r.start()

    yield start
    for r in started:
        r.stop()


@pytest.fixture
def build_dir():
    return BUILD


@pytest.fixture
def apache_factory():
    """Make Apaches on demand; each is stopped by PID and its temp root
    removed at teardown."""
    made = []

    def make(**kw):
        a = Apache(**kw)
        made.append(a)
        return a

    yield make
    for a in made:
        a.cleanup()


@pytest.fixture
def haproxy_factory():
    """Start haproxies on demand; each is stopped by PID at teardown."""
    made = []

    def make(frontends):
        h = HAProxy(frontends)
        made.append(h)
        return h.start()

    yield make
    for h in made:
        h.stop()


@pytest.fixture
def drivers():
    """A factory for tb_driver processes, all stopped at teardown."""
    started = []

    def start(url, *args, **opts):
        argv = ["--url", url] + list(args)
        for k, v in opts.items():
            argv += ["--" + k.replace("_", "-"), v]
        d = Driver(argv)
        started.append(d)
        assert d.ready.startswith("ok ready"), d.ready
        return d

    yield start
    for d in started:
        d.stop()


@pytest.fixture(scope="session")
def progs():
    """{name: path} of the shim tests' programs, which make builds."""
    if not os.path.exists(SHIM_SO):
        pytest.fail("%s is missing: run make first" % SHIM_SO)
    return {n: prog(n) for n in PROG_NAMES}


@pytest.fixture(scope="session")
def pki(tmp_path_factory):
    """The test PKI (tbtest/tls.py), made once per session."""
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture
def tls_redis(tmp_path, pki):
    """A factory for TLS-only redis-servers; each stopped by PID."""
    started = []

    def start(name="tls", **kw):
        r = TlsRedis(tmp_path / name, pki, **kw)
        started.append(r)
        return r.start()

    yield start
    for r in started:
        r.stop()


@pytest.fixture(scope="session")
def locale_dir():
    """(LOCPATH, name) of a locale whose decimal point is a comma, in a
    directory Apache's children (www-data) can read too."""
    d = tempfile.mkdtemp(prefix="tbloc-", dir="/tmp")
    os.chmod(d, 0o755)
    yield d, comma_locale(d)
    shutil.rmtree(d, ignore_errors=True)
