"""test_local_auto.py -- TBucketLocalConcurrency auto: a local cap that
sets itself from the latency of its scope's requests.

The backend is lat.cgi, a Perl CGI (one exec, no module: a few
milliseconds of CPU, so that a dozen running at once do not load the two
CPUs and bend their own latency). It counts its running copies under
flock(2) and keeps the highest count seen, so that "never above N" is
what the application saw. It sleeps 100 ms (?fixed: latency independent
of concurrency, as a page that waits on a remote API) or 100 ms plus
50 ms for every other copy running (?grow: a backend that queues, as a
saturated database). Both take 100 ms alone, so the floor that one phase
measures is the other's too. 100 ms rather than 50: the cap grows while
latency stays within a quarter of that floor, and on two CPUs shared
with other work, fork, exec and the wake-ups of a dozen CGIs at 200
requests a second bent a 50 ms latency past that often enough to hold
the cap near 10; at 100 ms the margin is 25 ms and the request rate
halves.

Clients run a closed loop on fresh connections, each sending again as
soon as it is answered, or 50 ms after a 503; a sampler reads the
status page every 100 ms. Every phase is bounded in time, every request
by a 10 s timeout.
"""
import http.client
import os
import socket
import threading
import time

import pytest

from tbtest.apache import assert_refused, http_get, metric
from tbtest.env import wait_until

LAT_CGI = r"""#!/usr/bin/perl
# lat.cgi?fixed|grow: count this copy in STATE/count ("running highest")
# under flock, sleep, uncount.
my $S = '__STATE__';
sub count {
    my ($d) = @_;
    open(my $l, '>>', "$S/lock") or die "lock: $!";
    flock($l, 2) or die "flock: $!";
    open(my $f, '+<', "$S/count") or die "count: $!";
    my ($cur, $max) = split(' ', scalar(<$f>) || '0 0');
    $cur += $d;
    $max = $cur if $cur > $max;
    seek($f, 0, 0);
    truncate($f, 0);
    print $f "$cur $max\n";
    close($f);
    close($l);
    return $cur;
}
# A body is read first, as an application reads its form before it works.
read(STDIN, my $body, $ENV{CONTENT_LENGTH}) if $ENV{CONTENT_LENGTH};
my $n = count(1);
my $grow = ($ENV{QUERY_STRING} || '') eq 'grow';
select(undef, undef, undef, __BASE__ + ($grow ? __STEP__ * ($n - 1) : 0));
count(-1);
print "Content-Type: text/plain\r\n\r\nran with $n\n";
"""

# lat.cgi's sleep alone, and what each other copy running adds (?grow),
# in seconds.
BASE_S, STEP_S = 0.1, 0.05

SCOPE = "<Location /cgi-bin/lat.cgi>"

STATUS = """
<Location /tbucket-status>
    SetHandler tbucket-status
</Location>
"""


def auto_body(bounds):
    return """
<Location /cgi-bin/lat.cgi>
    TBucketEnable On
    TBucketLocalConcurrency auto %s
</Location>
""" % bounds + STATUS


def server(apache_factory, workers):
    """A prefork Apache of `workers` children with lat.cgi, not started;
    (it, the backend's state dir)."""
    a = apache_factory(mpm="prefork", servers=workers)
    state = os.path.join(a.root, "state")
    os.makedirs(state)
    for name, text in (("count", "0 0\n"), ("lock", "")):
        with open(os.path.join(state, name), "w") as f:
            f.write(text)
    os.system("chown -R www-data:www-data %s" % state)
    cgi = LAT_CGI.replace("__STATE__", state).replace(
        "__BASE__", str(BASE_S)).replace("__STEP__", str(STEP_S))
    a.write_file("cgi-bin/lat.cgi", cgi, 0o755)
    return a, state


def backend(state):
    """(running now, highest ever) as lat.cgi counted them; the file is
    rewritten in place, so a read may find it empty: read again."""
    for _ in range(100):
        with open(os.path.join(state, "count")) as f:
            parts = f.read().split()
        if len(parts) == 2:
            return int(parts[0]), int(parts[1])
        time.sleep(0.01)
    raise AssertionError("lat.cgi's count stays unreadable")


def reset_backend(state):
    with open(os.path.join(state, "count"), "w") as f:
        f.write("0 0\n")


