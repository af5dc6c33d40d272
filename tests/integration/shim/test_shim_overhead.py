"""test_shim_overhead.py -- what the shim costs a connect(): plain, under a
config whose rule does not match, and under one that does. The figures
are printed (run pytest with -s to see them); the asserts only catch gross
regressions, since timing on a shared machine is noisy."""
from tbtest.shim import parse_kv, plain_env, run, shim_env, write_conf
from tbtest.env import free_port


def bench(progs, env, mode, port, n):
    p = run([progs["connect_loop"], mode, str(port), str(n)], env,
            timeout=120)
    return float(parse_kv(p.stdout)["ns_per_call"])


def best(progs, env, mode, port, n, runs=3):
    return min(bench(progs, env, mode, port, n) for _ in range(runs))


def confs(redis, tmp_path, port):
    other = port + 1 if port < 65535 else port - 1
    rule = ('outbound = ( { name = "bench"; host = "127.0.0.1"; port = %d; '
            'capacity = 1000000000; rate = 1000000000; } );')
    return (write_conf(tmp_path / "u.conf", redis, rule % other),
            write_conf(tmp_path / "m.conf", redis, rule % port))


# test_shim_900_01: the wrapper's own cost on an unmatched connect() is a
# table look-up: measured against a fake connect() preloaded after the
# shim (no system call), which also shows that the shim hands calls to
# the next interposer (dlsym RTLD_NEXT), not straight to libc.
def test_shim_900_01(redis_server, progs, tmp_path):
    port = free_port()
    unmatched, _ = confs(redis_server, tmp_path, port)
    fake = progs["libfakeconnect.so"]
    n = 2000000
    base_env = plain_env()
    base_env["LD_PRELOAD"] = fake
    # Timing is for the optimised build, also under `make asan`.
    shim = shim_env(unmatched, foreign=True)
    shim["LD_PRELOAD"] += " " + fake
    base = best(progs, base_env, "ebadf", port, n)
    wrapped = best(progs, shim, "ebadf", port, n)
    print("\nunmatched connect(), no syscall: fake alone %.1f ns, shim + "
          "fake %.1f ns: the shim adds %.1f ns" % (base, wrapped,
                                                     wrapped - base))
    # A real system call costs microseconds here; tens of ns means the
    # call went to the fake, through the look-up only.
    assert wrapped - base < 200, (base, wrapped)


# test_shim_900_02: a whole loopback connection plain, unmatched and
# matched: a matched connect() costs about one Redis round trip more.
def test_shim_900_02(redis_server, progs, tmp_path):
    port = free_port()
    unmatched, matched = confs(redis_server, tmp_path, port)
    n = 2000
    fig = {
        "plain": best(progs, plain_env(), "cycle", port, n),
        "unmatched": best(progs, shim_env(unmatched, foreign=True), "cycle",
                          port, n),
        "matched": best(progs, shim_env(matched, foreign=True), "cycle",
                        port, n),
    }
    print("\nloopback connect+accept cycle, ns per call: " + " ".join(
        "%s=%.0f" % kv for kv in fig.items())
        + "; matched adds %.1f us" % ((fig["matched"] - fig["plain"]) / 1e3))
    tokens = float(redis_server.client().hget(
        "tb:shim:out:bench:{bench}", "tokens"))
    assert tokens < 1000000000        # the matched runs reached Redis
    assert fig["matched"] - fig["plain"] < 2000000, fig
