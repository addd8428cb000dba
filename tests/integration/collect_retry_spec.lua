-- mirza.collect retries a transient failure before anything arrived, as
-- the engine's turn and a batch do (issue 36 item 6: mirza.retry.stream):
-- a 429 waited out for its Retry-After, a 5xx and a stream cut before its
-- first token sent again after a backoff, `retries` times (default 2, the
-- OpenAI SDKs'); never a 4xx, a timeout, a failure after text or a
-- Retry-After longer than a minute. A failure says its HTTP status, its
-- Retry-After and the retries made (the fourth value).
local mirza = require "mirza"
local H = require "tests.helper"

local FAST = { "--tok-rate", "0", "--ttft-ms", "0" }

local function sim_with(args)
  local all = { table.unpack(FAST) }
  for _, a in ipairs(args) do all[#all + 1] = a end
  local sim = H.start_sim(all)
  finally(sim.stop)
  return sim
end

local function collect(sim, extra)
  local opts = { url = sim.url, body = H.chat_body("x") }
  for k, v in pairs(extra or {}) do opts[k] = v end
  return mirza.collect(opts)
end

-- A simulator answering the chat route with these responses, in order.
local function serving(responses)
  local dir = H.tmpname(".rec")
  assert(os.execute("mkdir -p " .. H.q(dir)))
  for i, response in ipairs(responses) do
    H.write_file(("%s/%06d.request"):format(dir, i), "POST /v1/chat/completions\n\n{}")
    H.write_file(("%s/%06d.response"):format(dir, i), response)
  end
  local sim = H.start_sim { "--replay-dir", dir }
  finally(function()
    sim.stop()
    os.execute("rm -rf " .. H.q(dir))
  end)
  return sim
end

local function http(status, reason, extra)
  return ("HTTP/1.1 %d %s\r\nContent-Type: application/json\r\n%s\r\n{\"error\": {\"message\": \"%s\"}}")
    :format(status, reason, extra or "", reason)
end
local SSE = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n\r\n"
local ROLE = 'data: {"choices":[{"index":0,"delta":{"role":"assistant"}}]}\n\n'
local function text(t) return ('data: {"choices":[{"index":0,"delta":{"content":"%s"}}]}\n\n'):format(t) end
local function answer(t)
  return SSE .. ROLE .. text(t) .. 'data: {"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}\n\n'
    .. "data: [DONE]\n\n"
end

describe("mirza.collect retries", function()
  after_each(function() collectgarbage("collect") end)

  it("waits out 429s for their Retry-After, twice by default", function()
    local sim = sim_with { "--fail-first", "2", "--retry-after", "0" }
    local r, msg = collect(sim)
    assert(r, msg)
    assert.truthy(r.text ~= "")
  end)

  it("gives up after the retries with the status, the Retry-After and the retries made", function()
    local sim = sim_with { "--fail-first", "3", "--retry-after", "0" }
    local r, msg, code, partial = collect(sim)
    assert.is_nil(r)
    assert.equal("http", code)
    assert.truthy(msg:find("HTTP 429", 1, true), msg)
    assert.same({ 429, 0, 2, "" }, { partial.status, partial.retry_after, partial.retries, partial.text })
    -- three requests were made, no more: the fourth is answered
    assert(collect(sim, { retries = 0 }))
  end)

  it("retries = 0 fails at once; a Retry-After past a minute is not waited", function()
    local sim = sim_with { "--fail-first", "2", "--retry-after", "120" }
    local _, _, code, partial = collect(sim, { retries = 0 })
    assert.same({ "http", 429, 120, 0 }, { code, partial.status, partial.retry_after, partial.retries })
    local r
    r, _, code, partial = collect(sim) -- 2 retries allowed, none worth waiting two minutes for
    assert.is_nil(r)
    assert.same({ "http", 429, 120, 0 }, { code, partial.status, partial.retry_after, partial.retries })
    assert(collect(sim, { retries = 0 }))
    assert.has_error(function() collect(sim, { retries = -1 }) end,
      "mirza.collect: retries must be an integer >= 0, got -1")
  end)

  it("sends a 5xx, a stream cut before its first token and a 503 again; not a 401", function()
    local sim = serving {
      http(500, "Internal Server Error"),
      SSE .. ROLE, -- 200, then the stream ends before any text
      http(503, "Service Unavailable", "Retry-After: 0\r\n"),
      answer("Hi"),
      http(401, "Unauthorized"),
      answer("Bye"),
    }
    local r, msg = collect(sim, { retries = 3 })
    assert(r, msg)
    assert.equal("Hi", r.text)
    local _, _, code, partial = collect(sim)
    assert.same({ "http", 401, 0 }, { code, partial.status, partial.retries })
    r, msg = collect(sim)
    assert(r, msg)
    assert.equal("Bye", r.text)
  end)

  it("does not send a request again once text came, nor after a timeout", function()
    local sim = serving { SSE .. ROLE .. text("Half"), answer("Whole") }
    local r, _, code, partial = collect(sim)
    assert.is_nil(r)
    assert.same({ "closed", "Half", 0 }, { code, partial.text, partial.retries })
    r = assert(collect(sim))
    assert.equal("Whole", r.text)
    local slow = sim_with {}
    local _, msg, tcode, tpartial = collect(slow, { header_timeout = 0.3,
      body = H.chat_body("x", { mirza_sim = { fault = "head-delay=5000" } }) })
    assert.same({ "timeout", 0 }, { tcode, tpartial.retries }, msg)
  end)
end)
