-- The daemon supervisor with real processes: mirza-sim started, adopted,
-- refused, stopped, crashed and restarted; `mirza` itself run as a
-- subprocess to check keep_alive across runs and that SIGINT/SIGKILL leave
-- neither an orphan daemon nor a zombie (checked with `ps`).
local mirza = require "mirza"
local core = require "mirza.core"
local H = require "tests.helper"

local FAST = { "--tok-rate", "0", "--ttft-ms", "0" }

local function sim(port, extra, opts)
  local o = { preset = "mirza-sim", port = port, args = extra or FAST, deadline = 60, grace = 2, progress = false }
  for k, v in pairs(opts or {}) do o[k] = v end
  return mirza.daemon(o)
end

local function chat(d, prompt)
  local s <close> = mirza.open { url = d.chat_url, body = H.chat_body(prompt or "x"), stall_timeout = 15 }
  return H.drain(s)
end

-- Gone for good: no process, or a zombie left to init after its parent died.
local function gone(pid)
  local p = H.ps(pid)
  return p == nil or (p.stat:find("Z") and p.ppid == 1)
end

describe("mirza.daemon with mirza-sim", function()
  after_each(function() collectgarbage("collect") end)

  it("starts a daemon with a load delay and waits until it is healthy", function()
    local port = H.free_port()
    local seen = 0
    local d <close> = sim(port, { "--load-delay-ms", "1200" }, { progress = function() seen = seen + 1 end })
    local t0 = mirza.now()
    assert.is_true(d:start())
    assert.is_true(mirza.now() - t0 >= 1.1)
    assert.is_true(seen > 0, "progress was reported while waiting")
    assert.is_false(d.adopted)
    assert.equal(H.self_pid(), H.ps(d.pid).ppid)
    assert.equal(d.pid, core.pidfile_read(port))
    assert.is_true(d:healthy())
    assert.equal("done", chat(d).last.type)
    assert.truthy(d:log_tail():find("listening", 1, true))
  end)

  it("waits through 503 'Loading model' (llama dialect)", function()
    local d <close> = sim(H.free_port(), { "--dialect", "llama", "--health-delay-ms", "800" }, { dialect = "llama" })
    local t0 = mirza.now()
    assert.is_true(d:start())
    assert.is_true(mirza.now() - t0 >= 0.7)
    local ok, info = d:healthy()
    assert.is_true(ok)
    assert.equal("ok", info.status)
  end)

  it("adopts a healthy daemon already on the port instead of starting one", function()
    if H.cannot_tell_listener(pending) then return end
    local id = "adopt-me-" .. H.self_pid() -- unique when specs run in parallel
    local s = H.start_sim { "--model-id", id }
    finally(s.stop)
    local d <close> = sim(s.port, nil, { model_id = id })
    assert.is_true(d:start())
    assert.is_true(d.adopted)
    assert.equal(s.pid, d.pid) -- from /health startup.pid
    assert.same({}, H.pids_with("--port " .. s.port)) -- no second process
    assert.same({ s.pid }, H.pids_with("--model-id " .. id))
    assert.is_true(d:start()) -- again: nothing changes
    assert.equal("done", chat(d).last.type)
  end)

  it("refuses a foreign model on the port (health .model and /v1/models)", function()
    local a = H.start_sim { "--model-id", "someone-else" }
    finally(a.stop) -- every finally of a test runs (tests/helper.lua)
    local b = H.start_sim { "--dialect", "llama", "--model-id", "other" }
    finally(b.stop)
    local ok, msg, code = sim(a.port, nil, { model_id = "mine" }):start()
    assert.is_nil(ok)
    assert.equal("foreign", code)
    assert.truthy(msg:find("serves model 'someone-else', expected 'mine'", 1, true), msg)
    ok, msg, code = sim(b.port, nil, { model_id = "mine", dialect = "llama" }):start()
    assert.is_nil(ok)
    assert.equal("foreign", code)
    assert.truthy(msg:find("'other'", 1, true), msg)
    assert.is_truthy(H.ps(a.pid) and H.ps(b.pid)) -- left alone
  end)

  it("fails at once when the daemon exits before becoming healthy, with status and log", function()
    local port = H.free_port()
    local d <close> = sim(port, { "--load-delay-ms", "300", "--fail-start", "cannot load model.gguf" })
    local t0 = mirza.now()
    local ok, msg, code = d:start()
    assert.is_nil(ok)
    assert.equal("exited", code)
    assert.truthy(msg:find("exited with status 1", 1, true), msg)
    assert.truthy(msg:find("error: cannot load model.gguf", 1, true), msg)
    assert.is_true(mirza.now() - t0 < 10, "well before the 60 s deadline")
    assert.is_nil(core.pidfile_read(port))
  end)

  it("reports a missing program as a spawn error", function()
    local d = mirza.daemon { preset = "custom", argv = { "/nonexistent/llm-server", "{port}" }, port = H.free_port() }
    local ok, msg, code = d:start()
    assert.is_nil(ok)
    assert.equal("spawn", code)
    assert.truthy(msg:find("/nonexistent/llm-server", 1, true), msg)
  end)

  it("gives up at the deadline when the daemon never becomes healthy, and stops it", function()
    local d <close> = sim(H.free_port(), { "--health-delay-ms", "600000" }, { deadline = 1.5 })
    local t0 = mirza.now()
    local ok, msg, code = d:start()
    local pid = d.pid
    assert.is_nil(ok)
    assert.equal("timeout", code)
    assert.truthy(msg:find("not healthy after 1.5 s", 1, true), msg)
    assert.truthy(msg:find("Loading model", 1, true), msg)
    assert.is_true(mirza.now() - t0 < 10)
    assert.is_nil(H.ps(pid))
  end)

  it("stops a started daemon (reaped, pid file removed), idempotently", function()
    local port = H.free_port()
    local d = sim(port)
    assert.is_true(d:start())
    local pid = d.pid
    assert.is_true(d:stop())
    assert.is_nil(H.ps(pid)) -- reaped by us: not even a zombie
    assert.is_nil(core.pidfile_read(port))
    assert.is_true(d:stop())
    local _, _, code = mirza.request { url = d.health_url, timeout = 1 }
    assert.equal("refused", code)
  end)

  it("a clean stop removes the log mirza named; a crash's log, and a log the script named, stay", function()
    -- stop() and close(): the daemon gone by the SIGTERM
    for _, how in ipairs { "stop", "close" } do
      local d = sim(H.free_port())
      assert.is_true(d:start())
      local log = d.log_path
      assert.truthy(io.open(log), log)
      d[how](d)
      assert.is_nil(io.open(log), how .. " left " .. log)
    end
    -- the script's own log
    local mine = H.tmpname(".log")
    finally(function() os.remove(mine) end)
    local d = sim(H.free_port(), nil, { log = mine })
    assert.is_true(d:start())
    d:close()
    assert.truthy(H.read_file(mine):find("listening", 1, true))
    -- a daemon that died on its own: its log is what tells why
    d = sim(H.free_port(), { "--crash-after", "1", "--tok-rate", "0", "--ttft-ms", "0" })
    assert.is_true(d:start())
    assert.equal("error", chat(d).last.type)
    assert(H.wait_for(function() return not d:running() end, 15), "the daemon did not die")
    d:close()
    assert.truthy(H.read_file(d.log_path):find("listening", 1, true))
    os.remove(d.log_path)
  end)

  it("stops an adopted daemon", function()
    if H.cannot_tell_listener(pending) then return end
    local s = H.start_sim {}
    finally(s.stop)
    local d = sim(s.port)
    assert.is_true(d:start())
    assert.is_true(d.adopted)
    assert.is_true(d:stop())
    assert.truthy(H.wait_for(function() return gone(s.pid) end, 15))
    assert.is_false(d.adopted)
  end)

  it("reports a crash mid-stream as 'exited' with the status, and restarts it", function()
    local d <close> = sim(H.free_port(), { "--crash-after", "2", "--tok-rate", "0", "--ttft-ms", "0" },
      { restart = { max = 2, backoff = 0.1 } })
    assert.is_true(d:start())
    assert.equal("done", chat(d).last.type)
    local r = chat(d) -- the daemon dies in the middle of this one
    assert.equal("error", r.last.type)
    assert.equal("closed", r.last.code) -- the daemon read the whole request: a FIN, not a reset
    assert.equal("connection closed mid-stream (transfer closed with outstanding read data remaining)", r.last.message)
    local ev = d:stream_error(r.last)
    assert.equal("exited", ev.code)
    assert.equal(3, ev.exit_code)
    assert.truthy(ev.message:find("exited with status 3", 1, true), ev.message)
    assert.equal(r.last, ev.cause)
    local old = d.pid
    assert.is_true(d:ensure())
    assert.equal(1, d.restarts)
    assert.are_not.equal(old, d.pid)
    assert.equal("done", chat(d).last.type) -- the next request works
    assert.is_true(d:ensure()) -- healthy: nothing to do
    assert.equal(1, d.restarts)
  end)

  it("--crash-after counts the chat requests served, not the ones refused", function()
    local d <close> = sim(H.free_port(), { "--crash-after", "2", "--tok-rate", "0", "--ttft-ms", "0" })
    assert.is_true(d:start())
    -- refused with a 400: not the first served request
    local bad <close> = mirza.open { url = d.chat_url, body = { model = "x", stream = true, messages = {} } }
    assert.equal(400, bad:next().status)
    assert.equal("done", chat(d).last.type) -- the first served one
    local r = chat(d)                        -- the second: the crash
    assert.equal("closed", r.last.code)
    assert.equal("exited", d:stream_error(r.last).code)
  end)

  it("without a restart policy, ensure() reports the death", function()
    local d <close> = sim(H.free_port(), { "--crash-after", "1", "--tok-rate", "0", "--ttft-ms", "0" })
    assert.is_true(d:start())
    local r = chat(d)
    assert.equal("exited", d:stream_error(r.last).code)
    local ok, msg, code = d:ensure()
    assert.is_nil(ok)
    assert.equal("exited", code)
    assert.truthy(msg:find("status 3", 1, true), msg)
  end)

  it("does not trust a /health pid that does not hold the port: not ours to stop", function()
    if H.cannot_tell_listener(pending) then return end
    local sh = assert(io.popen("sleep 120 >/dev/null 2>&1 & echo $!"))
    local victim = tonumber(sh:read("l"))
    sh:close()
    finally(function() os.execute("kill " .. victim .. " 2>/dev/null") end)
    local s = H.start_sim { "--health-pid", tostring(victim) }
    finally(s.stop)
    local d = sim(s.port)
    assert.is_true(d:start())
    assert.is_true(d.adopted)
    assert.is_nil(d.pid)
    local ok, msg, code = d:stop()
    assert.is_nil(ok)
    assert.equal("unowned", code)
    assert.truthy(msg:find(("the pid it reports (%d) does not hold port %d"):format(victim, s.port), 1, true), msg)
    assert.truthy(core.pid_alive(victim), "the unrelated process was not signalled")
    assert.truthy(H.ps(s.pid) and not H.ps(s.pid).stat:find("Z"), "the daemon was left running")
    assert.is_true(d.adopted)
  end)

  it("never adopts a pid for a host that is not this machine", function()
    local daemon = require "mirza.daemon"
    local s = H.start_sim {}
    finally(s.stop)
    local real = daemon.is_loopback
    daemon.is_loopback = function() return false end -- 127.0.0.1 now looks remote
    finally(function() daemon.is_loopback = real end)
    local d = sim(s.port)
    assert.is_true(d:start())
    assert.is_true(d.adopted)
    assert.is_nil(d.pid)
    local ok, msg, code = d:stop()
    assert.is_nil(ok)
    assert.equal("unowned", code)
    assert.truthy(msg:find("not ours to stop (the host is not this machine)", 1, true), msg)
    assert.truthy(H.ps(s.pid) and not H.ps(s.pid).stat:find("Z"), "left running")
  end)

  it("where the build cannot tell who holds the port, an adopted daemon is left running, saying why", function()
    if require("mirza").platform.facts ~= "none" then
      pending("this build can tell which process listens on a port")
      return
    end
    local s = H.start_sim {}
    finally(s.stop)
    local d = sim(s.port)
    assert.is_true(d:start())
    assert.is_true(d.adopted)
    assert.is_nil(d.pid)
    local ok, msg, code = d:stop()
    assert.is_nil(ok)
    assert.equal("unowned", code)
    assert.truthy(msg:find(("the pid it reports (%d) cannot be checked: this build of mirza cannot tell which "
      .. "process listens on a port"):format(s.pid), 1, true), msg)
    assert.truthy(H.ps(s.pid) and not H.ps(s.pid).stat:find("Z"), "the daemon was left running")
  end)

  it("adopts the /health pid when it holds the listening socket", function()
    if H.cannot_tell_listener(pending) then return end
    local s = H.start_sim {}
    finally(s.stop)
    assert.is_true(core.pid_listens(s.pid, s.port))
    assert.is_false(core.pid_listens(H.self_pid(), s.port))
    local d = sim(s.port)
    assert.is_true(d:start())
    assert.equal(s.pid, d.pid)
  end)

  it("leaves other stream errors alone", function()
    local d <close> = sim(H.free_port())
    assert.is_true(d:start())
    local ev = { type = "error", code = "http", message = "HTTP 400" }
    assert.equal(ev, d:stream_error(ev))
  end)
end)

