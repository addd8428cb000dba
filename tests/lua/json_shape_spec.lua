-- JSON keeps its shape (issue 31 item 8): a decoded array is marked as
-- mirza.json.array marks one, so that "[]" decodes to a table that
-- encodes as "[]" again and "{}" as "{}", at any depth, through
-- mirza.json.decode, mirza.json.stream (and the jsonstage over it) and
-- mirza.schema.decode; a script's own empty array is json.array{}.
local mirza = require "mirza"
local schema = require "mirza.schema"
local jsonstage = require "mirza.jsonstage"
local pipeline = require "mirza.pipeline"

local json = mirza.json

-- Texts as json.encode writes them (no spaces, members in key order): each
-- must come back byte for byte after a decode.
local SHAPES = {
  "[]", "{}", "[[]]", "[{}]", "[[],{}]", "[[[]]]", '{"a":[]}', '{"a":{}}', '{"a":[],"b":{}}',
  '{"a":[[],{},[{}],{"b":[]}],"c":{"d":{"e":[]}}}', '[1,[],"x",{},null,true,[[],[null]]]',
  '{"messages":[{"content":"x","role":"assistant","tool_calls":[]},{"content":"[]","role":"tool"}],"tools":[]}',
}

local function marked(t)
  local mt = getmetatable(t)
  return mt ~= nil and mt.__name == "mirza.json.array"
end

describe("JSON keeps its shape", function()
  after_each(function() collectgarbage("collect") end)

  it("decode then encode gives the same bytes: empty arrays stay [], empty objects {}", function()
    for _, text in ipairs(SHAPES) do
      local v = assert(json.decode(text))
      assert.equal(text, json.encode(v))
      assert.equal(text, json.encode(json.decode(json.encode(v)))) -- and again
    end
  end)

  it("a decoded array carries json.array's marker, an object none", function()
    local v = json.decode('{"list":[1,2],"none":[],"obj":{},"deep":[{"in":[]}]}')
    assert.is_nil(getmetatable(v))
    assert.is_nil(getmetatable(v.obj))
    assert.is_nil(getmetatable(v.deep[1]))
    assert.is_true(marked(v.list))
    assert.is_true(marked(v.none))
    assert.is_true(marked(v.deep))
    assert.is_true(marked(v.deep[1]["in"]))
    assert.equal(getmetatable(json.array {}), getmetatable(v.none)) -- the very same marker
    -- still a plain sequence for Lua
    assert.same({ 1, 2 }, v.list)
    assert.equal(2, #v.list)
  end)

  it("a decoded array emptied by the script is still an array, an object still an object", function()
    local v = json.decode('{"a":[1,2],"o":{"k":1}}')
    table.remove(v.a)
    table.remove(v.a)
    v.o.k = nil
    assert.equal('{"a":[],"o":{}}', json.encode(v))
  end)

  it("a script's own empty array is json.array{} (a plain {} is an object)", function()
    assert.equal("[]", json.encode(json.array {}))
    assert.equal("{}", json.encode {})
    assert.equal('{"tool_calls":[]}', json.encode { tool_calls = json.array {} })
    assert.equal("{}", json.encode(json.object { }))
  end)

  it("mirza.json.stream hands out values of the same shape, at every depth", function()
    local text = '{"a":[],"b":{},"c":[[],{}],"d":[{"e":[]}]}'
    for depth = 0, 2 do
      local p <close> = json.stream { depth = depth }
      local got = {}
      for _, ev in ipairs(assert(p:feed(text))) do got[#got + 1] = ev.path .. "=" .. json.encode(ev.value) end
      assert.is_true(p:finish())
      local want = ({
        [0] = { "=" .. text },
        { "/a=[]", "/b={}", "/c=[[],{}]", '/d=[{"e":[]}]' },
        { "/c/0=[]", "/c/1={}", '/d/0={"e":[]}' },
      })[depth]
      assert.same(want, got)
    end
  end)

  it("the jsonstage's values (json = {depth =}) keep their shape", function()
    local evs = { { type = "text", text = '{"tags"' }, { type = "text", text = ':[],"meta":{},' },
      { type = "text", text = '"rows":[[]]}' }, { type = "done", finish_reason = "stop" } }
    local got = {}
    local out = pipeline.collect(pipeline.compose(pipeline.from_list(evs),
      { { name = "json", fn = jsonstage.stage, opts = { depth = 1 } } }))
    for _, ev in ipairs(out) do
      if ev.type == "json" then got[#got + 1] = ev.path .. "=" .. json.encode(ev.value) end
    end
    assert.same({ "/tags=[]", "/meta={}", "/rows=[[]]" }, got)
  end)

  it("mirza.schema.decode's value (a batch record's r.value) keeps its shape", function()
    local s = { type = "object", properties = { items = { type = "array" }, meta = { type = "object" } } }
    local text = 'Here it is:\n```json\n{"items":[],"meta":{},"rows":[[],{}]}\n```'
    local v = assert(schema.decode(s, text))
    assert.equal('{"items":[],"meta":{},"rows":[[],{}]}', json.encode(v))
    -- a record as a batch writes it, read back and written again: the same bytes
    local rec = json.encode { id = "r1", value = v }
    assert.equal(rec, json.encode(json.decode(rec)))
  end)

  it("a decoded [] is an array to the schema, not an object", function()
    local ok = schema.validate(assert(schema.compile { type = "object" }), json.decode("[]"))
    assert.is_false(ok)
    assert.is_true((schema.validate(assert(schema.compile { type = "array" }), json.decode("[]"))))
  end)
end)
