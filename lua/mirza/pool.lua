--- mirza.pool: several endpoints (daemons, machines) behind one acquire.
---
--- A request goes to the healthy endpoint with the fewest requests in
--- flight, never past that endpoint's own limit (its daemon's parallel
--- slots: llama-server `-np N`, vLLM's batch, MTPLX's scheduler). An endpoint
--- whose request failed in a way that blames the endpoint (refused, cut,
--- timeout, 5xx) is rested with exponential backoff; when the rest is over
--- it is probed with one request at a time until one succeeds (a
--- half-open circuit breaker). A task waiting for a slot is suspended on a
--- `mirza.loop` condition, so the pool holds no thread and no busy loop.
---
--- State lives in the pool object (`pool.new`), none in the module.
local mirza = require "mirza"
local loop = require "mirza.loop"

local P = {}

---@class mirza.Endpoint
---@field base string     base URL, e.g. "http://10.0.0.2:8080/v1"
---@field limit integer   most requests in flight
---@field inflight integer
---@field peak integer     most requests ever in flight at once
---@field fails integer   consecutive failures (0: healthy)
---@field rest_until number mirza.now() before which it gets no request
---@field served integer  requests completed
---@field failed integer  requests that failed because of the endpoint

---@class mirza.Pool
---@field endpoints mirza.Endpoint[]
local Pool = {}
Pool.__index = Pool

P.defaults = {
  limit = 4,      -- per endpoint, unless given with it
  rest = 0.5,     -- first rest after a failure, seconds
  rest_max = 30,  -- longest rest
}

-- "http://h:p", "http://h:p/", "http://h:p/v1" -> "http://h:p/v1"
local function normalize(base)
  base = base:gsub("/+$", "")
  if not base:find("/v%d+$") then base = base .. "/v1" end
  return base
end

---A pool over endpoints given as base URLs or `{url=, limit=}` tables.
---@param endpoints (string|{url: string, limit?: integer})[]
---@param opts? {limit?: integer, rest?: number, rest_max?: number, loop?: mirza.Loop}
---@return mirza.Pool
function P.new(endpoints, opts)
  opts = opts or {}
  if type(endpoints) == "string" then endpoints = { endpoints } end
  if type(endpoints) ~= "table" or #endpoints == 0 then error("mirza.pool: at least one endpoint", 2) end
  local self = setmetatable({
    endpoints = {},
    rest = opts.rest or P.defaults.rest,
    rest_max = opts.rest_max or P.defaults.rest_max,
    cond = loop.condition(opts.loop),
  }, Pool)
  for i, e in ipairs(endpoints) do
    local url, limit = e, nil
    if type(e) == "table" then url, limit = e.url, e.limit end
    if type(url) ~= "string" then error(("mirza.pool: endpoint %d has no url"):format(i), 2) end
    self.endpoints[i] = { base = normalize(url), limit = limit or opts.limit or P.defaults.limit,
      inflight = 0, peak = 0, fails = 0, rest_until = 0, served = 0, failed = 0, index = i }
  end
  return self
end

---Total request slots (the batch's useful concurrency).
---@return integer
function Pool:capacity()
  local n = 0
  for _, e in ipairs(self.endpoints) do n = n + e.limit end
  return n
end

-- The endpoint's limit right now: 1 while probing after a rest.
local function current_limit(e)
  return e.fails > 0 and 1 or e.limit
end

-- Whether `e` can take a request now.
local function free(e, now)
  return e.rest_until <= now and e.inflight < current_limit(e)
end

-- The best endpoint now, or nil and the time the next rest ends.
function Pool:_pick(now)
  local best, wake = nil, nil
  for _, e in ipairs(self.endpoints) do
    if e.rest_until > now then
      wake = math.min(wake or math.huge, e.rest_until)
    elseif free(e, now) and (not best or e.inflight < best.inflight
        or (e.inflight == best.inflight and e.served < best.served)) then
      best = e
    end
  end
  return best, wake
end

---Take a slot on the best endpoint, waiting (suspending the task) while
---none is free or every endpoint rests. nil, "timeout" after `timeout`.
---`prefer` (an endpoint of this pool) is taken whenever it is free: an
---engine keeps its conversation on the daemon that holds its session
---cache while that one is healthy and has room.
---@param timeout? number seconds
---@param prefer? mirza.Endpoint
---@return mirza.Endpoint|nil endpoint
---@return string? message
---@return string? code
function Pool:acquire(timeout, prefer)
  local t_end = timeout and mirza.now() + timeout
  while true do
    local now = mirza.now()
    local e, wake
    if prefer and free(prefer, now) then e = prefer else e, wake = self:_pick(now) end
    if e then
      e.inflight = e.inflight + 1
      e.peak = math.max(e.peak, e.inflight)
      return e
    end
    local left = t_end and t_end - now
    if left and left <= 0 then return nil, "no endpoint available in time", "timeout" end
    if wake then left = math.min(left or math.huge, wake - now + 0.001) end
    self.cond:wait(left)
  end
end

---Does this failure blame the endpoint (rest it) rather than the request?
---@param code string|nil error code of the failed request
---@param status integer|nil HTTP status
---@return boolean
function P.endpoint_failure(code, status)
  if code == "refused" or code == "closed" or code == "timeout" or code == "exited" then return true end
  return code == "http" and status ~= nil and status >= 500
end

---Give the slot back. `ok` true, or a failure that is the request's own
---(a 4xx): the endpoint answered, so it is healthy (a probe succeeded);
---a failure with `blame` true rests it.
---@param e mirza.Endpoint
---@param ok boolean
---@param blame? boolean the failure was the endpoint's
function Pool:release(e, ok, blame)
  e.inflight = e.inflight - 1
  if ok or not blame then -- it answered: reachable and healthy
    e.fails = 0
    if ok then e.served = e.served + 1 end
  else
    e.failed, e.fails = e.failed + 1, e.fails + 1
    local rest = math.min(self.rest_max, self.rest * 2 ^ (e.fails - 1))
    e.rest_until = mirza.now() + rest * (0.75 + 0.5 * math.random())
  end
  self.cond:broadcast() -- a slot, or the pick order, changed
end

---A line per endpoint: base, in flight/limit, served, failures, resting.
---@return string
function Pool:describe()
  local out, now = {}, mirza.now()
  for _, e in ipairs(self.endpoints) do
    out[#out + 1] = ("%s %d/%d served %d failed %d%s"):format(mirza.redact_url(e.base), e.inflight, e.limit,
      e.served, e.failed,
      e.rest_until > now and (" resting %.1fs"):format(e.rest_until - now) or "")
  end
  return table.concat(out, "\n")
end

return P
