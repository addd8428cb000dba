-- mirza-sim's decode step that grows with the batch (issue 41 item 5):
-- with --step-growth every generating sequence's token takes base + A*m +
-- B*m^2 ms (m = n - KNEE, n the sequences generating), so the aggregate
-- rate of the h100 preset peaks near 16 and falls past it, a sequence
-- joining or leaving changes the others' pace at once, and without the
-- option each stream keeps --tok-rate whatever the others do. And
-- --vllm-metrics: vLLM's /metrics gauges. Rates are measured over real
-- HTTP by counting the tokens received in a window once every stream of
-- the batch is generating (its first token in).
local mirza = require "mirza"
local H = require "tests.helper"

local sims = {}
teardown(function() for _, s in pairs(sims) do s.stop() end end)

local function sim(args)
  local argv = { "--dialect", "llama", "--ttft-ms", "0", "--reasoning-tokens", "0", "--answer-tokens", "100000",
    "--quiet" }
  for _, a in ipairs(args) do argv[#argv + 1] = a end
  local s = H.start_sim(argv)
  sims[#sims + 1] = s
  return s
end

-- n streams of endless answers; counts[i]: the tokens stream i has had.
local function batch(s, n)
  local b = { streams = {}, counts = {} }
  for i = 1, n do
    b.streams[i] = mirza.open { url = s.url, body = H.chat_body("step " .. i), stall_timeout = 20 }
    b.counts[i] = 0
  end
  -- read what has come, for up to `secs` (0: what is there now)
  function b.pump(secs)
    local deadline = mirza.now() + secs
    repeat
      mirza.wait(math.max(0, math.min(0.02, deadline - mirza.now())))
      for i, st in ipairs(b.streams) do
        for _ = 1, 100000 do
          local ev = st:next(0)
          if not ev then break end
          assert(ev.type ~= "error", ev.message)
          if ev.type == "text" then b.counts[i] = b.counts[i] + (ev.deltas or 1) end
        end
      end
    until mirza.now() >= deadline
  end
  function b.started()
    return H.wait_for(function()
      b.pump(0)
      for i = 1, #b.streams do if b.counts[i] == 0 then return false end end
      return true
    end, 10, 0.01)
  end
  -- tokens/s of the streams i..j (all by default) over `secs`
  function b.rate(secs, i, j)
    i, j = i or 1, j or #b.streams
    local function sum() local t = 0; for k = i, j do t = t + b.counts[k] end; return t end
    b.pump(0)
    local t0, c0 = mirza.now(), sum()
    b.pump(secs)
    return (sum() - c0) / (mirza.now() - t0)
  end
  function b.close(from)
    for i = #b.streams, from or 1, -1 do b.streams[i]:close(); b.streams[i] = nil end
  end
  return b
end

-- The aggregate tokens/s of n streams generating together.
local function aggregate(s, n, secs)
  local b = batch(s, n)
  finally(b.close)
  assert.is_true(b.started(), "the streams did not all start")
  local r = b.rate(secs)
  b.close()
  return r
end

describe("mirza-sim --step-growth", function()
  it("h100: the aggregate rate rises from 1 to 16 in flight and falls past it", function()
    local s = sim { "--parallel", "256", "--step-growth", "h100" }
    local r1, r16, r64 = aggregate(s, 1, 0.6), aggregate(s, 16, 0.8), aggregate(s, 64, 0.8)
    -- the curve: 256 tokens/s at 1, about 1,590 at 16, 1,460 at 64
    assert.is_true(r1 > 200 and r1 < 300, tostring(r1))
    assert.is_true(r16 > 4 * r1, ("@1 %.0f, @16 %.0f"):format(r1, r16))
    assert.is_true(r64 < 0.97 * r16, ("@16 %.0f, @64 %.0f"):format(r16, r64))
    assert.is_true(r64 > 0.8 * r16, ("@16 %.0f, @64 %.0f"):format(r16, r64))
  end)

  it("a sequence joining or leaving the batch changes the others' pace at once", function()
    -- base 5 ms + 1 ms a sequence: 6 ms a token alone (167/s), 69 ms with 64 (14.5/s)
    local s = sim { "--parallel", "64", "--tok-rate", "200", "--step-growth", "1" }
    local one = batch(s, 1)
    finally(one.close)
    assert.is_true(one.started())
    local alone = one.rate(0.4)
    local more = batch(s, 63)
    finally(more.close)
    assert.is_true(more.started(), "the 63 did not start")
    local crowded = one.rate(0.5)
    more.close()
    local after = one.rate(0.4)
    assert.is_true(alone > 140 and alone < 190, tostring(alone))
    assert.is_true(crowded > 10 and crowded < 20, tostring(crowded))
    assert.is_true(after > 140, tostring(after))
  end)

  it("a token already awaited comes later when the batch grows, sooner when it shrinks", function()
    -- base 1 s + 50 ms a sequence: 1.05 s a step alone, 4.2 s with 64
    local s = sim { "--parallel", "64", "--tok-rate", "1", "--step-growth", "50", "--metrics" }
    local one = batch(s, 1)
    finally(one.close)
    assert.is_true(one.started())
    local t0 = mirza.now() -- its first token; the second is due at t0 + 1.05 s alone
    local more = batch(s, 63)
    finally(more.close)
    -- the 63 are in the batch once the server runs them (their first tokens come a 4.2 s step later)
    local capacity = require "mirza.capacity"
    assert.is_true(H.wait_for(function()
      local _, running = capacity.waiting(s.url, "llama")
      return running == 64
    end, 10, 0.01), "the 63 did not start")
    assert.is_true(mirza.now() - t0 < 0.5, "the 63 took too long to start: this case cannot tell")
    one.pump(t0 + 1.5 - mirza.now())
    assert.equal(1, one.counts[1]) -- 4.2 s a step from the joins on: not before t0 + 3 s
    more.close() -- about 0.45 of a step made: the rest at 1.05 s a step, near t0 + 2.1 s
    one.pump(t0 + 2.6 - mirza.now())
    assert.equal(2, one.counts[1])
  end)

  it("a first token comes with the end of the step its prompt joined: later the fuller the batch", function()
    -- base 100 ms + 20 ms a sequence: 120 ms a step alone, 740 ms with 32
    local s = sim { "--parallel", "64", "--tok-rate", "10", "--step-growth", "20" }
    local function ttft()
      local st <close> = mirza.open { url = s.url, body = H.chat_body("first") }
      local t0 = mirza.now()
      repeat
        local ev = st:next(10) -- its next event, the others' transfers driven meanwhile
        assert(ev and ev.type ~= "error", ev and ev.message or "no first token in 10 s")
      until ev.type == "text"
      return mirza.now() - t0
    end
    local alone = ttft()
    local crowd = batch(s, 31)
    finally(crowd.close)
    assert.is_true(crowd.started(), "the 31 did not start")
    local crowded = ttft()
    assert.is_true(alone > 0.1 and alone < 0.35, tostring(alone))
    assert.is_true(crowded > 0.6, ("alone %.3f s, beside 31 %.3f s"):format(alone, crowded))
  end)

  it("without it a stream keeps --tok-rate whatever the others do; with --tok-rate 0 it is flat out", function()
    -- 16 at once: 3,200 tokens/s, which the sanitizer build's sim and
    -- client keep up with on 2 cores (64, 12,800/s, measured the machine)
    local s = sim { "--parallel", "64", "--tok-rate", "200" }
    local b = batch(s, 16)
    finally(b.close)
    assert.is_true(b.started())
    local r = b.rate(0.5, 1, 1)
    assert.is_true(r > 170 and r < 230, tostring(r))
    b.close()
    s = sim { "--tok-rate", "0", "--step-growth", "1000" } -- a step of 1 s, were it applied
    local st <close> = mirza.open { url = s.url, body = H.chat_body("flat", { max_tokens = 5000 }) }
    local t0 = mirza.now()
    local d = H.drain(st, 10)
    assert.equal("done", d.last.type)
    assert.is_true(mirza.now() - t0 < 2)
  end)

  it("rejects a malformed curve", function()
    local p = assert(io.popen(("%q --step-growth 1,2,3,4 --port 0 2>&1; echo rc=$?"):format(H.sim_bin)))
    local out = p:read("a")
    p:close()
    assert.matches("rc=2", out)
    assert.matches("--step-growth must be", out, 1, true)
  end)
end)

describe("mirza-sim --vllm-metrics", function()
  local function gauges(s)
    local st <close> = mirza.open { url = s.base .. "/metrics", plain = true, timeout = 10 }
    local ev = st:next(10)
    assert(ev.type == "response", ev.message)
    assert.equal(200, ev.status)
    local g = {}
    for name, labels, v in ev.body:gmatch("\nvllm:([%w_]+)(%b{}) (%S+)") do g[name] = { labels, tonumber(v) } end
    return g
  end

  for _, dialect in ipairs { "mtplx", "llama" } do
    it("answers vllm:num_requests_running and num_requests_waiting (" .. dialect .. " dialect)", function()
      local s = sim { "--dialect", dialect, "--parallel", "2", "--vllm-metrics", "--tok-rate", "50",
        "--model-id", "Qwen/Qwen3-0.6B" }
      local g = gauges(s)
      assert.same({ '{engine="0",model_name="Qwen/Qwen3-0.6B"}', 0 }, g.num_requests_running)
      assert.same({ '{engine="0",model_name="Qwen/Qwen3-0.6B"}', 0 }, g.num_requests_waiting)
      local b = batch(s, 3) -- two in the slots, one waiting
      finally(b.close)
      assert.truthy(H.wait_for(function()
        b.pump(0)
        g = gauges(s)
        return g.num_requests_running[2] == 2 and g.num_requests_waiting[2] == 1
      end, 10), "running and waiting")
      b.close()
      assert.truthy(H.wait_for(function() return gauges(s).num_requests_running[2] == 0 end, 10))
    end)
  end
end)
