-- mirza.pool's prompt slots (issue 32 item 2), on a fake clock and
-- without a request: what the pool believes each daemon's prompt cache
-- holds, as llama-server keeps it (a prompt per slot, cached once its
-- prefill is done). A prefix new to an endpoint goes there once; the items
-- that share it wait for its first token and follow it, never as a second
-- cold copy on the same server; a free slot elsewhere takes a new copy; a
-- new prefix on a full endpoint evicts the least recently used idle copy.
local pool = require "mirza.pool"

local function fake(n, limit, opts)
  local clock, urls = { t = 100 }, {}
  for i = 1, n do urls[i] = "http://127.0.0.1:" .. i end
  opts = opts or {}
  opts.limit, opts.clock = limit, function() return clock.t end
  return pool.new(urls, opts), clock
end

-- Acquire for key (at once: nil when it would wait), and report it sent:
-- endpoint index and ticket.
local function send(p, key)
  local e = p:acquire(0, { key = key })
  if not e then return "-" end
  return e.index, p:sent(key, e), e
end

describe("mirza.pool prompt slots", function()
  it("never sends a second cold copy of a prefix to its endpoint; the others follow its first token", function()
    local p = fake(2, 2)
    local a, ta, ea = send(p, "A")
    local b = send(p, "B")
    local c = send(p, "C")
    local d = send(p, "D")
    assert.same({ 1, 2, 1, 2 }, { a, b, c, d }) -- new prefixes: one each, spread over the free slots
    assert.is_true(ta.cold)
    -- every slot claimed, A's copy prefilling: A waits (room "wait"), no endpoint is taken
    assert.equal("wait", p:room_for("A"))
    assert.equal("-", (send(p, "A")))
    -- A's first token: its copy is cached, but busy: still wait
    p:prefilled(ea, ta)
    assert.is_false(ta.cold)
    assert.equal("wait", p:room_for("A"))
    -- A's request ends: its idle copy takes the next A (not cold)
    p:finished(ea, ta)
    p:release(ea, true)
    assert.equal("affine", p:room_for("A"))
    local a2, ta2 = send(p, "A")
    assert.equal(1, a2)
    assert.is_nil(ta2.cold)
  end)

  it("keeps a free slot of the same server for later while a prefix's first copy is still prefilling", function()
    local p = fake(1, 2)
    local _, t1, e = send(p, "A")
    -- a second request now would evaluate the same prefix again beside the first
    assert.equal("wait", p:room_for("A"))
    assert.equal("-", (send(p, "A")))
    p:prefilled(e, t1)
    -- cached, its copy busy: the free slot takes a new copy now
    assert.equal("slot", p:room_for("A"))
    local i2, t2 = send(p, "A")
    assert.equal(1, i2)
    assert.is_true(t2.cold)
  end)

  it("puts a new copy of a busy prefix in a slot no prefix claims, on another endpoint too", function()
    local p = fake(2, 2)
    local _, t1, e1 = send(p, "A")
    -- one prefix, four slots: while A's first copy is cold on 1, the other
    -- endpoint's free slot takes a new copy (not a second cold one on 1)
    assert.equal("slot", p:room_for("A"))
    local i2, t2 = send(p, "A")
    assert.equal(2, i2)
    assert.is_true(t2.cold)
    -- once 1's copy is prefilled and busy, 1's other slot takes a third
    p:prefilled(e1, t1)
    local i3, t3 = send(p, "A")
    assert.equal(1, i3)
    assert.is_true(t3.cold)
    assert.equal(2, p.endpoints[1].claimed)
  end)

  it("evicts the least recently used idle copy when a new prefix comes to a full endpoint", function()
    local p, clock = fake(1, 2)
    local _, ta, e = send(p, "A")
    p:prefilled(e, ta)
    clock.t = 101
    local _, tb = send(p, "B")
    p:prefilled(e, tb)
    p:finished(e, ta)
    p:release(e, true)
    clock.t = 102
    p:finished(e, tb)
    p:release(e, true)
    assert.equal(2, e.claimed)
    -- C: every slot claimed, both idle: A's (used least recently) gives its slot
    local _, tc = send(p, "C")
    assert.is_true(tc.cold)
    assert.equal(2, e.claimed)
    assert.equal("affine", p:room_for("B"))
    assert.is_not.equal("affine", p:room_for("A"))
  end)

  it("gives a cold copy's slot back when its request ends before its first token", function()
    local p = fake(1, 2)
    local _, ta, e = send(p, "A")
    assert.equal(1, e.claimed)
    p:finished(e, ta)
    p:release(e, false)
    assert.equal(0, e.claimed)
    p:finished(e, ta) -- once only
    assert.equal(0, e.claimed)
  end)
  it("does not follow into a paused endpoint: a 429's pause ends in time, not when a request wakes it", function()
    local p, clock = fake(1, 2)
    local _, t, e = send(p, "A")
    p:prefilled(e, t)
    p:finished(e, t)
    p:report(e, { code = "http", status = 429, retry_after = 1 }, "A")
    -- an idle copy of A, the endpoint paused: nothing in flight would ever
    -- wake a follower, so A must not wait for a copy ("wait") but for the pause
    assert.is_false(p:room_for("A"))
    clock.t = e.rest_until
    assert.equal("affine", p:room_for("A"))
  end)

  it("lets a busy prefix take a slot another prefix left idle for a second (a sorted input)", function()
    local p, clock = fake(1, 2)
    local _, a1, e = send(p, "A")
    p:prefilled(e, a1)
    local _, a2 = send(p, "A")
    p:prefilled(e, a2)
    p:finished(e, a1)
    p:release(e, true)
    clock.t = clock.t + 0.1 -- A used again: its first queue entry is stale, the second stands for both copies
    p:finished(e, a2)
    p:release(e, true) -- A done with: two idle copies, every slot claimed
    local _, b1 = send(p, "B") -- B evicts one of A's
    p:prefilled(e, b1)
    assert.equal("wait", p:room_for("B")) -- A's copy idle just now: B waits for its own
    clock.t = clock.t + 1
    assert.equal("slot", p:room_for("B")) -- idle a second: B takes it
    local _, b2 = send(p, "B")
    assert.is_true(b2.cold)
    assert.equal(2, e.claimed)
    assert.equal(0, e.idle_copies) -- both of A's copies evicted in turn
  end)

  it("waits idle_evict seconds (an option) before a busy prefix takes another's idle slot", function()
    local p, clock = fake(1, 2, { idle_evict = 5 })
    local _, a, e = send(p, "A")
    p:prefilled(e, a)
    p:finished(e, a)
    p:release(e, true) -- A idle
    local _, b1 = send(p, "B")
    p:prefilled(e, b1)
    clock.t = clock.t + 1
    assert.equal("wait", p:room_for("B")) -- a second is not enough here
    clock.t = clock.t + 4
    assert.equal("slot", p:room_for("B"))
  end)

  it("counts a request without a key in the slots while it runs: its slot holds no one's prefix", function()
    local p = fake(1, 2)
    local _, a, e = send(p, "A")
    p:prefilled(e, a)
    p:finished(e, a)
    p:release(e, true) -- A's copy idle in one slot
    local _, x = send(p, nil) -- too short to have a key: the other slot
    assert.is_true(x.anon)
    assert.equal(2, e.claimed)
    assert.equal("affine", p:room_for("A"))
    -- a new prefix now: every slot is claimed, so A's idle copy gives its slot (the daemon evicts it)
    local _, b = send(p, "B")
    assert.is_true(b.cold)
    assert.equal(2, e.claimed)
    assert.is_not.equal("affine", p:room_for("A"))
    -- the keyless request ends: its slot is free again, once
    p:finished(e, x)
    p:release(e, true)
    assert.equal(1, e.claimed)
    p:finished(e, x)
    assert.equal(1, e.claimed)
  end)
end)

