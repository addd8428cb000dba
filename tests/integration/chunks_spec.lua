-- s:chunks() (issue 20 item 1): the lighter iterator — `kind, text` for a
-- think or text delta, `kind, event` for anything else — gives the same
-- events in the same order as s:events(), outside a task and inside a
-- mirza.loop task, and closes the stream like it.
local mirza = require "mirza"
local loop = require "mirza.loop"
local H = require "tests.helper"

local CTL = { text = "Un deux trois, soleil — l'été à Zürich.", reasoning = "Je compte. Puis je réponds.",
  tok_rate = 2000, frames_per_chunk = 1 }

local function open(sim, ctl, no_think)
  local body = H.chat_body("chunks", { enable_thinking = not no_think })
  body.mirza_sim = ctl or CTL
  return mirza.open { url = sim.url, body = body, stall_timeout = 10 }
end

-- One line per event: kind and text, or kind and the fields that do not
-- vary between two answers to the same request.
local function from_events(s)
  local out = {}
  for ev in s:events() do
    out[#out + 1] = ev.text and (ev.type .. ":" .. ev.text)
      or (ev.type .. "|" .. tostring(ev.finish_reason) .. "|" .. tostring(ev.code))
  end
  return out
end

local function from_chunks(s)
  local out = {}
  for kind, x in s:chunks() do
    if type(x) == "string" then
      assert.is_true(kind == "think" or kind == "text", kind)
      out[#out + 1] = kind .. ":" .. x
    else
      assert.are.equal(kind, x.type)
      out[#out + 1] = kind .. "|" .. tostring(x.finish_reason) .. "|" .. tostring(x.code)
    end
  end
  return out
end

describe("s:chunks", function()
  local sim
  setup(function() sim = H.start_sim { "--ttft-ms", "0", "--progress-every", "0", "--parallel", "4" } end)
  teardown(function() sim.stop() end)

  it("gives the events of s:events(), in order: deltas as their text, the rest as the event", function()
    local want, got
    do
      local s <close> = open(sim)
      want = from_events(s)
    end
    do
      local s <close> = open(sim)
      got = from_chunks(s)
    end
    assert.is_true(#want > 10)
    assert.are.same(want, got)
    assert.are.equal("done|stop|nil", got[#got])
  end)

  it("does the same inside mirza.loop tasks, two streams at once", function()
    local a, b, want
    do
      local s <close> = open(sim)
      want = from_events(s)
    end
    loop.run(function()
      local ta = loop.spawn(function()
        local s <close> = open(sim)
        a = from_chunks(s)
      end)
      local tb = loop.spawn(function()
        local s <close> = open(sim)
        b = from_chunks(s)
      end)
      assert.is_true(ta:join())
      assert.is_true(tb:join())
    end)
    assert.are.same(want, a)
    assert.are.same(want, b)
  end)

  it("ends with the error event, as a table, after the text that came before", function()
    local ctl = { text = "un deux trois quatre cinq six", tok_rate = 2000, fault = "cut-after=3" }
    local s <close> = open(sim, ctl, true)
    local got, text = from_chunks(s), {}
    for _, line in ipairs(got) do text[#text + 1] = line:match("^text:(.*)") end
    assert.are.equal("un deux trois ", table.concat(text))
    assert.are.equal("error|nil|closed", got[#got])
  end)

  it("closes the stream when the loop is left with break", function()
    local s = open(sim)
    for kind in s:chunks() do
      if kind == "text" then break end
    end
    assert.is_true(s:closed())
  end)
end)
