-- What a script wrote survives Ctrl-C (issue 36 item 9): `mirza script.lua`
-- as a real child process writes to an io.open file (buffered, never
-- flushed) and to stdout through a pipe (buffered) that nobody reads yet,
-- so that its write blocks; the first SIGINT comes while it is blocked (a
-- write restarts: stdio would drop its buffer on EINTR), the script
-- catches it and writes the rest; the second SIGINT, while it waits in a
-- pcall, ends it with exit 130, after flushing the file and the pipe.
local H = require "tests.helper"

local LINES = 100000 -- 800 KB to the pipe: far more than a pipe holds

local SCRIPT = [[
local mirza = require "mirza"
local f = assert(io.open(%q, "w"))
for i = 1, 100 do f:write(("file line %%d\n"):format(i)) end -- under 4 KB: all in the file's buffer
io.stdout:setvbuf("full")
local n = 0
local function write_all()
  while n < %d do
    io.stdout:write(("%%07d\n"):format(n + 1))
    n = n + 1
  end
end
io.stderr:write("writing\n")
while n < %d do
  local ok, err = pcall(write_all)
  if not ok then io.stderr:write("caught ", tostring(err), "\n") end
end
io.stderr:write("written ", n, "\n")
while true do pcall(mirza.sleep, 600) end
]]

-- Whether pid is blocked writing to a pipe, where the system says (Linux's
-- /proc/<pid>/wchan); true where it cannot tell.
local function blocked_writing(pid)
  local f = io.open(("/proc/%d/wchan"):format(pid))
  if not f then return true end
  local w = f:read("a") or ""
  f:close()
  return w:find("pipe", 1, true) ~= nil or w == ""
end

describe("Ctrl-C twice while a script writes to a file and a pipe", function()
  it("loses none of the bytes it wrote: the first restarts the write, the second flushes", function()
    local script, file, out, err, gate, pidf, rcf, readf = H.tmpname(".lua"), H.tmpname(".file"),
      H.tmpname(".out"), H.tmpname(".err"), H.tmpname(".gate"), H.tmpname(".pid"), H.tmpname(".rc"), H.tmpname(".read")
    os.remove(gate)
    os.remove(readf)
    finally(function()
      for _, p in ipairs { script, file, out, err, gate, pidf, rcf, readf } do os.remove(p) end
    end)
    H.write_file(script, SCRIPT:format(file, LINES, LINES))
    -- mirza's stdout is a pipe whose reader waits for the gate before it reads
    local cmd = ("(%s %s </dev/null 2>%s & echo $! >%s; wait $!; echo $? >%s) | "
      .. "(while [ ! -e %s ]; do sleep 0.02; done; cat >%s; echo >%s) &"):format(H.q(H.mirza_bin), H.q(script),
      H.q(err), H.q(pidf), H.q(rcf), H.q(gate), H.q(out), H.q(readf))
    assert(os.execute(cmd))
    local pid = H.wait_for(function()
      local f = io.open(pidf)
      local p = f and tonumber(f:read("a"))
      if f then f:close() end
      return p
    end, 30)
    assert(pid, "mirza did not start")
    H.track(pid, H.mirza_bin)
    finally(function()
      H.write_file(gate, "") -- the reader goes on, whatever happened
      os.execute(("kill -KILL %d 2>/dev/null"):format(pid))
      H.untrack(pid)
    end)
    local function said(what) return (io.open(err) and H.read_file(err) or ""):find(what, 1, true) end
    assert(H.wait_for(function() return said("writing\n") end, 30), "the script did not start writing")
    assert(H.wait_for(function() return blocked_writing(pid) end, 30), "the script's write did not block")
    os.execute(("kill -INT %d"):format(pid))
    H.write_file(gate, "") -- the reader drains the pipe: the write goes on
    assert(H.wait_for(function() return said("written " .. LINES .. "\n") end, 60),
      "the script did not write everything: " .. tostring(io.open(err) and H.read_file(err)))
    assert.truthy(H.read_file(err):find("\ncaught [^\n]*interrupted\n"), H.read_file(err))
    os.execute(("kill -INT %d"):format(pid))
    local rc = H.wait_for(function()
      local f = io.open(rcf)
      local v = f and tonumber(f:read("a"))
      if f then f:close() end
      return v
    end, 30)
    assert.equal(130, rc)
    H.untrack(pid)
    local said_all = H.read_file(err)
    assert.truthy(said_all:find("^writing\ncaught [^\n]*interrupted\nwritten " .. LINES .. "\ninterrupted\n$"),
      said_all)
    -- the file: every line, flushed by the second Ctrl-C
    local want = {}
    for i = 1, 100 do want[i] = ("file line %d\n"):format(i) end
    assert.equal(table.concat(want), H.read_file(file))
    -- the pipe: every line in order (the one the first Ctrl-C came after may be there twice)
    assert(H.wait_for(function() return io.open(readf) ~= nil end, 30), "the reader did not see the pipe's end")
    local prev = 0
    for line in io.lines(out) do
      local v = assert(tonumber(line), line)
      assert(v == prev + 1 or v == prev, ("line %d after %d: bytes lost"):format(v, prev))
      prev = v
    end
    assert.equal(LINES, prev)
  end)
end)
