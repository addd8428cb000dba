-- What the engine puts on the wire and where its settings come from,
-- observed from outside: the simulator reports the session id of each
-- request and where it found it; MIRZA_* variables reach a real `mirza`
-- process and beat the table and the config file.
local engine = require "mirza.engine"
local pipeline = require "mirza.pipeline"
local H = require "tests.helper"

local q = H.q

local write = H.write_file

describe("engine configuration precedence", function()
  local cfg_path
  before_each(function()
    cfg_path = H.tmpname(".lua")
    write(cfg_path, 'return { model = "from-file", port = 7001, temperature = 0.5 }')
  end)
  after_each(function() os.remove(cfg_path) end)

  -- An environment made of a table, as engine.config accepts.
  local function env_of(t) return function(name) return t[name] end end

  it("defaults < config file < table < environment, with types coerced", function()
    local cfg = engine.config({ model = "from-table", port = 7000, max_tokens = 99, config_file = cfg_path },
      env_of { MIRZA_PORT = "7002", MIRZA_AUTOSTART = "0", MIRZA_MAX_TOKENS = "", MIRZA_SESSION_ID = "env-s" })
    assert.equal("from-table", cfg.model)    -- the code beats the file
    assert.equal(7002, cfg.port)             -- the environment beats both, as a number
    assert.equal(0.5, cfg.temperature)
    assert.equal(99, cfg.max_tokens)         -- an empty variable is no override
    assert.is_false(cfg.autostart)           -- "0" is false
    assert.equal("env-s", cfg.session_id)
    cfg = engine.config({ model = "from-table", config_file = false }, env_of {})
    assert.equal("from-table", cfg.model)
    assert.equal(engine.defaults.port, cfg.port)
  end)

  it("MIRZA_BASE_URL sets host and port", function()
    local cfg = engine.config({ config_file = false }, env_of { MIRZA_BASE_URL = "http://127.0.0.2:9123/v1" })
    assert.equal("127.0.0.2", cfg.host)
    assert.equal(9123, cfg.port)
  end)
end)

describe("the engine's requests as mirza-sim sees them", function()
  it("carry the session id in the X-MTPLX-Session-Id header", function()
    local e = engine.new { preset = "mirza-sim", port = H.free_port(), config_file = false, session_id = "wire-s1",
      daemon = { args = { "--tok-rate", "0", "--ttft-ms", "0" }, deadline = 30 }, max_tokens = 16,
      log = function() end }
    finally(function() e:unload() end)
    assert(e:load("Tu es concis."))
    e:set_thinking(false)
    local evs = pipeline.collect(assert(e:turn("Bonjour")))
    local done = evs[#evs]
    assert.equal("done", done.type)
    assert.equal("wire-s1", done.stats.session_id)
    assert.equal("header.x-mtplx-session-id", done.stats.request_session_source)
  end)

  it("take MIRZA_* settings from the environment of a real mirza process", function()
    local port = H.free_port()
    local script = H.tmpname(".lua")
    write(script, [[
local e = require("mirza.engine").new { preset = "mirza-sim", port = 1, session_id = "from-table",
  daemon = { args = { "--tok-rate", "0", "--ttft-ms", "0" }, deadline = 30 }, log = function() end }
assert(e:load())
local evs = require("mirza.pipeline").collect(assert(e:turn("x")))
print(e.cfg.port, e.cfg.session_id, e.cfg.max_tokens, evs[#evs].stats.session_id, evs[#evs].usage.completion_tokens)
e:unload()
]])
    finally(function() os.remove(script) end)
    local p = assert(io.popen(("MIRZA_CONFIG=/dev/null MIRZA_LUA_DIR= MIRZA_SIM=%s MIRZA_PORT=%d "
      .. "MIRZA_SESSION_ID=env-s2 MIRZA_MAX_TOKENS=7 %s %s 2>&1")
      :format(q(H.sim_bin), port, q(H.mirza_bin), q(script))))
    local out = p:read("a")
    local ok = p:close()
    assert.is_true(ok, out)
    assert.equal(("%d\tenv-s2\t7\tenv-s2\t7\n"):format(port), out)
  end)
end)
