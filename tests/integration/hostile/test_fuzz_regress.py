"""test_fuzz_regress.py -- replay the fuzz corpus as a regression test.

Every input under tests/fuzz/corpus/<target>/ (the seeds and each input
that once crashed a target or broke one of its invariants) is fed once to
the target's LLVMFuzzerTestOneInput(), linked with tests/fuzz/replay_main.c
instead of libFuzzer and built by make with gcc + ASan/UBSan into
$TB_BUILD/fuzz/replay_<target>, so this needs no clang. Inputs of bugs
reported but not fixed yet are listed in tests/fuzz/KNOWN_OPEN and expected
to fail (strict xfail: once the bug is fixed the test says XPASS and the
line must be removed).
"""
import os
import subprocess

import pytest

from tbtest.env import ROOT, BUILD

FUZZ = os.path.join(ROOT, "tests", "fuzz")
CORPUS = os.path.join(FUZZ, "corpus")
TARGETS = {
    # name: the sources it needs beyond the core (as the Makefile has it)
    "url": [],
    "key": [],
    "parse": [],
    "call": [],
    "shimconf": ["shim/shim_conf.c", "shim/shim_conf_table.c"],
    "rmcall": ["redismod/rm_command.c"],
    "form": ["mod_tbucket/tbucket_form_parse.c"],
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
def replay_bins():
    """replay_<target> (make builds them) for every target whose sources
    exist."""
    bins = {}
    for target, srcs in TARGETS.items():
        if not all(os.path.exists(os.path.join(ROOT, s)) for s in srcs):
            continue
        exe = os.path.join(BUILD, "fuzz", "replay_" + target)
        if not os.path.exists(exe):
            pytest.fail("%s is missing: run make" % exe)
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
