"""tbtest/load.py -- small, bounded HTTP load for the accuracy tests, and
single raw HTTP requests.

Each worker thread keeps one keep-alive connection (tbtest.client's
Session, which sends a GET again once when the server closed the kept
connection before answering, as browsers do) and sends GETs in a loop
until the deadline, round-robin over the URLs it is given, optionally
paced to a rate. Every run is bounded in time and in requests; the
result counts statuses, the retries (a retried request may have reached
the server twice) and the window the requests spanned.
http_head() sends bytes that python-requests would refuse or rewrite.
"""
import http.client
import socket
import threading
import time

import requests

from tbtest.client import LightSession, Session


class Result:
    def __init__(self):
        self.codes = {}
        self.first = None
        self.last = None
        self.errors = 0
        self.retries = 0
        self.ok_times = []
        self.lock = threading.Lock()

    def add(self, code, t0, t1):
        with self.lock:
            self.codes[code] = self.codes.get(code, 0) + 1
            self.first = t0 if self.first is None else min(self.first, t0)
            self.last = t1 if self.last is None else max(self.last, t1)
            if code == 200:
                self.ok_times.append((t0 + t1) / 2)

    @property
    def ok(self):
        return self.codes.get(200, 0)

    @property
    def refused(self):
        return self.codes.get(429, 0)

    @property
    def total(self):
        return sum(self.codes.values())

    def max_in(self, seconds):
        """The most 200s whose midpoint falls in any `seconds` window."""
        ts = sorted(self.ok_times)
        best = j = 0
        for i, t in enumerate(ts):
            while ts[j] < t - seconds:
                j += 1
            best = max(best, i - j + 1)
        return best

    @property
    def window(self):
        """Seconds from the first request's send to the last's answer."""
        return (self.last - self.first) if self.first is not None else 0.0


def blast(urls, threads=4, seconds=3.0, headers=None, rate=None,
          max_requests=200000, light=False):
    """GET urls round-robin from `threads` workers for `seconds`; with
    rate (requests/s over all workers) each worker is paced evenly. With
    light, each worker uses a LightSession (http.client), for a hammer
    that must outrun a limit on a busy machine."""
    res = Result()
    deadline = time.monotonic() + seconds
    budget = [max_requests]
    block = threading.Lock()

    def worker(idx):
        s = LightSession() if light else Session()
        s.headers.update(headers or {})
        n = idx
        interval = threads / rate if rate else 0.0
        nxt = time.monotonic() + (interval * idx / threads if rate else 0)
        while True:
            if rate:
                pause = nxt - time.monotonic()
                if pause > 0:
                    time.sleep(pause)
                nxt += interval
            if time.monotonic() >= deadline:
                break
            with block:
                if budget[0] <= 0:
                    break
                budget[0] -= 1
            t0 = time.monotonic()
            try:
                r = s.get(urls[n % len(urls)], timeout=10)
                res.add(r.status_code, t0, time.monotonic())
            except (requests.RequestException, OSError,
                    http.client.HTTPException):
                with res.lock:
                    res.errors += 1
            n += 1
        s.close()
        with res.lock:
            res.retries += s.retries

    ts = [threading.Thread(target=worker, args=(i,)) for i in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(timeout=seconds + 30)
    return res


def blast_servers(apache_factory, body, n, threads=4, seconds=3.0,
                  key="hot", rate=None, light=False):
    """n Apaches started with body (tbtest.apache.start_servers), one
    key (X-Key) hammered or paced round-robin over them as blast() does,
    then each checked for a clean log and stopped; the Result."""
    from tbtest.apache import start_servers
    servers, urls = start_servers(apache_factory, n, threads, body)
    res = blast(urls, threads=threads, seconds=seconds,
                headers={"X-Key": key}, rate=rate, light=light)
    for a in servers:
        a.assert_log_clean()
        a.stop()
    return res


def http_head(port, request, timeout=10):
    """Send one raw HTTP request (bytes, asking for `Connection: close`) to
    127.0.0.1:port and read the answer until the server closes; returns
    its head (status line and headers) as text."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(request)
        # recv() returns b"" once the server has closed.
        data = b"".join(iter(lambda: s.recv(65536), b""))
    return data.split(b"\r\n\r\n", 1)[0].decode(errors="replace")
