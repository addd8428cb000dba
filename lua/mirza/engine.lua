--- mirza.engine: the engine object bound to one daemon — everything the
--- Python engine did (shared/seed), with its policies as reloadable Lua.
---
--- Configuration, from lowest to highest precedence: `Engine.defaults`, the
--- table passed to `new`, the user config file (`$MIRZA_CONFIG`, else
--- `~/.config/mirza/config.lua`, a Lua file returning a table), then the
--- environment (`MIRZA_BASE_URL`, `MIRZA_MODEL`, `MIRZA_API_KEY`, ...). So a
--- user can redirect any script without editing it.
---
--- A turn is a pipeline over the stream's events: source (the C stream) →
--- stats tap → repetition guard → the script's own stages. The policy
--- modules are looked up by name at the start of every turn, so a hot
--- reload applies from the next turn and a stream in flight finishes on the
--- code it started with.
local mirza = require "mirza"
local reload = require "mirza.reload"

local E = {}
local Engine = {}

---The policy modules a turn uses, looked up by name at the start of each turn.
E.policies = { "mirza.prompt", "mirza.thinking", "mirza.repetition", "mirza.route", "mirza.pipeline" }
Engine.__index = Engine

---@class mirza.EngineConfig
E.defaults = {
  preset = "mtplx",            -- daemon preset: mtplx | llama-server | mirza-sim | custom
  dialect = nil,               -- "mtplx" | "llama"; default from the preset
  host = "127.0.0.1",
  port = 8766,
  base_url = nil,              -- "http://host:port/v1"; overrides host/port
  model = "pooyakn73/Qwen3.8-9B-Distill-MTPLX-Q6G64",
  model_id = nil,              -- id the daemon serves (default: the preset's)
  autostart = true,
  context_window = 16384,
  kv_bits = 8,
  depth = 3,                   -- MTP draft depth
  session_id = nil,            -- default: unique per engine ("mirza-<random>")
  max_tokens = 1024,
  max_tokens_thinking = 4096,
  temperature = 0.7,
  top_p = 0.95,
  presence_penalty = 0.0,
  repetition_penalty = 1.0,
  reasoning_budget = 0,
  api_key = nil,
  keep_alive = false,          -- leave a started daemon running at exit
  stall_timeout = 120,         -- seconds without a byte (heartbeats count)
  connect_timeout = 10,
  daemon = nil,                -- extra mirza.daemon options
  repetition = nil,            -- repetition guard options (false: off)
  log = nil,                   -- function(level, message); default: stderr for warnings
  body_extra = nil,            -- fields merged into every chat request body
  auto_reload = true,          -- check watched modules for changes before each turn
}

local ENV = {
  MIRZA_BASE_URL = "base_url", MIRZA_MODEL = "model", MIRZA_MODEL_ID = "model_id",
  MIRZA_API_KEY = "api_key", MIRZA_HOST = "host", MIRZA_PORT = "port", MIRZA_PRESET = "preset",
  MIRZA_SESSION_ID = "session_id", MIRZA_DIALECT = "dialect", MIRZA_CONTEXT_WINDOW = "context_window",
  MIRZA_MAX_TOKENS = "max_tokens", MIRZA_TEMPERATURE = "temperature", MIRZA_AUTOSTART = "autostart",
}

local function coerce(v, like)
  if type(like) == "number" then return tonumber(v) end
  if type(like) == "boolean" then return v == "1" or v == "true" or v == "yes" end
  return v
end

local function merge(into, from)
  for k, v in pairs(from or {}) do into[k] = v end
  return into
end

---Load the user config file: nil when absent, raises on a broken file
---(a config error must not be silently ignored).
---@param path? string
---@return table|nil
function E.config_file(path)
  path = path or os.getenv("MIRZA_CONFIG")
  if not path then
    local home = os.getenv("HOME")
    path = home and (os.getenv("XDG_CONFIG_HOME") or home .. "/.config") .. "/mirza/config.lua"
  end
  if not path or not io.open(path) then return nil end
  local chunk, err = loadfile(path, "t", {})
  if not chunk then error("mirza config: " .. err, 0) end
  local ok, t = pcall(chunk)
  if not ok or type(t) ~= "table" then error("mirza config " .. path .. ": " .. tostring(t), 0) end
  return t
end

---Resolve the configuration (defaults < opts < config file < environment).
---@param opts? table
---@param env? fun(name: string): string|nil default os.getenv
---@return table cfg
function E.config(opts, env)
  env = env or os.getenv
  local cfg = merge(merge({}, E.defaults), opts)
  for k in pairs(opts or {}) do
    if E.defaults[k] == nil and not ({ preset = 1, dialect = 1, base_url = 1, model_id = 1, session_id = 1,
      api_key = 1, daemon = 1, repetition = 1, log = 1, system_prompt = 1, config_file = 1,
      body_extra = 1 })[k] then
      error(("mirza.engine: unknown option %q"):format(k), 3)
    end
  end
  if cfg.config_file ~= false then merge(cfg, E.config_file(cfg.config_file)) end
  for name, key in pairs(ENV) do
    local v = env(name)
    if v and v ~= "" then cfg[key] = coerce(v, E.defaults[key]) end
  end
  if cfg.base_url then
    local host, port = cfg.base_url:match("^https?://([^/:]+):?(%d*)")
    cfg.host, cfg.port = host or cfg.host, tonumber(port) or cfg.port
  end
  cfg.dialect = cfg.dialect or ((cfg.preset == "llama-server") and "llama") or
      (cfg.daemon and cfg.daemon.dialect) or "mtplx"
  cfg.session_id = cfg.session_id or ("mirza-%08x%04x"):format(math.random(0, 0x7fffffff), math.random(0, 0xffff))
  return cfg
end

---Create an engine (does not contact the daemon: see `load`).
---@param opts? table see `Engine.defaults`
---@return mirza.Engine
function E.new(opts)
  local cfg = E.config(opts)
  local thinking = require "mirza.thinking"
  local self = setmetatable({
    cfg = cfg,
    loaded = false,
    history = require("mirza.prompt").history(),
    thinking = thinking.state(cfg.reasoning_budget),
    last = nil,           -- stats of the last turn
    live_tok_s = nil,     -- during a turn, from mtplx_progress
    watcher = mirza.watcher(),
    stages = {},          -- the script's own stages (pipeline specs)
  }, Engine)
  self.daemon = mirza.daemon(merge({
    preset = cfg.preset, host = cfg.host, port = cfg.port, model = cfg.model, model_id = cfg.model_id,
    context_window = cfg.context_window, kv_bits = cfg.kv_bits, depth = cfg.depth, api_key = cfg.api_key,
    autostart = cfg.autostart, keep_alive = cfg.keep_alive,
  }, cfg.daemon))
  -- Policies loaded from disk (--lua-dir / MIRZA_LUA_DIR) are watched too;
  -- embedded ones have no file to watch.
  for _, name in ipairs(E.policies) do
    if not package.preload[name] then reload.watch(self.watcher, name) end
  end
  self.base_url = cfg.base_url or self.daemon.base_url
  self.chat_url = self.base_url .. "/chat/completions"
  self.root_url = self.base_url:gsub("/v1/*$", "")
  return self
end

---@class mirza.Engine
---@field cfg table
---@field daemon mirza.Daemon
---@field history table the conversation (assistant turns without reasoning)
---@field thinking table the thinking state (mirza.thinking)
---@field last table|nil stats of the last turn
---@field loaded boolean

function Engine:log(level, msg)
  if self.cfg.log then return self.cfg.log(level, msg) end
  if level ~= "debug" and level ~= "info" then io.stderr:write("mirza: ", msg, "\n") end
end

-- Headers every request carries: the session, client controls (harmless
-- everywhere, needed by MTPLX <= 2.5.2 to honour sampling/thinking).
function Engine:headers()
  return {
    ["X-MTPLX-Session-Id"] = self.cfg.session_id,
    ["X-MTPLX-Allow-Client-Controls"] = "1",
  }
end

---Make sure the daemon serves: adopt a healthy one, else start it (when
---autostart), else fail with a connection error naming the URL. Then
---prefill the system prompt if given.
---@param system_prompt? string
---@return boolean|nil ok
---@return string? message
---@return string? code
function Engine:load(system_prompt)
  if not self.loaded then
    local ok, msg, code
    if self.daemon:healthy() then
      ok, msg, code = self.daemon:start() -- adopts
    elseif self.cfg.autostart then
      ok, msg, code = self.daemon:start()
    else
      return nil, ("the daemon is not reachable at %s"):format(self.base_url), "refused"
    end
    if not ok then return nil, msg, code end
    self.loaded = true
    self:log("info", ("daemon ready on %s (%s)"):format(self.base_url, self.daemon.adopted and "adopted" or "started"))
  end
  if system_prompt then
    self.system_prompt = system_prompt
    require("mirza.prompt").set_system(self.history, system_prompt)
    self:prefill(system_prompt)
  end
  return true
end

---Warm the session's KV cache with the system prompt: a one-token,
---non-streamed request. Failures are logged, not raised.
---@param system_prompt? string
---@return number|nil ms duration, or nil when it failed
---@return string? message
function Engine:prefill(system_prompt)
  system_prompt = system_prompt or self.system_prompt
  if not system_prompt or system_prompt == "" then return nil, "no system prompt" end
  local t0 = mirza.now()
  local body = {
    model = self.cfg.model_id or self.cfg.model, stream = false, max_tokens = 1, temperature = 0,
    messages = { { role = "system", content = system_prompt }, { role = "user", content = "bonjour" } },
    metadata = { session_id = self.cfg.session_id },
  }
  local res, msg = mirza.request { url = self.chat_url, body = body, headers = self:headers(),
    api_key = self.cfg.api_key, deadline = 30, timeout = self.cfg.connect_timeout }
  if not res then
    self:log("debug", "prefill failed: " .. msg)
    return nil, msg
  end
  local ms = (mirza.now() - t0) * 1000
  self:log("info", ("prefill done in %.1f ms"):format(ms))
  return ms
end

---@param on boolean thinking on (the default budget, 1024) or off
function Engine:set_thinking(on)
  require("mirza.thinking").set_thinking(self.thinking, on)
end

---@param budget integer tokens (clamped at 0; 0 turns thinking off)
function Engine:set_reasoning_budget(budget)
  require("mirza.thinking").set_budget(self.thinking, budget)
end

---Drop the daemon's RAM sessions (POST /admin/cache/clear, 1 s). Not an
---error when it fails: the next turn is just cold.
---@return boolean ok
---@return string? message
function Engine:clear_cache()
  local res, msg = mirza.request { url = self.root_url .. "/admin/cache/clear", method = "POST",
    api_key = self.cfg.api_key, deadline = 1, timeout = 1 }
  if not res then self:log("debug", "cache clear skipped: " .. msg) end
  return res ~= nil, msg
end

---Stop the daemon (started or adopted) and mark the engine unloaded.
function Engine:unload()
  self.daemon:stop()
  self.loaded = false
end

---Reload changed policy and behaviour modules (validate, then swap).
---@return string[] reloaded
---@return table<string,string> failed name -> error (old versions kept)
function Engine:reload()
  return reload.check(self.watcher)
end

---Watch a module for hot reload (a policy `mirza.route`, when loaded from
---disk, or the script's own behaviour module).
---@param name string
---@param path? string
function Engine:watch(name, path)
  return reload.watch(self.watcher, name, path)
end

-- The request body of one turn.
function Engine:body(messages, plan)
  local cfg = self.cfg
  local body = {
    model = cfg.model_id or cfg.model, messages = messages, stream = true,
    max_tokens = plan.max_tokens, temperature = cfg.temperature, top_p = cfg.top_p,
    presence_penalty = cfg.presence_penalty,
    stream_options = { include_usage = true },
  }
  if cfg.dialect == "llama" then
    body.repeat_penalty = cfg.repetition_penalty
  else
    body.metadata = { session_id = cfg.session_id }
  end
  return merge(merge(body, plan.fields), cfg.body_extra)
end

-- ------------------------------------------------------------ stats

---A fresh stats accumulator for one turn.
---@return table acc
function E.new_acc()
  return { t0 = mirza.now(), deltas = 0, chars = 0, first = nil }
end

---Account one event (the stats tap calls it for every event).
---@param acc table
---@param ev table
function E.observe(acc, ev)
  local t = ev.type
  if t == "text" or t == "think" then
    acc.first = acc.first or mirza.now()
    acc.deltas = acc.deltas + 1
    acc.chars = acc.chars + #ev.text
  elseif t == "progress" then
    if ev.decode_tok_s then acc.live_tok_s = ev.decode_tok_s end
  elseif t == "done" or t == "error" then
    acc.t1 = mirza.now()
    acc.final = ev
  end
end

-- Sum of an array of numbers (MTP acceptance by depth).
local function sum(a)
  local n = 0
  for _, v in ipairs(type(a) == "table" and a or {}) do n = n + (tonumber(v) or 0) end
  return n
end

---The seed's per-turn figures, server figures preferred:
---ttft_ms (mtplx_stats.ttft_s, llama timings.prompt_ms, else first token,
---else the whole duration), tok_s (mtplx decode_tok_s, then tok_s, llama
---predicted_per_second, else tokens / decode time), tokens
---(usage.completion_tokens, else counted deltas, else chars / 4),
---kv_tokens (prompt_tokens + completion), plus cached_tokens and the MTP
---acceptance rate when the server reports them.
---@param acc table
---@return table stats
function E.stats(acc)
  local fin = acc.final or {}
  local st, tm, us = fin.stats or {}, fin.timings or {}, fin.usage or {}
  local t1 = acc.t1 or mirza.now()
  local total = t1 - acc.t0
  local ttft = (st.ttft_s and st.ttft_s * 1000) or tm.prompt_ms
      or (acc.first and (acc.first - acc.t0) * 1000) or total * 1000
  local tokens = us.completion_tokens or tm.predicted_n
  if not tokens or tokens == 0 then tokens = acc.deltas > 0 and acc.deltas or acc.chars // 4 end
  local speed = st.decode_tok_s or st.tok_s or tm.predicted_per_second
  if not speed or speed <= 0 then
    local dt = acc.first and (t1 - acc.first) or total
    speed = dt > 0 and tokens / dt or 0
  end
  local drafted = sum(st.drafted_by_depth)
  local cached = (us.prompt_tokens_details or {}).cached_tokens or tm.cache_n or st.cached_tokens
  return {
    ttft_ms = math.floor(ttft * 10 + 0.5) / 10,
    tok_s = math.floor(speed * 10 + 0.5) / 10,
    live_tok_s = acc.live_tok_s,
    tokens = tokens,
    prompt_tokens = us.prompt_tokens or tm.prompt_n,
    kv_tokens = (us.prompt_tokens or 0) + tokens,
    cached_tokens = cached,
    mtp_acceptance = drafted > 0 and sum(st.accepted_by_depth) / drafted or nil,
    duration_s = total,
    finish_reason = fin.finish_reason,
    error = fin.type == "error" and fin.code or nil,
  }
end

-- ------------------------------------------------------------ turns

-- The stats tap: observes every event, records the stats at the end and
-- keeps the answer text for the history.
local function tap_stage(self, acc, answer)
  return function(up)
    return function()
      local ev = up()
      if ev then
        E.observe(acc, ev)
        if ev.type == "progress" and ev.decode_tok_s then self.live_tok_s = ev.decode_tok_s end
        if ev.type == "text" then answer[#answer + 1] = ev.text end
      end
      return ev
    end
  end
end

---Start one turn. Returns an event iterator (the composed pipeline: stats
---tap, repetition guard, the script's stages), and the stream (already
---open). The history is updated when the turn ends with "done" (assistant
---text only, no reasoning, so the daemon's prefix cache hits).
---@param input string|table a prompt string, a message list, or a JSON message list
---@param opts? {stages?: table, budget?: integer}
---@return (fun(): table|nil)|nil iter
---@return mirza.Stream|string stream_or_message
---@return string? code
function Engine:turn(input, opts)
  opts = opts or {}
  if not self.loaded then
    local ok, msg, code = self:load()
    if not ok then return nil, msg, code end
  end
  if self.cfg.auto_reload then self:reload() end -- between turns only
  local prompt, thinking, pipeline = require "mirza.prompt", require "mirza.thinking", require "mirza.pipeline"
  local user, err = prompt.messages(input)
  if not user then return nil, err, "prompt" end
  local text = prompt.last_user_text(user)
  local plan = thinking.plan(self.thinking, text, self.cfg.dialect,
    { max_tokens = self.cfg.max_tokens, max_tokens_thinking = self.cfg.max_tokens_thinking })
  if opts.budget then plan.budget = opts.budget end
  local messages, info, code = prompt.build(self.history, input,
    { context_window = self.cfg.context_window, reserve = plan.max_tokens })
  if not messages then return nil, info, code end
  if not info.fits then self:log("warning", "the prompt does not fit the context window even alone") end
  local s = mirza.open { url = self.chat_url, body = self:body(messages, plan), headers = self:headers(),
    api_key = self.cfg.api_key, stall_timeout = self.cfg.stall_timeout, timeout = self.cfg.connect_timeout }
  local acc, answer = E.new_acc(), {}
  self.live_tok_s = nil
  local stages = { { name = "stats", fn = tap_stage(self, acc, answer) } }
  if self.cfg.repetition ~= false then
    local rep = require "mirza.repetition"
    local ropts = merge({ on_cut = function(info)
      self:log("warning", ("degenerate reasoning cut on %q (%d repetitions)"):format(info.line, info.count))
      s:close()
    end }, self.cfg.repetition)
    stages[#stages + 1] = { name = "repetition", fn = rep.stage, opts = ropts }
  end
  for _, st in ipairs(self.stages) do stages[#stages + 1] = st end
  for _, st in ipairs(opts.stages or {}) do stages[#stages + 1] = st end
  local source = function()
    if s:closed() then return nil end
    return s:next()
  end
  local it = pipeline.compose(source, stages)
  local finished = false
  return function()
    if finished then return nil end
    local ev = it()
    if ev == nil then
      finished = true
      acc.t1 = acc.t1 or mirza.now()
      self.last = E.stats(acc)
      if acc.final and acc.final.type == "done" then
        prompt.add_turn(self.history, info.current, table.concat(answer))
      end
      s:close()
    end
    return ev
  end, s
end

---Run a turn to the end with output routing (mirza.route): the think and
---answer channels to their sinks, errors to the error sink (never into
---the answer). Returns the stats.
---@param input string|table
---@param sinks? table route options: {think=, answer=, error=, mode="token"|"sentence"|"whole"}
---@return table|nil stats `Engine.stats` of the turn
---@return table|string result route result {answer, think, error, cut, ...}, or the error message
---@return string? code
function Engine:say(input, sinks)
  local it, s, code = self:turn(input)
  if not it then return nil, s, code end
  local result = require("mirza.route").run(it, sinks or {})
  return self.last, result
end

return setmetatable(E, { __index = Engine })
