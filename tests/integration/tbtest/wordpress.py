"""tbtest/wordpress.py -- a real legacy login for the module to guard:
Debian 12's WordPress 6.1 on MariaDB, served by PHP in two (or more)
Apache replicas that share one docroot and one database.

Nothing here writes outside its temp dirs, and Debian's files are used as
they are:

  MariaDB     mariadb-install-db into a temp datadir, then mariadbd (as
              the mysql user) on a free loopback TCP port and a unix
              socket in the temp dir, stopped by PID. root reaches it
              through the socket (unix_socket authentication); WordPress
              has its own database and user over TCP.
  the site    a temp docroot of symlinks to /usr/share/wordpress, except
              for a wp-config.php of ours (Debian's reads
              /etc/wordpress/config-<host>.php) and a wp-content of ours
              with two mu-plugins: one logs every POST as PHP received
              it, the other makes wp_mail() a no-op.
              PHP resolves symlinks in __FILE__, so an entry point such as
              wp-admin/admin.php finds /usr/share/wordpress/wp-load.php,
              whose ABSPATH would be Debian's directory and so Debian's
              wp-config.php: an auto_prepend_file (in each replica's
              php.ini, ours) defines ABSPATH as our docroot first, and
              wp-load.php keeps a defined ABSPATH.
  replicas    prefork Apaches (tbtest/apache.py) with mod_php as
              tbtest/php.py unpacks it, or, for a sanitizer build of the
              module, php-fpm per replica (php_sapi() says why);
              PHP_INI_SCAN_DIR points at the CLI's conf.d, which gives
              PHP mysqli (php8.2-mysql) and opcache. Each serves the site
              in a <VirtualHost> of its own port, with the caller's lines
              inside (the rules test's <Location "/wp-login.php">) and
              outside it (TBucketRedis); configure() changes them by a
              graceful restart, the site and its users left as they are.
  install     WordPress's own installer (POST /wp-admin/install.php?step=2)
              makes the admin; wp_create_user(), from a PHP CLI script
              that loads wp-load.php, makes an ordinary user.

The site URL follows the request's Host when it names a replica, so a
login on either replica redirects back to that replica; every replica
uses one cookie name and the same salts, so a login cookie from one is
good on the other, as behind a load balancer.

login() posts the real login form from a chosen 127.0.0.x source address
and gives the status: 302 (to wp-admin) for a good password, 200 with
the login error for a bad one. login_body() is the form body a browser
sends; post_log() reads what the mu-plugin recorded, so a test can check
that body reached PHP byte for byte and from which address.

The login tests share one rig: conftest.py's fixture `wp` takes it from
SHARED (a SharedRig), which starts it for the first test that asks and
stops it after the last of a run of consecutive tests that use it, so
test_wordpress_rules.py and test_wordpress_form.py install WordPress
once between them. Each test file sees the replicas' error logs from its
own first test on (mark_logs), as it would on a rig of its own; every
test sets its own rules (protect) under a prefix of its own. By hand
(start() takes about 1.5 s here, 2.5 s with a sanitizer build):

    w = WordPress()
    w.start(server="TBucketRedis redis://127.0.0.1:PORT",
            vhost='<Location "/wp-login.php">\n    TBucketEnable On\n'
                  '    ...\n</Location>')
    w.login(0, *w.user, source_ip="127.0.0.2")        # 302
    w.login(1, w.user[0], "wrong", "127.0.0.3")       # 200
    w.configure(server=..., vhost=...)                # other rules
    w.cleanup()
"""
import base64
import http.client
import json
import os
import secrets
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.parse
from collections import namedtuple
from http.cookies import SimpleCookie

import pytest

from tbtest.apache import Apache
from tbtest.env import TempRoot, free_port, read_text, stop_pid
from tbtest.php import ModPhp, PhpFpm

WP_DIR = "/usr/share/wordpress"
MARIADBD = "/usr/sbin/mariadbd"
MARIADB_INSTALL_DB = "/usr/bin/mariadb-install-db"
MARIADB = "/usr/bin/mariadb"
PHP_CLI = "/usr/bin/php8.2"
PHP_CLI_CONF_D = "/etc/php/8.2/cli/conf.d"
# What the rig runs, and the package of scripts/install-deps.sh that
# brings it, to name what is missing.
PARTS = (
    (os.path.join(WP_DIR, "wp-login.php"), "wordpress"),
    (MARIADBD, "mariadb-server"),
    (MARIADB_INSTALL_DB, "mariadb-server"),
    (MARIADB, "mariadb-server"),
    (os.path.join(PHP_CLI_CONF_D, "20-mysqli.ini"), "php8.2-mysql"),
    (PHP_CLI, "php8.2-cli"),
)

