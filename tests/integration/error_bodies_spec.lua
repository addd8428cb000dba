-- The error bodies of each daemon family (issue 19): llama.cpp, vLLM (its
-- error object and FastAPI's detail), Ollama, MTPLX, OpenAI, and what sits
-- in front of them (a plain-text body, an HTML page, no body at all),
-- served by mirza-sim --replay-dir byte for byte (from the captured traces
-- where there are some): each gives nil, a message that names the status
-- and carries the daemon's own message, and the code "http", through
-- mirza.collect, mirza.request and an engine turn; the error event keeps
-- the status and the body.
local mirza = require "mirza"
local engine = require "mirza.engine"
local H = require "tests.helper"

local TRACES = os.getenv("MIRZA_TRACES") or H.traces

local function trace(name)
  local text = H.read_file(TRACES .. "/" .. name)
  local head, body = text:match("^(.-)\r?\n\r?\n(.*)$")
  return head:gsub("\r?\n", "\r\n") .. "\r\n\r\n" .. body
end

local function json_response(status, reason, body)
  return ("HTTP/1.1 %d %s\r\nContent-Type: application/json\r\n\r\n%s"):format(status, reason, body)
end

-- name: the request body that selects it (--replay-match body); response:
-- what the daemon answers; want: the whole message after the url requested
-- (every message starts with it: "http://.../v1/chat/completions: HTTP 400 ...").
local CASES = {
  { name = "llama.cpp", response = trace("llama-server.err_ctx_exceeded_stream.txt"), status = 400,
    want = "HTTP 400 Bad Request: request (298 tokens) exceeds the available context size (256 tokens), try "
      .. "increasing it" },
  { name = "llama.cpp invalid json", response = trace("llama-server.err_invalid_json.txt"), status = 500,
    want = "HTTP 500 Internal Server Error: [json.exception.parse_error.101] parse error at line 1, column 44: "
      .. "syntax error while parsing array - unexpected end of input; expected ']'" },
  { name = "vLLM", status = 400, response = json_response(400, "Bad Request",
    '{"object":"error","message":"This model\'s maximum context length is 4096 tokens. However, you requested '
      .. '5000 tokens (4000 in the messages, 1000 in the completion).","type":"BadRequestError","param":null,'
      .. '"code":400}'),
    want = "HTTP 400 Bad Request: This model's maximum context length is 4096 tokens. However, you requested 5000 "
      .. "tokens (4000 in the messages, 1000 in the completion)." },
  { name = "vLLM FastAPI", status = 404, response = json_response(404, "Not Found",
    '{"detail":"The model `qwen-big` does not exist."}'),
    want = "HTTP 404 Not Found: The model `qwen-big` does not exist." },
  { name = "vLLM FastAPI validation", status = 422, response = json_response(422, "Unprocessable Entity",
    '{"detail":[{"type":"missing","loc":["body","messages"],"msg":"Field required","input":{}}]}'),
    want = "HTTP 422 Unprocessable Content: body.messages: Field required" },
  { name = "Ollama", status = 404, response = json_response(404, "Not Found",
    '{"error":"model \\"llama3.2\\" not found, try pulling it first"}'),
    want = 'HTTP 404 Not Found: model "llama3.2" not found, try pulling it first' },
  { name = "MTPLX", status = 400, response = trace("mtplx.reconstructed.err_context.txt"),
    want = "HTTP 400 Bad Request: Prompt contains 33000 tokens, but the served context window is 32768 tokens. "
      .. "The prompt must be shorter than the context window to leave room for at least one generated token." },
  { name = "MTPLX busy session", status = 409, response = json_response(409, "Conflict",
    '{"error": {"message": "session \'s1\' is already generating", "type": "conflict_error", '
      .. '"code": "SessionBusy", "param": null}}'),
    want = "HTTP 409 Conflict: session 's1' is already generating" },
  { name = "OpenAI", status = 401, response = json_response(401, "Unauthorized",
    '{"error":{"message":"Incorrect API key provided: sk-abc***.","type":"invalid_request_error","param":null,'
      .. '"code":"invalid_api_key"}}'),
    want = "HTTP 401 Unauthorized: Incorrect API key provided: sk-abc***." },
  { name = "plain text", status = 500,
    response = "HTTP/1.1 500 Internal Server Error\r\nContent-Type: text/plain\r\n\r\n\nInternal error: CUDA out of "
      .. "memory\ntraceback follows\n",
    want = "HTTP 500 Internal Server Error: Internal error: CUDA out of memory" },
  { name = "HTML", status = 502,
    response = "HTTP/1.1 502 Bad Gateway\r\nContent-Type: text/html\r\n\r\n<html>\r\n<head><title>502 Bad Gateway"
      .. "</title></head>\r\n<body>\r\n<center><h1>502 Bad Gateway</h1></center>\r\n<hr><center>nginx/1.24.0"
      .. "</center>\r\n</body>\r\n</html>\r\n",
    want = "HTTP 502 Bad Gateway: 502 Bad Gateway" },
  { name = "empty", status = 503, response = "HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain\r\n\r\n",
    want = "HTTP 503 Service Unavailable" },
}

local write = H.write_file

describe("an error body of each daemon family", function()
  after_each(function() collectgarbage("collect") end)

  -- A simulator answering the chat route with this response, `n` times.
  local function serving(response, n)
    local dir = H.tmpname(".rec")
    assert(os.execute("mkdir -p " .. H.q(dir)))
    for i = 1, n do
      write(("%s/%06d.request"):format(dir, i), "POST /v1/chat/completions\n\n{}")
      write(("%s/%06d.response"):format(dir, i), response)
    end
    local sim = H.start_sim { "--replay-dir", dir }
    finally(function()
      sim.stop()
      os.execute("rm -rf " .. H.q(dir))
    end)
    return sim
  end

  for _, c in ipairs(CASES) do
    it(c.name .. ": nil, the daemon's message with the status, code http", function()
      local sim = serving(c.response, 4)
      local body = H.chat_body("x")
      local want = sim.url .. ": " .. c.want
      local res, msg, code, partial = mirza.collect { url = sim.url, body = body, retries = 0 } -- one recording each
      assert.is_nil(res)
      assert.equal(want, msg)
      assert.equal("http", code)
      assert.same({ text = "", think = "" }, { text = partial.text, think = partial.think })
      -- the event keeps the status and the body for the caller
      local s <close> = mirza.open { url = sim.url, body = body }
      local ev = H.drain(s, 30).last
      assert.same({ "error", "http", c.status, want }, { ev.type, ev.code, ev.status, ev.message })
      local sent = c.response:match("\r\n\r\n(.*)$")
      assert.equal(sent ~= "" and sent or nil, ev.body)
      -- a plain request: the message, the code and the status
      local got, rmsg, rcode, rstatus = mirza.request { url = sim.url, method = "POST", body = "{}" }
      assert.same({ nil, want, "http", c.status }, { got, rmsg, rcode, rstatus })
      -- an engine turn: the same message and code
      local e = engine.new { base_url = sim.base .. "/v1", model = "mirza-sim", config_file = false, daemon = false,
        busy_wait = 0, log = function() end }
      local st, emsg, ecode = e:say("x", { answer = function() end })
      e:close()
      assert.same({ nil, want, "http" }, { st, emsg, ecode })
    end)
  end
end)