def get(port, path, timeout=10):
    """One GET on a fresh connection; its status, 0 when it failed."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        c.request("GET", path, headers={"Connection": "close"})
        r = c.getresponse()
        r.read()
        return r.status
    except (OSError, http.client.HTTPException):
        return 0
    finally:
        c.close()


def status(a):
    return http_get(a.url("/tbucket-status")).text


class Run:
    """What one drive() saw: (seconds since start, status) per answer and
    (seconds since start, cap, in flight) per status sample."""

    def __init__(self):
        self.answers = []
        self.caps = []
        self.lock = threading.Lock()

    def codes(self, since=0.0):
        with self.lock:
            return [c for t, c in self.answers if t >= since]

    def end(self):
        with self.lock:
            return self.answers[-1][0] if self.answers else 0.0

    def cap_values(self):
        return [c for _, c, _ in self.caps]

    def held_since(self, cap):
        """When the cap's last unbroken run of samples at cap or above
        began (seconds since start), or None if the last sample is below.
        The last sample alone is not "held": a run that ends on its
        deadline may have just reached cap, with the window before it
        refused against a lower one."""
        since = None
        for t, c, _ in reversed(self.caps):
            if c < cap:
                break
            since = t
        return since

    def codes_while_held(self, cap, held, window):
        """The codes of the last `window` seconds if the cap had held cap
        or above for `held` seconds by the last sample, else None: only
        then must a client within the cap meet no 503. held exceeds
        window, so that a refusal made just before the first sample at
        cap, and recorded a moment later, falls outside the window."""
        assert held > window, (held, window)
        since = self.held_since(cap)
        if since is None or self.caps[-1][0] - since < held:
            return None
        return self.codes(since=max(since, self.end() - window))

    def __repr__(self):
        return "cap:in flight %s" % " ".join(
            "%.1f:%d:%d" % x for x in self.caps)


def drive(a, mode, clients, seconds, until=None, then=0.0):
    """clients closed-loop clients on lat.cgi?mode for at most seconds;
    with until, stop `then` seconds after until(status page text) first
    holds. The sampler reads the cap every 100 ms. Returns the Run."""
    run = Run()
    stop = threading.Event()
    t0 = time.monotonic()
    deadline = [t0 + seconds]

    def client():
        while not stop.is_set() and time.monotonic() < deadline[0]:
            code = get(a.port, "/cgi-bin/lat.cgi?" + mode)
            with run.lock:
                run.answers.append((time.monotonic() - t0, code))
            if code != 200:
                stop.wait(0.05)

    def sampler():
        nonlocal until
        while not stop.is_set() and time.monotonic() < deadline[0]:
            text = status(a)
            cap = int(metric(text, "tbucket_local_limit", scope=SCOPE))
            run.caps.append((time.monotonic() - t0, cap,
                             int(metric(text, "tbucket_local_in_flight",
                                        scope=SCOPE))))
            if until and until(text) \
                    and deadline[0] > time.monotonic() + then:
                deadline[0] = time.monotonic() + then
                until = None
            stop.wait(0.1)

    threads = [threading.Thread(target=client) for _ in range(clients)]
    threads.append(threading.Thread(target=sampler))
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=seconds + 30)
    stop.set()
    assert not any(t.is_alive() for t in threads), "a client hangs"
    return run


def auto_metrics(a):
    """The auto metrics of SCOPE: cap, bounds, latencies (s), changes."""
    text = status(a)
    got = {"cap": metric(text, "tbucket_local_limit", scope=SCOPE)}
    for b in ("min", "max"):
        got[b] = metric(text, "tbucket_local_auto_bounds", scope=SCOPE,
                        bound=b)
    for k in ("floor", "window"):
        got[k] = metric(text, "tbucket_local_auto_latency_seconds",
                        scope=SCOPE, kind=k)
    for d in ("up", "down", "probe"):
        got[d] = metric(text, "tbucket_local_auto_changes_total",
                        scope=SCOPE, direction=d)
    return got


def idle(a, state):
    """Waits until no request of the scope is in flight, in the module's
    count and the backend's."""
    assert wait_until(lambda: metric(status(a), "tbucket_local_in_flight",
                                     scope=SCOPE) == 0
                      and backend(state)[0] == 0, timeout=10)


def cut_to(bound):
    """An until for drive(): the cap cut to bound or below (not a probe's
    window at min, which comes before any cut)."""
    return lambda text: (
        metric(text, "tbucket_local_limit", scope=SCOPE) <= bound
        and metric(text, "tbucket_local_auto_changes_total", scope=SCOPE,
                   direction="down") > 0)


def raised_to(cap):
    """An until for drive(): the cap at cap or above."""
    return lambda text: metric(text, "tbucket_local_limit",
                               scope=SCOPE) >= cap


