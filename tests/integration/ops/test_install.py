"""test_install.py -- `make install` / `make uninstall` into a staging dir.

Checks the layout documented in docs/install.md: apxs directories for the
module and Debian's mods-available files, the shim under LIBDIR
(multiarch when PREFIX=/usr), the tool, the generated man pages; that
configuration files are never overwritten; that uninstall keeps them
unless PURGE=1; and that apache2 -t accepts the installed tbucket.load +
tbucket.conf. Nothing is written outside the test's temp dir.
"""
import os
import stat
import subprocess

from tbtest.apache import run_apache2
from tbtest.env import BUILD, ROOT, require

APXS = "/usr/bin/apxs"


def apxs(var):
    require(APXS, "apache2-dev")
    return subprocess.run([APXS, "-q", var], capture_output=True, text=True,
                          check=True).stdout.strip()


def make(*args):
    env = dict(os.environ)
    # Do not inherit the jobserver or flags of a `make test` above us.
    for k in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL", "MAKEOVERRIDES"):
        env.pop(k, None)
    p = subprocess.run(["make", "-s", "-C", ROOT, "BUILD=" + BUILD] +
                       list(args), capture_output=True, text=True, env=env,
                       timeout=600)
    return p


def files_under(root):
    out = set()
    for d, _, names in os.walk(root):
        for n in names:
            out.add(os.path.relpath(os.path.join(d, n), root))
    return out


def mode(path):
    return stat.S_IMODE(os.stat(path).st_mode)


def multiarch():
    return subprocess.run(["cc", "-print-multiarch"], capture_output=True,
                          text=True).stdout.strip() or "x86_64-linux-gnu"


# make install DESTDIR=... PREFIX=/usr: the Debian layout, nothing else.
def test_install_001_01_layout_prefix_usr(tmp_path):
    dest = tmp_path / "stage"
    p = make("install", "DESTDIR=%s" % dest, "PREFIX=/usr")
    assert p.returncode == 0, p.stdout + p.stderr
    libexec = apxs("LIBEXECDIR").lstrip("/")
    conf = apxs("SYSCONFDIR").lstrip("/")
    want = {
        "%s/mod_tbucket.so" % libexec: 0o644,
        "%s/mods-available/tbucket.load" % conf: 0o644,
        "%s/mods-available/tbucket.conf" % conf: 0o644,
        "usr/lib/%s/libtbucket_preload.so" % multiarch(): 0o644,
        "usr/bin/tbucket": 0o755,
        "usr/share/man/man5/mod_tbucket.5": 0o644,
        "usr/share/man/man5/tbucket-shim.5": 0o644,
        "usr/share/man/man8/tbucket.8": 0o644,
        "usr/share/doc/mod_tbucket/README.md": 0o644,
        "usr/share/doc/mod_tbucket/install.md": 0o644,
    }
    if os.path.exists(os.path.join(ROOT, "conf", "shim.conf")):
        want["etc/tbucket/shim.conf"] = 0o644
        want["usr/share/doc/mod_tbucket/shim.conf"] = 0o644
    if os.path.exists(os.path.join(ROOT, "conf",
                                   "tbucket-vhost.conf.example")):
        want["usr/share/doc/mod_tbucket/tbucket-vhost.conf.example"] = 0o644
    got = files_under(dest)
    assert got == set(want), (sorted(got - set(want)),
                              sorted(set(want) - got))
    for rel, m in want.items():
        assert mode(dest / rel) == m, rel
    load = (dest / conf / "mods-available" / "tbucket.load").read_text()
    assert ("LoadModule tbucket_module /%s/mod_tbucket.so" % libexec) in load
    # The installed module and shim are the ones we built.
    with open(os.path.join(BUILD, "mod_tbucket.so"), "rb") as f:
        assert (dest / libexec / "mod_tbucket.so").read_bytes() == f.read()


