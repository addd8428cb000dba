-- What URL a request takes (issue 38 item 3), on the wire: each form of
-- docs/batch.md's endpoint table that can be served over loopback (a bare
-- host, .../v1, OpenRouter's /api/v1, Groq's /openai/v1, Gemini's
-- /v1beta/openai/, an Azure deployment's URL with its api-version, a
-- pasted route's URL) goes through a batch, a pool (mirza.embed) and the
-- engine (its probe, then a turn; alone and over a pool of one) to a
-- small server that answers any path and logs each request line: every
-- request must take the path mirza.url gives, the query kept, and no
-- other. The hosts "look remote" only by their paths: the traffic stays
-- on 127.0.0.1 (the https:// forms are lua.url_spec's).
local mirza = require "mirza"
local H = require "tests.helper"

-- The server (python3, as core_spec's capture server): OpenAI's routes
-- under any prefix (…/models, …/chat/completions streamed or not,
-- …/completions, …/embeddings), 404 for anything else; one line per
-- request in the log, "METHOD PATH?QUERY".
local SERVER = [[
import http.server, json, os, sys
port_file, log_file = sys.argv[1], sys.argv[2]
log = open(log_file, "a", buffering=1)
USAGE = {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}
class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def log_message(self, *a):
        pass
    def reply(self, status, body, ctype="application/json"):
        data = body.encode()
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
    def do_GET(self):
        log.write("GET %s\n" % self.path)
        if self.path.split("?")[0].endswith("/models"):
            return self.reply(200, json.dumps({"object": "list", "data": [{"id": "m", "object": "model"}]}))
        self.reply(404, '{"error": {"message": "no such route", "type": "not_found_error"}}')
    def do_POST(self):
        n = int(self.headers.get("Content-Length") or 0)
        req = json.loads(self.rfile.read(n) or b"{}")
        log.write("POST %s\n" % self.path)
        route = self.path.split("?")[0]
        if route.endswith("/chat/completions"):
            if req.get("stream"):
                chunk = {"id": "c1", "object": "chat.completion.chunk", "model": "m", "created": 1}
                frames = [dict(chunk, choices=[{"index": 0, "delta": {"role": "assistant", "content": "ok"},
                                                "finish_reason": None}]),
                          dict(chunk, choices=[{"index": 0, "delta": {}, "finish_reason": "stop"}], usage=USAGE)]
                body = "".join("data: %s\n\n" % json.dumps(f) for f in frames) + "data: [DONE]\n\n"
                return self.reply(200, body, "text/event-stream")
            return self.reply(200, json.dumps({"id": "c1", "object": "chat.completion", "model": "m", "created": 1,
                "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"},
                             "finish_reason": "stop"}], "usage": USAGE}))
        if route.endswith("/embeddings"):
            inp = req.get("input")
            inp = inp if isinstance(inp, list) else [inp]
            return self.reply(200, json.dumps({"object": "list", "model": "m", "usage": USAGE,
                "data": [{"object": "embedding", "index": i, "embedding": [0.5, 0.25]} for i in range(len(inp))]}))
        if route.endswith("/completions"):
            return self.reply(200, json.dumps({"id": "t1", "object": "text_completion", "model": "m", "created": 1,
                "choices": [{"index": 0, "text": "ok", "finish_reason": "stop"}], "usage": USAGE}))
        self.reply(404, '{"error": {"message": "no such route", "type": "not_found_error"}}')
srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
open(port_file + ".tmp", "w").write(str(srv.server_address[1]))
os.rename(port_file + ".tmp", port_file)
srv.serve_forever()
]]

