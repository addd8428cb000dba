-- JSON keeps its shape in the events (issue 31 item 8): the tables the C
-- core decodes from a daemon's frames — a done event's usage, timings and
-- extra, a tool_call event's calls, an error event's error body — mark
-- their arrays as mirza.json.decode does, so json.encode gives back "[]"
-- for an empty array and "{}" for an empty object. Served by
-- mirza-sim --replay-dir byte for byte.
local mirza = require "mirza"
local H = require "tests.helper"

local json = mirza.json

-- A simulator answering the chat route with this response.
local function serving(response)
  local dir = H.tmpname(".rec")
  assert(os.execute("mkdir -p " .. H.q(dir)))
  H.write_file(dir .. "/000001.request", "POST /v1/chat/completions\n\n{}")
  H.write_file(dir .. "/000001.response", response)
  local sim = H.start_sim { "--replay-dir", dir }
  finally(function()
    sim.stop()
    os.execute("rm -rf " .. H.q(dir))
  end)
  return sim
end

local function sse(frames)
  local out = { "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n\r\n" }
  for _, f in ipairs(frames) do out[#out + 1] = "data: " .. f .. "\n\n" end
  out[#out + 1] = "data: [DONE]\n\n"
  return table.concat(out)
end

local function chunk(delta, finish, more)
  return ('{"id":"x","object":"chat.completion.chunk","choices":[{"index":0,"delta":%s,"finish_reason":%s}]%s}')
    :format(delta, finish and ('"' .. finish .. '"') or "null", more or "")
end

local function events(sim)
  local s <close> = mirza.open { url = sim.url, body = H.chat_body("x") }
  return H.drain(s, 30)
end

describe("the tables of the events", function()
  after_each(function() collectgarbage("collect") end)

  it("a done event's usage, timings and extra: empty arrays stay [], empty objects {}", function()
    local USAGE = '{"completion_tokens":1,"details":{},"prompt_tokens":2,"x_cached":[]}'
    local TIMINGS = '{"x_per_layer":[[],[1]],"x_spec":{}}'
    local sim = serving(sse {
      chunk('{"content":"hi"}', nil, ',"x_list":[],"x_obj":{},"x_deep":{"a":[[]],"b":[{}]}'),
      chunk("{}", "stop", ',"usage":' .. USAGE .. ',"timings":' .. TIMINGS),
    })
    local r = events(sim)
    assert.equal("hi", r.text)
    local done = r.last
    assert.equal("done", done.type)
    assert.equal(USAGE, json.encode(done.usage))
    assert.equal(TIMINGS, json.encode(done.timings))
    assert.equal('{"x_deep":{"a":[[]],"b":[{}]},"x_list":[],"x_obj":{}}', json.encode(done.extra))
  end)

  it("a tool_call event's calls: the delta's array, an empty list in it as []", function()
    local CALLS = '[{"function":{"arguments":"{}","name":"f"},"id":"c1","index":0,"type":"function",'
      .. '"x_meta":{"opts":{},"tags":[]}}]'
    local sim = serving(sse { chunk('{"tool_calls":' .. CALLS .. "}"), chunk("{}", "tool_calls") })
    local calls
    for _, ev in ipairs(events(sim).events) do
      if ev.type == "tool_call" then calls = ev.calls end
    end
    assert.is_table(calls)
    assert.equal(CALLS, json.encode(calls))
    assert.equal("mirza.json.array", getmetatable(calls).__name)
  end)

  it("an error event's error body: empty arrays stay [], empty objects {}", function()
    local BODY = '{"detail":[{"ctx":{},"input":{},"loc":[],"msg":"Field required","type":"missing"}]}'
    local sim = serving("HTTP/1.1 422 Unprocessable Entity\r\nContent-Type: application/json\r\n\r\n" .. BODY)
    local ev = events(sim).last
    assert.same({ "error", "http", 422 }, { ev.type, ev.code, ev.status })
    assert.is_table(ev.error)
    local text = json.encode(ev.error)
    assert.truthy(BODY:find(text, 1, true), text .. " is not the body's: " .. BODY)
    assert.truthy(text:find('"loc":[]', 1, true), text)
    assert.truthy(text:find('"input":{}', 1, true), text)
  end)

  it("a mid-stream error frame's error object", function()
    local ERR = '{"code":500,"details":[],"message":"boom","metadata":{},"type":"server_error"}'
    local sim = serving(sse { chunk('{"content":"a"}'), '{"error":' .. ERR .. "}" })
    local ev = events(sim).last
    assert.equal("error", ev.type)
    assert.equal(ERR, json.encode(ev.error))
  end)
end)
