--- mirza: the Lua facade over the C core (`mirza.core`).
---
--- Streams are pulled, never pushed: `mirza.open{...}` starts a request and
--- returns a stream whose events are read with `s:next(timeout)` or
--- `for ev in s:events() do ... end`. `mirza.wait` drives every open
--- transfer at once; coroutines and timers are built on top in Lua.
local core = require "mirza.core"

local M = {
  version = core.version,
  json = core.json,
  wait = core.wait,
  sleep = core.sleep,
  now = core.now,
  streams = core.streams,
  ready = core.ready,
  redact_url = core.redact_url,
  defaults = core.defaults,
  on_warning = core.on_warning,
  plain_remote = core.plain_remote,
}
M.isatty = core.isatty -- is this descriptor a terminal (progress lines redrawn in place)
M.fd_limit = core.fd_limit -- the open-files limit: soft, hard, soft before mirza raised it
M.platform = core.platform -- what this build does where systems differ (os.h)

-- MIRZA_RECORD=DIR records every request (mirza.record reads it, once).
local RECORD = require("mirza.record").env_dir

---Start a request (`mirza.core.open`, see _meta.lua). With `record = DIR`
---(or `MIRZA_RECORD` set, unless `record = false`) the request and the
---response as received are recorded there (mirza.record).
---@param opts mirza.RequestOptions
---@return mirza.Stream
local function open(opts)
  local ok, s
  if not RECORD and (type(opts) ~= "table" or opts.record == nil) then ok, s = pcall(core.open, opts)
  else ok, s = pcall(require("mirza.record").open, opts) end
  if not ok then error(s, 2) end -- a bad option is the caller's line, not this one
  return s
end
M.open = open

---Perform a plain (non-streamed) HTTP request and wait for its answer.
---@param opts mirza.RequestOptions same keys as `mirza.open` (`plain` is implied)
---@return string|nil body the response body (status < 400)
---@return integer|string status_or_message HTTP status, or the error message
---@return string? code error code: "http", "refused", "timeout", ...
---@return integer? status HTTP status of an "http" error
function M.request(opts)
  local req = require("mirza.util").copy(opts)
  req.plain = true
  local s <close> = open(req)
  local ev = s:next()
  if ev.type == "response" then return ev.body, ev.status end
  return nil, ev.message, ev.code, ev.status
end

-- A collect calls nothing before the end unless it has `on_json`: in a
-- mirza.loop task it holds its stream to the end (`hold = math.huge`,
-- merged), so the task wakes for the whole answer, not for each token
-- (docs/performance.md counts the resumes). The end, an error, a stall or
-- header timeout come at once, with what was received; `first_at()` is
-- the first token's read. Outside a task, or with a
-- `hold` or `on_json` of the caller's own, the options go as they are.
local function held(opts)
  if type(opts) ~= "table" or opts.hold ~= nil or opts.on_json ~= nil or opts.plain then return opts end
  local loop = package.loaded["mirza.loop"] -- no task without it
  if not (loop and loop.current() and coroutine.isyieldable()) then return opts end
  local req = require("mirza.util").copy(opts)
  req.hold = math.huge
  if req.merge == nil then req.merge = true end
  return req
end

-- The retry policy of a collect's `retries` option (mirza.retry.REQUEST
-- by default), and the options without it; a bad value raises at the
-- script's line.
local function retry_policy(opts)
  local retry = require "mirza.retry"
  if type(opts) ~= "table" or opts.retries == nil then return retry.REQUEST, opts end
  local n = opts.retries
  if math.type(n) ~= "integer" or n < 0 then
    error(("mirza.collect: retries must be an integer >= 0, got %s"):format(tostring(n)), 3)
  end
  local util = require "mirza.util"
  local req = util.copy(opts)
  req.retries = nil
  return util.merge(util.copy(retry.REQUEST), { retries = n }), req
end

-- What a failed collect tells besides its message and code: the HTTP
-- status and Retry-After of the last failure, and the retries made.
local function annotate(partial, state)
  local f = state.failure
  if type(partial) ~= "table" then return partial end
  partial.retries = state.retries
  if f then partial.status, partial.retry_after = f.status, tonumber(f.retry_after) end
  return partial
end

