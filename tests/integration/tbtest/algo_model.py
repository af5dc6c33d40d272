"""tbtest/algo_model.py -- a third, Python model of the algorithm scripts
other than the token bucket.

It performs the double operations of
shared/algo/tb_{gcra,fwindow,swindow,slog}.lua in the same order (Python floats
are IEEE-754 doubles too), so it generates tests/vectors/<algo>.tsv, which the
C twins (tests/unit/test_<algo>.c) and the real scripts in a real Redis
(algorithms/test_algo_vectors.py) must both reproduce.
State per bucket: gcra None | tat; windows None | [w, cur, prev]; slog list.
gcra_settle models tb_gcra.lua's 'settle' mode (costs are the differences
to settle; the TAT is always written, a debt at most one capacity).
"""
import math

EPS = 0.001


def _fold(n, waits, lefts_before, lefts_after):
    allowed, remaining, retry, binding = 1, -1, 0, 0
    for i in range(n):
        wait = waits[i]
        if wait != 0:
            if allowed == 1 or (retry != -1 and (wait == -1 or wait > retry)):
                retry = wait
                binding = i
            allowed = 0
    for i in range(n):
        left = lefts_after[i] if allowed else lefts_before[i]
        if left < 0:
            left = 0
        whole = math.floor(left)
        if remaining < 0 or whole < remaining:
            remaining = whole
            if allowed:
                binding = i
    return allowed, remaining, retry, binding


def _run(states, lims, costs, now, bucket):
    """One call on every bucket: bucket(state, cap, rate, cost, now)
    returns (wait, left before, left after, state if allowed, state if
    refused) for one bucket; the waits and what is left fold into the
    verdict, which picks the states to store. Returns (verdict, states)."""
    now = float(now)
    waits, before, after, if_allowed, if_refused = [], [], [], [], []
    for state, (cap, rate), cost in zip(states, lims, costs):
        w, b, a, s_ok, s_no = bucket(state, float(cap), float(rate),
                                     float(cost), now)
        waits.append(w)
        before.append(b)
        after.append(a)
        if_allowed.append(s_ok)
        if_refused.append(s_no)
    v = _fold(len(lims), waits, before, after)
    return v, (if_allowed if v[0] else if_refused)


def _gcra(settle):
    def bucket(tat, cap, rate, cost, now):
        interval = 1000 / rate
        limit = cap * interval
        d = 0.0
        if tat is not None and tat > now:
            d = tat - now
        a = d + cost * interval
        if settle:
            a = min(max(a, 0.0), 2 * limit)
        wait = 0
        if cost > cap and not settle:
            wait = -1
        elif a > limit + EPS:
            wait = max(1, math.ceil(a - limit - EPS))
        new = now + a
        return (wait, (limit - (a if settle else d) + EPS) / interval,
                (limit - a + EPS) / interval, new, new if settle else tat)
    return bucket


def gcra(states, lims, costs, now):
    return _run(states, lims, costs, now, _gcra(False))


def gcra_settle(states, lims, deltas, now):
    return _run(states, lims, deltas, now, _gcra(True))


def _fwindow(s, cap, rate, cost, now):
    win = cap * 1000 / rate
    idx = float(math.floor(now / win))
    if s is None or idx > s[0]:
        w, count = idx, 0.0
    else:
        w, count = s[0], s[1]
    wait = 0
    if cost > cap:
        wait = -1
    elif count + cost > cap:
        wait = max(1, math.ceil((w + 1) * win - now))
    return wait, cap - count, cap - count - cost, [w, count + cost, 0.0], s


def fwindow(states, lims, costs, now):
    return _run(states, lims, costs, now, _fwindow)


def _swindow(s, cap, rate, cost, now):
    win = cap * 1000 / rate
    idx = float(math.floor(now / win))
    if s is None or idx > s[0] + 1:
        w, cur, prev = idx, 0.0, 0.0
    elif idx == s[0] + 1:
        w, cur, prev = idx, 0.0, s[1]
    else:
        w, cur, prev = s
    into = now - w * win
    if into < 0:
        into = 0.0
    est = prev * ((win - into) / win) + cur
    wait = 0
    if cost > cap:
        wait = -1
    elif est + cost > cap:
        if cur + cost <= cap:
            at = w * win + win * (1 - (cap - cur - cost) / prev)
        else:
            at = (w + 1) * win + win * (1 - (cap - cost) / cur)
        wait = max(1, math.ceil(at - now))
    return wait, cap - est, cap - est - cost, [w, cur + cost, prev], s


def swindow(states, lims, costs, now):
    return _run(states, lims, costs, now, _swindow)


def _slog(s, cap, rate, cost, now):
    """A refusal still stores the log with its expired entries trimmed."""
    win = cap * 1000 / rate
    log = [t for t in (s or []) if float(t) > now - win]
    count = float(len(log))
    wait = 0
    if cost > cap:
        wait = -1
    elif count + cost > cap:
        d = math.ceil(count + cost - cap)
        wait = max(1, math.ceil(float(log[d - 1]) + win - now))
    return (wait, cap - count, cap - count - cost,
            sorted(log + [int(now)] * int(cost)), log)


def slog(states, lims, costs, now):
    return _run(states, lims, costs, now, _slog)


MODELS = {"gcra": gcra, "fixed_window": fwindow,
          "sliding_window": swindow, "sliding_log": slog}

# The 'settle' mode of the scripts that have one.
SETTLE_MODELS = {"gcra": gcra_settle}
