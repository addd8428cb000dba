-- mirza-sim's POST /v1/embeddings (issue 18): OpenAI's shape in both
-- dialects (llama-server's member order in its), deterministic unit
-- vectors (same text, same vector), --embedding-dims and `dimensions`,
-- base64, the four input forms, and --no-embeddings answering as
-- llama-server without --embeddings. Driven through mirza's public API.
local mirza = require "mirza"
local H = require "tests.helper"
local json = mirza.json

-- POST body to the sim's /v1/embeddings: the decoded answer and its text,
-- or nil, the error event (status, body).
local function embed(sim, body)
  local s <close> = mirza.open { url = sim.base .. "/v1/embeddings", body = body, plain = true, timeout = 10 }
  local ev = s:next()
  if ev.type == "response" then return json.decode(ev.body), ev.body end
  return nil, ev
end

local function norm(v)
  local n = 0
  for _, x in ipairs(v) do n = n + x * x end
  return math.sqrt(n)
end

local sims = {}
local function sim(name, args)
  if not sims[name] then sims[name] = H.start_sim(args) end
  return sims[name]
end

teardown(function()
  for _, s in pairs(sims) do s.stop() end
end)

for _, dialect in ipairs { "mtplx", "llama" } do
  describe("mirza-sim /v1/embeddings (" .. dialect .. ")", function()
    local s
    setup(function() s = sim(dialect, { "--dialect", dialect, "--model-id", "emb-model", "--quiet" }) end)

    it("answers one unit vector per input, in input order, with usage", function()
      local input = { "hello world", "bonjour", "hello world", "" }
      local r, raw = embed(s, { model = "asked-model", input = input })
      assert.equal("list", r.object)
      assert.equal(4, #r.data)
      for i, d in ipairs(r.data) do
        assert.same({ "embedding", i - 1, 16 }, { d.object, d.index, #d.embedding })
        assert.is_true(math.abs(norm(d.embedding) - 1) < 1e-5, tostring(norm(d.embedding)))
      end
      assert.same(r.data[1].embedding, r.data[3].embedding) -- same text, same vector
      assert.are_not.same(r.data[1].embedding, r.data[2].embedding)
      -- 4 bytes a token, at least 1: 11 -> 2, 7 -> 1, 11 -> 2, 0 -> 1
      assert.same({ prompt_tokens = 6, total_tokens = 6 }, r.usage)
      if dialect == "llama" then -- the order llama-server's code inserts them; the request's model
        assert.equal("asked-model", r.model)
        assert.truthy(raw:match('^{"model":"asked%-model","object":"list","usage":{"prompt_tokens":6,' ..
          '"total_tokens":6},"data":%[{"embedding":%[[^%]]+%],"index":0,"object":"embedding"}'), raw)
        assert.truthy(raw:match('"index":3,"object":"embedding"}%]}$'), raw)
      else
        assert.equal("emb-model", r.model)
        assert.truthy(raw:match('^{"object":"list","data":%[{"object":"embedding","index":0,"embedding":%['), raw)
        assert.truthy(raw:match('%],"model":"emb%-model","usage":{"prompt_tokens":6,"total_tokens":6}}$'), raw)
      end
      -- the same text in another request: the same vector
      local again = embed(s, { input = "hello world" })
      assert.same(r.data[1].embedding, again.data[1].embedding)
      assert.same({ prompt_tokens = 2, total_tokens = 2 }, again.usage)
    end)

    it("dimensions = k: the first k components of the full vector, renormalised", function()
      local full = embed(s, { input = "abc" }).data[1].embedding
      local short = embed(s, { input = "abc", dimensions = 5 }).data[1].embedding
      assert.equal(5, #short)
      local n = norm { table.unpack(full, 1, 5) }
      for i = 1, 5 do assert.is_true(math.abs(short[i] - full[i] / n) < 1e-6) end
    end)

    it("base64: the little-endian float32 bytes of the float answer", function()
      local f = embed(s, { input = { "x", "yz" } })
      local b = embed(s, { input = { "x", "yz" }, encoding_format = "base64" })
      for i = 1, 2 do
        local al = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
        local bits = b.data[i].embedding:gsub("=", ""):gsub(".", function(c)
          local v, t = al:find(c, 1, true) - 1, {}
          for k = 5, 0, -1 do t[#t + 1] = (v >> k) & 1 end
          return table.concat(t)
        end)
        local bytes = bits:sub(1, #bits - #bits % 8):gsub("%d%d%d%d%d%d%d%d",
          function(byte) return string.char(tonumber(byte, 2)) end)
        assert.equal(64, #bytes)
        for k = 1, 16 do
          local x = string.unpack("<f", bytes, 4 * k - 3)
          assert.is_true(math.abs(x - f.data[i].embedding[k]) < 1e-8, x .. " vs " .. f.data[i].embedding[k])
        end
        if dialect == "llama" then assert.equal("base64", b.data[i].encoding_format) end
      end
    end)

    it("token ids: one list is one input, a list of lists is one each; tokens count by length", function()
      local one = embed(s, { input = { 1, 2, 3 } })
      assert.same({ 1, 3 }, { #one.data, one.usage.prompt_tokens })
      local two = embed(s, { input = { { 1, 2, 3 }, { 7 } } })
      assert.same({ 2, 4 }, { #two.data, two.usage.prompt_tokens })
      assert.same(one.data[1].embedding, two.data[1].embedding)
    end)

    it("a missing or malformed input, dimensions or encoding_format is a 400", function()
      local _, ev = embed(s, { model = "m" })
      assert.equal(400, ev.status)
      local msg = json.decode(ev.body).error.message
      assert.equal(dialect == "llama" and '"input" or "content" must be provided' or "'input' is required", msg)
      for _, bad in ipairs { { input = {} }, { input = { "a", 3 } }, { input = true }, { input = "a", dimensions = 0 },
        { input = "a", dimensions = 1.5 }, { input = "a", encoding_format = "int8" } } do
        local r, e = embed(s, bad)
        assert.is_nil(r, json.encode(bad))
        assert.equal(400, e.status, json.encode(bad))
      end
    end)
  end)
end

describe("mirza-sim /v1/embeddings options", function()
  it("--embedding-dims sets the length; --seed changes the vectors, not their length", function()
    local a = embed(sim("dims", { "--embedding-dims", "7", "--quiet" }), { input = "same" }).data[1].embedding
    local b = embed(sim("seed", { "--embedding-dims", "7", "--seed", "9", "--quiet" }), { input = "same" })
    assert.same({ 7, 7 }, { #a, #b.data[1].embedding })
    assert.are_not.same(a, b.data[1].embedding)
  end)

  it("--no-embeddings: llama-server's 501 without --embeddings; 404 in the MTPLX dialect", function()
    local _, ev = embed(sim("noemb-llama", { "--dialect", "llama", "--no-embeddings", "--quiet" }), { input = "x" })
    assert.equal(501, ev.status)
    assert.equal('{"error":{"code":501,"message":"This server does not support embeddings. Start it with ' ..
      '`--embeddings`","type":"not_supported_error"}}', ev.body)
    local _, ev2 = embed(sim("noemb-mtplx", { "--no-embeddings", "--quiet" }), { input = "x" })
    assert.equal(404, ev2.status)
  end)

  it("http faults apply: a per-request http=503 answers 503", function()
    local s <close> = mirza.open { url = sim("dims", {}).base .. "/v1/embeddings", plain = true,
      body = { input = "x", mirza_sim = { fault = "http=503:busy" } } }
    local ev = s:next()
    assert.same({ "error", 503 }, { ev.type, ev.status })
  end)
end)
