-- mirza.json: what the JSON <-> Lua fuzzer (tests/fuzz/fuzz_json.c) found,
-- pinned with exact values: numbers encode exactly, a NUL inside a string
-- survives encoding, text after the value is refused, not dropped.
local mirza = require "mirza"
local json = mirza.json

describe("mirza.json exactness", function()
  after_each(function() collectgarbage("collect") end)

  it("encodes floats with every digit they need", function()
    assert.equal("0.30000000000000004", json.encode(0.1 + 0.2))
    assert.equal("0.1", json.encode(0.1))
    assert.equal("1e+300", json.encode(1e300))
    assert.equal(0.1 + 0.2, json.decode(json.encode(0.1 + 0.2)))
  end)

  -- The encoder writes the common short decimals (up to 3 digits after
  -- the point) by integer arithmetic: the same text as the general way,
  -- the fewest of 15 to 17 significant digits that read back the same.
  it("writes a short decimal as the fewest digits that read back, like any float", function()
    local function expected(x)
      for digits = 15, 17 do
        local s = ("%." .. digits .. "g"):format(x)
        if tonumber(s) == x then return s end
      end
    end
    local fixed = { 0.005, -0.005, 0.001, -0.001, 0.0015, 12.3, -2.5, 3.0, -0.0, 0.0, 100.25, 1234.125, 99999.999,
      1e14, 1e15, 1e15 - 1, 999999999999999.9, 123456789012.345, 0.1 + 0.2, 2.0 ^ 53 + 2, 5e-4, 0.01 }
    for _, x in ipairs(fixed) do assert.equal(expected(x), json.encode(x), ("%.17g"):format(x)) end
    local seed = 12345 -- a deterministic spread: rates, durations, money, tenths
    for _ = 1, 2000 do
      seed = (seed * 1103515245 + 12345) % 2147483648
      local x = (seed % 10000000) / 10 ^ (seed % 5) * (seed % 3 == 0 and -1 or 1)
      assert.equal(expected(x), json.encode(x), ("%.17g"):format(x))
    end
  end)

  it("encodes integers in full", function()
    assert.equal("9007199254740992", json.encode(2 ^ 53 | 0))
    assert.equal("9007199254740992", json.encode(2.0 ^ 53))
    assert.equal("4611686018427387905", json.encode((1 << 62) + 1))
    assert.equal("-9223372036854775808", json.encode(math.mininteger))
    assert.equal('{"seed":1234567890123}', json.encode({ seed = 1234567890123 }))
  end)

  it("keeps a NUL inside a string value", function()
    assert.equal('"a\\u0000b\\"\\\\\\u0001"', json.encode("a\0b\"\\\1"))
    assert.equal('["x\\u0000"]', json.encode({ "x\0" }))
  end)

  it("escapes as cJSON did: \\b \\f \\n \\r \\t, other controls as \\u00XX, the rest as is", function()
    assert.equal('"\\b\\f\\n\\r\\t\\u0001\\u001f\\"\\\\/\127\u{2028}é"',
      json.encode("\b\f\n\r\t\1\31\"\\/\127\u{2028}é"))
    assert.equal('{"\\n":"\\u0000\\n","\\u000b":[]}', json.encode({ ["\n"] = "\0\n", ["\v"] = json.array() }))
  end)

  it("decodes a NUL inside a string value whole, at any depth", function()
    local v = json.decode('{"a":"x\\u0000y","b":["\\u0000","z\\u0000\\u0000"],"c":{"d":"\\u0001\\u0000"}}')
    assert.same({ a = "x\0y", b = { "\0", "z\0\0" }, c = { d = "\1\0" } }, v)
    assert.equal("a\0b\"\\\1", json.decode(json.encode("a\0b\"\\\1")))
    -- every control character in use: a noncharacter stands in for NUL
    local all = {}
    for c = 1, 31 do all[#all + 1] = string.char(c) end
    local s = table.concat(all) .. "\0end"
    assert.equal(s, json.decode(json.encode(s)))
    assert.equal("\u{FDD0}\0\u{FDD0}", json.decode(json.encode(table.concat(all) .. "\u{FDD0}\0\u{FDD0}")):sub(32))
  end)

  it("raises on a table key holding a NUL instead of cutting it", function()
    assert.has_error(function() json.encode({ ["a\0b"] = 1 }) end,
      "json: cannot encode a table key containing NUL")
  end)

  it("refuses text after the value", function()
    local v, msg, code = json.decode('[1] x')
    assert.is_nil(v)
    assert.equal("invalid JSON at byte 5 near 'x'", msg)
    assert.equal("json", code)
    assert.is_nil((json.decode('{"a":1}{"b":2}')))
    assert.same({ 1 }, json.decode(' [1] \r\n\t'))
  end)
end)
