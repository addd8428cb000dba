--- mirza.conversation: an engine's conversation kept in a file, so that it
--- outlives the process (`e:save(path)`, `engine.new{history = path}`,
--- `mirza chat --continue`).
---
--- The file is one JSON object:
---
---   {"mirza_conversation": 1, "name": "...", "saved_at": "2026-12-04T03:50:39Z",
---    "session_id": "mirza-...", "model": "...", "thinking": {"budget": 0},
---    "system": "...", "messages": [...]}
---
--- `messages` are the history as the engine keeps it (assistant turns
--- without their reasoning, tool calls and results, `interrupted` marks),
--- so a resumed conversation sends the same bytes again and the daemon's
--- prefix cache still matches; the session id is the daemon's session
--- (MTPLX keeps its KV cache under it). A save writes a temporary file in
--- the same directory, then renames it over the old one: a reader, or a
--- crash, never sees a half-written file (the rename is atomic; the data
--- reach the disk when the system flushes them: no fsync from Lua).
---
--- `mirza chat` keeps its conversations in a per-user directory
--- (`dir()`: $XDG_STATE_HOME/mirza/conversations, else
--- ~/.local/state/mirza/conversations, created 0700), one NAME.json each,
--- and the name of the last one saved in its `last` file. A chat claims
--- its name when it starts (`claim`, `claim_new`): two chats started in
--- the same second get two names, not one file saved over by both.
local M = {}

---The format's version, written as `mirza_conversation`; files of a newer
---version are refused.
M.VERSION = 1

local function json() return require("mirza").json end

-- The message list as JSON wants it: an array even when empty.
local function messages_of(history)
  local out = json().array {}
  for i, m in ipairs(history.messages) do out[i] = m end
  return out
end

---The conversation of an engine as the table saved.
---@param e mirza.Engine
---@param name? string default: `e.conversation_name`
---@return table
function M.snapshot(e, name)
  return {
    mirza_conversation = M.VERSION, name = name or e.conversation_name, saved_at = os.date("!%Y-%m-%dT%H:%M:%SZ"),
    session_id = e.cfg.session_id, model = e:model(), thinking = { budget = e.thinking.budget },
    system = e.history.system, messages = messages_of(e.history),
  }
end

-- "dir/name.json" -> "name"
local function basename(path)
  return (path:match("([^/]+)$") or path):gsub("%.json$", "")
end

---Write `text` to `path` through a temporary file in the same directory
---and a rename: the file is the old one or the new one, never a part.
---@param path string
---@param text string
---@return true|nil ok
---@return string? message
---@return string? code "io"
function M.write_atomic(path, text)
  local tmp = ("%s.%08x.tmp"):format(path, math.random(0, 0x7fffffff))
  local f, err = io.open(tmp, "wb")
  if not f then return nil, ("cannot save %s: %s"):format(path, err), "io" end
  local ok, werr = f:write(text)
  local closed, cerr = f:close()
  if not ok or not closed then
    os.remove(tmp)
    return nil, ("cannot save %s: %s"):format(path, tostring(werr or cerr)), "io"
  end
  local moved, rerr = os.rename(tmp, path)
  if not moved then
    os.remove(tmp)
    return nil, ("cannot save %s: %s"):format(path, rerr), "io"
  end
  return true
end

---Save an engine's conversation to `path` (see the module comment). The
---engine's `conversation_name`, when not set, becomes the file's name
---without `.json`.
---@param e mirza.Engine
---@param path string
---@return true|nil ok
---@return string? message
---@return string? code "io"
function M.save(e, path)
  if type(path) ~= "string" then error("e:save: path must be a string, got " .. type(path), 3) end
  e.conversation_name = e.conversation_name or basename(path)
  return M.write_atomic(path, json().encode(M.snapshot(e)) .. "\n")
end

-- Why a decoded file is not a conversation, or nil.
local function invalid(t)
  if type(t) ~= "table" or type(t.mirza_conversation) ~= "number" then return "not a mirza conversation" end
  if t.mirza_conversation > M.VERSION then
    return ("a conversation of format %s, newer than this mirza's (%d)"):format(tostring(t.mirza_conversation),
      M.VERSION)
  end
  if type(t.messages) ~= "table" then return "no message list" end
  for _, k in ipairs { "session_id", "system", "name", "model" } do
    if t[k] ~= nil and t[k] ~= json().null and type(t[k]) ~= "string" then return ("'%s' is not a string"):format(k) end
  end
  if t.thinking ~= nil and (type(t.thinking) ~= "table" or type(t.thinking.budget) ~= "number") then
    return "'thinking' has no budget"
  end
end

