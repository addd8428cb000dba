-- mirza-sim's prompt cache as llama-server keeps it (issue 32 item 2): one
-- prompt per --parallel slot, a request's prompt the slot's only once its
-- prefill is done (its first token), the idle slot sharing the longest
-- prefix taken (else the least recently released), id_slot naming one;
-- --prompt-cache endpoint for the ideal cache; --prefill-rate making a
-- prefill cost what it evaluates. The requests here are concurrent: each is
-- an open stream, read later.
local mirza = require "mirza"
local H = require "tests.helper"

local PRE = {}
for i, word in ipairs { "alpha", "bravo", "charlie", "delta" } do PRE[i] = string.rep(word .. " is the rule. ", 60) end
local PRE_TOKENS = #PRE[1] // 4

local sims = {}
teardown(function() for _, s in pairs(sims) do s.stop() end end)
-- A fresh sim per case (the slots' contents are the point), llama dialect.
local function sim(args)
  local argv = { "--dialect", "llama", "--tok-rate", "0", "--ttft-ms", "0", "--quiet" }
  for _, a in ipairs(args) do argv[#argv + 1] = a end
  local s = H.start_sim(argv)
  sims[#sims + 1] = s
  return s
end

-- Open a streamed chat of preamble pre and question q (ctl: mirza_sim;
-- extra: more body members, e.g. id_slot); the request is sent at once.
local function open(s, pre, q, ctl, extra)
  local b = H.chat_body(q, { stream_options = { include_usage = true },
    chat_template_kwargs = { enable_thinking = false } })
  table.insert(b.messages, 1, { role = "system", content = pre })
  b.mirza_sim = ctl
  for k, v in pairs(extra or {}) do b[k] = v end
  return mirza.open { url = s.url, body = b, stall_timeout = 10 }
end

-- Read a stream to its end: its timings (cache_n, prompt_n, prompt_ms;
-- MTPLX: cache_n from usage) and usage.
local function finish(st)
  local r = H.drain(st, 10)
  st:close()
  assert.equal("done", r.last.type, r.last.message)
  local u = r.last.usage
  return r.last.timings or { cache_n = u.prompt_tokens_details.cached_tokens }, u
end

-- Read a stream up to its first token (its prefill is done).
local function first_token(st)
  for _ = 1, 100 do
    local ev = assert(st:next(10))
    if ev.type == "text" or ev.type == "think" then return end
    assert(ev.type ~= "done" and ev.type ~= "error", ev.type)
  end
  error("no token")
end

-- One request, read to its end: its cache_n.
local function cached(s, pre, q, ctl, extra)
  return (finish(open(s, pre, q, ctl, extra))).cache_n
end

local SLOW = { ttft_ms = 300 } -- a prefill long enough to overlap
local LONG = { tok_rate = 20, answer_tokens = 12 } -- a generation of ~0.6 s

describe("mirza-sim slots", function()
  it("two cold requests of one new preamble started together on two slots both evaluate it", function()
    local s = sim { "--parallel", "2" }
    local a, b = open(s, PRE[1], "qa", SLOW), open(s, PRE[1], "qb", SLOW)
    local ta, ua = finish(a)
    local tb, ub = finish(b)
    assert.same({ 0, 0 }, { ta.cache_n, tb.cache_n })
    assert.same({ ua.prompt_tokens, ub.prompt_tokens }, { ta.prompt_n, tb.prompt_n })
    assert.same({ 0, 0 }, { ua.prompt_tokens_details.cached_tokens, ub.prompt_tokens_details.cached_tokens })
    -- afterwards both slots hold it: two more at once both hit
    local c, d = open(s, PRE[1], "qc", SLOW), open(s, PRE[1], "qd", SLOW)
    assert.is_true(finish(c).cache_n >= PRE_TOKENS)
    assert.is_true(finish(d).cache_n >= PRE_TOKENS)
  end)

  it("--prompt-cache endpoint: the second of two requests started together finds the first's preamble", function()
    local s = sim { "--parallel", "2", "--prompt-cache", "endpoint" }
    local a = open(s, PRE[1], "qa", SLOW)
    mirza.sleep(0.05) -- arrives second
    local b = open(s, PRE[1], "qb", SLOW)
    assert.equal(0, finish(a).cache_n)
    assert.is_true(finish(b).cache_n >= PRE_TOKENS)
    -- any slot, any number of preambles: all of them stay
    for i = 2, 4 do assert.is_true(cached(s, PRE[i], "x") < 10) end -- the JSON around the preamble
    for i = 1, 4 do assert.is_true(cached(s, PRE[i], "y") >= PRE_TOKENS) end
  end)

  it("a warm slot hits: a request sent after the first's first token reuses the preamble", function()
    local s = sim { "--parallel", "1" }
    local a = open(s, PRE[2], "qa", LONG)
    first_token(a)
    local b = open(s, PRE[2], "qb") -- queued until a ends, then on a's slot
    local ta = finish(a)
    local tb, ub = finish(b)
    assert.equal(0, ta.cache_n)
    assert.is_true(tb.cache_n >= PRE_TOKENS and tb.cache_n < ub.prompt_tokens, tostring(tb.cache_n))
    assert.equal(ub.prompt_tokens - tb.cache_n, tb.prompt_n)
  end)

  it("a slot busy generating is not shared: the other idle slot misses", function()
    local s = sim { "--parallel", "2" }
    local a = open(s, PRE[2], "qa", LONG)
    first_token(a)
    assert.equal(0, cached(s, PRE[2], "qb")) -- the other slot, empty
    finish(a)
  end)

  it("a request cancelled during its prefill leaves its slot without its prompt", function()
    local s = sim { "--parallel", "1" }
    assert.equal(0, cached(s, PRE[3], "warm")) -- the slot holds PRE[3]
    local a = open(s, PRE[1], "qa", { ttft_ms = 2000 })
    mirza.sleep(0.2) -- on the slot, prefilling
    a:close()
    mirza.sleep(0.1)
    local n = cached(s, PRE[1], "qb")
    assert.is_true(n < 10, tostring(n)) -- not cached: the prefill never ended
    assert.is_true(cached(s, PRE[1], "qc") >= PRE_TOKENS) -- this one's did
  end)

  it("more preambles than slots: the slot released least recently is evicted", function()
    local s = sim { "--parallel", "2" }
    local a = open(s, PRE[1], "qa", LONG) -- taken first, released last
    first_token(a)
    assert.equal(0, cached(s, PRE[2], "qb")) -- taken second, released first
    finish(a)
    assert.is_true(cached(s, PRE[3], "qc") < 10) -- evicts PRE[2]'s slot, not PRE[1]'s
    assert.is_true(cached(s, PRE[1], "qd") >= PRE_TOKENS)
    assert.is_true(cached(s, PRE[3], "qe") >= PRE_TOKENS)
    assert.is_true(cached(s, PRE[2], "qf") < 10) -- gone
  end)

  it("id_slot names the slot: its prompt, not the best one; modulo the slots; waited for while busy", function()
    local s = sim { "--parallel", "2" }
    assert.equal(0, cached(s, PRE[1], "a", nil, { id_slot = 0 }))
    assert.equal(0, cached(s, PRE[2], "b", nil, { id_slot = 1 }))
    assert.is_true(cached(s, PRE[2], "c", nil, { id_slot = 2 }) < 10) -- 2 % 2: slot 0, holding PRE[1]
    assert.is_true(cached(s, PRE[2], "c2", nil, { id_slot = 4 }) >= PRE_TOKENS) -- slot 0 again: PRE[2] now
    assert.is_true(cached(s, PRE[1], "d", nil, { id_slot = 1 }) < 10) -- slot 1 holds PRE[2]
    assert.is_true(cached(s, PRE[1], "e", nil, { id_slot = -1 }) >= PRE_TOKENS) -- -1: any (slot 1 holds PRE[1])
    -- slot 0 busy: a request naming it waits; one naming none goes to slot 1 meanwhile
    local a = open(s, PRE[3], "f", LONG, { id_slot = 0 })
    first_token(a)
    local t0 = mirza.now()
    local b = open(s, PRE[3], "g", nil, { id_slot = 0 })
    assert.is_true(cached(s, PRE[4], "h") < 10) -- not queued behind b
    assert.is_true(mirza.now() - t0 < 0.3, tostring(mirza.now() - t0))
    finish(a)
    assert.is_true(finish(b).cache_n >= PRE_TOKENS) -- on slot 0, after a
  end)

  it("the MTPLX dialect has no id_slot: the best slot serves", function()
    local s = sim { "--parallel", "2", "--dialect", "mtplx" }
    assert.equal(0, cached(s, PRE[1], "a")) -- the last of the fresh slots: 1
    assert.is_true(cached(s, PRE[1], "b", nil, { id_slot = 0 }) >= PRE_TOKENS) -- slot 1 again
  end)

  it("--prefill-rate: a prefill takes what it evaluates, cached tokens cost nothing", function()
    local s = sim { "--parallel", "1", "--prefill-rate", "2000" } -- ~300 tokens: ~150 ms cold
    local cold, u = finish(open(s, PRE[4], "q1"))
    assert.equal(0, cold.cache_n)
    assert.is_true(cold.prompt_ms >= u.prompt_tokens / 2000 * 1000 - 5, tostring(cold.prompt_ms))
    local warm = finish(open(s, PRE[4], "q2"))
    assert.is_true(warm.cache_n >= PRE_TOKENS)
    assert.is_true(warm.prompt_ms < 60, tostring(warm.prompt_ms)) -- a few tokens: a few ms
    local fast = finish(open(s, PRE[1], "q3", { prefill_rate = 0 })) -- per request: no cost
    assert.is_true(fast.prompt_ms < 60, tostring(fast.prompt_ms))
  end)
end)
