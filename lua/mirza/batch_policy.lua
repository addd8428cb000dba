--- mirza.batch_policy: what a batch does with a failed attempt, and the
--- progress line (mirza.batch).
---
--- A failure is judged by its class (mirza.retry.class), never one class
--- for all: a route the endpoint does not have ("unsupported": 404, 405,
--- 501) is recorded at once for that item, tried on another endpoint that
--- may have it first, and never held against the endpoint; an item's own
--- failure (another 4xx) is recorded; a failure where the endpoint works
--- (a 5xx or an error frame given to some items while others are
--- answered, 408/409/429) is retried with a backoff while the endpoint
--- serves the rest; only the endpoint's own failures (refused, cut,
--- timeouts, 502/503/504, or faults on every request: mirza.pool) rest it
--- and count toward "every endpoint down". A run stops only when no
--- endpoint is reachable, every one is down for `give_up_after` seconds,
--- the model cannot be learnt, or the server wants a key it did not get.
local mirza = require "mirza"
local core = require "mirza.core"
local loop = require "mirza.loop"
local retry = require "mirza.retry"
local attempt = require "mirza.batch_attempt"
local copy = require("mirza.util").copy

local P = {}

---Seconds to wait before retry number `n` (1-based): the server's
---Retry-After when given, else exponential backoff with jitter (mirza.retry.delay).
---@param n integer
---@param opts table retry_base, retry_max
---@param retry_after? number
---@return number
function P.backoff(n, opts, retry_after)
  return retry.delay(n, retry_after, opts.retry_base, opts.retry_max)
end

---Whether running the same command again may get a failed item: a
---failure where the server or the network may do better next time (the
---"retry" and "endpoint" classes of mirza.retry: a 5xx, a 429, a refused
---connection, a cut stream, a timeout) or a model that may answer
---otherwise (a schema violation). Not an item's own failure (a bad input
---line, another 4xx, a bad frame), a server that wants a key (401, 403) or
---lacks the route ("unsupported"): a rerun fails those the same way until
---their cause is fixed.
---@param code string|nil
---@param status integer|nil
---@return boolean
function P.rerun_helps(code, status)
  return code == "schema" or retry.retryable(code, status)
end

---The kind a failed item is counted under in the summary: its code, with
---the HTTP status for "http" ("http 401").
---@param r table the failed attempt (code, status)
---@return string
function P.failure_kind(r)
  local code = r.code or "error"
  if code == "http" and r.status then return "http " .. r.status end
  return code
end

