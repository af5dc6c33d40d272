#!/usr/bin/python3
"""soak_load.py -- the soak's load generator: steady traffic of many
kinds against the replicas (through haproxy) and the shim's server, with
every request accounted for.

Run by soak.py as a process of its own, so that its CPU shows apart:

    /usr/bin/python3 bench/soak_load.py CONFIG.json

CONFIG names the haproxy port, the shim server's port, the length in
seconds, the rate scale and the output directory (and, to bisect a
finding, "only": the classes to run). One asyncio loop runs
a set of workers per traffic class (CLASSES); each worker holds one
connection (keep-alive through haproxy; one connection per request to
the shim's server) and sends at its share of the class's rate, never
faster, and never more than one request behind (a stalled worker does
not burst to catch up). SIGUSR1 starts a flood (FLOOD); SIGTERM, or the
end of the length, stops the load: a request in flight then still gets
its answer, within the request timeout.

A request is counted as sent once written, and then as answered (by
status) or lost (by why: "eof" when the connection closed before an
answer, "reset", "timeout" after REQUEST_TIMEOUT s, "proxy-503" for an
error haproxy made itself, a 5xx without the Retry-After every 503 of
the module carries); a connect that fails is lost too ("connect").
Written to the output directory:

  stats.jsonl    every STATS_EVERY s: per class, sent, answers by status,
                 losses by kind, latency max and p99 (ms), and the Redis
                 keys the requests sent should hold alive (active_keys,
                 and active_by per kind of KEYS: every key a request
                 touched, while younger than its TTL)
  active         the same figures every 2 s, as JSON (replaced)
  lost.tsv       every lost request: time, class, kind, seconds waited
  probes.tsv     every request of the shim probe: send time, status
  logins.tsv     every answered login (LOGIN_CLASSES): send time,
                 class, address, whether the password was the right one,
                 status, whether the answer was the rules' ban
                 ({"error":"banned",...}), whether it carried the known
                 client's cookie (tbk_user)
  summary.json   totals per class, the generator's own CPU seconds and
                 cut_answered: slow uploads answered (and closed) before
                 their body was all sent, counted as answered

Every loop is bounded by the length (and by MAX_REQUESTS), every request
by REQUEST_TIMEOUT.
"""
import asyncio
import json
import os
import random
import resource
import signal
import sys
import time

REQUEST_TIMEOUT = 30.0
STATS_EVERY = 10.0
MAX_REQUESTS = 20000000
FLOOD_SECONDS = 5.0
FLOOD_WORKERS = 48

# The module's limits (soak.py writes the same figures into the Apache
# configuration) and the TTL, in seconds, the bucket scripts give a key
# they write: capacity / rate + 1 s (tb_bucket.lua); a concurrency set
# lives for its slot TTL.
LIMITS = {
    "api": (60, 1.0),         # TBucketLimit 60 1/s, many distinct keys
    "hot": (200, 50.0),       # TBucketLimit 200 50/s, TBucketLease 20
    "probe": (20, 5.0),       # TBucketLimit 20 5/s, sent at 10/s
    "app": (60, 10.0),        # TBucketLimit 60 10/s, TBucketConcurrency 4
    "rule_ip": (10, 1 / 60.0),    # TBucketRule ip ... 10 1/m count=401
    "rule_user": (5, 1 / 60.0),   # TBucketRule user ... 5 1/m count=401
    "shim": (20, 10.0),       # the shim's inbound rule, 20 at 10/s
}
CONC_TTL = 30                 # TBucketConcurrency 4 ttl=30s
APP_CONCURRENCY = 4
PREFIX = "sk:"
SHIM_PREFIX = "sk:shim:"


def ttl(name):
    cap, rate = LIMITS[name]
    return cap / rate + 1.0


