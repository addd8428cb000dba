-- Structured answers against mirza-sim (issue 18 items 1-2): `schema =` on
-- mirza.collect, e:say / e:turn and mirza.tools.run sends response_format
-- (read back from the recorded request) and returns the decoded value; an
-- answer in prose, one that breaks the schema and a cut one each give
-- nil, message, "schema", raw; `attempts = N` asks again with the
-- violation in the retry's messages, and an answer that fits on the
-- second try (a --replay-dir sim answering a bad then a good recording)
-- is the value, the failed attempt gone from the engine's history.
local mirza = require "mirza"
local engine = require "mirza.engine"
local tools = require "mirza.tools"
local H = require "tests.helper"

local json = mirza.json
local FAST = { "--tok-rate", "0", "--ttft-ms", "0" }

local PERSON = { type = "object", required = { "name", "age" }, additionalProperties = false,
  properties = { name = { type = "string", minLength = 1 }, age = { type = "integer", minimum = 0 } } }
local GOOD, BAD = '{"name": "Ada", "age": 36}', '{"name": "Ada", "age": "36"}'

local function sim_text(text) return { mirza_sim = { text = text } } end

-- The body of request n recorded in dir (decoded).
local function request(dir, n)
  local text = H.read_file(("%s/%06d.request"):format(dir, n))
  return assert(json.decode(assert(text:match("\n\n(.*)$"))))
end

local function count_requests(dir)
  local n = 0
  while io.open(("%s/%06d.request"):format(dir, n + 1)) do n = n + 1 end
  return n
end

local function rmdir(dir) os.execute("rm -rf " .. H.q(dir)) end

-- A directory mirza-sim --replay-dir answers from: one recording per text,
-- answered in this order whatever is asked.
local function replay_dir(sim, texts)
  local dir = H.tmpname(".replay")
  for _, text in ipairs(texts) do
    assert(mirza.collect { url = sim.url, body = H.chat_body("x", sim_text(text)), record = dir })
  end
  return dir
end

local function new_engine(extra)
  local opts = {
    preset = "mirza-sim", port = H.free_port(), config_file = false, session_id = "structured-" .. math.random(1e9),
    daemon = { args = FAST, deadline = 30, progress = false, grace = 2 }, max_tokens = 256, log = function() end,
  }
  for k, v in pairs(extra or {}) do opts[k] = v end
  local e = engine.new(opts)
  assert(e:load())
  e:set_thinking(false)
  return e
end

local QUIET = { answer = function() end }
local function say_opts(extra)
  local t = { answer = QUIET.answer }
  for k, v in pairs(extra) do t[k] = v end
  return t
end

