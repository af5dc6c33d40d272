-- thread_ids.lua -- numbers wrk's threads: each thread's script sees its
-- number, 1..N, in the global `id`. The other scripts here load it with
-- dofile(): wrk runs each script in its own Lua state per thread, where
-- `require` does not search this directory.
local threads = 0

function setup(thread)
  threads = threads + 1
  thread:set("id", threads)
end