KEYS = {
    "api": lambda k: [(PREFIX + "{%s}" % k, ttl("api"))],
    "hot": lambda k: [(PREFIX + "{%s}" % k, ttl("hot"))],
    "probe": lambda k: [(PREFIX + "{%s}" % k, ttl("probe"))],
    "app": lambda k: [(PREFIX + "{%s}" % k, ttl("app")),
                      (PREFIX + "{%s}:conc" % k, CONC_TTL)],
    "login": lambda k: [(PREFIX + "{%s}:rule:ip" % k[0], ttl("rule_ip")),
                        (PREFIX + "{%s}:rule:user" % k[1],
                         ttl("rule_user"))],
    # The owner's address and her own bucket on the user rule (the
    # module names it "{owner#k<id>}"; only the count matters here).
    "owner": lambda k: [(PREFIX + "{%s}:rule:ip" % k[0], ttl("rule_ip")),
                        (PREFIX + "{%s#known}:rule:user" % k[1],
                         ttl("rule_user"))],
    "shim": lambda k: [(SHIM_PREFIX + "in:web:{%s}" % k, ttl("shim"))],
}

# Traffic classes at scale 1: requests/s over the class and workers
# (connections); the rate of a "fixed" class does not scale.
CLASSES = {
    # ~1 M distinct keys in 30 minutes (555/s), each sent once.
    "api": {"rate": 560.0, "workers": 16},
    # 8 hot keys under a lease, within their limit.
    "hot": {"rate": 80.0, "workers": 4},
    # 3 probe keys at 10/s each, twice their rate (whatever the scale).
    "probe": {"rate": 30.0, "workers": 3, "fixed": True},
    # a PHP page by 300 users, each well within its limit.
    "app": {"rate": 10.0, "workers": 2},
    # one user holding about 5 slow (1 s) PHP requests against a
    # concurrency of 4.
    "greedy": {"rate": 5.4, "workers": 6},
    # a PHP login from 500 addresses and 2000 users, 70% failing.
    "login": {"rate": 15.0, "workers": 3},
    # one address guessing passwords: banned by the ip rule.
    "attacker": {"rate": 2.0, "workers": 1, "fixed": True},
    # logins whose form body arrives slowly (SLOW_PIECES pieces, each
    # SLOW_GAP_S apart), half of them with the right password: the
    # module reads the body for %{FORM:log} and PHP must get it whole.
    "slowlogin": {"rate": 1.0, "workers": 2},
    # credential stuffing on one name (OWNER) from 200 addresses, wrong
    # passwords: the user rule keeps the name's bucket empty or banned.
    "stuffer": {"rate": 1.0, "workers": 2, "fixed": True},
    # OWNER herself, from her browser, with the right password and the
    # cookie (tbk_user) of her enrolment login (owner_enrol, before the
    # stuffers start): a known client, decided on a bucket of her own.
    "owner": {"rate": 0.2, "workers": 1, "fixed": True},
    # 8 peers of the shim's server, within its rule.
    "shim": {"rate": 20.0, "workers": 4},
    # one peer at 15/s against the rule's 10/s.
    "shimprobe": {"rate": 15.0, "workers": 1, "fixed": True},
}
SLOW_PIECES, SLOW_GAP_S = 4, 0.4
# The classes whose bodies go out in pieces (haproxy forwards them as
# they arrive); soak_report.py counts their losses at hard stops apart.
STREAMED = ("slowlogin",)
LOGIN_CLASSES = ("login", "attacker", "slowlogin", "stuffer", "owner",
                 "enrol")
OWNER, OWNER_IP = "owner", "10.9.0.1"
KNOWN_COOKIE = "tbk_user"
# The enrolment login is retried at most this long (each try bounded by
# REQUEST_TIMEOUT); the stuffers wait for it as long at most.
ENROL_S = 60.0
SHIM_PEERS = ["127.0.0.%d" % i for i in range(2, 10)]
SHIM_PROBE_PEER = "127.0.0.10"


class Tally:
    """Counts of one class: per window (reset at each stats line) and in
    total."""

    def __init__(self):
        self.total = self._zero()
        self.win = self._zero()

    @staticmethod
    def _zero():
        return {"sent": 0, "codes": {}, "lost": {}, "lat": []}

    def sent(self):
        self.total["sent"] += 1
        self.win["sent"] += 1

    def answered(self, code, lat):
        for d in (self.total, self.win):
            d["codes"][str(code)] = d["codes"].get(str(code), 0) + 1
        self.win["lat"].append(lat)

    def lost(self, kind):
        for d in (self.total, self.win):
            d["lost"][kind] = d["lost"].get(kind, 0) + 1

    def flush(self):
        w = self.win
        self.win = self._zero()
        lat = sorted(w["lat"])
        w["lat_max_ms"] = round(lat[-1] * 1000, 1) if lat else None
        w["lat_p99_ms"] = round(lat[int(0.99 * (len(lat) - 1))] * 1000, 1) \
            if lat else None
        del w["lat"]
        return w


