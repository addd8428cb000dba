-- mirza.tools: fragments accumulated into whole calls (split at every
-- offset of the name and of the arguments, parallel and interleaved
-- indexes, invalid JSON reported), the stage's events, the OpenAI tools
-- array, and running calls (raising, nil-err, unknown, custom runner).
local mirza = require "mirza"
local tools = require "mirza.tools"
local json = mirza.json

-- The fragments of one call cut at `cut` of its name and `acut` of its
-- arguments, as `tool_call` deltas: the id in the first one only.
local function fragments(index, id, name, args, cut, acut)
  return {
    { { index = index, id = id, type = "function", ["function"] = { name = name:sub(1, cut), arguments = "" } } },
    { { index = index, ["function"] = { name = name:sub(cut + 1) } } },
    { { index = index, ["function"] = { arguments = args:sub(1, acut) } } },
    { { index = index, ["function"] = { arguments = args:sub(acut + 1) } } },
  }
end

local function events_of(list)
  local i = 0
  return function()
    i = i + 1
    return list[i]
  end
end

describe("mirza.tools accumulator", function()
  after_each(function() collectgarbage("collect") end)

  it("rebuilds a call cut at every offset of its name and arguments", function()
    local name, args = "get_weather", '{"city": "Lyon \\"été\\"", "days": [1, 2]}'
    local n = 0
    for cut = 0, #name do
      for acut = 0, #args do
        local acc = tools.accumulator()
        for _, d in ipairs(fragments(0, "call_1", name, args, cut, acut)) do tools.add(acc, d) end
        local calls = tools.finish(acc)
        assert.equal(1, #calls)
        local c = calls[1]
        assert.equal("call_1", c.id)
        assert.equal(name, c.name)
        assert.equal(args, c.arguments)
        assert.same({ city = 'Lyon "été"', days = { 1, 2 } }, c.args)
        assert.is_nil(c.error)
        n = n + 1
      end
    end
    assert.equal((#name + 1) * (#args + 1), n)
  end)

  it("keeps parallel calls apart by index, even interleaved, in index order", function()
    local acc = tools.accumulator()
    local a = fragments(0, "call_a", "add", '{"x": 1}', 1, 3)
    local b = fragments(1, "call_b", "mul", '{"y": 2}', 2, 5)
    for i = 1, 4 do
      tools.add(acc, b[i])
      tools.add(acc, a[i])
    end
    local calls = tools.finish(acc)
    assert.same({ 0, 1 }, { calls[1].index, calls[2].index })
    assert.same({ "call_a", "add", '{"x": 1}' }, { calls[1].id, calls[1].name, calls[1].arguments })
    assert.same({ "call_b", "mul", '{"y": 2}' }, { calls[2].id, calls[2].name, calls[2].arguments })
    assert.same({ y = 2 }, calls[2].args)
  end)

  it("reports arguments that are not a JSON object, never guessing", function()
    local cases = { ['{"city": "Ly'] = "invalid JSON arguments: ", ["[1, 2]"] = "invalid JSON arguments: not an object",
      ["42"] = "invalid JSON arguments: not an object" }
    for text, prefix in pairs(cases) do
      local acc = tools.accumulator()
      tools.add(acc, { { index = 0, id = "c", ["function"] = { name = "f", arguments = text } } })
      local c = tools.finish(acc)[1]
      assert.is_nil(c.args)
      assert.equal(text, c.arguments)
      assert.equal(prefix, c.error:sub(1, #prefix), c.error)
    end
  end)

  it("reads empty arguments as an empty object", function()
    local acc = tools.accumulator()
    tools.add(acc, { { index = 0, id = "c", ["function"] = { name = "now" } } })
    local c = tools.finish(acc)[1]
    assert.same({}, c.args)
    assert.equal("", c.arguments)
  end)

  it("gives the history shape servers expect", function()
    local acc = tools.accumulator()
    for _, d in ipairs(fragments(0, "call_1", "f", '{"a":1}', 0, 2)) do tools.add(acc, d) end
    assert.same({ { id = "call_1", type = "function", ["function"] = { name = "f", arguments = '{"a":1}' } } },
      tools.wire(tools.finish(acc)))
    assert.is_nil(tools.wire({}))
  end)
end)

describe("mirza.tools stage", function()
  it("emits one tool_call_done per call before done, which carries them", function()
    local list = { { type = "text", text = "hm" } }
    for _, d in ipairs(fragments(1, "call_b", "mul", '{"y": 2}', 1, 4)) do
      list[#list + 1] = { type = "tool_call", calls = d }
    end
    for _, d in ipairs(fragments(0, "call_a", "add", '{"x', 2, 2)) do
      list[#list + 1] = { type = "tool_call", calls = d }
    end
    list[#list + 1] = { type = "done", finish_reason = "tool_calls" }
    local got = {}
    for ev in tools.stage(events_of(list)) do got[#got + 1] = ev end
    assert.equal(#list + 2, #got)
    for i = 1, #list - 1 do assert.equal(list[i], got[i]) end -- passed through untouched
    assert.same({ "tool_call_done", "tool_call_done", "done" },
      { got[#got - 2].type, got[#got - 1].type, got[#got].type })
    local a, b = got[#got - 2].call, got[#got - 1].call
    assert.same({ "call_a", "add", '{"x' }, { a.id, a.name, a.arguments })
    assert.truthy(a.error)
    assert.same({ y = 2 }, b.args)
    assert.same({ a, b }, got[#got].tool_calls)
  end)

  it("leaves a stream without calls as it is", function()
    local list = { { type = "text", text = "x" }, { type = "done", finish_reason = "stop" } }
    local got = {}
    for ev in tools.stage(events_of(list)) do got[#got + 1] = ev end
    assert.same(list, got)
    assert.is_nil(got[2].tool_calls)
  end)
end)

describe("mirza.tools calls", function()
  local T = {
    add = { description = "a + b", parameters = { type = "object" }, fn = function(a) return a.a + a.b end },
    boom = { fn = function() error("kaput", 0) end },
    soft = { fn = function() return nil, "no such city" end },
    text = { fn = function(a, call) return "id " .. call.id .. " " .. a.s end },
  }
  local function call(name, args, id)
    return { id = id or "c1", name = name, arguments = json.encode(args), args = args }
  end

  it("encodes results: strings as is, other values as JSON, failures as {error}", function()
    assert.equal("5", tools.call(T, call("add", { a = 2, b = 3 })))
    assert.equal("id c9 hi", tools.call(T, call("text", { s = "hi" }, "c9")))
    assert.same({ error = "kaput" }, json.decode(tools.call(T, call("boom", {}))))
    assert.same({ error = "no such city" }, json.decode(tools.call(T, call("soft", {}))))
    assert.same({ error = 'unknown tool "nope"' }, json.decode(tools.call(T, call("nope", {}))))
    local bad = { id = "c", name = "add", arguments = "{", error = "invalid JSON arguments: x" }
    assert.same({ error = "invalid JSON arguments: x" }, json.decode(tools.call(T, bad)))
  end)

  it("lets Ctrl-C (and a task's cancel) through a tool: no error result sent to the model", function()
    local stopped = { fn = function() error("interrupted", 0) end }
    local cancel = {}
    local cancelled = { fn = function() error(cancel) end }
    assert.error_matches(function() tools.call({ stop = stopped }, call("stop", {})) end, "^interrupted$")
    local ok, err = pcall(tools.call, { c = cancelled }, call("c", {}))
    assert.is_false(ok)
    assert.equal(cancel, err)
  end)

  it("runs calls in order, or through a custom runner, into tool messages", function()
    local calls = { call("add", { a = 1, b = 1 }, "x"), call("boom", {}, "y") }
    local want = { { role = "tool", tool_call_id = "x", content = "2" },
      { role = "tool", tool_call_id = "y", content = '{"error":"kaput"}' } }
    assert.same(want, tools.run_calls(calls, T))
    local seen
    local msgs = tools.run_calls(calls, T, { run_calls = function(fns)
      seen = #fns
      local out = {}
      for i = #fns, 1, -1 do out[i] = fns[i]() end -- another order: results keep their place
      return out
    end })
    assert.equal(2, seen)
    assert.same(want, msgs)
  end)

  it("builds the OpenAI tools array sorted by name, the same table every time", function()
    local specs = tools.specs(T)
    assert.same({ "add", "boom", "soft", "text" },
      { specs[1]["function"].name, specs[2]["function"].name, specs[3]["function"].name, specs[4]["function"].name })
    assert.same({ type = "function",
      ["function"] = { name = "add", description = "a + b", parameters = { type = "object" } } }, specs[1])
    assert.equal(specs, tools.specs(T))
    local body = tools.add_to_body({}, T, { tool_choice = "required" })
    assert.same({ "required", true }, { body.tool_choice, body.parallel_tool_calls })
    assert.error_matches(function() tools.specs { x = {} } end, "tool x needs a fn")
  end)
end)
