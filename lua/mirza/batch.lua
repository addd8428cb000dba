--- mirza.batch: run a file of chat requests against one or more daemons.
---
--- Input: JSONL in the OpenAI Batch API format
--- (`{"custom_id", "method": "POST", "url": "/v1/chat/completions", "body"}`,
--- as vLLM's run-batch reads it; url also `/v1/completions` or
--- `/v1/embeddings`), simpler lines `{"prompt": ...}` (optional
--- `custom_id`, `system`, other fields go to the body) or `{"messages": ...}`,
--- or plain text lines (each a prompt; custom_id "line-N"). A line's
--- `schema` (a JSON Schema, or a path to one), else its body's
--- `response_format` json_schema, else the run's `schema` (--schema FILE)
--- asks for a structured answer: it is sent as `response_format`, and the
--- answer is decoded and validated here (mirza.schema); the record carries
--- the value (`response.body.mirza.value`) or the violation (error code
--- "schema", with the JSON pointer).
---
--- Output: JSONL in the OpenAI batch output format, one record per item,
--- written and flushed as the item completes:
--- `{"id", "custom_id", "response": {"status_code", "body"}, "error", "mirza"}`
--- where body is a `chat.completion` assembled from the stream (reasoning kept
--- apart as `message.reasoning_content`) and `mirza` holds the item's stats
--- (attempts, endpoint, ttft_ms, tokens, tok_s, duration_s, cut, and
--- prompt_tokens and cached_tokens when the daemon reports its prompt
--- cache). `/v1/completions` and `/v1/embeddings` lines are sent
--- non-streamed and the server's body is recorded as it came.
---
--- Every chat and completions item carries a prefix key (mirza.pool's
--- prefix_key of its leading messages or prompt): items sharing a long
--- prefix go to the endpoint that took it last while it has room, where
--- the daemon's prompt cache holds it (`affinity = false`: least loaded).
---
--- Resume: records already in the output file are skipped (a torn last line
--- left by a kill is cut off first), so a run killed at any point and started
--- again loses and duplicates nothing. Item failures are records, never
--- fatal. Retryable failures (refused, cut, timeout, server error frames,
--- HTTP 408/409/429/5xx) are retried with exponential backoff and jitter,
--- honouring the server's Retry-After (`ev.retry_after`); other 4xx never.
--- A repetition guard (mirza.repetition) cuts a looping item early — the
--- daemon stops generating — and the record says so (`finish_reason`
--- "repetition", `mirza.cut`).
local mirza = require "mirza"
local loop = require "mirza.loop"
local pool_mod = require "mirza.pool"
local pipeline = require "mirza.pipeline"
local core = require "mirza.core"
local result = require "mirza.result"
local retry = require "mirza.retry"
local tools = require "mirza.tools"
local json = mirza.json

local B = {}

B.defaults = {
  limit = 4,              -- requests in flight per endpoint
  max_retries = 5,
  retry_base = 0.5,       -- first backoff, seconds (doubles, with jitter)
  retry_max = 30,         -- longest backoff
  stall_timeout = 120,    -- seconds without a byte before an attempt fails; false: none
  header_timeout = 600,   -- seconds until an attempt's response head (queued, long prefill); false: none
  deadline = nil,         -- per-request limit, seconds
  batch_deadline = nil,   -- whole-run limit: unfinished items stay for a rerun
  give_up_after = 300,    -- seconds every endpoint may be down before the run stops (the rest stays for a rerun)
  model = nil,            -- for lines without one; nil: what each endpoint lists first in /v1/models
  progress = "auto",      -- true, false, or "auto" (a line every progress_every s; live on a terminal)
  progress_every = 10,
  repetition = nil,       -- mirza.repetition options; false: no guard
  schema = nil,           -- a JSON Schema (table) or a path: the answer of every chat/completions line without its own
  attempts = 1,           -- answers a chat item with a schema may give (a violation is told to the model)
  affinity = true,        -- items sharing a prefix go where it went last (mirza.pool prefix affinity)
  lookahead = 64,         -- with affinity: how many of the next items a free slot may choose from
  tick = 0.25,            -- the scheduler reads the streams at most every tick seconds (mirza.loop's tick): at a
                          -- daemon's pace one read per stream per tick, not one per token (an item's first token
                          -- is still read as it comes); an item's end is seen up to a tick late; false or 0: at once
  hold = 1,               -- an item's text goes to its task at most every hold seconds (mirza.open's hold): one
                          -- wake-up per stream per second, not per tick; the end comes at once, a repetition cut
                          -- up to that late; ttft_ms is when the first token was read all the same; 0: each read
}

-- ------------------------------------------------------------ input

local copy = require("mirza.util").copy

