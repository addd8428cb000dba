-- mirza.stats: every figure from the server when it sends it, and each
-- fallback when it does not (synthetic accumulators: exact values).
local stats = require "mirza.stats"
local json = require("mirza").json

-- An accumulator: request sent at 100 s, first delta at `first`, end at 104 s.
local function acc(final, first, deltas, chars)
  return { t0 = 100, first = first, t1 = 104, deltas = deltas or 0, chars = chars or 0, final = final }
end

describe("mirza.stats", function()
  it("TTFT is request sent → first delta (queue included); the server's prompt time apart", function()
    local st = stats.stats(acc({ type = "done", timings = { prompt_ms = 4.2, predicted_n = 10 } }, 102.5, 10))
    assert.equal(2500, st.ttft_ms)
    assert.equal(4.2, st.server_ttft_ms)
    st = stats.stats(acc({ type = "done", stats = { ttft_s = 0.62 }, timings = { prompt_ms = 9 } }, 101, 3))
    assert.equal(1000, st.ttft_ms)
    assert.equal(620, st.server_ttft_ms) -- mtplx_stats first
    st = stats.stats(acc({ type = "done" }, nil, 0))
    assert.equal(4000, st.ttft_ms) -- no delta: the whole duration
    assert.is_nil(st.server_ttft_ms)
  end)

  it("tok_s: decode_tok_s, then tok_s, then predicted_per_second, then tokens / decode time", function()
    local fin = { type = "done", stats = { decode_tok_s = 54.14, tok_s = 40 }, timings = { predicted_per_second = 30 },
      usage = { completion_tokens = 20 } }
    assert.equal(54.1, stats.stats(acc(fin, 102)).tok_s)
    fin.stats.decode_tok_s = nil
    assert.equal(40, stats.stats(acc(fin, 102)).tok_s)
    fin.stats = nil
    assert.equal(30, stats.stats(acc(fin, 102)).tok_s)
    fin.timings = nil
    assert.equal(10, stats.stats(acc(fin, 102)).tok_s) -- 20 tokens in 2 s after the first
    assert.equal(5, stats.stats(acc(fin, nil)).tok_s) -- no delta: over the whole 4 s
  end)

  it("tokens: usage, then predicted_n, then counted deltas, then chars / 4", function()
    assert.equal(7, stats.stats(acc({ type = "done", usage = { completion_tokens = 7 }, timings = { predicted_n = 9 } },
      101, 3)).tokens)
    assert.equal(9, stats.stats(acc({ type = "done", timings = { predicted_n = 9 } }, 101, 3)).tokens)
    assert.equal(3, stats.stats(acc({ type = "done" }, 101, 3, 40)).tokens)
    assert.equal(10, stats.stats(acc({ type = "done" }, nil, 0, 41)).tokens)
  end)

  it("counts the deltas a merged event joins", function()
    local result = require "mirza.result"
    local a = result.new()
    result.feed(a, { type = "think", text = "abc" })
    result.feed(a, { type = "text", text = "Un deux trois", deltas = 3 })
    result.feed(a, { type = "done" })
    assert.equal(4, a.deltas)
    assert.equal(16, a.chars)
    assert.equal(4, stats.stats(a).tokens)
  end)

  it("prompt tokens: usage, else llama prompt_n + cache_n; kv and cached tokens", function()
    local st = stats.stats(acc({ type = "done", usage = { prompt_tokens = 100, completion_tokens = 5,
      prompt_tokens_details = { cached_tokens = 64 } }, timings = { cache_n = 1 } }, 101))
    assert.same({ 100, 105, 64 }, { st.prompt_tokens, st.kv_tokens, st.cached_tokens })
    st = stats.stats(acc({ type = "done", timings = { prompt_n = 12, cache_n = 88, predicted_n = 4 } }, 101))
    assert.same({ 100, 104, 88 }, { st.prompt_tokens, st.kv_tokens, st.cached_tokens })
    st = stats.stats(acc({ type = "done", stats = { cached_tokens = 33 }, usage = { completion_tokens = 2 } }, 101))
    assert.same({ 33, 2 }, { st.cached_tokens, st.kv_tokens })
    assert.is_nil(st.prompt_tokens)
  end)

  it("session cache figures, MTP acceptance, finish and error", function()
    local st = stats.stats(acc({ type = "done", finish_reason = "stop", stats = { session_cache_hit = true,
      cache_miss_reason = json.null, accepted_by_depth = { 6, 3, 1 }, drafted_by_depth = { 8, 6, 6 } } }, 101))
    assert.same({ true, nil, 0.5, "stop" },
      { st.session_cache_hit, st.cache_miss_reason, st.mtp_acceptance, st.finish_reason })
    st = stats.stats(acc({ type = "done",
      stats = { session_cache_hit = false, cache_miss_reason = "policy_mismatch" } }, 101))
    assert.same({ false, "policy_mismatch" }, { st.session_cache_hit, st.cache_miss_reason })
    st = stats.stats(acc({ type = "error", code = "exited" }, 101))
    assert.same({ "exited", nil, nil }, { st.error, st.mtp_acceptance, st.session_cache_hit })
  end)
end)
