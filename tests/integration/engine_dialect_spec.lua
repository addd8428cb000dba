-- Every endpoint in its own dialect (issue 32, item 1): an endpoint used
-- as is — `daemon = false`, a pool member — is probed once whatever model
-- was named, and driven in what answers: llama-server and vLLM in the
-- llama dialect (thinking switched in the chat template, so it can be
-- turned off), Ollama and any other OpenAI-compatible server in the plain
-- OpenAI dialect (OpenAI's fields only: no enable_thinking, no metadata,
-- no X-MTPLX headers), MTPLX in its own. A probe that finds nothing usable
-- falls back to plain OpenAI, never MTPLX; a dialect given is kept; a bare
-- host gets /v1 and a base with a path keeps it (mirza.url). Against
-- mirza-sim: --dialect llama, and the Ollama/vLLM poses of --route.
local mirza = require "mirza"
local engine = require "mirza.engine"
local H = require "tests.helper"

local sim = H.fast_sim

-- An endpoint used as is, its model named (docs/engine.md's pattern).
local function as_is(base, extra)
  local logged = {}
  local opts = { base_url = base, daemon = false, model_id = "m", config_file = false, max_tokens = 32,
    log = function(level, msg) logged[#logged + 1] = level .. ": " .. msg end }
  for k, v in pairs(extra or {}) do opts[k] = v end
  return engine.new(opts), logged
end

-- The chat requests sent while fn runs (the options given to mirza.open,
-- as they were then: url, body, headers).
local function chats(fn)
  local sent, open = {}, mirza.open
  mirza.open = function(o) -- luacheck: ignore
    if type(o.body) == "table" and o.body.messages then
      sent[#sent + 1] = { url = o.url, body = o.body, headers = o.headers }
    end
    return open(o)
  end
  local ok, err = pcall(fn)
  mirza.open = open -- luacheck: ignore
  assert(ok, err)
  return sent
end

-- One turn: its text, its reasoning, the requests sent (the last one's
-- body and headers), the stats.
local function turn(e, opts)
  local text, think, st, res = {}, {}, nil, nil
  local sent = chats(function()
    local o = { mode = "token", answer = function(t) text[#text + 1] = t end,
      think = function(t) think[#think + 1] = t end }
    for k, v in pairs(opts or {}) do o[k] = v end
    st, res = e:say("Bonjour", o)
  end)
  assert.is_table(st, tostring(res))
  local last = sent[#sent]
  return { text = table.concat(text), think = table.concat(think), body = last.body, headers = last.headers or {},
    url = last.url, sent = sent }
end

local function mtplx_headers(h)
  local found = {}
  for k, v in pairs(h) do
    local name = type(k) == "string" and k or tostring(v):match("^([^:]+):")
    if name and name:lower():find("^x%-mtplx") then found[#found + 1] = name end
  end
  return found
end

-- The fields of OpenAI's chat completions request (what a strict server takes).
local OPENAI = { model = true, messages = true, stream = true, stream_options = true, max_tokens = true,
  max_completion_tokens = true, temperature = true, top_p = true, presence_penalty = true, frequency_penalty = true,
  reasoning_effort = true, tools = true, tool_choice = true, parallel_tool_calls = true, response_format = true,
  stop = true, seed = true, n = true, logprobs = true, top_logprobs = true, logit_bias = true, user = true }

local function not_openai(body)
  local extra = {}
  for k in pairs(body) do
    if not OPENAI[k] then extra[#extra + 1] = k end
  end
  table.sort(extra)
  return extra
end

describe("an endpoint used as is with its model named", function()
  after_each(function() collectgarbage("collect") end)

  it("llama-server (mirza-sim --dialect llama): the llama dialect, thinking off for real, no X-MTPLX header",
    function()
      local s = sim { "--dialect", "llama", "--model-id", "qwen3-0.6b" }
      finally(s.stop)
      local e, logged = as_is(s.base .. "/v1", { verbose = true })
      assert.is_true(e:load())
      assert.same({ "llama-server", "/props", "llama" }, { e.detected.kind, e.detected.via, e.cfg.dialect })
      assert.equal("m", e:model()) -- the model named is the one sent
      assert.truthy(table.concat(logged, "\n"):find(("notice: %s/v1: llama-server (model 'qwen3-0.6b', via /props), "
        .. "used as is (llama dialect, model sent: m)"):format(s.base), 1, true), table.concat(logged, "\n"))
      e:set_thinking(false)
      local r = turn(e)
      assert.truthy(#r.text > 0)
      assert.equal("", r.think) -- the template's switch: the sim thinks by default, and a top-level field is ignored
      assert.same({ enable_thinking = false }, r.body.chat_template_kwargs)
      assert.is_nil(r.body.enable_thinking)
      assert.is_nil(r.body.reasoning_effort)
      assert.is_nil(r.body.metadata)
      assert.same({}, mtplx_headers(r.headers))
      e:set_thinking(true)
      r = turn(e)
      assert.truthy(#r.think > 0)
      assert.same({ true, 1024 }, { r.body.chat_template_kwargs.enable_thinking, r.body.thinking_budget_tokens })
      e:close()
    end)

  it("Ollama (/api/version): plain OpenAI — OpenAI's fields only, reasoning_effort only when thinking", function()
    local o = sim { "--no-route", "/health", "--route", '/api/version={"version":"0.12.6"}', "--model-id", "qwen3:8b" }
    finally(o.stop)
    local e = as_is(o.base .. "/v1")
    assert.is_true(e:load())
    assert.same({ "ollama", "0.12.6", "openai" }, { e.detected.kind, e.detected.version, e.cfg.dialect })
    assert.equal(("%s/v1: ollama (model 'qwen3:8b', version 0.12.6, via /api/version), used as is (openai dialect, "
      .. "model sent: m)"):format(o.base), e:describe())
    local r = turn(e)
    assert.truthy(#r.text > 0)
    assert.same({}, not_openai(r.body))
    assert.is_nil(r.body.reasoning_effort) -- thinking off: the server's default, nothing sent
    assert.same({}, mtplx_headers(r.headers))
    e:set_thinking(true)
    r = turn(e)
    assert.same({}, not_openai(r.body))
    assert.equal("medium", r.body.reasoning_effort)
    -- what the script puts in body_extra goes out as it is
    e.cfg.body_extra = { metadata = { run = "x" } }
    r = turn(e)
    assert.same({ run = "x" }, r.body.metadata)
    -- MTPLX's admin routes are not there
    assert.same({ nil, "ollama cannot clear a session's cache", "unsupported" }, { e:clear_cache() })
  end)

  it("vLLM (/version): the llama dialect", function()
    local v = sim { "--route", "/health=", "--route", '/version={"version":"0.11.0"}', "--model-id", "Qwen/Qwen3-8B" }
    finally(v.stop)
    local e = as_is(v.base .. "/v1")
    assert.is_true(e:load())
    assert.same({ "vllm", "llama" }, { e.detected.kind, e.cfg.dialect })
    local r = turn(e)
    assert.truthy(#r.text > 0)
    assert.same({ enable_thinking = false }, r.body.chat_template_kwargs)
    assert.is_nil(r.body.enable_thinking)
    assert.same({}, mtplx_headers(r.headers))
  end)

  it("a server that answers only /v1/models: plain OpenAI", function()
    local s = sim { "--no-route", "/health", "--model-id", "served-y" }
    finally(s.stop)
    local e = as_is(s.base .. "/v1")
    assert.is_true(e:load())
    assert.same({ "openai", "/v1/models", "openai" }, { e.detected.kind, e.detected.via, e.cfg.dialect })
    local r = turn(e)
    assert.truthy(#r.text > 0)
    assert.equal("m", r.body.model)
    assert.same({}, not_openai(r.body))
    assert.same({}, mtplx_headers(r.headers))
    -- the prefill too
    assert.same({}, not_openai(e:prefill_body("You are terse.")))
  end)

  it("MTPLX (mirza-sim's own dialect) is still driven as MTPLX", function()
    local s = sim { "--model-id", "qwen38" }
    finally(s.stop)
    local e = as_is(s.base .. "/v1")
    assert.is_true(e:load())
    assert.same({ "mtplx", "mtplx" }, { e.detected.kind, e.cfg.dialect })
    local r = turn(e)
    assert.is_false(r.body.enable_thinking)
    assert.equal(e.cfg.session_id, r.body.metadata.session_id)
    assert.equal(e.cfg.session_id, r.headers["X-MTPLX-Session-Id"])
  end)

  it("a dialect given is kept", function()
    local s = sim { "--dialect", "llama", "--model-id", "qwen3-0.6b" }
    finally(s.stop)
    local e = as_is(s.base .. "/v1", { dialect = "openai" })
    assert.is_true(e:load())
    assert.equal("llama-server", e.detected.kind)
    assert.equal("openai", e.cfg.dialect)
    local r = turn(e)
    assert.same({}, not_openai(r.body))
  end)

  it("a probe that finds nothing usable falls back to plain OpenAI, never MTPLX", function()
    -- a server that answers 404 to every probe: used all the same, in OpenAI's fields
    local s = sim { "--no-route", "/health", "--no-route", "/v1/models", "--model-id", "x" }
    finally(s.stop)
    local e = as_is(s.base .. "/v1")
    assert.is_true(e:load())
    assert.same({ "unknown", "openai" }, { e.detected.kind, e.cfg.dialect })
    local r = turn(e)
    assert.truthy(#r.text > 0)
    assert.same({}, not_openai(r.body))
    assert.same({}, mtplx_headers(r.headers))
    -- nothing answers at all: load still uses it as is (a remote may come up), in OpenAI's fields
    local dead = as_is(("http://127.0.0.1:%d/v1"):format(H.free_port()))
    assert.is_true(dead:load())
    assert.equal("openai", dead.cfg.dialect)
    assert.is_nil(dead.detected)
    assert.truthy(dead:describe():find("nothing told what answers (nothing answers at", 1, true), dead:describe())
    assert.same({}, dead:headers())
  end)
end)

describe("a base URL without /v1 (mirza.url's rule)", function()
  after_each(function() collectgarbage("collect") end)

  it("is a bare host given /v1 (used as is, and detected)", function()
    local s = sim { "--dialect", "llama", "--model-id", "qwen3-0.6b" }
    finally(s.stop)
    local e = as_is(s.base) -- as llama-server prints it
    assert.is_true(e:load())
    assert.equal(s.base .. "/v1", e.base_url)
    assert.is_true(e.detected.completed)
    assert.truthy(e:describe():find("/v1 added to the base URL", 1, true), e:describe())
    local r = turn(e)
    assert.truthy(#r.text > 0)
    assert.equal(s.base .. "/v1/chat/completions", r.url)
    -- without daemon = false: detected, completed the same
    local d = engine.new { base_url = s.base, config_file = false, max_tokens = 32, log = function() end }
    assert.is_true(d:load())
    assert.equal(s.base .. "/v1", d.base_url)
    r = turn(d)
    assert.truthy(#r.text > 0)
  end)

  it("is a base with a path, kept as it is", function()
    local s = sim { "--no-route", "/v1/models", "--model-id", "x" }
    finally(s.stop)
    local e = as_is(s.base .. "/api")
    assert.is_true(e:load())
    assert.equal(s.base .. "/api", e.base_url)
    assert.is_nil(e.detected.completed)
  end)
end)

describe("a pool's endpoints", function()
  after_each(function() collectgarbage("collect") end)

  it("are each probed and driven in their own dialect, a fail-over's request rebuilt for the next one", function()
    local l = sim { "--dialect", "llama", "--model-id", "qwen3-0.6b" }
    finally(l.stop)
    local dead = ("http://127.0.0.1:%d/v1"):format(H.free_port())
    local e = engine.new { endpoints = { dead, l.base .. "/v1" }, model_id = "m", config_file = false,
      max_tokens = 32, log = function() end }
    assert.is_true(e:load())
    assert.equal("openai", e.cfg.dialect) -- the first one does not answer: plain OpenAI
    local r = turn(e)
    assert.truthy(#r.text > 0)
    assert.equal(2, #r.sent)
    assert.equal(dead .. "/chat/completions", r.sent[1].url)
    assert.same({}, not_openai(r.sent[1].body))
    assert.equal(l.base .. "/v1/chat/completions", r.url)
    assert.equal("llama", e.cfg.dialect)
    assert.same({ enable_thinking = false }, r.body.chat_template_kwargs)
    assert.equal("", r.think)
  end)
end)
