--- mirza.loop: many streams at once, code that reads top to bottom.
---
--- A scheduler of coroutines ("tasks") over the core's non-blocking pulls.
--- Inside a task, `s:next()`, `for ev in s:events()`, `s:next_batch()`,
--- `mirza.sleep()`, `mirza.request()` and `mirza.collect()` read as blocking
--- calls but yield to the scheduler, which sleeps in one `mirza.ready()`
--- over every transfer and its timer heap, then resumes exactly the tasks
--- whose stream changed or whose timer expired: the cost of a wake-up does
--- not grow with the number of open streams. Outside a task those calls block as they always did, so
--- a script that uses no scheduler is unchanged.
---
--- The seam is narrow on purpose, and it is the core's own: loading this
--- module changes nothing (the Stream methods, `mirza.core.open` and
--- `mirza.sleep` stay the C functions they are). The scheduler tells the
--- core when it resumes a task (`mirza.core.task`); inside one, a pull
--- (`s:next`, the `events()` iterator, `s:next_batch`) with nothing to take
--- and `mirza.sleep` hand their wait to the scheduler's hook, which yields
--- the task, instead of blocking. Any code that pulls a stream — an engine
--- turn and its pipeline stages included — is cooperative in a task without
--- being rewritten, and exactly as before outside one. A coroutine of your
--- own inside a task must pass foreign yields through to its resumer, as
--- `mirza.pipeline` does; a task that computes without pulling or sleeping
--- holds the others up.
---
--- Tasks are joined (`t:join()`: `true, ...` or `nil, message, code`),
--- cancelled (`t:cancel()`: the streams it opened close at once, its
--- to-be-closed variables run), given deadlines (`t:deadline(s)`). A task's
--- error is reported with its traceback (`loop.on_error`) and does not stop
--- the others. `gather` runs functions with a concurrency limit and returns
--- their results in order; `as_completed` iterates tasks as they finish.
local core = require "mirza.core"
local mirza = require "mirza"

local M = {}
local core_task = core.task

local SUSPEND = setmetatable({}, { __name = "mirza.loop.suspend" })
local CANCEL = setmetatable({}, { __name = "mirza.loop.cancel", __tostring = function() return "cancelled" end })

-- The scheduler resuming a task right now (nil outside any task).
local running_loop = nil
-- Stream -> the task waiting on it (its loop is task.loop), false when
-- none does any more. Unwaiting leaves false, not nil: a key set to nil
-- is freed at the next collection, and a map of n streams that churns
-- (a batch: a new stream per item) would then insert a new key per wait.
-- Lua sizes a hash part to fit exactly, so at 255 or 256 live streams
-- every insert would rehash the whole part. Weak keys: a stream collected
-- drops out. Its values are held weakly too (an ephemeron: only while the
-- stream lives, and a waiting task's stream is on that task's stack), so
-- each loop holds its live tasks itself (live).
local waiter = setmetatable({}, { __mode = "k" })

-- ----------------------------------------------------------------- heap

-- Timers: a binary min-heap of {at, seq, fn}; ties in order of creation.
local function before(a, b)
  return a.at < b.at or (a.at == b.at and a.seq < b.seq)
end

local function heap_push(h, e)
  local i = #h + 1
  h[i] = e
  while i > 1 do
    local p = i // 2
    if not before(h[i], h[p]) then break end
    h[i], h[p] = h[p], h[i]
    i = p
  end
end

local function heap_pop(h)
  local n = #h
  local top, last = h[1], h[n]
  h[n] = nil
  n = n - 1
  if n == 0 then return top end
  h[1] = last
  local i = 1
  while true do
    local l, r, m = 2 * i, 2 * i + 1, i
    if l <= n and before(h[l], h[m]) then m = l end
    if r <= n and before(h[r], h[m]) then m = r end
    if m == i then break end
    h[i], h[m] = h[m], h[i]
    i = m
  end
  return top
end

-- ----------------------------------------------------------------- tasks

---@class mirza.Task
---@field id integer
---@field name string|nil
---@field status "ready"|"running"|"waiting"|"done"
---@field ok boolean|nil       true once finished with a result
---@field error string|nil     the failure message (with traceback for errors)
---@field code string|nil      "error", "cancelled" or "timeout" (deadline)
---@field loop mirza.Loop
local Task = {}
Task.__index = Task
Task.__name = "mirza.Task"

function Task.__tostring(t)
  return ("mirza.Task %d%s (%s)"):format(t.id, t.name and " " .. t.name or "", t.status)
