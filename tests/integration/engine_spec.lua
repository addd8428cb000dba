-- The engine end to end against mirza-sim over HTTP, started by the
-- supervisor: thinking on/off, prefill then a cache hit, clear cache, a
-- degenerate reasoning loop cut early (request closed), a mid-stream error
-- routed to the error sink with the partial answer kept, and hot reload of
-- a behaviour module edited while a turn is streaming (broken edit too).
local mirza = require "mirza"
local core = require "mirza.core"
local engine = require "mirza.engine"
local pipeline = require "mirza.pipeline"
local H = require "tests.helper"

local SYSTEM = string.rep("Tu es Mirza, un assistant vocal concis et précis. ", 12)

local function new_engine(extra)
  local opts = {
    preset = "mirza-sim", port = H.free_port(), config_file = false, session_id = "spec-" .. math.random(1e9),
    daemon = { args = { "--tok-rate", "0", "--ttft-ms", "0", "--verbose" }, deadline = 30 },
    max_tokens = 64, max_tokens_thinking = 128, log = function() end,
  }
  for k, v in pairs(extra or {}) do opts[k] = v end
  return engine.new(opts)
end

local function count(events, ty)
  local n = 0
  for _, ev in ipairs(events) do if ev.type == ty then n = n + 1 end end
  return n
end

local function run_turn(e, input)
  local it = assert(e:turn(input))
  return pipeline.collect(it)
end

