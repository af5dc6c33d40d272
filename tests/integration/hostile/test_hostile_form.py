"""test_hostile_form.py -- the module's form reader against PHP itself.

The key of a rule on %{FORM:field} must be what the application gets in
$_POST, or a client shows the rule one field and PHP another. The same
bodies go through Debian's PHP 8.2 and through the module's reader
(mod_tbucket/tbucket_form_parse.c, run by the test program form_read),
over the fuzz corpus of the form target and over hostile shapes: NULs in
names and values, names PHP renames (' ', '.', an unclosed '['), arrays,
nesting past PHP's limit, more pairs than PHP reads, user-name variants.

PHP runs as php-cgi, the body on stdin with REQUEST_METHOD=POST,
CONTENT_TYPE and CONTENT_LENGTH, so that $_POST is filled by PHP's real
POST handler (add_post_vars), as under mod_php or php-fpm. `php -r` with
parse_str() would be easier to drive, but parse_str() splits the string
with its own tokenizer, which skips empty segments: "&&&log=x" is one
pair to it and four to the POST handler, which counts every segment
against max_input_vars.

For every (body, field): ours names PHP's value exactly, or the shared
key; ours is absent only when PHP leaves the field unset; a field that
is an array in PHP is shared in ours. The hostile shapes also say what
ours must answer (plain bodies give values, not the shared key), and
FORMLOGIN gives each user-name variant the folded name or the shared
key, never a key of its own.
"""
import concurrent.futures
import json
import os
import subprocess
import tempfile
import urllib.parse

import pytest

from tbtest.env import ROOT, prog, require

PHP_CGI = "/usr/bin/php-cgi8.2"
CORPUS = os.path.join(ROOT, "tests", "fuzz", "corpus", "form")
# fuzz_form.c's table: the corpus file's first byte picks the field.
FUZZ_FIELDS = ("log", "pwd", "a", "user_name")

# Prints, for each field named (hex, comma-separated) in TB_FIELDS, what
# $_POST holds: null (unset), "array", or the value in hex; and PHP's
# limits, which the comparison assumes.
DUMP_PHP = r"""<?php
$out = array('max_input_vars' => ini_get('max_input_vars'),
             'max_input_nesting_level' => ini_get('max_input_nesting_level'),
             'fields' => array());
foreach (explode(',', getenv('TB_FIELDS')) as $h) {
    $f = hex2bin($h);
    if (!array_key_exists($f, $_POST)) {
        $out['fields'][$h] = null;
    } elseif (is_array($_POST[$f])) {
        $out['fields'][$h] = 'array';
    } else {
        $out['fields'][$h] = bin2hex($_POST[$f]);
    }
}
echo "TBJSON:", json_encode($out), "\n";
"""

# (field, body, what ours must answer: "value", "shared" or "absent").
# PHP must agree with each (checked below): a value or absent where ours
# has one, anything where ours shares.
HOSTILE = [
    # Plain bodies: values, never shared.
    ("log", b"log=admin&pwd=x&wp-submit=Log+In&testcookie=1", "value"),
    ("pwd", b"log=admin&pwd=p%26ss%3Dw0rd+%2B%25%2F%C3%A9", "value"),
    ("log", b"l%6fg=ad%6Din&pwd=x", "value"),
    ("log", b"pwd=x", "absent"),
    ("log", b"", "absent"),
    ("log", b"log", "value"),
    ("log", b"log=", "value"),
    ("log", b"log=a=b", "value"),
    ("log", b"a=1&&&log=x&&", "value"),
    ("user_login", b"user_login=bob", "value"),
    # Names PHP cuts at a NUL: the rule must see the same field.
    ("log", b"log%00x=admin&pwd=x", "value"),
    ("log", b"log=decoy&log%00=admin", "shared"),
    ("log", b"log%00=admin&log=decoy", "shared"),
    ("log", b"%00log=admin", "absent"),
    # Leading spaces dropped, ' ' and '.' made '_'.
    ("log", b"+%20log=admin", "value"),
    ("log", b"log=decoy&+log=admin", "shared"),
    ("l_og", b"l.og=admin", "value"),
    ("l_og", b"l+og=admin", "value"),
    ("l_og", b"l%2Eog=a&l%20og=b", "shared"),
    ("user_login", b"user.login=admin", "value"),
    ("user_login", b"user_login=decoy&user.login=admin", "shared"),
    ("l.og", b"l.og=admin", "absent"),
    # Arrays, and an unclosed '[' (made '_' with what follows it).
    ("log", b"log[]=admin", "shared"),
    ("log", b"log[a]=admin", "shared"),
    ("log", b"log=decoy&log[]=admin", "shared"),
    ("log", b"log[0]=admin&log=decoy", "shared"),
    ("log", b"log[=admin", "absent"),
    ("log_", b"log[=admin", "value"),
    ("l_og", b"l[og=admin", "value"),
    ("l_og", b"l[og]=admin", "absent"),
    ("user_lo_g_in_x", b"user[lo.g+in[x=a", "value"),
    ("log", b"log%5B%5D=admin", "shared"),
    ("log", b"log[%00]=admin", "absent"),
    ("log_", b"log[%00]=admin", "value"),
    ("log", b"[log]=admin&[log=x", "absent"),
    ("_log", b"[log=x", "absent"),
    ("log", b"log[a][b][c]=x", "shared"),
    ("log", b"log" + b"[a]" * 70 + b"=x", "shared"),
    ("log", b"log=admin&log" + b"[a]" * 70 + b"=x", "shared"),
    # What PHP reads of many pairs: 1,000 (max_input_vars).
    ("log", b"&" * 999 + b"log=x", "value"),
    ("log", b"&" * 1000 + b"log=x", "shared"),
    ("log", b"&" * 1001 + b"log=x", "shared"),
    ("log", b"log=admin&" + b"&" * 1001 + b"log=decoy", "shared"),
    ("log", b"log=admin" + b"&a=b" * 1000, "shared"),
    ("log", b"log=admin" + b"&a=b" * 999, "value"),
    # NUL and other bytes in values: the value, or shared if a NUL.
    ("log", b"log=ad%00min", "shared"),
    ("log", b"log=ad%ZZmin%4", "value"),
    ("log", b"log=%FF%FE", "value"),
    ("log", b"log=a+b%2Bc", "value"),
]

