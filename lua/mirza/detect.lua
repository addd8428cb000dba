--- mirza.detect: what answers at a base URL, so that a URL just works.
---
--- A few GETs, each route telling one kind of server apart from the others:
---   /health      MTPLX (JSON with `ok`, `model`, `startup`); llama-server's
---                is `{"status":"ok"}`, vLLM's empty; 503 while loading
---   /props       llama-server (`default_generation_settings`, `total_slots`)
---   /api/version Ollama (`{"version": "0.12.6"}`)
---   /version     vLLM (`{"version": "0.11.0"}`)
---   /v1/models   any OpenAI-compatible server: the model ids it serves
--- The first one that tells the kind stops the search; the model comes from
--- /health (MTPLX) or the first id of /v1/models (else /props). A refused
--- connection means nothing answers (no further probe); any other answer,
--- even 401 or 404 everywhere, is a server of unknown kind, used as it is
--- in the plain OpenAI dialect. The routes are where mirza.url's rule puts
--- them, never guessed from answers: a bare host (`http://127.0.0.1:8080`,
--- as llama-server prints it) gets /v1 (`found.url`, `found.completed`), a
--- base with a path is kept; its query string goes on every probe.
--- While /health answers 503 (llama-server loading its model) detection
--- waits, within `wait` seconds, with the daemon module's progress line.
local mirza = require "mirza"
local json = require("mirza.core").json
local resolve = require("mirza.url").resolve

local M = {}

