--- mirza.daemon: supervise one local LLM daemon (MTPLX, llama-server,
--- mirza-sim or any command) on a host:port.
---
--- `start()` adopts a healthy daemon already on the port (after checking
--- it serves the expected model), or spawns one (`mirza.core.spawn`: no
--- shell, own process group, output to a log) and polls its health URL
--- until it answers, the child exits (fail at once with the exit status
--- and the log tail) or the deadline passes. The pid of a daemon mirza
--- started goes into a per-port pid file, so a later run can adopt *and*
--- stop it. A started daemon is stopped by `stop()`, `close()` or when the
--- script ends, fails or is interrupted (the Process userdata's finalizer
--- at the end of the state), unless `keep_alive` — never merely because the
--- supervisor object became garbage. Adopted daemons are left running
--- unless `stop()` is called, and `stop()` signals one only when its pid is
--- plausibly the daemon's: a loopback host, and the pid holds the port's
--- listening socket or is named by our pid file.
---
--- Presets (mirza.presets) build the command line (and environment:
--- Ollama is set up by OLLAMA_* variables) from the seed's settings;
--- `custom` takes an argv (with `{host}`, `{port}`, `{model}`, `{model_id}`
--- placeholders) and a health path. A preset's port expects that daemon: when something else
--- answers there, start() names it (mirza.detect) instead of taking it.
local core = require "mirza.core"
local json = core.json

local M = {}

---@class mirza.DaemonOptions
---@field preset? "mtplx"|"llama-server"|"ollama"|"vllm"|"mirza-sim"|"custom" default "mtplx"
---@field host? string            default "127.0.0.1"
---@field port? integer           default 8766 (ollama 11434, vllm 8000)
---@field model? string           model directory/repo (mtplx, vllm), .gguf file (llama-server): required by those;
---                               ollama: a model name (optional)
---@field model_id? string        id served, checked on adoption (default: model's base name; ollama: the model as
---                               given; mirza-sim: "mirza-sim")
---@field context_window? integer default 16384 (llama-server: per slot, `-c` = context_window * parallel)
---@field kv_bits? integer        KV cache quantization: 8, 4, else none (default: mtplx 8; llama-server none, its f16)
---@field depth? integer          MTPLX MTP draft depth (default 3)
---@field parallel? integer       concurrent requests: llama-server `-np` (default 1); ollama OLLAMA_NUM_PARALLEL,
---                               vllm `--max-num-seqs` (those two only when given)
---@field jinja? boolean          llama-server `--jinja` (default true)
---@field dialect? "mtplx"|"llama" mirza-sim dialect (default "mtplx")
---@field bin? string             program to run (default "mtplx", "llama-server", the mirza-sim next to mirza)
---@field args? string[]          extra arguments appended to the preset's
---@field argv? string[]          custom: the whole command line
---@field health? string          health path (default "/health"; ollama "/api/version")
---@field env? table<string,string> extra environment for the daemon
---@field cwd? string
---@field log? string             log file (default <runtime dir>/daemon-<port>.log, removed after a clean stop; the
---previous one is kept as .1)
---@field api_key? string         sent on health/model requests
---@field autostart? boolean      start a daemon when none answers (default true)
---@field keep_alive? boolean     leave a started daemon running when mirza exits (default false)
---@field deadline? number        seconds to wait for health (default 300)
---@field grace? number           seconds between SIGTERM and SIGKILL (default 5)
---@field poll_interval? number   seconds between health probes (default 0.25)
---@field restart? {max?: integer, backoff?: number}  restart policy of ensure() (default: none)
---@field progress? boolean|fun(elapsed: number, d: mirza.Daemon)  progress while waiting (default: stderr)

local option_types = {
  preset = "string", host = "string", port = "number", model = "string", model_id = "string",
  context_window = "number", kv_bits = "number", depth = "number", parallel = "number",
  jinja = "boolean", dialect = "string", bin = "string", args = "table", argv = "table",
  health = "string", env = "table", cwd = "string", log = "string", api_key = "string",
  autostart = "boolean", keep_alive = "boolean", deadline = "number", grace = "number",
  poll_interval = "number", restart = "table", progress = { boolean = true, ["function"] = true },
}

local defaults = {
  preset = "mtplx", host = "127.0.0.1", port = 8766, context_window = 16384, kv_bits = 8,
  depth = 3, parallel = 1, jinja = true, dialect = "mtplx", health = "/health",
  autostart = true, keep_alive = false, deadline = 300, grace = 5, poll_interval = 0.25,
}