# Debian's wp-config.php (ours replaces it) and .htaccess (a symlink into
# /etc/wordpress, rewrite rules we do not use) stay out of the docroot,
# and wp-content is our own.
NOT_LINKED = ("wp-config.php", ".htaccess", "wp-content")

LOGIN_ERROR = 'id="login_error"'
# The cookie wp-login.php sets on the login page (its value as it goes
# over the wire) and wants back with the form.
TEST_COOKIE = ("wordpress_test_cookie", "WP%20Cookie%20check")

ABSPATH_PHP = """<?php
/* auto_prepend_file of every PHP request to the test site: WordPress's
 * entry points are symlinks into /usr/share/wordpress, and PHP resolves
 * them, so without this wp-load.php would take Debian's directory as
 * ABSPATH and load Debian's wp-config.php. */
define('ABSPATH', '%s/');
"""

WP_CONFIG = """<?php
/* wp-config.php of a test site (tests/integration/tbtest/wordpress.py):
 * the database of the test's own mariadbd, fixed salts, and a site URL
 * that follows the replica asked. */
define('DB_NAME', '{db_name}');
define('DB_USER', '{db_user}');
define('DB_PASSWORD', '{db_password}');
define('DB_HOST', '127.0.0.1:{db_port}');
define('DB_CHARSET', 'utf8mb4');
define('DB_COLLATE', '');
{salts}
$table_prefix = 'wp_';

/* Each replica answers on its own port, and a redirect (the 302 after a
 * login) must lead back to the replica that was asked: the site URL is
 * the request's Host when it names a replica, else the first one (the
 * PHP CLI has no Host). */
$tb_replicas = array({hosts});
$tb_host = (isset($_SERVER['HTTP_HOST'])
            && in_array($_SERVER['HTTP_HOST'], $tb_replicas, true))
           ? $_SERVER['HTTP_HOST'] : $tb_replicas[0];
define('WP_HOME', 'http://' . $tb_host);
define('WP_SITEURL', 'http://' . $tb_host);
unset($tb_replicas, $tb_host);
/* COOKIEHASH would be md5 of the site URL, different on each replica: one
 * name everywhere makes a login good on every replica, as behind a load
 * balancer. */
define('COOKIEHASH', md5('tbucket-wordpress'));

/* The mu-plugin's log of POST bodies. */
define('TB_POST_LOG', '{post_log}');

/* No request of WordPress's own: no wp-cron loopback request after a
 * page, no update check or other call to the internet (none is reachable
 * here, and each would wait for its timeout). */
define('DISABLE_WP_CRON', true);
define('WP_HTTP_BLOCK_EXTERNAL', true);
define('AUTOMATIC_UPDATER_DISABLED', true);
define('WP_AUTO_UPDATE_CORE', false);
define('WP_DEBUG', false);

/* Debian's install.php stores these two (its config-<host>.php files set
 * them); empty is WordPress's default, wp-content/uploads. */
$upload_path = '';
$upload_url_path = '';

require_once ABSPATH . 'wp-settings.php';
"""

# The mu-plugin: one JSON line per POST, written when PHP shuts down, so
# the line also holds the status WordPress answered with. The body is
# read from php://input, which PHP keeps for a urlencoded form after
# filling $_POST.
POST_LOG_PHP = r"""<?php
/* tb-post-log.php -- test mu-plugin: logs each POST request as PHP got it
 * (the raw body, base64, and the parsed form) with the client address and
 * the status answered, one JSON line per request, to TB_POST_LOG. */
if (defined('TB_POST_LOG') && isset($_SERVER['REQUEST_METHOD'])
        && $_SERVER['REQUEST_METHOD'] === 'POST') {
    $tb_raw = file_get_contents('php://input');
    $tb_post = $_POST;
    register_shutdown_function(function () use ($tb_raw, $tb_post) {
        $line = json_encode(array(
            'time' => microtime(true),
            'remote_addr' => $_SERVER['REMOTE_ADDR'],
            'host' => isset($_SERVER['HTTP_HOST'])
                      ? $_SERVER['HTTP_HOST'] : '',
            'uri' => $_SERVER['REQUEST_URI'],
            'content_type' => isset($_SERVER['CONTENT_TYPE'])
                              ? $_SERVER['CONTENT_TYPE'] : '',
            'body_b64' => base64_encode($tb_raw),
            'post' => $tb_post,
            'status' => http_response_code(),
        ), JSON_INVALID_UTF8_SUBSTITUTE | JSON_UNESCAPED_SLASHES);
        file_put_contents(TB_POST_LOG, $line . "\n", FILE_APPEND | LOCK_EX);
    });
}
"""

