"""tbtest/php.py -- real PHP stacks behind the module: mod_php under the
prefork MPM, and php-fpm behind mod_proxy_fcgi under the event MPM.

Neither package is installed: scripts/fetch-php.sh unpacks
libapache2-mod-php8.2 and php8.2-fpm (`apt-get download`, `dpkg -x`)
into $TB_PHP_DIR (default /var/cache/tbucket-php), since installing
libapache2-mod-php8.2 switches the system's Apache to prefork. php_root()
runs the script when the unpacked files are missing, and fails the test
naming the package when they cannot be had: a skip would hide a gap.

Both stacks run PHP without a php.ini of Debian's and without conf.d (no
opcache, no extra extensions), each with the same small php.ini of ours,
so the two compare like for like. Pages (install_pages()):

  /app/heavy.php   the work of a real page: about 25 ms of CPU, always the
                   same (a table of chained SHA-1 digests, sorted, escaped
                   and rendered; 25 KB of HTML)
  /app/sleep.php   ?ms=N: holds its worker N ms (at most 10 s), no CPU
  /app/env.php     what PHP sees of the module, by getenv() and $_SERVER
  /health.php      a tiny page: the health check, the critical client

ModPhp(apache) loads mod_php into an Apache(mpm="prefork") and gives its
config lines; PhpFpm is a php-fpm process of our own (its own [global]
and one static pool on a unix socket readable by www-data, in a temp dir
under /tmp, stopped by PID), and gives the lines that hand .php files to
it. Sizes and CPUs are parameters, so bench/overload.py runs the same
stacks pinned and sized as it wants. PhpFpm(pools=...) makes several
pools instead, each on its own socket and with its own nice value
(process.priority), for the split that gives critical requests PHP
workers of their own; split_conf() routes them by an <If>.
"""
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time

import pytest

from tbtest.env import ROOT, TempRoot, child_pids, fetched, stop_pid

PHP_DIR = os.environ.get("TB_PHP_DIR", "/var/cache/tbucket-php")
FETCH_PHP = os.path.join(ROOT, "scripts", "fetch-php.sh")
MOD_PHP_SO = "usr/lib/apache2/modules/libphp8.2.so"
PHP_FPM = "usr/sbin/php-fpm8.2"

HEAVY_PHP = r"""<?php
/* heavy.php: the work of a real page, the same every time. Builds a
 * 300-row table whose 8 cells per row are chained SHA-1 digests (20
 * rounds each), sorts it by a score, renders the first 100 rows as
 * escaped HTML and ends with a digest of the whole page: about 25 ms of
 * CPU without opcache on a 2-vCPU Debian 12 machine. ?rows=N changes the
 * size (1..5000). */
$rows = isset($_GET['rows']) ? max(1, min(5000, (int)$_GET['rows'])) : 300;
$data = array();
$h = 'tbucket';
for ($i = 0; $i < $rows; $i++) {
    $cells = array();
    for ($j = 0; $j < 8; $j++) {
        for ($round = 0; $round < 20; $round++) {
            $h = sha1($h . $i . ':' . $j . ':' . $round);
        }
        $cells[] = $h;
    }
    $data[] = array('id' => $i, 'cells' => $cells,
                    'score' => hexdec(substr($cells[1], 0, 6)) / 1677.7216);
}
usort($data, function ($a, $b) { return $a['score'] <=> $b['score']; });
$html = array();
foreach ($data as $r) {
    $tds = '';
    foreach ($r['cells'] as $c) {
        $tds .= '<td>' . htmlspecialchars(strtoupper(substr($c, 0, 12)))
                . '</td>';
    }
    $html[] = sprintf('<tr id="r%d"><th>%s</th>%s<td>%s</td></tr>', $r['id'],
                      htmlspecialchars($r['cells'][0]), $tds,
                      number_format($r['score'], 3));
}
$decision = getenv('TBUCKET_DECISION');
echo "<!DOCTYPE html>\n<title>heavy</title>\n<table>\n";
echo implode("\n", array_slice($html, 0, 100)), "\n</table>\n";
printf("<p>rows %d digest %s decision %s</p>\n", $rows,
       md5(implode('', $html)), $decision === false ? '-' : $decision);
"""

SLEEP_PHP = r"""<?php
/* sleep.php?ms=N: holds its worker N ms (at most 10 s) without CPU. */
$ms = isset($_GET['ms']) ? max(0, min(10000, (int)$_GET['ms'])) : 1000;
usleep($ms * 1000);
echo "slept $ms\n";
"""

HEALTH_PHP = r"""<?php
$d = getenv('TBUCKET_DECISION');
echo 'ok ', ($d === false ? '-' : $d), "\n";
"""

