-- A batch finds each server's load by itself (issue 41 items 1, 4, 6),
-- against mirza-sim in llama-server's dialect: the default reads /props
-- total_slots as the ceiling and climbs past the old fixed 4, `@4` stays 4,
-- a pool of a 16-slot and a 4-slot server gets each one's share so that
-- both finish together, and the progress line and the summary say each
-- endpoint's limit and how it was found.
local mirza = require "mirza"
local pool = require "mirza.pool"
local batch = require "mirza.batch"
local json = mirza.json
local H = require "tests.helper"

-- n items of 20 tokens.
local function items(n)
  local path, lines = H.tmpname(".jsonl"), {}
  for i = 1, n do
    lines[i] = json.encode { custom_id = "q" .. i, prompt = "question " .. i, max_tokens = 20 }
  end
  H.write_file(path, table.concat(lines, "\n") .. "\n")
  return path
end

local function llama(parallel)
  return H.start_sim { "--dialect", "llama", "--parallel", tostring(parallel), "--tok-rate", "50", "--ttft-ms", "100",
    "--quiet" }
end

-- Run a batch over pool p: its stats, the progress lines, and when each endpoint answered last.
local function run(p, input)
  local lines, last = {}, {}
  local report = p.report
  p.report = function(self, e, r, ...)
    last[e] = mirza.now()
    return report(self, e, r, ...)
  end
  local t0 = mirza.now()
  local st = assert(batch.run { input = input, output = H.tmpname(".jsonl"), pool = p, model = "m", quiet = true,
    progress = true, progress_every = 0.2, log = function(line) if line ~= "" then lines[#lines + 1] = line end end })
  for e, t in pairs(last) do last[e] = t - t0 end
  return st, lines, last
end

describe("batch limits", function()
  local sims = {}
  after_each(function()
    for _, s in ipairs(sims) do s.stop() end
    sims = {}
    collectgarbage("collect")
  end)

  it("climbs past 4 on a 16-slot server, under the ceiling /props announces", function()
    local sim = llama(16)
    sims[1] = sim
    local p = pool.new { sim.base }
    local st, lines = run(p, items(160))
    local e = p.endpoints[1]
    print(("\n  16 slots: peak %d, limit %d (%s), %.2f s"):format(e.peak, e.limit, e.limiter.why, st.elapsed))
    assert.equal(160, st.done_now)
    assert.equal(0, st.errors)
    assert.equal(16, e.limiter.ceiling)
    assert.is_true(e.peak > 4 and e.peak <= 17, "peak " .. e.peak) -- at the ceiling, one more waits at the server
    assert.is_true(e.limit > 4, "limit " .. e.limit)
    assert.truthy(lines[#lines]:find("; limit %d+[a-z1 ]* %(auto, ceiling 16 from /props total_slots%)"), lines[#lines])
    local summary = batch.summary(st, "o.jsonl")
    assert.truthy(summary:find("\nbatch: " .. sim.base .. "/v1: settled on limit %d+[a-z1 ]* %(auto, ceiling 16"
      .. " from /props"
      .. " total_slots%); at most %d+ in flight, 160 served"), summary)
  end)

  it("measures the start's rounds by the server's step: a 64-slot server whose step grows with its batch", function()
    local sim = H.start_sim { "--dialect", "llama", "--parallel", "64", "--step-growth", "vllm", "--tok-rate", "50",
      "--ttft-ms", "0", "--reasoning-tokens", "0", "--quiet" }
    sims[1] = sim
    local p = pool.new { sim.base }
    local at64, first_done -- when the endpoint's limit came to 64, and when the first answer ended
    local follow, report = p._follow, p.report
    p._follow = function(self, e)
      follow(self, e)
      if e.limit >= 64 then at64 = at64 or mirza.now() end
    end
    p.report = function(self, ...)
      first_done = first_done or mirza.now()
      return report(self, ...)
    end
    local st = run(p, items(64))
    local l = p.endpoints[1].limiter
    assert.equal(64, st.done_now)
    -- 16 -> 32 -> 64 at the steps (~0.15 s), before any answer of 20 tokens (~0.5 s) ended
    assert.is_true(at64 and at64 < first_done, ("64 at %s, first answer at %s"):format(at64, first_done))
    assert.is_true(#l.rounds >= 2, "rounds " .. #l.rounds)
    for i, r in ipairs(l.rounds) do -- every round's requests told their steps: its rate is load / step
      assert.is_number(r.rate, "round " .. i .. " has no rate")
      -- the step at 16-64 sequences: 24-36 ms (20 ms + 0.25 ms a sequence), read as it came
      local step = r.load / r.rate
      assert.is_true(step > 0.015 and step < 0.2, ("round %d: step %.3f s at %d"):format(i, step, r.load))
    end
  end)

  it("refuses a limit below 1 before anything is sent (exit status 2)", function()
    local script = H.source .. "/scripts/batch.lua"
    for _, case in ipairs {
      { { "--limit", "0" }, "batch: --limit needs a whole number >= 1" },
      { { "--limit", "2.5" }, "batch: --limit needs a whole number >= 1" },
      { { "--endpoint", "http://127.0.0.1:1@0" }, "batch: http://127.0.0.1:1@0: N must be 1 or more" },
    } do
      local args = { items(1), H.tmpname(".jsonl"), table.unpack(case[1]) }
      for i, a in ipairs(args) do args[i] = ("%q"):format(a) end
      local cli = H.spawn_mirza(("arg = { [0] = %q, %s }\ndofile(%q)\n"):format(script, table.concat(args, ", "),
        script))
      assert.equal(2, cli.wait(20))
      assert.truthy(cli.output():find(case[2], 1, true), cli.output())
    end
  end)

  it("keeps @4 at 4", function()
    local sim = llama(16)
    sims[1] = sim
    local p = pool.new { { url = sim.base, limit = 4 } }
    local st, lines = run(p, items(40))
    local e = p.endpoints[1]
    assert.equal(4, e.peak)
    assert.equal(4, e.limit)
    assert.is_nil(e.limiter)
    assert.truthy(lines[#lines]:find("; @4 fixed", 1, true), lines[#lines])
    assert.truthy(batch.summary(st):find(": @4 fixed; at most 4 in flight, 40 served", 1, true))
  end)

  it("polls a server's queue where its /metrics counts it (vLLM's num_requests_waiting)", function()
    local sim = H.start_sim { "--parallel", "8", "--vllm-metrics", "--tok-rate", "50", "--ttft-ms", "100", "--quiet" }
    sims[1] = sim
    local p = pool.new { sim.base }
    local polls, seen = 0, 0
    local server_waiting = p.server_waiting
    p.server_waiting = function(self, e, n)
      polls, seen = polls + 1, math.max(seen, n)
      return server_waiting(self, e, n)
    end
    local st = run(p, items(120))
    local e = p.endpoints[1]
    local msg = ("%d polls, at most %d waiting; peak %d, limit %d (%s), %.2f s"):format(polls, seen, e.peak, e.limit,
      e.limiter.why, st.elapsed)
    print("\n  " .. msg)
    assert.equal(120, st.done_now)
    assert.equal("vllm", e.metrics)
    assert.is_true(polls >= 2, msg)
    assert.is_true(e.limit <= 10, msg) -- 8 sequences at most: the rest waits
  end)

  it("gives a 16-slot and a 4-slot server each its share: both finish within 10 % of each other", function()
    sims[1], sims[2] = llama(16), llama(4)
    local p = pool.new { sims[1].base, sims[2].base }
    local st, lines, last = run(p, items(400))
    local a, b = p.endpoints[1], p.endpoints[2]
    local ta, tb = last[a], last[b]
    local msg = ("16 slots: %d served, peak %d, last at %.2f s; 4 slots: %d served, peak %d, last at %.2f s; %.2f s")
      :format(a.served, a.peak, ta, b.served, b.peak, tb, st.elapsed)
    print("\n  " .. msg)
    assert.equal(400, st.done_now)
    assert.is_true(math.abs(ta - tb) <= 0.1 * math.max(ta, tb), msg)
    assert.is_true(a.served > 2 * b.served, msg)
    assert.is_true(b.peak <= 8, msg) -- the 4-slot one: never far past its slots
    local ceiling4 = sims[2].base .. "/v1 limit %d+[a-z1 ]* %(auto, ceiling 4 from /props total_slots%)"
    assert.truthy(lines[#lines]:find(ceiling4), lines[#lines])
  end)
end)
