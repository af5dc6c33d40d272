-- keys32.lua -- 32 X-API-Keys in all, each request takes the next key of
-- its thread's share, round robin.
--
-- The requests are built once in init(); request() only hands out the
-- next one, so every variant of a run (bare Apache included) pays the
-- same small Lua cost in wrk. Keys are "wrk-<tag>-<k>", k = 1..32, split
-- evenly over the threads (2 threads: 16 keys each). Args: a tag (the
-- variant, so its buckets stay hot across rounds), the number of threads.
local threads = 0

function setup(thread)
  threads = threads + 1
  thread:set("id", threads)
end

function init(args)
  local tag = args[1] or "run"
  local nthreads = tonumber(args[2]) or 1
  local per = math.max(1, math.floor(32 / nthreads))
  reqs = {}
  for i = 1, per do
    local k = (id - 1) * per + i
    wrk.headers["X-API-Key"] = "wrk-" .. tag .. "-" .. k
    reqs[i] = wrk.format()
  end
  n = 0
  count = per
end

function request()
  n = n % count + 1
  return reqs[n]
end
