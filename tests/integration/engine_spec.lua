-- The engine end to end against mirza-sim over HTTP, started by the
-- supervisor: thinking on/off, prefill then a cache hit, clear cache, a
-- degenerate reasoning loop cut early (request closed), a mid-stream error
-- routed to the error sink with the partial answer kept, and hot reload of
-- a behaviour module edited while a turn is streaming (broken edit too).
local mirza = require "mirza"
local engine = require "mirza.engine"
local pipeline = require "mirza.pipeline"
local H = require "tests.helper"

local SYSTEM = string.rep("Tu es Mirza, un assistant vocal concis et précis. ", 12)

local function new_engine(extra)
  local opts = {
    preset = "mirza-sim", port = H.free_port(), config_file = false, session_id = "spec-" .. math.random(1e9),
    daemon = { args = { "--tok-rate", "0", "--ttft-ms", "0" }, deadline = 30 },
    max_tokens = 64, max_tokens_thinking = 128, log = function() end,
  }
  for k, v in pairs(extra or {}) do opts[k] = v end
  return engine.new(opts)
end

local function count(events, ty)
  local n = 0
  for _, ev in ipairs(events) do if ev.type == ty then n = n + 1 end end
  return n
end

local function run_turn(e, input)
  local it = assert(e:turn(input))
  return pipeline.collect(it)
end

describe("mirza.engine against mirza-sim", function()
  local e
  setup(function()
    e = new_engine()
    assert(e:load(SYSTEM))
  end)
  teardown(function() e:unload() end)
  after_each(function() collectgarbage("collect") end)

  it("started the daemon through the supervisor", function()
    assert.is_false(e.daemon.adopted)
    assert.is_number(e.daemon.pid)
    assert.is_true((e.daemon:healthy()))
  end)

  it("streams with thinking on and without it when off", function()
    e:set_thinking(true)
    local on = run_turn(e, "Pourquoi le ciel est-il bleu ?")
    assert.is_true(count(on, "think") > 0)
    assert.is_true(count(on, "text") > 0)
    assert.equal("done", on[#on].type)
    e:set_thinking(false)
    local off = run_turn(e, "Merci.")
    assert.equal(0, count(off, "think"))
    assert.is_true(count(off, "text") > 0)
    assert.is_number(e.last.tok_s)
    assert.is_true(e.last.tokens > 0)
  end)

  it("reports a cache hit after the prefill and none after clear_cache", function()
    e:set_thinking(false)
    assert.is_number(e:prefill())
    run_turn(e, "Bonjour")
    assert.is_true(e.last.cached_tokens > 50, "cached " .. tostring(e.last.cached_tokens))
    assert.is_true(e:clear_cache())
    run_turn(e, "Encore")
    assert.equal(0, e.last.cached_tokens)
  end)

  it("keeps assistant turns without reasoning in the history", function()
    e:set_thinking(true)
    run_turn(e, "Explique la pluie.")
    local last = e.history.messages[#e.history.messages]
    assert.equal("assistant", last.role)
    assert.is_nil(last.reasoning_content)
    assert.is_true(#last.content > 0)
  end)

  it("routes a mid-stream error to the error sink, partial answer kept", function()
    local e2 = new_engine { body_extra = { mirza_sim = { text = "Un deux trois. Quatre cinq six.", fault = "error-after=4" } } }
    assert(e2:load())
    local answer, errors = {}, {}
    local stats, msg, code, res = e2:say("x", { mode = "sentence",
      answer = function(s) answer[#answer + 1] = s end, error = function(m) errors[#errors + 1] = m end })
    e2:unload()
    assert.is_nil(stats) -- one convention: a failed turn is nil, message, code, result
    assert.equal("server", code)
    assert.equal(errors[1], msg)
    assert.equal(1, #errors)
    assert.matches("simulated failure", errors[1])
    assert.equal("Un deux trois.", answer[1])
    assert.equal("Un deux trois. Quatre ", res.answer)
    for _, s in ipairs(answer) do assert.is_nil(s:find("failure")) end
    assert.equal("server", e2.last.error)
  end)

  it("cuts a degenerate reasoning loop early and closes the request", function()
    local e3 = new_engine { max_tokens_thinking = 5000, body_extra = { mirza_sim = { fault = "loop", tok_rate = 2000 } } }
    assert(e3:load())
    e3:set_thinking(true)
    local it, s = e3:turn("x")
    local evs = pipeline.collect(it)
    e3:unload()
    local last = evs[#evs]
    assert.equal("cut", last.type)
    assert.equal("repetition", last.reason)
    assert.matches("reconsider", last.line)
    assert.is_true(s:closed())
    assert.is_true(count(evs, "think") < 400, "cut early")
  end)
end)

describe("hot reload during a running loop", function()
  local e, dir, path
  local NAME = "spec_behaviour"
  local function write(v)
    local f = assert(io.open(path, "w"))
    f:write(v)
    f:close()
    -- make sure the change is visible even within the same mtime tick
    os.execute("touch -d '+" .. math.random(2, 50) .. " seconds' " .. H.q(path))
  end
  setup(function()
    dir = H.tmpname(".d")
    os.execute("mkdir -p " .. H.q(dir))
    path = dir .. "/" .. NAME .. ".lua"
    write([[return { tag = "v1", stage = function(up) return function()
      local ev = up(); if ev and ev.type == "text" then ev.tag = "v1" end; return ev end end }]])
    package.loaded[NAME] = dofile(path)
    e = new_engine { body_extra = { mirza_sim = { text = "a b c d e f g h", tok_rate = 50 } } }
    assert(e:load())
    assert(e:watch(NAME, path))
    e.stages = { { name = "behaviour", fn = function(up, o) return package.loaded[NAME].stage(up, o) end } }
  end)
  teardown(function()
    e:unload()
    os.execute("rm -rf " .. H.q(dir))
    package.loaded[NAME] = nil
  end)

  it("finishes the turn in flight on the old code and uses the new one next turn", function()
    e:set_thinking(false)
    local it = assert(e:turn("x"))
    local first = it()
    while first and first.type ~= "text" do first = it() end
    -- edit while the stream is in flight
    write([[return { tag = "v2", stage = function(up) return function()
      local ev = up(); if ev and ev.type == "text" then ev.tag = "v2" end; return ev end end }]])
    local tags = { first.tag }
    for ev in it do if ev.type == "text" then tags[#tags + 1] = ev.tag end end
    for _, t in ipairs(tags) do assert.equal("v1", t) end
    local next_turn = run_turn(e, "y")
    for _, ev in ipairs(next_turn) do if ev.type == "text" then assert.equal("v2", ev.tag) end end
    assert.equal("v2", package.loaded[NAME].tag)
  end)

  it("keeps the previous version when the edit is broken, and reports file and line", function()
    local reported
    local w = mirza.watcher()
    local old_on_error = w.on_error
    w.on_error = function(_, msg) reported = msg end
    write("return { tag = 'v3', stage = function(up) return up end\n")  -- syntax error: missing }
    local evs = run_turn(e, "z")
    w.on_error = old_on_error
    assert.matches(NAME .. "%.lua:%d+:", reported)
    for _, ev in ipairs(evs) do if ev.type == "text" then assert.equal("v2", ev.tag) end end
    assert.equal("v2", package.loaded[NAME].tag)
    -- the daemon and the conversation survived
    assert.is_true((e.daemon:healthy()))
    assert.is_true(#e.history.messages >= 4)
  end)
end)
