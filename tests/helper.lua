--- Shared helpers for the busted specs: paths, fixtures, and starting a
--- real mirza-sim process on a free loopback port.
local H = {}

H.source = os.getenv("MIRZA_SOURCE_DIR") or "."
H.build = os.getenv("MIRZA_BUILD_DIR") or (H.source .. "/build")
H.sim_bin = os.getenv("MIRZA_SIM")
if not H.sim_bin or H.sim_bin == "" then H.sim_bin = H.build .. "/mirza-sim" end
H.mirza_bin = os.getenv("MIRZA_BIN") or (H.build .. "/mirza")
H.fixtures = os.getenv("MIRZA_FIXTURES") or (H.source .. "/tests/fixtures")
H.traces = H.fixtures .. "/traces"

local function shell_quote(s)
  return "'" .. tostring(s):gsub("'", "'\\''") .. "'"
end
H.q = shell_quote

--- What fn wrote into a file handle it is given (a temporary file).
---@param fn fun(f: file*)
---@return string text
function H.written(fn)
  local f = assert(io.tmpfile())
  fn(f)
  f:seek("set")
  local s = f:read("a")
  f:close()
  return s
end

--- The shell words that run stock lua5.4 on this build's mirza.so: a
--- sanitizer build's mirza.so needs the ASan runtime loaded first (and its
--- leak report off: lua5.4 itself is not instrumented).
---@return string command e.g. "lua5.4"
function H.stock_lua()
  if H._stock_lua then return H._stock_lua end
  local p = assert(io.popen("ldd " .. shell_quote(H.build .. "/lua/mirza.so") .. " 2>/dev/null"))
  local asan = p:read("a"):match("(/%S*libasan%.so[%.%d]*)")
  p:close()
  H._stock_lua = asan and ("LD_PRELOAD=%s ASAN_OPTIONS=detect_leaks=0 lua5.4"):format(shell_quote(asan)) or "lua5.4"
  return H._stock_lua
end

function H.read_file(path)
  local f = assert(io.open(path, "rb"))
  local s = f:read("a")
  f:close()
  return s
end

--- The records of a batch run by custom_id, and how many each file holds:
--- OUTPUT's answers and the failures in the error file beside it
--- (mirza.batch.errors_path; a file that does not exist holds none), each
--- checked to be in its place and never recorded twice.
---@param output string
---@return table<string, table> by
---@return integer answers
---@return integer failures
function H.batch_records(output)
  local json, by, n = require("mirza").json, {}, { [false] = 0, [true] = 0 }
  for path, failed in pairs { [output] = false, [require("mirza.batch").errors_path(output)] = true } do
    local f = io.open(path)
    for line in f and f:lines() or function() end do
      local r = assert(json.decode(line))
      assert(not by[r.custom_id], tostring(r.custom_id) .. ": recorded twice")
      assert(failed == (r.error ~= json.null), r.custom_id .. (failed and ": an answer in the error file"
        or ": a failure in OUTPUT"))
      by[r.custom_id], n[failed] = r, n[failed] + 1
    end
    if f then f:close() end
  end
  return by, n[false], n[true]
end

-- Write text to path (created or truncated), byte for byte.
function H.write_file(path, text)
  local f = assert(io.open(path, "wb"))
  f:write(text)
  f:close()
end