-- A body from a {"prompt": ...} line: other fields go into the body.
local function prompt_body(obj)
  local body = copy(obj)
  body.custom_id, body.prompt, body.system, body.schema = nil, nil, nil, nil
  local msgs = {}
  if obj.system then msgs[1] = { role = "system", content = obj.system } end
  msgs[#msgs + 1] = { role = "user", content = obj.prompt }
  body.messages = msgs
  return body
end

-- The custom_id of a decoded line: a string as it is, a number as its
-- string (1 -> "1"); nil and a message for anything else.
local function read_id(v)
  if v == nil or type(v) == "string" then return v end
  if type(v) == "number" then return math.tointeger(v) and ("%d"):format(math.tointeger(v)) or tostring(v) end
  return nil, "custom_id must be a string: write it in quotes"
end

-- What a line's url asks for: "chat", "completions", "embeddings", or nil.
local function kind_of(url)
  if url:find("/chat/completions$") then return "chat" end
  if url:find("/completions$") then return "completions" end
  if url:find("/embeddings$") then return "embeddings" end
  return nil
end

---Parse one input line. Returns the item, false for a blank line, or
---nil, a message and the line's custom_id when it could be read (the
---caller records the line under that id, else under "line-N").
---@param line string
---@param n integer line number (1-based)
---@return table|false|nil item {custom_id, body, line, kind ("chat", "completions", "embeddings"), schema?}
---@return string? message
---@return string? custom_id of a rejected line, when readable
function B.parse_line(line, n)
  line = line:gsub("\r$", "")
  if line:match("^%s*$") then return false end
  if not line:match("^%s*{") then
    return { custom_id = "line-" .. n, body = { messages = { { role = "user", content = line } } }, line = n,
      kind = "chat" }
  end
  local obj, err = json.decode(line)
  if type(obj) ~= "table" then return nil, "invalid JSON: " .. tostring(err) .. ": write one JSON object per line" end
  local id, id_err = read_id(obj.custom_id)
  if id_err then return nil, id_err end
  local function reject(msg) return nil, msg, id end
  id = id or ("line-" .. n)
  local sch = obj.schema
  if sch ~= nil and type(sch) ~= "table" and type(sch) ~= "string" then
    return reject("schema must be a JSON Schema (an object) or the path of a .json file")
  end
  if obj.body ~= nil then
    if type(obj.body) ~= "table" then return reject("body must be an object: {\"messages\": [...]}") end
    if obj.method and obj.method ~= "POST" then
      return reject("method must be POST, not " .. tostring(obj.method) .. ": use \"method\": \"POST\"")
    end
    local kind = obj.url == nil and "chat" or kind_of(tostring(obj.url))
    if not kind then
      return reject("unsupported url " .. tostring(obj.url) .. ": /v1/chat/completions, /v1/completions and"
        .. " /v1/embeddings are served")
    end
    if kind == "embeddings" and sch ~= nil then return reject("an /v1/embeddings line takes no schema") end
    return { custom_id = id, body = obj.body, line = n, kind = kind, schema = sch }
  end
  if type(obj.prompt) == "string" then
    return { custom_id = id, body = prompt_body(obj), line = n, kind = "chat", schema = sch }
  end
  if type(obj.messages) == "table" then
    local body = copy(obj)
    body.custom_id, body.schema = nil, nil
    return { custom_id = id, body = body, line = n, kind = "chat", schema = sch }
  end
  return reject("a line needs \"body\" (with \"method\" and \"url\"), \"prompt\" or \"messages\"")
end

-- A schema compiled once per table or path (mirza.schema): c, or nil and a message.
local function compiler()
  local done = {}
  return function(sch)
    local c = done[sch]
    if c then return c end
    local msg
    c, msg = require("mirza.schema").compile(sch)
    if not c then return nil, msg end
    done[sch] = c
    return c
  end
end

-- The schema a body's own response_format names: json_schema's schema,
-- or any JSON object for json_object.
local function body_schema(body)
  local rf = body.response_format
  if type(rf) ~= "table" then return nil end
  if rf.type == "json_schema" and type(rf.json_schema) == "table" and type(rf.json_schema.schema) == "table" then
    return rf.json_schema.schema
  end
  if rf.type == "json_object" then return { type = "object" } end
end

---Make items ready to send: each chat or completions item's schema
---compiled (its line's, else its body's response_format, else `o.schema`:
---`item.check`, and `item.rf` the response_format to send when the body
---has none) and its prefix key (`item.key`, mirza.pool.prefix_key). A
---line's schema that cannot be compiled makes the item invalid (recorded,
---code "input"); a run's that cannot, fails the run (nil, message).
---@param items table[]
---@param o table the run's options (schema)
---@return table[]|nil items
---@return string? message
function B.prepare(items, o)
  local compile, run_c = compiler(), nil
  if o.schema ~= nil then
    local msg
    run_c, msg = compile(o.schema)
    if not run_c then return nil, "--schema: " .. tostring(msg) end
  end
  local schema
  for _, it in ipairs(items) do
    it.kind = it.kind or "chat" -- items given by a script: chat bodies
    if not it.invalid and it.kind ~= "embeddings" and it.body then
      local own, c, msg = it.schema or body_schema(it.body), run_c, nil
      if own ~= nil then c, msg = compile(own) end
      if not c and msg then
        it.invalid = "schema: " .. tostring(msg)
      elseif c then
        schema = schema or require "mirza.schema"
        it.check = c
        if it.body.response_format == nil then it.rf = schema.response_format(c) end
      end
      local b = it.body
      local lead = it.kind == "chat" and b.messages or b.prompt
      if type(lead) == "table" and it.kind == "completions" then lead = lead[1] end
      if type(lead) == "table" or type(lead) == "string" then it.key = pool_mod.prefix_key(lead) end
    end
  end
  return items
end