# Mail goes nowhere: the installer mails the admin, and PHP's mail()
# would run a sendmail this machine does not have (its "not found" lands
# in Apache's error log).
NO_MAIL_PHP = r"""<?php
/* tb-no-mail.php -- test mu-plugin: wp_mail() succeeds without sending. */
add_filter('pre_wp_mail', '__return_true');
"""

# Makes one ordinary user: reads {"abspath", "login", "password",
# "email"} as JSON on stdin (any bytes in the password survive), prints
# the new user's id.
CREATE_USER_PHP = r"""<?php
$in = json_decode(stream_get_contents(STDIN), true);
define('ABSPATH', $in['abspath']);
require ABSPATH . 'wp-load.php';
$id = wp_create_user($in['login'], $in['password'], $in['email']);
if (is_wp_error($id)) {
    fwrite(STDERR, $id->get_error_message() . "\n");
    exit(1);
}
echo $id, "\n";
"""

SALT_NAMES = ("AUTH_KEY", "SECURE_AUTH_KEY", "LOGGED_IN_KEY", "NONCE_KEY",
              "AUTH_SALT", "SECURE_AUTH_SALT", "LOGGED_IN_SALT", "NONCE_SALT")

Response = namedtuple("Response", "status location cookies text headers",
                      defaults=({},))
Response.__doc__ = """One HTTP answer: status, Location header (or None),
cookies set ({name: value}), body as text, headers ({lower-case name:
value})."""


def require_stack():
    """Skip, naming the packages, when a part of the stack is not
    installed (scripts/install-deps.sh installs them all, so CI runs)."""
    missing = sorted({pkg for path, pkg in PARTS if not os.path.exists(path)})
    if missing:
        pytest.skip("WordPress stack not installed: apt-get install %s "
                    "(scripts/install-deps.sh)" % " ".join(missing))


class SharedRig:
    """One WordPress rig for every test that asks for it in a row: get()
    starts it on first use (skipping when the stack is not installed)
    and marks the replicas' logs whenever another test file takes it;
    stop() stops it (conftest.py calls it after the last test of a run
    that used it)."""

    def __init__(self):
        self.rig = None
        self.owner = None

    def get(self, owner):
        """The rig, started if need be; owner names the test file."""
        if self.rig is None:
            require_stack()
            w = WordPress()
            try:
                w.start()
            except BaseException:
                w.cleanup()
                raise
            self.rig, self.owner = w, owner
        elif owner != self.owner:
            self.owner = owner
            for a in self.rig.replicas:
                a.mark_logs()
        return self.rig

    def stop(self):
        if self.rig is not None:
            rig, self.rig, self.owner = self.rig, None, None
            rig.cleanup()


SHARED = SharedRig()


def protect(wp, redis, prefix, rules):
    """Every replica's lines for a login test (graceful restart): Redis,
    the key prefix (each test its own), refusal lines at notice, and
    rules, the <Location> of the virtual host."""
    wp.configure(server="TBucketRedis %s timeout=1000\nTBucketPrefix %s\n"
                        "TBucketRefusalLog notice" % (redis.url, prefix),
                 vhost=rules)


def bound(cap, rate_per_min, t0):
    """capacity + rate x T: the most a bucket can admit since t0."""
    return cap + rate_per_min * (time.monotonic() - t0) / 60.0 + 1


def started_rig():
    """A started WordPress rig for a module-scoped fixture (installing it
    is most of the cost), cleaned up after the module's last test; skips
    when the stack is not installed."""
    require_stack()
    w = WordPress()
    try:
        yield w.start()
    finally:
        w.cleanup()


def temp_root(prefix):
    """A temp dir under /tmp that the servers' users may enter."""
    root = tempfile.mkdtemp(prefix=prefix, dir="/tmp")
    os.chmod(root, 0o755)
    return root


