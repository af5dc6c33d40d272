"""test_php_stacks.py -- the module in front of real PHP stacks: mod_php
under the prefork MPM, and php-fpm behind mod_proxy_fcgi under the event
MPM (tbtest/php.py; both unpacked by scripts/fetch-php.sh, never
installed). Each serves PHP through a plain TBucketLimit, and PHP sees
the module's decision; the overload tool (tbtest/overload.py) counts what
it sends and what the server side spends."""
import concurrent.futures
import os
import shutil

import pytest
import requests

from tbtest import overload
from tbtest.apache import http_get, limited_conf
from tbtest.php import ModPhp, fpm_apache

# What heavy.php prints for its default 300 rows, whatever the stack.
HEAVY_DIGEST = "6046c6a71a141fde0d41bc74a01ba67e"


def limited(redis, prefix, limit="3 1/m"):
    return limited_conf(redis.url, prefix, "    TBucketLimit " + limit,
                        key="X-API-Key", status=False, where="/app/")


def mod_php(apache_factory, body, servers, prepare=None, **kw):
    """A prefork Apache of `servers` children with mod_php, started with
    body after prepare(a) (files to write); kw as Apache's."""
    a = apache_factory(mpm="prefork", servers=servers, **kw)
    php = ModPhp(a)
    if prepare:
        prepare(a)
    return a.start(php.conf() + body)


def overloaded_mod_php(apache_factory, redis_server, config, prefix):
    """mod_php (8 children, Debian's keep-alive defaults) with the
    overload bench's configuration `config`."""
    return mod_php(apache_factory,
                   overload.config_body(config, redis_server.url,
                                        prefix=prefix),
                   8, keepalive=(100, 5))


def check_served(a, sapi, key):
    """Three requests of one key reach PHP, which sees the decision and
    the remaining tokens by getenv() and $_SERVER; the fourth is refused
    before PHP runs; the heavy page renders in full."""
    for remaining in ("2", "1", "0"):
        r = http_get(a.url("/app/env.php"), headers={"X-API-Key": key})
        assert r.status_code == 200, r.text
        seen = r.json()
        assert seen["sapi"] == sapi
        for how in ("getenv", "server"):
            assert seen[how]["TBUCKET_DECISION"] == "allowed", seen
            assert seen[how]["TBUCKET_REMAINING"] == remaining, seen
            assert seen[how]["REDIRECT_TBUCKET_DECISION"] is None, seen
    r = http_get(a.url("/app/env.php"), headers={"X-API-Key": key})
    assert r.status_code == 429
    assert r.json()["error"] == "rate limited"
    r = http_get(a.url("/app/heavy.php"), headers={"X-API-Key": key + "-2"})
    assert r.status_code == 200
    assert "digest %s decision allowed" % HEAVY_DIGEST in r.text
    assert r.text.count("<tr ") == 100
    r = http_get(a.url("/health.php"))
    assert r.status_code == 200 and r.text == "ok -\n"


def check_logged(a):
    """check_served()'s requests in the access log, and a clean log."""
    log = a.access_text(until=lambda t: t.count(" 200 allowed ") >= 3
                        and " 429 rejected " in t)
    assert log.count(" 200 allowed /app/env.php") == 3
    assert " 429 rejected /app/env.php" in log
    a.assert_log_clean()


# mod_php (prefork): PHP runs in Apache's children, sees TBUCKET_DECISION
# by getenv() and $_SERVER, and is not run for a 429.
def test_module_160_01(apache_factory, redis_server):
    a = mod_php(apache_factory, limited(redis_server, "php1:"), 4)
    check_served(a, "apache2handler", "alice")
    check_logged(a)


# php-fpm (event, mod_proxy_fcgi on a unix socket): the decision reaches
# PHP as a FastCGI parameter, by getenv() and $_SERVER alike.
def test_module_160_02(apache_factory, redis_server, fpm_factory):
    fpm = fpm_factory(children=4)
    a = fpm_apache(apache_factory, fpm)
    a.start(fpm.conf() + limited(redis_server, "php2:"))
    check_served(a, "fpm-fcgi", "bob")
    check_logged(a)


