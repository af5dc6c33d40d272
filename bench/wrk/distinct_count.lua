-- distinct_count.lua -- distinct.lua, bounded by a count: each thread
-- stops after args[2] responses (wrk's -d still bounds the time). wrk
-- decides once, before init(), whether responses go to Lua, so this lives
-- apart from distinct.lua, which stays free of a response() callback.
local here = debug.getinfo(1, "S").source:match("^@(.-)[^/]*$")
dofile(here .. "distinct.lua")

local distinct_init = init

function init(args)
  distinct_init(args)
  seen = 0
  stop_after = tonumber(args[2] or "50000")
end

function response(status, headers, body)
  seen = seen + 1
  if seen >= stop_after then
    wrk.thread:stop()
  end
end
