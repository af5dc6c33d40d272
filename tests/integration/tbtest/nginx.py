"""tbnginx.py -- an nginx of our own for the shim's client tests.

Each nginx gets a prefix in a short temp dir under /tmp (mode 0755: as
root the workers run as www-data), its own config, pid file, logs and
temp paths, listens on a free loopback port, runs in the foreground
(`daemon off`, master + 2 workers, epoll, `multi_accept on`) and is
stopped by PID. Its one location answers `return 200` without touching
files, unless the caller gives it other directives (proxy_pass). The
access log has one line per request: the connection serial
number, the peer address, the status and the time, so tests count the
connections nginx accepted, per peer and over time.
"""
import os
import subprocess
import tempfile
import time

from tbtest.env import (TempRoot, free_port, read_text, require, stop_pid,
                        wait_port)

NGINX = "/usr/sbin/nginx"

CONF = """daemon off;
master_process on;
worker_processes 2;
{user}
pid {root}/run/nginx.pid;
error_log {root}/logs/error.log warn;
events {{
    use epoll;
    multi_accept on;
    accept_mutex off;
    worker_connections 1024;
}}
http {{
    log_format tb '$connection $remote_addr $status $msec';
    access_log {root}/logs/access.log tb;
    client_body_temp_path {root}/tmp/body;
    proxy_temp_path {root}/tmp/proxy;
    fastcgi_temp_path {root}/tmp/fastcgi;
    uwsgi_temp_path {root}/tmp/uwsgi;
    scgi_temp_path {root}/tmp/scgi;
    keepalive_timeout 0;
    server {{
        listen 127.0.0.1:{port} backlog=4096;
        location / {{
            {location}
        }}
    }}
}}
"""


class Nginx(TempRoot):
    """One nginx with its own prefix, port and logs."""

    def __init__(self, env, port=None,
                 location='return 200 "OK from nginx\\n";'):
        require(NGINX, "nginx")
        self.env = env
        self.port = port or free_port()
        self.root = tempfile.mkdtemp(prefix="tbn-", dir="/tmp")
        os.chmod(self.root, 0o755)
        for d in ("conf", "logs", "run", "tmp"):
            os.makedirs(os.path.join(self.root, d), mode=0o755)
        self.conf = os.path.join(self.root, "conf", "nginx.conf")
        self.access_log = os.path.join(self.root, "logs", "access.log")
        self.error_log = os.path.join(self.root, "logs", "error.log")
        self.proc = None
        self.stderr = None
        user = "user www-data;" if os.geteuid() == 0 else ""
        with open(self.conf, "w") as f:
            f.write(CONF.format(root=self.root, port=self.port, user=user,
                                location=location))

    def start(self):
        self.stderr = open(os.path.join(self.root, "logs", "stderr.log"),
                           "ab")
        self.proc = subprocess.Popen(
            [NGINX, "-p", self.root + "/", "-c", self.conf, "-e",
             self.error_log], env=self.env, stdout=self.stderr,
            stderr=self.stderr)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError("nginx exited %d: %s" % (
                    self.proc.returncode, self.read(self.error_log)))
            if wait_port(self.port, timeout=0.2):
                return self
        raise RuntimeError("nginx did not listen on %d" % self.port)

    def url(self, path="/"):
        return "http://127.0.0.1:%d%s" % (self.port, path)

    read = staticmethod(read_text)

    def requests(self):
        """The access log as (connection serial, peer, status, unix time)
        tuples."""
        out = []
        for line in self.read(self.access_log).splitlines():
            f = line.split()
            if len(f) == 4:
                out.append((int(f[0]), f[1], int(f[2]), float(f[3])))
        return out

    def stop(self):
        stop_pid(self.proc)
        if self.stderr is not None:
            self.stderr.close()
            self.stderr = None

