-- tb_slog.lua -- the sliding log, run atomically in Redis.
-- The build places tb_prelude.lua before this body: arguments,
-- clock, the folds and the order of the steps are described there.
--
-- The C twin is tb_slog_take() in tb_slog.c: the same decisions,
-- checked against each other by the vectors in tests/vectors/sliding_log.tsv.
--
-- A limit CAPACITY RATE means at most CAPACITY requests in any window of
-- W = CAPACITY * 1000 / RATE ms, exactly: every admitted unit of cost is a
-- member of a sorted set scored by its time in ms, and a request is
-- allowed when the members newer than now - W plus its cost fit within
-- CAPACITY. Cost must be a whole number (the client checks).
--
-- NOT O(1): memory is one member per admitted unit in the last W ms, so at
-- most CAPACITY members per key (about 60-70 bytes each), and a call costs
-- O(log N + M) for the trim plus O(cost * log N) for the insert. Keep
-- CAPACITY small (the client refuses more than TB_SLOG_MAX_CAPACITY).
--
-- KEYS[i]   one sorted set per bucket: members "<ms>:<seq>", score <ms>.
--
-- All or nothing over the buckets. Returns {allowed, remaining, retry_ms,
-- binding} exactly as tb_bucket.lua does.

local counts = {}

for i = 1, n do
  local cap, rate, cost = args(i)
  local win = cap * 1000 / rate
  -- Members at or before now - W have left the window.
  redis.call('ZREMRANGEBYSCORE', KEYS[i], '-inf',
             string.format('%.17g', now - win))
  local count = redis.call('ZCARD', KEYS[i])
  counts[i] = count
  local wait = 0
  if cost > cap then
    wait = -1
  elseif count + cost > cap then
    -- Wait until the d-th oldest member leaves the window.
    local d = math.ceil(count + cost - cap)
    local oldest = redis.call('ZRANGE', KEYS[i], d - 1, d - 1, 'WITHSCORES')
    wait = math.ceil(tonumber(oldest[2]) + win - now)
    if wait < 1 then wait = 1 end
  end
  fold_wait(i, wait)
end

return commit(counts, function(i, cost, win)
  if cost > 0 then
    -- Members with this score are numbered 1, 2, ...: unique, because a
    -- trim removes every member of one score at once.
    local stamp = string.format('%d', now)
    local seq = redis.call('ZCOUNT', KEYS[i], now, now)
    for j = 1, cost do
      redis.call('ZADD', KEYS[i], now, stamp .. ':' .. (seq + j))
    end
    redis.call('PEXPIRE', KEYS[i], math.ceil(win) + 1000)
  end
end)
