"""tbtest/algo_model.py -- a third, Python model of the algorithm scripts
other than the token bucket.

It performs the double operations of shared/tb_{gcra,fwindow,swindow,slog}.lua
in the same order (Python floats are IEEE-754 doubles too), so it generates
tests/vectors/<algo>.tsv, which the C twins (tests/unit/test_<algo>.c) and the
real scripts in a real Redis (algorithms/test_algo_vectors.py) must both
reproduce.
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


def _gcra(states, lims, costs, now, settle):
    now = float(now)
    n = len(lims)
    waits, before, after_l, afters = [], [], [], []
    for i in range(n):
        cap, rate = map(float, lims[i])
        cost = float(costs[i])
        interval = 1000 / rate
        limit = cap * interval
        d = 0.0
        if states[i] is not None and states[i] > now:
            d = states[i] - now
        a = d + cost * interval
        if settle:
            a = min(max(a, 0.0), 2 * limit)
        wait = 0
        if cost > cap and not settle:
            wait = -1
        elif a > limit + EPS:
            wait = max(1, math.ceil(a - limit - EPS))
        waits.append(wait)
        before.append((limit - (a if settle else d) + EPS) / interval)
        after_l.append((limit - a + EPS) / interval)
        afters.append(a)
    v = _fold(n, waits, before, after_l)
    keep = v[0] or settle
    new = [now + afters[i] for i in range(n)] if keep else list(states)
    return v, new


def gcra(states, lims, costs, now):
    return _gcra(states, lims, costs, now, False)


def gcra_settle(states, lims, deltas, now):
    return _gcra(states, lims, deltas, now, True)


def fwindow(states, lims, costs, now):
    now = float(now)
    n = len(lims)
    waits, before, after_l, st = [], [], [], []
    for i in range(n):
        cap, rate = map(float, lims[i])
        cost = float(costs[i])
        win = cap * 1000 / rate
        idx = float(math.floor(now / win))
        if states[i] is None or idx > states[i][0]:
            w, count = idx, 0.0
        else:
            w, count = states[i][0], states[i][1]
        wait = 0
        if cost > cap:
            wait = -1
        elif count + cost > cap:
            wait = max(1, math.ceil((w + 1) * win - now))
        waits.append(wait)
        before.append(cap - count)
        after_l.append(cap - count - cost)
        st.append([w, count + cost, 0.0])
    v = _fold(n, waits, before, after_l)
    return v, (st if v[0] else list(states))


def swindow(states, lims, costs, now):
    now = float(now)
    n = len(lims)
    waits, before, after_l, st = [], [], [], []
    for i in range(n):
        cap, rate = map(float, lims[i])
        cost = float(costs[i])
        win = cap * 1000 / rate
        idx = float(math.floor(now / win))
        s = states[i]
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
        waits.append(wait)
        before.append(cap - est)
        after_l.append(cap - est - cost)
        st.append([w, cur + cost, prev])
    v = _fold(n, waits, before, after_l)
    return v, (st if v[0] else list(states))


def slog(states, lims, costs, now):
    n = len(lims)
    waits, before, after_l, logs = [], [], [], []
    for i in range(n):
        cap, rate = map(float, lims[i])
        cost = float(costs[i])
        win = cap * 1000 / rate
        log = [t for t in (states[i] or []) if float(t) > float(now) - win]
        count = float(len(log))
        wait = 0
        if cost > cap:
            wait = -1
        elif count + cost > cap:
            d = math.ceil(count + cost - cap)
            wait = max(1, math.ceil(float(log[d - 1]) + win - float(now)))
        waits.append(wait)
        before.append(cap - count)
        after_l.append(cap - count - cost)
        logs.append(log)
    v = _fold(n, waits, before, after_l)
    if v[0]:
        for i in range(n):
            logs[i] = sorted(logs[i] + [int(now)] * int(costs[i]))
    return v, logs


MODELS = {"gcra": gcra, "fixed_window": fwindow,
          "sliding_window": swindow, "sliding_log": slog}

# The 'settle' mode of the scripts that have one.
SETTLE_MODELS = {"gcra": gcra_settle}
