-- mirza.engine configuration: precedence defaults < config file < code
-- table < environment, every MIRZA_* variable, option checks, endpoints.
local engine = require "mirza.engine"
local H = require "tests.helper"

local function env_of(t)
  return function(name) return t[name] end
end

local function config_file(text)
  local path = H.tmpname(".lua")
  local f = assert(io.open(path, "w"))
  f:write(text)
  f:close()
  return path
end

describe("mirza.engine configuration", function()
  after_each(function() collectgarbage("collect") end)

  it("system_prompt (code, config file) is the conversation's system prompt, as e:load(prompt) sets it", function()
    local e = engine.new { config_file = false, daemon = false, system_prompt = "You are terse." }
    assert.equal("You are terse.", e.system_prompt)
    assert.equal("You are terse.", e.history.system)
    local path = config_file('return { system_prompt = "From the file." }')
    finally(function() os.remove(path) end)
    assert.equal("From the file.", engine.new({ config_file = path, daemon = false }).history.system)
    assert.is_nil(engine.new({ config_file = false, daemon = false }).history.system)
  end)

  it("precedence: defaults < config file < code table < environment", function()
    local path = config_file("return { temperature = 0.1, max_tokens = 111, top_p = 0.5, port = 7001 }")
    finally(function() os.remove(path) end)
    local cfg = engine.config({ config_file = path, max_tokens = 222, port = 7002 }, env_of { MIRZA_PORT = "7003" })
    assert.equal(0.1, cfg.temperature)   -- file over default
    assert.equal(222, cfg.max_tokens)    -- code over file
    assert.equal(0.5, cfg.top_p)         -- file
    assert.equal(7003, cfg.port)         -- environment over code
    assert.equal(engine.defaults.stall_timeout, cfg.stall_timeout) -- default
    local no_file = engine.config({ config_file = false }, env_of {})
    assert.equal(engine.defaults.temperature, no_file.temperature)
  end)

  it("reads MIRZA_CONFIG and rejects unknown keys in the file and in code", function()
    local path = config_file("return { context_window = 4096 }")
    finally(function() os.remove(path) end)
    local saved = os.getenv
    os.getenv = function(n) if n == "MIRZA_CONFIG" then return path end return saved(n) end -- luacheck: ignore
    local ok, cfg = pcall(engine.config, {}, env_of {})
    os.getenv = saved -- luacheck: ignore
    assert(ok, cfg)
    assert.equal(4096, cfg.context_window)
    assert.has_error(function() engine.config({ config_file = false, nope = 1 }, env_of {}) end,
      'mirza.engine: unknown option "nope"')
  end)

  it("an unknown key in the config file is reported with the file and its line, not the caller's", function()
    local bad = config_file("-- my settings\nreturn {\n  temperature = 0.2,\n  tempreature = 1,\n}\n")
    finally(function() os.remove(bad) end)
    local ok, err = pcall(engine.config, { config_file = bad }, env_of {})
    assert.is_false(ok)
    assert.equal(("mirza config %s:4: unknown option \"tempreature\": fix or remove it (the options: docs/engine.md)")
      :format(bad), err)
    local quoted = config_file('return { ["max_tokns"] = 1 }')
    finally(function() os.remove(quoted) end)
    ok, err = pcall(engine.config, { config_file = quoted }, env_of {})
    assert.is_false(ok)
    assert.truthy(err:find(quoted .. ':1: unknown option "max_tokns"', 1, true), err)
  end)

  it("a config file named by $MIRZA_CONFIG or config_file must exist; /dev/null or an empty one: none", function()
    local saved = os.getenv
    local env = {}
    os.getenv = function(n) if env[n] ~= nil then return env[n] end return saved(n) end -- luacheck: ignore
    finally(function() os.getenv = saved end) -- luacheck: ignore
    env.MIRZA_CONFIG = "/nonexistent/mirza/confg.lua"
    local ok, err = pcall(engine.config, {}, env_of {})
    assert.is_false(ok)
    assert.equal("mirza config: $MIRZA_CONFIG names a file that cannot be read (/nonexistent/mirza/confg.lua: No such "
      .. "file or directory): fix the path, or unset it to use no config file", err)
    ok, err = pcall(engine.config, { config_file = "/nonexistent/c.lua" }, env_of {})
    assert.is_false(ok)
    assert.truthy(err:find("config_file names a file that cannot be read (/nonexistent/c.lua", 1, true), err)
    env.MIRZA_CONFIG = "/dev/null"
    assert.equal(engine.defaults.temperature, engine.config({}, env_of {}).temperature)
    local empty = config_file("\n")
    finally(function() os.remove(empty) end)
    env.MIRZA_CONFIG = empty
    assert.equal(engine.defaults.max_tokens, engine.config({}, env_of {}).max_tokens)
    -- no MIRZA_CONFIG and nothing at the default place: no settings, no error
    env.MIRZA_CONFIG, env.XDG_CONFIG_HOME = "", "/nonexistent/xdg"
    assert.equal(engine.defaults.top_p, engine.config({}, env_of {}).top_p)
  end)

  it("the config file runs sandboxed: using a global says so; it must return a table", function()
    local path = config_file("return { port = tonumber(os.getenv('P')) }")
    finally(function() os.remove(path) end)
    local ok, err = pcall(engine.config, { config_file = path }, env_of {})
    assert.is_false(ok)
    assert.truthy(err:find(path .. ":1: attempt to index a nil value (global 'os')", 1, true), err)
    assert.truthy(err:find("runs sandboxed: no globals such as os, io or require", 1, true), err)
    local nothing = config_file("local t = { port = 1 }")
    finally(function() os.remove(nothing) end)
    ok, err = pcall(engine.config, { config_file = nothing }, env_of {})
    assert.is_false(ok)
    assert.truthy(err:find("must return a table of options, got nil", 1, true), err)
  end)

  it("no preset asked for: load() detects what answers; a preset from code, file, env or daemon = {} supervises",
    function()
      local function detects(opts, env)
        opts.config_file = opts.config_file or false
        return engine.config(opts, env_of(env or {}))._detect == true
      end
      assert.is_true(detects {})
      assert.is_true(detects { base_url = "http://127.0.0.1:8080/v1" })
      assert.is_true(detects({}, { MIRZA_BASE_URL = "http://127.0.0.1:8080/v1" }))
      assert.is_false(detects { preset = "mtplx" })
      assert.is_false(detects({}, { MIRZA_PRESET = "llama-server" }))
      assert.is_false(detects { daemon = { preset = "mirza-sim" } })
      assert.is_false(detects { daemon = true })
      local path = config_file('return { preset = "ollama" }')
      finally(function() os.remove(path) end)
      assert.is_false(detects { config_file = path })
      -- the default model applies only to the default preset's daemon, and is dropped for what is detected
      local cfg = engine.config({ config_file = false }, env_of {})
      assert.is_true(cfg._default_model)
      assert.is_nil(engine.config({ config_file = false, model = "/m/x" }, env_of {})._default_model)
      -- presets' dialects and ports
      assert.equal("llama", engine.config({ config_file = false, preset = "vllm", model = "m" }, env_of {}).dialect)
      assert.equal(11434, engine.new({ config_file = false, preset = "ollama" }).daemon.port)
      assert.equal(8000, engine.new({ config_file = false, preset = "vllm", model = "m" }).daemon.port)
      assert.equal(9000, engine.new({ config_file = false, preset = "vllm", model = "m", port = 9000 }).daemon.port)
      assert.equal("http://127.0.0.1:11434/v1", engine.new({ config_file = false, preset = "ollama" }).base_url)
    end)

  it("honours every MIRZA_* variable", function()
    local env = {
      MIRZA_BASE_URL = "http://127.0.0.1:9100/v1", MIRZA_MODEL = "/m/llama.gguf", MIRZA_MODEL_ID = "mid",
      MIRZA_API_KEY = "key", MIRZA_HOST = "127.0.0.2", MIRZA_PORT = "9200", MIRZA_PRESET = "llama-server",
      MIRZA_SESSION_ID = "sess", MIRZA_DIALECT = "llama", MIRZA_CONTEXT_WINDOW = "2048", MIRZA_MAX_TOKENS = "77",
      MIRZA_TEMPERATURE = "0.3", MIRZA_AUTOSTART = "0", MIRZA_DAEMON = "0", MIRZA_THINK_TAGS = "open",
      MIRZA_RECORD = "/tmp/rec", MIRZA_VERBOSE = "1",
    }
    local cfg = engine.config({ config_file = false }, env_of(env))
    local got = {}
    for name, spec in pairs(engine.ENV) do got[name] = cfg[spec[1]] end
    assert.same({
      MIRZA_BASE_URL = "http://127.0.0.1:9100/v1", MIRZA_MODEL = "/m/llama.gguf", MIRZA_MODEL_ID = "mid",
      MIRZA_API_KEY = "key", MIRZA_HOST = "127.0.0.1", -- the base URL's host wins over MIRZA_HOST
      MIRZA_PORT = 9100, MIRZA_PRESET = "llama-server", MIRZA_SESSION_ID = "sess", MIRZA_DIALECT = "llama",
      MIRZA_CONTEXT_WINDOW = 2048, MIRZA_MAX_TOKENS = 77, MIRZA_TEMPERATURE = 0.3, MIRZA_AUTOSTART = false,
      MIRZA_DAEMON = false, MIRZA_THINK_TAGS = "open", MIRZA_RECORD = "/tmp/rec", MIRZA_VERBOSE = true,
    }, got)
    -- without a base URL, host and port come through; booleans and tags parse
    cfg = engine.config({ config_file = false, autostart = false }, env_of { MIRZA_HOST = "127.0.0.2",
      MIRZA_PORT = "9300", MIRZA_AUTOSTART = "yes", MIRZA_THINK_TAGS = "0" })
    assert.same({ "127.0.0.2", 9300, true, false }, { cfg.host, cfg.port, cfg.autostart, cfg.think_tags })
    local e = engine.new { config_file = false, port = 9400 }
    assert.is_table(e.daemon)
    assert.equal(17, #(function() local n = {} for k in pairs(engine.ENV) do n[#n + 1] = k end return n end)())
  end)

  it("OPENAI_API_KEY is the key when nothing else gives one, as for mirza batch (config.api_key)", function()
    local config = require "mirza.config"
    local function key(opts, env) return engine.config(opts, env_of(env)).api_key end
    assert.equal("sk-o", key({ config_file = false }, { OPENAI_API_KEY = "sk-o" }))
    assert.equal("code", key({ config_file = false, api_key = "code" }, { OPENAI_API_KEY = "sk-o" }))
    assert.equal("m", key({ config_file = false, api_key = "code" }, { OPENAI_API_KEY = "sk-o", MIRZA_API_KEY = "m" }))
    assert.equal("sk-o", key({ config_file = false, api_key = "" }, { OPENAI_API_KEY = "sk-o", MIRZA_API_KEY = "" }))
    assert.is_nil(key({ config_file = false }, { OPENAI_API_KEY = "" }))
    local file = config_file("return { temperature = 0.5 }")
    finally(function() os.remove(file) end)
    assert.equal("sk-o", key({ config_file = file }, { OPENAI_API_KEY = "sk-o" }))
    -- batch's order, the same function: the option, MIRZA_API_KEY, OPENAI_API_KEY
    assert.equal("opt", config.api_key("opt", env_of { MIRZA_API_KEY = "m", OPENAI_API_KEY = "o" }))
    assert.equal("m", config.api_key(nil, env_of { MIRZA_API_KEY = "m", OPENAI_API_KEY = "o" }))
    assert.equal("o", config.api_key("", env_of { MIRZA_API_KEY = "", OPENAI_API_KEY = "o" }))
  end)

  it("a malformed MIRZA_* number raises naming the variable, its value and what it takes", function()
    for _, case in ipairs {
      { "MIRZA_PORT", "abc", "a port number (1-65535) expected" }, { "MIRZA_PORT", "0", "a port number" },
      { "MIRZA_PORT", "70000", "a port number" }, { "MIRZA_PORT", "80.5", "a port number" },
      { "MIRZA_TEMPERATURE", "hot", "a number >= 0 expected" }, { "MIRZA_TEMPERATURE", "-1", "a number >= 0" },
      { "MIRZA_TEMPERATURE", "nan", "a number >= 0" }, { "MIRZA_TEMPERATURE", "1e999", "a number >= 0" },
      { "MIRZA_MAX_TOKENS", "1k", "a whole number >= 1 expected" }, { "MIRZA_MAX_TOKENS", "0", "a whole number" },
      { "MIRZA_CONTEXT_WINDOW", "16k", "a whole number >= 1 expected" },
    } do
      local name, value, says = case[1], case[2], case[3]
      local ok, err = pcall(engine.config, { config_file = false }, env_of { [name] = value })
      assert.is_false(ok, name .. "=" .. value .. " was taken")
      assert.truthy(tostring(err):find(("mirza: %s=%s: %s"):format(name, value, says), 1, true), err)
    end
    -- every numeric variable is checked: none is left to a silent tonumber
    for name, spec in pairs(engine.ENV) do
      if type(engine.defaults[spec[1]]) == "number" then
        assert.is_false(pcall(engine.config, { config_file = false }, env_of { [name] = "x" }), name)
      end
    end
    -- well-formed numbers pass, as integers where the option is one
    local cfg = engine.config({ config_file = false }, env_of { MIRZA_PORT = " 9300 ", MIRZA_MAX_TOKENS = "1e3",
      MIRZA_TEMPERATURE = "0", MIRZA_CONTEXT_WINDOW = "4096" })
    assert.same({ 9300, 1000, 0, 4096 }, { cfg.port, cfg.max_tokens, cfg.temperature, cfg.context_window })
    assert.equal("integer", math.type(cfg.max_tokens))
  end)

  it("empty variables are ignored", function()
    local cfg = engine.config({ config_file = false, max_tokens = 5 }, env_of { MIRZA_MAX_TOKENS = "" })
    assert.equal(5, cfg.max_tokens)
  end)

  it("parses base URLs: IPv6, default ports, https not supervised", function()
    local cfg = engine.config({ config_file = false, base_url = "http://[::1]:8123/v1/" }, env_of {})
    assert.same({ "[::1]", 8123, "http://[::1]:8123/v1" }, { cfg.host, cfg.port, cfg.base_url })
    assert.is_nil(cfg.daemon)
    cfg = engine.config({ config_file = false, base_url = "https://api.example.com/v1" }, env_of {})
    assert.same({ "api.example.com", 443, false }, { cfg.host, cfg.port, cfg.daemon })
    cfg = engine.config({ config_file = false, base_url = "http://gpu.lan/v1" }, env_of {})
    assert.same({ 80, false }, { cfg.port, cfg.daemon })
    assert.is_nil(cfg.model) -- an endpoint used as is gets no preset model
  end)

  it("a base URL's userinfo is not its host: http://alice:pw@127.0.0.1/v1 is loopback, detected", function()
    local cfg = engine.config({ config_file = false, base_url = "http://alice:p@ss@127.0.0.1:8124/v1" }, env_of {})
    assert.same({ "127.0.0.1", 8124 }, { cfg.host, cfg.port })
    assert.is_nil(cfg.daemon) -- loopback: load() detects (or supervises) what answers there
    cfg = engine.config({ config_file = false, base_url = "http://bob@[::1]/v1" }, env_of {})
    assert.same({ "[::1]", 80 }, { cfg.host, cfg.port })
    assert.is_nil(cfg.daemon)
    cfg = engine.config({ config_file = false, base_url = "http://127.0.0.1:pw@gpu.lan:9000/v1" }, env_of {})
    assert.same({ "gpu.lan", 9000, false }, { cfg.host, cfg.port, cfg.daemon }) -- a remote host stays remote
    cfg = engine.config({ config_file = false, base_url = "http://127.0.0.1:8125/v1?u=a@b" }, env_of {})
    assert.same({ "127.0.0.1", 8125 }, { cfg.host, cfg.port }) -- an '@' after the path is no userinfo
  end)
end)
