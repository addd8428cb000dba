--- mirza.tools: OpenAI tool calls — fragments accumulated into whole
--- calls, tools given as Lua functions, and the loop that runs them.
---
--- A stream carries a call as `tool_call` events whose `calls` hold
--- fragments keyed by `index`: the id and name come first (the name may be
--- split too), the JSON arguments in pieces cut anywhere. `stage` (a
--- pipeline stage) passes every event through and, when the choice
--- finishes, emits one `{type = "tool_call_done", call = call}` per call,
--- in index order, just before the `done` event, which gets
--- `ev.tool_calls` (the same calls). A call is only known complete at the
--- end: servers may interleave indexes. A call:
---
---     { index = 0, id = "call_1", name = "get_weather",
---       arguments = '{"city": "Lyon"}',   -- the text, as streamed
---       args = { city = "Lyon" },         -- decoded; nil when invalid
---       error = nil }                     -- "invalid JSON arguments: ..."
---
--- Arguments that are not a JSON object are reported in `call.error`,
--- never repaired or guessed; the loop then gives the model that error as
--- the tool's result instead of calling the function.
---
--- Tools: `{ name = { description = "...", parameters = {JSON schema},
--- fn = function(args, call) return result end } }`, or the name of a
--- module returning such a table (resolved each turn, so hot reload
--- applies). `fn` returns a string (sent as is), any other value (sent as
--- JSON), or `nil, err`; a raise, `nil, err` or an unknown tool name
--- becomes the result `{"error": "..."}` the model sees — never a crash.
---
--- Several calls of one round run concurrently when the loop runs inside a
--- `mirza.loop` task (each call its own task, through `loop.gather`: a tool
--- that waits on a stream or `mirza.sleep` lets the others go on), else one
--- after another. `run_calls(fns) -> results` (an option) replaces both:
--- each `fns[i]()` returns the i-th result string and never raises.
---
--- `M.run{url=..., body=..., tools=...}` is the loop over plain requests;
--- the engine has its own (`e:say(input, {tools = ...})`, mirza.turn).
local M = {}

local function json() return require("mirza").json end

---Default and limit of the rounds (requests) one tool loop may take.
M.MAX_ROUNDS = 8

-- ------------------------------------------------------------ accumulate

---A fresh accumulator (a plain table): `add` merges fragments into it,
---`finish` makes the calls.
---@return table acc
function M.accumulator()
  return { slots = {} }
end

