-- A runtime error in a hot-reloaded policy never kills a turn (mirza.policy),
-- against mirza-sim: a reloaded mirza.route, mirza.thinking, mirza.prompt
-- or stage module that raises while the turn runs gives way to the last
-- version that worked (else the built-in one, else the stage is dropped);
-- the turn's answer is whole in the sinks, the result and the history; the
-- error is one line naming file:line through e:log, once per version; the
-- next good edit is used; e:watch loads the file at once (a failed reload
-- is one line on e:log too); a programmer
-- error (a bad option, a sink that raises) still raises; in a child mirza
-- process nothing reaches stderr and the exit status is 0.
local mirza = require "mirza"
local engine = require "mirza.engine"
local pipeline = require "mirza.pipeline"
local H = require "tests.helper"

local TEXT = "One two three. Four five six. Seven eight nine."
local SENTENCES = { "One two three.", "Four five six.", "Seven eight nine." }
local SRC = H.source .. "/lua/mirza/"

local writes = 0
local function write(path, text)
  H.write_file(path, text)
  -- a change seen even within one mtime tick: each write a later mtime than the last (a random
  -- offset can repeat, and a version of the same size then goes unseen)
  writes = writes + 1
  assert(H.set_mtime(path, os.time() + 100 + writes))
end

-- The line of `text` holding `needle`.
local function line_of(text, needle)
  local n = 0
  for line in (text .. "\n"):gmatch("([^\n]*)\n") do
    n = n + 1
    if line:find(needle, 1, true) then return n end
  end
end

-- Versions of the policies: the real module from the source tree, with one
-- function wrapped (v1 counts its calls in a global, v2 raises).
local function wrap(module, fname, body)
  return ("local M = dofile(%q)\nlocal orig = M.%s\nfunction M.%s(...)\n%s\nend\nreturn M\n"):format(
    SRC .. module .. ".lua", fname, fname, body)
end
local ROUTE_V1 = wrap("route", "router", "_G.ROUTE_V1 = (_G.ROUTE_V1 or 0) + 1\nreturn orig(...)")
-- v2's router raises once it has routed the text up to "five" (part of it delivered)
local ROUTE_V2 = wrap("route", "router", [[_G.ROUTE_V2 = (_G.ROUTE_V2 or 0) + 1
  local r = orig(...)
  local feed, seen = r.feed, ""
  function r.feed(self, ev)
    feed(self, ev)
    if ev.type == "text" then seen = seen .. ev.text end
    if seen:find("five", 1, true) then error("route v2 broke") end
  end
  return r]])
local THINK_V1 = wrap("thinking", "plan", "_G.THINK_V1 = (_G.THINK_V1 or 0) + 1\nreturn orig(...)")
local THINK_V2 = wrap("thinking", "plan", "error('thinking v2 broke')")
local PROMPT_V1 = wrap("prompt", "build", "_G.PROMPT_V1 = (_G.PROMPT_V1 or 0) + 1\nreturn orig(...)")
local PROMPT_V2 = wrap("prompt", "build", "local t = nil\nreturn t.field")
-- mirza.repetition's stage, v2 raising on the third text event it pulls
local REP_V1 = wrap("repetition", "stage", "_G.REP_V1 = (_G.REP_V1 or 0) + 1\nreturn orig(...)")
local REP_V2 = wrap("repetition", "stage", [[local up, opts = ...
  local n = 0
  return orig(function()
    local ev = up()
    if ev and ev.type == "text" then
      n = n + 1
      if n == 3 then error("repetition v2 broke") end
    end
    return ev
  end, opts)]])
local STAGE_V1 = [[return function(up) return function()
  local ev = up()
  if ev and ev.type == "text" then ev.tag = "v1" end
  return ev end end]]
local STAGE_V2 = [[return function(up) local n = 0 return function()
  local ev = up()
  if ev and ev.type == "text" then
    n = n + 1
    if n == 3 then error("stage v2 broke") end
    ev.tag = "v2"
  end
  return ev end end]]
local STAGE_V3 = STAGE_V1:gsub("v1", "v3")

