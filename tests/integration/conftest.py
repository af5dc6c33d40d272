"""conftest.py -- shared pytest fixtures: a real redis-server per test."""
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tbenv import Redis, BUILD  # noqa: E402


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
def build_dir():
    return BUILD
