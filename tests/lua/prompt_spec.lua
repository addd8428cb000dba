-- mirza.prompt: input formats, history without reasoning, context budget.
local prompt = require "mirza.prompt"
local json = require("mirza").json

local function roles(msgs)
  local out = {}
  for _, m in ipairs(msgs) do out[#out + 1] = m.role .. ":" .. tostring(m.content) end
  return out
end

describe("mirza.prompt", function()
  after_each(function() collectgarbage("collect") end)

  describe("messages", function()
    it("a plain string is one user message", function()
      local m, kind = prompt.messages("Bonjour, ça va ?")
      assert.equal("text", kind)
      assert.same({ { role = "user", content = "Bonjour, ça va ?" } }, m)
    end)

    it("a JSON message list string is that list", function()
      local s = json.encode({ { role = "system", content = "Be brief." }, { role = "user", content = "Hi" } })
      local m, kind = prompt.messages(s)
      assert.equal("list", kind)
      assert.same({ { role = "system", content = "Be brief." }, { role = "user", content = "Hi" } }, m)
    end)

    it("invalid JSON, or JSON that is not a message list, is user text", function()
      for _, s in ipairs({ '[{"role": "user", "content": "hi"', "[1, 2, 3]", "[]", '[{"role":"wizard","content":"x"}]',
        '  [ "a" ]', '{"role":"user","content":"x"}' }) do
        assert.same({ { role = "user", content = s } }, prompt.messages(s), s)
      end
    end)

    it("a Lua list or a single message table", function()
      assert.same({ { role = "user", content = "x" } }, prompt.messages({ role = "user", content = "x" }))
      local list = { { role = "user", content = "a" }, { role = "assistant", content = "b" } }
      assert.same(list, prompt.messages(list))
    end)

    it("drops reasoning fields and keeps tool calls", function()
      local list = {
        { role = "user", content = "weather?" },
        { role = "assistant", content = json.null, reasoning_content = "hmm", tool_calls = { { id = "1" } } },
        { role = "tool", content = "sunny", tool_call_id = "1" },
      }
      local m = prompt.messages(list)
      assert.is_nil(m[2].reasoning_content)
      assert.same({ { id = "1" } }, m[2].tool_calls)
      assert.equal("1", m[3].tool_call_id)
    end)

    it("rejects bad tables with nil, message, code", function()
      local m, msg, code = prompt.messages({ { role = "user" } })
      assert.is_nil(m)
      assert.equal("prompt", code)
      assert.equal("message 1: content must be a string or a list of parts", msg)
      m, msg, code = prompt.messages({ { role = "robot", content = "x" } })
      assert.is_nil(m)
      assert.equal("message 1: unknown role robot", msg)
      assert.equal("prompt", code)
      m, msg, code = prompt.messages(42)
      assert.is_nil(m)
      assert.equal("prompt must be a string or a message list, got number", msg)
      assert.equal("prompt", code)
      assert.is_nil((prompt.messages({})))
    end)
  end)

  describe("history", function()
    it("is a plain table with a system prompt", function()
      local h = prompt.history("Tu es Mirza.")
      assert.same({ system = "Tu es Mirza.", messages = {} }, h)
      prompt.set_system(h, "Sois bref.")
      assert.equal("Sois bref.", h.system)
    end)

    it("stores assistant turns without their reasoning", function()
      local h = prompt.history()
      prompt.add_user(h, "2+2?")
      prompt.add_assistant(h, "<think>The user wants a sum. 2+2=4.</think>\n\n4.")
      prompt.add(h, { role = "assistant", content = "Yes.", reasoning_content = "sure" })
      prompt.add_assistant(h, "<think>cut while thinking, never closed")
      assert.same({
        { role = "user", content = "2+2?" },
        { role = "assistant", content = "4." },
        { role = "assistant", content = "Yes." },
        { role = "assistant", content = "" },
      }, h.messages)
    end)

    it("add raises on a malformed message", function()
      assert.has_error(function() prompt.add(prompt.history(), { role = "user", content = 3 }) end,
        "prompt.add: message 1: content must be a string or a list of parts")
    end)

    it("add_turn records the current messages and the answer; clear keeps the system", function()
      local h = prompt.history("S")
      local msgs, info = prompt.build(h, "Hello")
      assert.same({ "system:S", "user:Hello" }, roles(msgs))
      prompt.add_turn(h, info.current, "<think>greeting</think>Hi!")
      assert.same({ "user:Hello", "assistant:Hi!" }, roles(h.messages))
      msgs = prompt.build(h, "How are you?")
      assert.same({ "system:S", "user:Hello", "assistant:Hi!", "user:How are you?" }, roles(msgs))
      prompt.clear(h)
      assert.same({}, h.messages)
      assert.equal("S", h.system)
    end)

    it("the prefix sent on the next turn is identical to the previous request's", function()
      local h = prompt.history("System.")
      local first, info = prompt.build(h, "Question one")
      prompt.add_turn(h, info.current, "<think>long reasoning</think>Answer one")
      local second = prompt.build(h, "Question two")
      assert.same(first, { second[1], second[2] })
      assert.equal(json.encode(first[2]), json.encode(second[2]))
    end)
  end)

  describe("build", function()
    it("a list input's system replaces the history's for that request only", function()
      local h = prompt.history("default system")
      local msgs = prompt.build(h, { { role = "system", content = "special" }, { role = "user", content = "q" } })
      assert.same({ "system:special", "user:q" }, roles(msgs))
      assert.equal("default system", h.system)
    end)

    it("without a history, a seed-style JSON conversation is sent as is", function()
      local conv = json.encode({
        { role = "system", content = "S" }, { role = "user", content = "a" },
        { role = "assistant", content = "b" }, { role = "user", content = "c" },
      })
      local msgs, info = prompt.build(nil, conv)
      assert.same({ "system:S", "user:a", "assistant:b", "user:c" }, roles(msgs))
      assert.same({ { role = "user", content = "c" } }, info.current)
      assert.is_true(info.fits)
      assert.equal(0, info.dropped)
    end)

    it("returns nil, message, code for a bad input", function()
      local m, msg, code = prompt.build(prompt.history(), { { role = "nobody", content = "" } })
      assert.is_nil(m)
      assert.equal("prompt", code)
      assert.is_string(msg)
    end)

    it("documents its estimate: ceil(bytes/4) + 5 per message + 3", function()
      assert.equal(3 + 5 + 3, prompt.estimate({ { role = "user", content = "123456789" } }))
      assert.equal(3 + (1 + 5) + (2 + 5), prompt.estimate({
        { role = "system", content = "abcd" }, { role = "user", content = { { type = "text", text = "abcdefgh" } } } }))
      assert.equal(2 + 5, prompt.estimate_message({ role = "user", content = "é" .. "à" .. "ü" })) -- 6 bytes
      assert.equal(5 + 5, prompt.estimate_message({ role = "assistant", content = json.null,
        tool_calls = { { ["function"] = { name = "get", arguments = '{"city":"Paris"}' } } } }))
    end)

    -- A history of n turns, each user + assistant of `size` bytes.
    local function long_history(n, size)
      local h = prompt.history("You are a helpful assistant.")
      for i = 1, n do
        prompt.add_user(h, ("u%02d "):format(i) .. ("x"):rep(size - 4))
        prompt.add_assistant(h, ("a%02d "):format(i) .. ("y"):rep(size - 4))
      end
      return h
    end

    it("keeps everything when it fits", function()
      local h = long_history(5, 400)
      local msgs, info = prompt.build(h, "next", { context_window = 4096, reserve = 512 })
      assert.equal(12, #msgs)
      assert.equal(0, info.dropped)
      assert.is_true(info.fits)
      assert.equal(prompt.estimate(msgs), info.tokens)
      assert.equal(4096 - 512, info.budget)
    end)

    it("trims the oldest whole turns, never the system or the current message", function()
      local h = long_history(20, 400) -- each message ~105 tokens: ~4200 in all
      local msgs, info = prompt.build(h, "the current question", { context_window = 4096, reserve = 1024 })
      assert.is_true(info.fits)
      assert.equal(20, info.dropped) -- 10 whole turns
      assert.equal("system", msgs[1].role)
      assert.equal("You are a helpful assistant.", msgs[1].content)
      assert.same({ role = "user", content = "the current question" }, msgs[#msgs])
      assert.equal("user", msgs[2].role)                     -- a turn starts with its question
      assert.equal("u11 ", msgs[2].content:sub(1, 4))    -- the oldest kept turn
      assert.matches("^a20", msgs[#msgs - 1].content)       -- the newest turns stay
      assert.is_true(prompt.estimate(msgs) <= 4096 - 1024)
      -- trimmed down to the low-water mark, not just under the budget
      assert.is_true(info.tokens <= math.floor((4096 - 1024) * 0.75))
      -- and the history itself was trimmed, in place
      assert.equal(40 - info.dropped, #h.messages)
      assert.equal(msgs[2], h.messages[1])
    end)

    it("keeps the same prefix for the turns after a trim (cache friendly)", function()
      local h = long_history(20, 400)
      local o = { context_window = 4096, reserve = 1024 }
      local msgs, info = prompt.build(h, "q1", o)
      local first_kept = msgs[2].content
      prompt.add_turn(h, info.current, "short answer")
      for i = 2, 4 do
        msgs, info = prompt.build(h, "q" .. i, o)
        assert.equal(0, info.dropped)
        assert.equal(first_kept, msgs[2].content)
        prompt.add_turn(h, info.current, "short answer")
      end
    end)

    it("reserving more completion tokens trims more", function()
      local _, small = prompt.build(long_history(20, 400), "q", { context_window = 8192, reserve = 512 })
      local _, big = prompt.build(long_history(20, 400), "q", { context_window = 8192, reserve = 6000 })
      assert.equal(0, small.dropped)
      assert.equal(26, big.dropped)
    end)

    it("reports fits=false when even system + current are too big", function()
      local h = long_history(3, 100)
      local msgs, info = prompt.build(h, ("z"):rep(20000), { context_window = 2048, reserve = 256 })
      assert.is_false(info.fits)
      assert.same({ "system", "user" }, { msgs[1].role, msgs[2].role })
      assert.equal(2, #msgs)
      assert.equal(0, #h.messages)
    end)

    it("trims a seed-style list's older turns without a history", function()
      local conv = { { role = "system", content = "S" } }
      for i = 1, 30 do
        conv[#conv + 1] = { role = "user", content = ("q%d "):format(i) .. ("x"):rep(300) }
        conv[#conv + 1] = { role = "assistant", content = ("a%d "):format(i) .. ("y"):rep(300) }
      end
      conv[#conv + 1] = { role = "user", content = "final" }
      local msgs, info = prompt.build(nil, conv, { context_window = 2048, reserve = 256 })
      assert.is_true(info.fits)
      assert.equal("S", msgs[1].content)
      assert.equal("final", msgs[#msgs].content)
      assert.equal("user", msgs[2].role)
      assert.equal(#conv - info.dropped, #msgs)
    end)
  end)

  it("last_user_text finds the last user message, parts included", function()
    assert.equal("b", prompt.last_user_text({ { role = "user", content = "a" }, { role = "assistant", content = "x" },
      { role = "user", content = "b" } }))
    assert.equal("see this", prompt.last_user_text({ { role = "user", content = {
      { type = "text", text = "see" }, { type = "image_url", image_url = { url = "data:" } },
      { type = "text", text = "this" } } } }))
    assert.equal("", prompt.last_user_text({ { role = "system", content = "s" } }))
  end)
end)
