--- mirza.engine: the engine object bound to one daemon — everything the
--- Python engine it replaces did, with its policies as reloadable Lua.
---
--- Configuration (mirza.config), from lowest to highest precedence:
--- `engine.defaults`, the user config file (`$MIRZA_CONFIG`, else
--- `~/.config/mirza/config.lua`), the table passed to `new`, then the
--- environment (`MIRZA_BASE_URL`, `MIRZA_MODEL`, `MIRZA_API_KEY`, ...).
---
--- Endpoints: with a preset asked for (`preset`, `MIRZA_PRESET`, the config
--- file, `daemon = {preset=}`), a loopback `http://` daemon is supervised
--- (`mirza.daemon`: adopted when healthy, else started). Without one, `load`
--- first asks what answers (mirza.detect: MTPLX, llama-server, Ollama, vLLM,
--- any /v1/models) and uses it as it is in its dialect, its model the one
--- it reports (`e.detected`); only when nothing answers, and the engine
--- runs on its defaults (no `base_url`), is the default preset started
--- (autostart). `daemon = false` — the default for an `https://` or
--- non-loopback `base_url`, and for a pool's endpoints — uses the endpoint
--- as it is: no spawn, no pid, health optional, API key sent, TLS
--- verified; it is probed once all the same, whatever model was named, and
--- driven in the dialect of what answers (plain OpenAI when nothing tells).
---
--- A turn is a pipeline over the stream's events: source (the C stream,
--- with a dead daemon diagnosed) → think-tag splitter → stats tap →
--- repetition guard → the script's stages → the turn's stages. The policy
--- modules are looked up by name at the start of every turn, so a hot
--- reload applies from the next turn and a stream in flight finishes on the
--- code it started with. The turn logic lives in mirza.turn.
local mirza = require "mirza"
local reload = require "mirza.reload"
local stats = require "mirza.stats"

local E = {}
local Engine = {}

---The policy modules a turn uses, looked up by name at the start of each turn.
E.policies = { "mirza.prompt", "mirza.thinking", "mirza.repetition", "mirza.route", "mirza.pipeline",
  "mirza.thinktags" }
Engine.__index = Engine

local config = require "mirza.config"
-- The configuration (mirza.config), under the engine's names.
E.preset_models, E.defaults, E.ENV = config.preset_models, config.defaults, config.ENV
E.config, E.config_file, E.new_session_id = config.config, config.config_file, config.new_session_id
local merge = require("mirza.util").merge
local resolve = require("mirza.url").resolve

---Create an engine (does not contact the daemon: see `load`). With
---`history = path` it continues the conversation saved there (`e:save`,
---mirza.conversation): a file that cannot be read or is not a whole
---conversation gives nil, message, "io"|"history".
---@param opts? mirza.EngineOptions (_meta_lua.lua; the defaults: `Engine.defaults`)
---@return mirza.Engine|nil engine
---@return string? message
---@return string? code "io"|"history"
function E.new(opts)
  local saved -- the conversation of `history = path`, read before anything is set up
  if type(opts) == "table" and opts.history ~= nil then
    if type(opts.history) ~= "string" then error("mirza.engine: 'history' must be a file path (string)", 2) end
    local msg, code
    saved, msg, code = require("mirza.conversation").read(opts.history)
    if not saved then return nil, msg, code end
    opts = require("mirza.util").copy(opts)
    opts.history = nil
  end
  local cfg = E.config(opts)
  local self = setmetatable({
    cfg = cfg,
    loaded = false,
    history = require("mirza.prompt").history(),
    thinking = require("mirza.thinking").state(cfg.reasoning_budget),
    last = nil,           -- stats of the last turn
    live_tok_s = nil,     -- during a turn, from mtplx_progress
    watcher = mirza.watcher(),
    stages = {},          -- the script's own stages (pipeline specs)
  }, Engine)
  if cfg.daemon ~= false then self.daemon = mirza.daemon(config.daemon_options(cfg)) end
  -- Policies loaded from disk (--lua-dir / MIRZA_LUA_DIR) are watched too;
  -- embedded ones have no file to watch.
  for _, name in ipairs(E.policies) do
    if not package.preload[name] then reload.watch(self.watcher, name, nil, { load = false }) end
  end
  if type(cfg.tools) == "string" then reload.watch(self.watcher, cfg.tools, nil, { load = false }) end
  if cfg.pool or cfg.endpoints then self.pool = cfg.pool or require("mirza.pool").new(cfg.endpoints) end
  self:_set_base((self.pool and self.pool.endpoints[1].url) or cfg.base_url or (self.daemon and self.daemon.url)
      or ("http://%s:%d"):format(cfg.host, cfg.port))
  if cfg.system_prompt then -- as e:load(prompt) sets it (load prefills it too)
    self.system_prompt = cfg.system_prompt
    require("mirza.prompt").set_system(self.history, cfg.system_prompt)
  end
  if saved then require("mirza.conversation").apply(self, saved, opts.session_id ~= nil) end
  return self
