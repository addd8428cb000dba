-- The engine without sharp edges (issue 32, item 3 a-c): `e:turn` always
-- returns an iterator (a turn that cannot start yields one `error` event,
-- with the message and code `e:say` returns), a `base_url` the user gave
-- where nothing answers is never started on, and a turn waits out a 429 or
-- a 503 with Retry-After within its deadline, as a batch does.
local mirza = require "mirza"
local engine = require "mirza.engine"
local H = require "tests.helper"

local FAST = H.FAST

local sim = H.fast_sim

local function new(opts)
  local logged = {}
  local o = { config_file = false, max_tokens = 16, daemon = { progress = false },
    log = function(level, msg) logged[#logged + 1] = level .. ": " .. msg end }
  for k, v in pairs(opts) do o[k] = v end
  return engine.new(o), logged
end

-- The chat requests sent while fn runs (how many times a turn asked);
-- past `max` of them engine `e`'s turn is cancelled (a turn that would
-- ask forever fails the test instead of hanging it).
local function requests(fn, e, max)
  local n, open = 0, mirza.open
  mirza.open = function(o) -- luacheck: ignore
    if type(o.body) == "table" and o.body.messages then n = n + 1 end
    if e and n > max then e:cancel() end
    return open(o)
  end
  local ok, err = pcall(fn)
  mirza.open = open -- luacheck: ignore
  assert(ok, err)
  return n
end

describe("e:turn always returns an iterator", function()
  after_each(function() collectgarbage("collect") end)

  it("a turn that cannot start yields one error event: the message and code e:say gives", function()
    local dead = ("http://127.0.0.1:%d/v1"):format(H.free_port())
    local st, msg, code = new({ base_url = dead }):say("Bonjour")
    assert.is_nil(st)
    assert.equal("refused", code)
    assert.truthy(msg:find("nothing answers at " .. dead, 1, true), msg)
    local e = new { base_url = dead }
    local events = {}
    for ev in e:turn("Bonjour") do events[#events + 1] = ev end -- no "attempt to call a nil value"
    assert.same({ { type = "error", message = msg, code = code } }, events)
    -- the message and the code come second and third, the turn (already over) fourth
    local it, m2, c2, t = e:turn("Bonjour")
    assert.is_function(it)
    assert.same({ msg, code }, { m2, c2 })
    assert.same({ type = "error", message = msg, code = code }, it())
    assert.is_nil(it())
    assert.is_nil(it())
    t:close()
    assert.is_false(e:cancel()) -- nothing in flight
    assert.same({}, e.history.messages)
  end)

  it("a bad input, a bad schema: one error event too", function()
    local s = sim {}
    finally(s.stop)
    local e = new { base_url = s.base .. "/v1", daemon = false, model_id = "m" }
    local events = {}
    for ev in e:turn({ { role = "nobody" } }) do events[#events + 1] = ev end
    assert.equal(1, #events)
    assert.same({ "error", "prompt" }, { events[1].type, events[1].code })
    local _, msg, code = e:say({ { role = "nobody" } })
    assert.same({ msg, code }, { events[1].message, events[1].code })
    events = {}
    for ev in e:turn("x", { schema = "/nonexistent/schema.json" }) do events[#events + 1] = ev end
    assert.equal(1, #events)
    assert.equal("error", events[1].type)
    assert.is_string(events[1].message)
    -- and the engine still works
    local got = {}
    for ev in e:turn("Bonjour") do got[#got + 1] = ev.type end
    assert.equal("done", got[#got])
  end)
end)

describe("autostart", function()
  after_each(function() collectgarbage("collect") end)

  it("never starts a daemon at a base_url the user gave where nothing answers", function()
    local port = H.free_port()
    local url = ("http://127.0.0.1:%d/v1"):format(port)
    local e = new { base_url = url } -- autostart on (the default), no preset
    assert.is_true(e.cfg.autostart)
    local ok, msg, code = e:load()
    assert.is_nil(ok)
    assert.equal("refused", code)
    assert.equal(("nothing answers at %s: start your daemon there, correct base_url (MIRZA_BASE_URL), or set "
      .. "preset = \"mtplx\" (or \"llama-server\", \"ollama\", \"vllm\"; MIRZA_PRESET) to let mirza start one")
      :format(url), msg)
    assert.same({}, H.pids_with("--port " .. port)) -- nothing started there
    assert.is_nil(e.daemon and e.daemon.pid)
    local _, _, rcode = mirza.request { url = url .. "/models", timeout = 0.5, deadline = 1 }
    assert.equal("refused", rcode)
  end)

  it("a preset asked for still starts its daemon at the base_url", function()
    local port = H.free_port()
    local e = new { base_url = ("http://127.0.0.1:%d/v1"):format(port), preset = "mirza-sim",
      daemon = { progress = false, args = FAST } }
    finally(function() e:close() end)
    assert.is_true(e:load())
    assert.is_number(e.daemon.pid)
    assert.equal(1, #H.pids_with("--port " .. port))
  end)
end)

describe("a turn's 429 and 503", function()
  after_each(function() collectgarbage("collect") end)

  it("a 429 is waited out (its Retry-After), then answered", function()
    local s = sim { "--fail-first", "2", "--retry-after", "1" }
    finally(s.stop)
    local e, logged = new { base_url = s.base .. "/v1", daemon = false, model_id = "m" }
    assert.is_true(e:load())
    local st, res
    local t0 = mirza.now()
    local n = requests(function() st, res = e:say("Bonjour", { answer = function() end }) end)
    local dt = mirza.now() - t0
    assert.is_table(st, tostring(res))
    assert.equal(3, n)
    assert.is_true(dt >= 1.9, dt) -- 1 s, twice: the server's Retry-After
    assert.is_true(dt < 8, dt)
    assert.truthy(table.concat(logged, "\n"):find("answered 429 (Retry-After: 1 s): asking again in 1.", 1, true),
      table.concat(logged, "\n"))
    -- e:turn the same
    s.stop()
    local s2 = sim { "--fail-first", "1", "--retry-after", "0" }
    finally(s2.stop)
    local e2 = new { base_url = s2.base .. "/v1", daemon = false, model_id = "m" }
    local last
    for ev in e2:turn("Bonjour") do last = ev end
    assert.equal("done", last.type)
  end)

  it("a 503 with Retry-After is waited out within the turn's deadline, then fails with the server's answer", function()
    local s = sim { "--fault", "http=503,retry-after=1" }
    finally(s.stop)
    local e = new { base_url = s.base .. "/v1", daemon = false, model_id = "m", header_timeout = 2.5 }
    assert.is_true(e:load())
    local st, msg, code
    local t0 = mirza.now()
    local n = requests(function() st, msg, code = e:say("Bonjour", { answer = function() end }) end, e, 5)
    local dt = mirza.now() - t0
    assert.is_nil(st)
    assert.equal("http", code)
    assert.truthy(msg:find("503", 1, true), msg)
    assert.is_true(n >= 2 and n <= 3, n) -- at 0, ~1 (and ~2) s; a wait ending past 2.5 s is not begun
    assert.is_true(dt >= 0.95 and dt < 3.5, dt)
  end)

  it("a Retry-After past the deadline fails the turn at once", function()
    local s = sim { "--fail-first", "5", "--retry-after", "10" }
    finally(s.stop)
    local e = new { base_url = s.base .. "/v1", daemon = false, model_id = "m", header_timeout = 3 }
    assert.is_true(e:load())
    local t0 = mirza.now()
    local st, msg, code
    local n = requests(function() st, msg, code = e:say("Bonjour", { answer = function() end }) end, e, 1)
    assert.equal(1, n)
    assert.is_nil(st)
    assert.equal("http", code)
    assert.truthy(msg:find("429", 1, true), msg)
    assert.is_true(mirza.now() - t0 < 2, mirza.now() - t0)
  end)
end)