def held(until, seconds):
    """An until for drive(): until has held on every sample of the last
    `seconds`. Latency is what the cap reads, and a burst of other work on
    the two CPUs can cut it for a moment: the cap must then grow again
    and hold, within the phase's bound."""
    since = [None]

    def check(text):
        if not until(text):
            since[0] = None
            return False
        since[0] = since[0] or time.monotonic()
        return time.monotonic() - since[0] >= seconds
    return check


# Where a flood of ?grow leaves the cap of max=12: half of max or less.
# Idle it goes to 3-4; on a busy machine the floor the probe measures
# takes the machine's delays too (0.32 s for 0.1 s of sleep beside 4 busy
# loops at load 30), ?grow's latency is then a smaller step above it,
# and the cap held 5. Below half of max is the behaviour; the figure is
# bench/overload.py's.
CUT = 6


def shrink(a, clients, bound, seconds=15):
    """A flood of ?grow that binds the cap (more clients than max), until
    it is cut to bound or below, and 1 s more; the Run."""
    run = drive(a, "grow", clients, seconds, until=cut_to(bound), then=1.0)
    assert run.caps and run.caps[-1][1] <= bound, (auto_metrics(a), run)
    return run


def cut_server(apache_factory, workers, bounds, clients, bound):
    """server() started with auto_body(bounds), its cap then cut to bound
    or below by shrink() with clients, and nothing of the scope left in
    flight; (it, the backend's state dir)."""
    a, state = server(apache_factory, workers)
    a.start(auto_body(bounds))
    shrink(a, clients, bound)
    idle(a, state)
    return a, state


# Grows: from a cap a flood cut low (34 clients of ?grow over max=32: the
# cap binds, a probe at min measures the 100 ms floor, the cap comes down),
# 12 clients of ?fixed (100 ms whatever the concurrency) raise it: the cap
# climbs above where the flood left it, never past max, the status page
# counted the steps up, and once the cap has held 12 for 3 s the last
# 2.5 s answer no 503. Judged by direction and bound, not by reaching 12
# in time (as 221_03): on a busy machine the CGIs' fork and exec bend the
# latency that a step up waits for (idle, 12 is held within 15 s; beside
# busy loops the cap went from 4 to 5-8). bench/overload.py measures the
# climb.
@pytest.mark.slow
def test_module_221_01(apache_factory):
    a, state = cut_server(apache_factory, 40, "min=1 max=32", 34, 6)
    before = auto_metrics(a)
    reset_backend(state)
    run = drive(a, "fixed", 12, 15, until=held(raised_to(12), 3))
    after = auto_metrics(a)
    assert run.caps[0][1] < max(run.cap_values()) <= 32, run
    assert after["up"] > before["up"], (before, after)
    assert backend(state)[1] <= 12
    assert min(run.cap_values()) <= 6, run
    codes = run.codes_while_held(12, 3, 2.5)
    if codes is not None:
        assert len(codes) > 100 and set(codes) == {200}, \
            (codes.count(503), run)
    a.assert_log_clean()


# Shrinks: 16 clients of ?grow (50 ms more for every other copy running)
# over max=12: the cap binds, is probed at min and comes down to half of
# max or less (CUT); every sample is within [1, 12], the backend never ran more than
# 12, and the status page counted the probe and every change the samples
# saw.
@pytest.mark.slow
def test_module_221_02(apache_factory):
    a, state = server(apache_factory, 20)
    a.start(auto_body("min=1 max=12"))
    run = shrink(a, 16, CUT)
    caps = run.cap_values()
    assert all(1 <= c <= 12 for c in caps), run
    assert caps[-1] <= CUT, run
    assert backend(state)[1] <= 12
    got = auto_metrics(a)
    # Counted as the samples (100 ms apart, so they may miss a change)
    # saw them, whatever the path down: the probe at min is judged
    # against the flood that called it, and the cap it leaves is counted
    # as a step up from min. Idle, later windows cut it again (down >= 1);
    # beside busy loops the CGIs' latency held it there (4 busy loops:
    # cap 3, down 0, probe 1). A fall is a cut or a probe (with the step
    # after it, when the sample missed min); a rise a step up, or the end
    # of a probe that found no request to measure (not counted).
    assert got["probe"] >= 1, got
    steps = list(zip(caps, caps[1:]))
    assert got["down"] + got["probe"] >= sum(1 for x, y in steps if x > y), \
        (got, run)
    assert got["up"] + got["probe"] >= sum(1 for x, y in steps if y > x)
    assert got["min"] == 1 and got["max"] == 12
    codes = run.codes()
    assert codes.count(503) > 0 and set(codes) <= {200, 503}
    a.assert_log_clean()


