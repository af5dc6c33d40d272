"""tbtest/apache.py -- an Apache httpd of our own for the module tests.

Each Apache gets a self-contained server root in a short temp dir under
/tmp (mode 0755: the children run as www-data, and pytest's own tmp dirs
are 0700), loads mod_tbucket.so from $TB_BUILD, listens on a free
loopback port, runs in the foreground under setsid (prefork signals its
whole process group on shutdown) and is stopped by PID. The error log is
read back so that every test can assert it is clean apart from the TB tags
it declares, as httpd's own test/pyhttpd does with ignore_recent(lognos=).

Every apache2 the tests run, also `apache2 -t` and `apache2 -M`, goes
through scripts/apache2.sh (apache2_argv(), run_apache2()): for a
sanitizer build of the module it preloads the sanitizer runtimes into
apache2 only (never into curl or python), and any sanitizer report fails
the log check.
"""
import datetime
import os
import re
import signal
import subprocess
import tempfile
import time

import pytest

from tbtest.env import (BUILD, ROOT, TempRoot, child_pids, free_port,
                         read_text, require, wait_port, wait_until)

APACHE = "/usr/sbin/apache2"
APACHE2_SH = os.path.join(ROOT, "scripts", "apache2.sh")
MODDIR = "/usr/lib/apache2/modules"
PHP_CGI = "/usr/bin/php-cgi"

LEVELS_BAD = ("warn", "error", "crit", "alert", "emerg")
# MPM sizing notices (AH00161 MaxRequestWorkers reached, AH10159 within
# MinSpareThreads of it): tuning hints that slow sanitizer runs provoke,
# never a sign of a module fault.
BENIGN_TAGS = ("AH00161", "AH10159")
# The event MPM's own race at an ungraceful stop: SIGTERM makes the child
# close the sockets its workers are serving (close_worker_sockets), and a
# worker that had just sent a response and was starting its lingering
# close then adds a closed descriptor to its pollset (EBADF, AH03092).
# Bare Apache 2.4 without our module logs it at 9 of 120 stops made right
# after a response, 4-5 ms after the SIGTERM, and at none of 120 made
# 0.3 s later. Benign only inside a stop(): anywhere else it is a fault.
STOP_RACE_TAGS = ("AH03092",)
# A child killed by a fault signal (SEGV, ABRT, BUS, FPE, ILL). httpd logs
# it at notice (AH00052), below the level filter, so it is matched on its
# own; a child a test kills (SIGKILL, 9) is not a fault.
CHILD_FAULT = re.compile(r"AH00052: child pid \d+ exit signal .*\((4|6|7|8|11)\)")
LOG_LINE = re.compile(r"^\[[^\]]*\] \[(?:(\w*):)?(\w+)\]")
LOG_TIME = re.compile(r"^\[(\w{3} \w{3} \d\d \d\d:\d\d:\d\d\.\d+ \d{4})\]")


def log_line_time(line):
    """The wall-clock time of an error-log line (httpd's default
    ErrorLogFormat, local time, microseconds), or None."""
    m = LOG_TIME.match(line)
    if not m:
        return None
    try:
        return datetime.datetime.strptime(
            m.group(1), "%a %b %d %H:%M:%S.%f %Y").timestamp()
    except ValueError:
        return None

# Fixture files every server root gets. The PHP and CGI scripts print
# what the application sees of the module: the exact TBUCKET_* names and
# any REDIRECT_ copies.
PHP_ENV = r"""<?php
header('Content-Type: application/json');
$out = array();
foreach (array('TBUCKET_DECISION', 'TBUCKET_REMAINING',
               'REDIRECT_TBUCKET_DECISION', 'REDIRECT_STATUS') as $k) {
    $v = getenv($k);
    $out[$k] = ($v === false) ? null : $v;
}
$out['script'] = basename(__FILE__);
echo json_encode($out), "\n";
"""

CGI_ENV = r"""#!/bin/sh
printf 'Content-Type: application/json\r\n\r\n'
printf '{"TBUCKET_DECISION": "%s", "TBUCKET_REMAINING": "%s", "script": "env.cgi"}\n' \
    "${TBUCKET_DECISION:-}" "${TBUCKET_REMAINING:-}"
"""

