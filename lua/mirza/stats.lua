--- mirza.stats: the per-turn figures of the engine (the seed's, with the
--- server's own figures preferred where they mean the same thing).
---
--- The figures are made from a stream's reducer (mirza.result: started
--- just before the request is sent, fed every event of the turn):
---   ttft_ms         what the user waited: request sent → first delta
---                   (think or text), queueing and prefill included; the
---                   whole duration when no delta came
---   server_ttft_ms  the server's own prompt time, reported apart:
---                   mtplx_stats.ttft_s, else llama timings.prompt_ms
---   tok_s           mtplx decode_tok_s, then tok_s, llama
---                   predicted_per_second, else tokens / decode time
---   tokens          usage.completion_tokens, llama predicted_n, else the
---                   counted deltas, else chars / 4
---   prompt_tokens   usage.prompt_tokens, else llama prompt_n + cache_n
---                   (prompt_n counts only what was evaluated)
---   cached_tokens   usage…cached_tokens, llama cache_n, mtplx cached_tokens
---   session_cache_hit, cache_miss_reason   from mtplx_stats when present
---   mtp_acceptance  accepted / drafted over the MTP depths
local mirza = require "mirza"

local M = {}

-- Sum of an array of numbers (MTP acceptance by depth).
local function sum(a)
  local n = 0
  for _, v in ipairs(type(a) == "table" and a or {}) do n = n + (tonumber(v) or 0) end
  return n
end

local function round1(x)
  return x and math.floor(x * 10 + 0.5) / 10
end

-- JSON null (a lightuserdata) and non-values read as nil.
local function val(v)
  if v == nil or type(v) == "userdata" then return nil end
  return v
end

local function tokens_of(acc, us, tm)
  local n = us.completion_tokens or tm.predicted_n
  if not n or n == 0 then n = acc.deltas > 0 and acc.deltas or acc.chars // 4 end
  return n
end

local function speed_of(acc, st, tm, tokens, t1, total)
  local s = st.decode_tok_s or st.tok_s or tm.predicted_per_second
  if not s or s <= 0 then
    local dt = acc.first and (t1 - acc.first) or total
    s = dt > 0 and tokens / dt or 0
  end
  return s
end

---The figures of a turn (see the module comment).
---@param acc mirza.Reducer
---@return table stats
function M.stats(acc)
  local fin = acc.final or {}
  local st, tm, us = fin.stats or {}, fin.timings or {}, fin.usage or {}
  local t1 = acc.t1 or mirza.now()
  local total = t1 - acc.t0
  local ttft = acc.first and (acc.first - acc.t0) * 1000 or total * 1000
  local server_ttft = (st.ttft_s and st.ttft_s * 1000) or tm.prompt_ms
  local tokens = tokens_of(acc, us, tm)
  local prompt = us.prompt_tokens or (tm.prompt_n and tm.prompt_n + (tm.cache_n or 0))
  local drafted = sum(st.drafted_by_depth)
  return {
    ttft_ms = round1(ttft),
    server_ttft_ms = round1(server_ttft),
    tok_s = round1(speed_of(acc, st, tm, tokens, t1, total)),
    live_tok_s = acc.live_tok_s,
    tokens = tokens,
    prompt_tokens = prompt,
    kv_tokens = (prompt or 0) + tokens,
    cached_tokens = (us.prompt_tokens_details or {}).cached_tokens or tm.cache_n or st.cached_tokens,
    session_cache_hit = val(st.session_cache_hit),
    cache_miss_reason = val(st.cache_miss_reason),
    mtp_acceptance = drafted > 0 and sum(st.accepted_by_depth) / drafted or nil,
    duration_s = total,
    finish_reason = fin.finish_reason,
    error = fin.type == "error" and fin.code or nil,
  }
end

return M
