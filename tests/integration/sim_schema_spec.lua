-- mirza-sim honours response_format (issue 18): a json_schema (or
-- json_object) request is answered with JSON that validates against the
-- schema, streamed in small deltas like any answer (after the reasoning
-- when thinking), deterministic; the schema-ignore, schema-break and
-- schema-cut faults break it on purpose. The answers are checked by a
-- validator written here (independent of mirza.schema, so a bug in one
-- cannot hide a bug in the other).
local mirza = require "mirza"
local H = require "tests.helper"
local json = mirza.json

-- ---- a small JSON Schema validator: true, or false and the pointer ----------

local function is_array(v) return type(v) == "table" and (v[1] ~= nil or next(v) == nil) end
local function is_object(v) return type(v) == "table" and (v[1] == nil) end
local function same(a, b) return json.encode(a) == json.encode(b) end

local function follow(root, ref)
  local at = root
  for part in ref:gsub("^#", ""):gmatch("[^/]+") do at = at[(part:gsub("~1", "/"):gsub("~0", "~"))] end
  return assert(at, "unresolved $ref " .. ref)
end

local TYPES = {
  object = is_object,
  array = is_array,
  string = function(v) return type(v) == "string" end,
  number = function(v) return type(v) == "number" end,
  integer = function(v) return math.type(v) == "integer" or (type(v) == "number" and v == math.floor(v)) end,
  boolean = function(v) return type(v) == "boolean" end,
  null = function(v) return v == json.null end,
}

