-- mirza.json: encode/decode round trips, arrays vs objects, null, errors.
local mirza = require "mirza"
local H = require "tests.helper"
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

  it("writes an object's members in key order, whatever the table's order", function()
    local t, keys = {}, {}
    for i = 1, 40 do
      local k = ("k%02d"):format((i * 17) % 41)
      t[k], keys[#keys + 1] = i, k
    end
    table.sort(keys)
    local want = {}
    for i, k in ipairs(keys) do want[i] = ("%q:%d"):format(k, t[k]) end
    assert.equal("{" .. table.concat(want, ",") .. "}", json.encode(t))
    assert.equal('{"a":{"x":1,"y":[{"m":2,"n":1}]},"b":true}',
      json.encode { b = true, a = { y = { { n = 1, m = 2 } }, x = 1 } })
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
    assert.equal("invalid JSON at byte 11 near '2'", msg)
    v, msg, code = json.decode('{"a": tru}')
    assert.is_nil(v)
    assert.equal("json", code)
    assert.equal("invalid JSON at byte 7 near 'tru}'", msg)
  end)

  it("raises on values JSON cannot hold", function()
    assert.has_error(function() json.encode({ f = print }) end, "json: cannot encode a value of type function")
    assert.has_error(function() json.encode(0 / 0) end, "json: cannot encode NaN")
    assert.has_error(function() json.encode({ 1, -1 / 0 }) end, "json: cannot encode infinity")
    assert.has_error(function() json.encode({ [true] = 1 }) end, "json: cannot encode a table key of type boolean")
    local t = {}
    t.self = t
    assert.has_error(function() json.encode(t) end, "json: nesting deeper than 200 (a cycle?)")
  end)

  -- The half-built cJSON tree of a failed encode is freed when the error
  -- unwinds (its box is to-be-closed), not at the next garbage collection:
  -- with the collector stopped, 20 failed encodes of an 8 MiB string must
  -- not hold 160 MiB. Resident memory is the only outside view of C
  -- allocations; under ASan freed memory sits in quarantine, so the bound
  -- is checked in the normal build only.
  it("frees a half-built tree when encoding fails, not at the next GC", function()
    local rss_mib = H.rss_mib -- /proc/self/statm, or ps -o rss=
    local big = { string.rep("x", 8 << 20), print } -- the string is copied into the tree, then print fails
    collectgarbage("collect")
    collectgarbage("stop")
    local before = rss_mib()
    for _ = 1, 20 do
      local ok, err = pcall(json.encode, big)
      assert.is_false(ok)
      assert.equal("json: cannot encode a value of type function", err)
    end
    local grown = rss_mib() - before
    collectgarbage("restart")
    if not os.getenv("ASAN_OPTIONS") then
      assert.is_true(grown < 64, ("resident memory grew %.0f MiB"):format(grown))
    end
    assert.equal("[1]", json.encode({ 1 }))
  end)
end)
