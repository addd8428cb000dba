-- An answer that is not what was asked for (issue 31 items 6 and 7): a
-- 2xx web page (a web UI, a proxy's login page: mirza-sim's html-page
-- fault) where a chat stream was asked is a "protocol" error, status
-- 200, naming the url, the content type and the page's <title>, and
-- telling what to check; it is never retried as a network failure (the
-- same page would come again). The same through mirza.open, mirza.request,
-- mirza.collect, an engine's turn and a batch item. An HTTP error's
-- message names the url requested, so a doubled path shows.
local mirza = require "mirza"
local engine = require "mirza.engine"
local json = mirza.json
local H = require "tests.helper"

local TITLE = "Sign in - Proxy"
local FAULT = "html-page=" .. TITLE
local ADVICE = "check that the url is the daemon's API (a base url ending in /v1) and that no web UI or proxy "
  .. "answers in its place"

-- The message of a streamed request's answer with this content type and title.
local function not_a_stream(url, ctype, title)
  return ("%s answered 200 with %s (\"%s\"), not an event stream: %s"):format(url, ctype, title, ADVICE)
end

-- Chat requests the simulator answered (it logs one line per request).
local function chats(sim)
  local n = 0
  for _ in H.read_file(sim.log):gmatch("POST /v1/chat/completions 200") do n = n + 1 end
  return n
end

-- Assert that the simulator answered exactly n chat requests (its log
-- line comes when a request is over: wait for the n-th, then a little
-- more for one too many).
local function asked(sim, n)
  H.wait_for(function() return chats(sim) >= n end, 5)
  mirza.sleep(0.2)
  assert.equal(n, chats(sim), "the request was not sent once")
end

-- The chat requests answered so far, once the earlier tests' are logged.
local function settled(sim)
  mirza.sleep(0.2)
  return chats(sim)
end

local function body(extra)
  return H.chat_body("Bonjour", extra)
end

