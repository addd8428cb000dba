--- mirza.retry: what a failed request's error code means, and how long
--- to wait before the next try — one table and one formula for every user.
---
--- A failure is its error code (`"refused"`, `"closed"`, `"timeout"`,
--- `"exited"`, `"server"`, `"io"`, `"http"` with its status, ...) and
--- falls in one of four classes (`class`), so that a class of bad requests
--- never stops the good ones:
---
---   "unsupported"  HTTP 404, 405, 501: the server has no such route (a
---                  llama-server without --embeddings, MTPLX and
---                  /v1/completions). Never retried; says nothing against
---                  the endpoint, which serves its other routes.
---   "item"         the request's own: another 4xx, a bad frame, a local
---                  failure ("io": no socket, out of memory), anything
---                  unknown. Never retried, never held against the endpoint.
---   "retry"        the request failed where the endpoint works: HTTP 408,
---                  409, 429 (back-pressure: wait its Retry-After), another
---                  5xx, an error frame in a 200 stream. Retried after a
---                  backoff; the endpoint keeps serving the others. A 5xx
---                  or an error frame is a server `fault`: a pool rests an
---                  endpoint that faults on every request (mirza.pool).
---   "endpoint"     the endpoint's own: refused, cut, timeout, a daemon
---                  gone, HTTP 502/503/504. Retried, elsewhere when another
---                  endpoint is healthy; the endpoint is rested and counts
---                  toward "every endpoint down".
---
--- `classify` gives the class and the questions asked of it:
---
---   retry  is another attempt worth it (mirza.batch)? "retry" and
---          "endpoint".
---   blame  does an engine's turn fail over to another endpoint? "endpoint"
---          (its own), "request" (an HTTP 5xx: another daemon may answer
---          it), nil (no use: the request's own, or a 408/409/429/error
---          frame, which the same daemon answers after a wait).
---   fault  does it count toward an endpoint's run of server faults (a 5xx,
---          an error frame: mirza.pool's "5xx on everything")?
---   gone   may the daemon behind it have died (mirza.daemon)? The
---          transport failures and local I/O: the supervisor then looks at
---          the process and reports "exited" with its status.
---
--- `backoff(n, base, max, lo, hi)` is the exponential wait before try
--- number n+1: base * 2^(n-1), capped at max, times a jitter drawn in
--- [lo, hi] (one `math.random()` call) when given. Its users: a batch
--- retry (0.5 s doubling to 30 s, jitter [0.5, 1]), a pool's rest (0.5 s to
--- 30 s, [0.75, 1.25]), a daemon restart (`restart.backoff`, no cap, no
--- jitter), a turn waiting out its own session's 409 (50 ms to 0.8 s).
---
--- `delay(n, retry_after, base, max)` is the wait before the next try of a
--- request the server answered with back-pressure: its Retry-After when
--- it gave one, else that backoff jittered in [0.5, 1]. A batch's retry,
--- an engine turn's wait on a 429 and `mirza.collect`'s retries take it.
---
--- `stream(open, req, policy, state)` is how `mirza.collect` retries: a
--- stream over `open(req)` that, when a request fails before anything
--- arrived (no text, reasoning or tool call) with a failure worth
--- retrying, waits `delay` and sends it again, up to `policy.retries`
--- times — as the OpenAI SDKs do (2 retries, 0.5 s doubling to 8 s, a
--- Retry-After honoured up to 60 s). A timeout is not retried (its clock
--- is the caller's bound), nor a failure once text has come (it was
--- handed over), nor a Retry-After longer than `policy.wait_max` (the
--- caller sees it in the failure).
local F = {}

---@alias mirza.FailureClassName "unsupported"|"item"|"retry"|"endpoint"

---@class mirza.FailureClass
---@field class mirza.FailureClassName
---@field retry boolean
---@field blame "endpoint"|"request"|nil
---@field fault boolean
---@field gone boolean

