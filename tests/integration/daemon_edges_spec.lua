-- The daemon supervisor's edge paths with real mirza-sim processes: the
-- restart policy's limit and backoff, and the rotation of the daemon log
-- (one previous generation kept as <log>.1).
local mirza = require "mirza"
local H = require "tests.helper"

local FAST = { "--tok-rate", "0", "--ttft-ms", "0" }

local function daemon(opts)
  local o = { preset = "mirza-sim", port = H.free_port(), args = FAST, deadline = 60, grace = 2, progress = false }
  for k, v in pairs(opts or {}) do o[k] = v end
  return mirza.daemon(o)
end

-- One chat request; its final event, through stream_error (which waits
-- for the exit status of a daemon that died under it).
local function chat(d)
  local s <close> = mirza.open { url = d.chat_url, body = H.chat_body("x"), stall_timeout = 15 }
  return d:stream_error(H.drain(s, 20).last)
end

local function concat(a, b)
  local t = {}
  for _, v in ipairs(a) do t[#t + 1] = v end
  for _, v in ipairs(b) do t[#t + 1] = v end
  return t
end

describe("mirza.daemon restart policy", function()
  after_each(function() collectgarbage("collect") end)

  it("restarts a crashed daemon at most restart.max times, backing off 2x each time", function()
    -- every daemon process dies on its first chat request (exit 3)
    local d <close> = daemon { args = concat(FAST, { "--crash-after", "1" }), restart = { max = 2, backoff = 0.4 } }
    assert.is_true(d:start())
    local pids = { d.pid }
    for n = 1, 2 do
      assert.equal("exited", chat(d).code)
      local t0 = mirza.now()
      assert.is_true(d:ensure())
      local took = mirza.now() - t0
      assert.equal(n, d.restarts)
      assert.is_true(took >= 0.4 * 2 ^ (n - 1), ("restart %d after %.2f s"):format(n, took))
      assert.is_nil(H.ps(pids[#pids]), "the dead daemon was reaped")
      pids[#pids + 1] = d.pid
      assert.are_not.equal(pids[#pids - 1], d.pid)
      assert.is_true(d:healthy())
    end
    -- the third death is one too many
    assert.equal("exited", chat(d).code)
    local t0 = mirza.now()
    local ok, msg, code = d:ensure()
    assert.is_nil(ok)
    assert.equal("exited", code)
    assert.truthy(msg:find("exited with status 3", 1, true), msg)
    assert.equal(2, d.restarts)
    assert.is_true(mirza.now() - t0 < 0.4, "no backoff when no restart is left")
    assert.is_false(d:running())
    -- and it stays refused
    assert.is_nil((d:ensure()))
    assert.equal(2, d.restarts)
  end)

  it("restart.max defaults to 3", function()
    local d <close> = daemon { args = concat(FAST, { "--crash-after", "1" }), restart = { backoff = 0.01 } }
    assert.is_true(d:start())
    for n = 1, 3 do
      assert.equal("exited", chat(d).code)
      assert.is_true(d:ensure())
      assert.equal(n, d.restarts)
    end
    assert.equal("exited", chat(d).code)
    assert.is_nil((d:ensure()))
    assert.equal(3, d.restarts)
  end)

  it("rejects unknown restart options", function()
    local ok, err = pcall(daemon, { restart = { max = 1, bakoff = 1 } })
    assert.is_false(ok)
    assert.matches("unknown restart option 'bakoff'", err, 1, true)
  end)
end)

describe("mirza.daemon log rotation", function()
  local tmp = H.dir_per_case(".logs", before_each, after_each)

  local function read(path)
    local f = io.open(path)
    if not f then return nil end
    local text = f:read("a")
    f:close()
    return text
  end

  -- Mark the end of a daemon's life in its log, to tell generations apart.
  local function mark(path, text)
    local f = assert(io.open(path, "a"))
    f:write(text, "\n")
    f:close()
  end

  it("starts each daemon on a fresh log and keeps the previous one as .1", function()
    local log = tmp.path .. "/daemon.log"
    local d <close> = daemon { log = log }
    for run = 1, 3 do
      assert.is_true(d:start())
      local text = H.wait_for(function() return read(log) end, 10)
      assert.matches("^mirza%-sim listening on http://127%.0%.0%.1:" .. d.port .. "\n", text)
      assert.is_nil(text:find("end of run", 1, true), "a fresh log")
      if run == 1 then
        assert.is_nil(read(log .. ".1"))
      else
        assert.matches("\nend of run " .. (run - 1) .. "\n$", read(log .. ".1"))
      end
      assert.truthy(d:log_tail():find("listening", 1, true))
      assert.is_true(d:stop())
      mark(log, "end of run " .. run)
    end
    -- only one generation is kept
    local p = assert(io.popen("ls " .. H.q(tmp.path)))
    local files = {}
    for name in p:lines() do files[#files + 1] = name end
    p:close()
    assert.same({ "daemon.log", "daemon.log.1" }, files)
    assert.matches("\nend of run 3\n$", read(log))
    assert.matches("\nend of run 2\n$", read(log .. ".1"))
  end)

  it("a restart after a crash keeps the crashed daemon's log as .1", function()
    local log = tmp.path .. "/crash.log"
    local d <close> = daemon { log = log, args = concat(FAST, { "--crash-after", "1" }),
      restart = { max = 1, backoff = 0.01 } }
    assert.is_true(d:start())
    assert.equal("exited", chat(d).code)
    mark(log, "crashed here")
    assert.is_true(d:ensure())
    assert.matches("\ncrashed here\n$", read(log .. ".1"))
    assert.is_nil(read(log):find("crashed here", 1, true))
  end)
end)