# What PHP sees of the module, both ways it can look: getenv() (mod_php:
# Apache's subprocess_env; php-fpm: the FastCGI parameters) and $_SERVER.
ENV_PHP = r"""<?php
header('Content-Type: application/json');
$out = array('sapi' => php_sapi_name());
foreach (array('TBUCKET_DECISION', 'TBUCKET_REMAINING',
               'REDIRECT_TBUCKET_DECISION') as $k) {
    $v = getenv($k);
    $out['getenv'][$k] = ($v === false) ? null : $v;
    $out['server'][$k] = isset($_SERVER[$k]) ? $_SERVER[$k] : null;
}
echo json_encode($out), "\n";
"""

PHP_INI = """; php.ini of the test stacks (mod_php and php-fpm alike)
display_errors = Off
log_errors = On
error_log = {log}
expose_php = Off
memory_limit = 128M
max_execution_time = 30
"""

FPM_GLOBAL = """[global]
pid = {dir}/php-fpm.pid
error_log = {dir}/php-fpm.log
log_level = notice
daemonize = no
process_control_timeout = 5
"""

FPM_POOL = """
[{name}]
user = www-data
group = www-data
listen = {sock}
listen.owner = www-data
listen.group = www-data
listen.mode = 0660
listen.backlog = 511
pm = static
pm.max_children = {children}
request_terminate_timeout = 30
catch_workers_output = yes
"""


def php_root():
    """The directory the two packages are unpacked into (DIR/root), after
    running scripts/fetch-php.sh if either binary is missing; fails the
    test, naming the packages, if they cannot be had."""
    root, failed = fetched(FETCH_PHP, PHP_DIR, (MOD_PHP_SO, PHP_FPM))
    if failed:
        pytest.fail("libapache2-mod-php8.2 / php8.2-fpm are not unpacked "
                    "in %s and scripts/fetch-php.sh failed (rc %d): %s"
                    % (PHP_DIR, failed.returncode,
                       (failed.stdout + failed.stderr)[-800:]))
    return root


def install_pages(apache):
    """Write the PHP pages (module docstring) into an Apache's htdocs."""
    apache.write_file("htdocs/app/heavy.php", HEAVY_PHP)
    apache.write_file("htdocs/app/sleep.php", SLEEP_PHP)
    apache.write_file("htdocs/app/env.php", ENV_PHP)
    apache.write_file("htdocs/health.php", HEALTH_PHP)


