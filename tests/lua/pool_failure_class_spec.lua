-- mirza.pool and the classes of failure (issue 31 item 3), on a fake
-- clock and without a request: a class of bad requests never stops the
-- good ones. "unsupported" (404/405/501) and "item" (another 4xx) never
-- count against an endpoint; "retry" (a 500, an error frame) is one
-- request's until different requests fault in a row with no success
-- between (5xx on everything); a 429 pauses the endpoint without making it
-- failing; only "endpoint" (refused, cut, 502/503/504) rests it at once.
-- pool_classes_spec (integration) shows the same against mirza-sim.
local pool = require "mirza.pool"

-- A pool of one endpoint on a fake clock: p, its endpoint, clock (set clock.t).
local function fake(opts)
  local clock = { t = 100 }
  opts = opts or {}
  opts.clock = function() return clock.t end
  local p = pool.new({ "http://127.0.0.1:1" }, opts)
  return p, p.endpoints[1], clock
end

local function http(status, retry_after)
  return { code = "http", status = status, message = "HTTP " .. status, retry_after = retry_after }
end

-- Report request `key`'s outcome `r` through a slot taken now (it must be free).
local function run(p, r, key)
  local e = assert(p:acquire(0), "no slot free")
  p:report(e, r, key)
  return e
end

describe("mirza.pool failure classes", function()
  it("never rests an endpoint for an unsupported route or a 4xx, however many", function()
    local p, e = fake { suspect_items = 2 }
    for i = 1, 20 do
      run(p, http(({ 501, 404, 405, 400, 401, 413, 422 })[i % 7 + 1]), "k" .. i)
    end
    assert.same({ 0, 0, 0, 0 }, { e.fails, e.failed, e.faults, e.rest_until })
    assert.is_nil(p:down_for())
    assert.is_true(e.answered)
  end)

  it("keeps serving an endpoint that fails some items with 500 and answers the others", function()
    local p, e = fake { suspect_items = 4 }
    for round = 1, 10 do -- three bad items, then a good one: never four faults in a row
      for i = 1, 3 do run(p, http(500), ("bad%d.%d"):format(round, i)) end
      run(p, { ok = true }, "good" .. round)
    end
    assert.same({ 0, 0 }, { e.fails, e.failed })
    assert.is_nil(p:down_for())
  end)

  it("counts an error frame like a 5xx, and each request once per endpoint", function()
    local p, e = fake { suspect_items = 3 }
    for _ = 1, 10 do run(p, { code = "server", message = "boom" }, "same") end -- one item retried
    assert.same({ 0, 1 }, { e.fails, e.faults })
    run(p, { code = "server" }, "two")
    run(p, http(502 + 5), "three") -- 507, a fault: three different requests in a row
    assert.equal(1, e.fails)
  end)

  it("rests an endpoint for a run of bad items once per suspect_items, and a good one brings it back", function()
    local p, e, clock = fake { suspect_items = 4, limit = 10, rest = 1 }
    local slots = {}
    for i = 1, 10 do slots[i] = assert(p:acquire(0)) end -- ten bad items sent at once
    for i = 1, 10 do p:report(slots[i], http(500), "bad" .. i) end
    -- rested at the 4th; the 8th would rest it again, but the wave does not lengthen the rest
    assert.same({ 1, 2, 2 }, { e.fails, e.failed, e.faults })
    assert.is_true(e.rest_until <= 101.25, e.rest_until)
    assert.equal(0, p:down_for())
    clock.t = clock.t + 2 -- rest over: probes
    for i = 1, 10 do run(p, http(500), "bad" .. i) end -- their retries say nothing new
    assert.same({ 1, 2, 2 }, { e.fails, e.failed, e.faults }) -- still probing, not rested again
    run(p, http(500), "bad11") -- a new bad item: a fault, but not yet a run; still probing
    assert.same({ 1, 3 }, { e.fails, e.faults })
    assert.equal(2, p:down_for())
    run(p, { ok = true }, "good1")
    assert.same({ 0, 0 }, { e.fails, e.faults })
    assert.is_nil(p:down_for())
    for _ = 1, 5 do -- the bad items' next retries, among good ones: never again
      for i = 1, 11 do run(p, http(500), "bad" .. i) end
      run(p, { ok = true }, "good")
    end
    assert.same({ 0, 2 }, { e.fails, e.failed })
  end)

  it("rests an endpoint that faults on everything, longer while new requests fault", function()
    local p, e, clock = fake { suspect_items = 3, rest = 1 }
    for i = 1, 3 do run(p, http(500), "r" .. i) end
    assert.equal(1, e.fails)
    assert.is_nil(p:acquire(0)) -- resting
    clock.t = clock.t + 1.5
    assert.equal(1.5, (p:down_for()))
    for i = 4, 6 do run(p, http(500), "r" .. i) end -- the probes, new requests: fault too
    assert.equal(2, e.fails)
    assert.is_true(e.rest_until >= clock.t + 1.5, e.rest_until)
    assert.equal(1.5, (p:down_for())) -- down since the first rest, probes and all
    clock.t = clock.t + 3
    run(p, { ok = true }, "r7")
    assert.same({ 0, 0 }, { e.fails, e.faults })
    assert.is_nil(p:down_for())
  end)

  it("forgets the requests it counted once it holds suspect_keys of them (bounded memory)", function()
    local p, e = fake { suspect_items = 100, suspect_keys = 8 }
    for i = 1, 20 do run(p, http(500), i) end
    assert.is_true(e.nbad <= 8, e.nbad)
  end)

  it("rests at once for endpoint failures, one wave once", function()
    for _, r in ipairs { { code = "refused" }, { code = "closed" }, { code = "timeout" }, http(502), http(503),
      http(504) } do
      local p, e = fake { limit = 4 }
      local slots = { p:acquire(0), p:acquire(0), p:acquire(0), p:acquire(0) }
      for i = 1, 4 do p:report(slots[i], r, i) end
      assert.same({ 1, 4 }, { e.fails, e.failed }, tostring(r.code) .. " " .. tostring(r.status))
      assert.equal(0, p:down_for())
    end
  end)

  it("pauses an endpoint for a 429's Retry-After without calling it failing", function()
    local p, e, clock = fake { rest = 0.5, rest_max = 30 }
    run(p, http(429, 3), "x")
    assert.same({ 0, 0 }, { e.fails, e.failed })
    assert.is_nil(p:down_for())
    assert.is_nil(p:acquire(0)) -- paused
    assert.matches("paused 3%.0s", p:describe())
    clock.t = clock.t + 3
    assert.equal(e, p:acquire(0))
    p:report(e, http(429), "y") -- no Retry-After: `rest`
    assert.equal(clock.t + 0.5, e.rest_until)
    clock.t = clock.t + 1
    run(p, http(429, 3600), "z") -- at most rest_max
    assert.equal(clock.t + 30, e.rest_until)
    clock.t = clock.t + 30
    run(p, http(503), "w") -- an endpoint failure after a pause still rests it
    assert.equal(1, e.fails)
  end)
end)
