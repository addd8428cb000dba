-- mirza.schema: the validator keyword by keyword (what passes, what fails,
-- the JSON pointer and the message of the first violation), $ref into
-- $defs / definitions with a cycle, the ECMA pattern subset translated or
-- left unchecked, decode's preamble and cut answers, response_format's
-- wire form, and compile's errors.
local mirza = require "mirza"
local schema = require "mirza.schema"
local H = require "tests.helper"

local json, null = mirza.json, mirza.json.null

-- ok, msg, pointer of v against schema table s.
local function check(s, v)
  return schema.validate(assert(schema.compile(s)), v)
end

-- v from a JSON text (so arrays, null and numbers are as decoded).
local function J(text) return assert(json.decode(text)) end

local function passes(s, text)
  local ok, msg = check(s, J(text))
  assert.is_true(ok, ("%s should pass %s: %s"):format(text, json.encode(s), tostring(msg)))
end

local function fails(s, text, pointer, msg_part)
  local ok, msg, ptr = check(s, J(text))
  assert.is_false(ok, ("%s should fail %s"):format(text, json.encode(s)))
  assert.are.equal(pointer, ptr)
  if msg_part then assert.truthy(msg:find(msg_part, 1, true), ("%q lacks %q"):format(msg, msg_part)) end
  return msg
end

