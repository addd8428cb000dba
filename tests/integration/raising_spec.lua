-- Hooks and stages that raise, at the pipeline level: the error reaches
-- whoever pulls, with its own message and line; nothing is pulled after
-- it; every suspended stage is closed; and over a real stream the request
-- is torn down (the simulator sees the disconnect long before the end).
local mirza = require "mirza"
local pipeline = require "mirza.pipeline"
local repetition = require "mirza.repetition"
local route = require "mirza.route"
local H = require "tests.helper"

local function text(t) return { type = "text", text = t } end
local function think(t) return { type = "think", text = t } end

-- A bounded source counting how many events were pulled from it.
local function counted(list)
  local src = pipeline.from_list(list)
  local n = 0
  return function()
    local ev = src()
    if ev then n = n + 1 end
    return ev
  end, function() return n end
end

-- Pull `iter` until it raises; returns the events before and the error.
local function pull_until_error(iter)
  local got = {}
  for _ = 1, 1000 do
    local ok, ev = pcall(iter)
    if not ok then return got, ev end
    if ev == nil then return got, nil end
    got[#got + 1] = ev
  end
  error("no end after 1000 events")
end

describe("stages that raise", function()
  after_each(function() collectgarbage("collect") end)

  it("a push-style stage's error reaches the puller with its message and line; the stage is over", function()
    local src, pulled = counted { text "a", text "b", text "c", text "d" }
    local boom = pipeline.stage(function(up, emit)
      for ev in up do
        if ev.text == "c" then error("stage failed on c") end
        emit(ev)
      end
    end)
    local iter = pipeline.compose(src, { boom })
    local got, err = pull_until_error(iter)
    assert.same({ text "a", text "b" }, got)
    assert.matches("raising_spec%.lua:%d+: stage failed on c$", err)
    assert.equal(3, pulled())
    assert.is_nil(iter()) -- raised once, then ended: never resumed
    assert.equal(3, pulled())
  end)

  it("a plain function stage's error propagates through the stages after it, unchanged", function()
    local src = pipeline.from_list { text "a", text "b" }
    local n = 0
    local raising = function(up)
      return function()
        n = n + 1
        if n == 2 then error({ code = "mine" }) end -- a non-string error object survives too
        return up()
      end
    end
    local passthrough = pipeline.stage(function(up, emit) for ev in up do emit(ev) end end)
    local iter = pipeline.compose(src, { raising, passthrough, passthrough })
    local got, err = pull_until_error(iter)
    assert.same({ text "a" }, got)
    assert.same({ code = "mine" }, err)
  end)

  it("a source that raises reaches the puller through every stage", function()
    local i = 0
    local src = function()
      i = i + 1
      if i == 3 then error("source broke", 0) end
      return text(tostring(i))
    end
    local stages = { { name = "repetition", fn = repetition.stage, opts = { channels = { text = true } } },
      { name = "route", fn = route.stage, opts = { answer = function() end, mode = "token" } } }
    local got, err = pull_until_error((pipeline.compose(src, stages)))
    assert.same({ text "1", text "2" }, got)
    assert.equal("source broke", err)
  end)

  it("closing the pipeline after an error closes every suspended stage (their <close> run)", function()
    local closed = {}
    local function guarded(name)
      return pipeline.stage(function(up, emit)
        local _ <close> = setmetatable({}, { __close = function() closed[#closed + 1] = name end })
        for ev in up do emit(ev) end
      end)
    end
    local src, pulled = counted { text "a", text "b", text "c" }
    local boom = pipeline.stage(function(up, emit)
      emit(up())
      error("late failure", 0)
    end)
    do
      local iter, _, _, closer = pipeline.compose(src, { guarded "first", boom, guarded "last" })
      local _ <close> = closer
      local got, err = pull_until_error(iter)
      assert.same({ text "a" }, got)
      assert.equal("late failure", err)
      -- a coroutine that raised keeps its to-be-closed variables pending
      -- until it is closed: the pipeline's closer does that
      assert.same({}, closed)
    end
    assert.same({ "last", "first" }, closed)
    assert.equal(1, pulled())
  end)

  it("a raising on_cut hook propagates, and nothing is read after the loop", function()
    local n = 0
    local src = function()
      n = n + 1
      if n > 200 then return nil end
      return think("Wait, let me reconsider.\n")
    end
    local stages = { { name = "r", fn = repetition.stage, opts = { on_cut = function(cut)
      error(("hook saw %s x%d"):format(cut.line, cut.count), 0)
    end } } }
    local got, err = pull_until_error((pipeline.compose(src, stages)))
    assert.equal("hook saw Wait, let me reconsider. x6", err)
    assert.equal(5, #got) -- the sixth line completed the loop; the hook ran before it was emitted
    assert.equal(6, n)
  end)

  it("a raising route sink propagates from route.run with its message", function()
    local src = pipeline.from_list { text "Première phrase. ", text "Deuxième phrase. ", { type = "done" } }
    local seen = {}
    local ok, err = pcall(route.run, src, { mode = "sentence", answer = function(s)
      seen[#seen + 1] = s
      if #seen == 1 then error("sink is full", 0) end
    end })
    assert.is_false(ok)
    assert.equal("sink is full", err)
    assert.same({ "Première phrase." }, seen)
  end)
end)

describe("a stage that raises over a real stream", function()
  local sim
  setup(function() sim = H.start_sim { "--tok-rate", "0", "--ttft-ms", "0", "--verbose" } end)
  teardown(function() sim.stop() end)

  it("tears the request down: the stream closes and the simulator sees the disconnect early", function()
    local body = H.chat_body("long")
    body.mirza_sim = { answer_tokens = 100000, tok_rate = 200 } -- 500 s if nobody hangs up
    local t0 = mirza.now()
    local ok, err = pcall(function()
      local s <close> = mirza.open { url = sim.url, body = body, stall_timeout = 20 }
      local n = 0
      local boom = pipeline.stage(function(up, emit)
        for ev in up do
          if ev.type == "text" then
            n = n + 1
            if n == 3 then error("policy failed", 0) end
          end
          emit(ev)
        end
      end)
      for _ in pipeline.compose(function() return s:next(20) end, { boom }) do end
    end)
    assert.is_false(ok)
    assert.equal("policy failed", err)
    assert.equal(0, mirza.streams())
    -- the simulator logs the request when it is over: 499, client gone
    local line = H.wait_for(function()
      return H.read_file(sim.log):match("mirza%-sim: POST /v1/chat/completions 499 ([%d.]+)ms")
    end, 20)
    assert.truthy(line, "the simulator never saw the request end")
    assert.is_true(tonumber(line) < 20000, "the request ran " .. line .. " ms")
    assert.is_true(mirza.now() - t0 < 25)
  end)
end)
