-- tb_fwindow.lua -- the fixed-window counter, run atomically in Redis.
--
-- The C twin is tb_fwindow_take() in shared/tb_fwindow.c: the same
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
local counts = {}
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
  local left = tonumber(ARGV[base]) - counts[i]
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
               'n', counts[i] + tonumber(ARGV[base + 2]))
    redis.call('PEXPIRE', KEYS[i], math.ceil((wins[i] + 1) * win - now) + 1000)
  end
end

return {allowed, remaining, retry, binding}
