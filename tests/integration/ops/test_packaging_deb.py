"""test_packaging_deb.py -- `make deb`: the Debian packages, built once.

The packages (the Apache module, the tools and the Redis module) are
built once per session (module fixture `debs`, through `make deb`, as a
user would; started in the background as the session begins, by
tbtest/debbuild.py) and then checked: their versions come from VERSION;
their file lists, conffiles, dependencies and maintainer scripts are the
ones debian/README.source describes; dpkg-buildflags' hardening
reached every ELF file; lintian reports no error and no warning beyond
the kept ones README.source lists; the module extracted from the package
passes apache2 -t with its own tbucket.load and tbucket.conf and limits
real requests; the shim and tool extracted from tbucket-tools run with the
example shim.conf.

The install, a2enmod, remove and purge cycle runs for real with dpkg, in a
throwaway root: this machine's / under a private overlay in a private
mount and network namespace (ThrowawayRoot), so nothing is written to the
real /usr, /etc or /var and nothing inside can reach the machine's ports.
"""
import gzip
import os
import re
import shutil
import subprocess
import tempfile

import pytest

from tbtest.apache import Apache, MODDIR, http_get
from tbtest.debbuild import SHARED as DEB_BUILD
from tbtest.env import BUILD, ROOT, require

DPKG_DEB = "/usr/bin/dpkg-deb"
LINTIAN = "/usr/bin/lintian"
APACHE2 = "/usr/sbin/apache2"
MOD_PKG = "libapache2-mod-tbucket"
TOOLS_PKG = "tbucket-tools"
REDIS_PKG = "redis-tbucket"
REDIS_MODULE = "usr/lib/redis/modules/tbucket_redis.so"
# The file an admin's redis.conf includes, by a pattern, to load it.
REDIS_LOAD = "usr/share/redis-tbucket/redis-tbucket.conf"
# The dependency dh_apache2 adds: the module ABI of httpd 2.4.
APACHE_API = "apache2-api-20120211"


def multiarch():
    return subprocess.run(["dpkg-architecture", "-qDEB_HOST_MULTIARCH"],
                          capture_output=True, text=True,
                          check=True).stdout.strip()


def shim_path():
    return "usr/lib/%s/tbucket/libtbucket_preload.so" % multiarch()


# Every file of each package (directories aside) and its mode. Files
# under usr/share are named without the .gz dh_compress may add (it
# compresses by size); man pages are checked to be compressed apart.
def expected_files():
    doc_mod = "usr/share/doc/%s/" % MOD_PKG
    doc_tools = "usr/share/doc/%s/" % TOOLS_PKG
    doc_redis = "usr/share/doc/%s/" % REDIS_PKG
    return {
        REDIS_PKG: {
            # Executable: Redis 7 loads no module file without an x bit.
            REDIS_MODULE: 0o755,
            REDIS_LOAD: 0o644,
            doc_redis + "README.md": 0o644,
            doc_redis + "changelog.Debian": 0o644,
            doc_redis + "copyright": 0o644,
        },
        MOD_PKG: {
            "usr/lib/apache2/modules/mod_tbucket.so": 0o644,
            "etc/apache2/mods-available/tbucket.load": 0o644,
            "etc/apache2/mods-available/tbucket.conf": 0o644,
            "usr/share/man/man5/mod_tbucket.5": 0o644,
            doc_mod + "README.md": 0o644,
            doc_mod + "changelog.Debian": 0o644,
            doc_mod + "copyright": 0o644,
            doc_mod + "examples/tbucket-vhost.conf.example": 0o644,
        },
        TOOLS_PKG: {
            shim_path(): 0o644,
            "usr/bin/tbucket": 0o755,
            "usr/share/man/man5/tbucket-shim.5": 0o644,
            "usr/share/man/man8/tbucket.8": 0o644,
            doc_tools + "README.md": 0o644,
            doc_tools + "changelog.Debian": 0o644,
            doc_tools + "copyright": 0o644,
            doc_tools + "examples/shim.conf": 0o644,
        },
    }


def read(path):
    with open(path) as f:
        return f.read()


def version():
    return read(os.path.join(ROOT, "VERSION")).strip()


def run(args, timeout=120, **kw):
    return subprocess.run(args, capture_output=True, text=True,
                          timeout=timeout, **kw)


