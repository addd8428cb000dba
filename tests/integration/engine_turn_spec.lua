-- The engine's turns against mirza-sim (issue 7): a turn that closes on
-- break and on e:cancel() (the simulator sees the disconnect), <think> tags
-- in content, per-turn options reaching the request, endpoints used as is
-- (daemon = false), the model id sent, a dying daemon diagnosed and
-- restarted, tool calls kept in the history, the prefill, unload's result,
-- autostart off against a loading daemon, clear_cache, TTFT.
local mirza = require "mirza"
local engine = require "mirza.engine"
local pipeline = require "mirza.pipeline"
local prompt = require "mirza.prompt"
local H = require "tests.helper"

local FAST = { "--tok-rate", "0", "--ttft-ms", "0", "--verbose" }

local function new_engine(extra)
  local opts = {
    preset = "mirza-sim", port = H.free_port(), config_file = false, session_id = "spec-" .. math.random(1e9),
    daemon = { args = FAST, deadline = 30, progress = false, grace = 2 },
    max_tokens = 64, max_tokens_thinking = 128, log = function() end,
  }
  for k, v in pairs(extra or {}) do opts[k] = v end
  return engine.new(opts)
end

-- Requests sent while fn runs: the options given to mirza.open and mirza.request.
local function capture(fn)
  local sent = {}
  local open, request = mirza.open, mirza.request
  mirza.open = function(o) sent[#sent + 1] = o return open(o) end
  mirza.request = function(o) sent[#sent + 1] = o return request(o) end
  local ok, err = pcall(fn)
  mirza.open, mirza.request = open, request
  assert(ok, err)
  return sent
end

local function chats(sent)
  local out = {}
  for _, o in ipairs(sent) do
    if o.url:find("/chat/completions", 1, true) then out[#out + 1] = o end
  end
  return out
end

-- Chat requests the simulator logged with status 499 (client went away).
local function disconnects(e)
  local n = 0
  for _ in e.daemon:log_tail(200):gmatch("POST /v1/chat/completions 499") do n = n + 1 end
  return n
end

local function texts(evs, ty)
  local t = {}
  for _, ev in ipairs(evs) do if ev.type == ty then t[#t + 1] = ev.text end end
  return table.concat(t)
end

describe("a turn that closes", function()
  local e
  setup(function()
    e = new_engine { body_extra = { mirza_sim = { answer_tokens = 100000, tok_rate = 200 } } }
    assert(e:load())
    e:set_thinking(false)
  end)
  teardown(function() e:unload() end)
  after_each(function() collectgarbage("collect") end)

  it("break out of the for loop closes the request (no 409 on the next turn)", function()
    local before = disconnects(e)
    local got = 0
    for ev in e:turn("raconte") do
      if ev.type == "text" then
        got = got + 1
        if got == 3 then break end
      end
    end
    assert.equal(3, got)
    assert.equal(0, mirza.streams())
    assert.truthy(H.wait_for(function() return disconnects(e) == before + 1 end, 10), e.daemon:log_tail())
    local evs = pipeline.collect(assert(e:turn("encore", { body_extra = { mirza_sim = { text = "ok" } } })))
    assert.equal("done", evs[#evs].type)
    assert.equal("ok", texts(evs, "text"))
  end)

  it("e:cancel() from a sink stops the turn; the partial answer is kept, marked interrupted", function()
    local before, n, heard = disconnects(e), #e.history.messages, {}
    local stats, res = e:say("parle", { mode = "token", answer = function(t)
      heard[#heard + 1] = t
      if #heard == 5 then assert.is_true(e:cancel()) end
    end })
    assert.equal(5, #heard)
    assert.equal("cancelled", res.cut.reason)
    assert.is_true(stats.interrupted)
    assert.equal(table.concat(heard), res.answer)
    assert.truthy(H.wait_for(function() return disconnects(e) == before + 1 end, 10))
    assert.equal(n + 2, #e.history.messages)
    local last = e.history.messages[#e.history.messages]
    assert.same({ role = "assistant", content = table.concat(heard):gsub("^%s+", ""), interrupted = true }, last)
    local msgs = prompt.build(e.history, "suite")
    for _, m in ipairs(msgs) do assert.is_nil(m.interrupted) end -- a mark, never sent
    assert.is_false(e:cancel()) -- nothing in flight
  end)

  it("e:cancel() from another coroutine ends the loop with a cut event", function()
    local seen = {}
    local co = coroutine.wrap(function()
      for ev in e:turn("parle encore") do
        seen[#seen + 1] = ev.type
        coroutine.yield()
      end
      return "over"
    end)
    local r
    for _ = 1, 1000 do -- bounded: a regression must fail, not hang
      r = co()
      if #seen >= 4 and seen[#seen] == "text" then break end
    end
    assert.equal("text", seen[#seen])
    assert.is_true(e:cancel())
    for _ = 1, 10 do
      r = co()
      if r == "over" then break end
    end
    assert.equal("over", r)
    assert.equal("cut", seen[#seen])
    assert.equal(0, mirza.streams())
  end)

  it("a turn cancelled before any text stores nothing", function()
    local n = #e.history.messages
    local it, _, _, t = e:turn("rien", { body_extra = { mirza_sim = { ttft_ms = 5000 } } })
    assert.is_true(e:cancel())
    local evs = pipeline.collect(it)
    t:close()
    assert.same({ { type = "cut", reason = "cancelled" } }, evs)
    assert.equal(n, #e.history.messages)
    assert.is_true(e.last.interrupted)
  end)
end)

describe("reasoning sent as <think> tags in content", function()
  local e
  setup(function()
    e = new_engine()
    assert(e:load())
  end)
  teardown(function() e:unload() end)

  it("goes to the think sink and stays out of the answer and the history", function()
    e:set_thinking(false)
    local think, answer = {}, {}
    local text = "<think>Je réfléchis bien.</think>\n\nBonjour à vous."
    local st, res = e:say("x", { body_extra = { mirza_sim = { text = text } },
      mode = "whole", think = function(t) think[#think + 1] = t end, answer = function(t) answer[#answer + 1] = t end })
    assert.is_table(st)
    assert.equal("Je réfléchis bien.", table.concat(think))
    assert.same({ "Bonjour à vous." }, answer)
    assert.equal("Bonjour à vous.", res.answer)
    assert.equal("Bonjour à vous.", e.history.messages[#e.history.messages].content)
  end)

  it("a stream that starts inside an open think: 'open' per turn, and auto on a thinking turn", function()
    e:set_thinking(false)
    local evs = pipeline.collect(assert(e:turn("x", { think_tags = "open",
      body_extra = { mirza_sim = { text = "The user says hi.</think>Salut !" } } })))
    assert.equal("The user says hi.", texts(evs, "think"))
    assert.equal("Salut !", texts(evs, "text"))
    evs = pipeline.collect(assert(e:turn("x", { budget = 512,
      body_extra = { mirza_sim = { text = "Hmm.</think>Salut !", reasoning_tokens = 0 } } })))
    assert.equal("Hmm.", texts(evs, "think"))
    assert.equal("Salut !", texts(evs, "text"))
  end)

  it("reaches the repetition guard", function()
    e:set_thinking(false)
    local loop = "<think>" .. string.rep("Wait, I should reconsider the question.\n", 60) .. "</think>Fin."
    local evs = pipeline.collect(assert(e:turn("x", { body_extra = { mirza_sim = { text = loop } } })))
    assert.equal("cut", evs[#evs].type)
    assert.equal("repetition", evs[#evs].reason)
    assert.equal("", texts(evs, "text"))
  end)

  it("is left alone with think_tags = false", function()
    local evs = pipeline.collect(assert(e:turn("x", { think_tags = false,
      body_extra = { mirza_sim = { text = "<think>a</think>b" } } })))
    assert.equal("<think>a</think>b", texts(evs, "text"))
  end)
end)

describe("per-turn options", function()
  local e
  setup(function()
    e = new_engine()
    assert(e:load())
  end)
  teardown(function() e:unload() end)

  it("budget, max_tokens, temperature, top_p reach the request of turn and say", function()
    e:set_thinking(false)
    local evs
    local sent = chats(capture(function()
      evs = pipeline.collect(assert(e:turn("x", { budget = 2048, max_tokens = 300, temperature = 0.2, top_p = 0.5 })))
    end))
    local b = sent[1].body
    assert.same({ true, "high", 300, 0.2, 0.5 },
      { b.enable_thinking, b.reasoning_effort, b.max_tokens, b.temperature, b.top_p })
    assert.truthy(texts(evs, "think") ~= "", "the daemon was asked to think")
    assert.equal(0, e.thinking.budget) -- the engine's own setting is unchanged
    local stage_seen = 0
    sent = chats(capture(function()
      assert(e:say("y", { max_tokens = 3, temperature = 0.1, mode = "whole", answer = function() end,
        stages = { { name = "count", fn = pipeline.tap(function() stage_seen = stage_seen + 1 end) } } }))
    end))
    b = sent[1].body
    assert.same({ false, 3, 0.1 }, { b.enable_thinking, b.max_tokens, b.temperature })
    assert.equal("length", e.last.finish_reason)
    assert.equal(3, e.last.tokens)
    assert.is_true(stage_seen > 3)
    assert.has_error(function() e:say("z", { bogus = 1 }) end, 'mirza.engine: unknown say option "bogus"')
    assert.has_error(function() e:turn("z", { mode = "token" }) end, 'mirza.engine: unknown turn option "mode"')
  end)
end)

describe("endpoints", function()
  after_each(function() collectgarbage("collect") end)

  it("daemon = false uses the endpoint as is: no spawn, no pid, API key sent, served model id", function()
    local s = H.start_sim { "--api-key", "k-123", "--model-id", "served-x", "--tok-rate", "0", "--ttft-ms", "0" }
    finally(s.stop)
    local e = engine.new { base_url = s.base .. "/v1", daemon = false, api_key = "k-123", config_file = false,
      log = function() end }
    assert.is_nil(e.daemon)
    assert.is_true(e:load())
    assert.equal("served-x", e:model())
    local st, res
    local sent = chats(capture(function() st, res = e:say("x", { mode = "whole", answer = function() end }) end))
    assert.is_table(st, res)
    assert.equal("served-x", sent[1].body.model)
    assert.equal("k-123", sent[1].api_key)
    assert.equal("stop", st.finish_reason)
    assert.is_true(st.tokens > 0)
    assert.is_true(e:unload())
    assert.truthy(H.ps(s.pid) and not H.ps(s.pid).stat:find("Z"), "left running")
    local bad = engine.new { base_url = s.base .. "/v1", daemon = false, config_file = false, log = function() end }
    local ok, msg, code = bad:say("x", { error = function() end })
    assert.is_nil(ok)
    assert.equal("http", code)
    assert.matches("401", msg)
  end)

  it("a non-loopback or https base URL is not supervised by default", function()
    local daemon = require "mirza.daemon"
    local e = engine.new { base_url = "https://127.0.0.1:9/v1", config_file = false }
    assert.is_nil(e.daemon)
    assert.equal("https://127.0.0.1:9/v1/chat/completions", e.chat_url)
    local real = daemon.is_loopback
    daemon.is_loopback = function() return false end
    local ok, e2 = pcall(engine.new, { base_url = "http://127.0.0.1:9/v1", config_file = false })
    daemon.is_loopback = real
    assert(ok, e2)
    assert.is_nil(e2.daemon)
    local e3 = engine.new { base_url = "http://127.0.0.1:9/v1", config_file = false }
    assert.is_table(e3.daemon) -- loopback http: supervised
    assert.equal(9, e3.daemon.port)
  end)

  it("preset mirza-sim sends the simulator's id and adopts a simulator without calling it foreign", function()
    local s = H.start_sim { "--tok-rate", "0", "--ttft-ms", "0" }
    finally(s.stop)
    local e = engine.new { preset = "mirza-sim", port = s.port, config_file = false, log = function() end }
    assert.is_nil(e.cfg.model)
    assert.is_true(e:load())
    assert.is_true(e.daemon.adopted)
    assert.equal("mirza-sim", e:model())
    local sent = chats(capture(function() pipeline.collect(assert(e:turn("x"))) end))
    assert.equal("mirza-sim", sent[1].body.model)
    assert.equal("Qwen3.8-9B-Distill-MTPLX-Q6G64", engine.new { config_file = false }:model())
    assert.equal("qwen38", engine.new { config_file = false, model = "/m/qwen38" }:model())
  end)

  it("unload() of an adopted daemon that is not ours returns nil, message, 'unowned'", function()
    local s = H.start_sim { "--dialect", "llama" } -- llama: /health reports no pid
    finally(s.stop)
    local e = engine.new { preset = "mirza-sim", port = s.port, dialect = "llama", config_file = false,
      daemon = { dialect = "llama", progress = false }, log = function() end }
    assert.is_true(e:load())
    local ok, msg, code = e:unload()
    assert.is_nil(ok)
    assert.equal("unowned", code)
    assert.matches("not ours to stop", msg)
    assert.truthy(H.ps(s.pid) and not H.ps(s.pid).stat:find("Z"), "left running")
  end)

  it("autostart = false waits for a daemon answering 503 while loading", function()
    local s = H.start_sim { "--dialect", "llama", "--health-delay-ms", "1500" }
    finally(s.stop)
    local e = engine.new { preset = "mirza-sim", port = s.port, dialect = "llama", autostart = false,
      config_file = false, daemon = { dialect = "llama", progress = false }, log = function() end }
    local t0 = mirza.now()
    assert.is_true(e:load())
    assert.is_true(mirza.now() - t0 >= 1.0)
    assert.is_true(e.daemon.adopted)
    local off = engine.new { preset = "mirza-sim", port = H.free_port(), autostart = false, config_file = false }
    local ok, msg, code = off:say("x")
    assert.is_nil(ok)
    assert.equal("refused", code)
    assert.matches("autostart is off", msg)
  end)

  it("clear_cache is unsupported on llama-server and still clears the history when asked", function()
    local s = H.start_sim { "--dialect", "llama", "--tok-rate", "0", "--ttft-ms", "0" }
    finally(s.stop)
    local e = engine.new { preset = "mirza-sim", port = s.port, dialect = "llama", config_file = false,
      daemon = { dialect = "llama", progress = false }, log = function() end }
    assert(e:say("x", { mode = "whole", answer = function() end }))
    assert.equal(2, #e.history.messages)
    local ok, msg, code = e:clear_cache()
    assert.same({ nil, "llama-server cannot clear a session's cache", "unsupported" }, { ok, msg, code })
    assert.equal(2, #e.history.messages)
    assert.is_nil((e:clear_cache { history = true }))
    assert.equal(0, #e.history.messages)
  end)
end)

describe("a daemon that dies", function()
  after_each(function() collectgarbage("collect") end)

  it("is diagnosed (exit status, log tail), reaped at once, and restarted under the policy", function()
    local e = new_engine { daemon = { args = { "--crash-after", "2", "--tok-rate", "0", "--ttft-ms", "0" },
      deadline = 30, progress = false, grace = 2 }, restart = { max = 1, backoff = 0.1 } }
    finally(function() e:unload() end)
    assert(e:say("un", { mode = "whole", answer = function() end }))
    local pid = e.daemon.pid
    local st, msg, code = e:say("deux", { mode = "whole", answer = function() end, error = function() end })
    assert.is_nil(st)
    assert.equal("exited", code, msg)
    assert.truthy(msg:find("exited with status 3", 1, true), msg)
    assert.truthy(msg:find("mirza-sim", 1, true), msg) -- the log tail
    assert.is_nil(H.ps(pid), "reaped, not a zombie")
    assert.equal("exited", e.last.error)
    assert(e:say("trois", { mode = "whole", answer = function() end }))
    assert.equal(1, e.daemon.restarts)
    assert.are_not.equal(pid, e.daemon.pid)
  end)

  it("without a restart policy the next turn reports the death", function()
    local e = new_engine { daemon = { args = { "--crash-after", "1", "--tok-rate", "0", "--ttft-ms", "0" },
      deadline = 30, progress = false, grace = 2 } }
    finally(function() e:unload() end)
    local _, _, code = e:say("un", { error = function() end })
    assert.equal("exited", code)
    local ok, msg
    ok, msg, code = e:say("deux", { error = function() end })
    assert.is_nil(ok)
    assert.equal("exited", code)
    assert.truthy(msg:find("status 3", 1, true), msg)
  end)
end)

describe("tool calls and the prefill", function()
  local e
  setup(function()
    e = new_engine()
    assert(e:load())
  end)
  teardown(function() e:unload() end)

  it("keeps the accumulated tool calls in the history, so a tool message follows validly", function()
    local replay = "replay=" .. H.fixtures .. "/tool_calls.sse"
    local evs = pipeline.collect(assert(e:turn("Quel temps à Lyon ?",
      { body_extra = { mirza_sim = { fault = replay } } })))
    assert.equal("tool_calls", evs[#evs].finish_reason)
    local last = e.history.messages[#e.history.messages]
    assert.equal("assistant", last.role)
    assert.equal(mirza.json.null, last.content)
    assert.same({ { id = "call_fx1", type = "function",
      ["function"] = { name = "get_weather", arguments = '{"city": "Lyon", "unit": "C"}' } } }, last.tool_calls)
    local msgs = assert(prompt.build(e.history, { { role = "tool", tool_call_id = "call_fx1", content = "12 °C" } }))
    assert.truthy(prompt.validate(msgs))
    assert.equal("tool", msgs[#msgs].role)
    assert.equal(last, msgs[#msgs - 1])
  end)

  it("prefills with the next turn's thinking fields and a foreground length; stats report the cache", function()
    e:set_thinking(true)
    local sent = chats(capture(function() assert(e:load(string.rep("Tu es Mirza. ", 40))) end))
    local b = sent[1].body
    assert.same({ true, "medium", 16, false }, { b.enable_thinking, b.reasoning_effort, b.max_tokens, b.stream })
    e:set_thinking(false)
    assert.same({ false, 16 }, { e:prefill_body("s").enable_thinking, e:prefill_body("s").max_tokens })
    e:set_thinking(true)
    pipeline.collect(assert(e:turn("Bonjour")))
    assert.is_true(e.last.session_cache_hit)
    assert.is_nil(e.last.cache_miss_reason)
    assert.is_true(e:clear_cache())
    local evs = pipeline.collect(assert(e:turn("Encore")))
    assert.is_false(e.last.session_cache_hit)
    assert.equal("prefix_mismatch", evs[#evs].stats.cache_miss_reason)
    assert.equal("prefix_mismatch", e.last.cache_miss_reason)
  end)

  it("TTFT is what the user waited; the server's prompt time is reported apart", function()
    pipeline.collect(assert(e:turn("x", { body_extra = { mirza_sim = { ttft_ms = 400 } } })))
    assert.is_true(e.last.ttft_ms >= 390, tostring(e.last.ttft_ms))
    assert.is_number(e.last.server_ttft_ms)
  end)
end)

describe("a session the daemon has not released yet", function()
  local e, sid
  setup(function()
    sid = "busy-" .. math.random(1e9)
    e = new_engine { session_id = sid }
    assert(e:load())
    e:set_thinking(false)
  end)
  teardown(function() e:unload() end)

  -- A request on the engine's session that the daemon is still serving
  -- (~2 s of tokens that nobody reads: the simulator writes on), long
  -- enough for the turn to meet it on a loaded machine.
  -- The previous test's turn may not be released yet either: ask again
  -- (a bounded number of times) while the answer is 409.
  local function hold_session()
    for _ = 1, 50 do
      local s = mirza.open { url = e.chat_url, headers = e:headers(), body = { model = e:model(), stream = true,
        messages = { { role = "user", content = "tiens" } },
        mirza_sim = { text = "un deux trois quatre cinq six sept huit neuf dix", tok_rate = 5 } } }
      local ev = s:next(5)
      if not (ev and ev.status == 409) then
        assert.equal("text", ev and ev.type) -- the daemon is generating on the session now
        return s
      end
      s:close()
      mirza.sleep(0.05)
    end
    error("the session stayed busy")
  end

  it("is waited out: the turn asks again until the 409 clears", function()
    local _ <close> = hold_session()
    local t0 = mirza.now()
    local st, res = e:say("Bonjour", { mode = "whole", answer = function() end })
    assert.is_table(st, tostring(res))
    assert.equal("Bonjour", e.history.messages[#e.history.messages - 1].content)
    assert.is_true(mirza.now() - t0 >= 0.2, "the first answer was a 409")
  end)

  it("fails with the daemon's 409 when busy_wait is 0", function()
    e.cfg.busy_wait = 0
    local _ <close> = hold_session()
    local ok, msg, code = e:say("Bonjour", { mode = "whole", answer = function() end, error = function() end })
    e.cfg.busy_wait = 5
    assert.is_nil(ok)
    assert.equal("http", code)
    assert.truthy(msg:find("409", 1, true), msg)
  end)
end)
