-- tb_bucket.lua -- the token-bucket decision, run atomically inside Redis.
-- The build places shared/tb_prelude.lua before this body: arguments,
-- clock, the folds and the order of the steps are described there.
--
-- The C twin is tb_bucket_take() in shared/tb_bucket.c: the same operations
-- in the same order on IEEE-754 doubles, checked against each other by the
-- vectors in tests/vectors/token_bucket.tsv. Change both or neither.
--
-- KEYS[i]   one hash per bucket: fields tokens (fractional tokens) and
--           ts (milliseconds of Redis's clock at the last refill).
-- ARGV[2+3n]  optional, n = 1 only: want, a lease size. If allowed, take
--           g = min(floor(tokens), want) (at least cost), not cost; g is a
--           5th reply element (0 if refused). C twin: tb_bucket_lease();
--           vectors: tests/vectors/lease.tsv.
--
-- All or nothing: the request is allowed only if every bucket holds its
-- cost; then every bucket is deducted, otherwise none is and nothing is
-- written. O(1) per bucket.
--
-- Returns {allowed, remaining, retry_ms, binding}: remaining is the smallest
-- floor(tokens) left, retry_ms the largest wait (0 when allowed, -1 when a
-- cost exceeds its capacity so that waiting cannot help) and binding the
-- 0-based index of the bucket that decided.

local level = {}
local stamp = {}
local want = nil
local grant = 0

if #ARGV == 2 + 3 * n then
  want = tonumber(ARGV[2 + 3 * n])
  if n ~= 1 or want == nil then
    return redis.error_reply('ERR bad lease')
  end
end

for i = 1, n do
  local cap, rate, cost = args(i)
  local st = redis.call('HMGET', KEYS[i], 'tokens', 'ts')
  local tokens = tonumber(st[1])
  local ts = tonumber(st[2])
  if tokens == nil or ts == nil then
    tokens = cap
    ts = now
  end
  -- A clock that went backwards refills nothing and keeps the later stamp,
  -- so the same interval is never credited twice.
  local elapsed = now - ts
  if elapsed < 0 then
    elapsed = 0
  else
    ts = now
  end
  -- Cap the elapsed time first: the product then stays small and exact.
  local fill_ms = cap / rate * 1000
  if elapsed >= fill_ms then
    tokens = cap
  else
    tokens = tokens + elapsed * rate / 1000
    if tokens > cap then tokens = cap end
  end
  level[i] = tokens
  stamp[i] = ts
  local wait = 0
  if cost > cap then
    wait = -1
  elseif tokens < cost then
    wait = math.ceil((cost - tokens) * 1000 / rate)
  end
  fold_wait(i, wait)
end

-- An allowed lease takes the grant instead of the cost.
if want ~= nil and allowed == 1 then
  local _, _, cost = args(1)
  grant = math.floor(level[1])
  if grant > want then grant = want end
  if grant < cost then grant = cost end
  level[1] = level[1] - grant
elseif allowed == 1 then
  for i = 1, n do
    local _, _, cost = args(i)
    level[i] = level[i] - cost
  end
end

for i = 1, n do
  fold_left(i, level[i])
end

if allowed == 1 then
  for i = 1, n do
    local cap, rate = args(i)
    redis.call('HSET', KEYS[i], 'tokens', level[i], 'ts', stamp[i])
    redis.call('PEXPIRE', KEYS[i], math.ceil(cap / rate * 1000) + 1000)
  end
end

if want ~= nil then
  return {allowed, remaining, retry, binding, grant}
end
return {allowed, remaining, retry, binding}
