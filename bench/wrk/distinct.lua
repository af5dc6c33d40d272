-- distinct.lua -- a new X-API-Key on every request: every decision makes
-- a new bucket in Redis. Args: a run tag (keeps runs apart).
local here = debug.getinfo(1, "S").source:match("^@(.-)[^/]*$")
dofile(here .. "thread_ids.lua")

function init(args)
  tag = "wrk-" .. (args[1] or "run") .. "-" .. id .. "-"
  n = 0
end

function request()
  n = n + 1
  wrk.headers["X-API-Key"] = tag .. n
  return wrk.format()
end