---Merge one `tool_call` event's fragments (`ev.calls`) into `acc`, by
---index: the id when given, the name and arguments appended.
---@param acc table
---@param frags table[]|nil the delta's `tool_calls` array
function M.add(acc, frags)
  if type(frags) ~= "table" then return end
  for _, f in ipairs(frags) do
    local i = math.tointeger(type(f) == "table" and f.index) or 0
    local s = acc.slots[i + 1]
    if not s then
      s = { index = i, id = "", name = {}, arguments = {} }
      acc.slots[i + 1] = s
    end
    if type(f.id) == "string" and f.id ~= "" then s.id = f.id end
    local fn = f["function"]
    if type(fn) == "table" then
      if type(fn.name) == "string" then s.name[#s.name + 1] = fn.name end
      if type(fn.arguments) == "string" then s.arguments[#s.arguments + 1] = fn.arguments end
    end
  end
end

-- Decode a call's arguments: an object (an empty text counts as `{}`).
local function decode_args(text)
  if text:match("^%s*$") then return {} end
  local v, err = json().decode(text)
  if v == nil then return nil, "invalid JSON arguments: " .. tostring(err) end
  if type(v) ~= "table" or not text:match("^%s*{") then return nil, "invalid JSON arguments: not an object" end
  return v
end

---The accumulated calls, in index order (gaps in the indexes skipped),
---arguments decoded.
---@param acc table
---@return table[] calls see the module comment
function M.finish(acc)
  local keys, out = {}, {}
  for k in pairs(acc.slots) do keys[#keys + 1] = k end
  table.sort(keys)
  for i, k in ipairs(keys) do
    local s = acc.slots[k]
    local call = { index = s.index, id = s.id, name = table.concat(s.name), arguments = table.concat(s.arguments) }
    call.args, call.error = decode_args(call.arguments)
    out[i] = call
  end
  return out
end

---The calls as an assistant message carries them (what servers expect in
---the history): `{id, type = "function", function = {name, arguments}}`.
---@param calls table[] from `finish`
---@return table[]|nil wire nil when there are none
function M.wire(calls)
  if not calls or #calls == 0 then return nil end
  local out = {}
  for i, c in ipairs(calls) do
    out[i] = { id = c.id, type = "function", ["function"] = { name = c.name, arguments = c.arguments } }
  end
  return out
end

---What the stage does with an event that is not a delta: a `tool_call`
---goes into `acc`; a `done` after calls becomes one `tool_call_done`
---event per call, then the `done` with `tool_calls`. Returns the event to
---hand out now; the others wait in `q` (`q[q.h..q.t]`, see `M.pop`).
---For a source that checks the type itself (a turn's: no stage of its
---own per delta).
---@param acc table
---@param ev table
---@param q {h: integer, t: integer}
---@return table ev
function M.take(acc, ev, q)
  local ty = ev.type
  if ty == "tool_call" then
    M.add(acc, ev.calls)
  elseif ty == "done" and next(acc.slots) then
    local calls = M.finish(acc)
    ev.tool_calls = calls
    local n = q.t
    for _, c in ipairs(calls) do
      n = n + 1
      q[n] = { type = "tool_call_done", call = c }
    end
    q[n + 1], q.t = ev, n + 1
    return M.pop(q)
  end
  return ev
end

---The next event `take` queued (nil when none is).
---@param q {h: integer, t: integer}
---@return table|nil
function M.pop(q)
  local h = q.h
  if h > q.t then return nil end
  local ev = q[h]
  q[h], q.h = nil, h + 1
  if h == q.t then q.h, q.t = 1, 0 end
  return ev
end

---A queue for `take` and `pop`.
---@return {h: integer, t: integer}
function M.queue()
  return { h = 1, t = 0 }
end

---Pipeline stage: events pass through; at `done`, one `tool_call_done`
---event per call, then the `done` with `tool_calls` (when there are any).
---`opts.acc` lets the caller see the fragments of a turn cut short.
---@param up mirza.EventIter
---@param opts? {acc?: table}
---@return mirza.EventIter
function M.stage(up, opts)
  local acc = opts and opts.acc or M.accumulator()
  local q, take, pop = M.queue(), M.take, M.pop
  return function()
    if q.h <= q.t then return pop(q) end
    local ev = up()
    if not ev then return nil end
    local ty = ev.type
    if ty == "tool_call" or ty == "done" then return take(acc, ev, q) end
    return ev
  end
end

-- ------------------------------------------------------------ tools

---Resolve a tools option: a table as is, a module name through
---`package.loaded` (a hot-reloaded version wins) or `require`.
---@param tools table|string|nil
---@return table|nil
function M.resolve(tools)
  if type(tools) == "string" then
    local mod = package.loaded[tools]
    if mod == nil then mod = require(tools) end
    if type(mod) ~= "table" then error(("mirza.tools: module %q does not return a table"):format(tools), 3) end
    return mod
  end
  if tools ~= nil and type(tools) ~= "table" then
    error("mirza.tools: tools must be a table or a module name, got " .. type(tools), 3)
  end
  return tools
end

local specs_cache = setmetatable({}, { __mode = "k" })

---The OpenAI `tools` array of a tools table, sorted by name. Cached per
---table (and per spec), so every round of a conversation sends the same
---bytes and the daemon's prefix cache keeps hitting.
---@param tools table
---@return table[]
function M.specs(tools)
  local cached = specs_cache[tools]
  if cached then return cached end
  local names = {}
  for name, t in pairs(tools) do
    if type(name) ~= "string" or type(t) ~= "table" or type(t.fn) ~= "function" then
      error(("mirza.tools: tool %s needs a fn"):format(tostring(name)), 3)
    end
    names[#names + 1] = name
  end
  table.sort(names)
  local out = json().array {}
  for i, name in ipairs(names) do
    local t = tools[name]
    out[i] = { type = "function", ["function"] = { name = name, description = t.description,
      parameters = t.parameters or json().object { type = "object", properties = json().object {} } } }
  end
  specs_cache[tools] = out
  return out
end

---Add `tools`, `tool_choice` and `parallel_tool_calls` to a request body.
---@param body table
---@param tools table|nil resolved tools
---@param opts? {tool_choice?: string|table, parallel_tool_calls?: boolean}
---@return table body
function M.add_to_body(body, tools, opts)
  if not tools or next(tools) == nil then return body end
  opts = opts or {}
  body.tools = M.specs(tools)
  body.tool_choice = opts.tool_choice or "auto"
  if opts.parallel_tool_calls ~= nil then body.parallel_tool_calls = opts.parallel_tool_calls
  else body.parallel_tool_calls = true end
  return body
end

local function error_result(msg)
  return json().encode(json().object { error = tostring(msg) })
end

-- A tool's return value as the message content.
local function content_of(ok, v, err)
  if not ok then return error_result(v) end
  if v == nil then return error_result(err or "the tool returned nothing") end
  if type(v) == "string" then return v end
  local okj, text = pcall(json().encode, v)
  if not okj then return error_result("result not encodable as JSON: " .. tostring(text)) end
  return text
end

---Run one call: the content of its `role = "tool"` message. A tool's
---error becomes the content; only what no guard keeps (an interrupt:
---Ctrl-C, SIGTERM; a task's cancel: `mirza.pipeline.passes`) goes on up.
---@param tools table resolved tools
---@param call table from `finish`
---@return string content
function M.call(tools, call)
  if call.error then return error_result(call.error) end
  local t = tools[call.name]
  if type(t) ~= "table" or type(t.fn) ~= "function" then
    return error_result(("unknown tool %q"):format(call.name))
  end
  local ok, v, err = pcall(t.fn, call.args, call)
  if not ok and require("mirza.pipeline").passes(v) then error(v, 0) end
  return content_of(ok, v, err)
end

---Run calls (sequentially, or through `opts.run_calls`) and return the
---`role = "tool"` messages, in call order.
---@param calls table[] from `finish`
---@param tools table resolved tools
---@param opts? {run_calls?: fun(fns: (fun(): string)[]): string[], on_result?: fun(call: table, content: string)}
---@return table[] messages
function M.run_calls(calls, tools, opts)
  opts = opts or {}
  local fns = {}
  for i, c in ipairs(calls) do fns[i] = function() return M.call(tools, c) end end
  local results
  local task = #fns > 1 and require("mirza.loop").current()
  if opts.run_calls then
    results = opts.run_calls(fns)
  elseif task then -- inside a scheduler task: the calls as tasks of its loop
    results = require("mirza.loop").gather(fns, { loop = task.loop })
  else
    results = {}
    for i, f in ipairs(fns) do results[i] = f() end
  end
  local msgs = {}
  for i, c in ipairs(calls) do
    local content = results[i]
    if type(content) ~= "string" then content = error_result("the tool runner returned no result") end
    if opts.on_result then opts.on_result(c, content) end
    msgs[i] = { role = "tool", tool_call_id = c.id, content = content }
  end
  return msgs
end

-- ------------------------------------------------------------ plain loop

local RUN_KEYS = { tools = true, max_rounds = true, run_calls = true, on_event = true, on_result = true,
  tool_choice = true, parallel_tool_calls = true, schema = true, attempts = true, json = true, on_json = true }

-- One round: the stream's events through the stage (and the structured
-- answer's stages, `extra`), read into a result (mirza.result): the
-- result, or nil, message, code and the partial one.
local function round(req, on_event, extra)
  local mirza, result = require "mirza", require "mirza.result"
  local s <close> = mirza.open(req)
  local it, closer = M.stage(function() return s:next() end), nil
  if #extra > 0 then
    local _
    it, _, _, closer = require("mirza.pipeline").compose(it, extra)
  end
  local acc = result.drain(result.new(), it, on_event)
  if closer then getmetatable(closer).__close(closer) end
  return result.result(acc)
end

-- Drop the failed attempts' answers and retry prompts (`bad`) from a list.
local function without(msgs, bad)
  local keep = {}
  for _, m in ipairs(msgs) do
    if not bad[m] then keep[#keep + 1] = m end
  end
  for i = #msgs, 1, -1 do msgs[i] = nil end
  for i, m in ipairs(keep) do msgs[i] = m end
end

-- The structured answer of run (mirza.structured): its schema, tries,
-- stages and the check stage's verdict, or nil, message, code.
local function structured_of(topts)
  local structured = require "mirza.structured"
  local c, msg, code = structured.compile(topts.schema)
  if c == nil then return nil, msg, code end
  local st = { c = c, tries = structured.attempts(topts.attempts, 3), check = {}, bad = {}, attempt = 1, extra = {} }
  st.extra[#st.extra + 1] = structured.json_stage(topts.json, topts.on_json, c)
  if c then st.extra[#st.extra + 1] = structured.check_stage(c, st.check) end
  return st
end

-- A round answered without calls, with a schema: res (value, attempts)
-- when it fits, nil, message, "schema", raw after the last attempt, or
-- false when it is asked again (the violation appended to the messages).
local function answered(st, res, m)
  local structured = require "mirza.structured"
  local msgs = res.messages
  local v, why, raw = structured.outcome(st.c, st.check, m.content)
  st.check.value, st.check.schema_error = nil, nil
  if v ~= nil or st.attempt >= st.tries then
    without(msgs, st.bad)
    if v == nil then return nil, why, "schema", raw end
    res.value, res.attempts = v, st.attempt
    return res
  end
  st.attempt = st.attempt + 1
  local retry = { role = "user", content = structured.retry_message(why) }
  st.bad[m], st.bad[retry] = true, true
  msgs[#msgs + 1] = retry
  return false
end

---The tool loop over plain requests: `opts` are `mirza.open`'s (`body` a
---table with `messages`) plus `tools`, `max_rounds` (default 8),
---`run_calls`, `tool_choice`, `parallel_tool_calls`, `on_event(ev)` (every
---event of every round) and `on_result(call, content)`. The body's
---`messages` is copied, then grows by the assistant calls and the tool
---results of each round.
---
---A structured answer (docs/structured.md): `schema = S` sends it as
---`response_format` on every round and checks the answer (the round
---without calls): `result.value`; `attempts = N` answers a violation with
---a user message naming it and asks again (the failed answers and those
---prompts are not left in `messages`); when none fits: nil, message,
---"schema", the raw answer. `json` / `on_json` as for mirza.collect.
---@param opts mirza.ToolsRunOptions
---@return table|nil result `{text, think, finish_reason, usage, stats, rounds, messages}` (+ `value`, `attempts`)
---@return string? message
---@return string? code the stream's error code, or "rounds" past max_rounds
---@return table? partial the result so far
function M.run(opts)
  local req, topts = {}, {}
  for k, v in pairs(opts) do
    if RUN_KEYS[k] then topts[k] = v else req[k] = v end
  end
  local tools = M.resolve(topts.tools) or {}
  local st, smsg, scode = structured_of(topts)
  if not st then return nil, smsg, scode end
  local body = require("mirza.util").copy(req.body)
  body.messages = { table.unpack(body.messages or {}) }
  M.add_to_body(body, tools, topts)
  if st.c then body.response_format = require("mirza.schema").response_format(st.c) end
  req.body = body
  local res = { messages = body.messages, rounds = 0 }
  local max = topts.max_rounds or M.MAX_ROUNDS
  while true do
    res.rounds = res.rounds + 1
    local r, msg, code, partial = round(req, topts.on_event, st.extra)
    local got = r or partial
    res.text, res.think = got.text, got.think
    if not r then return nil, msg, code, res end
    res.finish_reason, res.usage, res.stats = r.finish_reason, r.usage, r.stats
    local calls, text = r.tool_calls, r.text
    local m = { role = "assistant", content = text, tool_calls = M.wire(calls) }
    if m.tool_calls and text == "" then m.content = json().null end
    body.messages[#body.messages + 1] = m
    if not m.tool_calls then
      if not st.c then return res end
      local done, dmsg, dcode, raw = answered(st, res, m)
      if done ~= false then return done, dmsg, dcode, raw end
    end
    if m.tool_calls then
      for _, tm in ipairs(M.run_calls(calls, tools, topts)) do body.messages[#body.messages + 1] = tm end
      if res.rounds >= max then
        return nil, ("tool loop: no answer after %d rounds"):format(max), "rounds", res
      end
    end
  end
end

return M