---Run a streaming request to the end and collect it (mirza.result).
---A failure before anything arrived that is worth retrying (HTTP 429,
---408, 409, a 5xx, an error frame, a refused connection, a stream cut
---before its first token; not a timeout) is retried after a backoff (0.5 s
---doubling to 8 s, jittered) or the server's Retry-After (up to 60 s),
---`retries` times (default 2, as the OpenAI SDKs; 0: none), within the
---request's `deadline` (mirza.retry.stream).
---A structured answer (mirza.structured, docs/structured.md): `schema = S`
---(a JSON Schema table or a .json path) sends it as `response_format` and
---gives the decoded, checked answer in `result.value`; `attempts = N` asks
---again with the violation; `json = {depth = N}` / `on_json = fn(ev)` calls
---fn with each value as it completes while the answer streams. An answer
---that never fits: nil, message (the JSON pointer of the violation first),
---"schema", the raw answer text.
---@param opts mirza.CollectOptions
---@return mirza.Result|nil result `{text, think, tool_calls, finish_reason, usage, stats, timings}`,
---and with a schema `value` and `attempts` (the requests made)
---@return string? message error message
---@return string? code error code ("schema": no answer fitted the schema)
---@return mirza.CollectFailure|string|nil partial what was received before the error: `{text, think,
---tool_calls}`, with `status` and `retry_after` (seconds) of the last failure and `retries` (the
---retries made) (_meta_lua.lua); the raw answer (a string) for "schema"
function M.collect(opts)
  local policy
  policy, opts = retry_policy(held(opts))
  local state = { retries = 0 }
  local function again(req) return require("mirza.retry").stream(open, req, policy, state) end
  if type(opts) == "table"
    and (opts.schema or opts.attempts or opts.json or opts.on_json or opts.think_tags ~= nil) then
    local r, msg, code, partial = require("mirza.structured").collect(again, opts) -- no tail call: errors at the caller
    return r, msg, code, annotate(partial, state)
  end
  local result = require "mirza.result"
  local s <close> = again(opts)
  local acc = result.drain(result.new { calls = true }, s:puller())
  local r, msg, code, partial = result.result(acc)
  if partial then state.failure = acc.final end -- the error after text too (puller does not look at it)
  return r, msg, code, annotate(partial, state)
end

local watcher -- the shared hot-reload watcher (mirza.reload)

-- The shared watcher's report of a failed reload (an engine reports
-- through its own log instead while the watcher keeps this one).
function M._reload_failed(name, msg)
  io.stderr:write("mirza: reload of ", name, " failed, the previous version stays (fix the file: it is ",
    "reloaded when it changes): ", msg, "\n")
end

---The shared watcher used by `mirza.watch`/`mirza.reload` and engines.
---@return mirza.Watcher
function M.watcher()
  watcher = watcher or require("mirza.reload").new { on_error = M._reload_failed }
  return watcher
end

---Watch a module (by name, or with its file) for hot reload, and load the
---file now (validate, then swap): a file that does not load is reported
---and the current version stays (`nil, message, "reload"`; still watched).
---@param name string
---@param path? string
---@return boolean|nil ok true: watched and loaded
---@return string? message
---@return string? code "io" (no such file) | "reload" (it does not load)
function M.watch(name, path)
  return require("mirza.reload").watch(M.watcher(), name, path)
end

---Reload every watched module whose file changed (validate, then swap; a
---broken file keeps the old version and is reported).
---@return string[] reloaded
---@return table<string,string> failed
function M.reload()
  return require("mirza.reload").check(M.watcher())
end

---Supervise a daemon (start, adopt, health, stop): see lua/mirza/daemon.lua.
---@param opts mirza.DaemonOptions
---@return mirza.Daemon
function M.daemon(opts)
  return require("mirza.daemon").new(opts)
end

---Run fn(...) as a task of the default scheduler (see `mirza.loop`), or,
---given a table, start a program (`mirza.core.spawn`: what users try).
---@param fn function|mirza.SpawnOptions
---@param ... any
---@return mirza.Task|mirza.Process|nil
function M.spawn(fn, ...)
  if type(fn) == "table" then return core.spawn(fn) end
  return require("mirza.loop").spawn(fn, ...)
end

---`mirza.embed{url =, input =, ...}`: the vectors of texts (mirza.embed,
---loaded on first use; also `mirza.embed.unpack`, `mirza.embed.pack`).
M.embed = setmetatable({}, {
  __index = function(_, k) return require("mirza.embed")[k] end,
  __call = function(_, opts) return require("mirza.embed").embed(opts) end,
})

return M