local validate
local function check(root, s, v, at)
  if s == true or s == nil then return true end
  if s == false then return false, at end
  if s["$ref"] then return validate(root, follow(root, s["$ref"]), v, at) end
  local t = s.type
  if t then
    local ok = false
    for _, name in ipairs(type(t) == "table" and t or { t }) do ok = ok or TYPES[name](v) end
    if not ok then return false, at end
  end
  if s.const ~= nil and not same(s.const, v) then return false, at end
  if s.enum then
    local found = false
    for _, e in ipairs(s.enum) do found = found or same(e, v) end
    if not found then return false, at end
  end
  if type(v) == "string" then
    local n = utf8.len(v)
    if (s.minLength and n < s.minLength) or (s.maxLength and n > s.maxLength) then return false, at end
  end
  if type(v) == "number" then
    if (s.minimum and v < s.minimum) or (s.maximum and v > s.maximum) or
      (s.exclusiveMinimum and v <= s.exclusiveMinimum) or (s.exclusiveMaximum and v >= s.exclusiveMaximum) or
      (s.multipleOf and v % s.multipleOf ~= 0) then
      return false, at
    end
  end
  if is_object(v) then
    for _, name in ipairs(s.required or {}) do if v[name] == nil then return false, at .. "/" .. name end end
    for k, x in pairs(v) do
      local ps = s.properties and s.properties[k]
      if ps ~= nil then
        local ok, p = validate(root, ps, x, at .. "/" .. k)
        if not ok then return false, p end
      elseif s.additionalProperties ~= nil then
        local ok, p = validate(root, s.additionalProperties, x, at .. "/" .. k)
        if not ok then return false, p end
      end
    end
  end
  if is_array(v) and (s.items or s.minItems or s.maxItems) then
    if (s.minItems and #v < s.minItems) or (s.maxItems and #v > s.maxItems) then return false, at end
    for i, x in ipairs(v) do
      local ok, p = validate(root, s.items, x, at .. "/" .. (i - 1))
      if not ok then return false, p end
    end
  end
  for _, b in ipairs(s.allOf or {}) do
    local ok, p = validate(root, b, v, at)
    if not ok then return false, p end
  end
  if s.anyOf then
    local any = false
    for _, b in ipairs(s.anyOf) do any = any or validate(root, b, v, at) end
    if not any then return false, at end
  end
  if s.oneOf then
    local n = 0
    for _, b in ipairs(s.oneOf) do if validate(root, b, v, at) then n = n + 1 end end
    if n ~= 1 then return false, at end
  end
  return true
end
validate = check

-- ---- the schemas -------------------------------------------------------------

local PERSON = {
  type = "object",
  properties = {
    name = { type = "string", minLength = 3, maxLength = 10 },
    age = { type = "integer", minimum = 18, maximum = 99 },
    score = { type = "number", exclusiveMinimum = 0, exclusiveMaximum = 1 },
    tags = { type = "array", items = { enum = { "a", "b", "c" } }, minItems = 1, maxItems = 5 },
    kind = { const = "person" },
    addr = { ["$ref"] = "#/$defs/addr" },
    either = { oneOf = { { type = "number" }, { type = "integer" } } },
    both = { type = "object", allOf = { { properties = { x = { type = "boolean" } }, required = { "x" } },
      { properties = { y = { type = "null" } }, required = { "y" } } } },
    when = { type = "string", format = "date-time" },
    maybe = { anyOf = { { type = "integer", multipleOf = 7, minimum = 10, maximum = 40 }, { type = "string" } } },
  },
  required = { "name", "age", "addr" },
  additionalProperties = false,
  ["$defs"] = { addr = { type = "object", properties = { city = { type = "string" },
    zip = { type = { "string", "null" }, maxLength = 5 } }, required = { "city" }, additionalProperties = false } },
}
local TREE = { -- recursive: arrays thin out with depth
  ["$ref"] = "#/definitions/node",
  definitions = { node = { type = "object", properties = { label = { type = "string" },
    children = { type = "array", items = { ["$ref"] = "#/definitions/node" } } },
    required = { "label", "children" } } },
}
local LIST = { type = "array", items = { type = "object", properties = { id = { type = "integer" },
  price = { type = "number", minimum = 1.5, maximum = 2 } }, required = { "id", "price" } } }
local SHORT = { type = "object", properties = { few = { type = "array", items = { type = "string", minLength = 12 },
  minItems = 5 }, none = { type = "array", maxItems = 0 }, one = { type = "array", maxItems = 1 } },
  required = { "few", "none", "one" } }

local CASES = { { "person", PERSON }, { "tree", TREE }, { "list", LIST }, { "bounds", SHORT } }

local function rf(schema)
  return { type = "json_schema", json_schema = { name = "t", schema = schema, strict = true } }
end

local function body(opts)
  local b = H.chat_body(opts.prompt or "Extract it.", { stream = opts.stream ~= false, response_format = opts.rf })
  for k, v in pairs(opts.extra or {}) do b[k] = v end
  return b
end

-- The streamed answer: result, the text deltas.
local function streamed(sim, opts, headers)
  local s <close> = mirza.open { url = sim.url, body = body(opts), headers = headers, timeout = 10 }
  local r = H.drain(s, 10)
  local deltas = {}
  for _, ev in ipairs(r.events) do if ev.type == "text" then deltas[#deltas + 1] = ev.text end end
  return r, deltas
end

local function plain(sim, opts, headers)
  local o = { stream = false }
  for k, v in pairs(opts) do o[k] = v end
  local raw = assert(mirza.request { url = sim.url, body = body(o), headers = headers, timeout = 10 })
  return json.decode(raw).choices[1]
end

local sims = {}
teardown(function() for _, s in pairs(sims) do s.stop() end end)
local function sim(dialect, extra)
  local key = dialect .. table.concat(extra or {}, " ")
  if not sims[key] then
    local args = { "--dialect", dialect, "--tok-rate", "0", "--ttft-ms", "0", "--quiet" }
    for _, a in ipairs(extra or {}) do args[#args + 1] = a end
    sims[key] = H.start_sim(args)
  end
  return sims[key]
end

for _, dialect in ipairs { "mtplx", "llama" } do
  describe("mirza-sim response_format (" .. dialect .. ")", function()
    local thinking_off = dialect == "llama" and { chat_template_kwargs = { enable_thinking = false } } or nil

    for _, c in ipairs(CASES) do
      it(c[1] .. ": the answer validates, streamed in small deltas, the same text not streamed", function()
        local s = sim(dialect)
        local r, deltas = streamed(s, { rf = rf(c[2]), extra = thinking_off })
        assert.equal("done", r.last.type)
        assert.equal("stop", r.last.finish_reason)
        local v = assert(json.decode(r.text))
        local ok, at = validate(c[2], c[2], v, "")
        assert.is_true(ok, ("%s invalid at %s: %s"):format(c[1], tostring(at), r.text))
        assert.is_true(#deltas >= 3, #deltas .. " deltas")
        for _, d in ipairs(deltas) do
          assert.is_true(#d <= 40, ("a delta of %d bytes: %q"):format(#d, d))
        end
        assert.equal(r.text, plain(s, { rf = rf(c[2]), extra = thinking_off }).message.content)
        assert.equal(r.text, (streamed(s, { rf = rf(c[2]), extra = thinking_off })).text) -- deterministic
      end)
    end

    it("arrays have 3 items unless minItems/maxItems say otherwise; a recursive schema ends", function()
      local v = json.decode(streamed(sim(dialect), { rf = rf(SHORT), extra = thinking_off }).text)
      assert.same({ 5, 0, 1 }, { #v.few, #v.none, #v.one })
      local list = json.decode(streamed(sim(dialect), { rf = rf(LIST), extra = thinking_off }).text)
      assert.equal(3, #list)
      local tree = json.decode(streamed(sim(dialect), { rf = rf(TREE), extra = thinking_off }).text)
      assert.equal(3, #tree.children)
    end)

    it("json_object: a JSON object; llama-server's json_object with a schema follows it", function()
      local r = streamed(sim(dialect), { rf = { type = "json_object" }, extra = thinking_off })
      local v = assert(json.decode(r.text))
      assert.is_true(is_object(v) and next(v) ~= nil, r.text)
      local r2 = streamed(sim(dialect), { rf = { type = "json_object", schema = LIST }, extra = thinking_off })
      assert.is_true((validate(LIST, LIST, assert(json.decode(r2.text)), "")), r2.text)
    end)

    it("thinking: the reasoning first, then the JSON answer", function()
      local extra = dialect == "llama" and {} or { enable_thinking = true }
      local r = streamed(sim(dialect), { rf = rf(PERSON), extra = extra },
        { ["X-MTPLX-Allow-Client-Controls"] = "1" })
      assert.is_true(#r.think > 0)
      local kinds = {}
      for _, ev in ipairs(r.events) do
        local kind = (ev.type == "think" or ev.type == "text") and ev.type
        if kind and kinds[#kinds] ~= kind then kinds[#kinds + 1] = kind end
      end
      assert.same({ "think", "text" }, kinds)
      assert.is_true((validate(PERSON, PERSON, assert(json.decode(r.text)), "")))
    end)

    it("another seed, another answer (still valid); mirza_sim.text wins over the schema", function()
      local a = streamed(sim(dialect), { rf = rf(PERSON), extra = thinking_off }).text
      local b = streamed(sim(dialect, { "--seed", "5" }), { rf = rf(PERSON), extra = thinking_off }).text
      assert.are_not.equal(a, b)
      assert.is_true((validate(PERSON, PERSON, json.decode(b), "")))
      local extra = { mirza_sim = { text = "not json at all" } }
      if thinking_off then extra.chat_template_kwargs = thinking_off.chat_template_kwargs end
      assert.equal("not json at all", streamed(sim(dialect), { rf = rf(PERSON), extra = extra }).text)
    end)

    it("max_tokens cuts the JSON: finish_reason length", function()
      local extra = { max_tokens = 4 }
      if thinking_off then extra.chat_template_kwargs = thinking_off.chat_template_kwargs end
      local r = streamed(sim(dialect), { rf = rf(PERSON), extra = extra })
      assert.equal("length", r.last.finish_reason)
      assert.is_nil(json.decode(r.text))
    end)

    it("odd schemas are answered, never crash the simulator", function()
      local odd = {
        json.object {}, true, false, { ["$ref"] = "#/nowhere" }, { ["$ref"] = "other.json#/x" },
        { type = "object", properties = { next = { ["$ref"] = "#" } }, required = { "next" } }, -- endless
        { type = "array", minItems = 1e12 }, { type = "string", minLength = 1e300 },
        { type = "number", minimum = 1e308, maximum = -1e308 }, { type = "integer", multipleOf = 0.5 },
        { enum = {} }, { type = {} }, { allOf = { false } }, { anyOf = {} },
      }
      for _, schema in ipairs(odd) do
        local c = plain(sim(dialect), { rf = rf(schema), extra = thinking_off })
        -- (a string of a million characters is more tokens than the context holds: length)
        assert.truthy(c.finish_reason == "stop" or c.finish_reason == "length", json.encode(schema))
      end
      local low = body { rf = rf { type = "number", minimum = "LOW" }, extra = thinking_off, stream = false }
      local raw = json.encode(low)
      raw = raw:gsub('"LOW"', "-1e999") -- cJSON reads it as -inf
      local n = json.decode(assert(mirza.request { url = sim(dialect).url, body = raw, timeout = 10 }))
      assert.is_number(json.decode(n.choices[1].message.content))
    end)

    describe("faults", function()
      local function faulty(spec, stream)
        local opts = { rf = rf(PERSON), extra = thinking_off, stream = stream }
        local h = { ["X-Mirza-Sim-Fault"] = spec }
        if stream == false then return plain(sim(dialect), opts, h).message.content end
        local r = streamed(sim(dialect), opts, h)
        assert.equal("stop", r.last.finish_reason) -- a normal finish, whatever the text
        return r.text
      end

      it("schema-break: valid JSON, a required member missing", function()
        for _, stream in ipairs { true, false } do
          local v = assert(json.decode(faulty("schema-break", stream)))
          local ok, at = validate(PERSON, PERSON, v, "")
          assert.same({ false, "/name" }, { ok, at })
        end
        -- nothing required anywhere: a value of the wrong type
        local r = streamed(sim(dialect), { rf = rf { type = "object", properties = { a = { type = "integer" } } },
          extra = thinking_off }, { ["X-Mirza-Sim-Fault"] = "schema-break" })
        assert.equal('"schema-break"', r.text)
      end)

      it("schema-cut: the JSON cut in the middle, then a normal finish", function()
        local whole = streamed(sim(dialect), { rf = rf(PERSON), extra = thinking_off }).text
        for _, stream in ipairs { true, false } do
          local cut = faulty("schema-cut", stream)
          assert.is_nil(json.decode(cut))
          assert.is_true(#cut > 0 and #cut < #whole and whole:sub(1, #cut) == cut, cut)
        end
      end)

      it("schema-ignore: prose, no JSON", function()
        for _, stream in ipairs { true, false } do
          local text = faulty("schema-ignore", stream)
          assert.is_nil(text:find("{", 1, true), text)
          assert.is_true(#text > 20)
        end
      end)
    end)
  end)
end