# Default PREFIX=/usr/local: the shim in PREFIX/lib; the tool runs.
def test_install_001_02_prefix_local(tmp_path):
    dest = tmp_path / "stage"
    p = make("install", "DESTDIR=%s" % dest)
    assert p.returncode == 0, p.stdout + p.stderr
    assert (dest / "usr/local/lib/libtbucket_preload.so").exists()
    assert (dest / "usr/local/share/man/man8/tbucket.8").exists()
    tool = dest / "usr/local/bin/tbucket"
    r = subprocess.run([str(tool), "--help"], capture_output=True, text=True)
    assert r.returncode == 0 and "tbucket take KEY" in r.stdout


# Configs are never overwritten; uninstall keeps them, PURGE=1 removes all.
def test_install_001_03_configs_and_uninstall(tmp_path):
    dest = tmp_path / "stage"
    args = ["DESTDIR=%s" % dest, "PREFIX=/usr"]
    assert make("install", *args).returncode == 0
    conf = dest / apxs("SYSCONFDIR").lstrip("/") / "mods-available"
    (conf / "tbucket.conf").write_text("# edited by the admin\n")
    p = make("install", *args)
    assert p.returncode == 0, p.stderr
    assert (conf / "tbucket.conf").read_text() == "# edited by the admin\n"
    assert (conf / "tbucket.conf.dist").exists()
    assert "tbucket.conf.dist" in p.stdout

    p = make("uninstall", *args)
    assert p.returncode == 0, p.stdout + p.stderr
    left = files_under(dest)
    keep = {os.path.relpath(conf / "tbucket.conf", dest)}
    if os.path.exists(os.path.join(ROOT, "conf", "shim.conf")):
        keep.add("etc/tbucket/shim.conf")
    assert left == keep
    assert "PURGE=1" in p.stdout

    p = make("uninstall", "PURGE=1", *args)
    assert p.returncode == 0, p.stdout + p.stderr
    assert files_under(dest) == set()


# uninstall refuses while the module is enabled (Apache would not start).
def test_install_001_04_uninstall_refuses_enabled(tmp_path):
    dest = tmp_path / "stage"
    args = ["DESTDIR=%s" % dest, "PREFIX=/usr"]
    assert make("install", *args).returncode == 0
    confdir = dest / apxs("SYSCONFDIR").lstrip("/")
    (confdir / "mods-enabled").mkdir()
    os.symlink("../mods-available/tbucket.load",
               confdir / "mods-enabled" / "tbucket.load")
    p = make("uninstall", *args)
    assert p.returncode != 0
    assert "a2dismod tbucket" in p.stdout + p.stderr
    assert (dest / apxs("LIBEXECDIR").lstrip("/") / "mod_tbucket.so").exists()


# The installed tbucket.load and tbucket.conf pass apache2 -t as they are.
def test_install_001_05_apache_accepts_installed_files(tmp_path):
    root = tmp_path / "inst"
    p = make("install", "PREFIX=%s/usr" % root,
             "LIBEXECDIR=%s/modules" % root,
             "APACHE_CONFDIR=%s/apache2" % root,
             "TB_CONFDIR=%s/etc/tbucket" % root)
    assert p.returncode == 0, p.stdout + p.stderr
    load = root / "apache2/mods-available/tbucket.load"
    assert ("%s/modules/mod_tbucket.so" % root) in load.read_text()
    run = tmp_path / "run"
    run.mkdir()
    mods = "/usr/lib/apache2/modules"
    httpd_conf = tmp_path / "httpd.conf"
    httpd_conf.write_text("\n".join([
        "ServerRoot %s" % tmp_path,
        "LoadModule mpm_prefork_module %s/mod_mpm_prefork.so" % mods,
        "LoadModule authz_core_module %s/mod_authz_core.so" % mods,
        "Include %s" % load,
        "Include %s" % (root / "apache2/mods-available/tbucket.conf"),
        "Listen 127.0.0.1:1",
        "ServerName localhost",
        "PidFile %s/httpd.pid" % run,
        "DefaultRuntimeDir %s" % run,
        "ErrorLog %s/error.log" % run,
        "",
    ]))
    so = "%s/modules/mod_tbucket.so" % root
    p = run_apache2(so, "-t", "-f", httpd_conf)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "Syntax OK" in p.stdout + p.stderr
    p = run_apache2(so, "-M", "-f", httpd_conf)
    assert "tbucket_module" in p.stdout, p.stdout + p.stderr
