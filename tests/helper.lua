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
--- On macOS (no ldd) the runtime is Apple clang's dylib, named by otool -L
--- (@rpath/...: found in clang's resource directory) and inserted with
--- DYLD_INSERT_LIBRARIES.
---@return string command e.g. "lua5.4"
function H.stock_lua()
  if H._stock_lua then return H._stock_lua end
  local so = shell_quote(H.build .. "/lua/mirza.so")
  local p = assert(io.popen("ldd " .. so .. " 2>/dev/null || otool -L " .. so .. " 2>/dev/null"))
  local libs = p:read("a")
  p:close()
  local asan = libs:match("(/%S*libasan%.so[%.%d]*)")
  if asan then
    H._stock_lua = ("LD_PRELOAD=%s ASAN_OPTIONS=detect_leaks=0 lua5.4"):format(shell_quote(asan))
  elseif libs:find("libclang_rt.asan_osx_dynamic.dylib", 1, true) then
    p = assert(io.popen("clang -print-resource-dir 2>/dev/null"))
    local dylib = (p:read("l") or "") .. "/lib/darwin/libclang_rt.asan_osx_dynamic.dylib"
    p:close()
    H._stock_lua = ("DYLD_INSERT_LIBRARIES=%s ASAN_OPTIONS=detect_leaks=0 lua5.4"):format(shell_quote(dylib))
  else
    H._stock_lua = "lua5.4"
  end
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
  for path, failed in pairs { [output] = false, [require("mirza.batch_output").errors_path(output)] = true } do
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

-- A fresh directory for each case of the describe block that calls it:
-- made before each case, removed after it (the block's busted hooks are
-- given: they live in the spec's environment, not this module's).
-- Returns a table whose `path` is the current case's directory.
function H.dir_per_case(suffix, before_each, after_each)
  local d = {}
  before_each(function()
    d.path = H.tmpname(suffix)
    os.execute("mkdir -p " .. H.q(d.path))
  end)
  after_each(function()
    os.execute("rm -rf " .. H.q(d.path))
    collectgarbage("collect")
  end)
  return d
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

-- ---- the platform: /proc where Linux has it, ps and lsof elsewhere --------
--
-- macOS has no /proc. Each fact read from it here has a portable way that
-- gives the same answer (ps, lsof, the shell), taken when /proc cannot be
-- read; MIRZA_TEST_NO_PROC=1 takes it on Linux too, so that it is tested
-- here. Where there is none (a count of system calls or context switches),
-- the helper returns nil and says once on stderr what is not checked.

--- Whether /proc is read (Linux, MIRZA_TEST_NO_PROC unset).
H.has_proc = os.getenv("MIRZA_TEST_NO_PROC") ~= "1" and (function()
  local f = io.open("/proc/self/stat")
  if f then f:close() end
  return f ~= nil
end)()

-- The first line a shell command prints (nil when none).
local function first_line(cmd)
  local p = assert(io.popen(cmd))
  local line = p:read("l")
  p:close()
  return line
end

--- The shell words that bound a command to `seconds`: prefix it with these.
--- GNU timeout -k 2 (exit 124), else gtimeout, else perl's alarm (macOS;
--- exit 142): scripts/timeout, the one place that picks.
---@param seconds number
---@return string
function H.timeout_prefix(seconds)
  return shell_quote(H.source .. "/scripts/timeout") .. " " .. seconds
end

--- The permission bits of path in octal, as `stat -c %a` gives them on
--- Linux and `stat -f %Lp` on macOS ("700"): read from `ls -ld`, which both
--- print alike. nil when path is not there.
---@param path string
---@return string?
function H.file_mode(path)
  local line = first_line("ls -ld " .. shell_quote(path) .. " 2>/dev/null")
  local perms = line and line:match("^.(" .. ("[rwxsStT-]"):rep(9) .. ")")
  if not perms then return nil end
  local mode = 0
  for i = 1, 9 do
    local c = perms:sub(i, i)
    if c:match("[rwxst]") then mode = mode | (1 << (9 - i)) end -- s, t: the x bit is set too
    if c:match("[sS]") then mode = mode | (i == 3 and 0x800 or 0x400) end -- setuid, setgid
    if c:match("[tT]") then mode = mode | 0x200 end -- sticky
  end
  return ("%o"):format(mode)
end

