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
