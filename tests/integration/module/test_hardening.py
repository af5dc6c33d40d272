"""test_hardening.py -- what an attacker's review found in the refusal
line and in how keys are shown, each checked as the attacker tried it:

- an IPv6 client rotating its address inside its /64 is limited as one
  client, and now banned as one: the refusal line says the network the
  limit counted (net=) and the fail2ban filter bans that network;
- a header key that spells an address ("ip:127.0.0.1") never looks like
  the address's own bucket on the status page, in its JSON, in
  Prometheus or in the log;
- refusals by the failure policy (Redis stopped) are never logged as
  TB00160 and never match the fail2ban filter, under every policy.
"""
import json

from tbtest.apache import http_get
from tbtest.env import fail2ban_hosts


def lines(a, tag):
    return [ln for ln in a.read_log().splitlines() if tag in ln]


# An IPv6 client behind a trusted proxy rotates its address inside one
# /64 for every request: its limit counts the /64 (39 refusals of 41),
# each refusal line names that network in net=, and fail2ban-regex with
# our filter sees the one network every time, so its maxretry is reached.
def test_module_200_01(apache_factory, redis_server):
    a = apache_factory(mpm="event", servers=1)
    a.start("""
LoadModule remoteip_module /usr/lib/apache2/modules/mod_remoteip.so
RemoteIPHeader X-Forwarded-For
RemoteIPInternalProxy 127.0.0.1
TBucketRedis %s timeout=1000
TBucketPrefix h1:
TBucketRefusalLog notice
<Location /limited>
    TBucketEnable On
    TBucketLimit 2 1/h
</Location>
""" % redis_server.url)
    codes = [http_get(a.url("/limited/ok.txt"), {
        "X-Forwarded-For": "2001:db8:1:2::%x" % (i + 1)}).status_code
        for i in range(41)]
    assert codes == [200, 200] + [429] * 39, codes
    refused = lines(a, "TB00160")
    assert len(refused) == 39
    assert all(" net=2001:db8:1:2::/64 " in ln for ln in refused)
    assert len({ln.split("client=")[1].split()[0] for ln in refused}) == 39
    hosts = fail2ban_hosts(a.error_log)
    assert hosts == ["2001:db8:1:2::/64"] * 39, hosts[:5]


# A header key that spells an address, and the address itself: two
# buckets, and never shown alike. The header key is shown as
# "key:ip:127.0.0.1" on the status page (Prometheus and JSON) and in the
# refusal line, the address as "ip:127.0.0.1"; a key that starts with
# "key:" is escaped the same way, so no key can pose as another.
def test_module_200_02(apache_factory, redis_server):
    a = apache_factory(mpm="event", servers=1)
    a.start("""
TBucketRedis %s timeout=1000
TBucketPrefix h2:
TBucketRefusalLog notice
TBucketTopKeys 20
<Location /limited>
    TBucketEnable On
    TBucketLimit 1 1/h
</Location>
<Location /api>
    TBucketEnable On
    TBucketKey "%%{HTTP:X-API-Key}"
    TBucketLimit 1 1/h
</Location>
<Location /tbucket-status>
    SetHandler tbucket-status
</Location>
""" % redis_server.url)
    for _ in range(2):
        http_get(a.url("/limited/ok.txt"))
        http_get(a.url("/api/ok.txt"), {"X-API-Key": "ip:127.0.0.1"})
        http_get(a.url("/api/ok.txt"), {"X-API-Key": "key:ip:9.9.9.9"})
    prom = http_get(a.url("/tbucket-status")).text
    keys = sorted({ln.split('key="')[1].split('"')[0]
                   for ln in prom.splitlines()
                   if ln.startswith("tbucket_top_key") and 'key="' in ln})
    assert keys == ["ip:127.0.0.1", "key:ip:127.0.0.1",
                    "key:key:ip:9.9.9.9"], keys
    page = json.loads(http_get(a.url("/tbucket-status?json")).text)
    shown = json.dumps(page)
    assert '"key:ip:127.0.0.1"' in shown and '"ip:127.0.0.1"' in shown
    refused = lines(a, "TB00160")
    assert len(refused) == 3
    got = sorted(ln.split('key="')[1].split('"')[0] for ln in refused)
    assert got == ["ip:127.0.0.1", "key:ip:127.0.0.1",
                   "key:key:ip:9.9.9.9"], got


POLICY = """
TBucketRedis %s timeout=100 connect_timeout=100
TBucketPrefix h3:
TBucketFailurePolicy %s
TBucketReplicas 2
TBucketRefusalLog notice
<Location /limited>
    TBucketEnable On
    TBucketLimit 4 1/h
</Location>
"""


# Redis stopped, under every policy: open allows, closed and local refuse
# (local past this server's share, 2 of 4), and no refusal is a TB00160
# line or a fail2ban match: an outage bans nobody. The local policy's
# refusals are logged as TB00163.
def test_module_200_03(apache_factory, redis_server):
    url = redis_server.url
    redis_server.stop()
    want = {"open": [200] * 5, "closed": [429] * 5,
            "local": [200, 200, 429, 429, 429]}
    for policy, expect in want.items():
        a = apache_factory(mpm="event", servers=1)
        a.start(POLICY % (url, policy))
        codes = [http_get(a.url("/limited/ok.txt")).status_code
                 for _ in range(5)]
        assert codes == expect, (policy, codes)
        assert lines(a, "TB00160") == [], policy
        assert fail2ban_hosts(a.error_log) == [], policy
        fallback = lines(a, "TB00163")
        assert len(fallback) == (3 if policy == "local" else 0), fallback
        a.stop()
