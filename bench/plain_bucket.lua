-- plain_bucket.lua -- the design's plain single-bucket token bucket, the
-- yardstick for Redis time per decision (bench/run.py compares the
-- usec_per_call of shared/algo/tb_bucket.lua against this one).
--
-- One key, no injected clock, no route buckets, no all-or-nothing pass:
-- read, refill, deduct, write back. KEYS[1] the bucket hash; ARGV[1]
-- capacity (tokens), ARGV[2] rate (tokens per second), ARGV[3] cost.
-- Returns {allowed, floor(tokens left)}.
local cap = tonumber(ARGV[1])
local rate = tonumber(ARGV[2])
local cost = tonumber(ARGV[3])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local st = redis.call('HMGET', KEYS[1], 'tokens', 'ts')
local tokens = tonumber(st[1]) or cap
local ts = tonumber(st[2]) or now
local elapsed = now - ts
if elapsed < 0 then elapsed = 0 end
tokens = math.min(cap, tokens + elapsed * rate / 1000)
local allowed = 0
if tokens >= cost then
  tokens = tokens - cost
  allowed = 1
end
redis.call('HSET', KEYS[1], 'tokens', tokens, 'ts', now)
redis.call('PEXPIRE', KEYS[1], math.ceil(cap / rate * 1000) + 1000)
return {allowed, math.floor(tokens)}
