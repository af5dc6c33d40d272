"""test_tbtest_logcheck.py -- the tests' error-log check forgives the
event MPM's stop race only while a stop() is under way.

httpd's event MPM, stopped by SIGTERM, closes the sockets its workers
are serving; a worker that has just answered and starts its lingering
close then logs AH03092 (EBADF from apr_pollset_add). Bare Apache logs it
too (tbtest/apache.py, STOP_RACE_TAGS), so a test that stops its server
right after a response must not fail on it: CI's make asan did once, in
test_topkeys 162_02. Anywhere outside a stop the same line is a fault,
and so is any other error line inside one.
"""
import time

from tbtest.apache import log_line_time

RACE = ("[%s] [mpm_event:error] [pid 11:tid 12] (9)Bad file descriptor: "
        "AH03092: process_lingering_close: apr_pollset_add failure")
CRASH = ("[%s] [core:notice] [pid 10:tid 10] AH00052: child pid 11 exit "
         "signal Segmentation fault (11)")
OTHER = "[%s] [mpm_event:error] [pid 11:tid 12] AH00999: something else"


def stamp(t):
    """t as httpd's default ErrorLogFormat writes it (local time)."""
    return time.strftime("%a %b %d %H:%M:%S", time.localtime(t)) \
        + ".%06d" % int((t % 1) * 1e6) + time.strftime(
            " %Y", time.localtime(t))


# test_ops_004_01: a real stop's window brackets the parent's own
# "caught SIGTERM" line (so the log's clock and the window's agree, time
# zone included); the race's line is forgiven inside a window and
# reported outside it; other error lines are reported inside one too, and
# a child's fault signal (a notice) anywhere.
def test_ops_004_01(apache_factory, redis_server):
    a = apache_factory(servers=1)
    a.start("TBucketRedis %s\n" % redis_server.url)
    a.stop()
    (sent, reaped), = a.stop_windows
    caught = [log_line_time(line) for line in a.read_log().splitlines()
              if "AH00491" in line]
    assert len(caught) == 1 and sent - 0.01 <= caught[0] <= reaped + 0.01, \
        (sent, caught, reaped)

    inside = sent + (reaped - sent) / 2
    outside = sent - 5
    assert abs(log_line_time(RACE % stamp(inside)) - inside) < 1e-5
    text = "\n".join([RACE % stamp(inside), RACE % stamp(outside),
                      OTHER % stamp(inside)])
    assert a.bad_lines(text=text) == [RACE % stamp(outside),
                                      OTHER % stamp(inside)]
    # A child's crash is a fault anywhere, inside a stop too, though
    # httpd logs it at notice; a child a test killed (SIGKILL) is not.
    assert a.bad_lines(text=CRASH % stamp(inside)) == [CRASH % stamp(inside)]
    killed = CRASH.replace("Segmentation fault (11)", "Killed (9)")
    assert a.bad_lines(text=killed % stamp(inside)) == []
    a.stop_windows.clear()
    assert a.bad_lines(text=RACE % stamp(inside)) == [RACE % stamp(inside)]