---The request dialect each kind speaks (mirza.thinking, the engine's body):
---"mtplx" (MTPLX's top-level fields and X-MTPLX headers), "llama" (thinking
---switched in the chat template: llama-server, vLLM), "openai" (OpenAI's
---fields only: Ollama, which checks `reasoning_effort`, and any other
---server — a strict one refuses what it does not know).
M.dialects = { mtplx = "mtplx", ["llama-server"] = "llama", vllm = "llama", ollama = "openai", openai = "openai",
  unknown = "openai" }

local PROBE_TIMEOUT = 1   -- connect timeout of one probe (seconds)
local PROBE_DEADLINE = 3  -- whole-probe limit

---@class mirza.Detected
---@field kind "mtplx"|"llama-server"|"ollama"|"vllm"|"openai"|"unknown"
---@field via string|nil   the route that told the kind ("/props"...); nil for "unknown"
---@field model string|nil the model id the server reports (MTPLX /health, else /v1/models, else /props)
---@field models string[]|nil every id of /v1/models
---@field version string|nil Ollama's and vLLM's version
---@field dialect "mtplx"|"llama"|"openai"
---@field url string       the base URL ("http://host:port/v1"), as mirza.url makes it of the URL given
---@field completed true|nil the URL given was a bare host and /v1 was added (mirza.url)
---@field waited number|nil seconds waited while the server was loading
---@field denied integer|nil 401 or 403: /health and /v1/models refused us (a missing or wrong api_key)
---@field loading true|nil /health answered 503 (loading) and was not waited for (`wait` = 0)

-- One probe: the decoded JSON (or {} for a body that is not JSON), or nil,
-- message, code, status.
local function get(url, o)
  local body, msg, code, status = mirza.request { url = url, method = "GET", timeout = o.timeout or PROBE_TIMEOUT,
    deadline = o.deadline or PROBE_DEADLINE, api_key = o.api_key, record = false }
  if not body then return nil, msg, code, status end
  local v = json.decode(body)
  return type(v) == "table" and v or {}
end

-- A probe's answer and its HTTP status (nil when it answered 2xx).
local function select_status(v, _, _, status)
  return v, status
end

local function ids_of(list)
  local ids = {}
  for _, m in ipairs(type(list) == "table" and type(list.data) == "table" and list.data or {}) do
    if type(m) == "table" and type(m.id) == "string" then ids[#ids + 1] = m.id end
  end
  return ids[1] and ids or nil
end

local function basename(path)
  return (path:match("([^/]+)$") or path):gsub("%.gguf$", "")
end

-- The kind routes after /health, in order: each returns the kind (and
-- fills `found`) when the answer is that server's.
local routes = {
  { "/props", function(p, found)
    if p.default_generation_settings == nil and p.total_slots == nil then return nil end
    local alias = type(p.model_alias) == "string" and p.model_alias
    found.props_model = alias or (type(p.model_path) == "string" and basename(p.model_path)) or nil
    return "llama-server"
  end },
  { "/api/version", function(p, found)
    if type(p.version) ~= "string" then return nil end
    found.version = p.version
    return "ollama"
  end },
  { "/version", function(p, found)
    if type(p.version) ~= "string" then return nil end
    found.version = p.version
    return "vllm"
  end },
}

-- MTPLX's /health (and mirza-sim's in its dialect): `ok`, `model`, `startup`.
local function mtplx_health(h)
  return h.model ~= nil or h.startup ~= nil or h.ok ~= nil
end

-- Wait while /health (the URL health) answers 503; the last health answer
-- (or nil, msg, code).
local function wait_loading(base, health, o)
  local d = require "mirza.daemon"
  local show = { preset = "the daemon", url = mirza.redact_url(base) }
  local t0, limit = mirza.now(), o.wait or 300
  while true do
    local h, msg, code, status = get(health, o)
    if h or status ~= 503 then
      d.end_progress(show)
      return h, msg, code, status, mirza.now() - t0
    end
    local elapsed = mirza.now() - t0
    if elapsed >= limit then
      d.end_progress(show)
      return nil, ("%s still answers 503 (loading) after %g s: wait for the model to load, or raise "
        .. "daemon.deadline"):format(mirza.redact_url(health), limit), "timeout", 503, elapsed
    end
    if o.progress == nil or o.progress == true then d.show_progress(elapsed, show)
    elseif o.progress then o.progress(elapsed, show) end
    mirza.sleep(o.poll_interval or 0.25)
  end
end

---@class mirza.DetectOptions
---@field api_key? string   sent on every probe
---@field wait? number      seconds to wait while the server answers 503 (loading; default 300; 0: do not wait)
---@field poll_interval? number seconds between probes while waiting (default 0.25)
---@field progress? boolean|fun(elapsed: number, w: table) while waiting (default: the daemon module's line)
---@field timeout? number   connect timeout of each probe (default 1)
---@field deadline? number  whole-probe limit (default 3)

---Find out what answers at an endpoint. Nothing is started or changed.
---@param base string the endpoint as written ("http://127.0.0.1:8080/v1", "http://h:8080"; mirza.url)
---@param opts? mirza.DetectOptions
---@return mirza.Detected|nil found
---@return string? message "nothing answers at URL" ...
---@return string? code "refused" (nothing listens), "timeout" (still loading, or no answer in time), ...
function M.detect(base, opts)
  local o, given = opts or {}, base
  local function at(route) return (resolve(given, route)) end -- the URL of a probe
  local _, bare
  _, base, bare = resolve(given)
  local found = { url = base, completed = bare or nil }
  local h, msg, code, status = get(at("/health"), o)
  local shown = mirza.redact_url(base) -- messages name the URL without its credentials
  if not h and code == "refused" then return nil, ("nothing answers at %s"):format(shown), "refused" end
  if status == 503 and (o.wait or 300) > 0 then
    h, msg, code, status, found.waited = wait_loading(base, at("/health"), o)
    if not h and code == "timeout" then return nil, msg, code end
  end
  if not h and not status then -- no HTTP answer at all (timeout, cut): no point in asking more
    return nil, ("%s does not answer: %s (check what listens there)"):format(shown, msg), code
  end
  if status == 503 then found.loading = true end -- not waited for (`wait` = 0): what tells may not answer yet
  if h and mtplx_health(h) then
    found.kind, found.via = "mtplx", "/health"
    if type(h.model) == "string" then found.model = h.model end
  end
  for _, r in ipairs(found.kind and {} or routes) do
    local p = get(at(r[1]), o)
    local kind = p and r[2](p, found)
    if kind then
      found.kind, found.via = kind, r[1]
      break
    end
  end
  local models_status
  if not found.model then
    local list, st = select_status(get(at("models"), o))
    found.models, models_status = ids_of(list), st
    if found.models and not found.kind then found.kind, found.via = "openai", "/v1/models" end
    found.model = found.models and found.models[1] or found.props_model
  end
  found.props_model = nil
  -- nothing told, and the routes a client needs turned us away: the key is missing or wrong
  local denied = { [401] = true, [403] = true }
  if not found.kind and denied[status] and denied[models_status] then found.denied = models_status end
  found.kind = found.kind or "unknown"
  found.dialect = M.dialects[found.kind]
  return found
end

---One line for a person: `llama-server (model 'qwen3', via /props)`.
---@param found mirza.Detected
---@return string
function M.describe(found)
  local bits = {}
  if found.model then bits[#bits + 1] = ("model '%s'"):format(found.model) end
  if found.version then bits[#bits + 1] = "version " .. found.version end
  if found.via then bits[#bits + 1] = "via " .. found.via end
  if found.completed then bits[#bits + 1] = "/v1 added to the base URL" end
  local kind = found.kind == "unknown" and "a server of unknown kind" or found.kind == "openai"
      and "an OpenAI-compatible server" or found.kind
  return #bits > 0 and ("%s (%s)"):format(kind, table.concat(bits, ", ")) or kind
end

return M
