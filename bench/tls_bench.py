"""tls_bench.py -- the `tls` part of `make bench`: the core's decisions per
second over TLS against plaintext.

One redis-server listens on a plaintext port and a TLS port at once (a CA
and a server certificate made by openssl in the run's temp dir), so both
URLs reach the same server with the same pinning. tb_bench
(bench/tb_bench.c) runs on each URL in turn, alternating which goes first
round by round, in three shapes: the run's concurrency with a connection
per thread (c50), the same threads sharing 4 connections as a threaded
MPM's child does, so decisions ride in batches (c50.pool4), and one
thread (c1, latency-bound). Each figure is the median of the per-round
ratios TLS / plaintext (target >= 0.80). The handshake is made once per
pooled connection, so what remains is the record encryption of each
write and read, on both sides: with OpenSSL 3.0 about 13,000 client
instructions per decision beside the plaintext path's 4,500. Rates swing
with the machine's load; the CPU time per decision of tb_bench (rusage)
and of Redis (/proc) is recorded too (medians over the rounds), which
drifts less. Also recorded: the
connections each TLS run made (one handshake each).

Called by bench/run.py with bench/benchkit.py as `h` (its helpers: run, pin,
kv, median, record, log, free_port, wait_port, stop_pid).
"""
import os
import resource
import subprocess
import time


def make_pki(d, h):
    """ca.pem, server.pem and server.key (SAN IP:127.0.0.1) in d."""
    def ssl(*args):
        h.run(["openssl"] + list(args), 60)
    ca_key, ca = os.path.join(d, "ca.key"), os.path.join(d, "ca.pem")
    key, csr = os.path.join(d, "server.key"), os.path.join(d, "server.csr")
    crt, ext = os.path.join(d, "server.pem"), os.path.join(d, "server.ext")
    for k in (ca_key, key):
        ssl("genpkey", "-algorithm", "EC", "-pkeyopt",
            "ec_paramgen_curve:P-256", "-out", k)
    ssl("req", "-x509", "-new", "-key", ca_key, "-sha256", "-days", "2",
        "-subj", "/CN=tb bench CA", "-out", ca)
    ssl("req", "-new", "-key", key, "-subj", "/CN=localhost", "-out", csr)
    with open(ext, "w") as f:
        f.write("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    ssl("x509", "-req", "-in", csr, "-CA", ca, "-CAkey", ca_key,
        "-CAcreateserial", "-days", "2", "-sha256", "-extfile", ext,
        "-out", crt)
    return ca, crt, key


def start_redis(d, h, cpus, ca, crt, key):
    """A redis-server on a plaintext and a TLS port: (proc, port, tls)."""
    port, tls = h.free_port(), h.free_port()
    conf = os.path.join(d, "redis.conf")
    with open(conf, "w") as f:
        f.write("\n".join([
            "bind 127.0.0.1", "port %d" % port, "tls-port %d" % tls,
            "tls-cert-file %s" % crt, "tls-key-file %s" % key,
            "tls-ca-cert-file %s" % ca, "tls-auth-clients no",
            "dir %s" % d, "save \"\"", "appendonly no", "daemonize no",
            "logfile %s/redis.log" % d]) + "\n")
    proc = subprocess.Popen(h.pin(cpus) + ["redis-server", conf],
                            stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if h.wait_port(port, 0.2) and h.wait_port(tls, 0.2):
            return proc, port, tls
    h.stop_pid(proc)
    raise RuntimeError("TLS redis-server did not listen")


def bench(h, tool, cpus, url, threads, pool, secs, redis_pid, ca=None):
    """One tb_bench run: its figures, plus client_us and redis_us, the
    CPU time (user + system) per decision of each side."""
    cmd = h.pin(cpus) + [tool, "-u", url, "-t", str(threads), "-p",
                         str(pool), "-d", str(secs), "-k", "thread"]
    if ca:
        cmd += ["-A", ca]
    r0, c0 = h.cpu_ticks([redis_pid]), resource.getrusage(
        resource.RUSAGE_CHILDREN)
    res = h.kv(h.run(cmd, 120))
    r1, c1 = h.cpu_ticks([redis_pid]), resource.getrusage(
        resource.RUSAGE_CHILDREN)
    n = max(1.0, res.get("decisions", 0))
    res["client_us"] = (c1.ru_utime - c0.ru_utime + c1.ru_stime
                        - c0.ru_stime) * 1e6 / n
    res["redis_us"] = (r1 - r0) * h.TICK_US / n
    return res


def part_tls(a, tool, tmp, h):
    d = os.path.join(tmp, "tls")
    os.makedirs(d)
    ca, crt, key = make_pki(d, h)
    proc, port, tls = start_redis(d, h, a.redis_cpu, ca, crt, key)
    plain_url = "redis://127.0.0.1:%d" % port
    tls_url = "rediss://127.0.0.1:%d" % tls
    try:
        shapes = (("c%d" % a.concurrency, a.concurrency, a.concurrency),
                  ("c%d.pool4" % a.concurrency, a.concurrency, 4),
                  ("c1", 1, 1))
        for shape, threads, pool in shapes:
            plain, enc, ratios = [], [], []
            cpu = {(w, n): [] for w in ("client_us", "redis_us")
                   for n in ("plain", "tls")}
            for i in range(a.rounds):
                pair = [("plain", plain_url, None), ("tls", tls_url, ca)]
                got = {}
                for name, url, cafile in (pair if i % 2 == 0
                                          else pair[::-1]):
                    res = bench(h, tool, a.client_cpu, url, threads, pool,
                                a.tls_seconds, proc.pid, cafile)
                    if res.get("failed", 0):
                        raise RuntimeError("%s: %d decisions failed" % (
                            name, res["failed"]))
                    got[name] = res["per_sec"]
                    for w in ("client_us", "redis_us"):
                        cpu[(w, name)].append(res[w])
                plain.append(got["plain"])
                enc.append(got["tls"])
                ratios.append(got["tls"] / got["plain"])
            h.log("tls %s: plaintext %s tls %s" % (
                shape, [int(x) for x in plain], [int(x) for x in enc]))
            tag = "tls." + shape
            h.record(tag + ".plaintext", round(h.median(plain)),
                     "decisions/s")
            h.record(tag + ".tls", round(h.median(enc)), "decisions/s")
            ratio = h.median(ratios)
            h.record(tag + ".ratio", round(ratio, 3), "x", ">= 0.80",
                     "met" if ratio >= 0.8 else "MISSED")
            for (w, name), xs in sorted(cpu.items()):
                h.record("%s.%s.%s" % (tag, w, name),
                         round(h.median(xs), 1), "us CPU/decision")
    finally:
        h.stop_pid(proc)
