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
---@field fn mirza.StageFn  the stage
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

---Turn a stage list entry (a spec or a bare function) into (fn, opts).
---@param s mirza.StageSpec|mirza.StageFn
---@return mirza.StageFn|nil fn nil when the stage is disabled
---@return table? opts
local function resolve(s)
  if type(s) == "function" then return s, nil end
  if type(s) ~= "table" or type(s.fn) ~= "function" then
    error("pipeline: a stage is a function or {name=, fn=function, opts=}", 3)
  end
  if s.enabled == false then return nil end
  return s.fn, s.opts
end

-- Closes every coroutine a composed pipeline created, so `break` out of a
-- generic for (or a `<close>` variable) releases suspended stages and
-- their own to-be-closed variables.
local Closer = {
  __close = function(self)
    for i = #self, 1, -1 do coroutine.close(self[i]) end
  end,
}

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
      if type(co) == "thread" then closer[#closer + 1] = co end
    end
  end
  return iter, nil, nil, closer
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