class Gen:
    """The generator's state: tallies, the active-key model, output."""

    def __init__(self, cfg):
        self.cfg = cfg
        self.out = cfg["out"]
        self.scale = float(cfg.get("scale", 1.0))
        self.t_end = time.time() + float(cfg["seconds"])
        self.stopping = False
        self.tally = {c: Tally() for c in list(CLASSES) + ["flood",
                                                          "enrol"]}
        self.cookie = None      # the owner's tbk_user, once she has one
        self.enrolled = None    # asyncio.Event, made in the loop
        self.active = {}
        self.counter = 0        # distinct keys of the api class
        self.flood_n = 0
        self.cut_answered = 0   # answered before their body was all sent
        self.budget = MAX_REQUESTS
        self.lost_f = open(os.path.join(self.out, "lost.tsv"), "w")
        self.lost_f.write("t\tclass\tkind\twaited_s\n")
        self.probe_f = open(os.path.join(self.out, "probes.tsv"), "w")
        self.probe_f.write("t_send\tclass\tkey\tstatus\n")
        self.stats_f = open(os.path.join(self.out, "stats.jsonl"), "w")
        self.login_f = open(os.path.join(self.out, "logins.tsv"), "w")
        self.login_f.write("t_send\tclass\tip\tright\tstatus\tbanned"
                           "\tknown\n")
        self.rng = random.Random(cfg.get("seed", 1))
        self.flood_until = 0.0

    def touch(self, kind, key, now):
        for rkey, t in KEYS[kind](key):
            self.active[rkey] = (now + t, kind)

    def prune(self, now):
        """Drop the keys past their TTL; {kind: keys alive}."""
        dead = [k for k, (exp, _) in self.active.items() if exp <= now]
        for k in dead:
            del self.active[k]
        by = dict.fromkeys(KEYS, 0)
        for _, kind in self.active.values():
            by[kind] += 1
        return by

    def running(self):
        return not self.stopping and time.time() < self.t_end \
            and self.budget > 0

    def record_login(self, cls, ip, req, status, body, t0):
        right = int(b"&pwd=right" in req)
        banned = int(status == 429 and b'"error":"banned"' in body)
        known = int(b"\r\nCookie: " + KNOWN_COOKIE.encode() + b"=" in req)
        self.login_f.write("%.3f\t%s\t%s\t%d\t%d\t%d\t%d\n" % (
            t0, cls, ip, right, status, banned, known))

    def keep_cookie(self, set_cookie):
        """The browser's jar, for the one cookie the owner cares about."""
        for c in set_cookie:
            name, _, rest = c.partition("=")
            if name.strip() == KNOWN_COOKIE:
                self.cookie = rest.split(";", 1)[0].strip()

    def record_lost(self, cls, kind, t0):
        self.tally[cls].lost(kind)
        self.lost_f.write("%.3f\t%s\t%s\t%.3f\n" % (t0, cls, kind,
                                                   time.time() - t0))
        self.lost_f.flush()


# ---- HTTP/1.1, just enough: status, Content-Length or chunked ---------

async def read_response(reader):
    """(status, close, retry_after, body, [Set-Cookie values]) of one
    response read whole from reader; raises EOFError when the connection closed before a full
    answer."""
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError as e:
        raise EOFError("eof" if not e.partial else "partial") from None
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ", 2)
    if len(parts) < 2 or not parts[0].startswith("HTTP/"):
        raise EOFError("junk")
    status = int(parts[1])
    hdr = {}
    cookies = []
    for line in lines[1:]:
        if ":" in line:
            k, v = line.split(":", 1)
            hdr[k.strip().lower()] = v.strip()
            if k.strip().lower() == "set-cookie":
                cookies.append(v.strip())
    close = hdr.get("connection", "").lower() == "close"
    body = b""
    try:
        if "chunked" in hdr.get("transfer-encoding", "").lower():
            while True:
                size = int((await reader.readuntil(b"\r\n")).split(b";")[0],
                           16)
                body += (await reader.readexactly(size + 2))[:size] \
                    if size else b""
                if size == 0:
                    while (await reader.readuntil(b"\r\n")) != b"\r\n":
                        pass
                    break
        elif "content-length" in hdr:
            body = await reader.readexactly(int(hdr["content-length"]))
        else:
            body = await reader.read()
            close = True
    except asyncio.IncompleteReadError:
        raise EOFError("partial") from None
    return status, close, "retry-after" in hdr, body, cookies