describe("mirza.collect with a schema", function()
  local sim, dir
  setup(function() sim = H.start_sim(FAST) end)
  teardown(function() sim.stop() end)
  before_each(function() dir = H.tmpname(".rec") end)
  after_each(function() rmdir(dir) end)

  it("sends response_format and returns the decoded value, a preamble skipped", function()
    local r = assert(mirza.collect { url = sim.url, record = dir, schema = PERSON,
      body = H.chat_body("who?", sim_text("Here you are:\n```json\n" .. GOOD .. "\n```")) })
    assert.are.same({ name = "Ada", age = 36 }, r.value)
    assert.are.equal(1, r.attempts)
    local rf = request(dir, 1).response_format
    assert.are.equal("json_schema", rf.type)
    assert.are.same({ name = "answer", strict = true, schema = PERSON }, rf.json_schema)
    assert.is_nil(mirza.collect { url = sim.url, body = H.chat_body("x") }.value) -- none asked: none given
  end)

  it("splits <think>...</think> out of the content before the check and the json events", function()
    local text = '<think>I think {"name": "Bob"} is wrong.</think>\n\n' .. GOOD
    local seen = {}
    local r = assert(mirza.collect { url = sim.url, schema = PERSON, body = H.chat_body("who?", sim_text(text)),
      on_json = function(ev) seen[#seen + 1] = ev.path end })
    assert.same({ name = "Ada", age = 36 }, r.value)
    assert.equal(GOOD, r.text)
    assert.equal('I think {"name": "Bob"} is wrong.', r.think)
    assert.same({ "/name", "/age" }, seen) -- the answer's, not the reasoning's
    -- think_tags = false: the tags stay in the text, and the first object is the reasoning's
    local r2, msg = mirza.collect { url = sim.url, schema = PERSON, think_tags = false,
      body = H.chat_body("who?", sim_text(text)) }
    assert.is_nil(r2)
    assert.truthy(msg)
  end)

  it("a path to a .json schema file works the same", function()
    local path = H.tmpname(".json")
    finally(function() os.remove(path) end)
    local f = assert(io.open(path, "w"))
    f:write(json.encode(PERSON))
    f:close()
    local r = assert(mirza.collect { url = sim.url, schema = path, body = H.chat_body("who?", sim_text(GOOD)) })
    assert.are.same({ name = "Ada", age = 36 }, r.value)
  end)

  it("prose, a violation and a cut answer each give nil, message, \"schema\", raw", function()
    local cases = {
      { "I am sorry, I cannot say.", "holds no JSON" },
      { BAD, '/age: expected integer, got string "36"' },
      { '{"name": "Ada", "extra": 1, "age": 3}', "/extra: member not allowed" },
      { '{"name": "Ada", "a', "cut" },
      { '{"name": "Ada" "age": 3}', "not valid JSON" },
    }
    for _, case in ipairs(cases) do
      local r, msg, code, raw = mirza.collect { url = sim.url, schema = PERSON,
        body = H.chat_body("x", sim_text(case[1])) }
      assert.is_nil(r)
      assert.are.equal("schema", code)
      assert.are.equal(case[1], raw)
      assert.truthy(msg:find(case[2], 1, true), ("%q lacks %q"):format(msg, case[2]))
    end
  end)

  it("a schema that is not one fails before any request", function()
    local r, msg, code = mirza.collect { url = sim.url, record = dir, schema = { type = "strnig" },
      body = H.chat_body("x") }
    assert.are.same({ nil, "schema" }, { r, code })
    assert.truthy(msg:find("unknown type", 1, true))
    assert.are.equal(0, count_requests(dir))
    local _, _, c2 = mirza.collect { url = sim.url, schema = "/nonexistent/schema.json", body = H.chat_body("x") }
    assert.are.equal("io", c2)
  end)

  it("attempts = 3 asks again twice, each time with the violation, then fails", function()
    local r, msg, code, raw = mirza.collect { url = sim.url, record = dir, schema = PERSON, attempts = 3,
      body = H.chat_body("who?", sim_text(BAD)) }
    assert.are.same({ nil, "schema", BAD }, { r, code, raw })
    assert.truthy(msg:find("/age", 1, true))
    assert.are.equal(3, count_requests(dir))
    local retry = "Your answer did not match the schema: /age: expected integer, got string \"36\". "
      .. "Answer again with the JSON only."
    assert.are.same({ { role = "user", content = "who?" }, { role = "assistant", content = BAD },
      { role = "user", content = retry } }, request(dir, 2).messages)
    assert.are.equal(5, #request(dir, 3).messages)
    assert.are.same(request(dir, 1).response_format, request(dir, 3).response_format)
  end)

  it("an answer that fits on the second attempt is the value", function()
    local rdir = replay_dir(sim, { BAD, GOOD })
    finally(function() rmdir(rdir) end)
    local rsim = H.start_sim { "--replay-dir", rdir }
    finally(rsim.stop)
    local r = assert(mirza.collect { url = rsim.url, record = dir, schema = PERSON, attempts = 2,
      body = H.chat_body("who?") })
    assert.are.same({ name = "Ada", age = 36 }, r.value)
    assert.are.equal(2, r.attempts)
    assert.are.equal(GOOD, r.text)
    assert.are.equal(3, #request(dir, 2).messages)
  end)

  it("attempts must be a whole number >= 1, said at the caller's line", function()
    local ok, err = pcall(function()
      mirza.collect { url = sim.url, schema = PERSON, attempts = 0, body = H.chat_body("x") }
    end)
    assert.is_false(ok)
    assert.truthy(err:find("structured_spec.lua:%d+: mirza: attempts must be an integer >= 1, got 0"), err)
    ok, err = pcall(function()
      tools.run { url = sim.url, tools = {}, schema = PERSON, attempts = 1.5, body = H.chat_body("x") }
    end)
    assert.truthy(not ok and err:find("structured_spec.lua:%d+: mirza: attempts", 1), err)
  end)
end)

describe("an engine turn with a schema", function()
  local e, dir, sim
  setup(function()
    dir = H.tmpname(".rec")
    e = new_engine { record = dir }
    sim = H.start_sim(FAST)
  end)
  teardown(function()
    e:close()
    sim.stop()
    rmdir(dir)
  end)
  before_each(function() e:reset() end)

  it("say: the text goes to the sinks, the value to the result and e.last", function()
    local heard = {}
    local st, res = e:say("who?", { schema = PERSON, answer = function(s) heard[#heard + 1] = s end,
      body_extra = sim_text(GOOD) })
    assert.truthy(st, res)
    assert.are.same({ name = "Ada", age = 36 }, res.value)
    assert.are.same(res.value, st.value)
    assert.are.same(res.value, e.last.value)
    assert.are.equal(1, res.attempts)
    assert.are.equal(GOOD, table.concat(heard))
    local n = count_requests(dir)
    assert.are.same(PERSON, request(dir, n).response_format.json_schema.schema)
    assert.are.same({ "user", "assistant" }, { e.history.messages[1].role, e.history.messages[2].role })
    assert.are.equal(2, #e.history.messages)
  end)

  it("say: a violation after every attempt gives nil, message, \"schema\", result; the history keeps nothing",
    function()
      local before = count_requests(dir)
      local st, msg, code, res = e:say("who?", say_opts { schema = PERSON, attempts = 2, body_extra = sim_text(BAD) })
      assert.are.same({ nil, "schema" }, { st, code })
      assert.truthy(msg:find("/age: expected integer", 1, true), msg)
      assert.are.equal(BAD, res.raw)
      assert.are.equal("/age", res.schema_error.pointer)
      assert.are.equal(2, res.attempts)
      assert.are.equal(before + 2, count_requests(dir))
      local retry = request(dir, before + 2).messages
      assert.are.same({ role = "assistant", content = BAD }, retry[#retry - 1])
      assert.truthy(retry[#retry].content:find("did not match the schema: /age", 1, true))
      assert.are.equal(0, #e.history.messages)
    end)

  it("say: the failed attempt leaves the history once an answer fits", function()
    local rdir = replay_dir(sim, { "Hello.", BAD, GOOD })
    finally(function() rmdir(rdir) end)
    local re = new_engine { daemon = { args = { "--replay-dir", rdir }, deadline = 30, progress = false, grace = 2 } }
    finally(function() re:close() end)
    assert(re:say("earlier", QUIET)) -- a turn before: kept
    local st, res = re:say("who?", say_opts { schema = PERSON, attempts = 3 })
    assert.truthy(st, res)
    assert.are.same({ name = "Ada", age = 36 }, res.value)
    assert.are.equal(2, res.attempts)
    local h = re.history.messages
    assert.are.equal(4, #h)
    assert.are.same({ "earlier", "who?", GOOD }, { h[1].content, h[3].content, h[4].content })
  end)

  it("say: a cancelled answer is not asked again", function()
    local before = count_requests(dir)
    local st, res = e:say("who?", { schema = PERSON, attempts = 3, answer = function() e:cancel() end,
      mode = "token", body_extra = sim_text(BAD) })
    assert.truthy(st, res)
    assert.are.equal("cancelled", res.cut.reason)
    assert.are.equal(1, res.attempts)
    assert.is_nil(res.value)
    assert.are.equal(before + 1, count_requests(dir))
  end)

  it("the engine's schema applies to every turn; schema = false turns it off", function()
    local se = new_engine { record = dir, schema = PERSON }
    finally(function() se:close() end)
    local st, res = se:say("who?", say_opts { body_extra = sim_text(GOOD) })
    assert.truthy(st, res)
    assert.are.same({ name = "Ada", age = 36 }, res.value)
    local n = count_requests(dir)
    assert.truthy(request(dir, n).response_format)
    st, res = se:say("free text", say_opts { schema = false, body_extra = sim_text("just words") })
    assert.truthy(st, res)
    assert.is_nil(res.value)
    assert.is_nil(request(dir, n + 1).response_format)
  end)

  it("turn: the done event carries the value, or the violation with its pointer", function()
    local done
    for ev in e:turn("who?", { schema = PERSON, body_extra = sim_text(GOOD) }) do
      if ev.type == "done" then done = ev end
    end
    assert.are.same({ name = "Ada", age = 36 }, done.value)
    assert.are.same(done.value, e.last.value)
    for ev in e:turn("who?", { schema = PERSON, body_extra = sim_text('{"name": ""}') }) do
      if ev.type == "done" then done = ev end
    end
    assert.is_nil(done.value)
    assert.are.equal("", done.schema_error.pointer)
    assert.are.equal('(root): missing required member "age"', done.schema_error.message)
    assert.are.equal('{"name": ""}', done.schema_error.raw)
    assert.are.same(done.schema_error, e.last.schema_error)
    assert.has_error(function() e:turn("x", { attempts = 2 }) end) -- a say option
  end)
end)

-- An order with its lines: what the sim builds from the schema itself.
local ORDER = { type = "object", required = { "id", "lines" }, properties = {
  id = { type = "integer", minimum = 1 },
  lines = { type = "array", minItems = 3, maxItems = 3, items = { ["$ref"] = "#/$defs/line" } } },
  ["$defs"] = { line = { type = "object", required = { "sku", "qty" }, additionalProperties = false,
    properties = { sku = { type = "string", minLength = 1 }, qty = { type = "integer", minimum = 1 } } } } }

describe("mirza-sim honouring response_format", function()
  local sim
  setup(function() sim = H.start_sim(FAST) end)
  teardown(function() sim.stop() end)

  it("its answer built from the schema is the value; its faults each give \"schema\"", function()
    local r = assert(mirza.collect { url = sim.url, schema = ORDER, body = H.chat_body("the order?") })
    assert.are.equal(3, #r.value.lines)
    assert.are.equal("string", type(r.value.lines[3].sku))
    for fault, says in pairs { ["schema-ignore"] = "holds no JSON", ["schema-break"] = "missing required member",
      ["schema-cut"] = "cut" } do
      local v, msg, code, raw = mirza.collect { url = sim.url, schema = ORDER,
        body = H.chat_body("the order?", { mirza_sim = { fault = fault } }) }
      assert.are.same({ nil, "schema" }, { v, code }, fault)
      assert.truthy(msg:find(says, 1, true), fault .. ": " .. msg)
      assert.are.equal("string", type(raw))
    end
  end)

  it("in the llama dialect too (the same field: llama-server makes it a grammar)", function()
    local llama = H.start_sim { "--tok-rate", "0", "--ttft-ms", "0", "--dialect", "llama" }
    finally(llama.stop)
    local r = assert(mirza.collect { url = llama.url, schema = ORDER, body = H.chat_body("the order?") })
    assert.are.equal(3, #r.value.lines)
    assert.is_true(r.value.id >= 1)
  end)

  it("collect: on_json gets each line as it completes, in order", function()
    local got = {}
    local r = assert(mirza.collect { url = sim.url, schema = ORDER, json = { depth = 2 },
      on_json = function(ev) got[#got + 1] = ev end, body = H.chat_body("the order?") })
    local paths = {}
    for i, ev in ipairs(got) do
      paths[i] = ev.path
      assert.are.equal("json", ev.type)
    end
    assert.are.same({ "/lines/0", "/lines/1", "/lines/2" }, paths)
    assert.are.same(r.value.lines[2], got[2].value)
    got = {}
    assert(mirza.collect { url = sim.url, on_json = function(ev) got[#got + 1] = ev.path end, -- depth 1, no schema
      body = H.chat_body("x", sim_text('Sure: {"a": 1, "b": [2]} done')) })
    assert.are.same({ "/a", "/b" }, got)
    got = {}
    local cut = assert(mirza.collect { url = sim.url, on_json = function(ev) got[#got + 1] = ev.path end,
      body = H.chat_body("x", sim_text('{"a": 1, "b": [2, 3], "c": "unfini')) })
    assert.are.same({ "/a", "/b" }, got) -- the values completed before the cut stand
    assert.truthy(cut.json_error, "a cut JSON is said")
    assert.is_nil(r.json_error)
  end)

  it("collect: a bracket in the preamble is prose, for the value and the json events alike", function()
    for _, case in ipairs {
      { PERSON, 'See [1] for the list: {"name": "Ada", "age": 36}', { "/name", "/age" } },
      { { type = "array", items = PERSON }, 'Use {braces} as in {x}: [{"name": "Ada", "age": 36}]', { "/0" } },
    } do
      local got = {}
      local r = assert(mirza.collect { url = sim.url, schema = case[1],
        on_json = function(ev) got[#got + 1] = ev.path end, body = H.chat_body("x", sim_text(case[2])) })
      local person = r.value[1] or r.value
      assert.are.same({ "Ada", 36 }, { person.name, person.age })
      assert.are.same(case[3], got)
      assert.is_nil(r.json_error)
    end
  end)

  it("turn: json events come while the answer streams, before its last delta", function()
    local e = new_engine()
    finally(function() e:close() end)
    local order, last_text, done = {}, 0, nil
    for ev in e:turn("the order?", { schema = ORDER, json = { depth = 2 } }) do
      order[#order + 1] = ev
      if ev.type == "text" then last_text = #order end
      if ev.type == "done" then done = ev end
    end
    local first_json
    for i, ev in ipairs(order) do
      if ev.type == "json" then first_json = first_json or i end
    end
    assert.truthy(first_json and first_json < last_text, "the first line came only after the whole answer")
    assert.are.equal(3, #done.value.lines)
    local heard = {}
    local st, res = e:say("the order?", say_opts { schema = ORDER, json = { depth = 2 },
      on_json = function(ev) heard[#heard + 1] = ev.path end })
    assert.truthy(st, res)
    assert.are.same({ "/lines/0", "/lines/1", "/lines/2" }, heard)
    local _, msg, code = e:say("the order?", say_opts { schema = ORDER, body_extra = { mirza_sim = {
      fault = "schema-break" } } })
    assert.are.equal("schema", code)
    assert.truthy(msg:find("missing required member", 1, true), msg)
  end)
end)

describe("mirza.tools.run with a schema", function()
  local sim, dir
  setup(function() sim = H.start_sim(FAST) end)
  teardown(function() sim.stop() end)
  before_each(function() dir = H.tmpname(".rec") end)
  after_each(function() rmdir(dir) end)

  it("returns the value; a violation retried, then nil, message, \"schema\", raw", function()
    local r = assert(tools.run { url = sim.url, record = dir, tools = {}, schema = PERSON,
      body = H.chat_body("who?", sim_text(GOOD)) })
    assert.are.same({ name = "Ada", age = 36 }, r.value)
    assert.truthy(request(dir, 1).response_format)
    local res, msg, code, raw = tools.run { url = sim.url, record = dir, tools = {}, schema = PERSON, attempts = 2,
      body = H.chat_body("who?", sim_text(BAD)) }
    assert.are.same({ nil, "schema", BAD }, { res, code, raw })
    assert.truthy(msg:find("/age", 1, true))
    local retry = request(dir, 3).messages
    assert.are.equal(3, #retry)
    assert.truthy(retry[3].content:find("did not match the schema: /age", 1, true))
  end)

  it("an answer that fits on the second attempt: the failed one is not in messages", function()
    local rdir = replay_dir(sim, { BAD, GOOD })
    finally(function() rmdir(rdir) end)
    local rsim = H.start_sim { "--replay-dir", rdir }
    finally(rsim.stop)
    local r = assert(tools.run { url = rsim.url, tools = {}, schema = PERSON, attempts = 2,
      body = H.chat_body("who?") })
    assert.are.same({ name = "Ada", age = 36 }, r.value)
    assert.are.equal(2, r.attempts)
    assert.are.same({ "user", "assistant" }, { r.messages[1].role, r.messages[2].role })
    assert.are.equal(GOOD, r.messages[2].content)
    assert.are.equal(2, #r.messages)
  end)

  it("on_json gets the values as they complete", function()
    local got = {}
    assert(tools.run { url = sim.url, tools = {}, schema = PERSON, on_json = function(ev) got[#got + 1] = ev.path end,
      body = H.chat_body("who?", sim_text(GOOD)) })
    assert.are.same({ "/name", "/age" }, got)
  end)
end)
