-- mirza.pool's prefix affinity (issue 18 item 6), on a fake clock and
-- without a request: a request with a prefix key goes to the endpoint that
-- took that key last while it has room; without room, to the least loaded
-- (which then holds the key); never to a rested or probing endpoint nor
-- one the retry avoids; the keys are an LRU of affinity_keys entries;
-- affinity = false ignores them. pool_pick_spec covers the pick without a
-- key. And pool.prefix_key: what of a request the key covers.
local pool = require "mirza.pool"

-- A pool on a fake clock: p, clock (set clock.t).
local function fake(urls, opts)
  local clock = { t = 100 }
  opts = opts or {}
  opts.clock = function() return clock.t end
  return pool.new(urls, opts), clock
end

local URLS = { "http://127.0.0.1:1", "http://127.0.0.1:2", "http://127.0.0.1:3" }

-- The index of the endpoint acquire(0, {key = key}) gets; "-" for none.
local function pick(p, key, avoid)
  local e = p:acquire(0, { key = key, avoid = avoid })
  return e and e.index or "-"
end

describe("mirza.pool prefix affinity", function()
  it("sends a key where it went last while that endpoint has room, even when it is the busiest", function()
    local p = fake(URLS, { limit = 3 })
    assert.same({ 1, 2, 3 }, { pick(p, "A"), pick(p, "B"), pick(p, "C") }) -- new keys: least loaded
    -- A's endpoint (1) has room: A goes there again, though 1 is now the busiest (2 in flight)
    assert.same({ 1, 1 }, { pick(p, "A"), pick(p, "A") })
    assert.same({ 3, 1, 1 }, { p.endpoints[1].inflight, p.endpoints[2].inflight, p.endpoints[3].inflight })
    assert.same({ 2, 0 }, { p.affine, p.spread })
    -- the positional form too
    local e = p:acquire(0, nil, nil, "B")
    assert.equal(p.endpoints[2], e)
  end)

  it("spreads a key whose endpoint is full to the least loaded, which holds the key from then on", function()
    local p = fake(URLS, { limit = 2 })
    assert.same({ 1, 1 }, { pick(p, "A"), pick(p, "A") }) -- 1 full
    assert.equal(2, pick(p, "A"))                          -- spread: 2 and 3 are empty, 2 first
    assert.equal(1, p.spread)
    assert.equal(p.endpoints[2], p:affine_endpoint("A"))
    assert.equal(2, pick(p, "A"))                          -- now with 2 while it has room
    assert.equal(3, pick(p, "A"))                          -- 2 full too
    p:release(p.endpoints[1], true)                        -- room on 1 again, but A went to 3 last
    assert.equal(3, pick(p, "A"))
    assert.equal(1, pick(p, "A"))                          -- 3 full: spread to 1, the only one with room
    assert.equal("-", pick(p, "A"))                        -- all full: none
  end)

  it("skips the key's endpoint while it rests and while it is probed, and a retry's avoided one", function()
    local p, clock = fake({ URLS[1], URLS[2] }, { limit = 4, rest = 1 })
    local a = p.endpoints[1]
    assert.equal(1, pick(p, "A"))
    p:report(a, { code = "refused" }, "x") -- a rests
    assert.equal(2, pick(p, "A"))           -- spread; A is with 2 now
    assert.equal(p.endpoints[2], p:affine_endpoint("A"))
    assert.equal(2, pick(p, "B"))           -- B is new: the least loaded of the healthy
    clock.t = a.rest_until                   -- the rest is over: a is probed one request at a time
    local b = assert(p:acquire(0, { key = "C" }))
    assert.equal(a, b)                       -- C (new) takes the probe: a is the least loaded
    p:report(a, { ok = true }, "y")          -- the probe answered
    -- a healthy again: a key that went to a goes there, one avoided there goes elsewhere
    assert.same({ 1, 2 }, { pick(p, "C"), pick(p, "C", { [a] = true }) })
  end)

  it("does not take a probing endpoint for its key: the least loaded decides", function()
    local p, clock = fake({ URLS[1], URLS[2] }, { limit = 4, rest = 1 })
    local a, b = p.endpoints[1], p.endpoints[2]
    assert.same({ 1, 2 }, { pick(p, "X"), pick(p, "A") })
    p:report(b, { ok = true }, "y") -- b served 1
    p:abandon(a)                     -- a served 0: the least loaded from now on
    assert.equal(2, pick(p, "A"))
    p:report(b, { code = "closed" }, "x")
    clock.t = b.rest_until           -- b is probed (one request) and A went there last
    assert.same({ 1, 0 }, { b.fails, b.inflight })
    assert.equal(1, pick(p, "A"))   -- to a, the least loaded; the probe is not spent on the key
    assert.equal(a, p:affine_endpoint("A"))
  end)

  it("forgets the least recently used key past affinity_keys", function()
    local p = fake(URLS, { limit = 10, affinity_keys = 2 })
    assert.same({ 1, 2 }, { pick(p, "A"), pick(p, "B") })
    assert.equal(1, pick(p, "A"))   -- A used: B is now the least recent
    assert.equal(3, pick(p, "C"))   -- a third key: B is forgotten
    assert.equal(2, p.nkeys)
    assert.is_nil(p:affine_endpoint("B"))
    assert.equal(p.endpoints[1], p:affine_endpoint("A"))
    assert.equal(p.endpoints[3], p:affine_endpoint("C"))
    -- B comes back as a new key: least loaded (in flight 2 1 1, 2 served fewer... all 0: the first of 2 and 3)
    assert.equal(2, pick(p, "B"))
    assert.is_nil(p:affine_endpoint("A")) -- A was the least recent then
    -- many keys: the memory stays bounded
    for i = 1, 100 do p:_remember("k" .. i, p.endpoints[1]) end
    assert.equal(2, p.nkeys)
    local n = 0
    for _ in pairs(p.keys) do n = n + 1 end
    assert.equal(2, n)
  end)

  it("ignores keys with affinity = false: least loaded as without one", function()
    local p = fake(URLS, { limit = 3, affinity = false })
    assert.same({ 1, 2, 3, 1, 2 }, { pick(p, "A"), pick(p, "A"), pick(p, "A"), pick(p, "A"), pick(p, "A") })
    assert.same({ 0, 0, 0 }, { p.affine, p.spread, p.nkeys })
  end)

  it("says whether a key would be sent now and how (room_for): affine, new, a slot elsewhere, or none", function()
    local p, clock = fake({ URLS[1], URLS[2] }, { limit = 1, rest = 1 })
    assert.same({ "new", "new" }, { p:room_for("A"), p:room_for(nil) })
    assert.equal(1, pick(p, "A"))
    assert.equal("slot", p:room_for("A"))      -- its endpoint is full: a slot on 2
    assert.equal(2, pick(p, "B"))
    assert.is_false(p:room_for("A"))           -- both full
    p:release(p.endpoints[1], true)
    assert.equal("affine", p:room_for("A"))
    assert.equal(1, pick(p, "A"))
    p:report(p.endpoints[1], { code = "refused" }, "x") -- rests
    assert.is_false(p:room_for("A"))           -- 1 rests, 2 is full
    clock.t = p.endpoints[1].rest_until
    assert.equal("slot", p:room_for("A"))      -- probing: a slot for anyone, not its key's copy
    local off = fake({ URLS[1] }, { affinity = false })
    assert.equal(1, pick(off, "A"))
    assert.equal("new", off:room_for("A"))
  end)

  it("prefers the engine's own endpoint over the key's", function()
    local p = fake(URLS, { limit = 3 })
    assert.equal(1, pick(p, "A"))
    local e = p:acquire(0, { prefer = p.endpoints[3], key = "A" })
    assert.equal(p.endpoints[3], e)
    assert.equal(p.endpoints[3], p:affine_endpoint("A"))
  end)
end)

