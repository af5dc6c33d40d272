"""tbtest/redismod.py -- tbucket_redis.so in a real redis-server, and the
two engines (the scripts by EVAL, the module's tbucket.* commands) side
by side on the same server.

ModRedis is tbtest.env's Redis with `loadmodule` in its redis.conf. For a
sanitizer build of the module (make SANITIZER=address,undefined) the
ASan/UBSan runtimes the module links are preloaded into redis-server only,
as scripts/apache2.sh does for Apache, with their reports written to
files in the server's directory (sanitizer_reports()). The vector tables
of tests/vectors/ are read here too, for the module's tests.
"""
import os
import subprocess

import pytest

from tbtest.env import BUILD, ROOT, Redis, lua_script

MODULE = os.path.join(BUILD, "tbucket_redis.so")

# algo (tests/vectors/<algo>.tsv name) -> (module command, script file)
ENGINES = {
    "token_bucket": ("tbucket.bucket", "tb_bucket.lua"),
    "gcra": ("tbucket.gcra", "tb_gcra.lua"),
    "sliding_window": ("tbucket.swindow", "tb_swindow.lua"),
    "fixed_window": ("tbucket.fwindow", "tb_fwindow.lua"),
    "sliding_log": ("tbucket.slog", "tb_slog.lua"),
}
ALGOS = sorted(ENGINES)


def module_path(build=None):
    """The module make built (fail, not skip, when it is missing)."""
    path = os.path.join(build, "tbucket_redis.so") if build else MODULE
    if not os.path.exists(path):
        pytest.fail("%s is missing: run make" % path)
    return path


def sanitizer_runtimes(so):
    """The ASan/UBSan runtimes a sanitizer build of `so` links, by path
    (none for a plain build)."""
    env = dict(os.environ)
    env.pop("LD_PRELOAD", None)
    out = subprocess.run(["ldd", so], capture_output=True, text=True,
                         env=env).stdout
    libs = []
    for line in out.splitlines():
        parts = line.split()
        if (len(parts) >= 3 and parts[2].startswith("/")
                and parts[0].startswith(("libasan.so", "libubsan.so"))):
            libs.append(parts[2])
    return libs


class ModRedis(Redis):
    """A redis-server of our own (tbtest.env.Redis) that loads the module
    (module=None: none, as a server without it). prefix as Redis's."""

    def __init__(self, tmpdir, module=MODULE, extra=None, port=None,
                 prefix=(), module_args=""):
        extra = list(extra or [])
        self.module = module
        self.sanitized = bool(module and sanitizer_runtimes(module))
        if module:
            extra.append(("loadmodule %s %s" % (module, module_args))
                         .strip())
        pre = list(prefix)
        if self.sanitized:
            d = str(tmpdir)
            pre = ["env", "LD_PRELOAD=" + " ".join(sanitizer_runtimes(module)),
                   "ASAN_OPTIONS=detect_leaks=0:log_path=%s/asan" % d,
                   "UBSAN_OPTIONS=print_stacktrace=1:log_path=%s/ubsan" % d
                   ] + pre
        super().__init__(tmpdir, port=port, extra=extra, prefix=pre)

    def restart(self, module="same", extra=None):
        """Stop (SHUTDOWN's save rules: ours save nothing but the AOF)
        and start again on the same port and directory, with the module
        or another (None: without)."""
        self.stop()
        if module != "same":
            self.extra = [e for e in self.extra
                          if not e.startswith("loadmodule ")]
            if module:
                self.extra.append("loadmodule %s" % module)
            self.module = module
        if extra:
            self.extra += list(extra)
        return self.start()

    def log(self):
        with open(os.path.join(self.dir, "redis.log"),
                  errors="replace") as f:
            return f.read()


def engine_calls(r):
    """(module calls, script calls) the server r (a Redis of tbtest's)
    has run: tbucket.bucket against EVALSHA and EVAL, from INFO
    commandstats."""
    st = r.client().info("commandstats")
    mod = st.get("cmdstat_tbucket.bucket", {}).get("calls", 0)
    scr = sum(st.get(k, {}).get("calls", 0)
              for k in ("cmdstat_evalsha", "cmdstat_eval"))
    return mod, scr


def sanitizer_reports(directory):
    """The text of every ASan/UBSan report file in directory."""
    out = []
    for name in sorted(os.listdir(directory)):
        if name.startswith(("asan.", "ubsan.")):
            with open(os.path.join(directory, name),
                      errors="replace") as f:
                out.append("%s:\n%s" % (name, f.read()))
    return out


