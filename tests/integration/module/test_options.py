"""test_options.py -- the name=value options of every directive, read by
one table-driven reader: apache2 -t refuses a bad value of each naming the
directive, the option and the value in one form, lists a directive's
options for one it does not have, and takes durations in one grammar
(500ms, 30s, 15m, 1h, 1d, decimals) within each option's range."""
import pytest

from tbtest.apache import assert_refused

RULE = "<Location /x>\nTBucketEnable On\nTBucketRule ip all 5 1/m %s\n" \
       "</Location>\n"
LOC = "<Location /x>\nTBucketEnable On\n%s\n</Location>\n"
REDIS = "TBucketRedis redis://127.0.0.1:6379 %s\n"

DURATION = "expected a duration such as 500ms, 30s, 15m, 1h or 1d"

# (config, words the refusal names): one bad value of every option.
BAD = [
    (RULE % "cost=0", ["TBucketRule: bad cost '0'"]),
    (RULE % "cost=6", ["TBucketRule: bad cost '6'", "capacity, 5"]),
    (RULE % "count=600", ["TBucketRule: bad count '600'"]),
    (RULE % "ban=3x", ["TBucketRule: bad ban '3x': " + DURATION,
                       "from 1s to 30d"]),
    (RULE % "ban=31d", ["TBucketRule: bad ban '31d'", "from 1s to 30d"]),
    (RULE % "ban=30", ["TBucketRule: bad ban '30'", "from 1s to 30d"]),
    (REDIS % "timeout=61s", ["TBucketRedis: bad timeout '61s': " + DURATION,
                             "from 1ms to 1m"]),
    (REDIS % "connect_timeout=0", ["TBucketRedis: bad connect_timeout '0'"]),
    (REDIS % "pool=2000", ["TBucketRedis: bad pool '2000'"]),
    (REDIS % "engine=lua", ["TBucketRedis: bad engine 'lua'",
                            "expected auto, script or module"]),
    (REDIS % "tls_ca=", ["TBucketRedis: bad tls_ca ''"]),
    (REDIS % "tls_cert=", ["TBucketRedis: bad tls_cert ''"]),
    (REDIS % "tls_key=", ["TBucketRedis: bad tls_key ''"]),
    (REDIS % "tls_verify=maybe", ["TBucketRedis: bad tls_verify 'maybe'",
                                  "expected on or off"]),
    ("TBucketBreaker threshold=0\n", ["TBucketBreaker: bad threshold '0'"]),
    ("TBucketBreaker cooldown=25h\n", ["TBucketBreaker: bad cooldown '25h'",
                                       "from 1ms to 1d"]),
    (LOC % "TBucketLease 5 ttl=61s", ["TBucketLease: bad ttl '61s'",
                                      "from 1ms to 1m"]),
    (LOC % "TBucketConcurrency 2 ttl=0ms",
     ["TBucketConcurrency: bad ttl '0ms'"]),
    (LOC % "TBucketLocalConcurrency auto min=0",
     ["TBucketLocalConcurrency: bad min '0'"]),
    (LOC % "TBucketLocalConcurrency auto max=100001",
     ["TBucketLocalConcurrency: bad max '100001'"]),
    ("TBucketShed low=0\n", ["TBucketShed: bad low '0'"]),
    ("TBucketShed normal=101\n", ["TBucketShed: bad normal '101'"]),
    ("TBucketShed high=x\n", ["TBucketShed: bad high 'x'"]),
    ("TBucketCPUPriority On low=20\n", ["TBucketCPUPriority: bad low '20'"]),
    ("TBucketCPUPriority On normal=-21\n",
     ["TBucketCPUPriority: bad normal '-21'"]),
    ("TBucketCPUPriority On high=x\n", ["TBucketCPUPriority: bad high 'x'"]),
    ("TBucketCPUPriority On critical=99\n",
     ["TBucketCPUPriority: bad critical '99'"]),
]


# apache2 -t refuses a bad value of every option, naming the directive,
# the option and the value (and, for a duration, the grammar and range).
@pytest.mark.parametrize("conf,words", BAD, ids=[w[0] for _, w in BAD])
def test_module_250_01(apache_factory, conf, words):
    assert_refused(apache_factory(mpm="prefork"), conf, *words)


UNKNOWN = [
    (RULE % "colour=red", "TBucketRule: unknown option 'colour=red' "
     "(expected cost=N, count=STATUS,..., ban=DURATION, known=DURATION "
     "or known-by=cookie|address)"),
    (REDIS % "retries=3", "TBucketRedis: unknown option 'retries=3' "
     "(expected timeout=DURATION, connect_timeout=DURATION, pool=N, "
     "engine=auto|script|module, coalesce=off|on, tls_ca=FILE, "
     "tls_cert=FILE, tls_key=FILE, "
     "tls_server_name=NAME or tls_verify=on|off)"),
    ("TBucketBreaker wait=1s\n", "TBucketBreaker: unknown option 'wait=1s' "
     "(expected threshold=N or cooldown=DURATION)"),
    (LOC % "TBucketLease 5 size=1", "TBucketLease: unknown option 'size=1' "
     "(expected ttl=DURATION)"),
    ("TBucketCPUPriority On idle=5\n", "TBucketCPUPriority: unknown option "
     "'idle=5' (expected low=N, normal=N, high=N or critical=N)"),
    ("TBucketShed medium=5\n", "TBucketShed: unknown option 'medium=5' "
     "(expected low=P, normal=P or high=P)"),
]


# An option a directive does not have is refused with the list of the
# ones it has, made from the same table that reads them.
@pytest.mark.parametrize("conf,msg", UNKNOWN,
                         ids=[m.split(":")[0] for _, m in UNKNOWN])
def test_module_250_02(apache_factory, conf, msg):
    assert_refused(apache_factory(mpm="prefork"), conf, msg)


# Every old spelling is still taken (bare ms for timeouts and ttls, whole
# units for ban=), and the one grammar's new ones too: decimals, ms and d
# where the range allows, option names in any case.
def test_module_250_03(apache_factory):
    a = apache_factory(mpm="prefork")
    rc, out = a.configtest("""
TBucketRedis redis://127.0.0.1:6379 timeout=50 connect_timeout=0.5s pool=2
TBucketBreaker threshold=3 cooldown=1d
TBucketShed LOW=50 normal=80
<Location /old>
    TBucketEnable On
    TBucketRule ip all 5 1/m ban=15m count=401,5xx cost=2
    TBucketLease 5 ttl=250
</Location>
<Location /new>
    TBucketEnable On
    TBucketRule ip all 5 1/m ban=1.5h
    TBucketRule user "%{HTTP:X-User}" 5 1/m Ban=1500ms
    TBucketRule day "%{HTTP:X-Day}" 5 1/m ban=30d
    TBucketConcurrency 2 ttl=1.5m
</Location>
""")
    assert rc == 0, out
    assert "Syntax OK" in out
