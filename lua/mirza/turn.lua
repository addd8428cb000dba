--- mirza.turn: one turn of the engine — `e:turn`, `e:say`, `e:cancel`.
---
--- `e:turn(input, opts)` returns the generic-for quadruple
--- `iter, stream, nil, turn`: the turn object is the loop's closing value,
--- so `break` (or an error in the loop body) closes the request at once —
--- the daemon sees the disconnect and stops generating — like
--- `s:events()` does for a raw stream. `e:cancel()` stops the turn in
--- flight from anywhere (a sink callback, another coroutine): the stream is
--- closed at once and the iterator's next event is
--- `{type = "cut", reason = "cancelled"}`, then the end. It is always an
--- iterator: a turn that cannot start yields one `error` event (the
--- message and code `say` returns) and ends. A 429, or a 503 with
--- Retry-After, before anything arrived is waited out within the turn's
--- deadline (`header_timeout` from its start), as a batch does.
---
--- History: a turn that ends with `done` stores the user message and the
--- answer (reasoning excluded, tool calls kept). A cancelled or broken-off
--- turn stores what was received so far, marked `interrupted = true` on the
--- assistant message (a field never sent to the daemon), so the model sees
--- the part the user heard; when nothing was received it stores nothing at
--- all. A turn that failed (error event) or was cut by the repetition guard
--- stores nothing. `e.last` (the stats) has `interrupted = true` for a
--- cancelled turn.
---
--- Tools (mirza.tools): the turn's `tools` (else the engine's) go in the
--- request; the streamed fragments become `tool_call_done` events and
--- `done.tool_calls`; `say` runs the calls and loops until the model
--- answers. A turn with calls stores the assistant message with its
--- `tool_calls` (content null when there is no text); the next round's
--- input, the `role = "tool"` results, is stored before its answer.
---
--- One error convention for `say`: it returns `stats, result` when the
--- turn ran (ended with `done`, or was cut: cancelled or repetition), and
--- `nil, message, code, result` when it failed, whether before the request
--- (daemon down, bad input) or during the stream (`result` then holds the
--- partial answer; the error also went to the error sink, and `e.last` has
--- the stats with `.error`).
---
--- A turn owns its request (stream, reducer, pipeline, cancel, busy-wait,
--- the endpoint it holds); the engine owns the conversation. A turn asks
--- the engine only through `e:_turn_begin`, `_turn_failover`, `_turn_error`,
--- `_turn_end`, `_turn_results`, `_turn_mark` and `_turn_forget` (see
--- "turns" in mirza.engine) and reads its public face (`cfg`, `stages`,
--- `log`, `tools`, `turn`, `last`): never the history itself.
local mirza = require "mirza"
local policy = require "mirza.policy"
local reducer = require "mirza.result"
local retry = require "mirza.retry"
local structured = require "mirza.structured"

local M = {}

