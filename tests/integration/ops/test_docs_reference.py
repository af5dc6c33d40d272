"""test_docs_reference.py -- the reference pages cannot drift from the code.

docs/reference.txt is the one source of the man pages. These tests read
the names the code accepts -- the module's AP_INIT_* directive table, the
shim's tables of settings, the tool's long options, commands and exit
codes -- and require the two sets to be equal, so a new directive without
documentation (or documentation of a removed one) fails.
They also render the pages and check groff has nothing to say. The same
holds for the status page: the metric families a live Apache serves and
the table of docs/status-page.md list the same names with the same types.
"""
import glob
import importlib.util
import os
import re
import subprocess

import pytest

from tbtest.apache import http_get
from tbtest.env import ROOT

REF = os.path.join(ROOT, "docs", "reference.txt")


def load_gen():
    spec = importlib.util.spec_from_file_location(
        "gen_man", os.path.join(ROOT, "docs", "gen_man.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


GEN = load_gen()
PAGES = GEN.parse(REF)


def read(path):
    with open(os.path.join(ROOT, path), encoding="utf-8") as f:
        return f.read()


def code_directives():
    names = set()
    for path in glob.glob(os.path.join(ROOT, "mod_tbucket", "*.c")):
        with open(path, encoding="utf-8") as f:
            names |= set(re.findall(r'AP_INIT_[A-Z0-9_]+\(\s*"([^"]+)"',
                                    f.read()))
    return names


def shim_settings(table, least):
    """The settings of a table of shim/shim_conf_table.c ("scalars" or
    "rule_settings"), each written `[SHIM_..] = {"name", DIRS, K_..`, as
    {name: the rules it belongs to}. Fails when it reads fewer than
    `least` entries, or fewer than the table's designators, so that a
    change of the table's form cannot leave the tests comparing nothing."""
    src = read("shim/shim_conf_table.c")
    start = src.find("static const setting_t %s[" % table)
    assert start >= 0, "no table %s in shim/shim_conf_table.c" % table
    body = src[src.find("] = {", start) + 3:src.find("\n};\n", start)]
    found = re.findall(r'\[SHIM_[A-Z]+_\w+\]\s*=\s*\{\s*"(\w+)",\s*'
                       r'(TOP|IN|OUT|BOTH),\s*K_\w+,', body)
    entries = len(re.findall(r"\[SHIM_\w+\]\s*=", body))
    assert len(found) >= least and len(found) == entries, \
        "read %d of the %d entries of shim_conf_table.c:%s (at least %d " \
        "expected)" % (len(found), entries, table, least)
    return {name: {"TOP": "top", "IN": "inbound", "OUT": "outbound",
                   "BOTH": "both"}[dirs] for name, dirs in found}


def diff_message(kind, code, docs):
    return ("%s in the code but not in docs/reference.txt: %s; "
            "documented but not in the code: %s"
            % (kind, sorted(code - docs) or "-", sorted(docs - code) or "-"))


# Every AP_INIT_* directive of mod_tbucket/*.c has an entry, and back.
def test_docs_001_01_directives():
    code = code_directives()
    assert code, "no AP_INIT_* table found in mod_tbucket/*.c"
    docs = set(GEN.entries(PAGES, "directive"))
    assert code == docs, diff_message("directives", code, docs)


# Every top-level setting of the shim's table has an entry, and back.
def test_docs_001_02_shim_settings():
    code = set(shim_settings("scalars", 15))
    docs = set(GEN.entries(PAGES, "setting"))
    assert code == docs, diff_message("shim settings", code, docs)


# Every rule setting has an entry, for the right direction(s).
def test_docs_001_03_shim_rule_settings():
    code = shim_settings("rule_settings", 15)
    docs = GEN.entries(PAGES, "rule")
    assert set(code) == set(docs), diff_message("rule settings", set(code),
                                                set(docs))
    for name, direction in code.items():
        assert docs[name].fields.get("applies") == direction, \
            "rule setting %s applies to %s in the code" % (name, direction)


# The tool's long options, commands and exit codes are documented.
# The options are tools/tbucket_args.c's table (and --help), the commands
# tools/tbucket.c's table, the exit codes tools/tbucket_tool.h's.
def test_docs_001_04_tool():
    args = read("tools/tbucket_args.c")
    opts = set(re.findall(r'^\s*\{ "([a-z-]+)", K_[A-Z_]+,', args, re.M))
    assert len(opts) >= 20, "no option table read in tbucket_args.c"
    opts.add("help")
    docs = set(GEN.entries(PAGES, "option"))
    assert opts == docs, diff_message("tbucket options", opts, docs)
    cmds = set(re.findall(r'^\s*\{ "(\w+)", tool_cmd_\w+ \}',
                          read("tools/tbucket.c"), re.M))
    assert len(cmds) >= 7, "no command table read in tools/tbucket.c"
    docs = set(GEN.entries(PAGES, "command"))
    assert cmds == docs, diff_message("tbucket commands", cmds, docs)
    codes = set(re.findall(r"#define EXIT_\w+ (\d+)",
                           read("tools/tbucket_tool.h")))
    assert len(codes) >= 5, "no exit codes read in tools/tbucket_tool.h"
    codes.add("0")
    docs = set(GEN.entries(PAGES, "exit"))
    assert codes == docs, diff_message("tbucket exit codes", codes, docs)


# Directives used in the shipped configs are real, documented directives.
def test_docs_001_05_conf_examples_use_documented_names():
    directives = set(GEN.entries(PAGES, "directive"))
    settings = set(GEN.entries(PAGES, "setting")) | set(
        GEN.entries(PAGES, "rule"))
    for path in glob.glob(os.path.join(ROOT, "conf", "*")):
        if os.path.isdir(path):
            continue
        with open(path, encoding="utf-8") as f:
            text = f.read()
        if os.path.basename(path) == "shim.conf":
            lines = [ln.split("#")[0].split("//")[0]
                     for ln in text.splitlines()]
            used = set(re.findall(r"(?:^|[{;(,\s])([a-z_]+)\s*=",
                                  "\n".join(lines)))
            assert used <= settings, "%s: undocumented %s" % (
                path, sorted(used - settings))
        else:
            used = set(re.findall(r"\b(TBucket[A-Za-z]+)", text))
            assert used <= directives, "%s: undocumented %s" % (
                path, sorted(used - directives))


# Each entry says how it is written; directives also say where.
def test_docs_001_06_entries_complete():
    for kind in ("directive", "setting", "rule", "command", "option"):
        for name, e in GEN.entries(PAGES, kind).items():
            assert e.fields.get("syntax"), "%s %s has no @syntax" % (kind,
                                                                     name)
            assert any(ln.strip() for ln in e.lines), \
                "%s %s has no description" % (kind, name)
    for name, e in GEN.entries(PAGES, "directive").items():
        assert e.fields["syntax"].split()[0] == name
        assert e.fields.get("context"), "directive %s has no @context" % name


# The generated pages render without groff warnings and name every entry.
def test_docs_001_07_man_pages_render(tmp_path):
    groff = "/usr/bin/groff"
    if not os.path.exists(groff):
        pytest.fail("groff is missing: apt-get install groff-base")
    out = tmp_path / "man"
    subprocess.run(["/usr/bin/python3", os.path.join(ROOT, "docs",
                                                     "gen_man.py"),
                    REF, str(out)], check=True)
    names = sorted(os.listdir(out))
    assert names == ["mod_tbucket.5", "tbucket-shim.5", "tbucket.8"]
    for page in PAGES:
        path = out / ("%s.%s" % (page.name, page.section))
        p = subprocess.run([groff, "-man", "-Tutf8", "-ww", "-z", str(path)],
                           capture_output=True, text=True)
        assert p.returncode == 0 and p.stderr == "", p.stderr
        text = subprocess.run([groff, "-man", "-Tascii", "-P-cbou",
                               str(path)], capture_output=True,
                              text=True).stdout
        flat = re.sub(r"\s+", "", text)
        for b in page.blocks:
            if b[0] == "entry":
                assert b[1].name.replace("-", "") in flat.replace("-", ""), \
                    "%s: %s missing from the rendered page" % (path,
                                                               b[1].name)


def status_doc_metrics(heading="Metrics"):
    """{family: type} from the table under '## <heading>' in
    docs/status-page.md: every backquoted tbucket_ name of a row's first
    cell (a row may name several families of one type)."""
    text = read("docs/status-page.md")
    section = text.split("\n## %s\n" % heading, 1)[1].split("\n## ", 1)[0]
    out = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 2 or not cells[0].startswith("`tbucket_"):
            continue
        for name in re.findall(r"`(tbucket_\w+)`", cells[0]):
            out[name] = cells[1]
    return out


DEPRECATED = "Deprecated names (aliases until 0.3.0)"


# Every metric family the status page serves (its # TYPE lines, from a
# live Apache with the module, a Redis and a limit) is in the table of
# docs/status-page.md with its type, or in its table of deprecated
# names, and the tables list no other.
def test_docs_001_08_status_metrics(apache_factory, redis_server):
    a = apache_factory()
    a.start("""
TBucketRedis %s timeout=500
TBucketShed low=50
<Location /limited>
    TBucketEnable On
    TBucketLimit 5 1/s
    TBucketLocalConcurrency 4
</Location>
<Location /tbucket-status>
    SetHandler tbucket-status
</Location>
""" % redis_server.url)
    assert http_get(a.url("/limited/ok.txt")).status_code == 200
    page = http_get(a.url("/tbucket-status")).text
    code = dict(re.findall(r"^# TYPE (tbucket_\w+) (\w+)$", page, re.M))
    assert "tbucket_decisions_total" in code, page[:500]
    docs = status_doc_metrics()
    old = status_doc_metrics(DEPRECATED)
    assert len(old) >= 2 and not set(old) & set(docs), (old, docs)
    docs.update(old)
    assert set(code) == set(docs), (
        "metrics served but not in docs/status-page.md: %s; documented but "
        "not served: %s" % (sorted(set(code) - set(docs)) or "-",
                            sorted(set(docs) - set(code)) or "-"))
    wrong = {n: (code[n], docs[n]) for n in code if code[n] != docs[n]}
    assert not wrong, "types served vs documented: %s" % wrong
    a.assert_log_clean()