-- Start the server: {base = "http://127.0.0.1:PORT", lines() -> the request lines since the last call, stop()}.
local function start_server()
  local script, port_file, log = H.tmpname(".py"), H.tmpname(".port"), H.tmpname(".log")
  H.write_file(script, SERVER)
  H.write_file(log, "")
  local p = assert(io.popen(("python3 %s %s %s >/dev/null 2>&1 & echo $!"):format(H.q(script), H.q(port_file),
    H.q(log))))
  local pid = tonumber(p:read("l"))
  p:close()
  H.track(pid, script)
  local port = H.wait_for(function()
    local f = io.open(port_file)
    if not f then return nil end
    local n = tonumber(f:read("a"))
    f:close()
    return n
  end, 20)
  assert(port, "the logging server did not start (python3)")
  os.remove(port_file)
  local srv, seen = { base = ("http://127.0.0.1:%d"):format(port) }, 0
  function srv.lines()
    local all = {}
    for line in H.read_file(log):gmatch("[^\n]+") do all[#all + 1] = line end
    local new = table.move(all, seen + 1, #all, 1, {})
    seen = #all
    return new
  end
  function srv.stop()
    os.execute("kill " .. pid .. " 2>/dev/null")
    H.untrack(pid)
    for _, f in ipairs { script, log } do os.remove(f) end
  end
  return srv
end

-- The forms: {name, what follows the host, the base's path, its query}.
local FORMS = {
  { "a bare host", "", "/v1", "" },
  { "a bare host and a last /", "/", "/v1", "" },
  { ".../v1 (Ollama's)", "/v1", "/v1", "" },
  { "OpenRouter's .../api/v1", "/api/v1", "/api/v1", "" },
  { "Groq's .../openai/v1", "/openai/v1", "/openai/v1", "" },
  { "Gemini's .../v1beta/openai/", "/v1beta/openai/", "/v1beta/openai", "" },
  { "an Azure deployment's URL", "/openai/deployments/D/chat/completions?api-version=2024-10-21",
    "/openai/deployments/D", "?api-version=2024-10-21" },
  { "a pasted route's URL", "/v1/chat/completions", "/v1", "" },
}

-- The request lines a form's requests may have: its routes under its base,
-- the probe's server-root routes under the base less /v<N>, the query on each.
local function allowed(form)
  local base, q = form[3], form[4]
  local root = base:gsub("/v%d+$", "")
  local ok = {}
  for _, r in ipairs { "chat/completions", "completions", "embeddings", "models" } do
    ok["POST " .. base .. "/" .. r .. q], ok["GET " .. base .. "/" .. r .. q] = true, true
  end
  -- /metrics: a batch reads vLLM's queue there (mirza.capacity)
  for _, r in ipairs { "/health", "/props", "/api/version", "/version", "/metrics" } do
    ok["GET " .. root .. r .. q] = true
  end
  return ok
end

-- Every line is one of the form's, and each of `want` is among them.
local function check(form, lines, want)
  local ok, got = allowed(form), {}
  for _, l in ipairs(lines) do
    assert.truthy(ok[l], ("%s: a request took %q"):format(form[1], l))
    got[l] = true
  end
  for _, w in ipairs(want) do
    local line = w:gsub("BASE", form[3]) .. form[4]
    assert.truthy(got[line], ("%s: no %q among %s"):format(form[1], line, table.concat(lines, ", ")))
  end
end

describe("each form of an endpoint, on the wire", function()
  local srv
  setup(function() srv = start_server() end)
  teardown(function() if srv then srv.stop() end end)
  after_each(function() collectgarbage("collect") end)

  it("a batch: chat, completions and embeddings lines, and the model asked of /models", function()
    local input = H.tmpname(".jsonl")
    H.write_file(input, table.concat({
      '{"custom_id": "c", "method": "POST", "url": "/v1/chat/completions", "body": {"messages": '
        .. '[{"role": "user", "content": "Bonjour"}]}}',
      '{"custom_id": "t", "method": "POST", "url": "/v1/completions", "body": {"prompt": "Bonjour"}}',
      '{"custom_id": "e", "method": "POST", "url": "/v1/embeddings", "body": {"input": "Bonjour"}}',
    }, "\n") .. "\n")
    finally(function() os.remove(input) end)
    for _, form in ipairs(FORMS) do
      local batch = require "mirza.batch"
      local batch_output = require "mirza.batch_output"
      local out = H.tmpname(".jsonl")
      assert(batch.run { input = input, output = out, quiet = true, endpoints = { srv.base .. form[2] },
        max_retries = 0 })
      local by, answers = H.batch_records(out)
      for _, f in ipairs { out, batch_output.errors_path(out) } do os.remove(f) end
      for id, r in pairs(by) do
        assert.equal(mirza.json.null, r.error, ("%s: %s: %s"):format(form[1], id, mirza.json.encode(r.error)))
        assert.equal(srv.base .. form[3], r.mirza.endpoint, form[1])
      end
      assert.equal(3, answers, form[1])
      check(form, srv.lines(), { "GET BASE/models", "POST BASE/chat/completions", "POST BASE/completions",
        "POST BASE/embeddings" })
    end
  end)

  it("a pool: mirza.embed over one, and over a url alone", function()
    for _, form in ipairs(FORMS) do
      local p = require("mirza.pool").new { srv.base .. form[2] }
      assert.equal(srv.base .. form[3], p.endpoints[1].base, form[1])
      local vecs, msg = require("mirza.embed") { pool = p, input = { "un", "deux" }, model = "m" }
      assert(vecs, form[1] .. ": " .. tostring(msg))
      assert.equal(2, #vecs)
      vecs, msg = require("mirza.embed") { url = srv.base .. form[2], input = "trois", model = "m" }
      assert(vecs, form[1] .. ": " .. tostring(msg))
      check(form, srv.lines(), { "POST BASE/embeddings" })
    end
  end)

  it("the engine: its probe and a turn, at a base_url and over a pool", function()
    for i, form in ipairs(FORMS) do
      for _, how in ipairs { "base_url", "endpoints" } do
        -- a key of its own: each engine probes (engines on one URL and key share a probe for 2 s)
        local opts = { config_file = false, max_tokens = 8, log = function() end, connect_timeout = 5,
          api_key = ("k-%d-%s"):format(i, how) }
        if how == "base_url" then opts.base_url, opts.daemon = srv.base .. form[2], false
        else opts.endpoints = { srv.base .. form[2] } end
        local e = require("mirza.engine").new(opts)
        local ok, msg = e:load()
        assert(ok, form[1] .. ", " .. how .. ": " .. tostring(msg))
        assert.equal(srv.base .. form[3], e.base_url, form[1] .. ", " .. how)
        assert.equal("m", e:model(), form[1] .. ", " .. how) -- what its /models listed
        local st, res = e:say("Bonjour", { answer = function() end })
        assert(st, form[1] .. ", " .. how .. ": " .. tostring(res))
        assert.equal("ok", res.answer)
        e:close()
        check(form, srv.lines(), { "GET BASE/models", "POST BASE/chat/completions" })
      end
    end
  end)

  it("every form's chat URL, as mirza.url gives it, is the one the engine posts to", function()
    for _, form in ipairs(FORMS) do
      local want = srv.base .. form[3] .. "/chat/completions" .. form[4]
      assert.equal(want, (require("mirza.url").resolve(srv.base .. form[2], "chat")), form[1])
      local e = require("mirza.engine").new { base_url = srv.base .. form[2], daemon = false, config_file = false,
        log = function() end }
      assert.equal(want, e.chat_url, form[1])
      e:close()
    end
  end)
end)
