"""test_status_alerts.py -- the alert rules (conf/prometheus/
tbucket-alerts.yml) evaluated by a real Prometheus: Debian's prometheus,
started on a free loopback port in a temp dir with its own configuration,
scrapes a real Apache's status page (Prometheus text, the page's default
view) every second; Redis is stopped under traffic, and the test waits,
bounded, for the breaker alert to fire through Prometheus's HTTP API.
Prometheus is stopped by its PID.
"""
import os
import signal
import subprocess
import time

import pytest
import requests

from tbtest.apache import http_get
from tbtest.env import ROOT, free_port, wait_port

PROMETHEUS = "/usr/bin/prometheus"
RULES = os.path.join(ROOT, "conf", "prometheus", "tbucket-alerts.yml")


def conf(redis_url):
    return """
TBucketRedis {url} timeout=200 connect_timeout=200
TBucketFailurePolicy local
TBucketBreaker threshold=2 cooldown=5s
TBucketPrefix al:
<Location /limited>
    TBucketEnable On
    TBucketLimit 1000 1000/s
</Location>
<Location /tbucket-status>
    SetHandler tbucket-status
    Require ip 127.0.0.1
</Location>
""".format(url=redis_url)


class Prometheus:
    """One prometheus of the test's own, scraping target's path."""

    def __init__(self, root, target, path):
        if not os.path.exists(PROMETHEUS):
            pytest.fail("prometheus is missing: apt-get install prometheus")
        self.port = free_port()
        self.root = str(root)
        cfg = os.path.join(self.root, "prometheus.yml")
        with open(cfg, "w") as f:
            f.write("""global:
  scrape_interval: 1s
  evaluation_interval: 1s
rule_files:
  - {rules}
scrape_configs:
  - job_name: tbucket
    metrics_path: {path}
    static_configs:
      - targets: ["{target}"]
""".format(rules=RULES, path=path, target=target))
        self.log = open(os.path.join(self.root, "prometheus.log"), "wb")
        self.proc = subprocess.Popen(
            [PROMETHEUS, "--config.file=" + cfg,
             "--storage.tsdb.path=" + os.path.join(self.root, "data"),
             "--web.listen-address=127.0.0.1:%d" % self.port],
            stdout=self.log, stderr=self.log, start_new_session=True)
        assert wait_port(self.port, timeout=30), self.read_log()

    def api(self, what):
        r = requests.get("http://127.0.0.1:%d/api/v1/%s" % (self.port, what),
                         timeout=5)
        r.raise_for_status()
        return r.json()["data"]

    def read_log(self):
        with open(os.path.join(self.root, "prometheus.log"),
                  errors="replace") as f:
            return f.read()[-3000:]

    def stop(self):
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=5)
        self.log.close()


def scraped_up(prom):
    """The target's last scrape succeeded (False while Prometheus is
    still starting: its API answers 503 until it is ready)."""
    try:
        targets = prom.api("targets")["activeTargets"]
    except requests.RequestException:
        return False
    return bool(targets) and targets[0]["health"] == "up"


# Redis stops under traffic: the breaker opens in the children, the local
# policy decides, and Prometheus, scraping the status page, fires
# TBucketBreakerOpen for that Redis (and has TBucketFallbackDecisions at
# least pending), within a bounded wait.
def test_module_247_01(apache_factory, redis_server, tmp_path):
    a = apache_factory(servers=2)
    a.start(conf(redis_server.url))
    prom = Prometheus(tmp_path, "127.0.0.1:%d" % a.port, "/tbucket-status")
    try:
        deadline = time.monotonic() + 30
        while not scraped_up(prom) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert scraped_up(prom), prom.read_log()
        for _ in range(20):
            assert http_get(a.url("/limited/ok.txt")).status_code == 200
        time.sleep(3)           # a few scrapes before the outage
        redis_server.stop()
        firing, pending, seen = None, set(), []
        deadline = time.monotonic() + 90
        while firing is None and time.monotonic() < deadline:
            for _ in range(5):
                http_get(a.url("/limited/ok.txt"))
            for al in prom.api("alerts")["alerts"]:
                seen.append((al["labels"]["alertname"], al["state"]))
                if al["labels"]["alertname"] == "TBucketFallbackDecisions":
                    pending.add(al["state"])
                if (al["labels"]["alertname"] == "TBucketBreakerOpen"
                        and al["state"] == "firing"):
                    firing = al
            time.sleep(1)
        assert firing, (seen[-10:], prom.read_log())
        assert firing["labels"]["redis"] == redis_server.url
        assert firing["labels"]["policy"] == "local"
        assert firing["labels"]["severity"] == "critical"
        assert firing["annotations"]["summary"].startswith(
            "Redis %s is failing" % redis_server.url)
        assert firing["annotations"]["doc"] == \
            "docs/operations.md#tbucketbreakeropen"
        assert pending & {"pending", "firing"}, seen[-10:]
    finally:
        prom.stop()
    a.assert_log_clean(allowed=("TB00105",))
