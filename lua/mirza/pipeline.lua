--- mirza.pipeline: a turn's event pipeline as a composition of stages.
---
--- An event iterator is a function returning the next event (a plain table
--- such as `{type="text", text="..."}`) or nil at the end. A stage is a
--- function `(upstream_iter, opts) -> iter`; a pipeline feeds the source
--- through its stages in order. `pipeline.stage(fn)` turns a push-style
--- body `fn(upstream, emit, opts)` into a stage that runs in a coroutine.
---
--- Stage lists are plain tables of specs `{name=, fn=, opts=, enabled=}` owned
--- by the caller (the engine, a script), so this module holds no state and
--- can be hot-reloaded; `insert`, `replace` and `remove` edit a list in place
--- by stage name.
local M = {}

-- The marker that tells an emit() yield from any other yield crossing the
-- stage's coroutine (e.g. a scheduler's yield inside the source iterator).
local EMIT = setmetatable({}, { __name = "mirza.pipeline.emit" })

---@alias mirza.EventIter fun(): table|nil
---@alias mirza.StageFn fun(upstream: mirza.EventIter, opts: table?): mirza.EventIter
---@class mirza.StageSpec
---@field name string       unique name in its list ("repetition", "route", ...)
---@field fn? mirza.StageFn  the stage
---@field module? string    instead of fn: a module (a stage function, or a table with `stage`), its
---current version at each turn; watched (`e:watch`), a version that raises gives way to the last one
---that worked (mirza.policy)
---@field opts? table       passed as the stage's second argument
---@field enabled? boolean  false skips the stage

local resume, yield, status = coroutine.resume, coroutine.yield, coroutine.status

local function emit(ev)
  yield(EMIT, ev)
end

-- What a resume of the stage's coroutine gave: an emitted event, nil at
-- the end, or a foreign yield, passed through to our own resumer and its
-- answer handed back (a tail call: no stack growth), so a stage stays
-- transparent to an outer scheduler. No table per event: the values stay
-- on the stack.
local function step(co, ok, tag, ev, ...)
  if not ok then error(tag, 0) end
  if tag == EMIT then return ev end
  if status(co) == "dead" then return nil end
  return step(co, resume(co, yield(tag, ev, ...)))
end

---Make a stage from a push-style body. `fn(upstream, emit, opts)` reads
---events with `upstream()`, sends events downstream with `emit(ev)` (which
---suspends it until the next pull) and ends the stream by returning.
---Errors raised in `fn` propagate to whoever pulls.
---@param fn fun(upstream: mirza.EventIter, emit: fun(ev: table), opts: table?)
---@return mirza.StageFn
function M.stage(fn)
  return function(upstream, opts)
    local co = coroutine.create(function() fn(upstream, emit, opts) end)
    local finished = false
    local iter = function()
      if finished then return nil end -- ended, or raised
      finished = true
      local ev = step(co, resume(co))
      if ev ~= nil then finished = false end
      return ev
    end
    return iter, co
  end
end

---The stage a module's value is: the value itself when it is a function,
---else its `stage` field (nil when neither is a function).
---@param v any
---@return mirza.StageFn|nil
function M.stage_of(v)
  if type(v) == "function" then return v end
  if type(v) == "table" and type(v.stage) == "function" then return v.stage end
  return nil
end

---Turn a stage list entry (a spec or a bare function) into (fn, opts).
---A spec with `module` and no `fn` uses that module's current version.
---@param s mirza.StageSpec|mirza.StageFn
---@return mirza.StageFn|nil fn nil when the stage is disabled
---@return table? opts
local function resolve(s)
  if type(s) == "function" then return s, nil end
  local fn = type(s) == "table" and (s.fn or type(s.module) == "string" and M.stage_of(require(s.module)))
  if type(fn) ~= "function" then
    error("pipeline: a stage is a function or {name=, fn=function (or module=name), opts=}", 3)
  end
  if s.enabled == false then return nil end
  return fn, s.opts
end

-- Closes every coroutine a composed pipeline created, so `break` out of a
-- generic for (or a `<close>` variable) releases suspended stages and
-- their own to-be-closed variables.
local Closer = {}
Closer.__close = function(self)
  for i = #self, 1, -1 do
    local c = self[i]
    if type(c) == "thread" then coroutine.close(c) else Closer.__close(c) end -- a guard's own closer
  end
