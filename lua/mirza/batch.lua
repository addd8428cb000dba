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
--- non-streamed and the server's body is recorded as it came. As in
--- OpenAI's Batch API, answers go to OUTPUT and failures to an error file
--- beside it (`out.jsonl` -> `out.errors.jsonl`; `errors` to choose), in the
--- same record shape; running the same command again does the failed
--- items again, and only they.
---
--- Every chat and completions item carries a prefix key (mirza.pool's
--- prefix_key of its leading messages or prompt): items sharing a long
--- prefix go to the endpoint that took it last while it has room, where
--- the daemon's prompt cache holds it (`affinity = false`: least loaded).
---
--- Resume: records already in the output file are skipped (a torn last line
--- left by a kill is cut off first), so a run killed at any point and started
--- again loses and duplicates nothing; no custom_id ever has two records.
--- The input and OUTPUT are read as streams: a run keeps each item's
--- custom_id (an id set, 24-48 bytes an item), never the bodies of the lines
--- it has not sent. Item failures are records, never fatal, and are
--- judged by class (mirza.batch_policy, mirza.retry.class): a route the
--- server does not have (404/405/501) is "unsupported" at once, another
--- 4xx is the item's, a 5xx or an error frame is retried with exponential
--- backoff and jitter (honouring Retry-After) while the endpoint serves
--- the rest, and only transport failures, 502/503/504 or faults on every
--- request rest an endpoint. A repetition guard (mirza.repetition) cuts a
--- looping item early — the daemon stops generating — and the record says
--- so (`finish_reason` "repetition", `mirza.cut`).
---
--- The concerns live in their own modules: mirza.batch_input (reading and
--- parsing lines), mirza.batch_output (records, resume, the error file),
--- mirza.batch_attempt (one request), mirza.batch_policy (failures,
--- retries, progress); this one is the scheduler and the run.
local mirza = require "mirza"
local loop = require "mirza.loop"
local pool_mod = require "mirza.pool"
local core = require "mirza.core"
local input = require "mirza.batch_input"
local output = require "mirza.batch_output"
local policy = require "mirza.batch_policy"
local copy = require("mirza.util").copy

local B = {}

