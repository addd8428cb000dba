-- scripts/chat.lua and mirza.behaviour against mirza-sim: a behaviour that
-- raises at run time falls back to the previous version (reported with
-- file:line), a changed system prompt applies from the next turn, unknown
-- /commands are errors, /new starts a fresh session, and the chat stops
-- the daemon it started but leaves an adopted one running; --help lists
-- its options, a bad option is a usage error (exit 2).
local mirza = require "mirza"
local engine = require "mirza.engine"
local behaviour = require "mirza.behaviour"
local pipeline = require "mirza.pipeline"
local H = require "tests.helper"

local write = H.write_file

local V1 = [[return { system = "S1", on_turn = function(t) return "v1:" .. t end,
  stage = function(up) return function() local ev = up()
    if ev and ev.type == "text" then ev.tag = "v1" end return ev end end }]]
-- v2: on_turn raises, the stage raises on its third text event
local V2 = [[return { system = "S1", on_turn = function(t) error("v2 on_turn broke") end,
  stage = function(up) local n = 0 return function() local ev = up()
    if ev and ev.type == "text" then n = n + 1 if n == 3 then error("v2 stage broke") end ev.tag = "v2" end
    return ev end end }]]

describe("mirza.behaviour", function()
  after_each(function() collectgarbage("collect") end)

  it("a version raising at run time is reported with file:line; the previous one runs that turn", function()
    local dir = H.tmpname(".d")
    os.execute("mkdir -p " .. H.q(dir))
    finally(function() os.execute("rm -rf " .. H.q(dir)) end)
    local path = dir .. "/beh_spec.lua"
    write(path, V1)
    local reports = {}
    local b = assert(behaviour.new("beh_spec", path, function(m) reports[#reports + 1] = m end))
    finally(function() package.loaded.beh_spec = nil end)
    local e = engine.new { preset = "mirza-sim", port = H.free_port(), config_file = false, log = function() end,
      daemon = { args = { "--tok-rate", "0", "--ttft-ms", "0" }, progress = false },
      body_extra = { mirza_sim = { text = "un deux trois quatre cinq" } } }
    finally(function() e:unload() end)
    e.stages = { b:stage_spec() }
    assert.equal("v1:x", b:on_turn("x", e))
    write(path, V2 .. "\n-- edited\n")
    e:reload()
    assert.is_true(b:refresh())
    assert.equal("v1:y", b:on_turn("y", e)) -- v2 raised: v1 ran
    assert.matches("beh_spec%.lua:1: v2 on_turn broke", reports[1])
    local evs = pipeline.collect(assert(e:turn("y")))
    assert.equal("done", evs[#evs].type)
    local tags = {}
    for _, ev in ipairs(evs) do if ev.type == "text" then tags[#tags + 1] = ev.tag end end
    assert.same({ "v2", "v2", "v1", "v1", "v1" }, tags)
    assert.matches("beh_spec%.lua:3: v2 stage broke", reports[2])
    assert.equal("un deux trois quatre cinq", e.history.messages[#e.history.messages].content)
  end)

  it("without a previous version the built-in default runs", function()
    local path = H.tmpname(".lua")
    finally(function() os.remove(path) package.loaded.beh_spec2 = nil end)
    write(path, V2)
    local reports = {}
    local b = assert(behaviour.new("beh_spec2", path, function(m) reports[#reports + 1] = m end))
    assert.equal("z", b:on_turn("z", {}))
    local evs = pipeline.collect(b:stage_spec().fn(pipeline.from_list {
      { type = "text", text = "a" }, { type = "text", text = "b" }, { type = "text", text = "c" }, { type = "done" } }))
    assert.same({ "v2", "v2", nil }, { evs[1].tag, evs[2].tag, evs[3].tag })
    assert.equal("c", evs[3].text)
    assert.equal(4, #evs)
    assert.equal(2, #reports)
  end)
end)

describe("mirza.behaviour, a hook removed by an edit", function()
  after_each(function() collectgarbage("collect") end)

  it("is gone from the next turn: no stage, the text unchanged (the old version's do not run)", function()
    local path = H.tmpname(".lua")
    finally(function() os.remove(path) package.loaded.beh_spec3 = nil mirza.watcher().files.beh_spec3 = nil end)
    write(path, V1)
    local b = assert(behaviour.new("beh_spec3", path, function(m) error("reported: " .. m) end))
    local function run()
      local evs = pipeline.collect(pipeline.compose(pipeline.from_list { { type = "text", text = "a" },
        { type = "done" } }, { b:stage_spec() }))
      return evs[1].tag, b:on_turn("x", {})
    end
    assert.same({ "v1", "v1:x" }, { run() })
    write(path, 'return { system = "S1" }\n-- stage and on_turn removed\n')
    mirza.reload()
    assert.is_true(b:refresh())
    assert.same({ nil, "x" }, { run() })
  end)

  it("an interrupt in on_turn goes on up: no hook's error, no fallback", function()
    local path = H.tmpname(".lua")
    finally(function() os.remove(path) package.loaded.beh_spec4 = nil mirza.watcher().files.beh_spec4 = nil end)
    write(path, 'return { on_turn = function() error("interrupted", 0) end }')
    local b = assert(behaviour.new("beh_spec4", path, function(m) error("reported: " .. m) end))
    local ok, err = pcall(b.on_turn, b, "x", {})
    assert.same({ false, "interrupted" }, { ok, err })
  end)
end)

describe("scripts/chat.lua", function()
  local function run_chat(lines, args, beh)
    local input, out, err = H.tmpname(".in"), H.tmpname(".out"), H.tmpname(".err")
    write(input, table.concat(lines, "\n") .. "\n")
    local cmd = ("%s %s/scripts/chat.lua %s --fifo %s %s >%s 2>%s"):format(H.q(H.mirza_bin), H.q(H.source),
      beh and H.q(beh) or "", H.q(input), args, H.q(out), H.q(err))
    local ok = os.execute(cmd)
    local r = { ok = ok, out = H.read_file(out), err = H.read_file(err) }
    os.remove(input) os.remove(out) os.remove(err)
    return r
  end

  it("reports unknown commands, applies a new system prompt next turn, /new, and stops what it started", function()
    local port = H.free_port()
    local beh = H.tmpname(".lua")
    finally(function() os.remove(beh) end)
    -- v1's on_turn rewrites the file: the next turn runs v2 with another system prompt
    write(beh, ([[return { system = "First system.", on_turn = function(t, e)
      io.stderr:write("SYSTEM=", e.system_prompt, "\n")
      local f = io.open(%q, "w")
      f:write('return { system = "Second system, longer.", on_turn = function(t, e) ',
        'io.stderr:write("SYSTEM=", e.system_prompt, " HIST=", e.history.system, "\\n") return t end }')
      f:close()
      return t end }]]):format(beh))
    local r = run_chat({ "/bogus", "Bonjour", "Encore", "/new", "/stats", "/quit", "never sent" },
      "--sim --port " .. port, beh)
    assert.is_true(r.ok, r.err)
    assert.truthy(r.err:find("error: unknown command /bogus", 1, true), r.err)
    assert.is_nil(r.err:find("turn failed", 1, true), r.err)
    assert.truthy(r.err:find("SYSTEM=First system.\n", 1, true), r.err)
    assert.truthy(r.err:find("SYSTEM=Second system, longer. HIST=Second system, longer.", 1, true), r.err)
    assert.truthy(r.err:find("new conversation (session mirza-", 1, true), r.err)
    assert.truthy(r.err:find("chat: started", 1, true), r.err)
    local _, _, code = mirza.request { url = ("http://127.0.0.1:%d/health"):format(port), timeout = 1, deadline = 2 }
    assert.equal("refused", code) -- the daemon it started is stopped
    -- stdout is the two answers, sentence by sentence: the simulator's text
    -- for each prompt (seeded by the prompt alone), asked again here
    local sim = H.start_sim { "--tok-rate", "0", "--ttft-ms", "0" }
    finally(sim.stop)
    local want = {}
    for _, prompt in ipairs { "Bonjour", "Encore" } do
      local res = assert(mirza.collect { url = sim.base .. "/v1/chat/completions",
        body = H.chat_body(prompt, { max_tokens = 32 }) })
      want[#want + 1] = res.text
    end
    assert.equal(table.concat(want, " "), (r.out:gsub("\n", " "):gsub(" +$", "")))
  end)

  -- scripts/chat.lua with these arguments and nothing on stdin: {rc, out, err}.
  local function chat_args(args)
    local out, err = H.tmpname(".out"), H.tmpname(".err")
    local cmd = ("%s %s %s/scripts/chat.lua %s </dev/null >%s 2>%s"):format(H.timeout_prefix(20), H.q(H.mirza_bin),
      H.q(H.source), args, H.q(out), H.q(err))
    local _, _, rc = os.execute(cmd)
    local r = { rc = rc, out = H.read_file(out), err = H.read_file(err) }
    os.remove(out) os.remove(err)
    return r
  end

  it("--help lists every option it takes, one line each, within 80 columns, and exits 0", function()
    for _, flag in ipairs { "--help", "-h", "--sim --help" } do
      local r = chat_args(flag)
      assert.equal(0, r.rc, r.err)
      assert.equal("", r.err)
      assert.matches("^usage: mirza chat ", r.out)
      for line in r.out:gmatch("[^\n]+") do assert.is_true(#line <= 80, "a line over 80 columns: " .. line) end
      -- every option the script compares an argument with has its line
      local src = H.read_file(H.source .. "/scripts/chat.lua")
      local n = 0
      for opt in src:gmatch('a == "(%-[%w%-]*)"') do
        n = n + 1
        local listed = r.out:find("\n  " .. opt:gsub("%-", "%%-") .. "[ ,]") or r.out:find("\n  %-%w, " ..
          opt:gsub("%-", "%%-") .. " ")
        assert.truthy(listed, opt .. " is not on a line of its own in --help:\n" .. r.out)
      end
      assert.is_true(n >= 9, "found only " .. n .. " options in scripts/chat.lua")
    end
  end)

  it("an unknown option or one without its value is a usage error naming it: exit 2, nothing started", function()
    local port = H.free_port()
    local cases = {
      { "--bogus", "chat: unknown option %-%-bogus %(mirza chat %-%-help lists the options%)" },
      { "-x beh.lua", "chat: unknown option %-x " },
      { "--name", "chat: %-%-name needs a conversation name " },
      { "--name --no-save", "chat: %-%-name needs a conversation name " },
      { "--fifo", "chat: %-%-fifo needs a path " },
      { "--port", "chat: %-%-port needs a port number " },
      { "--port eighty", "chat: %-%-port needs a port number from 1 to 65535, not eighty " },
      { "a.lua b.lua", "chat: one behaviour file only, not a%.lua and b%.lua " },
    }
    for _, c in ipairs(cases) do
      local r = chat_args("--sim --port " .. port .. " " .. c[1])
      assert.equal(2, r.rc, c[1] .. ": " .. r.err)
      assert.matches("^" .. c[2], r.err)
      assert.equal("", r.out)
    end
    local _, _, code = mirza.request { url = ("http://127.0.0.1:%d/health"):format(port), timeout = 1, deadline = 2 }
    assert.equal("refused", code) -- no simulator was started
  end)

  it("leaves an adopted daemon running", function()
    local s = H.start_sim { "--tok-rate", "0", "--ttft-ms", "0" }
    finally(s.stop)
    local r = run_chat({ "Bonjour", "/quit" }, "--sim --port " .. s.port)
    assert.is_true(r.ok, r.err)
    assert.truthy(r.err:find("chat: adopted", 1, true), r.err)
    assert.truthy(H.ps(s.pid) and not H.ps(s.pid).stat:find("Z"), "left running")
    assert.truthy((mirza.request { url = s.base .. "/health", timeout = 1, deadline = 2 }))
  end)
end)