---Per-turn options of `e:turn` (and of `e:say`, with the route's options).
M.TURN_KEYS = { budget = true, max_tokens = true, temperature = true, top_p = true, stages = true,
  think_tags = true, body_extra = true, tools = true, tool_choice = true, parallel_tool_calls = true, merge = true,
  schema = true, json = true, on_json = true }
---@class mirza.TurnOptions
---@field budget? integer  this turn's reasoning budget in tokens (0: no thinking): the thinking fields and
---max_tokens follow; default: the engine's (`e:set_thinking`)
---@field max_tokens? integer  this turn's completion budget (default: the engine's `max_tokens`, with
---thinking `max_tokens_thinking`)
---@field temperature? number  default: the engine's
---@field top_p? number  default: the engine's
---@field stages? (mirza.StageSpec|mirza.StageFn)[]  pipeline stages after the engine's `e.stages` (mirza.pipeline)
---@field think_tags? boolean|"auto"|"open"  `<think>…</think>` in the content split out (default: the engine's, "auto")
---@field body_extra? table  fields merged into this turn's request body, over the engine's `body_extra`
---@field tools? table|string|false  tools (mirza.tools), a module name, or false: none this turn
---@field tool_choice? string|table
---@field parallel_tool_calls? boolean
---@field merge? boolean  deltas that arrived together come as one event (`ev.deltas`); default: the
---engine's `merge`, else only in `say` without script stages
---@field schema? table|string|false  a JSON Schema (table or .json path; default: the engine's `schema`,
---false: none): sent as `response_format`, the answer decoded and checked (docs/structured.md)
---@field json? {depth?: integer}  `json` events for the values completed at that depth (default 1)
---@field on_json? fun(ev: table)  called with each `json` event as the answer streams

---Options of `e:say`'s tool loop (mirza.tools), besides the turn's `tools`.
M.LOOP_KEYS = { max_rounds = true, run_calls = true, on_tool_result = true, attempts = true }
---Route options `e:say` accepts (mirza.route), also under `sinks = {...}`.
M.ROUTE_KEYS = { answer = true, think = true, error = true, mode = true, think_mode = true, on_event = true,
  flush_on_error = true, abbreviations = true }

local function check_turn_opts(opts)
  for k in pairs(opts or {}) do
    if not M.TURN_KEYS[k] then error(("mirza.engine: unknown turn option %q"):format(tostring(k)), 3) end
  end
  return opts or {}
end

---@class mirza.Turn
---@field cancelled boolean
---@field finished boolean
local Turn = {}
Turn.__index = Turn

---The end of the turn, once: the stream closed, the outcome to the
---engine (stats, history, run log, the pool's slot: `e:_turn_end`).
function Turn:finish()
  if self.finished then return end
  self.finished = true
  local acc = self.acc
  self.s:close()
  acc.t1 = acc.t1 or mirza.now()
  -- routed by say with nothing between the tap and the router: its text is the answer, one copy
  local answer = self.router and self.router:text("answer") or reducer.join(acc.text)
  local tools = require "mirza.tools"
  -- whole calls from the done event; a turn cut short keeps what came
  local calls = tools.wire(acc.tool_calls or tools.finish(self.tool_acc))
  local ep = self.endpoint
  self.endpoint = nil
  self.engine:_turn_end(self, self.spec.ctx, { acc = acc, answer = answer, calls = calls, cancelled = self.cancelled,
    stream = self.s, endpoint = ep, value = self.value, schema_error = self.schema_error })
end

---Stop the turn: the request is closed now; the iterator then yields a
---`cut` event (reason "cancelled") and ends.
---@return boolean cancelled false when the turn was over already
function Turn:cancel()
  if self.finished or self.cancelled then return false end
  if self.acc and self.acc.final then return false end -- the last event came: nothing to stop
  self.cancelled = true
  if self.s then self.s:close() end -- nil: cancelled while its request was being opened
  return true
end

---Closing value of the generic for: `break` or an error in the loop body
---cancels and finishes the turn; after a normal end it only releases the
---pipeline's coroutines.
function Turn:close()
  if not self.finished then
    self:cancel()
    self:finish()
  end
  if self.pipeline_closer then
    local c = self.pipeline_closer
    self.pipeline_closer = nil
    getmetatable(c).__close(c)
  end
end
Turn.__close = Turn.close

-- The stats tap: every event into the turn's reducer (mirza.result: the
-- figures, the answer unless the router keeps it, the tool calls, the
-- live decode speed given to the engine).
local function tap_stage(t)
  local feed, acc = reducer.feed, t.acc
  return function(up)
    return function()
      local ev = up()
      if ev then feed(acc, ev) end
      return ev
    end
  end
end

-- A 409 on the engine's own session before anything arrived means the
-- daemon has not yet released it from this engine's previous request (the
-- client saw its end, or closed it, first): MTPLX frees a session only
-- after its last write, or once it notices a disconnect between tokens.
-- The source waits and asks again, up to `cfg.busy_wait` seconds in all.
local function busy(t, ev)
  if ev.type ~= "error" or ev.status ~= 409 or t.got_any then return false end
  local left = t.spec.busy_wait - (mirza.now() - t.acc.t0)
  if left <= 0 then return false end
  t.busy_tries = (t.busy_tries or 0) + 1
  mirza.sleep(math.min(left, retry.backoff(t.busy_tries, 0.05, 0.8))) -- 50 ms doubling to 0.8 s
  return not t.cancelled
end