@pytest.fixture(scope="module")
def debs():
    """`make deb` once (started in the background when the session began:
    tbtest/debbuild.py); the paths of the built .deb files by package."""
    require(DPKG_DEB, "dpkg")
    require("/usr/bin/dpkg-buildpackage", "dpkg-dev")
    require("/usr/bin/dh", "debhelper")
    rc, output, elapsed, waited = DEB_BUILD.wait(timeout=900)
    out = os.path.join(BUILD, "deb")
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "make-deb.log"), "w") as f:
        f.write(output)
        f.write("\nmake deb: %.1f s (the tests waited %.1f s of it)\n"
                % (elapsed, waited))
    if rc != 0:
        pytest.fail("make deb failed (%d, %.0f s):\n%s" % (
            rc, elapsed, output[-6000:]))
    found = {}
    for name in os.listdir(out):
        if name.endswith(".deb"):
            found[name.split("_")[0]] = os.path.join(out, name)
    return found


@pytest.fixture(scope="module")
def tree(debs):
    """Both packages unpacked (dpkg-deb -x) into one 0755 temp root."""
    root = tempfile.mkdtemp(prefix="tbdeb-", dir="/tmp")
    os.chmod(root, 0o755)
    for pkg in (MOD_PKG, TOOLS_PKG, REDIS_PKG):
        subprocess.run([DPKG_DEB, "-x", debs[pkg], root], check=True)
    yield root
    shutil.rmtree(root, ignore_errors=True)


def deb_field(deb, field):
    return run([DPKG_DEB, "-f", deb, field], check=True).stdout.strip()


def deb_control_file(deb, name):
    """A control member (conffiles, postinst...) or None if absent."""
    p = run([DPKG_DEB, "-I", deb, name])
    return p.stdout if p.returncode == 0 else None


def deb_contents(deb):
    """{path: (type character, mode)} from dpkg-deb -c, without './'."""
    out = {}
    for line in run([DPKG_DEB, "-c", deb], check=True).stdout.splitlines():
        perms, path = line.split()[0], line.split()[5]
        path = path[2:]
        if not path:
            continue
        mode = 0
        for i, ch in enumerate(perms[1:10]):
            if ch != "-":
                mode |= 1 << (8 - i)
        out[path] = (perms[0], mode)
    return out


# The built packages are the two of debian/control plus their -dbgsym
# packages, all at VERSION-N, and debian/changelog agrees.
def test_deb_001_01_versions(debs):
    assert set(debs) == {MOD_PKG, TOOLS_PKG, REDIS_PKG, MOD_PKG + "-dbgsym",
                         TOOLS_PKG + "-dbgsym", REDIS_PKG + "-dbgsym"}
    want = re.compile(r"^%s-\d+$" % re.escape(version()))
    for pkg, deb in debs.items():
        assert want.match(deb_field(deb, "Version")), pkg
    p = run(["dpkg-parsechangelog", "-l",
             os.path.join(ROOT, "debian/changelog"), "-S", "Version"],
            check=True)
    assert want.match(p.stdout.strip())


# Each package holds exactly the files listed, with their modes; man
# pages are compressed; only the module's two mods-available files are
# conffiles.
def test_deb_001_02_file_lists(debs):
    for pkg, want in expected_files().items():
        got = {}
        for path, (kind, mode) in deb_contents(debs[pkg]).items():
            if kind == "d":
                continue
            assert kind == "-", (pkg, path, kind)
            if path.startswith("usr/share/man/"):
                assert path.endswith(".gz"), path
            if path.startswith("usr/share/"):
                path = re.sub(r"\.gz$", "", path)
            got[path] = mode
        assert set(got) == set(want), (pkg, sorted(set(got) - set(want)),
                                       sorted(set(want) - set(got)))
        for path, mode in want.items():
            assert got[path] == mode, (pkg, path, oct(got[path]))
    conffiles = deb_control_file(debs[MOD_PKG], "conffiles")
    assert sorted(conffiles.split()) == [
        "/etc/apache2/mods-available/tbucket.conf",
        "/etc/apache2/mods-available/tbucket.load"]
    assert deb_control_file(debs[TOOLS_PKG], "conffiles") is None
    assert deb_control_file(debs[REDIS_PKG], "conffiles") is None