local function argerror(fmt, ...)
  error("mirza.daemon: " .. fmt:format(...), 3)
end

local presets = require "mirza.presets"
local basename, needs_model = presets.basename, presets.needs_model

---Find the simulator: $MIRZA_SIM, next to the mirza executable, build/.
M.find_sim = presets.find_sim

---Command lines by preset (mirza.presets): each takes the resolved options
---and returns the argv, and the preset's environment when it has one.
M.presets = presets.argv

-- ------------------------------------------------------------ options

local function check_type(k, v)
  local want = option_types[k]
  if not want then argerror("unknown option '%s'", tostring(k)) end
  local ok = type(want) == "table" and want[type(v)] or type(v) == want
  if not ok then
    local wanted = type(want) == "table" and "boolean or function" or want
    argerror("option '%s' must be a %s, got %s", k, wanted, type(v))
  end
end

local function check_values(o)
  if not M.presets[o.preset] then argerror("unknown preset '%s'", o.preset) end
  if math.type(o.port) ~= "integer" and o.port ~= math.floor(o.port) or o.port < 0 or o.port > 65535 then
    argerror("'port' must be an integer 0..65535")
  end
  if o.port == 0 then argerror("'port' 0 cannot be supervised: pick a port") end
  for _, k in ipairs { "deadline", "grace", "poll_interval" } do
    if o[k] < 0 then argerror("'%s' must be >= 0", k) end
  end
  if o.restart then
    for k in pairs(o.restart) do
      if k ~= "max" and k ~= "backoff" then argerror("unknown restart option '%s'", tostring(k)) end
    end
  end
  if o.health:sub(1, 1) ~= "/" then argerror("'health' must be a path starting with '/'") end
end

local function merge_env(env, extra)
  for k, v in pairs(extra or {}) do env[k] = v end
  return env
end

---Validate options, fill defaults and build the command line (pure: no
---process, no I/O). Raises on unknown keys and wrong types. Without
---`model`, the mtplx, llama-server and vllm presets have no command line
---(`o.argv` nil): they can adopt a daemon, and start() says what is missing.
---@param opts mirza.DaemonOptions
---@return table o resolved options, with `o.argv` the command line (nil: see above) and
---`o.env` the daemon's extra environment (the preset's, then `env`)
function M.resolve(opts)
  if type(opts) ~= "table" then argerror("options table expected, got %s", type(opts)) end
  local o = {}
  for k, v in pairs(opts) do
    check_type(k, v)
    o[k] = v
  end
  o.kv_explicit, o.parallel_explicit = opts.kv_bits ~= nil, opts.parallel ~= nil
  for k, v in pairs(presets.defaults[o.preset or defaults.preset] or {}) do
    if o[k] == nil then o[k] = v end
  end
  for k, v in pairs(defaults) do
    if o[k] == nil then o[k] = v end
  end
  check_values(o)
  o.port = math.tointeger(o.port)
  if not o.model_id then
    local id = o.model and (o.preset == "ollama" and o.model or basename(o.model))
    o.model_id = id or (o.preset == "mirza-sim" and "mirza-sim" or nil)
  end
  -- without a model such a preset can only adopt: start() says what is missing
  if o.model or not needs_model[o.preset] then
    local argv, env = M.presets[o.preset](o)
    o.argv, o.env = argv, env and merge_env(env, opts.env) or o.env
  end
  return o
end



-- ------------------------------------------------------------ the daemon

---@class mirza.Daemon
---@field preset string
---@field host string
---@field port integer
---@field model_id string|nil   the model id expected on the port
---@field url string            "http://host:port"
---@field base_url string       "http://host:port/v1" (OpenAI base URL)
---@field chat_url string       ".../v1/chat/completions"
---@field health_url string
---@field argv string[]         the command line start() runs
---@field log_path string|nil   where a started daemon's output goes
---@field adopted boolean       true when start() found a healthy daemon already there
---@field pid integer|nil       pid of the daemon (started, or adopted and known)
---@field restarts integer      restarts done by ensure()
---@field keep_alive boolean
local Daemon = {}
Daemon.__index = Daemon

local HEALTH_TIMEOUT = 1    -- connect timeout of one probe (seconds)
local HEALTH_DEADLINE = 3   -- whole-probe limit
local EXIT_SETTLE = 1       -- how long a cut stream waits for the exit status
local PROGRESS_EVERY = 5    -- seconds between progress lines when not a tty
local TAIL_LINES = 20