# The overload tool against mod_php under Debian's keep-alive defaults
# and a per-key limit nothing reaches: every flood request is answered
# 200 with one Redis script call, every critical request is accounted
# for, and Apache's CPU covers the pages rendered.
@pytest.mark.slow
def test_module_160_03(apache_factory, redis_server):
    a = overloaded_mod_php(apache_factory, redis_server, "per_key", "php3:")
    rc = redis_server.client()
    rep = overload.run(a.port, a.proc.pid, redis=rc, flood=16, keys=1000,
                       duration=3.0, warmup=0.5)
    fl, cr = rep["flood"], rep["critical"]
    # Answered or timed out behind the flood's kept-alive connections.
    assert cr["sent"] == 30 == sum(cr["by_status"].values()), rep
    assert fl["answered"] > 20, rep
    assert set(fl["by_status"]) == {200}, rep
    assert fl["errors"] == 0 and fl["lost_processes"] == 0, rep
    # One script call per flood request; /health.php is not limited. A
    # request cut at the end (in flight when the flood stopped, more of
    # them on a busy machine) may have been decided without an answer.
    assert fl["answered"] <= rep["redis_script_calls"] <= \
        fl["answered"] + fl["cut_at_end"], rep
    # Each page is about 25 ms of CPU in Apache's children.
    assert rep["apache_cpu_s"] > fl["answered"] * 0.005, rep
    cost = overload.page_cost(a.port, a.proc.pid, n=10,
                              headers={"X-API-Key": "page"})
    assert cost["statuses"] == {200: 10}
    assert 5.0 < cost["apache_ms"] < 500.0, cost
    a.assert_log_clean()


# The overload tool against php-fpm with no limiter: the pages' CPU is
# php-fpm's, not Apache's, and the critical client is answered.
@pytest.mark.slow
def test_module_160_04(apache_factory, redis_server, fpm_factory):
    fpm = fpm_factory(children=4)
    a = fpm_apache(apache_factory, fpm, keepalive=(100, 5))
    a.start(fpm.conf() + overload.config_body("none", redis_server.url,
                                              prefix="php4:"))
    rep = overload.run(a.port, a.proc.pid, fpm_pid=fpm.proc.pid,
                       redis=redis_server.client(), flood=8, keys=100,
                       duration=2.0, warmup=0.5)
    fl, cr = rep["flood"], rep["critical"]
    assert cr["answered"] == cr["sent"] == 20, rep
    assert set(fl["by_status"]) == {200} and fl["answered"] > 10, rep
    assert rep["redis_script_calls"] == 0, rep
    assert rep["fpm_cpu_s"] > rep["apache_cpu_s"], rep
    cost = overload.page_cost(a.port, a.proc.pid, fpm.proc.pid, n=10)
    assert cost["fpm_ms"] > 5.0 and cost["fpm_ms"] > 3 * cost["apache_ms"], \
        cost
    a.assert_log_clean()


# Local protection in front of mod_php under a flood of 32 connections
# (prefork, 8 workers, Debian's keep-alive defaults): the critical client
# is always answered, the flood gets 503s (decision "shed" in the access
# log) and only the requests let through reach Redis; a refused request
# alone costs under a tenth of a page's CPU and no Redis command.
@pytest.mark.slow
def test_module_160_05(apache_factory, redis_server):
    a = overloaded_mod_php(apache_factory, redis_server, "local", "php5:")
    rc = redis_server.client()
    rep = overload.run(a.port, a.proc.pid, redis=rc, flood=32, keys=1000,
                       duration=3.0, warmup=0.5,
                       status_path=overload.STATUS_PATH)
    fl, cr = rep["flood"], rep["critical"]
    assert cr["answered"] == cr["sent"] == 30, rep
    ok, shed = fl["by_status"].get(200, 0), fl["by_status"].get(503, 0)
    assert ok > 0 and shed > ok, rep
    assert set(fl["by_status"]) <= {200, 503} and fl["errors"] == 0, rep
    # Admitted requests decide in Redis once each (those cut at the end
    # too, at most 6 in flight); refused ones never do.
    assert ok <= rep["redis_script_calls"] <= ok + 6, rep
    # The status page counts them too (and any the flood left unread).
    assert shed <= rep["status_decisions_shed"] <= shed + 32, rep
    assert " 503 shed /app/heavy.php" in a.access_text(
        until=lambda t: " 503 shed " in t)
    page = overload.page_cost(a.port, a.proc.pid, n=10,
                              headers={"X-API-Key": "page"})
    cost = overload.shed_cost(a.port, a.proc.pid, redis=rc, hold=6, n=200,
                              seconds=2.0)
    assert cost["statuses"] == {503: cost["sent"]} and cost["sent"] > 20, cost
    assert cost["redis_commands"] == 0, cost
    assert cost["apache_ms"] < page["apache_ms"] / 10, (cost, page)
    a.assert_log_clean()


