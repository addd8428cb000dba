--- mirza.structured: a request with `schema =` — what the collect, the
--- engine's turn and `say`, and the plain tool loop share (docs/structured.md).
---
--- The schema (mirza.schema) goes in the body as `response_format`
--- (json_schema, the OpenAI shape: llama-server, vLLM, MTPLX and Ollama's
--- /v1 all take it; llama-server makes it a grammar). The answer is then
--- decoded and checked here (`schema.decode`), never trusted: a daemon
--- that ignores the field, a cut answer or one that breaks the schema
--- fails with `nil, message, "schema", raw`, the message giving the JSON
--- pointer of the first violation. With `attempts = N` a failed answer is
--- answered with a user message naming the violation (`retry_message`)
--- and the model asked again, up to N requests in all.
---
--- In `mirza.collect`, reasoning sent as `<think>…</think>` in the content
--- is split out (mirza.thinktags: into `think`) before the json events and
--- the schema check, as an engine's turn does; `think_tags = false` keeps
--- it in the text ("open": the answer starts inside a think).
---
--- Streaming field by field: `json = {depth = N}` (events in the stream)
--- or `on_json = fn(ev)` (a callback; depth 1 unless `json` says) puts the
--- incremental parser's stage (mirza.jsonstage) after the think split, so
--- `{type = "json", path = "/items/3", value = ...}` events come while the
--- answer streams.
local mirza = require "mirza"
local schema = require "mirza.schema"
local reducer = require "mirza.result"
local util = require "mirza.util"

local M = {}

