-- tb_fwindow.lua -- the fixed-window counter, run atomically in Redis.
-- The build places tb_prelude.lua before this body: arguments,
-- clock, the folds and the order of the steps are described there.
--
-- The C twin is tb_fwindow_take() in tb_fwindow.c: the same
-- operations in the same order on IEEE-754 doubles, checked against each
-- other by the vectors in tests/vectors/fixed_window.tsv.
--
-- A limit CAPACITY RATE means CAPACITY requests per window of
-- W = CAPACITY * 1000 / RATE ms. Windows are aligned to the epoch of the
-- clock (window w covers [w * W, (w + 1) * W) ms), so every key shares the
-- same boundaries. Known edge: a client may spend CAPACITY at the end of
-- one window and CAPACITY again at the start of the next, so up to
-- 2 * CAPACITY requests can pass within any short interval around a
-- boundary (tested in tests/unit/test_fwindow.c).
--
-- KEYS[i]   one hash per bucket: w (window number) and n (cost spent in
--           window w).
--
-- All or nothing over the buckets, O(1) per bucket. Returns
-- {allowed, remaining, retry_ms, binding} exactly as tb_bucket.lua does.

local wins = {}
local counts = {}

for i = 1, n do
  local cap, rate, cost = args(i)
  local win = cap * 1000 / rate
  local idx = math.floor(now / win)
  local st = redis.call('HMGET', KEYS[i], 'w', 'n')
  local w = tonumber(st[1])
  local count = tonumber(st[2])
  -- A later window starts empty; a clock that went backwards stays in the
  -- (later) stored window, so no window is ever opened twice.
  if w == nil or count == nil or idx > w then
    w = idx
    count = 0
  end
  wins[i] = w
  counts[i] = count
  local wait = 0
  if cost > cap then
    wait = -1
  elseif count + cost > cap then
    wait = math.ceil((w + 1) * win - now)
    if wait < 1 then wait = 1 end
  end
  fold_wait(i, wait)
end

return commit(counts, function(i, cost, win)
  redis.call('HSET', KEYS[i], 'w', wins[i], 'n', counts[i] + cost)
  redis.call('PEXPIRE', KEYS[i], math.ceil((wins[i] + 1) * win - now) + 1000)
end)
