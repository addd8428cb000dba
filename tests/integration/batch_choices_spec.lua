-- The batch record of an answer with several choices and logprobs, and
-- what the server said of itself (issue 36 items 3-4): each choice's text
-- by its index (two interleaved choices were joined into one,
-- "HelloBonjour there toi.!"), its finish reason and its logprobs kept,
-- `logprobs: null` where OpenAI's shape has it; body.model the model that
-- answered, system_fingerprint and created the server's when it sends
-- them.
local mirza = require "mirza"
local batch = require "mirza.batch"
local batch_output = require "mirza.batch_output"
local json = mirza.json
local H = require "tests.helper"

local function line(id, body)
  body.messages = body.messages or { { role = "user", content = "prompt " .. id } }
  return json.encode { custom_id = id, method = "POST", url = "/v1/chat/completions", body = body }
end

-- Run lines through a batch on sim; the records by custom_id.
local function run_lines(sim, lines)
  local input, output = H.tmpname(".jsonl"), H.tmpname(".jsonl")
  H.write_file(input, table.concat(lines, "\n") .. "\n")
  finally(function()
    os.remove(input)
    os.remove(output)
    os.remove(batch_output.errors_path(output))
  end)
  local st = assert(batch.run { input = input, output = output, endpoints = { sim.base }, quiet = true,
    progress = false })
  local by = H.batch_records(output)
  return by, st
end

local sims = {}
teardown(function() for _, s in pairs(sims) do s.stop() end end)

for _, dialect in ipairs { "mtplx", "llama" } do
  describe("batch records (" .. dialect .. ")", function()
    local sim
    setup(function()
      sim = H.start_sim { "--dialect", dialect, "--model-id", "served-7b", "--tok-rate", "0", "--ttft-ms", "0",
        "--quiet" }
      sims[#sims + 1] = sim
    end)
    after_each(function() collectgarbage("collect") end)

    it("n = 2: each choice by its index, its finish reason, its logprobs", function()
      local by, st = run_lines(sim, {
        line("two", { model = "m", n = 2, logprobs = true, top_logprobs = 1, max_tokens = 2,
          chat_template_kwargs = { enable_thinking = false },
          mirza_sim = { texts = { "Hello there!", "Bonjour toi. Encore" } } }),
      })
      assert.equal(0, st.errors)
      local body = by.two.response.body
      assert.equal(2, #body.choices)
      local c0, c1 = body.choices[1], body.choices[2]
      assert.same({ 0, "Hello there!", "stop" }, { c0.index, c0.message.content, c0.finish_reason })
      assert.same({ 1, "Bonjour toi. ", "length" }, { c1.index, c1.message.content, c1.finish_reason })
      local function tokens(c)
        local t = {}
        for _, x in ipairs(c.logprobs.content) do
          assert.is_true(x.logprob <= 0)
          assert.same({ x.token:byte(1, -1) }, x.bytes)
          assert.equal(x.token, x.top_logprobs[1].token)
          t[#t + 1] = x.token
        end
        return t
      end
      assert.same({ "Hello ", "there!" }, tokens(c0))
      assert.same({ "Bonjour ", "toi. " }, tokens(c1))
      assert.equal(4, body.usage.completion_tokens)
    end)

    it("logprobs null where OpenAI's shape has it; the model that answered; the server's created and fingerprint",
      function()
        local t0 = os.time()
        local by = run_lines(sim, { line("one", { model = "asked", mirza_sim = { text = "Fine." } }) })
        local body = by.one.response.body
        assert.equal(1, #body.choices)
        assert.equal(json.null, body.choices[1].logprobs)
        assert.equal("Fine.", body.choices[1].message.content)
        assert.same({ "served-7b", "asked" }, { body.model, by.one.mirza.model })
        assert.is_true(math.type(body.created) == "integer" and body.created >= t0 - 1 and body.created <= os.time(),
          tostring(body.created))
        if dialect == "llama" then assert.equal("b9928-mirza-sim", body.system_fingerprint)
        else assert.is_nil(body.system_fingerprint) end -- MTPLX sends none: none made up
        -- the raw record has the keys (a null is written, not left out)
        local raw = json.encode(body)
        assert.truthy(raw:find('"logprobs":null', 1, true), raw)
      end)
  end)
end
