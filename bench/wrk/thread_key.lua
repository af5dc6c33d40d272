-- thread_key.lua -- one X-API-Key per wrk thread, sent on every request.
--
-- wrk 4.1 has no per-connection hook, so "one key per connection" is one
-- key per thread: each bucket is hot and already exists. The header is set
-- in init(), so wrk still sends one prebuilt request (no request()
-- function): the same client cost as a plain run. Args: a run tag.
local here = debug.getinfo(1, "S").source:match("^@(.-)[^/]*$")
dofile(here .. "thread_ids.lua")

function init(args)
  local tag = args[1] or "run"
  wrk.headers["X-API-Key"] = "wrk-" .. tag .. "-" .. id
end
