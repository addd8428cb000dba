-- mirza.collect in a mirza.loop task (issue 31 item 10): a collect that
-- calls nothing before the end (no `on_json`) holds its stream to the end
-- in C (`hold = math.huge`, merged), so its task wakes for the whole
-- answer, not for each token, and its result is an unheld collect's: the
-- text, the reasoning, the usage and finish reason, or the error's
-- message, code and the text received before it. With `on_json` its
-- values still come as they complete. `mirza.open{hold = math.huge}`
-- itself hands nothing over before the end.
local mirza = require "mirza"
local loop = require "mirza.loop"
local H = require "tests.helper"

-- Run fn() as the one task of a loop of its own: its results (packed)
-- and how many times the loop resumed a task.
local function in_task(fn)
  local l = loop.new()
  local out
  l:spawn(function() out = table.pack(fn()) end)
  l:run()
  return out, l.resumes
end

-- What of a result must not depend on the hold (stats and timings carry
-- the daemon's clocks, and the usage its prefix cache's hits, which
-- differ from one request to the next).
local function essence(r)
  if type(r) ~= "table" then return r end
  local u = r.usage
  return { text = r.text, think = r.think, finish_reason = r.finish_reason, tool_calls = r.tool_calls,
    usage = u and { u.prompt_tokens, u.completion_tokens, u.total_tokens } }
end

describe("mirza.collect in a task", function()
  local sim
  setup(function() sim = H.start_sim { "--parallel", "16", "--quiet", "--progress-every", "0" } end)
  teardown(function() if sim then sim.stop() end end)

  -- 40 tokens (10 of them reasoning) at 200 a second: 0.2 s, a frame
  -- every 5 ms, so an unheld collect wakes its task per token or so.
  local function opts(extra, sim_extra)
    local ms = { answer_tokens = 30, reasoning_tokens = 10, tok_rate = 200, ttft_ms = 0 }
    for k, v in pairs(sim_extra or {}) do ms[k] = v end
    local o = { url = sim.url, body = H.chat_body("q", { enable_thinking = true, mirza_sim = ms }) }
    for k, v in pairs(extra or {}) do o[k] = v end
    return o
  end

  it("wakes its task for the whole answer, not per token, with an unheld collect's result", function()
    local held, n_held = in_task(function() return mirza.collect(opts()) end)
    local plain, n_plain = in_task(function() return mirza.collect(opts { hold = false }) end)
    assert.is_table(held[1], tostring(held[2]))
    assert.is_true(n_held <= 4, ("%d resumes for 40 tokens"):format(n_held))
    assert.is_true(n_plain > 10, ("%d resumes unheld: the pacing no longer tells"):format(n_plain))
    assert.same(essence(plain[1]), essence(held[1]))
    assert.equal(40, held[1].usage.completion_tokens)
    assert.is_true(#held[1].think > 0 and #held[1].text > 0)
    assert.is_table(held[1].stats)
  end)

  it("fails as an unheld collect does, the text before the error kept", function()
    local cases = {
      { name = "cut", sim = { fault = "cut-after=12" } },
      { name = "stall", sim = { fault = "stall-after=12" }, req = { stall_timeout = 0.3 } },
    }
    for _, c in ipairs(cases) do
      local held, n_held = in_task(function() return mirza.collect(opts(c.req, c.sim)) end)
      local req = { hold = false }
      for k, v in pairs(c.req or {}) do req[k] = v end
      local plain = in_task(function() return mirza.collect(opts(req, c.sim)) end)
      assert.is_nil(held[1], c.name)
      assert.equal(plain[2], held[2], c.name)
      assert.equal(plain[3], held[3], c.name)
      assert.same(plain[4], held[4], c.name)
      assert.is_true(#held[4].think + #held[4].text > 0, c.name .. ": nothing kept")
      assert.is_true(n_held <= 4, ("%s: %d resumes"):format(c.name, n_held))
    end
  end)

  -- A JSON answer of 8 records, each some 12 tokens, at 100 tokens a second.
  local function records()
    local out = {}
    for i = 1, 8 do out[i] = ('{"id": %d, "name": "record %d"}'):format(i, i) end
    return '{"records": [' .. table.concat(out, ", ") .. "]}"
  end

  it("with on_json, hands each value over as it completes", function()
    local body = H.chat_body("q", { mirza_sim = { text = records(), tok_rate = 100, ttft_ms = 0 } })
    local at = {} -- the loop's resumes when each value came
    local out = in_task(function()
      local l = loop.current().loop
      return mirza.collect { url = sim.url, body = body, json = { depth = 2 },
        on_json = function() at[#at + 1] = l.resumes end }
    end)
    assert.is_table(out[1], tostring(out[2]))
    assert.equal(records(), out[1].text)
    assert.equal(8, #at)
    local distinct = 1
    for i = 2, #at do if at[i] ~= at[i - 1] then distinct = distinct + 1 end end
    assert.is_true(distinct >= 6, ("the 8 values came in %d wake-ups"):format(distinct))
  end)

  it("with json and no on_json, holds to the end all the same", function()
    local body = H.chat_body("q", { mirza_sim = { text = records(), tok_rate = 100, ttft_ms = 0 } })
    local out, n = in_task(function()
      return mirza.collect { url = sim.url, body = body, json = { depth = 2 } }
    end)
    assert.is_table(out[1], tostring(out[2]))
    assert.equal(records(), out[1].text)
    assert.is_nil(out[1].json_error)
    assert.is_true(n <= 4, ("%d resumes"):format(n))
  end)

  it("mirza.open{hold = math.huge} hands nothing over before the end; first_at is the first token's", function()
    local s <close> = mirza.open(opts { hold = math.huge, merge = true })
    local evs, first_seen = {}, nil
    for ev in s:events() do
      first_seen = first_seen or mirza.now()
      evs[#evs + 1] = ev.type
    end
    assert.same({ "think", "text", "done" }, evs) -- one event per channel run: nothing before the end
    assert.is_true(s:first_at() > 0 and s:first_at() < first_seen)
  end)
end)
