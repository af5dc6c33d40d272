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
-- A body may read arguments after those (tb_bucket.lua's lease size).
--
-- Provided, as locals of the assembled script:
--   now         the clock in ms, read once per call.
--   n           the number of buckets, #KEYS.
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
-- They are the Lua side of shared/tb_algo_int.h, which folds the C twins'
-- buckets the same way, so a body reads like its twin's take function.
--
-- Each body defines its state layout (KEYS[i]) and then, in this order:
--   1. for i = 1, n: reads bucket i's state, keeps what steps 2 and 3
--      need, and calls fold_wait(i, wait) with wait -1 when cost >
--      capacity, else its own wait;
--   2. calls fold_left for every bucket, or fold_room;
--   3. only if allowed == 1, writes every bucket's new state with a TTL
--      (a refused request writes nothing);
--   4. returns {allowed, remaining, retry, binding}, the reply the client
--      parses (a body may append elements, as the lease does).
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

local n = #KEYS
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