# User names WordPress's sanitize_user() and MySQL's collation make one
# user with "admin": each is that name's key or the shared one.
VARIANTS = ["admin", "Admin", "ADMIN", " admin ", "  ADMIN", "admin&x;",
            "admin<script>1</script>", "\u00e1dmin", "\uff41dmin",
            "\uff21\uff24\uff2d\uff29\uff2e", "ad\u200bmin", "\u200badmin",
            "admin\u00a0", "admin\t", "adm%69n", "&#97;dmin", "admin\x7f",
            "ad\u00admin", "a\u0301dmin"]
# Those that must fold to "admin" itself (plain ASCII).
FOLDED = ["admin", "Admin", "ADMIN", " admin ", "  ADMIN"]
SHARED_BYTES = set(range(0x20)) | set(range(0x80, 0x100)) | \
    {0x7f, ord("&"), ord("<"), ord("%")}


def encode(value):
    """A browser's encoding of one value (UTF-8, spaces as +)."""
    return urllib.parse.quote_plus(value.encode()).encode()


def php_post(script, body, fields):
    """What PHP's POST handler makes of body: {field: None | "array" |
    value bytes}, and PHP's limits."""
    env = {"REDIRECT_STATUS": "1", "GATEWAY_INTERFACE": "CGI/1.1",
           "SCRIPT_FILENAME": script, "REQUEST_METHOD": "POST",
           "CONTENT_TYPE": "application/x-www-form-urlencoded",
           "CONTENT_LENGTH": str(len(body)),
           "TB_FIELDS": ",".join(f.encode().hex() for f in fields),
           "PATH": "/usr/bin:/bin"}
    p = subprocess.run([PHP_CGI, "-q", "-d", "display_errors=0", "-d",
                        "log_errors=0"], input=body, env=env,
                       capture_output=True, timeout=60)
    out = p.stdout.decode("latin-1")
    assert p.returncode == 0 and "TBJSON:" in out, (p.returncode, out,
                                                    p.stderr[-500:])
    got = json.loads(out.split("TBJSON:", 1)[1].splitlines()[0])
    fields_out = {}
    for f in fields:
        v = got["fields"][f.encode().hex()]
        fields_out[f] = v if v in (None, "array") else bytes.fromhex(v)
    return fields_out, got


def ours(cases):
    """form_read's keys for [(field, body)]: [(form, login)], each "A"
    (absent), "S" (shared) or the key's bytes."""
    lines = "".join("%s %s\n" % (f.encode().hex(), b.hex())
                    for f, b in cases)
    p = subprocess.run([prog("form_read")], input=lines.encode(),
                       capture_output=True, timeout=60)
    assert p.returncode == 0, p.stderr
    out = []
    for line in p.stdout.decode().splitlines():
        pair = []
        for tok in line.split(" "):
            pair.append(bytes.fromhex(tok[2:]) if tok.startswith("F:")
                        else tok)
        out.append(tuple(pair))
    assert len(out) == len(cases)
    return out