# conc.php?ms=N: PHP counts itself in flight under flock(), keeps the
# highest count seen, holds N ms, and leaves.
CONC_PHP = r"""<?php
$dir = '__STATE__';
function bump($dir, $by) {
    $f = fopen("$dir/lock", 'c');
    flock($f, LOCK_EX);
    $cur = (int)@file_get_contents("$dir/cur") + $by;
    file_put_contents("$dir/cur", $cur);
    if ($cur > (int)@file_get_contents("$dir/max")) {
        file_put_contents("$dir/max", $cur);
    }
    flock($f, LOCK_UN);
    fclose($f);
}
bump($dir, 1);
usleep(min((int)($_GET['ms'] ?? 500), 5000) * 1000);
bump($dir, -1);
echo "ran\n";
"""

LOCAL = """
TBucketRedis redis://127.0.0.1:1 timeout=20
<Location /app/conc.php>
    TBucketEnable On
    TBucketLocalConcurrency 3
</Location>
"""


def state_dir(a):
    return os.path.join(a.root, "phpstate")


def conc_page(a):
    """conc.php and its state dir (written by www-data)."""
    state = state_dir(a)
    os.makedirs(state, exist_ok=True)
    for name in ("cur", "max", "lock"):
        open(os.path.join(state, name), "w").close()
    shutil.chown(state, "www-data", "www-data")
    for name in ("cur", "max", "lock"):
        shutil.chown(os.path.join(state, name), "www-data", "www-data")
    a.write_file("htdocs/app/conc.php", CONC_PHP.replace("__STATE__", state))
    return state


def flood_conc(a, n):
    def one(_):
        try:
            return http_get(a.url("/app/conc.php?ms=600"),
                            timeout=20).status_code
        except requests.RequestException:
            return 0
    with concurrent.futures.ThreadPoolExecutor(n) as ex:
        return list(ex.map(one, range(n)))


def php_max(state):
    with open(os.path.join(state, "max")) as f:
        return int(f.read() or 0)


def check_capped(a, state):
    """Ten at once of conc.php: PHP ran 3 at most, the rest got 503."""
    codes = flood_conc(a, 10)
    assert php_max(state) == 3
    assert codes.count(200) >= 3 and codes.count(503) >= 1
    assert set(codes) <= {200, 503}
    a.assert_log_clean()


# mod_php under prefork (8 children): TBucketLocalConcurrency 3 holds PHP
# itself to 3 requests at once, across children, with Redis unreachable;
# the others get 503 and never run PHP.
@pytest.mark.slow
def test_module_160_06(apache_factory):
    a = mod_php(apache_factory, LOCAL, 8, prepare=conc_page)
    check_capped(a, state_dir(a))


# php-fpm (8 children) behind the event MPM: the same cap across Apache's
# threads, counted by PHP in php-fpm's workers.
@pytest.mark.slow
def test_module_160_07(apache_factory, fpm_factory):
    fpm = fpm_factory(children=8)
    a = fpm_apache(apache_factory, fpm)
    state = conc_page(a)
    a.start(fpm.conf() + LOCAL)
    check_capped(a, state)