describe("mirza.schema.validate", function()
  it("types: integer is a number without a fraction, null is mirza.json.null", function()
    passes({ type = "integer" }, "3")
    passes({ type = "integer" }, "3.0")
    passes({ type = "integer" }, "12345678901234567890") -- beyond 2^53: a float, still whole
    fails({ type = "integer" }, "3.5", "", "expected integer, got number 3.5")
    passes({ type = "number" }, "3.5")
    fails({ type = "number" }, '"12"', "", 'expected number, got string "12"')
    passes({ type = "null" }, "null")
    fails({ type = "string" }, "null", "", "got null")
    fails({ type = "boolean" }, "0", "", "expected boolean")
    passes({ type = { "string", "null" } }, "null")
    fails({ type = { "string", "null" } }, "1", "", "expected string or null, got number 1")
    passes({ type = "array" }, "[]")
    passes({ type = "object" }, "{}")
    fails({ type = "array" }, '{"a": 1}', "", "expected array, got object")
    fails({ type = "object" }, "[1]", "", "expected object, got array [1]")
    assert.is_true((schema.validate(assert(schema.compile { type = "null" }), null)))
  end)

  it("sees JSON as mirza.json.decode gives it: a duplicated member's last value", function()
    fails({ properties = { a = { type = "integer" } } }, '{"a": 1, "a": "x"}', "/a", 'got string "x"')
    passes({ properties = { a = { type = "integer" } } }, '{"a": "x", "a": 1}')
    passes({ type = "integer", maximum = 9007199254740992 }, "9007199254740993") -- a float: 2^53
  end)

  it("gives the pointer of the first violation, indices from 0, ~ and / escaped", function()
    local s = { type = "object", properties = { items = { type = "array", items = {
      type = "object", properties = { price = { type = "number" } } } } } }
    local msg = fails(s, '{"items": [{"price": 1}, {"price": 2}, {"price": "12"}]}', "/items/2/price")
    assert.are.equal('/items/2/price: expected number, got string "12"', msg)
    fails({ properties = { ["a/b~c"] = { type = "string" } } }, '{"a/b~c": 1}', "/a~1b~0c")
    msg = fails({ type = "string" }, "1", "")
    assert.are.equal("(root): expected string, got number 1", msg)
  end)

  it("required, in its order; additionalProperties false or a schema", function()
    local s = { type = "object", required = { "b", "a" }, properties = { a = {}, b = {} } }
    fails(s, "{}", "", 'missing required member "b"')
    fails(s, '{"b": 1}', "", 'missing required member "a"')
    passes(s, '{"a": 1, "b": 2}')
    local closed = { properties = { a = {} }, additionalProperties = false }
    fails(closed, '{"a": 1, "z": 2}', "/z", "member not allowed (the object at (root) takes only: a)")
    passes(closed, '{"a": 1}')
    fails({ additionalProperties = { type = "integer" } }, '{"x": 1, "y": "2"}', "/y", "expected integer")
    passes({ properties = { a = {} }, additionalProperties = { type = "integer" } }, '{"a": "s", "b": 1}')
  end)

  it("patternProperties, propertyNames, min/maxProperties, dependentRequired, dependentSchemas", function()
    local s = { patternProperties = { ["^n_"] = { type = "number" } }, additionalProperties = false }
    passes(s, '{"n_a": 1}')
    fails(s, '{"n_a": "x"}', "/n_a", "expected number")
    fails(s, '{"b": 1}', "/b", "member not allowed")
    fails({ propertyNames = { maxLength = 2 } }, '{"abc": 1}', "/abc", 'member name "abc" is not allowed')
    fails({ minProperties = 2 }, '{"a": 1}', "", "expected at least 2 members, got 1")
    fails({ maxProperties = 1 }, '{"a": 1, "b": 2}', "", "expected at most 1 members, got 2")
    fails({ dependentRequired = { card = { "cvv" } } }, '{"card": 1}', "", 'missing member "cvv"')
    passes({ dependentRequired = { card = { "cvv" } } }, '{"x": 1}')
    fails({ dependentSchemas = { a = { required = { "b" } } } }, '{"a": 1}', "", 'missing required member "b"')
  end)

  it("items, prefixItems (and draft 4's list form), min/maxItems, uniqueItems, contains", function()
    fails({ items = { type = "string" } }, '["a", 2]', "/1", "expected string")
    fails({ prefixItems = { { type = "string" }, { type = "number" } } }, '["a", "b"]', "/1", "expected number")
    passes({ prefixItems = { { type = "string" } }, items = false }, '["a"]')
    fails({ prefixItems = { { type = "string" } }, items = false }, '["a", 1]', "/1", "no value is allowed here")
    fails({ items = { { type = "string" } }, additionalItems = false }, '["a", 1]', "/1", "no value is allowed")
    fails({ minItems = 2 }, "[1]", "", "expected at least 2 items, got 1")
    fails({ maxItems = 1 }, "[1, 2]", "", "expected at most 1 items, got 2")
    fails({ uniqueItems = true }, '[1, {"a": [1]}, 2, {"a": [1]}]', "/3", "duplicate of /1")
    passes({ uniqueItems = true }, '[1, "1", [1], {"a": 1}]')
    fails({ contains = { type = "string" } }, "[1, 2]", "", "expected at least 1 items matching contains, got 0")
    fails({ contains = { type = "string" }, maxContains = 1 }, '["a", "b"]', "", "at most 1")
    passes({ contains = { type = "string" }, minContains = 2 }, '["a", 1, "b"]')
  end)

  it("enum and const compare deeply (1 equals 1.0)", function()
    passes({ enum = { "a", 1, { x = { 1, 2 } } } }, '{"x": [1, 2]}')
    passes({ enum = { "a", 1 } }, "1.0")
    fails({ enum = { "red", "green" } }, '"blue"', "", 'expected one of "red", "green", got string "blue"')
    fails({ const = { a = 1 } }, '{"a": 1, "b": 2}', "", 'expected {"a":1}')
    passes({ const = { a = { true } } }, '{"a": [true]}')
    fails({ const = null }, "0", "", "expected null")
  end)

  it("numeric bounds, exclusive (numbers and draft 4's booleans), multipleOf", function()
    fails({ minimum = 0 }, "-1", "", "expected a number >= 0, got -1")
    passes({ minimum = 0 }, "0")
    fails({ maximum = 10 }, "10.5", "", "<= 10")
    fails({ exclusiveMinimum = 0 }, "0", "", "> 0")
    fails({ exclusiveMaximum = 5 }, "5", "", "< 5")
    fails({ minimum = 0, exclusiveMinimum = true }, "0", "", "> 0")
    fails({ maximum = 5, exclusiveMaximum = true }, "5", "", "< 5")
    passes({ multipleOf = 0.01 }, "19.99")
    fails({ multipleOf = 3 }, "10", "", "expected a multiple of 3, got 10")
    passes({ minimum = 1 }, '"not a number: bounds only apply to numbers"')
  end)

  it("minLength/maxLength count UTF-8 characters, not bytes", function()
    passes({ maxLength = 3 }, '"été"') -- 5 bytes, 3 characters
    fails({ maxLength = 2 }, '"été"', "", "expected at most 2 characters, got 3")
    fails({ minLength = 4 }, '"été"', "", "expected at least 4 characters, got 3")
  end)

  it("anyOf, oneOf, allOf, not, if/then/else", function()
    local any = { anyOf = { { type = "string" }, { type = "object", required = { "id" } } } }
    passes(any, '"x"')
    local msg = fails(any, '{"name": 1}', "", "matches none of the anyOf alternatives")
    assert.truthy(msg:find('missing required member "id"', 1, true), msg) -- the closest alternative said
    local one = { oneOf = { { type = "integer" }, { minimum = 0 } } }
    passes(one, "-3")
    fails(one, "3", "", "matches oneOf alternatives 1 and 2, expected exactly one")
    fails({ oneOf = { { type = "string" }, { type = "null" } } }, "1", "", "matches none of the oneOf")
    fails({ allOf = { { type = "number" }, { maximum = 3 } } }, "4", "", "<= 3")
    fails({ ["not"] = { type = "null" } }, "null", "", "matches the schema under not")
    local cond = { ["if"] = { properties = { kind = { const = "n" } } }, ["then"] = { required = { "n" } },
      ["else"] = { required = { "s" } } }
    fails(cond, '{"kind": "n"}', "", 'missing required member "n"')
    fails(cond, '{"kind": "x"}', "", 'missing required member "s"')
    passes(cond, '{"kind": "n", "n": 1}')
  end)

  it("boolean schemas", function()
    passes(true, "1")
    fails(false, "1", "", "no value is allowed here")
    fails({ properties = { a = false } }, '{"a": 1}', "/a", "no value is allowed")
  end)

  it("$ref into $defs and definitions, a recursive schema, siblings of $ref", function()
    local tree = { ["$defs"] = { node = { type = "object", required = { "v" }, properties = {
      v = { type = "integer" }, kids = { type = "array", items = { ["$ref"] = "#/$defs/node" } } } } },
      ["$ref"] = "#/$defs/node" }
    passes(tree, '{"v": 1, "kids": [{"v": 2, "kids": [{"v": 3}]}]}')
    fails(tree, '{"v": 1, "kids": [{"v": 2, "kids": [{"v": 3.5}]}]}', "/kids/0/kids/0/v", "expected integer")
    passes({ definitions = { s = { type = "string" } }, items = { ["$ref"] = "#/definitions/s" } }, '["a"]')
    fails({ definitions = { s = { type = "string" } }, items = { ["$ref"] = "#/definitions/s" } }, "[1]", "/0")
    fails({ ["$defs"] = { p = { minimum = 0 } }, ["$ref"] = "#/$defs/p", type = "integer" }, "1.5", "",
      "expected integer")
    local c = assert(schema.compile(tree))
    assert.are.equal(c.root.ref.properties.kids.items.ref, c.root.ref) -- one node per target: resolved once
  end)

  it("a schema not compiled yet is compiled by validate; a bad one raises", function()
    assert.is_true((schema.validate({ type = "string" }, "x")))
    assert.has_error(function() schema.validate({ type = "strnig" }, "x") end)
  end)
end)

