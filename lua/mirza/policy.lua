--- mirza.policy: a policy that raises while a turn runs never ends the turn.
---
--- Hot reload validates a file before swapping it in (mirza.reload), but a
--- version that loads can still raise on some input once it runs. The
--- engine calls its policies through here: `mirza.prompt` and
--- `mirza.thinking` functions (`call`), the router of `mirza.route`
--- (`router`), the stages of `mirza.repetition` and `mirza.thinktags`, and
--- the script's own stages (`stage`). When a version raises (a string
--- error: a non-string one, such as a task's own cancel, an interrupt
--- (Ctrl-C) and an error raised upstream of a stage propagate:
--- `pipeline.passes`), its
--- error is reported once, as one line `file:line: message` through
--- `e:log("error", ...)`, that version is kept out of use until its file
--- changes (a fix is picked up by the next reload), and the turn goes on
--- with the last version that worked, else the original one (the built-in
--- one for an embedded policy). A stage of the script's own with no other
--- version is dropped for the rest of that turn and the turn goes on
--- without it.
---
--- Nothing is guarded while a policy is its original version (the built-in
--- code, where an error is a bug that must show): no pcall then, the turn's
--- cost is unchanged. A guarded router pays one pcall per event.
local pipeline = require "mirza.pipeline"
local reload = require "mirza.reload"
local result = require "mirza.result"

local M = {}

-- What runs instead of a version that raised, for the report.
local function instead(name, nextv, base)
  if nextv == nil then return "no other version" end
  if nextv ~= base then return "the last version that worked runs" end
  return package.preload[name] and "the built-in version runs" or "the original version runs"
end

---Report that version `v` of `name` raised (once per version) and keep it
---out of use until its file changes.
---@param e mirza.Engine
---@param name string module name, or a stage's label
---@param v any the version (a module value, or a stage function)
---@param err string the error
---@param what string what runs instead
function M.report(e, name, v, err, what)
  local w = e.watcher
  local f = w.files[name]
  local msg = reload.message(err, f and f.path)
  if not reload.failed(w, v, msg) then return end
  if f or package.preload[name] then
    e:log("error", ("%s (%s is kept out of use until its file changes; %s)"):format(msg, name, what))
  else -- a function of the script's: no file to watch, tried again next turn
    e:log("error", ("%s (%s)"):format(msg, what))
  end
end

-- The versions to try, and whether the first is the original (unguarded).
local function versions_of(e, name)
  if package.loaded[name] == nil then require(name) end
  local vs, base = reload.versions(e.watcher, name)
  return vs, base, vs[1] == base or not e.watcher.files[name]
end

-- A version ran without raising this turn: it becomes the one to fall
-- back on once the turn ends (`turn_end`), not before — one function of a
-- new version working does not make the version good.
local function ran(e, name, v)
  local r = e._policy_ran or {}
  e._policy_ran = r
  r[name] = v
end

---The turn ended: the policy versions that ran in it without raising (and
---were not found raising later in it) are the ones to fall back on.
---@param e mirza.Engine
function M.turn_end(e)
  local r = e._policy_ran
  if not r then return end
  e._policy_ran = nil
  for name, v in pairs(r) do reload.worked(e.watcher, name, v) end
end

---Call `name.fname(...)` with the first version that does not raise; the
---original version is called unguarded.
---@param e mirza.Engine
---@param name string e.g. "mirza.prompt"
---@param fname string e.g. "build"
---@return any ...
function M.call(e, name, fname, ...)
  local vs, base, plain = versions_of(e, name)
  if plain then return vs[1][fname](...) end
  for i, v in ipairs(vs) do
    if v == base then return v[fname](...) end
    local fn = type(v) == "table" and v[fname]
    local r = type(fn) == "function" and table.pack(pcall(fn, ...))
      or { false, ("%s has no function %s"):format(name, fname) }
    if r[1] then
      ran(e, name, v)
      return table.unpack(r, 2, r.n)
    end
    if pipeline.passes(r[2]) then error(r[2], 0) end -- a control-flow value, an interrupt
    M.report(e, name, v, r[2], instead(name, vs[i + 1], base))
    if i == #vs then error(reload.message(r[2]), 0) end -- no version left
  end
end

---Module `name` for this turn's calls: the original itself, else a proxy
---whose functions go through `call` (a version that raises gives way).
---@param e mirza.Engine
---@param name string
---@return table
function M.module(e, name)
  local vs, _, plain = versions_of(e, name)
  if plain then return vs[1] end
  return setmetatable({}, { __index = function(_, fname)
    return function(...) return M.call(e, name, fname, ...) end
  end })
