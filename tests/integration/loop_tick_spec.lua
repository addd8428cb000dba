-- mirza.loop's tick (issue 20 item 4): a scheduler with `tick = S` that has
-- to wait looks at its streams at most every S seconds, so paced streams
-- are read a tick's worth at a time — one wait per tick, not one per token
-- — and lose nothing: every byte arrives, in order, and timers still fire.
local mirza = require "mirza"
local loop = require "mirza.loop"
local H = require "tests.helper"

local STREAMS, TOKENS, RATE = 8, 100, 200 -- 0.5 s per stream

describe("mirza.loop tick", function()
  local sim
  setup(function() sim = H.start_sim { "--parallel", "16", "--ttft-ms", "0", "--quiet" } end)
  teardown(function() if sim then sim.stop() end end)

  -- STREAMS paced streams at once on a loop with this tick; returns the
  -- loop, the texts, and the events read.
  local function run(tick)
    local l = loop.new { tick = tick }
    local texts, events, fns = {}, 0, {}
    for i = 1, STREAMS do
      fns[i] = function()
        local s <close> = mirza.open { url = sim.url, body = H.chat_body("q" .. i,
          { mirza_sim = { text = ("s%d "):format(i) .. ("w "):rep(TOKENS - 1), tok_rate = RATE } }) }
        local parts = {}
        for ev in s:events() do
          if ev.type == "text" then parts[#parts + 1] = ev.text; events = events + 1
          elseif ev.type == "error" then error(ev.message) end
        end
        texts[i] = table.concat(parts)
      end
    end
    local _, errs, nerr = loop.gather(fns, { loop = l })
    assert.are.equal(0, nerr, nerr > 0 and select(2, next(errs)) or nil)
    return l, texts, events
  end

  it("waits once per tick, not once per token, and every byte arrives", function()
    local t0 = mirza.now()
    local l, texts, events = run(0.1)
    local wall = mirza.now() - t0
    for i = 1, STREAMS do assert.are.equal(("s%d "):format(i) .. ("w "):rep(TOKENS - 1), texts[i]) end
    assert.are.equal(STREAMS * TOKENS, events)
    assert.is_true(l.pauses > 0, "the waits were shortened to ticks")
    -- at most a wait per tick (and the few of the start and the end)
    assert.is_true(l.polls <= wall / 0.1 * 1.5 + 8, ("%d waits in %.2f s"):format(l.polls, wall))
  end)

  it("without a tick, waits as the tokens come (the figure the tick is measured against)", function()
    local l, _, events = run(nil)
    assert.are.equal(0, l.pauses)
    assert.is_true(l.polls > events / STREAMS, ("%d waits for %d events"):format(l.polls, events))
  end)

  it("is 0.25 s while mirza.batch runs (tick = 0: none), and the loop's own comes back after", function()
    local batch = require "mirza.batch"
    local input, out = H.tmpname(".jsonl"), H.tmpname(".jsonl")
    finally(function() os.remove(input); os.remove(out) end)
    local f = assert(io.open(input, "w"))
    for i = 1, 4 do
      f:write(mirza.json.encode { custom_id = "c" .. i, body = { messages = { { role = "user", content = "q" } },
        mirza_sim = { answer_tokens = 20, tok_rate = 100 } } }, "\n")
    end
    f:close()
    local function ticks_seen(tick)
      os.remove(out)
      local l, seen, over = loop.default(), {}, false
      loop.run(function()
        loop.spawn(function()
          while not over do
            seen[#seen + 1] = l.tick or "none"
            mirza.sleep(0.01)
          end
        end)
        local st = batch.run { input = input, output = out, endpoints = { sim.base .. "/v1" }, model = "m",
          quiet = true, tick = tick }
        over = true
        assert.are.equal(4, st.done_now)
      end)
      assert.is_nil(l.tick, "the default loop's tick is back")
      return seen
    end
    local seen = ticks_seen(nil)
    assert.are.equal(0.25, seen[#seen])
    seen = ticks_seen(0)
    assert.are.equal("none", seen[#seen])
  end)

  it("gives the loop's own tick back after two batches that overlap, whichever ends first", function()
    local batch = require "mirza.batch"
    local files = {}
    local function input(n, tokens)
      local path = H.tmpname(".jsonl")
      files[#files + 1] = path
      local f = assert(io.open(path, "w"))
      for i = 1, n do
        f:write(mirza.json.encode { custom_id = "c" .. i, body = { messages = { { role = "user", content = "q" } },
          mirza_sim = { answer_tokens = tokens, tok_rate = 200 } } }, "\n")
      end
      f:close()
      return path
    end
    finally(function() for _, p in ipairs(files) do os.remove(p) end end)
    local short, long = input(2, 10), input(2, 400) -- 0.05 s and 2 s: ticks of 0.25 apart
    local out1, out2 = H.tmpname(".jsonl"), H.tmpname(".jsonl")
    files[#files + 1], files[#files + 2] = out1, out2
    os.remove(out1)
    os.remove(out2)
    local l = loop.default()
    l.tick = 0.01 -- the script's own
    local during
    loop.run(function()
      local a = loop.spawn(function()
        return batch.run { input = long, output = out1, endpoints = { sim.base .. "/v1" }, model = "m", quiet = true }
      end)
      local b = loop.spawn(function()
        return batch.run { input = short, output = out2, endpoints = { sim.base .. "/v1" }, model = "m", quiet = true }
      end)
      assert.truthy(b:join()) -- the second one ends first
      during = l.tick
      assert.truthy(a:join())
    end)
    assert.are.equal(0.25, during, "the first batch still runs: its tick")
    assert.are.equal(0.01, l.tick, "both ended: the loop's own")
    l.tick = nil
  end)

  it("hands a short answer over as it ends: a task runs item after item, not one per tick", function()
    -- 4 tasks x 6 short answers each under a 5 s tick: seen a tick late,
    -- 6 ticks (30 s); handed over as they end, well under one tick. The
    -- second kind is paced (a token every 5 ms) and opened as a short
    -- answer (`short`): a pause reads it to its end.
    for _, rate in ipairs { 0, 200 } do
      local l, done, fns = loop.new { tick = 5 }, 0, {}
      for i = 1, 4 do
        fns[i] = function()
          for j = 1, 6 do
            local s <close> = mirza.open { url = sim.url, short = rate > 0, body = H.chat_body("q" .. i .. j,
              { mirza_sim = { text = "a b c", tok_rate = rate } }) }
            for ev in s:events() do
              if ev.type == "error" then error(ev.message) end
            end
            done = done + 1
          end
        end
      end
      local t0 = mirza.now()
      local _, errs, nerr = loop.gather(fns, { loop = l })
      assert.are.equal(0, nerr, nerr > 0 and select(2, next(errs)) or nil)
      assert.are.equal(24, done)
      assert.is_true(mirza.now() - t0 < 5, ("rate %d: %.1f s for 24 short answers at a 5 s tick"):format(rate,
        mirza.now() - t0))
    end
  end)

  it("reads a stream under way once per tick while short answers around it end", function()
    -- a paced answer (2 s, merged: one event per read) beside a task that
    -- runs short answers back to back until it ends: each short end is
    -- handed over at once, without a look at the paced one, which is read
    -- once per 0.5 s tick (~5 reads); a look at each short end reads it
    -- every few milliseconds (~100)
    local l, reads, shorts, over = loop.new { tick = 0.5 }, 0, 0, false
    local text = ("w "):rep(200)
    local _, errs, nerr = loop.gather({
      function()
        local s <close> = mirza.open { url = sim.url, merge = true, body = H.chat_body("long",
          { mirza_sim = { text = text, tok_rate = 100 } }) }
        for ev in s:events() do
          if ev.type == "text" then reads = reads + 1
          elseif ev.type == "error" then error(ev.message) end
        end
        over = true
      end,
      function()
        while not over do
          local s <close> = mirza.open { url = sim.url, body = H.chat_body("s",
            { mirza_sim = { text = "a b", tok_rate = 0 } }) }
          for ev in s:events() do
            if ev.type == "error" then error(ev.message) end
          end
          shorts = shorts + 1
        end
      end,
    }, { loop = l })
    assert.are.equal(0, nerr, nerr > 0 and select(2, next(errs)) or nil)
    assert.is_true(shorts > 20, shorts .. " short answers in 2 s")
    assert.is_true(reads < 20, ("%d reads of the paced answer beside %d short ones"):format(reads, shorts))
  end)

  it("still fires timers and sleeps, on time", function()
    local l = loop.new { tick = 0.05 }
    local slept, fired
    l:spawn(function()
      local t0 = mirza.now()
      mirza.sleep(0.03)
      slept = mirza.now() - t0
    end)
    l:at(mirza.now() + 0.02, function() fired = true end)
    l:run()
    assert.is_true(fired)
    assert.is_true(slept >= 0.03, tostring(slept))
  end)
end)
