-- mirza.embed against mirza-sim's POST /v1/embeddings (issue 18 item 4):
-- a large input cut into chunks keeps its order over a pool of two sims
-- (one answering late, so chunks finish out of order) and runs as many
-- requests at once as the pool has slots; inside mirza.loop other tasks
-- go on while it waits; float and base64 answers give the same float32
-- vectors and the packed form round-trips; a server without the route
-- (llama-server's 501, a 404) is said at once, never retried; a pool with
-- a dead endpoint completes; a chunk that fails for good fails the call
-- with nothing partial, after the retries mirza.retry allows.
local mirza = require "mirza"
local pool = require "mirza.pool"
local loop = require "mirza.loop"
local H = require "tests.helper"

local DIMS = "12"

-- n texts "text 1" .. "text n".
local function texts(n)
  local t = {}
  for i = 1, n do t[i] = "text " .. i end
  return t
end

-- The value a float32 holds (what base64 carries).
local function f32(x)
  return (string.unpack("<f", string.pack("<f", x)))
end

-- How many requests were recorded into dir.
local function recorded(dir)
  local p = assert(io.popen("ls " .. H.q(dir) .. " 2>/dev/null | grep -c '\\.request$'"))
  local n = tonumber(p:read("a"))
  p:close()
  return n
end

describe("mirza.embed", function()
  local sim, slow
  -- the vector of each text asked alone (the reference for every order test)
  local alone = {}
  setup(function()
    sim = H.start_sim { "--embedding-dims", DIMS }
    slow = H.start_sim { "--embedding-dims", DIMS, "--fault", "head-delay=150" }
    for i, t in ipairs(texts(40)) do alone[i] = assert(mirza.embed { url = sim.base, input = t })[1] end
  end)
  teardown(function()
    sim.stop()
    slow.stop()
  end)
  after_each(function() collectgarbage("collect") end)

  local function assert_alone(vecs, n)
    assert.equal(n, vecs.n)
    assert.equal(n, #vecs)
    for i = 1, n do assert.same(alone[i], vecs[i], "vector " .. i) end
  end

  it("a string is one input; its vector is a float array of the server's length, with usage and model", function()
    local v = assert(mirza.embed { url = sim.base .. "/v1", input = "text 3" })
    assert.equal(1, v.n)
    assert.equal(tonumber(DIMS), #v[1])
    assert.equal(tonumber(DIMS), v.dims)
    assert.equal("number", math.type(v[1][1]) and "number")
    assert.same(alone[3], v[1])
    assert.equal(math.max(1, #"text 3" // 4), v.usage.prompt_tokens)
    assert.equal("mirza-sim", v.model)
    local norm = 0
    for _, x in ipairs(v[1]) do norm = norm + x * x end
    assert.near(1, norm, 1e-5)
  end)

  it("places each vector by its index when the server lists them out of order", function()
    local v = assert(mirza.embed { url = sim.base, input = texts(5),
      body_extra = { mirza_sim = { embed_order = "reverse" } } })
    assert_alone(v, 5) -- the server listed 4, 3, 2, 1, 0
  end)

  it("chunks over a pool of two sims, one late: inputs keep their order, the pool's slots all used", function()
    local p = pool.new({ slow.base, sim.base }, { limit = 2 })
    local v = assert(mirza.embed { pool = p, input = texts(40), batch = 3 })
    assert_alone(v, 40)
    assert.equal(14, v.requests) -- ceil(40 / 3)
    assert.equal(40, v.usage.prompt_tokens) -- each text is 6 or 7 bytes: one token
    assert.is_true(p.endpoints[1].served > 0 and p.endpoints[2].served > 0)
    assert.equal(2, p.endpoints[1].peak) -- requests at once: the pool's capacity
    assert.equal(2, p.endpoints[2].peak)
    assert.is_true(p.endpoints[2].served > p.endpoints[1].served) -- the late one served fewer
  end)

  it("a lone url: `parallel` requests at once, the route itself accepted too", function()
    local dir = H.tmpname(".rec")
    finally(function() os.execute("rm -rf " .. H.q(dir)) end)
    local v = assert(mirza.embed { url = slow.base .. "/v1/embeddings", input = texts(10), batch = 1, parallel = 5,
      record = dir })
    assert_alone(v, 10)
    assert.equal(10, recorded(dir))
  end)

  it("inside mirza.loop: other tasks go on while the chunks are in flight", function()
    local ticks, done = 0, false
    local got
    loop.run(function()
      local ticker = loop.spawn(function()
        while not done do
          ticks = ticks + 1
          mirza.sleep(0.01)
        end
      end)
      got = { mirza.embed { url = slow.base, input = texts(8), batch = 2, parallel = 2 } }
      done = true
      ticker:join()
    end)
    assert_alone(assert(got[1], got[2]), 8)
    assert.is_true(ticks >= 5, "the ticker ran " .. ticks .. " times during 2 rounds of 150 ms") -- ~30; blocked: 1
  end)

  it("a task cancelled while it embeds takes its chunks with it: slots back, nothing more sent", function()
    local p = pool.new({ slow.base }, { limit = 2 })
    local t = loop.spawn(function() return mirza.embed { pool = p, input = texts(20), batch = 1 } end)
    loop.default():run(function() return p.endpoints[1].inflight == 2 end)
    t:cancel()
    assert.equal(0, p.endpoints[1].inflight)
    loop.default():run() -- until every task is done: none sends anything more
    assert.equal(0, p.endpoints[1].served)
    assert.equal(0, p.endpoints[1].inflight)
    assert.equal(0, mirza.streams())
  end)

  it("base64 and float answers give the same float32 vectors; packed round-trips", function()
    local fl = assert(mirza.embed { url = sim.base, input = texts(40), batch = 7 })
    local b64 = assert(mirza.embed { url = sim.base, input = texts(40), batch = 7, encoding_format = "base64" })
    for i = 1, 40 do
      assert.equal(#fl[i], #b64[i])
      for j = 1, #fl[i] do assert.equal(f32(fl[i][j]), b64[i][j], ("vector %d value %d"):format(i, j)) end
    end
    local packed = b64:packed(5)
    assert.equal(4 * tonumber(DIMS), #packed)
    assert.equal(packed, b64.packed(5))
    assert.equal(packed, fl:packed(5))
    assert.same(b64[5], mirza.embed.unpack(packed))
    assert.same(b64[5], mirza.embed.unpack(mirza.embed.pack(b64[5])))
    assert.is_nil((mirza.embed.unpack("abc")))
    assert.has_error(function() b64:packed(41) end)
  end)

  it("long base64 vectors (whole 128-character steps and a tail) decode to the float answer's values", function()
    for _, d in ipairs { 24, 33, 100, 769 } do -- 96 bytes: one step exactly; then steps and tails
      local fl = assert(mirza.embed { url = sim.base, input = texts(3), dimensions = d })
      local b64 = assert(mirza.embed { url = sim.base, input = texts(3), dimensions = d, encoding_format = "base64" })
      assert.equal(d, b64.dims)
      for i = 1, 3 do
        for j = 1, d do assert.equal(f32(fl[i][j]), b64[i][j], ("dims %d vector %d value %d"):format(d, i, j)) end
      end
    end
    assert.is_nil(mirza.embed.base64_decode(("A"):rep(127) .. "!"))  -- a bad character in a whole step
    assert.is_nil(mirza.embed.base64_decode(("A"):rep(130) .. "!"))  -- in the tail
    assert.is_nil(mirza.embed.base64_decode("AAAAA"))                 -- 5 characters: not base64
    assert.equal("\0\0\0", mirza.embed.base64_decode("AAAA"))
    assert.equal("hi", mirza.embed.base64_decode("aGk="))
    assert.equal("hi", mirza.embed.base64_decode("aGk"))
  end)

  it("dimensions is sent: shorter vectors, the first components renormalised", function()
    local v = assert(mirza.embed { url = sim.base, input = { "text 1", "text 2" }, dimensions = 4 })
    assert.equal(4, #v[1])
    assert.equal(4, v.dims)
  end)

  it("token lists are inputs too; an empty input list makes no request", function()
    local v = assert(mirza.embed { url = sim.base, input = { { 1, 2, 3 }, "text 1", { 4 } } })
    assert.equal(3, v.n)
    assert.same(alone[1], v[2])
    assert.same(assert(mirza.embed { url = sim.base, input = { 1, 2, 3 } })[1], v[1]) -- one token list
    local none = assert(mirza.embed { url = "http://127.0.0.1:1", input = {} })
    assert.equal(0, none.n)
  end)

  it("a server without the route says so at once, one request, no retry", function()
    for _, dialect in ipairs { "llama", "mtplx" } do
      local s = H.start_sim { "--no-embeddings", "--dialect", dialect }
      finally(s.stop)
      local dir = H.tmpname(".rec")
      finally(function() os.execute("rm -rf " .. H.q(dir)) end)
      local v, msg, code, status = mirza.embed { url = s.base, input = texts(3), batch = 1, parallel = 1,
        record = dir }
      assert.is_nil(v)
      assert.equal("unsupported", code)
      if dialect == "llama" then
        assert.equal(501, status)
        assert.matches("does not serve embeddings %(http://[^ ]+/v1/embeddings: HTTP 501.*restart llama%-server "
          .. "with %-%-embeddings", msg)
      else
        assert.equal(404, status)
        assert.matches("does not serve embeddings %(http://[^ ]+/v1/embeddings: HTTP 404.*MTPLX has none", msg)
      end
      assert.equal(1, recorded(dir))
    end
  end)

  it("a pool with a dead endpoint completes on the other", function()
    local p = pool.new({ "http://127.0.0.1:" .. H.free_port(), sim.base }, { limit = 2 })
    local v = assert(mirza.embed { pool = p, input = texts(40), batch = 4 })
    assert_alone(v, 40)
    assert.is_true(p.endpoints[1].failed > 0)
    assert.equal(10, p.endpoints[2].served)
  end)

  it("a pool with an endpoint answering 503 completes on the other", function()
    local bad = H.start_sim { "--fault", "http=503", "--retry-after", "0" }
    finally(bad.stop)
    local p = pool.new({ bad.base, sim.base }, { limit = 2 })
    local v = assert(mirza.embed { pool = p, input = texts(20), batch = 2 })
    assert_alone(v, 20)
    assert.is_true(p.endpoints[1].failed > 0)
  end)

  it("a chunk failing for good fails the call: nil, message, code, no partial vectors", function()
    local dir = H.tmpname(".rec")
    finally(function() os.execute("rm -rf " .. H.q(dir)) end)
    local input = texts(6)
    input[4] = { 1.5 } -- not a token list: HTTP 400, the request's own fault
    local v, msg, code, status = mirza.embed { url = sim.base, input = input, batch = 1, parallel = 1, record = dir }
    assert.is_nil(v)
    assert.equal("http", code)
    assert.equal(400, status)
    assert.matches("HTTP 400", msg)
    assert.equal(4, recorded(dir)) -- a 400 is not retried; chunks after it are not sent
  end)

  it("a retryable failure is tried `attempts` times, then the call fails", function()
    local busy = H.start_sim { "--fault", "http=429", "--retry-after", "0" }
    finally(busy.stop)
    local dir = H.tmpname(".rec")
    finally(function() os.execute("rm -rf " .. H.q(dir)) end)
    local v, msg, code, status = mirza.embed { url = busy.base, input = "x", attempts = 2, record = dir }
    assert.is_nil(v)
    assert.equal("http", code)
    assert.equal(429, status)
    assert.matches("HTTP 429", msg)
    assert.equal(2, recorded(dir))
  end)

  it("nothing answering: refused, within the pool's unreachable time", function()
    local t0 = mirza.now()
    local v, _, code = mirza.embed { url = "http://127.0.0.1:" .. H.free_port(), input = texts(8), batch = 1,
      attempts = 8 }
    assert.is_nil(v)
    assert.equal("refused", code)
    assert.is_true(mirza.now() - t0 < 8, "gave up after " .. (mirza.now() - t0) .. " s")
  end)

  it("bad options raise at the caller's line", function()
    assert.has_error(function() mirza.embed { input = "x" } end, "mirza.embed: 'url' or 'pool' is required")
    assert.has_error(function() mirza.embed { url = sim.base } end, "mirza.embed: 'input' is required")
    local ok, err = pcall(function() mirza.embed { url = sim.base, input = "x", bacth = 2 } end)
    assert.is_false(ok)
    assert.matches("embed_spec%.lua:%d+: mirza%.embed: unknown option \"bacth\"", err)
    assert.has_error(function() mirza.embed { url = sim.base, input = "x", batch = 0 } end)
    assert.has_error(function() mirza.embed { url = sim.base, input = "x", parallel = 0 } end,
      "mirza.embed: 'parallel' must be a positive integer (got 0)")
    assert.has_error(function() mirza.embed { url = sim.base, input = { "a", 3 } } end)
  end)
end)
