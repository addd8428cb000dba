-- The scheduler (mirza.loop) against mirza-sim over real loopback HTTP:
-- 256 concurrent streams with every byte checked, only ready tasks woken,
-- joins, errors that do not stop the others, cancellation observed by the
-- simulator, deadlines, gather/as_completed, and plain scripts unchanged.
local mirza = require "mirza"
local loop = require "mirza.loop"
local H = require "tests.helper"

-- A distinct exact text per stream, so a byte from another stream shows.
local function text_for(i, words)
  local t = {}
  for w = 1, words do t[w] = ("s%dw%d"):format(i, w) end
  return table.concat(t, " ") .. " é✓"
end

local function open(sim, text, ctl)
  local body = H.chat_body("loop", { stream_options = { include_usage = true } })
  body.mirza_sim = ctl or {}
  body.mirza_sim.text = text
  return mirza.open { url = sim.url, body = body, stall_timeout = 60 }
end

-- Read a stream to the end inside a task: text and the final event.
local function read_all(s)
  local out, last = {}, nil
  for ev in s:events() do
    if ev.type == "text" then out[#out + 1] = ev.text end
    last = ev
  end
  return table.concat(out), last
end

describe("mirza.loop", function()
  local sim
  setup(function()
    sim = H.start_sim { "--parallel", "300", "--ttft-ms", "0", "--tok-rate", "200", "--verbose",
      "--heartbeat-ms", "0" }
  end)
  teardown(function() sim.stop() end)
  after_each(function() collectgarbage("collect") end)

  it("runs 256 streams at once, every byte correct, waking only ready tasks", function()
    local l = loop.new()
    local n, words = 256, 40
    local tasks, events = {}, 0
    local t0 = mirza.now()
    for i = 1, n do
      tasks[i] = l:spawn(function()
        local s <close> = open(sim, text_for(i, words))
        local out, last = {}, nil
        for ev in s:events() do
          events = events + 1
          if ev.type == "text" then out[#out + 1] = ev.text end
          last = ev
        end
        return table.concat(out), last.type, mirza.streams()
      end)
    end
    local peak = 0
    l:run(function()
      peak = math.max(peak, mirza.streams())
      return l.alive == 0
    end)
    local dt = mirza.now() - t0
    for i = 1, n do
      local ok, text, last = tasks[i]:join()
      assert.is_true(ok)
      assert.equal(text_for(i, words), text)
      assert.equal("done", last)
    end
    assert.is_true(peak >= n / 2, "streams were not concurrent: peak " .. peak)
    -- A task is resumed when one of its events arrived (or to start): a
    -- scheduler that woke every waiting task would resume far more often.
    assert.is_true(l.resumes <= events + 2 * n, ("resumes %d for %d events"):format(l.resumes, events))
    print(("\n  256 streams x %d tokens: %.2f s, %d events, %d resumes, %d waits"):format(words, dt, events,
      l.resumes, l.polls))
    -- at 200 tok/s a stream takes ~0.2 s: sequentially 256 of them take ~50 s
    assert.is_true(dt < 40, ("256 streams took %.1f s"):format(dt))
    assert.equal(0, mirza.streams())
  end)

  it("keeps a task waiting on a stream alive through collections, though nothing else holds it", function()
    -- spawned and dropped: only the scheduler holds these tasks while their
    -- streams wait (each stream itself only on its task's stack)
    local l, texts, done = loop.new(), {}, 0
    for i = 1, 32 do
      l:spawn(function()
        local s <close> = open(sim, text_for(i, 20))
        texts[i] = read_all(s)
        done = done + 1
      end)
    end
    local deadline = mirza.now() + 10 -- a task collected never ends: fail, not hang (done in ~0.2 s)
    l:spawn(function()
      while done < 32 and mirza.now() < deadline do
        collectgarbage("collect")
        mirza.sleep(0.01)
      end
    end)
    l:run(function() return done == 32 or mirza.now() >= deadline end)
    for i = 1, 32 do assert.equal(text_for(i, 20), texts[i]) end
  end)

  it("shares the time between streams flat out: every one progresses", function()
    local l = loop.new()
    local n, words = 16, 2000
    local counts, total, at_half, queued = {}, 0, nil, 0
    local all_queued = loop.condition(l)
    for i = 1, n do
      counts[i] = 0
      l:spawn(function()
        local s <close> = open(sim, text_for(i, words), { tok_rate = 0 })
        -- every stream wholly queued before any is read: each always has
        -- more, whatever order a loaded simulator answered them in
        local t0 = mirza.now()
        while not s:finished() do
          assert(mirza.now() - t0 < 60, "stream " .. i .. " was not queued in 60 s")
          mirza.sleep(0.01)
        end
        queued = queued + 1
        if queued == n then
          all_queued:broadcast() -- every waiter is ready at once: they take turns from here
        else
          all_queued:wait(60)
          assert(queued == n, "the other streams were not queued in 60 s")
        end
        for ev in s:events() do
          if ev.type == "text" then
            counts[i], total = counts[i] + 1, total + 1
            if total == n * words // 2 then at_half = table.move(counts, 1, n, 1, {}) end
          end
        end
      end)
    end
    l:run()
    assert.equal(n * (words + 1), total) -- every word and the closing "é✓"
    local least = math.huge
    for i = 1, n do least = math.min(least, at_half[i]) end
    -- half-way through, each stream has had a real share, not none
    assert.is_true(least >= words // 8, ("a stream had %d of %d words at half time"):format(least, words))
  end)

  it("joins results and errors; one task's error leaves the others running", function()
    local reported = {}
    local l = loop.new { on_error = function(t, msg) reported[#reported + 1] = { t = t, msg = msg } end }
    local good = {}
    for i = 1, 3 do
      good[i] = l:spawn(function() return read_all(open(sim, text_for(i, 8))) end)
    end
    local function explode() error("kaboom in task") end
    local bad = l:spawn(function()
      local s <close> = open(sim, text_for(9, 8))
      s:next()
      explode()
    end)
    l:run()
    for i = 1, 3 do
      local ok, text = good[i]:join()
      assert.is_true(ok)
      assert.equal(text_for(i, 8), text)
    end
    local ok, msg, code = bad:join()
    assert.is_nil(ok)
    assert.equal("error", code)
    assert.truthy(msg:find("kaboom in task", 1, true))
    assert.truthy(msg:find("explode", 1, true), "no traceback: " .. msg) -- the traceback names the function
    assert.equal(1, #reported)
    assert.equal(bad, reported[1].t)
    assert.equal(0, mirza.streams()) -- the failed task's stream was closed
  end)

  it("cancels a task: its connection closes at once (the simulator sees it)", function()
    local l = loop.new()
    local got = 0
    local long = l:spawn(function()
      local s = open(sim, text_for(1, 100000), { tok_rate = 50 }) -- never closed by the task itself
      for ev in s:events() do if ev.type == "text" then got = got + 1 end end
    end)
    local before = select(2, H.read_file(sim.log):gsub(" 499 ", ""))
    l:run(function() return got >= 3 end)
    assert.equal(1, mirza.streams())
    local t0 = mirza.now()
    assert.is_true(long:cancel())
    assert.equal(0, mirza.streams()) -- closed synchronously
    local ok, msg, code = long:join()
    assert.is_nil(ok)
    assert.equal("cancelled", msg)
    assert.equal("cancelled", code)
    -- the simulator logs the request as abandoned by the client (499)
    local seen = H.wait_for(function()
      return select(2, H.read_file(sim.log):gsub(" 499 ", "")) > before
    end, 20, 0.02)
    assert.is_truthy(seen, "the simulator did not see the disconnect")
    print(("\n  cancel -> simulator saw the disconnect after %.0f ms"):format((mirza.now() - t0) * 1000))
    assert.is_false(long:cancel()) -- already over
  end)

  it("cancels a task waiting in a pipeline stage, running its <close> variables", function()
    local pipeline = require "mirza.pipeline"
    local l = loop.new()
    local closed = false
    local t = l:spawn(function()
      local _ <close> = setmetatable({}, { __close = function() closed = true end })
      local s = open(sim, text_for(2, 100000), { tok_rate = 50 })
      local stage = pipeline.map(function(ev) return ev end)
      local it = pipeline.compose(function() return s:next() end, { stage })
      for _ in it do end
    end)
    l:run(function() return mirza.streams() == 1 and l.nwaiting == 1 end)
    t:cancel()
    assert.is_true(closed)
    assert.equal(0, mirza.streams())
  end)

  it("gives deadlines to tasks and timeouts to next() without stopping others", function()
    local l = loop.new()
    local slow = l:spawn(function() return read_all(open(sim, text_for(3, 1000), { tok_rate = 20 })) end)
    slow:deadline(0.3)
    local polled = l:spawn(function()
      local s <close> = open(sim, "late", { ttft_ms = 5000 })
      local t0 = mirza.now()
      local ev, msg, code = s:next(0.2)
      return ev, msg, code, mirza.now() - t0
    end)
    local quick = l:spawn(function() return read_all(open(sim, text_for(4, 5))) end)
    l:run()
    local ok, msg, code = slow:join()
    assert.is_nil(ok)
    assert.equal("timeout", code)
    assert.truthy(msg:find("deadline", 1, true))
    local ok2, ev, m2, c2, waited = polled:join()
    assert.is_true(ok2)
    assert.is_nil(ev)
    assert.equal("timeout", m2)
    assert.equal("timeout", c2)
    assert.is_true(waited >= 0.19 and waited < 4, "waited " .. waited)
    assert.equal(text_for(4, 5), select(2, quick:join()))
    assert.equal(0, mirza.streams())
  end)

  it("keeps the timer heap bounded when every next() has a timeout", function()
    local l = loop.new()
    -- a live timer earlier than the reader's: the cancelled ones pile up behind it
    local sleeper = l:spawn(function() mirza.sleep(20) end)
    local t = l:spawn(function()
      local s <close> = open(sim, text_for(7, 3000), { tok_rate = 3000 })
      local n, peak = 0, 0
      while true do
        local ev = assert(s:next(30))
        if ev.type == "text" then n = n + 1 end
        peak = math.max(peak, #l.timers)
        if ev.type == "done" then break end
      end
      return n, peak
    end)
    local t0 = mirza.now()
    local ok, n, peak = t:join()
    -- join returns when the task is done, not at the next timer (20 s away)
    assert.is_true(mirza.now() - t0 < 15, "join waited for an unrelated timer")
    sleeper:cancel()
    assert.is_true(ok)
    assert.is_true(n >= 1000, "text events: " .. tostring(n))
    assert.is_true(peak <= 200, "timer heap grew to " .. tostring(peak))
  end)

  it("tells a condition's waiters whether they were signalled or timed out, in a task and outside", function()
    local l = loop.new()
    local c = loop.condition(l)
    local got = {}
    l:spawn(function() got.signalled = c:wait(30) end)
    l:spawn(function() got.timed_out = c:wait(0.01) end)
    l:spawn(function()
      while got.timed_out == nil do mirza.sleep(0.005) end -- the short wait is over: only the long one is queued
      got.woke = c:signal()
      got.nobody = c:signal()
    end)
    l:run()
    assert.same({ signalled = true, timed_out = false, woke = true, nobody = false }, got)
    -- outside a task, wait runs the scheduler until signalled or timed out
    l:spawn(function() c:signal() end)
    assert.is_true(c:wait(30))
    assert.is_false(c:wait(0.01))
  end)

  it("returns a timeout from next(timeout) in a task, the stream still open", function()
    local s <close> = open(sim, "late", { ttft_ms = 5000 })
    local ev, msg, code
    loop.run(function() ev, msg, code = s:next(0.05) end)
    assert.same({ nil, "timeout", "timeout" }, { ev, msg, code })
    assert.is_false(s:closed())
  end)

  it("gathers with a concurrency limit, results in order", function()
    local running, peak, fns = 0, 0, {}
    for i = 1, 12 do
      fns[i] = function()
        running = running + 1
        peak = math.max(peak, running)
        local text = read_all(open(sim, text_for(i, 6)))
        running = running - 1
        if i == 5 then error("item five") end
        return text
      end
    end
    local results, errors, nerr = loop.gather(fns, { limit = 3, loop = loop.new() })
    assert.equal(3, peak)
    assert.equal(1, nerr)
    assert.truthy(errors[5]:find("item five", 1, true))
    for i = 1, 12 do
      if i ~= 5 then assert.equal(text_for(i, 6), results[i]) end
    end
  end)

  it("gather keeps every value each function returned, nils among them, as join does", function()
    local fns = {
      function()
        local text = read_all(open(sim, "two words"))
        return text, nil, 3
      end,
      function() return nil, "no answer", "refused" end,
      function() error("item three") end,
      function() end,
      function()
        mirza.sleep(0.01)
        return "a", "b", nil
      end,
    }
    local results, errors, nerr, all = loop.gather(fns, { limit = 2, loop = loop.new() })
    assert.same({ "two words", [5] = "a" }, results)
    assert.equal(1, nerr)
    assert.truthy(errors[3]:find("item three", 1, true))
    assert.same({ n = 3, "two words", nil, 3 }, all[1])
    assert.same({ n = 3, nil, "no answer", "refused" }, all[2])
    assert.is_nil(all[3])
    assert.same({ n = 0 }, all[4])
    assert.same({ n = 3, "a", "b", nil }, all[5])
  end)

  it("iterates tasks as they complete, and runs mirza.request/sleep cooperatively", function()
    local l = loop.new()
    -- spawned in the order c, a, b; c waits (sleeping in steps) until b is
    -- done, b until a is done, then b makes a request: run one after the
    -- other they would never finish, concurrently they finish a, b, c
    -- whatever the machine's load (no race between two clocks)
    local done, ticks = {}, 0
    local function until_done(name)
      local t0 = mirza.now()
      while not done[name] do
        assert(mirza.now() - t0 < 30, "waited 30 s for task " .. name)
        mirza.sleep(0.01)
        ticks = ticks + 1
      end
    end
    local tasks = {
      l:spawn(function()
        until_done("b")
        return "c"
      end),
      l:spawn(function()
        mirza.sleep(0.05)
        done.a = true
        return "a"
      end),
      l:spawn(function()
        until_done("a")
        local before = ticks
        local body = H.chat_body("plain", { stream = false, mirza_sim = { text = "b", ttft_ms = 600 } })
        local res = assert(mirza.request { url = sim.url, body = body })
        done.b = true
        return mirza.json.decode(res).choices[1].message.content, ticks - before
      end),
    }
    local order, during = {}, nil
    for t in loop.as_completed(tasks) do
      local ok, v, n = t:join()
      assert.is_true(ok, v)
      order[#order + 1] = v
      if v == "b" then during = n end
    end
    assert.same({ "a", "b", "c" }, order)
    -- c kept sleeping in steps while b's request was in flight (600 ms)
    assert.is_true(during > 0, "no other task ran during mirza.request")
  end)

  it("inside a task in a task: join suspends, loop.run returns results", function()
    local v = loop.run(function()
      local child = loop.spawn(function() return read_all(open(sim, "child text")) end)
      local ok, text = child:join()
      return ok and text
    end)
    assert.equal("child text", v)
    local ok, err = pcall(loop.run, function() error("top level", 0) end)
    assert.is_false(ok)
    assert.truthy(err:find("^top level\nstack traceback"))
  end)

  it("leaves scripts without a scheduler unchanged (blocking next, timeouts)", function()
    local s <close> = open(sim, "plain", { ttft_ms = 3000 })
    local ev, msg, code = s:next(0.05)
    assert.is_nil(ev)
    assert.equal("timeout", msg)
    assert.equal("timeout", code)
    assert.is_nil(loop.current())
    local s2 <close> = open(sim, "blocking read")
    assert.equal("blocking read", H.drain(s2).text)
  end)

  it("runs engines in tasks: conversations at once, barge-in cancels a turn", function()
    local engine = require "mirza.engine"
    local function new(extra)
      local opts = { preset = "mirza-sim", base_url = sim.base .. "/v1", autostart = false, config_file = false,
        model = "mirza-sim",
        log = function() end, max_tokens = 48 }
      for k, v in pairs(extra or {}) do opts[k] = v end
      local e = engine.new(opts)
      assert(e:load())
      return e
    end
    local e1, e2 = new(), new()
    local slow = new { max_tokens = 400, body_extra = { mirza_sim = { tok_rate = 20 } } }
    assert.are_not.equal(e1.cfg.session_id, e2.cfg.session_id) -- MTPLX answers 409 to a shared one
    local l = loop.new()
    local b1, b2 = {}, {}
    local t1 = l:spawn(function() return e1:say("Bonjour", { answer = function(x) b1[#b1 + 1] = x end }) end)
    local t2 = l:spawn(function() return e2:say("Hello", { answer = function(x) b2[#b2 + 1] = x end }) end)
    local got = 0
    local barge = l:spawn(function()
      return slow:say("Raconte une longue histoire", { answer = function() got = got + 1 end })
    end)
    l:run(function() return t1:done() and t2:done() and got >= 2 end)
    local ok1, st1 = t1:join()
    local ok2, st2 = t2:join()
    assert.is_true(ok1 and ok2)
    assert.is_true(st1.tokens > 0 and st2.tokens > 0)
    assert.is_nil(st1.error)
    assert.is_true(#table.concat(b1) > 0 and #table.concat(b2) > 0)
    assert.equal("running", barge:done() and "over" or "running") -- still streaming: 400 tokens at 20/s
    local before = select(2, H.read_file(sim.log):gsub(" 499 ", ""))
    barge:cancel() -- barge-in
    assert.equal(0, mirza.streams())
    assert.truthy(H.wait_for(function() return select(2, H.read_file(sim.log):gsub(" 499 ", "")) > before end, 20))
    -- the conversation goes on after the barge-in
    local t3 = l:spawn(function() return slow:say("Plus court", {}) end)
    local ok3, st3 = t3:join()
    assert.is_true(ok3)
    assert.is_nil(st3.error)
  end)
end)