# Dependencies are computed: shared libraries (shlibs), the Apache module
# ABI from dh_apache2. Installation enables nothing; prerm and postrm
# disable the module on removal and purge.
def test_deb_001_03_depends_and_scripts(debs):
    mod = deb_field(debs[MOD_PKG], "Depends")
    for dep in ("libc6", "libhiredis0.14", APACHE_API, "apache2-bin"):
        assert dep in mod, mod
    tools = deb_field(debs[TOOLS_PKG], "Depends")
    for dep in ("libc6", "libhiredis0.14", "libconfig9"):
        assert dep in tools, tools
    # The Redis module links libc alone (the core's pure twins, no
    # hiredis); installing it loads nothing.
    red = deb_field(debs[REDIS_PKG], "Depends")
    assert "libc6" in red and "hiredis" not in red, red
    assert "redis-server" in deb_field(debs[REDIS_PKG], "Enhances")
    assert deb_control_file(debs[REDIS_PKG], "postinst") is None
    # Removal warns about a redis.conf that still loads the module.
    assert "tbucket_redis" in deb_control_file(debs[REDIS_PKG], "postrm")
    postinst = deb_control_file(debs[MOD_PKG], "postinst") or ""
    assert "enmod" not in postinst
    prerm = deb_control_file(debs[MOD_PKG], "prerm")
    postrm = deb_control_file(debs[MOD_PKG], "postrm")
    assert prerm and re.search(r"apache2_invoke dismod", prerm), prerm
    assert postrm and '"$1" = "purge"' in postrm, postrm
    assert re.search(r"apache2_invoke dismod", postrm), postrm
    assert re.search(r"for conf in tbucket\b", postrm), postrm
    assert "<IfModule tbucket_module>" in postrm, postrm


# dpkg-buildflags' hardening reached compiler and linker: full RELRO
# (BIND_NOW), the stack protector and _FORTIFY_SOURCE in every ELF file.
def test_deb_001_04_hardening(tree):
    for rel in ("usr/lib/apache2/modules/mod_tbucket.so", shim_path(),
                "usr/bin/tbucket", REDIS_MODULE):
        path = os.path.join(tree, rel)
        assert "GNU_RELRO" in run(["readelf", "-lW", path]).stdout, rel
        assert "BIND_NOW" in run(["readelf", "-dW", path]).stdout, rel
        syms = run(["readelf", "--dyn-syms", "-W", path]).stdout
        assert "__stack_chk_fail" in syms, rel
        # __snprintf_chk and the like (__stack_chk_fail does not match).
        assert re.search(r"__\w+_chk\b", syms), rel


def kept_lintian_warnings():
    """The tags listed under 'Lintian' in debian/README.source."""
    text = read(os.path.join(ROOT, "debian/README.source"))
    section = text.split("\nLintian\n", 1)[1].split("\n\n\n", 1)[0]
    return set(re.findall(r"^- `([a-z0-9-]+)`", section, re.M))


# lintian: no error, and no warning that README.source does not list.
def test_deb_001_05_lintian(debs):
    require(LINTIAN, "lintian")
    changes = [n for n in os.listdir(os.path.join(BUILD, "deb"))
               if n.endswith(".changes")]
    assert len(changes) == 1, changes
    p = run([LINTIAN, os.path.join(BUILD, "deb", changes[0])], timeout=600)
    # "E: PACKAGE[ TYPE]: TAG [context]"; TYPE is e.g. "changes".
    tags = re.findall(r"^([A-Z]): ([^:]+): (\S+)", p.stdout, re.M)
    errors = [t for t in tags if t[0] == "E"]
    assert not errors and p.returncode == 0, p.stdout + p.stderr
    kept = kept_lintian_warnings()
    assert kept, "debian/README.source lists no kept warning"
    unlisted = [t for t in tags if t[0] == "W" and t[2] not in kept]
    assert not unlisted, p.stdout