def request_bytes(method, path, headers, body=b""):
    h = ["%s %s HTTP/1.1" % (method, path), "Host: soak"]
    h += ["%s: %s" % kv for kv in headers.items()]
    if body:
        h.append("Content-Length: %d" % len(body))
    return ("\r\n".join(h) + "\r\n\r\n").encode() + body


# ---- what each class sends ----------------------------------------------

def make_request(gen, cls, idx):
    """(bytes, key kind, key) of the next request of class cls."""
    r = gen.rng
    if cls == "api":
        gen.counter += 1
        k = "d%d" % gen.counter
        return request_bytes("GET", "/api/ok.txt", {"X-API-Key": k}), \
            "api", k
    if cls == "hot":
        k = "hot%d" % r.randrange(8)
        return request_bytes("GET", "/hot/ok.txt", {"X-API-Key": k}), \
            "hot", k
    if cls == "probe":
        k = "probe%d" % idx
        return request_bytes("GET", "/probe/ok.txt", {"X-API-Key": k}), \
            "probe", k
    if cls == "app":
        k = "app%d" % r.randrange(300)
        return request_bytes("GET", "/app/heavy.php?rows=20",
                             {"X-API-Key": k}), "app", k
    if cls == "greedy":
        return request_bytes("GET", "/app/sleep.php?ms=1000",
                             {"X-API-Key": "greedy"}), "app", "greedy"
    if cls == "flood":
        gen.flood_n += 1
        k = "f%d" % gen.flood_n
        return request_bytes("GET", "/app/heavy.php?rows=100",
                             {"X-API-Key": k}), "app", k
    if cls in LOGIN_CLASSES:
        if cls == "login":
            ip = "10.0.%d.%d" % divmod(r.randrange(500), 250)
            ok = r.random() < 0.3
        elif cls == "slowlogin":
            ip = "10.1.%d.%d" % divmod(r.randrange(500), 250)
            ok = r.random() < 0.5
        elif cls == "stuffer":
            ip, ok = "10.7.%d.%d" % divmod(r.randrange(200), 250), False
        elif cls in ("owner", "enrol"):
            ip, ok = OWNER_IP, True
        else:
            ip, ok = "10.66.6.6", False
        user = OWNER if cls in ("stuffer", "owner", "enrol") else \
            "user%d" % r.randrange(2000)
        body = ("log=%s&pwd=%s" % (user, "right" if ok else "wrong")).encode()
        headers = {"X-Forwarded-For": ip, "X-API-Key": user,
                   "Content-Type": "application/x-www-form-urlencoded"}
        if cls == "owner" and gen.cookie:
            headers["Cookie"] = "%s=%s" % (KNOWN_COOKIE, gen.cookie)
        return request_bytes("POST", "/login.php", headers, body), \
            ("owner" if cls == "owner" else "login"), (ip, user)
    raise ValueError(cls)


async def paced(gen, interval, t_stop=None):
    """Yields once every interval seconds (0: back to back), from a random
    phase, while the load runs (and before t_stop), each time taking one
    request of the budget; a late turn is not made up beyond one interval."""
    nxt = time.time() + gen.rng.random() * interval
    while gen.running() and (t_stop is None or time.time() < t_stop):
        now = time.time()
        if nxt > now:
            await asyncio.sleep(nxt - now)
        nxt = max(nxt + interval, time.time() - interval)
        if not gen.running():
            return
        gen.budget -= 1
        yield


