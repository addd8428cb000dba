-- Streaming over real loopback HTTP against mirza-sim: a normal stream with
-- thinking, every fault the simulator can inject (a clear error, partial
-- text kept), cancellation by break, refused connections, HTTP errors.
local mirza = require "mirza"
local H = require "tests.helper"

local function open(sim, prompt, ctl, extra)
  local body = H.chat_body(prompt, extra)
  body.mirza_sim = ctl
  return mirza.open { url = sim.url, body = body, stall_timeout = 10 }
end

-- The simulator counts a prompt as its messages' JSON length / 4 tokens
-- (ASCII prompts: mirza.json and cJSON print the same bytes).
local function prompt_tokens(body)
  return #mirza.json.encode(body.messages) // 4
end

local function count(events, ty)
  local n = 0
  for _, ev in ipairs(events) do if ev.type == ty then n = n + 1 end end
  return n
end

local function types(events)
  local seen, order = {}, {}
  for _, ev in ipairs(events) do
    if not seen[ev.type] then
      seen[ev.type] = true
      order[#order + 1] = ev.type
    end
  end
  return order
end

describe("streaming from mirza-sim (mtplx dialect)", function()
  local sim
  setup(function() sim = H.start_sim { "--tok-rate", "0", "--ttft-ms", "0", "--verbose" } end)
  teardown(function() sim.stop() end)
  after_each(function() collectgarbage("collect") end)

  it("streams reasoning, then the answer, then done with usage and stats", function()
    local s <close> = open(sim, "Quel temps fait-il ?",
      { text = "Il fait beau à Lyon.", reasoning = "Je réfléchis.\nC'est simple." }, { enable_thinking = true })
    local r = H.drain(s)
    assert.equal("Il fait beau à Lyon.", r.text)
    assert.equal("Je réfléchis.\nC'est simple.", r.think)
    assert.same({ "think", "text", "done" }, (function()
      local t = {}
      for _, ty in ipairs(types(r.events)) do if ty ~= "progress" and ty ~= "heartbeat" then t[#t + 1] = ty end end
      return t
    end)())
    local done = r.last
    assert.equal("done", done.type)
    assert.equal("stop", done.finish_reason)
    local nthink, ntext = count(r.events, "think"), count(r.events, "text")
    assert.equal(nthink + ntext, done.usage.completion_tokens)
    assert.equal(prompt_tokens(H.chat_body("Quel temps fait-il ?")), done.usage.prompt_tokens)
    assert.equal(done.usage.prompt_tokens + done.usage.completion_tokens, done.usage.total_tokens)
    assert.equal(nthink, done.stats.reasoning_tokens)
    assert.equal(ntext, done.stats.answer_tokens)
    assert.is_nil(s:next()) -- ended
  end)

  it("reads the same text with the for-loop iterator", function()
    local text = {}
    for ev in open(sim, "hello", { text = "One two three." }):events() do
      if ev.type == "text" then text[#text + 1] = ev.text end
    end
    assert.equal("One two three.", table.concat(text))
  end)

  it("keeps a UTF-8 character split across frames whole", function()
    local s <close> = open(sim, "utf8", { fault = "utf8-split" })
    local r = H.drain(s)
    assert.equal("done", r.last.type)
    for _, ev in ipairs(r.events) do
      if ev.type == "text" then assert.truthy(utf8.len(ev.text), "broken UTF-8 in one event: " .. ev.text) end
    end
    -- the fault prefixes multi-byte characters split mid-character across
    -- frames to the answer the same request gets without it
    local plain = H.drain(open(sim, "utf8", {}))
    assert.equal("done", plain.last.type)
    assert.equal("Voilà : un café à 3 €, au Japon 日本 🙂. " .. plain.text, r.text)
  end)

  it("reports a mid-stream error frame after the partial text", function()
    local s <close> = open(sim, "x", { text = "a b c d e f g h", fault = "error-after=3" })
    local r = H.drain(s)
    assert.equal("error", r.last.type)
    assert.equal("server", r.last.code)
    assert.equal("server error: simulated failure after 3 tokens", r.last.message)
    assert.equal("a b c ", r.text)
  end)

  it("reports a connection cut without [DONE] as closed, text kept", function()
    local s <close> = open(sim, "x", { text = "a b c d e f g h", fault = "cut-after=4" })
    local r = H.drain(s)
    assert.equal("error", r.last.type)
    assert.equal("closed", r.last.code)
    assert.equal("a b c d ", r.text)
  end)

  it("fails a stalled stream with a timeout, text kept", function()
    local body = H.chat_body("x")
    body.mirza_sim = { text = "a b c d e f", fault = "stall-after=2" }
    local s <close> = mirza.open { url = sim.url, body = body, stall_timeout = 0.3 }
    local t0 = mirza.now()
    local r = H.drain(s)
    assert.equal("timeout", r.last.code)
    assert.equal(("no data from %s for 0.3 s (stall timeout: raise the `stall_timeout` option, or false for none)")
      :format(sim.url), r.last.message)
    assert.equal("a b ", r.text)
    assert.is_true(mirza.now() - t0 < 5)
  end)

  it("reports a malformed JSON frame as a protocol error, text kept", function()
    local s <close> = open(sim, "x", { text = "a b c d e f", fault = "malformed-after=2" })
    local r = H.drain(s)
    assert.equal("protocol", r.last.code)
    assert.matches("malformed frame", r.last.message)
    assert.equal("a b ", r.text)
  end)

  it("turns an oversized frame into a protocol error instead of memory growth", function()
    local body = H.chat_body("x")
    body.mirza_sim = { text = "a b c d", fault = "oversized=300000" }
    local s <close> = mirza.open { url = sim.url, body = body, max_event_bytes = 65536 }
    local r = H.drain(s)
    assert.equal("protocol", r.last.code)
    assert.equal("SSE event or line larger than the limit (limit 65536 bytes)", r.last.message)
  end)

  it("passes a degenerate reasoning loop through as think events", function()
    local s <close> = open(sim, "x", { fault = "loop" }, { enable_thinking = true, max_tokens = 60 })
    local r = H.drain(s)
    assert.equal("done", r.last.type)
    assert.equal("length", r.last.finish_reason)
    -- 24 ordinary reasoning tokens, then 36 tokens of the 6-word line
    local _, n = r.think:gsub("Wait, let me reconsider the question%.\n", "")
    assert.equal(6, n)
  end)

  it("replays a recorded capture over HTTP", function()
    local s <close> = open(sim, "x", { fault = "replay=" .. H.traces .. "/mtplx.reconstructed.thinking_stream.sse" })
    local r = H.drain(s)
    assert.equal("done", r.last.type)
    assert.equal("L'utilisateur demande la météo à Lyon.\nJe réponds brièvement.", r.think)
    assert.equal("Il fait beau à Lyon aujourd’hui : 22 °C.", r.text)
    assert.equal(54.1, r.last.stats.decode_tok_s)
    assert.equal(2048, r.last.stats.cached_tokens)
    assert.equal(10, r.last.stats.answer_tokens)
    local hb = 0
    for _, ev in ipairs(r.events) do if ev.type == "heartbeat" then hb = hb + 1 end end
    assert.equal(1, hb)
  end)

  it("cancels the request on break (the connection is closed)", function()
    local body = H.chat_body("long")
    body.mirza_sim = { answer_tokens = 100000, tok_rate = 200 }
    local s = mirza.open { url = sim.url, body = body }
    local got = 0
    for ev in s:events() do
      if ev.type == "text" then
        got = got + 1
        if got == 3 then break end
      end
    end
    assert.equal(3, got)
    assert.is_true(s:closed())
    assert.equal(0, mirza.streams())
    -- the simulator saw the client go (it logs the request when it is over)
    assert.truthy(H.wait_for(function()
      return H.read_file(sim.log):match("POST /v1/chat/completions 499")
    end, 20), "the simulator never saw the disconnect")
    -- the daemon is free again: a new request is served at once
    local s2 <close> = open(sim, "after", { text = "ok" })
    assert.equal("ok", H.drain(s2).text)
  end)

  it("returns an HTTP 400 with the server's JSON error message", function()
    local s <close> = mirza.open { url = sim.url, body = { model = "x", stream = true, messages = {} } }
    local ev = s:next()
    assert.equal("error", ev.type)
    assert.equal("http", ev.code)
    assert.equal(400, ev.status)
    assert.equal(sim.url .. ": " .. "HTTP 400 Bad Request: 'messages' is required", ev.message)
    assert.same({ code = 400, type = "invalid_request_error", message = "'messages' is required" }, ev.error)
    assert.is_nil(s:next())
  end)

  it("sums up a non-JSON error body in one line, the raw body kept", function()
    local s <close> = open(sim, "x", { fault = "http-text=502" })
    local ev = s:next()
    assert.equal("http", ev.code)
    assert.equal(502, ev.status)
    assert.equal(sim.url .. ": " .. "HTTP 502 Bad Gateway: Bad Gateway", ev.message)
    assert.equal("<html><body>Bad Gateway</body></html>\n", ev.body)
  end)

  it("names an HTML error page by its title", function()
    local ev = open(sim, "x", { fault = "http-html=503" }):next()
    assert.equal("http", ev.code)
    assert.equal(503, ev.status)
    assert.equal(sim.url .. ": " .. "HTTP 503 Service Unavailable: 503 Service Unavailable", ev.message)
    assert.matches("^<html>\r\n<head><title>", ev.body)
  end)

  it("gives the first line of a plain-text error body", function()
    local ev = open(sim, "x", { fault = "http-plain=500:model crashed" }):next()
    assert.equal(sim.url .. ": " .. "HTTP 500 Internal Server Error: model crashed", ev.message)
    assert.equal("model crashed\n", ev.body)
  end)

  it("mirza.request returns nil, message, 'http', status for HTTP errors", function()
    local body, msg, code, status = mirza.request { url = sim.url, body = { messages = {} } }
    assert.is_nil(body)
    assert.equal("http", code)
    assert.equal(400, status)
    assert.equal(sim.url .. ": " .. "HTTP 400 Bad Request: 'messages' is required", msg)
    local health, st = mirza.request { url = sim.base .. "/health" }
    assert.equal(200, st)
    assert.is_true(mirza.json.decode(health).ok)
  end)

  it("sends the session header and reports cached tokens on a repeated prefix", function()
    local body = H.chat_body("Bonjour, comment vas-tu aujourd'hui ?")
    table.insert(body.messages, 1, { role = "system", content = string.rep("You are a helpful voice assistant. ", 20) })
    local function turn()
      local s <close> = mirza.open { url = sim.url, body = body, headers = { ["X-MTPLX-Session-Id"] = "spec-cache" } }
      return H.drain(s).last
    end
    local first = turn()
    assert.equal(0, first.usage.prompt_tokens_details.cached_tokens)
    local done = turn()
    assert.equal("spec-cache", done.stats.session_id)
    assert.equal("header.x-mtplx-session-id", done.stats.request_session_source)
    -- the whole prompt repeats: all of it is cached but the last token
    assert.equal(prompt_tokens(body), done.usage.prompt_tokens)
    assert.equal(prompt_tokens(body) - 1, done.usage.prompt_tokens_details.cached_tokens)
    assert.is_true(done.stats.session_cache_hit)
  end)

  it("keeps unknown top-level fields reachable", function()
    local s <close> = open(sim, "x", { fault = "replay=" .. H.fixtures .. "/unknown_fields.sse" })
    local r = H.drain(s)
    assert.equal("done", r.last.type)
    assert.equal("yes", r.last.extra.x_vendor_flag)
  end)
end)

describe("streaming from mirza-sim (llama dialect)", function()
  local sim
  setup(function() sim = H.start_sim { "--dialect", "llama", "--tok-rate", "0", "--ttft-ms", "0" } end)
  teardown(function() sim.stop() end)

  it("reports timings and a usage-only frame", function()
    local s <close> = open(sim, "x", { text = "a b c" },
      { stream_options = { include_usage = true }, chat_template_kwargs = { enable_thinking = false } })
    local r = H.drain(s)
    assert.equal("a b c", r.text)
    assert.equal("done", r.last.type)
    assert.is_true(r.last.timings.predicted_per_second > 0)
    assert.equal(3, r.last.timings.predicted_n)
    assert.equal(3, r.last.usage.completion_tokens)
  end)

  it("reports a llama mid-stream error (no [DONE]) as a server error", function()
    local s <close> = open(sim, "x", { text = "a b c d e", fault = "error-after=2" },
      { chat_template_kwargs = { enable_thinking = false } })
    local r = H.drain(s)
    assert.equal("server", r.last.code)
    assert.equal("a b ", r.text)
    assert.equal("", r.think)
  end)
end)

describe("transport failures", function()
  it("reports a refused connection", function()
    local url = ("http://127.0.0.1:%d/v1/chat/completions"):format(H.free_port())
    local s <close> = mirza.open { url = url, body = H.chat_body("x") }
    local ev = s:next()
    assert.equal("refused", ev.code)
    assert.equal(url .. ": ", ev.message:sub(1, #url + 2))
    assert.is_nil(s:next())
  end)

  it("raises on programmer errors", function()
    assert.has_error(function() mirza.open { url = "http://x", bogus = 1 } end, "mirza.open: unknown option 'bogus'")
    assert.has_error(function() mirza.open { body = "{}" } end, "mirza.open: 'url' is required")
    local s = mirza.open { url = "http://127.0.0.1:9/" }
    s:close()
    s:close() -- idempotent
    assert.has_error(function() s:next() end, "attempt to use a closed stream")
  end)
end)

-- Streams that misbehave (issue 8): each case here failed before its fix.
describe("misbehaving streams", function()
  local sim, llama
  setup(function()
    sim = H.start_sim { "--tok-rate", "0", "--ttft-ms", "0" }
    llama = H.start_sim { "--dialect", "llama", "--tok-rate", "0", "--ttft-ms", "0" }
  end)
  teardown(function()
    sim.stop()
    llama.stop()
  end)
  after_each(function() collectgarbage("collect") end)

  it("ends with done when the server finishes without [DONE] (finish_reason and usage kept)", function()
    local s <close> = open(sim, "x", { text = "a b c", fault = "no-done" })
    local r = H.drain(s)
    assert.equal("a b c", r.text)
    assert.equal("done", r.last.type)
    assert.equal("stop", r.last.finish_reason)
    assert.equal(3, r.last.usage.completion_tokens)
    assert.is_true(r.last.no_done_marker)
  end)

  it("ends with done without [DONE] in the llama dialect (usage-only frame last)", function()
    local s <close> = open(llama, "x", { text = "a b", fault = "no-done" },
      { stream_options = { include_usage = true }, chat_template_kwargs = { enable_thinking = false } })
    local r = H.drain(s)
    assert.equal("done", r.last.type)
    assert.equal("stop", r.last.finish_reason)
    assert.equal(2, r.last.usage.completion_tokens)
    assert.is_true(r.last.no_done_marker)
  end)

  it("has no no_done_marker on a normal end", function()
    local r = H.drain(open(sim, "x", { text = "a b" }))
    assert.equal("done", r.last.type)
    assert.is_nil(r.last.no_done_marker)
  end)
end)

describe("NUL characters in a delta", function()
  local sim
  setup(function() sim = H.start_sim { "--tok-rate", "0", "--ttft-ms", "0" } end)
  teardown(function() sim.stop() end)

  it("keeps the text after \\u0000 (token frame: fast path)", function()
    local r = H.drain(open(sim, "x", { text = "a b", fault = "nul-after=1" }))
    assert.equal("done", r.last.type)
    assert.equal("a a\0bb", r.text)
  end)

  it("keeps the text after \\u0000 (frames read by cJSON)", function()
    local r = H.drain(open(sim, "x", { fault = "replay=" .. H.fixtures .. "/nul_in_delta.sse" }))
    assert.equal("done", r.last.type)
    assert.equal("x\0y1\0002", r.text)
  end)
end)

describe("invalid UTF-8 in a delta", function()
  local sim
  setup(function() sim = H.start_sim { "--tok-rate", "0", "--ttft-ms", "0" } end)
  teardown(function() sim.stop() end)

  it("is replaced by U+FFFD (one per maximal subpart) and counted on done", function()
    local r = H.drain(open(sim, "x", { text = "a b", fault = "bad-utf8-after=1" }))
    assert.equal("done", r.last.type)
    assert.equal("a A\u{FFFD}B\u{FFFD}C\u{1F600}Db", r.text)
    assert.truthy(utf8.len(r.text))
    assert.equal(2, r.last.invalid_utf8)
  end)

  it("is not counted when there is none", function()
    local r = H.drain(open(sim, "x", { text = "é à ü" }))
    assert.equal("é à ü", r.text)
    assert.is_nil(r.last.invalid_utf8)
  end)
end)

describe("HTTP error events carry the server's error object", function()
  local llama, mtplx
  setup(function()
    llama = H.start_sim { "--dialect", "llama", "--context-window", "40" }
    mtplx = H.start_sim { "--context-window", "40" }
  end)
  teardown(function()
    llama.stop()
    mtplx.stop()
  end)

  local long = string.rep("a long prompt that overflows the context ", 10)

  it("llama-server: a context overflow is told from other 400s without parsing", function()
    local ev = open(llama, long):next()
    assert.equal("http", ev.code)
    assert.equal(400, ev.status)
    assert.equal("exceed_context_size_error", ev.error.type)
    assert.equal(400, ev.error.code)
    assert.equal(40, ev.error.n_ctx)
    assert.equal(prompt_tokens(H.chat_body(long)), ev.error.n_prompt_tokens)
    assert.equal(("request (%d tokens) exceeds the available context size (40 tokens), try increasing it")
      :format(prompt_tokens(H.chat_body(long))), ev.error.message)
  end)

  it("MTPLX: the error object with its string code", function()
    local ev = open(mtplx, long):next()
    assert.equal(400, ev.status)
    assert.equal("invalid_request_error", ev.error.type)
    assert.equal("HTTPException", ev.error.code)
    assert.equal(("Prompt contains %d tokens, but the served context window is 40 tokens. The prompt must be "
      .. "shorter than the context window to leave room for at least one generated token.")
      :format(prompt_tokens(H.chat_body(long))), ev.error.message)
  end)

  it("a non-JSON error body has no error object", function()
    local ev = open(mtplx, "x", { fault = "http-text=502" }):next()
    assert.is_nil(ev.error)
  end)
end)

describe("response headers on error events", function()
  local sim
  setup(function() sim = H.start_sim { "--tok-rate", "0", "--ttft-ms", "0" } end)
  teardown(function() sim.stop() end)

  it("exposes Retry-After in delta-seconds as ev.retry_after, and the headers", function()
    local ev = open(sim, "x", { fault = "http=429,retry-after=7" }):next()
    assert.equal(429, ev.status)
    assert.equal(7, ev.retry_after)
    assert.equal("7", ev.headers["retry-after"])
    assert.equal("application/json", ev.headers["content-type"])
    assert.equal("mirza-sim", ev.headers.server)
  end)

  it("reads an HTTP-date Retry-After as seconds from now", function()
    local ev = open(sim, "x", { fault = "http-html=503,retry-after=date+60" }):next()
    assert.equal(503, ev.status)
    assert.is_true(ev.retry_after >= 55 and ev.retry_after <= 61, tostring(ev.retry_after))
    assert.matches("GMT$", ev.headers["retry-after"])
  end)

  it("has no retry_after without the header", function()
    local ev = open(sim, "x", { fault = "http=400" }):next()
    assert.equal(400, ev.status)
    assert.is_nil(ev.retry_after)
    assert.is_table(ev.headers)
  end)
end)

describe("waiting for the response head", function()
  local sim
  setup(function() sim = H.start_sim { "--tok-rate", "0", "--ttft-ms", "0" } end)
  teardown(function() sim.stop() end)

  local function run(fault, opts)
    local body = H.chat_body("x")
    body.mirza_sim = { text = "a b", fault = fault }
    local req = { url = sim.url, body = body }
    for k, v in pairs(opts) do req[k] = v end
    local s <close> = mirza.open(req)
    local t0 = mirza.now()
    local r = H.drain(s)
    return r, mirza.now() - t0
  end

  it("a slow head is no stall: each header line resets the stall timer", function()
    local r = run("slow-head=150", { stall_timeout = 0.5 })
    assert.equal("done", r.last.type, r.last.message)
    assert.equal("a b", r.text)
  end)

  it("a queued request without headers for longer than stall_timeout does not stall", function()
    local r, took = run("head-delay=1200", { stall_timeout = 0.4 })
    assert.equal("done", r.last.type, r.last.message)
    assert.equal("a b", r.text)
    assert.is_true(took >= 1.1)
  end)

  it("header_timeout limits the wait for the head", function()
    local r, took = run("head-delay=5000", { header_timeout = 0.3, stall_timeout = 10 })
    assert.equal("error", r.last.type)
    assert.equal("timeout", r.last.code)
    assert.matches("header timeout", r.last.message)
    assert.is_true(took < 4, tostring(took))
  end)
end)

-- The deadlines are checked only when the earliest one noted is due, so a
-- lone queued request (above) has no check before its head: there a stall
-- clock wrongly running from the open could go unseen. Queued behind a
-- stream whose own stall clock is checked every second, it is checked
-- while it waits, whatever ran before.
describe("a request queued by the daemon behind another stream", function()
  local sim
  -- llama-server's dialect: a queued request gets no response head until
  -- it has the daemon's one slot (MTPLX answers its head at once)
  setup(function()
    sim = H.start_sim { "--dialect", "llama", "--parallel", "1", "--tok-rate", "20", "--ttft-ms", "0",
      "--reasoning-tokens", "0" }
  end)
  teardown(function() sim.stop() end)

  local function body(text)
    local b = H.chat_body("x")
    b.mirza_sim = { text = text }
    return b
  end

  it("does not stall while the other streams (its clocks are checked meanwhile)", function()
    local words = {}
    for i = 1, 40 do words[i] = "w" .. i end -- 2 s at 20 tokens a second
    local first <close> = mirza.open { url = sim.url, body = body(table.concat(words, " ")), stall_timeout = 1 }
    local ev = first:next(10)
    -- an event of the first request: it has the slot, the second waits for it
    assert.is_truthy(ev and ev.type ~= "error", ev and ev.message)
    local queued <close> = mirza.open { url = sim.url, body = body("a b"), stall_timeout = 0.3 }
    local t_queued = mirza.now()
    local r1 = H.drain(first)
    local waited = mirza.now() - t_queued
    local r2 = H.drain(queued)
    assert.equal("done", r1.last.type, r1.last.message)
    -- the second had no head for longer than its own stall_timeout and the
    -- first's (so the first's stall clock was checked while it waited)
    assert.is_true(waited > 1.3, tostring(waited))
    assert.equal("done", r2.last.type, r2.last.message)
    assert.equal("a b", r2.text)
  end)
end)

describe("redirects", function()
  local sim
  setup(function() sim = H.start_sim { "--tok-rate", "0", "--ttft-ms", "0" } end)
  teardown(function() sim.stop() end)

  for _, st in ipairs { 307, 308, 301 } do
    it("fails a " .. st .. " with an http error naming the Location (not followed)", function()
      local ev = open(sim, "x", { fault = "redirect=" .. st }):next()
      assert.equal("error", ev.type)
      assert.equal("http", ev.code)
      assert.equal(st, ev.status)
      assert.matches("^" .. sim.url:gsub("%p", "%%%0") .. ": HTTP " .. st .. " [%a ]+ to " .. sim.url:gsub("%p", "%%%0")
        .. "/moved %(redirects are not followed", ev.message)
      assert.equal("/v1/chat/completions/moved", ev.headers.location)
    end)
  end
end)

describe("malformed frames", function()
  local sim
  setup(function() sim = H.start_sim { "--tok-rate", "0", "--ttft-ms", "0" } end)
  teardown(function() sim.stop() end)

  local function run(opts)
    local body = H.chat_body("x")
    body.mirza_sim = { text = "a b c d", fault = "malformed-after=2" }
    local req = { url = sim.url, body = body }
    for k, v in pairs(opts) do req[k] = v end
    return H.drain(mirza.open(req))
  end

  it("fail the stream with 'protocol' by default, the text before kept", function()
    local r = run {}
    assert.equal("protocol", r.last.code)
    assert.equal("a b ", r.text)
    local r2 = run { on_bad_frame = "error" }
    assert.equal("protocol", r2.last.code)
    assert.equal("a b ", r2.text)
  end)

  it("are skipped and counted with on_bad_frame = 'skip'", function()
    local r = run { on_bad_frame = "skip" }
    assert.equal("done", r.last.type)
    assert.equal("a b c d", r.text)
    assert.equal(1, r.last.skipped_frames)
  end)

  it("on_bad_frame takes 'error' or 'skip' only", function()
    assert.has_error(function() mirza.open { url = sim.url, on_bad_frame = "ignore" } end,
      'mirza.open: \'on_bad_frame\' must be "error" or "skip"')
  end)
end)

describe("compressed bodies", function()
  local sim
  setup(function() sim = H.start_sim { "--tok-rate", "0", "--ttft-ms", "0" } end)
  teardown(function() sim.stop() end)

  it("decodes a gzip stream", function()
    local r = H.drain(open(sim, "x", { text = "a b c", fault = "gzip" }))
    assert.equal("done", r.last.type, r.last.message)
    assert.equal("a b c", r.text)
  end)

  it("decodes a gzip stream when the script set Accept-Encoding itself", function()
    local body = H.chat_body("x")
    body.mirza_sim = { text = "é b c", fault = "gzip" }
    local r = H.drain(mirza.open { url = sim.url, body = body, headers = { ["Accept-Encoding"] = "gzip" } })
    assert.equal("done", r.last.type, r.last.message)
    assert.equal("é b c", r.text)
  end)

  it("decodes a gzip error body", function()
    local ev = open(sim, "x", { fault = "gzip,http=400:bad things" }):next()
    assert.equal(sim.url .. ": " .. "HTTP 400 Bad Request: bad things", ev.message)
    assert.equal("bad things", ev.error.message)
  end)
end)
