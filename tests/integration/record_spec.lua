-- Record and replay (issue 10): a recorded request has its request file
-- (secrets redacted) and the response as received; mirza-sim --replay-dir
-- serves it again and the events are the same, byte for byte; matching by
-- body; a used-up recording fails clearly; MIRZA_RECORD records a whole
-- process; an engine's tool session is logged one line per turn in
-- runs.jsonl and replays offline to the same answers.
local mirza = require "mirza"
local engine = require "mirza.engine"
local H = require "tests.helper"

local json = mirza.json
local FAST = { "--tok-rate", "0", "--ttft-ms", "0" }
local SECRET = "sk-very-secret-4242"

local function events(opts)
  local s <close> = mirza.open(opts)
  return H.drain(s, 30).events
end

local function files(dir)
  local p = assert(io.popen("ls " .. H.q(dir)))
  local out = {}
  for l in p:lines() do out[#out + 1] = l end
  p:close()
  return out
end

local function body_of(response)
  return response:match("\r\n\r\n(.*)$")
end

describe("recording a request", function()
  local sim, dir
  setup(function()
    sim = H.start_sim { "--tok-rate", "0", "--ttft-ms", "0", "--api-key", SECRET }
    dir = H.tmpname(".rec")
  end)
  teardown(function()
    sim.stop()
    os.execute("rm -rf " .. H.q(dir))
  end)
  after_each(function() collectgarbage("collect") end)

  it("writes the request without secrets and the response as received", function()
    local body = H.chat_body("Bonjour", { reasoning_effort = "low" })
    local evs = events { url = sim.url .. "?api_key=" .. SECRET .. "&x=1", body = body, api_key = SECRET,
      headers = { ["X-Api-Key"] = SECRET, ["X-MTPLX-Session-Id"] = "rec-1", "X-Token: " .. SECRET }, record = dir }
    assert.equal("done", evs[#evs].type)
    assert.same({ "000001.request", "000001.response" }, files(dir))
    local req = H.read_file(dir .. "/000001.request")
    local head, sent = req:match("^(.-)\n\n(.*)$")
    assert.equal(table.concat({
      "POST " .. sim.url .. "?api_key=[redacted]&x=1",
      "X-Api-Key: [redacted]", "X-MTPLX-Session-Id: rec-1", "X-Token: [redacted]",
      "Authorization: [redacted]" }, "\n"), head)
    assert.same(body, json.decode(sent))
    local resp = H.read_file(dir .. "/000001.response")
    assert.truthy(resp:find("^HTTP/1.1 200 OK\r\n"), resp:sub(1, 80))
    assert.truthy(resp:find("\r\nContent-Type: text/event-stream\r\n", 1, true))
    assert.equal("data: [DONE]\n\n", body_of(resp):sub(-14))
    for _, f in ipairs(files(dir)) do
      assert.is_nil(H.read_file(dir .. "/" .. f):find(SECRET, 1, true), f)
    end
  end)

  it("continues the numbering, and record = false opts out", function()
    events { url = sim.url, body = H.chat_body("encore"), api_key = SECRET, record = dir }
    events { url = sim.url, body = H.chat_body("pas ça"), api_key = SECRET, record = false }
    assert.equal("000002.request", files(dir)[3])
    assert.equal(4, #files(dir))
  end)
end)

describe("mirza-sim --replay-dir", function()
  local sim, dir
  setup(function()
    sim = H.start_sim(FAST)
    dir = H.tmpname(".rec")
  end)
  teardown(function()
    sim.stop()
    os.execute("rm -rf " .. H.q(dir))
  end)
  after_each(function() collectgarbage("collect") end)

  it("serves the recorded responses in order, the same events byte for byte", function()
    local a = events { url = sim.url, body = H.chat_body("un", { mirza_sim = { fault = "utf8-split" } }), record = dir }
    local b = events { url = sim.url, body = H.chat_body("deux", { enable_thinking = true }), record = dir }
    local replay = H.start_sim { "--replay-dir", dir }
    local again = dir .. "/again"
    local a2 = events { url = replay.url, body = H.chat_body("n'importe"), record = again }
    local b2 = events { url = replay.url, body = H.chat_body("quoi") }
    local c = events { url = replay.url, body = H.chat_body("trois") }
    replay.stop()
    assert.same(a, a2)
    assert.same(b, b2)
    assert.equal(body_of(H.read_file(dir .. "/000001.response")), body_of(H.read_file(again .. "/000001.response")))
    assert.same({ "error", "http", 500 }, { c[1].type, c[1].code, c[1].status })
    assert.truthy(c[1].message:find("replay: no recorded response left for POST /v1/chat/completions", 1, true))
  end)

  it("matches by body with --replay-match body", function()
    local d = dir .. "/body"
    local a = events { url = sim.url, body = H.chat_body("alpha"), record = d }
    local b = events { url = sim.url, body = H.chat_body("beta"), record = d }
    local replay = H.start_sim { "--replay-dir", d, "--replay-match", "body" }
    local b2 = events { url = replay.url, body = H.chat_body("beta") }
    local a2 = events { url = replay.url, body = H.chat_body("alpha") }
    replay.stop()
    assert.same(a, a2)
    assert.same(b, b2)
    assert.are_not.same(a, b)
  end)

  it("records a whole process with MIRZA_RECORD", function()
    local d = dir .. "/env"
    local script = H.tmpname(".lua")
    local f = assert(io.open(script, "w"))
    f:write(([[
      local mirza = require "mirza"
      assert(mirza.collect { url = %q, body = { stream = true, messages = { { role = "user", content = "env" } } } })
    ]]):format(sim.url))
    f:close()
    assert.is_true(os.execute(("MIRZA_RECORD=%s %s %s"):format(H.q(d), H.q(H.mirza_bin), H.q(script))))
    os.remove(script)
    assert.same({ "000001.request", "000001.response" }, files(d))
  end)
end)

describe("an engine recording", function()
  local sim, dir
  local SCRIPT = { { { id = "w1", name = "weather", arguments = '{"city": "Lyon"}' },
    { id = "w2", name = "weather", arguments = '{"city": "Paris"}' } } }
  local TOOLS = { weather = { description = "weather", fn = function(a) return a.city .. ": 18 °C" end } }
  setup(function()
    sim = H.start_sim(FAST)
    dir = H.tmpname(".rec")
  end)
  teardown(function()
    sim.stop()
    os.execute("rm -rf " .. H.q(dir))
  end)

  local function session(base, record)
    local e = engine.new { base_url = base .. "/v1", model = "mirza-sim", config_file = false, record = record,
      session_id = "rec-session", tools = TOOLS, log = function() end,
      body_extra = { mirza_sim = { tool_calls = SCRIPT } } }
    local out = {}
    for _, input in ipairs { "Quel temps ?", "Et demain ?" } do
      local evs = {}
      local st, res = e:say(input, { answer = function() end, on_event = function(ev) evs[#evs + 1] = ev end })
      assert(st, res)
      out[#out + 1] = { answer = res.answer, rounds = res.rounds, events = evs }
    end
    return out, e
  end

  it("logs one line per turn and replays to the same session", function()
    local first, e = session(sim.base, dir)
    assert.equal("tool results: [w1] Lyon: 18 °C; [w2] Paris: 18 °C", first[1].answer)
    local lines = {}
    for l in io.lines(dir .. "/runs.jsonl") do lines[#lines + 1] = json.decode(l) end
    assert.equal(4, #lines) -- two says of two rounds each
    local l1, l2 = lines[1], lines[2]
    assert.same({ e.chat_url, "mirza-sim", "rec-session", "000001", "Quel temps ?", "", 2, "tool_calls" },
      { l1.endpoint, l1.model, l1.session, l1.request, l1.prompt, l1.answer, l1.tool_calls, l1.finish_reason })
    assert.same({ "000002", "2 tool results", first[1].answer, 0, "stop" },
      { l2.request, l2.prompt, l2.answer, l2.tool_calls, l2.finish_reason })
    assert.equal("Et demain ?", lines[3].prompt)
    assert.equal(0, l1.reasoning_bytes)
    assert.truthy(l1.time:match("^%d%d%d%d%-%d%d%-%d%dT%d%d:%d%d:%d%dZ$"))
    -- the last line is the engine's last request: its stats as the engine reported them
    assert.same({ e.last.ttft_ms, e.last.tokens, e.last.finish_reason },
      { lines[4].stats.ttft_ms, lines[4].stats.tokens, lines[4].finish_reason })
    assert.is_true(l1.stats.ttft_ms >= 0 and l1.stats.ttft_ms < 10000)
    assert.is_nil(l1.error)
    local replay = H.start_sim { "--replay-dir", dir }
    local second = session(replay.base, nil)
    replay.stop()
    assert.same(first, second)
  end)
end)

-- Issue 36 item 2: Ctrl-C while a turn's line is written to runs.jsonl
-- goes on up (it is no failure to write); a failure to write is a warning.
describe("runs.jsonl's guard", function()
  local record = require "mirza.record"
  local tmp = H.dir_per_case(".rec", before_each, after_each)

  -- An engine as log_turn reads it, whose model() raises `raise` (a
  -- callback of the line's), and whose log keeps what it is told.
  local function fake_engine(raise, logged)
    return { cfg = { record = tmp.path }, chat_url = "http://127.0.0.1:1/v1/chat/completions",
      model = function() if raise then error(raise, 0) end return "m" end,
      log = function(_, level, msg) logged[#logged + 1] = level .. ": " .. msg end }
  end

  local OUT = { acc = { deltas = 0 }, answer = "a" }

  it("lets an interrupt through, and logs nothing", function()
    local logged = {}
    local ok, err = pcall(record.log_turn, fake_engine("interrupted", logged), OUT, {})
    assert.is_false(ok)
    assert.equal("interrupted", err)
    assert.same({}, logged)
  end)

  it("logs a failure to write as a warning, and the turn goes on", function()
    local logged = {}
    record.log_turn(fake_engine("disk full", logged), OUT, {})
    assert.same({ "warning: run log: disk full" }, logged)
    record.log_turn(fake_engine(nil, logged), OUT, {})
    assert.equal(1, #logged)
    assert.equal("m", json.decode(H.read_file(tmp.path .. "/runs.jsonl")).model)
  end)
end)

-- Issue 17: nothing a URL or a header carries as a credential is written in
-- clear: the userinfo of the URL (http://user:pass@host), each header that
-- can hold a secret, credential-like query parameters; in the request
-- files and in runs.jsonl, its endpoint and its errors alike.
describe("recordings redact credentials", function()
  local PASS = "pw-" .. SECRET
  local sim, dir
  setup(function()
    sim = H.start_sim(FAST)
    dir = H.tmpname(".rec")
  end)
  teardown(function()
    sim.stop()
    os.execute("rm -rf " .. H.q(dir))
  end)
  after_each(function() collectgarbage("collect") end)

  local function with_userinfo(url) return (url:gsub("^http://", "http://alice:" .. PASS .. "@")) end
  local function hides_secret(d)
    for _, f in ipairs(files(d)) do
      local text = H.read_file(d .. "/" .. f)
      assert.is_nil(text:find(SECRET, 1, true), f .. " shows the secret: " .. text:sub(1, 400))
    end
  end

  it("the URL's userinfo and every header that can carry a secret", function()
    local d = dir .. "/headers"
    local secret_headers = { "Authorization", "Proxy-Authorization", "Cookie", "Set-Cookie", "X-Api-Key", "api-key",
      "X-Auth-Token", "X-Client-Secret", "X-Password", "X-Session-Token" }
    local headers = { ["X-MTPLX-Session-Id"] = "rec-redact" }
    for _, h in ipairs(secret_headers) do headers[h] = "v-" .. SECRET end
    local evs = events { url = with_userinfo(sim.url) .. "?token=" .. SECRET .. "&x=1", body = H.chat_body("x"),
      headers = headers, record = d }
    assert.equal("done", evs[#evs].type, evs[#evs].message)
    local head = H.read_file(d .. "/000001.request"):match("^(.-)\n\n")
    local lines = {}
    for l in head:gmatch("[^\n]+") do lines[#lines + 1] = l end
    assert.equal(("POST http://[redacted]@127.0.0.1:%d/v1/chat/completions?token=[redacted]&x=1"):format(sim.port),
      lines[1])
    local want = { "X-MTPLX-Session-Id: rec-redact" }
    for _, h in ipairs(secret_headers) do want[#want + 1] = h .. ": [redacted]" end
    table.sort(want)
    assert.same(want, { table.unpack(lines, 2) })
    hides_secret(d)
  end)

  it("the response head: a Set-Cookie or other secret header of the server's as Name: [redacted]", function()
    local src, d = dir .. "/served", dir .. "/resp-head"
    assert(os.execute("mkdir -p " .. H.q(src)))
    local chunk = '{"id":"chatcmpl-c","object":"chat.completion.chunk","choices":[{"index":0,"delta":'
      .. '{"content":"Hi."},"finish_reason":"stop"}]}'
    local function write(path, text)
      local f = assert(io.open(path, "wb"))
      f:write(text)
      f:close()
    end
    write(src .. "/000001.request", "POST /v1/chat/completions\n\n{}")
    write(src .. "/000001.response", "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
      .. "Set-Cookie: sid=" .. SECRET .. "; HttpOnly\r\nX-Auth-Token:" .. SECRET .. "\r\n"
      .. "X-Request-Id: req_kept\r\n\r\ndata: " .. chunk .. "\n\ndata: [DONE]\n\n")
    local replay = H.start_sim { "--replay-dir", src }
    local evs = events { url = replay.url, body = H.chat_body("x"), record = d }
    replay.stop()
    assert.equal("done", evs[#evs].type, evs[#evs].message)
    local resp = H.read_file(d .. "/000001.response")
    assert.truthy(resp:find("\r\nSet-Cookie: [redacted]\r\n", 1, true), resp)
    assert.truthy(resp:find("\r\nX-Auth-Token: [redacted]\r\n", 1, true), resp)
    assert.truthy(resp:find("\r\nX-Request-Id: req_kept\r\n", 1, true), resp)
    assert.truthy(resp:find("\r\n\r\ndata: ", 1, true), resp)
    hides_secret(d)
  end)

  it("runs.jsonl: the endpoint and the error of an engine turn", function()
    local d, logged = dir .. "/runs", {}
    local e = engine.new { base_url = with_userinfo(sim.base) .. "/v1", model = "mirza-sim", config_file = false,
      record = d, daemon = false, log = function(_, msg) logged[#logged + 1] = msg end }
    assert(e:say("bonjour", { answer = function() end }))
    e:close()
    local refused = engine.new { base_url = ("http://alice:%s@127.0.0.1:%d/v1"):format(PASS, H.free_port()),
      model = "mirza-sim", config_file = false, record = d, daemon = false, connect_timeout = 2,
      log = function(_, msg) logged[#logged + 1] = msg end }
    local st, msg = refused:say("encore", { answer = function() end })
    refused:close()
    assert.is_nil(st)
    assert.is_nil(msg:find(SECRET, 1, true), msg)
    local lines = {}
    for l in io.lines(d .. "/runs.jsonl") do lines[#lines + 1] = json.decode(l) end
    assert.equal(2, #lines)
    assert.equal(("http://[redacted]@127.0.0.1:%d/v1/chat/completions"):format(sim.port), lines[1].endpoint)
    assert.truthy(lines[2].endpoint:find("^http://%[redacted%]@127%.0%.0%.1:%d+/v1/chat/completions$"),
      lines[2].endpoint)
    assert.is_table(lines[2].error)
    hides_secret(d)
    for _, m in ipairs(logged) do assert.is_nil(m:find(SECRET, 1, true), m) end
  end)
end)