---The keys a request takes for structured answers (besides mirza.open's).
M.KEYS = { schema = true, attempts = true, json = true, on_json = true, think_tags = true }
---@class mirza.StructuredOptions
---@field schema? table|string|false a JSON Schema (a table, or a .json file's path); false: none
---@field attempts? integer requests in all while the answer does not fit (default 1)
---@field json? {depth?: integer} json events for the values completed at that depth (default 1)
---@field on_json? fun(ev: table) called with each json event
---@field think_tags? boolean|"open" collect: `<think>…</think>` split out of the content first (default true)

---The user message that tells the model what was wrong with its answer.
---@param msg string the violation (schema.decode's message)
---@return string
function M.retry_message(msg)
  return "Your answer did not match the schema: " .. msg .. ". Answer again with the JSON only."
end

---The compiled schema of a request option (a table, a path, a compiled
---schema; nil or false: none).
---@param s any
---@return mirza.Schema|false|nil c false/nil: no schema
---@return string? message
---@return string? code "io" | "schema"
function M.compile(s)
  if s == nil or s == false then return false end
  return schema.compile(s)
end

---How many requests `attempts` allows (at least 1); a bad value raises
---at `level` (the script's line, seen from the caller).
---@param n any
---@param level integer
---@return integer
function M.attempts(n, level)
  if n == nil then return 1 end
  if math.type(n) ~= "integer" or n < 1 then
    error(("mirza: attempts must be an integer >= 1, got %s"):format(tostring(n)), level + 1)
  end
  return n
end

---Add `response_format` for c to a request body (a copy is returned: the
---caller's table is not changed).
---@param body table
---@param c mirza.Schema
---@return table body
function M.add_format(body, c)
  local b = util.copy(body)
  b.response_format = schema.response_format(c)
  return b
end

-- ------------------------------------------------------------ stages

---The incremental JSON stage for a request's `json` / `on_json` options,
---as a stage spec (mirza.pipeline), or nil when neither is given. The
---stage is mirza.jsonstage's (issue 18 contract 2); `on_json` is called
---for each json event, which also goes on down the stream. With the
---request's schema, the JSON starts where `schema.decode` takes it: at
---the first bracket of the schema's root type (`schema.root`).
---@param json? table `{depth = N}` (default depth 1)
---@param on_json? fun(ev: table)
---@param c? mirza.Schema|false the request's compiled schema
---@return mirza.StageSpec|nil
function M.json_stage(json, on_json, c)
  if json == nil and on_json == nil then return nil end
  if json ~= nil and type(json) ~= "table" then error("mirza: json must be a table {depth = N}", 3) end
  if on_json ~= nil and type(on_json) ~= "function" then error("mirza: on_json must be a function", 3) end
  local stage = require("mirza.pipeline").stage_of(require "mirza.jsonstage")
  local depth = json and json.depth or 1
  return { name = "json", fn = function(up, opts)
    local it = stage(up, opts)
    if not on_json then return it end
    return function()
      local ev = it()
      if ev and ev.type == "json" then on_json(ev) end
      return ev
    end
  end, opts = { depth = depth, root = c and schema.root(c) or nil } }
end

---A stage that keeps the answer's text and, at the `done` event, decodes
---and checks it against c: `ev.value` (the decoded value) or
---`ev.schema_error = {message =, pointer =, raw =}`; `into` (a table, if
---given) gets the same `value` / `schema_error` fields. A round that
---ended with tool calls and no text is not an answer: left alone.
---@param c mirza.Schema
---@param into? table
---@return mirza.StageSpec
function M.check_stage(c, into)
  into = into or {}
  return { name = "schema", fn = function(up)
    local rope = reducer.rope()
    return function()
      local ev = up()
      if ev == nil then return nil end
      local ty = ev.type
      if ty == "text" then reducer.push(rope, ev.text)
      elseif ty == "done" then
        local text = reducer.join(rope)
        if not (ev.tool_calls and #ev.tool_calls > 0 and not text:find("%S")) then
          local v, msg, _, raw, ptr = schema.decode(c, text)
          if v ~= nil then ev.value, into.value, into.schema_error = v, v, nil
          else
            ev.schema_error = { message = msg, pointer = ptr, raw = raw }
            into.value, into.schema_error = nil, ev.schema_error
          end
        end
      end
      return ev
    end
  end }
end

---What an answer came to: the check stage's verdict (`into` of
---`check_stage`), or, when no `done` came (a repetition cut), the text
---decoded here. Returns the value, or nil, the message and the raw text.
---@param c mirza.Schema
---@param check table
---@param text string the answer
---@return any|nil value
---@return string? message
---@return string? raw
function M.outcome(c, check, text)
  if check.value ~= nil then return check.value end
  local err = check.schema_error
  if err then return nil, err.message, err.raw end
  local v, msg, _, raw = schema.decode(c, text)
  return v, msg, raw
end

-- ------------------------------------------------------------ collect

-- The body as a table (a JSON text is decoded), shallow-copied.
local function body_table(body)
  if type(body) == "string" then
    local t, msg = mirza.json.decode(body)
    if type(t) ~= "table" then error("mirza.collect: schema = needs a body that is a JSON object (" ..
        tostring(msg or "not an object") .. ")", 3) end
    return t
  end
  if type(body) ~= "table" then error("mirza.collect: schema = needs a body table with messages", 3) end
  return util.copy(body)
end

-- One request read to its end through the stages: the reducer.
local function run_once(open, req, stages)
  local s <close> = open(req)
  local src = function() return s:next() end
  local it, closer = src, nil
  if #stages > 0 then
    local _
    it, _, _, closer = require("mirza.pipeline").compose(src, stages)
  end
  local acc = reducer.drain(reducer.new { calls = true }, it)
  if closer then getmetatable(closer).__close(closer) end
  return acc
end

-- The result of a run, with the json stage's word on a JSON cut short.
local function result_of(acc)
  local r, msg, code, partial = reducer.result(acc)
  local fin = acc.final
  if r and fin and fin.json_error then r.json_error = fin.json_error end
  return r, msg, code, partial
end

---`mirza.collect` with `schema`, `attempts`, `json`, `on_json` (see the
---module comment): the result with `value` (and `attempts`, the requests
---made; `json_error` when the json stage saw the JSON cut or invalid), or
---nil, message, code, partial as collect fails, or nil, message,
---"schema", raw after the last attempt.
---@param open fun(opts: table): mirza.Stream
---@param opts table
---@return mirza.Result|nil result
---@return string? message
---@return string? code
---@return table|string|nil partial_or_raw
function M.collect(open, opts)
  local req, so = {}, {}
  for k, v in pairs(opts) do
    if M.KEYS[k] then so[k] = v else req[k] = v end
  end
  local c, msg, code = M.compile(so.schema)
  if c == nil then return nil, msg, code end
  local tries = M.attempts(so.attempts, 3) -- here, mirza.collect, the script
  local stages = {}
  if so.think_tags ~= false then -- the answer alone is JSON: reasoning inline in the content split off first
    stages[1] = { name = "think_tags", fn = require("mirza.thinktags").stage,
      opts = { mode = so.think_tags == nil and true or so.think_tags } }
  end
  stages[#stages + 1] = M.json_stage(so.json, so.on_json, c)
  if not c then -- no schema: only the json events
    return result_of(run_once(open, req, stages))
  end
  local body = M.add_format(body_table(req.body), c)
  body.messages = { table.unpack(body.messages or {}) }
  req.body = body
  local check = {}
  stages[#stages + 1] = M.check_stage(c, check)
  for attempt = 1, tries do
    check.value, check.schema_error = nil, nil
    local r, m2, c2, partial = result_of(run_once(open, req, stages))
    if not r then return nil, m2, c2, partial end
    local v, why, raw = M.outcome(c, check, r.text)
    if v ~= nil then
      r.value, r.attempts = v, attempt
      return r
    end
    if attempt == tries then return nil, why, "schema", raw end
    local msgs = body.messages
    msgs[#msgs + 1] = { role = "assistant", content = r.text }
    msgs[#msgs + 1] = { role = "user", content = M.retry_message(why) }
  end
end

return M
