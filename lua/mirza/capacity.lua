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
local mirza = require "mirza"
local json = require("mirza.core").json
local resolve = require("mirza.url").resolve

local C = {}

C.TIMEOUT = 1 -- seconds a probe may take, its connection included

-- GET a route of the endpoint: its decoded JSON object, or nil.
local function get(url, route, opts)
  local body = mirza.request { url = (resolve(url, route)), method = "GET", timeout = opts.timeout or C.TIMEOUT,
    deadline = opts.timeout or C.TIMEOUT, api_key = opts.api_key, headers = opts.headers, record = false }
  local v = body and json.decode(body)
  return type(v) == "table" and v or nil
end

---@class mirza.Capacity
---@field ceiling integer|nil the most requests it serves at once, when it says
---@field source string|nil where it said so ("/props total_slots")
---@field start integer|nil a limit to start from (MTPLX: 1)
---@field kind string|nil "llama-server", "mtplx"

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
  if slots and slots >= 1 then return { ceiling = slots, source = "/props total_slots", kind = "llama-server" } end
  if props then return nil end -- a /props without slots: some other server's
  local h = get(url, "/health", opts)
  if h and (h.startup ~= nil or h.ok ~= nil) and h.model ~= nil then
    return { start = 1, source = "/health (MTPLX: serial by default)", kind = "mtplx" }
  end
  return nil
end

return C
