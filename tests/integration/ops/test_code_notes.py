"""test_code_notes.py -- what the code says about itself stays true.

mod_tbucket/mod_tbucket.h groups its function declarations under banners
that name the file defining them ("/* ---- tbucket_cpu.c ---- */"); the
objects make built (nm) say where each function really is. docs/design.md's
"File notes" speak of files and of the project's functions, types,
constants and directives: each must exist. And every integration test has
an id of its own across the tree, as tests/integration/README.md asks.
"""
import glob
import os
import re
import subprocess

from tbtest.env import BUILD, ROOT

HEADER = os.path.join(ROOT, "mod_tbucket", "mod_tbucket.h")
HEADERS = [HEADER, os.path.join(ROOT, "mod_tbucket", "tbucket_login.h")]
BANNER = re.compile(r"^/\* ----+ (.*?) -*\s*\*/\s*$")
# A declared function: its name before "(" at the start of a declaration
# line (after the return type), never a function-pointer member.
DECL = re.compile(r"^[A-Za-z_][\w\s\*]*?\b(tbucket_\w+)\s*\(", re.M)


def read(path):
    with open(path, encoding="utf-8") as f:
        return f.read()


def strip_comments(text):
    return re.sub(r"/\*.*?\*/", lambda m: "\n" * m.group(0).count("\n"),
                  text, flags=re.S)


def banner_sections():
    """[(banner text, files it names, functions declared under it)] of
    mod_tbucket.h and the headers it includes for parts of the module
    (tbucket_login.h), in order; text before the first banner is ''."""
    sections = [("", set(), [])]
    raw, code = [], []
    for h in HEADERS:
        raw += read(h).splitlines()
        code += strip_comments(read(h)).splitlines()
    for line, bare in zip(raw, code):
        m = BANNER.match(line)
        if m:
            sections.append((m.group(1), set(re.findall(r"[\w.]+\.c",
                                                        m.group(1))), []))
            continue
        f = DECL.match(bare)
        if f and not bare.lstrip().startswith(("typedef", "#", "return")):
            sections[-1][2].append(f.group(1))
    return sections


def defined_in():
    """{function: the mod_tbucket/*.c defining it} from the objects."""
    where = {}
    objs = glob.glob(os.path.join(BUILD, "mod_tbucket", "*.o"))
    assert len(objs) > 20, "run make first: %s" % BUILD
    for obj in objs:
        out = subprocess.run(["nm", "--format=posix", "--defined-only",
                              "--extern-only", obj], capture_output=True,
                             text=True, check=True).stdout
        for line in out.splitlines():
            name, kind = line.split()[:2]
            if kind == "T":
                where[name] = os.path.basename(obj)[:-2] + ".c"
    return where


# Every function mod_tbucket.h declares sits under a banner naming the
# file whose object defines it (nm), and every function is defined.
def test_notes_001_01():
    where = defined_in()
    bad, seen = [], 0
    for text, files, funcs in banner_sections():
        for fn in funcs:
            seen += 1
            if fn not in where:
                bad.append("%s: declared, defined nowhere" % fn)
            elif where[fn] not in files:
                bad.append("%s: under '%s', defined in %s"
                           % (fn, text or "(no banner)", where[fn]))
    assert seen > 60, seen
    assert not bad, "\n".join(bad)


SYMBOL = re.compile(r"\b((?:tb__?|tbucket_|shim_|rm_|TB_|TBUCKET_|SHIM_|"
                    r"RM_)\w*[A-Za-z0-9])\b")


def file_notes():
    text = read(os.path.join(ROOT, "docs", "design.md"))
    start = text.index("\n## File notes")
    end = text.find("\n## ", start + 1)
    return text[start:end if end > 0 else len(text)]


def c_sources():
    out = []
    for pat in ("**/*.c", "**/*.h", "**/*.lua", "**/*.map"):
        out += [p for p in glob.glob(os.path.join(ROOT, pat), recursive=True)
                if not os.path.relpath(p, ROOT).startswith(("build", "."))]
    return "\n".join(read(p) for p in out)


# docs/design.md's "File notes" name only files that exist and the
# project's symbols (tb_, tbucket_, shim_, rm_ ...) and directives that
# the sources still have.
def test_notes_001_02():
    notes = file_notes()
    src = c_sources()
    bad = ["no file %s" % f for f in re.findall(r"^### `([^`]+)`", notes,
                                                 re.M)
           if not os.path.exists(os.path.join(ROOT, f))]
    names = set(SYMBOL.findall(notes))
    bad += ["no symbol %s" % s for s in sorted(names)
            if not re.search(r"\b%s\b" % re.escape(s), src)]
    bad += ["no directive %s" % d for d in
            sorted(set(re.findall(r"\b(TBucket[A-Za-z]+)\b", notes)))
            if '"%s"' % d not in src]
    assert len(names) > 20, names
    assert not bad, "\n".join(bad)


# No two integration tests share an id (test_<area>_NNN_NN), whatever
# their files.
def test_notes_001_03():
    ids = {}
    for path in glob.glob(os.path.join(ROOT, "tests", "integration", "**",
                                       "test_*.py"), recursive=True):
        for name in re.findall(r"^def (test_\w+)\(", read(path), re.M):
            ids.setdefault(name, []).append(os.path.relpath(path, ROOT))
    assert len(ids) > 300, len(ids)
    dup = {k: v for k, v in ids.items() if len(v) > 1}
    assert not dup, dup