---Create a supervisor (nothing is started: call `start()`). Raises on bad
---options.
---@param opts mirza.DaemonOptions
---@return mirza.Daemon
function M.new(opts)
  local o = M.resolve(opts)
  local d = setmetatable({ _o = o, preset = o.preset, host = o.host, port = o.port, model_id = o.model_id,
    argv = o.argv, keep_alive = o.keep_alive, adopted = false, restarts = 0 }, Daemon)
  d.url = ("http://%s:%d"):format(o.host:find(":", 1, true) and "[" .. o.host .. "]" or o.host, o.port)
  d.chat_url, d.base_url = require("mirza.url").resolve(d.url, "chat") -- a bare host: its /v1
  d.health_url = d.url .. o.health
  d.log_path = o.log
  return d
end

-- One GET; body or nil, message, code, status.
function Daemon:_get(url)
  local mirza = require "mirza"
  return mirza.request { url = url, method = "GET", timeout = HEALTH_TIMEOUT, deadline = HEALTH_DEADLINE,
    api_key = self._o.api_key }
end

---Probe the health URL once.
---@return boolean healthy 200 and not `"ok": false`
---@return table|string|nil info the decoded health answer; else the error message
---@return string? code "refused", "http" (503 while loading), "timeout", ...
---@return integer? status HTTP status of an "http" answer
function Daemon:healthy()
  local body, msg, code, status = self:_get(self.health_url)
  if not body then return false, msg, code, status end
  local info = json.decode(body)
  if type(info) == "table" and info.ok == false then return false, info, "http", msg end
  return true, type(info) == "table" and info or {}
end

-- The model the daemon serves, when it says: /health .model, else the ids
-- of /v1/models. Returns a string, a list of ids, or nil (cannot tell).
function Daemon:_served(info)
  if type(info) == "table" and type(info.model) == "string" then return info.model end
  local body = self:_get((require("mirza.url").resolve(self.url, "models")))
  local models = body and json.decode(body)
  if type(models) ~= "table" or type(models.data) ~= "table" then return nil end
  local ids = {}
  for _, m in ipairs(models.data) do
    if type(m) == "table" and type(m.id) == "string" then ids[#ids + 1] = m.id end
  end
  return ids[1] and ids or nil
end

-- true, or nil, message, "foreign" when the port serves another model.
-- Ollama serves every model it has pulled ("qwen3" is "qwen3:latest").
function Daemon:_check_model(info)
  local want = self.model_id
  if not want then return true end
  local served = self:_served(info)
  if served == nil or served == want then return true end
  if type(served) == "table" then
    for _, id in ipairs(served) do
      if id == want or self.preset == "ollama" and id == want .. ":latest" then return true end
    end
    served = table.concat(served, ", ")
  end
  if self.preset == "ollama" then
    return nil, ("ollama at %s has no model '%s' (it has %s): run `ollama pull %s`, or pick one of those"):format(
      self.url, want, served, want), "foreign"
  end
  return nil, ("%s serves model '%s', expected '%s': give model_id = '%s' (or the model that serves it), or use "
    .. "another port for yours"):format(self.url, served, want, served), "foreign"
end

-- The /health answer of each preset's daemon, when it has a telling one.
local health_shape = {
  mtplx = function(i) return i.model ~= nil or i.startup ~= nil or i.ok ~= nil end,
  ["llama-server"] = function(i) return i.status == "ok" end,
  ollama = function(i) return type(i.version) == "string" end,
}

-- When what answers is not the preset's daemon: a message naming what it
-- is (mirza.detect), else nil. `info` is the health answer (a table), or
-- nil when the health route did not answer 200.
function Daemon:_other_kind(info)
  local shape = health_shape[self.preset]
  if info and (not shape or shape(info)) then return nil end
  if self.preset == "mirza-sim" or self.preset == "custom" then return nil end
  local found = require("mirza.detect").detect(self.base_url, { api_key = self._o.api_key, wait = 0 })
  if not found or found.kind == self.preset or found.kind == "unknown" then return nil end
  return ("%s is %s, not %s: leave preset unset to use it as it is, or point mirza at your %s daemon "
    .. "(another base_url or port)"):format(self.url, require("mirza.detect").describe(found), self.preset,
    self.preset)
end

---Whether a host is this machine's loopback (127.0.0.0/8, ::1,
---localhost). Only a loopback daemon's pid can be ours to stop. Tests
---replace it to make a local simulator look remote.
---@param host string
---@return boolean
function M.is_loopback(host)
  host = host:gsub("^%[(.*)%]$", "%1"):lower()
  return host == "localhost" or host == "::1" or host:find("^127%.%d+%.%d+%.%d+$") ~= nil
