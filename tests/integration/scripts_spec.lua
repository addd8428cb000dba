-- Every script under scripts/ run as a user runs it, against mirza-sim:
-- bench.lua (a small count), demo.lua, chat.lua fed lines on stdin.
-- Each runs in its own `mirza` process on its own free port; the daemons
-- they start must be gone when they exit.
local H = require "tests.helper"

local q = H.q

-- Run `env mirza script args`, stdin from a string; stdout, stderr, rc.
local function run(env, script, args, stdin)
  local input, err = H.tmpname(".in"), H.tmpname(".err")
  local f = assert(io.open(input, "w"))
  f:write(stdin or "")
  f:close()
  local argv = { "env", env, q(H.mirza_bin), q(H.source .. "/scripts/" .. script) }
  for _, a in ipairs(args or {}) do argv[#argv + 1] = q(a) end
  -- `timeout`: a script that hangs fails this spec in bounded time
  local p = assert(io.popen(("cd %s && %s %s <%s 2>%s"):format(q(H.source), H.timeout_prefix(240),
    table.concat(argv, " "), q(input), q(err))))
  local out = p:read("a")
  local _, _, rc = p:close()
  local e = H.read_file(err)
  os.remove(input)
  os.remove(err)
  return out, e, rc
end

-- Environment that keeps a developer's own settings out of the run.
local function clean_env(port)
  return ("MIRZA_CONFIG=/dev/null MIRZA_LUA_DIR= MIRZA_SIM=%s MIRZA_PORT=%d MIRZA_DEMO_PORT=%d")
    :format(q(H.sim_bin), port, port)
end

describe("scripts/", function()
  after_each(function() collectgarbage("collect") end)

  it("bench.lua streams the requested number of tokens and reports the cost", function()
    local out, err, rc = run("MIRZA_LUA_DIR=", "bench.lua", { "3000", H.sim_bin })
    assert.equal(0, rc, err)
    assert.equal("3000", out:match("tokens%s+(%d+) %("), out)
    local cpu, per = out:match("cpu%s+([%d.]+) s"), out:match("cpu per token ([%d.]+) us")
    assert.truthy(cpu and per, out)
    -- the figure printed is the quotient of the two others
    assert.near(tonumber(cpu), tonumber(per) * 3000 / 1e6, 0.0006) -- cpu is printed to 1 ms
  end)

  it("demo.lua runs its three turns and stops the daemon it started", function()
    local port = H.free_port()
    local out, err, rc = run(clean_env(port), "demo.lua")
    assert.equal(0, rc, err)
    assert.matches(("^daemon started on http://127%%.0%%.0%%.1:%d/v1, session mirza%%-%%x+\n"):format(port), out)
    local _, turns = out:gsub("\n> ", "")
    local _, stats = out:gsub("\n%[ttft %d+ ms, [%d.]+ tok/s, %d+ tokens, kv %d+", "")
    assert.equal(3, turns, out)
    assert.equal(3, stats, out)
    assert.is_nil(out:find("turn failed", 1, true), out)
    assert.matches("\ndaemon stopped\n$", out)
    assert.same({}, H.pids_with("--port " .. port))
  end)

  it("chat.lua answers stdin lines sentence by sentence, runs commands, quits on /quit", function()
    local port = H.free_port()
    local dir = H.tmpname(".chat")
    os.execute("mkdir -p " .. q(dir))
    finally(function() os.execute("rm -rf " .. q(dir)) end)
    -- A behaviour whose stage records the raw answer text of every turn:
    -- what chat prints must be exactly that text, cut into sentences.
    local record = dir .. "/raw.txt"
    local f = assert(io.open(dir .. "/behaviour.lua", "w"))
    f:write(([[
return {
  system = "Tu es concis.",
  stage = function(up)
    return function()
      local ev = up()
      if ev and (ev.type == "text" or ev.type == "done") then
        local out = assert(io.open(%q, "a"))
        out:write(ev.type == "text" and ev.text or "\n")
        out:close()
      end
      return ev
    end
  end,
}
]]):format(record))
    f:close()
    local out, err, rc = run(clean_env(port), "chat.lua", { dir .. "/behaviour.lua", "--sim" },
      "Bonjour !\n/think off\nQuel temps fait-il ?\n/stats\n/quit\nnever read\n")
    assert.equal(0, rc, err)
    assert.matches(("chat: started http://127%%.0%%.0%%.1:%d/v1 "):format(port), err)
    assert.truthy(err:find("thinking off\n", 1, true), err)
    local _, stats = err:gsub("%[ttft %d+ ms, [%d.]+ tok/s, %d+ tokens, kv %d+", "")
    assert.equal(3, stats, err) -- two turns, then /stats repeats the last
    local raw = H.read_file(record)
    local function squash(s) return (s:gsub("%s+", " "):gsub("^ ", ""):gsub(" $", "")) end
    assert.equal(squash(raw), squash(out))
    assert.is_true(select(2, out:gsub("\n", "")) >= 2, "at least one sentence per turn")
    assert.same({}, H.pids_with("--port " .. port)) -- the daemon went with chat
  end)
end)