describe("mirza.pool.prefix_key", function()
  local long = ("You are a careful assistant. "):rep(40) -- > 512 bytes

  it("keys a chat request on its leading messages, whatever the question", function()
    local k1 = pool.prefix_key { { role = "system", content = long }, { role = "user", content = "q1" } }
    local k2 = pool.prefix_key { { role = "system", content = long }, { role = "user", content = "question two" } }
    local k3 = pool.prefix_key { { role = "system", content = long .. "!" }, { role = "user", content = "q1" } }
    assert.is_string(k1)
    assert.equal(16, #k1)
    assert.equal(k1, k2)
    assert.not_equal(k1, k3)
  end)

  it("keys a short prefix with the start of the last message, and a prompt on its first bytes", function()
    local doc = ("A long document about tides. "):rep(30)
    local a = pool.prefix_key { { role = "user", content = doc .. "Question one?" } }
    local b = pool.prefix_key { { role = "user", content = doc .. "Another question?" } }
    assert.equal(a, b)
    assert.equal(pool.prefix_key(doc .. "x"), pool.prefix_key(doc .. "y"))
    assert.not_equal(pool.prefix_key(doc), pool.prefix_key("B" .. doc))
    -- the role counts: the same text as the system prompt is another prefix
    assert.not_equal(a, pool.prefix_key { { role = "system", content = doc .. "Question one?" } })
  end)

  it("gives no key to a request shorter than prefix_bytes", function()
    assert.is_nil(pool.prefix_key { { role = "system", content = "Be brief." }, { role = "user", content = "hi" } })
    assert.is_nil(pool.prefix_key("short prompt"))
    assert.is_string(pool.prefix_key("short prompt", 5))
    assert.is_nil(pool.prefix_key {})
  end)

  it("hashes a content given as parts, and raises on anything but messages or a prompt", function()
    local parts = { { type = "text", text = long } }
    assert.is_string(pool.prefix_key { { role = "system", content = parts }, { role = "user", content = "q" } })
    assert.has_error(function() pool.prefix_key(42) end)
  end)
end)
