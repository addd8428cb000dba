--- mirza.result: the result of a stream — one reducer for every reader.
---
--- `mirza.collect`, the tool loop's rounds (mirza.tools), a batch attempt
--- (mirza.batch), the engine's turn (mirza.turn) and the turn's figures
--- (mirza.stats) all read a stream of events into the same thing: the
--- text, the reasoning, the tool calls, the terminal event (usage, the
--- server's stats and timings, the finish reason, or the error with its
--- code, status, body and Retry-After), a repetition cut, and the clock
--- marks the figures are made from. `new` starts one (its clock starts
--- now: call it just before the request is sent), `feed` takes every
--- event, and `result`, `partial` and `failure` read it.
---
--- `feed` is on the hot path of every turn: one call per event, no closure
--- and no table made per delta. Texts are kept in a rope (`rope`, `push`,
--- `join`): deltas joined every KEEP_RUN into one string, so a long answer
--- costs about its bytes, not a table slot and a string per token; the
--- router's channels and the guarded router keep theirs the same way.
---
--- A reducer (a plain table; its fields are read by mirza.stats):
---
---     t0, t1        clock when it started, when the terminal event came
---     first         clock of the first delta (text or think), else nil
---     deltas, chars deltas counted (a merged event counts its `deltas`), bytes of text + reasoning
---     think_bytes   bytes of reasoning
---     text, think   ropes (false: not kept, e.g. a turn whose router keeps the answer)
---     calls         tool-call fragments merged by index (mirza.tools accumulator), when asked for
---     tool_calls    whole calls, from the `done` event (mirza.tools.stage upstream)
---     final         the terminal event (`done` or `error`), nil while there is none
---     cut           the repetition guard's `cut` event, if any
---     live_tok_s    the last decode speed a progress event gave
---     on_progress   called with it, when set (the engine's live figure)
local mirza = require "mirza"

local concat, now = table.concat, mirza.now

local R = {}

---Deltas a rope keeps apart before joining them into one string.
R.KEEP_RUN = 1024
local KEEP_RUN = R.KEEP_RUN

-- ------------------------------------------------------------ rope

---@class mirza.Rope
---@field parts string[] the current run's deltas, parts[1..n]
---@field n integer
---@field runs string[] joined runs

---An empty rope.
---@return mirza.Rope
function R.rope()
  return { parts = {}, n = 0, runs = {} }
end

---Append a piece of text. The current run's table is reused after a join
---(entries past `n` are stale and never read).
---@param rope mirza.Rope
---@param s string
function R.push(rope, s)
  local n = rope.n + 1
  rope.parts[n], rope.n = s, n
  if n == KEEP_RUN then
    local runs = rope.runs
    runs[#runs + 1] = concat(rope.parts, "", 1, n)
    rope.n = 0
  end
end
local push = R.push

---The whole text so far, kept in place of the runs: asking again (a
---result, the engine's history) gives the same string, not another copy.
---@param rope mirza.Rope|false|nil
---@return string
function R.join(rope)
  if not rope then return "" end
  local runs = rope.runs
  if rope.n > 0 then
    runs[#runs + 1] = concat(rope.parts, "", 1, rope.n)
    rope.n = 0
  end
  if #runs > 1 then
    local whole = concat(runs)
    for i = #runs, 2, -1 do runs[i] = nil end
    runs[1] = whole
  end
  return runs[1] or ""
end
local join = R.join

-- ------------------------------------------------------------ reducer

---@class mirza.Reducer
---@field t0 number
---@field t1 number|nil
---@field first number|nil
---@field deltas integer
---@field chars integer
---@field think_bytes integer
---@field text mirza.Rope|false
---@field think mirza.Rope|false
---@field calls table|false
---@field tool_calls table[]|nil
---@field final table|nil
---@field cut table|nil
---@field live_tok_s number|nil
---@field on_progress fun(tok_s: number)|nil

---A fresh reducer; its clock starts now (call it just before sending).
---`text`/`think` false: that text is counted, not kept; `calls` true:
---`tool_call` fragments are merged (mirza.tools.add) — not needed behind
---`mirza.tools.stage`, whose `done` event carries the whole calls.
---@param opts? {text?: boolean, think?: boolean, calls?: boolean}
---@return mirza.Reducer
function R.new(opts)
  opts = opts or {}
  return { t0 = now(), deltas = 0, chars = 0, think_bytes = 0,
    text = opts.text ~= false and R.rope(), think = opts.think ~= false and R.rope(),
    calls = opts.calls == true and require("mirza.tools").accumulator() }
end

---Account one event (every event of the stream, in order).
---@param acc mirza.Reducer
---@param ev table
function R.feed(acc, ev)
  local ty = ev.type
  if ty == "text" then -- the deltas first, one comparison each
    local text = ev.text
    acc.first = acc.first or now()
    acc.deltas = acc.deltas + (ev.deltas or 1) -- a merged event joins several
    acc.chars = acc.chars + #text
    local rope = acc.text
    if rope then push(rope, text) end
  elseif ty == "think" then
    local text = ev.text
    acc.first = acc.first or now()
    acc.deltas = acc.deltas + (ev.deltas or 1)
    acc.chars = acc.chars + #text
    acc.think_bytes = acc.think_bytes + #text
    local rope = acc.think
    if rope then push(rope, text) end
  elseif ty == "tool_call" then
    if acc.calls then require("mirza.tools").add(acc.calls, ev.calls) end
  elseif ty == "progress" then
    local v = ev.decode_tok_s
    if v then
      acc.live_tok_s = v
      if acc.on_progress then acc.on_progress(v) end
    end
  elseif ty == "done" or ty == "error" then
    acc.t1, acc.final = now(), ev
    if ev.tool_calls then acc.tool_calls = ev.tool_calls end
  elseif ty == "cut" then
    acc.cut = ev
  end
end
local feed = R.feed

---Feed every event of an iterator (until it returns nil).
---@param acc mirza.Reducer
---@param events mirza.EventIter
---@param on_event? fun(ev: table) sees each event first
---@return mirza.Reducer acc
function R.drain(acc, events, on_event)
  for ev in events do
    if on_event then on_event(ev) end
    feed(acc, ev)
  end
  return acc
end

---The whole calls: the `done` event's (behind mirza.tools.stage), else
---those merged here; nil when there are none.
---@param acc mirza.Reducer
---@return table[]|nil calls mirza.tools calls (`index, id, name, arguments, args, error`)
function R.calls(acc)
  if acc.tool_calls then return acc.tool_calls end
  local c = acc.calls
  if c and next(c.slots) then return require("mirza.tools").finish(c) end
  return nil
end

---Whether the stream ended as asked: a `done`, or a repetition cut (the
---guard closed it on purpose; what came before is the answer).
---@param acc mirza.Reducer
---@return boolean
function R.ok(acc)
  local fin = acc.final
  return acc.cut ~= nil or (fin ~= nil and fin.type == "done")
end

---What came before the end, ended or not: `{text, think, tool_calls}`.
---@param acc mirza.Reducer
---@return {text: string, think: string, tool_calls: table[]|nil}
function R.partial(acc)
  return { text = join(acc.text), think = join(acc.think), tool_calls = R.calls(acc) }
end

-- The Retry-After a failed response gave, in seconds (the core's
-- `retry_after`, else the header), or nil.
local function retry_after(fin)
  local h = type(fin.headers) == "table" and fin.headers or nil
  return tonumber(fin.retry_after) or (h and tonumber(h["retry-after"] or h["Retry-After"]))
end

---Why the stream failed: the error event's fields, with defaults when it
---ended without a terminal event (a cut transfer, a cancel).
---@param acc mirza.Reducer
---@return {code: string, message: string, status?: integer, error?: table, body?: string, retry_after?: number}
function R.failure(acc)
  local fin = acc.final or {}
  return { code = fin.code or "closed", message = fin.message or "stream ended without a final event",
    status = fin.status, error = fin.error, body = fin.body, retry_after = retry_after(fin) }
end

---@class mirza.Result
---@field text string
---@field think string
---@field tool_calls? table[] whole calls (mirza.tools), when the model made some
---@field finish_reason? string
---@field usage? table
---@field stats? table
---@field timings? table
---@field cut? table the repetition guard's cut event

---The result of a stream: `{text, think, tool_calls, finish_reason, usage,
---stats, timings, cut}` when it ended as asked (`R.ok`), else nil, the
---error's message and code, and the partial result (the text received
---before the error is never lost).
---@param acc mirza.Reducer
---@return mirza.Result|nil result
---@return string? message
---@return string? code
---@return table? partial `{text, think, tool_calls}`
function R.result(acc)
  local res = R.partial(acc)
  if not R.ok(acc) then
    local f = R.failure(acc)
    return nil, f.message, f.code, res
  end
  local fin = acc.final or {}
  res.finish_reason, res.usage, res.stats, res.timings = fin.finish_reason, fin.usage, fin.stats, fin.timings
  res.cut = acc.cut
  return res
end

return R
