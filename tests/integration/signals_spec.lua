-- Signals while a script is blocked outside mirza's own waits (issue 8):
-- `mirza script.lua` as a real child process, blocked in io.read on a FIFO
-- nobody writes to, with a daemon started and a stream open. SIGINT or
-- SIGTERM must end it promptly with the normal cleanup: one line
-- "interrupted" on stderr, exit 130/143, the daemon stopped, its pid file
-- removed.
local mirza = require "mirza"
local core = require "mirza.core"
local H = require "tests.helper"

local SCRIPT = [[
local mirza = require "mirza"
local d = mirza.daemon { preset = "mirza-sim", port = %d, args = { "--tok-rate", "5" }, progress = false,
  deadline = 60, grace = 2 }
assert(d:start())
local s = mirza.open { url = d.chat_url, body = { model = "m", stream = true,
  messages = { { role = "user", content = "x" } }, mirza_sim = { answer_tokens = 100000 } } }
assert(s:next(30))
io.stdout:write("ready ", d.pid, "\n")
io.stdout:flush()
local line = io.read("l")
io.stdout:write("read returned ", tostring(line), "\n")
]]

-- Run the script with stdin on a FIFO opened read-write (so the open does
-- not block and no EOF ever comes). Returns {pid, wait(timeout), out(),
-- err(), kill(), cleanup()}.
local function spawn(port)
  local script, out, err, rcf, fifo = H.tmpname(".lua"), H.tmpname(".out"), H.tmpname(".err"), H.tmpname(".rc"),
    H.tmpname(".fifo")
  local f = assert(io.open(script, "w"))
  f:write(SCRIPT:format(port))
  f:close()
  assert(os.execute("mkfifo " .. H.q(fifo)))
  local cmd = ("%s %s <>%s >%s 2>%s & echo $!; wait $!; echo $? >%s"):format(H.q(H.mirza_bin), H.q(script),
    H.q(fifo), H.q(out), H.q(err), H.q(rcf))
  local sh = assert(io.popen(cmd))
  local run = { pid = tonumber(sh:read("l")) }
  local function slurp(p) return io.open(p) and H.read_file(p) or "" end
  function run.out() return slurp(out) end
  function run.err() return slurp(err) end
  function run.wait(timeout)
    local rc = H.wait_for(function() return tonumber(slurp(rcf)) end, timeout, 0.02)
    if rc and sh then
      sh:close()
      sh = nil
    end
    return rc
  end
  function run.cleanup()
    for _, p in ipairs { script, out, err, rcf, fifo } do os.remove(p) end
  end
  function run.kill()
    os.execute(("kill -KILL %d 2>/dev/null"):format(run.pid))
    run.wait(10)
  end
  return run
end

local function gone(pid)
  local p = H.ps(pid)
  return p == nil or (p.stat:find("Z") ~= nil and p.ppid == 1)
end

describe("a script blocked in io.read", function()
  after_each(function() collectgarbage("collect") end)

  for _, case in ipairs { { "INT", 130 }, { "TERM", 143 }, { "INT", 130, twice = true } } do
    local sig, want = case[1], case[2]
    it(("ends promptly on SIG%s%s with cleanup, exit %d, one line 'interrupted'"):format(sig,
      case.twice and " sent twice" or "", want), function()
      local port = H.free_port()
      local run = spawn(port)
      local ok, e = pcall(function()
        local dpid = tonumber(H.wait_for(function() return run.out():match("ready (%d+)") end, 60))
        assert(dpid, "the script did not get ready: " .. run.err())
        assert.equal(dpid, core.pidfile_read(port))
        local t0 = mirza.now()
        os.execute(("kill -%s %d"):format(sig, run.pid))
        if case.twice then os.execute(("kill -%s %d"):format(sig, run.pid)) end
        local rc = run.wait(15)
        assert(rc, "mirza did not exit after SIG" .. sig)
        assert.equal(want, rc)
        assert.is_true(mirza.now() - t0 < 10)
        assert.equal("interrupted\n", run.err())
        assert.is_nil(run.out():match("read returned"))
        assert.is_true(H.wait_for(function() return gone(dpid) end, 10), "the daemon is still running")
        assert.is_nil(core.pidfile_read(port))
      end)
      if not ok then run.kill() end
      run.cleanup()
      if not ok then error(e, 0) end
    end)
  end
end)