---Read an input file. Bad lines become items with an `invalid` message
---(recorded as errors under their custom_id when it can be read, never
---dropped). Duplicate custom_ids, a directory and a file without a single
---item are errors.
---@param path string
---@return table[]|nil items
---@return string? message
---@return string? code "io" or "input"
function B.read_input(path)
  local _, _, kind = core.stat(path)
  if kind == "directory" then return nil, path .. " is a directory: give INPUT as a file of prompts", "input" end
  local f, err = io.open(path, "rb")
  if not f then return nil, err, "io" end
  local items, seen, n = {}, {}, 0
  for line in f:lines() do
    n = n + 1
    local item, msg, id = B.parse_line(line, n)
    if item == nil then item = { custom_id = id or ("line-" .. n), line = n, invalid = msg } end
    if item then
      if seen[item.custom_id] then
        f:close()
        return nil, ("%s:%d: duplicate custom_id %q (first on line %d): give each line its own custom_id"):format(path,
          n, item.custom_id, seen[item.custom_id]), "input"
      end
      seen[item.custom_id] = n
      items[#items + 1] = item
    end
  end
  f:close()
  if #items == 0 then
    return nil, path .. " holds no prompt (empty, or only blank lines): nothing to do; write one prompt or JSON"
      .. " request per line", "input"
  end
  return items
end

-- ------------------------------------------------------------ output

-- The place of a body recorded as the server sent it (B.encode_record):
-- unique per process, so no text of an item's can be taken for it.
local RAW = ("\1mirza-raw-body-%08x%08x\1"):format(math.random(0, 0xffffffff), math.random(0, 0xffffffff))
local RAW_JSON = json.encode(RAW)

-- A line of batch output (ours, or OpenAI's): an object with a custom_id
-- and both `response` and `error` (null or not). Input lines have no
-- `response`, so a prompt file given as OUTPUT is never taken for one.
local function is_record(rec)
  return type(rec) == "table" and type(rec.custom_id) == "string" and rec.response ~= nil and rec.error ~= nil
end

-- A last line without its newline that a killed run of ours left. After
-- whole records, any object begun. Alone, it must read as the start of
-- one: records are encoded with their keys in order, custom_id then error.
local function torn_record(tail, records)
  if records > 0 then return tail:sub(1, 1) == "{" end
  return ('{"custom_id":"'):sub(1, #tail) == tail or tail:find('^{"custom_id":"[^"]*$') ~= nil
    or tail:find('^{"custom_id":".-","error":') ~= nil
end

-- Write data to path through a new file renamed over it (a crash leaves
-- the old file or the new one, never half of one).
local function replace_file(path, data)
  local tmp, i = path .. ".tmp", 0
  while core.stat(tmp) do -- never overwrite a file of the user's
    i = i + 1
    tmp = ("%s.tmp%d"):format(path, i)
  end
  local w, err = io.open(tmp, "wb")
  if not w then return nil, err end
  local ok, werr = w:write(data)
  w:close()
  if ok then ok, werr = os.rename(tmp, path) end
  if not ok then os.remove(tmp) end
  return ok, werr
end

---Check an existing output file before appending to it, and list the
---custom_ids it already holds. Every line must be a batch output record
---(else nothing is touched: nil, message, "output"). A last line without
---its newline is a record torn by a kill and is cut off (the only
---change ever made), or a whole record that gets its newline back.
---@param path string
---@return table<string,boolean>|nil done
---@return integer|string count_or_message
---@return boolean|string|nil newline_or_code true: write a newline before the next record
function B.resume(path)
  local f = io.open(path, "rb")
  if not f then return {}, 0 end
  local data, rerr = f:read("a")
  f:close()
  if not data then return nil, ("cannot read %s: %s"):format(path, rerr), "io" end
  local done, n, lineno, rest = {}, 0, 0, 1
  for line, after in data:gmatch("([^\n]*)\n()") do
    lineno = lineno + 1
    local rec = json.decode(line)
    if not is_record(rec) then
      return nil, ("%s:%d is not a batch output record: OUTPUT must be a new file or the output of an earlier"
        .. " run (nothing was changed; give another OUTPUT)"):format(path, lineno), "output"
    end
    if not done[rec.custom_id] then n = n + 1 end
    done[rec.custom_id] = true
    rest = after
  end
  local tail = data:sub(rest)
  if tail == "" then return done, n, false end
  local rec = json.decode(tail)
  if is_record(rec) then -- whole, only its newline missing
    if not done[rec.custom_id] then n = n + 1 end
    done[rec.custom_id] = true
    return done, n, true
  end
  if rec ~= nil or not torn_record(tail, lineno) then
    return nil, ("%s:%d is not a batch output record: OUTPUT must be a new file or the output of an earlier"
      .. " run (nothing was changed; give another OUTPUT)"):format(path, lineno + 1), "output"
  end
  local ok, err = replace_file(path, data:sub(1, rest - 1))
  if not ok then return nil, ("cannot cut the torn last line of %s: %s"):format(path, err), "io" end
  return done, n, false
end

-- Where the records go: out (a file handle), the custom_ids already
-- done, and whether out is a stream (stdout, a pipe, a terminal: no
-- resume, not closed by us when it is stdout). nil, message, code when
-- OUTPUT must not be written.
local function open_output(o, before_open)
  local path = o.output
  if path == "-" then
    local err, code = before_open({})
    if err then return nil, err, code end
    return io.stdout, {}, true
  end
  local mtime, _, kind, id = core.stat(path)
  if not mtime then kind, id = nil, nil end -- no such file yet (or unreadable: open says why)
  if kind == "directory" then
    return nil, ("%s is a directory: give OUTPUT as a file, e.g. %s/out.jsonl"):format(path, path:gsub("/+$", "")),
      "output"
  end
  if id and o.input and select(4, core.stat(o.input)) == id then -- p.txt p.txt, or a link to it
    return nil, ("INPUT and OUTPUT are the same file (%s): give another OUTPUT, e.g. %s.out.jsonl (nothing was"
      .. " changed)"):format(path, (path:gsub("%.[^./]*$", ""))), "output"
  end
  local done, newline = {}, false
  if kind == nil or kind == "file" then
    local err, code
    done, err, code = B.resume(path)
    if not done then return nil, err, code end
    newline = code
  end
  local berr, bcode = before_open(done)
  if berr then return nil, berr, bcode end
  local out, err = io.open(path, "ab") -- a pipe or a terminal: written as it comes, no seek, no read
  if not out then return nil, err, "io" end
  if newline then out:write("\n") end
  return out, done, kind ~= nil and kind ~= "file"
end

-- The chat.completion body of a finished attempt: the server's completion
-- id when it sent one.
local function completion(item, r)
  local msg = { role = "assistant", content = r.text }
  if r.think ~= "" then msg.reasoning_content = r.think end
  local calls = tools.wire(r.calls)
  if calls then
    for _, c in ipairs(calls) do
      if c.id == "" then c.id = nil end -- a server that sent no id: none in the record either
    end
    msg.tool_calls = json.array(calls)
    if r.text == "" then msg.content = json.null end -- calls alone: content null, as the server's own answer
  end
  local fin = r.final or {}
  local reason = r.cut and "repetition" or fin.finish_reason or json.null
  return {
    id = type(fin.id) == "string" and fin.id or "chatcmpl-" .. item.custom_id, object = "chat.completion",
    created = os.time(), model = r.model,
    choices = { { index = 0, message = msg, finish_reason = reason } },
    usage = fin.usage,
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
function B.record(item, r)
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
  return rec
end

---A record as a line of JSON (no newline). A body recorded as the server
---sent it (`r.raw`, an embeddings answer) is put in as its own text, not
---decoded and encoded again (its floats stay as sent).
---@param rec table B.record's
---@param r table the attempt result
---@return string
function B.encode_record(rec, r)
  local line = json.encode(rec)
  if not r.raw or rec.response == json.null or rec.response.body ~= RAW then return line end
  local at, to = line:find(RAW_JSON, 1, true)
  local raw = r.raw:gsub("[\r\n]+", " ") -- valid JSON holds no raw newline inside a string: whitespace only
  return line:sub(1, at - 1) .. raw .. line:sub(to + 1)
end

-- ------------------------------------------------------------ one attempt

-- The request body as sent: defaults filled (not into an embeddings
-- line: its fields are another endpoint's), the structured answer asked
-- for, a chat streamed, the others not.
local function request_body(item, opts)
  local body = item.kind == "embeddings" and {} or copy(opts.body)
  for k, v in pairs(item.body) do body[k] = v end
  body.model = body.model or opts.model
  if item.rf and body.response_format == nil then body.response_format = item.rf end
  if item.kind == "chat" then
    body.stream = true
    body.stream_options = { include_usage = true }
  elseif item.kind == "completions" then
    body.stream, body.stream_options = false, nil
  end
  return body
end

-- JSON null (a lightuserdata) and non-numbers read as nil.
local function num(v)
  return math.type(v) and v or nil
end

-- What the daemon says of its prompt cache: prompt tokens and cached
-- tokens, from usage.prompt_tokens_details.cached_tokens (OpenAI, vLLM),
-- llama.cpp's timings.cache_n (prompt_n counts only what it evaluated),
-- MTPLX's mtplx_stats.cached_tokens; cached nil when none says.
local function cache_of(usage, timings, stats)
  local us, tm, st = type(usage) == "table" and usage or {}, type(timings) == "table" and timings or {},
    type(stats) == "table" and stats or {}
  local details = type(us.prompt_tokens_details) == "table" and us.prompt_tokens_details or {}
  local cached = num(details.cached_tokens) or num(tm.cache_n) or num(st.cached_tokens)
  local prompt = num(us.prompt_tokens) or (num(tm.prompt_n) and tm.prompt_n + (num(tm.cache_n) or 0))
  return prompt, cached
end

-- The answer of an attempt decoded and checked against the item's
-- schema: r gets `value`, or becomes a failure (code "schema") that keeps
-- the answer (`answered`).
local function check_answer(item, r)
  if not item.check or not r.ok then return end
  local value, msg, code, _, pointer = require("mirza.schema").decode(item.check, r.text or "")
  if value ~= nil then
    r.value = value
    return
  end
  r.ok, r.answered, r.code, r.message, r.pointer = false, true, code or "schema", msg, pointer
end

-- Read one attempt's stream through the repetition guard into a result
-- (mirza.result), tool-call fragments merged.
local function read_stream(s, opts)
  local stages = {}
  if opts.repetition ~= false then
    local ropts = copy(opts.repetition)
    ropts.channels = ropts.channels or { think = true, text = true }
    ropts.on_cut = function() s:close() end -- the daemon stops generating at once
    stages[1] = { name = "repetition", fn = require("mirza.repetition").stage, opts = ropts }
  end
  local source = function()
    if s:closed() then return nil end
    return s:next()
  end
  local iter, _, _, closer = pipeline.compose(source, stages)
  local _ <close> = closer
  return result.drain(result.new { calls = true }, iter)
end

-- The model endpoint e serves: the first id its /v1/models lists, asked
-- once (the other workers wait for that answer). nil, message, code when
-- it cannot be asked (code "model" when it answered without a model: no
-- use retrying).
local function served_model(e, opts)
  while e.model_asked do e.model_asked:wait() end -- asked by another worker: its answer is ours
  if e.model then return e.model end
  local asked = loop.condition()
  e.model_asked = asked
  local _ <close> = setmetatable({}, { __close = function() -- answered, failed or cancelled
    e.model_asked = nil
    asked:broadcast()
  end })
  local url = e.base .. "/models"
  local body, msg, code, status = mirza.request { url = url, method = "GET", headers = opts.headers,
    api_key = opts.api_key, timeout = opts.connect_timeout, deadline = opts.deadline or 30 }
  local list = body and json.decode(body)
  local first = type(list) == "table" and type(list.data) == "table" and list.data[1]
  if type(first) == "table" and type(first.id) == "string" then
    e.model = first.id
    return e.model
  end
  if not body and retry.blame(code, status) then return nil, msg, code, status end
  return nil, ("cannot learn the model from %s (%s): pass --model ID, or give each line a \"model\""):format(
    mirza.redact_url(url), body and "no model listed" or msg), "model"
end

-- A non-streamed attempt (/v1/completions, /v1/embeddings): the server's
-- body decoded (an embeddings answer recorded as its text, `r.raw`).
local function plain_attempt(item, e, opts, body, r)
  local s <close> = mirza.open { url = e.base .. "/" .. item.kind, body = body, plain = true,
    headers = opts.headers, api_key = opts.api_key, stall_timeout = opts.stall_timeout,
    deadline = opts.deadline, timeout = opts.connect_timeout, header_timeout = opts.header_timeout }
  local ev = s:next() or { type = "error", code = "closed", message = "no answer" }
  r.final, r.duration_s = ev, mirza.now() - r.t0
  if ev.type ~= "response" then
    local f = result.failure { final = ev }
    r.code, r.message, r.status, r.error, r.retry_after = f.code, f.message, f.status, f.error, f.retry_after
    return r
  end
  local v = json.decode(ev.body or "")
  if type(v) ~= "table" then
    r.code, r.status = "protocol", ev.status
    r.message = ("%s/%s answered %d with a body that is not a JSON object"):format(mirza.redact_url(e.base),
      item.kind, ev.status or 0)
    return r
  end
  r.ok, r.body = true, v
  if item.kind == "embeddings" then r.raw = ev.body end
  local usage = type(v.usage) == "table" and v.usage or nil
  r.prompt_tokens, r.cached_tokens = cache_of(usage, v.timings, v.mtplx_stats)
  r.tokens = usage and num(usage.completion_tokens)
  local choice = type(v.choices) == "table" and v.choices[1]
  if item.kind == "completions" and type(choice) == "table" then
    r.text = type(choice.text) == "string" and choice.text or ""
  end
  r.tok_s = r.tokens and r.duration_s > 0 and r.tokens / r.duration_s or nil
  check_answer(item, r)
  return r
end

-- One HTTP attempt on endpoint e: the result table.
local function attempt(item, e, opts)
  local r = { t0 = mirza.now(), endpoint = e.base }
  local body = request_body(item, opts)
  if body.model == nil then
    body.model, r.message, r.code, r.status = served_model(e, opts)
    if not body.model then return r end
  end
  r.model = body.model
  if item.kind ~= "chat" then return plain_attempt(item, e, opts, body, r) end
  local s <close> = mirza.open { url = e.base .. "/chat/completions", body = body,
    headers = opts.headers, api_key = opts.api_key, stall_timeout = opts.stall_timeout,
    deadline = opts.deadline, timeout = opts.connect_timeout, header_timeout = opts.header_timeout,
    merge = true, hold = opts.hold or false } -- only the text is kept: what arrived together is one event
  local acc = read_stream(s, opts)
  local t1, fin = mirza.now(), acc.final or {}
  local first = s:first_at() or acc.first -- as read, not as handed over (hold)
  local got = result.partial(acc)
  r.text, r.think, r.calls, r.cut, r.final = got.text, got.think, got.tool_calls, acc.cut, acc.final
  r.duration_s = t1 - r.t0
  r.ttft_ms = first and (first - r.t0) * 1000
  r.tokens = fin.usage and fin.usage.completion_tokens or acc.deltas
  r.tok_s = first and t1 > first and r.tokens / (t1 - first) or nil
  r.prompt_tokens, r.cached_tokens = cache_of(fin.usage, fin.timings, fin.stats)
  if result.ok(acc) then
    r.ok = true
    check_answer(item, r)
  else
    local f = result.failure(acc)
    r.code, r.message, r.status, r.error, r.retry_after = f.code, f.message, f.status, f.error, f.retry_after
  end
  return r
end

---Is a failed attempt worth retrying? (mirza.retry)
B.retryable = retry.retryable

---Seconds to wait before retry number `n` (1-based): the server's
---Retry-After when given, else exponential backoff with jitter (mirza.retry).
---@param n integer
---@param opts table retry_base, retry_max
---@param retry_after? number
---@return number
function B.backoff(n, opts, retry_after)
  if retry_after and retry_after >= 0 then return retry_after + 0.05 * math.random() end
  return retry.backoff(n, opts.retry_base, opts.retry_max, 0.5, 1)
end

-- "42s", "6m25s", "1h05m", "?"
local function fmt_time(s)
  if not s or s ~= s or s == math.huge then return "?" end
  s = math.floor(s + 0.5)
  if s >= 3600 then return ("%dh%02dm"):format(s // 3600, s % 3600 // 60) end
  if s >= 60 then return ("%dm%02ds"):format(s // 60, s % 60) end
  return s .. "s"
end

-- Whether the whole run stops (ctx.abort set, the other workers
-- cancelled): no endpoint ever answered and all refuse; every endpoint
-- down for `give_up_after` seconds; or the model cannot be learnt (r).
local function give_up(ctx, r)
  if ctx.abort then return true end
  local pool, o = ctx.pool, ctx.opts
  local why = pool:unreachable()
  if why then
    ctx.abort = { code = "unreachable", message = "no endpoint reachable: " .. why
      .. "; start the daemon or correct the endpoint URL (--endpoint), then run again" }
  elseif r.code == "model" then
    ctx.abort = { code = "model", message = r.message }
  else
    local down, which = pool:down_for()
    if down and o.give_up_after and down >= o.give_up_after then
      ctx.abort = { code = "down", message = ("every endpoint down for %s (%s)"):format(fmt_time(down), which) }
    end
  end
  if not ctx.abort then return false end
  local me = loop.current()
  for _, t in ipairs(ctx.workers) do
    if t ~= me then t:cancel("batch stopped: " .. ctx.abort.message, "cancelled") end
  end
  return true
end

-- One attempt of `job` ({item, n, tried}) on the best endpoint for it
-- (another than those it failed on, while one is healthy): its result.
local function try(job, ctx)
  local pool = ctx.pool
  local e = pool:acquire(nil, { avoid = job.tried, key = ctx.opts.affinity ~= false and job.item.key or nil })
  -- the slot goes back even when the task is cancelled mid-attempt
  local slot <close> = setmetatable({}, { __close = function(self)
    if not self.released then pool:abandon(e) end
  end })
  local ok, r = pcall(attempt, job.item, e, ctx.opts)
  if not ok then r = { code = "error", message = tostring(r), t0 = mirza.now() } end
  slot.released = true
  pool:report(e, r, job.item.custom_id)
  job.tried[e], job.n = true, job.n + 1
  r.attempts = job.n
  job.t0 = job.t0 or r.t0
  r.duration_s = mirza.now() - job.t0 -- every attempt so far and the waits between them
  return r
end

-- Run the job's next attempt: the item's result when it is over; nil and
-- the time of its next attempt when it is to be retried (the worker takes
-- other items meanwhile: a backoff holds no slot and no worker); nil
-- alone when the run stops (give_up): the item stays for a rerun.
local function step(job, ctx)
  local item, opts = job.item, ctx.opts
  if item.invalid then return { code = "input", message = item.invalid, attempts = 0 } end
  local r = try(job, ctx)
  if r.ok then return r end
  if r.code == "schema" and r.answered and item.kind == "chat" and (job.answers or 1) < opts.attempts then
    -- the violation told to the model, which answers again at once (no backoff): the
    -- retry's messages are the item's, its answer, and what did not fit
    job.answers = (job.answers or 1) + 1
    local body = copy(item.body)
    local msgs = {}
    for i, m in ipairs(item.body.messages or {}) do msgs[i] = m end
    msgs[#msgs + 1] = { role = "assistant", content = r.text or "" }
    msgs[#msgs + 1] = { role = "user", content = require("mirza.structured").retry_message(r.message) }
    body.messages = msgs
    local again = copy(item)
    again.body = body
    job.item, job.tried = again, {} -- the daemon answered: no reason to avoid it
    ctx.stats.retries = ctx.stats.retries + 1
    return nil, mirza.now()
  end
  if give_up(ctx, r) then return nil end
  if not B.retryable(r.code, r.status) or job.n > opts.max_retries then return r end
  ctx.stats.retries = ctx.stats.retries + 1
  return nil, mirza.now() + B.backoff(job.n, opts, r.retry_after)
end

-- ------------------------------------------------------------ progress

---The progress line: done/total, errors, retries, aggregate tok/s, ETA;
---with the run's options `o`, also when every endpoint of its pool is
---down and when the run gives up.
---@param st table batch stats
---@param o? table the run's options (pool, give_up_after)
---@return string
function B.progress_line(st, o)
  local dt = mirza.now() - st.t0
  local rate = dt > 0 and st.tokens / dt or 0
  local per_item = st.done_now > 0 and dt / st.done_now or nil
  local eta = per_item and per_item * (st.total - st.skipped - st.done_now)
  local line = ("batch: %d/%d done, %d errors, %d retries, %d cut, %.0f tok/s, ETA %s"):format(
    st.skipped + st.done_now, st.total, st.errors, st.retries, st.cut, rate, fmt_time(eta))
  local down = o and o.pool and o.pool:down_for()
  if not down then return line end
  local quit = o.give_up_after and (", giving up in %s"):format(fmt_time(math.max(0, o.give_up_after - down))) or ""
  return ("%s; every endpoint down for %s%s"):format(line, fmt_time(down), quit)
end

-- A task printing progress until cancelled.
local function progress_task(stats, opts)
  local live = opts.progress == true or (opts.progress == "auto" and core.isatty(2))
  local every = live and 0.25 or opts.progress_every
  local log = opts.log or function(line, is_live)
    io.stderr:write(is_live and ("\r\27[K" .. line) or (line .. "\n"))
  end
  return loop.spawn(function()
    local _ <close> = setmetatable({}, { __close = function() if live then log("", true) end end })
    while true do
      mirza.sleep(every)
      log(B.progress_line(stats, opts), live)
    end
  end)
end

-- ------------------------------------------------------------ the run

local function resolve(opts)
  local o = copy(B.defaults)
  for k, v in pairs(opts) do o[k] = v end
  if not o.output then error("mirza.batch.run: 'output' is required", 3) end
  if not o.input and not o.items then error("mirza.batch.run: 'input' (a path) or 'items' is required", 3) end
  if math.type(o.attempts) ~= "integer" or o.attempts < 1 then
    error("mirza.batch.run: 'attempts' must be an integer >= 1, got " .. tostring(o.attempts), 3)
  end
  if o.hold and not (type(o.hold) == "number" and o.hold >= 0) then -- NaN fails too
    error("mirza.batch.run: 'hold' must be a number of seconds >= 0 (or false), got " .. tostring(o.hold), 3)
  end
  o.pool = o.pool or pool_mod.new(o.endpoints or { o.base_url or "http://127.0.0.1:8766/v1" },
    { limit = o.limit, affinity = o.affinity ~= false })
  return o
end

-- The index of the pending item to run next. With prefix affinity, the
-- first of the next `lookahead` items whose prefix's endpoint has room
-- (or that has no endpoint yet): the free slot takes an item whose prefix
-- its daemon holds, where taking the next one in order would send that
-- one to a daemon without its prefix. An item passed over `lookahead`
-- times is taken next (none waits forever); when none fits, the next one
-- in order (spread). Without keys or affinity: the next one in order.
local function pick_pending(ctx, queue)
  local first, o = queue.next, ctx.opts
  if o.affinity == false or not queue.keyed or (o.lookahead or 0) < 2 then return first end
  local pool, last = ctx.pool, math.min(#queue, first + o.lookahead - 1)
  local fit, fresh
  for i = first, last do
    local it = queue[i]
    if (it.passed or 0) >= o.lookahead then return i end
    local room = pool:room_for(it.key)
    if room == "affine" then fit = i break end
    if room == "new" and not fresh then fresh = i end
  end
  local pick = fit or fresh or first
  for i = first, pick - 1 do queue[i].passed = (queue[i].passed or 0) + 1 end
  return pick
end

-- The next job: a retry whose time has come, else the next pending item,
-- else (after waiting for it) the earliest retry; nil when none is left
-- or the run stops.
local function next_job(ctx, queue)
  local waiting = queue.waiting
  while not ctx.abort do
    local now, first = mirza.now(), nil
    for i, j in ipairs(waiting) do
      if not first or j.at < waiting[first].at then first = i end
    end
    if first and waiting[first].at <= now then return table.remove(waiting, first) end
    if queue.next <= #queue then
      local i, n = pick_pending(ctx, queue), queue.next
      queue[i], queue[n] = queue[n], queue[i] -- the passed-over item takes its place: still among the next
      queue.next = n + 1
      return { item = queue[n], n = 0, tried = {} }
    end
    if not first then return nil end
    mirza.sleep(waiting[first].at - now)
  end
end

-- The workers: each runs one attempt at a time, of the next job, until
-- none is left (or the run stops: the item it was on is not recorded).
local function work(ctx, queue)
  while true do
    local job = next_job(ctx, queue)
    if not job then return end
    local r, at = step(job, ctx)
    if r then ctx.write(B.record(job.item, r), r)
    elseif not at then return
    else
      job.at = at
      queue.waiting[#queue.waiting + 1] = job
    end
  end
end

local function make_writer(run, stats)
  run.stats = stats
  return function(rec, r)
    if run.write_error then error(run.write_error, 0) end
    local ok, err = run.out:write(B.encode_record(rec, r) .. "\n") -- unbuffered: one write(2) per record
    if not ok then
      run.write_error = ("cannot write %s: %s (the records before are kept; free space or choose another OUTPUT,"
        .. " then run the same command again)"):format(run.name, err)
      error(run.write_error, 0)
    end
    stats.done_now = stats.done_now + 1
    if not r.ok then stats.errors = stats.errors + 1 end
    if r.cut then stats.cut = stats.cut + 1 end
    if r.ok then stats.tokens = stats.tokens + (r.tokens or 0) end
    if r.cached_tokens and r.prompt_tokens then -- only items whose daemon said: the share is of those
      stats.cached_tokens = stats.cached_tokens + r.cached_tokens
      stats.cache_prompt_tokens = stats.cache_prompt_tokens + r.prompt_tokens
    end
  end
end

local function drive(o, items, done, out)
  local stats = { t0 = mirza.now(), total = #items, skipped = 0, done_now = 0, errors = 0, retries = 0, cut = 0,
    tokens = 0, cached_tokens = 0, cache_prompt_tokens = 0 }
  local queue = { next = 1, waiting = {} } -- pending items, then jobs waiting to be retried
  for _, it in ipairs(items) do
    if done[it.custom_id] then stats.skipped = stats.skipped + 1 else
      queue[#queue + 1] = it
      queue.keyed = queue.keyed or it.key ~= nil
    end
  end
  local workers, progress = {}, nil
  local ctx = { opts = o, stats = stats, pool = o.pool, write = make_writer(out, stats), workers = workers }
  -- The scheduler's tick while the batch runs (a longer one of the
  -- script's own is kept): the records lose nothing (a first token is
  -- read as it comes), an item's end is seen up to a tick late, the CPU
  -- per token drops (docs/batch.md, "CPU").
  local release_tick = o.tick and o.tick > 0 and loop.current().loop:hold_tick(o.tick)
  -- Cancelling the task running the batch cancels its workers too.
  local _ <close> = setmetatable({}, { __close = function()
    for _, t in ipairs(workers) do t:cancel() end
    if progress then progress:cancel() end
    if release_tick then release_tick() end
  end })
  for i = 1, math.min(o.pool:capacity(), #queue) do workers[i] = loop.spawn(work, ctx, queue) end
  progress = o.progress and progress_task(stats, o)
  if o.batch_deadline then
    for _, t in ipairs(workers) do t:deadline(o.batch_deadline) end
  end
  for t in loop.as_completed(workers) do
    local ok, msg, code = t:join()
    if not ok and code ~= "timeout" and not (ctx.abort and code == "cancelled") then error(msg, 0) end
    if not ok and code == "timeout" then stats.deadline = true end
  end
  stats.elapsed = mirza.now() - stats.t0
  stats.left = #queue - stats.done_now
  if ctx.abort then -- the message names what is left and what to do
    stats.abort = ctx.abort
    if ctx.abort.code == "down" then
      stats.abort.message = ("%s; %d of %d items left for a rerun: run the same command again once a daemon answers")
        :format(ctx.abort.message, stats.left, stats.total)
    end
  end
  return stats
end

-- Run drive to its end: true, stats or false, error. Ctrl-C raises in the
-- scheduler's wait, then once more at the next Lua instruction (the
-- host's hook); both are taken here, then the batch's task is cancelled
-- so that its workers and the progress line unwind (their <close>)
-- before B.run reports what was saved.
local function run_guarded(o, items, done, run)
  if loop.current() then return pcall(drive, o, items, done, run) end
  local l, t = loop.default(), nil
  local ok, err = pcall(function()
    t = l:spawn(drive, o, items, done, run)
    t.watched = true
    local rok, rerr = pcall(l.run, l)
    if not rok then error(rerr, 0) end
  end)
  if ok then
    local tok, res = t:join()
    return tok == true, res
  end
  if t and not t:done() then pcall(t.cancel, t, "interrupted", "interrupted") end
  return false, err
end

-- What a run stopped by an error (Ctrl-C) saved, and how to go on.
local function stopped_line(run, o, items, err)
  local st = run.stats or { skipped = 0, done_now = 0 }
  local why = tostring(err):find("interrupted", 1, true) and "interrupted" or "stopped by an error"
  local saved = st.skipped + st.done_now
  if run.stream then
    return ("batch: %s: %d of %d records written to %s (no resume from a stream: give OUTPUT as a file to resume)")
      :format(why, st.done_now, #items, run.name)
  end
  return ("batch: %s: %d of %d items saved in %s, %d left; to resume, run: %s"):format(why, saved, #items, run.name,
    #items - saved, o.resume_command or "the same command again")
end

-- Descriptors a run needs besides its connections: standard streams,
-- INPUT and OUTPUT, the client's wake pipe and epoll, libcurl's own.
local FD_RESERVE = 32

---Whether `n` requests at once fit in the open-files limit (each holds a
---socket; mirza raised the soft limit to the hard one when it loaded).
---nil when they do, else the message that says what to do.
---@param n integer requests in flight at most
---@return string|nil message
function B.check_fd_limit(n)
  local soft, hard = mirza.fd_limit()
  if n + FD_RESERVE <= soft then return nil end
  return ("%d requests at once need about %d open files, and this process may open %s (%s): lower the"
    .. " endpoints' @N so that they add up to at most %d, or raise the hard limit (ulimit -Hn as root,"
    .. " limits.conf, LimitNOFILE=); nothing was changed"):format(n, n + FD_RESERVE, soft,
    soft == hard and "the hard limit" or ("the hard limit is " .. hard), math.max(1, soft - FD_RESERVE))
end

---Run a batch. Returns the summary (also written to stderr unless
---`quiet`): total, skipped (already in the output), done_now, errors,
---retries, cut, tokens, elapsed, left (unfinished: deadline), deadline.
---Options: `B.defaults`, plus input (path) or items (parsed), output (a
---path; "-" is standard output), endpoints (base URLs or {url=, limit=})
---or base_url or pool, body (fields merged into every request), headers,
---api_key, quiet, log, resume_command (shown when Ctrl-C stops the run).
---An existing OUTPUT file must hold batch records (it is resumed: its
---custom_ids are skipped) and must not be INPUT; a pipe or a terminal
---is written as it comes, without resume; each record goes out in one
---write. Codes: "limit" (more requests at once than the open-files limit
---allows, nothing written), "input", "io",
---"output" (OUTPUT refused, nothing written), "write" (writing failed),
---"unreachable" (no endpoint ever answered: all refuse), "down" (every
---endpoint down for `give_up_after` s), "model" (no --model, and an
---endpoint lists none): the unfinished items stay for a rerun.
---@param opts table
---@return table|nil summary
---@return string? message
---@return string? code
function B.run(opts)
  local o = resolve(opts)
  local items = o.items
  if not items then
    local err, code
    items, err, code = B.read_input(o.input)
    if not items then return nil, err, code end
  end
  local perr
  items, perr = B.prepare(items, o)
  if not items then return nil, perr, "input" end
  -- Before anything is written: the requests that can be in flight at once
  -- (the items not done yet, up to the endpoints' limits) must fit in the
  -- open-files limit.
  local out, done, stream = open_output(o, function(done)
    local pending = 0
    for _, it in ipairs(items) do
      if not done[it.custom_id] then pending = pending + 1 end
    end
    local ferr = B.check_fd_limit(math.min(o.pool:capacity(), pending))
    if ferr then return ferr, "limit" end
  end)
  if not out then return nil, done, stream end
  out:flush()
  out:setvbuf("no") -- a record is whole on disk (or in the pipe) in one write, never in pieces
  -- closed (standard output flushed, and buffered again) however the run
  -- ends, also when the task running it is cancelled: no file left open
  -- until a collection
  local _ <close> = setmetatable({}, { __close = function()
    if out == io.stdout then
      out:setvbuf(core.isatty(1) and "line" or "full")
    elseif io.type(out) == "file" then
      out:close()
    end
  end })
  local run = { out = out, stream = stream, name = o.output == "-" and "standard output" or o.output }
  local ok, stats = run_guarded(o, items, done, run)
  if run.write_error then return nil, run.write_error, "write" end
  if not ok then
    if not o.quiet then io.stderr:write(stopped_line(run, o, items, stats), "\n") end
    error(stats, 0)
  end
  if stats.abort then return nil, stats.abort.message, stats.abort.code end
  if not o.quiet then io.stderr:write(B.summary(stats, run.name), "\n") end
  return stats
end

---The share of the prompt tokens the daemons served from their prompt
---cache, over the items whose daemon reported it (0..1); nil when none did.
---@param st table batch stats
---@return number|nil
function B.cached_share(st)
  if not st.cache_prompt_tokens or st.cache_prompt_tokens <= 0 then return nil end
  return st.cached_tokens / st.cache_prompt_tokens
end

---The summary line of a finished run.
---@param st table
---@param output? string
---@return string
function B.summary(st, output)
  local rate = st.elapsed > 0 and st.tokens / st.elapsed or 0
  local share = B.cached_share(st)
  return ("batch: %d items (%d already done, %d now: %d ok, %d errors, %d cut), %d retries, %d tokens in %.1f s"
    .. " (%.0f tok/s)%s%s%s"):format(st.total, st.skipped, st.done_now, st.done_now - st.errors, st.errors, st.cut,
    st.retries, st.tokens, st.elapsed, rate, st.deadline and (", deadline reached: %d left"):format(st.left) or "",
    share and ("; prompt tokens served from cache: %.0f%%"):format(share * 100) or "",
    output and ("; output: " .. output) or "")
end

return B