PHP_WRAPPER = """#!/bin/sh
exec %s
""" % PHP_CGI

# The two threaded MPMs take the same settings.
THREADED_TUNING = """StartServers {servers}
ServerLimit {servers}
ThreadsPerChild 8
ThreadLimit 8
MinSpareThreads 8
MaxSpareThreads {threads}
MaxRequestWorkers {threads}
"""

MPM_TUNING = {
    "prefork": """StartServers {servers}
MinSpareServers {servers}
MaxSpareServers {servers}
ServerLimit {limit}
MaxRequestWorkers {limit}
""",
    "worker": THREADED_TUNING,
    "event": THREADED_TUNING,
}


def server_root_conf(root, port, log_level="warn"):
    """The directives every apache2 of ours starts with: its own server
    root, one loopback port, the run files and the error log (logs/) in
    that root, since nothing else sets them without systemd, and children
    as www-data. Lines without a final newline."""
    return "\n".join([
        'ServerRoot "%s"' % root,
        "ServerName 127.0.0.1",
        "Listen 127.0.0.1:%d" % port,
        "PidFile %s/run/httpd.pid" % root,
        "DefaultRuntimeDir %s/run" % root,
        "Mutex file:%s/run default" % root,
        "ScoreBoardFile %s/run/scoreboard" % root,
        "ErrorLog %s/logs/error.log" % root,
        "LogLevel %s" % log_level,
        "User www-data",
        "Group www-data",
    ])


def apache2_argv(so, *args):
    """The command line that runs apache2 with args for the module build
    `so` (the mod_tbucket.so its configuration loads)."""
    require(APACHE, "apache2")
    return [APACHE2_SH, so] + [str(a) for a in args]


def run_apache2(so, *args, env=None, timeout=30):
    """Run apache2 to completion (-t, -M) for the module build `so`;
    returns the CompletedProcess, output as text. env replaces the
    environment (scripts/apache2.sh still sets the preload)."""
    return subprocess.run(apache2_argv(so, *args), env=env,
                          capture_output=True, text=True, timeout=timeout)