end

---Save the conversation (history, session id, thinking budget, model,
---`conversation_name`) to `path` as JSON, atomically (a temporary file
---renamed over it): mirza.conversation, docs/engine.md.
---@param path string
---@return true|nil ok
---@return string? message
---@return string? code "io"
function Engine:save(path)
  return require("mirza.conversation").save(self, path)
end

---Where the next request goes (a pool's engine follows its endpoint): the
---endpoint as written, of which mirza.url's rule makes the base URL and
---each request's URL (`self._url` kept for the other routes).
---@param url string "http://h:p", "http://h:p/v1", a route's URL, a query string kept
function Engine:_set_base(url)
  self._url = url
  self.chat_url, self.base_url = resolve(url, "chat")
end

---@class mirza.Engine
---@field cfg table
---@field daemon mirza.Daemon|nil nil when the endpoint is used as is (`daemon = false`)
---@field pool mirza.Pool|nil the endpoints of `endpoints =` or `pool =` (mirza.pool), if any
---@field base_url string where the next request goes (with a pool: the last turn's endpoint)
---@field history table the conversation (assistant turns without reasoning)
---@field thinking table the thinking state (mirza.thinking)
---@field last mirza.TurnStats|nil stats of the last turn
---@field stages (mirza.StageSpec|mirza.StageFn)[] the script's own stages: every turn runs them after the built-in ones
---@field system_prompt string|nil the system prompt (`load`, `system_prompt`)
---@field loaded boolean
---@field served_model string|nil the id an unsupervised endpoint serves (from /v1/models)
---@field conversation_name string|nil the conversation's name: saved with it (`e:save`) and in the run log
---@field conversation table|nil what `history = path` resumed: `{name, model, saved_at, messages}`
---@field detected mirza.Detected|nil what load() found answering (no preset asked for, or an endpoint used as is
---without a model): `{kind = "llama-server", model = "qwen3", via = "/props", dialect = "llama", ...}`

---Log through the engine's `log` option, else to stderr (notice and up).
---URL credentials in the message are redacted first.
---@param level "debug"|"info"|"notice"|"warning"|"error"
---@param msg string
function Engine:log(level, msg)
  if type(msg) == "string" then msg = require("mirza.record").redact_text(msg) end -- no URL credentials
  if self.cfg.log then return self.cfg.log(level, msg) end
  if level ~= "debug" and level ~= "info" then io.stderr:write("mirza: ", msg, "\n") end
end

-- fn(...) with the library's warnings (`mirza.on_warning`: a credential
-- over plain http to another machine, said once per Lua state) in the
-- engine's `log` as "warning", when it has one and the script does not
-- route them itself; else they go where they went (stderr).
function Engine:_with_warnings(fn, ...)
  if not self.cfg.log then return fn(...) end
  local core = require "mirza.core"
  local prev = core.on_warning(function(m) self:log("warning", m) end)
  if prev then -- the script's own handler keeps them
    core.on_warning(prev)
    return fn(...)
  end
  local res = table.pack(pcall(fn, ...))
  core.on_warning(nil)
  if not res[1] then error(res[2], 0) end
  return table.unpack(res, 2, res.n)
end

---Headers every request carries in the MTPLX dialect: the session, client
---controls (needed by MTPLX <= 2.5.2 to honour sampling/thinking). None in
---the others: a server that is not MTPLX has no use for them.
---@return table<string, string>
function Engine:headers()
  if self.cfg.dialect ~= "mtplx" then return {} end
  return {
    ["X-MTPLX-Session-Id"] = self.cfg.session_id,
    ["X-MTPLX-Allow-Client-Controls"] = "1",
  }
end

---The `model` sent: `model_id`, else the id the supervised daemon serves
---the model as, else what an endpoint used as is reports (`e.detected`:
---MTPLX /health, the first id of /v1/models, llama-server /props), else
---`model`.
---@return string|nil
function Engine:model()
  local cfg = self.cfg
  return cfg.model_id or (self.daemon and self.daemon.model_id) or self.served_model or cfg.model
end

-- What answers at `base` (mirza.detect), waiting while it loads within
-- the daemon settings' deadline (`wait` = 0: not at all), with their
-- progress; an endpoint used as is with a remote call's timeouts.
function Engine:_probe(base, remote, wait)
  local d = type(self.cfg.daemon) == "table" and self.cfg.daemon or {}
  return self:_with_warnings(require("mirza.detect").detect, base, { api_key = self.cfg.api_key,
    wait = wait or d.deadline, poll_interval = d.poll_interval, progress = d.progress,
    timeout = remote and self.cfg.connect_timeout or nil, deadline = remote and 10 or nil })
end

-- Use what was found as it is: its model (unless one was given; a pool's
-- endpoint that tells none keeps the last one's), its dialect (unless
-- given); a preset's default model does not
-- apply. A server that turns every probe away (401/403) is an error
-- saying so.
function Engine:_use(found)
  local cfg = self.cfg
  if found.denied then
    return nil, ("%s answers %d to every request: %s (MIRZA_API_KEY)"):format(self.base_url, found.denied,
      cfg.api_key and "check api_key, the server does not take it" or "give api_key the server's key"), "http"
  end
  self.detected, self._unprobed = found, nil
  if cfg._default_model then cfg.model, cfg._default_model = nil, nil end
  if not cfg.model_id and not cfg.model then self.served_model = found.model or self.served_model end
  if not cfg._given_dialect then cfg.dialect = found.dialect end
  return true
end

-- What an endpoint used as is answered, for the engines of this process
-- (a thousand engines on one URL made together probe it once): kept
-- PROBE_KEEP seconds, short enough that a daemon restarted as another
-- server is probed again.
local PROBE_KEEP = 2
local probes = {}

local function recent_probe(base, key)
  local p = probes[base .. "\0" .. (key or "")]
  if p and mirza.now() - p.at < PROBE_KEEP then return p.found end
end

local function remember_probe(base, key, found)
  probes[base .. "\0" .. (key or "")] = { found = found, at = mirza.now() }
end

-- An endpoint used as is: probed once (its answer is kept in `_found`,
-- under the endpoint as written: `url`), then driven as what
-- answered. A probe that found nothing usable — no answer, or a server
-- still loading (asked again at its next use) — leaves plain OpenAI (or
-- the dialect given): never MTPLX's fields to a server that did not say it
-- was MTPLX. At load a server refusing every probe (401/403) is an error;
-- at a turn (a pool's endpoint used for the first time) the request says.
-- `wait`: seconds a loading server is waited for (nil: the daemon settings').
function Engine:_as_is(url, wait)
  self._found = self._found or {}
  local f = self._found[url]
  if f and f == self._used and not f.again then return true end
  if not f or f.again then
    local found, msg, code = recent_probe(url, self.cfg.api_key)
    if not found then
      found, msg, code = self:_probe(url, true, wait)
      if found and not found.loading then remember_probe(url, self.cfg.api_key, found) end
    end
    if found and found.loading then
      found, msg, code = nil, resolve(url, "/health") .. " answers 503 (loading)", "loading"
    end
    f = found or { failed = msg, again = code == "refused" or code == "loading" or nil }
    self._found[url] = f
  end
  self._used = f
  if not f.failed then return self:_use(f) end
  self.detected, self._unprobed = nil, f.failed
  if not self.cfg._given_dialect then self.cfg.dialect = "openai" end
  return true
end

-- No preset asked for: use what answers, unsupervised; when nothing does,
-- start the default preset (autostart) — only on the engine's defaults:
-- a `base_url` the user gave is never started on — or say what to do.
function Engine:_detect_or_start()
  local base = self.base_url
  local found, msg, code = self:_probe(self._url, false)
  if found then
    self.daemon = nil -- nothing started, nothing to stop on close
    self._found = { [self._url] = found }
    self._used = found
    return self:_use(found)
  end
  if code ~= "refused" then return nil, msg, code end
  local start = "or set preset = \"mtplx\" (or \"llama-server\", \"ollama\", \"vllm\"; MIRZA_PRESET) "
      .. "to let mirza start one"
  if self.cfg.base_url then
    return nil, ("nothing answers at %s: start your daemon there, correct base_url (MIRZA_BASE_URL), %s")
        :format(base, start), "refused"
  end
  local todo = ("nothing answers at %s: start your daemon, %s"):format(base, start)
  if not self.cfg.autostart then return nil, todo, "refused" end
  local ok, err, ecode = self.daemon:start()
  if not ok and ecode == "spawn" then return nil, ("%s (%s)"):format(todo, err), ecode end
  return ok, err, ecode
end

-- Reach the endpoint: detect, adopt or start; an endpoint used as is is
-- probed once, whatever model was named (a server that tells nothing is
-- used all the same, in plain OpenAI).
function Engine:_connect()
  if self.daemon and self.cfg._detect then return self:_detect_or_start() end
  if self.daemon then return self.daemon:start() end
  return self:_as_is(self._url)
end

---One line saying what the engine talks to, e.g. `http://127.0.0.1:8080/v1:
---llama-server (model 'qwen3', via /props), used as is (llama dialect)`.
---Printed on stderr by load() with `verbose = true` (`MIRZA_VERBOSE=1`).
---@return string
function Engine:describe()
  local what, model = "used as is", self:model()
  if self.detected then
    what = require("mirza.detect").describe(self.detected) .. ", used as is"
    if model == self.detected.model then model = nil end
  elseif self._unprobed then
    what = ("nothing told what answers (%s), used as is"):format(self._unprobed)
  elseif self.daemon then
    local d = self.daemon
    what = ("%s daemon %s%s"):format(d.preset, d.adopted and "adopted" or d._proc and "started" or "not started",
      d.pid and (" (pid %d)"):format(d.pid) or "")
  end
  return ("%s: %s (%s dialect%s)"):format(self.base_url, what, self.cfg.dialect,
    model and (", model sent: " .. model) or "")
end

---Make sure the endpoint serves: with no preset asked for, what answers is
---detected and used as is (`e.detected`; a server loading its model, 503,
---is waited for), and only when nothing answers is the default preset
---started (autostart; off: `nil, "nothing answers at URL: ...", "refused"`).
---A supervised daemon is adopted when healthy, waited for while loading,
---else started (when autostart) or reported; an unsupervised endpoint is
---used as is. With `verbose`, one line (`e:describe()`) goes to stderr.
---Then the system prompt, if given (else, at the first load, the
---`system_prompt` option), is set and prefilled.
---@param system_prompt? string
---@return boolean|nil ok
---@return string? message
---@return string? code
function Engine:load(system_prompt)
  if not self.loaded then
    local ok, msg, code = self:_connect()
    if not ok then return nil, msg, code end
    self.loaded = true
    local how = not self.daemon and "used as is" or self.daemon.adopted and "adopted" or "started"
    self:log("info", ("daemon ready on %s (%s)"):format(self.base_url, how))
    if self.cfg.verbose then self:log("notice", self:describe()) end
  end
  if system_prompt == nil and not self._prefilled then system_prompt = self.cfg.system_prompt end
  if system_prompt then
    self._prefilled = true
    self.system_prompt = system_prompt
    require("mirza.prompt").set_system(self.history, system_prompt)
    self:prefill(system_prompt)
  end
  return true
end

---The prefill request's body: the system prompt and a short user turn,
---with the thinking fields the next turn will send (MTPLX counts a
---thinking mismatch as a `policy_mismatch` cache miss) and
---`prefill_tokens` of completion, so MTPLX treats it as a foreground
---request that warms the session rather than a background one.
---@param system_prompt string
---@return table body
function Engine:prefill_body(system_prompt)
  local th = require "mirza.thinking"
  local body = {
    model = self:model(), stream = false, max_tokens = self.cfg.prefill_tokens, temperature = 0,
    messages = { { role = "system", content = system_prompt }, { role = "user", content = "bonjour" } },
  }
  if self.cfg.dialect == "mtplx" then body.metadata = { session_id = self.cfg.session_id } end
  return merge(merge(body, th.request_fields(self.thinking, self.cfg.dialect)), self.cfg.body_extra)
end

---Warm the session's KV cache with the system prompt (non-streamed).
---Failures are logged, not raised.
---@param system_prompt? string
---@return number|nil ms duration, or nil when it failed
---@return string? message
function Engine:prefill(system_prompt)
  system_prompt = system_prompt or self.system_prompt
  if not system_prompt or system_prompt == "" then return nil, "no system prompt" end
  local t0 = mirza.now()
  local res, msg = self:_with_warnings(mirza.request, { url = self.chat_url,
    body = self:prefill_body(system_prompt), headers = self:headers(), api_key = self.cfg.api_key, deadline = 30,
    timeout = self.cfg.connect_timeout, record = self.cfg.record })
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

---Clear this engine's session on the daemon (MTPLX: POST
---/admin/sessions/{id}/clear; `{all = true}`: /admin/cache/clear, every
---session). With `{history = true}` the conversation is cleared too (the
---system prompt stays). llama-server has no such endpoint: "unsupported"
---(the history is still cleared when asked).
---@param opts? {history?: boolean, all?: boolean}
---@return boolean|nil ok
---@return string? message
---@return string? code "unsupported", or the request's error code
function Engine:clear_cache(opts)
  opts = opts or {}
  if opts.history then require("mirza.prompt").clear(self.history) end
  local kind = self.detected and self.detected.kind
  local dialect = self.cfg.dialect
  if dialect ~= "mtplx" or (kind and kind ~= "mtplx") then -- only MTPLX has the admin routes
    local what = kind == "openai" and "an OpenAI-compatible server" or kind == "unknown" and "this server" or kind
    return nil, ("%s cannot clear a session's cache"):format(what or (dialect == "llama" and "llama-server")
      or "an OpenAI-compatible server"), "unsupported"
  end
  local path = opts.all and "/admin/cache/clear"
      or ("/admin/sessions/%s/clear"):format(self.cfg.session_id:gsub("[^%w%-_.~]", function(c)
        return ("%%%02X"):format(c:byte())
      end))
  local res, msg, code = self:_with_warnings(mirza.request, { url = (resolve(self._url, path)), method = "POST",
    headers = self:headers(), api_key = self.cfg.api_key, deadline = 2, timeout = 1 })
  if not res then
    self:log("debug", "cache clear failed: " .. msg)
    return nil, msg, code
  end
  return true
end

---Start a fresh conversation: the turn in flight is cancelled, the history
---cleared, the daemon's session dropped (best effort), a new session id
---taken, and the system prompt prefilled again.
---@return boolean ok
function Engine:reset()
  self:cancel()
  if self.loaded then self:clear_cache { history = true } else require("mirza.prompt").clear(self.history) end
  self.cfg.session_id = E.new_session_id()
  if self.loaded and self.system_prompt then self:prefill() end
  return true
end

---Stop the daemon (started or adopted) and mark the engine unloaded.
---An unsupervised endpoint has nothing to stop.
---@return true|nil ok
---@return string? message why the daemon could not be stopped
---@return string? code "unowned" (an adopted daemon that is not ours to stop), "io"
function Engine:unload()
  self:cancel()
  self.loaded = false
  if not self.daemon then return true end
  return self.daemon:stop()
end

---Release the engine: stop a daemon this engine started (unless
---keep_alive), leave an adopted or unsupervised one running.
function Engine:close()
  self:cancel()
  self.loaded = false
  if self.daemon then self.daemon:close() end
end

---Reload changed policy and behaviour modules (validate, then swap); a
---failure is reported through `e:log` (one line), the old version kept.
---@return string[] reloaded
---@return table<string,string> failed name -> error (old versions kept)
function Engine:reload()
  return reload.check(self.watcher, self:_reload_report())
end

-- Where a failed reload goes: the engine's log, one line, unless the
-- script gave the watcher a handler of its own (nil: that one).
function Engine:_reload_report()
  if self.watcher.on_error ~= mirza._reload_failed then return nil end
  return function(name, msg)
    self:log("error", ("reload of %s failed, the previous version stays (fix the file: it is reloaded when it "
      .. "changes): %s"):format(name, msg))
  end
end

---Watch a module for hot reload (a policy such as `mirza.route`, a stage
---module, the script's own behaviour module) and load its file now: it is
---used from the next turn on. A file that does not load is reported
---(through `e:log`, unless the watcher has an `on_error` of the script's) and
---the current version stays (`nil, message, "reload"`; still watched, so a
---fix is picked up when the file changes). A policy version that raises
---while a turn runs is reported once through `e:log` and replaced, for
---that turn and until its file changes, by the last version that worked
---(else the built-in one): see docs/engine.md, "Hot reload".
---@param name string
---@param path? string the file (default: found on package.path)
---@return boolean|nil ok true: watched and loaded
---@return string? message
---@return string? code "io" (no such file) | "reload" (it does not load)
function Engine:watch(name, path)
  return reload.watch(self.watcher, name, path, { on_error = self:_reload_report() })
end

---The request body of one turn.
---@param messages table[]
---@param plan table mirza.thinking plan
---@param opts? table per-turn options (temperature, top_p, body_extra)
---@param schema? mirza.Schema the turn's schema: sent as `response_format` (mirza.schema)
---@return table body
function Engine:body(messages, plan, opts, schema)
  local cfg = self.cfg
  opts = opts or {}
  local body = {
    model = self:model(), messages = messages, stream = true,
    max_tokens = plan.max_tokens, temperature = opts.temperature or cfg.temperature,
    top_p = opts.top_p or cfg.top_p, presence_penalty = cfg.presence_penalty,
    stream_options = { include_usage = true },
  }
  if cfg.dialect == "llama" then
    body.repeat_penalty = cfg.repetition_penalty
  elseif cfg.dialect == "mtplx" then
    body.metadata = { session_id = cfg.session_id }
  end -- "openai": OpenAI's fields only (anything else through body_extra)
  local parallel = opts.parallel_tool_calls
  if parallel == nil then parallel = cfg.parallel_tool_calls end
  require("mirza.tools").add_to_body(body, self:tools(opts),
    { tool_choice = opts.tool_choice or cfg.tool_choice, parallel_tool_calls = parallel })
  if schema then body.response_format = require("mirza.schema").response_format(schema) end
  return merge(merge(merge(body, plan.fields), cfg.body_extra), opts.body_extra)
end

---The tools of a turn: the turn's `tools` option (`false`: none), else the
---engine's; a module name resolves to its current (hot-reloaded) version.
---@param opts? table per-turn options
---@return table|nil tools
function Engine:tools(opts)
  local t = opts and opts.tools
  if t == false then return nil end
  if t == nil then t = self.cfg.tools end
  return require("mirza.tools").resolve(t)
end

-- ------------------------------------------------------------ turns
--
-- Two owners, one boundary. A turn (mirza.turn) owns one request of the
-- conversation: its stream, its reducer (mirza.result), its pipeline, its
-- cancel, its busy-wait, the endpoint it holds while it runs. The engine
-- owns the conversation: the daemon, the history, the thinking plan, the
-- stages, the endpoint the next request goes to, the last turn's stats,
-- the turn in flight. mirza.turn asks the engine through the `_turn_*`
-- methods below (`_turn_begin`, `_turn_failover`, `_turn_error`,
-- `_turn_end`, `_turn_results`, and for a say with a schema `_turn_mark`
-- and `_turn_forget`) and otherwise uses only its public face (`cfg`,
-- `stages`, `log`, `tools`, `turn`, `last`); the engine calls a turn's
-- `cancel` and `finish` only, and never reads its fields. They are two files because they are two
-- concerns — keeping a session, reading one response through a pipeline —
-- that meet at this interface, not one class split for size.

local policy = require "mirza.policy"
local retry = require "mirza.retry"

---Start one turn (mirza.turn: the generic-for quadruple `iter, stream,
---nil, turn`). A turn still in flight on this engine is cancelled first
---(one turn at a time per session). Always an iterator: a turn that
---cannot start (the daemon down, a bad input) yields one `error` event
---(`message`, `code`) and ends, with `iter, message, code, turn`.
---@param input string|table a prompt string, a message list, or a JSON message list
---@param opts? mirza.TurnOptions
---@return fun(): table|nil iter
---@return mirza.Stream|string stream_or_message
---@return string? code
---@return mirza.Turn turn the closing value
function Engine:turn(input, opts)
  local t = self._turn
  if t then
    t:cancel()
    t:finish()
  end
  return require("mirza.turn").start(self, input, opts)
end

---Run a turn to the end with output routing and the tool loop (mirza.turn).
---@param input string|table a prompt string, a message list, or a JSON message list
---@param opts? mirza.SayOptions turn, route and tool loop options (see mirza.turn)
---@return mirza.TurnStats|nil stats
---@return mirza.SayResult|string result_or_message
---@return string? code
---@return mirza.SayResult? result on failure: what was routed before it
function Engine:say(input, opts)
  return require("mirza.turn").say(self, input, opts)
end

---Cancel the turn in flight, if any (barge-in).
---@return boolean cancelled
function Engine:cancel()
  local t = self._turn
  return t ~= nil and t:cancel()
end

-- Everything before the request: the daemon up, reload, the plan, the
-- messages. Returns plan, messages, info, prompt module, or nil, msg, code.
function Engine:_prepare(input, opts)
  if not self.loaded then
    local ok, msg, code = self:load()
    if not ok then return nil, msg, code end
  end
  if self.daemon and self.daemon._proc then -- our child: restart or diagnose a dead one
    local ok, msg, code = self.daemon:ensure()
    if not ok then return nil, msg, code end
  end
  if self.cfg.auto_reload then self:reload() end -- between turns only
  -- a reloaded version that raises gives way to the last one that worked (mirza.policy)
  local prompt, thinking = policy.module(self, "mirza.prompt"), policy.module(self, "mirza.thinking")
  local user, err = prompt.messages(input)
  if not user then return nil, err, "prompt" end
  local plan = thinking.plan(self.thinking, prompt.last_user_text(user), self.cfg.dialect,
    { max_tokens = self.cfg.max_tokens, max_tokens_thinking = self.cfg.max_tokens_thinking }, opts.budget)
  plan.dialect = self.cfg.dialect -- its fields' (Engine:_replan)
  if opts.max_tokens then plan.max_tokens = opts.max_tokens end
  local messages, info, code = prompt.build(self.history, input,
    { context_window = self.cfg.context_window, reserve = plan.max_tokens or 0 })
  if not messages then return nil, info, code end
  if not info.fits then self:log("warning", "the prompt does not fit the context window even alone") end
  return plan, messages, info, prompt
end

---@class mirza.TurnSpec what the engine gives a starting turn (mirza.turn)
---@field plan table the thinking plan (mirza.thinking)
---@field open fun(): mirza.Stream opens the request (again: to the current endpoint)
---@field endpoint mirza.Endpoint|nil the pool's slot the turn holds
---@field busy_wait number seconds a 409 on the session may be waited out
---@field progress fun(tok_s: number) the live decode speed
---@field ctx table the engine's own (handed back to `_turn_end`)

---The start of turn `t`: the daemon up, the plan and messages, an
---endpoint (a pool's: the last turn's while it has room, its session
---cache, else the least loaded), the request; `t` becomes the turn in
---flight. Returns the spec, or nil, message, code.
---@param t mirza.Turn
---@param input string|table
---@param opts mirza.TurnOptions
---@param schema? mirza.Schema the turn's schema, compiled (mirza.structured): sent as `response_format`
---@return mirza.TurnSpec|nil spec
---@return string? message
---@return string? code
function Engine:_turn_begin(t, input, opts, schema)
  local plan, messages, info, prompt = self:_prepare(input, opts)
  if not plan then return nil, messages, info end
  local endpoint
  if self.pool then
    local msg, code
    -- the endpoint of its last turn while it has room (its session cache), else where
    -- its leading messages (the system prompt) went last (that daemon's prompt cache),
    -- else the least loaded (mirza.pool's prefix affinity)
    self._prefix_key = require("mirza.pool").prefix_key(messages)
    -- what each endpoint without a fixed limit announces (its ceiling, MTPLX's serial start): read once,
    -- before the first request through it, as a batch does; a probe that fails changes nothing
    self.pool:read_capacity { api_key = self.cfg.api_key }
    endpoint, msg, code = self.pool:acquire(self.cfg.connect_timeout,
      { prefer = self._endpoint, key = self._prefix_key })
    if not endpoint then return nil, msg, code end
    self._endpoint = endpoint
    self:_set_base(endpoint.url)
  end
  if not self.daemon then self:_as_is(self._url, 0) end -- a pool's endpoint: probed at its first use
  local merged = opts.merge -- deltas that arrived together as one event: the turn's option, else the engine's
  if merged == nil then merged = self.cfg.merge end
  local req = { api_key = self.cfg.api_key, stall_timeout = self.cfg.stall_timeout, timeout = self.cfg.connect_timeout,
    header_timeout = self.cfg.header_timeout,
    record = self.cfg.record, merge = merged == true, hold = merged == true and self.cfg.hold or nil }
  self._turn, self.live_tok_s = t, nil
  local ht = self.cfg.header_timeout
  return { plan = plan, endpoint = endpoint, busy_wait = self.cfg.busy_wait or 0,
    deadline = type(ht) == "number" and mirza.now() + ht or nil,
    ctx = { info = info, prompt = prompt }, progress = function(v) self.live_tok_s = v end,
    open = function() -- to the current endpoint (another after a fail-over), in its dialect
      self:_replan(plan)
      req.url, req.headers = self.chat_url, self:headers()
      req.body = self:body(messages, plan, opts, schema)
      return self:_with_warnings(mirza.open, req) -- a credential over plain http: said in the engine's log
    end }
end

-- The plan's thinking fields in the dialect of the endpoint the request
-- goes to (a pool's endpoints may speak different ones).
function Engine:_replan(plan)
  local d = self.cfg.dialect
  if plan.dialect == d then return end
  plan.fields = policy.module(self, "mirza.thinking").request_fields({ budget = plan.budget,
    efforts = self.thinking.efforts }, d)
  plan.dialect = d
end

---An engine over a pool: a failure of endpoint `ep` before anything
---arrived (refused, cut, timeout, 5xx: mirza.retry) sends the request to
---another one, each endpoint tried at most once per turn (`avoid`: those
---it left); the pool's rule rests the failed one for its own failures
---only (one turn's HTTP 500 does not). Returns the endpoint to try next
---(nil: none) and whether `ep` was given back to the pool.
---@param ep mirza.Endpoint|nil
---@param ev table the error event
---@param avoid table<mirza.Endpoint, boolean>
---@param key any the turn (its HTTP 500s count once)
---@return mirza.Endpoint|nil next
---@return boolean released
function Engine:_turn_failover(ep, ev, avoid, key)
  if not ep or not retry.blame(ev.code, ev.status) then return nil, false end
  local tried = 2 -- this endpoint and the next, plus those left before
  for _ in pairs(avoid) do tried = tried + 1 end
  if tried > #self.pool.endpoints then return nil, false end
  self.pool:report(ep, { code = ev.code, status = ev.status, message = ev.message }, key)
  avoid[ep] = true
  local nxt = self.pool:acquire(self.cfg.connect_timeout, { avoid = avoid, key = self._prefix_key })
  if not nxt then return nil, true end
  self:log("warning", ("%s: %s; trying %s"):format(self.base_url, ev.message or ev.code, nxt.base))
  self._endpoint = nxt
  self:_set_base(nxt.url)
  self:_as_is(nxt.url, 0) -- its dialect (probed at its first use)
  return nxt, true
end

---A stream error the turn gives up on: a dead daemon of ours diagnosed
---("exited" with the status and log tail), else the event as it is.
---@param ev table
---@return table ev
function Engine:_turn_error(ev)
  if self.daemon then return self.daemon:stream_error(ev) end
  return ev
end

---The end of turn `t`, once, with its spec's `ctx` and `out` = {acc (its
---mirza.result reducer), answer, calls (wire form), cancelled, stream, endpoint}. The stats
---(`e.last`), the history (a done turn; a cancelled one's part, marked
---interrupted), the policies' fallbacks, the run log, the pool's slot.
---@param t mirza.Turn
---@param ctx table
---@param out {acc: mirza.Reducer, answer: string, calls: table[]|nil, cancelled: boolean, stream: mirza.Stream,
---  endpoint: mirza.Endpoint|nil, value: any, schema_error: table|nil}
function Engine:_turn_end(t, ctx, out)
  local acc = out.acc
  self.last = stats.stats(acc)
  self.last.value, self.last.schema_error = out.value, out.schema_error -- a turn with a schema (mirza.structured)
  local done = acc.final ~= nil and acc.final.type == "done"
  if done then
    ctx.prompt.add_turn(self.history, ctx.info.current, out.answer, { tool_calls = out.calls })
  elseif out.cancelled then
    self.last.interrupted = true
    if out.answer ~= "" or out.calls then
      ctx.prompt.add_turn(self.history, ctx.info.current, out.answer, { tool_calls = out.calls, interrupted = true })
    end
  end
  policy.turn_end(self) -- the policy versions that ran without raising: the next fallback
  if self.cfg.record then require("mirza.record").log_turn(self, out, ctx.info.current) end
  if out.endpoint then -- the pool's slot back, with the outcome: the pool's rule says whom it blames
    local fin = acc.final
    if fin then
      self.pool:report(out.endpoint, { ok = done, code = fin.code, status = fin.status, message = fin.message }, t)
    else
      self.pool:release(out.endpoint, false, false)
    end
  end
  if self._turn == t then self._turn = nil end
end

---After `say`'s last round allowed, the calls' results still go to the
---history: an assistant message with tool_calls must be answered by tool
---messages for the next request to be valid.
---@param msgs table[] the `role = "tool"` messages
function Engine:_turn_results(msgs)
  local prompt = require "mirza.prompt"
  for _, m in ipairs(msgs) do prompt.add(self.history, m) end
end

---The newest message of the history (nil when it is empty): a mark
---`_turn_forget` finds again by identity, however much of the history's
---head is trimmed meanwhile.
---@return table|nil message
function Engine:_turn_mark()
  local msgs = self.history.messages
  return msgs[#msgs]
end

---The history once a say with a schema is over (mirza.turn): the failed
---attempts' answers (`bad`, by identity) removed, and the retry prompt
---(mirza.structured.retry_message) right after each — or, when no attempt
---fitted (`all`), everything after `mark` (`_turn_mark` before the say;
---nil: everything), as for a failed turn. Trimmed in place, by identity,
---not position.
---@param mark table|nil
---@param bad table<table, boolean> the failed attempts' assistant messages
---@param all boolean
function Engine:_turn_forget(mark, bad, all)
  local prefix = require("mirza.structured").retry_message("\0"):match("^(.-)\0")
  local msgs = self.history.messages
  local keep, after_mark, skip_next = {}, mark == nil, false
  for _, m in ipairs(msgs) do
    local retry_prompt = skip_next and m.role == "user" and type(m.content) == "string"
        and m.content:sub(1, #prefix) == prefix
    local drop = (all and after_mark) or bad[m] or retry_prompt
    skip_next = bad[m] == true
    if not drop then keep[#keep + 1] = m end
    if m == mark then after_mark = true end
  end
  for i = #msgs, 1, -1 do msgs[i] = nil end
  for i, m in ipairs(keep) do msgs[i] = m end
end

return setmetatable(E, { __index = Engine })