def script_text(algo):
    return lua_script(ENGINES[algo][1])


def script(r, algo, keys, argv):
    """One call of the script as it ships (EVAL of build/lua/)."""
    return r.eval(script_text(algo), len(keys), *keys, *argv)


def module(r, algo, keys, argv):
    """The same call as a tbucket.* command."""
    return r.execute_command(ENGINES[algo][0], len(keys), *keys, *argv)


def call(r, engine, algo, keys, argv):
    return (script if engine == "script" else module)(r, algo, keys, argv)


def dump(r, key):
    """A key's value exactly as stored: ('hash', [(field, value)...]) in
    Redis's order, ('string', bytes), ('zset', [(member, score)...]), or
    None."""
    t = r.type(key)
    if t == b"none":
        return None
    if t == b"hash":
        return ("hash", list(r.hgetall(key).items()))
    if t == b"string":
        return ("string", r.get(key))
    if t == b"zset":
        return ("zset", r.zrange(key, 0, -1, withscores=True))
    return (t.decode(), None)


def num(x):
    """A double as the shortest string that reads back to the same value
    (what the client sends is "%.17g" or digits: both read back exact)."""
    x = float(x)
    return str(int(x)) if x == int(x) and abs(x) < 1e15 else repr(x)


# ---- the algorithm vector tables (tests/vectors/<algo>.tsv) -------------

def algo_rows(algo):
    """Rows of gcra/fixed_window/sliding_window/sliding_log.tsv: case,
    now_ms, capacities, rates, costs ('|'-joined), allowed, remaining,
    retry_ms, binding, states, [op]."""
    out = []
    with open(os.path.join(ROOT, "tests", "vectors", algo + ".tsv")) as f:
        for line in f:
            if line.startswith("#") or not line.strip():
                continue
            out.append(line.rstrip("\n").split("\t"))
    return out


def algo_state(r, algo, key):
    """A window/GCRA/log key's state in the tables' form."""
    if not r.exists(key):
        return "-"
    if algo == "gcra":
        return float(r.get(key))
    if algo == "sliding_log":
        return [int(s) for _, s in r.zrange(key, 0, -1, withscores=True)]
    h = r.hgetall(key)
    if algo == "fixed_window":
        return (float(h[b"w"]), float(h[b"n"]))
    return (float(h[b"w"]), float(h[b"cur"]), float(h[b"prev"]))


def algo_expected(algo, text):
    if text == "-":
        return "-"
    if algo == "gcra":
        return float(text)
    if algo == "sliding_log":
        return [int(t) for t in text.split(",")]
    vals = [float(x) for x in text.split(",")]
    return tuple(vals[:2]) if algo == "fixed_window" else tuple(vals)


LEASE_COLS = ("id exists tokens ts_ms now_ms capacity rate cost want "
              "allowed remaining retry_ms granted new_tokens new_ts_ms "
              "ttl_ms back").split()


def lease_rows():
    """tests/vectors/lease.tsv as dicts, back "0" where it is absent."""
    rows = []
    path = os.path.join(ROOT, "tests", "vectors", "lease.tsv")
    with open(path) as f:
        for line in f:
            line = line.rstrip("\n")
            if not line or line.startswith("#"):
                continue
            parts = line.split("\t")
            assert len(parts) in (len(LEASE_COLS) - 1, len(LEASE_COLS))
            rows.append(dict(zip(LEASE_COLS, parts + ["0"])))
    return rows


def module_cluster(tmp_path, so=None, primaries=3):
    """tbtest.ha's ClusterRig whose nodes load the module (the sanitizer
    runtimes preloaded as ModRedis does); not started."""
    from tbtest.ha import ClusterRig
    so = so or module_path()
    rig = ClusterRig(tmp_path, primaries=primaries)
    libs = sanitizer_runtimes(so)
    for n in rig.nodes:
        n.extra.append("loadmodule %s" % so)
        if libs:
            n.prefix = ["env", "LD_PRELOAD=" + " ".join(libs),
                        "ASAN_OPTIONS=detect_leaks=0:log_path=%s/asan"
                        % n.dir,
                        "UBSAN_OPTIONS=print_stacktrace=1:log_path=%s/ubsan"
                        % n.dir]
    return rig
