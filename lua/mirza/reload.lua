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
--- Versions: a version that loads can still raise once it runs. The
--- watcher remembers, per module, its original version (the one installed
--- before the first swap: the built-in one for an embedded policy), the
--- last version that ran without raising (`worked`) and the versions that
--- raised (`failed`: kept out of use until the file changes again, which
--- brings a new version). `versions(w, name)` lists what to try, newest
--- first; mirza.policy uses it so that a raising policy never ends a turn.
---
--- The watcher's state is a plain table owned by the caller; this module
--- keeps none, so it can itself be reloaded.
local core = require "mirza.core"

local M = {}

---@class mirza.WatchedFile
---@field path string
---@field mtime number
---@field size integer
---@field base any the version installed before the first swap (nil when there was none)
---@field good any the last version that ran without raising

---@class mirza.Watcher
---@field files table<string, mirza.WatchedFile> watched modules by name
---@field bad table<any, string> versions that raised at run time -> their error (weak keys)
---@field on_error? fun(name: string, message: string) called when a reload fails
---@field on_reload? fun(name: string, path: string) called after a successful swap

---Create a watcher (a plain table).
---@param opts? {on_error?: fun(name: string, message: string), on_reload?: fun(name: string, path: string)}
---@return mirza.Watcher
function M.new(opts)
  opts = opts or {}
  return { files = {}, bad = setmetatable({}, { __mode = "k" }), on_error = opts.on_error, on_reload = opts.on_reload }
end

---Find a module's file on package.path.
---@param name string
---@return string|nil path
---@return string? message
function M.find(name)
  return package.searchpath(name, package.path)
end

---Watch a module by name, from `path` or found on package.path, and load
---that file now (validate, then swap), so it is the version in use from
---the next turn on, not only after its first change. A file that does not
---load is reported (`on_error`) and returns `nil, message, "reload"`: the
---current version stays, and the file is watched all the same (a fix is
---picked up when it changes). `opts.load = false` only watches (a module
---already loaded from that very file).
---@param w mirza.Watcher
---@param name string module name, e.g. "mirza.route" or "behaviour"
---@param path? string the module's file
---@param opts? {load?: boolean, on_error?: fun(name: string, message: string)} on_error: instead of the watcher's
---@return boolean|nil ok true: watched and loaded
---@return string? message the file cannot be found ("io") or does not load ("reload")
---@return string? code "io" | "reload"
function M.watch(w, name, path, opts)
  local found, err = path, nil
  if not found then found, err = M.find(name) end
  if not found then return nil, err, "io" end
  local mtime, size = core.stat(found)
  if not mtime then return nil, size, "io" end
  local old = w.files[name]
  local base = old and old.base
  if not old then -- the original: what is installed, else the embedded one
    base = package.loaded[name]
    if base == nil and package.preload[name] then base = require(name) end
  end
  w.files[name] = { path = found, mtime = mtime, size = size, base = base, good = old and old.good }
  if opts and opts.load == false then
    -- not loaded yet: the original is the version `require` loads first (see versions)
    if base == nil then w.files[name].lazy = true end
    return true
  end
  return M.reload(w, name, opts and opts.on_error)
end

---An error as one line naming its file: the first line of a string error
---(no traceback), with `path` put in front when it names no file:line.
---@param err any
---@param path? string
---@return string
function M.message(err, path)
  local msg = tostring(err):match("^[^\n]*")
  if path and not msg:find("^[^:]+:%d+:") then msg = path .. ": " .. msg end
  return msg
end

---Load `path` as module `name` without installing it.
---@param name string
---@param path string
---@return any|nil value what the chunk returned
---@return string? message compile or runtime error, with file and line (an interrupt raises)
function M.load(name, path)
  local chunk, err = loadfile(path, "t")
  if not chunk then return nil, err end
  local ok, value = pcall(chunk, name, path)
  if not ok and require("mirza.pipeline").passes(value) and type(value) == "string" then
    error(value, 0) -- Ctrl-C while the file runs: no fault of the file's
  end
  if not ok then return nil, M.message(value, path) end
  if value == nil then return nil, path .. ": module returned nothing" end
  return value
end

---Reload one module now (validate, then swap).
---@param w mirza.Watcher
---@param name string
---@param on_error? fun(name: string, message: string) where a failure is reported (default: `w.on_error`)
---@return boolean|nil ok
---@return string? message the error; the old version stays installed
---@return string? code "reload"
function M.reload(w, name, on_error)
  local f = w.files[name]
  if not f then return nil, "not watched: " .. name, "reload" end
  local value, err = M.load(name, f.path)
  if value == nil then
    on_error = on_error or w.on_error
    if on_error then on_error(name, err) end
    return nil, err, "reload"
  end
  package.loaded[name] = value
  f.lazy = nil -- a swap before the first require: there is no original
  if w.on_reload then w.on_reload(name, f.path) end
  return true
end

---The versions of module `name` to try, newest first: the installed one,
---the last one that worked, the original one; without those that raised
---(`failed`). Just the installed one when the module is not watched.
---@param w mirza.Watcher
---@param name string
---@return any[] versions
---@return any base the original version (nil when there was none)
function M.versions(w, name)
  local f, cur = w.files[name], package.loaded[name]
  if not f then return { cur } end
  if f.lazy and cur ~= nil then f.base, f.lazy = cur, nil end
  local out = {}
  local each = { cur, f.good, f.base }
  for i = 1, 3 do
    local v = each[i]
    if v ~= nil and not w.bad[v] and v ~= out[1] and v ~= out[2] then out[#out + 1] = v end
  end
  return out, f.base
end

---Record that a version of `name` raised at run time: it stays out of use
---(`versions`) until its file changes. Returns true the first time, so the
---caller reports each version's error once.
---@param w mirza.Watcher
---@param version any
---@param message string
---@return boolean first
function M.failed(w, version, message)
  if w.bad[version] then return false end
  w.bad[version] = message
  return true
end

---Record that a version of `name` ran without raising (the fallback of
---the versions after it).
---@param w mirza.Watcher
---@param name string
---@param version any
function M.worked(w, name, version)
  local f = w.files[name]
  if f and not w.bad[version] then f.good = version end
end

---Reload every watched module whose file changed (mtime or size) since
---the last look. Call it between turns.
---@param w mirza.Watcher
---@param on_error? fun(name: string, message: string) where failures are reported (default: `w.on_error`)
---@return string[] reloaded names swapped in
---@return table<string, string> failed name -> error message (old versions kept)
function M.check(w, on_error)
  local reloaded, failed = {}, {}
  for name, f in pairs(w.files) do
    local mtime, size = core.stat(f.path)
    if mtime and (mtime ~= f.mtime or size ~= f.size) then
      f.mtime, f.size = mtime, size
      local ok, err = M.reload(w, name, on_error)
      if ok then reloaded[#reloaded + 1] = name else failed[name] = err end
    end
  end
  table.sort(reloaded)
  return reloaded, failed
end

return M