# Recovers: after the shrinking phase (cap CUT or less), 12 clients of
# ?fixed bring the cap back up, never past max (12); once it has held
# max for 2.5 s, the last 2 s answer no 503.
@pytest.mark.slow
def test_module_221_03(apache_factory):
    a, state = cut_server(apache_factory, 20, "min=1 max=12", 16, CUT)
    run = drive(a, "fixed", 12, 12, until=held(raised_to(12), 2.5))
    # Judged by direction and bound, not by reaching max in time: a step
    # up waits for windows whose latency stays within a quarter of the
    # floor, and on a busy machine the CGIs' fork and exec bend it (idle,
    # max is held within 12 s; beside busy loops on a shared machine the
    # cap went 4 -> 7, or 3 -> 5, and stayed there). bench/overload.py
    # measures the climb.
    assert run.caps[0][1] < max(run.cap_values()) <= 12, run
    codes = run.codes_while_held(12, 2.5, 2)
    if codes is not None:
        assert len(codes) > 50 and set(codes) == {200}, \
            (codes.count(503), run)
    a.assert_log_clean()


# min and max hold: with min=3 max=5, 16 clients of ?grow bind the cap,
# which probes at min, and 8 of ?fixed hold it at max: every sample of
# the cap is within [3, 5], both bounds are reached, and the backend ran
# 5 at most, and 5. (min is also where the floor is measured: taken at 3
# in flight, it makes ?grow at 5 look close enough that the cap is not
# cut below 5 again; the cut to below min is 221_02's, at min=1.)
@pytest.mark.slow
def test_module_221_04(apache_factory):
    a, state = server(apache_factory, 20)
    a.start(auto_body("min=3 max=5"))
    down = drive(a, "grow", 16, 4)
    # Until max has held 1 s (at most 10 s), not a fixed 3 s: a step up
    # waits for windows within a quarter of the floor, which a busy
    # machine's fork and exec bend (idle, 5 is held within 3 s).
    up = drive(a, "fixed", 8, 10, until=held(raised_to(5), 1))
    caps = down.cap_values() + up.cap_values()
    assert set(caps) <= {3, 4, 5}, (down, up)
    assert 3 in down.cap_values() and up.cap_values()[-1] == 5, (down, up)
    assert auto_metrics(a)["probe"] >= 1
    assert backend(state)[1] == 5
    a.assert_log_clean()


# The status page shows an auto scope: its bounds at once, the floor and
# the last window's latency once traffic has run (0 before), its changes
# by direction, the cap as tbucket_local_limit; the HTML view has the
# "auto scopes" table with the scope's row.
def test_module_221_05(apache_factory):
    a, state = server(apache_factory, 8)
    a.start(auto_body("min=2 max=9"))
    got = auto_metrics(a)
    assert got == {"cap": 9, "min": 2, "max": 9, "floor": 0, "window": 0,
                   "up": 0, "down": 0, "probe": 0}, got
    text = status(a)
    for d in ("up", "down", "probe"):
        assert ('tbucket_local_auto_changes_total{scope="%s",direction="%s"}'
                % (SCOPE, d)) in text
    drive(a, "fixed", 4, 2)
    got = auto_metrics(a)
    assert 0.095 <= got["floor"] <= got["window"] < 1.0, got
    assert 2 <= got["cap"] <= 9, got
    html = http_get(a.url("/tbucket-status?view=html")).text
    assert "<h3>auto scopes: the cap sets itself</h3>" in html
    row = html[html.index("auto scopes"):]
    row = row[:row.index("</table>")]
    assert "<code>&lt;Location /cgi-bin/lat.cgi&gt;</code>" in row, row
    assert ('data-metric="tbucket_local_auto_bounds" data-labels="scope='
            '&quot;&lt;Location /cgi-bin/lat.cgi&gt;&quot;,bound=&quot;max'
            '&quot;">9<') in row, row
    a.assert_log_clean()


BAD = [
    ("auto min=0", "TBucketLocalConcurrency: bad min '0'"),
    ("auto max=0", "TBucketLocalConcurrency: bad max '0'"),
    ("auto min=5 max=3",
     "TBucketLocalConcurrency auto: min=5 is more than max=3"),
    ("auto foo=1", "TBucketLocalConcurrency: unknown option 'foo=1'"),
    ("4 5", "TBucketLocalConcurrency: expected N, auto [min=N] [max=N] or "
     "Off, not '4 5'"),
]


