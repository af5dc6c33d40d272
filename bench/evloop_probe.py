#!/usr/bin/python3
"""evloop_probe.py -- can the shim recognise an event loop at connect()?

Builds bench/evloop_probe.c, starts a small HTTP upstream on a free
loopback port, and makes each program below connect() to it three times
with the probe preloaded: blocking-style clients (curl, PHP, Python
urllib, psql), event loops (nginx proxy_pass, HAProxy, Node, Python
asyncio) and Apache prefork with mod_proxy, with one Listen line and with
two. Each program, server and upstream runs in a temp dir, bounded in
time, and is stopped by PID. Prints one Markdown row per program: what
the two cheap signals said at connect() (fd already in an epoll set;
thread has waited in epoll), how long the /proc scan behind the first
took, and what the program is. Also times epoll_wait(0) with and
without the wrapper, the cost of keeping the second signal.

    /usr/bin/python3 bench/evloop_probe.py [--build build]

Needs: gcc, nginx, haproxy, nodejs, php-cli, postgresql-client, curl,
apache2 (the packages of `make test`, plus nodejs).
"""
import argparse
import http.server
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "tests", "integration"))

from tbtest.env import free_port, stop_pid, wait_port  # noqa: E402

EPOLL_LOOP = r"""
#include <stdio.h>
#include <sys/epoll.h>
#include <time.h>
int main(void)
{
    struct epoll_event ev;
    struct timespec a, b;
    int ep = epoll_create1(0), i, n = 1000000;
    clock_gettime(CLOCK_MONOTONIC, &a);
    for (i = 0; i < n; i++) epoll_wait(ep, &ev, 1, 0);
    clock_gettime(CLOCK_MONOTONIC, &b);
    printf("%.1f\n", ((b.tv_sec - a.tv_sec) * 1e9
                      + (b.tv_nsec - a.tv_nsec)) / n);
    return 0;
}
"""


# Three GETs one after the other: the second and third connect from
# inside the running loop, the first before it ever waited.
NODE_CHAIN = """
const http = require('http');
let left = 3;
function one() {
  if (left-- > 0) http.get('%s', r => { r.resume(); r.on('end', one); });
}
one();
"""