-- The names in dir, dotfiles too (`ls -A`, in its order).
function H.listing(dir)
  local p = assert(io.popen("ls -A " .. H.q(dir)))
  local names = {}
  for name in p:lines() do names[#names + 1] = name end
  p:close()
  return names
end

function H.tmpname(suffix)
  local n = os.tmpname()
  os.remove(n)
  return n .. (suffix or "")
end

local mirza = require "mirza"

-- ---- cleanups and processes: one list per test, one registry per file -----
--
-- busted's `finally(fn)` keeps only the last function a test registers, so a
-- test that registered two lost the first (a mirza-sim left running after
-- every suite run). Requiring this file makes `finally` accumulate: every
-- function a test registers runs after it, the last registered first, each
-- even when an earlier one raised; the first error is raised after all ran.
-- Every process the helpers below start is recorded; one still alive when
-- its spec file ends is killed then (and named on stderr, so the test that
-- forgot it can be fixed). The state lives in the Lua registry: busted
-- reloads this file per spec file (insulation), the hooks are installed once.
local state = debug.getregistry()["mirza.tests.helper"]
if not state then
  state = { procs = {} }
  debug.getregistry()["mirza.tests.helper"] = state
end

--- Run every function of `list`, the last first, each in a pcall; raise the
--- first error once all ran.
local function run_cleanups(list)
  local first
  for i = #list, 1, -1 do
    local ok, err = pcall(list[i])
    if not ok and first == nil then first = err end
  end
  if first ~= nil then error(first, 0) end
end
H.run_cleanups = run_cleanups

--- The command line of a live process, nil when it is gone or a zombie.
local function cmdline(pid)
  local f = io.open("/proc/" .. math.tointeger(pid) .. "/stat")
  if not f then return nil end
  local stat = f:read("a")
  f:close()
  if not stat or stat:match("^%d+ %b() (%a)") == "Z" then return nil end
  f = io.open("/proc/" .. math.tointeger(pid) .. "/cmdline")
  if not f then return nil end
  local args = f:read("a") or ""
  f:close()
  return (args:gsub("%z", " "))
end

--- Record a process a test started (`what`: its executable, checked before
--- it is killed, so a reused pid is never signalled); killed at the end of
--- the spec file if still alive. H.start_sim and H.spawn_mirza call it.
---@param pid integer
---@param what string
function H.track(pid, what)
  state.procs[pid] = { what = what, test = state.test }
end

--- Forget a process (it was stopped or reaped).
function H.untrack(pid)
  if pid then state.procs[pid] = nil end
end

--- Kill every recorded process still alive: TERM, then KILL after 5 s.
--- Returns the command lines of those it found.
function H.kill_tracked()
  local left = {}
  for pid, p in pairs(state.procs) do
    local args = cmdline(pid)
    if args and args:find(p.what, 1, true) then
      left[#left + 1] = ("pid %d (%s), started by \"%s\": %s"):format(pid, p.what:match("[^/]*$"),
        tostring(p.test), args)
      os.execute("kill " .. pid .. " 2>/dev/null")
      local t0 = mirza.now()
      while cmdline(pid) and mirza.now() - t0 < 5 do mirza.sleep(0.02) end
      if cmdline(pid) then os.execute("kill -9 " .. pid .. " 2>/dev/null") end
    end
    state.procs[pid] = nil
  end
  table.sort(left)
  return left
end

local ok_busted, busted = pcall(require, "busted")
if ok_busted and type(busted) == "table" and type(busted.subscribe) == "function" and not state.hooked then
  state.hooked = true
  local function on_test_start(element)
    state.test = element.name
    local env = element.env
    local register = env and env.finally
    if register then
      local list = {}
      env.finally = function(fn)
        assert(type(fn) == "function" or (getmetatable(fn) or {}).__call, "finally: a function is needed")
        if #list == 0 then register(function() run_cleanups(list) end) end
        list[#list + 1] = fn
      end
    end
    return nil, true
  end
  local function on_file_end()
    for _, line in ipairs(H.kill_tracked()) do
      io.stderr:write("tests/helper.lua: killed a process its test left running: ", line, "\n")
    end
    return nil, true
  end
  busted.subscribe({ "test", "start" }, on_test_start, { priority = 1 })
  busted.subscribe({ "file", "end" }, on_file_end, { priority = 1 })
end

--- Start mirza-sim with extra arguments; returns {url, base, port, pid, log, stop}.
---@param args? string[]
function H.start_sim(args)
  local port_file, log = H.tmpname(".port"), H.tmpname(".log")
  local argv = { shell_quote(H.sim_bin), "--port", "0", "--port-file", shell_quote(port_file) }
  for _, a in ipairs(args or {}) do argv[#argv + 1] = shell_quote(a) end
  local cmd = table.concat(argv, " ") .. " >" .. shell_quote(log) .. " 2>&1 & echo $!"
  local p = assert(io.popen(cmd))
  local pid = tonumber(p:read("l"))
  p:close()
  H.track(pid, H.sim_bin)
  local port
  local t0 = mirza.now()
  while not port and mirza.now() - t0 < 10 do
    local f = io.open(port_file)
    if f then
      port = tonumber(f:read("a"))
      f:close()
    end
    if not port then mirza.sleep(0.01) end
  end
  os.remove(port_file)
  assert(port, "mirza-sim did not start: " .. (io.open(log) and H.read_file(log) or "?"))
  local sim = { port = port, pid = pid, log = log }
  sim.base = ("http://127.0.0.1:%d"):format(port)
  sim.url = sim.base .. "/v1/chat/completions"
  function sim.stop()
    if sim.pid then
      os.execute("kill " .. sim.pid .. " 2>/dev/null; wait " .. sim.pid .. " 2>/dev/null")
      H.untrack(sim.pid)
      sim.pid = nil
    end
    os.remove(log)
  end
  return sim
end

--- A chat request body.
function H.chat_body(prompt, extra)
  local body = { model = "mirza-sim", stream = true, messages = { { role = "user", content = prompt } } }
  for k, v in pairs(extra or {}) do body[k] = v end
  return body
end

--- Collect every event of a stream into {events, text, think, last}.
--- Bounded: a stream that never ends fails after `max_events` (default
--- 1,000,000) instead of hanging until the runner's timeout.
function H.drain(s, timeout, max_events)
  local r = { events = {}, text = {}, think = {} }
  for _ = 1, max_events or 1000000 do
    local ev, msg = s:next(timeout)
    if not ev then
      assert(msg == nil, msg)
      break
    end
    r.events[#r.events + 1] = ev
    if ev.type == "text" then r.text[#r.text + 1] = ev.text end
    if ev.type == "think" then r.think[#r.think + 1] = ev.text end
    r.last = ev
  end
  assert(r.last == nil or r.last.type == "done" or r.last.type == "error",
    "H.drain: no final event after " .. (max_events or 1000000) .. " events")
  r.text, r.think = table.concat(r.text), table.concat(r.think)
  return r
end

-- ---- processes (daemon specs) ---------------------------------------------

--- The pid of this process (the mirza running busted).
function H.self_pid()
  local f = assert(io.open("/proc/self/stat"))
  local pid = tonumber(f:read("a"):match("^(%d+)"))
  f:close()
  return pid
end

--- A count of this process from a /proc/self file: `H.proc_count("io",
--- "syscw")` (write system calls), `H.proc_count("status",
--- "voluntary_ctxt_switches")` (waits that slept); nil where /proc is not.
function H.proc_count(file, field)
  local f = io.open("/proc/self/" .. file)
  if not f then return nil end
  local n = tonumber(f:read("a"):match(field .. ":%s*(%d+)"))
  f:close()
  return n
end

--- Poll fn every `step` seconds until it returns a truthy value (returned)
--- or `timeout` seconds pass (nil).
function H.wait_for(fn, timeout, step)
  local t0 = mirza.now()
  repeat
    local v = fn()
    if v then return v end
    mirza.sleep(step or 0.05)
  until mirza.now() - t0 > (timeout or 10)
  return fn()
end

--- `ps` view of one pid: {stat = "S", ppid = n}, or nil when it is gone.
function H.ps(pid)
  local p = assert(io.popen("ps -o stat=,ppid= -p " .. math.tointeger(pid) .. " 2>/dev/null"))
  local line = p:read("l")
  p:close()
  local stat, ppid = (line or ""):match("^%s*(%S+)%s+(%d+)")
  return stat and { stat = stat, ppid = tonumber(ppid) } or nil
end

--- Pids of live (non-zombie) processes whose command line contains text.
function H.pids_with(text)
  local p = assert(io.popen("ps -eo pid=,stat=,args="))
  local pids = {}
  for line in p:lines() do
    local pid, stat, args = line:match("^%s*(%d+)%s+(%S+)%s+(.*)$")
    if pid and not stat:find("Z") and args:find(text, 1, true) and not args:find("ps -eo", 1, true) then
      pids[#pids + 1] = tonumber(pid)
    end
  end
  p:close()
  return pids
end

local port_cursor
--- A loopback port where nothing listens (probed: connection refused),
--- below the ephemeral range, spread by pid so parallel runs rarely meet.
function H.free_port()
  port_cursor = port_cursor or 20000 + (H.self_pid() * 37) % 12000
  for _ = 1, 500 do
    local port = port_cursor
    port_cursor = port_cursor < 32000 and port_cursor + 1 or 20000
    local _, _, code = mirza.request { url = ("http://127.0.0.1:%d/"):format(port), timeout = 0.5, deadline = 1 }
    if code == "refused" then return port end
  end
  error("no free port found")
end

--- Run `mirza` on a Lua chunk in the background (its own process, its
--- output in a file). Returns {pid, out, rc(), wait(timeout) -> exit code,
--- signal(name), output()}.
function H.spawn_mirza(code)
  local script, out, rcf = H.tmpname(".lua"), H.tmpname(".out"), H.tmpname(".rc")
  local f = assert(io.open(script, "w"))
  f:write(code)
  f:close()
  local cmd = ("%s %s >%s 2>&1 & echo $!; wait $!; echo $? >%s"):format(shell_quote(H.mirza_bin),
    shell_quote(script), shell_quote(out), shell_quote(rcf))
  local sh = assert(io.popen(cmd))
  local run = { pid = tonumber(sh:read("l")), out = out }
  H.track(run.pid, H.mirza_bin)
  function run.output()
    return io.open(out) and H.read_file(out) or ""
  end
  function run.rc()
    local rf = io.open(rcf)
    local rc = rf and tonumber(rf:read("a"))
    if rf then rf:close() end
    return rc
  end
  function run.wait(timeout)
    local rc = H.wait_for(run.rc, timeout or 30)
    if rc and sh then
      H.untrack(run.pid)
      sh:close()
      sh = nil
      os.remove(script)
      os.remove(rcf)
    end
    return rc
  end
  function run.signal(name)
    os.execute(("kill -%s %d 2>/dev/null"):format(name, run.pid))
  end
  --- Wait until the script printed a line matching pattern; its captures.
  function run.expect(pattern, timeout)
    return H.wait_for(function() return run.output():match(pattern) end, timeout or 30)
  end
  return run
end

return H