describe("mirza.pool next_item (which pending item goes first)", function()
  local function items(...)
    local t = {}
    for i, k in ipairs { ... } do t[i] = { key = k ~= "-" and k or nil } end
    return t
  end

  it("takes an item with an idle copy, then a new one, then a new copy; never a second cold copy", function()
    local p = fake(1, 4)
    local _, a, e = send(p, "A")  -- A cold
    local _, b = send(p, "B")
    p:prefilled(e, b)
    p:finished(e, b)
    p:release(e, true)            -- B idle
    assert.equal(3, p:next_item(items("A", "C", "B", "-"), 64))
    assert.equal(2, p:next_item(items("A", "C", "-"), 64))    -- a new prefix before one that waits
    assert.equal(2, p:next_item(items("A", "-"), 64))         -- no key: any slot will do, A waits
    p:prefilled(e, a)                                         -- A cached, its copy busy: a new copy
    assert.equal("slot", p:room_for("A"))
    assert.equal(2, p:next_item(items("A", "-"), 64))         -- still after an item any slot will do
    assert.equal(1, p:next_item(items("A", "A"), 64))
    assert.equal(1, p:next_item(items("B", "A"), 1))          -- lookahead 1: in order
  end)

  it("takes an item passed over lookahead times next, whatever its prefix", function()
    local p = fake(1, 4)
    send(p, "A") -- cold: A's items wait
    local win = items("A", "-", "-", "-")
    assert.equal(2, p:next_item(win, 2))
    table.remove(win, 2)
    assert.equal(2, p:next_item(win, 2))
    table.remove(win, 2)
    assert.equal(1, p:next_item(win, 2)) -- passed twice
  end)
end)
