-- The core's clocks and what its messages show: the default timeouts of
-- mirza.open/collect/request (and the engine's and batch's), every byte of
-- a slow response head counting as progress, and URLs with credentials
-- redacted in every message the C core makes.
local mirza = require "mirza"
local H = require "tests.helper"

describe("URL redaction (mirza.redact_url)", function()
  it("hides userinfo and credential-like query parameters, keeps the rest", function()
    assert.equal("http://[redacted]@h:1/x?api_key=[redacted]&a=1&Token=[redacted]#f",
      mirza.redact_url("http://u:p@h:1/x?api_key=S&a=1&Token=T#f"))
    assert.equal("https://[redacted]@c/v1?x&key=[redacted]&q=auth",
      mirza.redact_url("https://a@b@c/v1?x&key=k&q=auth"))
    assert.equal("[redacted]@host/p", mirza.redact_url("user:pw@host/p"))
    assert.equal("http://127.0.0.1:8080/v1/chat/completions?stream=1",
      mirza.redact_url("http://127.0.0.1:8080/v1/chat/completions?stream=1"))
    assert.equal("http://h/a@b", mirza.redact_url("http://h/a@b")) -- an @ in the path is no userinfo
    assert.equal(require("mirza.core").redact_url, mirza.redact_url)
  end)

  it("shows a refused URL redacted in the error message", function()
    local port = H.free_port()
    local url = ("http://alice:s3cr3t@127.0.0.1:%d/v1/chat/completions?api_key=K3Y&x=1"):format(port)
    local body, msg, code = mirza.request { url = url, timeout = 2 }
    assert.is_nil(body)
    assert.equal("refused", code)
    assert.matches(("http://[redacted]@127.0.0.1:%d/v1/chat/completions?api_key=[redacted]&x=1"):format(port),
      msg, 1, true)
    assert.is_nil(msg:find("s3cr3t", 1, true))
    assert.is_nil(msg:find("K3Y", 1, true))
  end)
end)

describe("the stall clock against a slow head", function()
  local sim
  setup(function() sim = H.start_sim { "--tok-rate", "0", "--ttft-ms", "0" } end)
  teardown(function() sim.stop() end)

  local function ask(fault, opts)
    local req = { url = sim.url, body = H.chat_body("slow", { mirza_sim = { fault = fault, text = "Bien." } }) }
    for k, v in pairs(opts) do req[k] = v end
    local t0 = mirza.now()
    local s <close> = mirza.open(req)
    local r = H.drain(s, 30)
    return r, mirza.now() - t0
  end

  it("counts every byte of a head trickling in as progress (not only whole lines)", function()
    -- ~140 head bytes, one every 15 ms (~2 s); a line takes up to 0.5 s, the stall timeout is 0.25 s
    local r, took = ask("slow-head-bytes=15", { stall_timeout = 0.25 })
    assert.equal("done", r.last.type, r.last.message)
    assert.equal("Bien.", r.text)
    assert.is_true(took > 1.5, "the head came too fast to test anything: " .. took)
  end)

  it("times the whole head with header_timeout, however steadily it trickles", function()
    local r = ask("slow-head-bytes=15", { stall_timeout = 0.25, header_timeout = 1 })
    assert.equal("error", r.last.type)
    assert.equal("timeout", r.last.code)
    assert.matches("header timeout", r.last.message, 1, true)
  end)
end)
