#!/usr/bin/env python3
"""gen_algo_vectors.py -- write tests/vectors/{gcra,fixed_window,
sliding_window,sliding_log}.tsv from the Python model of the scripts
(tests/integration/tbtest/algo_model.py).

Each row is one call; rows of one case run in order on the same keys, which
start missing. Columns (tab-separated), one value per bucket joined by '|':
  case now_ms capacity rate cost allowed remaining retry_ms binding state
  [op]
state is what Redis holds afterwards: '-' for no key; gcra the TAT (ms);
windows "w,cur,prev"; the log its times ascending, ',' between ('-' empty).
op is absent for a decision; "settle" marks a call of the script's
'settle' mode, whose cost column holds the differences to settle (real
cost - cost charged, negative to give back): gcra only, which may then
hold a debt (a TAT more than capacity intervals ahead).
The C tests and the Redis tests must both reproduce every row; the
hand-computed edge cases live in the unit tests. Regenerate with
  python3 tests/vectors/gen_algo_vectors.py
"""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "integration"))
from tbtest.algo_model import MODELS, SETTLE_MODELS  # noqa: E402

BIG = 1764000000000  # A realistic Redis clock (ms since 1970).


SETTLE = "settle"


def rep(k, step):
    return [step] * k


def b(cap, rate, cost=1):
    return (cap, rate, cost)


CASES = {
    "gcra": {
        "burst_then_refuse": [(1000, [b(5, 1)])] * 6,
        "spacing_cap1": [(t, [b(1, 10)]) for t in
                         (0, 50, 99, 100, 150, 199, 200, 1000)],
        "partial_recovery": [(0, [b(3, 2)])] * 3
        + [(499, [b(3, 2)]), (500, [b(3, 2)]), (500, [b(3, 2)]),
           (1500, [b(3, 2)]), (1500, [b(3, 2)]), (1500, [b(3, 2)])],
        "cost_4": [(0, [b(10, 5, 4)])] * 3 + [(400, [b(10, 5, 4)])],
        "cost_over_capacity": [(0, [b(10, 5, 11)]), (0, [b(10, 5, 10)])],
        "cost_zero": [(0, [b(1, 1, 1)]), (0, [b(1, 1, 0)]),
                      (0, [b(1, 1, 1)])],
        "fractional_rate": [(0, [b(2, 0.5)])] * 3
        + [(2000, [b(2, 0.5)]), (3999, [b(2, 0.5)])],
        "clock_backwards": [(10000, [b(2, 1)])] * 2
        + [(9000, [b(2, 1)]), (11000, [b(2, 1)])],
        "idle_forgets": [(0, [b(3, 1)])] * 3 + [(100000, [b(3, 1)])] * 3,
        "big_clock_third_ms": [(BIG + k, [b(10, 3)]) for k in range(12)]
        + [(BIG + 334, [b(10, 3)]), (BIG + 3667, [b(10, 3)])],
        "huge_rate": [(5, [b(100, 1e6, 50)])] * 3 + [(6, [b(100, 1e6, 50)])],
        "multi_all_or_nothing": [(0, [b(5, 1), b(2, 10)])] * 3
        + [(100, [b(5, 1), b(2, 10)]), (100, [b(5, 1), b(2, 10, 3)])],
        # Settlements: debt, its floor, refunds never above capacity.
        "settle_debit_into_debt": [(0, [b(5, 1)]),
                                   (0, [b(5, 1, 8)], SETTLE),
                                   (0, [b(5, 1)]), (4000, [b(5, 1)]),
                                   (4999, [b(5, 1)]), (5000, [b(5, 1)]),
                                   (5000, [b(5, 1)])],
        "settle_debt_floor": [(0, [b(5, 1)]), (0, [b(5, 1, 100)], SETTLE),
                              (0, [b(5, 1)]), (6000, [b(5, 1)]),
                              (6000, [b(5, 1, 100)], SETTLE),
                              (16000, [b(5, 1, 5)])],
        "settle_refund": [(0, [b(10, 2)])] * 3
        + [(0, [b(10, 2, -2)], SETTLE), (0, [b(10, 2)]),
           (100, [b(10, 2, -10)], SETTLE), (100, [b(10, 2, 10)])],
        "settle_missing_key": [(500, [b(3, 1, -3)], SETTLE),
                               (700, [b(3, 1, 2)], SETTLE),
                               (700, [b(3, 1, 2)])],
        "settle_multi": [(0, [b(5, 1), b(2, 10)]),
                         (0, [b(5, 1, 3), b(2, 10, 3)], SETTLE),
                         (100, [b(5, 1), b(2, 10)]),
                         (300, [b(5, 1), b(2, 10)]),
                         (300, [b(5, 1, -4), b(2, 10, -0.5)], SETTLE)],
        "settle_big_clock_fraction": [(BIG, [b(4, 3)]),
                                      (BIG + 1, [b(4, 3, 2.5)], SETTLE),
                                      (BIG + 1, [b(4, 3)]),
                                      (BIG + 667, [b(4, 3)]),
                                      (BIG + 668, [b(4, 3, -0.25)], SETTLE)],
    },
    "fixed_window": {
        "window_fills": [(100, [b(5, 5)])] * 6,
        "boundary_double_burst": [(999, [b(5, 5)])] * 6
        + [(1000, [b(5, 5)])] * 6,
        "cost_and_over": [(0, [b(10, 1, 3)])] * 4
        + [(0, [b(10, 1, 11)]), (0, [b(10, 1, 1)])],
        "fractional_cost": [(0, [b(2, 2, 0.75)])] * 3,
        "clock_backwards": [(2500, [b(5, 5, 5)]), (1500, [b(5, 5)]),
                            (3000, [b(5, 5)])],
        "fractional_window": [(3333, [b(10, 3, 10)]), (3333, [b(10, 3)]),
                              (3334, [b(10, 3)])],
        "stale_window": [(0, [b(3, 3, 3)]), (5000, [b(3, 3, 2)])],
        "big_clock": [(BIG + k * 7, [b(4, 2)]) for k in range(6)],
        "multi_all_or_nothing": [(0, [b(3, 3), b(10, 1)])] * 4
        + [(1000, [b(3, 3), b(10, 1, 8)])],
    },
    "sliding_window": {
        "weights_previous": [(500, [b(10, 10, 10)]), (1000, [b(10, 10)]),
                             (1100, [b(10, 10)]), (1100, [b(10, 10)]),
                             (1250, [b(10, 10)]), (1500, [b(10, 10)]),
                             (1500, [b(10, 10)])],
        "half_window": [(0, [b(10, 10, 10)]), (1500, [b(10, 10, 5)]),
                        (1500, [b(10, 10)])],
        "retry_next_window": [(0, [b(4, 4, 4)]), (100, [b(4, 4)]),
                              (1249, [b(4, 4)]), (1250, [b(4, 4)])],
        "skips_two_windows": [(0, [b(4, 4, 4)]), (2500, [b(4, 4, 4)])],
        "cost_over_capacity": [(0, [b(4, 4, 5)]), (0, [b(4, 4, 4)])],
        "clock_backwards": [(1500, [b(4, 4, 2)]), (900, [b(4, 4, 2)]),
                            (900, [b(4, 4, 1)])],
        "fractional_window": [(k * 1111, [b(3, 1)]) for k in range(8)],
        "big_clock": [(BIG + k * 250, [b(5, 2)]) for k in range(12)],
        "multi_all_or_nothing": [(0, [b(3, 3), b(10, 1)])] * 4
        + [(1500, [b(3, 3), b(10, 1, 8)])],
    },
    "sliding_log": {
        "exact_window": [(0, [b(3, 3)]), (100, [b(3, 3)]), (200, [b(3, 3)]),
                         (300, [b(3, 3)]), (999, [b(3, 3)]),
                         (1000, [b(3, 3)]), (1001, [b(3, 3)]),
                         (1100, [b(3, 3)])],
        "no_double_burst": [(999, [b(5, 5)])] * 5
        + [(1000, [b(5, 5)]), (1998, [b(5, 5)]), (1999, [b(5, 5)])],
        "cost_two": [(0, [b(5, 5, 2)])] * 3 + [(1000, [b(5, 5, 5)])],
        "cost_over_capacity": [(0, [b(4, 4, 5)]), (0, [b(4, 4, 0)])],
        "clock_backwards": [(5000, [b(2, 2, 2)]), (3000, [b(2, 2)]),
                            (5999, [b(2, 2)]), (6000, [b(2, 2)])],
        "fractional_rate": [(k * 700, [b(2, 0.5)]) for k in range(10)],
        "big_clock": [(BIG + k * 100, [b(4, 2)]) for k in range(10)],
        "multi_all_or_nothing": [(0, [b(3, 3), b(10, 1)])] * 4
        + [(1000, [b(3, 3), b(10, 1, 8)])],
    },
}