---Read a saved conversation: the table, with its history rebuilt and
---checked (`history = {system, messages}`), or nil, message, code: "io"
---when the file cannot be read, "history" when it is not a whole
---conversation (cut, not JSON, a message that is not one).
---@param path string
---@return table|nil conversation
---@return string? message
---@return string? code "io"|"history"
function M.read(path)
  local f, err = io.open(path, "rb")
  if not f then return nil, ("cannot read the conversation: %s"):format(err), "io" end
  local text = f:read("a") or ""
  f:close()
  local t, jerr = json().decode(text)
  local why = jerr or invalid(t)
  if why then return nil, ("%s is not a saved conversation (%s)"):format(path, why), "history" end
  local prompt = require "mirza.prompt"
  local h = prompt.history(type(t.system) == "string" and t.system or nil)
  for i, m in ipairs(t.messages) do
    local ok, aerr = pcall(prompt.add, h, m)
    if not ok then
      return nil, ("%s is not a saved conversation (message %d: %s)"):format(path, i,
        tostring(aerr):gsub("^prompt%.add: ", "")), "history"
    end
  end
  t.history = h
  return t
end

---Give a read conversation to an engine: its history, session id (unless
---`keep_session`: one the script set itself), thinking budget and name.
---The model is not changed (the daemon may serve another one now):
---`e.conversation.model` says which one answered before.
---@param e mirza.Engine
---@param t table from `read`
---@param keep_session? boolean
function M.apply(e, t, keep_session)
  e.history = t.history
  if type(t.session_id) == "string" and not keep_session then e.cfg.session_id = t.session_id end
  if t.thinking then require("mirza.thinking").set_budget(e.thinking, t.thinking.budget) end
  e.conversation_name = type(t.name) == "string" and t.name or nil
  e.conversation = { name = e.conversation_name, model = type(t.model) == "string" and t.model or nil,
    saved_at = t.saved_at, messages = #t.history.messages }
end

-- ------------------------------------------------------------ chat's directory

---The per-user directory of `mirza chat`'s conversations, created (mode
---0700, parents as needed) when missing.
---@param env? fun(name: string): string|nil default os.getenv
---@return string|nil dir
---@return string? message
---@return string? code "io"
function M.dir(env)
  env = env or os.getenv
  local state = env("XDG_STATE_HOME")
  if not state or state == "" then
    local home = env("HOME")
    if not home or home == "" then return nil, "neither XDG_STATE_HOME nor HOME is set", "io" end
    state = home .. "/.local/state"
  end
  local dir = state .. "/mirza/conversations"
  local core = require "mirza.core"
  if select(3, core.stat(dir)) == "directory" then return dir end
  local ok, err = core.mkdir_p(dir, tonumber("700", 8)) -- no shell: any name is safe
  if not ok then return nil, err, "io" end
  return dir
end

---Whether `name` may name a conversation: letters, digits, `.`, `_`, `-`,
---not starting with `.` (no path, nothing hidden), at most 100 bytes.
---@param name string
---@return boolean
function M.valid_name(name)
  return type(name) == "string" and #name <= 100 and name:find("^[%w_-][%w._-]*$") ~= nil
end

---The file of conversation `name` in `dir`.
---@param dir string
---@param name string
---@return string path
function M.path(dir, name)
  return ("%s/%s.json"):format(dir, name)
end

local function exists(path)
  local f = io.open(path)
  if f then f:close() end
  return f ~= nil
end

local function is_dir(path)
  return select(3, require("mirza.core").stat(path)) == "directory"
end

-- The claim of conversation `name`: a directory beside its file.
local function claim_path(dir, name)
  return ("%s/.%s.claim"):format(dir, name)
end

local function taken(dir, name)
  return exists(M.path(dir, name)) or is_dir(claim_path(dir, name))
end

---A name for a new conversation in `dir`: the local time
---("2026-12-04-035039"), with "-2", "-3", ... when taken (saved, or
---claimed by a chat that has not saved yet). Nothing is claimed: see
---`claim_new`.
---@param dir string
---@return string
function M.new_name(dir)
  local base = os.date("%Y-%m-%d-%H%M%S")
  local name, n = base, 1
  while taken(dir, name) do
    n = n + 1
    name = ("%s-%d"):format(base, n)
  end
  return name
end

---@class mirza.ConversationClaim
---@field dir string
---@field name string
---@field path string the claim (a directory, `DIR/.NAME.claim`)
local Claim = {}
Claim.__index = Claim

---Give the name up (idempotent): once its file is saved (the file keeps
---it from then on), or when nothing was saved under it.
function Claim:release()
  if not self.path then return end
  os.remove(self.path .. "/owner")
  os.remove(self.path)
  self.path = nil
end
Claim.__close = Claim.release
Claim.__gc = Claim.release

