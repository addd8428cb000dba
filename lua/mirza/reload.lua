--- mirza.reload: hot reload of Lua modules between turns.
---
--- Reload is "validate, then swap": the new file is loaded and run in a
--- protected call; only if it compiles, runs and returns a value does it
--- replace `package.loaded[name]`. A broken file keeps the previous version
--- running and the error (with file and line) is reported. Code that wants
--- to pick up new versions resolves modules by name at the start of each
--- turn (`package.loaded[name]`), so a stream in flight finishes on the
--- code it started with.
---
--- The watcher's state is a plain table owned by the caller; this module
--- keeps none, so it can itself be reloaded.
local core = require "mirza.core"

local M = {}

---@class mirza.Watcher
---@field files table<string, {path: string, mtime: number, size: integer}> watched modules by name
---@field on_error? fun(name: string, message: string) called when a reload fails
---@field on_reload? fun(name: string, path: string) called after a successful swap

---Create a watcher (a plain table).
---@param opts? {on_error?: fun(name: string, message: string), on_reload?: fun(name: string, path: string)}
---@return mirza.Watcher
function M.new(opts)
  opts = opts or {}
  return { files = {}, on_error = opts.on_error, on_reload = opts.on_reload }
end

---Find a module's file on package.path.
---@param name string
---@return string|nil path
---@return string? message
function M.find(name)
  return package.searchpath(name, package.path)
end

---Watch a module by name, from `path` or found on package.path.
---@param w mirza.Watcher
---@param name string module name, e.g. "mirza.route" or "behaviour"
---@param path? string the module's file
---@return boolean|nil ok
---@return string? message when the file cannot be found
---@return string? code "io"
function M.watch(w, name, path)
  local found, err = path, nil
  if not found then found, err = M.find(name) end
  if not found then return nil, err, "io" end
  local mtime, size = core.stat(found)
  if not mtime then return nil, size, "io" end
  w.files[name] = { path = found, mtime = mtime, size = size }
  return true
end

---Load `path` as module `name` without installing it.
---@param name string
---@param path string
---@return any|nil value what the chunk returned
---@return string? message compile or runtime error, with file and line
function M.load(name, path)
  local chunk, err = loadfile(path, "t")
  if not chunk then return nil, err end
  local ok, value = xpcall(chunk, debug.traceback, name, path)
  if not ok then return nil, value end
  if value == nil then return nil, path .. ": module returned nothing" end
  return value
end

---Reload one module now (validate, then swap).
---@param w mirza.Watcher
---@param name string
---@return boolean|nil ok
---@return string? message the error; the old version stays installed
---@return string? code "reload"
function M.reload(w, name)
  local f = w.files[name]
  if not f then return nil, "not watched: " .. name, "reload" end
  local value, err = M.load(name, f.path)
  if value == nil then
    if w.on_error then w.on_error(name, err) end
    return nil, err, "reload"
  end
  package.loaded[name] = value
  if w.on_reload then w.on_reload(name, f.path) end
  return true
end

---Reload every watched module whose file changed (mtime or size) since
---the last look. Call it between turns.
---@param w mirza.Watcher
---@return string[] reloaded names swapped in
---@return table<string, string> failed name -> error message (old versions kept)
function M.check(w)
  local reloaded, failed = {}, {}
  for name, f in pairs(w.files) do
    local mtime, size = core.stat(f.path)
    if mtime and (mtime ~= f.mtime or size ~= f.size) then
      f.mtime, f.size = mtime, size
      local ok, err = M.reload(w, name)
      if ok then reloaded[#reloaded + 1] = name else failed[name] = err end
    end
  end
  table.sort(reloaded)
  return reloaded, failed
end

return M