class PackagedApache(Apache):
    """tbtest.apache's Apache, loading the module the Debian way: through the
    package's own tbucket.load (its LoadModule path moved into the
    unpacked tree) and tbucket.conf, in place of tbtest.apache's LoadModule
    line."""

    def __init__(self, tree, **kw):
        super().__init__(build=os.path.join(tree, MODDIR.lstrip("/")), **kw)
        avail = os.path.join(tree, "etc/apache2/mods-available")
        load = read(os.path.join(avail, "tbucket.load"))
        line = "LoadModule tbucket_module %s/mod_tbucket.so" % MODDIR
        assert load.count(line) == 1, load
        self.load = self.write_file("conf/tbucket.load", load.replace(
            line, "LoadModule tbucket_module %s" % self.so))
        self.tbucket_conf = os.path.join(avail, "tbucket.conf")

    def config_text(self, body, mpm=None):
        text = super().config_text(body, mpm)
        line = "LoadModule tbucket_module %s\n" % self.so
        assert text.count(line) == 1
        return text.replace(line, "Include %s\nInclude %s\n" % (
            self.load, self.tbucket_conf))


# The unpacked module passes apache2 -t with its own tbucket.load and
# tbucket.conf, and apache2 -M lists it.
def test_deb_001_06_apache_configtest(tree):
    require(APACHE2, "apache2")
    a = PackagedApache(tree)
    try:
        code, out = a.configtest("")
        assert code == 0 and "Syntax OK" in out, out
        assert "Include %s" % a.load in read(
            os.path.join(a.root, "conf", "test.conf"))
        p = run([APACHE2, "-M", "-f",
                 os.path.join(a.root, "conf", "test.conf")], timeout=30)
        assert "tbucket_module (shared)" in p.stdout, p.stdout + p.stderr
    finally:
        a.cleanup()


# The packaged module limits real requests: tbucket.conf's defaults with
# the test's Redis, 2 allowed, then 429.
def test_deb_001_07_packaged_module_limits(tree, redis_server):
    a = PackagedApache(tree)
    try:
        a.start("""
TBucketRedis %s timeout=500
<Location /limited>
    TBucketEnable On
    TBucketLimit 2 1/h
</Location>
""" % redis_server.url)
        codes = [http_get(a.url("/limited/ok.txt")).status_code
                 for _ in range(3)]
        assert codes == [200, 200, 429]
        # tbucket.conf's TBucketPrefix names the key.
        assert redis_server.client().keys("rl:*")
        a.assert_log_clean()
    finally:
        a.cleanup()


# The unpacked shim loads the example shim.conf without a complaint (with
# TBUCKET_STRICT=1 a bad one would refuse to start, exit 78), and the
# unpacked tool runs against the system's libraries.
def test_deb_001_08_tools_run(tree):
    env = dict(os.environ)
    env.update({
        "LD_PRELOAD": os.path.join(tree, shim_path()),
        "TBUCKET_CONFIG": os.path.join(
            tree, "usr/share/doc/%s/examples/shim.conf" % TOOLS_PKG),
        "TBUCKET_STRICT": "1",
    })
    p = run(["/bin/true"], env=env, timeout=30)
    assert p.returncode == 0 and p.stderr == "", p.stderr
    env["TBUCKET_CONFIG"] = os.path.join(tree, "missing.conf")
    p = run(["/bin/true"], env=env, timeout=30)
    assert p.returncode == 78 and "missing.conf" in p.stderr, p.stderr
    p = run([os.path.join(tree, "usr/bin/tbucket"), "--help"], timeout=30)
    assert p.returncode == 0 and "tbucket take KEY" in p.stdout


# The unpacked Redis module loads into Debian's redis-server with the
# loadmodule line its README gives (path moved into the unpacked tree),
# and decides: 2 allowed, then refused, on Redis's clock.
def test_deb_001_10_redis_module_loads(tree, tmp_path):
    from tbtest.redismod import ModRedis
    # dh_compress compresses a document of more than 4 kB, as policy asks.
    readme = os.path.join(tree, "usr/share/doc/%s/README.md" % REDIS_PKG)
    if os.path.exists(readme + ".gz"):
        with gzip.open(readme + ".gz", "rt") as f:
            readme = f.read()
    else:
        readme = read(readme)
    assert "loadmodule /%s" % REDIS_MODULE in readme
    r = ModRedis(tmp_path / "redis",
                 module=os.path.join(tree, REDIS_MODULE)).start()
    try:
        c = r.client()
        got = [c.execute_command("tbucket.bucket", 1, "deb:{k}", "", "2",
                                 "0.001", "1")[0] for _ in range(3)]
        assert got == [1, 1, 0]
        assert [m[1] for m in c.execute_command("MODULE", "LIST")] == \
            [b"tbucket"]
    finally:
        r.stop()


