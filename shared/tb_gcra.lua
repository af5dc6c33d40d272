-- tb_gcra.lua -- GCRA (generic cell rate algorithm), run atomically in Redis.
--
-- The C twin is tb_gcra_take() in shared/tb_gcra.c: the same operations in
-- the same order on IEEE-754 doubles, checked against each other by the
-- vectors in tests/vectors/gcra.tsv. Change both or neither.
--
-- A limit CAPACITY RATE means: one request per emission interval
-- T = 1000 / RATE ms in the long run, with a burst tolerance of CAPACITY
-- requests (CAPACITY = 1 is strict even spacing). The state is one number,
-- the theoretical arrival time (TAT, ms of Redis's clock, a string key).
-- A request of cost k is allowed when the debt max(TAT - now, 0) plus k * T
-- stays within CAPACITY * T; TAT then moves to now + debt + k * T.
--
-- The stored TAT is rounded to the resolution of a double near now (about
-- 0.24 us for today's clock), so comparisons allow EPS = 0.001 ms of slack:
-- a request may pass at most 1 us early. Keep RATE below about 1e5/s per key
-- for the rounding to stay under 1% of T.
--
-- KEYS[i]   one string per bucket (TAT in ms).
-- ARGV[1]   "" to use Redis's TIME, or a clock in ms (tests only).
-- ARGV[2+3(i-1)..4+3(i-1)]  capacity, rate (per second), cost of bucket i.
--
-- All or nothing over the buckets, O(1) per bucket. Returns
-- {allowed, remaining, retry_ms, binding} exactly as tb_bucket.lua does.

local EPS = 0.001

local now
if ARGV[1] ~= '' then
  now = tonumber(ARGV[1])
else
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

local n = #KEYS
local debt = {}
local after = {}
local allowed = 1
local remaining = -1
local retry = 0
local binding = 0

for i = 1, n do
  local base = 2 + (i - 1) * 3
  local cap = tonumber(ARGV[base])
  local rate = tonumber(ARGV[base + 1])
  local cost = tonumber(ARGV[base + 2])
  local interval = 1000 / rate
  local limit = cap * interval
  local tat = tonumber(redis.call('GET', KEYS[i]))
  -- A TAT in the past is no debt; a clock that went backwards keeps the
  -- whole (larger) debt, so nothing is credited twice.
  local d = 0
  if tat ~= nil and tat > now then
    d = tat - now
  end
  local a = d + cost * interval
  debt[i] = d
  after[i] = a
  local wait = 0
  if cost > cap then
    wait = -1
  elseif a > limit + EPS then
    wait = math.ceil(a - limit - EPS)
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
  local interval = 1000 / tonumber(ARGV[base + 1])
  local limit = tonumber(ARGV[base]) * interval
  local used = debt[i]
  if allowed == 1 then used = after[i] end
  local left = (limit - used + EPS) / interval
  if left < 0 then left = 0 end
  local whole = math.floor(left)
  if remaining < 0 or whole < remaining then
    remaining = whole
    if allowed == 1 then binding = i - 1 end
  end
end

if allowed == 1 then
  for i = 1, n do
    redis.call('SET', KEYS[i], now + after[i], 'PX',
               math.ceil(after[i]) + 1000)
  end
end

return {allowed, remaining, retry, binding}
