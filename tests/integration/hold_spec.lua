-- mirza.open's `hold` (issue 20 item 4): a stream that holds hands its
-- events over at most every `hold` seconds, all at once (with merge: one
-- event per channel run), instead of as each read queues one; nothing is
-- lost, the end comes at once, and `first_at()` keeps when the first token
-- was read. A held stream is read less often as its answer ages (client.c's
-- rule: at most an eighth of its age late), not as each frame comes; an
-- engine's say holds 5 ms by default (its `hold`).
local mirza = require "mirza"
local loop = require "mirza.loop"
local H = require "tests.helper"

-- This process's voluntary context switches (a wait that slept), or nil
-- where /proc is not there.
local function switches() return H.proc_count("status", "voluntary_ctxt_switches") end

describe("mirza.open hold", function()
  local sim
  setup(function() sim = H.start_sim { "--parallel", "16", "--quiet" } end)
  teardown(function() if sim then sim.stop() end end)

  local TEXT = "s " .. ("w "):rep(39) -- 40 tokens

  local function open(opts)
    local o = { url = sim.url, merge = true,
      body = H.chat_body("q", { mirza_sim = { text = TEXT, tok_rate = 40, ttft_ms = 300 } }) }
    for k, v in pairs(opts or {}) do o[k] = v end
    return mirza.open(o)
  end

  it("hands a paced answer over in a few events, every byte, in order", function()
    local t0 = mirza.now()
    local s <close> = open { hold = 0.4 }
    local texts, first_seen, last
    for ev in s:events() do
      if ev.type == "text" then
        texts = (texts or "") .. ev.text
        first_seen = first_seen or mirza.now()
      end
      last = ev
    end
    assert.equal(TEXT, texts)
    assert.equal("done", last.type)
    assert.equal(40, last.usage.completion_tokens)
    -- 1 s of tokens handed over every 0.4 s: a few events, not 40
    local n = 0
    s:close()
    local again <close> = open { hold = 0.4 }
    for ev in again:events() do if ev.type == "text" then n = n + 1 end end
    assert.is_true(n >= 2 and n <= 6, ("%d text events"):format(n))
    -- the first token's time is when it was read, not when it was handed over
    local at = s:first_at()
    assert.is_true(at - t0 >= 0.29, "first_at before the daemon's time to first token")
    assert.is_true(at < first_seen, "first_at is the handing over")
  end)

  it("hands the end over at once, whatever the hold", function()
    local t0 = mirza.now()
    local s <close> = open { hold = 600 }
    local r = H.drain(s)
    assert.equal(TEXT, r.text)
    assert.equal("done", r.last.type)
    assert.is_true(mirza.now() - t0 < 60, "the end waited for the hold")
    assert.is_number(s:first_at())
  end)

  it("with step, hands the token after the first over as it comes, and step() is the daemon's pace", function()
    local s <close> = open { hold = 600, step = true }
    assert.is_nil(s:step())
    local a = s:next()
    assert.equal("text", a.type)
    local b = s:next() -- not held 600 s: at once
    assert.equal("text", b.type)
    local dt = s:step()
    assert.is_number(dt)
    assert.is_true(dt > 0.01 and dt < 0.2, ("step %.3f s at 40 tokens/s"):format(dt)) -- 25 ms
    local r = H.drain(s)
    assert.equal(TEXT, a.text .. b.text .. r.text)
    -- heartbeats between the tokens (a 100 ms step, one every 20 ms) are reads too: the stream stays
    -- read as it comes until its step, not parked at the first of them (its next token read 250 ms on)
    local hb = H.start_sim { "--parallel", "4", "--quiet", "--heartbeat-ms", "20" }
    finally(function() hb.stop() end)
    local slow <close> = mirza.open { url = hb.url, merge = true, hold = 600, step = true,
      body = H.chat_body("q", { mirza_sim = { text = TEXT, tok_rate = 10, ttft_ms = 0 } }) }
    local ev
    repeat ev = slow:next() until not ev or slow:step() or ev.type == "done" or ev.type == "error"
    local sdt = slow:step()
    assert.is_true(sdt and sdt > 0.05 and sdt < 0.18, ("step %s s at 10 tokens/s"):format(tostring(sdt)))
  end)

  it("holds nothing with hold = false or 0, and refuses a negative hold, naming it", function()
    for _, h in ipairs { false, 0 } do
      local s <close> = open { hold = h }
      local n = 0
      for ev in s:events() do if ev.type == "text" then n = n + 1 end end
      assert.is_true(n > 10, ("%d text events with hold = %s"):format(n, tostring(h)))
    end
    local ok, err = pcall(open, { hold = -1 })
    assert.is_false(ok)
    assert.matches("'hold' must be a non%-negative number of seconds", err)
  end)

  it("gives a batch item's ttft_ms as the first token was read, not as its text was handed over", function()
    local batch = require "mirza.batch"
    -- heartbeats every 50 ms while the daemon prefills: the first token
    -- comes less than a hold after one, so it is held with them
    local hb = H.start_sim { "--parallel", "16", "--quiet", "--heartbeat-ms", "50" }
    finally(function() hb.stop() end)
    local input, output = H.tmpname(".jsonl"), H.tmpname(".jsonl")
    local lines = {}
    for i = 1, 3 do
      lines[i] = mirza.json.encode { custom_id = "h" .. i, body = { messages = { { role = "user", content = "q" } },
        mirza_sim = { text = TEXT, tok_rate = 40, ttft_ms = 300 } } }
    end
    H.write_file(input, table.concat(lines, "\n") .. "\n")
    -- a fixed limit: no start round asks for a step (that token is handed over at once, the held first one
    -- with it, 25 ms on: close to the first token's read either way)
    local st = assert(batch.run { input = input, output = output, endpoints = { hb.base }, model = "m",
      quiet = true, progress = false, hold = 1, limit = 16 })
    assert.equal(3, st.done_now)
    local n = 0
    for line in io.lines(output) do
      local rec = mirza.json.decode(line)
      n = n + 1
      assert.equal(TEXT, rec.response.body.choices[1].message.content)
      -- the daemon's 300 ms, read as it came (the first token is read to the byte): as handed
      -- over (a second after the heartbeat before it), 1000 or more
      local ttft = rec.mirza.ttft_ms
      assert.is_true(ttft >= 290 and ttft < 900, ("ttft_ms %s"):format(tostring(ttft)))
      assert.is_true(rec.mirza.tok_s > 20 and rec.mirza.tok_s < 80, ("tok_s %s"):format(tostring(rec.mirza.tok_s)))
    end
    assert.equal(3, n)
    os.remove(input)
    os.remove(output)
  end)

  -- 2,000 tokens at 10,000 a second: 0.2 s, a frame every 0.1 ms
  local FAST = ("f "):rep(2000)
  local function fast_body() return H.chat_body("q", { mirza_sim = { text = FAST, tok_rate = 10000, ttft_ms = 0 } }) end

  it("waiting on one fast stream, reads what it holds once per hold, not once per frame", function()
    local s <close> = mirza.open { url = sim.url, merge = true, hold = 0.005, body = fast_body() }
    local before = switches()
    local parts, n = {}, 0
    for ev in s:events() do
      if ev.type == "text" then parts[#parts + 1], n = ev.text, n + 1
      elseif ev.type == "error" then error(ev.message) end
    end
    local slept = before and switches() - before
    assert.equal(FAST, table.concat(parts))
    assert.is_true(n < 200, ("%d text events for 2000 tokens"):format(n))
    -- a wake-up per frame: about 2,000; muted between reads (client.c's rule): far fewer
    if slept then assert.is_true(slept < 400, ("%d waits for 2000 frames"):format(slept)) end
  end)

  it("in an engine's say, hands a fast answer to the sinks once per hold (the engine's `hold`)", function()
    local engine = require "mirza.engine"
    local function say(hold)
      local e = engine.new { base_url = sim.base .. "/v1", daemon = false, config_file = false, model_id = "m",
        dialect = "mtplx", log = function() end, hold = hold }
      assert(e:load())
      local parts = {}
      local st, res = e:say("q", { mode = "token", answer = function(text) parts[#parts + 1] = text end,
        body_extra = { mirza_sim = { text = FAST, tok_rate = 10000, ttft_ms = 0 } }, max_tokens = 2100 })
      e:close()
      assert(st, res)
      assert.equal(FAST, table.concat(parts))
      assert.equal(FAST, res.answer)
      return #parts
    end
    local held = say(nil) -- the default: 5 ms
    assert.is_true(held < 200, ("%d sink calls for 2000 tokens"):format(held))
    say(false) -- off: every byte too
    for _, bad in ipairs { -1, "5", 61 } do
      local ok, err = pcall(engine.new,
        { base_url = sim.base .. "/v1", daemon = false, config_file = false, hold = bad })
      assert.is_false(ok)
      assert.matches("'hold' must be seconds from 0 to 60, or false, got " .. tostring(bad), err, 1, true)
    end
  end)

  it("a scheduler whose streams hold to the end reads them in fewer waits, not per token", function()
    -- 8 streams of 100 tokens at 100 tokens/s (1 s), each held to the end
    -- (what mirza.collect does in a task): read as they come, a wait per
    -- token (~800); read at most an eighth of their age late (client.c's
    -- rule), on a shared grid, about 150
    local function run(hold)
      local l, texts, fns = loop.new(), {}, {}
      local text = ("w "):rep(100)
      for i = 1, 8 do
        fns[i] = function()
          local s <close> = mirza.open { url = sim.url, merge = true, hold = hold,
            body = H.chat_body("q", { mirza_sim = { text = text, tok_rate = 100, ttft_ms = 3 * i } }) }
          local parts = {}
          for ev in s:events() do
            if ev.type == "text" then parts[#parts + 1] = ev.text
            elseif ev.type == "error" then error(ev.message) end
          end
          texts[i] = table.concat(parts)
        end
      end
      local before = switches()
      local _, errs, nerr = loop.gather(fns, { loop = l })
      assert.are.equal(0, nerr, nerr > 0 and select(2, next(errs)) or nil)
      for i = 1, 8 do assert.equal(text, texts[i]) end
      return before and switches() - before
    end
    local held, free = run(math.huge), run(false)
    if held then
      assert.is_true(held * 3 < free, ("%d waits for 800 frames held to the end, %d read as they come"):format(held,
        free))
    end
  end)
end)
