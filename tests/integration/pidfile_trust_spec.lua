-- Adopting a daemon from a pid file (issue 19; lua/mirza/daemon.lua's
-- _adopted_pid over src/pidfile.c's pid files): the pid a pid file
-- names is trusted, and so stopped by d:stop(), only when the file is ours
-- (a regular file, not a symlink, in a directory of ours nobody else can
-- write to) and the pid holds the daemon's port; a pid that names another
-- process, a stale pid, a directory writable by others or owned by
-- another user, a symlinked pid file: the daemon is adopted but not ours
-- to stop, with the reason, and nothing is signalled. Each case runs in a
-- child mirza with its own XDG_RUNTIME_DIR (the pid files' directory),
-- so changing that directory's mode touches no other test's.
local mirza = require "mirza"
local core = require "mirza.core"
local H = require "tests.helper"

local json = mirza.json
local NO_PID = "it reports no pid and no pid file of ours names it"

-- Run `code` (a mirza script) as a child with XDG_RUNTIME_DIR = xdg; its
-- last line of output, decoded from JSON.
local function child(xdg, code)
  local script, out = H.tmpname(".lua"), H.tmpname(".out")
  local f = assert(io.open(script, "w"))
  f:write(code)
  f:close()
  local ok = os.execute(("XDG_RUNTIME_DIR=%s %s %s >%s 2>&1"):format(H.q(xdg), H.q(H.mirza_bin), H.q(script),
    H.q(out)))
  local text = H.read_file(out)
  os.remove(script)
  os.remove(out)
  assert(ok, text)
  return json.decode(text:match("([^\n]+)\n?$"))
end

-- The child: prepare the pid file (`setup`, Lua run with PORT, PID and
-- DIR = the pid files' directory), then adopt the daemon on PORT and try
-- to stop it unless it is trusted.
local ADOPT = [[
local mirza = require "mirza"
local core = require "mirza.core"
local PORT, PID = %d, %d
local DIR = core.pidfile_path(PORT):match("^(.*)/[^/]*$")
%s
local d = mirza.daemon { preset = "mirza-sim", port = PORT, deadline = 10, grace = 1, progress = false }
assert(d:start())
local out = { adopted = d.adopted, pid = d.pid, read = core.pidfile_read(PORT) }
if not d.pid then out.ok, out.msg, out.code = d:stop() end
print(mirza.json.encode(out))
]]

local function dead_pid()
  local p = assert(io.popen("sh -c 'echo $$'"))
  local pid = tonumber(p:read("l"))
  p:close()
  return pid
end

local function sleeper()
  local sh = assert(io.popen("sleep 120 >/dev/null 2>&1 & echo $!"))
  local pid = tonumber(sh:read("l"))
  sh:close()
  H.track(pid, "sleep")
  finally(function()
    os.execute("kill " .. pid .. " 2>/dev/null")
    H.untrack(pid)
  end)
  return pid
end

describe("a pid file", function()
  local root
  setup(function()
    root = H.tmpname(".xdg")
    assert(os.execute("mkdir -p " .. H.q(root)))
  end)
  teardown(function()
    os.execute("rm -rf " .. H.q(root))
  end)

  local n = 0
  local function xdg()
    n = n + 1
    local d = ("%s/%d"):format(root, n)
    assert(os.execute("mkdir -m 700 " .. H.q(d)))
    return d
  end

  describe("when /health reports no pid", function()
    local sim
    setup(function()
      sim = H.start_sim { "--tok-rate", "0", "--ttft-ms", "0", "--route", '/health={"status":"ok"}' }
    end)
    teardown(function() sim.stop() end)

    local function adopt(pid, setup_code)
      return child(xdg(), ADOPT:format(sim.port, pid, setup_code or "assert(core.pidfile_write(PORT, PID))"))
    end

    local function refused(out, why)
      assert.is_true(out.adopted)
      assert.is_nil(out.pid)
      assert.same({ nil, "unowned" }, { out.ok, out.code })
      assert.truthy(out.msg:find(("not ours to stop (%s)"):format(why), 1, true), out.msg)
      assert.truthy(H.ps(sim.pid) and not H.ps(sim.pid).stat:find("Z"), "the daemon was signalled")
    end

    it("is trusted when it names the process holding the port, in a directory of ours", function()
    if H.cannot_tell_listener(pending) then return end
      local out = adopt(sim.pid)
      assert.same({ true, sim.pid, sim.pid }, { out.adopted, out.pid, out.read })
    end)

    it("is not when its pid is another process (alive, not holding the port): nothing is signalled", function()
    if H.cannot_tell_listener(pending) then return end
      local other = sleeper()
      refused(adopt(other), NO_PID)
      assert.truthy(core.pid_alive(other), "the unrelated process was signalled")
    end)

    it("is not when its pid is stale (no such process)", function()
      refused(adopt(dead_pid()), NO_PID)
    end)

    it("is not when its directory is writable by others, sticky bit or not, or by its group", function()
      for _, mode in ipairs { "0777", "1777", "0770" } do
        local out = adopt(sim.pid,
          ("assert(core.pidfile_write(PORT, PID)); os.execute('chmod %s ' .. DIR)"):format(mode))
        assert.is_nil(out.read, mode)
        refused(out, NO_PID)
      end
    end)

    it("is not when its directory belongs to another user", function()
      local id = assert(io.popen("id -u"))
      local uid = tonumber(id:read("l"))
      id:close()
      if uid ~= 0 then
        pending("needs root to give the directory away")
        return
      end
      local out = adopt(sim.pid, "assert(core.pidfile_write(PORT, PID)); assert(os.execute('chown 65534 ' .. DIR))")
      assert.is_nil(out.read)
      refused(out, NO_PID)
    end)

    it("is not when it is a symlink to a file naming the daemon", function()
      local target = H.tmpname(".pid")
      finally(function() os.remove(target) end)
      local f = assert(io.open(target, "w"))
      f:write(sim.pid, "\n")
      f:close()
      local out = adopt(sim.pid, ("os.execute('mkdir -p -m 700 ' .. DIR); assert(os.execute('ln -s %s ' .. "
        .. "core.pidfile_path(PORT)))"):format(target))
      assert.is_nil(out.read)
      refused(out, NO_PID)
    end)
  end)

  describe("when /health reports a pid that does not hold the port", function()
    it("it is trusted only if our pid file names it, in a directory nobody else can write to", function()
    if H.cannot_tell_listener(pending) then return end
      local other = sleeper()
      local sim = H.start_sim { "--tok-rate", "0", "--ttft-ms", "0", "--health-pid", tostring(other) }
      finally(sim.stop)
      local trusted = child(xdg(), ADOPT:format(sim.port, other, "assert(core.pidfile_write(PORT, PID))"))
      assert.same({ true, other, other }, { trusted.adopted, trusted.pid, trusted.read })
      local out = child(xdg(), ADOPT:format(sim.port, other,
        "assert(core.pidfile_write(PORT, PID)); os.execute('chmod 0777 ' .. DIR)"))
      assert.is_true(out.adopted)
      assert.is_nil(out.pid)
      assert.equal("unowned", out.code)
      assert.truthy(out.msg:find(("the pid it reports (%d) does not hold port %d"):format(other, sim.port), 1, true),
        out.msg)
      assert.truthy(core.pid_alive(other), "the unrelated process was signalled")
    end)
  end)
end)
