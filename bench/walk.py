#!/usr/bin/python3
"""walk.py -- the walk of one decision from the module's check_access
hook, measured with callgrind: which of the repository's source files it
runs, which calls climb back up a layer, how many call sites reach the
shared-memory counting files (mod_tbucket/tbucket_shm*.c), and the
instructions it costs.

One apache2 -X (a single process) runs under
`valgrind --tool=callgrind --toggle-collect=check_access
--dump-after=check_access`, so each request's check_access is one
profile of its own; a redis-server of its own answers. The scope is a
typical one: a TBucketLimit, one named limit without a key of its own
(TBucketRouteLimit) and two with one (TBucketRule ip and user, count=),
all far from their capacity, so every decision is an allowed one. The
first --warmup requests (the connection, the script load) are left out;
each figure is the same for every measured request (else the spread is
printed), instructions are the median.

Layers, low to high, by the path of a function's source file (the layers
of docs/hacking.md): 0 shared/base, 1 shared/algo, 2 shared/tables,
3 shared/redis, 4 shared/*, 5 mod_tbucket/* but mod_tbucket.c,
6 mod_tbucket/mod_tbucket.c. A climb is a call whose call site (the
file of the line that calls, inlined code counted where it is written)
lies in a lower layer than the called function's file; a call down a
layer the reverse (one return back up each); calls between files of one
layer are neither. Also counted: the calls out of mod_tbucket.c into
other files, and those of them whose callees (in the profile's call
graph) reach tbucket_shm*.c: how often the walk goes back to the
counters. docs/hacking.md, "The request's walk, measured", has the
figures before and after the one bucket model.

    /usr/bin/python3 bench/walk.py --build DIR [--requests 20] [--verbose]
        [--json F] [--keep DIR]
"""
import argparse
import collections
import glob
import http.client
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "tests", "integration"))
from tbtest.apache import server_root_conf  # noqa: E402
from tbtest.env import Redis, free_port, wait_port  # noqa: E402

MODDIR = "/usr/lib/apache2/modules"
TOPS = ("shared/", "mod_tbucket/", "shim/", "tools/", "redismod/")

SCOPE = """
LoadModule mpm_prefork_module {moddir}/mod_mpm_prefork.so
LoadModule authz_core_module {moddir}/mod_authz_core.so
LoadModule tbucket_module {so}
DocumentRoot "{root}/htdocs"
<Directory "{root}/htdocs">
    Require all granted
</Directory>
TBucketRedis {url} timeout=2000
TBucketPrefix walk:
<Location /limited>
    TBucketEnable On
    TBucketKey "%{{HTTP:X-Key}}"
    TBucketLimit 1000000 1000/s
    TBucketRouteLimit export 1000000 1000/s
    TBucketRule ip "%{{REMOTE_ADDR}}" 1000000 1000/s count=200
    TBucketRule user "%{{HTTP:X-User}}" 1000000 1000/s count=401
</Location>
"""


def layer(path):
    """The layer of a repository file (module docstring), None outside."""
    if path.startswith("mod_tbucket/"):
        return 6 if path == "mod_tbucket/mod_tbucket.c" else 5
    for i, d in enumerate(("base/", "algo/", "tables/", "redis/")):
        if path.startswith("shared/" + d):
            return i
    if path.startswith("shared/"):
        return 4
    return None


def repo_path(name):
    """A debug-info file name made relative to the repository, or None
    for a file outside it (libc, APR, httpd, hiredis)."""
    for top in TOPS:
        i = name.find("/" + top)
        if name.startswith(top):
            return name
        if i >= 0 and not name.startswith("/usr/"):
            return name[i + 1:]
    return None


