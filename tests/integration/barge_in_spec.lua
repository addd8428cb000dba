-- Barge-in and Ctrl-C while a turn runs stages (issue 36 items 1-2),
-- against mirza-sim: `e:cancel()` from another task ends the turn with a
-- cut, blames no stage (nothing logged, the watched stage runs the next
-- turn), with stages or without; an interrupt raised inside a reloaded
-- policy (a stage, a mirza.thinking function, the router) goes on up
-- instead of being reported as the policy's error; in a child `mirza`
-- process Ctrl-C stops an answer while a stage runs (exit 130, the rest
-- of the answer never comes).
local mirza = require "mirza"
local engine = require "mirza.engine"
local loop = require "mirza.loop"
local H = require "tests.helper"

local SRC = H.source .. "/lua/mirza/"
local SHOUT = [[return function(up) return function() local ev = up()
  if ev and ev.type == "text" then ev.text = ev.text:upper() end return ev end end]]

describe("e:cancel() from another task while a turn runs", function()
  local sim, dir, logs
  setup(function() sim = H.start_sim { "--tok-rate", "100", "--ttft-ms", "0", "--heartbeat-ms", "0" } end)
  teardown(function() sim.stop() end)
  before_each(function()
    dir = H.tmpname(".d")
    os.execute("mkdir -p " .. H.q(dir))
    logs = {}
  end)
  after_each(function()
    os.execute("rm -rf " .. H.q(dir))
    package.loaded.barge_shout = nil
    mirza.watcher().files.barge_shout = nil
    collectgarbage("collect")
  end)

  local function new_engine()
    return engine.new { base_url = sim.base .. "/v1", daemon = false, model_id = "mirza-sim", config_file = false,
      max_tokens = 64, log = function(level, msg) if level ~= "info" then logs[#logs + 1] = msg end end,
      body_extra = { mirza_sim = { answer_tokens = 400 } } }
  end

  -- e:say in one task, cancelled from another once 3 tokens came: the
  -- say's results.
  local function barge_in(e)
    local heard, r = 0, nil
    loop.run(function()
      local t = loop.spawn(function()
        return e:say("Bonjour", { mode = "token", answer = function() heard = heard + 1 end })
      end)
      assert(H.wait_for(function() loop.sleep(0.005) return heard >= 3 end, 20), "no text came")
      assert.is_true(e:cancel())
      r = table.pack(t:join())
    end)
    return r
  end

  it("ends the turn with a cut; the watched stage is not blamed and runs the next turn", function()
    local e = new_engine()
    finally(function() e:close() end)
    H.write_file(dir .. "/shout.lua", SHOUT)
    assert(e:watch("barge_shout", dir .. "/shout.lua"))
    e.stages = { { name = "shout", module = "barge_shout" } }
    local r = barge_in(e)
    assert.is_true(r[1], tostring(r[2]))
    assert.is_table(r[2], tostring(r[3])) -- the stats: the turn ran, cut
    assert.equal("cancelled", r[3].cut.reason)
    assert.same({}, logs)
    local _, res = assert(e:say("Encore", { mode = "whole", answer = function() end }))
    assert.truthy(res.answer:find("%a"))
    assert.equal(res.answer:upper(), res.answer) -- the stage ran
    assert.same({}, logs)
  end)

  it("without stages the say returns the cut instead of raising 'attempt to use a closed stream'", function()
    local e = new_engine()
    finally(function() e:close() end)
    local r = barge_in(e)
    assert.is_true(r[1], tostring(r[2]))
    assert.is_table(r[2], tostring(r[3]))
    assert.equal("cancelled", r[3].cut.reason)
    assert.is_true(e.history.messages[#e.history.messages].interrupted)
  end)

  it("an e:turn loop with a stage of the script's own ends with the cut event", function()
    local e = new_engine()
    finally(function() e:close() end)
    local tagged = 0
    e.stages = { function(up) return function()
      local ev = up()
      if ev and ev.type == "text" then tagged = tagged + 1 end
      return ev
    end end }
    local types
    loop.run(function()
      local t = loop.spawn(function()
        local seen = {}
        for ev in e:turn("Bonjour") do seen[#seen + 1] = ev.type end
        return seen
      end)
      assert(H.wait_for(function() loop.sleep(0.005) return tagged >= 3 end, 20), "no text came")
      e:cancel()
      local ok, seen = t:join()
      assert(ok, seen)
      types = seen
    end)
    assert.equal("cut", types[#types])
    assert.same({}, logs)
  end)
end)

describe("an interrupt inside a reloaded policy", function()
  local sim, dir, e, logs
  local originals = {}
  setup(function()
    sim = H.start_sim { "--tok-rate", "0", "--ttft-ms", "0", "--heartbeat-ms", "0" }
    for _, n in ipairs { "mirza.route", "mirza.thinking" } do originals[n] = require(n) end
  end)
  teardown(function() sim.stop() end)
  before_each(function()
    dir = H.tmpname(".d")
    os.execute("mkdir -p " .. H.q(dir))
    logs = {}
    e = engine.new { base_url = sim.base .. "/v1", daemon = false, model_id = "mirza-sim", config_file = false,
      max_tokens = 32, log = function(level, msg) if level ~= "info" then logs[#logs + 1] = msg end end }
  end)
  after_each(function()
    e:close()
    local w = mirza.watcher()
    for n, m in pairs(originals) do
      package.loaded[n] = m
      w.files[n] = nil
    end
    e.watcher.files.barge_stage = nil
    package.loaded.barge_stage = nil
    os.execute("rm -rf " .. H.q(dir))
    collectgarbage("collect")
  end)

  -- A wrapped copy of the module of the source tree whose function fname raises "interrupted".
  local function watch_raising(name, file, fname)
    local path = dir .. "/" .. file .. ".lua"
    H.write_file(path, ("local M = dofile(%q)\nfunction M.%s() error('interrupted', 0) end\nreturn M\n")
      :format(SRC .. file .. ".lua", fname))
    assert(e:watch(name, path))
  end

  local function say_raises()
    local ok, err = pcall(e.say, e, "Bonjour", { mode = "whole", answer = function() end })
    assert.is_false(ok)
    assert.equal("interrupted", err)
    assert.same({}, logs) -- not reported as the policy's error
  end

  it("in a stage module: goes on up", function()
    local path = dir .. "/stage.lua"
    H.write_file(path, "return function(up) return function() up() error('interrupted!', 0) end end")
    assert(e:watch("barge_stage", path))
    e.stages = { { name = "s", module = "barge_stage" } }
    local ok, err = pcall(e.say, e, "Bonjour", { mode = "whole", answer = function() end })
    assert.is_false(ok)
    assert.equal("interrupted!", err)
    assert.same({}, logs)
  end)

  it("in a mirza.thinking function: goes on up", function()
    watch_raising("mirza.thinking", "thinking", "plan")
    say_raises()
  end)

  it("in the router of mirza.route: goes on up", function()
    watch_raising("mirza.route", "route", "router")
    say_raises()
  end)
end)

describe("Ctrl-C in a mirza script while a stage runs", function()
  after_each(function() collectgarbage("collect") end)

  for _, how in ipairs { "fn", "module" } do
    it(("stops the answer (a stage given as %s): exit 130, the rest never comes"):format(how), function()
      local sim = H.start_sim { "--tok-rate", "50", "--ttft-ms", "0", "--answer-tokens", "5000" }
      finally(sim.stop)
      local stage = H.tmpname(".lua")
      H.write_file(stage, SHOUT)
      finally(function() os.remove(stage) end)
      local run = H.spawn_mirza(([[
local e = require("mirza.engine").new { base_url = %q, daemon = false, config_file = false, model_id = "m",
  log = function() end }
if %q == "module" then
  assert(e:watch("shout", %q))
  e.stages = { { name = "shout", module = "shout" } }
else
  e.stages = { { name = "shout", fn = dofile(%q) } }
end
local n = 0
local st = e:say("Bonjour", { mode = "token", answer = function(t)
  n = n + 1
  if n == 3 then io.stdout:write("speaking\n") io.stdout:flush() end
end })
io.stdout:write("the answer ended: ", tostring(st and st.tokens), "\n")
]]):format(sim.base .. "/v1", how, stage, stage))
      local rc
      finally(function() if not rc then run.signal("KILL") run.wait(10) end end)
      assert(run.expect("speaking", 30), run.output())
      run.signal("INT")
      rc = run.wait(20) -- the whole answer would take 100 s
      assert.equal(130, rc, run.output())
      assert.is_nil(run.output():find("the answer ended", 1, true), run.output())
      assert.is_nil(run.output():find("dropped", 1, true), run.output())
    end)
  end
end)
