"""test_shim_overhead.py -- what the shim costs a connect(): plain, under a
config whose rule does not match, and under one that does. The figures
are printed (run pytest with -s to see them); the asserts only catch gross
regressions, since timing on a shared machine is noisy."""
from shimlib import parse_kv, plain_env, progs, run, shim_env, write_conf
from tbenv import free_port

__all__ = ["progs"]


def bench(progs, env, mode, port, n):
    p = run([progs["connect_loop"], mode, str(port), str(n)], env,
            timeout=120)
    return float(parse_kv(p.stdout)["ns_per_call"])


def best(progs, env, mode, port, n, runs=3):
    return min(bench(progs, env, mode, port, n) for _ in range(runs))


# test_shim_900_01: an unmatched connect() costs the wrapper's table
# look-up only (well under a microsecond); a matched one costs about one
# Redis round trip on top of a real loopback connect.
def test_shim_900_01(redis_server, progs, tmp_path):
    port = free_port()
    other = port + 1 if port < 65535 else port - 1
    rule = ('outbound = ( { name = "bench"; host = "127.0.0.1"; port = %d; '
            'capacity = 1000000000; rate = 1000000000; } );')
    unmatched = write_conf(tmp_path / "u.conf", redis_server, rule % other)
    matched = write_conf(tmp_path / "m.conf", redis_server, rule % port)
    n_fast, n_cycle = 200000, 2000
    fig = {
        "ebadf_plain": best(progs, plain_env(), "ebadf", port, n_fast),
        "ebadf_unmatched": best(progs, shim_env(unmatched), "ebadf", port,
                                n_fast),
        "cycle_plain": best(progs, plain_env(), "cycle", port, n_cycle),
        "cycle_unmatched": best(progs, shim_env(unmatched), "cycle", port,
                                n_cycle),
        "cycle_matched": best(progs, shim_env(matched), "cycle", port,
                              n_cycle),
    }
    print("\nshim connect() overhead, ns per call: " + " ".join(
        "%s=%.0f" % kv for kv in fig.items()))
    print("unmatched adds %.0f ns; matched adds %.1f us" % (
        fig["ebadf_unmatched"] - fig["ebadf_plain"],
        (fig["cycle_matched"] - fig["cycle_plain"]) / 1000))
    assert fig["ebadf_unmatched"] - fig["ebadf_plain"] < 1000, fig
    # Every matched connect spent a token: the decisions reached Redis.
    tokens = float(redis_server.client().hget(
        "tb:shim:out:bench:{bench}", "tokens"))
    assert tokens < 1000000000
    assert fig["cycle_matched"] - fig["cycle_plain"] < 2000000, fig