async def http_worker(gen, cls, idx, interval, t_stop=None):
    """One keep-alive connection to haproxy sending class cls every
    interval seconds (0: back to back) until the load stops (or t_stop)."""
    if cls == "stuffer":
        await wait_enrolled(gen)
    elif cls == "owner":
        await owner_enrol(gen)
    tally = gen.tally[cls]
    conn = None
    # slow uploads through haproxy's upload frontend (soak.py says why)
    port = "upload_port" if cls in STREAMED else "web_port"
    async for _ in paced(gen, interval, t_stop):
        req, kind, key = make_request(gen, cls, idx)
        t0 = time.time()
        try:
            if conn is None:
                conn = await asyncio.wait_for(asyncio.open_connection(
                    "127.0.0.1", gen.cfg[port]), REQUEST_TIMEOUT)
        except (OSError, asyncio.TimeoutError):
            gen.record_lost(cls, "connect", t0)
            await asyncio.sleep(0.1)
            continue
        reader, writer = conn
        # The answer is read while the request goes out: a server may
        # answer an upload before its body is all sent (a refusal that
        # closes without reading it), and clients read that answer.
        answer = asyncio.ensure_future(read_response(reader))
        try:
            cut = await send_request(writer, req, cls in STREAMED, answer)
            tally.sent()
            gen.touch(kind, key, t0)
            status, close, retry, body, cookies = await asyncio.wait_for(
                answer, REQUEST_TIMEOUT)
            if cut:
                gen.cut_answered += 1
                close = True
            if cls in ("owner", "enrol"):
                gen.keep_cookie(cookies)
            if status >= 500 and not retry:
                # haproxy's own error (no server answered); the module's
                # 503 always carries Retry-After.
                gen.record_lost(cls, "proxy-%d" % status, t0)
            else:
                tally.answered(status, time.time() - t0)
                if cls in LOGIN_CLASSES:
                    gen.record_login(cls, key[0], req, status, body, t0)
        except (EOFError, ConnectionError, OSError,
                asyncio.TimeoutError) as e:
            answer.cancel()
            gen.record_lost(cls, loss_kind(e), t0)
            close = True
        if close:
            writer.close()
            conn = None
        if cls == "enrol" and gen.cookie:
            break
    if conn is not None:
        conn[1].close()


async def wait_enrolled(gen):
    try:
        await asyncio.wait_for(gen.enrolled.wait(), ENROL_S)
    except asyncio.TimeoutError:
        pass


async def owner_enrol(gen):
    """The owner's earlier successful login, before the stuffers start:
    class "enrol", once a second until it gets 200 and the cookie (or
    ENROL_S passed); then the stuffers go."""
    try:
        await http_worker(gen, "enrol", 0, 1.0,
                          t_stop=time.time() + ENROL_S)
    finally:
        gen.enrolled.set()