---Claim conversation `name` in `dir` for this process, before anything is
---saved under it: no other chat takes the name while the claim is held
---(`claim:release()` gives it up; after the first save the file holds
---it). Exclusive without O_EXCL: a directory holding a file is renamed
---into place as `DIR/.NAME.claim`, and a rename onto a directory that is
---not empty fails, so of two claims made at once one wins.
---@param dir string
---@param name string a valid name (`valid_name`)
---@return mirza.ConversationClaim|nil claim
---@return string? message
---@return string? code "taken" (saved, or claimed: see the message) | "io"
function M.claim(dir, name)
  local target = claim_path(dir, name)
  local function busy()
    if exists(M.path(dir, name)) then
      return nil, ("a conversation named %s exists: --continue %s resumes it"):format(name, name), "taken"
    end
    return nil, ("another mirza chat is starting conversation %s (or one that was killed left %s: remove it)")
      :format(name, target), "taken"
  end
  if taken(dir, name) then return busy() end
  local tmp = ("%s/.claim.%08x%04x.tmp"):format(dir, math.random(0, 0x7fffffff), math.random(0, 0xffff))
  local made, err = require("mirza.core").mkdir_p(tmp, tonumber("700", 8))
  if not made then return nil, ("cannot claim %s: %s"):format(name, err), "io" end
  local f, ferr = io.open(tmp .. "/owner", "w") -- not empty: a rename onto it fails
  if f then
    f:write(os.date("!%Y-%m-%dT%H:%M:%SZ"), "\n")
    f:close()
  end
  local moved, rerr
  if f then moved, rerr = os.rename(tmp, target) end
  if not moved then
    os.remove(tmp .. "/owner")
    os.remove(tmp)
    if f and is_dir(target) then return busy() end
    return nil, ("cannot claim %s: %s"):format(name, tostring(ferr or rerr)), "io"
  end
  local c = setmetatable({ dir = dir, name = name, path = target }, Claim)
  if exists(M.path(dir, name)) then -- saved (and released) by another chat since the check
    c:release()
    return busy()
  end
  return c
end

---Claim a new conversation's name in `dir` (`new_name`'s, the next free
---one when another chat claims it first).
---@param dir string
---@return mirza.ConversationClaim|nil claim its `name` is the conversation's
---@return string? message
---@return string? code "io"
function M.claim_new(dir)
  for _ = 1, 1000 do
    local c, err, code = M.claim(dir, M.new_name(dir))
    if c or code ~= "taken" then return c, err, code end
  end
  return nil, ("no free conversation name in %s"):format(dir), "io"
end

---Note `name` as the last conversation saved in `dir`.
---@param dir string
---@param name string
---@return true|nil ok
---@return string? message
---@return string? code "io"
function M.mark_last(dir, name)
  return M.write_atomic(dir .. "/last", name .. "\n")
end

local function is_file(path)
  return select(3, require("mirza.core").stat(path)) == "file"
end

---The file of the conversation to continue: `name`, else the last one
---saved in `dir`. A `name` holding a `/` is a path. One ending in `.json`
---is the file of that name in the current directory, else conversation
---`name` of `dir`, else that conversation without `.json` (`talk.json`:
---`talk`). Any other name is conversation `name` of `dir`, else the file
---of that name in the current directory: a name that resumed a
---conversation of `dir` still does, a file there shadows nothing.
---@param dir string|nil nil: only a file will do
---@param name? string
---@return string|nil path
---@return string name_or_message the conversation's name (a file's: its name without `.json`)
---@return string? code on failure "io" (none to continue, no such conversation), "usage" (a bad name);
---  on success "file" when the path is a file of the user's, not one of `dir` (saved back there)
function M.find(dir, name)
  if name and name:find("/", 1, true) then
    if not exists(name) then return nil, ("no conversation file %s"):format(name), "io" end
    return name, basename(name), "file"
  end
  if not name then
    if not dir then return nil, "no conversation directory", "io" end
    local f = io.open(dir .. "/last")
    name = f and f:read("l")
    if f then f:close() end
    if not name then return nil, ("no conversation to continue in %s"):format(dir), "io" end
    if not M.valid_name(name) then
      return nil, ("%q is not a conversation name (letters, digits, . _ -)"):format(name), "usage"
    end
    if not exists(M.path(dir, name)) then return nil, ("no conversation named %s in %s"):format(name, dir), "io" end
    return M.path(dir, name), name
  end
  local stem = name:match("^(.+)%.json$")
  if stem and is_file(name) then return name, stem, "file" end -- a file's name: the file here first
  for _, n in ipairs { name, stem } do
    if dir and M.valid_name(n) and exists(M.path(dir, n)) then return M.path(dir, n), n end
  end
  if not stem and is_file(name) then return name, name, "file" end -- no such conversation: a file here
  if not M.valid_name(name) then
    return nil, ("%q is not a conversation name (letters, digits, . _ -)"):format(name), "usage"
  end
  if not dir then return nil, ("no conversation directory, nor a file %s here"):format(name), "io" end
  return nil, ("no conversation named %s in %s, nor a file %s here"):format(stem or name, dir, name), "io"
end

return M
