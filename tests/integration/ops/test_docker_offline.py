"""test_docker_offline.py -- what can be checked of docker/ without an engine.

No Docker engine runs on the test machines, so these tests check the files
themselves: docker/compose.yaml parses and every service can be built or
pulled; every file, port and host name it (and the Dockerfile) refers to
exists or matches; the Dockerfile uses Debian 12 and apt only and builds
with the README's commands; docker-compose (Debian's 1.29) validates the
file; and the Apache configuration baked into the image passes apache2 -t
with the module we built.
"""
import os
import re
import shlex
import subprocess

import pytest

from tbtest.apache import run_apache2
from tbtest.env import BUILD, ROOT, require

DOCKER = os.path.join(ROOT, "docker")
COMPOSE = os.path.join(DOCKER, "compose.yaml")
COMPOSE_BIN = "/usr/bin/docker-compose"


def load_compose():
    try:
        import yaml
    except ImportError:
        pytest.fail("python3 yaml is missing: apt-get install python3-yaml")
    with open(COMPOSE) as f:
        return yaml.safe_load(f)


def dockerfile_path(build):
    ctx = os.path.normpath(os.path.join(DOCKER, build.get("context", ".")))
    return ctx, os.path.join(ctx, build.get("dockerfile", "Dockerfile"))


def instructions(path):
    """(INSTRUCTION, arguments) of a Dockerfile, continuations joined."""
    out = []
    cur = ""
    with open(path) as f:
        for line in f:
            s = line.rstrip("\n")
            if not cur and (not s.strip() or s.lstrip().startswith("#")):
                continue
            if s.lstrip().startswith("#"):
                continue
            if s.endswith("\\"):
                cur += s[:-1] + " "
                continue
            cur += s
            word, _, rest = cur.strip().partition(" ")
            out.append((word.upper(), rest.strip()))
            cur = ""
    return out


def readme_make_commands():
    """Every `make ...` the README (and the install guide) shows."""
    cmds = set()
    for name in ("README.md", os.path.join("docs", "install.md")):
        with open(os.path.join(ROOT, name)) as f:
            text = f.read()
        for m in re.finditer(r"(?<![\w/.-])make(?:\s+([a-z][\w-]*))?", text):
            cmds.add(m.group(1) or "")
    return cmds


def services():
    return load_compose()["services"]


# The compose file parses; no top-level name: (docker-compose 1.29 rejects
# it); every service has a build or an image.
def test_docker_001_01_compose_parses():
    doc = load_compose()
    assert isinstance(doc, dict) and "services" in doc
    assert "name" not in doc
    svcs = doc["services"]
    assert {"redis", "haproxy"} <= set(svcs)
    apaches = [n for n, s in svcs.items()
               if isinstance(s.get("build"), dict)
               and s["build"].get("target") == "apache"]
    assert len(apaches) == 3, apaches
    for name, s in svcs.items():
        assert "build" in s or "image" in s, name


# Build contexts, Dockerfiles, targets and mounted files exist.
def test_docker_001_02_referenced_files_exist():
    checked = {"builds": 0, "mounts": 0}
    svcs = services()
    assert len(svcs) >= 5, svcs
    for name, s in svcs.items():
        b = s.get("build")
        if b is not None:
            if isinstance(b, str):
                b = {"context": b}
            ctx, df = dockerfile_path(b)
            assert os.path.isdir(ctx), "%s: no context %s" % (name, ctx)
            assert os.path.isfile(df), "%s: no Dockerfile %s" % (name, df)
            stages = {m.group(1) for w, a in instructions(df) if w == "FROM"
                      for m in [re.search(r"\bAS\s+(\S+)", a, re.I)] if m}
            if "target" in b:
                assert b["target"] in stages, (name, b["target"], stages)
            checked["builds"] += 1
        for v in s.get("volumes", []):
            src = v.split(":")[0] if isinstance(v, str) else v.get("source")
            if src.startswith((".", "/")):
                path = os.path.normpath(os.path.join(DOCKER, src))
                assert os.path.exists(path), "%s: %s" % (name, path)
                checked["mounts"] += 1
        for f in s.get("env_file", []) or []:
            assert os.path.exists(os.path.join(DOCKER, f)), f
    # The compose file builds its images and mounts its configs: a check
    # that found nothing to check would pass on an empty file.
    assert checked["builds"] >= 3 and checked["mounts"] >= 1, checked


# Every COPY source of the Dockerfile exists in the build context.
def test_docker_001_03_dockerfile_copies_exist():
    df = os.path.join(DOCKER, "Dockerfile")
    copies = 0
    for word, args in instructions(df):
        if word not in ("COPY", "ADD"):
            continue
        parts = [p for p in shlex.split(args) if not p.startswith("--")]
        if "--from=" in args:
            continue
        assert word == "COPY", "ADD fetches URLs and unpacks: use COPY"
        for src in parts[:-1]:
            assert os.path.exists(os.path.join(ROOT, src)), src
            copies += 1
    assert copies >= 1, "no COPY read in %s" % df


