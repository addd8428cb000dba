-- mirza.result: the one reducer every reader of a stream uses. The events
-- of recorded streams (served again by mirza-sim's replay fault: reasoning
-- and answer, tool calls, an error frame after text, llama's error frame)
-- are fed whole and split at every event, a partial result read at the
-- split; an error after any prefix keeps that prefix's text; tool-call
-- fragments cut at every offset merge through it as mirza.tools merges
-- them; the rope joins runs of KEEP_RUN deltas; the failure carries the
-- code, status, body and Retry-After.
local mirza = require "mirza"
local H = require "tests.helper"
local result = require "mirza.result"
local tools = require "mirza.tools"

local RECORDED = {
  thinking = H.traces .. "/mtplx.reconstructed.thinking_stream.sse",
  tools = H.fixtures .. "/tool_calls.sse",
  midstream = H.traces .. "/mtplx.reconstructed.midstream_error.sse",
  llama_error = H.fixtures .. "/llama_midstream_error.sse",
}

-- What a reader expects of a list of events, computed apart from the
-- reducer: texts joined, the terminal event.
local function expected(events)
  local text, think, last = {}, {}, nil
  for _, ev in ipairs(events) do
    if ev.type == "text" then text[#text + 1] = ev.text
    elseif ev.type == "think" then think[#think + 1] = ev.text
    elseif ev.type == "done" or ev.type == "error" then last = ev end
  end
  return table.concat(text), table.concat(think), last
end

local function feed(acc, events, from, to)
  for i = from, to do result.feed(acc, events[i]) end
  return acc
end

describe("mirza.result over recorded streams", function()
  local sim
  local streams = {} -- name -> the events mirza read from it
  setup(function()
    sim = H.start_sim { "--tok-rate", "0", "--ttft-ms", "0" }
    for name, path in pairs(RECORDED) do
      local body = H.chat_body("x", { mirza_sim = { fault = "replay=" .. path } })
      local s <close> = mirza.open { url = sim.url, body = body }
      streams[name] = H.drain(s, 10).events
    end
  end)
  teardown(function() sim.stop() end)
  after_each(function() collectgarbage("collect") end)

  it("gives the same result whole and split at every event, a partial result read at the split", function()
    for name, events in pairs(streams) do
      local text, think, last = expected(events)
      assert.is_true(#events >= 2, name)
      for k = 0, #events do
        local acc = feed(result.new { calls = true }, events, 1, k)
        local part = result.partial(acc) -- read mid-stream: the rope joined, then fed on
        local t, th = expected { table.unpack(events, 1, k) }
        assert.equal(t, part.text, name .. " at " .. k)
        assert.equal(th, part.think, name .. " at " .. k)
        feed(acc, events, k + 1, #events)
        local r, msg, code, partial = result.result(acc)
        local got = r or partial
        assert.equal(text, got.text, name .. " split at " .. k)
        assert.equal(think, got.think, name .. " split at " .. k)
        if last.type == "done" then
          assert.is_table(r, name)
          assert.same({ last.finish_reason, last.usage, last.stats, last.timings },
            { r.finish_reason, r.usage, r.stats, r.timings })
        else
          assert.is_nil(r, name)
          assert.same({ last.message, last.code }, { msg, code })
        end
      end
    end
    assert.matches("^Il fait", (expected(streams.midstream)))
    assert.equal("Edges", (expected(streams.llama_error)))
    assert.is_true(#select(2, expected(streams.thinking)) > 0)
  end)

  it("keeps the text received before an error, whatever event the error follows", function()
    for name, events in pairs(streams) do
      for k = 0, #events - 1 do
        local acc = feed(result.new(), events, 1, k)
        result.feed(acc, { type = "error", code = "closed", message = "connection cut" })
        local r, msg, code, partial = result.result(acc)
        assert.is_nil(r)
        assert.same({ "connection cut", "closed" }, { msg, code })
        local t, th = expected { table.unpack(events, 1, k) }
        assert.equal(t, partial.text, name .. " cut after " .. k)
        assert.equal(th, partial.think, name .. " cut after " .. k)
      end
    end
  end)

  it("merges a recorded stream's tool-call fragments into whole calls, as mirza.collect returns them", function()
    local acc = feed(result.new { calls = true }, streams.tools, 1, #streams.tools)
    local r = assert(result.result(acc))
    assert.equal(1, #r.tool_calls)
    local c = r.tool_calls[1]
    assert.same({ "call_fx1", "get_weather", { city = "Lyon", unit = "C" } }, { c.id, c.name, c.args })
    assert.equal("tool_calls", r.finish_reason)
    -- without `calls` the fragments are not merged: behind mirza.tools.stage the done event has them
    assert.is_nil(result.calls(feed(result.new(), streams.tools, 1, #streams.tools)))
    local staged, i = {}, 0
    for ev in tools.stage(function() i = i + 1 return streams.tools[i] end) do staged[#staged + 1] = ev end
    assert.same(r.tool_calls, assert(result.result(feed(result.new(), staged, 1, #staged))).tool_calls)
    local via = assert(mirza.collect { url = sim.url,
      body = H.chat_body("x", { mirza_sim = { fault = "replay=" .. RECORDED.tools } }) })
    assert.same(r.tool_calls, via.tool_calls)
  end)

  it("keeps the partial answer and the error of mirza.collect (an error frame after text)", function()
    local r, msg, code, partial = mirza.collect { url = sim.url,
      body = H.chat_body("x", { mirza_sim = { fault = "replay=" .. RECORDED.midstream } }) }
    assert.is_nil(r)
    assert.equal("server", code)
    assert.matches("stall watchdog", msg)
    assert.equal("Il fait ", partial.text)
  end)
end)

describe("mirza.result", function()
  after_each(function() collectgarbage("collect") end)

  -- The fragments of one call cut at `cut` of its name and `acut` of its arguments.
  local function fragments(name, args, cut, acut)
    return {
      { type = "tool_call", calls = { { index = 0, id = "c1", ["function"] = { name = name:sub(1, cut) } } } },
      { type = "text", text = "" },
      { type = "tool_call", calls = { { index = 0, ["function"] = { name = name:sub(cut + 1),
        arguments = args:sub(1, acut) } } } },
      { type = "tool_call", calls = { { index = 0, ["function"] = { arguments = args:sub(acut + 1) } } } },
      { type = "done", finish_reason = "tool_calls" },
    }
  end

  it("merges tool-call fragments cut at every offset exactly as mirza.tools does", function()
    local name, args = "get_weather", '{"city": "Lyon \\"été\\""}'
    for cut = 0, #name do
      for acut = 0, #args do
        local evs = fragments(name, args, cut, acut)
        local acc, ref = feed(result.new { calls = true }, evs, 1, #evs), tools.accumulator()
        for _, ev in ipairs(evs) do
          if ev.type == "tool_call" then tools.add(ref, ev.calls) end
        end
        local r = assert(result.result(acc))
        assert.same(tools.finish(ref), r.tool_calls)
        assert.same({ name, { city = 'Lyon "été"' } }, { r.tool_calls[1].name, r.tool_calls[1].args })
      end
    end
  end)

  it("joins a rope's runs, read at any point and fed on", function()
    local rope, want = result.rope(), {}
    for i = 1, 3 * result.KEEP_RUN + 7 do
      local piece = tostring(i % 10)
      result.push(rope, piece)
      want[#want + 1] = piece
      if i % 997 == 0 or i == result.KEEP_RUN then assert.equal(table.concat(want), result.join(rope)) end
    end
    assert.equal(table.concat(want), result.join(rope))
    assert.equal(1, #rope.runs) -- kept as one string: asking again gives it, not another copy
    assert.equal(table.concat(want), result.join(rope))
    local long, parts = result.rope(), {} -- runs of KEEP_RUN joined as they fill, read only at the end
    for i = 1, 2 * result.KEEP_RUN + 3 do
      parts[i] = ("<%d>"):format(i)
      result.push(long, parts[i])
    end
    assert.equal(2, #long.runs)
    assert.equal(table.concat(parts), result.join(long))
    assert.equal("", result.join(result.rope()))
    assert.equal("", result.join(false))
  end)

  it("counts the figures: first delta, deltas a merged event joins, bytes; texts not kept are counted", function()
    local acc = result.new { text = false, think = false }
    assert.is_nil(acc.first)
    result.feed(acc, { type = "progress", decode_tok_s = 42.5 })
    assert.is_nil(acc.first)
    result.feed(acc, { type = "think", text = "abc" })
    local first = acc.first
    assert.is_number(first)
    result.feed(acc, { type = "text", text = "Un deux trois", deltas = 3 })
    assert.equal(first, acc.first)
    result.feed(acc, { type = "done", tool_calls = { { name = "x" } } })
    assert.same({ 4, 16, 3, 42.5 }, { acc.deltas, acc.chars, acc.think_bytes, acc.live_tok_s })
    assert.is_number(acc.t1)
    assert.same({ text = "", think = "", tool_calls = { { name = "x" } } }, result.partial(acc))
  end)

  it("a repetition cut ends as asked, with the text before it", function()
    local acc = result.new()
    result.feed(acc, { type = "text", text = "la la " })
    result.feed(acc, { type = "cut", reason = "repetition" })
    assert.is_true(result.ok(acc))
    local r = assert(result.result(acc))
    assert.equal("la la ", r.text)
    assert.equal("repetition", r.cut.reason)
  end)

  it("reads the failure: code, message, status, body, Retry-After (the core's, else the header)", function()
    local acc = result.new()
    result.feed(acc, { type = "error", code = "http", status = 429, message = "busy", body = '{"error":{}}',
      retry_after = 7, headers = { ["retry-after"] = "3" } })
    assert.same({ code = "http", message = "busy", status = 429, body = '{"error":{}}', retry_after = 7 },
      result.failure(acc))
    acc = result.new()
    result.feed(acc, { type = "error", code = "http", status = 503, message = "x",
      headers = { ["Retry-After"] = "3" } })
    assert.equal(3, result.failure(acc).retry_after)
    acc = result.new()
    result.feed(acc, { type = "text", text = "half" })
    local r, msg, code, partial = result.result(acc) -- no terminal event: cut short
    assert.is_nil(r)
    assert.same({ "stream ended without a final event", "closed", "half" }, { msg, code, partial.text })
  end)
end)
