#!/usr/bin/env python3
"""gen_man.py -- man pages from docs/reference.txt, the one source.

    python3 docs/gen_man.py docs/reference.txt OUTDIR

writes OUTDIR/mod_tbucket.5, OUTDIR/tbucket-shim.5 and OUTDIR/tbucket.8
(one file per @page). The format of the source is described at its top.
tests/integration/ops/test_docs_reference.py imports parse() to check the
entries against the code, so a directive without documentation, or
documentation without a directive, fails `make test`.
"""
import os
import sys

ENTRY_KINDS = ("directive", "setting", "rule", "command", "option", "exit")
FIELDS = ("syntax", "default", "context", "applies")

# Where each kind of entry goes in a page, and under which heading.
HEADINGS = {
    "directive": "DIRECTIVES",
    "setting": "SETTINGS",
    "rule": "RULE SETTINGS",
    "command": "COMMANDS",
    "option": "OPTIONS",
    "exit": "EXIT STATUS",
}


class Page:
    def __init__(self, name, section, title, line):
        self.name = name
        self.section = section
        self.title = title
        self.line = line
        self.blocks = []    # ("section", heading, lines) | ("entry", e)


class Entry:
    def __init__(self, kind, name, line):
        self.kind = kind
        self.name = name
        self.line = line
        self.fields = {}
        self.lines = []


def bad(where, msg):
    raise ValueError("%s: %s" % (where, msg))


def parse(path):
    """Return the list of Pages in the file; raise ValueError on an error
    that names the line."""
    pages = []
    page = None
    current = None   # the lines list text goes into
    entry = None
    with open(path, encoding="utf-8") as f:
        for no, raw in enumerate(f, 1):
            line = raw.rstrip("\n")
            if line.startswith("#"):
                continue
            where = "%s:%d" % (path, no)
            if line.startswith("@"):
                word, _, rest = line[1:].partition(" ")
                rest = rest.strip()
                if word == "page":
                    parts = rest.split(None, 2)
                    if len(parts) != 3 or not parts[1].isdigit():
                        bad(where, "@page NAME SECTION TITLE")
                    page = Page(parts[0], parts[1], parts[2], no)
                    pages.append(page)
                    current, entry = None, None
                    continue
                if page is None:
                    bad(where, "@%s before any @page" % word)
                if word == "section":
                    if not rest:
                        bad(where, "@section needs a heading")
                    current = []
                    page.blocks.append(("section", rest, current))
                    entry = None
                elif word in ENTRY_KINDS:
                    if not rest or " " in rest:
                        bad(where, "@%s needs one name" % word)
                    entry = Entry(word, rest, no)
                    page.blocks.append(("entry", entry))
                    current = entry.lines
                elif word in FIELDS:
                    if entry is None:
                        bad(where, "@%s outside an entry" % word)
                    if word in entry.fields:
                        bad(where, "@%s given twice" % word)
                    entry.fields[word] = rest
                else:
                    raise ValueError("%s: unknown @%s" % (where, word))
                continue
            if current is None:
                if line.strip():
                    raise ValueError("%s: text outside a section" % where)
                continue
            current.append(line)
    for p in pages:
        seen = set()
        for b in p.blocks:
            if b[0] == "entry":
                key = (b[1].kind, b[1].name)
                if key in seen:
                    raise ValueError("%s:%d: %s %s documented twice"
                                     % (path, b[1].line, b[1].kind, b[1].name))
                seen.add(key)
    return pages


def entries(pages, kind):
    """{name: Entry} of one kind over all pages."""
    out = {}
    for p in pages:
        for b in p.blocks:
            if b[0] == "entry" and b[1].kind == kind:
                out[b[1].name] = b[1]
    return out


# ---- roff ----------------------------------------------------------------

def esc(text):
    """Escape a line of text for roff."""
    text = text.replace("\\", "\\e").replace("-", "\\-")
    if text.startswith((".", "'")):
        text = "\\&" + text
    return text


def paragraphs(lines):
    """Render text lines: paragraphs, and indented lines as examples."""
    out = []
    i = 0
    para = []

    def flush():
        if para:
            out.append(".PP" if not out or out[-1] != ".PP" else "")
            out.extend(esc(x.strip()) for x in para)
            del para[:]

    while i < len(lines):
        line = lines[i]
        if line.startswith("  "):
            flush()
            out += [".PP", ".RS 4", ".nf"]
            while i < len(lines) and (lines[i].startswith("  ")
                                      or not lines[i].strip()):
                last = i + 1 >= len(lines)
                if not lines[i].strip() and (
                        last or not lines[i + 1].startswith("  ")):
                    break
                out.append(esc(lines[i][2:]))
                i += 1
            out += [".fi", ".RE"]
            continue
        if not line.strip():
            flush()
        else:
            para.append(line)
        i += 1
    flush()
    return [x for x in out if x != ""]


def render_entry(e):
    out = []
    head = e.fields.get("syntax", e.name)
    if e.kind == "exit":
        head = e.name
    # Inline font escapes, not .B: a macro argument loses its quotes.
    out += [".TP", "\\fB%s\\fR" % esc(head)]
    text = paragraphs(e.lines)
    # Inside .TP the first paragraph must not start with .PP.
    if text and text[0] == ".PP":
        text = text[1:]
    out += text
    for field, label in (("default", "Default"), ("context", "Context"),
                         ("applies", "Rules")):
        if field in e.fields:
            out += [".br", "%s: %s" % (label, esc(e.fields[field]))]
    return out


def render(page):
    out = ['.\\" Generated by docs/gen_man.py from docs/reference.txt;'
           ' do not edit.',
           '.TH %s %s "" "mod_tbucket" "mod_tbucket"'
           % (page.name.upper().replace("-", "\\-"), page.section),
           ".SH NAME",
           "%s \\- %s" % (esc(page.name), esc(page.title))]
    # Free sections in order; entries grouped under their kind's heading
    # where the first entry of that kind appears.
    opened = None
    for b in page.blocks:
        if b[0] == "section":
            opened = None
            out.append('.SH "%s"' % b[1])
            out += paragraphs(b[2])
        else:
            e = b[1]
            if opened != e.kind:
                opened = e.kind
                out.append('.SH "%s"' % HEADINGS[e.kind])
            out += render_entry(e)
    return "\n".join(out) + "\n"


def main(argv):
    if len(argv) != 3:
        sys.stderr.write("usage: gen_man.py reference.txt OUTDIR\n")
        return 64
    try:
        pages = parse(argv[1])
    except ValueError as e:
        sys.stderr.write("gen_man.py: %s\n" % e)
        return 65
    os.makedirs(argv[2], exist_ok=True)
    for p in pages:
        path = os.path.join(argv[2], "%s.%s" % (p.name, p.section))
        with open(path + ".tmp", "w", encoding="utf-8") as f:
            f.write(render(p))
        os.replace(path + ".tmp", path)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
