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

return F
