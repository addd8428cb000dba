-- Several choices (n > 1) and logprobs (issue 36 item 3), on mirza-sim
-- in both dialects: the simulator streams them in vLLM's and OpenAI's
-- shape (a role frame per choice, then one choice per frame, interleaved,
-- each token's logprobs {token, logprob, bytes, top_logprobs}, a finish
-- frame per choice, usage at the end), and a plain mirza.open stream
-- hands each choice's deltas out under its own ev.index (none for choice
-- 0), with done.choices giving each choice's finish reason and logprobs,
-- and done the model, system_fingerprint and created the server sent.
local mirza = require "mirza"
local H = require "tests.helper"
local json = mirza.json

local TEXTS = { "Hello there!", "Bonjour toi." }

-- The data frames of an SSE body, decoded; "[DONE]" kept as the string.
local function frames(sse)
  local out = {}
  for data in sse:gmatch("data: ([^\n]*)\n\n") do out[#out + 1] = data == "[DONE]" and data or json.decode(data) end
  return out
end

local function body(extra)
  local b = { model = "m", stream = true, n = 2, stream_options = { include_usage = true },
    mirza_sim = { texts = TEXTS }, messages = { { role = "user", content = "hi" } } }
  for k, v in pairs(extra or {}) do b[k] = v end
  return b
end

local sims = {}
teardown(function() for _, s in pairs(sims) do s.stop() end end)

for _, dialect in ipairs { "mtplx", "llama" } do
  describe("n = 2 and logprobs (" .. dialect .. ")", function()
    local s
    setup(function()
      s = H.start_sim { "--dialect", dialect, "--tok-rate", "0", "--ttft-ms", "0", "--quiet" }
      sims[#sims + 1] = s
    end)

    it("mirza-sim streams one choice per frame, interleaved, each token's logprobs, a finish per choice", function()
      local raw = assert(mirza.request { url = s.url, timeout = 10,
        body = body { logprobs = true, top_logprobs = 2, chat_template_kwargs = { enable_thinking = false } } })
      local fs = frames(raw)
      assert.equal("[DONE]", fs[#fs])
      local order, text, finish, roles, tokens = {}, { [0] = {}, [1] = {} }, {}, {}, { [0] = {}, [1] = {} }
      for i = 1, #fs - 1 do
        local f = fs[i]
        assert.equal("chat.completion.chunk", f.object)
        assert.is_true(#f.choices <= 1, "one choice per frame")
        local ch = f.choices[1]
        if ch then
          local d = ch.delta
          if d.role then roles[#roles + 1] = ch.index end
          if d.content and d.content ~= json.null and d.content ~= "" then
            order[#order + 1] = ch.index
            text[ch.index][#text[ch.index] + 1] = d.content
            local lp = ch.logprobs.content
            assert.equal(1, #lp)
            assert.equal(d.content, lp[1].token)
            assert.is_true(lp[1].logprob <= 0)
            assert.same({ d.content:byte(1, -1) }, lp[1].bytes)
            assert.equal(2, #lp[1].top_logprobs)
            assert.same({ d.content, lp[1].logprob }, { lp[1].top_logprobs[1].token, lp[1].top_logprobs[1].logprob })
            assert.is_true(lp[1].top_logprobs[2].logprob < lp[1].logprob)
            tokens[ch.index][#tokens[ch.index] + 1] = lp[1].token
          end
          if ch.finish_reason ~= json.null and ch.finish_reason ~= nil then finish[ch.index] = ch.finish_reason end
        elseif f.usage then
          assert.equal(i, #fs - 1, "usage last")
          assert.equal(4, f.usage.completion_tokens, "every choice's tokens")
        end
      end
      assert.same({ 0, 1 }, roles)
      assert.same({ 0, 1, 0, 1 }, order)
      assert.same({ TEXTS[1], TEXTS[2] }, { table.concat(text[0]), table.concat(text[1]) })
      assert.same({ [0] = "stop", [1] = "stop" }, finish)
    end)

    it("mirza.open: each choice's deltas under its index, done.choices with finish reasons and logprobs", function()
      local st <close> = mirza.open { url = s.url, body = body { logprobs = true, max_tokens = 1,
        chat_template_kwargs = { enable_thinking = false },
        mirza_sim = { texts = { "Hello there!", "Bonjour" } } } }
      local r = H.drain(st, 10)
      local by = { [0] = {}, [1] = {} }
      for _, ev in ipairs(r.events) do
        if ev.type == "text" then
          assert.is_true(ev.index == nil or ev.index == 1, "choice 0 has no index")
          table.insert(by[ev.index or 0], ev.text)
        end
      end
      assert.same({ { "Hello " }, { "Bonjour" } }, { by[0], by[1] })
      local done = r.last
      assert.equal("done", done.type)
      assert.equal("length", done.finish_reason)
      assert.equal(2, #done.choices)
      assert.same({ 0, "length" }, { done.choices[1].index, done.choices[1].finish_reason })
      assert.same({ 1, "stop" }, { done.choices[2].index, done.choices[2].finish_reason }) -- its whole text in 1 token
      assert.same({ "Hello " }, { done.choices[1].logprobs.content[1].token })
      assert.same({ "Bonjour" }, { done.choices[2].logprobs.content[1].token })
      assert.equal("mirza-sim", done.model)
      assert.is_true(math.abs(done.created - os.time()) < 60, tostring(done.created))
      if dialect == "llama" then assert.equal("b9928-mirza-sim", done.system_fingerprint)
      else assert.is_nil(done.system_fingerprint) end
    end)

    it("n = 2 without logprobs: the texts apart, finish reasons per choice, no logprobs", function()
      local st <close> = mirza.open { url = s.url, merge = true,
        body = body { chat_template_kwargs = { enable_thinking = false } } }
      local r = H.drain(st, 10)
      local by = { [0] = {}, [1] = {} }
      for _, ev in ipairs(r.events) do
        if ev.type == "text" then table.insert(by[ev.index or 0], ev.text) end
      end
      assert.same(TEXTS, { table.concat(by[0]), table.concat(by[1]) })
      assert.same({ "stop", "stop" }, { r.last.choices[1].finish_reason, r.last.choices[2].finish_reason })
      assert.is_nil(r.last.choices[1].logprobs)
    end)

    it("non-streamed: every choice's message, in index order", function()
      local r = json.decode(assert(mirza.request { url = s.url, timeout = 10, body = body { stream = false,
        stream_options = json.null, chat_template_kwargs = { enable_thinking = false } } }))
      assert.equal(2, #r.choices)
      for i, c in ipairs(r.choices) do
        assert.same({ i - 1, TEXTS[i], "stop" }, { c.index, c.message.content, c.finish_reason })
      end
      assert.equal(4, r.usage.completion_tokens)
    end)

    it("n = 1: as before, no done.choices; n out of range is a 400", function()
      local st <close> = mirza.open { url = s.url, body = body { n = 1 } }
      local r = H.drain(st, 10)
      assert.equal("done", r.last.type)
      assert.is_nil(r.last.choices)
      assert.equal(TEXTS[1], r.text)
      local _, msg, code, status = mirza.request { url = s.url, body = body { n = 17 }, timeout = 10 }
      assert.same({ "http", 400 }, { code, status }, msg)
    end)
  end)
end
