-- What each class of failure (mirza.retry.class) does to an endpoint of a
-- pool, against mirza-sim over loopback (issue 31 item 3: a class of bad
-- requests never stops the good ones). Each request goes through the pool
-- as a batch's does (acquire, the request, report with the item's key):
-- a 501 (a llama-server without --embeddings) never rests the endpoint,
-- which serves chat all along; HTTP 500s of some items while the others
-- succeed keep it serving; refused and 503 rest it; a 500 on everything
-- rests it and counts toward "every endpoint down".
local mirza = require "mirza"
local pool = require "mirza.pool"
local H = require "tests.helper"

local FAST = { "--tok-rate", "0", "--ttft-ms", "0", "--answer-tokens", "4", "--retry-after", "0" }

local function argv(extra)
  local a = { table.unpack(FAST) }
  for _, x in ipairs(extra or {}) do a[#a + 1] = x end
  return a
end

-- One request of item `key` through the pool (`path` under the endpoint's
-- base, a chat by default; `fault` a mirza-sim fault for it): true, or
-- nil and the code and status of its failure, reported to the pool. The
-- slot is taken at once (an error when the endpoint rests), or within `wait` s.
local function send(p, key, fault, path, wait)
  local e = assert(p:acquire(wait or 0), "no slot: the endpoint rests")
  local body = path and { model = "m", input = "x" }
    or { model = "m", stream = false, messages = { { role = "user", content = "q " .. key } },
      mirza_sim = fault and { fault = fault } or nil }
  local text, msg, code, status = mirza.request { url = e.base .. (path or "/chat/completions"), body = body,
    timeout = 5, deadline = 10 }
  if text then
    p:report(e, { ok = true }, key)
    return true
  end
  p:report(e, { code = code, status = status, message = msg }, key)
  return nil, code, status
end

describe("mirza.pool against failures of each class", function()
  after_each(function() collectgarbage("collect") end)

  it("never rests an endpoint for a route it does not have (501), which serves chat all along", function()
    local sim = H.start_sim(argv { "--dialect", "llama", "--no-embeddings" })
    finally(sim.stop)
    local p = pool.new({ sim.base }, { limit = 1, suspect_items = 2 })
    local e = p.endpoints[1]
    for i = 1, 10 do -- ten embeddings items, then chat: the 501s say nothing of the endpoint
      assert.same({ nil, "http", 501 }, { send(p, "e" .. i, nil, "/embeddings") })
      assert.same({ 0, 0, 0 }, { e.fails, e.failed, e.faults }, "after embeddings item " .. i)
    end
    assert.is_nil(p:down_for())
    for i = 1, 5 do assert.is_true(send(p, "c" .. i)) end
    -- and through mirza.embed: unsupported at once, the pool untouched
    local v, _, code, status = mirza.embed { pool = p, input = { "a", "b" }, batch = 1 }
    assert.same({ nil, "unsupported", 501 }, { v, code, status })
    assert.same({ 0, 0, 5 }, { e.fails, e.failed, e.served })
    assert.is_nil(p:down_for())
  end)

  it("keeps serving an endpoint that answers 500 to some items and serves the others", function()
    local sim = H.start_sim(argv())
    finally(sim.stop)
    local p = pool.new({ sim.base }, { limit = 4, suspect_items = 3 })
    local e = p.endpoints[1]
    for round = 1, 4 do -- two bad items (each retried), one good, again and again
      for _, k in ipairs { "bad1", "bad2", "bad1", "bad2" } do
        assert.same({ nil, "http", 500 }, { send(p, k, "http=500") }, k)
      end
      assert.is_true(send(p, "good" .. round))
    end
    for i = 3, 12 do -- then ten other bad items, a good one after each two
      assert.same({ nil, "http", 500 }, { send(p, "bad" .. i, "http=500") })
      if i % 2 == 0 then assert.is_true(send(p, "ok" .. i)) end
    end
    assert.same({ 0, 0 }, { e.fails, e.failed })
    assert.is_nil(p:down_for())
  end)

  it("rests an endpoint that refuses, and one that answers 503", function()
    local port = H.free_port()
    local p = pool.new({ "http://127.0.0.1:" .. port }, { rest = 0.2 })
    assert.same({ nil, "refused" }, { send(p, "x") })
    assert.equal(1, p.endpoints[1].fails)
    assert.is_not_nil(p:down_for()) -- its only endpoint: every endpoint down
    local sim = H.start_sim(argv { "--fault", "http=503" })
    finally(sim.stop)
    local q = pool.new({ sim.base }, { rest = 0.2 })
    assert.same({ nil, "http", 503 }, { send(q, "y") })
    assert.equal(1, q.endpoints[1].fails)
    assert.same({ nil, "no endpoint available in time", "timeout" }, { q:acquire(0) }) -- resting
    assert.is_not_nil(q:down_for())
  end)

  it("rests an endpoint that answers 500 to everything, and counts it down", function()
    local sim = H.start_sim(argv { "--fault", "http=500" })
    finally(sim.stop)
    local p = pool.new({ sim.base }, { limit = 4, suspect_items = 3, rest = 0.2 })
    local e = p.endpoints[1]
    assert.same({ nil, "http", 500 }, { send(p, "a") })
    assert.same({ nil, "http", 500 }, { send(p, "b") })
    assert.equal(0, e.fails)
    assert.is_nil(p:down_for())
    assert.same({ nil, "http", 500 }, { send(p, "c") }) -- three different items in a row: everything
    assert.equal(1, e.fails)
    assert.is_not_nil(p:down_for())
    for _, k in ipairs { "d", "e", "f" } do -- the probes after the rest: new items, 500 again
      assert.same({ nil, "http", 500 }, { send(p, k, nil, nil, 2) })
      assert.is_not_nil(p:down_for(), k) -- still down: a 500 does not end a probe
    end
    assert.equal(2, e.fails) -- rested again, longer
    assert.is_true(p:down_for() > 0.1)
  end)
end)
