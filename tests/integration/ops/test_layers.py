"""test_layers.py -- shared/ stays in its layers, and every C file outside
tests/ keeps its functions small.

libtb is five layers (shared/README.md): base/ at the bottom, algo/ and
redis/ on it, side by side, tables/ on algo/, and the decision path at the
top of shared/.
A file may include the headers, and call the functions, of its own layer
and of the layers it stands on, never of one above or beside it. These
tests read the includes from the sources and the calls from the objects
make built (nm), and fail on a call that runs back up or across, and on a
cycle between the files of redis/ (redis/README.md draws the graph).

They also keep what a new maintainer reads in shape: every .c file of
shared/ opens with a head comment naming the file ("tb_x.c -- ..."), each
folder's README.md names its files, and no function in shared/ takes more
than 7 parameters or runs past 80 lines (from its opening brace to its
closing one), as docs/hacking.md asks. The 002 tests hold the hosts
(mod_tbucket/, shim/, tools/, redismod/, bench/'s C) to the same: includes
of their own folder and the core's public header only (or what their
README says they may reach), head comments of at most 20 lines, the same
function sizes, no file over 900 lines, a README naming every file.
"""
import glob
import os
import re
import subprocess

import pytest

from tbtest.env import BUILD, ROOT

SHARED = os.path.join(ROOT, "shared")
LAYERS = ("base", "algo", "redis", "tables")
# What each layer may include and call: itself and what it stands on.
# "top" is the decision path; "public" is tb.h, which every layer may
# include (it declares every layer's public functions).
MAY_USE = {
    "base": {"public", "base"},
    "algo": {"public", "base", "algo"},
    "redis": {"public", "base", "redis"},
    "tables": {"public", "base", "algo", "tables"},
    "top": {"public", "base", "algo", "redis", "tables", "top"},
}
MAX_PARAMS = 7
MAX_LINES = 80
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def rel(path):
    return os.path.relpath(path, SHARED)


def layer_of(path):
    """base, algo, redis or top for a file under shared/; public for
    tb.h."""
    r = rel(path)
    if r in ("tb.h", "tb_tables.h", "tb_bans.h", "tb_known.h",
             "tb_coalesce.h"):
        return "public"
    head = r.split(os.sep)[0]
    return head if head in LAYERS else "top"


def sources(pattern):
    return sorted(glob.glob(os.path.join(SHARED, pattern))
                  + glob.glob(os.path.join(SHARED, "*", pattern)))


def read(path):
    with open(path, encoding="utf-8") as f:
        return f.read()


def resolve_include(path, name):
    """The file a quoted include names, as the compiler finds it with
    -Ishared: beside the including file first, then under shared/."""
    for d in (os.path.dirname(path), SHARED):
        cand = os.path.normpath(os.path.join(d, name))
        if os.path.exists(cand):
            return cand
    return None


# ---- Functions, read from the C text ----------------------------------

def strip_comments(text):
    """text with comments and the insides of string and character
    literals blanked out, line breaks kept."""
    out, i, n = [], 0, len(text)
    while i < n:
        if text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append("".join(c if c == "\n" else " " for c in text[i:j]))
            i = j
        elif text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i))
            i = j
        elif text[i] in "\"'":
            q, j = text[i], i + 1
            while j < n and text[j] != q:
                j += 2 if text[j] == "\\" else 1
            out.append(q + " " * (j - i - 1) + q)
            i = j + 1
        else:
            out.append(text[i])
            i += 1
    return "".join(out)


def count_params(params):
    """Parameters of a declarator's list: top-level commas plus one,
    none for "" or "void"."""
    if params.strip() in ("", "void"):
        return 0
    depth, n = 0, 1
    for c in params:
        depth += c == "("
        depth -= c == ")"
        n += c == "," and depth == 0
    return n


def functions(path):
    """(name, parameters, lines, first line) of every function defined
    in path: a definition in this tree's style opens with "{" alone in
    column 0 and ends at "}" in column 0; its lines are counted from the
    one to the other, both included."""
    lines = strip_comments(read(path)).split("\n")
    found, i = [], 0
    while i < len(lines):
        if lines[i] != "{":
            i += 1
            continue
        j, sig = i - 1, []
        while (j >= 0 and lines[j].strip() and not lines[j].startswith("#")
               and not lines[j].rstrip().endswith((";", "}"))):
            sig.insert(0, lines[j])
            j -= 1
        k = i + 1
        while k < len(lines) and lines[k] != "}":
            k += 1
        m = re.search(r"([A-Za-z_]\w*)\s*\((.*)\)\s*$", " ".join(sig), re.S)
        if m:
            found.append((m.group(1), count_params(m.group(2)), k - i + 1,
                          j + 2))
        i = k + 1
    return found


# ---- Calls, read from the objects -------------------------------------