B.defaults = {
  limit = nil,            -- requests in flight per endpoint, fixed; nil: each endpoint's found as the run goes
                          -- (mirza.limit), at most what its server announces (mirza.capacity)
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
  think_tags = true,      -- an item with a schema: reasoning sent as <think>…</think> in the content split out
                          -- before the check (mirza.thinktags mode; "open": the answer starts inside one; false: kept)
  schema = nil,           -- a JSON Schema (table) or a path: the answer of every chat/completions line without its own
  attempts = 1,           -- answers a chat item with a schema may give (a violation is told to the model)
  affinity = true,        -- items sharing a prefix go where it went last (mirza.pool prefix affinity)
  lookahead = 64,         -- with affinity: how many of the next items a free slot may choose from
  hold = 1,               -- an item's text goes to its task at most every hold seconds (mirza.open's hold): one
                          -- wake-up per stream per second, not per token; the end comes as read, a repetition
                          -- cut up to that late; ttft_ms is when the first token was read all the same; 0: each
                          -- read
}

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
  if o.errors ~= nil and o.errors ~= false and type(o.errors) ~= "string" then
    error("mirza.batch.run: 'errors' must be a path or false, got " .. tostring(o.errors), 3)
  end
  if not o.pool then -- each endpoint as pasted (mirza.url makes its requests' URLs)
    o.pool = pool_mod.new(o.endpoints or { o.base_url or "http://127.0.0.1:8766/v1" },
      { limit = o.limit, affinity = o.affinity ~= false })
  end
  return o
end

-- The next job: a retry whose time has come, else the next pending item
-- (read from the source as slots free up: the window holds the next
-- `lookahead` at most), else (after waiting for it) the earliest retry;
-- nil when none is left or the run stops.
local function next_job(ctx, queue)
  local waiting, win = queue.waiting, queue.win
  local want = ctx.opts.affinity ~= false and math.max(1, ctx.opts.lookahead or 1) or 1
  while not ctx.abort do
    local now, first = mirza.now(), nil
    for i, j in ipairs(waiting) do
      if not first or j.at < waiting[first].at then first = i end
    end
    if first and waiting[first].at <= now then return table.remove(waiting, first) end
    while #win < want and queue.source do
      local it = queue.source.next()
      if not it then
        queue.source = nil
        break
      end
      win[#win + 1] = it
    end
    if #win > 0 then -- which of them goes first: the pool's placement decides (mirza.pool next_item)
      local i = ctx.pool:next_item(win, ctx.opts.affinity ~= false and ctx.opts.lookahead or 1)
      return { item = table.remove(win, i), n = 0, tried = {} }
    end
    if not first then return nil end
    mirza.sleep(waiting[first].at - now)
  end
end

-- The workers: each runs one attempt at a time, of the next job, until
-- none is left (or the run stops: the item it was on is not recorded).
local function work(ctx, queue)
  while true do
    ctx.pool:wait_room() -- an item is taken only when it can go out: the limits move
    local job = next_job(ctx, queue)
    if not job then return end
    local r, at = policy.step(job, ctx)
    if r then ctx.write(output.record(job.item, r), r)
    elseif not at then return
    else
      job.at = at
      queue.waiting[#queue.waiting + 1] = job
    end
  end
end

-- Count a failed item under its kind (policy.failure_kind), the first
-- message of each kind kept for the summary, in the order they came.
local function count_failure(stats, r, rec)
  local kind = policy.failure_kind(r)
  local k = stats._by_kind[kind]
  if not k then
    local err = type(rec.error) == "table" and rec.error or {} -- its message as recorded: secrets redacted
    k = { kind = kind, n = 0, message = err.message or r.message or kind, code = r.code,
      rerun = policy.rerun_helps(r.code, r.status), custom_id = rec.custom_id }
    stats._by_kind[kind] = k
    stats.kinds[#stats.kinds + 1] = k
  end
  k.n = k.n + 1
end

-- Write one record: an answer to OUTPUT, a failure to the error file.
local function make_writer(run, stats)
  run.stats = stats
  local sink = run.sink
  return function(rec, r)
    if run.write_error then error(run.write_error, 0) end
    local f, name, err = sink.out, sink.name, nil
    if not r.ok then
      name = sink.errors_name or sink.name
      f, err = output.errors_file(sink)
    end
    local ok = false
    if f then ok, err = f:write(output.encode_record(rec, r) .. "\n") end -- unbuffered: one write(2) per record
    if not ok then
      run.write_error = ("cannot write %s: %s (the records before are kept; free space or choose another file,"
        .. " then run the same command again)"):format(name, err)
      error(run.write_error, 0)
    end
    stats.done_now = stats.done_now + 1
    if not r.ok then
      stats.errors = stats.errors + 1
      stats.by_code[r.code or "error"] = (stats.by_code[r.code or "error"] or 0) + 1
      count_failure(stats, r, rec)
    end
    if r.cut then stats.cut = stats.cut + 1 end
    if r.ok then stats.tokens = stats.tokens + (r.tokens or 0) end
    if r.cached_tokens and r.prompt_tokens then -- only items whose daemon said: the share is of those
      stats.cached_tokens = stats.cached_tokens + r.cached_tokens
      stats.cache_prompt_tokens = stats.cache_prompt_tokens + r.prompt_tokens
    end
  end
end

local function drive(o, run)
  local stats = { t0 = mirza.now(), total = run.total, skipped = run.skipped, done_now = 0, errors = 0, retries = 0,
    cut = 0, tokens = 0, cached_tokens = 0, cache_prompt_tokens = 0, by_code = {}, kinds = {}, _by_kind = {},
    redo = run.sink.redo }
  local queue = { source = run.source, win = {}, waiting = {} } -- pending items as read, jobs waiting to be retried
  local workers, progress, probes = {}, nil, {}
  local ctx = { opts = o, stats = stats, pool = o.pool, write = make_writer(run, stats), workers = workers,
    unsupported = {}, unsupported_result = {} }
  -- Cancelling the task running the batch cancels its workers too.
  local _ <close> = setmetatable({}, { __close = function()
    for _, t in ipairs(workers) do t:cancel() end
    if progress then progress:cancel() end
    for _, t in ipairs(probes) do t:cancel() end
  end })
  -- each endpoint's announced capacity, all at once, before the first request (a second at most)
  probes = B.probe_capacity(o.pool, o)
  for t in loop.as_completed(probes) do t:join() end
  for _, t in ipairs(B.poll_waiting(o.pool, o)) do probes[#probes + 1] = t end -- cancelled with the probes
  for i = 1, math.min(o.pool:capacity(), run.total - run.skipped) do workers[i] = loop.spawn(work, ctx, queue) end
  progress = o.progress and policy.progress_task(stats, o, function(...) return policy.progress_line(...) end)
  if o.batch_deadline then
    for _, t in ipairs(workers) do t:deadline(o.batch_deadline) end
  end
  for t in loop.as_completed(workers) do
    local ok, msg, code = t:join()
    if not ok and code ~= "timeout" and not (ctx.abort and code == "cancelled") then error(msg, 0) end
    if not ok and code == "timeout" then stats.deadline = true end
  end
  stats.elapsed = mirza.now() - stats.t0
  stats.limits = B.limits(o.pool)
  -- what a rerun does: the items not recorded, and the failed ones when they have their own file
  stats.left = stats.total - stats.skipped - stats.done_now + (run.sink.err ~= run.sink.out and stats.errors or 0)
  if ctx.abort then -- the message names what is left and what to do
    stats.abort = ctx.abort
    if ctx.abort.code == "down" then
      stats.abort.message = ("%s; %d of %d items left for a rerun: run the same command again once a daemon answers")
        :format(ctx.abort.message, stats.left, stats.total)
    end
  end
  return stats
end

---Read what each endpoint without a fixed limit announces
---(mirza.capacity), each in a task of its own, all at once: the
---ceilings come as the answers do (a second at most).
---@param pool mirza.Pool
---@param o table the run's options (api_key, headers)
---@return mirza.Task[]
function B.probe_capacity(pool, o)
  local tasks = {}
  local ro = { api_key = o.api_key, headers = o.headers }
  for _, e in ipairs(pool.endpoints) do
    if e.limiter then
      tasks[#tasks + 1] = loop.spawn(pool.probe, pool, e, ro) -- mirza.capacity's answer to e's limiter
    end
  end
  return tasks
end

---Poll the queue of each endpoint whose /metrics counts it (the probe's
---`metrics`) every `every` seconds (0.5), for its limiter
---(`Pool:server_waiting`), until cancelled: one task per such endpoint.
---@param pool mirza.Pool
---@param o table the run's options (api_key, headers)
---@param every? number
---@return mirza.Task[]
function B.poll_waiting(pool, o, every)
  local tasks, capacity = {}, require "mirza.capacity"
  local ro = { api_key = o.api_key, headers = o.headers }
  for _, e in ipairs(pool.endpoints) do
    if e.limiter and e.metrics then
      tasks[#tasks + 1] = loop.spawn(function()
        while true do
          mirza.sleep(every or 0.5)
          local n, running = capacity.waiting(e.url, e.metrics, ro)
          if n then pool:server_waiting(e, n, running) end
        end
      end)
    end
  end
  return tasks
end

---What each endpoint's limit ended at and how it was found, for the
---summary: `{base, text, peak, served}` per endpoint (text: "settled on
---limit 16 (auto, ...)" or "@8 fixed").
---@param pool mirza.Pool
---@return table[]
function B.limits(pool)
  local out = {}
  for _, e in ipairs(pool.endpoints) do
    out[#out + 1] = { base = mirza.redact_url(e.base), peak = e.peak, served = e.served,
      text = (e.limiter and "settled on " or "") .. pool_mod.limit_text(e) }
  end
  return out
end

-- Run drive to its end: true, stats or false, error. Ctrl-C raises in the
-- scheduler's wait, then once more at the next Lua instruction (the
-- host's hook); both are taken here, then the batch's task is cancelled
-- so that its workers and the progress line unwind (their <close>)
-- before B.run reports what was saved.
local function run_guarded(o, run)
  if loop.current() then return pcall(drive, o, run) end
  local l, t = loop.default(), nil
  local ok, err = pcall(function()
    t = l:spawn(drive, o, run)
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
local function stopped_line(run, o, err)
  local st = run.stats or { skipped = run.skipped, done_now = 0, errors = 0 }
  local why = tostring(err):find("interrupted", 1, true) and "interrupted" or "stopped by an error"
  local saved = st.skipped + st.done_now - (run.sink.err ~= run.sink.out and st.errors or 0) -- failures: redone
  if run.sink.stream then
    return ("batch: %s: %d of %d records written to %s (no resume from a stream: give OUTPUT as a file to resume)")
      :format(why, st.done_now, run.total, run.sink.name)
  end
  return ("batch: %s: %d of %d items saved in %s, %d left; to resume, run: %s"):format(why, saved, run.total,
    run.sink.name, run.total - saved, o.resume_command or "the same command again")
end

-- Descriptors a run needs besides its connections: standard streams,
-- INPUT and OUTPUT, the error file, the client's wake pipe and epoll,
-- libcurl's own.
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
---`quiet`): total, skipped (already in the output), done_now, errors
---(recorded in the error file), redo (failed items of an earlier run now
---done again), retries, cut, tokens, elapsed, left (unfinished: deadline),
---deadline, by_code (errors by code), kinds (a list, one entry per kind of
---failure in the order they came: `{kind = "http 401", n, message = the
---first one's, custom_id = the first one's, code, rerun = whether running
---the command again may redo them}`), errors_file.
---Options: `B.defaults`, plus input (path) or items (parsed), output (a
---path; "-" is standard output), errors (the error file: default beside
---OUTPUT, `out.errors.jsonl`; false: failures go to OUTPUT), endpoints
---(URLs as a user pastes them: a base with or without /v1, a route's
---URL, a query string kept; or {url=, limit=}) or base_url or pool, body
---(fields merged into every request), headers, api_key, quiet, log,
---resume_command (shown when Ctrl-C stops the run).
---The input is read as a stream (its custom_ids in an id set, not its
---bodies): duplicates stop the run before anything is sent. An existing
---OUTPUT file must hold batch records (it is resumed: its custom_ids are
---skipped) and must not be INPUT; the error file's items are done again
---(it starts anew); a pipe or a terminal is written as it comes, without
---resume; each record goes out in one write. Codes: "limit" (more
---requests at once than the open-files limit allows, nothing written),
---"input", "io", "output" (OUTPUT refused, nothing written), "write"
---(writing failed), "unreachable" (no endpoint ever answered: all refuse),
---"down" (every endpoint down for `give_up_after` s), "model" (no --model,
---and an endpoint lists none), "auth" (the server wants a key: --api-key):
---the unfinished items stay for a rerun.
---@param opts mirza.BatchOptions (_meta_lua.lua)
---@return table|nil summary
---@return string? message
---@return string? code
function B.run(opts)
  local o = resolve(opts)
  local set <close> = core.idset() -- every item's custom_id: done (in OUTPUT), its input line
  local compile, run_c = input.compiler(), nil
  if o.schema ~= nil then
    local msg
    run_c, msg = compile(o.schema)
    if not run_c then return nil, "--schema: " .. tostring(msg), "input" end
  end
  local DONE, total, skipped = input.DONE, nil, nil
  -- OUTPUT first (its custom_ids marked done), then INPUT (the ids, the
  -- duplicates, the count); before anything is written, the requests that
  -- can be in flight at once must fit in the open-files limit.
  local sink, err, code = output.open(o, function(id) set:put(id, DONE) end, function()
    local serr, scode
    if o.items then total, skipped, scode = input.scan_items(o.items, set)
    else total, skipped, scode = input.scan(o.input, set) end
    if not total then return skipped, scode end
    o.pool:fit(mirza.fd_limit() - FD_RESERVE) -- limits found as the run goes stay within the open files
    serr = B.check_fd_limit(math.min(o.pool:capacity(), total - skipped))
    if serr then return serr, "limit" end
  end)
  if not sink then return nil, err, code end
  local src, serr = { next = function() end, close = function() end }, nil -- nothing left: nothing to read
  if total > skipped then src, serr = input.source(o, set, compile, run_c) end
  if not src then
    output.close(sink)
    return nil, serr, "io"
  end
  -- closed however the run ends, also when the task running it is
  -- cancelled: no file left open until a collection
  local _ <close> = setmetatable({}, { __close = function()
    src.close()
    output.close(sink)
  end })
  local run = { sink = sink, source = src, total = total, skipped = skipped }
  local ok, stats = run_guarded(o, run)
  if run.write_error then return nil, run.write_error, "write" end
  if not ok then
    if not o.quiet then io.stderr:write(stopped_line(run, o, stats), "\n") end
    error(stats, 0)
  end
  stats.errors_file = sink.errors_name
  if stats.abort then return nil, stats.abort.message, stats.abort.code end
  if not o.quiet then io.stderr:write(B.summary(stats, sink.name), "\n") end
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

-- What the summary says of a kind of failure besides its first message.
local function kind_hint(k)
  if k.code == "input" then return " (fix the line in INPUT)" end
  if k.rerun or k.code == "unsupported" or k.kind == "http 401" or k.kind == "http 403" then return "" end
  return " (the request's own: fix it)"
end

-- The failures part of the summary: how many, where, the first message of
-- each kind, and whether running the same command again may get them —
-- advised only for the kinds where it can (not an input line, a key the
-- server wants, a route it lacks, another 4xx: those fail the same way).
local function failures_summary(st, output_name)
  local lines, again = {}, 0
  for _, k in ipairs(st.kinds or {}) do
    lines[#lines + 1] = ("batch:   %d %s (first: %s): %s%s"):format(k.n, k.kind, tostring(k.custom_id), k.message,
      kind_hint(k))
    if k.rerun then again = again + k.n end
  end
  local where
  if st.errors_file then
    where = ("batch: %d failed, recorded in %s; the first message of each kind:"):format(st.errors, st.errors_file)
  else -- among the answers (OUTPUT a stream, or errors = false): a rerun does not tell them apart
    where = ("batch: %d failed, recorded in %s with the answers (give --errors FILE to keep failures apart, and a"
      .. " rerun redoes them); the first message of each kind:"):format(st.errors, output_name or "OUTPUT")
  end
  local advice
  if again == st.errors then
    advice = "batch: run the same command again to redo them (only they are sent)"
  elseif again > 0 then
    advice = ("batch: run the same command again to redo the %d that a rerun may get (only the failed items are"
      .. " sent); the %d others fail the same way until their cause above is fixed"):format(again, st.errors - again)
  else
    advice = "batch: running the same command again fails them the same way: fix the cause above first (then only"
      .. " the failed items are sent)"
  end
  return ("%s\n%s\n%s"):format(where, table.concat(lines, "\n"), advice)
end

---The summary of a finished run: what was done, and when items failed,
---where they are, the first message of each kind of failure (its code,
---with the HTTP status: "http 401") and whether running the same command
---again may redo them (mirza.batch_policy.rerun_helps).
---@param st table
---@param output_name? string
---@return string
function B.summary(st, output_name)
  local rate = st.elapsed > 0 and st.tokens / st.elapsed or 0
  local share = B.cached_share(st)
  local line = ("batch: %d items (%d already done, %d now: %d ok, %d errors, %d cut), %d retries, %d tokens in %.1f s"
    .. " (%.0f tok/s)%s%s%s"):format(st.total, st.skipped, st.done_now, st.done_now - st.errors, st.errors, st.cut,
    st.retries, st.tokens, st.elapsed, rate, st.deadline and (", deadline reached: %d left"):format(st.left) or "",
    share and ("; prompt tokens served from cache: %.0f%%"):format(share * 100) or "",
    output_name and ("; output: " .. output_name) or "")
  if st.redo and st.redo > 0 then line = line .. ("; %d failed before, done again"):format(st.redo) end
  if st.errors > 0 then line = line .. "\n" .. failures_summary(st, output_name) end
  for _, l in ipairs(st.limits or {}) do
    line = line .. ("\nbatch: %s: %s; at most %d in flight, %d served"):format(l.base, l.text, l.peak,
      l.served)
  end
  return line
end

return B
