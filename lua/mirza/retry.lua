--- mirza.retry: what a failed request's error code means, and how long
--- to wait before the next try — one table and one formula for every user.
---
--- A failure is its error code (`"refused"`, `"closed"`, `"timeout"`,
--- `"exited"`, `"server"`, `"io"`, `"http"` with its status, ...) and
--- `classify` answers the three questions asked of it:
---
---   retry  is another attempt worth it (mirza.batch)? The transport
---          failures, a dead daemon, a server error frame, HTTP 408, 409,
---          429 and 5xx; never another 4xx or a bad frame.
---   blame  whose failure is it (mirza.pool)? "endpoint" (its own: refused,
---          cut, timeout, a daemon gone, HTTP 502/503/504: rest it),
---          "request" (another 5xx: it answered, perhaps to this request
---          only: suspect it), nil (the request's own: a 4xx, a bad frame).
---          An engine's turn fails over to another endpoint on either.
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

---@class mirza.FailureClass
---@field retry boolean
---@field blame "endpoint"|"request"|nil
---@field gone boolean

-- The classes (shared, never modified).
local TRANSPORT = { retry = true, blame = "endpoint", gone = true } -- refused, cut, timeout
local EXITED = { retry = true, blame = "endpoint", gone = false }   -- the daemon's death, diagnosed
local SERVER = { retry = true, blame = nil, gone = false }          -- an error frame in a 200 stream
local LOCAL_IO = { retry = false, blame = nil, gone = true }        -- a local read/write failed
local OVERLOAD = { retry = true, blame = nil, gone = false }        -- HTTP 408, 409, 429
local UNAVAILABLE = { retry = true, blame = "endpoint", gone = false } -- HTTP 502, 503, 504
local FAILED = { retry = true, blame = "request", gone = false }     -- another HTTP 5xx
local FINAL = { retry = false, blame = nil, gone = false }          -- the request's own

---Error code -> class, for every code but "http" (by status, see classify).
F.CODES = { refused = TRANSPORT, closed = TRANSPORT, timeout = TRANSPORT, exited = EXITED, server = SERVER,
  io = LOCAL_IO }

---HTTP status -> class, for those that are not FINAL below 500.
F.STATUS = { [408] = OVERLOAD, [409] = OVERLOAD, [429] = OVERLOAD, [502] = UNAVAILABLE, [503] = UNAVAILABLE,
  [504] = UNAVAILABLE }

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

---Is a failed attempt worth retrying?
---@param code string|nil
---@param status integer|nil
---@return boolean
function F.retryable(code, status)
  return F.classify(code, status).retry
end

---Whose failure it is: "endpoint", "request" or nil (see the module comment).
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
