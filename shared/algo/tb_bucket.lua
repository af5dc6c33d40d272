-- tb_bucket.lua -- the token-bucket decision, run atomically inside Redis.
-- The build places tb_prelude.lua before this body: arguments,
-- clock, the folds and the order of the steps are described there.
--
-- The C twin is tb_bucket_take() in tb_bucket.c: the same operations
-- in the same order on IEEE-754 doubles, checked against each other by the
-- vectors in tests/vectors/token_bucket.tsv. Change both or neither.
--
-- KEYS[i]   one hash per bucket: fields tokens (fractional tokens; below 0
--           down to -capacity when a settlement charged more than the
--           bucket held: a debt) and ts (milliseconds of Redis's clock at
--           the last refill). A bucket in debt refills from its debt.
-- ARGV[2+3n]  optional, one of:
--           'settle': settle what requests really cost instead of
--           deciding. The cost of bucket i is then the difference to
--           settle (real cost - cost charged): taken when positive, given
--           back when negative; the bucket keeps between -capacity and
--           capacity and is always written, with a TTL that covers its
--           refill from what it holds. The reply's allowed is 0 when a
--           bucket is left in debt, retry_ms the time until every bucket
--           is out of it. C twin: tb_bucket_settle(); vectors:
--           tests/vectors/token_bucket_settle.tsv.
--           want, n = 1 only: a lease size. If allowed, take
--           g = min(floor(tokens), want) (at least cost), not cost; g is a
--           5th reply element (0 if refused). C twin: tb_bucket_lease();
--           vectors: tests/vectors/lease.tsv.
--           'rules': the buckets of several rules (TBucketRule), each
--           maybe of another client key, decided together. 2n numbers
--           follow, for bucket i: hold_i, 1 when the bucket must hold its
--           cost but is not charged now (the host charges it later by
--           'settle', once the response's status is known), else 0; and
--           ban_i, the ms a refusal by bucket i bans its key (0: none).
--           A bucket's hash may hold a field `ban`, the clock in ms until
--           which its key is banned: a banned bucket refuses the request
--           at once, retry_ms the ban's time left, and nothing is
--           written. When buckets refuse, each with a ban_i gets its
--           `ban` field and a TTL that outlives it, and retry_ms is the
--           longest ban. The reply then has 8 elements: the four, 0 (no
--           grant), the slots held (0 without a concurrency limit), the
--           banned buckets (bit i-1 for bucket i) and those this call
--           banned.
-- ARGV[3+3n]  optional after want: back, unspent tokens of an expired
--           lease of the same bucket, added (up to capacity) after the
--           refill and before the decision. A refused call that gave
--           tokens back still writes the bucket. C twin:
--           tb_bucket_give_back() then tb_bucket_lease().
--
-- All or nothing: the request is allowed only if every bucket holds its
-- cost; then every bucket is deducted, otherwise none is and nothing is
-- written. O(1) per bucket.
--
-- Returns {allowed, remaining, retry_ms, binding}: remaining is the smallest
-- floor(tokens) left (0 when in debt), retry_ms the largest wait (0 when
-- allowed, -1 when a cost exceeds its capacity so that waiting cannot help)
-- and binding the 0-based index of the bucket that decided.

local level = {}
local stamp = {}
local ban_until = {}
-- The optional arguments end at nargv: the concurrency ones follow.
local mode = nil
if nargv >= 2 + 3 * n then mode = ARGV[2 + 3 * n] end
local settle = mode == 'settle'
local rules = mode == 'rules'
local want = nil
local back = 0
local grant = 0
local hold = {}
local ban_ms = {}
local waits = {}
local banned = 0
local ban_left = 0

if rules then
  if nargv ~= 2 + 5 * n then
    return redis.error_reply('ERR bad rules')
  end
  for i = 1, n do
    hold[i] = ARGV[1 + 3 * n + 2 * i] == '1'
    ban_ms[i] = tonumber(ARGV[2 + 3 * n + 2 * i])
    if ban_ms[i] == nil or not (ban_ms[i] >= 0) then
      return redis.error_reply('ERR bad rules')
    end
  end
elseif mode ~= nil and not settle then
  want = tonumber(mode)
  if nargv >= 3 + 3 * n then back = tonumber(ARGV[3 + 3 * n]) end
  if n ~= 1 or want == nil or back == nil or not (back >= 0) then
    return redis.error_reply('ERR bad lease')
  end
end

for i = 1, n do
  local cap, rate, cost = args(i)
  local st
  if rules or settle then
    st = redis.call('HMGET', KEYS[i], 'tokens', 'ts', 'ban')
    ban_until[i] = tonumber(st[3])
    if rules and ban_until[i] ~= nil and ban_until[i] > now then
      banned = banned + 2 ^ (i - 1)
      if ban_until[i] - now > ban_left then
        ban_left = ban_until[i] - now
        binding = i - 1
      end
    end
  else
    st = redis.call('HMGET', KEYS[i], 'tokens', 'ts')
  end
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
  -- A bucket in debt takes its debt longer to fill.
  local fill_ms = cap / rate * 1000
  if tokens < 0 then fill_ms = (cap - tokens) / rate * 1000 end
  if elapsed >= fill_ms then
    tokens = cap
  else
    tokens = tokens + elapsed * rate / 1000
    if tokens > cap then tokens = cap end
  end
  local wait = 0
  if settle then
    tokens = tokens - cost
    if tokens > cap then tokens = cap end
    if tokens < -cap then tokens = -cap end
    if tokens < 0 then wait = math.ceil(-tokens * 1000 / rate) end
  else
    if back > 0 then
      tokens = tokens + back
      if tokens > cap then tokens = cap end
    end
    if cost > cap then
      wait = -1
    elseif tokens < cost then
      wait = math.ceil((cost - tokens) * 1000 / rate)
    end
  end
  level[i] = tokens
  stamp[i] = ts
  waits[i] = wait
  if banned == 0 then fold_wait(i, wait) end
end

-- A banned key is refused before any bucket counts: nothing is written.
if banned > 0 then
  allowed = 0
  return {0, 0, ban_left, binding, 0, conc_held, banned, 0}
end

-- An allowed lease takes the grant instead of the cost.
if want ~= nil and allowed == 1 then
  local _, _, cost = args(1)
  grant = math.floor(level[1])
  if grant > want then grant = want end
  if grant < cost then grant = cost end
  level[1] = level[1] - grant
elseif allowed == 1 and not settle then
  for i = 1, n do
    local _, _, cost = args(i)
    if not hold[i] then level[i] = level[i] - cost end
  end
end

for i = 1, n do
  fold_left(i, level[i])
end

-- The TTL covers the refill from what is written: from empty after an
-- allowed take, from the level (a debt, maybe) otherwise.
for i = 1, n do
  local cap, rate = args(i)
  local ttl = nil
  if settle or (allowed == 0 and back > 0) then
    ttl = math.ceil((cap - level[i]) / rate * 1000) + 1000
  elseif allowed == 1 and not hold[i] then
    ttl = math.ceil(cap / rate * 1000) + 1000
  end
  -- A settlement never ends a ban early.
  if settle and ban_until[i] ~= nil and ban_until[i] - now > ttl then
    ttl = ban_until[i] - now
  end
  if ttl ~= nil then
    redis.call('HSET', KEYS[i], 'tokens', level[i], 'ts', stamp[i])
    redis.call('PEXPIRE', KEYS[i], ttl)
  end
end

if rules then
  -- Each bucket that refused bans its key for its rule's time.
  local newban = 0
  if allowed == 0 then
    for i = 1, n do
      if ban_ms[i] > 0 and waits[i] > 0 then
        redis.call('HSET', KEYS[i], 'ban', now + ban_ms[i])
        if redis.call('PTTL', KEYS[i]) < ban_ms[i] then
          redis.call('PEXPIRE', KEYS[i], ban_ms[i])
        end
        newban = newban + 2 ^ (i - 1)
        if retry ~= -1 and ban_ms[i] > retry then
          retry = ban_ms[i]
          binding = i - 1
        end
      end
    end
  end
  local reply = finish({allowed, remaining, retry, binding, 0})
  reply[6] = conc_held
  reply[7] = 0
  reply[8] = newban
  return reply
end
if want ~= nil then
  return finish({allowed, remaining, retry, binding, grant})
end
return finish({allowed, remaining, retry, binding})