def write_ini(path, log):
    """Our php.ini at path, logging PHP errors to log."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    os.chmod(os.path.dirname(path), 0o755)
    with open(path, "w") as f:
        f.write(PHP_INI.format(log=log))
    os.chmod(path, 0o644)
    return path


class ModPhp:
    """mod_php (libphp8.2.so, unpacked) in one of our Apaches, which must
    use the prefork MPM: Debian's mod_php is not thread-safe and refuses
    a threaded MPM. Adds the LoadModule line to the Apache and writes the
    pages; conf() gives the lines for the config body."""

    def __init__(self, apache):
        if apache.mpm != "prefork":
            pytest.fail("mod_php needs the prefork MPM, not %s" % apache.mpm)
        self.so = os.path.join(php_root(), MOD_PHP_SO)
        self.apache = apache
        entry = ("php_module", self.so)
        if entry not in apache.modules:
            apache.modules.append(entry)
        # PHP's own log: the children (www-data) write it.
        self.log = os.path.join(apache.root, "logs", "php.log")
        open(self.log, "a").close()
        shutil.chown(self.log, "www-data", "www-data")
        self.ini_dir = os.path.join(apache.root, "php")
        write_ini(os.path.join(self.ini_dir, "php.ini"), self.log)
        install_pages(apache)

    def conf(self):
        """.php files to mod_php, with our php.ini."""
        return ('PHPIniDir "%s"\n'
                '<FilesMatch "\\.php$">\n'
                '    SetHandler application/x-httpd-php\n'
                '</FilesMatch>\n' % self.ini_dir)


class PhpFpm(TempRoot):
    """One php-fpm master (`php-fpm8.2 -F -y CONF`, foreground) with a
    static pool of `children` workers (www-data) on a unix socket, or
    with `pools`, (name, workers, nice or None) each, in its
    own temp dir; pinned to `cpus` with taskset when given. The socket is
    owned by www-data, so Apache's children can connect to it."""

    MODULES = ("proxy", "proxy_fcgi")

    def __init__(self, children=8, cpus=None, env=None, pools=None):
        self.bin = os.path.join(php_root(), PHP_FPM)
        self.cpus = cpus
        # More environment for the master and its workers (tbtest/
        # wordpress.py gives PHP_INI_SCAN_DIR, for the CLI's extensions).
        self.env = dict(env or {})
        self.root = tempfile.mkdtemp(prefix="tbfpm-", dir="/tmp")
        os.chmod(self.root, 0o755)
        # pools: (name, children, nice or None) each, the first the one
        # conf() names; by default one pool "tb" of `children`.
        if not pools:
            pools = [("tb", children, None)]
        self.pools = [(n, c, nice) for n, c, nice in pools]
        self.children = sum(c for _, c, _ in self.pools)
        self.sock = self.socket(self.pools[0][0])
        self.conf_path = os.path.join(self.root, "php-fpm.conf")
        self.log = os.path.join(self.root, "php-fpm.log")
        self.php_log = os.path.join(self.root, "php.log")
        open(self.php_log, "a").close()
        shutil.chown(self.php_log, "www-data", "www-data")
        self.ini = write_ini(os.path.join(self.root, "php.ini"), self.php_log)
        text = FPM_GLOBAL.format(dir=self.root)
        for name, n, nice in self.pools:
            text += FPM_POOL.format(name=name, sock=self.socket(name),
                                    children=n)
            if nice is not None:
                # The nice value of the pool's workers (the master runs
                # as root, so it may set a negative one too).
                text += "process.priority = %d\n" % nice
        with open(self.conf_path, "w") as f:
            f.write(text)
        self.proc = None
        self.out = None

    def socket(self, pool):
        """The unix socket of pool `pool` (the one pool "tb" keeps the
        name php-fpm.sock)."""
        if pool == "tb":
            return os.path.join(self.root, "php-fpm.sock")
        return os.path.join(self.root, "php-fpm-%s.sock" % pool)

    def start(self, timeout=15):
        """Start the master; returns once the socket accepts connections
        and every worker is up. Fails the test, naming the package, if
        php-fpm exits or never listens."""
        env = dict(os.environ)
        env.pop("NOTIFY_SOCKET", None)   # no systemd to tell
        env.pop("LD_PRELOAD", None)
        env.update(self.env)
        pin = ["taskset", "-c", self.cpus] if self.cpus else []
        self.out = open(os.path.join(self.root, "stderr.log"), "ab")
        self.proc = subprocess.Popen(
            pin + [self.bin, "-F", "-y", self.conf_path, "-c", self.ini],
            stdout=self.out, stderr=self.out, env=env,
            start_new_session=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                pytest.fail("php-fpm8.2 (package php8.2-fpm, unpacked by "
                            "scripts/fetch-php.sh) exited %d: %s" % (
                                self.proc.returncode, self.read_log()[-1500:]))
            if all(self._listening(self.socket(p[0])) for p in self.pools) \
                    and len(child_pids(self.proc.pid)) >= self.children:
                return self
            time.sleep(0.05)
        self.stop()
        pytest.fail("php-fpm8.2 (package php8.2-fpm) did not listen on %s: %s"
                    % (self.sock, self.read_log()[-1500:]))

    def _listening(self, sock):
        if not os.path.exists(sock):
            return False
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            s.settimeout(0.5)
            s.connect(sock)
            return True
        except OSError:
            return False
        finally:
            s.close()

    def conf(self):
        """The lines that hand .php files to this pool (mod_proxy_fcgi;
        the Apache must load MODULES)."""
        return ('<FilesMatch "\\.php$">\n'
                '    SetHandler "proxy:unix:%s|fcgi://localhost"\n'
                '</FilesMatch>\n' % self.sock)

    def split_conf(self, pool, expr):
        """conf(), and .php requests for which the ap_expr `expr` holds
        (an <If> on a header: "%{HTTP:X-Partner} == 'yes'") to pool
        `pool` instead. Apache merges <If> after <FilesMatch>, so its
        SetHandler wins; each pool has its own fcgi:// name, so that
        mod_proxy never mixes their connections."""
        return (self.conf() +
                '<If "(%s) && %%{REQUEST_FILENAME} =~ /\\.php$/">\n'
                '    SetHandler "proxy:unix:%s|fcgi://%s"\n'
                '</If>\n' % (expr.replace('"', '\\"'), self.socket(pool),
                              pool))

    def pids(self):
        """The master and its workers."""
        if self.proc is None:
            return []
        return [self.proc.pid] + child_pids(self.proc.pid)

    def read_log(self):
        out = ""
        for name in ("php-fpm.log", "stderr.log", "php.log"):
            try:
                with open(os.path.join(self.root, name),
                          errors="replace") as f:
                    out += f.read()
            except OSError:
                pass
        return out

    def stop(self):
        # SIGQUIT: graceful (workers finish their request); stop_pid
        # falls back to SIGKILL of the master if it lingers, and then the
        # workers it started, which that leaves behind, go by PID too.
        workers = self.pids()[1:]
        stop_pid(self.proc, sig=signal.SIGQUIT, timeout=10)
        for pid in workers:
            try:
                with open("/proc/%d/cmdline" % pid, "rb") as f:
                    if b"php-fpm" not in f.read():
                        continue    # gone, and the PID reused
                os.kill(pid, signal.SIGKILL)
            except (OSError, ProcessLookupError):
                pass
        if self.out is not None:
            self.out.close()
            self.out = None



def fpm_apache(apache_factory, fpm, **kw):
    """An Apache(mpm="event") that loads what PhpFpm needs, with the
    PHP pages written; start it with fpm.conf() + body."""
    kw.setdefault("mpm", "event")
    mods = list(kw.pop("modules", ()))
    a = apache_factory(modules=mods + list(PhpFpm.MODULES), **kw)
    install_pages(a)
    return a
