"""tbtest/env.py -- where things are (the source tree, the build, the test
programs), what the test programs print, free loopback ports, processes by
PID, and a real redis-server.

Every server is started in a temp dir on a free loopback port, waited for
until it answers, and stopped by PID on teardown. Nothing here mocks Redis.
If a required binary is missing the tests fail and name the package: a skip
would hide a gap in CI.
"""
import os
import shutil
import signal
import socket
import subprocess
import time

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..",
                                    ".."))
BUILD = os.environ.get("TB_BUILD", os.path.join(ROOT, "build"))
# The test programs (tests/integration/progs/), built by make.
PROGS = os.path.join(BUILD, "progs")
REDIS_SERVER = "/usr/bin/redis-server"


def require(path, package):
    """Fail (not skip) when a binary the tests need is missing."""
    if not os.path.exists(path):
        pytest.fail("%s is missing: apt-get install %s" % (path, package))
    return path


def comma_locale(root):
    """A locale whose decimal point is a comma (de_DE.UTF-8), compiled by
    localedef into root and made visible to child processes through
    LOCPATH, without touching the system's locales. Returns its name."""
    require("/usr/share/i18n/locales/de_DE", "locales")
    out = os.path.join(str(root), "de_DE.UTF-8")
    if not os.path.isdir(out):
        r = subprocess.run(["localedef", "-i", "de_DE", "-f", "UTF-8", out],
                           capture_output=True, text=True, timeout=120)
        # localedef exits 1 for warnings and still writes the locale.
        if not os.path.isdir(out):
            pytest.fail("localedef failed (rc %d): %s" % (r.returncode,
                                                         r.stderr[-500:]))
    return "de_DE.UTF-8"


def lua_script(name):
    """The text of the script `name` ("tb_gcra.lua") as it ships: the
    prelude and body that make joins into build/lua/, byte for byte the
    text libtb embeds and hashes for EVALSHA."""
    path = os.path.join(BUILD, "lua", name)
    if not os.path.exists(path):
        pytest.fail("%s is missing: run make" % path)
    with open(path, "rb") as f:
        return f.read()


def prog(name):
    """The path of a test program make builds; fail if it is missing."""
    path = os.path.join(PROGS, name)
    if not os.path.exists(path):
        pytest.fail("%s is missing: run make" % path)
    return path


def parse_kv(line):
    """The key=value words of a test program's output line as a dict,
    values as int where they parse: 'ok a=1 b=x' -> {'a': 1, 'b': 'x'}."""
    out = {}
    for tok in line.split():
        if "=" not in tok:
            continue
        k, v = tok.split("=", 1)
        try:
            out[k] = int(v)
        except ValueError:
            out[k] = v
    return out


