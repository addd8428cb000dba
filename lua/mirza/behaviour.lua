--- mirza.behaviour: a hot-reloaded behaviour file for an assistant script
--- (scripts/chat.lua), guarded so that a broken edit never kills the chat.
---
--- The file is a Lua module returning a table that may define `system`
--- (the system prompt), `stage` (a pipeline stage, `function(upstream) ->
--- iterator`) and `on_turn(text, engine) -> text`. It is watched through
--- `mirza.watch` (validate, then swap: a file that does not load keeps the
--- previous version). A version that loads but raises at run time is
--- caught here: the error is reported (one line, file:line) and, for that turn,
--- the previous version's hook or stage runs — or the built-in default
--- (no stage, the text unchanged) when there is no previous version or it
--- fails too. A hook or stage removed from the file is gone from the next
--- turn: the previous version's stands in only for one that raises. An
--- interrupt (Ctrl-C) is no hook's error: it goes on up (`pipeline.passes`).
--- `refresh()` notices a swapped version between turns.
local M = {}

---@class mirza.Behaviour
---@field name string
---@field cur table the current version
---@field prev table|nil the version before it
---@field report fun(message: string)
local B = {}
B.__index = B

---Load a behaviour file and watch it.
---@param name string module name (package.loaded key)
---@param path string the file
---@param report? fun(message: string) where runtime errors go (default: stderr)
---@return mirza.Behaviour|nil b
---@return string? message load error (file:line)
function M.new(name, path, report)
  local mod, err = require("mirza.reload").load(name, path)
  if not mod then return nil, err end
  if type(mod) ~= "table" then return nil, path .. ": a behaviour file returns a table" end
  package.loaded[name] = mod
  -- loaded just above: watched without a second load
  require("mirza.reload").watch(require("mirza").watcher(), name, path, { load = false })
  return setmetatable({ name = name, cur = mod, prev = nil,
    report = report or function(m) io.stderr:write("behaviour: ", m, "\n") end }, B)
end

---A behaviour without a file: the built-in defaults.
---@return mirza.Behaviour
function M.default()
  return setmetatable({ name = "", cur = {}, report = function() end }, B)
end

---Take up a version swapped in by a reload (call between turns).
---@return boolean changed
function B:refresh()
  local now = self.name ~= "" and package.loaded[self.name]
  if type(now) ~= "table" or now == self.cur then return false end
  self.prev, self.cur = self.cur, now
  return true
end

---The system prompt of the current version (nil when it sets none).
---@return string|nil
function B:system()
  local s = self.cur.system
  return type(s) == "string" and s or nil
end

-- The hooks `field` of the versions to try, newest first: none when the
-- current version has none (a hook removed from the file is gone, not
-- taken from the version before), else its own and the previous
-- version's, when that one has it.
function B:_hooks(field)
  local cur, prev = self.cur[field], self.prev and self.prev[field]
  if cur == nil then return {} end
  return { cur, prev }
end

---Run `on_turn(text, engine)`; a raising version falls back to the
---previous one, then to the text unchanged.
---@param text string
---@param engine table
---@return string
function B:on_turn(text, engine)
  for _, hook in ipairs(self:_hooks("on_turn")) do
    local ok, out = pcall(hook, text, engine)
    if ok and type(out) == "string" then return out end
    if not ok and require("mirza.pipeline").passes(out) then error(out, 0) end -- Ctrl-C is no hook's error
    self.report(ok and "on_turn must return a string" or require("mirza.reload").message(out))
  end
  return text
end

---The behaviour's stage as a pipeline stage spec (`e.stages`).
---@return mirza.StageSpec
-- The stage survives errors (mirza.pipeline's guard): when the version's
-- stage raises (building it or pulling from it), the previous version's
-- stage takes over the rest of the stream, the events the broken one had
-- pulled and not passed on first; past the last, events pass through
-- unchanged. Received text is never dropped.
function B:stage_spec()
  return { name = "behaviour", fn = function(up, opts)
    local fns = self:_hooks("stage")
    if #fns == 0 then return up end -- no stage in the current version
    return require("mirza.pipeline").guard(fns, function(_, msg) self.report(msg) end)(up, opts)
  end }
end

return M
