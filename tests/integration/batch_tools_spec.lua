-- Batch items answered with tool calls (issue 19 item 8): the record
-- carries the calls exactly as the server meant them — the same list, in
-- the same order, with the same ids, names and argument texts byte for
-- byte as mirza-sim's non-streamed answer to the same request — whether
-- the fragments arrive together (merged into one event) or one frame per
-- chunk, with names split across fragments (fault tool-name-split), and
-- for a line that asks for no stream (batch always streams); `content` is
-- null beside them, as in that answer.
local mirza = require "mirza"
local batch = require "mirza.batch"
local json = mirza.json
local H = require "tests.helper"

local TOOLS = {
  { type = "function", ["function"] = { name = "get_weather", parameters = { type = "object" } } },
  { type = "function", ["function"] = { name = "lookup_station_by_name", parameters = { type = "object" } } },
  { type = "function", ["function"] = { name = "add", parameters = { type = "object" } } },
}
-- Three calls: arguments as a JSON text (its spacing kept), and as values
-- with non-ASCII text, quotes and a newline (the arguments come in pieces
-- cut on character boundaries).
local CALLS = {
  { id = "call-a", name = "get_weather", arguments = '{"city": "Lyon",  "unit":"C"}' },
  { id = "call-b", name = "lookup_station_by_name", arguments = { name = "Saint-Étienne", note = 'a "quoted"\nline' } },
  { id = "call-c", name = "add", arguments = { a = 2, b = 40 } },
}

local VARIANTS = { -- custom_id -> what the line adds to mirza_sim (and to its body)
  together = {},
  ["one-frame-per-chunk"] = { tok_rate = 400, frames_per_chunk = 1 },
  ["name-split"] = { fault = "tool-name-split" },
  ["name-split-one-frame-per-chunk"] = { fault = "tool-name-split", tok_rate = 400, frames_per_chunk = 1 },
  ["stream-false"] = { body = { stream = false } },
}

local function body_of(variant, calls)
  local ctl = { tool_calls = calls }
  for k, v in pairs(variant) do if k ~= "body" then ctl[k] = v end end
  local body = { messages = { { role = "user", content = "Quel temps ?" } }, tools = TOOLS, mirza_sim = ctl }
  for k, v in pairs(variant.body or {}) do body[k] = v end
  return body
end

describe("batch items answered with tool calls", function()
  local sim
  setup(function() sim = H.start_sim { "--tok-rate", "0", "--ttft-ms", "0", "--parallel", "4" } end)
  teardown(function() sim.stop() end)
  after_each(function() collectgarbage("collect") end)

  -- Run the lines {custom_id = body}; the records by custom_id.
  local function run(bodies)
    local input, output = H.tmpname(".jsonl"), H.tmpname(".jsonl")
    local f = assert(io.open(input, "wb"))
    for id, body in pairs(bodies) do
      f:write(json.encode { custom_id = id, method = "POST", url = "/v1/chat/completions", body = body }, "\n")
    end
    f:close()
    local st = assert(batch.run { input = input, output = output, endpoints = { sim.base }, model = "m", quiet = true,
      progress = false })
    assert.equal(0, st.errors)
    local by = {}
    for line in io.lines(output) do
      local r = assert(json.decode(line))
      by[r.custom_id] = r
    end
    os.remove(input)
    os.remove(output)
    return by
  end

  it("records the merged calls exactly as the server's non-streamed answer has them", function()
    local plain = body_of({}, CALLS)
    plain.stream, plain.model = false, "m"
    local want = json.decode(assert(mirza.request { url = sim.url, body = plain })).choices[1].message
    assert.same({ "assistant", json.null, 3 }, { want.role, want.content, #want.tool_calls })
    assert.equal('{"city": "Lyon",  "unit":"C"}', want.tool_calls[1]["function"].arguments) -- a JSON text as it is
    local bodies = {}
    for id, v in pairs(VARIANTS) do bodies[id] = body_of(v, CALLS) end
    local by = run(bodies)
    for id in pairs(VARIANTS) do
      local r = assert(by[id], id .. ": no record")
      local choice = r.response.body.choices[1]
      assert.same(want, choice.message, id) -- role, content null, the calls
      assert.equal("tool_calls", choice.finish_reason, id)
      assert.equal(1, r.mirza.attempts, id)
    end
  end)

  it("keeps the id the server made up for a call sent without one, and only the calls of the answer", function()
    local calls = { { name = "add", arguments = { a = 1, b = 2 } }, { name = "get_weather", arguments = "{}" } }
    local by = run { anon = body_of({}, calls), split = body_of({ fault = "tool-name-split" }, calls) }
    for id, r in pairs(by) do
      local got = r.response.body.choices[1].message.tool_calls
      assert.equal(2, #got, id)
      assert.matches("^call_0_", got[1].id, id)
      assert.matches("^call_1_", got[2].id, id)
      assert.same({ "add", '{"a":1,"b":2}', "function" }, { got[1]["function"].name, got[1]["function"].arguments,
        got[1].type }, id)
      assert.same({ "get_weather", "{}" }, { got[2]["function"].name, got[2]["function"].arguments }, id)
    end
  end)
end)