describe("a policy that raises while the turn runs", function()
  local sim, e, logs, dir
  local originals = {}
  local function new_engine(extra)
    logs = {}
    local opts = { base_url = sim.base .. "/v1", daemon = false, model_id = "mirza-sim", config_file = false,
      max_tokens = 64, log = function(level, msg) logs[#logs + 1] = { level = level, msg = msg } end,
      body_extra = { mirza_sim = { text = TEXT, tok_rate = 2000 } },
      hold = false } -- each read as it comes: a policy breaks between two deltas, not in one held event
    for k, v in pairs(extra or {}) do opts[k] = v end
    return engine.new(opts)
  end
  -- The log lines above info.
  local function reports()
    local out = {}
    for _, l in ipairs(logs) do
      if l.level ~= "info" and l.level ~= "debug" then out[#out + 1] = l.msg end
    end
    return out
  end
  local function file(name, text)
    local path = dir .. "/" .. name .. ".lua"
    write(path, text)
    return path
  end
  local function say(input, opts)
    local got = {}
    opts = opts or {}
    opts.mode = opts.mode or "sentence"
    opts.answer = opts.answer or function(s) got[#got + 1] = s end
    local st, res, code = e:say(input, opts)
    assert(st, res)
    return got, res, code
  end
  local function last_answer()
    local m = e.history.messages
    return m[#m].content
  end

  setup(function()
    sim = H.start_sim { "--tok-rate", "0", "--ttft-ms", "0", "--heartbeat-ms", "0" }
    for _, n in ipairs { "mirza.route", "mirza.thinking", "mirza.prompt", "mirza.repetition" } do
      originals[n] = require(n)
    end
  end)
  teardown(function() sim.stop() end)
  before_each(function()
    dir = H.tmpname(".d")
    os.execute("mkdir -p " .. H.q(dir))
    e = new_engine()
    assert(e:load())
    _G.ROUTE_V1, _G.ROUTE_V2, _G.THINK_V1, _G.PROMPT_V1, _G.REP_V1 = nil, nil, nil, nil, nil
  end)
  after_each(function()
    local w = mirza.watcher()
    for n, m in pairs(originals) do
      package.loaded[n] = m
      w.files[n] = nil
    end
    w.files.spec_stage_mod, package.loaded.spec_stage_mod = nil, nil
    e:close()
    os.execute("rm -rf " .. H.q(dir))
    collectgarbage("collect")
  end)

  it("mirza.route: the previous version takes over mid-stream; every sentence once, the answer whole", function()
    local path = file("route", ROUTE_V1)
    assert.is_true(e:watch("mirza.route", path))
    assert.same(SENTENCES, (say("a")))
    assert.equal(1, _G.ROUTE_V1)
    write(path, ROUTE_V2)
    local got, res = say("a")
    assert.same(SENTENCES, got)
    assert.equal(TEXT, res.answer)
    assert.equal(TEXT, last_answer())
    assert.equal(2, _G.ROUTE_V1) -- v1 took over
    assert.same({ ("%s:%d: route v2 broke (mirza.route is kept out of use until its file changes; "
      .. "the last version that worked runs)"):format(path, line_of(ROUTE_V2, "route v2 broke")) }, reports())
    -- the broken version stays out of use: the next turn runs v1 from the start, no second report
    assert.same(SENTENCES, (say("a")))
    assert.equal(3, _G.ROUTE_V1)
    assert.equal(1, _G.ROUTE_V2) -- not even tried
    assert.equal(1, #reports())
    -- token mode: the deltas once each
    local toks = {}
    write(path, ROUTE_V2 .. "\n-- again\n")
    say("a", { mode = "token", answer = function(t) toks[#toks + 1] = t end })
    assert.equal(TEXT, table.concat(toks))
    assert.equal(2, #reports())
  end)

  it("mirza.route loaded by watch that never worked: the built-in one runs", function()
    local path = file("route", ROUTE_V2)
    assert.is_true(e:watch("mirza.route", path))
    local got, res = say("a")
    assert.same(SENTENCES, got)
    assert.equal(TEXT, res.answer)
    assert.equal(TEXT, last_answer())
    local r = reports()
    assert.equal(1, #r)
    assert.truthy(r[1]:find(("%s:%d: route v2 broke"):format(path, line_of(ROUTE_V2, "route v2 broke")), 1, true))
    -- "built-in" when the modules are embedded, "original" when they load
    -- from disk (MIRZA_LUA_DIR, as scripts/mutate runs the suite)
    local embedded = package.preload["mirza.route"] ~= nil
    assert.truthy(r[1]:find(embedded and "the built-in version runs" or "the original version runs", 1, true), r[1])
  end)

  it("mirza.thinking and mirza.prompt: the previous version plans and builds the turn", function()
    local tpath, ppath = file("thinking", THINK_V1), file("prompt", PROMPT_V1)
    assert.is_true(e:watch("mirza.thinking", tpath))
    assert.is_true(e:watch("mirza.prompt", ppath))
    say("a")
    assert.same({ 1, 1 }, { _G.THINK_V1, _G.PROMPT_V1 })
    write(tpath, THINK_V2)
    write(ppath, PROMPT_V2)
    local got, res = say("b")
    assert.same(SENTENCES, got)
    assert.equal(TEXT, res.answer)
    assert.equal(TEXT, last_answer())
    assert.equal(4, #e.history.messages) -- both turns stored
    assert.same({ 2, 2 }, { _G.THINK_V1, _G.PROMPT_V1 }, table.concat(reports(), "\n"))
    local r = reports()
    table.sort(r)
    assert.equal(2, #r)
    assert.equal(("%s:%d: attempt to index a nil value (local 't') (mirza.prompt is kept out of use until its "
      .. "file changes; the last version that worked runs)"):format(ppath, line_of(PROMPT_V2, "t.field")), r[1])
    assert.equal(("%s:%d: thinking v2 broke (mirza.thinking is kept out of use until its file changes; "
      .. "the last version that worked runs)"):format(tpath, line_of(THINK_V2, "thinking v2 broke")), r[2])
    -- the next good edit is used
    write(tpath, "_G.THINK_V3 = true\n" .. THINK_V1)
    say("c")
    assert.equal(3, _G.THINK_V1)
    assert.is_true(_G.THINK_V3)
    assert.equal(2, #reports())
    _G.THINK_V3 = nil
  end)

  it("mirza.repetition: the previous version guards the rest of the stream, no text lost", function()
    local path = file("repetition", REP_V1)
    assert.is_true(e:watch("mirza.repetition", path))
    local deltas = {}
    local function sink(t) deltas[#deltas + 1] = t end
    say("a", { mode = "token", merge = false, answer = sink })
    assert.equal(1, _G.REP_V1)
    write(path, REP_V2)
    deltas = {}
    local _, res = say("a", { mode = "token", merge = false, answer = sink })
    assert.equal(TEXT, table.concat(deltas))
    assert.equal(TEXT, res.answer)
    assert.equal(TEXT, last_answer())
    assert.equal(2, _G.REP_V1)
    assert.same({ ("%s:%d: repetition v2 broke (mirza.repetition is kept out of use until its file changes; "
      .. "the last version that worked runs)"):format(path, line_of(REP_V2, "repetition v2 broke")) }, reports())
  end)

  it("a stage module: the previous version gets the event the broken one pulled; a fix is used", function()
    local path = file("spec_stage_mod", STAGE_V1)
    assert.is_true(e:watch("spec_stage_mod", path))
    e.stages = { { name = "tagger", module = "spec_stage_mod" } }
    local function turn_tags()
      local tags, text = {}, {}
      for ev in assert(e:turn("a")) do
        if ev.type == "text" then
          tags[#tags + 1] = ev.tag
          text[#text + 1] = ev.text
        end
      end
      assert.equal(TEXT, table.concat(text))
      assert.equal(TEXT, last_answer())
      return tags
    end
    local t1 = turn_tags()
    assert.equal("v1", t1[1])
    write(path, STAGE_V2)
    local t2 = turn_tags()
    assert.same({ "v2", "v2" }, { t2[1], t2[2] })
    for i = 3, #t2 do assert.equal("v1", t2[i]) end
    assert.equal(#t1, #t2)
    assert.same({ ("%s:%d: stage v2 broke (spec_stage_mod is kept out of use until its file changes; "
      .. "the last version that worked runs)"):format(path, line_of(STAGE_V2, "stage v2 broke")) }, reports())
    write(path, STAGE_V3)
    local t3 = turn_tags()
    for i = 1, #t3 do assert.equal("v3", t3[i]) end
    assert.equal(1, #reports())
  end)

  it("a stage with no other version is dropped for the rest of the turn, the turn goes on", function()
    local n = 0
    local evs = pipeline.collect(assert(e:turn("a", { stages = { { name = "boom", fn = function(up)
      return function()
        local ev = up()
        if ev and ev.type == "text" then
          n = n + 1
          if n == 2 then error("boom stage broke") end
          ev.tag = "boom"
        end
        return ev
      end
    end } } })))
    local text, tags = {}, {}
    for _, ev in ipairs(evs) do
      if ev.type == "text" then
        text[#text + 1] = ev.text
        tags[#tags + 1] = ev.tag or "-"
      end
    end
    assert.equal("done", evs[#evs].type)
    assert.equal(TEXT, table.concat(text))
    assert.equal("boom", tags[1])
    for i = 2, #tags do assert.equal("-", tags[i]) end
    assert.equal(2, n) -- not called again this turn
    local r = reports()
    assert.equal(1, #r)
    assert.truthy(r[1]:find("policy_errors_spec.lua:%d+: boom stage broke %(stage \"boom\" is dropped for the rest "
      .. "of this turn%)$"), r[1])
  end)

  it("e:watch loads the file at once; a broken file is reported and the current version stays", function()
    local path = file("thinking", THINK_V1)
    assert.is_true(e:watch("mirza.thinking", path))
    assert.equal(path, debug.getinfo(require("mirza.thinking").plan, "S").short_src)
    say("a")
    assert.equal(1, _G.THINK_V1) -- used before any change of the file
    local bad = file("route", "return {")
    local w = mirza.watcher()
    local old_on_error, reported = w.on_error, nil
    w.on_error = function(_, msg) reported = msg end
    local ok, msg, code = e:watch("mirza.route", bad)
    w.on_error = old_on_error
    assert.is_nil(ok)
    assert.equal(bad .. ":1: unexpected symbol near <eof>", msg)
    assert.equal("reload", code)
    assert.equal(msg, reported)
    assert.equal(originals["mirza.route"], package.loaded["mirza.route"])
    assert.same(SENTENCES, (say("a")))
  end)

  it("a programmer error still raises; a sink that raises is not the route's error", function()
    local path = file("route", ROUTE_V1)
    assert.is_true(e:watch("mirza.route", path))
    assert.has_error(function() e:say("a", { bogus = true }) end, 'mirza.engine: unknown say option "bogus"')
    local ok, err = pcall(e.say, e, "a", { answer = function() error("my sink broke", 0) end })
    assert.is_false(ok)
    assert.equal("my sink broke", err)
    assert.same({}, reports())
    assert.same(SENTENCES, (say("a"))) -- v1 is still in use
  end)

  it("in a child mirza process: exit 0, the error once on the engine's log, nothing on stderr", function()
    local rpath, r2, r3 = file("route", ROUTE_V1), file("route2", ROUTE_V2), file("route3", "return {")
    local script, out, err = H.tmpname(".lua"), H.tmpname(".out"), H.tmpname(".err")
    finally(function() os.remove(script) os.remove(out) os.remove(err) end)
    write(script, ([[
local engine = require "mirza.engine"
local e = engine.new { base_url = %q, daemon = false, model_id = "mirza-sim", config_file = false,
  log = function(level, msg) if level ~= "info" and level ~= "debug" then print("LOG " .. msg) end end,
  body_extra = { mirza_sim = { text = %q, tok_rate = 2000 } } }
assert(e:watch("mirza.route", %q))
assert(e:say("hello", { mode = "whole" })) -- v1 works
assert(os.rename(%q, %q)) -- the edit: v2, which raises mid-stream
local st, res = e:say("hello", { mode = "sentence", answer = function(s) print("SAY " .. s) end })
print("ANSWER " .. tostring(st and res.answer))
assert(os.rename(%q, %q)) -- an edit that does not load
assert(e:say("hello", { mode = "whole" }))
e:close()
]]):format(sim.base .. "/v1", TEXT, rpath, r2, rpath, r3, rpath))
    local ok = os.execute(("%s %s >%s 2>%s"):format(H.q(H.mirza_bin), H.q(script), H.q(out), H.q(err)))
    local o, er = H.read_file(out), H.read_file(err)
    assert.is_true(ok, er)
    assert.equal("", er)
    local logs_seen, says = {}, {}
    for line in o:gmatch("[^\n]+") do
      if line:find("^LOG ") then logs_seen[#logs_seen + 1] = line end
      if line:find("^SAY ") then says[#says + 1] = line:sub(5) end
    end
    assert.equal(2, #logs_seen, o)
    assert.truthy(logs_seen[1]:find(("LOG %s:%d: route v2 broke"):format(rpath, line_of(ROUTE_V2, "route v2 broke")),
      1, true), o)
    -- a reload that fails goes to the engine's log too, one line
    assert.equal(("LOG reload of mirza.route failed, the previous version stays (fix the file: it is reloaded when "
      .. "it changes): %s:1: unexpected symbol near <eof>"):format(rpath), logs_seen[2])
    assert.same(SENTENCES, says)
    assert.truthy(o:find("ANSWER " .. TEXT .. "\n", 1, true), o)
  end)
end)
