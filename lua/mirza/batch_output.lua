--- mirza.batch_output: where a batch's records go (mirza.batch).
---
--- Answers go to OUTPUT, failures to an error file beside it (OpenAI's
--- Batch API: an output file and an error file, records of one shape).
--- OUTPUT is read back as a stream when a run starts again (resume): the
--- custom_ids it holds go into the run's id set, one line at a time,
--- never the whole file; a last line torn by a kill is cut off. The error
--- file's items are done again by the next run: it is read (how many
--- there are) and started anew.
local mirza = require "mirza"
local core = require "mirza.core"
local tools = require "mirza.tools"
local json = mirza.json

local O = {}

-- The place of a body recorded as the server sent it (O.encode_record):
-- unique per process, so no text of an item's can be taken for it.
local RAW = ("\1mirza-raw-body-%08x%08x\1"):format(math.random(0, 0xffffffff), math.random(0, 0xffffffff))
local RAW_JSON = json.encode(RAW)

-- A line of batch output (ours, or OpenAI's): an object with a custom_id
-- and both `response` and `error` (null or not). Input lines have no
-- `response`, so a prompt file given as OUTPUT is never taken for one.
local function is_record(rec)
  return type(rec) == "table" and type(rec.custom_id) == "string" and rec.response ~= nil and rec.error ~= nil
end

---The custom_id of a line of batch output, or nil when the line is not a
---record. Records of ours (keys in order: custom_id, error, ..., response)
---are read without decoding; any other line is decoded. A newline at the
---end is allowed.
---@param line string
---@return string|nil custom_id
function O.record_id(line)
  local id = line:match('^{"custom_id":"([^"\\]*)","error":')
  local last = line:byte(-1) == 10 and -2 or -1 -- a line read with its newline
  if id and line:byte(last) == 125 and line:find('"response":', 1, true) then return id end
  local rec = json.decode(last == -2 and line:sub(1, -2) or line)
  return is_record(rec) and rec.custom_id or nil
end

-- A last line without its newline that a killed run of ours left. After
-- whole records, any object begun. Alone, it must read as the start of
-- one: records are encoded with their keys in order, custom_id then error.
local function torn_record(tail, records)
  if records > 0 then return tail:sub(1, 1) == "{" end
  return ('{"custom_id":"'):sub(1, #tail) == tail or tail:find('^{"custom_id":"[^"]*$') ~= nil
    or tail:find('^{"custom_id":".-","error":') ~= nil
end

-- The first `len` bytes of path, through a new file renamed over it (a
-- crash leaves the old file or the new one, never half of one), copied a
-- block at a time.
local function cut_file(path, len)
  local tmp, i = path .. ".tmp", 0
  while core.stat(tmp) do -- never overwrite a file of the user's
    i = i + 1
    tmp = ("%s.tmp%d"):format(path, i)
  end
  local r, rerr = io.open(path, "rb")
  if not r then return nil, rerr end
  local w, err = io.open(tmp, "wb")
  if not w then
    r:close()
    return nil, err
  end
  local ok, werr = true, nil
  while ok and len > 0 do
    local block = r:read(math.min(len, 1 << 16))
    if not block then break end
    len = len - #block
    ok, werr = w:write(block)
  end
  r:close()
  w:close()
  if ok then ok, werr = os.rename(tmp, path) end
  if not ok then os.remove(tmp) end
  return ok, werr
end

local NOT_OUTPUT = "%s:%d is not a batch output record: OUTPUT must be a new file or the output of an earlier"
  .. " run (nothing was changed; give another OUTPUT)"

---Read an existing output file before appending to it, a line at a time:
---`each(custom_id)` is called for every record. Every line must be a batch
---output record (else nothing is touched: nil, message, "output"). A last
---line without its newline is a record torn by a kill and is cut off (the
---only change ever made), or a whole record that gets its newline back.
---@param path string
---@param each fun(custom_id: string)
---@return integer|nil records the records read (a custom_id twice counts twice)
---@return boolean|string newline_or_message true: write a newline before the next record
---@return string? code
function O.scan(path, each)
  local f, err = io.open(path, "rb")
  if not f then
    if core.stat(path) then return nil, ("cannot read %s to resume it: %s"):format(path, err), "io" end
    return 0, false -- no such file yet
  end
  local n, lineno, pos = 0, 0, 0
  while true do
    local line = f:read("L")
    if not line then break end
    if line:sub(-1) ~= "\n" then -- the last line, without its newline
      f:close()
      local rec = json.decode(line) -- decoded, never the fast path: a torn record may end in "}" too
      if is_record(rec) then -- whole, only its newline missing
        each(rec.custom_id)
        return n + 1, true
      end
      if rec ~= nil or not torn_record(line, lineno) then
        return nil, NOT_OUTPUT:format(path, lineno + 1), "output"
      end
      local ok, cerr = cut_file(path, pos)
      if not ok then return nil, ("cannot cut the torn last line of %s: %s"):format(path, cerr), "io" end
      return n, false
    end
    lineno = lineno + 1
    local id = O.record_id(line)
    if not id then
      f:close()
      return nil, NOT_OUTPUT:format(path, lineno), "output"
    end
    each(id)
    n, pos = n + 1, pos + #line
  end
  f:close()
  return n, false
end

---The custom_ids an output file holds (a table: for tests and small
---files; a run uses O.scan), their count, and whether a newline is due;
---or nil, a message and a code (O.scan).
---@param path string
---@return table<string,boolean>|nil done
---@return integer|string count_or_message
---@return boolean|string|nil newline_or_code
function O.resume(path)
  local done, n = {}, 0
  local _, newline, code = O.scan(path, function(id)
    if not done[id] then n = n + 1 end
    done[id] = true
  end)
  if code then return nil, newline, code end
  return done, n, newline
end

---The error file beside OUTPUT: out.jsonl -> out.errors.jsonl (out ->
---out.errors.jsonl); nil for standard output ("-").
---@param output string
---@return string|nil
function O.errors_path(output)
  if output == "-" then return nil end
  local stem = output:match("^(.*)%.jsonl$") or output
  return stem .. ".errors.jsonl"
end

-- What a path is: nil (no such file), "file", "directory", ... and its id.
local function kind_of(path)
  local mtime, _, kind, id = core.stat(path)
  if not mtime then return nil end
  return kind, id
end

-- Refuse a directory or INPUT itself as a file to write: a message.
local function refused(path, input, what)
  local kind, id = kind_of(path)
  if kind == "directory" then
    return ("%s is a directory: give %s as a file, e.g. %s/out.jsonl"):format(path, what, path:gsub("/+$", ""))
  end
  if id and input and select(4, core.stat(input)) == id then -- p.txt p.txt, or a link to it
    return ("INPUT and %s are the same file (%s): give another %s, e.g. %s.out.jsonl (nothing was changed)"):format(
      what, path, what, (path:gsub("%.[^./]*$", "")))
  end
end

-- A file opened to append records to, unbuffered (one write(2) each).
local function open_append(path, mode)
  local f, err = io.open(path, mode or "ab")
  if not f then return nil, err end
  f:setvbuf("no")
  return f
end

---Open where the records go. `o.output` (a path, or "-" for standard
---output) and `o.errors` (the error file: nil for O.errors_path's, false
---for none: failures go to OUTPUT too). An existing OUTPUT is scanned
---(O.scan: its custom_ids passed to `done(id)`); an existing error file
---is read for its count (`redo`) and removed once `before_open` agreed
---(a new one is made at the first failure: O.errors_file). `before_open()` runs after the scans and before anything is
---written; a message (and code) it returns stops everything.
---Returns {out, err, stream, name, errors_name, redo} or nil, message, code.
---@param o table
---@param done fun(custom_id: string)
---@param before_open fun(): string?, string?
---@return table|nil sink
---@return string? message
---@return string? code
function O.open(o, done, before_open)
  local path, epath = o.output, o.errors
  local okind = path ~= "-" and kind_of(path) or nil
  -- the error file: beside a file OUTPUT; with a stream (standard output,
  -- a pipe, a terminal) the failures go along unless --errors names one
  if epath == nil and path ~= "-" and (okind == nil or okind == "file") then epath = O.errors_path(path) end
  local oid = path ~= "-" and select(4, core.stat(path)) or nil
  local eid = epath and select(4, core.stat(epath)) or nil
  if epath == path or (oid and eid and oid == eid) then -- by name, or another spelling of it, or a link
    return nil, ("--errors and OUTPUT are the same file (%s): give another (nothing was changed)"):format(epath),
      "output"
  end
  local sink = { name = path == "-" and "standard output" or path, errors_name = epath or nil, redo = 0 }
  local newline = false
  if path ~= "-" then
    local why = refused(path, o.input, "OUTPUT")
    if why then return nil, why, "output" end
    if okind == nil or okind == "file" then
      local n, nl, code = O.scan(path, done)
      if not n then return nil, nl, code end
      newline = nl
    end
    sink.stream = okind ~= nil and okind ~= "file"
  else
    sink.stream = true
  end
  if epath then
    local why = refused(epath, o.input, "the error file")
    if why then return nil, why, "output" end
    if kind_of(epath) == "file" then
      local n, _, code = O.scan(epath, function() end)
      if not n then
        return nil, ("the error file %s (--errors) holds lines that are not batch records: give another"
          .. " (nothing was changed)"):format(epath), code
      end
      sink.redo = n
    end
  end
  local berr, bcode = before_open()
  if berr then return nil, berr, bcode end
  if path == "-" then
    io.stdout:flush()
    io.stdout:setvbuf("no")
    sink.out = io.stdout
  else
    local out, err = open_append(path) -- a pipe or a terminal: written as it comes, no seek, no read
    if not out then return nil, err, "io" end
    if newline then out:write("\n") end
    sink.out = out
  end
  if epath then
    -- the failed items are done again now: their records start anew, in
    -- a file made at the first failure (none when nothing fails); a pipe
    -- or a terminal is appended to at once
    local ekind = kind_of(epath)
    if ekind == nil or ekind == "file" then
      if ekind == "file" then
        local ok, err = os.remove(epath)
        if not ok then
          O.close(sink)
          return nil, err, "io"
        end
      end
    else
      local err
      sink.err, err = open_append(epath)
      if not sink.err then
        O.close(sink)
        return nil, err, "io"
      end
    end
  else
    sink.err = sink.out
  end
  return sink
end

---The error file of a sink, opened at its first failure: the handle, or
---nil and a message.
---@param sink table O.open's
---@return file*|nil
---@return string? message
function O.errors_file(sink)
  if sink.err then return sink.err end
  local err
  sink.err, err = open_append(sink.errors_name)
  return sink.err, err
end

---Close a sink's files (standard output is flushed and buffered again).
---@param sink table
function O.close(sink)
  for _, f in pairs { sink.out, sink.err ~= sink.out and sink.err or nil } do
    if f == io.stdout then
      f:setvbuf(core.isatty(1) and "line" or "full")
    elseif io.type(f) == "file" then
      f:close()
    end
  end
end

-- The assistant message of a choice: {text, think, tool_calls}.
local function message(got)
  local msg = { role = "assistant", content = got.text }
  if got.think ~= "" then msg.reasoning_content = got.think end
  local calls = tools.wire(got.calls)
  if calls then
    for _, c in ipairs(calls) do
      if c.id == "" then c.id = nil end -- a server that sent no id: none in the record either
    end
    msg.tool_calls = json.array(calls)
    if got.text == "" then msg.content = json.null end -- calls alone: content null, as the server's own answer
  end
  return msg
end

-- The choices of the answer, each by its index, as OpenAI's
-- chat.completion has them: choice 0 from r (its finish reason
-- "repetition" when the guard cut it), the others (n > 1) from
-- r.choices, each with its finish reason and logprobs from the done
-- event's `choices` (null when the server said none).
local function choices(r, fin)
  local said, idx = {}, { 0 }
  for _, c in ipairs(type(fin.choices) == "table" and fin.choices or {}) do
    if math.type(c.index) == "integer" then said[c.index] = c end
  end
  for i in pairs(r.choices or {}) do if not said[i] then said[i] = {} end end
  for i in pairs(said) do if i ~= 0 then idx[#idx + 1] = i end end
  table.sort(idx)
  local list = {}
  for _, i in ipairs(idx) do
    local c = said[i] or {}
    local got = i == 0 and { text = r.text, think = r.think, calls = r.calls } or r.choices and r.choices[i] or {}
    local reason = c.finish_reason or (i == 0 and fin.finish_reason) or json.null
    if i == 0 and r.cut then reason = "repetition" end
    list[#list + 1] = { index = i, message = message { text = got.text or "", think = got.think or "",
      calls = got.calls or got.tool_calls }, logprobs = c.logprobs or json.null, finish_reason = reason }
  end
  return list
end

-- The chat.completion body of a finished attempt, saying what the server
-- said: its completion id, the model that answered, system_fingerprint
-- and created when it sent them (else the request's model and now).
local function completion(item, r)
  local fin = r.final or {}
  return {
    id = type(fin.id) == "string" and fin.id or "chatcmpl-" .. item.custom_id, object = "chat.completion",
    created = math.tointeger(fin.created) or os.time(),
    model = type(fin.model) == "string" and fin.model or r.model,
    system_fingerprint = type(fin.system_fingerprint) == "string" and fin.system_fingerprint or nil,
    choices = choices(r, fin), usage = fin.usage,
  }
end

-- Round to a tenth.
local function r1(x)
  return x and math.floor(x * 10 + 0.5) / 10
end

-- The server's request id (x-request-id, as OpenAI sends it), else one
-- made up in the same shape.
local function request_id(fin)
  local h = type(fin.headers) == "table" and fin.headers or {}
  local id = h["x-request-id"] or h["request-id"]
  if type(id) == "string" and id ~= "" then return id end
  return ("req_%08x%08x%08x%08x"):format(math.random(0, 0xffffffff), math.random(0, 0xffffffff),
    math.random(0, 0xffffffff), math.random(0, 0xffffffff))
end

-- The body of an HTTP error as the server sent it: its JSON (OpenAI's
-- {"error": {...}}), else the text, else the error object mirza read.
local function error_body(fin, r)
  if type(fin.body) == "string" and fin.body ~= "" then
    local v = json.decode(fin.body)
    if v ~= nil then return v end
    return fin.body
  end
  return r.error and { error = r.error } or json.null
end

---The output record of an item (an attempt result, or an input error):
---`response` is null when no HTTP response came (refused, cut, timeout,
---an input error), else {status_code, request_id, body}.
---@param item table
---@param r table attempt result {ok, text, think, final | code, message, status, error}
---@return table record
function O.record(item, r)
  local rec = { id = ("batch_req_%06d"):format(item.line or 0), custom_id = item.custom_id,
    response = json.null, error = json.null }
  local fin = type(r.final) == "table" and r.final or {}
  if r.ok or r.answered then -- answered (a schema violation is an error with the answer kept)
    local body = r.raw and RAW or r.body or completion(item, r)
    if r.value ~= nil and body ~= RAW then body.mirza = { value = r.value } end
    rec.response = { status_code = 200, request_id = request_id(fin), body = body }
  end
  if r.answered then
    rec.error = { code = r.code, message = r.message, pointer = r.pointer }
  elseif not r.ok then
    if r.status and r.status >= 300 then
      rec.response = { status_code = r.status, request_id = request_id(fin), body = error_body(fin, r) }
    end
    rec.error = { code = r.code or "error", message = r.message and require("mirza.record").redact_text(r.message) }
  end
  rec.mirza = {
    attempts = r.attempts, endpoint = r.endpoint and mirza.redact_url(r.endpoint), ttft_ms = r1(r.ttft_ms),
    tokens = r.tokens, tok_s = r1(r.tok_s), duration_s = r.duration_s and math.floor(r.duration_s * 1000 + 0.5) / 1000,
    cut = r.cut and { reason = r.cut.reason, rule = r.cut.rule, line = r.cut.line, count = r.cut.count,
      channel = r.cut.channel } or nil,
    prompt_tokens = r.cached_tokens and r.prompt_tokens, cached_tokens = r.cached_tokens,
  }
  local body = rec.response ~= json.null and type(rec.response.body) == "table" and rec.response.body or nil
  if body and r.model ~= body.model then rec.mirza.model = r.model end -- asked for, when another answered
  return rec
end

---A record as a line of JSON (no newline). A body recorded as the server
---sent it (`r.raw`, an embeddings answer) is put in as its own text, not
---decoded and encoded again (its floats stay as sent).
---@param rec table O.record's
---@param r table the attempt result
---@return string
function O.encode_record(rec, r)
  local line = json.encode(rec)
  if not r.raw or rec.response == json.null or rec.response.body ~= RAW then return line end
  local at, to = line:find(RAW_JSON, 1, true)
  local raw = r.raw:gsub("[\r\n]+", " ") -- valid JSON holds no raw newline inside a string: whitespace only
  return line:sub(1, at - 1) .. raw .. line:sub(to + 1)
end

return O