# `make deb` stops before building when debian/changelog does not carry
# VERSION.
def test_deb_001_09_version_mismatch_refused(tmp_path):
    src = tmp_path / "src"
    (src / "scripts").mkdir(parents=True)
    (src / "debian").mkdir()
    shutil.copy(os.path.join(ROOT, "scripts/build-deb.sh"),
                src / "scripts")
    shutil.copy(os.path.join(ROOT, "debian/changelog"), src / "debian")
    (src / "VERSION").write_text("9.9.9\n")
    out = tmp_path / "out"
    p = run(["sh", str(src / "scripts/build-deb.sh"), str(out)])
    assert p.returncode != 0
    assert "9.9.9" in p.stderr and "dch -v 9.9.9-1" in p.stderr, p.stderr
    assert not out.exists()


# ---- install, enable, remove, purge in a throwaway root --------------

ENTER_ROOT = r"""
set -e
up=$1 work=$2 mnt=$3 debs=$4
mount --make-rprivate /
mount -t overlay overlay -o "lowerdir=/,upperdir=$up,workdir=$work" "$mnt"
mount -t tmpfs -o mode=755 tmpfs "$mnt/dev"
mknod -m 666 "$mnt/dev/null" c 1 3
mknod -m 666 "$mnt/dev/zero" c 1 5
mknod -m 666 "$mnt/dev/urandom" c 1 9
mount -t proc proc "$mnt/proc"
mount -t tmpfs -o mode=755 tmpfs "$mnt/run"
mkdir "$mnt/run/lock"
mount --bind -o ro "$debs" "$mnt/mnt"
exec chroot "$mnt" /bin/sh -c "$5"
"""


class ThrowawayRoot:
    """This machine's / seen through an overlay whose writes land in a
    temp dir, never in the real /.

    Each run() enters a new mount and network namespace (unshare), mounts
    the overlay, a /dev holding only null, zero and urandom, /proc, an
    empty /run, and the package directory read-only at /mnt, then chroots
    there. The overlay keeps what earlier runs wrote, so a test can
    install, act and purge in steps. The network namespace has only a
    loopback that is down, and policy-rc.d refuses every service action,
    as in a Debian build chroot: a maintainer script cannot start or
    restart a real server."""

    ENV = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8",
           "HOME": "/root", "DEBIAN_FRONTEND": "noninteractive"}

    def __init__(self, debdir):
        if os.geteuid() != 0:
            pytest.fail("the throwaway root needs root (mount, chroot)")
        require("/usr/bin/unshare", "util-linux")
        self.dir = tempfile.mkdtemp(prefix="tbroot-", dir="/tmp")
        self.dirs = [os.path.join(self.dir, d) for d in ("up", "work",
                                                         "mnt")]
        for d in self.dirs:
            os.mkdir(d)
        self.debdir = debdir
        # man-db's trigger would rebuild the whole index at every step.
        self.run("printf '#!/bin/sh\\nexit 101\\n' > /usr/sbin/policy-rc.d"
                 " && chmod 755 /usr/sbin/policy-rc.d"
                 " && rm -f /var/lib/man-db/auto-update")

    def run(self, cmd, check=True):
        p = subprocess.run(
            ["unshare", "--mount", "--net", "--", "sh", "-c", ENTER_ROOT,
             "sh"] + self.dirs + [self.debdir, cmd],
            capture_output=True, text=True, timeout=300, env=self.ENV)
        if check:
            assert p.returncode == 0, (cmd, p.stdout + p.stderr)
        return p

    def present(self, paths):
        """{path: exists?} for absolute paths inside the root."""
        cmd = "; ".join('[ -e "%s" ] && echo "1 %s" || echo "0 %s"'
                        % (p, p, p) for p in paths)
        out = self.run(cmd).stdout.split("\n")
        return {line[2:]: line[0] == "1" for line in out if line}

    def cleanup(self):
        shutil.rmtree(self.dir, ignore_errors=True)


