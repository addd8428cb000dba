-- Batch jobs with the data and servers users bring (issue 31): failures
-- by class (a route the server lacks is "unsupported" at once and never
-- stops the good lines; a 500 to some lines is retried while the rest are
-- answered), the error file beside OUTPUT and its redo, the server's key
-- from --api-key or the environment (never printed), --endpoint as pasted
-- (without /v1, a route's URL, a query string kept), a BOM, JSON lines
-- that are not objects, and a short item not held to the tick.
local mirza = require "mirza"
local batch = require "mirza.batch"
local batch_output = require "mirza.batch_output"
local json = mirza.json
local H = require "tests.helper"

local SCRIPT = H.source .. "/scripts/batch.lua"

-- Records by custom_id of a JSONL file (an absent file: none).
local function records(path)
  local by, n = {}, 0
  local f = io.open(path, "rb")
  if not f then return by, 0 end
  for l in f:lines() do
    local r = assert(json.decode(l))
    assert.is_nil(by[r.custom_id], "two records for " .. r.custom_id)
    by[r.custom_id], n = r, n + 1
  end
  f:close()
  return by, n
end

-- `mirza scripts/batch.lua ARGS...` with env (a table of NAME=value) to its
-- end: exit code, stdout, stderr.
local function cli(env, ...)
  local words = {}
  for k, v in pairs(env or {}) do words[#words + 1] = k .. "=" .. H.q(v) end
  words[#words + 1] = H.q(H.mirza_bin)
  words[#words + 1] = H.q(SCRIPT)
  for _, a in ipairs { ... } do words[#words + 1] = H.q(a) end
  local err = H.tmpname(".err")
  local p = assert(io.popen("env -u MIRZA_API_KEY -u OPENAI_API_KEY " .. table.concat(words, " ") .. " 2>"
    .. H.q(err)))
  local out = p:read("a")
  local _, _, rc = p:close()
  local e = H.read_file(err)
  os.remove(err)
  return rc, out, e
end

local function chat(id, sim_ctl)
  return json.encode { custom_id = id, body = { model = "m", max_tokens = 4,
    messages = { { role = "user", content = "prompt " .. id } }, mirza_sim = sim_ctl } }
end

local function embed(id)
  return json.encode { custom_id = id, method = "POST", url = "/v1/embeddings", body = { model = "m", input = id } }
end

local function input_of(lines)
  local path = H.tmpname(".jsonl")
  H.write_file(path, table.concat(lines, "\n") .. "\n")
  return path
end

describe("batch failures by class", function()
  local sim, llama
  setup(function()
    sim = H.start_sim { "--parallel", "8", "--tok-rate", "0", "--ttft-ms", "0", "--verbose" }
    llama = H.start_sim { "--dialect", "llama", "--no-embeddings", "--parallel", "8", "--tok-rate", "0",
      "--ttft-ms", "0" }
  end)
  teardown(function()
    if sim then sim.stop() end
    if llama then llama.stop() end
  end)

  it("records lines for a route the server lacks as unsupported at once, and answers the others", function()
    local lines = {}
    for i = 1, 30 do lines[i] = i % 3 == 0 and embed("e" .. i) or chat("c" .. i) end
    local input, out = input_of(lines), H.tmpname(".jsonl")
    local t0 = mirza.now()
    local st = assert(batch.run { input = input, output = out, base_url = llama.base, quiet = true,
      give_up_after = 60 })
    assert.is_true(mirza.now() - t0 < 5, ("%.1f s"):format(mirza.now() - t0))
    local ok, nok = records(out)
    local bad, nbad = records(batch_output.errors_path(out))
    assert.equal(20, nok)
    assert.equal(10, nbad)
    assert.equal(10, st.errors)
    assert.equal(10, st.by_code.unsupported)
    for id, r in pairs(ok) do
      assert.truthy(id:match("^c"))
      assert.equal(json.null, r.error)
    end
    for id, r in pairs(bad) do
      assert.truthy(id:match("^e"))
      assert.equal("unsupported", r.error.code)
      -- the lines sent got the 501; the others, once no endpoint served the route, none (response null)
      if r.mirza.attempts == 1 then assert.equal(501, r.response.status_code)
      else assert.equal(json.null, r.response) end
      -- the URL requested and what to do
      assert.truthy(r.error.message:find(llama.base .. "/v1/embeddings", 1, true), r.error.message)
      assert.truthy(r.error.message:find("give an --endpoint that does", 1, true), r.error.message)
      assert.is_true(r.mirza.attempts <= 1) -- never retried
    end
    assert.equal(0, st.retries)
    os.remove(input)
    os.remove(out)
    os.remove(batch_output.errors_path(out))
  end)

  it("retries lines that get a 500 while the endpoint answers the others first", function()
    local lines = {}
    for i = 1, 30 do lines[i] = chat("c" .. i, i % 3 == 0 and { fault = "http=500" } or nil) end
    local input, out = input_of(lines), H.tmpname(".jsonl")
    local st = assert(batch.run { input = input, output = out, base_url = sim.base, quiet = true,
      retry_base = 0.05, max_retries = 3, give_up_after = 60, limit = 4 })
    local ok, nok = records(out)
    local bad, nbad = records(batch_output.errors_path(out))
    assert.equal(20, nok)
    assert.equal(10, nbad)
    assert.equal(30, st.retries) -- each bad line 3 times more, none given up on early
    local slowest_good, fastest_bad = 0, math.huge
    for _, r in pairs(ok) do slowest_good = math.max(slowest_good, r.mirza.duration_s) end
    for _, r in pairs(bad) do
      assert.equal(500, r.response.status_code)
      assert.equal(4, r.mirza.attempts)
      fastest_bad = math.min(fastest_bad, r.mirza.duration_s)
    end
    -- the endpoint was never rested for the 500s: the good ones were all
    -- answered while the bad ones were still being retried
    assert.is_true(slowest_good < fastest_bad, ("good up to %.3f s, bad from %.3f s"):format(slowest_good,
      fastest_bad))
    os.remove(input)
    os.remove(out)
    os.remove(batch_output.errors_path(out))
  end)

  it("takes a 404 that names a model for the line's own failure, not a missing route", function()
    -- vLLM, Ollama and OpenAI answer 404 for a model they do not have
    local input = input_of { chat("bad", { fault = "http=404:The model `nope` does not exist." }), chat("ok1"),
      chat("ok2"), chat("ok3") }
    local out = H.tmpname(".jsonl")
    local st = assert(batch.run { input = input, output = out, base_url = sim.base, quiet = true, limit = 1 })
    local ok, nok = records(out)
    local bad, nbad = records(batch_output.errors_path(out))
    assert.equal(3, nok)
    assert.truthy(ok.ok1 and ok.ok2 and ok.ok3)
    assert.equal(1, nbad)
    assert.equal("http", bad.bad.error.code)
    assert.equal(1, st.errors)
    for _, p in ipairs { input, out, batch_output.errors_path(out) } do os.remove(p) end
  end)

  it("splits <think>...</think> out of the content before the schema check, as the engine does", function()
    local line = json.encode { custom_id = "t", schema = { type = "object", required = { "a" },
      properties = { a = { type = "integer" } } },
      body = { model = "m", messages = { { role = "user", content = "q" } },
        mirza_sim = { text = '<think>the user wants {"a": 1}.</think>\n\n{"a": 1}' } } }
    local input, out = input_of { line }, H.tmpname(".jsonl")
    local st = assert(batch.run { input = input, output = out, base_url = sim.base, quiet = true })
    assert.equal(0, st.errors)
    local ok = records(out)
    local msg = ok.t.response.body.choices[1].message
    assert.equal(1, ok.t.response.body.mirza.value.a)
    assert.equal('{"a": 1}', msg.content)
    assert.equal('the user wants {"a": 1}.', msg.reasoning_content)
    os.remove(input)
    os.remove(out)
  end)

  it("makes no error file when nothing fails", function()
    local input, out = input_of { chat("a"), chat("b") }, H.tmpname(".jsonl")
    assert(batch.run { input = input, output = out, base_url = sim.base, quiet = true })
    local _, n = records(out)
    assert.equal(2, n)
    assert.is_nil(io.open(batch_output.errors_path(out)))
    os.remove(input)
    os.remove(out)
  end)

  it("puts failures in the error file and a rerun sends them, and only them, again", function()
    local input = input_of { chat("a"), chat("b", { fault = "http=400" }), chat("c"), embed("d") }
    local out = H.tmpname(".jsonl")
    local errors = out:gsub("%.jsonl$", "") .. ".errors.jsonl"
    local rc, _, err = cli(nil, input, out, "--endpoint", llama.base, "--quiet")
    assert.equal(1, rc, err)
    local ok, nok = records(out)
    local bad, nbad = records(errors)
    assert.equal(2, nok)
    assert.truthy(ok.a and ok.c)
    assert.equal(2, nbad)
    assert.equal("http", bad.b.error.code)
    assert.equal("unsupported", bad.d.error.code)
    -- the same command again, against a server that serves both: only b
    -- and d are sent; no custom_id has two records; the error file is new
    rc, _, err = cli(nil, input, out, "--endpoint", sim.base)
    assert.equal(1, rc, err) -- b gets its 400 again
    assert.truthy(err:find("2 already done", 1, true), err)
    assert.truthy(err:find("2 failed before, done again", 1, true), err)
    assert.truthy(err:find("1 failed, recorded in " .. errors, 1, true), err)
    assert.truthy(err:find("1 http 400 (first: b): ", 1, true), err)
    -- a 400 is the request's own: the same command fails it again, and the summary does not advise it
    assert.truthy(err:find("running the same command again fails them the same way", 1, true), err)
    ok, nok = records(out)
    bad, nbad = records(errors)
    assert.equal(3, nok)
    assert.truthy(ok.d) -- answered now
    assert.equal(1, nbad)
    assert.truthy(bad.b)
    -- --errors FILE chooses the error file
    local elsewhere = H.tmpname(".jsonl")
    rc, _, err = cli(nil, input, out, "--endpoint", sim.base, "--errors", elsewhere)
    assert.equal(1, rc, err)
    assert.truthy(err:find("recorded in " .. elsewhere, 1, true), err)
    bad, nbad = records(elsewhere)
    assert.equal(1, nbad)
    assert.truthy(bad.b)
    for _, p in ipairs { input, out, errors, elsewhere } do os.remove(p) end
  end)
end)

describe("batch endpoints and keys as users give them", function()
  local keyed
  setup(function()
    keyed = H.start_sim { "--api-key", "s3cret-key", "--tok-rate", "0", "--ttft-ms", "0", "--verbose",
      "--parallel", "4" }
  end)
  teardown(function() if keyed then keyed.stop() end end)

  it("sends --api-key, else MIRZA_API_KEY, else OPENAI_API_KEY, and never prints it", function()
    local input = input_of { chat("a"), chat("b") }
    -- no key: every line fails, and the message says how to give one
    local out = H.tmpname(".jsonl")
    local rc, _, err = cli(nil, input, out, "--endpoint", keyed.base .. "/v1")
    assert.equal(1, rc, err)
    local bad = records(batch_output.errors_path(out))
    assert.truthy(bad.a.error.message:find("give the server's key: --api-key KEY or MIRZA_API_KEY", 1, true),
      bad.a.error.message)
    os.remove(batch_output.errors_path(out))
    for _, case in ipairs {
      { env = nil, args = { "--api-key", "s3cret-key" } },
      { env = { MIRZA_API_KEY = "s3cret-key", OPENAI_API_KEY = "wrong" }, args = {} },
      { env = { OPENAI_API_KEY = "s3cret-key" }, args = {} },
      { env = { MIRZA_API_KEY = "wrong" }, args = { "--api-key", "s3cret-key" } },
    } do
      os.remove(out)
      local argv = { input, out, "--endpoint", keyed.base .. "/v1" }
      for _, a in ipairs(case.args) do argv[#argv + 1] = a end
      local stdout
      rc, stdout, err = cli(case.env, table.unpack(argv))
      assert.equal(0, rc, err)
      local _, n = records(out)
      assert.equal(2, n)
      assert.is_nil(err:find("s3cret", 1, true))
      assert.is_nil(stdout:find("s3cret", 1, true))
      assert.is_nil(H.read_file(out):find("s3cret", 1, true))
    end
    for _, p in ipairs { input, out } do os.remove(p) end
  end)

  it("takes a base URL with or without /v1, a route's URL and a query string", function()
    local input = input_of { chat("a"), embed("e") }
    for _, ep in ipairs { keyed.base, keyed.base .. "/", keyed.base .. "/v1", keyed.base .. "/v1/",
      keyed.base .. "/v1/chat/completions", keyed.base .. "/v1/embeddings?api-version=2024-10-21" } do
      local out = H.tmpname(".jsonl")
      local rc, _, err = cli(nil, input, out, "--endpoint", ep .. "@2", "--api-key", "s3cret-key", "--quiet")
      local ef = io.open(batch_output.errors_path(out))
      assert.equal(0, rc, ep .. ": " .. err .. (ef and ef:read("a") or ""))
      if ef then ef:close() end
      local ok, n = records(out)
      assert.equal(2, n, ep)
      assert.truthy(ok.a.response.body.choices)
      assert.truthy(ok.e.response.body.data)
      os.remove(out)
    end
    -- the query string went out on every request, the route's own path kept
    local log = H.read_file(keyed.log)
    assert.truthy(log:find("POST /v1/chat/completions?api-version=2024-10-21 200", 1, true), log)
    assert.truthy(log:find("POST /v1/embeddings?api-version=2024-10-21 200", 1, true), log)
    assert.is_nil(log:find("/v1/v1/", 1, true))
    assert.is_nil(log:find("completions/chat/completions", 1, true))
    os.remove(input)
  end)
end)

describe("batch input as other tools write it", function()
  local sim
  setup(function() sim = H.start_sim { "--parallel", "4", "--tok-rate", "0", "--ttft-ms", "0" } end)
  teardown(function() if sim then sim.stop() end end)

  it("skips a BOM on line 1 and makes a JSON line that is not an object an input error naming it", function()
    local input = H.tmpname(".jsonl")
    H.write_file(input, "\239\187\191" .. chat("first") .. "\n[1,2]\n\"text\"\nnull\nplain text prompt\n")
    local out = H.tmpname(".jsonl")
    local st = assert(batch.run { input = input, output = out, base_url = sim.base, quiet = true })
    assert.equal(5, st.total)
    local ok = records(out)
    local bad = records(batch_output.errors_path(out))
    assert.truthy(ok.first, "the BOM line read as its JSON") -- not "line-1" with the BOM in its prompt
    assert.truthy(ok["line-5"])
    for n, kind in pairs { [2] = "an array", [3] = "a string", [4] = "null" } do
      local r = bad["line-" .. n]
      assert.truthy(r, "line " .. n)
      assert.equal("input", r.error.code)
      assert.truthy(r.error.message:find(("line %d is JSON but %s, not an object"):format(n, kind), 1, true),
        r.error.message)
    end
    for _, p in ipairs { input, out, batch_output.errors_path(out) } do os.remove(p) end
  end)

  it("reads a short item (small max_tokens) to its end as it comes, not a tick late", function()
    -- 4 paced items of 4 tokens (10 ms a token), one at a time, at a 2 s
    -- tick: each one's end read as it comes (well under a tick for all);
    -- not opened as short answers, each end waits for the next look (8 s)
    local lines = {}
    for i = 1, 4 do lines[i] = chat("s" .. i, { answer_tokens = 4, tok_rate = 100 }) end
    local input, out = input_of(lines), H.tmpname(".jsonl")
    local t0 = mirza.now()
    local st = assert(batch.run { input = input, output = out, base_url = sim.base, quiet = true, limit = 1,
      tick = 2 })
    local took = mirza.now() - t0
    assert.equal(0, st.errors)
    assert.is_true(took < 2, ("%.1f s for 4 short items at a 2 s tick"):format(took))
    for _, p in ipairs { input, out } do os.remove(p) end
  end)

  it("stops on a duplicate custom_id before anything is sent, naming both lines", function()
    local input = input_of { chat("a"), chat("b"), chat("a") }
    local out = H.tmpname(".jsonl")
    local st, msg, code = batch.run { input = input, output = out, base_url = sim.base, quiet = true }
    assert.is_nil(st)
    assert.equal("input", code)
    assert.truthy(msg:find(':3: duplicate custom_id "a" (first on line 1)', 1, true), msg)
    assert.is_nil(io.open(out)) -- nothing written
    os.remove(input)
  end)
end)