end

---@class mirza.Loop
---@field on_error fun(task: mirza.Task, message: string) reports a failed task nobody joins
local Loop = {}
Loop.__index = Loop

local function default_on_error(task, msg)
  io.stderr:write(("mirza.loop: %s failed: %s\n"):format(tostring(task), msg))
end

---A new scheduler. Most scripts use the default one (`loop.default()`)
---through the module functions.
---
---When each stream is read is the C core's one rule (docs/performance.md,
---"When a stream is read"): as its bytes come until it answers a reader
---that holds what comes (`hold`), then at most an eighth of its answer's
---age late. A scheduler has nothing to tune: `tick`, which earlier
---versions took, is accepted and ignored.
---@param opts? {on_error?: fun(task: mirza.Task, message: string), tick?: number}
---@return mirza.Loop
function M.new(opts)
  opts = opts or {}
  return setmetatable({
    runq = {}, rhead = 1, rtail = 0, -- tasks to resume
    rargs = {}, rmany = {},          -- with their resume value (rmany: values packed)
    timers = {}, seq = 0, ndead = 0,
    nwaiting = 0,                    -- tasks waiting on a stream
    live = {}, free = {},            -- the tasks not finished, by slot (t.slot); the slots free in live
    alive = 0,                       -- tasks not finished
    ids = 0,
    buf = {},                        -- reused by mirza.ready
    current = nil,                   -- the task being resumed
    resumes = 0,                     -- statistics: tasks resumed, waits
    polls = 0,
    on_error = opts.on_error or default_on_error,
  }, Loop)
end

local default_loop

---The default scheduler (created on first use).
---@return mirza.Loop
function M.default()
  default_loop = default_loop or M.new()
  return default_loop
end

---The task being run by a scheduler, or nil outside any task.
---@return mirza.Task|nil
function M.current()
  return running_loop and running_loop.current
end

-- Queue t to be resumed with the given values: the task in runq, its
-- value in rargs (a wake gives one: no table per resume); other values
-- packed (rmany marks them), none as nil.
function Loop:_push(t, ...)
  local i = self.rtail + 1
  self.rtail = i
  self.runq[i] = t
  local n = select("#", ...)
  if n == 1 and ... ~= nil then
    self.rargs[i] = ...
  elseif n > 0 then
    self.rargs[i], self.rmany[i] = table.pack(...), true
  end
  t.status = "ready"
end

---Schedule fn(...) as a new task; it starts on the scheduler's next round.
---@param fn function
---@param ... any arguments
---@return mirza.Task
function Loop:spawn(fn, ...)
  if type(fn) ~= "function" then error("mirza.loop.spawn: function expected", 2) end
  self.ids = self.ids + 1
  local t = setmetatable({
    id = self.ids, loop = self, token = 0, joiners = {}, slice = 0,
    streams = setmetatable({}, { __mode = "k" }),
  }, Task)
  t.co = coroutine.create(function(...)
    return xpcall(fn, function(e)
      if e == CANCEL then return e end
      return debug.traceback(tostring(e), 2)
    end, ...)
  end)
  self.alive = self.alive + 1
  local free, slot = self.free, #self.free -- a slot of live: an array, reused, no hash to grow
  if slot > 0 then free[slot], slot = nil, free[slot] else slot = #self.live + 1 end
  t.slot, self.live[slot] = slot, t
  self:_push(t, ...)
  return t
end