# apache2 -t refuses every bad auto value, naming directive and value.
@pytest.mark.parametrize("args,msg", BAD)
def test_module_221_06(apache_factory, args, msg):
    assert_refused(apache_factory(mpm="prefork"), """
<Location /x>
    TBucketEnable On
    TBucketLocalConcurrency %s
</Location>
""" % args, msg)


# A graceful restart keeps what the cap learnt: after a flood cut it to
# CUT or less, the cap, its bounds and its floor are the same in the new
# generation (before tb_adapt_bounds kept the cap, the reload rounded the
# estimate, which can be a step from the cap), and the new generation
# holds the backend to that cap (one step up in 1.5 s), not to max (12).
@pytest.mark.slow
def test_module_221_07(apache_factory):
    a, state = cut_server(apache_factory, 20, "min=1 max=12", 16, CUT)
    before = auto_metrics(a)
    a.graceful(auto_body("min=1 max=12"))
    after = auto_metrics(a)
    assert after == before, (before, after)
    reset_backend(state)
    run = drive(a, "grow", 16, 1.5)
    assert backend(state)[1] <= max(run.cap_values()) \
        <= int(before["cap"]) + 1 < 12, (before, run)
    a.assert_log_clean()


def slow_post(port, path, nbytes, gap):
    """A POST of nbytes to path on a fresh connection, its body sent a
    byte every gap seconds; its status, 0 when it failed."""
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    try:
        s.sendall(("POST %s HTTP/1.1\r\nHost: x\r\n"
                   "Content-Type: application/octet-stream\r\n"
                   "Content-Length: %d\r\nConnection: close\r\n\r\n"
                   % (path, nbytes)).encode())
        for _ in range(nbytes):
            time.sleep(gap)
            s.sendall(b"x")
        head = s.makefile("rb").readline().split()
        return int(head[1]) if len(head) > 1 else 0
    except (OSError, ValueError):
        return 0
    finally:
        s.close()


# An auto scope on /upload that reaches lat.cgi through Action, an
# internal redirect: the body is read by the chain's second request.
ACTION = """
Action lat-upload /cgi-bin/lat.cgi virtual
<Location /upload>
    TBucketEnable On
    TBucketLocalConcurrency auto min=1 max=16
    SetHandler lat-upload
</Location>
""" + STATUS


# Slow uploads are the client's time, not the scope's latency: one
# client of ?fixed (100 ms) every half second sets the floor, then 6
# clients upload to the same scope a byte every 0.15 s (16 bytes, 2.4 s
# each, within mod_reqtimeout's defaults) for 8 s beside it, to lat.cgi
# directly or through Action (the body read after an internal redirect).
# The cap never falls below half its max (16) and every request,
# legitimate or slow, is answered 200. When an upload counted as
# latency, each slow POST read as 24 times the floor and the cap fell to
# 1 or 2, refusing the legitimate client.
@pytest.mark.slow
@pytest.mark.parametrize("via", ["direct", "action"])
def test_module_221_08(apache_factory, via):
    a, state = server(apache_factory, 24)
    if via == "direct":
        a.start(auto_body("min=1 max=16"))
        path, scope = "/cgi-bin/lat.cgi?fixed", SCOPE
    else:
        a.start(ACTION)
        path, scope = "/upload?fixed", "<Location /upload>"
    caps, legit, slow = [], [], []
    stop = threading.Event()
    uploading = threading.Event()

    def light():
        while not stop.is_set():
            legit.append(get(a.port, path))
            stop.wait(0.5)

    def uploader():
        uploading.wait()
        t_end = time.monotonic() + 8
        while not stop.is_set() and time.monotonic() < t_end:
            slow.append(slow_post(a.port, path, 16, 0.15))

    def sampler():
        while not stop.is_set():
            caps.append(int(metric(status(a), "tbucket_local_limit",
                                   scope=scope)))
            stop.wait(0.1)

    ups = [threading.Thread(target=uploader) for _ in range(6)]
    others = [threading.Thread(target=light), threading.Thread(target=sampler)]
    for t in ups + others:
        t.start()
    time.sleep(1.5)
    uploading.set()
    for t in ups:
        t.join(timeout=25)
    stop.set()
    for t in others:
        t.join(timeout=15)
    assert not any(t.is_alive() for t in ups + others), "a client hangs"
    assert len(slow) >= 12 and len(legit) >= 10, (slow, legit)
    assert min(caps) >= 8, caps
    assert set(legit) == {200} and set(slow) == {200}, (legit, slow, caps)
    a.assert_log_clean()