class Apache(TempRoot):
    """One apache2 with its own server root, port and error log."""

    def __init__(self, mpm="event", servers=2, build=None,
                 log_level="warn tbucket:info", port=None, modules=(),
                 keepalive=None, cpus=None):
        require(APACHE, "apache2")
        require(os.path.join(MODDIR, "mod_mpm_%s.so" % mpm), "apache2")
        self.mpm = mpm
        self.servers = servers
        self.build = build or BUILD
        self.so = os.path.join(self.build, "mod_tbucket.so")
        if not os.path.exists(self.so):
            pytest.fail("%s is missing: run make" % self.so)
        self.log_level = log_level
        # More modules to load: a name from MODDIR ("proxy_fcgi") or a
        # (module name, path) pair (tbtest/php.py adds mod_php's).
        self.modules = list(modules)
        # (MaxKeepAliveRequests, KeepAliveTimeout in seconds), or None
        # for MaxKeepAliveRequests 0 (unlimited) and the default timeout.
        self.keepalive = keepalive
        # CPUs to pin apache2 to (taskset -c, as the bench does), or None.
        self.cpus = cpus
        self.port = port or free_port()
        self.root = tempfile.mkdtemp(prefix="tba-", dir="/tmp")
        os.chmod(self.root, 0o755)
        for d in ("conf", "logs", "run", "htdocs", "cgi-bin", "php-bin"):
            os.makedirs(os.path.join(self.root, d), exist_ok=True)
            os.chmod(os.path.join(self.root, d), 0o755)
        self.conf = os.path.join(self.root, "conf", "httpd.conf")
        self.error_log = os.path.join(self.root, "logs", "error.log")
        self.access_log = os.path.join(self.root, "logs", "access.log")
        self.proc = None
        self.log_mark = 0
        # (SIGTERM sent, parent reaped) wall-clock times of each stop():
        # the only place the event MPM's stop race (STOP_RACE_TAGS) is
        # benign. Times, not log offsets: tests unlink the log.
        self.stop_windows = []
        self._fixtures()

    # ---- files ---------------------------------------------------------

    def write_file(self, rel, text, mode=0o644):
        path = os.path.join(self.root, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        d = os.path.dirname(path)
        while d.startswith(self.root) and d != self.root:
            os.chmod(d, 0o755)
            d = os.path.dirname(d)
        with open(path, "w") as f:
            f.write(text)
        os.chmod(path, mode)
        return path

    def _fixtures(self):
        self.write_file("htdocs/index.html", "<p>hello</p>\n")
        for d in ("", "a/", "b/", "api/", "api/export/", "limited/",
                  "shadow/", "free/", "deep/inner/"):
            self.write_file("htdocs/%sok.txt" % d, "ok\n")
        self.write_file("htdocs/app/index.php", PHP_ENV)
        self.write_file("htdocs/app/export.php", PHP_ENV)
        self.write_file("cgi-bin/env.cgi", CGI_ENV, 0o755)
        self.write_file("php-bin/php-cgi", PHP_WRAPPER, 0o755)
        self.write_file("htdocs/err429.html", "custom 429 page\n")

    # ---- configuration -------------------------------------------------

    def config_text(self, body, mpm=None):
        mpm = mpm or self.mpm
        r = self.root
        mods = ["authz_core", "authz_host", "mime", "alias", "actions",
                "env", "headers", "dir", "setenvif", "rewrite"]
        if mpm == "prefork":
            mods.append("cgi")
        else:
            mods.append("cgid")
        lines = [
            server_root_conf(r, self.port, self.log_level),
            "LoadModule mpm_%s_module %s/mod_mpm_%s.so" % (mpm, MODDIR, mpm),
        ]
        for m in mods + [m for m in self.modules if isinstance(m, str)]:
            lines.append("LoadModule %s_module %s/mod_%s.so" % (m, MODDIR, m))
        for m in self.modules:
            if not isinstance(m, str):
                lines.append("LoadModule %s %s" % tuple(m))
        if self.keepalive:
            keepalive = ["MaxKeepAliveRequests %d" % self.keepalive[0],
                         "KeepAliveTimeout %d" % self.keepalive[1]]
        else:
            keepalive = ["MaxKeepAliveRequests 0"]
        lines += [
            "LoadModule tbucket_module %s" % self.so,
            "TypesConfig /etc/mime.types",
            MPM_TUNING[mpm].format(servers=self.servers,
                                   limit=max(self.servers, 4),
                                   threads=8 * self.servers),
            "KeepAlive On",
        ] + keepalive + [
            "Timeout 10",
            'DocumentRoot "%s/htdocs"' % r,
            "DirectoryIndex index.html index.php",
            "<Directory />",
            "    AllowOverride None",
            "    Require all denied",
            "</Directory>",
            '<Directory "%s/htdocs">' % r,
            "    AllowOverride Limit",
            "    Require all granted",
            "</Directory>",
            '<Directory "%s/cgi-bin">' % r,
            "    Require all granted",
            "</Directory>",
            '<Directory "%s/php-bin">' % r,
            "    Require all granted",
            "</Directory>",
            'ScriptAlias /cgi-bin/ "%s/cgi-bin/"' % r,
            'ScriptAlias /php-bin/ "%s/php-bin/"' % r,
            "AddHandler application/x-httpd-php .php",
            "Action application/x-httpd-php /php-bin/php-cgi",
            'LogFormat "%h %>s %{TBUCKET_DECISION}e %U %P" tb',
            "CustomLog %s tb" % self.access_log,
        ]
        if mpm != "prefork":
            lines.append("ScriptSock %s/run/cgid.sock" % r)
        return "\n".join(lines) + "\n\n" + body + "\n"

    def write_config(self, body, mpm=None):
        text = self.config_text(body, mpm)
        with open(self.conf, "w") as f:
            f.write(text)
        return self.conf

    def configtest(self, body, mpm=None):
        """Run apache2 -t on a config; returns (exit code, output)."""
        path = os.path.join(self.root, "conf", "test.conf")
        with open(path, "w") as f:
            f.write(self.config_text(body, mpm))
        p = run_apache2(self.so, "-t", "-f", path)
        return p.returncode, p.stdout + p.stderr

    # ---- process -------------------------------------------------------

    def start(self, body=None):
        if body is not None:
            self.write_config(body)
        self.stderr = open(os.path.join(self.root, "logs", "stderr.log"),
                           "ab")
        pin = ["taskset", "-c", self.cpus] if self.cpus else []
        self.proc = subprocess.Popen(
            pin + ["setsid"] + apache2_argv(self.so, "-f", self.conf,
                                            "-DFOREGROUND"),
            env=self._env(), stdout=self.stderr, stderr=self.stderr)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError("apache2 exited %d:\n%s" % (
                    self.proc.returncode, self.read_log()[-3000:]
                    + self.read_stderr()[-2000:]))
            if wait_port(self.port, timeout=0.2):
                self._wait_resumed(deadline)
                return self
        raise RuntimeError("apache2 did not listen on %d" % self.port)

    def _wait_resumed(self, deadline):
        """The parent binds its port before its MPM sets its signal
        handlers, and a SIGUSR1 in between (a graceful restart sent as soon
        as the port answers) kills it, SIGUSR1's default action: seen on a
        loaded run. The MPM logs "resuming normal operations" once they are
        set, so wait for that line (bounded: a config whose LogLevel hides
        it only costs the wait)."""
        end = min(deadline, time.monotonic() + 5)
        while self._resumed() == 0 and time.monotonic() < end:
            if self.proc.poll() is not None:
                return
            time.sleep(0.02)

    def _env(self):
        """The environment apache2 starts with (scripts/apache2.sh sets
        its preload); a subclass may add to it."""
        return dict(os.environ)

    def _resumed(self):
        return self.read_log().count("resuming normal operations")

    def graceful(self, body=None, timeout=20):
        """Graceful restart (SIGUSR1, as apachectl graceful), optionally
        with a new config; returns when the new generation serves."""
        if body is not None:
            self.write_config(body)
        before = self._resumed()
        os.kill(self.proc.pid, signal.SIGUSR1)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError("apache2 exited on graceful restart:\n"
                                   + self.read_log()[-3000:])
            if self._resumed() > before and wait_port(self.port, 0.2):
                return self
            time.sleep(0.05)
        raise RuntimeError("graceful restart did not complete")

    def child_pids(self):
        """PIDs of this apache's children."""
        return child_pids(self.proc.pid)

    def stop(self):
        if self.proc is None:
            return
        if self.proc.poll() is None:
            sent = time.time()
            try:
                os.kill(self.proc.pid, signal.SIGTERM)
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                # setsid made the parent a group leader: its group is ours.
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=5)
            except ProcessLookupError:
                pass
            self.stop_windows.append((sent, time.time()))
        # Whatever of its group outlived the parent (a parent that died,
        # say, leaves its children behind): setsid made the group ours.
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        self.proc = None
        self.stderr.close()

    # ---- HTTP ----------------------------------------------------------

    def url(self, path):
        return "http://127.0.0.1:%d%s" % (self.port, path)

    # ---- logs ----------------------------------------------------------

    def read_log(self):
        return read_text(self.error_log)

    def read_stderr(self):
        return read_text(os.path.join(self.root, "logs", "stderr.log"))

    def access_text(self, until=None, timeout=5.0):
        """The access log's text; with until, read again (bounded) until
        until(text) holds. log_transaction writes a request's line after
        its response has gone, so a client can hold its answer before
        the line exists, more so under a sanitizer."""
        def ready():
            text = read_text(self.access_log)
            return (text,) if until is None or until(text) else None

        got = wait_until(ready, timeout=timeout)
        return got[0] if got else read_text(self.access_log)

    def mark_log(self):
        """Later log checks only look at lines written after this."""
        self.log_mark = len(self.read_log())

    def log_since_mark(self):
        return self.read_log()[self.log_mark:]

    def bad_lines(self, allowed=(), text=None):
        """Error-log lines at warn and above that carry none of the
        allowed tags, plus any sanitizer report and any child a fault
        signal killed."""
        text = self.read_log() if text is None else text
        bad = []
        for line in text.splitlines():
            if ("AddressSanitizer" in line or "runtime error:" in line
                    or CHILD_FAULT.search(line)):
                bad.append(line)
                continue
            m = LOG_LINE.match(line)
            if not m or m.group(2) not in LEVELS_BAD:
                continue
            if any(tag in line for tag in tuple(allowed) + BENIGN_TAGS):
                continue
            if self.in_stop(line):
                continue
            bad.append(line)
        for line in self.read_stderr().splitlines():
            if "AddressSanitizer" in line or "runtime error:" in line:
                bad.append(line)
        return bad

    def in_stop(self, line):
        """Whether line is the event MPM's stop race (STOP_RACE_TAGS)
        logged while a stop() was under way (a 50 ms margin each side
        for the log's clock: same machine, microsecond stamps)."""
        if not any(tag in line for tag in STOP_RACE_TAGS):
            return False
        t = log_line_time(line)
        return t is not None and any(
            a - 0.05 <= t <= b + 0.05 for a, b in self.stop_windows)

    def assert_log_clean(self, allowed=()):
        bad = self.bad_lines(allowed)
        assert not bad, "unexpected error-log lines:\n" + "\n".join(bad)


