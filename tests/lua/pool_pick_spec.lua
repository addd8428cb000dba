-- mirza.pool's choice of endpoint (issue 19 item 8), on a fake clock and
-- without a request: the least loaded endpoint with room, ties to the one
-- that served fewer, then to the first; each endpoint's own limit; a
-- rested endpoint skipped until its rest is over, then probed one request
-- at a time (half-open) until one succeeds, its rest doubling while the
-- probes fail. pool_spec covers what each failure does to an endpoint and
-- where a retry goes; this is the pick itself.
local pool = require "mirza.pool"

-- A pool on a fake clock: p, clock (set clock.t).
local function fake(urls, opts)
  local clock = { t = 100 }
  opts = opts or {}
  opts.clock = function() return clock.t end
  return pool.new(urls, opts), clock
end

-- Which endpoint (its index) each of n acquire(0) gets; "-" for none.
local function picks(p, n)
  local got = {}
  for i = 1, n do
    local e = p:acquire(0)
    got[i] = e and e.index or "-"
  end
  return got
end

describe("mirza.pool picks", function()
  it("the least loaded endpoint with room, within each one's own limit", function()
    local p = fake { { url = "http://127.0.0.1:1", limit = 2 }, { url = "http://127.0.0.1:2", limit = 1 },
      { url = "http://127.0.0.1:3", limit = 3 } }
    assert.equal(6, p:capacity())
    -- 0 0 0 -> the first; 1 0 0 -> 2; 1 1 0 -> 3; 1 1 1 -> 1; then 2 is full, 1 too
    assert.same({ 1, 2, 3, 1, 3, 3, "-" }, picks(p, 7))
    local ok, msg, code = p:acquire(0)
    assert.same({ nil, "no endpoint available in time", "timeout" }, { ok, msg, code })
    assert.same({ 2, 1, 3 }, { p.endpoints[1].inflight, p.endpoints[2].inflight, p.endpoints[3].inflight })
    p:release(p.endpoints[3], true) -- a slot back on 3: only 3 has room
    assert.same({ 3, "-" }, picks(p, 2))
  end)

  it("between equally loaded endpoints, the one that served fewer; the load comes first", function()
    local p = fake({ "http://127.0.0.1:1", "http://127.0.0.1:2", "http://127.0.0.1:3" }, { limit = 4 })
    local a = p:acquire(0)
    p:release(a, true) -- served: 1 0 0
    local b = p:acquire(0)
    p:release(b, true) -- served: 1 1 0
    assert.same({ 1, 2 }, { a.index, b.index })
    -- in flight 0 0 0 -> 3 (served fewest); 0 0 1 -> 1 (1 and 2 tie: the first); 1 0 1 -> 2;
    -- 1 1 1 -> 3 (served fewest); 1 1 2 -> 1 (3 served fewer, but is busier)
    assert.same({ 3, 1, 2, 3, 1 }, picks(p, 5))
  end)

  it("skips a rested endpoint until its rest is over, then probes it one request at a time", function()
    local p, clock = fake({ "http://127.0.0.1:1", "http://127.0.0.1:2" }, { limit = 4, rest = 1 })
    local a = p.endpoints[1]
    p:report(assert(p:acquire(0)), { code = "refused" }, "x")
    assert.same({ 2, 2, 2, 2, "-" }, picks(p, 5)) -- a rests, b has 4 slots
    clock.t = a.rest_until - 0.001
    assert.same({ "-" }, picks(p, 1))
    clock.t = a.rest_until -- over: a is probed, with one request only
    assert.same({ 1, "-" }, picks(p, 2))
    p:report(a, { ok = true }, "y") -- the probe answered: all of a's slots again
    assert.same({ 1, 1, 1, 1, "-" }, picks(p, 5))
  end)

  it("rests a failing endpoint longer after each failed probe, up to rest_max", function()
    local p, clock = fake({ "http://127.0.0.1:1" }, { rest = 1, rest_max = 3 })
    local e, rests = p.endpoints[1], {}
    for i = 1, 4 do
      local got = p:acquire(0)
      assert.equal(e, got, "probe " .. i)
      p:report(e, { code = "closed" }, "x")
      rests[i] = e.rest_until - clock.t
      assert.is_nil(p:acquire(0)) -- resting
      clock.t = e.rest_until
    end
    -- 1, 2, 4 capped at 3, 3: each times a jitter in [0.75, 1.25]
    for i, d in ipairs { 1, 2, 3, 3 } do
      assert.is_true(rests[i] >= 0.75 * d and rests[i] <= 1.25 * d, ("rest %d: %.3f s"):format(i, rests[i]))
    end
    assert.same({ 4, 4 }, { e.fails, e.failed })
  end)
end)
