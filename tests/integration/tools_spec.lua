-- Tools against mirza-sim (issue 10): a two-round loop with parallel calls
-- streamed in fragments ends with the right answer and a history the next
-- turn sends again byte for byte (as recorded on the wire); a raising
-- tool, invalid JSON arguments and an unknown tool become error results
-- the model sees; the round limit; a tools module hot-reloaded by name;
-- the plain-request loop (mirza.tools.run).
local mirza = require "mirza"
local engine = require "mirza.engine"
local tools = require "mirza.tools"
local H = require "tests.helper"

local json = mirza.json
local FAST = { "--tok-rate", "0", "--ttft-ms", "0" }

local function new_engine(extra)
  local opts = {
    preset = "mirza-sim", port = H.free_port(), config_file = false, session_id = "tools-" .. math.random(1e9),
    daemon = { args = FAST, deadline = 30, progress = false, grace = 2 },
    max_tokens = 256, log = function() end,
  }
  for k, v in pairs(extra or {}) do opts[k] = v end
  local e = engine.new(opts)
  assert(e:load())
  e:set_thinking(false)
  return e
end

local WEATHER = { type = "object", properties = { city = { type = "string" } }, required = { "city" } }
local function weather_tools(log)
  return {
    get_weather = { description = "Weather of a city", parameters = WEATHER, fn = function(a)
      log[#log + 1] = a.city
      return { ("%s: %d °C"):format(a.city, #a.city) } -- a table: sent as JSON
    end },
    add = { description = "a + b", fn = function(a) return a.a + a.b end },
    boom = { description = "always fails", fn = function() error("boom: the sensor is down", 0) end },
  }
end

-- Two rounds: two calls in parallel, then one; the ids are the script's.
local SCRIPT = {
  { { id = "c1", name = "get_weather", arguments = '{"city": "Lyon"}' },
    { id = "c2", name = "get_weather", arguments = { city = "Saint-Étienne" } } },
  { { id = "c3", name = "add", arguments = { a = 2, b = 40 } } },
}

local function sim_opts(script) return { body_extra = { mirza_sim = { tool_calls = script } } } end

local function merged(a, b)
  local t = {}
  for k, v in pairs(a) do t[k] = v end
  for k, v in pairs(b or {}) do t[k] = v end
  return t
end

describe("the engine's tool loop", function()
  local e, dir
  setup(function()
    dir = H.tmpname(".rec")
    e = new_engine { record = dir }
  end)
  teardown(function()
    e:unload()
    os.execute("rm -rf " .. H.q(dir))
  end)
  before_each(function() e:reset() end)
  after_each(function() collectgarbage("collect") end)

  it("runs parallel fragmented calls over two rounds and answers with their results", function()
    local cities, routed, results = {}, {}, {}
    local st, res = e:say("Quel temps ?", merged(sim_opts(SCRIPT), {
      tools = weather_tools(cities), answer = function(s) routed[#routed + 1] = s end, mode = "token",
      on_tool_result = function(call, content) results[#results + 1] = call.id .. "=" .. content end }))
    assert(st, res)
    assert.same({ "Lyon", "Saint-Étienne" }, cities)
    assert.equal(3, res.rounds)
    local want = 'tool results: [c1] ["Lyon: 4 °C"]; [c2] ["Saint-Étienne: 14 °C"]; [c3] 42'
    assert.equal(want, res.answer)
    assert.equal(want, table.concat(routed))
    assert.same({ 'c1=["Lyon: 4 °C"]', 'c2=["Saint-Étienne: 14 °C"]', "c3=42" }, results)
    local m = e.history.messages
    assert.same({ "user", "assistant", "tool", "tool", "assistant", "tool", "assistant" },
      (function() local r = {} for i, x in ipairs(m) do r[i] = x.role end return r end)())
    assert.equal(json.null, m[2].content)
    assert.same({
      { id = "c1", type = "function", ["function"] = { name = "get_weather", arguments = '{"city": "Lyon"}' } },
      { id = "c2", type = "function", ["function"] = { name = "get_weather", arguments = '{"city":"Saint-Étienne"}' } },
    }, m[2].tool_calls)
    assert.same({ role = "tool", tool_call_id = "c3", content = "42" }, m[6])
  end)

  it("sends the whole history again as a prefix of the next turn, and the cache hits", function()
    local first = assert(e:say("Quel temps ?", merged(sim_opts(SCRIPT), { tools = weather_tools({}),
      answer = function() end })))
    local history = json.decode(json.encode(e.history.messages))
    local st = assert(e:say("Merci !", { tools = weather_tools({}), answer = function() end }))
    -- the request of that turn, as the simulator received it: the last recorded
    local n = 0
    while io.open(("%s/%06d.request"):format(dir, n + 1)) do n = n + 1 end
    local raw = H.read_file(("%s/%06d.request"):format(dir, n))
    local body = json.decode(raw:match("\n\n(.*)$"))
    assert.equal(#history + 1, #body.messages)
    for i, m in ipairs(history) do assert.same(m, body.messages[i]) end
    assert.same({ role = "user", content = "Merci !" }, body.messages[#body.messages])
    assert.same({ "add", "boom", "get_weather" }, { body.tools[1]["function"].name, body.tools[2]["function"].name,
      body.tools[3]["function"].name })
    assert.same({ "auto", true }, { body.tool_choice, body.parallel_tool_calls })
    assert.is_true(st.session_cache_hit)
    -- the whole prompt of the last round is a prefix of this one (the sim
    -- counts a common prefix of the serialised messages, less the closing ])
    assert.truthy(st.cached_tokens >= first.prompt_tokens - 1, st.cached_tokens .. " / " .. first.prompt_tokens)
  end)

  it("gives the model an error result for a raising tool, bad JSON and an unknown tool", function()
    local script = { { { id = "b1", name = "boom", arguments = "{}" }, { id = "b2", name = "get_weather",
      arguments = '{"city": "Ly' }, { id = "b3", name = "teleport", arguments = "{}" } } }
    local calls = {}
    local st, res = e:say("Essaie", merged(sim_opts(script), { tools = weather_tools({}), answer = function() end,
      on_tool_result = function(c) calls[#calls + 1] = c end }))
    assert(st, res)
    assert.equal(2, res.rounds)
    assert.equal('tool results: [b1] {"error":"boom: the sensor is down"}; [b2] {"error":"invalid JSON arguments: '
      .. calls[2].error:sub(#"invalid JSON arguments: " + 1) .. '"}; [b3] {"error":"unknown tool \\"teleport\\""}',
      res.answer)
    assert.equal('{"city": "Ly', calls[2].arguments)
    assert.is_nil(calls[2].args)
  end)

  it("reports the calls as tool_call_done events and on done, one turn at a time", function()
    local evs = {}
    for ev in e:turn("Quel temps ?", merged(sim_opts(SCRIPT), { tools = weather_tools({}) })) do
      evs[#evs + 1] = ev
    end
    local done_calls = {}
    for _, ev in ipairs(evs) do
      if ev.type == "tool_call_done" then done_calls[#done_calls + 1] = ev.call.id .. " " .. ev.call.name end
    end
    assert.same({ "c1 get_weather", "c2 get_weather" }, done_calls)
    local last = evs[#evs]
    assert.same({ "done", "tool_calls", 2 }, { last.type, last.finish_reason, #last.tool_calls })
    assert.same({ city = "Saint-Étienne" }, last.tool_calls[2].args)
    assert.equal(evs[#evs - 1].call, last.tool_calls[2])
  end)

  it("stops at max_rounds with code 'rounds', the history still valid", function()
    local script = { { { id = "r1", name = "add", arguments = { a = 1, b = 1 } } },
      { { id = "r2", name = "add", arguments = { a = 1, b = 2 } } }, { { id = "r3", name = "add", arguments = "{}" } } }
    local st, msg, code, res = e:say("Compte", merged(sim_opts(script), { tools = weather_tools({}), max_rounds = 2,
      answer = function() end }))
    assert.is_nil(st)
    assert.same({ "tool loop: no answer after 2 rounds", "rounds", 2 }, { msg, code, res.rounds })
    local m = e.history.messages
    assert.same({ role = "tool", tool_call_id = "r2", content = "3" }, m[#m])
    assert.equal("r2", m[#m - 1].tool_calls[1].id)
  end)

  it("runs the calls through an injected runner", function()
    local batches = {}
    local st = e:say("Quel temps ?", merged(sim_opts(SCRIPT), { tools = weather_tools({}), answer = function() end,
      run_calls = function(fns)
        batches[#batches + 1] = #fns
        local out = {}
        for i = #fns, 1, -1 do out[i] = fns[i]() end
        return out
      end }))
    assert.truthy(st)
    assert.same({ 2, 1 }, batches)
  end)

  it("runs the calls of a round concurrently inside a scheduler task", function()
    local loop = require "mirza.loop"
    local running, most = 0, 0
    local function slow(name)
      return { description = name, fn = function()
        running = running + 1
        most = math.max(most, running)
        mirza.sleep(0.3) -- yields to the scheduler inside a task
        running = running - 1
        return name
      end }
    end
    local script = { { { id = "s1", name = "one", arguments = "{}" }, { id = "s2", name = "two", arguments = "{}" } } }
    local st, res = loop.run(function()
      return e:say("Deux outils", merged(sim_opts(script), { tools = { one = slow "one", two = slow "two" },
        answer = function() end }))
    end)
    assert.truthy(st, tostring(res))
    assert.equal(2, most) -- both calls were in flight at once
    assert.equal("tool results: [s1] one; [s2] two", res.answer)
    -- outside a task the same round runs one call after the other
    most = 0
    assert.truthy(e:say("Deux outils", merged(sim_opts(script), { tools = { one = slow "one", two = slow "two" },
      answer = function() end })))
    assert.equal(1, most)
  end)
end)

describe("a tools module given by name", function()
  local dir, e, path
  local function write(result)
    local f = assert(io.open(path, "w"))
    f:write(("return { ping = { description = 'ping', fn = function() return %q end } }\n"):format(result))
    f:close()
  end
  setup(function()
    dir = H.tmpname(".mod")
    os.execute("mkdir -p " .. H.q(dir))
    path = dir .. "/spec_tools_mod.lua"
    write("pong")
    package.path = dir .. "/?.lua;" .. package.path
    e = new_engine { tools = "spec_tools_mod" }
  end)
  teardown(function()
    e:unload()
    package.loaded.spec_tools_mod = nil
    os.execute("rm -rf " .. H.q(dir))
  end)

  it("is hot-reloaded between turns", function()
    local script = { { { id = "p", name = "ping", arguments = "{}" } } }
    local _, res = assert(e:say("ping", merged(sim_opts(script), { answer = function() end })))
    assert.equal("tool results: [p] pong", res.answer)
    write("pong, version two")
    assert.truthy(H.wait_for(function()
      local _, r = assert(e:say("ping", merged(sim_opts(script), { answer = function() end })))
      return r.answer == "tool results: [p] pong, version two"
    end, 10, 0.2))
  end)
end)

describe("mirza.tools.run over plain requests", function()
  local sim
  setup(function() sim = H.start_sim(FAST) end)
  teardown(function() sim.stop() end)

  it("loops until the model answers, and keeps the messages", function()
    local res = assert(tools.run { url = sim.url,
      body = H.chat_body("Quel temps ?", { mirza_sim = { tool_calls = SCRIPT } }), tools = weather_tools({}) })
    assert.equal(3, res.rounds)
    assert.equal('tool results: [c1] ["Lyon: 4 °C"]; [c2] ["Saint-Étienne: 14 °C"]; [c3] 42', res.text)
    assert.equal(7, #res.messages)
    assert.same({ "stop", "c3" }, { res.finish_reason, res.messages[6].tool_call_id })
  end)
end)

-- How calls come over the wire (issue 21): real daemons send a call's id,
-- type and whole name in its first fragment; the simulator does the same
-- by default, and splits the name only under the tool-name-split fault.
-- mirza joins name pieces (as the OpenAI Python SDK does; the Node SDK
-- keeps the last piece), so a server that splits names still works.
describe("tool-call fragments on the wire", function()
  local sim
  setup(function() sim = H.start_sim(FAST) end)
  teardown(function() sim.stop() end)
  after_each(function() collectgarbage("collect") end)

  local ONE = { { id = "w1", name = "get_weather", arguments = { city = "Lyon" } } }
  local TOOLS = { { type = "function", ["function"] = { name = "get_weather", parameters = WEATHER } } }

  -- The fragments of a streamed answer to a request with tools.
  local function fragments(fault)
    local s <close> = mirza.open { url = sim.url, body = H.chat_body("Quel temps ?",
      { tools = TOOLS, mirza_sim = { tool_calls = ONE, fault = fault } }) }
    local frags, acc, last = {}, tools.accumulator(), nil
    for ev in s:events() do
      if ev.type == "tool_call" then
        for _, f in ipairs(ev.calls) do frags[#frags + 1] = f end
        tools.add(acc, ev.calls)
      end
      last = ev
    end
    assert.same({ "done", "tool_calls" }, { last.type, last.finish_reason })
    return frags, tools.finish(acc)
  end

  it("sends each call's id, type and whole name in its first fragment, then only arguments", function()
    local frags, calls = fragments(nil)
    assert.same({ index = 0, id = "w1", type = "function", ["function"] = { name = "get_weather", arguments = "" } },
      frags[1])
    for i = 2, #frags do
      assert.is_nil(frags[i].id)
      assert.is_nil(frags[i]["function"].name)
    end
    assert.is_true(#frags > 3) -- the arguments still come in pieces
    assert.same({ "w1", "get_weather", '{"city":"Lyon"}' }, { calls[1].id, calls[1].name, calls[1].arguments })
  end)

  it("joins a name sent in pieces (fault tool-name-split)", function()
    local frags, calls = fragments("tool-name-split")
    assert.same({ "get_w", "eather" }, { frags[1]["function"].name, frags[2]["function"].name })
    assert.is_nil(frags[2].id)
    assert.same({ "w1", "get_weather", { city = "Lyon" } }, { calls[1].id, calls[1].name, calls[1].args })
  end)

  it("runs the engine's tool loop against split names", function()
    local e = new_engine()
    local cities = {}
    local st, res = e:say("Quel temps ?", { tools = weather_tools(cities), answer = function() end,
      body_extra = { mirza_sim = { tool_calls = SCRIPT, fault = "tool-name-split" } } })
    e:unload()
    assert(st, res)
    assert.same({ "Lyon", "Saint-Étienne" }, cities)
    assert.equal('tool results: [c1] ["Lyon: 4 °C"]; [c2] ["Saint-Étienne: 14 °C"]; [c3] 42', res.answer)
  end)

  it("joins split names in batch output records too (mirza.batch)", function()
    local input, output = H.tmpname(".jsonl"), H.tmpname(".jsonl")
    local f = assert(io.open(input, "w"))
    for _, fault in ipairs { "none", "tool-name-split" } do
      f:write(json.encode { custom_id = fault, method = "POST", url = "/v1/chat/completions", body = {
        messages = { { role = "user", content = "Quel temps ?" } }, tools = TOOLS,
        mirza_sim = { tool_calls = ONE, fault = fault ~= "none" and fault or nil } } }, "\n")
    end
    f:close()
    assert(require("mirza.batch").run { input = input, output = output, endpoints = { sim.base }, quiet = true,
      progress = false })
    local n = 0
    for line in io.lines(output) do
      local rec = json.decode(line)
      local call = rec.response.body.choices[1].message.tool_calls[1]
      assert.same({ "w1", "get_weather", '{"city":"Lyon"}' }, { call.id, call["function"].name,
        call["function"].arguments }, rec.custom_id)
      n = n + 1
    end
    os.remove(input)
    os.remove(output)
    assert.equal(2, n)
  end)

  it("answers a non-streamed request with message.tool_calls and content null", function()
    local body = H.chat_body("Quel temps ?", { stream = false, tools = TOOLS, mirza_sim = { tool_calls = ONE } })
    local text = assert(mirza.request { url = sim.url, body = body })
    local r = json.decode(text)
    assert.equal("tool_calls", r.choices[1].finish_reason)
    assert.equal(json.null, r.choices[1].message.content)
    local fn = { name = "get_weather", arguments = '{"city":"Lyon"}' }
    assert.same({ { id = "w1", type = "function", ["function"] = fn } }, r.choices[1].message.tool_calls)
    assert.is_true(r.usage.completion_tokens > 0)
  end)
end)
