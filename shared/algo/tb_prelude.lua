-- tb_prelude.lua -- the head every algorithm script shares: arguments, the
-- clock, and the all-or-nothing fold of the buckets into one verdict.
--
-- Redis cannot make one script load another, so the build
-- (scripts/embed-lua.sh) writes each script as this file followed by its
-- body, byte for byte, into build/lua/<name>.lua. That assembled text is
-- what the library embeds, what its SHA-1 (EVALSHA) is taken of, and what
-- the tests run; line numbers in Redis's error messages count from the top
-- of it.
--
-- Every script takes the same arguments:
-- KEYS[i]   the state of bucket i; its type and fields are the body's.
-- ARGV[1]   "" to use Redis's TIME, or a clock in ms (tests only).
-- ARGV[2+3(i-1)..4+3(i-1)]  capacity, rate (per second), cost of bucket i.
-- A body may read arguments after those (tb_bucket.lua's lease size), up
-- to nargv.
--
-- Concurrency, optional in every script: one more key after the buckets'
-- and four more arguments after all the others.
-- KEYS[n+1]  the sorted set of the client's slots in flight: members slot
--            ids, scores the slot's expiry in ms of the clock above.
-- ARGV[nargv+1..nargv+4]  'conc', the limit N, the slot's ttl in ms and
--            the id of the slot to take.
-- Expired slots are pruned first; a set holding N slots refuses the
-- request (fold_wait at index n + 1, wait CONC_WAIT ms) before any bucket
-- is read, so the body writes nothing, and a bucket that refuses keeps
-- finish() from taking the slot: all or nothing across both kinds. The
-- wait is a constant because no slot says when its request will end.
-- With n = 0 the script is a concurrency limit alone.
--
-- Provided, as locals of the assembled script:
--   now         the clock in ms, read once per call.
--   n           the number of buckets: #KEYS, less the slot set.
--   nargv       #ARGV, less the concurrency arguments.
--   allowed, remaining, retry, binding
--               the verdict so far (1, -1, 0, 0 before any bucket).
--   args(i)     capacity, rate and cost of bucket i, as numbers.
--   fold_wait(i, wait)  wait is 0 (fits), -1 (never: cost > capacity) or
--               ms; the largest decides, -1 beats any wait, and any
--               non-zero wait refuses the request.
--   fold_left(i, left)  the room left in bucket i (after the deduction
--               when allowed), clamped at 0; remaining is the smallest
--               floor, and when allowed the tightest bucket binds.
--   fold_room(used)  fold_left of capacity - used[i], less the cost when
--               allowed, for every bucket: the window algorithms' room.
--   commit(used, store)  steps 2 to 4 below for the window algorithms:
--               fold_room(used); when allowed, store(i, cost, win) for
--               every bucket, win being its window of capacity * 1000 /
--               rate ms; then finish().
-- They are the Lua side of shared/algo/tb_algo_int.h, which folds the C
-- twins' buckets the same way, so a body reads like its twin's take
-- function.
--
-- Each body defines its state layout (KEYS[i]) and then, in this order:
--   1. for i = 1, n: reads bucket i's state, keeps what steps 2 and 3
--      need, and calls fold_wait(i, wait) with wait -1 when cost >
--      capacity, else its own wait;
--   2. calls fold_left for every bucket, or fold_room;
--   3. only if allowed == 1, writes every bucket's new state with a TTL
--      (a refused request writes nothing);
--   4. returns finish({allowed, remaining, retry, binding}), the reply
--      the client parses (a body may append a fifth element, as the lease
--      does). finish() takes the concurrency slot when the request is
--      allowed and appends {grant or 0, slots held} when there is one.
-- The window algorithms make steps 2 to 4 one call of commit().
-- Helpers are few on purpose: Redis runs the whole text on every call, so
-- each function here is a closure built again on every call (measured:
-- about 0.08 us per function per call in Redis 7.0).

local now
if ARGV[1] ~= '' then
  now = tonumber(ARGV[1])
else
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

local nargv = #ARGV
local conc_key = nil
if nargv >= 5 and ARGV[nargv - 3] == 'conc' then
  conc_key = KEYS[#KEYS]
  nargv = nargv - 4
end
local n = #KEYS
if conc_key then n = n - 1 end
local allowed = 1
local remaining = -1
local retry = 0
local binding = 0

local function args(i)
  local base = 2 + (i - 1) * 3
  return tonumber(ARGV[base]), tonumber(ARGV[base + 1]),
         tonumber(ARGV[base + 2])
end

local function fold_wait(i, wait)
  if wait ~= 0 then
    if allowed == 1 or retry ~= -1 and (wait == -1 or wait > retry) then
      retry = wait
      binding = i - 1
    end
    allowed = 0
  end
end

local function fold_left(i, left)
  if left < 0 then left = 0 end
  local whole = math.floor(left)
  if remaining < 0 or whole < remaining then
    remaining = whole
    if allowed == 1 then binding = i - 1 end
  end
end

local function fold_room(used)
  for i = 1, n do
    local cap, _, cost = args(i)
    local left = cap - used[i]
    if allowed == 1 then left = left - cost end
    fold_left(i, left)
  end
end

local CONC_WAIT = 1000
local conc_held = 0

if conc_key then
  redis.call('ZREMRANGEBYSCORE', conc_key, '-inf', now)
  conc_held = redis.call('ZCARD', conc_key)
  if conc_held >= tonumber(ARGV[nargv + 2]) then
    fold_wait(n + 1, CONC_WAIT)
  end
end

local function finish(reply)
  if conc_key then
    if #reply == 4 then reply[5] = 0 end
    if allowed == 1 then
      local ttl = tonumber(ARGV[nargv + 3])
      redis.call('ZADD', conc_key, now + ttl, ARGV[nargv + 4])
      -- The set lives as long as its latest slot.
      if redis.call('PTTL', conc_key) < ttl then
        redis.call('PEXPIRE', conc_key, ttl)
      end
      conc_held = conc_held + 1
    end
    reply[6] = conc_held
  end
  return reply
end

local function commit(used, store)
  fold_room(used)
  if allowed == 1 then
    for i = 1, n do
      local cap, rate, cost = args(i)
      store(i, cost, cap * 1000 / rate)
    end
  end
  return finish({allowed, remaining, retry, binding})
end

