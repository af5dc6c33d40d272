"""test_demo.py -- `make run`'s demo (scripts/run.sh with conf/demo/) starts,
serves the PHP app, the CGI script, the export route, the tenant and the status
page, and Ctrl-C stops all it started."""
import os
import re
import signal
import subprocess
import time

from tbtest.apache import PHP_CGI, http_get
from tbtest.env import BUILD, ROOT, free_port, require


def pid_alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def as_from_a_terminal():
    """SIGINT back to its default in the demo's shell, as a terminal gives
    it. A shell that starts with SIGINT ignored cannot trap it (POSIX),
    and a test run started in the background by a non-interactive shell
    (`make test &`) passes that on: there run.sh slept through the
    SIGINT and the test timed out."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


# The demo works end to end and SIGINT (Ctrl-C) stops Apache and Redis.
def test_module_007_01():
    require(PHP_CGI, "php-cgi")
    port = free_port()
    env = dict(os.environ, TB_DEMO_PORT=str(port))
    env.pop("LD_PRELOAD", None)
    p = subprocess.Popen(["sh", os.path.join(ROOT, "scripts", "run.sh"),
                          BUILD], env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True,
                         preexec_fn=as_from_a_terminal)
    out = []
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            line = p.stdout.readline()
            if not line:
                break
            out.append(line)
            if "Ctrl-C stops everything" in line:
                break
        text = "".join(out)
        assert "Ctrl-C stops everything" in text, text
        m = re.search(r"\(pid (\d+)\), Redis on [\d.:]+ \(pid (\d+)\)", text)
        apache_pid, redis_pid = int(m.group(1)), int(m.group(2))
        assert "curl -i -H 'X-API-Key: alice'" in text
        u = "http://127.0.0.1:%d" % port
        r = http_get(u + "/app/", {"X-API-Key": "alice"})
        assert r.status_code == 200
        assert r.json()["decision"] == "allowed"
        assert r.headers["X-RateLimit-Remaining"] == "19"
        r = http_get(u + "/cgi-bin/hello.cgi", {"X-API-Key": "alice"})
        assert "TBUCKET_DECISION=allowed" in r.text
        r = http_get(u + "/app/export.php", {"X-API-Key": "alice"})
        assert r.status_code == 200
        assert r.headers["X-RateLimit-Remaining"] == "8"
        # 20 tokens of main bucket and 30 of "export", 10 per export: the
        # third or (on a slow machine, after refills) fourth is refused.
        codes = [http_get(u + "/app/export.php",
                          {"X-API-Key": "bob"}).status_code
                 for _ in range(4)]
        assert codes[:2] == [200, 200] and 429 in codes, codes
        r = http_get(u + "/app/", {"X-API-Key": "gold-key"})
        assert r.headers["X-RateLimit-Limit"] == "100"
        text = http_get(u + "/tbucket-status").text
        assert "tbucket_decisions_total" in text
        assert 'policy="local"' in text
    finally:
        p.send_signal(signal.SIGINT)
        try:
            rest = p.communicate(timeout=30)[0]
        except subprocess.TimeoutExpired:
            # SIGTERM runs the same cleanup: nothing is left behind.
            p.terminate()
            p.communicate(timeout=30)
            rest = "run.sh did not stop on SIGINT within 30 s"
    assert "stopped Apache and Redis" in rest, rest
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and (pid_alive(apache_pid)
                                           or pid_alive(redis_pid)):
        time.sleep(0.1)
    assert not pid_alive(apache_pid) and not pid_alive(redis_pid)
