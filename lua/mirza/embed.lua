--- mirza.embed: the vectors of texts, from any daemon serving the OpenAI
--- `POST /v1/embeddings` route (llama-server --embeddings, vLLM with an
--- embedding model, Ollama; see docs/embeddings.md for which serve it).
---
---   local vecs = assert(mirza.embed { url = "http://127.0.0.1:8080", input = texts })
---   print(#vecs, vecs[1][1], vecs.usage.prompt_tokens)
---   store(vecs:packed(1))                  -- 4 bytes a float, little-endian
---
--- A large input is cut into chunks of `batch` inputs, sent in parallel
--- (as many at once as the pool has slots, or `parallel` for one URL) as
--- tasks of `mirza.loop`: inside a task, other tasks go on meanwhile;
--- outside any, the call runs the scheduler until it is done. Each chunk's
--- vectors land at their inputs' places, whatever order the chunks finish
--- in and whatever order the server lists them in (by `index`). A failed
--- chunk is tried again as mirza.retry classifies its failure (another
--- endpoint of the pool first); a chunk that still fails fails the whole
--- call: nil, message, code, and no vectors at all — never a result with
--- holes. A server that has no such route (HTTP 404, 405, 501: llama-server
--- without --embeddings, MTPLX) is said so at once, code "unsupported".
---
--- Answers in float arrays and in base64 (little-endian float32, what
--- `encoding_format = "base64"` asks; a quarter to two fifths of the
--- bytes of the JSON floats) are both read; base64 is decoded here in Lua (no C helper
--- exists for it: docs/embeddings.md has the cost of each).
local loop = require "mirza.loop"
local retry = require "mirza.retry"

local M = {}

---Defaults of `mirza.embed`'s options.
M.defaults = {
  batch = 64,     -- inputs per request
  parallel = 4,   -- requests at once to a lone `url` (a pool: its capacity)
  attempts = 3,   -- tries per chunk (mirza.retry says which failures are worth another)
  give_up_after = 10, -- seconds every endpoint may be failing before the call stops retrying
  backoff = 0.5,  -- first wait before a retry on the same endpoint, doubling, seconds
  backoff_max = 8,
}

-- HTTP statuses meaning "no embeddings route here": said at once, never retried.
local UNSUPPORTED = { [404] = true, [405] = true, [501] = true }

local KEYS = { url = "string", pool = "table", model = "string", input = "string|table", batch = "number",
  parallel = "number", attempts = "number", give_up_after = "number", dimensions = "number", encoding_format = "string",
  api_key = "string", headers = "table", timeout = "number|boolean", header_timeout = "number|boolean",
  stall_timeout = "number|boolean", deadline = "number|boolean", record = "string|boolean", body_extra = "table" }

-- Raise on an unknown option or a wrong type: a programmer error, at the caller's line.
local function check(opts)
  if type(opts) ~= "table" then error("mirza.embed: options table expected, got " .. type(opts), 3) end
  for k, v in pairs(opts) do
    local want = KEYS[k]
    if not want then error(("mirza.embed: unknown option %q"):format(tostring(k)), 3) end
    if not want:find(type(v), 1, true) then
      error(("mirza.embed: '%s' must be a %s (got %s)"):format(k, want:gsub("|", " or "), type(v)), 3)
    end
  end
  if not opts.url and not opts.pool then error("mirza.embed: 'url' or 'pool' is required", 3) end
  if opts.input == nil then error("mirza.embed: 'input' is required", 3) end
  for _, k in ipairs { "batch", "parallel", "attempts" } do
    local v = opts[k]
    if v and (v < 1 or v % 1 ~= 0) then
      error(("mirza.embed: '%s' must be a positive integer (got %s)"):format(k, tostring(v)), 3)
    end
  end
end

-- The inputs as a list: a string, or one tokenized input (a list of
-- integers), is one input; a list of strings or of token lists is many.
local function inputs_of(input)
  if type(input) == "string" or type(input[1]) == "number" then return { input } end
  for i = 1, #input do
    local t = type(input[i])
    if t ~= "string" and t ~= "table" then
      error(("mirza.embed: input[%d] must be a string or a list of tokens (got %s)"):format(i, t), 3)
    end
  end
  return input
end

-- ------------------------------------------------------------ vectors

local B64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
-- byte -> its 6-bit value, and pre-shifted by 6, 12, 18 for each place of a
-- 4-character group. A byte outside the alphabet is 2^40 in all four: any
-- group holding one is over 24 bits, which is how it is found (no branch).
local BAD = 1 << 40
local SIX, S6, S12, S18 = {}, {}, {}, {}
for c = 0, 255 do SIX[c] = BAD end
for i = 1, 64 do SIX[B64:byte(i)] = i - 1 end
SIX[("-"):byte()], SIX[("_"):byte()] = 62, 63 -- the URL-safe alphabet too
for c = 0, 255 do S6[c], S12[c], S18[c] = SIX[c] << 6, SIX[c] << 12, SIX[c] << 18 end

local byte, pack, unpack, concat = string.byte, string.pack, string.unpack, table.concat

-- The decoder of whole 128-character steps (96 bytes): one `string.byte`
-- and one `string.pack` a step, its 32 groups in locals. Generated here
-- because the speed is in the width: 4 characters a step cost 2.1x as
-- much, 16 a step 1.2x (a narrow step's time goes into making and
-- interning its short string). decode_steps(s, last, out) puts the bytes
-- of s[1..last] (last a multiple of 128) in out[1..k] and returns k, or
-- nil when a character is not base64.
local STEP_GROUPS = 32
local decode_steps = (function()
  local chars, vals, xs = {}, {}, {}
  for g = 1, STEP_GROUPS do
    chars[g] = ("a%d, b%d, c%d, d%d"):format(g, g, g, g)
    vals[g] = ("S18[a%d] | S12[b%d] | S6[c%d] | SIX[d%d]"):format(g, g, g, g)
    xs[g] = "x" .. g
  end
  local x = table.concat(xs, ", ")
  local src = ([[local byte, pack, S18, S12, S6, SIX = ...
return function(s, last, out)
  local k = 0
  for i = 1, last, %d do
    local %s = byte(s, i, i + %d)
    local %s = %s
    if (%s) >= 1 << 24 then return nil end
    k = k + 1
    out[k] = pack("%s", %s)
  end
  return k
end]]):format(4 * STEP_GROUPS, table.concat(chars, ", "), 4 * STEP_GROUPS - 1, x, table.concat(vals, ", "),
    table.concat(xs, " | "), ">" .. ("I3"):rep(STEP_GROUPS), x)
  return assert(load(src, "=mirza.embed.base64"))(byte, pack, S18, S12, S6, SIX)
end)()

---Decode base64 (standard or URL-safe alphabet, padding optional).
---@param s string
---@return string|nil bytes nil when s is not base64
function M.base64_decode(s)
  s = s:gsub("=+$", "")
  local n, out = #s, {}
  if n % 4 == 1 then return nil end
  local last = n - n % (4 * STEP_GROUPS)
  local k = decode_steps(s, last, out)
  if not k then return nil end
  local bits, nbits, tail = 0, 0, {} -- the rest, 6 bits at a time
  for i = last + 1, n do
    local v = SIX[byte(s, i)]
    if v == BAD then return nil end
    bits, nbits = (bits << 6 | v) & 0xFFFFFF, nbits + 6
    if nbits >= 8 then
      nbits = nbits - 8
      tail[#tail + 1] = bits >> nbits & 0xFF
    end
  end
  out[k + 1] = string.char(table.unpack(tail))
  return concat(out)
end

---The floats of a packed vector (little-endian float32, as `vecs:packed(i)`
---gives and base64 answers hold).
---@param s string a multiple of 4 bytes
---@return number[]|nil floats nil, message when the length is not a multiple of 4
---@return string? message
function M.unpack(s)
  if type(s) ~= "string" then error("mirza.embed.unpack: string expected, got " .. type(s), 2) end
  if #s % 4 ~= 0 then return nil, ("%d bytes is not a whole number of float32"):format(#s) end
  local v, d = {}, #s // 4
  local i = 1
  while i <= d do -- at most 4,096 values per call (the C stack)
    local m = math.min(4096, d - i + 1)
    local got = table.pack(unpack("<" .. ("f"):rep(m), s, (i - 1) * 4 + 1))
    table.move(got, 1, m, i, v)
    i = i + m
  end
  return v
end

---A vector as little-endian float32 bytes (4 a value).
---@param v number[]
---@return string
function M.pack(v)
  local out, d = {}, #v
  for i = 1, d, 4096 do
    local j = math.min(d, i + 4095)
    out[#out + 1] = pack("<" .. ("f"):rep(j - i + 1), table.unpack(v, i, j))
  end
  return concat(out)
end

---@class mirza.Vectors
---@field n integer how many inputs (and vectors)
---@field dims integer|nil length of each vector (nil when n is 0)
---@field usage {prompt_tokens: integer, total_tokens: integer} summed over the requests
---@field model string|nil the model the server says answered
---@field requests integer requests that succeeded (chunks)
---@field packed fun(self_or_i: mirza.Vectors|integer, i?: integer): string vector i as little-endian float32 bytes
---  (`vecs:packed(i)` or `vecs.packed(i)`)

local function new_vectors(n)
  local vecs = { n = n, usage = { prompt_tokens = 0, total_tokens = 0 }, requests = 0 }
  vecs.packed = function(a, b)
    local i = a == vecs and b or a
    local v = vecs[i]
    if not v then error(("mirza.embed: packed(%s): no vector %s of %d"):format(tostring(i), tostring(i), vecs.n), 2) end
    return M.pack(v)
  end
  return vecs
end

-- One answer's vector: a float array, or base64 float32.
local function vector_of(emb)
  if type(emb) == "string" then
    local bytes = M.base64_decode(emb)
    if not bytes then return nil, "an embedding is a string that is not base64" end
    return M.unpack(bytes)
  end
  if type(emb) ~= "table" or type(emb[1]) ~= "number" then return nil, "an embedding is not a list of numbers" end
  return emb
end

-- Put one chunk's answer (a decoded body) in place: inputs first..first+count-1.
-- nil, message when it does not hold exactly one vector per input.
local function place(vecs, body, first, count)
  local data = type(body) == "table" and body.data
  if type(data) ~= "table" then return nil, "the answer has no 'data' list" end
  if #data ~= count then return nil, ("the answer holds %d embeddings for %d inputs"):format(#data, count) end
  local got = {}
  for k, item in ipairs(data) do
    if type(item) ~= "table" then return nil, ("the answer's embedding %d is not an object"):format(k) end
    local idx = math.tointeger(item.index)
    if item.index == nil then idx = k - 1 end -- a server that lists them in order without an index
    if not idx or idx < 0 or idx >= count or got[idx] then
      return nil, ("the answer's embedding %d has a bad or repeated index"):format(k)
    end
    local v, why = vector_of(item.embedding)
    if not v then return nil, why end
    if vecs.dims and #v ~= vecs.dims then
      return nil, ("an embedding of %d values among ones of %d"):format(#v, vecs.dims)
    end
    vecs.dims, got[idx] = #v, v
  end
  for j = 0, count - 1 do vecs[first + j] = got[j] end
  local u = type(body.usage) == "table" and body.usage or {}
  vecs.usage.prompt_tokens = vecs.usage.prompt_tokens + (math.tointeger(u.prompt_tokens) or 0)
  vecs.usage.total_tokens = vecs.usage.total_tokens + (math.tointeger(u.total_tokens or u.prompt_tokens) or 0)
  vecs.model = vecs.model or (type(body.model) == "string" and body.model or nil)
  vecs.requests = vecs.requests + 1
  return true
end

-- ------------------------------------------------------------ requests

-- The request of one chunk to pool endpoint ep (its URL by mirza.url's rule).
local function request_of(opts, ep, list)
  local body = { model = opts.model, input = list, encoding_format = opts.encoding_format,
    dimensions = opts.dimensions }
  for k, v in pairs(opts.body_extra or {}) do body[k] = v end
  return { url = (require("mirza.url").resolve(ep.url, "embeddings")), body = body, api_key = opts.api_key,
    headers = opts.headers, timeout = opts.timeout, header_timeout = opts.header_timeout,
    stall_timeout = opts.stall_timeout, deadline = opts.deadline, record = opts.record }
end

-- A message for a server without the route: a 501 is llama-server's
-- "started without --embeddings"; a 404 or 405 a server with no such route.
local function unsupported(url, msg, status)
  local hint = status == 501 and "restart llama-server with --embeddings (and --pooling mean, cls or last when the "
      .. "model has no pooling of its own)"
      or "vLLM serves it with an embedding model (--task embed), Ollama with an embedding model; MTPLX has none"
  return ("%s does not serve embeddings (%s): %s; see docs/embeddings.md"):format(require("mirza").redact_url(url),
    msg, hint)
end

-- Whether a call stops retrying: every endpoint has been failing for
-- `give_up_after` seconds (the pool's down_for), or none ever answered
-- and all refuse (unreachable). A chunk's own `attempts` bound it too.
local function given_up(ctx)
  local down = ctx.pool:down_for()
  return (down and down >= ctx.give_up_after) or ctx.pool:unreachable() ~= nil
end

-- A slot of the pool held by a chunk: given back without a verdict when
-- the chunk's task is cancelled while it holds one (another chunk failed).
local function holder(pool)
  return setmetatable({}, { __close = function(h) if h.ep then pool:abandon(h.ep) end end })
end

-- One chunk, tried up to `attempts` times: true, or nil, message, code, status.
local function run_chunk(ctx, first, list)
  local opts, pool, avoid, key = ctx.opts, ctx.pool, {}, {}
  local held <close> = holder(pool)
  local msg, code, status
  for attempt = 1, ctx.attempts do
    local ep
    ep, msg, code = pool:acquire(nil, nil, avoid) -- bounded: rests end, slots come back
    if not ep then return nil, msg, code end
    held.ep = ep
    local req = request_of(opts, ep, list)
    local text
    text, msg, code, status = require("mirza").request(req)
    held.ep = nil
    if text then
      local body, jmsg = require("mirza").json.decode(text)
      local ok, why = false, jmsg
      if body ~= nil then ok, why = place(ctx.vecs, body, first, #list) end
      pool:report(ep, { ok = true }, key) -- it answered: whatever it said is the request's, not the endpoint's
      if ok then return true end
      return nil, ("%s: %s"):format(require("mirza").redact_url(req.url), why), "protocol"
    end
    pool:report(ep, { code = code, status = status, message = msg }, key)
    if code == "http" and UNSUPPORTED[status] then
      return nil, unsupported(req.url, msg, status), "unsupported", status
    end
    local class = retry.classify(code, status)
    if not class.retry or attempt == ctx.attempts or given_up(ctx) then break end
    avoid[ep] = true
    -- the pool rests an endpoint for its own failures (the next try goes elsewhere, or
    -- waits for the rest); one that is not the endpoint's (429, a 500) waits here
    if class.blame ~= "endpoint" then
      require("mirza").sleep(retry.backoff(attempt, M.defaults.backoff, M.defaults.backoff_max, 0.5, 1))
    end
  end
  return nil, msg, code, status
end

-- A worker: takes the next chunk until none is left. The first chunk that
-- fails for good cancels the other workers (their requests close, their
-- slots go back) and its failure is the call's.
local function worker(ctx)
  while ctx.next <= #ctx.chunks and not ctx.failed do
    local c = ctx.chunks[ctx.next]
    ctx.next = ctx.next + 1
    local ok, msg, code, status = run_chunk(ctx, c.first, c.list)
    if not ok and not ctx.failed then
      ctx.failed = { msg, code, status }
      local me = loop.current()
      for _, t in ipairs(ctx.workers) do
        if t ~= me then t:cancel("another chunk failed") end
      end
    end
  end
end

-- The pool the chunks go through: the one given (a mirza.pool, or a list
-- of endpoints), else a pool of one over `url` (as written: mirza.url).
local function pool_of(opts)
  local P = require "mirza.pool"
  local p = opts.pool
  if p and p.acquire then return p end
  if p then return P.new(p) end
  -- rests of at most 2 s: a lone daemon loading its model is tried again soon
  return P.new({ opts.url }, { limit = opts.parallel or M.defaults.parallel, rest_max = 2 })
end

---Embed `opts.input` (see the module comment). Options: `url` (as written:
---"http://h:p", a base with a path, or the route itself; mirza.url) or `pool` (a
---`mirza.pool`, or a list of endpoints), `input` (a string, a list of
---strings, or token lists), `model` (default: none sent — the server's
---own; Ollama needs one), `batch` (inputs per request, default 64),
---`parallel` (requests at once to a lone url, default 4), `attempts`
---(tries per chunk, default 3), `give_up_after` (seconds every endpoint
---may be failing before no chunk is tried again, default 10),
---`dimensions`, `encoding_format` ("float" or "base64"),
---`api_key`, `headers`, `body_extra` (more body fields), the clocks of
---`mirza.request` (`timeout`, `header_timeout`, `stall_timeout`,
---`deadline`) and `record`.
---@param opts mirza.EmbedOptions
---@return mirza.Vectors|nil vecs `vecs[i][j]`: value j of input i's vector
---@return string? message
---@return string? code "unsupported", "protocol", or the request's ("refused", "http", "timeout", ...)
---@return integer? status HTTP status of an "http" or "unsupported" failure
function M.embed(opts)
  check(opts)
  local list = inputs_of(opts.input)
  local n, size = #list, math.tointeger(opts.batch) or M.defaults.batch
  local ctx = { opts = opts, vecs = new_vectors(n), pool = pool_of(opts), chunks = {}, next = 1, workers = {},
    attempts = opts.attempts or M.defaults.attempts, give_up_after = opts.give_up_after or M.defaults.give_up_after }
  for first = 1, n, size do
    local last = math.min(n, first + size - 1)
    ctx.chunks[#ctx.chunks + 1] = { first = first, list = table.move(list, first, last, 1, {}) }
  end
  -- the caller's task cancelled (or a deadline) while the chunks run: they go too
  local _ <close> = setmetatable({}, { __close = function()
    for _, t in ipairs(ctx.workers) do t:cancel() end -- a finished one: a no-op
  end })
  for i = 1, math.min(#ctx.chunks, ctx.pool:capacity()) do ctx.workers[i] = loop.spawn(worker, ctx) end
  for _, t in ipairs(ctx.workers) do
    local ok, msg, code = t:join()
    if not ok and code == "error" then error(msg, 0) end -- a bug, not a failed request
  end
  if ctx.failed then return nil, ctx.failed[1], ctx.failed[2], ctx.failed[3] end
  return ctx.vecs
end

return setmetatable(M, { __call = function(_, opts) return M.embed(opts) end })
