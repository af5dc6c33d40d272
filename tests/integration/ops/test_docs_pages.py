"""test_docs_pages.py -- the README starts a user in one screen, and
every page of docs/ can be found from it.

README.md stays short and points to docs/, where the pages are kept by
purpose (guide, operations, design, benchmarks, proof). These tests keep
that shape: the README's length, its test command, no directive table in
it (docs/reference.txt is the one list of directives), every page of
docs/ reachable from the README by relative Markdown links, and every
relative link of the README and of docs/*.md pointing at a file that
exists and, with an anchor, at a heading of that file.
"""
import glob
import os
import re

from tbtest.env import ROOT

README = os.path.join(ROOT, "README.md")
DOCS = os.path.join(ROOT, "docs")
MAX_README_LINES = 200

# [text](target) and ![alt](target); the target ends at a space (before
# an optional title) or at the closing parenthesis.
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?"
                  r"(?:\s+\"[^\"]*\")?\s*\)")
FENCE = re.compile(r"^\s*(```|~~~)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")


def read(path):
    with open(path, encoding="utf-8") as f:
        return f.read()


def prose_lines(text):
    """The lines of a Markdown text outside fenced code blocks."""
    out, fenced = [], False
    for line in text.splitlines():
        if FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            out.append(line)
    return out


def links(path):
    """The link targets of a Markdown file, outside code blocks and
    inline code spans."""
    found = []
    for line in prose_lines(read(path)):
        line = re.sub(r"`[^`]*`", "", line)
        found += LINK.findall(line)
    return found


def slug(heading):
    """GitHub's anchor for a heading: the text without Markdown markup,
    lower case, punctuation dropped, spaces turned into hyphens."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)
    text = text.replace("`", "").replace("*", "")
    text = text.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path):
    """Every anchor the headings of a Markdown file define, with GitHub's
    -1, -2 suffixes for repeated headings."""
    seen, out = {}, set()
    for line in prose_lines(read(path)):
        m = HEADING.match(line)
        if not m:
            continue
        s = slug(m.group(2))
        n = seen.get(s, 0)
        seen[s] = n + 1
        out.add(s if n == 0 else "%s-%d" % (s, n))
    return out


def is_relative(target):
    return not re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I) \
        and not target.startswith("//")


def resolve(page, target):
    """(absolute path or None for the page itself, anchor or None)."""
    path, _, anchor = target.partition("#")
    if not path:
        return os.path.abspath(page), anchor or None
    return (os.path.normpath(os.path.join(os.path.dirname(page), path)),
            anchor or None)


def doc_pages():
    """The pages of docs/ that must be reachable: Markdown and the
    reference (images and the man page generator are not pages)."""
    return sorted(glob.glob(os.path.join(DOCS, "*.md"))
                  + [os.path.join(DOCS, "reference.txt")])


def checked_pages():
    return [README] + sorted(glob.glob(os.path.join(DOCS, "*.md")))


# README.md fits in one screenful of reading: at most 200 lines.
def test_docs_002_01():
    n = len(read(README).splitlines())
    assert n <= MAX_README_LINES, "README.md has %d lines (at most %d)" % (
        n, MAX_README_LINES)


# Every page of docs/ is reachable from README.md by relative Markdown
# links, followed through the Markdown pages they lead to.
def test_docs_002_02():
    reached, todo = set(), [README]
    while todo:
        page = todo.pop()
        if page in reached:
            continue
        reached.add(page)
        for target in links(page):
            if not is_relative(target):
                continue
            path, _ = resolve(page, target)
            if path.endswith(".md") and os.path.isfile(path):
                todo.append(path)
            elif os.path.isfile(path):
                reached.add(path)
    missing = [os.path.relpath(p, ROOT) for p in doc_pages()
               if p not in reached]
    assert not missing, "not reachable from README.md: %s" % missing


# Every relative link of README.md and docs/*.md names an existing file,
# and an anchor names a heading of the Markdown file it points into.
def test_docs_002_03():
    bad = []
    for page in checked_pages():
        for target in links(page):
            if not is_relative(target):
                continue
            path, anchor = resolve(page, target)
            where = "%s: %s" % (os.path.relpath(page, ROOT), target)
            if not os.path.exists(path):
                bad.append(where + " (no such file)")
            elif anchor and not path.endswith(".md"):
                bad.append(where + " (anchor into a file that is not "
                                   "Markdown)")
            elif anchor and anchor not in anchors(path):
                bad.append(where + " (no such heading)")
    assert not bad, "broken links:\n  " + "\n  ".join(bad)


# README.md names the test command CI runs, `make test`, as a command.
def test_docs_002_04():
    text = read(README)
    assert re.search(r"^make test\b", text, re.M), \
        "README.md shows no `make test` command line"
    assert "`make test`" in text


# README.md holds no directive table: the directives are listed once, in
# docs/reference.txt, which the README links to.
def test_docs_002_05():
    rows = [ln for ln in read(README).splitlines()
            if re.match(r"^\s*\|\s*`?TBucket[A-Za-z]+", ln)]
    assert not rows, "directive table rows in README.md: %s" % rows[:3]
    assert "(docs/reference.txt)" in read(README)