async def send_request(writer, req, slow, answer):
    """Writes req; slow: its head at once, its body in SLOW_PIECES pieces
    SLOW_GAP_S apart (a slow upload: the module's form reader and PHP
    wait for the rest). True when the body was cut off: the answer (the
    task reading it) came first, or the server closed while the body
    was still going out; the caller reads the answer either way."""
    if not slow:
        writer.write(req)
        await writer.drain()
        return False
    head, body = req.split(b"\r\n\r\n", 1)
    try:
        writer.write(head + b"\r\n\r\n")
        step = max(1, -(-len(body) // SLOW_PIECES))
        for i in range(0, len(body), step):
            await writer.drain()
            await asyncio.wait([answer], timeout=SLOW_GAP_S)
            if answer.done():
                return True
            writer.write(body[i:i + step])
        await writer.drain()
    except (ConnectionError, OSError):
        return True
    return False


def loss_kind(e):
    if isinstance(e, asyncio.TimeoutError):
        return "timeout"
    if isinstance(e, EOFError):
        return str(e) or "eof"
    if isinstance(e, ConnectionResetError):
        return "reset"
    return type(e).__name__


async def shim_worker(gen, cls, idx, interval):
    """One connection per request to the shim's server, from a peer
    address of its own (the shim keys its rule by the peer)."""
    tally = gen.tally[cls]
    nworkers = CLASSES[cls]["workers"]
    peers = [SHIM_PROBE_PEER] if cls == "shimprobe" else \
        SHIM_PEERS[idx::nworkers]
    n = 0
    req = request_bytes("GET", "/", {"Connection": "close"})
    async for _ in paced(gen, interval):
        peer = peers[n % len(peers)]
        n += 1
        t0 = time.time()
        writer = None
        try:
            reader, writer = await asyncio.wait_for(asyncio.open_connection(
                "127.0.0.1", gen.cfg["shim_port"], local_addr=(peer, 0)),
                REQUEST_TIMEOUT)
        except (OSError, asyncio.TimeoutError):
            gen.record_lost(cls, "connect", t0)
            continue
        try:
            writer.write(req)
            await writer.drain()
            tally.sent()
            gen.touch("shim", peer, t0)
            status = (await asyncio.wait_for(read_response(reader),
                                             REQUEST_TIMEOUT))[0]
            tally.answered(status, time.time() - t0)
            if cls == "shimprobe":
                gen.probe_f.write("%.6f\t%s\t%s\t%d\n" % (t0, cls, peer,
                                                          status))
        except (EOFError, ConnectionError, OSError,
                asyncio.TimeoutError) as e:
            gen.record_lost(cls, loss_kind(e), t0)
        finally:
            writer.close()


async def reporter(gen):
    """The stats line every STATS_EVERY s and the active figure every 2 s,
    until the load stops."""
    nxt = time.time() + STATS_EVERY
    while gen.running():
        await asyncio.sleep(2.0)
        now = time.time()
        by = gen.prune(now)
        tmp = os.path.join(gen.out, "active.tmp")
        with open(tmp, "w") as f:
            json.dump({"t": round(now, 3), "total": sum(by.values()),
                       "by": by}, f)
        os.replace(tmp, os.path.join(gen.out, "active"))
        if now >= nxt:
            nxt += STATS_EVERY
            write_stats(gen, now, by)


def write_stats(gen, now, by):
    line = {"t": round(now, 3), "active_keys": sum(by.values()),
            "active_by": by,
            "flood": gen.flood_until > now,
            "classes": {c: t.flush() for c, t in gen.tally.items()}}
    gen.stats_f.write(json.dumps(line) + "\n")
    gen.stats_f.flush()
    gen.probe_f.flush()
    gen.login_f.flush()


def start_flood(gen):
    """FLOOD_WORKERS connections sending back to back for FLOOD_SECONDS."""
    now = time.time()
    if gen.flood_until > now or not gen.running():
        return
    gen.flood_until = now + FLOOD_SECONDS
    for i in range(FLOOD_WORKERS):
        asyncio.ensure_future(http_worker(gen, "flood", i, 0.0,
                                          t_stop=gen.flood_until))


async def main_async(gen):
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, lambda: setattr(gen, "stopping",
                                                            True))
    loop.add_signal_handler(signal.SIGUSR1, lambda: start_flood(gen))
    gen.enrolled = asyncio.Event()
    tasks = [asyncio.ensure_future(reporter(gen))]
    only = gen.cfg.get("only")       # a subset of the classes, to bisect
    for cls, spec in CLASSES.items():
        rate = spec["rate"] * (1.0 if spec.get("fixed") else gen.scale)
        if rate <= 0 or (only and cls not in only):
            continue
        interval = spec["workers"] / rate
        for i in range(spec["workers"]):
            if cls.startswith("shim"):
                coro = shim_worker(gen, cls, i, interval)
            else:
                coro = http_worker(gen, cls, i, interval)
            tasks.append(asyncio.ensure_future(coro))
    await asyncio.gather(*tasks)
    # Flood workers still running end by their own t_stop.
    pending = [t for t in asyncio.all_tasks() if t is not
               asyncio.current_task()]
    if pending:
        await asyncio.wait(pending, timeout=REQUEST_TIMEOUT + 5)


def main():
    with open(sys.argv[1]) as f:
        cfg = json.load(f)
    gen = Gen(cfg)
    t0 = time.time()
    asyncio.run(main_async(gen))
    now = time.time()
    write_stats(gen, now, gen.prune(now))
    ru = resource.getrusage(resource.RUSAGE_SELF)
    summary = {"seconds": round(now - t0, 1),
               "cpu_s": round(ru.ru_utime + ru.ru_stime, 1),
               "distinct_keys": gen.counter,
               "flood_keys": gen.flood_n,
               "cut_answered": gen.cut_answered,
               "classes": {c: {k: v for k, v in t.total.items()
                               if k != "lat"}
                           for c, t in gen.tally.items()}}
    with open(os.path.join(gen.out, "summary.json"), "w") as f:
        json.dump(summary, f, indent=1)
    for f in (gen.lost_f, gen.probe_f, gen.stats_f, gen.login_f):
        f.close()


if __name__ == "__main__":
    main()