class MariaDB(TempRoot):
    """One mariadbd of our own: a fresh datadir, a free loopback port and
    a unix socket in its temp dir, run as the mysql user, stopped by
    PID."""

    def __init__(self, port=None):
        self.root = temp_root("tbdb-")
        self.data = os.path.join(self.root, "data")
        # mariadbd (as mysql) makes its socket and pid file here.
        self.run_dir = os.path.join(self.root, "run")
        os.mkdir(self.run_dir)
        shutil.chown(self.run_dir, "mysql", "mysql")
        self.sock = os.path.join(self.run_dir, "mysqld.sock")
        self.error_log = os.path.join(self.run_dir, "error.log")
        self.port = port or free_port()
        self.proc = None
        self.out = None

    def argv(self):
        """mariadbd's command line: no option files (--no-defaults keeps
        /etc/mysql out), loopback only, and an InnoDB sized for a test
        that does not flush its log on every commit."""
        return [MARIADBD, "--no-defaults", "--user=mysql",
                "--datadir=" + self.data, "--socket=" + self.sock,
                "--port=%d" % self.port, "--bind-address=127.0.0.1",
                "--pid-file=" + os.path.join(self.run_dir, "mysqld.pid"),
                "--log-error=" + self.error_log, "--skip-name-resolve",
                "--innodb-buffer-pool-size=64M",
                "--innodb-log-file-size=16M",
                "--innodb-flush-log-at-trx-commit=0",
                "--skip-innodb-doublewrite"]

    def start(self, timeout=30):
        """Make the datadir and start mariadbd; returns once root can
        run a query through the socket. Raises if either step fails."""
        p = subprocess.run(
            [MARIADB_INSTALL_DB, "--no-defaults", "--user=mysql",
             "--datadir=" + self.data, "--skip-test-db",
             "--skip-name-resolve",
             "--auth-root-authentication-method=socket"],
            capture_output=True, text=True, timeout=120)
        if p.returncode != 0:
            raise RuntimeError("mariadb-install-db failed (rc %d): %s"
                               % (p.returncode, (p.stdout + p.stderr)[-1500:]))
        self.out = open(os.path.join(self.root, "stderr.log"), "ab")
        self.proc = subprocess.Popen(self.argv(), stdout=self.out,
                                     stderr=self.out, start_new_session=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError("mariadbd exited %d: %s" % (
                    self.proc.returncode, self.read_log()[-2000:]))
            if os.path.exists(self.sock) and \
                    self.sql("SELECT 1", check=False) == "1":
                return self
            time.sleep(0.05)
        raise RuntimeError("mariadbd did not answer on %s: %s"
                           % (self.sock, self.read_log()[-2000:]))

    def sql(self, statements, check=True):
        """Run statements as root through the socket; the output, one
        row a line, tab-separated, without column names."""
        p = subprocess.run([MARIADB, "--no-defaults", "-S", self.sock,
                            "-uroot", "--batch", "--skip-column-names",
                            "-e", statements],
                           capture_output=True, text=True, timeout=30)
        if p.returncode != 0:
            if check:
                raise RuntimeError("mariadb: %s: %s" % (statements,
                                                        p.stderr.strip()))
            return None
        return p.stdout.strip()

    def create_database(self, name, user, password):
        """A database and a user that may do anything in it, from
        127.0.0.1 (name, user and password: letters and digits)."""
        self.sql("CREATE DATABASE %s CHARACTER SET utf8mb4; "
                 "CREATE USER '%s'@'127.0.0.1' IDENTIFIED BY '%s'; "
                 "GRANT ALL PRIVILEGES ON %s.* TO '%s'@'127.0.0.1';"
                 % (name, user, password, name, user))

    def read_log(self):
        out = ""
        for path in (self.error_log, os.path.join(self.root, "stderr.log")):
            try:
                with open(path, errors="replace") as f:
                    out += f.read()
            except OSError:
                pass
        return out

    def stop(self):
        # SIGTERM is mariadbd's clean shutdown (under a second here).
        stop_pid(self.proc, sig=signal.SIGTERM, timeout=30)
        if self.out is not None:
            self.out.close()
            self.out = None


def php_sapi(so):
    """How the replicas run PHP for a build of mod_tbucket.so: mod_php,
    unless the build is sanitized. PHP loads its extensions (mysqli)
    with dlopen(RTLD_DEEPBIND), which the ASan runtime preloaded into
    apache2 refuses, ending apache2 at start; a sanitized build hands
    PHP to php-fpm (tbtest/php.py's PhpFpm, no sanitizer) over
    mod_proxy_fcgi, so the module still runs under ASan in front of the
    same WordPress."""
    env = dict(os.environ)
    env.pop("LD_PRELOAD", None)
    p = subprocess.run(["ldd", so], capture_output=True, text=True, env=env,
                       timeout=30)
    return "php-fpm" if "libasan" in p.stdout else "mod_php"


class WpApache(Apache):
    """An Apache whose mod_php finds the PHP CLI's extensions (mysqli),
    and whose error log and stderr are read from a mark on (mark_logs):
    what a test file sharing the rig checks is its own lines."""

    log_marks = (0, 0)

    def _env(self):
        env = super()._env()
        env["PHP_INI_SCAN_DIR"] = PHP_CLI_CONF_D
        return env

    def mark_logs(self):
        """Read both logs from their present ends on."""
        self.log_marks = (len(super().read_log()),
                          len(super().read_stderr()))

    def read_log(self):
        return super().read_log()[self.log_marks[0]:]

    def read_stderr(self):
        return super().read_stderr()[self.log_marks[1]:]


def request(apache, method, path, body=None, headers=None,
            source_ip="127.0.0.1", timeout=30):
    """One request on a fresh connection from source_ip (any 127.0.0.x:
    the whole of 127/8 is this host's) to an Apache, redirects not
    followed; a Response."""
    conn = http.client.HTTPConnection("127.0.0.1", apache.port,
                                      timeout=timeout,
                                      source_address=(source_ip, 0))
    h = {"Connection": "close"}
    h.update(headers or {})
    try:
        conn.request(method, path, body=body, headers=h)
        r = conn.getresponse()
        data = r.read()
        cookies = {}
        for line in r.msg.get_all("Set-Cookie") or []:
            c = SimpleCookie()
            c.load(line)
            cookies.update({k: m.value for k, m in c.items()})
        return Response(r.status, r.getheader("Location"), cookies,
                        data.decode("utf-8", "replace"),
                        {k.lower(): v for k, v in r.getheaders()})
    finally:
        conn.close()


def form(fields):
    """A form body as a browser encodes it
    (application/x-www-form-urlencoded, UTF-8, spaces as +)."""
    return urllib.parse.urlencode(fields).encode("ascii")


def login_body(user, password):
    """The body a browser posts from wp-login.php's form (the fields in
    the form's order; "remember me" left unticked)."""
    return form([("log", user), ("pwd", password), ("wp-submit", "Log In"),
                 ("testcookie", "1")])


class WordPress:
    """The whole rig: one MariaDB, one site, `replicas` prefork Apaches
    of `servers` children each. start() brings it up and installs
    WordPress; cleanup() stops everything by PID and removes the temp
    dirs. Users: self.admin and self.user, (login, password) pairs; the
    user's password holds characters a form has to encode."""

    def __init__(self, replicas=2, servers=4, build=None, php=None):
        self.db = MariaDB()
        self.root = temp_root("tbwp-")
        self.docroot = os.path.join(self.root, "htdocs")
        self.post_log_path = os.path.join(self.root, "log", "post.log")
        self.abspath_php = os.path.join(self.root, "abspath.php")
        self.replicas = [WpApache(mpm="prefork", servers=servers, build=build)
                         for _ in range(replicas)]
        # "mod_php", or "php-fpm" (one pool of `servers` workers per
        # replica): see php_sapi().
        self.sapi = php or php_sapi(self.replicas[0].so)
        self.php = [self.make_php(a, servers) for a in self.replicas]
        self.db_password = secrets.token_hex(12)
        self.admin = ("tbadmin", "Adm1n-" + secrets.token_hex(8))
        self.user = ("alice", "p&ss=w0rd +%/\u00e9" + secrets.token_hex(4))
        # Seconds each stage of start() took.
        self.timings = {}

    def make_php(self, apache, servers):
        """The PHP of one replica (ModPhp or PhpFpm, tbtest/php.py), its
        php.ini (ours) told to prepend abspath.php."""
        if self.sapi == "mod_php":
            php = ModPhp(apache)
            ini = os.path.join(php.ini_dir, "php.ini")
        else:
            apache.modules.extend(PhpFpm.MODULES)
            php = PhpFpm(children=servers,
                         env={"PHP_INI_SCAN_DIR": PHP_CLI_CONF_D})
            ini = php.ini
        with open(ini, "a") as f:
            f.write("auto_prepend_file = %s\n" % self.abspath_php)
        return php

    # ---- the site ------------------------------------------------------

    def hosts(self):
        """host:port of each replica, as a browser sends it in Host."""
        return ["127.0.0.1:%d" % a.port for a in self.replicas]

    def write_site(self):
        """The docroot: symlinks to Debian's WordPress, our wp-config.php,
        our wp-content with the mu-plugins; the POST log, writable by the
        children (www-data)."""
        os.makedirs(self.docroot)
        for name in sorted(os.listdir(WP_DIR)):
            if name not in NOT_LINKED:
                os.symlink(os.path.join(WP_DIR, name),
                           os.path.join(self.docroot, name))
        content = os.path.join(self.docroot, "wp-content")
        for d in ("plugins", "themes", "uploads", "mu-plugins"):
            os.makedirs(os.path.join(content, d))
        for name, text in (("tb-post-log.php", POST_LOG_PHP),
                           ("tb-no-mail.php", NO_MAIL_PHP)):
            with open(os.path.join(content, "mu-plugins", name), "w") as f:
                f.write(text)
        log_dir = os.path.dirname(self.post_log_path)
        os.makedirs(log_dir)
        open(self.post_log_path, "w").close()
        for path in (content, os.path.join(content, "uploads"), log_dir,
                     self.post_log_path):
            shutil.chown(path, "www-data", "www-data")
        with open(self.abspath_php, "w") as f:
            f.write(ABSPATH_PHP % self.docroot)
        salts = "\n".join("define('%s', '%s');" % (n, secrets.token_hex(32))
                          for n in SALT_NAMES)
        with open(os.path.join(self.docroot, "wp-config.php"), "w") as f:
            f.write(WP_CONFIG.format(
                db_name="wordpress", db_user="wp",
                db_password=self.db_password, db_port=self.db.port,
                salts=salts, post_log=self.post_log_path,
                hosts=", ".join("'%s'" % h for h in self.hosts())))
        # The children read the config (root's umask may hide it).
        for dirpath, dirnames, filenames in os.walk(self.root):
            for n in dirnames + filenames:
                p = os.path.join(dirpath, n)
                if not os.path.islink(p):
                    os.chmod(p, os.stat(p).st_mode | 0o444 |
                             (0o111 if os.path.isdir(p) else 0))

    # ---- Apache configuration ------------------------------------------

    def body(self, index, server="", vhost=""):
        """The config body of replica `index`: its PHP, the caller's
        server-level lines, and the site's virtual host on the replica's
        port with the caller's vhost lines inside it."""
        a = self.replicas[index]
        return "\n".join([
            self.php[index].conf(),
            server,
            "<VirtualHost 127.0.0.1:%d>" % a.port,
            "    ServerName 127.0.0.1",
            '    DocumentRoot "%s"' % self.docroot,
            "    DirectoryIndex index.php",
            '    <Directory "%s">' % self.docroot,
            "        Options FollowSymLinks",
            "        AllowOverride None",
            "        Require all granted",
            "    </Directory>",
            vhost,
            "</VirtualHost>",
        ])

    def configure(self, server="", vhost=""):
        """New caller's lines on every replica (graceful restart): the
        site, its database and its users stay as they are."""
        for i, a in enumerate(self.replicas):
            a.graceful(self.body(i, server, vhost))

    # ---- start and stop ------------------------------------------------

    def start(self, server="", vhost=""):
        """Start the database and the replicas (with the caller's lines,
        as configure() takes them), install WordPress through its
        installer on the first replica and add the ordinary user."""
        t0 = time.monotonic()
        self.db.start()
        self.db.create_database("wordpress", "wp", self.db_password)
        t1 = time.monotonic()
        self.write_site()
        for i, a in enumerate(self.replicas):
            if self.sapi == "php-fpm":
                self.php[i].start()
            a.start(self.body(i, server, vhost))
        t2 = time.monotonic()
        self.install()
        t3 = time.monotonic()
        self.create_user(self.user[0], self.user[1], "alice@example.org")
        t4 = time.monotonic()
        self.timings = {"mariadb": t1 - t0, "site+apache": t2 - t1,
                        "install": t3 - t2, "user": t4 - t3,
                        "total": t4 - t0}
        return self

    def install(self):
        """WordPress's installer, as its form posts it (step 2)."""
        name, password = self.admin
        r = request(self.replicas[0], "POST", "/wp-admin/install.php?step=2",
                    body=form([("weblog_title", "tbucket test site"),
                               ("user_name", name),
                               ("admin_password", password),
                               ("admin_password2", password),
                               ("pw_weak", "on"),
                               ("admin_email", "admin@example.org"),
                               ("blog_public", "0"),
                               ("language", ""),
                               ("Submit", "Install WordPress")]),
                    headers={"Content-Type":
                             "application/x-www-form-urlencoded"})
        if r.status != 200 or "<h1>Success!</h1>" not in r.text:
            raise RuntimeError("WordPress install failed (%d): %s\n%s" % (
                r.status, r.text[-2000:], self.php_log()[-2000:]))

    def create_user(self, login, password, email):
        """An ordinary user (WordPress's default role, subscriber) by
        wp_create_user() in the PHP CLI; its id."""
        script = os.path.join(self.root, "create-user.php")
        with open(script, "w") as f:
            f.write(CREATE_USER_PHP)
        p = subprocess.run(
            [PHP_CLI, script],
            input=json.dumps({"abspath": self.docroot + "/", "login": login,
                              "password": password, "email": email}),
            capture_output=True, text=True, timeout=60)
        if p.returncode != 0 or not p.stdout.strip().isdigit():
            raise RuntimeError("wp_create_user failed (rc %d): %s"
                               % (p.returncode, (p.stdout + p.stderr)[-1500:]))
        return int(p.stdout.strip())

    def cleanup(self):
        """Stop every server (each by its PID) and remove the temp dirs,
        also after a start() that failed half way."""
        failed = []
        for a, php in zip(self.replicas, self.php):
            try:
                if a.proc is not None:
                    a.stop()
            except Exception as e:       # the others still go
                failed.append(e)
            shutil.rmtree(a.root, ignore_errors=True)
            if self.sapi == "php-fpm":
                php.cleanup()
        self.db.cleanup()
        shutil.rmtree(self.root, ignore_errors=True)
        if failed:
            raise failed[0]

    # ---- clients -------------------------------------------------------

    def replica(self, replica):
        """A replica by index, or the Apache itself."""
        return self.replicas[replica] if isinstance(replica, int) else replica

    def post_login(self, replica, user, password, source_ip="127.0.0.1"):
        """POST the login form to /wp-login.php of a replica from
        source_ip, with the test cookie a browser holds from the login
        page (WordPress refuses a login without it); the Response."""
        return request(
            self.replica(replica), "POST", "/wp-login.php",
            body=login_body(user, password), source_ip=source_ip,
            headers={"Content-Type": "application/x-www-form-urlencoded",
                     "Cookie": "%s=%s" % TEST_COOKIE})

    def login(self, replica, user, password, source_ip="127.0.0.1"):
        """post_login()'s status: 302 logged in, 200 refused (the form
        again, with the error), or whatever answered before WordPress."""
        return self.post_login(replica, user, password, source_ip).status

    def get(self, replica, path, cookies=None, source_ip="127.0.0.1"):
        """GET path on a replica with cookies ({name: value}); the
        Response, redirects not followed."""
        h = {}
        if cookies:
            h["Cookie"] = "; ".join("%s=%s" % kv for kv in cookies.items())
        return request(self.replica(replica), "GET", path, headers=h,
                       source_ip=source_ip)

    # ---- logs ----------------------------------------------------------

    def post_log(self, uri_prefix="/wp-login.php"):
        """The POSTs the mu-plugin logged whose URI starts with
        uri_prefix, oldest first, each a dict with the raw body as
        bytes under "body"."""
        out = []
        with open(self.post_log_path, errors="replace") as f:
            for line in f:
                if not line.strip():
                    continue
                e = json.loads(line)
                if e["uri"].startswith(uri_prefix):
                    e["body"] = base64.b64decode(e.pop("body_b64"))
                    out.append(e)
        return out

    def php_log(self):
        """PHP's error logs of every replica, one after the other."""
        return "".join(read_text(p.log if self.sapi == "mod_php"
                                 else p.php_log) for p in self.php)