end

-- A pipeline.guard over versions `vs` (module values or stage functions)
-- of `name`: reported through M.report; the version that ended the stream
-- without raising is recorded as working.
local function guard(e, name, vs, base, last)
  local fns = {}
  for i, v in ipairs(vs) do
    fns[i] = pipeline.stage_of(v) or function() error(("%s has no stage function"):format(name), 0) end
  end
  return pipeline.guard(fns, function(i, msg)
    M.report(e, name, vs[i], msg, vs[i + 1] and instead(name, vs[i + 1], base) or last)
  end, function(i)
    if e.watcher.files[name] then reload.worked(e.watcher, name, vs[i]) end
  end)
end

---The stage of policy module `name` (its `stage` field): guarded unless
---the original version is in use.
---@param e mirza.Engine
---@param name string "mirza.repetition", "mirza.thinktags"
---@return mirza.StageFn
function M.policy_stage(e, name)
  local vs, base, plain = versions_of(e, name)
  if plain then return vs[1].stage end
  return guard(e, name, vs, base, "the stage is dropped for the rest of this turn")
end

---A stage of the script's own (`e.stages`, `opts.stages`), guarded: a
---spec with `module` uses that module's versions (watched with
---`e:watch`), a bare function or `fn` has no other version; when none is
---left the stage is dropped for the rest of the turn.
---@param e mirza.Engine
---@param s mirza.StageSpec|mirza.StageFn
---@return mirza.StageSpec|mirza.StageFn
function M.stage(e, s)
  if type(s) ~= "table" and type(s) ~= "function" then return s end -- pipeline.compose says what is wrong
  local spec = type(s) == "table" and s or { name = "stage", fn = s }
  if spec.enabled == false then return s end
  local name, vs, base = spec.module
  if type(name) == "string" and spec.fn == nil then
    vs, base = versions_of(e, name)
  elseif type(spec.fn) == "function" then
    name, vs = ("stage %q"):format(tostring(spec.name)), { spec.fn }
  else
    return s
  end
  return { name = spec.name, opts = spec.opts,
    fn = guard(e, name, vs, base, ("stage %q is dropped for the rest of this turn"):format(tostring(spec.name))) }
end

-- ---------------------------------------------------------------- router

local function is_space(b)
  return b == 32 or b == 10 or b == 9 or b == 13
end