describe("a 200 web page where a chat stream was asked", function()
  local sim
  setup(function() sim = H.start_sim { "--tok-rate", "0", "--ttft-ms", "0", "--verbose" } end)
  teardown(function() sim.stop() end)
  after_each(function() collectgarbage("collect") end)

  it("is a protocol error naming the url, the content type and the page's title (mirza.open)", function()
    local s <close> = mirza.open { url = sim.url, body = body(), headers = { ["X-Mirza-Sim-Fault"] = FAULT } }
    local r = H.drain(s, 10)
    assert.equal(1, #r.events, "nothing comes before the error")
    local ev = r.last
    assert.equal("error", ev.type)
    assert.equal("protocol", ev.code)
    assert.equal(200, ev.status)
    assert.equal(not_a_stream(sim.url, "text/html", TITLE), ev.message)
    assert.is_false(require("mirza.retry").retryable(ev.code, ev.status))
  end)

  it("names any other content type, and the first line of its text", function()
    local s <close> = mirza.open { url = sim.url, body = body(),
      headers = { ["X-Mirza-Sim-Fault"] = "http-plain=200:Welcome to the proxy" } }
    local ev = H.drain(s, 10).last
    assert.equal("protocol", ev.code)
    assert.equal(not_a_stream(sim.url, "text/plain", "Welcome to the proxy"), ev.message)
  end)

  it("is the same error for a plain request, which expected JSON (mirza.request)", function()
    local got, msg, code, status = mirza.request { url = sim.url, body = body { stream = false },
      headers = { ["X-Mirza-Sim-Fault"] = FAULT } }
    assert.is_nil(got)
    assert.equal("protocol", code)
    assert.equal(200, status)
    assert.equal(("%s answered 200 with text/html (\"%s\"), not JSON: %s"):format(sim.url, TITLE, ADVICE), msg)
    -- a plain request may fetch text that is no page: a health route's "OK"
    local ok = mirza.request { url = sim.url, body = body { stream = false },
      headers = { ["X-Mirza-Sim-Fault"] = "http-plain=200:OK" } }
    assert.equal("OK\n", ok)
  end)

  it("fails mirza.collect with that message and code, once", function()
    local before = settled(sim)
    local r, msg, code = mirza.collect { url = sim.url, body = body(), headers = { ["X-Mirza-Sim-Fault"] = FAULT } }
    assert.is_nil(r)
    assert.equal("protocol", code)
    assert.equal(not_a_stream(sim.url, "text/html", TITLE), msg)
    asked(sim, before + 1)
  end)
end)

describe("an engine's turn and a batch item against a web page", function()
  local sim
  setup(function() sim = H.start_sim { "--tok-rate", "0", "--ttft-ms", "0", "--verbose", "--fault", FAULT } end)
  teardown(function() sim.stop() end)
  after_each(function() collectgarbage("collect") end)

  it("fails the engine's turn with the error, asked once", function()
    local e = engine.new { base_url = sim.base .. "/v1", daemon = false, config_file = false, model = "m",
      log = function() end }
    local before = settled(sim)
    local errors = {}
    local ok, msg, code, res = e:say("Bonjour", { error = function(_, ev) errors[#errors + 1] = ev end })
    assert.is_nil(ok)
    assert.equal("protocol", code)
    assert.equal(not_a_stream(sim.url, "text/html", TITLE), msg)
    assert.equal(1, #errors)
    assert.equal(200, errors[1].status)
    assert.equal(200, res.error.status)
    asked(sim, before + 1)
    -- e:turn's events end with the same error
    local last
    for ev in e:turn("encore") do last = ev end
    assert.equal("error", last.type)
    assert.equal("protocol", last.code)
    assert.equal(not_a_stream(sim.url, "text/html", TITLE), last.message)
    asked(sim, before + 2)
  end)

  it("records the batch item's error after one attempt: no retry", function()
    local batch = require "mirza.batch"
    local batch_input = require "mirza.batch_input"
    local batch_output = require "mirza.batch_output"
    local input, output = H.tmpname(".jsonl"), H.tmpname(".jsonl")
    finally(function() os.remove(input) os.remove(output) os.remove(batch_output.errors_path(output)) end)
    H.write_file(input, json.encode { custom_id = "a", prompt = "Bonjour" } .. "\n")
    local before = settled(sim)
    local st = assert(batch.run { items = assert(batch_input.read_input(input)),
      output = output, endpoints = { sim.base }, model = "m", quiet = true, progress = false, max_retries = 3,
      retry_base = 0.05 })
    assert.equal(1, st.errors)
    assert.equal("", H.read_file(output)) -- a failure: in the error file beside OUTPUT
    local rec = json.decode(H.read_file(batch_output.errors_path(output)))
    assert.equal("a", rec.custom_id)
    assert.equal("protocol", rec.error.code)
    assert.equal(not_a_stream(sim.url, "text/html", TITLE), rec.error.message)
    assert.equal(1, rec.mirza.attempts)
    asked(sim, before + 1)
  end)
end)

describe("an HTTP error's message", function()
  local sim
  setup(function() sim = H.start_sim { "--tok-rate", "0", "--ttft-ms", "0" } end)
  teardown(function() sim.stop() end)
  after_each(function() collectgarbage("collect") end)

  it("names the url requested: a doubled path shows", function()
    local url = sim.url .. "/chat/completions"
    local s <close> = mirza.open { url = url, body = body() }
    local ev = H.drain(s, 10).last
    assert.equal("http", ev.code)
    assert.equal(404, ev.status)
    assert.equal(url .. ": HTTP 404 Not Found: Not Found", ev.message)
  end)

  it("names it without its credentials", function()
    local url = sim.url:gsub("^http://", "http://user:secret@") .. "?api_key=k1"
    local _, msg, code = mirza.request { url = url, body = body { stream = false },
      headers = { ["X-Mirza-Sim-Fault"] = "http-html=502" } }
    assert.equal("http", code)
    assert.equal(mirza.redact_url(url) .. ": HTTP 502 Bad Gateway: 502 Bad Gateway", msg)
    assert.is_nil(msg:find("secret", 1, true))
    assert.is_nil(msg:find("k1", 1, true))
  end)
end)