def fmt_num(x):
    x = float(x)
    if x == int(x) and abs(x) < 1e15:
        return str(int(x))
    return repr(x)


def fmt_state(algo, s):
    if algo == "sliding_log":
        return ",".join(str(t) for t in s) if s else "-"
    if s is None:
        return "-"
    if algo == "gcra":
        return fmt_num(s)
    return ",".join(fmt_num(x) for x in s)


def main():
    for algo, cases in CASES.items():
        model = MODELS[algo]
        rows = ["# " + "\t".join(["case", "now_ms", "capacity", "rate", "cost",
                                  "allowed", "remaining", "retry_ms", "binding",
                                  "state"])]
        for name, steps in cases.items():
            states = None
            for step in steps:
                now, buckets, op = (step + (None,))[:3]
                if states is None:
                    states = [None] * len(buckets)
                lims = [(c, r) for c, r, _ in buckets]
                costs = [k for _, _, k in buckets]
                run = SETTLE_MODELS[algo] if op == SETTLE else model
                v, states = run(states, lims, costs, now)
                cols = [
                    name, str(now),
                    "|".join(fmt_num(c) for c, _ in lims),
                    "|".join(fmt_num(r) for _, r in lims),
                    "|".join(fmt_num(k) for k in costs),
                    str(v[0]), str(v[1]), str(v[2]), str(v[3]),
                    "|".join(fmt_state(algo, s) for s in states)]
                if op:
                    cols.append(op)
                rows.append("\t".join(cols))
        with open(os.path.join(HERE, algo + ".tsv"), "w") as f:
            f.write("\n".join(rows) + "\n")


if __name__ == "__main__":
    main()
