-- The core API end to end over real loopback HTTP: mirza.wait driving
-- several streams at once, mirza.collect, tool-call events, the request as
-- the server sees it (headers, api_key, method), stream bookkeeping.
local mirza = require "mirza"
local H = require "tests.helper"

local function open(sim, ctl, extra)
  local body = H.chat_body("x", extra)
  body.mirza_sim = ctl
  return mirza.open { url = sim.url, body = body, stall_timeout = 20 }
end

-- Read every stream in `streams` to its end with mirza.wait + s:next(0),
-- never blocking on one stream. Returns the texts, the final events, the
-- order in which the streams ended, and how many wait() calls it took.
local function drive(streams)
  local text, ended, order, open_n, waits = {}, {}, {}, #streams, 0
  for i in ipairs(streams) do text[i] = {} end
  while open_n > 0 do
    waits = waits + 1
    assert(waits < 100000, "mirza.wait loop did not end")
    local ready = mirza.wait(10)
    assert.is_true(ready > 0, "wait timed out with streams running")
    for i, s in ipairs(streams) do
      while not ended[i] and s:pending() > 0 do
        local ev = assert(s:next(0))
        if ev.type == "text" then text[i][#text[i] + 1] = ev.text end
        if ev.type == "done" or ev.type == "error" then
          ended[i] = ev
          order[#order + 1] = i
          open_n = open_n - 1
        end
      end
    end
  end
  for i in ipairs(streams) do text[i] = table.concat(text[i]) end
  return text, ended, order, waits
end

describe("mirza.wait with several streams", function()
  local sim
  setup(function() sim = H.start_sim { "--tok-rate", "0", "--ttft-ms", "0", "--parallel", "4" } end)
  teardown(function() sim.stop() end)
  after_each(function() collectgarbage("collect") end)

  it("drives three streams at once; each gets its own text; the fast one ends first", function()
    local s1 <close> = open(sim, { text = "slow one two three four", tok_rate = 20 })
    local s2 <close> = open(sim, { text = "fast a b c", tok_rate = 0 })
    local s3 <close> = open(sim, { text = "medium x y z", tok_rate = 60 })
    assert.equal(3, mirza.streams())
    local text, ended, order = drive { s1, s2, s3 }
    assert.same({ "slow one two three four", "fast a b c", "medium x y z" }, text)
    assert.same({ 2, 3, 1 }, order)
    for i = 1, 3 do
      assert.equal("done", ended[i].type)
      assert.equal("stop", ended[i].finish_reason)
    end
    assert.is_true(s1:finished() and s2:finished() and s3:finished())
  end)

  it("returns 0 at its timeout when nothing is ready, without waiting for the stream", function()
    local s <close> = open(sim, { text = "late", ttft_ms = 3000 })
    local t0 = mirza.now()
    assert.equal(0, mirza.wait(0.1))
    local took = mirza.now() - t0
    assert.is_true(took >= 0.05 and took < 1.5, "wait(0.1) took " .. took .. " s")
    assert.equal(0, s:pending())
    assert.is_false(s:finished())
    assert.equal(1, mirza.streams())
  end)

  it("returns 0 at once when no stream is open", function()
    assert.equal(0, mirza.streams())
    local t0 = mirza.now()
    assert.equal(0, mirza.wait(5))
    assert.is_true(mirza.now() - t0 < 2)
  end)

  it("counts pending events and finished() only after the final event arrived", function()
    local s <close> = open(sim, { text = "a b c" })
    while not s:finished() do mirza.wait(10) end
    -- text events, maybe progress, then done: all buffered, none read yet
    local n = s:pending()
    local got = 0
    while s:next(0) do got = got + 1 end
    assert.equal(n, got)
    assert.equal(0, s:pending())
    assert.is_true(s:finished())
  end)

  it("counts open streams and forgets closed ones", function()
    assert.equal(0, mirza.streams())
    local a = open(sim, { text = "a" })
    local b = open(sim, { text = "b" })
    assert.equal(2, mirza.streams())
    a:close()
    assert.equal(1, mirza.streams())
    assert.is_true(a:closed())
    assert.is_false(b:closed())
    b:close()
    assert.equal(0, mirza.streams())
  end)
end)

describe("mirza.collect", function()
  local sim
  setup(function() sim = H.start_sim { "--tok-rate", "0", "--ttft-ms", "0" } end)
  teardown(function() sim.stop() end)
  after_each(function() collectgarbage("collect") end)

  it("returns the whole text, reasoning, finish reason and usage", function()
    local body = H.chat_body("x", { enable_thinking = true })
    body.mirza_sim = { text = "Il fait beau.", reasoning = "Je réfléchis." }
    local r = assert(mirza.collect { url = sim.url, body = body,
      headers = { ["X-MTPLX-Allow-Client-Controls"] = "1" } })
    assert.equal("Il fait beau.", r.text)
    assert.equal("Je réfléchis.", r.think)
    assert.equal("stop", r.finish_reason)
    assert.is_table(r.usage)
    assert.equal(r.usage.prompt_tokens + r.usage.completion_tokens, r.usage.total_tokens)
    assert.is_table(r.stats)
    assert.equal(0, mirza.streams())
  end)

  it("returns nil, message, code and the partial result on a mid-stream error", function()
    local body = H.chat_body("x")
    body.mirza_sim = { text = "a b c d e f", fault = "error-after=3" }
    local r, msg, code, partial = mirza.collect { url = sim.url, body = body }
    assert.is_nil(r)
    assert.equal("server", code)
    assert.matches("simulated failure", msg)
    assert.equal("a b c ", partial.text)
    assert.equal(0, mirza.streams())
  end)

  it("returns 'refused' when nothing listens", function()
    local r, msg, code = mirza.collect { url = ("http://127.0.0.1:%d/v1/chat/completions"):format(H.free_port()),
      body = H.chat_body("x") }
    assert.is_nil(r)
    assert.equal("refused", code)
    assert.matches("127.0.0.1", msg, 1, true)
  end)
end)

describe("tool calls end to end", function()
  local sim
  setup(function() sim = H.start_sim { "--tok-rate", "0", "--ttft-ms", "0" } end)
  teardown(function() sim.stop() end)

  it("delivers tool_call events with their calls, then done with finish_reason tool_calls", function()
    local s <close> = open(sim, { fault = "replay=" .. H.fixtures .. "/tool_calls.sse" })
    local r = H.drain(s, 10)
    local calls, args = {}, {}
    for _, ev in ipairs(r.events) do
      if ev.type == "tool_call" then
        calls[#calls + 1] = ev
        local c = ev.calls[1]
        assert.equal(0, c.index)
        args[#args + 1] = c["function"].arguments
      end
    end
    assert.equal(5, #calls)
    assert.equal("call_fx1", calls[1].calls[1].id)
    assert.equal("function", calls[1].calls[1].type)
    assert.equal("get_weather", calls[1].calls[1]["function"].name)
    assert.equal('{"city": "Lyon", "unit": "C"}', table.concat(args))
    assert.same({ city = "Lyon", unit = "C" }, mirza.json.decode(table.concat(args)))
    assert.equal("", r.text)
    assert.equal("done", r.last.type)
    assert.equal("tool_calls", r.last.finish_reason)
    assert.equal(9, r.last.usage.completion_tokens)
  end)
end)

-- A one-shot HTTP server (python3) that records the request it receives
-- and answers a fixed JSON body: the request exactly as it left mirza.
local function capture_server()
  local port_file, req_file = H.tmpname(".port"), H.tmpname(".req")
  local py = [[
import socket, sys
s = socket.socket(); s.bind(("127.0.0.1", 0)); s.listen(1)
open(sys.argv[1] + ".tmp", "w").write(str(s.getsockname()[1]))
import os; os.rename(sys.argv[1] + ".tmp", sys.argv[1])
s.settimeout(30)
c, _ = s.accept(); c.settimeout(10)
data = b""
while b"\r\n\r\n" not in data:
    chunk = c.recv(65536)
    if not chunk: break
    data += chunk
head, _, body = data.partition(b"\r\n\r\n")
n = 0
for line in head.split(b"\r\n")[1:]:
    k, _, v = line.partition(b":")
    if k.strip().lower() == b"content-length": n = int(v)
while len(body) < n:
    chunk = c.recv(65536)
    if not chunk: break
    body += chunk
open(sys.argv[2], "wb").write(head + b"\r\n\r\n" + body)
c.sendall(b'HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 11\r\n'
          b'Connection: close\r\n\r\n{"ok":true}')
c.close()
]]
  local script = H.tmpname(".py")
  local f = assert(io.open(script, "w"))
  f:write(py)
  f:close()
  os.execute(("python3 %s %s %s >/dev/null 2>&1 &"):format(H.q(script), H.q(port_file), H.q(req_file)))
  local port = H.wait_for(function()
    local pf = io.open(port_file)
    if not pf then return nil end
    local p = tonumber(pf:read("a"))
    pf:close()
    return p
  end, 20)
  assert(port, "capture server did not start")
  local srv = { url = ("http://127.0.0.1:%d/v1/x"):format(port) }
  --- The recorded request: {method, target, headers (lower-case names), body}.
  function srv.request()
    assert(H.wait_for(function() return io.open(req_file) end, 20), "no request recorded")
    local raw = H.read_file(req_file)
    os.remove(req_file); os.remove(port_file); os.remove(script)
    local head, body = raw:match("^(.-)\r\n\r\n(.*)$")
    local method, target = head:match("^(%S+) (%S+)")
    local headers = {}
    for k, v in head:gmatch("\r\n([^:\r\n]+):%s*([^\r\n]*)") do headers[k:lower()] = v end
    return { method = method, target = target, headers = headers, body = body }
  end
  return srv
end

describe("the request as the server sees it", function()
  after_each(function() collectgarbage("collect") end)

  it("a streaming POST: JSON body, Content-Type, Accept, api_key, user headers", function()
    local srv = capture_server()
    local s <close> = mirza.open { url = srv.url, body = { model = "m", stream = true }, api_key = "sekret",
      headers = { ["X-MTPLX-Session-Id"] = "sess-42", "X-Other: yes" } }
    local ev = s:next(20)
    local req = srv.request()
    assert.equal("POST", req.method)
    assert.equal("/v1/x", req.target)
    assert.equal("application/json", req.headers["content-type"])
    assert.equal("text/event-stream", req.headers["accept"])
    assert.equal("Bearer sekret", req.headers["authorization"])
    assert.equal("sess-42", req.headers["x-mtplx-session-id"])
    assert.equal("yes", req.headers["x-other"])
    assert.matches("^mirza/", req.headers["user-agent"])
    assert.same({ model = "m", stream = true }, mirza.json.decode(req.body))
    -- a JSON body where SSE was expected is still delivered (the JSON fallback)
    assert.is_table(ev)
  end)

  it("a plain GET: no body, no Content-Type, Accept JSON, no Authorization without api_key", function()
    local srv = capture_server()
    local body, status = mirza.request { url = srv.url, timeout = 10 }
    local req = srv.request()
    assert.equal('{"ok":true}', body)
    assert.equal(200, status)
    assert.equal("GET", req.method)
    assert.equal("", req.body)
    assert.is_nil(req.headers["content-type"])
    assert.is_nil(req.headers["authorization"])
    assert.equal("application/json", req.headers["accept"])
  end)

  it("method = 'DELETE' goes out as DELETE", function()
    local srv = capture_server()
    local body = mirza.request { url = srv.url, method = "DELETE" }
    assert.equal('{"ok":true}', body)
    assert.equal("DELETE", srv.request().method)
  end)
end)

describe("api_key against a protected daemon", function()
  local sim
  setup(function() sim = H.start_sim { "--tok-rate", "0", "--ttft-ms", "0", "--api-key", "k-123" } end)
  teardown(function() sim.stop() end)

  it("is refused with 401 without the key and served with it", function()
    local _, _, code, status = mirza.request { url = sim.base .. "/health" }
    assert.equal("http", code)
    assert.equal(401, status)
    local body = mirza.request { url = sim.base .. "/health", api_key = "k-123" }
    assert.is_true(mirza.json.decode(body).ok)
    local r = assert(mirza.collect { url = sim.url, api_key = "k-123",
      body = H.chat_body("x", { mirza_sim = { text = "ok then" } }) })
    assert.equal("ok then", r.text)
  end)
end)

describe("mirza.isatty", function()
  it("tells a terminal from a file or a pipe, without a shell", function()
    local code = "io.write(tostring(require('mirza').isatty(2)), tostring(require('mirza').isatty(1)))"
    local p = assert(io.popen(("%s -e %s 2>/dev/null </dev/null"):format(H.q(H.mirza_bin), H.q(code))))
    assert.equal("falsefalse", p:read("a")) -- stdout a pipe, stderr a file
    p:close()
    assert.is_false(mirza.isatty(-1))
    assert.is_false(mirza.isatty(4096))
    assert.has_error(function() mirza.isatty("x") end)
  end)

  it("says true of a pseudo-terminal (script(1) gives one)", function()
    local code = "io.write(tostring(require('mirza').isatty(2)), tostring(require('mirza').isatty(1)))"
    local term, why = H.in_terminal(H.q(H.mirza_bin) .. " -e " .. H.q(code))
    if not term then
      pending(why)
      return
    end
    local p = assert(io.popen(term .. " </dev/null"))
    assert.matches("^truetrue", p:read("a")) -- stderr and stdout: the terminal
    p:close()
  end)
end)
