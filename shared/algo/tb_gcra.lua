-- tb_gcra.lua -- GCRA (generic cell rate algorithm), run atomically in Redis.
-- The build places tb_prelude.lua before this body: arguments,
-- clock, the folds and the order of the steps are described there.
--
-- The C twin is tb_gcra_take() in tb_gcra.c: the same operations in
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
-- KEYS[i]   one string per bucket (TAT in ms). A TAT more than
--           CAPACITY * T ahead of now is a debt (a settlement charged more
--           than the bucket held): requests wait until it is paid.
-- ARGV[2+3n]  optional: 'settle', to settle what requests really cost
--           instead of deciding. The cost of bucket i is then the
--           difference to settle (real cost - cost charged): the TAT moves
--           by cost * T, never behind now (a full bucket) nor more than
--           2 * CAPACITY * T ahead (a debt of CAPACITY), and is always
--           written. The reply's allowed is 0 when a bucket is left in
--           debt, retry_ms the time until every bucket is out of it. C
--           twin: tb_gcra_settle(); vectors: the rows of
--           tests/vectors/gcra.tsv marked settle.
--
-- All or nothing over the buckets, O(1) per bucket. Returns
-- {allowed, remaining, retry_ms, binding} exactly as tb_bucket.lua does.

local EPS = 0.001

local settle = ARGV[2 + 3 * n] == 'settle'
local debt = {}
local after = {}

for i = 1, n do
  local cap, rate, cost = args(i)
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
  if settle then
    if a < 0 then a = 0 end
    if a > 2 * limit then a = 2 * limit end
  end
  debt[i] = d
  after[i] = a
  local wait = 0
  if cost > cap and not settle then
    wait = -1
  elseif a > limit + EPS then
    wait = math.ceil(a - limit - EPS)
    if wait < 1 then wait = 1 end
  end
  fold_wait(i, wait)
end

for i = 1, n do
  local cap, rate = args(i)
  local interval = 1000 / rate
  local used = debt[i]
  if allowed == 1 or settle then used = after[i] end
  fold_left(i, (cap * interval - used + EPS) / interval)
end

if allowed == 1 or settle then
  for i = 1, n do
    redis.call('SET', KEYS[i], now + after[i], 'PX',
               math.ceil(after[i]) + 1000)
  end
end

return finish({allowed, remaining, retry, binding})