-- A class (shared, never modified).
local function class(name, blame, fault, gone)
  return { class = name, retry = name == "retry" or name == "endpoint", blame = blame, fault = fault, gone = gone }
end

local TRANSPORT = class("endpoint", "endpoint", false, true) -- refused, cut, timeout
local EXITED = class("endpoint", "endpoint", false, false)     -- the daemon's death, diagnosed
local UNAVAILABLE = class("endpoint", "endpoint", false, false) -- HTTP 502, 503, 504
local SERVER = class("retry", nil, true, false)                -- an error frame in a 200 stream
local FAILED = class("retry", "request", true, false)          -- another HTTP 5xx
local OVERLOAD = class("retry", nil, false, false)             -- HTTP 408, 409, 429
local UNSUPPORTED = class("unsupported", nil, false, false)    -- HTTP 404, 405, 501
local LOCAL_IO = class("item", nil, false, true)               -- a local read/write failed, no socket
local FINAL = class("item", nil, false, false)                 -- the request's own

---Error code -> class, for every code but "http" (by status, see classify).
F.CODES = { refused = TRANSPORT, closed = TRANSPORT, timeout = TRANSPORT, exited = EXITED, server = SERVER,
  io = LOCAL_IO }

---HTTP status -> class, for those that are not FINAL below 500 (FAILED from 500 up).
F.STATUS = { [404] = UNSUPPORTED, [405] = UNSUPPORTED, [501] = UNSUPPORTED, [408] = OVERLOAD, [409] = OVERLOAD,
  [429] = OVERLOAD, [502] = UNAVAILABLE, [503] = UNAVAILABLE, [504] = UNAVAILABLE }

---What a failure means (see the module comment). Never allocates.
---@param code string|nil error code
---@param status integer|nil HTTP status (code "http")
---@return mirza.FailureClass
function F.classify(code, status)
  if code == "http" then
    local c = F.STATUS[status]
    if c then return c end
    return (status or 0) >= 500 and FAILED or FINAL
  end
  return F.CODES[code] or FINAL
end

---The class of a failure: "unsupported" (no such route: record it at
---once), "item" (the request's own: record it), "retry" (retry it after a
---backoff; the endpoint keeps serving) or "endpoint" (retry it elsewhere;
---the endpoint rests). See the module comment.
---@param code string|nil error code
---@param status integer|nil HTTP status (code "http")
---@return mirza.FailureClassName
function F.class(code, status)
  return F.classify(code, status).class
end

---Is a failed attempt worth retrying? ("retry" and "endpoint" classes)
---@param code string|nil
---@param status integer|nil
---@return boolean
function F.retryable(code, status)
  return F.classify(code, status).retry
end

---Whether an engine's turn fails over: "endpoint", "request" (an HTTP
---5xx) or nil (see the module comment).
---@param code string|nil
---@param status integer|nil
---@return "endpoint"|"request"|nil
function F.blame(code, status)
  return F.classify(code, status).blame
end

---May the daemon behind the request have died?
---@param code string|nil
---@return boolean
function F.gone(code)
  return F.classify(code).gone
end

---Seconds to wait before try number n+1 (n >= 1 failures so far):
---`base * 2^(n-1)`, at most `max` (nil: no cap), times a jitter drawn in
---[lo, hi] when `lo` is given.
---@param n integer
---@param base number
---@param max? number
---@param lo? number
---@param hi? number
---@return number seconds
function F.backoff(n, base, max, lo, hi)
  local d = base * 2 ^ (n - 1)
  if max and d > max then d = max end
  if lo then d = d * (lo + (hi - lo) * math.random()) end
  return d
end

