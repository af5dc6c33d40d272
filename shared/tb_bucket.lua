-- tb_bucket.lua -- the token-bucket decision, run atomically inside Redis.
--
-- The C twin is tb_bucket_take() in shared/tb_bucket.c: the same operations
-- in the same order on IEEE-754 doubles, checked against each other by the
-- vectors in tests/vectors/token_bucket.tsv. Change both or neither.
--
-- KEYS[i]   one hash per bucket: fields tokens (fractional tokens) and
--           ts (milliseconds of Redis's clock at the last refill).
-- ARGV[1]   "" to use Redis's TIME, or a clock in ms (tests only).
-- ARGV[2+3(i-1)..4+3(i-1)]  capacity, rate (tokens per second), cost of
--           bucket i.
-- ARGV[2+3n]  optional, n = 1 only: want, a lease size (issue 6). If
--           allowed, take g = min(floor(tokens), want) (at least cost),
--           not cost; g is a 5th reply element (0 if refused). C twin:
--           tb_bucket_lease(); vectors: tests/vectors/lease.tsv.
--
-- All or nothing: the request is allowed only if every bucket holds its
-- cost; then every bucket is deducted, otherwise none is and nothing is
-- written. O(1) per bucket.
--
-- Returns {allowed, remaining, retry_ms, binding}: remaining is the smallest
-- floor(tokens) left, retry_ms the largest wait (0 when allowed, -1 when a
-- cost exceeds its capacity so that waiting cannot help) and binding the
-- 0-based index of the bucket that decided.

local now
if ARGV[1] ~= '' then
  now = tonumber(ARGV[1])
else
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

local n = #KEYS
local level = {}
local stamp = {}
local allowed = 1
local remaining = -1
local retry = 0
local binding = 0
local want = nil
local grant = 0

if #ARGV == 2 + 3 * n then
  want = tonumber(ARGV[2 + 3 * n])
  if n ~= 1 or want == nil then
    return redis.error_reply('ERR bad lease')
  end
end

for i = 1, n do
  local base = 2 + (i - 1) * 3
  local cap = tonumber(ARGV[base])
  local rate = tonumber(ARGV[base + 1])
  local cost = tonumber(ARGV[base + 2])
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
  if wait ~= 0 then
    if allowed == 1 or retry ~= -1 and (wait == -1 or wait > retry) then
      retry = wait
      binding = i - 1
    end
    allowed = 0
  end
end

if want ~= nil and allowed == 1 then
  grant = math.floor(level[1])
  if grant > want then grant = want end
  if grant < tonumber(ARGV[4]) then grant = tonumber(ARGV[4]) end
end

for i = 1, n do
  local base = 2 + (i - 1) * 3
  local left = level[i]
  if allowed == 1 then
    if want ~= nil then
      left = left - grant
    else
      left = left - tonumber(ARGV[base + 2])
    end
  end
  local whole = math.floor(left)
  if remaining < 0 or whole < remaining then
    remaining = whole
    if allowed == 1 then binding = i - 1 end
  end
end

if allowed == 1 then
  for i = 1, n do
    local base = 2 + (i - 1) * 3
    local cap = tonumber(ARGV[base])
    local rate = tonumber(ARGV[base + 1])
    local left = level[i] - tonumber(ARGV[base + 2])
    if want ~= nil then left = level[i] - grant end
    redis.call('HSET', KEYS[i], 'tokens', left, 'ts', stamp[i])
    redis.call('PEXPIRE', KEYS[i], math.ceil(cap / rate * 1000) + 1000)
  end
end

if want ~= nil then
  return {allowed, remaining, retry, binding, grant}
end
return {allowed, remaining, retry, binding}
