-- mirza.pool's limits (issue 41): an endpoint without a limit gets a
-- limiter (mirza.limit), one with `limit` (`@N`) keeps it fixed; what a
-- server announces caps the first, never the second; the open files cap
-- them all; a report's outcome reaches the limiter (429, 503, refused and
-- cut halve it); each endpoint's limit reads as the progress line says it.
local pool = require "mirza.pool"

local function fake(urls, opts)
  local clock = { t = 100 }
  opts = opts or {}
  opts.clock = function() return clock.t end
  return pool.new(urls, opts), clock
end

describe("mirza.pool limits", function()
  it("are found without @N, fixed with it", function()
    local p = fake { "http://127.0.0.1:1", { url = "http://127.0.0.1:2", limit = 4 } }
    local a, b = p.endpoints[1], p.endpoints[2]
    assert.is_truthy(a.limiter)
    assert.is_nil(b.limiter)
    assert.same({ 8, 4 }, { a.limit, b.limit })
    assert.equal(256 + 4, p:capacity()) -- the most the limits may reach: a batch's workers
    assert.equal("limit 8 (auto, no ceiling announced)", pool.limit_text(a))
    assert.equal("@4 fixed", pool.limit_text(b))
    assert.has_error(function() pool.new { { url = "http://127.0.0.1:3", limit = 0 } } end)
  end)

  it("take what the server announces as a ceiling (or a start), and the open files as a cap", function()
    local p = fake { "http://127.0.0.1:1", "http://127.0.0.1:2", { url = "http://127.0.0.1:3", limit = 4 } }
    local a, b, c = p.endpoints[1], p.endpoints[2], p.endpoints[3]
    p:announce(a, { ceiling = 64, source = "/props total_slots" })
    p:announce(b, { start = 1, source = "/health (MTPLX: serial by default)" })
    p:announce(c, { ceiling = 2, source = "/props total_slots" }) -- fixed: stays
    p:announce(a, nil)
    assert.same({ 16, 1, 4 }, { a.limit, b.limit, c.limit })
    assert.equal("limit 16 (auto, ceiling 64 from /props total_slots)", pool.limit_text(a))
    assert.equal("limit 1 (auto, started at 1: /health (MTPLX: serial by default))", pool.limit_text(b))
    assert.equal(64 + 256 + 4, p:capacity())
    p:fit(44) -- 40 for the two found: 20 each
    assert.same({ 20, 20 }, { a.limiter.max, b.limiter.max })
    assert.equal(44, p:capacity())
    local q = fake { "http://127.0.0.1:1" }
    q:fit(30) -- before the probe's answer, as a batch does
    q:announce(q.endpoints[1], { ceiling = 512, source = "/props total_slots" })
    assert.equal(30, q:capacity())
  end)

  it("send one more than the slots announced, alone, once the start is at them: it waits queued at the server",
    function()
    local p = fake { "http://127.0.0.1:1" }
    local a = p.endpoints[1]
    p:announce(a, { ceiling = 2, source = "/props total_slots" })
    assert.equal(2 + 1, p:capacity())
    local tickets = {}
    for i = 1, 2 do
      assert.equal(a, p:acquire(0))
      tickets[i] = p:sent(nil, a)
    end
    assert.is_nil(p:acquire(0)) -- the start's first round: none past the slots, it could take one of theirs
    assert.equal("limit 2 (auto, ceiling 2 from /props total_slots)", pool.limit_text(a))
    for i = 1, 2 do p:prefilled(a, tickets[i]) end -- their first tokens together: at the ceiling
    assert.equal("limit 2 and 1 queued (auto, ceiling 2 from /props total_slots)", pool.limit_text(a))
    assert.equal(a, p:acquire(0)) -- the third waits in the server's queue
    assert.is_true(a.last.extra) -- and its limiter is told so: its wait is no queue of the server's
    assert.is_nil(p:acquire(0))
    local two = fake { "http://127.0.0.1:1", "http://127.0.0.1:2" } -- a pool: a slot elsewhere does it
    local e = two.endpoints[1]
    two:announce(e, { ceiling = 1, source = "/props total_slots" })
    assert.equal(e, two:acquire(0, e))
    two:prefilled(e, two:sent(nil, e))
    assert.equal("limit 1 (auto, ceiling 1 from /props total_slots)", pool.limit_text(e))
    assert.equal(two.endpoints[2], two:acquire(0, e))
    local fixed = fake { { url = "http://127.0.0.1:1", limit = 2 } } -- @2 is 2
    for _ = 1, 2 do assert.truthy(fixed:acquire(0)) end
    assert.is_nil(fixed:acquire(0))
  end)

  it("hear each request's outcome: a 429, a 503, a refused or cut connection halve the limit", function()
    for _, r in ipairs { { code = "http", status = 429 }, { code = "http", status = 503 }, { code = "refused" },
      { code = "closed" } } do
      local p = fake { "http://127.0.0.1:1" }
      local e = assert(p:acquire(0))
      local ticket = p:sent(nil, e)
      p:report(e, r, "x", ticket)
      assert.equal(4, e.limit, r.code .. " " .. tostring(r.status))
      assert.equal(0, e.limiter.inflight)
      assert.is_nil(next(e.open))
    end
    local p = fake { "http://127.0.0.1:1" } -- the item's own failure, an answer, a cancel: no back-off
    for _, r in ipairs { { code = "http", status = 400 }, { ok = true, tokens = 20, ttft_ms = 100 } } do
      local e = assert(p:acquire(0))
      p:report(e, r, "x")
    end
    local e = assert(p:acquire(0))
    p:abandon(e, p:sent(nil, e))
    assert.equal(8, e.limit)
    assert.same({ 0, 0 }, { e.inflight, e.limiter.inflight })
  end)
end)
