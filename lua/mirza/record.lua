--- mirza.record: every request and turn written to a directory, in files
--- `mirza-sim --replay-dir DIR` serves again byte for byte.
---
--- Recording is on for a request given `record = DIR` (`mirza.open`,
--- `mirza.request`, `mirza.collect`, the engine's `record` option), or for
--- every request when `MIRZA_RECORD=DIR` is set (`record = false` opts a
--- request out). Per request, numbered in order (`000001`, `000002`, ...):
---
---   NNNNNN.request   "METHOD URL" on the first line, the script's headers
---                    (secrets redacted), a blank line, the body verbatim
---   NNNNNN.response  the response as received: the head (status line and
---                    headers, CRLF) then the body as delivered (libcurl
---                    de-chunks and decodes it), written by the C client
---
--- Secrets never reach the files: `api_key` (the Authorization header) is
--- not written, a header whose name looks like a credential (*auth*, as in
--- Authorization and Proxy-Authorization, *cookie*, *key*, *token*,
--- *secret*, *password*, *passwd*: mirza.core.is_secret, the C core's
--- list) has its value replaced by `[redacted]`, and so do the URL's
--- userinfo (`http://user:pass@host`) and its credential-like query
--- parameters (`mirza.redact_url`, the rule of the C core's messages);
--- runs.jsonl shows its endpoint and errors the same way.
--- The body is kept verbatim: replay matches requests by it.
---
--- An engine recording also appends one JSON line per turn to `runs.jsonl`
--- (`log_turn`): time, endpoint, model, session, the conversation's name
--- (`e.conversation_name`: `mirza chat`'s, a saved one's), request number,
--- a prompt summary, the answer, the reasoning length, tool calls, stats,
--- error.
--- Numbers continue after the files already in the directory, and several
--- processes may record into one directory at once: a number is claimed
--- by appending one byte to the directory's `.ids` file (O_APPEND, so each
--- claim lands at its own offset, which is the number), never by looking
--- for a free name, and each runs.jsonl line goes out in one write, so
--- lines of several processes never interleave. Numbers are unique, not
--- always consecutive (two processes starting on an older recording at
--- once may skip a few), and go on after `rm DIR/*`, which leaves `.ids`.
local M = {}

local core = require "mirza.core"
local util = require "mirza.util"

-- Per directory: the number past the files found there when this process
-- first recorded into it (claims start there at the least).
local floors = {}

---The request number a stream was recorded under.
---@type table<mirza.Stream, string>
M.ids = setmetatable({}, { __mode = "k" })

---The directory from `MIRZA_RECORD`, read once when the module loads.
M.env_dir = os.getenv("MIRZA_RECORD")
if M.env_dir == "" then M.env_dir = nil end

local function exists(path)
  local f = io.open(path)
  if f then f:close() end
  return f ~= nil
end

-- Claim request numbers in dir: append bytes to its `.ids` so that the
-- last one claimed is at least `least`; returns that number. Appends are
-- atomic (O_APPEND, one unbuffered write): the offset after ours is ours
-- alone, whoever else appends at the same time.
local function claim(dir, least)
  local f, err = io.open(dir .. "/.ids", "ab")
  if not f then error("mirza.open: cannot record into " .. dir .. ": " .. err, 5) end
  f:setvbuf("no")
  local have = f:seek("end")
  f:write(("\n"):rep(math.max(1, least - have)))
  local n = f:seek("cur")
  f:close()
  return n
end

local function next_id(dir)
  local least = floors[dir]
  if not least then
    core.mkdir_p(dir) -- no shell; a failure is claim's to report, with the file it could not open
    least = 1
    while exists(("%s/%06d.request"):format(dir, least)) do least = least + 1 end
    floors[dir] = least
  end
  local n = claim(dir, least)
  -- a file not claimed through .ids (an older recording, a copy) keeps its number
  while exists(("%s/%06d.request"):format(dir, n)) do n = claim(dir, n + 1) end
  return ("%06d"):format(n)
end

---A URL as it may be written: userinfo and credential-like query
---parameters as `[redacted]` (`mirza.redact_url`).
---@param url string
---@return string
function M.scrub_url(url)
  return core.redact_url(url)
end

---Text (a message, a log line) with every URL in it as `mirza.redact_url`
---shows it: what a Lua-side message puts around a URL cannot carry its
---credentials out.
---@param text string
---@return string
function M.redact_text(text)
  return (text:gsub("%a[%w+.-]*://[^%s\"'<>]+", core.redact_url))
end

-- The script's headers as lines, secrets redacted.
local function header_lines(headers, api_key)
  local out = {}
  for k, v in pairs(headers or {}) do
    local name, value = k, v
    if type(k) ~= "string" then name, value = tostring(v):match("^([^:]*):%s*(.*)$") end
    if name then
      out[#out + 1] = ("%s: %s"):format(name, core.is_secret(name) and "[redacted]" or value)
    end
  end
  table.sort(out)
  if api_key then out[#out + 1] = "Authorization: [redacted]" end
  return out
end

---Record a request into `dir`: write its `.request` file and return the
---options for `mirza.core.open` (the body encoded once, so the file holds
---exactly the bytes sent; `record_file` naming the `.response` file) and
---the request number.
---@param opts mirza.RequestOptions the request, without `record`
---@param dir string
---@return table req
---@return string id
function M.prepare(opts, dir)
  local req = util.copy(opts)
  if type(req.body) == "table" then req.body = core.json.encode(req.body) end
  local id = next_id(dir)
  local method = req.method or (req.body and "POST" or "GET")
  local lines = header_lines(req.headers, req.api_key)
  table.insert(lines, 1, method .. " " .. M.scrub_url(req.url or ""))
  local path = ("%s/%s.request"):format(dir, id)
  local f, err = io.open(path, "wb")
  if not f then error("mirza.open: cannot record into " .. dir .. ": " .. err, 3) end
  f:write(table.concat(lines, "\n"), "\n\n", req.body or "")
  f:close()
  req.record_file = ("%s/%s.response"):format(dir, id)
  return req, id
end

---`mirza.open` with recording: `opts.record` (a directory, or false), else
---`MIRZA_RECORD`.
---@param opts mirza.RequestOptions
---@return mirza.Stream
function M.open(opts)
  local dir = opts.record
  if dir == nil then dir = M.env_dir end
  local req = util.copy(opts)
  req.record = nil
  if not dir then return core.open(req) end
  local id
  req, id = M.prepare(req, dir)
  local s = core.open(req)
  M.ids[s] = id
  return s
end

-- ------------------------------------------------------------ run log

-- At most n bytes of s, cut on a UTF-8 character boundary.
local function clip(s, n)
  if #s <= n then return s end
  local i = n
  while i > 0 and (s:byte(i + 1) or 0) & 0xC0 == 0x80 do i = i - 1 end
  return s:sub(1, i) .. "…"
end

---A short summary of a turn's input: the last user text, else what the
---messages are (e.g. "2 tool results").
---@param messages table[]
---@return string
function M.summary(messages)
  local last = messages[#messages]
  if last and last.role == "user" then
    return clip(require("mirza.prompt").last_user_text(messages), 200)
  end
  local tools = 0
  for _, m in ipairs(messages) do if m.role == "tool" then tools = tools + 1 end end
  if tools > 0 then return ("%d tool result%s"):format(tools, tools > 1 and "s" or "") end
  return ("%d messages"):format(#messages)
end

local STATS = { "ttft_ms", "server_ttft_ms", "tok_s", "tokens", "prompt_tokens", "cached_tokens", "total_ms",
  "session_cache_hit" }

---The run log line of a finished turn (a table, see the module comment).
---@param e mirza.Engine
---@param out {acc: mirza.Reducer, answer: string, cancelled: boolean, stream: mirza.Stream} the turn's outcome
---@param messages table[] the messages it sent
---@return table
function M.turn_line(e, out, messages)
  local acc = out.acc
  local fin = acc.final or {}
  local line = {
    time = os.date("!%Y-%m-%dT%H:%M:%SZ"), endpoint = M.scrub_url(e.chat_url), model = e:model(),
    session = e.cfg.session_id, conversation = e.conversation_name,
    request = M.ids[out.stream], prompt = M.summary(messages), answer = out.answer,
    reasoning_bytes = acc.think_bytes, finish_reason = fin.finish_reason,
    tool_calls = acc.tool_calls and #acc.tool_calls or 0, interrupted = out.cancelled or nil, stats = {},
  }
  for _, k in ipairs(STATS) do line.stats[k] = e.last and e.last[k] end
  if fin.type == "error" then
    line.error = { message = fin.message and M.redact_text(fin.message), code = fin.code }
  end
  return line
end

---Append a finished turn's line to `<record dir>/runs.jsonl`. A failure
---to write is logged, never raised (the turn is over); an interrupt
---(Ctrl-C) is no failure to write: it goes on up (`pipeline.passes`).
---@param e mirza.Engine
---@param out table the turn's outcome (see `turn_line`)
---@param messages table[] the messages it sent
function M.log_turn(e, out, messages)
  local dir = e.cfg.record
  local ok, err = pcall(function()
    local text = core.json.encode(M.turn_line(e, out, messages))
    local f = assert(io.open(dir .. "/runs.jsonl", "ab"))
    f:setvbuf("no") -- the whole line in one write (O_APPEND): never interleaved with another process's
    f:write(text .. "\n")
    f:close()
  end)
  if not ok and require("mirza.pipeline").passes(err) then error(err, 0) end -- Ctrl-C, a task's cancel
  if not ok then e:log("warning", "run log: " .. tostring(err)) end
end

return M
