-- mirza-sim's per-slot prefix cache (issue 18, contract 3; issue 32: the
-- default --prompt-cache slots): each of the --parallel slots keeps the
-- last prompt it served (once its prefill was done); a request gets the
-- free slot sharing the longest prefix with it (more than a tenth of it, as
-- llama-server's --slot-prompt-similarity 0.1), else the least recently
-- released one, and reports that prefix (4 bytes a token) as cached tokens
-- in usage, llama's timings.cache_n and mtplx_stats. MTPLX session ids keep
-- their own cache, as before. Requests one at a time here; concurrent ones,
-- id_slot, --prompt-cache endpoint and --prefill-rate: sim_slots_spec.
local mirza = require "mirza"
local H = require "tests.helper"
local json = mirza.json

local PRE = {}
for i, word in ipairs { "alpha", "bravo", "charlie", "delta" } do PRE[i] = string.rep(word .. " is the rule. ", 60) end

local function body(pre, q, extra)
  local b = H.chat_body(q, { stream = false })
  table.insert(b.messages, 1, { role = "system", content = pre })
  for k, v in pairs(extra or {}) do b[k] = v end
  return b
end

-- A non-streamed chat: the decoded answer and its cached tokens.
local function chat(sim, pre, q, headers)
  local raw = assert(mirza.request { url = sim.url, body = body(pre, q), headers = headers, timeout = 10 })
  local r = json.decode(raw)
  return r.usage.prompt_tokens_details.cached_tokens, r
end

local sims = {}
teardown(function() for _, s in pairs(sims) do s.stop() end end)
local function sim(name, args)
  if not sims[name] then
    local argv = { "--tok-rate", "0", "--ttft-ms", "0", "--quiet" }
    for _, a in ipairs(args) do argv[#argv + 1] = a end
    sims[name] = H.start_sim(argv)
  end
  return sims[name]
end

describe("mirza-sim prefix cache (llama)", function()
  it("two slots keep two preambles; a third evicts the least recently used", function()
    local s = sim("llama2", { "--dialect", "llama", "--parallel", "2" })
    local pre_tokens = #PRE[1] // 4
    assert.equal(0, (chat(s, PRE[1], "q1")))
    assert.is_true(chat(s, PRE[2], "q1") < 10) -- a free slot, not the one holding PRE[1]
    assert.is_true(chat(s, PRE[2], "q1b") >= pre_tokens) -- its slot, not the least recently used
    local hit, r = chat(s, PRE[1], "q2")
    assert.is_true(hit >= pre_tokens and hit < r.usage.prompt_tokens, hit .. " / " .. r.usage.prompt_tokens)
    assert.equal(hit, r.timings.cache_n)
    assert.equal(r.usage.prompt_tokens - hit, r.timings.prompt_n)
    assert.is_true(chat(s, PRE[2], "q2") >= #PRE[2] // 4)
    assert.is_true(chat(s, PRE[3], "q") < 10) -- evicts the least recently used slot: PRE[1]'s
    assert.is_true(chat(s, PRE[1], "q3") < 10) -- PRE[1] is gone; it takes PRE[2]'s slot, now the older
    assert.is_true(chat(s, PRE[3], "q4") >= #PRE[3] // 4) -- PRE[3] stayed
    assert.is_true(chat(s, PRE[2], "q3") < 10) -- PRE[2] was evicted
  end)

  it("the same prompt again: all of it cached but the last token; streamed usage says the same", function()
    local s = sim("llama1", { "--dialect", "llama" })
    chat(s, PRE[4], "same")
    local hit, r = chat(s, PRE[4], "same")
    assert.equal(r.usage.prompt_tokens - 1, hit)
    local res = assert(mirza.collect { url = s.url, timeout = 10,
      body = body(PRE[4], "same", { stream = true, stream_options = { include_usage = true } }) })
    assert.equal(hit, res.usage.prompt_tokens_details.cached_tokens)
    assert.equal(hit, res.timings.cache_n)
  end)

  it("session ids mean nothing to llama-server: the slot's cache serves every client", function()
    local s = sim("llama-sess", { "--dialect", "llama" })
    chat(s, PRE[1], "x", { ["X-MTPLX-Session-Id"] = "one" })
    local hit, r = chat(s, PRE[1], "x", { ["X-MTPLX-Session-Id"] = "two" })
    assert.equal(r.usage.prompt_tokens - 1, hit)
  end)

  it("4 preambles over two sims: affinity keeps them cached, one sim for all evicts them", function()
    local a = sim("aff-a", { "--dialect", "llama", "--parallel", "2" })
    local b = sim("aff-b", { "--dialect", "llama", "--parallel", "2" })
    local function share(route)
      local cached, prompt = 0, 0
      for round = 1, 10 do
        for i = 1, 4 do
          local c, r = chat(route(i), PRE[i], ("round %d"):format(round))
          cached, prompt = cached + c, prompt + r.usage.prompt_tokens
        end
      end
      return cached / prompt
    end
    local with = share(function(i) return i <= 2 and a or b end)
    local single = sim("aff-single", { "--dialect", "llama", "--parallel", "2" })
    local without = share(function() return single end)
    io.write(("\ncached share of the prompt tokens, 4 preambles x 10 rounds: %.0f%% with affinity (two sims), " ..
      "%.0f%% on one sim\n"):format(with * 100, without * 100))
    assert.is_true(with > 0.7, tostring(with)) -- every round after the first
    assert.is_true(without < 0.1, tostring(without)) -- LRU evicts the one needed next
  end)
end)

describe("mirza-sim prefix cache (mtplx)", function()
  it("a sessionless request is served from the slot cache; mtplx_stats says so", function()
    local s = sim("mtplx", {})
    local miss, r0 = chat(s, PRE[2], "q")
    local st0 = r0.mtplx_stats
    assert.same({ 0, "no_session", false }, { miss, st0.cache_miss_reason, st0.session_cache_hit })
    local hit, r = chat(s, PRE[2], "q2")
    assert.is_true(hit >= #PRE[2] // 4)
    local st = r.mtplx_stats
    assert.same({ hit, true, "ram", json.null }, { st.cached_tokens, st.session_cache_hit, st.cache_source,
      st.cache_miss_reason })
    assert.equal(r.usage.prompt_tokens - hit, st.new_prefill_tokens)
    -- /admin/cache/clear forgets the slots too
    assert(mirza.request { url = s.base .. "/admin/cache/clear", method = "POST", body = "{}" })
    assert.equal(0, (chat(s, PRE[2], "q2")))
  end)

  it("a session keeps its own cache, whatever the slot served in between", function()
    local s = sim("mtplx-sess", {})
    local h = { ["X-MTPLX-Session-Id"] = "conv" }
    chat(s, PRE[3], "first", h)
    chat(s, PRE[1], "other") -- the only slot now holds PRE[1]
    local hit, r = chat(s, PRE[3], "second", h)
    assert.is_true(hit >= #PRE[3] // 4, tostring(hit))
    assert.same({ "conv", "header.x-mtplx-session-id" }, { r.mtplx_stats.session_id,
      r.mtplx_stats.request_session_source })
    assert.is_true(chat(s, PRE[1], "again") < 10) -- the session's turn went through the slot too
  end)
end)
