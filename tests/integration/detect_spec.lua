-- A URL just works (issue 17): with no preset asked for, the engine asks
-- what answers (mirza.detect) and talks to it as it is, in its dialect,
-- with the model it reports — llama-server (/props), a server without
-- /health, Ollama (/api/version) and vLLM (/version) posed by mirza-sim's
-- --route/--no-route — nothing started, nothing stopped; a server still
-- loading is waited for; an explicit preset that finds another server
-- names it; nothing answering says what to do. `mirza chat` the same.
local mirza = require "mirza"
local engine = require "mirza.engine"
local detect = require "mirza.detect"
local H = require "tests.helper"

local sim = H.fast_sim

local function new_engine(base, extra)
  local logged = {}
  local opts = { base_url = base .. "/v1", config_file = false, max_tokens = 32,
    log = function(level, msg) logged[#logged + 1] = level .. ": " .. msg end,
    daemon = { progress = false, deadline = 20 } }
  for k, v in pairs(extra or {}) do opts[k] = v end
  return engine.new(opts), logged
end

-- The chat requests sent while fn runs (the options given to mirza.open).
local function chats(fn)
  local sent, open = {}, mirza.open
  mirza.open = function(o) -- luacheck: ignore
    if o.body and type(o.body) == "table" and o.body.messages then sent[#sent + 1] = o end
    return open(o)
  end
  local ok, err = pcall(fn)
  mirza.open = open -- luacheck: ignore
  assert(ok, err)
  return sent
end

-- One streamed turn: the answer's text and the request's body.
local function turn(e)
  local text, st, res = {}, nil, nil
  local sent = chats(function()
    st, res = e:say("Bonjour", { mode = "token", answer = function(t) text[#text + 1] = t end })
  end)
  assert.is_table(st, tostring(res))
  assert.equal("stop", st.finish_reason)
  return table.concat(text), sent[1].body
end

local function alive(pid)
  local p = H.ps(pid)
  return p ~= nil and not p.stat:find("Z")
end

describe("no preset: what answers is detected and used as is", function()
  after_each(function() collectgarbage("collect") end)

  it("llama-server (mirza-sim --dialect llama): via /props, its model, the llama dialect, unsupervised", function()
    local s = sim { "--dialect", "llama", "--model-id", "qwen3-0.6b" }
    finally(s.stop)
    local e, logged = new_engine(s.base, { verbose = true })
    assert.is_table(e.daemon) -- a loopback URL could be supervised: load decides
    assert.is_true(e:load())
    assert.is_nil(e.daemon)    -- what answers is used as it is
    assert.same({ kind = "llama-server", model = "qwen3-0.6b", via = "/props", dialect = "llama",
      models = { "qwen3-0.6b" }, url = s.base .. "/v1" }, e.detected)
    assert.equal("llama", e.cfg.dialect)
    assert.equal("qwen3-0.6b", e:model())
    local text, body = turn(e)
    assert.truthy(#text > 0)
    assert.equal("qwen3-0.6b", body.model)
    assert.is_table(body.chat_template_kwargs) -- llama-server switches thinking in the template
    assert.is_nil(body.metadata)
    assert.truthy(table.concat(logged, "\n"):find(("notice: %s/v1: llama-server (model 'qwen3-0.6b', via /props), "
      .. "used as is (llama dialect)"):format(s.base), 1, true), table.concat(logged, "\n"))
    e:close()
    assert.is_true(alive(s.pid), "close leaves it running")
    assert.same({}, H.pids_with("--port " .. s.port)) -- and nothing was started on its port
  end)

  it("a server without /health: via /v1/models, its model, a streamed answer", function()
    local s = sim { "--no-route", "/health", "--model-id", "served-y" }
    finally(s.stop)
    local _, _, _, status = mirza.request { url = s.base .. "/health", timeout = 1, deadline = 2 }
    assert.equal(404, status)
    local e = new_engine(s.base)
    assert.is_true(e:load())
    assert.is_nil(e.daemon)
    assert.same({ "openai", "served-y", "/v1/models", "openai" },
      { e.detected.kind, e.detected.model, e.detected.via, e.detected.dialect })
    local text, body = turn(e)
    assert.truthy(#text > 0)
    assert.equal("served-y", body.model)
    assert.is_nil(body.enable_thinking) -- OpenAI's fields only
    assert.is_nil(body.metadata)
    e:close()
    assert.is_true(alive(s.pid))
  end)

  it("MTPLX (mirza-sim's own dialect): via /health, its model; a model given is the one sent", function()
    local s = sim { "--model-id", "qwen38" }
    finally(s.stop)
    local e = new_engine(s.base)
    assert.is_true(e:load())
    assert.is_nil(e.daemon)
    assert.same({ "mtplx", "qwen38", "/health" }, { e.detected.kind, e.detected.model, e.detected.via })
    assert.equal("qwen38", e:model()) -- not the mtplx preset's default model
    local e2 = new_engine(s.base, { model = "mine" })
    assert.is_true(e2:load())
    assert.equal("mine", e2:model())
    assert.equal("mtplx", e2.detected.kind)
  end)

  it("Ollama (/api/version) and vLLM (/version, an empty /health), posed by mirza-sim --route", function()
    local o = sim { "--no-route", "/health", "--route", '/api/version={"version":"0.12.6"}', "--model-id", "qwen3:8b" }
    local v = sim { "--route", "/health=", "--route", '/version={"version":"0.11.0"}', "--model-id", "Qwen/Qwen3-8B" }
    finally(function() o.stop() v.stop() end)
    local eo = new_engine(o.base)
    assert.is_true(eo:load())
    assert.same({ kind = "ollama", version = "0.12.6", model = "qwen3:8b", via = "/api/version", dialect = "openai",
      models = { "qwen3:8b" }, url = o.base .. "/v1" }, eo.detected)
    local text, body = turn(eo)
    assert.truthy(#text > 0)
    assert.equal("qwen3:8b", body.model)
    assert.is_nil(body.enable_thinking) -- Ollama checks what it is given: OpenAI's fields only
    local ev = new_engine(v.base)
    assert.is_true(ev:load())
    assert.same({ "vllm", "0.11.0", "Qwen/Qwen3-8B", "/version", "llama" },
      { ev.detected.kind, ev.detected.version, ev.detected.model, ev.detected.via, ev.detected.dialect })
    assert.equal("vllm (model 'Qwen/Qwen3-8B', version 0.11.0, via /version)", detect.describe(ev.detected))
    text, body = turn(ev)
    assert.truthy(#text > 0)
    assert.equal("Qwen/Qwen3-8B", body.model)
    assert.is_table(body.chat_template_kwargs)
    -- neither has MTPLX's admin routes: /clear says so instead of an HTTP 404
    assert.same({ nil, "ollama cannot clear a session's cache", "unsupported" }, { eo:clear_cache() })
    assert.same({ nil, "vllm cannot clear a session's cache", "unsupported" }, { ev:clear_cache() })
  end)

  it("a server still loading (503) is waited for, with progress, then detected", function()
    local s = sim { "--dialect", "llama", "--health-delay-ms", "1500" }
    finally(s.stop)
    local seen = 0
    local e = new_engine(s.base, { daemon = { progress = function() seen = seen + 1 end, deadline = 20 } })
    local t0 = mirza.now()
    assert.is_true(e:load())
    assert.is_true(mirza.now() - t0 >= 1.2)
    assert.is_true(seen > 0, "progress while loading")
    assert.equal("llama-server", e.detected.kind)
    assert.is_true(e.detected.waited > 1)
    -- within the bound: a server that stays loading fails with "timeout" and says what to do
    local slow = sim { "--dialect", "llama", "--health-delay-ms", "60000" }
    finally(slow.stop)
    local e2 = new_engine(slow.base, { daemon = { progress = false, deadline = 0.5 } })
    local ok, msg, code = e2:load()
    assert.is_nil(ok)
    assert.equal("timeout", code)
    assert.truthy(msg:find("still answers 503 (loading) after 0.5 s", 1, true), msg)
  end)

  it("a server that turns every probe away (401) says to give the API key; with it, it is detected", function()
    local s = sim { "--api-key", "k-42", "--model-id", "keyed" }
    finally(s.stop)
    local ok, msg, code = new_engine(s.base):load()
    assert.is_nil(ok)
    assert.equal("http", code)
    assert.equal(s.base .. "/v1 answers 401 to every request: give api_key the server's key (MIRZA_API_KEY)", msg)
    ok, msg = new_engine(s.base, { api_key = "wrong" }):load()
    assert.is_nil(ok)
    assert.truthy(msg:find("check api_key, the server does not take it", 1, true), msg)
    local e = new_engine(s.base, { api_key = "k-42" })
    assert.is_true(e:load())
    assert.same({ "mtplx", "keyed" }, { e.detected.kind, e.detected.model })
  end)

  it("nothing answers, autostart off: 'nothing answers at URL' and what to do", function()
    local port = H.free_port()
    local e = engine.new { port = port, config_file = false, autostart = false, log = function() end }
    local ok, msg, code = e:load()
    assert.is_nil(ok)
    assert.equal("refused", code)
    assert.equal(("nothing answers at http://127.0.0.1:%d/v1: start your daemon, or set preset = \"mtplx\" (or "
      .. "\"llama-server\", \"ollama\", \"vllm\"; MIRZA_PRESET) to let mirza start one"):format(port), msg)
    -- a base_url given: never started on, autostart or not (engine_edges_spec)
    ok, msg, code = new_engine(("http://127.0.0.1:%d"):format(port), { autostart = false }):load()
    assert.is_nil(ok)
    assert.equal("refused", code)
    assert.equal(("nothing answers at http://127.0.0.1:%d/v1: start your daemon there, correct base_url "
      .. "(MIRZA_BASE_URL), or set preset = \"mtplx\" (or \"llama-server\", \"ollama\", \"vllm\"; MIRZA_PRESET) "
      .. "to let mirza start one"):format(port), msg)
  end)
end)

describe("an explicit preset that finds another server", function()
  after_each(function() collectgarbage("collect") end)

  it("preset mtplx against llama-server, or a server without /health, names what answered", function()
    local s = sim { "--dialect", "llama", "--model-id", "qwen3-0.6b" }
    local n = sim { "--no-route", "/health", "--model-id", "served-y" }
    finally(function() s.stop() n.stop() end)
    local e = new_engine(s.base, { preset = "mtplx" })
    local ok, msg, code = e:load()
    assert.is_nil(ok)
    assert.equal("foreign", code)
    assert.equal(("http://127.0.0.1:%d is llama-server (model 'qwen3-0.6b', via /props), not mtplx: leave preset "
      .. "unset to use it as it is, or point mirza at your mtplx daemon (another base_url or port)"):format(s.port),
      msg)
    ok, msg, code = new_engine(n.base, { preset = "mtplx" }):load()
    assert.is_nil(ok)
    assert.equal("foreign", code)
    assert.truthy(msg:find("is an OpenAI-compatible server (model 'served-y', via /v1/models), not mtplx", 1, true),
      msg)
    ok, msg, code = mirza.daemon({ preset = "llama-server", model = "m.gguf", port = n.port, progress = false }):start()
    assert.is_nil(ok)
    assert.equal("foreign", code)
    assert.truthy(msg:find("not llama-server: leave preset unset", 1, true), msg)
    assert.is_true(alive(s.pid) and alive(n.pid), "left alone")
  end)

  it("a daemon that wants an API key says to give it", function()
    local s = sim { "--api-key", "k-42" }
    finally(s.stop)
    local ok, msg, code = mirza.daemon({ preset = "mtplx", model = "m", port = s.port, progress = false }):start()
    assert.is_nil(ok)
    assert.equal("foreign", code)
    assert.truthy(msg:find(("^http://127.0.0.1:%d/health answers 401 %%(.*%%): give api_key %%(MIRZA_API_KEY%%) the "
      .. "daemon's key$"):format(s.port)), msg)
    assert.is_true(mirza.daemon({ preset = "mtplx", model = "m", model_id = "mirza-sim", port = s.port,
      api_key = "k-42", progress = false }):start())
  end)
end)

describe("a preset without a model", function()
  after_each(function() collectgarbage("collect") end)

  it("adopts the daemon on its port (MIRZA_PRESET=llama-server MIRZA_PORT=P), and says what is missing to start one",
    function()
      local s = sim { "--dialect", "llama", "--model-id", "qwen3-0.6b" }
      finally(s.stop)
      local e = engine.new { preset = "llama-server", port = s.port, config_file = false, log = function() end,
        daemon = { progress = false } }
      assert.is_true(e:load())
      assert.is_true(e.daemon.adopted)
      local text, body = turn(e)
      assert.truthy(#text > 0)
      assert.is_table(body.chat_template_kwargs)
      local port = H.free_port()
      local ok, msg, code = mirza.daemon({ preset = "vllm", port = port, progress = false }):start()
      assert.is_nil(ok)
      assert.equal("spawn", code)
      assert.equal(("nothing answers at http://127.0.0.1:%d, and preset 'vllm' needs 'model' to start one: give "
        .. "model = ... (MIRZA_MODEL), or start the daemon yourself"):format(port), msg)
    end)
end)

describe("mirza chat with only MIRZA_BASE_URL", function()
  it("talks to a llama-server: a streamed answer, the detection named, the server left running", function()
    local s = sim { "--dialect", "llama", "--model-id", "qwen3-0.6b" }
    finally(s.stop)
    local input, out, err = H.tmpname(".in"), H.tmpname(".out"), H.tmpname(".err")
    finally(function() os.remove(input) os.remove(out) os.remove(err) end)
    local f = assert(io.open(input, "w"))
    f:write("Bonjour\n/quit\n")
    f:close()
    local cmd = ("MIRZA_CONFIG=/dev/null MIRZA_LUA_DIR= MIRZA_BASE_URL=%s MIRZA_VERBOSE=1 %s chat --fifo %s >%s 2>%s")
        :format(H.q(s.base .. "/v1"), H.q(H.mirza_bin), H.q(input), H.q(out), H.q(err))
    local ok = os.execute(cmd)
    local stderr = H.read_file(err)
    assert.is_true(ok, stderr)
    assert.truthy(stderr:find(("chat: using llama-server (model 'qwen3-0.6b', via /props) at %s/v1"):format(s.base), 1,
      true), stderr)
    assert.truthy(stderr:find("mirza: " .. s.base .. "/v1: llama-server (model 'qwen3-0.6b', via /props), used as is "
      .. "(llama dialect)", 1, true), stderr)
    assert.is_nil(stderr:find("turn failed", 1, true), stderr)
    -- the answer is the simulator's text for that prompt
    local want = assert(mirza.collect { url = s.url, body = H.chat_body("Bonjour", { max_tokens = 1024 }) })
    assert.truthy(#want.text > 0)
    assert.equal(want.text, (H.read_file(out):gsub("\n", " "):gsub(" +$", "")))
    assert.is_true(alive(s.pid), "left running")
  end)

  it("a MIRZA_CONFIG that does not exist is an error naming it, without a traceback", function()
    local cmd = ("MIRZA_CONFIG=/nonexistent/mirza.lua MIRZA_LUA_DIR= %s chat --fifo /dev/null 2>&1"):format(
      H.q(H.mirza_bin))
    local p = assert(io.popen(cmd))
    local text = p:read("a")
    local _, _, rc = p:close()
    assert.equal(1, rc)
    assert.equal("chat: mirza config: $MIRZA_CONFIG names a file that cannot be read (/nonexistent/mirza.lua: No "
      .. "such file or directory): fix the path, or unset it to use no config file\n", text)
  end)
end)
