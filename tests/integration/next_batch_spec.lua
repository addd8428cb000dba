-- s:next_batch (issue 12): the events that arrived together in one call,
-- the same events as s:next() gives one by one, over real loopback HTTP
-- against mirza-sim (16 token frames per HTTP chunk).
local mirza = require "mirza"
local H = require "tests.helper"

local function open(sim, ctl)
  local body = H.chat_body("batch", { enable_thinking = true })
  body.mirza_sim = ctl
  return mirza.open { url = sim.url, body = body, stall_timeout = 10 }
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
