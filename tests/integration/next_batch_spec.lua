-- What arrived together, taken at once (issue 12), over real loopback HTTP
-- against mirza-sim (16 token frames per HTTP chunk): s:next_batch (the
-- events in one call, the same events as s:next() gives one by one) and
-- merge = true (the deltas of one channel joined into one event), in a raw
-- stream and in the engine's turns.
local mirza = require "mirza"
local engine = require "mirza.engine"
local H = require "tests.helper"

local function open(sim, ctl, merge)
  local body = H.chat_body("batch", { enable_thinking = true })
  body.mirza_sim = ctl
  return mirza.open { url = sim.url, body = body, stall_timeout = 10, merge = merge }
end

local CTL = { text = "Un deux trois quatre cinq six sept huit neuf dix onze douze.",
  reasoning = "Je compte. Puis je réponds.", frames_per_chunk = 16 }

-- Events without the figures that differ between two runs (ids, times).
local function shape(ev)
  return { type = ev.type, text = ev.text, finish_reason = ev.finish_reason }
end

-- Wait (bounded) until the whole response is queued, so the first batch
-- holds everything: deterministic whatever the machine's load.
local function await_finished(s)
  assert.truthy(H.wait_for(function() return s:finished() end, 20, 0.01), "the stream did not finish")
end

