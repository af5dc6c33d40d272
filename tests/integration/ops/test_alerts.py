"""test_alerts.py -- conf/prometheus/tbucket-alerts.yml: promtool accepts
the rules and their unit tests pass (tbucket-alerts.test.yml: series that
reproduce each case, and moments at which an alert must not fire), every
alert has a summary and a doc link to a section of docs/operations.md
that exists, and every alert of the file has a test case.

promtool is Debian's package prometheus (scripts/install-deps.sh).
"""
import os
import shutil
import subprocess

import pytest
import yaml

from tbtest.env import ROOT

from test_docs_pages import anchors

PROM_DIR = os.path.join(ROOT, "conf", "prometheus")
RULES = os.path.join(PROM_DIR, "tbucket-alerts.yml")
TESTS = os.path.join(PROM_DIR, "tbucket-alerts.test.yml")
PROMTOOL = "/usr/bin/promtool"


def promtool(*args):
    if not os.path.exists(PROMTOOL):
        pytest.fail("promtool is missing: apt-get install prometheus")
    return subprocess.run([PROMTOOL] + list(args), cwd=PROM_DIR,
                          capture_output=True, text=True, timeout=120)


def alerts():
    with open(RULES) as f:
        doc = yaml.safe_load(f)
    return [r for g in doc["groups"] for r in g["rules"]]


# promtool checks the rules and runs their unit tests: all pass.
def test_ops_040_01():
    p = promtool("check", "rules", RULES)
    assert p.returncode == 0, p.stdout + p.stderr
    p = promtool("test", "rules", TESTS)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "SUCCESS" in p.stdout


# Each alert says what to look at first and links to its section of
# docs/operations.md, and each has a test case that expects it to fire.
def test_ops_040_02():
    have = anchors(os.path.join(ROOT, "docs", "operations.md"))
    with open(TESTS) as f:
        cases = yaml.safe_load(f)["tests"]
    fired = {t["alertname"] for c in cases for t in c["alert_rule_test"]
             if t.get("exp_alerts")}
    names = [r["alert"] for r in alerts()]
    assert len(names) >= 8 and len(set(names)) == len(names), names
    for r in alerts():
        ann = r["annotations"]
        assert "First look at" in ann["summary"], r["alert"]
        page, _, anchor = ann["doc"].partition("#")
        assert page == "docs/operations.md", ann["doc"]
        assert anchor == r["alert"].lower() and anchor in have, ann["doc"]
        assert r["alert"] in fired, r["alert"]
