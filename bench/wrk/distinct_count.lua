-- distinct_count.lua -- distinct.lua, bounded by a count: each thread
-- stops after args[2] responses (wrk's -d still bounds the time). wrk
-- decides once, before init(), whether responses go to Lua, so this lives
-- apart from distinct.lua, which stays free of a response() callback.
local threads = 0

function setup(thread)
  threads = threads + 1
  thread:set("id", threads)
end

function init(args)
  tag = "wrk-" .. (args[1] or "run") .. "-" .. id .. "-"
  n = 0
  seen = 0
  stop_after = tonumber(args[2] or "50000")
end

function request()
  n = n + 1
  wrk.headers["X-API-Key"] = tag .. n
  return wrk.format()
end

function response(status, headers, body)
  seen = seen + 1
  if seen >= stop_after then
    wrk.thread:stop()
  end
end
