-- next(timeout) in mirza.loop tasks among other timers (issue 19 item 8):
-- several pending at once end in the order of their deadlines, sleeps
-- between them; a task that reads every event with next(timeout) sets a
-- new timer per call and is never timed out by an earlier call's. Checked
-- by the order things end in, never by how long they took.
local mirza = require "mirza"
local loop = require "mirza.loop"
local H = require "tests.helper"

describe("mirza.loop next(timeout)", function()
  local sim
  setup(function() sim = H.start_sim { "--parallel", "4", "--ttft-ms", "0" } end)
  teardown(function() sim.stop() end)
  after_each(function() collectgarbage("collect") end)

  local function open(ctl)
    return mirza.open { url = sim.url, body = H.chat_body("x", { mirza_sim = ctl }) }
  end

  it("times out pending next() calls and sleeps in the order of their deadlines", function()
    local ended = {}
    loop.run(function()
      local function reader(name, timeout)
        return loop.spawn(function()
          local s <close> = open { ttft_ms = 10000 } -- no event before the timeouts
          local ev, msg, code = s:next(timeout)
          ended[#ended + 1] = ("%s %s %s %s"):format(name, tostring(ev), msg, code)
        end)
      end
      local a, b = reader("a", 0.3), reader("b", 0.1)
      local c = loop.spawn(function()
        mirza.sleep(0.2)
        ended[#ended + 1] = "c slept"
      end)
      for _, t in ipairs { a, b, c } do assert(t:join()) end
    end)
    assert.same({ "b nil timeout timeout", "c slept", "a nil timeout timeout" }, ended)
    assert.equal(0, mirza.streams())
  end)

  it("never times out a reader calling next(timeout) per event on the timer of an earlier call", function()
    local got
    loop.run(function()
      local s <close> = open { tok_rate = 25, answer_tokens = 40 } -- ~1.6 s, an event per 40 ms
      local n = 0
      while true do
        local ev, msg, code = s:next(0.6) -- every earlier call's timer would fire during a later wait
        if not ev then
          got = ("after %d events: %s %s"):format(n, msg, code)
          return
        end
        n = n + 1
        if ev.type == "done" then
          got = "done"
          return
        end
      end
    end)
    assert.equal("done", got)
  end)
end)