# The whole life of the packages under dpkg: installed, the module is
# not enabled; a2enmod enables it and apache2ctl -t passes with Debian's
# own apache2.conf; dpkg -r disables it and keeps the edited conffile;
# dpkg --purge removes the conffiles and a2enmod's state, leaving nothing.
def test_deb_002_01_install_enable_remove_purge(debs):
    r = ThrowawayRoot(os.path.dirname(debs[MOD_PKG]))
    try:
        avail = "/etc/apache2/mods-available/tbucket."
        enabled = "/etc/apache2/mods-enabled/tbucket."
        state = "/var/lib/apache2/module/%s/tbucket"
        so = "/usr/lib/apache2/modules/mod_tbucket.so"
        shim = "/" + shim_path()
        paths = [avail + "load", avail + "conf", enabled + "load",
                 enabled + "conf", so, shim, "/usr/bin/tbucket",
                 state % "enabled_by_admin", state % "disabled_by_maint"]

        r.run("dpkg -i /mnt/%s /mnt/%s" % (os.path.basename(debs[MOD_PKG]),
                                           os.path.basename(debs[TOOLS_PKG])))
        assert r.present(paths) == {
            avail + "load": True, avail + "conf": True,
            enabled + "load": False, enabled + "conf": False, so: True,
            shim: True, "/usr/bin/tbucket": True,
            state % "enabled_by_admin": False,
            state % "disabled_by_maint": False}
        assert r.run("a2query -m tbucket", check=False).returncode != 0
        assert "tbucket take KEY" in r.run("tbucket --help").stdout

        r.run("a2enmod tbucket")
        p = r.run("apache2ctl -t 2>&1 && apache2ctl -M 2>&1")
        assert "Syntax OK" in p.stdout
        assert "tbucket_module (shared)" in p.stdout
        got = r.present(paths)
        assert got[enabled + "load"] and got[enabled + "conf"]
        assert got[state % "enabled_by_admin"]

        r.run("echo '# edited by the admin' >> %sconf" % avail)
        r.run("dpkg -r %s" % MOD_PKG)
        got = r.present(paths)
        assert not got[so] and not got[enabled + "load"]
        assert not got[enabled + "conf"]
        assert got[avail + "load"] and got[avail + "conf"]
        assert got[state % "disabled_by_maint"]
        assert "edited by the admin" in r.run("cat %sconf" % avail).stdout
        assert "Syntax OK" in r.run("apache2ctl -t 2>&1").stdout

        r.run("dpkg --purge %s %s" % (MOD_PKG, TOOLS_PKG))
        assert not any(r.present(paths).values()), r.present(paths)
        for pkg in (MOD_PKG, TOOLS_PKG):
            p = r.run("dpkg-query -W -f='${Status}' %s" % pkg, check=False)
            assert p.returncode != 0 or "not-installed" in p.stdout, p.stdout
    finally:
        r.cleanup()


# Runs inside the throwaway root: redis-server with the configuration
# file $1 and the overrides that keep it on a unix socket under /tmp, in
# the foreground; prints MODULE LIST and shuts it down. Exits 1,
# printing its log, when it does not answer PING within 10 s (an aborted
# start leaves its socket file behind: the socket alone proves nothing).
REDIS_START = r"""
conf=$1 sock=/tmp/redis.sock log=/tmp/redis.log
rm -f "$sock" "$log"
redis-server "$conf" --port 0 --unixsocket "$sock" --daemonize no \
    --supervised no --pidfile /tmp/redis.pid --logfile "$log" --dir /tmp \
    --save '' --appendonly no &
pid=$!
up() { [ "$(redis-cli -s "$sock" ping 2>/dev/null)" = PONG ]; }
i=0
while ! up && [ $i -lt 100 ] && kill -0 $pid 2>/dev/null; do
    sleep 0.1; i=$((i + 1))
done
if ! up; then
    kill $pid 2>/dev/null; wait $pid; rc=$?
    cat "$log"; echo "redis-server exited $rc"
    exit 1
fi
echo "modules: $(redis-cli -s "$sock" MODULE LIST | tr '\n' ' ')"
redis-cli -s "$sock" SHUTDOWN NOSAVE >/dev/null 2>&1 || true
wait $pid || true
"""


def redis_in_root(r, conf):
    """redis-server in the throwaway root with conf: (started?, output)."""
    p = r.run("set -- %s\n%s" % (conf, REDIS_START), check=False)
    return p.returncode == 0, p.stdout + p.stderr


