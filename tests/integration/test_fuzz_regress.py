"""test_fuzz_regress.py -- replay the fuzz corpus as a regression test.

Every input under tests/fuzz/corpus/<target>/ (the seeds and each input
that once crashed a target or broke one of its invariants) is fed once to
the target's LLVMFuzzerTestOneInput(), linked with tests/fuzz/replay_main.c
instead of libFuzzer and built with gcc + ASan/UBSan, so this needs no
clang. Inputs of bugs reported but not fixed yet are listed in
tests/fuzz/KNOWN_OPEN and expected to fail (strict xfail: once the bug is
fixed the test says XPASS and the line must be removed).
"""
import os
import subprocess

import pytest

from tbenv import ROOT, BUILD

FUZZ = os.path.join(ROOT, "tests", "fuzz")
CORPUS = os.path.join(FUZZ, "corpus")
TARGETS = {
    # name: (extra sources, extra libraries)
    "url": ([], []),
    "key": ([], []),
    "parse": ([], []),
    "shimconf": (["shim/shim_conf.c"], ["-lconfig", "-ldl"]),
}


def known_open():
    known = {}
    with open(os.path.join(FUZZ, "KNOWN_OPEN")) as f:
        for line in f:
            parts = line.split(None, 2)
            if len(parts) >= 2 and not line.startswith("#"):
                known[parts[1]] = "%s: %s" % (parts[0], parts[2].strip()
                                              if len(parts) > 2 else "")
    return known


def corpus_cases():
    known = known_open()
    cases = []
    for target in sorted(TARGETS):
        d = os.path.join(CORPUS, target)
        if not os.path.isdir(d):
            continue
        for name in sorted(os.listdir(d)):
            rel = "%s/%s" % (target, name)
            marks = []
            if rel in known:
                marks.append(pytest.mark.xfail(strict=True,
                                               reason=known[rel]))
            cases.append(pytest.param(target, name, marks=marks, id=rel))
    return cases


@pytest.fixture(scope="module")
def replay_bins(tmp_path_factory):
    """Build replay_<target> for every target whose sources exist."""
    out = tmp_path_factory.mktemp("fuzz-replay")
    script_c = os.path.join(BUILD, "shared", "tb_script.c")
    assert os.path.exists(script_c), "run make first: %s missing" % script_c
    core = [os.path.join(ROOT, "shared", f)
            for f in sorted(os.listdir(os.path.join(ROOT, "shared")))
            if f.endswith(".c")] + [script_c]
    bins = {}
    for target, (srcs, libs) in TARGETS.items():
        if not all(os.path.exists(os.path.join(ROOT, s)) for s in srcs):
            continue
        exe = str(out / ("replay_" + target))
        cmd = (["cc", "-g", "-O1", "-fno-omit-frame-pointer",
                "-fsanitize=address,undefined",
                "-fno-sanitize-recover=all", "-D_GNU_SOURCE",
                "-I" + os.path.join(ROOT, "shared"),
                "-I" + os.path.join(ROOT, "shim"), "-I" + BUILD,
                "-o", exe, os.path.join(FUZZ, "fuzz_%s.c" % target),
                os.path.join(FUZZ, "replay_main.c")]
               + [os.path.join(ROOT, s) for s in srcs] + core
               + ["-lhiredis", "-lssl", "-lcrypto", "-lm", "-pthread"] + libs)
        r = subprocess.run(cmd, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, timeout=120)
        assert r.returncode == 0, r.stdout.decode(errors="replace")
        bins[target] = exe
    return bins


# test_fuzz_001_01: every corpus input passes its target's invariants
# under ASan/UBSan (known open bugs are strict xfails).
@pytest.mark.parametrize("target,name", corpus_cases())
def test_fuzz_001_01(replay_bins, target, name):
    if target not in replay_bins:
        pytest.fail("fuzz target %s has no sources to build" % target)
    env = dict(os.environ)
    env.pop("FUZZ_SKIP_KNOWN", None)
    env.pop("LD_PRELOAD", None)
    env["ASAN_OPTIONS"] = "detect_leaks=1:abort_on_error=0"
    env["LSAN_OPTIONS"] = "suppressions=%s" % os.path.join(FUZZ,
                                                           "lsan.supp")
    r = subprocess.run([replay_bins[target],
                        os.path.join(CORPUS, target, name)],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       timeout=60, env=env)
    assert r.returncode == 0, r.stdout.decode(errors="replace")[-3000:]
