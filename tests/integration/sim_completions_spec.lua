-- mirza-sim's POST /v1/completions (issue 18 item 5): OpenAI's
-- text_completion, streamed and not, in both dialects (llama-server's
-- member order in its), the same text both ways, usage at the end, the
-- prefix cache and max_tokens as for chat. The SSE body is read whole
-- (mirza.request) and split here: mirza's stream decoder reads chat deltas.
local mirza = require "mirza"
local H = require "tests.helper"
local json = mirza.json

local function post(sim, body)
  return assert(mirza.request { url = sim.base .. "/v1/completions", body = body, timeout = 10 })
end

-- The data frames of an SSE body, decoded; "[DONE]" kept as the string.
local function frames(sse)
  local out = {}
  for data in sse:gmatch("data: ([^\n]*)\n\n") do out[#out + 1] = data == "[DONE]" and data or json.decode(data) end
  return out
end

local sims = {}
teardown(function() for _, s in pairs(sims) do s.stop() end end)

for _, dialect in ipairs { "mtplx", "llama" } do
  describe("mirza-sim /v1/completions (" .. dialect .. ")", function()
    local s
    setup(function()
      s = H.start_sim { "--dialect", dialect, "--tok-rate", "0", "--ttft-ms", "0", "--answer-tokens", "6", "--quiet" }
      sims[#sims + 1] = s
    end)

    it("non-streamed: one text_completion choice with usage", function()
      local raw = post(s, { model = "m", prompt = "Once upon a time" })
      local r = json.decode(raw)
      assert.equal("text_completion", r.object)
      assert.truthy(r.id:match("^cmpl%-"), r.id)
      local ch = r.choices[1]
      assert.same({ 0, "stop", json.null }, { ch.index, ch.finish_reason, ch.logprobs })
      assert.is_true(#ch.text > 0)
      assert.same({ 4, 6, 10 }, { r.usage.prompt_tokens, r.usage.completion_tokens, r.usage.total_tokens })
      if dialect == "llama" then
        assert.truthy(raw:match('^{"choices":%[{"text":"[^"]*","index":0,"logprobs":null,"finish_reason":"stop"}%],' ..
          '"created":%d+,"model":"mirza%-sim","system_fingerprint":"[^"]+","object":"text_completion","usage":'), raw)
        assert.is_table(r.timings)
      else
        assert.truthy(raw:match('^{"id":"cmpl%-%d+","object":"text_completion","created":%d+,"model":"mirza%-sim",' ..
          '"choices":%[{"index":0,"text":'), raw)
      end
    end)

    it("streamed: the same text in one frame per token, the finish frame, usage, [DONE]", function()
      local plain = json.decode(post(s, { prompt = "Once upon a time" })).choices[1].text
      local fs = frames(post(s, { prompt = "Once upon a time", stream = true,
        stream_options = { include_usage = true } }))
      assert.equal("[DONE]", fs[#fs])
      local text, ids, usage, finish = {}, {}, nil, nil
      for i = 1, #fs - 1 do
        local f = fs[i]
        assert.equal("text_completion", f.object)
        ids[f.id] = true
        usage = f.usage or usage
        local ch = f.choices[1]
        if ch then
          text[#text + 1] = ch.text
          if ch.finish_reason ~= json.null then finish = ch.finish_reason end
          assert.is_nil(ch.delta)
        end
      end
      assert.equal(plain, table.concat(text))
      assert.equal("stop", finish)
      assert.equal(6, usage.completion_tokens)
      assert.equal(1, #(function() local l = {} for k in pairs(ids) do l[#l + 1] = k end return l end)())
      -- one frame a token, then the finish frame (and llama's usage frame)
      assert.equal(6 + 1 + (dialect == "llama" and 1 or 0), #fs - 1)
    end)

    it("max_tokens gives finish_reason length; a repeated prompt is cached; no prompt is a 400", function()
      local r = json.decode(post(s, { prompt = "Twice told", max_tokens = 2 }))
      assert.same({ "length", 2 }, { r.choices[1].finish_reason, r.usage.completion_tokens })
      local again = json.decode(post(s, { prompt = { "Twice told" } }))
      assert.equal(again.usage.prompt_tokens - 1, again.usage.prompt_tokens_details.cached_tokens)
      local _, msg, code, status = mirza.request { url = s.base .. "/v1/completions", body = { model = "m" } }
      assert.same({ "http", 400 }, { code, status }, msg)
    end)
  end)
end
