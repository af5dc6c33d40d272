"""tbtest/client.py -- a keep-alive HTTP client that behaves like a real
one.

A server may close a kept-alive connection at any moment it is idle
(KeepAliveTimeout, MaxKeepAliveRequests, a graceful restart, the event
MPM closing idle connections when its workers are busy). A request that
goes out in the same instant finds the connection gone before any byte
of a response: http.client raises RemoteDisconnected, or the socket
ConnectionResetError / BrokenPipeError. Browsers, curl and requests'
adapters with retries send such a request again on a new connection
when it is idempotent (RFC 9110, 9.2.2); a bare requests.Session does
not, and a test that uses one fails on a busy machine for what no user
would ever see.

Session does what they do: once, only for an idempotent method, only
when the connection was a kept-alive one (an earlier response from that
host left it open) and only when nothing of the response arrived.
Every retry is counted, per session (`.retries`) and in all
(`retries()`), because the first attempt may have reached the server: a
test that counts server-side events (tokens charged, requests logged)
allows for them.
"""
import http.client
import threading
from urllib.parse import urlsplit

import requests

IDEMPOTENT = {"GET", "HEAD", "OPTIONS", "PUT", "DELETE", "TRACE"}
# What the request meets when the server closed the kept-alive
# connection before answering: no byte of a status line.
CLOSED_BEFORE_ANSWER = (http.client.RemoteDisconnected,
                        ConnectionResetError, BrokenPipeError)

_lock = threading.Lock()
_total = [0]


def retries():
    """Retries made by every Session of this process so far."""
    with _lock:
        return _total[0]


def closed_before_answer(exc):
    """Whether a requests ConnectionError is a connection closed before
    any byte of the response (urllib3 wraps the socket's error in a
    ProtocolError('Connection aborted.', err); an error while reading the
    body is a ChunkedEncodingError instead, never retried)."""
    seen = set()
    e = exc
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, CLOSED_BEFORE_ANSWER):
            return True
        args = getattr(e, "args", ())
        inner = [a for a in args if isinstance(a, BaseException)]
        e = inner[-1] if inner else (e.__cause__ or e.__context__)
    return False


class Session(requests.Session):
    """requests.Session that retries an idempotent request once when
    its kept-alive connection was closed before the answer."""

    def __init__(self):
        super().__init__()
        self.retries = 0
        self._kept = set()       # hosts whose last response kept the conn

    @staticmethod
    def _host(url):
        u = urlsplit(url)
        return (u.scheme, u.netloc)

    def send(self, request, **kw):
        host = self._host(request.url)
        reused = host in self._kept
        self._kept.discard(host)
        try:
            r = super().send(request, **kw)
        except requests.ConnectionError as e:
            if not (reused and request.method in IDEMPOTENT
                    and closed_before_answer(e)):
                raise
            self.retries += 1
            with _lock:
                _total[0] += 1
            r = super().send(request, **kw)
        orig = getattr(r.raw, "_original_response", None)
        if orig is not None and not orig.will_close:
            self._kept.add(host)
        return r


class Answer:
    """What LightSession.get() returns: the status and the body."""

    def __init__(self, status_code, content):
        self.status_code = status_code
        self.content = content


class LightSession:
    """GETs on one kept-alive http.client connection: the same retry
    rule as Session (once, when the kept-alive connection was closed
    before any byte of the answer; counted), at a fraction of
    requests' CPU per call. For hammers that must outrun a limit on a
    busy machine: beside 4 busy loops at load 12, four threads of
    Session sent about 50 requests a second."""

    def __init__(self):
        self.headers = {}
        self.retries = 0
        self._conn = None
        self._where = None

    def close(self):
        if self._conn is not None:
            self._conn.close()
        self._conn = None

    def get(self, url, timeout=10):
        u = urlsplit(url)
        where = (u.hostname, u.port)
        path = (u.path or "/") + ("?" + u.query if u.query else "")
        if where != self._where:
            self.close()
            self._where = where
        for attempt in (0, 1):
            kept = self._conn is not None
            if not kept:
                self._conn = http.client.HTTPConnection(*where,
                                                        timeout=timeout)
            try:
                self._conn.request("GET", path, headers=self.headers)
                r = self._conn.getresponse()
            except CLOSED_BEFORE_ANSWER:
                self.close()
                if not kept or attempt:
                    raise
                self.retries += 1
                with _lock:
                    _total[0] += 1
                continue
            except (OSError, http.client.HTTPException):
                self.close()
                raise
            try:
                body = r.read()
            except (OSError, http.client.HTTPException):
                self.close()
                raise
            if r.will_close:
                self.close()
            return Answer(r.status, body)
        raise AssertionError("not reached")
