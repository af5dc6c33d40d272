-- tb_swindow.lua -- the sliding-window counter, run atomically in Redis.
--
-- The C twin is tb_swindow_take() in shared/tb_swindow.c: the same
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
-- ARGV[1]   "" to use Redis's TIME, or a clock in ms (tests only).
-- ARGV[2+3(i-1)..4+3(i-1)]  capacity, rate (per second), cost of bucket i.
--
-- All or nothing over the buckets, O(1) per bucket. Returns
-- {allowed, remaining, retry_ms, binding} exactly as tb_bucket.lua does.

local now
if ARGV[1] ~= '' then
  now = tonumber(ARGV[1])
else
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

local n = #KEYS
local wins = {}
local curs = {}
local prevs = {}
local ests = {}
local allowed = 1
local remaining = -1
local retry = 0
local binding = 0

for i = 1, n do
  local base = 2 + (i - 1) * 3
  local cap = tonumber(ARGV[base])
  local rate = tonumber(ARGV[base + 1])
  local cost = tonumber(ARGV[base + 2])
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
  if wait ~= 0 then
    if allowed == 1 or retry ~= -1 and (wait == -1 or wait > retry) then
      retry = wait
      binding = i - 1
    end
    allowed = 0
  end
end

for i = 1, n do
  local base = 2 + (i - 1) * 3
  local left = tonumber(ARGV[base]) - ests[i]
  if allowed == 1 then left = left - tonumber(ARGV[base + 2]) end
  if left < 0 then left = 0 end
  local whole = math.floor(left)
  if remaining < 0 or whole < remaining then
    remaining = whole
    if allowed == 1 then binding = i - 1 end
  end
end

if allowed == 1 then
  for i = 1, n do
    local base = 2 + (i - 1) * 3
    local win = tonumber(ARGV[base]) * 1000 / tonumber(ARGV[base + 1])
    redis.call('HSET', KEYS[i], 'w', wins[i],
               'cur', curs[i] + tonumber(ARGV[base + 2]), 'prev', prevs[i])
    redis.call('PEXPIRE', KEYS[i], math.ceil((wins[i] + 2) * win - now) + 1000)
  end
end

return {allowed, remaining, retry, binding}
