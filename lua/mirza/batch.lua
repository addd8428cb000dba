--- mirza.batch: run a file of chat requests against one or more daemons.
---
--- Input: JSONL in the OpenAI Batch API format
--- (`{"custom_id", "method": "POST", "url": "/v1/chat/completions", "body"}`,
--- as vLLM's run-batch reads it), simpler lines `{"prompt": ...}` (optional
--- `custom_id`, `system`, other fields go to the body) or `{"messages": ...}`,
--- or plain text lines (each a prompt; custom_id "line-N").
---
--- Output: JSONL in the OpenAI batch output format, one record per item,
--- written and flushed as the item completes:
--- `{"id", "custom_id", "response": {"status_code", "body"}, "error", "mirza"}`
--- where body is a `chat.completion` assembled from the stream (reasoning kept
--- apart as `message.reasoning_content`) and `mirza` holds the item's stats
--- (attempts, endpoint, ttft_ms, tokens, tok_s, duration_s, cut).
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
  model = "default",
  progress = "auto",      -- true, false, or "auto" (a line every progress_every s; live on a terminal)
  progress_every = 10,
  repetition = nil,       -- mirza.repetition options; false: no guard
}

-- ------------------------------------------------------------ input

local function copy(t)
  local c = {}
  for k, v in pairs(t or {}) do c[k] = v end
  return c
end