-- Back-pressure before anything arrived — HTTP 429, or 503 with a
-- Retry-After — is waited out, as a batch does (mirza.retry: the
-- endpoint works, it asks for time): the server's Retry-After, else a
-- backoff of 0.5 s doubling to 30 s (jittered), then the request again —
-- while the wait ends within the turn's deadline (`header_timeout` from its
-- start; false: none). A wait that would pass it fails the turn at once
-- with the server's answer. Asleep in slices, so that a cancel stops it.
local function overloaded(e, t, ev)
  if ev.code ~= "http" or t.got_any then return false end
  local ra = tonumber(ev.retry_after)
  if not (ev.status == 429 or (ev.status == 503 and ra)) then return false end
  if e.pool and not t.endpoint then return false end -- its slot was given back (fail-over found none)
  t.overload_tries = (t.overload_tries or 0) + 1
  local wait = ra and math.max(0, ra) + 0.05 * math.random() or retry.backoff(t.overload_tries, 0.5, 30, 0.5, 1)
  local limit = t.spec.deadline
  if limit and mirza.now() + wait > limit then return false end
  e:log("notice", ("%s answered %d%s: asking again in %.1f s"):format(e.base_url, ev.status,
    ra and (" (Retry-After: %g s)"):format(ra) or "", wait))
  local until_ = mirza.now() + wait
  while not t.cancelled do
    local left = until_ - mirza.now()
    if left <= 0 then break end
    mirza.sleep(math.min(0.25, left))
  end
  return not t.cancelled
end

-- An engine over a pool: a failure of the endpoint before anything
-- arrived goes to another one (`e:_turn_failover` says which).
local function failover(e, t, ev)
  local ep, released = e:_turn_failover(t.endpoint, ev, t.avoid, t)
  if released then t.endpoint = ep end
  return ep ~= nil and not t.cancelled
end

-- The source: the stream's events (a 409 from the engine's own previous
-- request waited out, a 429 or 503 with Retry-After waited out, a failed
-- endpoint of a pool replaced), a dead daemon
-- diagnosed ("exited" with the status and log tail), and one `cut` event
-- after a cancel. Tool calls are gathered here too, as mirza.tools.stage
-- would (into t.tool_acc; at `done`, a `tool_call_done` per call first):
-- a delta costs no stage call of its own for them.
local function source(e, t)
  local cut_sent, pipeline_passes, isyieldable, protect = false, require("mirza.pipeline").passes,
    coroutine.isyieldable, nil
  local tools = require "mirza.tools"
  local acc, q, take, pop = t.tool_acc, tools.queue(), tools.take, tools.pop
  return function()
    if q.h <= q.t then return pop(q) end
    while true do
      if t.cancelled then
        if cut_sent then return nil end
        cut_sent = true
        return { type = "cut", reason = "cancelled" }
      end
      local s = t.s
      if s:closed() then return nil end
      -- In a coroutine (a task) a cancel from another task can close the
      -- stream under the wait, which then raises: the pull is protected
      -- there. The main thread's turns (nothing else runs while they wait)
      -- skip the pcall's cost, a tenth of a flat-out event.
      if protect == nil then protect = isyieldable() end
      local ok, ev
      if protect then ok, ev = pcall(s.next, s) else ok, ev = true, s:next() end
      local ty = ok and ev and ev.type
      if not ok then
        if not t.cancelled or pipeline_passes(ev) then error(ev, 0) end -- else the cut, next round
      elseif ty ~= "error" then -- the common case, one comparison
        t.got_any = true
        if ty == "tool_call" or ty == "done" then return take(acc, ev, q) end
        return ev
      elseif not busy(t, ev) and (t.got_any or not (failover(e, t, ev) or overloaded(e, t, ev))) then
        ev = e:_turn_error(ev)
        t.got_any = true
        return ev
      else
        s:close()
        t.s = t.spec.open()
      end
    end
  end
end

local merge = require("mirza.util").merge

