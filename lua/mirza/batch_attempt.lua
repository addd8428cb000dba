--- mirza.batch_attempt: one attempt of a batch item on one endpoint
--- (mirza.batch): the request as sent, the stream read through the
--- repetition guard into a result (mirza.result), the answer checked
--- against the item's schema, the daemon's prompt-cache figures.
local mirza = require "mirza"
local loop = require "mirza.loop"
local pipeline = require "mirza.pipeline"
local result = require "mirza.result"
local retry = require "mirza.retry"
local copy = require("mirza.util").copy
local resolve = require("mirza.url").resolve
local json = mirza.json

local A = {}

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

-- The choices past the first (n > 1): their deltas (an event with an
-- `index`) go each into a result of its own, `others[index]`, the rest
-- is the stream of choice 0 the stages and the reducer read.
-- `first()` is called at the first delta, `step(dt)` (when given: the
-- stream measures it, mirza.open's `step`) once its step is known.
local DELTA = { text = true, think = true, tool_call = true }
local function apart(s, first, others, step)
  return function()
    while not s:closed() do
      local ev = s:next()
      if first and ev and DELTA[ev.type] then
        first() -- the daemon's prefill is done
        first = nil
      end
      local dt = step and not first and not s:closed() and s:step()
      if dt then
        step(dt) -- the daemon's decode step at its load
        step = nil
      end
      local i = ev and ev.index
      if not (i and DELTA[ev.type]) then return ev end
      local acc = others[i] or result.new { calls = true }
      others[i] = acc
      result.feed(acc, ev)
    end
  end
end

-- Read one attempt's stream, for an item with a schema (`check`) through
-- the think-tag splitter (reasoning sent as `<think>…</think>` in the
-- content goes to `think`, as an engine's turn splits it: the answer
-- checked is the answer alone), and through the repetition guard, into a
-- result (mirza.result), tool-call fragments merged. (Only an item with a
-- schema pays for the splitter: its answer is the one checked.) The other
-- choices' deltas go to `others` (apart), choice 0's through the stages.
local function read_stream(s, opts, first, check, others, step)
  local stages = {}
  if check and opts.think_tags ~= false then
    stages[1] = { name = "think_tags", fn = require("mirza.thinktags").stage,
      opts = { mode = opts.think_tags == nil and true or opts.think_tags } }
  end
  if opts.repetition ~= false then
    local ropts = copy(opts.repetition)
    ropts.channels = ropts.channels or { think = true, text = true }
    ropts.on_cut = function() s:close() end -- the daemon stops generating at once
    stages[#stages + 1] = { name = "repetition", fn = require("mirza.repetition").stage, opts = ropts }
  end
  local iter, _, _, closer = pipeline.compose(apart(s, first, others, step), stages)
  local _ <close> = closer
  return result.drain(result.new { calls = true }, iter)
end

---What to say of an HTTP 401 or 403: the server wants a key it did not
---get, or refuses the one it got (`keyed`: a key was sent).
---@param url string
---@param status integer
---@param keyed? boolean
---@return string
function A.auth_message(url, status, keyed)
  if keyed then
    return ("%s answered HTTP %d (%s): check --api-key KEY / MIRZA_API_KEY / OPENAI_API_KEY"):format(
      mirza.redact_url(url), status, status == 401 and "the key given was refused" or "the key given may not do that")
  end
  return ("%s answered HTTP %d (%s): give the server's key: --api-key KEY or MIRZA_API_KEY (OPENAI_API_KEY is"
    .. " read too); nothing is sent without it"):format(mirza.redact_url(url), status,
    status == 401 and "no key, or a wrong one" or "this key may not do that")
end

-- Whether the run's requests carry a key: api_key, or an Authorization
-- header of its own (headers as a map or as "Name: value" lines).
local function keyed(opts)
  if opts.api_key then return true end
  for k, v in pairs(opts.headers or {}) do
    local name = math.type(k) and tostring(v):match("^([^:]*):") or k
    if type(name) == "string" and name:lower():match("^%s*authorization%s*$") then return true end
  end
  return false
end

-- The model endpoint e serves: the first id its /v1/models lists, asked
-- once (the other workers wait for that answer). nil, message, code when
-- it cannot be asked (code "model" when it answered without a model, or
-- "auth" when it wants a key: no use retrying).
local function served_model(e, opts)
  while e.model_asked do e.model_asked:wait() end -- asked by another worker: its answer is ours
  if e.model then return e.model end
  local asked = loop.condition()
  e.model_asked = asked
  local _ <close> = setmetatable({}, { __close = function() -- answered, failed or cancelled
    e.model_asked = nil
    asked:broadcast()
  end })
  local url = resolve(e.url, "models")
  local body, msg, code, status = mirza.request { url = url, method = "GET", headers = opts.headers,
    api_key = opts.api_key, timeout = opts.connect_timeout, deadline = opts.deadline or 30 }
  local list = body and json.decode(body)
  local first = type(list) == "table" and type(list.data) == "table" and list.data[1]
  if type(first) == "table" and type(first.id) == "string" then
    e.model = first.id
    return e.model
  end
  if status == 401 or status == 403 then return nil, A.auth_message(url, status, keyed(opts)), "auth", status end
  if not body and retry.blame(code, status) then return nil, msg, code, status end
  return nil, ("cannot learn the model from %s (%s): pass --model ID, or give each line a \"model\""):format(
    mirza.redact_url(url), body and "no model listed" or msg), "model"
end

-- The options of the attempt r's request (its URL: r.url).
local function request_opts(r, opts, body)
  return { url = r.url, body = body, headers = opts.headers, api_key = opts.api_key,
    stall_timeout = opts.stall_timeout, deadline = opts.deadline, timeout = opts.connect_timeout,
    header_timeout = opts.header_timeout }
end

-- A failed attempt's fields from a result's failure (mirza.result.failure).
local function failed(r, f, opts)
  r.code, r.message, r.status, r.error, r.retry_after = f.code, f.message, f.status, f.error, f.retry_after
  if f.status == 401 or f.status == 403 then r.message = A.auth_message(r.url, f.status, keyed(opts)) end
  return r
end

-- A non-streamed attempt (/v1/completions, /v1/embeddings): the server's
-- body decoded (an embeddings answer recorded as its text, `r.raw`).
local function plain_attempt(item, opts, body, r, first)
  local ro = request_opts(r, opts, body)
  ro.plain = true
  local s <close> = mirza.open(ro)
  local ev = s:next() or { type = "error", code = "closed", message = "no answer" }
  if first and ev.type == "response" then first() end
  r.final, r.duration_s = ev, mirza.now() - r.t0
  if ev.type ~= "response" then return failed(r, result.failure { final = ev }, opts) end
  local v = json.decode(ev.body or "")
  if type(v) ~= "table" then
    r.code, r.status = "protocol", ev.status
    r.message = ("%s answered %d with a body that is not a JSON object"):format(mirza.redact_url(r.url),
      ev.status or 0)
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

---One HTTP attempt of `item` on endpoint e: the result table (`ok`, or
---`code`, `message`, `status`...; `url` the URL requested). `first()`, when
---given, is called at the answer's first token (the daemon's prefill done);
---`step(dt)`, when given, once its decode step is measured (mirza.open's
---`step`: the first token to the next one read).
---@param item table
---@param e table a pool endpoint
---@param opts table the run's options
---@param first? fun()
---@param step? fun(dt: number)
---@return table r
function A.attempt(item, e, opts, first, step)
  local r = { t0 = mirza.now(), endpoint = e.base, url = (resolve(e.url, item.kind)) }
  local body = request_body(item, opts)
  if body.model == nil then
    body.model, r.message, r.code, r.status = served_model(e, opts)
    if not body.model then return r end
  end
  r.model = body.model
  if item.kind ~= "chat" then return plain_attempt(item, opts, body, r, first) end
  local ro = request_opts(r, opts, body)
  ro.merge, ro.hold, ro.step = true, opts.hold or false, step ~= nil -- only the text is kept: one event a read
  local s <close> = mirza.open(ro)
  local others = {}
  local acc = read_stream(s, opts, first, item.check, others, step)
  local t1, fin = mirza.now(), acc.final or {}
  local first_at = s:first_at() or acc.first -- as read, not as handed over (hold)
  local got = result.partial(acc)
  r.text, r.think, r.calls, r.cut, r.final = got.text, got.think, got.tool_calls, acc.cut, acc.final
  for i, o in pairs(others) do
    r.choices = r.choices or {}
    r.choices[i] = result.partial(o) -- choice i's {text, think, tool_calls} (n > 1)
  end
  r.duration_s = t1 - r.t0
  r.ttft_ms = first_at and (first_at - r.t0) * 1000
  r.tokens = fin.usage and fin.usage.completion_tokens or acc.deltas
  r.tok_s = first_at and t1 > first_at and r.tokens / (t1 - first_at) or nil
  r.prompt_tokens, r.cached_tokens = cache_of(fin.usage, fin.timings, fin.stats)
  if result.ok(acc) then
    r.ok = true
    check_answer(item, r)
    return r
  end
  return failed(r, result.failure(acc), opts)
end

return A