class Upstream(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.send_header("Content-Length", "3")
        self.end_headers()
        self.wfile.write(b"OK\n")

    def log_message(self, *a):
        pass


def get(port, path="/"):
    """A plain GET, outside the probe (it drives a server)."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(("GET %s HTTP/1.0\r\nHost: x\r\n\r\n" % path).encode())
        data = b""
        while True:
            c = s.recv(4096)
            if not c:
                return data
            data += c


def env_with(probe, up, log):
    env = dict(os.environ)
    env.update(LD_PRELOAD=probe, EVLOOP_PORT=str(up), EVLOOP_LOG=log)
    return env


def run3(argv, env, tmp, times=3):
    for _ in range(times):
        subprocess.run(argv, env=env, cwd=tmp, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL, timeout=20)


def clients(probe, up, log, tmp):
    url = "http://127.0.0.1:%d/" % up
    env = env_with(probe, up, log)
    asyncio_src = ("import asyncio\n"
                   "async def m():\n"
                   "    r, w = await asyncio.open_connection(\n"
                   "        '127.0.0.1', %d)\n"
                   "    w.write(b'GET / HTTP/1.0\\r\\n\\r\\n')\n"
                   "    await r.read()\n"
                   "asyncio.run(m())\n" % up)
    return [
        ("curl", "client", ["curl", "-s", "--max-time", "5", url]),
        ("php file_get_contents", "client",
         ["php", "-r", "file_get_contents('%s');" % url]),
        ("python urllib, timeout", "client",
         ["/usr/bin/python3", "-c", "import urllib.request as u; "
          "u.urlopen('%s', timeout=5).read()" % url]),
        ("psql (libpq)", "client",
         ["psql", "host=127.0.0.1 port=%d connect_timeout=2" % up, "-c",
          "select 1"]),
        ("python asyncio", "event loop",
         ["/usr/bin/python3", "-c", asyncio_src]),
        ("node http.get, 3 in a row", "event loop",
         ["node", "-e", NODE_CHAIN % url]),
    ], env


def nginx_rows(probe, up, log, tmp):
    from tbnginx import Nginx
    n = Nginx(env_with(probe, up, log),
              location="proxy_pass http://127.0.0.1:%d;" % up)
    try:
        n.start()
        for _ in range(3):
            get(n.port)
    finally:
        n.cleanup()


def haproxy_rows(probe, up, log, tmp):
    port = free_port()
    cfg = os.path.join(tmp, "haproxy.cfg")
    with open(cfg, "w") as f:
        f.write("global\n    nbthread 2\ndefaults\n    mode http\n"
                "    timeout connect 5s\n    timeout client 5s\n"
                "    timeout server 5s\n"
                "frontend fe\n    bind 127.0.0.1:%d\n    default_backend be\n"
                "backend be\n    server up 127.0.0.1:%d\n" % (port, up))
    p = subprocess.Popen(["haproxy", "-db", "-f", cfg],
                         env=env_with(probe, up, log),
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_port(port)
        for _ in range(3):
            get(port)
    finally:
        stop_pid(p)


def apache_rows(probe, up, log, tmp, listens):
    from tbtest.apache import MODDIR, Apache

    class ProbeApache(Apache):
        def _env(self):
            return env_with(probe, up, log)

    a = ProbeApache(mpm="prefork", servers=2)
    extra = ["Listen 127.0.0.1:%d" % free_port() for _ in range(listens - 1)]
    body = "\n".join(extra + [
        "LoadModule proxy_module %s/mod_proxy.so" % MODDIR,
        "LoadModule proxy_http_module %s/mod_proxy_http.so" % MODDIR,
        "KeepAlive Off",
        "ProxyPass /up/ http://127.0.0.1:%d/" % up])
    try:
        a.start(body)
        for _ in range(3):
            get(a.port, "/up/")
    finally:
        a.cleanup()


def epoll_cost(probe, tmp):
    src = os.path.join(tmp, "eploop.c")
    exe = os.path.join(tmp, "eploop")
    with open(src, "w") as f:
        f.write(EPOLL_LOOP)
    subprocess.run(["gcc", "-O2", src, "-o", exe], check=True, timeout=60)
    plain, wrapped = [], []
    for _ in range(9):
        plain.append(float(subprocess.run([exe], capture_output=True,
                                          text=True, timeout=60).stdout))
        env = dict(os.environ, LD_PRELOAD=probe)
        wrapped.append(float(subprocess.run([exe], env=env,
                                            capture_output=True, text=True,
                                            timeout=60).stdout))
    return min(plain), min(wrapped)


def parse(log):
    rows = []
    try:
        with open(log) as f:
            for line in f:
                rows.append(dict(kv.split("=", 1) for kv in line.split()))
    except FileNotFoundError:
        pass
    return rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    a = ap.parse_args()
    os.environ["TB_BUILD"] = os.path.abspath(a.build)
    tmp = tempfile.mkdtemp(prefix="tbevl-", dir="/tmp")
    os.chmod(tmp, 0o755)
    probe = os.path.join(tmp, "evloop_probe.so")
    subprocess.run(["gcc", "-O2", "-shared", "-fPIC",
                    os.path.join(HERE, "evloop_probe.c"), "-o", probe,
                    "-ldl"], check=True, timeout=60)
    up_srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Upstream)
    up = up_srv.server_address[1]
    threading.Thread(target=up_srv.serve_forever, daemon=True).start()
    table = []
    try:
        progs, env = clients(probe, up, "", tmp)
        runs = [(name, kind, (lambda argv=argv, log=None, name=name:
                              run3(argv, dict(env, EVLOOP_LOG=log), tmp,
                                   1 if name.startswith("node") else 3)))
                for name, kind, argv in progs]
        runs += [
            ("nginx proxy_pass", "event loop",
             lambda log: nginx_rows(probe, up, log, tmp)),
            ("haproxy (2 threads)", "event loop",
             lambda log: haproxy_rows(probe, up, log, tmp)),
            ("apache prefork + mod_proxy, 1 Listen", "must wait",
             lambda log: apache_rows(probe, up, log, tmp, 1)),
            ("apache prefork + mod_proxy, 2 Listen", "must wait",
             lambda log: apache_rows(probe, up, log, tmp, 2)),
        ]
        for name, kind, fn in runs:
            log = os.path.join(tmp, "probe-%d.log" % len(table))
            open(log, "w").close()
            os.chmod(log, 0o666)
            t0 = time.monotonic()
            try:
                fn(log=log)
            except Exception as e:          # one row per program anyway
                print("%s: %s" % (name, e), file=sys.stderr)
            rows = parse(log)
            table.append((name, kind, rows, time.monotonic() - t0))
        plain, wrapped = epoll_cost(probe, tmp)
    finally:
        up_srv.shutdown()
        shutil.rmtree(tmp, ignore_errors=True)

    print("| program | what it is | connects | non-blocking | fd in an "
          "epoll set | thread waited in epoll | /proc scan, us (fds) |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: |")
    for name, kind, rows, _ in table:
        def count(k):
            return sum(int(r[k]) for r in rows)
        scans = sorted(int(r["scan_ns"]) for r in rows)
        fds = max((int(r["fds"]) for r in rows), default=0)
        print("| %s | %s | %d | %d | %d | %d | %s |" % (
            name, kind, len(rows), count("nonblock"), count("in_epoll"),
            count("epoll_thr"),
            "%.0f (%d)" % (scans[len(scans) // 2] / 1e3, fds)
            if scans else "-"))
    print("\nepoll_wait(timeout 0), ns per call: plain %.1f, wrapped "
          "(thread flag) %.1f" % (plain, wrapped))


if __name__ == "__main__":
    main()