STATUS = """
<Location /tbucket-status>
    SetHandler tbucket-status
</Location>
"""


def limited_conf(url, prefix, inner, key="X-Key", status=True,
                 where="/limited"):
    """The body most module tests start from: TBucketRedis url (timeout
    500 ms) and TBucketPrefix, one Location `where` limited by the
    directives in inner and keyed on the request header `key` (None: the
    default key), and the status page (status=False: none)."""
    return """
TBucketRedis %s timeout=500
TBucketPrefix %s
<Location %s>
    TBucketEnable On
%s%s
</Location>
%s""" % (url, prefix, where,
         '    TBucketKey "%%{HTTP:%s}"\n' % key if key else "", inner,
         STATUS if status else "")


def start_servers(apache_factory, n, threads, body):
    """n prefork Apaches of `threads` children each (a child per client
    connection, so no request waits for one to be spawned), started with
    body; (the servers, the URL of /limited/ok.txt on each)."""
    servers = []
    for _ in range(n):
        a = apache_factory(mpm="prefork", servers=threads)
        servers.append(a.start(body))
    return servers, [a.url("/limited/ok.txt") for a in servers]


def assert_refused(a, body, *words):
    """apache2 -t of a (an Apache) refuses body, naming every word;
    returns the output."""
    rc, out = a.configtest(body)
    assert rc != 0, out
    for w in words:
        assert w in out, out
    return out


def http_get(url, headers=None, timeout=10, **kw):
    """One GET on a fresh connection (so prefork spreads requests)."""
    import requests
    h = {"Connection": "close"}
    h.update(headers or {})
    return requests.get(url, headers=h, timeout=timeout, **kw)


def tokens(rclient, key):
    """The tokens field of a bucket hash in Redis, or None; rounded to
    two decimals so that the refill of a slow (1/h) test rate between two
    requests does not matter."""
    v = rclient.hget(key, "tokens")
    return None if v is None else round(float(v), 2)


def metric(text, name, **labels):
    """The value of one sample of a Prometheus text page (0 if absent)."""
    want = ",".join('%s="%s"' % kv for kv in sorted(labels.items()))
    for line in text.splitlines():
        if line.startswith("#") or not line.startswith(name):
            continue
        head, _, value = line.rpartition(" ")
        if "{" in head:
            n, _, rest = head.partition("{")
            got = ",".join(sorted(rest.rstrip("}").split(",")))
        else:
            n, got = head, ""
        if n == name and got == want:
            return float(value)
    return 0.0


def metric_sum(text, name):
    """The sum of every sample of one family of a Prometheus text page
    (every virtual host, every label)."""
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            total += float(line.rsplit(" ", 1)[1])
    return total