---"42s", "6m25s", "1h05m", "?"
---@param s number|nil seconds
---@return string
function P.fmt_time(s)
  if not s or s ~= s or s == math.huge then return "?" end
  s = math.floor(s + 0.5)
  if s >= 3600 then return ("%dh%02dm"):format(s // 3600, s % 3600 // 60) end
  if s >= 60 then return ("%dm%02ds"):format(s // 60, s % 60) end
  return s .. "s"
end

-- Whether the whole run stops (ctx.abort set, the other workers
-- cancelled): no endpoint ever answered and all refuse; every endpoint
-- down for `give_up_after` seconds; the model cannot be learnt or the
-- server wants a key (r).
local function give_up(ctx, r)
  if ctx.abort then return true end
  local pool, o = ctx.pool, ctx.opts
  local why = pool:unreachable()
  if why then
    ctx.abort = { code = "unreachable", message = "no endpoint reachable: " .. why
      .. "; start the daemon or correct the endpoint URL (--endpoint), then run again" }
  elseif r.code == "model" or r.code == "auth" then
    ctx.abort = { code = r.code, message = r.message }
  else
    local down, which = pool:down_for()
    if down and o.give_up_after and down >= o.give_up_after then
      ctx.abort = { code = "down", message = ("every endpoint down for %s (%s)"):format(P.fmt_time(down), which) }
    end
  end
  if not ctx.abort then return false end
  local me = loop.current()
  for _, t in ipairs(ctx.workers) do
    if t ~= me then t:cancel("batch stopped: " .. ctx.abort.message, "cancelled") end
  end
  return true
end

-- The endpoints that said they do not serve a kind of line: ctx.unsupported[kind][e] = true.
local function unsupported_on(ctx, kind)
  local u = ctx.unsupported[kind]
  if not u then
    u = {}
    ctx.unsupported[kind] = u
  end
  return u
end

-- One attempt of `job` ({item, n, tried}) on the best endpoint for it
-- (another than those it failed on, while one is healthy): its result.
local function try(job, ctx)
  local pool = ctx.pool
  local avoid = job.tried
  local skip = ctx.unsupported[job.item.kind]
  if skip then -- never where its route is missing, while another may have it
    avoid = copy(job.tried)
    for e in pairs(skip) do avoid[e] = true end
  end
  local key = ctx.opts.affinity ~= false and job.item.key or nil
  local e = pool:acquire(nil, { avoid = avoid, key = key })
  -- the daemon's prompt slots as the pool believes them: a prefix new to
  -- e is a cold copy until its first token (its prefill done); the items
  -- sharing it follow then, never as a second cold copy beside it
  -- (and the request's record for e's limiter: its first token, its answer)
  local ticket = pool:sent(key, e)
  local function first() pool:prefilled(e, ticket) end
  -- a request of the limiter's start round measures the server's step too
  local step = pool:wants_step(e, ticket) and function(dt) pool:stepped(e, ticket, dt) end or nil
  -- the slot goes back even when the task is cancelled mid-attempt
  local slot <close> = setmetatable({}, { __close = function(self)
    pool:finished(e, ticket)
    if not self.released then pool:abandon(e, ticket) end
  end })
  local ok, r = pcall(attempt.attempt, job.item, e, ctx.opts, first, step)
  if not ok then r = { code = "error", message = tostring(r), t0 = mirza.now() } end
  slot.released = true
  pool:report(e, r, job.item.custom_id, ticket)
  job.tried[e], job.n = true, job.n + 1
  r.attempts, r.e = job.n, e
  job.t0 = job.t0 or r.t0
  r.duration_s = mirza.now() - job.t0 -- every attempt so far and the waits between them
  return r
end

-- Whether an unsupported-class failure says the route is missing, not the
-- line's own: a 405 or a 501, or a 404 that names no model (vLLM, Ollama
-- and OpenAI answer 404 for a model they do not have: that is the line's).
local function route_missing(r)
  if r.status ~= 404 then return true end
  -- the server's own words only: the message starts with the URL, which may hold "model" (models.example.com)
  local err = type(r.error) == "table" and r.error or {}
  local fin = type(r.final) == "table" and r.final or {}
  local text = table.concat({ tostring(err.message or ""), tostring(err.code or ""), tostring(err.type or ""),
    type(fin.body) == "string" and fin.body or "" }, " ")
  return not text:lower():find("model", 1, true)
end

-- Whether some endpoint may still serve this kind of line.
local function served_somewhere(ctx, kind)
  local u = ctx.unsupported[kind] or {}
  for _, e in ipairs(ctx.pool.endpoints) do
    if not u[e] then return true end
  end
  return false
end

-- The record's message for a line whose route no endpoint serves.
local function unsupported_message(item, r)
  local route = item.url or ("/v1/" .. (item.kind == "chat" and "chat/completions" or item.kind))
  local msg = r.message or ("HTTP " .. tostring(r.status))
  local hint = item.kind == "embeddings" and not msg:find("--embeddings", 1, true)
    and " (llama-server serves it when started with --embeddings)" or ""
  return ("%s: the server does not serve %s%s: give an --endpoint that does, then run the same command again"
    .. " (only the failed items are redone)"):format(msg, route, hint)
end

---Run the job's next attempt: the item's result when it is over; nil and
---the time of its next attempt when it is to be retried (the worker takes
---other items meanwhile: a backoff holds no slot and no worker); nil
---alone when the run stops (give_up): the item stays for a rerun.
---@param job table {item, n, tried, answers?, t0?}
---@param ctx table the run
---@return table|nil result
---@return number? at
function P.step(job, ctx)
  local item, opts = job.item, ctx.opts
  if item.invalid then return { code = "input", message = item.invalid, attempts = 0 } end
  if not served_somewhere(ctx, item.kind) then -- known at once: no request (the answer that said so kept)
    local r = ctx.unsupported_result[item.kind] -- recorded without an HTTP answer of its own: response null
    return { code = "unsupported", message = r.message, attempts = 0, endpoint = r.endpoint }
  end
  local r = try(job, ctx)
  if r.ok then return r end
  if r.code == "schema" and r.answered and item.kind == "chat" and (job.answers or 1) < opts.attempts then
    -- the violation told to the model, which answers again at once (no backoff): the
    -- retry's messages are the item's, its answer, and what did not fit
    job.answers = (job.answers or 1) + 1
    local body = copy(item.body)
    local msgs = {}
    for i, m in ipairs(item.body.messages or {}) do msgs[i] = m end
    msgs[#msgs + 1] = { role = "assistant", content = r.text or "" }
    msgs[#msgs + 1] = { role = "user", content = require("mirza.structured").retry_message(r.message) }
    body.messages = msgs
    local again = copy(item)
    again.body = body
    job.item, job.tried = again, {} -- the daemon answered: no reason to avoid it
    ctx.stats.retries = ctx.stats.retries + 1
    return nil, mirza.now()
  end
  local class = retry.class(r.code, r.status)
  if class == "unsupported" and r.code ~= "model" and r.code ~= "auth" and route_missing(r) then
    unsupported_on(ctx, item.kind)[r.e] = true
    r.code, r.message = "unsupported", unsupported_message(item, r)
    ctx.unsupported_result[item.kind] = r
    if served_somewhere(ctx, item.kind) and job.n <= opts.max_retries then -- another endpoint may have it
      -- at once the first time; then (that endpoint resting, the pool sending it here again) as a retry
      return nil, mirza.now() + (job.n > 1 and P.backoff(job.n - 1, opts) or 0)
    end
    return r
  end
  if give_up(ctx, r) then return nil end
  if not retry.retryable(r.code, r.status) or job.n > opts.max_retries then return r end
  ctx.stats.retries = ctx.stats.retries + 1
  return nil, mirza.now() + P.backoff(job.n, opts, r.retry_after)
end

---The progress line: done/total, errors, retries, aggregate tok/s, ETA;
---with the run's options `o`, each endpoint's limit and how it was found
---(`P.limits`), and when every endpoint of its pool is down and when the
---run gives up.
---@param st table batch stats
---@param o? table the run's options (pool, give_up_after)
---@return string
function P.progress_line(st, o)
  local dt = mirza.now() - st.t0
  local rate = dt > 0 and st.tokens / dt or 0
  local per_item = st.done_now > 0 and dt / st.done_now or nil
  local eta = per_item and per_item * (st.total - st.skipped - st.done_now)
  local line = ("batch: %d/%d done, %d errors, %d retries, %d cut, %.0f tok/s, ETA %s"):format(
    st.skipped + st.done_now, st.total, st.errors, st.retries, st.cut, rate, P.fmt_time(eta))
  line = line .. P.limits(o and o.pool)
  local down = o and o.pool and o.pool:down_for()
  if not down then return line .. P.endpoints_down(o and o.pool) end
  local quit = o.give_up_after and (", giving up in %s"):format(P.fmt_time(math.max(0, o.give_up_after - down)))
    or ""
  return ("%s; every endpoint down for %s%s"):format(line, P.fmt_time(down), quit)
end

---What the progress line says of the endpoints' limits, as they move:
---`; limit 16 (auto, ceiling 64 from /props total_slots)` for one
---endpoint, `; http://gpu1:8080/v1 limit 16 (...); http://gpu2:8080/v1
---@8 fixed` for several; "" without a pool.
---@param pool? mirza.Pool
---@return string
function P.limits(pool)
  if not pool then return "" end
  local out, many = {}, #pool.endpoints > 1
  local text = require("mirza.pool").limit_text
  for _, e in ipairs(pool.endpoints) do
    out[#out + 1] = "; " .. (many and (mirza.redact_url(e.base) .. " ") or "") .. text(e)
  end
  return table.concat(out)
end

-- A failure's message without the URL it starts with (the core's
-- messages name the request's URL first; the line names the endpoint).
local function reason(msg)
  return (tostring(msg):gsub("^%a+://%S+: ", "", 1))
end

---What the progress line says of the endpoints down (resting or probed
---after failures of their own) while another serves:
---`; http://gpu2:8080/v1 down for 42s (its last error)` for each; "" when
---none is (or no pool).
---@param pool? mirza.Pool
---@return string
function P.endpoints_down(pool)
  if not pool then return "" end
  local out, now = {}, pool.clock()
  for _, e in ipairs(pool.endpoints) do
    if e.failing_since then
      out[#out + 1] = ("; %s down for %s%s"):format(mirza.redact_url(e.base), P.fmt_time(now - e.failing_since),
        e.last_error and (" (%s)"):format(reason(e.last_error)) or "")
    end
  end
  return table.concat(out)
end

---A log line: the local time first (`2026-12-07 05:31:02 batch: ...`),
---so that a log of a long run says when each line was written.
---@param line string
---@return string
function P.log_line(line)
  return require("mirza.util").log_time() .. " " .. line
end

---A task printing progress (`line_of(stats, opts)`) until cancelled: a
---line every `opts.progress_every` seconds, each with its time
---(`P.log_line`), or redrawn in place 4 times a second on a terminal
---(`progress` true, or "auto" on a terminal). `opts.log(line, live)`
---replaces the writer (the line without the time).
---@param stats table
---@param opts table
---@param line_of fun(st: table, o: table): string
---@return mirza.Task
function P.progress_task(stats, opts, line_of)
  local live = opts.progress == true or (opts.progress == "auto" and core.isatty(2))
  local every = live and 0.25 or opts.progress_every
  local log = opts.log or function(line, is_live)
    io.stderr:write(is_live and ("\r\27[K" .. line) or (P.log_line(line) .. "\n"))
  end
  return loop.spawn(function()
    local _ <close> = setmetatable({}, { __close = function() if live then log("", true) end end })
    while true do
      mirza.sleep(every)
      log(line_of(stats, opts), live)
    end
  end)
end

return P
