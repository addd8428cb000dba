--- mirza.capacity: what a server announces of how many requests it serves
--- at once, read at the start of a batch (issue 41). A ceiling for the
--- endpoint's limit (mirza.limit), never the limit itself: the most a
--- server serves at once is not always the load it serves best.
---
--- What each server says:
---   llama-server  GET /props `total_slots` (its -np): requests past it wait
---                 in its queue, headers unsent.
---   MTPLX         GET /health (`ok`, `model`, `startup`): its scheduler is
---                 serial by default and /health does not say otherwise, so
---                 the limit starts at 1 (no ceiling: it grows if the rate does).
---   vLLM          nothing of its --max-num-seqs: /metrics has
---                 vllm:num_requests_running and _waiting, the load of the
---                 moment, not the most it runs.
---   Ollama        nothing: OLLAMA_NUM_PARALLEL is read by the server only.
--- A probe that fails, times out (within `timeout`, 1 s) or answers
--- something else says "no ceiling known": never an error.
---
--- The load of the moment: vLLM's /metrics `vllm:num_requests_waiting`,
--- llama-server's `llamacpp:requests_deferred` (with --metrics: its
--- /props says `endpoint_metrics`) count the requests its queue holds
--- (`waiting`); a batch polls it, and its limiter backs off while some
--- wait (mirza.limit's `waiting`).
local mirza = require "mirza"
local json = require("mirza.core").json
local resolve = require("mirza.url").resolve

local C = {}

C.TIMEOUT = 1 -- seconds a probe may take, its connection included

-- GET a route of the endpoint: its decoded JSON object, or nil.
local function get_text(url, route, opts)
  return (mirza.request { url = (resolve(url, route)), method = "GET", timeout = opts.timeout or C.TIMEOUT,
    deadline = opts.timeout or C.TIMEOUT, api_key = opts.api_key, headers = opts.headers, record = false })
end

local function get(url, route, opts)
  local body = get_text(url, route, opts)
  local v = body and json.decode(body)
  return type(v) == "table" and v or nil
end

-- The gauges of each server's /metrics that count the requests it queues
-- and those it runs.
local WAITING = { vllm = "vllm:num_requests_waiting", llama = "llamacpp:requests_deferred" }
local RUNNING = { vllm = "vllm:num_requests_running", llama = "llamacpp:requests_processing" }

-- The sum of a Prometheus gauge's samples in a /metrics text (every label
-- set: vLLM has one per model), nil when it has none.
local function gauge(text, name)
  local sum
  for line in text:gmatch("[^\n]+") do
    if line:sub(1, #name) == name then
      local rest = line:sub(#name + 1)
      local v = rest:match("^%b{}%s+(%S+)") or rest:match("^%s+(%S+)")
      v = tonumber(v)
      if v then sum = (sum or 0) + v end
    end
  end
  return sum
end

---@class mirza.Capacity
---@field ceiling integer|nil the most requests it serves at once, when it says
---@field source string|nil where it said so ("/props total_slots")
---@field start integer|nil a limit to start from (MTPLX: 1)
---@field kind string|nil "llama-server", "mtplx", "vllm"
---@field metrics "vllm"|"llama"|nil its /metrics counts the requests it queues (`C.waiting`)

---What the server at `url` (as its user wrote it: mirza.url) announces.
---Inside a mirza.loop task the probes yield: probe each endpoint in a
---task of its own and they run at once. nil when it announces nothing
---(or does not answer in time).
---@param url string
---@param opts? {api_key?: string, headers?: table, timeout?: number}
---@return mirza.Capacity|nil
function C.probe(url, opts)
  opts = opts or {}
  local props = get(url, "/props", opts)
  local slots = props and math.tointeger(props.total_slots)
  if slots and slots >= 1 then
    return { ceiling = slots, source = "/props total_slots", kind = "llama-server",
      metrics = props.endpoint_metrics == true and "llama" or nil }
  end
  if props then return nil end -- a /props without slots: some other server's
  local h = get(url, "/health", opts)
  if h and (h.startup ~= nil or h.ok ~= nil) and h.model ~= nil then
    return { start = 1, source = "/health (MTPLX: serial by default)", kind = "mtplx",
      metrics = C.waiting(url, "vllm", opts) and "vllm" or nil } -- mirza-sim --vllm-metrics poses as vLLM
  end
  if C.waiting(url, "vllm", opts) then return { kind = "vllm", metrics = "vllm" } end
  return nil
end

---How many requests the server's queue holds now, from its /metrics
---(`kind`: `probe`'s `metrics`); nil when it does not say. Second: how
---many it runs (vLLM's num_requests_running, llama-server's
---requests_processing), when it says.
---@param url string
---@param kind "vllm"|"llama"
---@param opts? {api_key?: string, headers?: table, timeout?: number}
---@return number|nil waiting
---@return number|nil running
function C.waiting(url, kind, opts)
  local text = get_text(url, "/metrics", opts or {})
  if not text then return nil end
  local waiting = gauge(text, WAITING[kind])
  if waiting == nil then return nil end
  return waiting, gauge(text, RUNNING[kind])
end

return C
