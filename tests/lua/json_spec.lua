-- mirza.json: encode/decode round trips, arrays vs objects, null, errors.
local mirza = require "mirza"
local json = mirza.json

describe("mirza.json", function()
  after_each(function() collectgarbage("collect") end)

  it("round-trips nested values", function()
    local v = { a = 1, b = { 1, 2, 3 }, c = "x\n\"é", d = true, e = 2.5 }
    local back = json.decode(json.encode(v))
    assert.same(v, back)
  end)

  it("decodes integers as integers and others as floats", function()
    local v = json.decode('[1, 2.5, -3, 1e3, 12345678901]')
    assert.equal(math.type(v[1]), "integer")
    assert.equal(math.type(v[2]), "float")
    assert.equal(v[4], 1000)
    assert.equal(v[5], 12345678901)
  end)

  it("maps null to json.null both ways", function()
    local v = json.decode('{"a":null,"b":[null,1]}')
    assert.equal(json.null, v.a)
    assert.equal(json.null, v.b[1])
    assert.equal('[null,1]', json.encode({ json.null, 1 }))
  end)

  it("encodes an empty table as an object unless marked", function()
    assert.equal("{}", json.encode({}))
    assert.equal("[]", json.encode(json.array()))
    assert.equal('{"1":"a"}', json.encode(json.object({ "a" })))
    assert.equal('{"5":true}', json.encode({ [5] = true }))
  end)

  it("returns nil, message, code on invalid JSON", function()
    local v, msg, code = json.decode('{"a": [1, 2')
    assert.is_nil(v)
    assert.equal("json", code)
    assert.matches("invalid JSON at byte", msg)
  end)

  it("raises on values JSON cannot hold", function()
    assert.has_error(function() json.encode({ f = print }) end)
    assert.has_error(function() json.encode(0 / 0) end)
    local t = {}
    t.self = t
    assert.has_error(function() json.encode(t) end, "json: nesting deeper than 200 (a cycle?)")
  end)

  it("does not leak when encoding fails half-way (boxes close)", function()
    for _ = 1, 200 do
      pcall(json.encode, { a = { b = { c = print } } })
    end
    collectgarbage("collect")
    assert.equal("[1]", json.encode({ 1 }))
  end)
end)