describe("s:next_batch", function()
  local sim
  setup(function() sim = H.start_sim { "--tok-rate", "0", "--ttft-ms", "0", "--progress-every", "0" } end)
  teardown(function() sim.stop() end)
  after_each(function() collectgarbage("collect") end)

  it("gives everything queued in one call, the same events as next(), then nil", function()
    local want = {}
    do
      local s <close> = open(sim, CTL)
      for ev in s:events() do want[#want + 1] = shape(ev) end
    end
    local s <close> = open(sim, CTL)
    await_finished(s)
    local b = s:next_batch()
    local got = {}
    for i, ev in ipairs(b) do got[i] = shape(ev) end
    assert.same(want, got)
    assert.equal("done", b[#b].type)
    assert.is_true(#b > 10, tostring(#b))
    assert.is_nil(s:next_batch())
    assert.is_nil(s:next())
  end)

  it("stops at max events and goes on where it stopped", function()
    local s <close> = open(sim, CTL)
    await_finished(s)
    local pending = s:pending()
    local first = s:next_batch(nil, 3)
    assert.equal(3, #first)
    assert.equal(pending - 3, s:pending())
    local rest = s:next_batch()
    assert.equal(pending - 3, #rest)
    assert.equal("done", rest[#rest].type)
  end)

  it("times out like next(): nil, \"timeout\", \"timeout\"", function()
    local s <close> = open(sim, { text = "lent", ttft_ms = 5000 })
    local b, msg, code = s:next_batch(0.05)
    assert.is_nil(b)
    assert.equal("timeout", msg)
    assert.equal("timeout", code)
  end)

  it("raises on a closed stream and on a negative count", function()
    local s = open(sim, CTL)
    assert.has_error(function() s:next_batch(nil, -1) end, "bad argument #2 to 'next_batch' (negative count)")
    s:close()
    assert.has_error(function() s:next_batch() end, "attempt to use a closed stream")
  end)
end)

-- The reference for merge: adjacent think (or text) events of one choice
-- joined, `deltas` counting them (absent for one).
local function merged(events)
  local out = {}
  for _, ev in ipairs(events) do
    local last = out[#out]
    if last and (ev.type == "text" or ev.type == "think") and last.type == ev.type then
      last.text, last.deltas = last.text .. ev.text, (last.deltas or 1) + 1
    else
      out[#out + 1] = { type = ev.type, text = ev.text, finish_reason = ev.finish_reason }
    end
  end
  return out
end

describe("merge = true", function()
  local sim
  setup(function() sim = H.start_sim { "--tok-rate", "0", "--ttft-ms", "0", "--progress-every", "0" } end)
  teardown(function() sim.stop() end)

  it("joins the deltas queued back to back of one channel: the same text, deltas adding up", function()
    local one = {}
    do
      local s <close> = open(sim, CTL)
      for ev in s:events() do one[#one + 1] = shape(ev) end
    end
    local s <close> = open(sim, CTL, true)
    await_finished(s)
    local got = {}
    for ev in s:events() do
      local sh = shape(ev)
      sh.deltas = ev.deltas
      got[#got + 1] = sh
    end
    assert.same(merged(one), got)
    assert.equal(3, #got) -- everything was queued: one think, one text, done
    assert.is_true(got[2].deltas > 10, tostring(got[2].deltas))
  end)

  it("never waits for more: a delta that arrived comes at once, alone, while the rest is held back", function()
    -- the sim sends one delta, then nothing for 60 s: the first event must
    -- hold that delta alone, well before then, however loaded the machine
    -- (a paced stream raced the reader's clock against the sim's)
    local s <close> = open(sim, { text = "Un deux trois quatre.", fault = "stall-after=1:60000" }, true)
    local t0 = mirza.now()
    local ev, msg = s:next(8)
    assert.truthy(ev, msg)
    assert.equal("think", ev.type)
    assert.is_nil(ev.deltas)
    assert.is_true(#ev.text > 0 and mirza.now() - t0 < 8)
  end)

  it("refuses nothing else: next_batch over a merge stream gives the merged events", function()
    local s <close> = open(sim, CTL, true)
    await_finished(s)
    local b = s:next_batch()
    assert.same({ "think", "text", "done" }, { b[1].type, b[2].type, b[3].type })
  end)
end)

describe("merged engine turns", function()
  local sim
  setup(function()
    sim = H.start_sim { "--tok-rate", "0", "--ttft-ms", "0", "--progress-every", "0", "--frames-per-chunk", "16" }
  end)
  teardown(function() sim.stop() end)

  local TEXT = ("Un deux trois quatre cinq six sept huit neuf dix. "):rep(20)
  local function new_engine(extra)
    local opts = { base_url = sim.base .. "/v1", daemon = false, config_file = false, log = function() end,
      model = "mirza-sim", body_extra = { mirza_sim = { text = TEXT } } }
    for k, v in pairs(extra or {}) do opts[k] = v end
    return engine.new(opts)
  end

  -- say with a token sink: the text, the sink's calls, the deltas they carried.
  local function say(e, opts)
    local parts, calls, deltas = {}, 0, 0
    opts = opts or {}
    opts.mode, opts.answer = "token", function(text, ev)
      parts[#parts + 1], calls, deltas = text, calls + 1, deltas + (ev.deltas or 1)
    end
    local st, res = e:say("hello", opts)
    assert.truthy(st, res)
    return table.concat(parts), calls, deltas, st, res
  end

  it("say joins what arrived together: the same answer, history and token count in fewer events", function()
    local e1, e2 = new_engine(), new_engine { merge = false }
    local text1, calls1, deltas1, st1, res1 = say(e1)
    local text2, calls2, deltas2, st2 = say(e2)
    assert.equal(TEXT, text1)
    assert.equal(text2, text1)
    assert.equal(res1.answer, text1)
    assert.equal(deltas2, deltas1)
    assert.equal(calls2, deltas2) -- merge = false: one call per delta
    assert.is_true(calls1 < deltas1 / 4, ("%d calls for %d deltas"):format(calls1, deltas1))
    assert.equal(st2.tokens, st1.tokens)
    local h = e1.history.messages
    assert.equal(TEXT, h[#h].content)
  end)

  it("keeps the answer once for the history, and the turn's own text past a script stage", function()
    local e = new_engine()
    local text, _, _, _, res = say(e)
    local h = e.history.messages
    assert.equal(TEXT, text)
    assert.equal(res.answer, h[#h].content)
    e.stages[1] = { name = "upper", fn = require("mirza.pipeline").map(function(ev)
      if ev.type == "text" then ev.text = ev.text:upper() end
      return ev
    end) }
    text = say(e)
    assert.equal(TEXT:upper(), text) -- the sinks get the stage's text
    assert.equal(TEXT, h[#h].content) -- the history the model's, as the stats tap saw it
  end)

  it("keeps one event per delta for e:turn, a script stage, and merge = false in say", function()
    local e = new_engine()
    local n, deltas = 0, 0
    for ev in e:turn("hello") do
      if ev.type == "text" then n, deltas = n + 1, deltas + (ev.deltas or 1) end
    end
    assert.equal(deltas, n)
    local _, calls, d = say(e, { merge = false })
    assert.equal(d, calls)
    local seen = 0
    e.stages[1] = { name = "count", fn = require("mirza.pipeline").tap(function(ev)
      if ev.type == "text" then seen = seen + (ev.deltas and 1000 or 1) end
    end) }
    _, calls, d = say(e)
    assert.equal(d, calls)
    assert.equal(d, seen)
    assert.is_true(d > 100, tostring(d))
    -- and e:turn merges when asked
    n, deltas = 0, 0
    e.stages = {}
    do
      local it, s, _, t = e:turn("hello", { merge = true })
      assert.truthy(it, s)
      H.wait_for(function() return s:finished() end, 20, 0.01)
      for ev in it, s, nil, t do
        if ev.type == "text" then n, deltas = n + 1, deltas + (ev.deltas or 1) end
      end
    end
    assert.is_true(n < deltas, ("%d events for %d deltas"):format(n, deltas))
  end)
end)
