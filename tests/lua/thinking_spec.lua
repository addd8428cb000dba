-- mirza.thinking: budget steps, levels, max tokens, request fields, hook.
local thinking = require "mirza.thinking"

describe("mirza.thinking", function()
  after_each(function() collectgarbage("collect") end)

  it("starts off, and set_thinking toggles the default budget", function()
    local s = thinking.state()
    assert.equal(0, s.budget)
    assert.is_false(thinking.enabled(s))
    assert.equal(1024, thinking.set_thinking(s, true))
    assert.is_true(thinking.enabled(s))
    assert.equal(0, thinking.set_thinking(s, false))
    assert.is_false(thinking.enabled(s))
  end)

  it("set_budget clamps at 0, floors, and does not snap", function()
    local s = thinking.state(2048)
    assert.equal(2048, s.budget)
    assert.equal(0, thinking.set_budget(s, -50))
    assert.equal(700, thinking.set_budget(s, 700.9))
    assert.equal(700, s.budget)
    assert.equal(5000, thinking.set_budget(s, 5000))
    assert.has_error(function() thinking.set_budget(s, "lots") end, "thinking.set_budget: budget must be a number")
  end)

  it("maps budgets to the smallest step that holds them", function()
    local cases = {
      { 0, "off" }, { 1, "low" }, { 512, "low" }, { 513, "medium" }, { 1024, "medium" },
      { 1025, "high" }, { 2048, "high" }, { 100000, "high" }, { -3, "off" },
    }
    for _, c in ipairs(cases) do
      assert.equal(c[2], thinking.level(c[1]), "budget " .. c[1])
    end
    assert.is_nil(thinking.effort(0))
    assert.equal("medium", thinking.effort(1024))
    for _, step in ipairs(thinking.STEPS) do assert.equal(step, thinking.step(step)) end
  end)

  it("resolves max tokens for thinking and plain turns", function()
    local s = thinking.state(0)
    assert.equal(512, thinking.max_tokens(s, 512, 4096))
    assert.is_nil(thinking.max_tokens(s, nil, 4096))
    thinking.set_budget(s, 1024)
    assert.equal(4096, thinking.max_tokens(s, 512, 4096))
    assert.equal(512 + 1024, thinking.max_tokens(s, 512, nil))
    assert.is_nil(thinking.max_tokens(s, nil, nil))
  end)

  describe("request_fields", function()
    it("mtplx: enable_thinking and a safe reasoning_effort", function()
      local s = thinking.state(0)
      assert.same({ enable_thinking = false }, thinking.request_fields(s, "mtplx"))
      for budget, effort in pairs({ [300] = "low", [1024] = "medium", [2048] = "high", [9000] = "high" }) do
        thinking.set_budget(s, budget)
        assert.same({ enable_thinking = true, reasoning_effort = effort }, thinking.request_fields(s, "mtplx"))
      end
    end)

    it("mtplx: never sends a value outside the accepted set", function()
      local s = thinking.state(2048)
      s.efforts = { low = true, medium = true } -- a daemon without "high"
      assert.same({ enable_thinking = true }, thinking.request_fields(s, "mtplx"))
      local all = { auto = true, low = true, medium = true, high = true, xhigh = true }
      for _, b in ipairs({ 1, 512, 600, 1024, 2000, 2048, 4096 }) do
        local f = thinking.request_fields(thinking.state(b), "mtplx")
        assert.is_true(thinking.SAFE_EFFORTS[f.reasoning_effort] and all[f.reasoning_effort])
      end
    end)

    it("llama: chat_template_kwargs and the exact budget", function()
      local s = thinking.state(0)
      assert.same({ chat_template_kwargs = { enable_thinking = false } }, thinking.request_fields(s, "llama"))
      thinking.set_budget(s, 700)
      assert.same({ chat_template_kwargs = { enable_thinking = true }, thinking_budget_tokens = 700 },
        thinking.request_fields(s, "llama"))
      -- no top-level fields llama-server would ignore
      assert.is_nil(thinking.request_fields(s, "llama").enable_thinking)
    end)

    it("a per-turn budget overrides the state's", function()
      local s = thinking.state(1024)
      assert.same({ enable_thinking = false }, thinking.request_fields(s, "mtplx", 0))
    end)

    it("rejects an unknown dialect", function()
      assert.has_error(function() thinking.request_fields(thinking.state(), "gemini") end,
        'thinking.request_fields: unknown dialect "gemini"')
    end)

    it("openai: OpenAI's reasoning_effort when thinking, nothing when not", function()
      assert.same({}, thinking.request_fields(thinking.state(0), "openai"))
      assert.same({ reasoning_effort = "low" }, thinking.request_fields(thinking.state(300), "openai"))
      assert.same({ reasoning_effort = "high" }, thinking.request_fields(thinking.state(4096), "openai"))
    end)
  end)

  describe("decide", function()
    it("keeps the state's budget without a hook", function()
      assert.equal(512, thinking.decide("anything", thinking.state(512)))
    end)

    it("calls the hook with the prompt, clamps its answer", function()
      local s = thinking.state(1024)
      local seen
      s.decide = function(p, st)
        seen = p
        if p:find("quick") then return -10 end
        return st.budget * 2
      end
      assert.equal(2048, thinking.decide("explain this", s))
      assert.equal("explain this", seen)
      assert.equal(0, thinking.decide("quick one", s))
      assert.equal(1024, s.budget) -- the state is not changed
      s.decide = function() return "high" end
      assert.has_error(function() thinking.decide("x", s) end, "thinking: decide hook must return a number")
    end)

    it("the sample auto hook depends on the prompt", function()
      local s = thinking.state(512)
      s.decide = thinking.auto
      assert.equal(0, thinking.decide("Bonjour !", s))
      assert.equal(0, thinking.decide("hi there", s))
      assert.equal(1024, thinking.decide("Pourquoi le ciel est-il bleu ?", s))
      assert.equal(1024, thinking.decide("What is 17 * 23 exactly, if you please?", s))
      assert.equal(1024, thinking.decide("Explain how a heat pump works in winter.", s))
      assert.equal(512, thinking.decide("Tell me a story about a small red fox.", s))
      -- whole words: "show" is not "how"
      assert.equal(512, thinking.decide("Show me a picture of the old harbour please", s))
    end)

    it("plan bundles budget, fields and max tokens", function()
      local s = thinking.state(0)
      s.decide = function() return 2048 end
      local p = thinking.plan(s, "x", "mtplx", { max_tokens = 256 })
      assert.same({ budget = 2048, fields = { enable_thinking = true, reasoning_effort = "high" },
        max_tokens = 256 + 2048 }, p)
      s.decide = nil
      p = thinking.plan(s, "x", "llama", { max_tokens = 256, max_tokens_thinking = 4096 })
      assert.same({ budget = 0, fields = { chat_template_kwargs = { enable_thinking = false } },
        max_tokens = 256 }, p)
    end)
  end)
end)
