-- Batch lines for /v1/embeddings and /v1/completions (issue 18 item 5):
-- sent non-streamed, the server's body recorded as it came (an
-- embeddings body as its own text: the floats as the server wrote them),
-- with the same resume, retries and pool as chat lines; a daemon without
-- embeddings (llama-server without --embeddings: 501) is recorded with
-- its status and body. A completions line takes the run's --max-tokens,
-- a schema (its text decoded and validated), and a prefix key on its
-- prompt (its cached tokens recorded).
local mirza = require "mirza"
local batch = require "mirza.batch"
local batch_output = require "mirza.batch_output"
local json = mirza.json
local H = require "tests.helper"

-- Write lines to a new file; its path.
local function input_of(lines)
  local input = H.tmpname(".jsonl")
  local f = assert(io.open(input, "wb"))
  for _, l in ipairs(lines) do f:write(json.encode(l), "\n") end
  f:close()
  return input
end

-- The lines of output by custom_id (each the decoded record, and its text).
local function records(output)
  local by, text = {}, {}
  local fh = io.open(output)
  for l in fh and fh:lines() or function() end do
    local r = assert(json.decode(l))
    by[r.custom_id], text[r.custom_id] = r, l
  end
  if fh then fh:close() end
  return by, text
end

-- A copy of t with the fields of more.
local function copy_with(t, more)
  local c = {}
  for k, v in pairs(t) do c[k] = v end
  for k, v in pairs(more) do c[k] = v end
  return c
end

local function embed_line(id, input, more)
  local body = { input = input }
  for k, v in pairs(more or {}) do body[k] = v end
  return { custom_id = id, method = "POST", url = "/v1/embeddings", body = body }
end