local function texts(evs, ty)
  local t = {}
  for _, ev in ipairs(evs) do if ev.type == ty then t[#t + 1] = ev.text end end
  return table.concat(t)
end

-- Chat requests the simulator logged with status 499 (client went away).
local function disconnects(e)
  local n = 0
  for _ in e.daemon:log_tail(200):gmatch("POST /v1/chat/completions 499") do n = n + 1 end
  return n
end

describe("mirza.engine against mirza-sim", function()
  local e
  setup(function()
    e = new_engine()
    assert(e:load(SYSTEM))
  end)
  teardown(function() e:unload() end)
  after_each(function() collectgarbage("collect") end)

  it("started the daemon through the supervisor", function()
    assert.is_false(e.daemon.adopted)
    assert.equal(core.pidfile_read(e.daemon.port), e.daemon.pid)
    assert.equal(H.self_pid(), H.ps(e.daemon.pid).ppid)
    assert.is_true((e.daemon:healthy()))
  end)

  it("streams with thinking on and without it when off", function()
    e:set_thinking(true)
    local on = run_turn(e, "Pourquoi le ciel est-il bleu ?")
    local done = on[#on]
    assert.equal("done", done.type)
    -- the simulator's defaults: 48 reasoning tokens, 32 answer tokens
    assert.equal(48, count(on, "think"))
    assert.equal(32, count(on, "text"))
    assert.equal(80, done.usage.completion_tokens)
    e:set_thinking(false)
    local off = run_turn(e, "Merci.")
    done = off[#off]
    assert.equal(0, count(off, "think"))
    assert.equal(32, count(off, "text"))
    assert.equal(32, done.usage.completion_tokens)
    assert.equal(math.floor(done.stats.decode_tok_s * 10 + 0.5) / 10, e.last.tok_s)
    assert.equal(32, e.last.tokens)
  end)

  it("reports a cache hit after the prefill and none after clear_cache", function()
    assert.is_true(e:reset()) -- empty history: the turn's prompt is the prefill's
    e:set_thinking(false)
    local request, usage = mirza.request, nil
    mirza.request = function(o)
      local res, msg, code = request(o)
      usage = res and mirza.json.decode(res).usage
      return res, msg, code
    end
    local t0 = mirza.now()
    local ok, ms = pcall(e.prefill, e)
    mirza.request = request
    assert(ok, ms)
    assert.is_true(ms > 0 and ms <= (mirza.now() - t0) * 1000, tostring(ms))
    run_turn(e, "bonjour") -- the prefill's own user turn
    assert.equal(usage.prompt_tokens, e.last.prompt_tokens)
    -- all of the prompt cached but the last token (the simulator leaves one)
    assert.equal(usage.prompt_tokens - 1, e.last.cached_tokens)
    assert.is_true(e:clear_cache())
    run_turn(e, "Encore")
    assert.equal(0, e.last.cached_tokens)
  end)

  it("keeps assistant turns without reasoning in the history", function()
    e:set_thinking(true)
    local evs = run_turn(e, "Explique la pluie.")
    assert.equal(48, count(evs, "think"))
    assert.equal(32, count(evs, "text"))
    local last = e.history.messages[#e.history.messages]
    assert.same({ role = "assistant", content = texts(evs, "text"):gsub("^%s+", "") }, last)
  end)

  it("routes a mid-stream error to the error sink, partial answer kept", function()
    local e2 = new_engine {
      body_extra = { mirza_sim = { text = "Un deux trois. Quatre cinq six.", fault = "error-after=4" } } }
    assert(e2:load())
    local answer, errors = {}, {}
    local stats, msg, code, res = e2:say("x", { mode = "sentence",
      answer = function(s) answer[#answer + 1] = s end, error = function(m) errors[#errors + 1] = m end })
    e2:unload()
    assert.is_nil(stats) -- one convention: a failed turn is nil, message, code, result
    assert.equal("server", code)
    assert.equal(errors[1], msg)
    assert.equal(1, #errors)
    assert.equal("server error: simulated failure after 4 tokens", errors[1])
    assert.equal("Un deux trois.", answer[1])
    assert.equal("Un deux trois. Quatre ", res.answer)
    for _, s in ipairs(answer) do assert.is_nil(s:find("failure")) end
    assert.equal("server", e2.last.error)
  end)

  it("cuts a degenerate reasoning loop early and closes the request", function()
    local e3 = new_engine { max_tokens_thinking = 5000,
      body_extra = { mirza_sim = { fault = "loop", tok_rate = 2000 } } }
    assert(e3:load())
    finally(function() e3:unload() end)
    e3:set_thinking(true)
    local before = disconnects(e3)
    local it, s = e3:turn("x")
    local evs, closed_at_cut, streams_at_cut = {}, nil, nil
    for ev in it do
      evs[#evs + 1] = ev
      if ev.type == "cut" then closed_at_cut, streams_at_cut = s:closed(), mirza.streams() end
      assert.is_true(#evs < 5000, "never cut")
    end
    local last = evs[#evs]
    assert.equal("cut", last.type)
    assert.equal("repetition", last.reason)
    assert.equal("Wait, let me reconsider the question.", last.line)
    -- closed when the cut is announced, not only when the turn ends
    assert.is_true(closed_at_cut)
    assert.equal(0, streams_at_cut)
    assert.truthy(H.wait_for(function() return disconnects(e3) == before + 1 end, 10), e3.daemon:log_tail())
    assert.equal(60, count(evs, "think"))
  end)
end)

describe("hot reload during a running loop", function()
  local e, dir, path
  local NAME = "spec_behaviour"
  local V1 = [[return { tag = "v1", stage = function(up) return function()
      local ev = up(); if ev and ev.type == "text" then ev.tag = "v1" end; return ev end end }]]
  local V2 = V1:gsub("v1", "v2")
  local function rep(v, n)
    local t = {}
    for i = 1, n do t[i] = v end
    return t
  end
  local function tags_of(evs)
    local t = {}
    for _, ev in ipairs(evs) do if ev.type == "text" then t[#t + 1] = ev.tag end end
    return t
  end
  local writes = 0
  local function write(v)
    local f = assert(io.open(path, "w"))
    f:write(v)
    f:close()
    -- make sure the change is visible even within the same mtime tick: each write a later mtime than
    -- the last (V1 and V2 have one size; a random offset gave two writes the same mtime one run in 49)
    writes = writes + 1
    assert(H.set_mtime(path, os.time() + 100 + writes))
  end
  setup(function()
    dir = H.tmpname(".d")
    os.execute("mkdir -p " .. H.q(dir))
    path = dir .. "/" .. NAME .. ".lua"
    write(V1)
    package.loaded[NAME] = dofile(path)
    e = new_engine { body_extra = { mirza_sim = { text = "a b c d e f g h", tok_rate = 50 } } }
    assert(e:load())
    assert(e:watch(NAME, path))
    e.stages = { { name = "behaviour", fn = function(up, o) return package.loaded[NAME].stage(up, o) end } }
  end)
  teardown(function()
    e:unload()
    os.execute("rm -rf " .. H.q(dir))
    package.loaded[NAME] = nil
  end)

  it("finishes the turn in flight on the old code and uses the new one next turn", function()
    e:set_thinking(false)
    write(V1)
    run_turn(e, "w") -- v1 in place, whatever ran before
    assert.equal("v1", package.loaded[NAME].tag)
    local it = assert(e:turn("x"))
    local first = it()
    while first and first.type ~= "text" do first = it() end
    assert.equal("text", first.type)
    -- edit while the stream is in flight
    write(V2)
    local tags = { first.tag }
    for ev in it do if ev.type == "text" then tags[#tags + 1] = ev.tag end end
    assert.same(rep("v1", 8), tags)
    local next_turn = run_turn(e, "y")
    assert.same(rep("v2", 8), tags_of(next_turn))
    assert.equal("v2", package.loaded[NAME].tag)
  end)

  it("keeps the previous version when the edit is broken, and reports file and line", function()
    e:set_thinking(false)
    write(V2)
    run_turn(e, "v") -- v2 in place, whatever ran before
    assert.equal("v2", package.loaded[NAME].tag)
    local n = #e.history.messages
    local reported
    local w = mirza.watcher()
    local old_on_error = w.on_error
    w.on_error = function(_, msg) reported = msg end
    write("return { tag = 'v3', stage = function(up) return up end\n")  -- syntax error: missing }
    local evs = run_turn(e, "z")
    w.on_error = old_on_error
    assert.equal(path .. ":2: '}' expected (to close '{' at line 1) near <eof>", reported)
    assert.same(rep("v2", 8), tags_of(evs))
    assert.equal("v2", package.loaded[NAME].tag)
    -- the daemon and the conversation survived
    assert.is_true((e.daemon:healthy()))
    assert.equal(n + 2, #e.history.messages)
  end)
end)