--- Set path's modification and access times to `epoch` seconds, fractions
--- kept, as GNU `touch -d @EPOCH` does (macOS's touch takes no @): perl's
--- Time::HiRes::utime, on Debian and every Mac. Whether it was set.
---@param path string
---@param epoch number
---@return boolean
function H.set_mtime(path, epoch)
  return os.execute(("perl -MTime::HiRes=utime -e 'utime($ARGV[0], $ARGV[0], $ARGV[1]) or exit 1' %.9f %s")
    :format(epoch, shell_quote(path))) == true
end

--- The shell command that runs `cmd` (a shell command line) on a
--- pseudo-terminal, its output flushed as written: util-linux's
--- `script -qfec CMD /dev/null`, or BSD script(1) (macOS)
--- `script -qF /dev/null sh -c CMD`; nil and why where there is neither.
---@param cmd string
---@return string? command
---@return string? why
function H.in_terminal(cmd)
  if H._script == nil then
    H._script = os.execute("script -qec true /dev/null >/dev/null 2>&1") and "util-linux"
      or os.execute("script -q /dev/null true >/dev/null 2>&1") and "bsd" or false
  end
  if H._script == "util-linux" then return ("script -qfec %s /dev/null"):format(shell_quote(cmd)) end
  if H._script == "bsd" then return ("script -qF /dev/null sh -c %s"):format(shell_quote(cmd)) end
  return nil, "no script(1) to give the command a terminal"
end

--- The command line of a live process, nil when it is gone or a zombie.
---@param pid integer
---@return string?
local function cmdline(pid)
  pid = math.tointeger(pid)
  if not H.has_proc then
    local line = first_line("ps -ww -o stat=,args= -p " .. pid .. " 2>/dev/null")
    local stat, args = (line or ""):match("^%s*(%S+)%s+(.*)$")
    if not stat or stat:find("Z") then return nil end
    return args
  end
  local f = io.open("/proc/" .. pid .. "/stat")
  if not f then return nil end
  local stat = f:read("a")
  f:close()
  if not stat or stat:match("^%d+ %b() (%a)") == "Z" then return nil end
  f = io.open("/proc/" .. pid .. "/cmdline")
  if not f then return nil end
  local args = f:read("a") or ""
  f:close()
  return (args:gsub("%z", " "))
end
H.cmdline = cmdline

--- Whether a process is alive (a zombie is not).
function H.alive(pid) return cmdline(pid) ~= nil end

--- The argv of a live process, each argument whole (/proc/PID/cmdline);
--- nil where /proc is not: `ps` joins the arguments with blanks, so where
--- one argument ends cannot be told.
---@param pid integer
---@return string[]? argv
---@return string? why
function H.argv(pid)
  if not H.has_proc then return nil, "no /proc here: ps cannot tell where one argument ends" end
  local f = io.open(("/proc/%d/cmdline"):format(pid))
  if not f then return nil, "no such process" end
  local raw = f:read("a")
  f:close()
  local argv = {}
  for a in raw:gmatch("([^%z]*)%z") do argv[#argv + 1] = a end
  return argv
end

--- The files a process has open (its descriptors' paths): /proc/PID/fd, or
--- `lsof` (on every Mac; /tmp shows there as /private/tmp, so each such path
--- is given both ways). nil and why when neither can be read.
---@param pid integer
---@return table<string, true>? paths
---@return string? why
function H.open_paths(pid)
  local paths = {}
  if H.has_proc then
    local p = assert(io.popen("readlink /proc/" .. math.tointeger(pid) .. "/fd/* 2>/dev/null"))
    for path in p:lines() do paths[path] = true end
    p:close()
    return paths
  end
  local p = assert(io.popen(("command -v lsof >/dev/null && lsof -nP -a -p %d -Ffn 2>/dev/null;"
    .. " command -v lsof >/dev/null && echo lsof-ok"):format(math.tointeger(pid))))
  local fd, ok = nil, false
  for line in p:lines() do
    local kind, value = line:sub(1, 1), line:sub(2)
    if kind == "f" then fd = value:match("^%d+$")
    elseif kind == "n" and fd then
      paths[value] = true
      paths[value:match("^/private(/.*)$") or value] = true
    elseif line == "lsof-ok" then ok = true end
  end
  p:close()
  if not ok then return nil, "neither /proc nor lsof here" end
  return paths
end

--- The local addresses listening on a TCP port, as /proc/net/tcp writes
--- them (hex, "0100007F" for 127.0.0.1); without /proc, from `lsof` (an
--- IPv4 address converted, an IPv6 one as lsof prints it). nil and why when
--- neither can be read.
---@param port integer
---@return string[]? addresses
---@return string? why
function H.listen_addrs(port)
  local found = {}
  if H.has_proc then
    for _, file in ipairs { "/proc/net/tcp", "/proc/net/tcp6" } do
      local f = io.open(file)
      if f then
        for line in f:lines() do
          local addr, p, st = line:match("^%s*%d+:%s+(%x+):(%x+)%s+%x+:%x+%s+(%x+)")
          if addr and tonumber(p, 16) == port and st == "0A" then found[#found + 1] = addr end
        end
        f:close()
      end
    end
    return found
  end
  local p = assert(io.popen(("command -v lsof >/dev/null && lsof -nP -iTCP:%d -sTCP:LISTEN -Fn 2>/dev/null;"
    .. " command -v lsof >/dev/null && echo lsof-ok"):format(math.tointeger(port))))
  local ok = false
  for line in p:lines() do
    local a, b, c, d = line:match("^n(%d+)%.(%d+)%.(%d+)%.(%d+):%d+$")
    if a then found[#found + 1] = ("%02X%02X%02X%02X"):format(d, c, b, a)
    elseif line:match("^n%[") then found[#found + 1] = line:sub(2)
    elseif line == "lsof-ok" then ok = true end
  end
  p:close()
  if not ok then return nil, "neither /proc nor lsof here" end
  return found
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

--- The arguments of a mirza-sim that answers at once (no pacing, no prefill wait).
H.FAST = { "--tok-rate", "0", "--ttft-ms", "0" }

--- Start a mirza-sim that answers at once (H.FAST), with extra arguments.
---@param extra? string[]
function H.fast_sim(extra)
  local args = { table.unpack(H.FAST) }
  for _, a in ipairs(extra or {}) do args[#args + 1] = a end
  return H.start_sim(args)
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

--- The pid of this process (the mirza running busted): /proc/self, or the
--- parent of a shell it starts (io.popen's sh -c).
function H.self_pid()
  if H._self_pid then return H._self_pid end
  if H.has_proc then
    local f = assert(io.open("/proc/self/stat"))
    H._self_pid = tonumber(f:read("a"):match("^(%d+)"))
    f:close()
  else
    H._self_pid = tonumber(first_line("echo $PPID"))
  end
  return H._self_pid
end

local told = {}
--- A count of this process from a /proc/self file: `H.proc_count("io",
--- "syscw")` (write system calls), `H.proc_count("status",
--- "voluntary_ctxt_switches")` (waits that slept); nil where /proc is not
--- (macOS: no portable way to these counts), said once on stderr.
function H.proc_count(file, field)
  local f = H.has_proc and io.open("/proc/self/" .. file)
  if not f then
    if not told[field] then
      told[field] = true
      io.stderr:write("tests/helper.lua: no /proc/self/", file, " here: what rests on ", field,
        " is not checked\n")
    end
    return nil
  end
  local n = tonumber(f:read("a"):match(field .. ":%s*(%d+)"))
  f:close()
  return n
end

--- This process's resident memory in MiB: /proc/self/statm, or `ps -o rss=`
--- (KiB, on Linux and macOS alike).
function H.rss_mib()
  if H.has_proc then
    local f = assert(io.open("/proc/self/statm"))
    local pages = tonumber(f:read("a"):match("^%d+ (%d+)"))
    f:close()
    return pages * 4096 / 1048576
  end
  return assert(tonumber(first_line("ps -o rss= -p " .. H.self_pid()))) / 1024
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

--- Where this build cannot tell which process listens on a port
--- (mirza.platform.facts == "none": the portable build, as a system with
--- neither /proc nor libproc), marks the running test pending with the
--- reason and returns true: a test of trusting an adopted pid has nothing
--- to test there (daemon_spec pins the safe answer instead).
---@param pending function busted's, from the spec's environment
---@return boolean
function H.cannot_tell_listener(pending)
  if require("mirza").platform.facts ~= "none" then return false end
  pending("this build cannot tell which process listens on a port (mirza.platform.facts is \"none\")")
  return true
end

return H