end

-- The pid of a daemon we did not start, and why it is trusted (or why
-- none is). A pid reported by /health (startup.pid) is trusted only when
-- that process holds the port's listening socket or our pid file names
-- it; a pid file alone only when that pid is alive and not seen to miss
-- the socket (a recycled pid does not hold it). Never for a remote host:
-- a pid there means nothing here.
function Daemon:_adopted_pid(info)
  if not M.is_loopback(self.host) then return nil, "the host is not this machine" end
  local port = self.port
  local ours = core.pidfile_read(port)
  local st = type(info) == "table" and info.startup
  local pid = type(st) == "table" and math.tointeger(st.pid)
  if pid and pid > 0 and pid ~= ours then
    local listens, why = core.pid_listens(pid, port)
    if listens then return pid end
    if listens == nil then return nil, ("the pid it reports (%d) cannot be checked: %s"):format(pid, why) end
    return nil, ("the pid it reports (%d) does not hold port %d"):format(pid, port)
  end
  if pid and pid > 0 then return pid end
  -- a pid file outlives a daemon that died on its own: its pid may be
  -- another process's now, trusted only when seen to hold the port
  local listens, why
  if ours and core.pid_alive(ours) then listens, why = core.pid_listens(ours, port) end
  if listens then return ours end
  if why then return nil, ("the pid our pid file names (%d) cannot be checked: %s"):format(ours, why) end
  return nil, "it reports no pid and no pid file of ours names it"
end

function Daemon:_adopt(info)
  local other = self:_other_kind(info)
  if other then return nil, other, "foreign" end
  local ok, msg, code = self:_check_model(info)
  if not ok then return nil, msg, code end
  self.adopted = true
  self.pid, self._unowned = self:_adopted_pid(info)
  return true
end

-- Default progress: a line every PROGRESS_EVERY seconds, or a line
-- rewritten each second when stderr is a terminal.
local stderr_tty
local function show_progress(elapsed, d)
  if stderr_tty == nil then stderr_tty = core.isatty(2) end
  local last = d._shown or 0
  local every = stderr_tty and 1 or PROGRESS_EVERY
  if elapsed - last < every then return end
  d._shown = elapsed
  local line = ("mirza: waiting for %s at %s: %d s"):format(d.preset, d.url, math.floor(elapsed))
  io.stderr:write(stderr_tty and ("\r" .. line) or (line .. "\n"))
  io.stderr:flush()
end

function Daemon:_progress(elapsed)
  local p = self._o.progress
  if p == false then return end
  if type(p) == "function" then return p(elapsed, self) end
  show_progress(elapsed, self)
end

local function end_progress(d)
  if d._shown and stderr_tty then io.stderr:write("\n") end
  d._shown = nil
end

---The default progress line while waiting, for other waits (mirza.detect):
---`w.preset` names what is waited for, `w.url` where; `w._shown` is its state.
M.show_progress, M.end_progress = show_progress, end_progress

---The last n lines of the daemon's log (started daemons; "" otherwise).
---@param n? integer default 20
---@return string
function Daemon:log_tail(n)
  if not self.log_path then return "" end
  return core.file_tail(self.log_path, n or TAIL_LINES)
end

local function with_tail(msg, tail)
  if tail == "" then return msg end
  return msg .. ":\n" .. tail:gsub("\n$", "")
end

-- Why the child is gone, as an "exited" failure (stops nothing).
function Daemon:_exited(what)
  local _, text, code, sig = self._proc:poll()
  self._status = { text = text, exit_code = code, signal = sig }
  local msg = ("daemon %s %s (%s on %s)"):format(text, what, self.preset, self.url)
  return nil, with_tail(msg, self:log_tail()), "exited"
end

-- Whether a child stopped cleanly: running until our SIGTERM, then gone
-- within the grace, by the signal or with status 0 (143: a wrapper shell
-- passing the SIGTERM on). One that died on its own, needed SIGKILL or
-- failed has a log worth reading.
local function clean_stop(running, killed, code, sig)
  return running and not killed and (code == 0 or code == 143 or sig == 15)
end

