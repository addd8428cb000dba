-- mirza.loop's run queue (issue 20): a task queued holds its resume values
-- beside it, not in a table of its own: one value as it is, several (or a
-- lone nil) packed. Every value must still arrive, in order and counted:
-- the arguments a task was spawned with, what a plain coroutine.yield()
-- is resumed with, what a condition's waiter is woken with. No socket.
local loop = require "mirza.loop"

describe("mirza.loop run queue", function()
  it("starts a task with every argument it was spawned with, nils counted", function()
    local l, got = loop.new(), {}
    local function keep(...) got[#got + 1] = table.pack(...) end
    l:spawn(keep)
    l:spawn(keep, "one")
    l:spawn(keep, nil)
    l:spawn(keep, 1, nil, 3, nil)
    l:spawn(keep, false)
    l:run()
    assert.same({ { n = 0 }, { "one", n = 1 }, { n = 1 }, { 1, nil, 3, nil, n = 4 }, { false, n = 1 } }, got)
  end)

  it("resumes a task that yielded plainly after the others, with nothing", function()
    local l, order = loop.new(), {}
    l:spawn(function()
      order[#order + 1] = "a1"
      local n = select("#", coroutine.yield()) -- before `#order`: b writes meanwhile
      order[#order + 1] = n
      order[#order + 1] = "a2"
    end)
    l:spawn(function() order[#order + 1] = "b" end)
    l:run()
    assert.same({ "a1", "b", 0, "a2" }, order)
  end)

  it("wakes a condition's waiter with what its wait returns, signal or timeout", function()
    local l, got = loop.new(), {}
    local c = loop.condition(l)
    l:spawn(function() got.signalled = c:wait(5) end)
    l:spawn(function() got.timed_out = c:wait(0.001) end)
    l:run(function() return got.timed_out ~= nil end)
    l:spawn(function() c:signal() end)
    l:run()
    assert.is_true(got.signalled)
    assert.is_false(got.timed_out)
  end)
end)