class Profile:
    """One callgrind dump (compressed names, uncompressed positions):
    self cost per file, and every call with its site and callee."""

    def __init__(self, path):
        self.total = 0
        self.self_ir = collections.Counter()     # file -> Ir
        self.obj_ir = collections.Counter()      # object -> Ir
        self.calls = []   # (site file, line, callee fn, callee file, n)
        self.graph = collections.defaultdict(set)   # fn -> callees
        self.fn_file = {}
        self._parse(path)

    def _parse(self, path):
        names = {"fl": {}, "fn": {}, "ob": {}}
        kind = {"fl": "fl", "fi": "fl", "fe": "fl", "cfi": "fl",
                "cfl": "fl", "fn": "fn", "cfn": "fn", "ob": "ob",
                "cob": "ob"}
        fn_file = {}
        cur = {"fl": "", "file": "", "fn": "", "ob": ""}
        callee = None
        call = None
        raw = []
        with open(path) as f:
            for line in f:
                line = line.rstrip("\n")
                m = re.match(r"^(fl|fi|fe|fn|cfi|cfl|cfn|ob|cob)=(.*)$", line)
                if m:
                    key, val = m.groups()
                    n = re.match(r"^\((\d+)\)(?: (.*))?$", val)
                    table = names[kind[key]]
                    if n:
                        if n.group(2) is not None:
                            table[n.group(1)] = n.group(2)
                        val = table[n.group(1)]
                    if key == "fl":
                        cur["fl"] = cur["file"] = val
                    elif key in ("fi", "fe"):
                        cur["file"] = val
                    elif key == "fn":
                        cur["fn"] = val
                        cur["file"] = cur["fl"]
                        fn_file.setdefault(val, cur["fl"])
                    elif key == "ob":
                        cur["ob"] = val
                    elif key in ("cfi", "cfl"):
                        callee = [val, callee[1] if callee else None]
                    elif key == "cfn":
                        callee = [callee[0] if callee else None, val]
                    continue
                if line.startswith("calls="):
                    call = int(line[6:].split()[0])
                    continue
                if line.startswith("totals:") or line.startswith("summary:"):
                    self.total = int(line.split()[1])
                    continue
                if not line or not (line[0].isdigit() or line[0] in "+-*"):
                    continue
                parts = line.split()
                ir = int(parts[1]) if len(parts) > 1 else 0
                if call is not None:
                    raw.append((cur["file"], parts[0], callee[1],
                                callee[0], call))
                    self.graph[cur["fn"]].add(callee[1])
                    call = None
                    callee = None
                else:
                    self.self_ir[cur["file"]] += ir
                    self.obj_ir[cur["ob"]] += ir
        self.fn_file = fn_file
        for site, ln, fn, fl, n in raw:
            self.calls.append((site, ln, fn, fl or fn_file.get(fn, ""), n))


def reaches_shm(prof, fn):
    """Whether a function or one it calls (in this profile's call graph,
    which merges every call of a function) runs in tbucket_shm*.c."""
    seen, todo = set(), [fn]
    while todo:
        f = todo.pop()
        if f in seen:
            continue
        seen.add(f)
        path = repo_path(prof.fn_file.get(f, "")) or ""
        if re.match(r"mod_tbucket/tbucket_shm[^/]*\.c$", path):
            return True
        todo.extend(prof.graph.get(f, ()))
    return False


def walk_figures(prof):
    """The figures of one decision's profile (module docstring)."""
    files = sorted({p for p in (repo_path(f) for f, ir in
                                prof.self_ir.items() if ir) if p})
    climbs, downs, hops, shm, descents = {}, {}, {}, {}, {}
    counting = {}
    for site, ln, fn, fl, n in prof.calls:
        s, c = repo_path(site), repo_path(fl)
        if not s or not c:
            continue
        where = "%s:%s" % (s, ln)
        ls, lc = layer(s), layer(c)
        if ls is not None and lc is not None and lc > ls:
            climbs[(where, fn, c)] = climbs.get((where, fn, c), 0) + n
        if ls is not None and lc is not None and lc < ls:
            downs[(where, fn)] = downs.get((where, fn), 0) + n
        if s != c:
            hops[(where, fn)] = hops.get((where, fn), 0) + n
        if re.match(r"mod_tbucket/tbucket_shm[^/]*\.c$", c) and \
                not re.match(r"mod_tbucket/tbucket_shm", s):
            shm[(where, fn)] = shm.get((where, fn), 0) + n
        if s == "mod_tbucket/mod_tbucket.c" and c != s:
            descents[(where, fn)] = descents.get((where, fn), 0) + n
            if reaches_shm(prof, fn):
                counting[(where, fn)] = counting.get((where, fn), 0) + n
    return {
        "instructions": prof.total,
        "files": files,
        "files_c": [f for f in files if f.endswith(".c")],
        "climbs": sorted(climbs.items()),
        "downs": sorted(downs.items()),
        "hops": sorted(hops.items()),
        "shm_sites": sorted(shm.items()),
        "descents": sorted(descents.items()),
        "counting": sorted(counting.items()),
        "objects": dict(prof.obj_ir),
    }


