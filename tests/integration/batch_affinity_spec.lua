-- Batch items and the daemons' prompt cache (issue 18 item 6): each
-- record carries the prompt tokens and the cached tokens its daemon
-- reported (llama.cpp's timings.cache_n and usage...cached_tokens, MTPLX's
-- mtplx_stats), the summary line the share served from cache (only when
-- a daemon reported it); items sharing a long preamble, over two
-- mirza-sims with a cache per slot, go where their preamble went last:
-- most of their prompt tokens come from cache, far more than with
-- --no-affinity (least loaded), and the CLI takes --no-affinity and
-- --schema.
local mirza = require "mirza"
local batch = require "mirza.batch"
local json = mirza.json
local H = require "tests.helper"

local SCRIPT = H.source .. "/scripts/batch.lua"

-- A preamble of about `tokens` tokens (4 bytes each), distinct from its first byte.
local function preamble(k, tokens)
  local words, n = { ("Document %d."):format(k) }, 0
  while n < tokens * 4 do
    words[#words + 1] = ("w%d-%d"):format(k, #words)
    n = n + #words[#words] + 1
  end
  return table.concat(words, " ")
end

-- Lines: `np` preambles x `nq` questions, in turn (d1 d2 ... d1 d2 ...),
-- or shuffled in a fixed order (in turn, a pool of 4 slots answering in
-- order keeps each of 4 preambles on its slot by chance).
local function lines(np, nq, shuffled)
  local out = {}
  for q = 1, nq do
    for k = 1, np do
      out[#out + 1] = { custom_id = ("d%d-q%d"):format(k, q), system = preamble(k, 500),
        prompt = ("Question %d?"):format(q), max_tokens = 4, mirza_sim = { answer_tokens = 4 } }
    end
  end
  local x = 12345
  for i = shuffled and #out or 0, 2, -1 do -- Fisher-Yates on a fixed linear congruential sequence
    x = (x * 1103515245 + 12345) % 2147483648
    local j = x % i + 1
    out[i], out[j] = out[j], out[i]
  end
  return out
end

local function write_input(ls)
  local input = H.tmpname(".jsonl")
  local f = assert(io.open(input, "wb"))
  for _, l in ipairs(ls) do f:write(json.encode(l), "\n") end
  f:close()
  return input
end

local function records(output)
  local by = {}
  local fh = io.open(output)
  for l in fh and fh:lines() or function() end do
    local r = assert(json.decode(l))
    by[r.custom_id] = r
  end
  if fh then fh:close() end
  return by
end

local FAST = { "--tok-rate", "0", "--ttft-ms", "0", "--dialect", "llama", "--context-window", "100000" }

local function sim_with(more)
  local args = { table.unpack(FAST) }
  for _, a in ipairs(more or {}) do args[#args + 1] = a end
  return H.start_sim(args)
end

describe("batch and the prompt cache", function()
  it("records each item's cached tokens and says the share served from cache in the summary", function()
    local sim = sim_with { "--parallel", "1" }
    local input, output = write_input(lines(1, 3)), H.tmpname(".jsonl")
    local st = assert(batch.run { input = input, output = output, endpoints = { sim.base }, limit = 1, model = "m",
      quiet = true, progress = false })
    local by = records(output)
    sim.stop()
    local cached, prompt = 0, 0
    for q = 1, 3 do
      local m = by["d1-q" .. q].mirza
      assert.is_number(m.cached_tokens)
      assert.is_number(m.prompt_tokens)
      cached, prompt = cached + m.cached_tokens, prompt + m.prompt_tokens
      if q > 1 then assert.is_true(m.cached_tokens >= 490, "q" .. q .. ": " .. m.cached_tokens) end -- the preamble
    end
    assert.same({ cached, prompt }, { st.cached_tokens, st.cache_prompt_tokens })
    local pct = ("%.0f%%"):format(cached / prompt * 100)
    assert.truthy(batch.summary(st):find("prompt tokens served from cache: " .. pct, 1, true), batch.summary(st))
    -- a daemon that says nothing of its cache: no such words
    st.cached_tokens, st.cache_prompt_tokens = 0, 0
    assert.is_nil(batch.summary(st):find("from cache", 1, true))
    os.remove(input)
    os.remove(output)
  end)

  it("reads MTPLX's figures too (a session's cached prefix)", function()
    local sim = H.start_sim { "--tok-rate", "0", "--ttft-ms", "0" } -- MTPLX dialect
    local ls = lines(1, 2)
    for _, l in ipairs(ls) do l.metadata = { session_id = "s1" } end
    local input, output = write_input(ls), H.tmpname(".jsonl")
    assert(batch.run { input = input, output = output, endpoints = { sim.base }, limit = 1, model = "m", quiet = true,
      progress = false })
    local by = records(output)
    sim.stop()
    assert.is_true(by["d1-q2"].mirza.cached_tokens >= 490)
    os.remove(input)
    os.remove(output)
  end)

  it("keeps a preamble on the daemon that holds it: most prompt tokens cached, far more than without affinity",
    function()
      local sims = { sim_with { "--parallel", "2" }, sim_with { "--parallel", "2" } }
      local bases = { sims[1].base, sims[2].base }
      local input = write_input(lines(4, 20, true))
      local share, where = {}, {}
      for _, on in ipairs { true, false } do
        local output = H.tmpname(".jsonl")
        local st = assert(batch.run { input = input, output = output, endpoints = bases, limit = 2, model = "m",
          quiet = true, progress = false, affinity = on })
        assert.same({ 80, 0 }, { st.done_now, st.errors })
        share[on] = batch.cached_share(st)
        local by = records(output)
        local per = {}
        for id, r in pairs(by) do
          local d = id:match("^(d%d)")
          per[d] = per[d] or {}
          per[d][r.mirza.endpoint] = (per[d][r.mirza.endpoint] or 0) + 1
        end
        where[on] = per
        os.remove(output)
      end
      for _, s in ipairs(sims) do s.stop() end
      os.remove(input)
      assert.is_true(share[true] >= 0.6, ("with affinity: %.2f"):format(share[true]))
      assert.is_true(share[true] >= share[false] + 0.2, ("%.2f with, %.2f without"):format(share[true],
        share[false]))
      -- with affinity each preamble is served mostly by one daemon (the last items may spread)
      local on_one = 0
      for _, per in pairs(where[true]) do
        local most = 0
        for _, n in pairs(per) do most = math.max(most, n) end
        on_one = on_one + most
      end
      assert.is_true(on_one >= 60, on_one .. " of 80 items on their preamble's usual daemon")
    end)

  it("evaluates each preamble once on servers that cache a prompt per slot once prefilled (issue 32's shape)",
    function()
      -- two servers of 2 slots, 4 preambles x 8 questions, shuffled, a prefill
      -- of 5,000 tokens/s: the first item of a preamble goes alone, the others
      -- follow its first token on its slot (never a second cold copy beside it)
      local more = { "--parallel", "2", "--prompt-cache", "slots", "--prefill-rate", "5000" }
      local sims = { sim_with(more), sim_with(more) }
      local input, output = write_input(lines(4, 8, true)), H.tmpname(".jsonl")
      local st = assert(batch.run { input = input, output = output, endpoints = { sims[1].base, sims[2].base },
        limit = 2, model = "m", quiet = true, progress = false })
      for _, s in ipairs(sims) do s.stop() end
      assert.same({ 32, 0 }, { st.done_now, st.errors })
      local cold = {}
      for id, r in pairs(records(output)) do
        if r.mirza.cached_tokens < 400 then cold[#cold + 1] = id end -- its preamble (~500 tokens) evaluated
      end
      table.sort(cold)
      assert.equal(4, #cold, "preambles evaluated: " .. table.concat(cold, " "))
      assert.is_true(batch.cached_share(st) >= 0.85, ("%.2f"):format(batch.cached_share(st)))
      os.remove(input)
      os.remove(output)
    end)

  it("takes --no-affinity and --schema on the command line", function()
    local sim = sim_with { "--parallel", "2" }
    local schema = H.tmpname(".json")
    local f = assert(io.open(schema, "wb"))
    f:write('{"type": "object", "required": ["n"], "properties": {"n": {"type": "integer"}}}')
    f:close()
    local ls = lines(1, 2)
    for _, l in ipairs(ls) do l.max_tokens, l.mirza_sim = nil, nil end -- room for the whole JSON answer
    local input, output, err = write_input(ls), H.tmpname(".jsonl"), H.tmpname(".err")
    local cmd = table.concat({ H.q(H.mirza_bin), H.q(SCRIPT), H.q(input), H.q(output), "--endpoint", H.q(sim.base),
      "--model", "m", "--no-affinity", "--schema", H.q(schema), "--progress-every", "100" }, " ")
    local ok = os.execute(cmd .. " 2>" .. H.q(err))
    local by, e = records(output), H.read_file(err)
    sim.stop()
    assert.is_true(ok == true, e)
    assert.truthy(e:find("prompt tokens served from cache: %d+%%"), e)
    local v = by["d1-q1"].response.body.mirza.value
    assert.equal("integer", math.type(v.n))
    for _, p in ipairs { input, output, err, schema } do os.remove(p) end
  end)
end)