-- How much of the channel's text `got` (everything its stream brought)
-- the sink has had, given what it got (`sent`): the end of the last
-- non-space byte of `sent` matched in `got`, white space apart (a
-- sentence sink gets trimmed sentences). A `sent` that is no prefix of
-- `got` (a version that rewrote the text) counts by its length.
local function delivered(got, sent)
  local i, n = 0, #got
  for j = 1, #sent do
    local b = sent:byte(j)
    if not is_space(b) then
      repeat i = i + 1 until i > n or not is_space(got:byte(i))
      if i > n or got:byte(i) ~= b then return math.min(#sent, n) end
    end
  end
  local j = #sent -- white space the sink got last (a token sink) is had too
  while j > 0 and is_space(sent:byte(j)) and i < n and is_space(got:byte(i + 1)) do
    i, j = i + 1, j - 1
  end
  return i
end

-- Texts kept as ropes (mirza.result): a long answer costs about its
-- bytes, not a slot and a string per delta.
local rope, keep, whole = result.rope, result.push, result.join

local function stderr_sink(message, ev)
  io.stderr:write(("mirza: %s error: %s\n"):format(ev and ev.code or "?", message))
end

---@class mirza.GuardedRouter
local GR = {}
GR.__index = GR

-- A sink recording what it was given; a raise inside it is the sink's own
-- (not the router's): `in_sink` tells them apart.
function GR:_sink(ch, sink)
  if sink == nil then return nil end
  local sent = self.sent[ch]
  return function(text, ev)
    keep(sent, text)
    self.in_sink = true
    sink(text, ev)
    self.in_sink = false
  end
end

-- An error sink or on_event hook that gets each event once, whatever
-- router versions saw it.
function GR:_once(fn)
  if fn == nil then return nil end
  local seen = setmetatable({}, { __mode = "k" })
  return function(a, ev)
    local key = ev or a
    if type(key) == "table" then
      if seen[key] then return end
      seen[key] = true
    end
    self.in_sink = true
    fn(a, ev)
    self.in_sink = false
  end
end

-- Build a router from versions[i], or the next one that builds.
function GR:_start(i)
  while true do
    local v = self.vs[i]
    if v == nil then error(self.last_err, 0) end
    self.i, self.v, self.safe = i, v, v == self.base
    if self.safe then
      self.r = v.router(self.opts)
      return
    end
    local ok, r = pcall(function() return v.router(self.opts) end)
    if ok and type(r) == "table" and type(r.feed) == "function" and type(r.finish) == "function" then
      self.r = r
      return
    end
    self:_failed(ok and "mirza.route: router() returned no router" or r)
    i = i + 1
  end
end

-- The router raised `err`: a sink's error propagates, a version's is reported.
function GR:_failed(err)
  if self.in_sink or pipeline.passes(err) then
    self.in_sink = false
    error(err, 0)
  end
  M.report(self.e, "mirza.route", self.v, err, instead("mirza.route", self.vs[self.i + 1], self.base))
  self.last_err = reload.message(err)
end

-- The next version takes over: it gets, per channel, the text its sink has
-- not had yet, then `ev` (the event the broken one raised on, when not a
-- delta: its text is in the channel's already). Repeats while they raise.
function GR:_recover(err, ev)
  while true do
    self:_failed(err)
    self:_start(self.i + 1)
    local evs = {}
    for _, ch in ipairs { "think", "answer" } do
      local got = whole(self.got[ch])
      local cut = delivered(got, whole(self.sent[ch]))
      self.prefix[ch] = got:sub(1, cut)
      if cut < #got then evs[#evs + 1] = { type = ch == "answer" and "text" or "think", text = got:sub(cut + 1) } end
    end
    if ev then evs[#evs + 1] = ev end
    local ok = true
    for _, x in ipairs(evs) do
      if self.safe then self.r:feed(x) else ok, err = pcall(self.r.feed, self.r, x) end
      if not ok then break end
    end
    if ok then return end
  end
end

---Route one event (see mirza.route's Router:feed).
---@param ev table
function GR:feed(ev)
  local ty = ev.type
  if ty == "text" then
    keep(self.got.answer, ev.text)
  elseif ty == "think" then
    keep(self.got.think, ev.text)
  elseif ty == "done" or ty == "error" or ty == "cut" then
    self.terminal = ev
  end
  if self.safe then return self.r:feed(ev) end
  local ok, err = pcall(self.r.feed, self.r, ev)
  if not ok then self:_recover(err, (ty ~= "text" and ty ~= "think") and ev or nil) end
end

---The end of the turn: the result, with each channel's whole text.
---@return table result
function GR:finish()
  while true do
    local ok, res = true
    if self.safe then res = self.r:finish() else ok, res = pcall(self.r.finish, self.r) end
    if ok and type(res) == "table" then
      if not self.safe then reload.worked(self.e.watcher, "mirza.route", self.v) end
      res.answer = self.prefix.answer .. (res.answer or "")
      res.think = self.prefix.think .. (res.think or "")
      return res
    end
    self:_recover(ok and "mirza.route: finish() returned no result" or res, self.terminal)
  end
end

---The text a channel got so far, whole.
---@param name "answer"|"think"
---@return string
function GR:text(name)
  return whole(self.got[name])
end

---The router of a say turn: `route.router(ropts)` of the route in use,
---and whether it is guarded (a reloaded version: then a version that
---raises hands over to the next one, which gets the text the sinks have
---not had yet — nothing lost, nothing twice).
---@param e mirza.Engine
---@param ropts table route options
---@return mirza.Router|mirza.GuardedRouter router
---@return boolean guarded
function M.router(e, ropts)
  local vs, base, plain = versions_of(e, "mirza.route")
  if plain then return vs[1].router(ropts), false end
  local self = setmetatable({ e = e, vs = vs, base = base, got = { answer = rope(), think = rope() },
    sent = { answer = rope(), think = rope() }, prefix = { answer = "", think = "" }, in_sink = false }, GR)
  local norm = (base or require "mirza.route").sink
  local opts = {}
  for k, v in pairs(ropts) do opts[k] = v end
  opts.answer = self:_sink("answer", ropts.answer ~= nil and norm(ropts.answer) or nil)
  opts.think = self:_sink("think", ropts.think ~= nil and norm(ropts.think) or nil)
  opts.error = self:_once(ropts.error ~= nil and norm(ropts.error) or stderr_sink)
  opts.on_event = self:_once(ropts.on_event and function(ev) return ropts.on_event(ev) end)
  self.opts = opts
  self:_start(1)
  return self, true
end

return M
