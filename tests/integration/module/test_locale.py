"""test_locale.py -- the module in an Apache child whose locale another
module changed: mod_lua's os.setlocale() here, as a PHP script's
setlocale(LC_ALL, 'de_DE') does inside mod_php. setlocale is process-wide,
so every later decision and settlement of that child runs under a decimal
comma; they must still be Redis's and exact (shared/base/tb_cnum.c). The
German locale is made by localedef at test time and reaches Apache
through LOCPATH.
"""
from tbtest.apache import http_get, metric_sum, tokens, wait_until

# Switch the whole process to the locale given, report the cost given, and
# show which decimal point the process now prints.
HANDLER = r"""
function handle(r)
  local args = r:parseargs()
  if args["locale"] then
    os.setlocale(args["locale"])
  end
  r.content_type = "text/plain"
  r.headers_out["X-Request-Cost"] = args["cost"] or "1"
  r:puts("point=" .. string.format("%.1f", 2.5) .. "\n")
  return apache2.OK
end
"""


def conf(redis):
    return """
LoadModule lua_module /usr/lib/apache2/modules/mod_lua.so
TBucketRedis %s timeout=1000
TBucketPrefix l:
AddHandler lua-script .lua
<Location /loc>
    TBucketEnable On
    TBucketKey "%%{HTTP:X-Key}"
    TBucketLimit 10 1/h
    TBucketCost 1
    TBucketCostHeader X-Request-Cost
</Location>
<Location /tbucket-status>
    SetHandler tbucket-status
</Location>
""" % redis.url


# test_module_120_01: after a handler switches the child to de_DE (one
# event child, so every request meets it), a fractional rate (1/h) is
# still decided by Redis and a reported cost of 1.5 is settled as 1.5:
# 10 - 1.5 - 1.5 = 7 tokens, no Redis error. Before the fix the second
# decision failed open ("0,000277..." to the script) and both
# settlements read 1.5 as 1 (9 tokens left).
def test_module_120_01(apache_factory, redis_server, locale_dir,
                       monkeypatch):
    locpath, name = locale_dir
    monkeypatch.setenv("LOCPATH", locpath)
    a = apache_factory(mpm="event", servers=1)
    a.write_file("htdocs/loc/h.lua", HANDLER)
    a.start(conf(redis_server))
    r = redis_server.client()
    res = http_get(a.url("/loc/h.lua"), {"X-Key": "k"},
                   params={"locale": name, "cost": "1.5"})
    assert res.status_code == 200 and res.text == "point=2,5\n", res.text
    assert "X-Request-Cost" not in res.headers
    assert wait_until(lambda: tokens(r, "l:{k}") == 8.5), tokens(r, "l:{k}")
    res = http_get(a.url("/loc/h.lua"), {"X-Key": "k"},
                   params={"cost": "1.5"})
    assert res.status_code == 200 and res.text == "point=2,5\n", res.text
    assert wait_until(lambda: tokens(r, "l:{k}") == 7.0), tokens(r, "l:{k}")
    page = http_get(a.url("/tbucket-status")).text
    assert metric_sum(page, "tbucket_redis_errors_total") == 0
    assert metric_sum(page, "tbucket_cost_invalid_total") == 0
    a.assert_log_clean()