---Seconds to wait before try n+1 (n >= 1 failures so far) of a request
---the server answered with `retry_after` (seconds; nil: none): that, plus
---up to 50 ms of jitter (requests told the same time do not all come back
---at once), else `backoff(n, base, max, 0.5, 1)`.
---@param n integer
---@param retry_after number|nil
---@param base number
---@param max? number
---@return number seconds
function F.delay(n, retry_after, base, max)
  if retry_after and retry_after >= 0 then return retry_after + 0.05 * math.random() end
  return F.backoff(n, base, max, 0.5, 1)
end

---@class mirza.RetryPolicy
---@field retries integer tries after the first (0: none)
---@field base number first backoff, seconds (doubles)
---@field max number longest backoff, seconds
---@field wait_max number longest Retry-After waited out, seconds (a longer one ends the retries)

---What `mirza.collect` does by default: the OpenAI SDKs' 2 retries, 0.5 s
---doubling to 8 s, a Retry-After up to 60 s.
---@type mirza.RetryPolicy
F.REQUEST = { retries = 2, base = 0.5, max = 8, wait_max = 60 }

---@class mirza.RetryState
---@field retries integer tries made after the first, over every stream of the state
---@field failure table|nil the last error event a stream of the state gave

-- A stream that sends its request again after a transient failure (`stream`).
local Retrying = {}
Retrying.__index = Retrying

-- The wait before sending the request again after `ev` (an error event
-- before anything arrived), or nil when it is not to be sent again.
function Retrying:_wait(ev)
  local p = self.policy
  if self.n >= p.retries or ev.code == "timeout" or not F.classify(ev.code, ev.status).retry then return nil end
  local ra = tonumber(ev.retry_after)
  if ra and ra > p.wait_max then return nil end
  local wait = F.delay(self.n + 1, ra, p.base, p.max)
  if self.until_ and self.mirza.now() + wait >= self.until_ then return nil end -- past the caller's deadline
  return wait
end

-- Send the request again after `wait` seconds; the deadline is what is
-- left of the caller's.
function Retrying:_again(wait)
  local mirza = self.mirza
  self.s:close()
  mirza.sleep(wait)
  self.n, self.state.retries = self.n + 1, self.state.retries + 1
  local req = self.req
  if self.until_ then
    req = require("mirza.util").copy(req)
    req.deadline = self.until_ - mirza.now()
  end
  self.s = self.open(req)
end

---The next event (`mirza.Stream.next`); a failure worth retrying before
---anything arrived is not handed out: the request is sent again.
---@return table|nil ev
function Retrying:next(...)
  while true do
    local ev = self.s:next(...)
    local ty = ev and ev.type
    if ty == "error" then self.state.failure = ev end
    if self.got or ty ~= "error" then
      if ty == "text" or ty == "think" or ty == "tool_call" then self.got = true end
      return ev
    end
    local wait = self:_wait(ev)
    if not wait then return ev end
    self:_again(wait)
  end
end

---`next` as a function of no arguments, for a reader that takes every
---event (mirza.result.drain): once text came, the stream's own `next`
---without this one's checks (an error then is not retried; the reader's
---reducer keeps it).
---@return fun(): table|nil
function Retrying:puller()
  return function()
    if self.got then return self.s:next() end
    return self:next()
  end
end

---Close the request in flight (idempotent; also `<close>`).
function Retrying:close()
  self.s:close()
end
Retrying.__close = Retrying.close

---A stream over `open(req)` that sends the request again, after `delay`,
---when it fails before anything arrived with a failure worth retrying (see
---the module comment); `state` (shared by the streams of one call) counts
---the retries and keeps the last failure. Only `next` and `close`.
---@param open fun(req: table): mirza.Stream
---@param req table
---@param policy mirza.RetryPolicy
---@param state mirza.RetryState
---@return table stream
function F.stream(open, req, policy, state)
  local mirza = require "mirza"
  local limit = tonumber(req.deadline)
  local s = open(req)
  return setmetatable({ s = s, open = open, req = req, policy = policy, state = state, n = 0, got = false,
    mirza = mirza, until_ = limit and mirza.now() + limit or nil }, Retrying)
end

return F
