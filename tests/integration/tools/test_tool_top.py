"""test_tool_top.py -- `tbucket top` against status pages it cannot trust.

The tool fetches a tbucket-status page's JSON view over plain HTTP. Here
the page comes from a small server of the test's own on a loopback port,
so its answers can be anything: a frame with hostile strings, an error
status, not JSON, nothing at all. The module's own page is tested in
module/test_topkeys.py (in a terminal, under tmux).
"""
import json
import os
import subprocess
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from tbtest.env import BUILD, free_port

TOOL = os.path.join(BUILD, "tbucket")


def entry(key, refusals):
    return {"key": key, "vhost": "www.example.com:80", "limit": "default",
            "decisions": refusals + 2, "decisions_err": 0,
            "refusals": refusals, "refusals_err": 0, "allowed": 2,
            "refused": refusals, "last_refusal": 1764768000.5}


PAGE = {
    "metrics": [{"name": "tbucket_decisions_total", "type": "counter",
                 "help": "", "samples": [
                     {"suffix": "", "labels": {"outcome": "allowed"},
                      "value": 12},
                     {"suffix": "", "labels": {"outcome": "rejected"},
                      "value": 7}]}],
    "top": {"k": 20, "counters": 160, "memory_bytes": 1561392,
            "windows": [
                {"minutes": m, "decisions": 19, "refusals": 7,
                 "decisions_bound": 0, "refusals_bound": 0,
                 "by_refusals": [entry("k-1", 5),
                                 entry("evil\x1b[2J\x07\u00e9", 2)],
                 "by_decisions": [entry("k-1", 5)]} for m in (1, 15)]},
}


class Page(BaseHTTPRequestHandler):
    """Serves what the test sets in server.answer, records requests."""

    def do_GET(self):
        self.server.seen.append((self.path, self.headers.get("Host")))
        status, body = self.server.answer
        if status is None:
            time.sleep(5)
            return
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def page_server():
    srv = ThreadingHTTPServer(("127.0.0.1", 0), Page)
    srv.daemon_threads = True
    srv.seen = []
    srv.answer = (200, json.dumps(PAGE).encode())
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    yield srv
    srv.shutdown()
    srv.server_close()


def top(*args, timeout=30):
    if not os.path.exists(TOOL):
        pytest.fail("%s is missing: run make" % TOOL)
    return subprocess.run([TOOL, "top"] + list(args), capture_output=True,
                          text=True, timeout=timeout)


# test_tool_003_01: --once prints one frame of both windows and both
# rankings, asks for the JSON view (keeping the URL's query) with the
# URL's host and port in Host, and shows a hostile key's control bytes
# as '?': nothing from the server reaches the terminal as an escape.
def test_tool_003_01(page_server):
    port = page_server.server_address[1]
    p = top("http://127.0.0.1:%d/tbucket-status?x=1" % port, "--once")
    assert p.returncode == 0, p.stderr
    assert page_server.seen == [("/tbucket-status?x=1&view=json",
                                 "127.0.0.1:%d" % port)]
    out = p.stdout
    assert "\x1b" not in out and "\x07" not in out
    assert "evil?[2J??" in out
    for head in ("LAST 1 MINUTE, BY REFUSALS", "LAST 1 MINUTE, BY DECISIONS",
                 "LAST 15 MINUTES, BY REFUSALS",
                 "LAST 15 MINUTES, BY DECISIONS"):
        assert head in out
    row = [ln for ln in out.splitlines() if ln.endswith(" k-1")][0]
    assert row.split()[1:4] == ["5", "7", "2"], row
    assert "allowed 12 rejected 7" in out


# test_tool_003_02: what top cannot read exits 69 with a reason on
# stderr: no listener, an error status, not JSON, JSON that is not a
# status page, a server that never answers (bounded by --timeout).
def test_tool_003_02(page_server):
    url = "http://127.0.0.1:%d/s" % page_server.server_address[1]
    p = top("http://127.0.0.1:%d/s" % free_port(), "--once")
    assert p.returncode == 69 and "connect" in p.stderr, p.stderr
    for answer, needle in (((404, b"{}"), "404"),
                           ((200, b"<html>"), "not the JSON view"),
                           ((200, b'{"a":1}'), "not the JSON view"),
                           ((200, b'{"metrics":[1,'), "not the JSON view")):
        page_server.answer = answer
        p = top(url, "--once")
        assert p.returncode == 69 and needle in p.stderr, (answer, p.stderr)
    page_server.answer = (None, b"")
    t0 = time.monotonic()
    p = top(url, "--once", "--timeout", "300ms")
    assert p.returncode == 69 and "300 ms" in p.stderr, p.stderr
    assert time.monotonic() - t0 < 3


# test_tool_003_03: a status page without top keys (TBucketTopKeys Off)
# still gives a frame; bad URLs and options are usage errors (64).
def test_tool_003_03(page_server):
    page_server.answer = (200, json.dumps({"metrics": [],
                                           "top": None}).encode())
    url = "http://127.0.0.1:%d/s" % page_server.server_address[1]
    p = top(url, "--once")
    assert p.returncode == 0 and "top keys: off" in p.stdout, p.stdout
    for args in (["https://127.0.0.1/s"], ["127.0.0.1/s"], ["http://"],
                 ["http://127.0.0.1:x/s"], ["http://h/a b"], [],
                 [url, "--interval", "5ms"], [url, "--interval", "2h"]):
        p = top(*args, "--once")
        assert p.returncode == 64, (args, p.stdout, p.stderr)


# test_tool_003_04: without --once, top redraws with the terminal's
# clear-and-home sequence every --interval and stops on SIGINT (Ctrl-C)
# with status 0.
def test_tool_003_04(page_server):
    url = "http://127.0.0.1:%d/s" % page_server.server_address[1]
    proc = subprocess.Popen([TOOL, "top", url, "--interval", "100ms"],
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 10
        while len(page_server.seen) < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(page_server.seen) >= 3
    finally:
        proc.send_signal(2)
        out, err = proc.communicate(timeout=10)
    assert proc.returncode == 0, err
    assert out.count(b"\x1b[H\x1b[2J") >= 3