def fold(value):
    """FORMLOGIN's key for a value PHP gave, written the plain way: shared
    when it holds a byte sanitize_user() or a collation may fold, else
    ASCII lower case with its spaces trimmed and runs made one."""
    if b"\0" in value or any(c in SHARED_BYTES for c in value):
        return "S"
    return b" ".join(w for w in value.lower().split(b" ") if w)


@pytest.fixture(scope="module")
def php_script():
    require(PHP_CGI, "php-cgi")
    with tempfile.TemporaryDirectory(prefix="tbphp-") as d:
        path = os.path.join(d, "dump.php")
        with open(path, "w") as f:
            f.write(DUMP_PHP)
        yield path


def corpus_cases():
    cases = []
    for name in sorted(os.listdir(CORPUS)):
        with open(os.path.join(CORPUS, name), "rb") as f:
            data = f.read()
        if data:
            cases.extend((field, data[1:]) for field in FUZZ_FIELDS)
    return cases


def php_all(script, cases):
    """PHP's $_POST[field] for every (field, body), one php-cgi run per
    body (a few at once)."""
    bodies = {}
    for f, b in cases:
        bodies.setdefault(b, set()).add(f)
    with concurrent.futures.ThreadPoolExecutor(4) as ex:
        runs = {b: ex.submit(php_post, script, b, sorted(fs))
                for b, fs in bodies.items()}
        res = {b: r.result() for b, r in runs.items()}
    for fields, got in res.values():
        assert got["max_input_vars"] == "1000", got
        assert got["max_input_nesting_level"] == "64", got
    return [res[b][0][f] for f, b in cases]


def agrees(php, mine):
    """Ours is PHP's value, or the shared key; absent only when PHP has
    none; an array in PHP is shared in ours."""
    form, login = mine
    if form == "S":
        return True
    if php is None:
        return form == "A"
    if php == "array":
        return False
    if b"\0" in php:
        return False           # form_read shares a value with a NUL
    return form == php and login == fold(php)


# test_hostile_003_01: over the fuzz corpus, every field of the fuzz
# target's table, the module's reader and PHP's POST handler agree (ours
# is PHP's value, or shared; absent only when PHP has none).
def test_hostile_003_01(php_script):
    cases = corpus_cases()
    assert len(cases) >= 4 * 30, len(cases)
    php = php_all(php_script, cases)
    mine = ours(cases)
    bad = [(f, b[:80], p, m) for (f, b), p, m in zip(cases, php, mine)
           if not agrees(p, m)]
    assert not bad, bad
    # Not everything shared: most corpus bodies give a value or absent.
    plain = sum(1 for m in mine if m[0] != "S")
    assert plain >= len(cases) // 2, (plain, len(cases))


# test_hostile_003_02: the hostile shapes (NUL-cut names, renamed names,
# arrays, unclosed '[', nesting past PHP's limit, 999/1000/1001 pairs,
# NULs in values): ours agrees with PHP and answers what each shape
# says (plain bodies give their value, ambiguous ones the shared key).
def test_hostile_003_02(php_script):
    cases = [(f, b) for f, b, _ in HOSTILE]
    php = php_all(php_script, cases)
    mine = ours(cases)
    for (f, b, want), p, m in zip(HOSTILE, php, mine):
        assert agrees(p, m), (f, b[:80], p, m)
        kind = {"A": "absent", "S": "shared"}.get(m[0], "value")
        assert kind == want, (f, b[:80], p, m)


# test_hostile_003_03: FORMLOGIN over the user-name variants WordPress
# folds into "admin" (entities, markup, accents, full-width letters,
# zero-width and no-break spaces, %XX, controls): each gives "admin" or
# the shared key, never a key of its own; plain ASCII spellings fold to
# "admin"; PHP gets each variant as posted.
def test_hostile_003_03(php_script):
    cases = [("log", b"log=" + encode(v) + b"&pwd=x") for v in VARIANTS]
    php = php_all(php_script, cases)
    mine = ours(cases)
    for v, p, (form, login) in zip(VARIANTS, php, mine):
        assert p == v.encode(), (v, p)
        assert form == p, (v, form)
        assert login in (b"admin", "S"), (v, login)
        if v in FOLDED:
            assert login == b"admin", (v, login)
        else:
            assert login == "S", (v, login)