def free_port():
    """A free TCP port on 127.0.0.1 (bound then released)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port, timeout=10.0, host="127.0.0.1"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection((host, port), timeout=0.2):
                return True
        except OSError:
            time.sleep(0.02)
    return False


def wait_until(check, timeout=5.0, step=0.02):
    """check()'s first true value within timeout seconds, else its last:
    for effects that follow a response (log_transaction's work, counters
    counted once Redis has answered, a process that has yet to exit)."""
    deadline = time.monotonic() + timeout
    while True:
        got = check()
        if got or time.monotonic() > deadline:
            return got
        time.sleep(step)


def stop_pid(proc, sig=signal.SIGTERM, timeout=10.0, group=False):
    """Stop a process we started, by PID; SIGKILL if it will not go. With
    group, its whole process group (one it leads: start_new_session), and
    whatever of the group outlives it is killed too."""
    if proc is None or proc.poll() is not None:
        return
    kill = os.killpg if group else os.kill
    try:
        kill(proc.pid, signal.SIGCONT)
        kill(proc.pid, sig)
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=5)
    except ProcessLookupError:
        pass
    if group:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def read_text(path):
    """The text of a file (a log, say), bad bytes replaced; "" when it
    does not exist (yet)."""
    try:
        with open(path, errors="replace") as f:
            return f.read()
    except FileNotFoundError:
        return ""


def fetched(script, where, files):
    """Packages a scripts/fetch-*.sh unpacks, without installing them:
    runs script (its path) on where when one of files (paths under
    where/root) is missing. (where/root, None) when every file is there,
    else (where/root, the script's CompletedProcess) for the caller to
    report."""
    root = os.path.join(where, "root")
    want = [os.path.join(root, f) for f in files]
    if all(os.path.exists(p) for p in want):
        return root, None
    p = subprocess.run(["sh", script, where], capture_output=True,
                       text=True, timeout=300)
    if p.returncode != 0 or not all(os.path.exists(x) for x in want):
        return root, p
    return root, None


def child_pids(ppid):
    """PIDs of the processes whose parent is ppid (from /proc)."""
    pids = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % d) as f:
                fields = f.read().rsplit(")", 1)[1].split()
            if int(fields[1]) == ppid:
                pids.append(int(d))
        except (OSError, IndexError, ValueError):
            continue
    return pids


def factory(create, finish, then=None):
    """The body of a factory fixture (conftest.py): yields a function
    that makes a server with create(*args, **kw), records it, and returns
    it (or then(it): start it, check it); at teardown calls finish on each
    one made, also those whose start failed, and raises the first error
    a finish raised once all have run."""
    made = []

    def make(*args, **kw):
        x = create(*args, **kw)
        made.append(x)
        return then(x) if then else x

    yield make
    failed = []
    for x in made:
        try:
            finish(x)
        except Exception as e:      # the others are still finished
            failed.append(e)
    if failed:
        raise failed[0]


CHROMIUM = "/usr/bin/chromium"


def chromium(args, timeout=90):
    """Run headless Chromium once with args (["--dump-dom", url], ...) in
    its own session and profile; the whole process group is killed, by
    the PID we started, however it ends. (exit code, stdout, stderr)."""
    import tempfile
    require(CHROMIUM, "chromium")
    profile = tempfile.mkdtemp(prefix="tb-chromium-")
    cmd = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu",
           "--disable-quic", "--no-first-run",
           "--disable-background-networking", "--disable-component-update",
           "--disable-sync", "--user-data-dir=" + profile] + list(args)
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate(timeout=10)
        pytest.fail("chromium did not finish in %ds" % timeout)
    finally:
        # Helpers (crashpad, zygote) share the session we made.
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        shutil.rmtree(profile, ignore_errors=True)
    return proc.returncode, out.decode("utf-8", "replace"), \
        err.decode("utf-8", "replace")


class TempRoot:
    """A server of the tests whose files live in a temp dir of its own,
    self.root: cleanup() stops it (the subclass's stop()) and removes the
    dir."""

    def cleanup(self):
        self.stop()
        shutil.rmtree(self.root, ignore_errors=True)


class Redis:
    """A redis-server of our own on a free loopback port in a temp dir.
    prefix is put before its command line (bench/run.py pins it to CPUs
    with taskset)."""

    def __init__(self, tmpdir, port=None, extra=None, password=None,
                 prefix=()):
        require(REDIS_SERVER, "redis-server")
        self.dir = str(tmpdir)
        self.port = port or free_port()
        self.extra = list(extra or [])
        self.password = password
        self.prefix = list(prefix)
        if password:
            self.extra.append("requirepass %s" % password)
        self.proc = None
        os.makedirs(self.dir, exist_ok=True)
        self.conf = os.path.join(self.dir, "redis.conf")

    @property
    def url(self):
        return "redis://127.0.0.1:%d" % self.port

    def start(self):
        lines = [
            "bind 127.0.0.1",
            "port %d" % self.port,
            "dir %s" % self.dir,
            "save \"\"",
            "appendonly no",
            "daemonize no",
            "logfile %s" % os.path.join(self.dir, "redis.log"),
            "enable-debug-command local",
        ] + list(self.extra)
        with open(self.conf, "w") as f:
            f.write("\n".join(lines) + "\n")
        self.proc = subprocess.Popen(self.prefix + [REDIS_SERVER, self.conf],
                                     stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError("redis-server exited: see %s" % self.conf)
            try:
                if self.client().ping():
                    return self
            except Exception:
                time.sleep(0.02)
        raise RuntimeError("redis-server did not answer on %d" % self.port)

    def client(self, **kw):
        import redis
        kw.setdefault("socket_timeout", 5)
        if self.password:
            kw.setdefault("password", self.password)
        return redis.Redis(host="127.0.0.1", port=self.port, **kw)

    def stop(self, sig=signal.SIGTERM):
        stop_pid(self.proc, sig)

    def kill9(self):
        if self.proc and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=5)

    def sigstop(self):
        os.kill(self.proc.pid, signal.SIGSTOP)

    def sigcont(self):
        os.kill(self.proc.pid, signal.SIGCONT)


F2B_REGEX = "/usr/bin/fail2ban-regex"


def fail2ban_hosts(log_path):
    """The host (address or network) fail2ban-regex finds with our filter
    (conf/fail2ban/filter.d/mod-tbucket.conf) in an error log, one per
    line that matches; skips when fail2ban is not installed."""
    require(F2B_REGEX, "fail2ban")
    filt = os.path.join(ROOT, "conf", "fail2ban", "filter.d",
                        "mod-tbucket.conf")
    p = subprocess.run([F2B_REGEX, "-o", "ip", log_path, filt],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    return [ln.strip() for ln in p.stdout.splitlines() if ln.strip()]
