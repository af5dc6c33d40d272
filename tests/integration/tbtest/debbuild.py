"""tbtest/debbuild.py -- `make deb` for test_packaging_deb, started in the
background when the session's collection holds the packaging tests, and
waited for by their `debs` fixture.

The package build compiles the whole tree again with Debian's flags and
runs the unit tests: 54-156 s on this machine, which in line with the
tests was the longest single wait of `make test`. Started at the
session's start, it overlaps the tests collected before the packaging
ones (about ten minutes of them). It runs at nice 5: a test beside it
loses about a quarter of a CPU to it, less than to one of NOISE=1's busy
loops at nice 0, beside which the suite is proven to hold. Beside those
loops it still gets a quarter of each CPU; at nice 19 it would get 1.5%
and starve. In a plain `make test` it ended 848 s after it started, and
the packaging tests waited 0 s for it. When the fixture does have to
wait, the build's nice goes back to 0 where the user may do that (root).
It is stopped by PID (its own process group) at the session's end if it
is still running, as when the run is cut short.
"""
import os
import subprocess
import time

from tbtest.env import BUILD, ROOT, stop_pid

LOG = os.path.join(BUILD, "make-deb.running.log")
NICE = 5


class DebBuild:
    def __init__(self):
        self.proc = None
        self.started = None
        self.log = None
        self.result = None

    def start(self):
        """Start `make deb` (once) with a clean make environment."""
        if self.proc is not None or self.result is not None:
            return
        env = dict(os.environ)
        # Do not inherit the jobserver or variables of a `make test`
        # above us.
        for k in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL", "MAKEOVERRIDES"):
            env.pop(k, None)
        os.makedirs(BUILD, exist_ok=True)
        # Outside BUILD/deb, which build-deb.sh empties first.
        self.log = open(LOG, "w")
        self.started = time.monotonic()
        self.proc = subprocess.Popen(
            ["nice", "-n", str(NICE), "make", "-C", ROOT, "BUILD=" + BUILD,
             "deb"], stdout=self.log, stderr=subprocess.STDOUT, env=env,
            start_new_session=True)

    def wait(self, timeout=900):
        """(return code, output, seconds from start to end, seconds this
        call waited); starts the build if the hook did not."""
        if self.result is None:
            self.start()
            try:
                # The tests wait now: full speed (root may lower a nice).
                os.setpriority(os.PRIO_PGRP, self.proc.pid, 0)
            except OSError:
                pass
            t0 = time.monotonic()
            try:
                rc = self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.stop()
                rc = -1
            waited = time.monotonic() - t0
            elapsed = time.monotonic() - self.started
            self.log.close()
            with open(LOG) as f:
                out = f.read()
            self.result = (rc, out, elapsed, waited)
            self.proc = None
        return self.result

    def stop(self):
        """Stop a build still running, by its process group."""
        stop_pid(self.proc, group=True)
        self.proc = None


SHARED = DebBuild()