end

---Compose a source iterator with stages, first stage first.
---Returns the generic-for quadruple: `for ev in pipeline.compose(src, st) do`.
---@param source mirza.EventIter
---@param stages (mirza.StageSpec|mirza.StageFn)[]?
---@return mirza.EventIter iter
---@return nil
---@return nil
---@return table closer to-be-closed value closing the stages' coroutines
function M.compose(source, stages)
  local iter, closer = source, setmetatable({}, Closer)
  for _, s in ipairs(stages or {}) do
    local fn, opts = resolve(s)
    if fn then
      local co
      iter, co = fn(iter, opts)
      if type(co) == "thread" or getmetatable(co) == Closer then closer[#closer + 1] = co end
    end
  end
  return iter, nil, nil, closer
end

---Whether an error caught by a guard is no failure of the guarded code
---and must go on up: a value that is not a string (a control-flow value
---such as a task's own cancel) or an interrupt (Ctrl-C, SIGTERM:
---"interrupted" under `mirza`, "interrupted!" under stock lua5.4, maybe
---after a position). Every guard of the library (a stage's, a policy's,
---a behaviour hook's, a reload's) lets such an error through.
---@param err any
---@return boolean
function M.passes(err)
  if type(err) ~= "string" then return true end
  local line = err:match("^[^\n]*") -- a traceback may follow
  return line == "interrupted" or line == "interrupted!" or line:find(":%d+: interrupted!?$") ~= nil
end
local passes = M.passes

-- What the stage at fns[k] and the ones after it make of `up`: the first
-- that builds, guarded; `up` itself past the last (see M.guard). An error
-- raised upstream (while the stage pulls: `pulling` is still set) is not
-- the stage's and goes on up, as an interrupt does: a cancel's closed
-- stream, a broken stage before this one, never blame this one.
local function guarded(up, fns, k, opts, on_error, on_end, closer)
  for i = k, #fns do
    local held, nh = {}, 0 -- pulled by this stage since it last passed an event on
    local pulling = false
    local function tee()
      pulling = true
      local ev = up()
      pulling = false
      if ev ~= nil then
        nh = nh + 1
        held[nh] = ev
      end
      return ev
    end
    local ok, it, co = pcall(fns[i], tee, opts)
    if ok and type(it) == "function" then
      if type(co) == "thread" then closer[#closer + 1] = co end
      local failed = false
      return function()
        if failed then return it() end
        local okp, ev = pcall(it)
        if okp then
          for j = nh, 1, -1 do held[j] = nil end
          nh = 0
          if ev == nil and on_end then
            on_end(i)
            on_end = nil
          end
          return ev
        end
        if pulling or passes(ev) then error(ev, 0) end -- not the stage's failure
        -- a coroutine that raised keeps its to-be-closed variables open until closed
        if type(co) == "thread" then coroutine.close(co) end
        on_error(i, ev)
        failed = true
        local r, n = 0, nh
        it = guarded(function() -- the held events first, then the rest of the stream
          if r < n then
            r = r + 1
            local h = held[r]
            held[r] = nil
            return h
          end
          return up()
        end, fns, i + 1, opts, on_error, on_end, closer)
        return it()
      end
    end
    if ok then it = "the stage returned no iterator" end
    if pulling or passes(it) then error(it, 0) end
    on_error(i, it)
  end
  return up
end

---A stage that never ends the stream by raising: `fns` are versions of
---one stage, newest first. The first runs; when it raises (building its
---iterator or on a pull) with a string error, `on_error(i, message)` is
---called and the next version takes over the rest of the stream; past the
---last one, events pass through unchanged (the stage is dropped). The
---events the raising stage had pulled since it last passed one on are
---handed to the next version first, in order: an event is never lost,
---whatever the broken version emitted before stays emitted. An error
---that `passes` (a control-flow value, an interrupt) and one raised
---upstream while the stage pulls (not the stage's: a turn's cancel, a
---stage before it) propagate, no version blamed.
---`on_end(i)`, when given, is called once the version i ended the stream
---without raising. The second result, like `pipeline.stage`'s, is closed
---by `compose`.
---@param fns mirza.StageFn[]
---@param on_error fun(i: integer, message: string)
---@param on_end? fun(i: integer)
---@return mirza.StageFn
function M.guard(fns, on_error, on_end)
  return function(upstream, opts)
    local closer = setmetatable({}, Closer)
    return guarded(upstream, fns, 1, opts, on_error, on_end, closer), closer
  end
end

---Index and spec of the stage named `name`.
---@param stages mirza.StageSpec[]
---@param name string
---@return integer|nil index
---@return mirza.StageSpec|nil spec
function M.find(stages, name)
  for i, s in ipairs(stages) do
    if type(s) == "table" and s.name == name then return i, s end
  end
  return nil
end

local function index_of(stages, name)
  local i = M.find(stages, name)
  if not i then error(("pipeline: no stage named %q"):format(tostring(name)), 3) end
  return i
end

---Insert a stage spec, in place. `where` is `{before=name}`, `{after=name}`,
---or nil to append. Raises when the anchor or `spec.name` is wrong.
---@param stages mirza.StageSpec[]
---@param spec mirza.StageSpec
---@param where? {before?: string, after?: string}
---@return mirza.StageSpec[] stages the same list
function M.insert(stages, spec, where)
  if type(spec) ~= "table" or type(spec.name) ~= "string" then
    error("pipeline.insert: spec needs a name", 2)
  end
  if M.find(stages, spec.name) then
    error(("pipeline.insert: a stage named %q exists (use replace)"):format(spec.name), 2)
  end
  local pos = #stages + 1
  if where and where.before then pos = index_of(stages, where.before)
  elseif where and where.after then pos = index_of(stages, where.after) + 1 end
  table.insert(stages, pos, spec)
  return stages
end

---Replace the stage named `name`, in place. `with` is a full spec or a bare
---stage function (which keeps the old name and opts).
---@param stages mirza.StageSpec[]
---@param name string
---@param with mirza.StageSpec|mirza.StageFn
---@return mirza.StageSpec[] stages the same list
function M.replace(stages, name, with)
  local i = index_of(stages, name)
  if type(with) == "function" then
    local old = stages[i]
    with = { name = old.name, fn = with, opts = old.opts, enabled = old.enabled }
  end
  stages[i] = with
  return stages
end

---Remove the stage named `name`, in place; no error when absent.
---@param stages mirza.StageSpec[]
---@param name string
---@return mirza.StageSpec|nil removed
function M.remove(stages, name)
  local i = M.find(stages, name)
  return i and table.remove(stages, i) or nil
end

---A shallow copy of a stage list (specs copied too), so a turn or a script
---can edit it without touching the engine's defaults.
---@param stages mirza.StageSpec[]
---@return mirza.StageSpec[]
function M.copy(stages)
  local out = {}
  for i, s in ipairs(stages) do
    if type(s) == "table" then
      local c = {}
      for k, v in pairs(s) do c[k] = v end
      s = c
    end
    out[i] = s
  end
  return out
end

---An iterator over a list of events (tests, replays, scripts).
---@param events table[]
---@return mirza.EventIter
function M.from_list(events)
  local i = 0
  return function()
    i = i + 1
    return events[i]
  end
end

---Drain an iterator into a list.
---@param iter mirza.EventIter
---@return table[]
function M.collect(iter)
  local out = {}
  for ev in iter do out[#out + 1] = ev end
  return out
end

---A stage that maps each event through `fn(ev, opts)`; returning nil drops
---the event.
---@param fn fun(ev: table, opts: table?): table|nil
---@return mirza.StageFn
function M.map(fn)
  return function(upstream, opts)
    return function()
      for ev in upstream do
        local out = fn(ev, opts)
        if out ~= nil then return out end
      end
      return nil
    end
  end
end

---A stage that calls `fn(ev, opts)` on each event and passes it on unchanged.
---@param fn fun(ev: table, opts: table?)
---@return mirza.StageFn
function M.tap(fn)
  return M.map(function(ev, opts)
    fn(ev, opts)
    return ev
  end)
end

return M
