"""test_tool_bans.py -- `tbucket bans` among many bans, against a real
Redis: newest (latest-ending) first, the total and how many more were not
shown, and --rule / --key finding one ban among thousands inside one
script call.

The junk bans are written by a Lua script exactly as tb_client_ban writes
a ban (the `ban` field of the rule bucket's hash with its end in ms of
Redis's clock, a TTL that outlives it, the member in "<prefix>bans"
scored by that end), so that 12,000 of them take one call.
"""
import os
import subprocess

import pytest

from tbtest.env import BUILD

TOOL = os.path.join(BUILD, "tbucket")

JUNK_LUA = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local n, base, pre = tonumber(ARGV[1]), tonumber(ARGV[2]), ARGV[3]
for i = tonumber(ARGV[4]), n do
  local k = pre .. '{junk' .. i .. '}:rule:ip'
  local ms = base + i * 10
  redis.call('HSET', k, 'ban', now + ms)
  redis.call('PEXPIRE', k, ms)
  redis.call('ZADD', KEYS[1], now + ms, k)
end
redis.call('PEXPIRE', KEYS[1], base + n * 10)
return n
"""


def run(redis_server, *args):
    if not os.path.exists(TOOL):
        pytest.fail("%s is missing: run make" % TOOL)
    e = dict(os.environ)
    e.pop("TBUCKET_CONFIG", None)
    return subprocess.run([TOOL] + list(args) + ["--url", redis_server.url],
                          capture_output=True, text=True, timeout=60, env=e)


def junk(redis_server, n, base_ms, prefix="rl:"):
    """n bans of rule ip on keys junk1..junkN, ending base_ms + 10 ms * i
    from now (junkN last)."""
    r = redis_server.client()
    # In calls of 10,000, so that none runs long on a busy machine.
    for first in range(1, n + 1, 10000):
        assert r.eval(JUNK_LUA, 1, prefix + "bans", min(n, first + 9999),
                      base_ms, prefix, first) == min(n, first + 9999)


def rows(out):
    """The listing's rows: (rule, key, seconds left)."""
    got = []
    for line in out.splitlines()[1:-1]:
        rule, key, left = line.split()
        got.append((rule, key, int(left)))
    return got


# 12,000 junk bans ending within the next 10 to 12 minutes, then a fresh
# 15-minute ban on admin: --rule user --key admin finds it (one lookup),
# --key admin and --rule user alone find it by reading the index inside
# Redis; the plain listing with --limit 10 shows 10, the latest-ending
# first (admin, then the junk from the last one down), the total 12,001
# and the 11,991 more not shown.
def test_tool_004_01(redis_server):
    junk(redis_server, 12000, 600000)
    p = run(redis_server, "ban", "user", "admin", "15m")
    assert p.returncode == 0, p.stderr
    for args in (("--rule", "user", "--key", "admin"), ("--key", "admin"),
                 ("--rule", "user")):
        p = run(redis_server, "bans", *args)
        assert p.returncode == 0, p.stderr
        got = rows(p.stdout)
        assert [g[:2] for g in got] == [("user", "admin")], p.stdout
        assert 895 <= got[0][2] <= 900, got
        assert p.stdout.splitlines()[-1] == \
            "1 ban matching, newest first; 1 shown", p.stdout
    p = run(redis_server, "bans", "--limit", "10")
    assert p.returncode == 0, p.stderr
    got = rows(p.stdout)
    assert len(got) == 10, p.stdout
    assert got[0][:2] == ("user", "admin")
    assert [g[1] for g in got[1:]] == ["junk%d" % i
                                       for i in range(12000, 11991, -1)]
    lefts = [g[2] for g in got]
    assert lefts == sorted(lefts, reverse=True), lefts
    assert p.stdout.splitlines()[-1] == (
        "12001 bans in all, newest first; 10 shown, 11991 more not shown "
        "(--limit 10)"), p.stdout
    # A filter that matches many: the newest of them, and how many more.
    p = run(redis_server, "bans", "--rule", "ip", "--limit", "3")
    assert [g[1] for g in rows(p.stdout)] == ["junk12000", "junk11999",
                                              "junk11998"], p.stdout
    assert p.stdout.splitlines()[-1] == (
        "12000 bans matching, newest first; 3 shown, 11997 more not shown "
        "(--limit 3)"), p.stdout
    # Nothing matches: said, not an error.
    p = run(redis_server, "bans", "--rule", "user", "--key", "nobody")
    assert p.returncode == 0 and rows(p.stdout) == []
    assert p.stdout.splitlines()[-1] == \
        "0 bans matching, newest first; 0 shown"


# -q prints the rows alone (no header, no last line); a lifted ban is no
# longer found; bad values are refused naming the option.
def test_tool_004_02(redis_server):
    junk(redis_server, 50, 600000)
    assert run(redis_server, "ban", "user", "alice", "1h").returncode == 0
    p = run(redis_server, "bans", "-q", "--key", "alice")
    assert p.stdout.split()[:2] == ["user", "alice"]
    assert len(p.stdout.splitlines()) == 1, p.stdout
    p = run(redis_server, "bans", "-q")
    assert len(p.stdout.splitlines()) == 51
    assert run(redis_server, "unban", "user", "alice").returncode == 0
    p = run(redis_server, "bans", "--key", "alice")
    assert rows(p.stdout) == [] and " 0 shown" in p.stdout
    for bad, word in ((("--limit", "0"), "--limit"),
                      (("--limit", "100001"), "--limit"),
                      (("--rule", "a/b"), "--rule"),
                      (("--key", ""), "--key")):
        p = run(redis_server, "bans", *bad)
        assert p.returncode == 64 and word in p.stderr, (bad, p.stderr)


# A filter reads the index inside Redis 10,000 members per call, newest
# first, and goes on to the end: the oldest of 25,002 bans is found, and
# a filter matching 25,000 counts them all across the calls.
def test_tool_004_03(redis_server):
    assert run(redis_server, "ban", "user", "old", "5m").returncode == 0
    junk(redis_server, 25000, 600000)
    assert run(redis_server, "ban", "user", "new", "1h").returncode == 0
    p = run(redis_server, "bans", "--key", "old")
    assert [g[:2] for g in rows(p.stdout)] == [("user", "old")], p.stdout
    p = run(redis_server, "bans", "--rule", "user")
    assert [g[1] for g in rows(p.stdout)] == ["new", "old"], p.stdout
    p = run(redis_server, "bans", "--rule", "ip", "--limit", "2")
    assert [g[1] for g in rows(p.stdout)] == ["junk25000", "junk24999"]
    assert p.stdout.splitlines()[-1] == (
        "25000 bans matching, newest first; 2 shown, 24998 more not shown "
        "(--limit 2)"), p.stdout
    p = run(redis_server, "bans", "--limit", "1")
    assert p.stdout.splitlines()[-1] == (
        "25002 bans in all, newest first; 1 shown, 25001 more not shown "
        "(--limit 1)"), p.stdout