-- The turn's stages: think tags, stats, repetition guard, the script's,
-- the turn's own (the tool calls are the source's).
local function stages_of(e, t, opts, plan)
  local cfg = e.cfg
  local tags = opts.think_tags
  if tags == nil then tags = cfg.think_tags end
  local list = { -- the tool calls: gathered by the source
    { name = "think_tags", fn = policy.policy_stage(e, "mirza.thinktags"),
      opts = { mode = tags, hold = plan.budget > 0 } },
    { name = "stats", fn = tap_stage(t) },
  }
  if cfg.repetition ~= false then
    local ropts = merge({ on_cut = function(info)
      e:log("warning", ("degenerate reasoning cut on %q (%d repetitions)"):format(info.line, info.count))
      t.s:close()
    end }, type(cfg.repetition) == "table" and cfg.repetition or nil)
    list[#list + 1] = { name = "repetition", fn = policy.policy_stage(e, "mirza.repetition"), opts = ropts }
  end
  -- structured answers (mirza.structured): the json events, then the check at `done` (into t.value)
  list[#list + 1] = structured.json_stage(opts.json, opts.on_json, t.schema)
  if t.schema then list[#list + 1] = structured.check_stage(t.schema, t) end
  -- the script's own: one that raises gives way to its last working version, or is dropped (mirza.policy)
  for _, st in ipairs(e.stages) do list[#list + 1] = policy.stage(e, st) end
  for _, st in ipairs(opts.stages or {}) do list[#list + 1] = policy.stage(e, st) end
  return list
end

-- Whether a say turn's events reach the router as the stats tap saw them:
-- no stage of the script's own (the engine's or the turn's) in between.
-- Then the router needs no event per delta (say merges) and its answer is
-- the turn's (one copy, Turn:finish).
local function builtin_only(e, topts)
  return #e.stages == 0 and topts.stages == nil
end

-- A turn that could not start (the daemon down, a bad input or schema,
-- no endpoint): an iterator all the same, yielding one `error` event with
-- the message and code, then the end; the message and the code come
-- second and third, the turn (finished: nothing to close) fourth, and
-- `t.start_error` holds the event.
local function failed(t, msg, code)
  local ev = { type = "error", message = msg, code = code }
  t.finished, t.start_error = true, ev
  local sent = false
  return function()
    if sent then return nil end
    sent = true
    return ev
  end, msg, code, t
end

---Start one turn on engine `e` (`e:turn`, which first ends the turn in
---flight; see the module comment). Always an iterator: a turn that cannot
---start yields one `error` event (`message`, `code`) and ends, the
---message and the code then second and third.
---@param e mirza.Engine
---@param input string|table a prompt string, a message list, or a JSON message list
---@param opts? mirza.TurnOptions
---@return fun(): table|nil iter
---@return mirza.Stream|string stream_or_message
---@return string? code
---@return mirza.Turn turn the closing value
function M.start(e, input, opts)
  opts = check_turn_opts(opts)
  local t = setmetatable({ engine = e, input = input, cancelled = false, finished = false, avoid = {},
    tool_acc = require("mirza.tools").accumulator() }, Turn)
  local sch = opts.schema
  if sch == nil then sch = e.cfg.schema end
  local c, cmsg, ccode = structured.compile(sch)
  if c == nil then return failed(t, cmsg, ccode) end
  t.schema = c or nil
  local spec, msg, code = e:_turn_begin(t, input, opts, t.schema)
  if not spec then return failed(t, msg, code) end
  t.spec, t.plan, t.endpoint = spec, spec.plan, spec.endpoint
  t.acc = reducer.new { think = false } -- TTFT counts from here: request sent → first delta
  t.acc.on_progress = spec.progress
  local s = spec.open()
  t.s = s
  local it, _, _, closer = require("mirza.pipeline").compose(source(e, t), stages_of(e, t, opts, spec.plan))
  t.pipeline_closer = closer
  return function()
    if t.finished then return nil end
    local ev = it()
    if ev == nil then t:finish() end
    return ev
  end, s, nil, t
end

local function split_opts(opts)
  local topts, ropts, lopts = {}, {}, {}
  for k, v in pairs(opts or {}) do
    if M.TURN_KEYS[k] then topts[k] = v
    elseif M.ROUTE_KEYS[k] then ropts[k] = v
    elseif M.LOOP_KEYS[k] then lopts[k] = v
    elseif k == "sinks" then merge(ropts, v)
    else error(("mirza.engine: unknown say option %q"):format(tostring(k)), 3) end
  end
  return topts, ropts, lopts
end

-- One turn routed to the sinks: the route's result and the turn, or nil,
-- message, code when it could not start.
local function routed(e, input, topts, ropts)
  local it, s, code, t = e:turn(input, topts)
  if t.start_error then return nil, s, code end
  local result
  do
    local _ <close> = t
    local r, guarded = policy.router(e, ropts)
    if builtin_only(e, topts) and not guarded then t.router, t.acc.text = r, false end -- one copy of the answer
    for ev in it do r:feed(ev) end
    result = r:finish()
  end
  return result, t
end

-- After the last round allowed, the calls' results still go to the
-- history: an assistant message with tool_calls must be answered by tool
-- messages for the next request to be valid.
local function over_limit(e, msgs, max, result)
  e:_turn_results(msgs)
  return nil, ("tool loop: no answer after %d rounds"):format(max), "rounds", result
end

-- The rounds of one say (one attempt, with a schema): turns until the
-- model answers without tool calls. Returns stats, result, or nil,
-- message, code, result.
local function rounds(e, input, topts, ropts, lopts)
  local tools_mod = require "mirza.tools"
  local tools = e:tools(topts)
  local max = lopts.max_rounds or e.cfg.max_rounds or tools_mod.MAX_ROUNDS
  local run = { run_calls = lopts.run_calls or e.cfg.run_calls, on_result = lopts.on_tool_result }
  for n = 1, math.huge do
    local result, t, code = routed(e, input, topts, ropts)
    if not result then return nil, t, code end
    result.rounds = n
    local err = result.error
    if err then return nil, err.message or "error", err.code or "error", result end
    local calls = t.acc.tool_calls
    result.tool_calls = calls
    if not (tools and calls and #calls > 0) or result.cut then
      result.value, result.schema_error = t.value, t.schema_error
      result.json_error = t.acc.final and t.acc.final.json_error -- the json stage: the JSON cut or invalid
      return e.last, result
    end
    -- later rounds think like the first (same request fields: the cache hits)
    topts.budget = topts.budget or t.plan.budget
    input = tools_mod.run_calls(calls, tools, run)
    if n >= max then return over_limit(e, input, max, result) end
  end
end

-- say with a schema: up to `tries` attempts; a failed one is answered
-- with the violation (structured.retry_message) and asked again.
-- The history is the engine's: the attempts are told apart by its marks
-- (`e:_turn_mark`), and what they leave is trimmed by `e:_turn_forget`.
local function say_schema(e, c, tries, input, topts, ropts, lopts)
  local mark, bad, last = e:_turn_mark(), {}, nil
  for attempt = 1, tries do
    local before = e:_turn_mark()
    local st, result, code, r4 = rounds(e, input, topts, ropts, lopts)
    if not st then
      e:_turn_forget(mark, bad, true)
      return nil, result, code, r4
    end
    result.attempts = attempt
    if result.cut and result.cut.reason == "cancelled" then -- stopped on purpose: not asked again
      e:_turn_forget(mark, bad, false)
      return st, result
    end
    local v, why, raw = structured.outcome(c, result, result.answer)
    if v ~= nil then
      e:_turn_forget(mark, bad, false)
      result.value, result.schema_error, e.last.value = v, nil, v
      return e.last, result
    end
    result.schema_error = result.schema_error or { message = why, raw = raw }
    result.raw, last = raw, result
    local stored = e:_turn_mark()
    if stored ~= before and stored.role == "assistant" then -- the answer is in the history: answer it
      bad[stored] = true
      input = structured.retry_message(why)
    end -- else (a cut: nothing stored) the same input again
  end
  e:_turn_forget(mark, bad, true)
  return nil, last.schema_error.message, "schema", last
end

---Run a turn to the end with output routing (mirza.route); see the
---module comment for the return convention. With tools (the `tools`
---option, else the engine's), the calls the model makes are run and their
---results sent back, round after round, until it answers: every round's
---text and reasoning go to the sinks, the history keeps each assistant
---`tool_calls` message and the `role = "tool"` results, and
---`result.rounds` counts the requests. Past `max_rounds` (default 8) it
---fails with code "rounds".
---
---With a schema (the `schema` option, else the engine's; docs/structured.md)
---the answer is still the text the sinks got, and the decoded value is
---`result.value` and `stats.value` (`e.last.value`). An answer that does
---not fit is answered with the violation and asked again while `attempts`
---(default: the engine's, else 1) allows; the history then keeps the
---question and the answer that fitted only. When none fits: `nil, message,
---"schema", result` with `result.raw` (the last answer) and
---`result.schema_error = {message, pointer, raw}`, and the history keeps
---nothing of the say (as for a failed turn). The sinks get every attempt's
---text.
---@param e mirza.Engine
---@param input string|table
---@param opts? table turn options (`TURN_KEYS`), route options (`ROUTE_KEYS`, or under
---`sinks`), tool loop options (`LOOP_KEYS`: max_rounds, run_calls, on_tool_result, attempts)
---@return table|nil stats
---@return table|string result_or_message
---@return string? code
---@return table? result on failure: what was routed before it
function M.say(e, input, opts)
  local topts, ropts, lopts = split_opts(opts)
  if topts.merge == nil and e.cfg.merge == nil then topts.merge = builtin_only(e, topts) end
  local sch = topts.schema
  if sch == nil then sch = e.cfg.schema end
  local c, msg, code = structured.compile(sch)
  if c == nil then return nil, msg, code end
  if not c then return rounds(e, input, topts, ropts, lopts) end
  topts.schema = c -- compiled once for every attempt
  local attempts = lopts.attempts
  if attempts == nil then attempts = e.cfg.attempts end
  return say_schema(e, c, structured.attempts(attempts, 2), input, topts, ropts, lopts) -- e:say tail-calls this
end

return M
