"""test_demo_replicas.py -- `make demo-replicas` runs and says what the
README says: three replicas share one limit, then the local policy."""
import os
import re
import subprocess

import pytest

from tbtest.env import BUILD, ROOT

DEMO = os.path.join(ROOT, "tools", "demo_replicas.py")


# A short run of the demo: totals near capacity + rate x t in both phases,
# every replica answered, phase 2 decided by the local policy.
@pytest.mark.slow
def test_demo_001_01_short_run(tmp_path):
    png = tmp_path / "demo.png"
    p = subprocess.run(["/usr/bin/python3", DEMO, "--build", BUILD,
                        "--seconds", "3", "--pace", "30", "--png", str(png)],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    out = p.stdout
    totals = re.findall(r"^  total\s+(\d+)\s+(\d+)\s+limit: .* = (\d+)$",
                        out, re.M)
    assert len(totals) == 2, out
    for ok, no, limit in totals:
        ok, no, limit = int(ok), int(no), int(limit)
        assert ok + no == 90, out
        # One shared bucket: never above the limit (one token of slack
        # for the refill during the last request); local: about limit.
        assert limit * 0.7 <= ok <= limit + 2, out
    phase2 = out.split("redis-server stopped")[1]
    for name in ("web1", "web2", "web3"):
        assert re.search(r"^  %s\s+\d+\s+\d+\s+fallback-local \d+$" % name,
                         phase2, re.M), out
    if png.exists():
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # Nothing of ours is left running.
    assert not [d for d in os.listdir("/tmp") if d.startswith("tbdemo-")
                and os.path.isdir(os.path.join("/tmp", d))
                and os.path.exists(os.path.join("/tmp", d, "haproxy.cfg"))]