# Debian 12 only, packages from apt only, built with the README's commands.
def test_docker_001_04_debian_and_readme_commands():
    df = os.path.join(DOCKER, "Dockerfile")
    ins = instructions(df)
    for word, args in ins:
        if word == "FROM":
            assert args.split()[0] == "debian:12", args
        if word == "RUN":
            # No command of a RUN line fetches anything outside apt.
            for cmd in re.split(r"&&|\|\||;|\|", args):
                first = (cmd.split() or [""])[0]
                assert first not in ("curl", "wget", "pip", "pip3", "npm",
                                     "gem", "git"), \
                    "RUN fetches outside apt: %s" % cmd
    run_text = " ; ".join(a for w, a in ins if w == "RUN")
    used = set()
    for m in re.finditer(r"(?<![\w/.-])make\b((?:\s+[^\s;&|]+)*)", run_text):
        words = [w for w in m.group(1).split() if "=" not in w]
        used.add(words[0] if words else "")
    readme = readme_make_commands()
    assert used <= readme, "make commands not in the README: %s" % (
        sorted(used - readme))
    # The README's build and test commands are both there.
    assert "" in used and "test" in used, used
    assert "sh scripts/install-deps.sh" in run_text


# Ports are published on loopback only, and haproxy listens on them;
# haproxy's backends and the module's Redis are compose services.
def test_docker_001_05_ports_and_hosts_match():
    svcs = services()
    with open(os.path.join(DOCKER, "haproxy", "haproxy.cfg")) as f:
        cfg = f.read()
    binds = {int(p) for p in re.findall(r"^\s*bind\s+\S*:(\d+)", cfg, re.M)}
    for p in svcs["haproxy"].get("ports", []):
        parts = str(p).split(":")
        assert len(parts) == 3 and parts[0] == "127.0.0.1", p
        assert int(parts[2].split("/")[0]) in binds, p
    for host, port in re.findall(r"^\s*server\s+\S+\s+([\w.-]+):(\d+)",
                                 cfg, re.M):
        assert host in svcs, host
        assert port == "80"
    with open(os.path.join(DOCKER, "apache", "tbucket.conf")) as f:
        m = re.search(r"^\s*TBucketRedis\s+redis://([\w.-]+):(\d+)",
                      f.read(), re.M)
    assert m and m.group(1) in svcs and m.group(2) == "6379"
    for name, s in svcs.items():
        for dep in s.get("depends_on", []):
            assert dep in svcs, (name, dep)


# docker-compose validates the file offline.
def test_docker_001_06_compose_config():
    require(COMPOSE_BIN, "docker-compose")
    p = subprocess.run([COMPOSE_BIN, "-f", COMPOSE, "config", "-q"],
                       capture_output=True, text=True, timeout=60,
                       cwd=DOCKER)
    assert p.returncode == 0, p.stdout + p.stderr


# The Apache config baked into the image passes apache2 -t with our module.
def test_docker_001_07_apache_config_syntax(tmp_path):
    so = os.path.join(BUILD, "mod_tbucket.so")
    if not os.path.exists(so):
        pytest.fail("%s is missing: run make" % so)
    mods = "/usr/lib/apache2/modules"
    run = tmp_path / "run"
    run.mkdir()
    lines = ["ServerRoot %s" % tmp_path,
             "LoadModule mpm_event_module %s/mod_mpm_event.so" % mods]
    for m in ("authz_core", "authz_host", "mime", "alias", "actions",
              "cgid", "headers", "remoteip", "dir"):
        lines.append("LoadModule %s_module %s/mod_%s.so" % (m, mods, m))
    lines += ["LoadModule tbucket_module %s" % so,
              "Listen 127.0.0.1:1",
              "PidFile %s/httpd.pid" % run,
              "DefaultRuntimeDir %s" % run,
              "ErrorLog %s/error.log" % run,
              "Include %s/apache/tbucket.conf" % DOCKER,
              "Include %s/apache/app.conf" % DOCKER, ""]
    conf = tmp_path / "httpd.conf"
    conf.write_text("\n".join(lines))
    env = dict(os.environ, REPLICA="test", APACHE_LOG_DIR=str(run))
    p = run_apache2(so, "-t", "-f", conf, env=env)
    assert p.returncode == 0, p.stdout + p.stderr


# haproxy accepts its configuration (names that do not resolve here only
# disable a server, thanks to init-addr none).
def test_docker_001_08_haproxy_config():
    haproxy = require("/usr/sbin/haproxy", "haproxy")
    p = subprocess.run([haproxy, "-c", "-f",
                        os.path.join(DOCKER, "haproxy", "haproxy.cfg")],
                       capture_output=True, text=True, timeout=30)
    assert p.returncode == 0, p.stdout + p.stderr
