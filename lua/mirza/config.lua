--- mirza.config: an engine's configuration, resolved — the defaults, the
--- user config file, the options given, the environment — and checked.
---
--- Precedence, from lowest to highest: `defaults`, the user config file
--- (`$MIRZA_CONFIG`, else `~/.config/mirza/config.lua`, a Lua file
--- returning a table, run sandboxed), the table passed to `mirza.engine.new`,
--- then the environment (`ENV`: `MIRZA_BASE_URL`, `MIRZA_MODEL`, ...). So
--- the config file sets a user's defaults, a script's explicit options beat
--- it, and a user can still redirect any script without editing it. The
--- engine (mirza.engine) re-exports these as `engine.config`,
--- `engine.defaults`, `engine.ENV`, ...; state lives in the resolved table.
local merge = require("mirza.util").merge

local M = {}

--- The model each preset runs when `model` is not given (mtplx only: the
--- others need a model file, or serve their own id).
M.preset_models = { mtplx = "pooyakn73/Qwen3.8-9B-Distill-MTPLX-Q6G64" }

---@class mirza.EngineConfig
M.defaults = {
  preset = "mtplx",            -- daemon preset: mtplx | llama-server | ollama | vllm | mirza-sim | custom
                               -- (not given: what answers is detected, see Engine:load)
  host = "127.0.0.1",
  port = 8766,
  autostart = true,
  context_window = 16384,
  depth = 3,                   -- MTP draft depth
  max_tokens = 1024,
  max_tokens_thinking = 4096,
  temperature = 0.7,
  top_p = 0.95,
  presence_penalty = 0.0,
  repetition_penalty = 1.0,
  reasoning_budget = 0,
  keep_alive = false,          -- leave a started daemon running at exit
  stall_timeout = 120,         -- seconds without a byte (heartbeats count); false: none
  header_timeout = 600,        -- seconds until the response head (long prefills, queued turns); false: none
  busy_wait = 5,               -- seconds a 409 "session busy" is waited out (the daemon
                               -- releasing this engine's previous request); 0: fail at once
  connect_timeout = 10,
  auto_reload = true,          -- check watched modules for changes before each turn
  think_tags = "auto",         -- <think> tags in content: "auto" | true | false | "open" (mirza.thinktags)
  prefill_tokens = 16,         -- max_tokens of the prefill request
  max_rounds = 8,              -- tool loop: most requests one `say` may take (mirza.tools)
  hold = 0.005,                -- seconds: a turn that merges deltas (`say` without script stages, `merge`)
                               -- hands them over at most this long after the first one came, what came
                               -- meanwhile as one event (mirza.open's hold): a fast stream read in one go
                               -- per hold, not a wake-up per token; false or 0: each read as it comes
}

-- Options without a default (nil unless given).
local OPTIONAL = { dialect = "string", base_url = "string", model = "string", model_id = "string",
  kv_bits = "number", session_id = "string", api_key = "string", daemon = "table|boolean", restart = "table",
  repetition = "table|boolean", log = "function", body_extra = "table", system_prompt = "string",
  config_file = "string|boolean",
  verbose = "boolean", -- one line on stderr saying what load() found (detected, adopted, started)
  -- tools (mirza.tools): a table of tools, or a module name (hot-reloaded)
  tools = "table|string", tool_choice = "string|table", parallel_tool_calls = "boolean", run_calls = "function",
  record = "string", -- record every request and turn into this directory (mirza.record)
  -- several endpoints (mirza.pool): base URLs or {url=, limit=}, or a pool shared with other engines
  endpoints = "table", pool = "table",
  -- deltas that arrived together as one event (mirza.open's merge): nil = in `say` when the
  -- turn has no script stages, true = every turn, false = never
  merge = "boolean",
  -- structured answers (mirza.schema, docs/structured.md): every turn's schema (a table or a .json
  -- path; a turn's `schema = false` turns it off), and the tries `say` makes to get an answer that fits it
  schema = "table|string", attempts = "number" }

-- Environment variables: name -> option, type ("port", "count" and
-- "temperature" are numbers, checked: see NUMBERS).
M.ENV = {
  MIRZA_BASE_URL = { "base_url", "string" }, MIRZA_MODEL = { "model", "string" },
  MIRZA_MODEL_ID = { "model_id", "string" }, MIRZA_API_KEY = { "api_key", "string" },
  MIRZA_HOST = { "host", "string" }, MIRZA_PORT = { "port", "port" }, MIRZA_PRESET = { "preset", "string" },
  MIRZA_SESSION_ID = { "session_id", "string" }, MIRZA_DIALECT = { "dialect", "string" },
  MIRZA_CONTEXT_WINDOW = { "context_window", "count" }, MIRZA_MAX_TOKENS = { "max_tokens", "count" },
  MIRZA_TEMPERATURE = { "temperature", "temperature" }, MIRZA_AUTOSTART = { "autostart", "boolean" },
  MIRZA_DAEMON = { "daemon", "boolean" }, MIRZA_THINK_TAGS = { "think_tags", "tags" },
  MIRZA_RECORD = { "record", "string" }, MIRZA_VERBOSE = { "verbose", "boolean" },
}

-- The numbers a variable may hold: a test of the number, and what to say
-- when it fails.
local NUMBERS = {
  port = { function(n) return math.type(n) == "integer" and n >= 1 and n <= 65535 end,
    "a port number (1-65535) expected" },
  count = { function(n) return math.type(n) == "integer" and n >= 1 end, "a whole number >= 1 expected" },
  temperature = { function(n) return n >= 0 and n < math.huge end, "a number >= 0 expected (0.7; 0 for greedy)" },
}

-- The number in variable `name`, or an error naming it, its value and what
-- it takes: a typo must not silently drop the setting.
local function number(name, v, ty)
  local check = NUMBERS[ty]
  local n = tonumber(v)
  if ty ~= "temperature" and math.type(n) == "float" then n = math.tointeger(n) or n end -- "1e3", "8080.0"
  if n == nil or n ~= n or not check[1](n) then
    error(("mirza: %s=%s: %s"):format(name, v, check[2]), 0)
  end
  return n
end

local function coerce(v, ty, name)
  if NUMBERS[ty] then return number(name, v, ty) end
  if ty == "boolean" then return v == "1" or v == "true" or v == "yes" or v == "on" end
  if ty == "tags" then
    if v == "auto" or v == "open" then return v end
    return v == "1" or v == "true" or v == "yes" or v == "on"
  end
  return v
end


-- The line of a config file's text that sets key (for an error message), or nil.
local function line_of(text, key)
  local n = 0
  for line in text:gmatch("[^\n]*") do
    n = n + 1
    local at = line:find(key, 1, true)
    if at and line:sub(at - 1, at - 1):find("^[^%w_]?$") and line:sub(at + #key):find("^[%s%]\"']*=") then return n end
  end
end

local function is_option(k)
  return M.defaults[k] ~= nil or OPTIONAL[k] ~= nil
end

---Load the user config file: nil when there is none at the default place;
---raises on a broken file, and on a file named by `path` or
---`$MIRZA_CONFIG` that cannot be read (a config error must not be silently
---ignored; `MIRZA_CONFIG=/dev/null`, an empty file, means no settings).
---The file runs sandboxed: an empty environment (no `os`, `io`,
---`require`...), so it can only return plain values. Its keys are checked
---here, an unknown one reported with the file and line.
---@param path? string
---@return table|nil
function M.config_file(path)
  local named = path and "config_file" or (os.getenv("MIRZA_CONFIG") or "") ~= "" and "$MIRZA_CONFIG"
  path = path or named and os.getenv("MIRZA_CONFIG")
  if not path then
    local home = os.getenv("HOME")
    path = home and (os.getenv("XDG_CONFIG_HOME") or home .. "/.config") .. "/mirza/config.lua"
  end
  local f, why
  if path then f, why = io.open(path) end
  if not f then
    if not named then return nil end
    error(("mirza config: %s names a file that cannot be read (%s): fix the path, or unset it to use no config file")
      :format(named, why), 0)
  end
  local text = f:read("a") or ""
  f:close()
  if not text:find("%S") then return {} end
  local chunk, err = load(text, "@" .. path, "t", {})
  if not chunk then error("mirza config: " .. err, 0) end
  local ok, t = pcall(chunk)
  if not ok and require("mirza.pipeline").passes(t) and type(t) == "string" then error(t, 0) end -- Ctrl-C
  if not ok then
    local hint = tostring(t):find("global '", 1, true) and " (the config file runs sandboxed: no globals such as "
        .. "os, io or require; return plain values)" or ""
    error(("mirza config %s: %s%s"):format(path, tostring(t), hint), 0)
  end
  if type(t) ~= "table" then
    error(("mirza config %s: must return a table of options, got %s"):format(path, type(t)), 0)
  end
  for k in pairs(t) do
    if not is_option(k) then
      local line = type(k) == "string" and line_of(text, k)
      error(("mirza config %s%s: unknown option %q: fix or remove it (the options: docs/engine.md)"):format(path,
        line and (":" .. line) or "", tostring(k)), 0)
    end
  end
  return t
end

local function check_keys(t, level)
  for k in pairs(t or {}) do
    if not is_option(k) then
      error(("mirza.engine: unknown option %q"):format(tostring(k)), level)
    end
  end
end

-- scheme, host, port of a base URL ("[::1]" kept bracketed for URLs).
local function parse_url(url)
  local scheme, rest = url:match("^(https?)://(.*)$")
  if not scheme then
    error(("mirza.engine: base_url must be http(s)://..., got %q"):format(require("mirza.record").redact_text(url)), 4)
  end
  local authority = rest:match("^[^/?#]*")
  local hostport = authority:match("^.*@(.*)$") -- after the userinfo (user:pass@), its last '@'
  if hostport then rest = hostport .. rest:sub(#authority + 1) end
  local host, port = rest:match("^(%[[^%]]+%]):?(%d*)")
  if not host then host, port = rest:match("^([^/:]+):?(%d*)") end
  return scheme, host, tonumber(port) or (scheme == "https" and 443 or 80)
end

-- Where the engine talks, and whether it supervises a daemon there.
local function resolve_endpoint(cfg)
  if cfg.endpoints or cfg.pool then -- a pool: endpoints used as they are, the first one the base
    if cfg.daemon == nil then cfg.daemon = false end
    local first = cfg.pool and cfg.pool.endpoints[1].base or cfg.endpoints[1]
    if type(first) == "table" then first = first.url end
    if type(first) ~= "string" then error("mirza.engine: endpoints needs at least one base URL", 4) end
    cfg.base_url = first
  end
  if cfg.base_url then
    cfg.base_url = cfg.base_url:gsub("/+$", "")
    local scheme, host, port = parse_url(cfg.base_url)
    cfg.host, cfg.port = host, port
    local remote = scheme == "https" or not require("mirza.daemon").is_loopback(host)
    if cfg.daemon == nil and remote then cfg.daemon = false end
  end
  if cfg.daemon == true then cfg.daemon = nil end
end

---The API key as `mirza batch` and the engine take it: the first of
---`given` (an option, the config file), `$MIRZA_API_KEY`, `$OPENAI_API_KEY`
---that is not empty; nil when none is.
---@param given? string
---@param env? fun(name: string): string|nil default os.getenv
---@return string|nil
function M.api_key(given, env)
  env = env or os.getenv
  for _, v in ipairs { given or "", env("MIRZA_API_KEY") or "", env("OPENAI_API_KEY") or "" } do
    if v ~= "" then return v end
  end
  return nil
end

---Resolve the configuration (defaults < config file < opts < environment;
---`$OPENAI_API_KEY` is the key only when no other gives one: `api_key`).
---@param opts? table
---@param env? fun(name: string): string|nil default os.getenv
---@return table cfg
function M.config(opts, env)
  env = env or os.getenv
  check_keys(opts, 4)
  local cfg = merge({}, M.defaults)
  local given = {} -- what the user set: file, code or environment (not a default)
  local path = opts and opts.config_file
  if path ~= false then merge(given, merge({}, M.config_file(type(path) == "string" and path or nil))) end
  merge(given, opts)
  merge(cfg, given)
  for name, spec in pairs(M.ENV) do
    local v = env(name)
    if v and v ~= "" then cfg[spec[1]], given[spec[1]] = coerce(v, spec[2], name), true end
  end
  cfg.api_key = M.api_key(cfg.api_key, env) -- $MIRZA_API_KEY is in already: it beats the code's
  local hold = cfg.hold
  if hold ~= false and not (type(hold) == "number" and hold >= 0 and hold <= 60) then -- NaN fails too
    error(("mirza.engine: 'hold' must be seconds from 0 to 60, or false, got %s"):format(tostring(hold)), 3)
  end
  resolve_endpoint(cfg)
  -- No preset asked for: what answers is detected (Engine:load).
  cfg._detect = given.preset == nil and given.daemon ~= true and not (type(cfg.daemon) == "table" and cfg.daemon.preset)
      or nil
  cfg._given_port = (given.port ~= nil or given.base_url ~= nil) or nil
  cfg._given_dialect = given.dialect ~= nil or nil
  -- a preset's default model only for a daemon we supervise: an endpoint
  -- used as is serves what it serves (see Engine:model)
  if cfg.model == nil and cfg.daemon ~= false then
    cfg.model = M.preset_models[cfg.preset]
    cfg._default_model = cfg.model ~= nil or nil
  end
  cfg.dialect = cfg.dialect or ((cfg.preset == "llama-server" or cfg.preset == "vllm") and "llama") or
      (type(cfg.daemon) == "table" and cfg.daemon.dialect) or "mtplx"
  cfg.session_id = cfg.session_id or M.new_session_id()
  return cfg
end

---A fresh session id ("mirza-<random>").
---@return string
function M.new_session_id()
  return ("mirza-%08x%04x"):format(math.random(0, 0x7fffffff), math.random(0, 0xffff))
end

-- Presets whose daemon has a port of its own (Ollama's 11434, vLLM's
-- 8000), used unless a port or base URL was given.
local own_port = { ollama = true, vllm = true }

---The options of the supervisor (mirza.daemon) of a supervised endpoint.
---@param cfg table a resolved configuration
---@return table
function M.daemon_options(cfg)
  local port = (cfg._given_port or not own_port[cfg.preset]) and cfg.port or nil
  return merge({
    preset = cfg.preset, host = cfg.host, port = port, model = cfg.model, model_id = cfg.model_id,
    context_window = cfg.context_window, kv_bits = cfg.kv_bits, depth = cfg.depth, api_key = cfg.api_key,
    autostart = cfg.autostart, keep_alive = cfg.keep_alive, restart = cfg.restart,
  }, cfg.daemon)
end

return M