-- A body from a {"prompt": ...} line: other fields go into the body.
local function prompt_body(obj)
  local body = copy(obj)
  body.custom_id, body.prompt, body.system = nil, nil, nil
  local msgs = {}
  if obj.system then msgs[1] = { role = "system", content = obj.system } end
  msgs[#msgs + 1] = { role = "user", content = obj.prompt }
  body.messages = msgs
  return body
end

---Parse one input line. Returns the item, false for a blank line, or
---nil and a message (the caller records it under custom_id "line-N").
---@param line string
---@param n integer line number (1-based)
---@return table|false|nil item {custom_id, body, line}
---@return string? message
function B.parse_line(line, n)
  line = line:gsub("\r$", "")
  if line:match("^%s*$") then return false end
  if not line:match("^%s*{") then
    return { custom_id = "line-" .. n, body = { messages = { { role = "user", content = line } } }, line = n }
  end
  local obj, err = json.decode(line)
  if type(obj) ~= "table" then return nil, "invalid JSON: " .. tostring(err) end
  local id = obj.custom_id
  if id ~= nil and type(id) ~= "string" then return nil, "custom_id must be a string" end
  id = id or ("line-" .. n)
  if obj.body ~= nil then
    if type(obj.body) ~= "table" then return nil, "body must be an object" end
    if obj.method and obj.method ~= "POST" then return nil, "method must be POST, not " .. tostring(obj.method) end
    if obj.url and not tostring(obj.url):find("/chat/completions$") then
      return nil, "unsupported url " .. tostring(obj.url) .. " (only /v1/chat/completions)"
    end
    return { custom_id = id, body = obj.body, line = n }
  end
  if type(obj.prompt) == "string" then return { custom_id = id, body = prompt_body(obj), line = n } end
  if type(obj.messages) == "table" then
    local body = copy(obj)
    body.custom_id = nil
    return { custom_id = id, body = body, line = n }
  end
  return nil, "a line needs \"body\", \"prompt\" or \"messages\""
end

---Read an input file. Bad lines become items with an `invalid` message
---(recorded as errors, never dropped). Duplicate custom_ids are an error.
---@param path string
---@return table[]|nil items
---@return string? message
---@return string? code "io" or "input"
function B.read_input(path)
  local f, err = io.open(path, "rb")
  if not f then return nil, err, "io" end
  local items, seen, n = {}, {}, 0
  for line in f:lines() do
    n = n + 1
    local item, msg = B.parse_line(line, n)
    if item == nil then item = { custom_id = "line-" .. n, line = n, invalid = msg } end
    if item then
      if seen[item.custom_id] then
        f:close()
        return nil, ("%s:%d: duplicate custom_id %q (first on line %d)"):format(path, n, item.custom_id,
          seen[item.custom_id]), "input"
      end
      seen[item.custom_id] = n
      items[#items + 1] = item
    end
  end
  f:close()
  return items
end

-- ------------------------------------------------------------ output

---Prepare the output file for appending and list the custom_ids it
---already holds. A last line without its newline (a run killed mid-write)
---is cut off; lines that do not parse are dropped the same way.
---@param path string
---@return table<string,boolean>|nil done
---@return integer|string count_or_message
function B.resume(path)
  local f = io.open(path, "rb")
  if not f then return {}, 0 end
  local data = f:read("a")
  f:close()
  local done, n, keep, good = {}, 0, {}, true
  for line in data:gmatch("([^\n]*)\n") do
    local rec = json.decode(line)
    if type(rec) == "table" and type(rec.custom_id) == "string" and not done[rec.custom_id] then
      done[rec.custom_id] = true
      n = n + 1
      keep[#keep + 1] = line
    else
      good = false
    end
  end
  if not good or data:sub(-1) ~= "\n" and data ~= "" then -- rewrite without the torn/bad lines
    local tmp = path .. ".tmp"
    local w, err = io.open(tmp, "wb")
    if not w then return nil, err end
    w:write(table.concat(keep, "\n"), #keep > 0 and "\n" or "")
    w:close()
    local ok, rerr = os.rename(tmp, path)
    if not ok then return nil, rerr end
  end
  return done, n
end

-- Tool call deltas merged by index into whole calls.
local function merge_calls(calls, deltas)
  for _, d in ipairs(deltas or {}) do
    local i = (tonumber(d.index) or 0) + 1
    local c = calls[i] or { type = "function", ["function"] = { name = "", arguments = "" } }
    calls[i] = c
    c.id = d.id or c.id
    local fn = d["function"] or {}
    c["function"].name = c["function"].name .. (fn.name or "")
    c["function"].arguments = c["function"].arguments .. (fn.arguments or "")
  end
end

-- The chat.completion body of a finished attempt.
local function completion(item, r)
  local msg = { role = "assistant", content = r.text }
  if r.think ~= "" then msg.reasoning_content = r.think end
  if #r.calls > 0 then msg.tool_calls = json.array(r.calls) end
  local fin = r.final or {}
  local reason = r.cut and "repetition" or fin.finish_reason or json.null
  return {
    id = "chatcmpl-" .. item.custom_id, object = "chat.completion", created = os.time(),
    model = r.model,
    choices = { { index = 0, message = msg, finish_reason = reason } },
    usage = fin.usage,
  }
end

-- Round to a tenth.
local function r1(x)
  return x and math.floor(x * 10 + 0.5) / 10
end

---The output record of an item (an attempt result, or an input error).
---@param item table
---@param r table attempt result {ok, text, think, final | code, message, status, error}
---@return table record
function B.record(item, r)
  local rec = { id = ("batch_req_%06d"):format(item.line or 0), custom_id = item.custom_id,
    response = json.null, error = json.null }
  if r.ok then
    rec.response = { status_code = 200, body = completion(item, r) }
  else
    if r.status then rec.response = { status_code = r.status, body = r.error or json.null } end
    rec.error = { code = r.code or "error", message = r.message and require("mirza.record").redact_text(r.message) }
  end
  rec.mirza = {
    attempts = r.attempts, endpoint = r.endpoint and mirza.redact_url(r.endpoint), ttft_ms = r1(r.ttft_ms),
    tokens = r.tokens, tok_s = r1(r.tok_s), duration_s = r.duration_s and math.floor(r.duration_s * 1000 + 0.5) / 1000,
    cut = r.cut and { reason = r.cut.reason, rule = r.cut.rule, line = r.cut.line, count = r.cut.count,
      channel = r.cut.channel } or nil,
  }
  return rec
end

-- ------------------------------------------------------------ one attempt

-- The request body as sent: defaults filled, streaming forced.
local function request_body(item, opts)
  local body = copy(opts.body)
  for k, v in pairs(item.body) do body[k] = v end
  body.model = body.model or opts.model
  body.stream = true
  body.stream_options = { include_usage = true }
  return body
end

-- Read one attempt's stream through the repetition guard.
local function read_stream(s, opts, r)
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
  local text, think = {}, {}
  for ev in iter do
    local ty = ev.type
    if ty == "text" or ty == "think" then
      r.first = r.first or mirza.now()
      r.deltas = r.deltas + (ev.deltas or 1)
      local t = ty == "text" and text or think
      t[#t + 1] = ev.text
    elseif ty == "tool_call" then merge_calls(r.calls, ev.calls)
    elseif ty == "cut" then r.cut = ev
    elseif ty == "done" or ty == "error" then r.final = ev end
  end
  r.text, r.think = table.concat(text), table.concat(think)
end

-- One HTTP attempt on endpoint e: the result table.
local function attempt(item, e, opts)
  local r = { t0 = mirza.now(), deltas = 0, calls = {}, endpoint = e.base }
  local body = request_body(item, opts)
  r.model = body.model
  local s <close> = mirza.open { url = e.base .. "/chat/completions", body = body,
    headers = opts.headers, api_key = opts.api_key, stall_timeout = opts.stall_timeout,
    deadline = opts.deadline, timeout = opts.connect_timeout, header_timeout = opts.header_timeout,
    merge = true } -- only the text is kept: what arrived together is one event
  read_stream(s, opts, r)
  local t1, fin = mirza.now(), r.final or {}
  r.duration_s = t1 - r.t0
  r.ttft_ms = r.first and (r.first - r.t0) * 1000
  r.tokens = fin.usage and fin.usage.completion_tokens or r.deltas
  r.tok_s = r.first and t1 > r.first and r.tokens / (t1 - r.first) or nil
  if r.cut or fin.type == "done" then
    r.ok = true
  else
    r.code, r.message = fin.code or "closed", fin.message or "stream ended without a final event"
    r.status, r.error = fin.status, fin.error
    r.retry_after = tonumber(fin.retry_after)
      or tonumber(type(fin.headers) == "table" and (fin.headers["retry-after"] or fin.headers["Retry-After"]))
  end
  return r
end

---Is a failed attempt worth retrying?
---@param code string|nil
---@param status integer|nil
---@return boolean
function B.retryable(code, status)
  if code == "http" then
    return status == 408 or status == 409 or status == 429 or (status or 0) >= 500
  end
  return code == "refused" or code == "closed" or code == "timeout" or code == "server" or code == "exited"
end

---Seconds to wait before retry number `n` (1-based): the server's
---Retry-After when given, else exponential backoff with jitter.
---@param n integer
---@param opts table retry_base, retry_max
---@param retry_after? number
---@return number
function B.backoff(n, opts, retry_after)
  if retry_after and retry_after >= 0 then return retry_after + 0.05 * math.random() end
  local d = math.min(opts.retry_max, opts.retry_base * 2 ^ (n - 1))
  return d * (0.5 + 0.5 * math.random())
end

-- Run an item to its record: attempts on the pool's endpoints, retries.
local function run_item(item, ctx)
  local opts, stats = ctx.opts, ctx.stats
  if item.invalid then return { code = "input", message = item.invalid, attempts = 0 } end
  local r
  for n = 1, opts.max_retries + 1 do
    local e = ctx.pool:acquire()
    -- the slot goes back even when the task is cancelled mid-attempt
    local slot <close> = setmetatable({}, { __close = function(self)
      if not self.released then ctx.pool:release(e, false, false) end
    end })
    local ok, res = pcall(attempt, item, e, opts)
    if not ok then res = { code = "error", message = tostring(res), t0 = mirza.now() } end
    slot.released = true
    ctx.pool:release(e, res.ok, not res.ok and pool_mod.endpoint_failure(res.code, res.status))
    r = res
    r.attempts = n
    if r.ok or not B.retryable(r.code, r.status) or n > opts.max_retries then break end
    stats.retries = stats.retries + 1
    mirza.sleep(B.backoff(n, opts, r.retry_after))
  end
  return r
end

-- ------------------------------------------------------------ progress

local function fmt_time(s)
  if not s or s ~= s or s == math.huge then return "?" end
  s = math.floor(s + 0.5)
  if s >= 3600 then return ("%dh%02dm"):format(s // 3600, s % 3600 // 60) end
  if s >= 60 then return ("%dm%02ds"):format(s // 60, s % 60) end
  return s .. "s"
end

---The progress line: done/total, errors, retries, aggregate tok/s, ETA.
---@param st table batch stats
---@return string
function B.progress_line(st)
  local dt = mirza.now() - st.t0
  local rate = dt > 0 and st.tokens / dt or 0
  local per_item = st.done_now > 0 and dt / st.done_now or nil
  local eta = per_item and per_item * (st.total - st.skipped - st.done_now)
  return ("batch: %d/%d done, %d errors, %d retries, %d cut, %.0f tok/s, ETA %s"):format(st.skipped + st.done_now,
    st.total, st.errors, st.retries, st.cut, rate, fmt_time(eta))
end

local function is_terminal()
  return os.execute("test -t 2") == true
end

-- A task printing progress until cancelled.
local function progress_task(stats, opts)
  local live = opts.progress == true or (opts.progress == "auto" and is_terminal())
  local every = live and 0.25 or opts.progress_every
  local log = opts.log or function(line, is_live)
    io.stderr:write(is_live and ("\r\27[K" .. line) or (line .. "\n"))
  end
  return loop.spawn(function()
    local _ <close> = setmetatable({}, { __close = function() if live then log("", true) end end })
    while true do
      mirza.sleep(every)
      log(B.progress_line(stats), live)
    end
  end)
end

-- ------------------------------------------------------------ the run

local function resolve(opts)
  local o = copy(B.defaults)
  for k, v in pairs(opts) do o[k] = v end
  if not o.output then error("mirza.batch.run: 'output' is required", 3) end
  if not o.input and not o.items then error("mirza.batch.run: 'input' (a path) or 'items' is required", 3) end
  o.pool = o.pool or pool_mod.new(o.endpoints or { o.base_url or "http://127.0.0.1:8766/v1" }, { limit = o.limit })
  return o
end

-- The workers: each takes the next pending item until none is left.
local function work(ctx, queue)
  while queue.next <= #queue do
    local item = queue[queue.next]
    queue.next = queue.next + 1
    local r = run_item(item, ctx)
    ctx.write(B.record(item, r), r)
  end
end

local function make_writer(out, stats)
  return function(rec, r)
    out:write(json.encode(rec), "\n")
    out:flush()
    stats.done_now = stats.done_now + 1
    if not r.ok then stats.errors = stats.errors + 1 end
    if r.cut then stats.cut = stats.cut + 1 end
    if r.ok then stats.tokens = stats.tokens + (r.tokens or 0) end
  end
end

local function drive(o, items, done, out)
  local stats = { t0 = mirza.now(), total = #items, skipped = 0, done_now = 0, errors = 0, retries = 0, cut = 0,
    tokens = 0 }
  local queue = { next = 1 }
  for _, it in ipairs(items) do
    if done[it.custom_id] then stats.skipped = stats.skipped + 1 else queue[#queue + 1] = it end
  end
  local ctx = { opts = o, stats = stats, pool = o.pool, write = make_writer(out, stats) }
  local workers, progress = {}, nil
  -- Cancelling the task running the batch cancels its workers too.
  local _ <close> = setmetatable({}, { __close = function()
    for _, t in ipairs(workers) do t:cancel() end
    if progress then progress:cancel() end
  end })
  for i = 1, math.min(o.pool:capacity(), #queue) do workers[i] = loop.spawn(work, ctx, queue) end
  progress = o.progress and progress_task(stats, o)
  if o.batch_deadline then
    for _, t in ipairs(workers) do t:deadline(o.batch_deadline) end
  end
  for t in loop.as_completed(workers) do
    local ok, msg, code = t:join()
    if not ok and code ~= "timeout" then error(msg, 0) end
    if not ok then stats.deadline = true end
  end
  stats.elapsed = mirza.now() - stats.t0
  stats.left = #queue - stats.done_now
  return stats
end

---Run a batch. Returns the summary (also written to stderr unless
---`quiet`): total, skipped (already in the output), done_now, errors,
---retries, cut, tokens, elapsed, left (unfinished: deadline), deadline.
---Options: `B.defaults`, plus input (path) or items (parsed), output,
---endpoints (base URLs or {url=, limit=}) or base_url or pool, body
---(fields merged into every request), headers, api_key, quiet, log.
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
  local done, n = B.resume(o.output)
  if not done then return nil, n, "io" end
  local out, oerr = io.open(o.output, "ab")
  if not out then return nil, oerr, "io" end
  local ok, stats = pcall(function()
    if loop.current() then return drive(o, items, done, out) end
    return loop.run(drive, o, items, done, out)
  end)
  out:close()
  if not ok then error(stats, 0) end
  if not o.quiet then io.stderr:write(B.summary(stats, o.output), "\n") end
  return stats
end

---The summary line of a finished run.
---@param st table
---@param output? string
---@return string
function B.summary(st, output)
  local rate = st.elapsed > 0 and st.tokens / st.elapsed or 0
  return ("batch: %d items (%d already done, %d now: %d ok, %d errors, %d cut), %d retries, %d tokens in %.1f s"
    .. " (%.0f tok/s)%s%s"):format(st.total, st.skipped, st.done_now, st.done_now - st.errors, st.errors, st.cut,
    st.retries, st.tokens, st.elapsed, rate, st.deadline and (", deadline reached: %d left"):format(st.left) or "",
    output and ("; output: " .. output) or "")
end

return B