describe("mirza.schema patterns", function()
  it("translates the ECMA subset that means the same in Lua", function()
    local s = { pattern = "^[A-Z]{2}-\\d{3,5}$" }
    passes(s, '"FR-123"')
    passes(s, '"FR-12345"')
    fails(s, '"FR-12"', "", "expected a string matching /^[A-Z]{2}-\\d{3,5}$/")
    fails(s, '"FR-123456"', "")
    fails(s, '"fr-123"', "")
    passes({ pattern = "a.c" }, '"xxabcxx"') -- unanchored: a search, as in ECMA
    fails({ pattern = "^a+$" }, '"aab"', "")
    passes({ pattern = "^\\w+@\\w+\\.com$" }, '"ada_l@example.com"')
    fails({ pattern = "^\\w+@\\w+\\.com$" }, '"ada@examplexcom"', "")
    passes({ pattern = "^[^,]*$" }, '"a b"')
    fails({ pattern = "^[^,]*$" }, '"a,b"', "")
    passes({ pattern = "^-?\\d+(\\.\\d+)?$" }, '"not translated: anything passes"')
  end)

  it("leaves what it cannot translate unchecked, and says so", function()
    local c = assert(schema.compile { properties = { a = { pattern = "^(a|b)$" }, b = { pattern = "^x$" } } })
    assert.are.same({ "pattern ^(a|b)$ at /properties/a/pattern" }, c.unchecked)
    assert.is_true((schema.validate(c, { a = "zzz", b = "x" })))
    for _, p in ipairs { "(a)", "a|b", "\\bword", "a+?", "(?=a)", "[[:alpha:]]", "\\1", "a{200}", "é+", "[é]" } do
      assert.is_nil(require("mirza.regex").translate(p), p)
    end
  end)

  it("does not apply a byte-wise pattern to a non-ASCII string", function()
    passes({ pattern = "^.{3}$" }, '"été"') -- 3 characters, 5 bytes: not judged in bytes
    fails({ pattern = "^.{3}$" }, '"abcd"', "")
    fails({ pattern = "^a.b$" }, '"a\\rb"', "") -- "." is no line terminator, \r included
    fails({ pattern = "^[a-z]+$" }, '"été"', "") -- no "." nor negation: bytes are exact
    passes({ pattern = "^café$" }, '"café"') -- a non-ASCII literal is its bytes
    fails({ pattern = "^café$" }, '"cafe"', "")
    passes({ pattern = "^\\s+$" }, '"\\u00a0"') -- ECMA's \s takes U+00A0, Lua's %s does not: not judged
    fails({ pattern = "^\\s+$" }, '" x"', "")
  end)
end)