def objects():
    """{source under shared/: its object under $TB_BUILD/shared/}, the
    generated script table included (algo/)."""
    objs = {}
    for src in sources("*.c"):
        objs[rel(src)] = os.path.join(BUILD, "shared",
                                      rel(src)[:-2] + ".o")
    objs[os.path.join("algo", "tb_script.c")] = os.path.join(
        BUILD, "shared", "algo", "tb_script.o")
    missing = [o for o in objs.values() if not os.path.exists(o)]
    if missing:
        pytest.fail("objects missing (run make BUILD=%s): %s"
                    % (BUILD, ", ".join(missing[:5])))
    return objs


def nm(obj, *flags):
    out = subprocess.run(["nm", "--format=posix"] + list(flags) + [obj],
                         capture_output=True, text=True, check=True).stdout
    return {line.split()[0] for line in out.splitlines() if line.strip()}


def symbol_table():
    """({symbol: source that defines it}, {source: symbols it uses}) for
    libtb's own global symbols."""
    defined, used = {}, {}
    objs = objects()
    for src, obj in objs.items():
        for sym in nm(obj, "--defined-only", "--extern-only"):
            defined[sym] = src
    for src, obj in objs.items():
        used[src] = {s for s in nm(obj, "--undefined-only") if s in defined}
    return defined, used


def layer_of_rel(src):
    return layer_of(os.path.join(SHARED, src))


# Every quoted include of a file in shared/ names a header of its own
# layer or of one below it (tb.h is every layer's), and exists.
def test_layers_001_01():
    bad = []
    for path in sources("*.[ch]"):
        mine = layer_of(path)
        for name in INCLUDE.findall(read(path)):
            target = resolve_include(path, name)
            if target is None or not target.startswith(SHARED + os.sep):
                bad.append("%s: \"%s\" is not a header of shared/"
                           % (rel(path), name))
            elif layer_of(target) not in MAY_USE.get(mine, {"public"}):
                bad.append("%s (%s) includes %s (%s)"
                           % (rel(path), mine, rel(target),
                              layer_of(target)))
    assert not bad, "\n".join(bad)


# No object of shared/ calls a function (or reads a variable) that a
# layer above or beside it defines: the calls follow the includes.
def test_layers_001_02():
    defined, used = symbol_table()
    bad = []
    for src, syms in sorted(used.items()):
        mine = layer_of_rel(src)
        for sym in sorted(syms):
            theirs = layer_of_rel(defined[sym])
            if theirs not in MAY_USE[mine]:
                bad.append("%s (%s) uses %s of %s (%s)"
                           % (src, mine, sym, defined[sym], theirs))
    assert not bad, "\n".join(bad)


# The files of redis/ call each other without a cycle.
def test_layers_001_03():
    defined, used = symbol_table()
    graph = {}
    for src, syms in used.items():
        if layer_of_rel(src) == "redis":
            graph[src] = {defined[s] for s in syms
                          if layer_of_rel(defined[s]) == "redis"
                          and defined[s] != src}
    state, path = {}, []

    def visit(node):
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                cycle = path[path.index(nxt):] + [nxt]
                pytest.fail("cycle in redis/: " + " -> ".join(cycle))
            if nxt not in state:
                visit(nxt)
        path.pop()
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node)


# Every .c file of shared/ opens with a head comment that names it:
# "/* tb_x.c -- what it owns".
def test_layers_001_04():
    bad = []
    for path in sources("*.c"):
        name = os.path.basename(path)
        first = read(path).split("\n", 1)[0]
        if not first.startswith("/* %s -- " % name):
            bad.append("%s: head comment %r" % (rel(path), first[:60]))
    assert not bad, "\n".join(bad)


# No function in shared/ takes more than 7 parameters or runs past 80
# lines.
def test_layers_001_05():
    bad = []
    for path in sources("*.[ch]"):
        for name, params, lines, at in functions(path):
            if params > MAX_PARAMS or lines > MAX_LINES:
                bad.append("%s:%d %s: %d parameters, %d lines"
                           % (rel(path), at, name, params, lines))
    assert not bad, "\n".join(bad)


# The parser above measures what it should: on a sample in this tree's
# style (comments and strings holding braces and commas, a function
# pointer parameter) it finds each function with its parameters and
# lines, so test_layers_001_05 cannot pass by finding nothing.
def test_layers_001_06(tmp_path):
    sample = tmp_path / "sample.c"
    sample.write_text(
        "/* sample.c -- { not a body, } */\n"
        "static int one(void)\n{\n    return 1;\n}\n\n"
        "int eight(int a, int b, const char *c, void (*f)(int, int),\n"
        "          int e, int g, int h, int i)\n"
        "{\n    /* , } */\n    return a + b + e + g + h + i\n"
        "           + (c[0] == '}') + (f != 0);\n}\n")
    found = {f[0]: f[1:3] for f in functions(str(sample))}
    assert found == {"one": (0, 3), "eight": (8, 5)}, found
    assert len(functions(os.path.join(SHARED, "tb_client.c"))) > 20