# The Redis left behind by redis-tbucket's removal still starts: a
# redis.conf that loads the module by including the package's file by
# its pattern (as operations.md says) loads it while the package is
# installed and starts without it after remove and purge; a file that
# loads it with a loadmodule line of its own stops Redis from starting
# (the trap), and remove and purge name that file, and only that one, in
# a warning.
def test_deb_002_02_redis_removal(debs):
    r = ThrowawayRoot(os.path.dirname(debs[REDIS_PKG]))
    try:
        so = "/" + REDIS_MODULE
        r.run("dpkg -i /mnt/%s" % os.path.basename(debs[REDIS_PKG]))
        r.run("echo 'include /usr/share/redis-tbucket/*.conf'"
              " >> /etc/redis/redis.conf")
        r.run("echo 'loadmodule %s' > /etc/redis/direct.conf" % so)
        for conf in ("/etc/redis/redis.conf", "/etc/redis/direct.conf"):
            ok, out = redis_in_root(r, conf)
            assert ok and "tbucket" in out, out

        p = r.run("dpkg -r %s" % REDIS_PKG)
        assert "WARNING: /etc/redis/direct.conf still loads" in p.stderr, \
            p.stderr
        assert "redis.conf still" not in p.stderr, p.stderr
        assert not any(r.present([so, "/" + REDIS_LOAD]).values())
        ok, out = redis_in_root(r, "/etc/redis/redis.conf")
        assert ok and "tbucket" not in out, out
        ok, out = redis_in_root(r, "/etc/redis/direct.conf")
        assert not ok and "Can't load module" in out, out

        p = r.run("dpkg --purge %s" % REDIS_PKG)
        assert "WARNING: /etc/redis/direct.conf still loads" in p.stderr
        ok, out = redis_in_root(r, "/etc/redis/redis.conf")
        assert ok and "tbucket" not in out, out
    finally:
        r.cleanup()


# The Apache left behind by libapache2-mod-tbucket's removal still
# passes apache2ctl -t with the packaged example site enabled (its
# TBucket* lines inside <IfModule tbucket_module>; the certificates it
# names made for the test); a site using TBucket* outside <IfModule>
# makes removal print a warning naming the file, and apache2ctl -t
# passes again once that site is disabled.
def test_deb_002_03_apache_removal(debs):
    r = ThrowawayRoot(os.path.dirname(debs[MOD_PKG]))
    try:
        r.run("dpkg -i /mnt/%s" % os.path.basename(debs[MOD_PKG]))
        example = "/usr/share/doc/%s/examples/tbucket-vhost.conf.example" \
            % MOD_PKG
        r.run("a2enmod -q tbucket ssl"
              " && cp %s /etc/apache2/sites-available/api.conf"
              " && printf '<VirtualHost *:8080>\\n    TBucketEnable On\\n"
              "    TBucketLimit 10 1/s\\n</VirtualHost>\\n'"
              " > /etc/apache2/sites-available/bare.conf"
              " && openssl req -x509 -newkey rsa:2048 -nodes -days 2"
              " -subj /CN=api.example.com"
              " -keyout /etc/ssl/private/api.example.com.key"
              " -out /etc/ssl/certs/api.example.com.pem 2>/dev/null"
              " && a2ensite -q api bare" % example)
        p = r.run("apache2ctl -t 2>&1")
        assert "Syntax OK" in p.stdout, p.stdout

        p = r.run("dpkg -r %s" % MOD_PKG)
        ours = p.stderr.partition("%s: WARNING: without mod_tbucket, "
                                  "apache2ctl -t fails" % MOD_PKG)[2]
        assert "sites-enabled/bare.conf" in ours, p.stderr
        assert "Invalid command 'TBucketEnable'" in ours, p.stderr
        assert "<IfModule tbucket_module>" in ours, p.stderr
        assert "api.conf" not in ours, p.stderr
        assert r.run("apache2ctl -t", check=False).returncode != 0

        r.run("a2dissite -q bare")
        p = r.run("apache2ctl -t 2>&1")
        assert "Syntax OK" in p.stdout, p.stdout
        p = r.run("dpkg --purge %s" % MOD_PKG)
        assert "WARNING" not in p.stderr, p.stderr
        p = r.run("apache2ctl -t 2>&1")
        assert "Syntax OK" in p.stdout, p.stdout
    finally:
        r.cleanup()