describe("mirza.schema.decode", function()
  local c = assert(schema.compile { type = "object", required = { "name" },
    properties = { name = { type = "string" }, tags = { type = "array", items = { type = "string" } } } })

  it("skips a preamble up to the first { or [ and ignores what follows the value", function()
    local v = schema.decode(c, 'Sure, here it is:\n```json\n{"name": "Ada {1}", "tags": ["a]"]}\n```\nDone.')
    assert.are.same({ name = "Ada {1}", tags = { "a]" } }, v)
    assert.are.same({ name = "x\"}" }, (schema.decode(c, '{"name": "x\\"}"}')))
  end)

  it("a cut, invalid or missing JSON gives nil, message, \"schema\", raw", function()
    local cut = '{"name": "Ada", "tags": ["a", "b'
    local v, msg, code, raw = schema.decode(c, cut)
    assert.is_nil(v)
    assert.are.equal("schema", code)
    assert.are.equal(cut, raw)
    assert.truthy(msg:find("cut", 1, true))
    v, msg, code, raw = schema.decode(c, "I cannot answer that.")
    assert.are.same({ nil, "schema", "I cannot answer that." }, { v, code, raw })
    assert.truthy(msg:find("holds no JSON", 1, true), msg)
    v, msg, code = schema.decode(c, '{"name": "Ada",}')
    assert.are.same({ nil, "schema" }, { v, code })
    assert.truthy(msg:find("not valid JSON", 1, true), msg)
  end)

  it("starts at the first bracket of the schema's root type: a bracket in the preamble is prose", function()
    -- an object root: a [ before it is prose (it was taken for the answer, /0 = 1)
    local v, msg = schema.decode(c, 'See [1] for the list: {"name": "Ada"}')
    assert.are.same({ name = "Ada" }, v, msg)
    -- an array root: a { before it is prose
    local list = assert(schema.compile { type = "array", items = { type = "integer" } })
    v, msg = schema.decode(list, 'Note {x} and {"y": 1} first: [1, 2]')
    assert.are.same({ 1, 2 }, v, msg)
    -- the root's own bracket in prose: that start is not JSON, the next one is taken
    v, msg = schema.decode(c, 'Use {braces} like {this} for: {"name": "Ada"}')
    assert.are.same({ name = "Ada" }, v, msg)
    v, msg = schema.decode(list, 'See [citation needed] then [3]')
    assert.are.same({ 3 }, v, msg)
    v, msg = schema.decode(c, 'Use {name for: {"name": "Ada"}') -- a start never closed
    assert.are.same({ name = "Ada" }, v, msg)
    -- a root through $ref, allOf, or alternatives that agree
    for _, s in ipairs { { ["$ref"] = "#/$defs/p", ["$defs"] = { p = { type = "object" } } },
      { allOf = { { type = "object" } } },
      { anyOf = { { type = "object" }, { type = "object", required = { "b" } } } } } do
      assert.are.equal("object", schema.root(s))
      assert.are.same({ b = 1 }, (schema.decode(s, '[1] {"b": 1}')))
    end
    assert.are.equal("array", schema.root(list))
    -- nothing says the root: either bracket, so [1] is the answer
    for _, s in ipairs { {}, { type = { "object", "array" } },
      { anyOf = { { type = "object" }, { type = "array" } } } } do
      assert.is_nil(schema.root(s))
      assert.are.same({ 1 }, (schema.decode(s, 'See [1] for the list: {"a": 1}')))
    end
    -- no bracket of the root's type: no JSON, said with the type
    v, msg = schema.decode(list, 'Here: {"a": 1}')
    assert.is_nil(v)
    assert.truthy(msg:find("holds no JSON array", 1, true), msg)
  end)

  it("tries the next start only while the first is not JSON before a value inside it completes", function()
    -- a member completed, then broken: the answer is broken (not the text after it)
    local v, msg = schema.decode(c, '{"name": "Ada", oops} {"name": "Bob"}')
    assert.is_nil(v)
    assert.truthy(msg:find("not valid JSON", 1, true), msg)
    -- a cut answer after a prose start is said to be cut
    v, msg = schema.decode(c, 'Use {x}: {"name": "Ada", "tags": ["a"')
    assert.is_nil(v)
    assert.truthy(msg:find("cut", 1, true), msg)
    -- at most CANDIDATES starts
    local prose = string.rep("{x} ", schema.CANDIDATES - 1)
    assert.are.same({ name = "Ada" }, (schema.decode(c, prose .. '{"name": "Ada"}')))
    v, msg = schema.decode(c, prose .. '{x} {"name": "Ada"}')
    assert.is_nil(v)
    assert.truthy(msg:find("not valid JSON", 1, true), msg)
    -- a valid first value that breaks the schema is the answer's violation, not a cue to look further
    v, msg = schema.decode(c, '{"tags": []} {"name": "Ada"}')
    assert.is_nil(v)
    assert.truthy(msg:find("missing required member", 1, true), msg)
  end)

  it("a value that breaks the schema gives the violation and its pointer", function()
    local v, msg, code, raw, ptr = schema.decode(c, '{"name": "Ada", "tags": ["a", 2]}')
    assert.are.same({ nil, "schema", '{"name": "Ada", "tags": ["a", 2]}', "/tags/1" }, { v, code, raw, ptr })
    assert.are.equal("/tags/1: expected string, got number 2", msg)
  end)
end)

describe("mirza.schema.compile", function()
  it("reads a .json file; a missing file is io, a broken one or a bad schema is schema", function()
    local path = H.tmpname(".json")
    finally(function() os.remove(path) end)
    local f = assert(io.open(path, "w"))
    f:write('{"type": "object", "required": [], "properties": {"a": {"enum": [1, 2]}}}')
    f:close()
    local c = assert(schema.compile(path))
    assert.is_true((schema.validate(c, { a = 2 })))
    assert.is_false((schema.validate(c, { a = 3 })))
    local _, msg, code = schema.compile(path .. ".missing")
    assert.are.equal("io", code)
    assert.truthy(msg:find(".missing", 1, true))
    f = assert(io.open(path, "w"))
    f:write('{"type": ')
    f:close()
    _, _, code = schema.compile(path)
    assert.are.equal("schema", code)
    _, msg, code = schema.compile { type = "strnig" }
    assert.are.same({ "schema", "schema: /type: unknown type strnig" }, { code, msg })
    _, msg, code = schema.compile { ["$ref"] = "#/$defs/nothing" }
    assert.are.equal("schema", code)
    assert.truthy(msg:find("points to nothing", 1, true), msg)
    _, msg = schema.compile { ["$ref"] = "other.json#/x" }
    assert.truthy(msg:find("not a pointer into this schema", 1, true), msg)
    _, msg = schema.compile { properties = { a = 3 } }
    assert.truthy(msg:find("/properties/a: a schema must be an object or a boolean", 1, true), msg)
  end)

  it("lists the keywords present but not checked (format, ...)", function()
    local c = assert(schema.compile { properties = { d = { type = "string", format = "date" } } })
    assert.are.same({ "format at /properties/d" }, c.unchecked)
    assert.is_true((schema.validate(c, { d = "not a date" })))
    assert.truthy(#schema.UNCHECKED > 0)
    for _, k in ipairs(schema.UNCHECKED) do assert.are.equal("string", type(k)) end
  end)
end)

describe("mirza.schema.response_format", function()
  it("is the OpenAI json_schema shape; lists stay arrays, even empty ones", function()
    local s = { title = "Invoice line", type = "object", required = {}, properties = { a = { enum = { 1 } } } }
    local rf = schema.response_format(assert(schema.compile(s)))
    assert.are.equal('{"json_schema":{"name":"Invoice_line","schema":{"properties":{"a":{"enum":[1]}},'
      .. '"required":[],"title":"Invoice line","type":"object"},"strict":true},"type":"json_schema"}', json.encode(rf))
    assert.are.same({}, s.required) -- the caller's table is not marked
    assert.is_nil(getmetatable(s.required))
    assert.are.equal("facts", schema.response_format({ type = "object" }, "facts").json_schema.name)
    assert.are.equal("answer", schema.response_format({ type = "object" }).json_schema.name)
  end)
end)
