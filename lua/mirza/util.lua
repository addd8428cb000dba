--- mirza.util: the table helpers the library's modules share (one copy
--- instead of one per module), and the time a log line starts with.
local M = {}

---Set into[k] = v for every pair of `from` (nil: nothing); returns `into`.
---@generic T: table
---@param into T
---@param from? table
---@return T
function M.merge(into, from)
  for k, v in pairs(from or {}) do into[k] = v end
  return into
end

---A shallow copy of t (nil: an empty table).
---@param t? table
---@return table
function M.copy(t)
  return M.merge({}, t)
end

---The local time as a log line starts with: "2026-12-07 05:31:02".
---@param t? integer seconds since the epoch (default: now)
---@return string
function M.log_time(t)
  return os.date("%Y-%m-%d %H:%M:%S", t) --[[@as string]]
end

return M
