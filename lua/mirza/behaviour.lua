--- mirza.behaviour: a hot-reloaded behaviour file for an assistant script
--- (scripts/chat.lua), guarded so that a broken edit never kills the chat.
---
--- The file is a Lua module returning a table that may define `system`
--- (the system prompt), `stage` (a pipeline stage, `function(upstream) ->
--- iterator`) and `on_turn(text, engine) -> text`. It is watched through
--- `mirza.watch` (validate, then swap: a file that does not load keeps the
--- previous version). A version that loads but raises at run time is
--- caught here: the error is reported (with file:line) and, for that turn,
--- the previous version's hook or stage runs — or the built-in default
--- (no stage, the text unchanged) when there is no previous version or it
--- fails too. `refresh()` notices a swapped version between turns.
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
  require("mirza").watch(name, path)
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

-- The versions to try, newest first.
function B:_versions()
  return { self.cur, self.prev }
end

---Run `on_turn(text, engine)`; a raising version falls back to the
---previous one, then to the text unchanged.
---@param text string
---@param engine table
---@return string
function B:on_turn(text, engine)
  for _, v in ipairs(self:_versions()) do
    local hook = v and v.on_turn
    if hook then
      local ok, out = xpcall(hook, debug.traceback, text, engine)
      if ok and type(out) == "string" then return out end
      self.report(ok and "on_turn must return a string" or out)
    end
  end
  return text
end

-- A stage iterator over `up` that survives errors: when the version's
-- stage raises (building it or pulling from it), the next version's
-- stage takes over the rest of the stream; past the last, events pass
-- through unchanged. The event the broken stage had pulled and not passed
-- on is handed to the next one: received text is never dropped.
local function guarded(self, up, versions, i)
  for k = i, 2 do
    local v = versions[k]
    if v and v.stage then
      local held -- pulled by this stage, not yet passed on
      local tee = function()
        held = up()
        return held
      end
      local ok, it = xpcall(v.stage, debug.traceback, tee)
      if ok and type(it) == "function" then
        local failed = false
        return function()
          if failed then return it() end
          local okp, ev = xpcall(it, debug.traceback)
          if okp then
            held = nil
            return ev
          end
          self.report(ev)
          failed = true
          local replay = held
          held = nil
          it = guarded(self, function()
            if replay ~= nil then
              local r = replay
              replay = nil
              return r
            end
            return up()
          end, versions, k + 1)
          return it()
        end
      end
      self.report(ok and "stage must return an iterator" or it)
    end
  end
  return up
end

---The behaviour's stage as a pipeline stage spec (`e.stages`).
---@return mirza.StageSpec
function B:stage_spec()
  return { name = "behaviour", fn = function(up)
    return guarded(self, up, self:_versions(), 1)
  end }
end

return M
