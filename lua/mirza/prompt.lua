--- mirza.prompt: from what the caller typed to the `messages` of a request.
---
--- Input formats (the seed's): a plain string (one user message), a JSON
--- string holding a message list, or a Lua list of messages. A conversation
--- history is a plain table owned by the caller (`prompt.history()`); the
--- functions here take it, so the module can be hot-reloaded mid-chat.
---
--- Assistant turns are stored without their reasoning (`reasoning_content`
--- fields and `<think>…</think>` spans are dropped): chat templates render
--- past turns without it, so what we send again is byte-identical to what
--- the daemon has cached, and its prefix cache hits.
---
--- Context budget: the prompt must fit in `context_window - reserve`, where
--- `reserve` is the turn's resolved max_tokens. The estimate is deliberately
--- simple and cheap: ceil(bytes / 4) per text plus 5 tokens per message (role markers
--- of a chat template like `<|im_start|>user\n…<|im_end|>\n`) plus 3 for
--- the assistant primer. Bytes, not characters: accented French letters
--- count double, which keeps the estimate on the safe side. When the
--- prompt does not fit, whole turns (a user message and the replies that
--- follow it) are dropped from the oldest; never the system prompt, never
--- the current message. The history is trimmed in place and down to
--- `low_water` (75 %) of the budget, so the following turns keep the same
--- prefix (and keep hitting the cache) instead of shifting every turn.
local M = {}

--- Defaults of `build`'s options.
M.DEFAULTS = {
  context_window = 16384,  -- the daemon's context (the seed's maxKvCacheTokens)
  reserve = 0,             -- tokens reserved for the completion (the turn's max_tokens)
  low_water = 0.75,        -- after a trim the prompt fills at most this share
  bytes_per_token = 4,
  overhead = 5,            -- tokens per message
  primer = 3,              -- tokens opening the assistant reply
}

local ROLES = { system = true, user = true, assistant = true, tool = true, developer = true }
-- Fields a message keeps; anything else (reasoning_content, reasoning,
-- thinking, ...) is dropped when it is stored or sent.
local KEEP = { "role", "content", "name", "tool_calls", "tool_call_id" }

local function json_lib()
  local ok, mirza = pcall(require, "mirza")
  return ok and type(mirza) == "table" and mirza.json or nil
end

local function is_null(v)
  local json = json_lib()
  return v == nil or (json ~= nil and v == json.null)
end

-- nil when `m` is a valid message, else why not.
local function invalid(m, i)
  if type(m) ~= "table" then return ("message %d is not a table"):format(i) end
  if not ROLES[m.role] then return ("message %d: unknown role %s"):format(i, tostring(m.role)) end
  local c = m.content
  if type(c) == "string" or type(c) == "table" then return nil end
  if is_null(c) and m.tool_calls then return nil end
  return ("message %d: content must be a string or a list of parts"):format(i)
end

-- A copy of a message with only the fields a request needs.
local function clean(m)
  local out = {}
  for _, k in ipairs(KEEP) do out[k] = m[k] end
  return out
end

---Check a list of messages; returns a cleaned copy.
---@param list table
---@return table[]|nil messages
---@return string? message why the list is not a message list
---@return string? code "prompt"
function M.validate(list)
  if type(list) ~= "table" or #list == 0 then return nil, "not a non-empty message list", "prompt" end
  local out = {}
  for i, m in ipairs(list) do
    local why = invalid(m, i)
    if why then return nil, why, "prompt" end
    out[i] = clean(m)
  end
  return out
end

---Turn an input into messages. A string that decodes as a JSON message list
---is that list; any other string (including invalid JSON, or JSON that is
---not a message list, such as "[1, 2, 3]" typed by a user) is one user
---message, like the seed. A table is a message list, or one message.
---@param input string|table
---@return table[]|nil messages
---@return string kind_or_message "text" or "list"; the error message on failure
---@return string? code "prompt" on failure
function M.messages(input)
  if type(input) == "string" then
    local json = input:find("^%s*%[") and json_lib()
    local list = json and json.decode(input)
    local msgs = type(list) == "table" and M.validate(list)
    if msgs then return msgs, "list" end
    return { { role = "user", content = input } }, "text"
  end
  if type(input) == "table" then
    if input.role then input = { input } end
    local msgs, msg, code = M.validate(input)
    if not msgs then return nil, msg, code end
    return msgs, "list"
  end
  return nil, "prompt must be a string or a message list, got " .. type(input), "prompt"
end

---A new, empty conversation history.
---@param system? string the system prompt
---@return {system: string|nil, messages: table[]}
function M.history(system)
  return { system = system, messages = {} }
end

---Set (or remove, with nil) the history's system prompt.
---@param h table history
---@param text string|nil
function M.set_system(h, text)
  h.system = text
end

---Remove every turn; the system prompt stays.
---@param h table history
function M.clear(h)
  h.messages = {}
end

---An answer as stored: `<think>…</think>` spans removed (the seed's inline
---rendering), and an unterminated `<think>` (a turn cut while thinking)
---removed to the end.
---@param text string
---@return string
function M.strip_reasoning(text)
  text = text:gsub("<think>.-</think>", ""):gsub("<think>.*$", "")
  return (text:gsub("^%s+", ""))
end

---Append a message to the history, without its reasoning. An assistant
---message may carry `interrupted = true` (a turn cut short): kept in the
---history, never sent.
---@param h table history
---@param m table a message
function M.add(h, m)
  local why = invalid(m, #h.messages + 1)
  if why then error("prompt.add: " .. why, 2) end
  local interrupted = m.interrupted == true or nil
  m = clean(m)
  m.interrupted = interrupted
  if m.role == "assistant" and type(m.content) == "string" then
    m.content = M.strip_reasoning(m.content)
  end
  h.messages[#h.messages + 1] = m
end

---Append a user message.
---@param h table history
---@param text string
function M.add_user(h, text)
  M.add(h, { role = "user", content = text })
end

---Append an assistant answer (its reasoning, if any, is not stored).
---@param h table history
---@param text string
function M.add_assistant(h, text)
  M.add(h, { role = "assistant", content = text })
end

---Record a finished turn: the current messages (`info.current` from
---`build`, or `prompt.messages(input)`; system messages are skipped), then
---the answer with its tool calls (`{id, type, function = {name,
---arguments}}`, so a following `role = "tool"` message is valid), and
---`interrupted` for a turn cut short.
---@param h table history
---@param current table[]
---@param answer string|nil nil for a turn that produced nothing to keep
---@param extra? {tool_calls?: table[], interrupted?: boolean}
function M.add_turn(h, current, answer, extra)
  for _, m in ipairs(current) do
    if m.role ~= "system" then M.add(h, m) end
  end
  local calls = extra and extra.tool_calls
  if not answer and not calls then return end
  local content = answer or ""
  if calls and content == "" then
    local json = json_lib()
    content = json and json.null or ""
  end
  M.add(h, { role = "assistant", content = content, tool_calls = calls, interrupted = extra and extra.interrupted })
end

local function text_bytes(content)
  if type(content) == "string" then return #content end
  local n = 0
  if type(content) == "table" then
    for _, part in ipairs(content) do
      if type(part) == "table" and type(part.text) == "string" then n = n + #part.text end
    end
  end
  return n
end

---Estimated tokens of one message (see the module comment).
---@param m table
---@param opts? table bytes_per_token, overhead
---@return integer
function M.estimate_message(m, opts)
  opts = opts or M.DEFAULTS
  local bytes = text_bytes(m.content)
  if type(m.tool_calls) == "table" then
    for _, c in ipairs(m.tool_calls) do
      local f = type(c) == "table" and c["function"]
      if type(f) == "table" then bytes = bytes + #(f.name or "") + #(f.arguments or "") end
    end
  end
  local bpt = opts.bytes_per_token or M.DEFAULTS.bytes_per_token
  return math.ceil(bytes / bpt) + (opts.overhead or M.DEFAULTS.overhead)
end

---Estimated prompt tokens of a message list, primer included.
---@param messages table[]
---@param opts? table bytes_per_token, overhead, primer
---@return integer
function M.estimate(messages, opts)
  opts = opts or M.DEFAULTS
  local n = opts.primer or M.DEFAULTS.primer
  for _, m in ipairs(messages) do n = n + M.estimate_message(m, opts) end
  return n
end

-- Sizes of the leading whole turns of `list`: a turn starts at a user
-- message (a leading non-user message is a turn of its own).
local function turns(list)
  local sizes = {}
  for i, m in ipairs(list) do
    if i == 1 or m.role == "user" then sizes[#sizes + 1] = 0 end
    sizes[#sizes] = sizes[#sizes] + 1
  end
  return sizes
end

local function with_defaults(opts)
  local o = {}
  for k, v in pairs(M.DEFAULTS) do o[k] = v end
  for k, v in pairs(opts or {}) do o[k] = v end
  return o
end

-- How many leading messages of `older` to drop so that the prompt fits:
-- none when it fits, else whole turns until it fits in low_water × budget.
local function drop_count(fixed, older, o)
  local budget = o.context_window - o.reserve
  local total = fixed
  for _, m in ipairs(older) do total = total + M.estimate_message(m, o) end
  if total <= budget then return 0, total end
  local target, dropped = math.floor(budget * o.low_water), 0
  for _, size in ipairs(turns(older)) do
    if total <= target then break end
    for i = dropped + 1, dropped + size do total = total - M.estimate_message(older[i], o) end
    dropped = dropped + size
  end
  return dropped, total
end

-- Split parsed input into (system override, earlier messages, current turn).
local function split_input(msgs)
  local system, rest = nil, {}
  for _, m in ipairs(msgs) do
    if m.role == "system" and #rest == 0 then system = m.content else rest[#rest + 1] = m end
  end
  local last_user = 1
  for i, m in ipairs(rest) do
    if m.role == "user" then last_user = i end
  end
  return system, table.move(rest, 1, last_user - 1, 1, {}), table.move(rest, last_user, #rest, 1, {})
end

-- Drop the first `d` stored messages of a history, in place.
local function drop_stored(h, d)
  local n = #h.messages
  d = math.min(d, n)
  table.move(h.messages, d + 1, n, 1)
  for i = n - d + 1, n do h.messages[i] = nil end
end

local function concat(...)
  local out = {}
  for _, list in ipairs({ ... }) do table.move(list, 1, #list, #out + 1, out) end
  return out
end

---Context budget options of prompt.build; unset fields take prompt.DEFAULTS.
---@class mirza.PromptBudget
---@field context_window? integer
---@field reserve? integer
---@field low_water? number
---@field bytes_per_token? number
---@field overhead? integer
---@field primer? integer

---Build a request's messages: system prompt, history, then the input,
---trimmed to the context budget (see the module comment). A system message
---at the head of a list input replaces the history's for this request;
---messages of a list input before its last user message are older turns
---(trimmed like history, not stored). With `h` nil, only the input counts.
---The history is trimmed in place when it does not fit.
---@param h table|nil history
---@param input string|table
---@param opts? mirza.PromptBudget
---@return table[]|nil messages
---@return table info_or_message `{tokens, budget, dropped, fits, current}`; the error message on failure
---@return string? code "prompt" on failure
function M.build(h, input, opts)
  local msgs, kind, code = M.messages(input)
  if not msgs then return nil, kind, code end
  local o = with_defaults(opts)
  local system, earlier, current = split_input(msgs)
  system = system or (h and h.system)
  local head = system and { { role = "system", content = system } } or {}
  local older = concat(h and h.messages or {}, earlier)
  local fixed = M.estimate(head, o) + M.estimate(current, o) - o.primer -- one primer
  local dropped, tokens = drop_count(fixed, older, o)
  if h and dropped > 0 then drop_stored(h, dropped) end
  local out = concat(head, table.move(older, dropped + 1, #older, 1, {}), current)
  for i, m in ipairs(out) do
    if m.interrupted then out[i] = clean(m) end -- a history mark, not a message field
  end
  local budget = o.context_window - o.reserve
  return out, { tokens = tokens, budget = budget, dropped = dropped, fits = tokens <= budget, current = current }
end

---The text of the last user message (what a thinking hook looks at).
---@param messages table[]
---@return string
function M.last_user_text(messages)
  for i = #messages, 1, -1 do
    local m = messages[i]
    if m.role == "user" then
      if type(m.content) == "string" then return m.content end
      local parts = {}
      for _, p in ipairs(m.content) do parts[#parts + 1] = type(p) == "table" and p.text or nil end
      return table.concat(parts, " ")
    end
  end
  return ""
end

return M
