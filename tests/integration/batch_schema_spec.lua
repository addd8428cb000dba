-- Batch items with a schema (issue 18 items 1-2): the run's --schema, a
-- line's own `schema` and a body's response_format json_schema; the
-- schema is sent as response_format (mirza-sim answers it with valid
-- JSON, or breaks it on request), the answer is decoded and validated
-- here: the record carries the value (response.body.mirza.value), or the
-- violation (error code "schema", its message and JSON pointer) with the
-- answer kept; a line's schema that cannot be compiled is an input error,
-- a run's stops the run before anything is sent. Answers are in OUTPUT,
-- failures (a violation too: it keeps the answer) in the error file.
local mirza = require "mirza"
local batch = require "mirza.batch"
local batch_output = require "mirza.batch_output"
local json = mirza.json
local H = require "tests.helper"

local PERSON = { type = "object", properties = { name = { type = "string" }, age = { type = "integer", minimum = 0 } },
  required = { "name", "age" }, additionalProperties = false }

describe("batch items with a schema", function()
  local sim, schema_file
  setup(function()
    sim = H.start_sim { "--tok-rate", "0", "--ttft-ms", "0", "--parallel", "4" }
    schema_file = H.tmpname(".json")
    local f = assert(io.open(schema_file, "wb"))
    f:write(json.encode(PERSON))
    f:close()
  end)
  teardown(function()
    sim.stop()
    os.remove(schema_file)
  end)

  -- Run the lines (tables, encoded one a line); the records by custom_id
  -- (OUTPUT's and the error file's) and the stats.
  local function run(lines, extra)
    local input, output = H.tmpname(".jsonl"), H.tmpname(".jsonl")
    local f = assert(io.open(input, "wb"))
    for _, l in ipairs(lines) do f:write(type(l) == "string" and l or json.encode(l), "\n") end
    f:close()
    local opts = { input = input, output = output, endpoints = { sim.base }, model = "m", quiet = true,
      progress = false }
    for k, v in pairs(extra or {}) do opts[k] = v end
    local st, msg, code = batch.run(opts)
    local by = H.batch_records(output)
    os.remove(input)
    os.remove(output)
    os.remove(batch_output.errors_path(output))
    return by, st, msg, code
  end

  -- A prompt line answered with `text` (mirza-sim's override), or by the sim itself.
  local function line(id, text, more)
    local l = { custom_id = id, prompt = "Who is it?", mirza_sim = text and { text = text } or nil }
    for k, v in pairs(more or {}) do l[k] = v end
    return l
  end

  it("decodes an answer valid against --schema into body.mirza.value; a violation is an error with its pointer",
    function()
      local by, st = run({
        line("sim"),                                      -- the sim answers the response_format sent
        line("given", '{"name": "Ada", "age": 36}'),
        line("preamble", 'Here it is: {"name": "Bo", "age": 1} Hope it helps.'),
        line("missing", '{"name": "Ada"}'),
        line("wrong-type", '{"name": "Ada", "age": "36"}'),
        line("prose", "I cannot answer that."),
        line("cut", '{"name": "Ada", "ag'),
      }, { schema = schema_file })
      assert.same({ 7, 4 }, { st.done_now, st.errors })
      local v = by.sim.response.body.mirza.value
      assert.equal(json.null, by.sim.error)
      assert.is_string(v.name)
      assert.equal("integer", math.type(v.age))
      assert.same({ name = "Ada", age = 36 }, by.given.response.body.mirza.value)
      assert.same({ name = "Bo", age = 1 }, by.preamble.response.body.mirza.value)
      for id, want in pairs { missing = { "", "missing required member \"age\"" },
        ["wrong-type"] = { "/age", "/age: expected integer" }, prose = { nil, "holds no JSON" },
        cut = { nil, "is cut" } } do
        local r = by[id]
        assert.equal("schema", r.error.code, id)
        assert.truthy(r.error.message:find(want[2], 1, true), id .. ": " .. r.error.message)
        assert.equal(want[1], r.error.pointer, id)
        -- the answer is kept, as the server gave it
        assert.equal(200, r.response.status_code, id)
        assert.is_string(r.response.body.choices[1].message.content, id)
        assert.is_nil(r.response.body.mirza, id)
      end
      assert.equal('{"name": "Ada"}', by.missing.response.body.choices[1].message.content)
    end)

  it("takes a line's own schema, else its body's response_format, over --schema", function()
    local LIST = { type = "array", items = { type = "number" }, minItems = 2 }
    local by = run({
      line("own", "[1, 2.5]", { schema = LIST }),
      line("own-bad", "[1]", { schema = LIST }),
      line("own-sim", nil, { schema = LIST }),
      { custom_id = "rf", method = "POST", url = "/v1/chat/completions", body = {
        messages = { { role = "user", content = "x" } }, mirza_sim = { text = '{"ok": true}' },
        response_format = { type = "json_schema", json_schema = { name = "flag", schema = {
          type = "object", required = { "ok" }, properties = { ok = { type = "boolean" } } } } } } },
      { custom_id = "json-object", method = "POST", url = "/v1/chat/completions", body = {
        messages = { { role = "user", content = "x" } }, mirza_sim = { text = "[1]" },
        response_format = { type = "json_object" } } },
      line("run", '{"name": "C", "age": 3}'),
    }, { schema = schema_file })
    assert.same({ 1, 2.5 }, by.own.response.body.mirza.value)
    assert.same({ "schema", "" }, { by["own-bad"].error.code, by["own-bad"].error.pointer })
    local got = by["own-sim"].response.body.mirza.value -- the sim was sent the line's schema, not --schema
    assert.is_table(got)
    assert.is_true(#got >= 2)
    for _, x in ipairs(got) do assert.is_number(x) end
    assert.same({ ok = true }, by.rf.response.body.mirza.value)
    assert.equal("schema", by["json-object"].error.code) -- an array is not the object json_object asks for
    assert.same({ name = "C", age = 3 }, by.run.response.body.mirza.value)
  end)

  it("records the sim's broken, ignored and cut structured answers as schema errors", function()
    local by, st = run({
      line("break", nil, { mirza_sim = { fault = "schema-break" } }),
      line("ignore", nil, { mirza_sim = { fault = "schema-ignore" } }),
      line("cut", nil, { mirza_sim = { fault = "schema-cut" } }),
    }, { schema = PERSON })
    assert.equal(3, st.errors)
    for _, id in ipairs { "break", "ignore", "cut" } do
      assert.equal("schema", by[id].error.code, id)
      assert.equal(1, by[id].mirza.attempts, id) -- a violation is not retried
    end
    assert.truthy(by["break"].error.message:find("missing required member", 1, true))
  end)

  it("with attempts = N tells the model what did not fit and takes the answer that fits", function()
    -- a --replay-dir sim answering a bad then a good recording, whatever is asked
    local rdir = H.tmpname(".replay")
    finally(function() os.execute("rm -rf " .. H.q(rdir)) end)
    for _, text in ipairs { '{"name": "Ada"}', '{"name": "Ada", "age": 36}' } do
      assert(mirza.collect { url = sim.url, body = H.chat_body("x", { mirza_sim = { text = text } }), record = rdir })
    end
    local rsim = H.start_sim { "--replay-dir", rdir }
    finally(rsim.stop)
    local saved = sim
    sim = rsim
    finally(function() sim = saved end)
    local by, st = run({ line("again") }, { schema = PERSON, attempts = 2 })
    assert.equal(0, st.errors)
    assert.same({ name = "Ada", age = 36 }, by.again.response.body.mirza.value)
    assert.equal(2, by.again.mirza.attempts)
    sim = saved
    -- every answer broken: as many as attempts, then the violation
    by, st = run({ line("broken", nil, { mirza_sim = { fault = "schema-break" } }) }, { schema = PERSON, attempts = 3 })
    assert.equal(1, st.errors)
    assert.equal("schema", by.broken.error.code)
    assert.equal(3, by.broken.mirza.attempts)
    assert.has_error(function() batch.run { items = {}, output = "x", attempts = 0 } end,
      "mirza.batch.run: 'attempts' must be an integer >= 1, got 0")
  end)

  it("records a line whose schema cannot be compiled as an input error; a bad --schema stops the run", function()
    local by = run { line("bad", '{"a": 1}', { schema = { type = 5 } }),
      line("fine", "[]", { schema = { type = "array" } }) }
    assert.equal("input", by.bad.error.code)
    assert.truthy(by.bad.error.message:find("schema", 1, true))
    assert.equal(json.null, by.fine.error)
    local none, st, msg, code = run({ line("x", "{}") }, { schema = "/nonexistent/schema.json" })
    assert.same({}, none)
    assert.is_nil(st)
    assert.equal("input", code)
    assert.truthy(msg:find("--schema", 1, true) and msg:find("nonexistent", 1, true), msg)
  end)
end)