-- Stock lua5.4 with mirza.so: its own SIGINT handler only sets a hook that
-- raises "interrupted!" at the next Lua instruction; a wait inside mirza
-- must return to Lua for it (before, Ctrl-C was ignored until the wait
-- ended: never, on a stalled stream).
describe("stock lua5.4, Ctrl-C while mirza waits", function()
  local LUA = os.getenv("MIRZA_LUA") -- a path; else stock lua5.4 (with the ASan runtime first, if needed)
  local sim
  setup(function() sim = H.start_sim { "--tok-rate", "0", "--ttft-ms", "0", "--verbose" } end)
  teardown(function() sim.stop() end)

  local WAITS = {
    events = [[
local s <close> = mirza.open { url = URL, body = BODY }
for ev in s:events() do
  if ev.type == "text" then io.stdout:write("ready\n"); io.stdout:flush() end
end
io.stdout:write("loop ended\n")
]],
    next_in_coroutine = [[
local s <close> = mirza.open { url = URL, body = BODY }
local co = coroutine.wrap(function()
  while true do
    local ev = s:next()
    if ev and ev.type == "text" then io.stdout:write("ready\n"); io.stdout:flush() end
  end
end)
co()
]],
    sleep = [[
io.stdout:write("ready\n"); io.stdout:flush()
mirza.sleep(600)
io.stdout:write("slept\n")
]],
  }

  for name, body in pairs(WAITS) do
    it(("exits promptly with 'interrupted!' from a wait in %s, closing the stream"):format(name), function()
      local script, out, err, rcf = H.tmpname(".lua"), H.tmpname(".out"), H.tmpname(".err"), H.tmpname(".rc")
      local f = assert(io.open(script, "w"))
      f:write(("local mirza = require 'mirza'\nlocal URL = %q\nlocal BODY = %s\n"):format(sim.url,
        ("{ model = 'm', stream = true, messages = { { role = 'user', content = 'sig' } }, "
          .. "mirza_sim = { fault = 'stall-after=2', text = 'un deux trois quatre' } }")), body)
      f:close()
      local cmd = ("LUA_CPATH=%s %s %s >%s 2>%s & echo $!; wait $!; echo $? >%s"):format(
        H.q(H.build .. "/lua/?.so;;"), LUA and H.q(LUA) or H.stock_lua(), H.q(script), H.q(out), H.q(err), H.q(rcf))
      local sh = assert(io.popen(cmd))
      local pid = tonumber(sh:read("l"))
      local function slurp(p) return io.open(p) and H.read_file(p) or "" end
      local ok, e = pcall(function()
        assert(H.wait_for(function() return slurp(out):find("ready", 1, true) end, 20, 0.02),
          "the script did not get ready: " .. slurp(err))
        local closes = select(2, H.read_file(sim.log):gsub(" 499 ", ""))
        os.execute(("kill -INT %d"):format(pid))
        local rc = H.wait_for(function() return tonumber(slurp(rcf)) end, 5, 0.02)
        assert(rc, "lua5.4 did not exit after SIGINT: " .. slurp(err))
        assert.equal(1, rc)
        assert.matches("interrupted!", slurp(err), 1, true)
        assert.is_nil(slurp(out):find("loop ended", 1, true))
        if name ~= "sleep" then -- the simulator saw the client go (its log: status 499)
          assert.truthy(H.wait_for(function()
            return select(2, H.read_file(sim.log):gsub(" 499 ", "")) > closes
          end, 5, 0.02), "the stream was not closed")
        end
      end)
      if not ok then os.execute(("kill -KILL %d 2>/dev/null"):format(pid)) end
      H.wait_for(function() return tonumber(slurp(rcf)) end, 5, 0.02)
      sh:close()
      for _, p in ipairs { script, out, err, rcf } do os.remove(p) end
      if not ok then error(e, 0) end
    end)
  end
end)
