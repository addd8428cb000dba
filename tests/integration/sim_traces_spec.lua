-- mirza-sim against the recorded traces of the real daemons (issue 21):
-- the simulator's frames, field by field, beside llama-server's captures
-- and MTPLX's reconstructed frames (tests/fixtures/traces, the captures
-- the project was founded on). For each kind of frame (role, reasoning, text,
-- tool call, finish, usage, progress, heartbeat, error) the paths of its
-- members, in order and with their JSON types, must be the trace's; the
-- frame kinds must come in the trace's order; ids, created and
-- system_fingerprint must look like the daemon's. What differs on purpose
-- is listed in ALLOWED below and in man/mirza-sim.1 (DIFFERENCES FROM REAL
-- DAEMONS); anything else is a bug in the simulator.
local mirza = require "mirza"
local H = require "tests.helper"

local FAST = { "--tok-rate", "0", "--ttft-ms", "0" }

-- ---- an order-keeping JSON reader: a value's shape as a list of paths --

-- Read the JSON value at s[i]; append "path:type" entries to out in the
-- order the members appear (objects "path.key", array items "path[]").
-- Returns the index after the value.
local function walk(s, i, path, out)
  i = s:find("%S", i)
  local c = s:sub(i, i)
  if c == "{" then
    i = s:find("%S", i + 1)
    if s:sub(i, i) == "}" then
      out[#out + 1] = path .. ":{}"
      return i + 1
    end
    while true do
      i = s:find("%S", i)
      local key, j = s:match('^"(.-[^\\]?)"%s*:()', i)
      assert(key, "bad JSON object at " .. i .. ": " .. s:sub(i, i + 40))
      i = walk(s, j, path .. "." .. key, out)
      i = s:find("%S", i)
      local d = s:sub(i, i)
      if d == "}" then return i + 1 end
      assert(d == ",", "bad JSON at " .. i)
      i = i + 1
    end
  elseif c == "[" then
    i = s:find("%S", i + 1)
    if s:sub(i, i) == "]" then
      out[#out + 1] = path .. ":[]"
      return i + 1
    end
    local seen = {}
    while true do
      local item = {}
      i = walk(s, i, path .. "[]", item)
      for _, p in ipairs(item) do -- items of one shape are listed once
        if not seen[p] then
          seen[p] = true
          out[#out + 1] = p
        end
      end
      i = s:find("%S", i)
      if s:sub(i, i) == "]" then return i + 1 end
      i = i + 1
    end
  elseif c == '"' then
    local j = i + 1
    while true do
      local q = s:find('["\\]', j)
      if s:sub(q, q) == '"' then
        out[#out + 1] = path .. ":string"
        return q + 1
      end
      j = q + 2
    end
  end
  local lit = s:match("^[%w%.%+%-]+", i)
  local t = lit == "null" and "null" or (lit == "true" or lit == "false") and "bool" or "number"
  out[#out + 1] = path .. ":" .. t
  return i + #lit
end

local function paths(text)
  local out = {}
  walk(text, 1, "", out)
  return out
end

-- ---- frames ---------------------------------------------------------------

-- The data lines of an SSE body, [DONE] as the string "[DONE]".
local function data_lines(body)
  local out = {}
  for line in body:gmatch("[^\n]+") do
    local d = line:match("^data: (.*)$")
    if d then out[#out + 1] = d:gsub("\r$", "") end
  end
  return out
end

-- What a frame is, from its decoded JSON.
local function kind_of(f)
  if f == "[DONE]" then return "done" end
  if f.error then return "error" end
  if f.mtplx_progress then return f.mtplx_progress.heartbeat and "heartbeat" or "progress" end
  local ch = f.choices and f.choices[1]
  if not ch then return "usage" end
  if ch.finish_reason ~= mirza.json.null then return "finish" end
  local d = ch.delta
  if d.role then return "role" end
  if d.reasoning_content then return "reasoning" end
  if d.tool_calls then return d.tool_calls[1].id and "tool_head" or "tool_args" end
  if d.content then return "text" end
  return "other"
end

-- {kind, paths, json} for every frame of an SSE body.
local function frames(body)
  local out = {}
  for _, d in ipairs(data_lines(body)) do
    local f = d == "[DONE]" and d or assert(mirza.json.decode(d))
    out[#out + 1] = { kind = kind_of(f), paths = d ~= "[DONE]" and paths(d) or {}, json = f }
  end
  return out
end

-- The kinds in order, runs collapsed ("role text finish usage done").
local function kinds(fs)
  local out = {}
  for _, f in ipairs(fs) do
    if out[#out] ~= f.kind then out[#out + 1] = f.kind end
  end
  return table.concat(out, " ")
end

-- Differences on purpose, per dialect: paths the simulator adds ("+path")
-- or leaves out ("-path"), each documented in man/mirza-sim.1. None at
-- present: every frame compared here has the trace's members; what still
-- differs is values (ids, fingerprint, counts) and what no trace shows.
local ALLOWED = {
  llama = {},
  mtplx = {},
}

-- The paths of sim frame f beside the trace frame of its kind, minus the
-- allowed differences; nil when equal, else a readable diff.
local function diff(dialect, want, got)
  local allowed, w, g = ALLOWED[dialect], {}, {}
  for _, p in ipairs(want) do
    if not allowed["-" .. p] then w[#w + 1] = p end
  end
  for _, p in ipairs(got) do
    if not allowed["+" .. p] then g[#g + 1] = p end
  end
  local same = #w == #g
  for i = 1, same and #w or 0 do
    local wp, wt = w[i]:match("^(.*):(.-)$")
    local gp, gt = g[i]:match("^(.*):(.-)$")
    same = same and wp == gp and (wt == gt or wt == "null" or gt == "null") -- a null stands for any value
  end
  if same then return nil end
  return "trace: " .. table.concat(w, " ") .. "\n  sim: " .. table.concat(g, " ")
end

-- Every sim frame of a kind the trace has must have the trace's paths.
local function same_shapes(dialect, trace, sim)
  local ref = {}
  for _, f in ipairs(trace) do ref[f.kind] = ref[f.kind] or f.paths end
  local bad = {}
  for _, f in ipairs(sim) do
    local d = ref[f.kind] and diff(dialect, ref[f.kind], f.paths)
    if d and not bad[f.kind] then bad[f.kind] = f.kind .. " frame differs:\n  " .. d end
  end
  local msgs = {}
  for _, m in pairs(bad) do msgs[#msgs + 1] = m end
  table.sort(msgs)
  assert(#msgs == 0, table.concat(msgs, "\n"))
end

local function trace(name) return frames(H.read_file(H.traces .. "/" .. name)) end

local function raw(sim, body, headers, path)
  local url = path and sim.base .. path or sim.url
  local s <close> = mirza.open { url = url, body = body, headers = headers, plain = true, timeout = 10 }
  local ev = s:next()
  assert(ev.type == "response", ev.message)
  return ev.body, ev.headers, ev.status
end

-- Ids, created and fingerprint: one value per stream, shaped like the daemon's.
local function same_identity(fs, id_pattern, fingerprint)
  local first
  for _, f in ipairs(fs) do
    if f.kind ~= "done" then
      first = first or f.json
      assert.equal(first.id, f.json.id)
      assert.equal(first.created, f.json.created)
      assert.equal("chat.completion.chunk", f.json.object)
      if fingerprint then assert.truthy(tostring(f.json.system_fingerprint):match(fingerprint))
      else assert.is_nil(f.json.system_fingerprint) end
    end
  end
  assert.truthy(first.id:match(id_pattern), first.id)
  assert.truthy(math.type(first.created) == "integer" and math.abs(first.created - os.time()) < 60)
end

-- A .txt trace: status, headers (names in lowercase) and body.
local function http_trace(name)
  local text = H.read_file(H.traces .. "/" .. name)
  local head, body = text:match("^(.-)\r?\n\r?\n(.*)$")
  local status = tonumber(head:match("^HTTP/1%.1 (%d+)"))
  local headers = {}
  for k, v in head:gmatch("\n([%w%-]+):%s*([^\r\n]*)") do headers[k:lower()] = v end
  return status, headers, body
end

-- The body paths of a plain answer beside a .txt trace's.
local function same_body(dialect, name, body, headers, status)
  local t_status, t_headers, t_body = http_trace(name)
  assert.equal(t_status, status)
  assert.equal(t_headers["content-type"], headers["content-type"])
  local d = diff(dialect, paths(t_body), paths(body))
  assert(not d, name .. " body differs:\n  " .. tostring(d))
  return t_headers
end

local LLAMA_ID = "^chatcmpl%-" .. ("[%w]"):rep(32) .. "$"
local FINGERPRINT = "^b%d+%-[%w%-]+$"

describe("mirza-sim beside llama-server's traces", function()
  local sim
  setup(function() sim = H.start_sim { "--dialect", "llama", "--context-window", "256", table.unpack(FAST) } end)
  teardown(function() sim.stop() end)
  after_each(function() collectgarbage("collect") end)

  local function body(extra, think)
    local b = H.chat_body("Bonjour", { chat_template_kwargs = { enable_thinking = think or false } })
    for k, v in pairs(extra or {}) do b[k] = v end
    return b
  end

  it("streams with include_usage like chat_stream_usage.sse: finish frame, then usage and timings with no choices",
    function()
      local t = trace("llama-server.chat_stream_usage.sse")
      local s = frames(raw(sim, body { stream_options = { include_usage = true } }))
      assert.equal(kinds(t), kinds(s))
      assert.equal("role text finish usage done", kinds(s))
      same_shapes("llama", t, s)
      same_identity(s, LLAMA_ID, FINGERPRINT)
    end)

  it("streams without include_usage like chat_stream_no_usage.sse: timings on the finish frame", function()
    local t = trace("llama-server.chat_stream_no_usage.sse")
    local s = frames(raw(sim, body()))
    assert.equal(kinds(t), kinds(s))
    same_shapes("llama", t, s)
    same_identity(s, LLAMA_ID, FINGERPRINT)
  end)

  it("streams reasoning like reasoning_grammar_stream.sse", function()
    local t = trace("llama-server.reasoning_grammar_stream.sse")
    local s = frames(raw(sim, body(nil, true)))
    assert.equal(kinds(t), kinds(s))
    same_shapes("llama", t, s)
  end)

  it("answers a non-streamed request like chat_nonstream.txt", function()
    local b, h, st = raw(sim, body { stream = false })
    same_body("llama", "llama-server.chat_nonstream.txt", b, h, st)
    local r = mirza.json.decode(b)
    assert.truthy(r.id:match(LLAMA_ID) and r.system_fingerprint:match(FINGERPRINT))
  end)

  -- No capture: the order is llama.cpp's (common_chat_msg::to_json_oaicompat).
  it("puts reasoning_content before content, and tool calls as type, function, id, in a non-streamed message",
    function()
      local b = raw(sim, body({ stream = false }, true))
      local p = table.concat(paths(b), " ")
      assert.truthy(p:find(".choices[].message.role:string .choices[].message.reasoning_content:string "
        .. ".choices[].message.content:string", 1, true), p)
      local calls = { { id = "t1", name = "get_weather", arguments = "{}" } }
      b = raw(sim, body({ stream = false, tools = { { type = "function", ["function"] = { name = "get_weather" } } },
        mirza_sim = { tool_calls = calls } }))
      p = table.concat(paths(b), " ")
      assert.truthy(p:find(".choices[].message.role:string .choices[].message.content:null "
        .. ".choices[].message.tool_calls[].type:string .choices[].message.tool_calls[].function.name:string "
        .. ".choices[].message.tool_calls[].function.arguments:string .choices[].message.tool_calls[].id:string",
        1, true), p)
    end)

  it("refuses like the err_*.txt traces: status, body, Connection: close", function()
    local cases = {
      { "llama-server.err_missing_messages_stream.txt", { model = "m", stream = true } },
      { "llama-server.err_ctx_exceeded_stream.txt",
        body { messages = { { role = "user", content = ("x"):rep(1200) } } } },
    }
    for _, c in ipairs(cases) do
      local ev = (function()
        local s <close> = mirza.open { url = sim.url, body = c[2], timeout = 10 }
        return s:next()
      end)()
      assert.equal("http", ev.code, c[1])
      local th = same_body("llama", c[1], ev.body, ev.headers, ev.status)
      assert.equal(th.connection, ev.headers.connection)
    end
    local s <close> = mirza.open { url = sim.url, body = '{"messages":[', timeout = 10 }
    local ev = s:next()
    same_body("llama", "llama-server.err_invalid_json.txt", ev.body, ev.headers, ev.status)
  end)

  it("lists its model with the members OpenAI clients read (id, object, created, owned_by; meta.n_ctx)", function()
    local _, _, t_body = http_trace("llama-server.v1_models.txt")
    local b = raw(sim, nil, nil, "/v1/models")
    local m, t = mirza.json.decode(b), mirza.json.decode(t_body)
    assert.equal(t.object, m.object)
    for _, k in ipairs { "id", "object", "created", "owned_by" } do
      assert.equal(math.type(t.data[1][k]) or type(t.data[1][k]), math.type(m.data[1][k]) or type(m.data[1][k]), k)
    end
    assert.equal(256, m.data[1].meta.n_ctx)
  end)
end)

describe("mirza-sim beside MTPLX's reconstructed frames", function()
  local sim
  setup(function()
    sim = H.start_sim { "--tok-rate", "0", "--ttft-ms", "150", "--heartbeat-ms", "40", "--progress-every", "8" }
  end)
  teardown(function() sim.stop() end)
  after_each(function() collectgarbage("collect") end)

  local HEADERS = { ["X-MTPLX-Session-Id"] = "traces", ["X-MTPLX-Allow-Client-Controls"] = "1" }
  local function without(fs, drop)
    local out = {}
    for _, f in ipairs(fs) do
      if not drop[f.kind] then out[#out + 1] = f end
    end
    return out
  end

  it("streams thinking like thinking_stream.sse: heartbeat, progress, reasoning, text, usage, mtplx_stats", function()
    local t = trace("mtplx.reconstructed.thinking_stream.sse")
    local s = frames(raw(sim, H.chat_body("Bonjour", { enable_thinking = true }), HEADERS))
    local beats = { heartbeat = true, progress = true }
    assert.equal(kinds(without(t, beats)), kinds(without(s, beats)))
    same_shapes("mtplx", t, s)
    local seen = {}
    for _, f in ipairs(s) do seen[f.kind] = true end
    assert.truthy(seen.heartbeat and seen.progress)
    same_identity(s, "^chatcmpl%-[%w%-]+$", nil)
  end)

  it("ends a failing stream like midstream_error.sse: finish_reason error, the error beside it, then [DONE]", function()
    local t = trace("mtplx.reconstructed.midstream_error.sse")
    local failing = H.chat_body("Bonjour", { mirza_sim = { fault = "error-after=2", ttft_ms = 0 } })
    local s = frames(raw(sim, failing, HEADERS))
    assert.equal(kinds(t), kinds(s))
    same_shapes("mtplx", t, s)
  end)

  it("refuses a prompt past the context window like err_context.txt", function()
    local s <close> = mirza.open { url = sim.url, timeout = 10,
      body = H.chat_body(("x"):rep(140000), { mirza_sim = { ttft_ms = 0 } }) }
    local ev = s:next()
    same_body("mtplx", "mtplx.reconstructed.err_context.txt", ev.body, ev.headers, ev.status)
  end)
end)