describe("batch lines for /v1/embeddings", function()
  local sim
  setup(function() sim = H.start_sim { "--tok-rate", "0", "--ttft-ms", "0", "--parallel", "4" } end)
  teardown(function() sim.stop() end)

  it("records the server's body as it sent it, floats and all, and resumes", function()
    local lines = { embed_line("one", "Bonjour"), embed_line("two", { "a", "b", "c" }),
      embed_line("b64", "x", { encoding_format = "base64" }) }
    local input, output = input_of(lines), H.tmpname(".jsonl")
    local opts = { input = input, output = output, endpoints = { sim.base }, model = "m", quiet = true,
      progress = false, body = { max_tokens = 7 } } -- --max-tokens: not for an embeddings line
    local st = assert(batch.run(opts))
    assert.same({ 3, 0 }, { st.done_now, st.errors })
    local by, text = records(output)
    for _, l in ipairs(lines) do
      local id = l.custom_id
      local b = copy_with(l.body, { model = "m" })
      local want = assert(mirza.request { url = sim.base .. "/v1/embeddings", body = b }) -- same text, same body
      assert.equal(200, by[id].response.status_code, id)
      assert.equal(json.null, by[id].error, id)
      assert.truthy(text[id]:find('"body":' .. want, 1, true), id .. ": the body is not the server's text")
      assert.same(json.decode(want), by[id].response.body, id)
      assert.equal(1, by[id].mirza.attempts)
    end
    assert.equal(3, #by.two.response.body.data)
    assert.is_string(by.b64.response.body.data[1].embedding)
    -- run again: everything is done, nothing is sent
    st = assert(batch.run(opts))
    assert.same({ 3, 0 }, { st.skipped, st.done_now })
    os.remove(input)
    os.remove(output)
  end)

  it("retries on another endpoint of the pool, and records a daemon without embeddings as it answered", function()
    local dead = H.start_sim {}
    local dead_base = dead.base
    dead.stop() -- refuses from now on
    local noemb = H.start_sim { "--dialect", "llama", "--no-embeddings" }
    local input, output = input_of { embed_line("a", "x"), embed_line("b", "y") }, H.tmpname(".jsonl")
    local st = assert(batch.run { input = input, output = output, endpoints = { dead_base, sim.base }, model = "m",
      quiet = true, progress = false, retry_base = 0.01 })
    assert.same({ 2, 0 }, { st.done_now, st.errors })
    local by = records(output)
    for _, id in ipairs { "a", "b" } do
      assert.equal(mirza.redact_url(sim.base .. "/v1"), by[id].mirza.endpoint, id)
      assert.equal(200, by[id].response.status_code, id)
    end
    assert.is_true(by.a.mirza.attempts + by.b.mirza.attempts >= 3) -- at least one went to the dead one first
    os.remove(output)
    st = assert(batch.run { input = input, output = output, endpoints = { noemb.base }, model = "m", quiet = true,
      progress = false, max_retries = 0 })
    assert.equal(2, st.errors)
    -- failures go to the error file beside OUTPUT, none to OUTPUT; a route the
    -- daemon does not serve (501) is "unsupported", its message says what to do
    assert.same({}, (records(output)))
    by = records(batch_output.errors_path(output))
    assert.equal(501, by.a.response.status_code)
    assert.equal("unsupported", by.a.error.code)
    assert.truthy(by.a.error.message:find("/v1/embeddings", 1, true), by.a.error.message)
    assert.truthy(by.a.error.message:find("--endpoint", 1, true), by.a.error.message)
    assert.is_table(by.a.response.body.error)
    noemb.stop()
    os.remove(input)
    os.remove(output)
    os.remove(batch_output.errors_path(output))
  end)
end)

describe("batch lines for /v1/completions", function()
  local sim
  setup(function()
    sim = H.start_sim { "--tok-rate", "0", "--ttft-ms", "0", "--dialect", "llama", "--parallel", "1",
      "--context-window", "100000" }
  end)
  teardown(function() sim.stop() end)

  local function comp_line(id, prompt, more)
    local body = { prompt = prompt }
    for k, v in pairs(more or {}) do body[k] = v end
    return { custom_id = id, method = "POST", url = "/v1/completions", body = body }
  end

  it("records the server's text_completion, with the run's max_tokens, a schema's value and the cached tokens",
    function()
      local doc = ("A long document about the tides of the Atlantic. "):rep(50)
      local lines = { comp_line("text", "Bonjour", { mirza_sim = { text = "Salut tout le monde" } }),
        comp_line("json", "Give me n", { mirza_sim = { text = 'Sure: {"n": 4}' } }),
        comp_line("doc1", doc .. "Question one?"), comp_line("doc2", doc .. "Question two?") }
      local input, output = input_of(lines), H.tmpname(".jsonl")
      assert(batch.run { input = input, output = output, endpoints = { sim.base }, model = "m",
        quiet = true, progress = false, limit = 1, body = { max_tokens = 2 },
        schema = { type = "object", required = { "n" }, properties = { n = { type = "integer" } } } })
      local by = records(batch_output.errors_path(output)) -- a schema violation is a failure: in the error file
      assert.is_nil(records(output).text)
      local t = by.text.response.body
      assert.same({ "text_completion", "length" }, { t.object, t.choices[1].finish_reason }) -- 2 tokens: cut
      assert.equal(2, t.usage.completion_tokens)
      assert.equal("schema", by.text.error.code) -- not JSON: the run's schema applies to completions
      os.remove(output)
      os.remove(batch_output.errors_path(output))
      local st = assert(batch.run { input = input, output = output, endpoints = { sim.base }, model = "m", quiet = true,
        progress = false, limit = 1,
        schema = { type = "object", required = { "n" }, properties = { n = { type = "integer" } } } })
      by = records(output)
      assert.same({ n = 4 }, by.json.response.body.mirza.value)
      assert.equal('Sure: {"n": 4}', by.json.response.body.choices[1].text)
      -- the two questions on one document: the second's prompt mostly cached, and said so
      local c1, c2 = by.doc1.mirza.cached_tokens, by.doc2.mirza.cached_tokens
      assert.is_number(c1)
      assert.is_true(math.max(c1, c2) >= #doc // 4 - 5, ("cached %d and %d"):format(c1, c2))
      assert.is_number(batch.cached_share(st))
      os.remove(input)
      os.remove(output)
      os.remove(batch_output.errors_path(output))
    end)
end)