describe("mirza.spawn as users try it", function()
  it("starts a program from a table (mirza.core.spawn), and a task from a function", function()
    local p <close> = assert(mirza.spawn { argv = { "sleep", "30" } })
    assert.equal("mirza.Process", getmetatable(p).__name)
    local pid = p:pid()
    assert.is_true((p:poll())) -- still running
    p:close()
    assert.truthy(H.wait_for(function() return not core.pid_alive(pid) or H.ps(pid) == nil end, 15))
    local p2, msg, code = mirza.spawn { argv = { "/nonexistent/prog" } }
    assert.same({ nil, "spawn" }, { p2, code })
    assert.truthy(msg:find("/nonexistent/prog", 1, true), msg)
    local t = mirza.spawn(function(a, b) return a + b end, 40, 2)
    assert.same({ true, 42 }, { t:join() })
  end)
end)

describe("mirza.daemon across mirza runs", function()
  after_each(function() collectgarbage("collect") end)

  local function script(port, opts, tail)
    return ([[
local mirza = require "mirza"
local d = mirza.daemon { preset = "mirza-sim", port = %d, grace = 2, %s }
assert(d:start())
print(("pid=%%d adopted=%%s"):format(d.pid or 0, tostring(d.adopted)))
io.stdout:flush()
%s
]]):format(port, opts or "", tail or "")
  end

  it("keep_alive leaves the daemon for the next run, which adopts and stops it", function()
    if H.cannot_tell_listener(pending) then return end
    local port = H.free_port()
    local run1 = H.spawn_mirza(script(port, 'keep_alive = true, dialect = "llama", args = { "--dialect", "llama" }'))
    assert.equal(0, run1.wait(60), run1.output())
    local pid = tonumber(run1.output():match("pid=(%d+) adopted=false"))
    assert.is_number(pid, run1.output())
    assert.truthy(H.ps(pid) and not H.ps(pid).stat:find("Z"), "still running after run 1")
    assert.equal(pid, core.pidfile_read(port))
    -- run 2 (llama dialect: the pid comes from the pid file) adopts and stops it
    local run2 = H.spawn_mirza(script(port, 'dialect = "llama"', "assert(d:stop())"))
    assert.equal(0, run2.wait(60), run2.output())
    assert.truthy(run2.output():find(("pid=%d adopted=true"):format(pid), 1, true), run2.output())
    assert.truthy(H.wait_for(function() return gone(pid) end, 15))
    assert.is_nil(core.pidfile_read(port))
  end)

  it("a started daemon survives its supervisor becoming garbage, until the state ends", function()
    local port = H.free_port()
    local run = H.spawn_mirza(([[
local mirza = require "mirza"
local core = require "mirza.core"
local d = mirza.daemon { preset = "mirza-sim", port = %d, grace = 2, progress = false }
assert(d:start())
local pid = d.pid
d = nil
collectgarbage("collect") collectgarbage("collect")
local body = mirza.request { url = "http://127.0.0.1:%d/health", timeout = 2, deadline = 5 }
print(("pid=%%d alive=%%s healthy=%%s pidfile=%%s"):format(pid, tostring(core.pid_alive(pid)), tostring(body ~= nil),
  tostring(core.pidfile_read(%d) == pid)))
]]):format(port, port, port))
    assert.equal(0, run.wait(60), run.output())
    local pid = tonumber(run.output():match("pid=(%d+) alive=true healthy=true pidfile=true"))
    assert.is_number(pid, run.output())
    assert.truthy(H.wait_for(function() return gone(pid) end, 15), "stopped at the end of the state")
    assert.is_nil(core.pidfile_read(port))
  end)

  it("stops what it started when the script ends or fails", function()
    for _, tail in ipairs { "", "error('boom')" } do
      local port = H.free_port()
      local run = H.spawn_mirza(script(port, nil, tail))
      local rc = run.wait(60)
      local pid = tonumber(run.output():match("pid=(%d+)"))
      assert.is_number(pid, run.output())
      assert.equal(tail == "" and 0 or 1, rc, run.output())
      assert.truthy(H.wait_for(function() return gone(pid) end, 15))
      assert.is_nil(core.pidfile_read(port))
    end
  end)

  for _, case in ipairs { { "INT", 130 }, { "TERM", 143 } } do
    it("SIG" .. case[1] .. " of mirza stops the daemon: no orphan, no zombie", function()
      local port = H.free_port()
      local run = H.spawn_mirza(script(port, nil, "mirza.sleep(120)"))
      local pid = tonumber(run.expect("pid=(%d+)"))
      assert.is_number(pid, run.output())
      assert.equal(run.pid, H.ps(pid).ppid)
      run.signal(case[1])
      assert.equal(case[2], run.wait(30), run.output())
      assert.is_nil(H.ps(pid), "reaped by mirza before it exited")
      assert.same({}, H.pids_with("--port " .. port))
      assert.is_nil(core.pidfile_read(port))
    end)
  end

  it("SIGKILL of mirza takes the daemon down too (" .. require("mirza").platform.parent_death .. ")", function()
    local port = H.free_port()
    local run = H.spawn_mirza(script(port, nil, "mirza.sleep(120)"))
    local pid = tonumber(run.expect("pid=(%d+)"))
    assert.is_number(pid, run.output())
    run.signal("KILL")
    assert.equal(137, run.wait(30))
    assert.truthy(H.wait_for(function() return gone(pid) end, 15), "daemon outlived mirza")
    assert.same({}, H.pids_with("--port " .. port))
    assert.is_nil(H.ps(run.pid))
    core.pidfile_remove(port) -- stale: nobody could remove it
  end)
end)