# Each folder of shared/ has a README.md that names every .c and .h
# file in it, so a file cannot be added without saying what it owns.
def test_layers_001_07():
    bad = []
    for d in [SHARED] + [os.path.join(SHARED, l) for l in LAYERS]:
        readme = os.path.join(d, "README.md")
        if not os.path.exists(readme):
            bad.append("%s: no README.md" % rel(d))
            continue
        text = read(readme)
        for path in sorted(glob.glob(os.path.join(d, "*.[ch]"))):
            name = os.path.basename(path)
            if name not in ("tb.h", "tb_tables.h", "tb_bans.h",
                            "tb_known.h", "tb_coalesce.h") \
                    and name not in text:
                bad.append("%s does not name %s" % (rel(readme), name))
    assert not bad, "\n".join(bad)


# ---- The hosts: the same rules over every C file outside tests/ --------

# Each host folder and the quoted headers its files may include: their
# own, the core's public header, and what the folder's README says it may
# reach beyond that (the tool the shim's loader; the Redis module the
# core's pure twins). Headers of the system, APR and httpd are included
# with <> or are not files of this tree, and are not checked.
HOSTS = {
    "mod_tbucket": {"shared/tb.h"},
    "shim": {"shared/tb.h"},
    "tools": {"shared/tb.h", "shim/tb_shim.h"},
    "redismod": {"shared/tb.h", "shared/algo/tb_algo_int.h",
                 "shared/base/tb_base.h"},
    "bench": {"shared/tb.h"},
}


def host_sources(pattern):
    out = []
    for d in HOSTS:
        out += glob.glob(os.path.join(ROOT, d, pattern))
    return sorted(out)


def tree_header(path, name):
    """The file of this tree a quoted include names (beside the file, or
    under shared/ as -Ishared finds it), or None for a header of the
    system, APR or httpd."""
    for d in (os.path.dirname(path), SHARED):
        cand = os.path.normpath(os.path.join(d, name))
        if os.path.exists(cand) and cand.startswith(ROOT + os.sep):
            return os.path.relpath(cand, ROOT)
    return None


# Every quoted include of a host file is its own folder's header, or one
# the table above allows: no host reaches into another, or into the
# core's internals, unless its README says so.
def test_layers_002_01():
    bad, seen = [], 0
    for path in host_sources("*.[ch]"):
        folder = os.path.relpath(path, ROOT).split(os.sep)[0]
        for name in INCLUDE.findall(read(path)):
            target = tree_header(path, name)
            if target is None:
                continue
            seen += 1
            if (os.path.dirname(target) != folder
                    and target not in HOSTS[folder]):
                bad.append("%s includes %s" % (os.path.relpath(path, ROOT),
                                               target))
    assert seen > 40, "too few includes read: %d" % seen
    assert not bad, "\n".join(bad)


# Every host .c file opens with a head comment naming it, at most 20
# lines long.
def test_layers_002_02():
    bad = []
    files = host_sources("*.c")
    assert len(files) > 30, files
    for path in files:
        text = read(path)
        name = os.path.basename(path)
        head = text[:text.find("*/") + 2] if text.startswith("/*") else ""
        if not head.startswith("/* %s -- " % name):
            bad.append("%s: head comment %r" % (name, text[:60]))
        elif head.count("\n") + 1 > 20:
            bad.append("%s: head comment of %d lines" % (
                name, head.count("\n") + 1))
    assert not bad, "\n".join(bad)


# No function in any host takes more than 7 parameters or runs past 80
# lines, as in shared/.
def test_layers_002_03():
    bad, n = [], 0
    for path in host_sources("*.[ch]"):
        for name, params, lines, at in functions(path):
            n += 1
            if params > MAX_PARAMS or lines > MAX_LINES:
                bad.append("%s:%d %s: %d parameters, %d lines"
                           % (os.path.relpath(path, ROOT), at, name, params,
                              lines))
    assert n > 300, "too few functions read: %d" % n
    assert not bad, "\n".join(bad)


# No C file or header of the tree, outside tests/, is over 900 lines: one
# job per file.
def test_layers_002_04():
    bad = []
    files = host_sources("*.[ch]") + sources("*.[ch]")
    for path in files:
        n = read(path).count("\n")
        if n > 900:
            bad.append("%s: %d lines" % (os.path.relpath(path, ROOT), n))
    assert len(files) > 80, len(files)
    assert not bad, "\n".join(bad)


# Each host folder has a README.md naming every .c and .h file in it.
def test_layers_002_05():
    bad = []
    for d in HOSTS:
        if d == "bench":
            continue
        readme = os.path.join(ROOT, d, "README.md")
        if not os.path.exists(readme):
            bad.append("%s: no README.md" % d)
            continue
        text = read(readme)
        for path in sorted(glob.glob(os.path.join(ROOT, d, "*.[ch]"))):
            if os.path.basename(path) not in text:
                bad.append("%s/README.md does not name %s"
                           % (d, os.path.basename(path)))
    assert not bad, "\n".join(bad)