-- Settle a task: record the outcome, wake its joiners and watchers.
function Loop:_finish(t, ok, err, code, results)
  t.status, t.ok = "done", ok
  self.alive = self.alive - 1
  local slot = t.slot
  if slot then -- once: a slot freed twice would be given to two tasks
    self.live[slot], self.free[#self.free + 1], t.slot = false, slot, nil
  end
  -- Its timers go with it: a cancelled task's sleep or stream timeout and a
  -- finished task's deadline would keep step() waiting for nothing.
  if t.timer then self:cancel_timer(t.timer) t.timer = nil end
  if t.deadline_timer then self:cancel_timer(t.deadline_timer) t.deadline_timer = nil end
  if ok then
    t.results = results
  else
    t.error, t.code = err, code
    for s in pairs(t.streams) do pcall(s.close, s) end
    if code == "error" and #t.joiners == 0 and not t.watched then self.on_error(t, err) end
  end
  for _, j in ipairs(t.joiners) do j.fn(t) end
  t.joiners = {}
end

-- What a finished coroutine returned: (resume ok, xpcall ok, ...).
function Loop:_settle(t, r)
  if not r[1] then return self:_finish(t, false, tostring(r[2]), "error") end
  if r[2] then return self:_finish(t, true, nil, nil, table.pack(table.unpack(r, 3, r.n))) end
  if r[3] == CANCEL then return self:_finish(t, false, t.cancel_msg or "cancelled", t.cancel_code or "cancelled") end
  self:_finish(t, false, tostring(r[3]), "error")
end

local hook -- the core's way into the scheduler (below)

-- After a resume of t: (resume ok, what it yielded or returned...).
local function resumed(self, t, prev_loop, prev, prev_hook, ok, ...)
  core_task(prev_hook, M.SLICE)
  running_loop, self.current = prev_loop, prev
  if coroutine.status(t.co) == "dead" then return self:_settle(t, table.pack(ok, ...)) end
  if t.status == "done" then return end -- cancelled itself while closing
  if ... ~= SUSPEND then self:_push(t) end -- a plain coroutine.yield(): others first
end

-- Resume t once, with the given values.
function Loop:_step(t, ...)
  local prev_loop, prev = running_loop, self.current
  running_loop, self.current = self, t
  t.status = "running"
  self.resumes = self.resumes + 1
  local prev_hook = core_task(hook, M.SLICE) -- the core's pulls now yield to us
  return resumed(self, t, prev_loop, prev, prev_hook, coroutine.resume(t.co, ...))
end

-- ------------------------------------------------------------- suspending

-- The protocol of every wait: `local token = l:_arm(t)`, register a waker
-- that calls `l:_wake(t, token, why)`, then `suspend()`. A stale waker (an
-- earlier wait's timer, a second completion) carries an old token and is
-- ignored, so wakers never need unregistering.
local function arm(t)
  t.token = t.token + 1
  t.status = "waiting"
  return t.token
end
Loop._arm = function(_, t) return arm(t) end

function Loop:_wake(t, token, ...)
  if t.status ~= "waiting" or t.token ~= token then return false end
  self:_push(t, ...)
  return true
end

---A timer calling fn() at `at` (mirza.now() seconds). Returns the entry,
---for `cancel_timer`.
---@param at number
---@param fn function
---@return table timer
function Loop:at(at, fn)
  self.seq = self.seq + 1
  local e = { at = at, seq = self.seq, fn = fn }
  heap_push(self.timers, e)
  return e
end

---Cancel a timer made by `at` (idempotent). Cancelled entries stay in the
---heap until they reach its top, unless they are many: then it is rebuilt
---(a task calling next(timeout) per event must not grow it without bound).
---@param e table
function Loop:cancel_timer(e)
  if e.dead then return end
  e.dead = true
  self.ndead = self.ndead + 1
  local h = self.timers
  if self.ndead > 64 and self.ndead * 2 > #h then
    local live = {}
    for _, x in ipairs(h) do if not x.dead then live[#live + 1] = x end end
    table.sort(live, before) -- a sorted array is a valid heap
    self.timers, self.ndead = live, 0
  end
end

-- Suspend the running task (raises outside one); returns the wake values
-- (what the waker gave `_wake` after its token: "signal", "timer", ...).
local function suspend()
  return coroutine.yield(SUSPEND)
end

-- The task calling us, when it can yield to its scheduler.
local function this_task()
  local l = running_loop
  local t = l and l.current
  if t and coroutine.isyieldable() then return t, l end
  return nil
end

---Sleep `seconds`: `mirza.sleep` itself (in a task, other tasks and
---transfers go on meanwhile).
---@param seconds number
M.sleep = core.sleep

---Let the other ready tasks run, then continue (outside a task: no-op).
function M.yield()
  if this_task() then coroutine.yield() end
end

-- Wait for stream s to have news (or `timeout` seconds): "stream" or "timer".
function Loop:_await_stream(t, s, timeout)
  if waiter[s] then error("mirza.loop: two tasks wait on the same stream", 4) end
  local token = self:_arm(t)
  waiter[s] = t
  self.nwaiting = self.nwaiting + 1
  t.waiting_on = s
  local timer
  if timeout then timer = self:at(mirza.now() + timeout, function() self:_wake(t, token, "timer") end) end
  t.timer = timer -- a cancel (no return from suspend) drops it in _finish
  local why = suspend()
  t.timer = nil
  if timer then self:cancel_timer(timer) end
  return why
end

-- Forget t's stream wait (woken, timed out or cancelled).
function Loop:_unwait(t)
  local s = t.waiting_on
  if s then
    waiter[s] = false
    self.nwaiting = self.nwaiting - 1
    t.waiting_on = nil
  end
end

-- ------------------------------------------------------------- the hook

-- Events a task may take from queued streams before it lets the others
-- run: a stream flat out always has more queued, and without a slice one
-- task would run its whole turn while every other stream waits. Counted
-- by the core since the task was last resumed (read at each resume).
M.SLICE = 64

-- What the core asks of the scheduler, inside a task that can yield
-- (`mirza.core.task`, around every resume in `_step`):
--  "wait", x=stream, timeout  a pull found nothing to take: suspend until
--                      the stream has news or the timer; returns why
--                      ("stream", "timer", "closed"): the core then takes
--                      or says "timeout"
--  "turn"              the task took M.SLICE events in a row: others first
--  "sleep", x=seconds  mirza.sleep in a task
--  "open", x=stream    core.open in a task: the stream is the task's
--                      (cancel closes it), recorded or not
--  "closed", x=stream  a stream a task waits on was closed (from anywhere,
--                      not yielding): wake that task (its pull then raises)
function hook(op, x, timeout)
  local l = running_loop
  if op == "wait" then return l:_await_stream(l.current, x, timeout) end
  if op == "turn" then
    coroutine.yield() -- back of the ready queue; the scheduler polls meanwhile
    return "turn"
  end
  if op == "sleep" then
    local t = l.current
    local token = l:_arm(t)
    t.timer = l:at(mirza.now() + x, function() l:_wake(t, token, "timer") end)
    suspend()
    t.timer = nil
  elseif op == "open" then
    l.current.streams[x] = true
  elseif op == "closed" then
    local t = waiter[x]
    if t then t.loop:_wake(t, t.token, "closed") end
  end
end

-- ------------------------------------------------------------- the loop

-- Resume every queued task (new ones queued meanwhile wait for next round).
function Loop:_run_ready()
  local stop, runq, rargs, rmany = self.rtail, self.runq, self.rargs, self.rmany
  while self.rhead <= stop do
    local i = self.rhead
    local t, arg, many = runq[i], rargs[i], rmany[i]
    runq[i], rargs[i] = nil, nil
    if many then rmany[i] = nil end
    self.rhead = i + 1
    if t.status == "ready" then
      self:_unwait(t)
      if many then
        self:_step(t, table.unpack(arg, 1, arg.n))
      elseif arg ~= nil then
        self:_step(t, arg)
      else
        self:_step(t)
      end
    end
  end
  -- Drained: start again at 1, so the indices stay in the tables' array
  -- parts. Ever-growing ones would live in the hash parts, where a queue
  -- of one or two entries fills its part at each push: a rehash per
  -- resume, in each of the three tables.
  if self.rhead > self.rtail then self.rhead, self.rtail = 1, 0 end
end

-- Fire the timers that are due.
function Loop:_fire_timers()
  local now = mirza.now()
  while self.timers[1] and self.timers[1].at <= now do -- re-read: fn() may rebuild the heap
    local e = heap_pop(self.timers)
    if e.dead then
      self.ndead = self.ndead - 1
    else
      e.dead = true -- fired: a later cancel_timer is a no-op
      e.fn()
    end
  end
end

-- Seconds until the next live timer (nil: none).
function Loop:_next_timer()
  local h = self.timers
  while h[1] and h[1].dead do
    heap_pop(h)
    self.ndead = self.ndead - 1
  end
  return h[1] and math.max(0, h[1].at - mirza.now())
end

-- Wait for the next thing that can happen: at once when tasks are queued,
-- else until a stream awaited has news or the next timer. False when
-- nothing can ever happen (no task queued, no timer, no stream awaited).
function Loop:_wait()
  if self.rhead <= self.rtail then
    self:_poll(0)
    return true
  end
  local timeout = self:_next_timer()
  if not timeout and self.nwaiting == 0 then return false end
  self:_poll(timeout)
  return true
end

---One round: run the ready tasks, then wait for the streams and timers
---they wait on, waking exactly the tasks concerned. Returns false when
---nothing can happen any more (no task ready, no timer, no stream awaited).
---@return boolean progressed
function Loop:step()
  if this_task() then error("mirza.loop: step() inside a task", 2) end
  self:_run_ready()
  return self:_wait()
end

function Loop:_poll(timeout)
  local list, n = core.ready(timeout, self.buf)
  self.polls = self.polls + 1
  for i = 1, n do
    local t = waiter[list[i]]
    if t and t.loop == self then self:_wake(t, t.token, "stream") end
  end
  if n == 0 and not timeout then
    -- Nothing runs any more yet tasks wait on streams (closed under them):
    -- let them look again rather than wait forever. Never on a normal path.
    for _, t in pairs(waiter) do
      if t and t.loop == self then self:_wake(t, t.token, "stream") end
    end
  end
  self:_fire_timers()
end

---Run until `done()` returns true (checked after every round of tasks), or
---until every task finished (no predicate). Raises when tasks remain that
---nothing can ever wake.
---@param done? fun(): boolean
function Loop:run(done)
  if this_task() then error("mirza.loop: run() inside a task (use join)", 2) end
  while true do
    self:_run_ready()
    if done and done() or (not done and self.alive == 0) then return end
    if not self:_wait() then
      error(("mirza.loop: %d task(s) wait forever (deadlock)"):format(self.alive), 2)
    end
  end
end

-- ------------------------------------------------------------- task API

-- The outcome as join returns it.
local function outcome(t)
  if t.ok then return true, table.unpack(t.results, 1, t.results.n) end
  return nil, t.error, t.code
end

---Call fn(task) when t finishes (at once if it has).
---@param fn fun(t: mirza.Task)
function Task:on_done(fn)
  if self.status == "done" then return fn(self) end
  self.joiners[#self.joiners + 1] = { fn = fn }
end

---Wait for the task: `true, ...results`, or `nil, message, code` with code
---"error" (message with traceback), "cancelled" or "timeout" (deadline).
---Inside a task it suspends; outside, it runs the scheduler until done.
---@return boolean|nil ok
---@return any ...
function Task:join()
  if self.status ~= "done" then
    local t, l = this_task()
    if t == self then error("mirza.loop: a task cannot join itself", 2) end
    if t then
      local token = l:_arm(t)
      self:on_done(function() l:_wake(t, token, "joined") end)
      suspend()
    else
      self.loop:run(function() return self.status == "done" end)
    end
  end
  return outcome(self)
end

---Cancel the task: the streams it opened close at once (the daemons stop
---generating), its to-be-closed variables run, joiners get
---`nil, msg, code`. A task cancelling itself unwinds at once.
---@param msg? string default "cancelled"
---@param code? string default "cancelled"
---@return boolean cancelled false when it had finished already
function Task:cancel(msg, code)
  if self.status == "done" then return false end
  local l = self.loop
  self.cancel_msg, self.cancel_code = msg or "cancelled", code or "cancelled"
  if l.current == self then error(CANCEL, 0) end
  l:_unwait(self)
  for s in pairs(self.streams) do pcall(s.close, s) end
  self.status = "done" -- before close: a __close handler cannot resume it
  local ok, err = coroutine.close(self.co)
  self.status = "running"
  if not ok then l.on_error(self, "error while cancelling: " .. tostring(err)) end
  l:_finish(self, false, self.cancel_msg, self.cancel_code)
  return true
end

---Cancel the task `seconds` from now unless it finished (code "timeout").
---@param seconds number
---@return mirza.Task self
function Task:deadline(seconds)
  local l = self.loop
  if self.deadline_timer then l:cancel_timer(self.deadline_timer) end
  self.deadline_timer = l:at(mirza.now() + seconds, function()
    if self.status ~= "done" then self:cancel(("deadline of %g s exceeded"):format(seconds), "timeout") end
  end)
  return self
end

---@return boolean done the task has finished (any outcome)
function Task:done()
  return self.status == "done"
end

-- ------------------------------------------------------------- helpers

local function loop_of(opts)
  return opts and opts.loop or M.default()
end

---Spawn a task on the default scheduler.
---@param fn function
---@param ... any
---@return mirza.Task
function M.spawn(fn, ...)
  return M.default():spawn(fn, ...)
end

---Run fn(...) as a task on the default scheduler until it and every task
---it spawned finished; returns its results, raises its error.
---@param fn function
---@param ... any
---@return any ...
function M.run(fn, ...)
  local l = M.default()
  local t = l:spawn(fn, ...)
  t.watched = true
  l:run()
  local r = table.pack(outcome(t))
  if not r[1] then error(r[2], 0) end
  return table.unpack(r, 2, r.n)
end

-- A completion queue: tasks are pushed as they finish; take() waits for
-- the next one (suspending the calling task, or running the scheduler when
-- called outside any task). O(1) per completion.
local function completions(l)
  local q, head, tail, wake = {}, 1, 0, nil
  local c = {}
  function c.watch(t)
    t.watched = true -- its failure is reported through us, not on_error
    t:on_done(function(d)
      tail = tail + 1
      q[tail] = d
      if wake then wake() end
    end)
  end
  function c.take()
    if not q[head] then
      local t, tl = this_task()
      if t then
        local token = tl:_arm(t)
        wake = function() tl:_wake(t, token, "done") end
        suspend()
        wake = nil
      else
        l:run(function() return q[head] ~= nil end)
      end
    end
    local d = q[head]
    q[head], head = nil, head + 1
    return d
  end
  return c
end

---Iterate tasks in the order they finish: `for t in loop.as_completed(ts)`
---(then `t:join()` gives its outcome without waiting). Inside a task it
---suspends between results; outside it runs the scheduler.
---@param tasks mirza.Task[]
---@return fun(): mirza.Task|nil
function M.as_completed(tasks)
  if #tasks == 0 then return function() return nil end end
  local c, left = completions(tasks[1].loop), #tasks
  for _, t in ipairs(tasks) do c.watch(t) end
  return function()
    if left == 0 then return nil end
    left = left - 1
    return c.take()
  end
end

---Run functions concurrently, at most `opts.limit` at a time (default: all),
---each as its own task; results in the order of `fns`. One failure does not
---stop the others. `results[i]` is the first value fns[i] returned; every
---value it returned is in `all[i]`, packed (`all[i].n` counts them, nils
---among them kept), as `t:join()` would give them after its `true`.
---@param fns function[]
---@param opts? {limit?: integer, loop?: mirza.Loop}
---@return any[] results results[i]: first value returned by fns[i] (nil when it failed)
---@return table<integer,string> errors errors[i]: the failure message of fns[i]
---@return integer nerrors
---@return table<integer,{n: integer}> all all[i]: every value fns[i] returned (`table.pack`), nil when it failed
function M.gather(fns, opts)
  local l, n = loop_of(opts), #fns
  local limit = math.max(1, opts and opts.limit or n)
  local results, errors, nerr, next_i, all = {}, {}, 0, 1, {}
  local c = completions(l)
  local function launch()
    local t = l:spawn(fns[next_i])
    t.index, next_i = next_i, next_i + 1
    c.watch(t)
  end
  while next_i <= n and next_i <= limit do launch() end
  for _ = 1, n do
    local t = c.take()
    if t.ok then results[t.index], all[t.index] = t.results[1], t.results
    else errors[t.index], nerr = t.error, nerr + 1 end
    if next_i <= n then launch() end
  end
  return results, errors, nerr, all
end

-- ------------------------------------------------------------- conditions

---@class mirza.Condition
local Condition = {}
Condition.__index = Condition

---A condition tasks wait on until another task signals it (a pool slot
---freed, a queue filled). Waiters are woken in FIFO order.
---@param l? mirza.Loop default: the default scheduler
---@return mirza.Condition
function M.condition(l)
  return setmetatable({ loop = l or M.default(), q = {}, head = 1, tail = 0 }, Condition)
end

---Suspend the current task until signalled or `timeout` seconds passed.
---Outside a task, runs the scheduler until then.
---@param timeout? number
---@return boolean signalled false on timeout
function Condition:wait(timeout)
  local t, l = this_task()
  l = l or self.loop
  local entry, why = {}, nil
  if t then
    local token = arm(t)
    entry.fn = function(w) return l:_wake(t, token, w) end
  else
    entry.fn = function(w) why = w end
  end
  self.tail = self.tail + 1
  self.q[self.tail] = entry
  local timer
  if timeout then
    timer = l:at(mirza.now() + timeout, function()
      if not entry.dead then
        entry.dead = true
        entry.fn("timer")
      end
    end)
  end
  if t then why = suspend() else l:run(function() return why ~= nil end) end
  if timer then l:cancel_timer(timer) end
  entry.dead = true
  return why == "signal"
end

---Wake the oldest waiter.
---@return boolean woke false when nobody waited
function Condition:signal()
  while self.head <= self.tail do
    local e = self.q[self.head]
    self.q[self.head], self.head = nil, self.head + 1
    if not e.dead then
      e.dead = true
      if e.fn("signal") ~= false then return true end
    end
  end
  return false
end

---Wake every waiter.
function Condition:broadcast()
  while self:signal() do end
end

M.Loop, M.Task = Loop, Task
return M
