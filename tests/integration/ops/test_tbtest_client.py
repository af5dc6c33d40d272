"""test_tbtest_client.py -- the tests' keep-alive client retries what a
browser retries, and nothing else.

A small server on loopback answers the first request of a connection
with keep-alive and then closes the connection when the next request
arrives, without a byte of answer: the instant in which a server ends
an idle kept-alive connection as the client reuses it. tbtest.client's
Session (and LightSession, the hammers' client) must send an idempotent
request again, once, and count it; a POST, or a request on a fresh
connection, must fail as before.
"""
import socket
import threading

import pytest
import requests

from tbtest import client

OK = (b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n"
      b"Connection: keep-alive\r\n\r\nok")


class Closer:
    """Serves `answer` requests per connection, then closes the
    connection on the next request's first bytes. Counts what it saw."""

    def __init__(self, answer=1):
        self.answer = answer
        self.requests = 0
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self.stop = False
        self.t = threading.Thread(target=self.loop, daemon=True)
        self.t.start()

    def loop(self):
        self.sock.settimeout(0.2)
        while not self.stop:
            try:
                c, _ = self.sock.accept()
            except OSError:
                continue
            threading.Thread(target=self.serve, args=(c,),
                             daemon=True).start()

    def serve(self, c):
        c.settimeout(10)
        with c:
            for n in range(self.answer + 1):
                data = b""
                while b"\r\n\r\n" not in data:
                    chunk = c.recv(4096)
                    if not chunk:
                        return
                    data += chunk
                self.requests += 1
                if n == self.answer:
                    return              # closed, no byte of answer
                c.sendall(OK)

    def close(self):
        self.stop = True
        self.t.join(timeout=2)
        self.sock.close()

    def url(self):
        return "http://127.0.0.1:%d/" % self.port


@pytest.fixture
def closer():
    s = Closer()
    yield s
    s.close()


# test_ops_003_01: a GET on a kept-alive connection the server closed
# before answering is sent again once, on a new connection, and counted.
def test_ops_003_01(closer):
    before = client.retries()
    with client.Session() as s:
        assert s.get(closer.url(), timeout=5).status_code == 200
        assert s.get(closer.url(), timeout=5).status_code == 200
        assert s.retries == 1
    assert client.retries() == before + 1
    assert closer.requests == 3          # the retried one reached it twice


# test_ops_003_02: a bare requests.Session fails there (what the retry
# is for), and tbtest's Session does not retry a POST.
def test_ops_003_02(closer):
    with requests.Session() as s:
        s.get(closer.url(), timeout=5)
        with pytest.raises(requests.ConnectionError):
            s.get(closer.url(), timeout=5)
    with client.Session() as s:
        s.get(closer.url(), timeout=5)
        with pytest.raises(requests.ConnectionError):
            s.post(closer.url(), data=b"x", timeout=5)
        assert s.retries == 0


# test_ops_003_03: a fresh connection closed before an answer is an
# error, not retried (no earlier response kept it alive).
def test_ops_003_03():
    s0 = Closer(answer=0)
    try:
        with client.Session() as s:
            with pytest.raises(requests.ConnectionError):
                s.get(s0.url(), timeout=5)
            assert s.retries == 0
        assert s0.requests == 1
    finally:
        s0.close()


# test_ops_003_04: LightSession keeps the same rule: a GET on a kept-alive
# connection closed before the answer is sent again once and counted; on
# a fresh connection it is an error, not retried.
def test_ops_003_04(closer):
    before = client.retries()
    s = client.LightSession()
    assert s.get(closer.url(), timeout=5).status_code == 200
    assert s.get(closer.url(), timeout=5).content == b"ok"
    assert s.retries == 1 and client.retries() == before + 1
    assert closer.requests == 3
    s.close()
    s0 = Closer(answer=0)
    try:
        s = client.LightSession()
        with pytest.raises(ConnectionError):
            s.get(s0.url(), timeout=5)
        assert s.retries == 0 and s0.requests == 1
    finally:
        s0.close()
