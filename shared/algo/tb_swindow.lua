-- tb_swindow.lua -- the sliding-window counter, run atomically in Redis.
-- The build places tb_prelude.lua before this body: arguments,
-- clock, the folds and the order of the steps are described there.
--
-- The C twin is tb_swindow_take() in tb_swindow.c: the same
-- operations in the same order on IEEE-754 doubles, checked against each
-- other by the vectors in tests/vectors/sliding_window.tsv.
--
-- A limit CAPACITY RATE means CAPACITY requests per sliding window of
-- W = CAPACITY * 1000 / RATE ms. It keeps two fixed-window counts (the
-- current window w, aligned to the epoch, and the previous one) and
-- estimates the sliding count as
--     prev * (W - (now - w * W)) / W + cur,
-- i.e. it assumes the previous window's requests were spread evenly. This
-- is an approximation: it can admit more than the exact log when the
-- previous window's requests came late in it, and fewer when they came
-- early. The error on a bursty trace is measured against the exact sliding
-- log by bench/algo_figures.py.
--
-- KEYS[i]   one hash per bucket: w (window number), cur and prev (cost
--           spent in windows w and w - 1).
--
-- All or nothing over the buckets, O(1) per bucket. Returns
-- {allowed, remaining, retry_ms, binding} exactly as tb_bucket.lua does.

local wins = {}
local curs = {}
local prevs = {}
local ests = {}

for i = 1, n do
  local cap, rate, cost = args(i)
  local win = cap * 1000 / rate
  local idx = math.floor(now / win)
  local st = redis.call('HMGET', KEYS[i], 'w', 'cur', 'prev')
  local w = tonumber(st[1])
  local cur = tonumber(st[2])
  local prev = tonumber(st[3])
  if w == nil or cur == nil or prev == nil or idx > w + 1 then
    w = idx
    cur = 0
    prev = 0
  elseif idx == w + 1 then
    w = idx
    prev = cur
    cur = 0
  end
  -- A clock that went backwards stays at the start of the stored window,
  -- where the previous window weighs the most.
  local into = now - w * win
  if into < 0 then into = 0 end
  local est = prev * ((win - into) / win) + cur
  wins[i] = w
  curs[i] = cur
  prevs[i] = prev
  ests[i] = est
  local wait = 0
  if cost > cap then
    wait = -1
  elseif est + cost > cap then
    local at
    if cur + cost <= cap then
      -- Within this window, once enough of prev has slid out.
      at = w * win + win * (1 - (cap - cur - cost) / prev)
    else
      -- In the next window, once enough of cur has slid out.
      at = (w + 1) * win + win * (1 - (cap - cost) / cur)
    end
    wait = math.ceil(at - now)
    if wait < 1 then wait = 1 end
  end
  fold_wait(i, wait)
end

return commit(ests, function(i, cost, win)
  redis.call('HSET', KEYS[i], 'w', wins[i], 'cur', curs[i] + cost,
             'prev', prevs[i])
  redis.call('PEXPIRE', KEYS[i], math.ceil((wins[i] + 2) * win - now) + 1000)
end)