def get(port, n):
    """One request to the limited scope on a fresh connection; its
    status."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    c.request("GET", "/limited/ok.txt",
              headers={"X-Key": "client-%d" % (n % 4),
                       "X-User": "user-%d" % (n % 4)})
    st = c.getresponse().status
    c.close()
    return st


def start_apache(build, tmp, url, out):
    root = os.path.join(tmp, "apache")
    for d in ("conf", "logs", "run", "htdocs/limited"):
        os.makedirs(os.path.join(root, d), exist_ok=True)
    with open(os.path.join(root, "htdocs/limited/ok.txt"), "w") as f:
        f.write("ok\n")
    for d, _, fs in os.walk(tmp):
        os.chmod(d, 0o777)
        for fn in fs:
            os.chmod(os.path.join(d, fn), 0o644)
    port = free_port()
    conf = os.path.join(root, "conf", "httpd.conf")
    with open(conf, "w") as f:
        f.write(server_root_conf(root, port) + "\n" + SCOPE.format(
            moddir=MODDIR, so=os.path.join(build, "mod_tbucket.so"),
            root=root, url=url))
    env = dict(os.environ)
    env.pop("LD_PRELOAD", None)
    cmd = ["setsid", "valgrind", "--tool=callgrind",
           "--toggle-collect=check_access", "--dump-after=check_access",
           "--compress-pos=no", "--dump-line=yes",
           "--callgrind-out-file=" + os.path.join(out, "cg.%p"),
           "/usr/sbin/apache2", "-X", "-f", conf, "-DFOREGROUND"]
    log = open(os.path.join(root, "logs", "valgrind.log"), "wb")
    proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=log)
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError("apache2 under valgrind exited %d: see %s"
                               % (proc.returncode, root))
        if wait_port(port, timeout=0.5):
            return proc, port
    proc.kill()
    raise RuntimeError("apache2 under valgrind did not listen")


def measure(build, requests, warmup, keep=None):
    tmp = tempfile.mkdtemp(prefix="tbwalk-", dir="/tmp")
    out = os.path.join(tmp, "cg")
    os.makedirs(out)
    rd = Redis(os.path.join(tmp, "redis"))
    proc = None
    try:
        rd.start()
        proc, port = start_apache(build, tmp, rd.url, out)
        statuses = [get(port, i) for i in range(warmup + requests)]
    finally:
        if proc is not None and proc.poll() is None:
            os.kill(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=120)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)
        rd.stop()
    if any(s != 200 for s in statuses):
        raise RuntimeError("a request was not answered 200: %s" % statuses)
    dumps = sorted(glob.glob(os.path.join(out, "cg.*.*")),
                   key=lambda p: int(p.rsplit(".", 1)[1]))
    profs = [Profile(p) for p in dumps]
    profs = [p for p in profs if p.total > 0]
    if len(profs) != warmup + requests:
        raise RuntimeError("%d profiles with instructions for %d requests"
                           % (len(profs), warmup + requests))
    if keep:
        os.makedirs(keep, exist_ok=True)
        for p in dumps[-requests:]:
            shutil.copy(p, keep)
    shutil.rmtree(tmp, ignore_errors=True)
    return [walk_figures(p) for p in profs[warmup:]]


def summary(figs):
    """One decision's figures from the measured requests, with the spread
    of each count when the requests disagree."""
    def spread(key):
        vals = sorted({len(f[key]) for f in figs})
        return vals[0] if len(vals) == 1 else "%d..%d" % (vals[0], vals[-1])

    def calls(key):
        vals = sorted({sum(n for _, n in f[key]) for f in figs})
        return vals[0] if len(vals) == 1 else "%d..%d" % (vals[0], vals[-1])

    first = figs[0]
    return {
        "requests": len(figs),
        "instructions_median": int(statistics.median(
            f["instructions"] for f in figs)),
        "instructions_min": min(f["instructions"] for f in figs),
        "instructions_max": max(f["instructions"] for f in figs),
        "files_visited": spread("files"),
        "files_visited_c": spread("files_c"),
        "climbs_sites": spread("climbs"),
        "climbs_calls": calls("climbs"),
        "down_sites": spread("downs"),
        "down_calls": calls("downs"),
        "hop_sites": spread("hops"),
        "hop_calls": calls("hops"),
        "shm_sites": spread("shm_sites"),
        "shm_calls": calls("shm_sites"),
        "descents_sites": spread("descents"),
        "descents_calls": calls("descents"),
        "counting_sites": spread("counting"),
        "counting_calls": calls("counting"),
        "files": first["files"],
        "climbs": ["%s -> %s (%s) x%d" % (w, fn, c, n)
                   for (w, fn, c), n in first["climbs"]],
        "shm": ["%s -> %s x%d" % (w, fn, n)
                for (w, fn), n in first["shm_sites"]],
        "descents": ["%s -> %s x%d" % (w, fn, n)
                     for (w, fn), n in first["descents"]],
        "counting": ["%s -> %s x%d" % (w, fn, n)
                     for (w, fn), n in first["counting"]],
        "downs": ["%s -> %s x%d" % (w, fn, n)
                  for (w, fn), n in first["downs"]],
        "objects": {os.path.basename(k): v for k, v in sorted(
            first["objects"].items(), key=lambda kv: -kv[1]) if v},
    }


REPORT = """walk from check_access, one decision (%(requests)d requests)
  instructions          %(instructions_median)d (median; \
%(instructions_min)d..%(instructions_max)d)
  files visited         %(files_visited)s (.c files %(files_visited_c)s)
  climbs (lower->upper) %(climbs_sites)s call sites, %(climbs_calls)s calls
  calls down a layer    %(down_sites)s call sites, %(down_calls)s calls
  calls between files   %(hop_sites)s call sites, %(hop_calls)s calls
  into tbucket_shm*.c   %(shm_sites)s call sites, %(shm_calls)s calls
  out of mod_tbucket.c  %(descents_sites)s call sites, %(descents_calls)s calls
    reaching shm*.c     %(counting_sites)s call sites, \
%(counting_calls)s calls"""


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default=os.path.join(ROOT, "build"),
                    help="the build dir holding mod_tbucket.so")
    ap.add_argument("--requests", type=int, default=20,
                    help="measured requests (1 to 200)")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--json", help="write the figures here")
    ap.add_argument("--keep", help="copy the measured profiles here")
    ap.add_argument("--verbose", action="store_true",
                    help="list the files, climbs and call sites")
    a = ap.parse_args()
    if not shutil.which("valgrind"):
        print("walk: valgrind is not installed: not measured")
        return 0
    n = max(1, min(a.requests, 200))
    s = summary(measure(os.path.abspath(a.build), n, a.warmup, a.keep))
    s["build"] = os.path.abspath(a.build)
    print(REPORT % s)
    if a.verbose:
        for key in ("files", "climbs", "downs", "shm", "descents",
                    "counting"):
            print("%s:" % key)
            for x in s[key]:
                print("  " + x)
        print("instructions by object: %s" % s["objects"])
    if a.json:
        with open(a.json, "w") as f:
            json.dump(s, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