-- Stop and forget a child we started (and its pid file). `tidy` (a stop
-- asked for: stop(), close()): the log mirza named itself is removed when
-- the daemon stopped cleanly; a log the caller named, and any log of a
-- failure, stay.
function Daemon:_drop(tidy)
  local proc = self._proc
  if proc then
    self._proc = nil
    if not proc:closed() then
      local running = proc:poll()
      local killed, _, code, sig = proc:stop(self._o.grace)
      proc:close()
      if tidy and self._own_log and clean_stop(running, killed, code, sig) then os.remove(self.log_path) end
    end
    if core.pidfile_read(self.port) == self.pid then core.pidfile_remove(self.port) end
  end
end

-- Poll health until healthy, the child exits, or the deadline.
function Daemon:_wait()
  local mirza = require "mirza"
  local t0 = mirza.now()
  while true do
    local ok, info, code = self:healthy()
    if ok then
      end_progress(self)
      return self:_check_model(info)
    end
    if self._proc and not self._proc:poll() then
      end_progress(self)
      return self:_exited("before becoming healthy")
    end
    local elapsed = mirza.now() - t0
    if elapsed >= self._o.deadline then
      end_progress(self)
      local last = type(info) == "table" and "not ok" or ("%s: %s"):format(code, info)
      return nil, with_tail(("daemon at %s not healthy after %g s (last probe: %s)"):format(self.health_url,
        self._o.deadline, last), self:log_tail()), "timeout"
    end
    self:_progress(elapsed)
    mirza.sleep(self._o.poll_interval)
  end
end

-- A fresh log for this start; the previous one is kept as <log>.1.
function Daemon:_rotate_log()
  if not self.log_path then
    local dir = assert(core.runtime_dir())
    self.log_path = ("%s/daemon-%d.log"):format(dir, self.port)
    self._own_log = true -- named here: removed after a clean stop (_drop)
  end
  os.remove(self.log_path .. ".1")
  os.rename(self.log_path, self.log_path .. ".1")
end

-- Spawn the command line and wait until it is healthy.
function Daemon:_spawn()
  local o = self._o
  self:_rotate_log()
  local proc, msg, code = core.spawn { argv = self.argv, env = o.env, cwd = o.cwd, log = self.log_path,
    keep_alive = o.keep_alive, grace = o.grace, pidfile = self.port }
  if not proc then return nil, msg, code end
  self._proc, self.pid, self.adopted, self._status = proc, proc:pid(), false, nil
  local ok, err, ecode = self:_wait()
  if not ok then
    self:_drop()
    return nil, err, ecode
  end
  return true
end

---Adopt a healthy daemon already on the port, or start one and wait until
---it is healthy. A daemon still loading on the port (503) is waited for and
---adopted. Calling start() on a running daemon does nothing. Failure codes:
---"exited" (the message has the exit status and log tail), "timeout",
---"foreign" (another model, or not a daemon), "refused" (autostart off), "spawn".
---@return true|nil ok
---@return string? message
---@return string? code "exited", "timeout", "foreign", "refused" or "spawn"
function Daemon:start()
  if self._proc and self._proc:poll() then return true end
  if self._proc then self:_drop() end
  local ok, info, code, status = self:healthy()
  if ok then return self:_adopt(info) end
  if code == "http" and status == 503 then
    local w, msg, c = self:_wait()
    if not w then return nil, msg, c end
    return self:_adopt(select(2, self:healthy()))
  elseif code == "http" and (status == 401 or status == 403) then
    return nil, ("%s answers %d (%s): give api_key (MIRZA_API_KEY) the daemon's key"):format(self.health_url,
      status, info), "foreign"
  elseif code ~= "refused" then
    local other = self:_other_kind(nil)
    if other then return nil, other, "foreign" end
    return nil, ("%s answers but is not a healthy %s daemon (%s): check what runs on port %d"):format(
      self.health_url, self.preset, info, self.port), "foreign"
  end
  if not self._o.autostart then
    return nil, ("no daemon at %s and autostart is off: %s"):format(self.url, info), "refused"
  end
  if not self.argv then
    return nil, ("nothing answers at %s, and preset '%s' needs 'model' to start one: give model = ... "
      .. "(MIRZA_MODEL), or start the daemon yourself"):format(self.url, self.preset), "spawn"
  end
  return self:_spawn()
end

