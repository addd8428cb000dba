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
