-- mirza.loop's timers (issue 19 item 8): several pending at once fire in
-- deadline order whatever order they were set in, equal deadlines in the
-- order they were set, a heap of hundreds after cancellations (and after
-- the rebuild that drops them) still pops in order, a replaced deadline
-- is the only one that counts. No socket: timers set in the past fire at
-- the next step without waiting, and real short sleeps are checked by the
-- order they end in, never by how long they took.
local mirza = require "mirza"
local loop = require "mirza.loop"

-- A deterministic sequence in [0, 1) (math.random is the suite's to seed).
local function lcg(seed)
  local x = seed
  return function()
    x = (x * 1103515245 + 12345) % 2147483648
    return x / 2147483648
  end
end

describe("mirza.loop timers", function()
  it("fires pending timers in deadline order, not in the order they were set", function()
    local l, fired = loop.new(), {}
    local past = mirza.now() - 10 -- all due: one step fires them all, in the heap's order
    for _, k in ipairs { 5, 1, 4, 2, 3 } do l:at(past + k, function() fired[#fired + 1] = k end) end
    assert.is_true(l:step())
    assert.same({ 1, 2, 3, 4, 5 }, fired)
  end)

  it("wakes sleeping tasks in the order of their deadlines", function()
    -- A deadline is when the sleep began plus its length: on a loaded
    -- machine the tasks begin their sleeps milliseconds apart, so the
    -- order expected is that of the deadlines each task noted (10, 20, 30
    -- when they begin together; spawned 30, 10, 20).
    local l, woke, due = loop.new(), {}, {}
    for _, ms in ipairs { 30, 10, 20 } do
      l:spawn(function()
        due[ms] = mirza.now() + ms / 1000
        mirza.sleep(ms / 1000)
        woke[#woke + 1] = ms
      end)
    end
    l:run()
    local want = { 30, 10, 20 }
    table.sort(want, function(a, b) return due[a] < due[b] end)
    assert.same(want, woke)
  end)

  it("times out conditions' waiters in the order of their timeouts; a signal takes the oldest", function()
    local l, out = loop.new(), {}
    local c = loop.condition(l)
    for _, ms in ipairs { 400, 10, 300, 200 } do
      l:spawn(function()
        local signalled = c:wait(ms / 1000) -- before `#out`: it is read when the wait is over
        out[#out + 1] = ms .. (signalled and " signalled" or " timed out")
        if ms == 10 then c:signal() end -- the oldest waiter: 400, though 200 times out first
      end)
    end
    l:run()
    assert.same({ "10 timed out", "400 signalled", "200 timed out", "300 timed out" }, out)
  end)

  it("fires equal deadlines in the order they were set, among earlier and later ones", function()
    local l, fired = loop.new(), {}
    local at = mirza.now() - 10
    for i = 1, 40 do
      local slot = ({ 2, 1, 3 })[i % 3 + 1] -- three deadlines, set interleaved
      l:at(at + slot, function() fired[#fired + 1] = slot * 100 + i end)
    end
    l:step()
    local want = {}
    for slot = 1, 3 do
      for i = 1, 40 do
        if ({ 2, 1, 3 })[i % 3 + 1] == slot then want[#want + 1] = slot * 100 + i end
      end
    end
    assert.same(want, fired)
  end)

  -- Set n timers at random due times, cancel those `drop` picks, set
  -- `more` after that, and check that the others fire once each, sorted
  -- by (time, order set).
  local function check_heap(n, drop, more)
    local l, rnd, fired, live, dropped = loop.new(), lcg(n), {}, {}, {}
    local base = mirza.now() - 100
    local function set(i)
      local at = base + math.floor(rnd() * n / 4) / 8 -- many equal times among them
      return { at = at, i = i, e = l:at(at, function() fired[#fired + 1] = i end) }
    end
    for i = 1, n do
      local x = set(i)
      if drop(i, rnd) then dropped[#dropped + 1] = x else live[#live + 1] = x end
    end
    for _, x in ipairs(dropped) do l:cancel_timer(x.e) end
    l:cancel_timer(dropped[1].e) -- twice: idempotent
    for i = n + 1, n + more do live[#live + 1] = set(i) end -- after the rebuild, when there was one
    table.sort(live, function(a, b) return a.at < b.at or (a.at == b.at and a.i < b.i) end)
    local want = {}
    for k, x in ipairs(live) do want[k] = x.i end
    l:step()
    assert.same(want, fired)
    assert.is_false(l:step()) -- nothing left: cancelled ones never fire later
  end

  it("pops 500 timers in order after a few cancellations (left in the heap)", function()
    check_heap(500, function(i) return i % 17 == 1 end, 20)
  end)

  it("pops timers in order after most were cancelled (the heap rebuilt without them)", function()
    check_heap(500, function(_, rnd) return rnd() < 0.7 end, 50)
    check_heap(200, function(i) return i % 5 ~= 0 end, 7)
  end)

  it("cancels a task at the deadline it was last given; an earlier one no longer counts", function()
    local l = loop.new()
    local extended = l:spawn(function()
      mirza.sleep(0.05)
      return "finished"
    end)
    extended:deadline(0.001):deadline(30) -- the first one must not cancel it
    local shortened = l:spawn(function() mirza.sleep(30) end)
    shortened:deadline(30):deadline(0.01)
    assert.same({ true, "finished" }, { extended:join() })
    local ok, msg, code = shortened:join()
    assert.same({ nil, "timeout", "deadline of 0.01 s exceeded" }, { ok, code, msg })
  end)

  it("cancels tasks past their deadlines in the order of the deadlines", function()
    local l, ended, due = loop.new(), {}, {}
    for _, ms in ipairs { 30, 10, 20 } do
      local t = l:spawn(function() mirza.sleep(30) end)
      due[ms] = mirza.now() + ms / 1000 -- as above: the order of the deadlines as set
      t:deadline(ms / 1000):on_done(function(d) ended[#ended + 1] = ms .. " " .. d.code end)
    end
    l:run()
    local want = { 30, 10, 20 }
    table.sort(want, function(a, b) return due[a] < due[b] end)
    for i, ms in ipairs(want) do want[i] = ms .. " timeout" end
    assert.same(want, ended)
  end)

  it("wakes a task woken early from a timed wait at its next sleep's end, not at the old timeout", function()
    local l, seen = loop.new(), {}
    local c = loop.condition(l)
    local a = l:spawn(function()
      local signalled = c:wait(0.02)
      seen[#seen + 1] = signalled and "signalled" or "timed out"
      mirza.sleep(0.08) -- the wait's timer (0.02) is stale now
      seen[#seen + 1] = "slept"
    end)
    l:spawn(function()
      c:signal()
      mirza.sleep(0.04) -- past the stale timer, before a's sleep ends
      seen[#seen + 1] = a:done() and "a done" or "a asleep"
    end)
    l:run()
    assert.same({ "signalled", "a asleep", "slept" }, seen)
  end)

  -- A task's pending timers left in the heap when it is cancelled (its
  -- sleep) or finishes (its deadline) made `step()` sleep until they were
  -- due: `while l:step() do end` after cancelling a task asleep for an hour
  -- waited that hour.
  it("drops the sleep timer of a cancelled task and the deadline of a finished one", function()
    local l = loop.new()
    local t = l:spawn(function() mirza.sleep(3) end)
    l:run(function() return t.status == "waiting" end) -- run checks after the ready tasks ran, before waiting
    t:cancel()
    assert.is_false(l:step(), "a step waited for a cancelled task's timer")
    local quick = l:spawn(function() return 1 end)
    quick:deadline(3)
    assert.is_true(quick:join())
    assert.is_false(l:step(), "a step waited for a finished task's deadline")
  end)
end)