---Stop the daemon, whether started or adopted: SIGTERM to its process
---group, `grace` seconds, then SIGKILL; removes the pid file, and the log
---of a started daemon that stopped cleanly (gone by the SIGTERM; the
---default log only: one named by `log` stays). Idempotent.
---An adopted daemon is stopped only when its pid is known to be the
---daemon's (see `_adopted_pid`): otherwise it is not ours to stop, and
---nothing is signalled.
---@return true|nil ok
---@return string? message
---@return string? code "unowned" (adopted, pid unknown or untrusted: left running), "io" (cannot signal)
function Daemon:stop()
  if self._proc then
    self:_drop(true)
    return true
  end
  if self.adopted then
    if not self.pid then
      return nil, ("the daemon at %s was adopted and is not ours to stop (%s)"):format(self.url,
        self._unowned or "pid unknown"), "unowned"
    end
    local ok, msg, code = core.pid_stop(self.pid, self._o.grace)
    if not ok then return nil, msg, code end
    if core.pidfile_read(self.port) == self.pid then core.pidfile_remove(self.port) end
    self.adopted = false
  end
  return true
end

---Whether a started daemon's process is still running (adopted: its pid is
---alive, or health answers when the pid is unknown).
---@return boolean
function Daemon:running()
  if self._proc then return self._proc:poll() end
  if self.adopted and self.pid then return core.pid_alive(self.pid) end
  return self.adopted and self:healthy() or false
end

---Make sure the daemon is up before a request: start it if never started;
---if it died, restart it under the `restart` policy (backoff, at most
---`restart.max` restarts in the daemon's life), else fail.
---@return true|nil ok
---@return string? message
---@return string? code "exited" when dead and no restart is allowed; start()'s codes
function Daemon:ensure()
  if not self._proc and not self.adopted then return self:start() end
  if self:running() then return true end
  local policy = self._o.restart
  local _, msg, code
  if self._proc then _, msg, code = self:_exited("while serving")
  else msg, code = ("adopted daemon at %s is gone"):format(self.url), "exited" end
  if not policy or self.restarts >= (policy.max or 3) then return nil, msg, code end
  self.restarts = self.restarts + 1
  -- backoff * 2^(n-1) before restart number n, no cap: `max` bounds the count
  require("mirza").sleep(require("mirza.retry").backoff(self.restarts, policy.backoff or 0.5))
  self:_drop()
  self.adopted, self.pid = false, nil
  return self:start()
end

---Turn a stream error caused by the daemon's death into code "exited"
---with the exit status (and log tail); other errors are returned as is.
---Waits briefly for the exit status, which lags the closed socket.
---@param ev mirza.Event an error event (from a stream of this daemon)
---@return mirza.Event ev `{type="error", code="exited", message, status_text, exit_code?, signal?, cause=ev}` or ev
function Daemon:stream_error(ev)
  if type(ev) ~= "table" or ev.type ~= "error" or not require("mirza.retry").gone(ev.code) then return ev end
  local mirza = require "mirza"
  local t0 = mirza.now()
  while self:running() and mirza.now() - t0 < EXIT_SETTLE do mirza.sleep(0.05) end
  if self:running() or not (self._proc or self.adopted) then return ev end
  local msg
  if self._proc then
    msg = select(2, self:_exited(("while serving (stream %s: %s)"):format(ev.code, ev.message)))
  else
    msg = ("adopted daemon at %s is gone (stream %s: %s)"):format(self.url, ev.code, ev.message)
  end
  local st = self._status or {}
  return { type = "error", code = "exited", message = msg, status_text = st.text, exit_code = st.exit_code,
    signal = st.signal, cause = ev }
end

---Release the supervisor: stop a started daemon unless keep_alive (its pid
---file then stays, for the next run to adopt); adopted daemons are left
---running. A daemon stopped cleanly leaves no log behind (as `stop()`).
---Idempotent; also `__close`. Not a finalizer: a started daemon
---lives until stop(), close() or the end of the Lua state (its process is
---anchored in the registry), never just because this table became garbage.
function Daemon:close()
  local proc = self._proc
  if not proc then return end
  if self.keep_alive then
    self._proc = nil
    proc:close()
    return
  end
  self:_drop(true) -- at lua_close the process's own finalizer may have run first: _drop sees it closed
end

Daemon.__close = Daemon.close

function Daemon:__tostring()
  local state = self._proc and "started" or self.adopted and "adopted" or "stopped"
  return ("mirza.Daemon (%s %s, %s, pid %s)"):format(self.preset, self.url, state, tostring(self.pid))
end

M.Daemon = Daemon
return M
