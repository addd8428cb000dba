-- mirza.json.stream (src/l_jsonstream.c) and mirza.jsonstage: values handed
-- out as they complete, at every split, the verdict at finish, errors, close;
-- the stage over a recorded stream of text deltas.
local mirza = require "mirza"
local json = mirza.json
local jsonstage = require "mirza.jsonstage"
local pipeline = require "mirza.pipeline"

-- Feed the pieces; the events (path = value as JSON text) and finish's results.
local function run(pieces, depth)
  local p <close> = json.stream { depth = depth }
  local got = {}
  for _, piece in ipairs(pieces) do
    local evs, msg, code, before = p:feed(piece)
    for _, ev in ipairs(evs or before) do
      assert.equal("json", ev.type)
      got[#got + 1] = ev.path .. "=" .. json.encode(ev.value)
    end
    if not evs then return got, nil, msg, code end
  end
  return got, p:finish()
end

-- Every way to cut s in two, and byte by byte.
local function splits(s)
  local out = { { s } }
  for i = 1, #s - 1 do out[#out + 1] = { s:sub(1, i), s:sub(i + 1) } end
  local bytes = {}
  for i = 1, #s do bytes[i] = s:sub(i, i) end
  out[#out + 1] = bytes
  return out
end

local DOC = 'Here you go:\n{"items": [{"id": 1, "name": "caf\\u00e9"}, {"id": 2, "tags": ["a/b", null]}],'
  .. ' "a~b": {"x": true}, "n": -1.5e2} trailing'

describe("mirza.json.stream", function()
  after_each(function() collectgarbage("collect") end)

  it("hands out the values completed at the chosen depth, whatever the pieces", function()
    local want = {
      [0] = { '={"a~b":{"x":true},"items":[{"id":1,"name":"café"},{"id":2,"tags":["a/b",null]}],"n":-150}' },
      [1] = { '/items=[{"id":1,"name":"café"},{"id":2,"tags":["a/b",null]}]', '/a~0b={"x":true}', "/n=-150" },
      [2] = { '/items/0={"id":1,"name":"café"}', '/items/1={"id":2,"tags":["a/b",null]}', "/a~0b/x=true" },
      [3] = { "/items/0/id=1", '/items/0/name="café"', "/items/1/id=2", '/items/1/tags=["a/b",null]' },
      [4] = { '/items/1/tags/0="a/b"', "/items/1/tags/1=null" },
    }
    for depth = 0, 4 do
      for _, pieces in ipairs(splits(DOC)) do
        local got, ok, msg = run(pieces, depth)
        assert.same(want[depth], got, table.concat(pieces, "|"))
        assert.is_true(ok, msg)
      end
    end
  end)

  it("decodes values as json.decode does: null, integers, floats, strings with NUL", function()
    local p <close> = json.stream { depth = 1 }
    local evs = p:feed('[null, 3, 2.5, 1e2, "a\\u0000b", {}, []]')
    assert.equal(7, #evs)
    assert.equal(json.null, evs[1].value)
    assert.equal("integer", math.type(evs[2].value))
    assert.equal(2.5, evs[3].value)
    assert.equal(100, evs[4].value)
    assert.equal("a\0b", evs[5].value)
    assert.same({}, evs[6].value)
    for i, ev in ipairs(evs) do assert.equal("/" .. (i - 1), ev.path) end
    assert.is_true(p:finish())
  end)

  it("appends to a list it is given, and returns it", function()
    local p <close> = json.stream { depth = 1 }
    local list = { "kept" }
    assert.equal(list, p:feed("[1, 2", list))
    assert.equal(2, #list)
    assert.equal(list, p:feed(", 3]", list))
    assert.equal("kept", list[1])
    assert.same({ "/0", "/1", "/2" }, { list[2].path, list[3].path, list[4].path })
    assert.same({ 1, 2, 3 }, { list[2].value, list[3].value, list[4].value })
    assert.error_matches(function() p:feed("x", "not a list") end, "table expected")
  end)

  it("gives an empty list for a piece that completes nothing, and ignores text after the value", function()
    local p <close> = json.stream()
    assert.same({}, p:feed("no JSON yet, "))
    assert.same({}, p:feed('["a", '))
    local evs = p:feed('"b"] and [more]')
    assert.equal(1, #evs)
    assert.equal("", evs[1].path)
    assert.same({ "a", "b" }, evs[1].value)
    assert.same({}, p:feed("{garbage"))
    assert.is_true(p:finish())
  end)

  it("reports a cut text at finish, the values given before standing", function()
    local got, ok, msg, code = run({ '{"a": 1, "b": [2, ', "3" }, 1)
    assert.same({ "/a=1" }, got)
    assert.is_nil(ok)
    assert.equal("JSON cut at byte 19: the text ended inside the value", msg)
    assert.equal("protocol", code)
    local p <close> = json.stream()
    assert.same({}, p:feed("just prose"))
    ok, msg, code = p:finish()
    assert.is_nil(ok)
    assert.equal("no JSON in the text (no { or [)", msg)
    assert.equal("protocol", code)
  end)

  it("refuses invalid JSON with the byte offset, keeping the values completed before it", function()
    local p <close> = json.stream { depth = 1 }
    assert.same({}, p:feed("ok: ["))
    local evs, msg, code, before = p:feed('1, "two", 03]')
    assert.is_nil(evs)
    assert.equal("invalid JSON at byte 17: malformed number", msg)
    assert.equal("protocol", code)
    assert.equal(2, #before)
    assert.equal("two", before[2].value)
    -- sticky: later feeds and finish say the same
    local again, msg2 = p:feed("]")
    assert.is_nil(again)
    assert.equal(msg, msg2)
    local ok, msg3 = p:finish()
    assert.is_nil(ok)
    assert.equal(msg, msg3)
    for _, bad in ipairs { '["\\uD800"]', '["a\1"]', "[1,]", '{"a" 1}', "[tru]" } do
      local q <close> = json.stream()
      local none, m = q:feed(bad)
      assert.is_nil(none, bad)
      assert.matches("^invalid JSON at byte %d+: ", m)
    end
  end)

  it("root = starts at that bracket only; candidates = gives a start that is not JSON up for the next", function()
    local function each_split(text, o, want, want_ok)
      for _, pieces in ipairs(splits(text)) do
        local p <close> = json.stream(o)
        local got = {}
        for _, piece in ipairs(pieces) do
          for _, ev in ipairs(assert(p:feed(piece))) do got[#got + 1] = ev.path .. "=" .. json.encode(ev.value) end
        end
        assert.same(want, got)
        assert.equal(want_ok, (p:finish()))
      end
    end
    local pre = 'See [1] for the list: {"a": 1}'
    each_split(pre, { depth = 1 }, { "/0=1" }, true) -- either bracket: [1] was the answer
    each_split(pre, { depth = 1, root = "object" }, { "/a=1" }, true)
    each_split('Note {x} first: [1, 2]', { depth = 1, root = "array", candidates = 8 }, { "/0=1", "/1=2" }, true)
    each_split('Use {braces} here: {"a": 1}', { depth = 1, root = "object", candidates = 8 }, { "/a=1" }, true)
    each_split('[see below] [[1], 2]', { depth = 1, root = "array", candidates = 8 }, { "/0=[1]", "/1=2" }, true)
    -- one start (the default): the prose start is the error
    local p <close> = json.stream { root = "object" }
    local evs, msg = p:feed('Use {braces} here: {"a": 1}')
    assert.is_nil(evs)
    assert.equal("invalid JSON at byte 6: unexpected byte", msg)
    -- no start is whole: the first one's error, or the cut of the last
    local q <close> = json.stream { root = "object", candidates = 8 }
    assert.same({}, q:feed("{x} and {y} and nothing"))
    assert.same({ nil, "invalid JSON at byte 2: unexpected byte", "protocol" }, { q:finish() })
    local r <close> = json.stream { root = "object", candidates = 8 }
    assert.same({}, r:feed('{x} {"a": [1,'))
    assert.same({ nil, "JSON cut at byte 13: the text ended inside the value", "protocol" }, { r:finish() })
    local none <close> = json.stream { root = "array" }
    assert.same({}, none:feed('{"a": 1}'))
    assert.same({ nil, "no JSON in the text (no [)", "protocol" }, { none:finish() })
    assert.has_error(function() json.stream { root = "list" } end,
      "mirza.json.stream: 'root' must be \"object\" or \"array\" (got list)")
    assert.has_error(function() json.stream { candidates = 0 } end)
  end)

  it("caps one value at max_bytes", function()
    local p <close> = json.stream { depth = 1, max_bytes = 8 }
    assert.equal(1, #p:feed('[1, "abc'))
    local evs, msg = p:feed('defghij"]')
    assert.is_nil(evs)
    assert.equal("invalid JSON at byte 13: value too large", msg)
  end)

  it("is closed by close, <close> and collection; methods on a closed one raise", function()
    local p = json.stream { depth = 2 }
    assert.matches("^mirza.JSONStream %(depth 2, 0 values%)$", tostring(p))
    assert.is_false(p:closed())
    p:close()
    p:close() -- idempotent
    assert.is_true(p:closed())
    assert.equal("mirza.JSONStream (closed)", tostring(p))
    assert.error_matches(function() p:feed("[]") end, "attempt to use a closed JSON stream")
    assert.error_matches(function() p:finish() end, "attempt to use a closed JSON stream")
    local q
    do
      local s <close> = json.stream()
      q = s
    end
    assert.is_true(q:closed())
    for _ = 1, 200 do json.stream():feed('{"a": [1, 2') end -- open ones left to the collector
    collectgarbage("collect")
  end)

  it("raises on wrong arguments", function()
    assert.error_matches(function() json.stream { deepth = 1 } end, "mirza.json.stream: unknown option 'deepth'")
    assert.error_matches(function() json.stream { depth = -1 } end,
      "mirza.json.stream: 'depth' must be an integer from 0 to 1000 %(got %-1%)")
    assert.error_matches(function() json.stream { depth = 1.5 } end, "'depth' must be an integer")
    assert.error_matches(function() json.stream { max_bytes = 0 } end, "'max_bytes' must be a positive integer")
    assert.error_matches(function() json.stream(3) end, "table expected")
    local p <close> = json.stream()
    assert.error_matches(function() p:feed() end, "string expected")
  end)
end)

-- A recorded answer: what a daemon streamed for a JSON-constrained request,
-- as the text deltas of a turn (split inside names, numbers, escapes and
-- literals), a think event and the final event.
local RECORDED = {
  { type = "think", text = "The user wants two records." },
  { type = "text", text = "```json\n{\"rec" },
  { type = "text", text = "ords\": [{\"name\": \"Ada\", \"year\": 18" },
  { type = "text", text = "15}, {\"name\": \"Gr\\u00" },
  { type = "text", text = "e2ce\", \"year\": 1906, \"alive\": fal" },
  { type = "text", text = "se}], \"n\": 2}\n```" },
  { type = "done", finish_reason = "stop", usage = { completion_tokens = 40 } },
}

local function through(events, opts)
  return pipeline.collect(pipeline.compose(pipeline.from_list(events),
    { { name = "json", fn = jsonstage.stage, opts = opts } }))
end

local function copy(evs)
  local out = {}
  for i, ev in ipairs(evs) do
    local c = {}
    for k, v in pairs(ev) do c[k] = v end
    out[i] = c
  end
  return out
end

describe("mirza.jsonstage", function()
  it("passes every event through and adds json events right after the delta that completed them", function()
    local out = through(copy(RECORDED), { depth = 2 })
    local order = {}
    for _, ev in ipairs(out) do order[#order + 1] = ev.type == "json" and ev.path or ev.type end
    assert.same({ "think", "text", "text", "text", "/records/0", "text", "text", "/records/1", "done" }, order)
    assert.same({ name = "Ada", year = 1815 }, out[5].value)
    assert.same({ name = "Grâce", year = 1906, alive = false }, out[8].value)
    assert.is_nil(out[9].json_error)
    assert.equal(40, out[9].usage.completion_tokens)
    local k = 0
    for _, ev in ipairs(out) do -- the stream's own events, unchanged and in order
      if ev.type ~= "json" then
        k = k + 1
        assert.same(RECORDED[k], ev)
      end
    end
    assert.equal(#RECORDED, k)
  end)

  it("at depth 0 (the default) gives the whole value once, at its end", function()
    local out = through(copy(RECORDED))
    assert.equal("json", out[7].type)
    assert.equal("", out[7].path)
    assert.equal(2, out[7].value.n)
    assert.equal("Grâce", out[7].value.records[2].name)
    assert.equal("done", out[8].type)
  end)

  it("sets json_error on the final event of a cut answer, the values given standing", function()
    local evs = copy(RECORDED)
    table.remove(evs, 6)
    table.remove(evs, 5)
    local out, texts = through(evs, { depth = 2 }), {}
    for _, ev in ipairs(evs) do if ev.type == "text" then texts[#texts + 1] = ev.text end end
    assert.equal("/records/0", out[5].path)
    assert.equal("done", out[#out].type)
    assert.equal(("JSON cut at byte %d: the text ended inside the value"):format(#table.concat(texts)),
      out[#out].json_error)
  end)

  it("sets json_error for invalid JSON, keeps the values completed before it and adds no more", function()
    local out = through({
      { type = "text", text = '[{"a": 1},' }, { type = "text", text = ' {"b": 2} {"c": 3}, {"d": 4}]' },
      { type = "error", code = "server", message = "boom" } }, { depth = 1 })
    local paths = {}
    for _, ev in ipairs(out) do if ev.type == "json" then paths[#paths + 1] = ev.path end end
    assert.same({ "/0", "/1" }, paths)
    assert.equal("error", out[#out].type)
    assert.equal("invalid JSON at byte 21: unexpected byte", out[#out].json_error)
    local prose = through({ { type = "text", text = "I cannot answer that." }, { type = "cut" } })
    assert.equal("no JSON in the text (no { or [)", prose[#prose].json_error)
  end)

  it("with root, a bracket in the preamble is prose: the json events are the answer's", function()
    local function paths(evs, opts)
      local out = through(evs, opts)
      local got = {}
      for _, ev in ipairs(out) do
        if ev.type == "json" then got[#got + 1] = ev.path .. "=" .. json.encode(ev.value) end
      end
      return got, out[#out]
    end
    local obj = { { type = "text", text = "See [1] for" }, { type = "text", text = ' the list: {"a": 1, "b": {}}' },
      { type = "done" } }
    local got, final = paths(copy(obj), { depth = 1, root = "object" })
    assert.same({ "/a=1", "/b={}" }, got)
    assert.is_nil(final.json_error)
    local arr = { { type = "text", text = "Use {braces" }, { type = "text", text = '} and {x}: [{"a": 1}, 2]' },
      { type = "done" } }
    got, final = paths(copy(arr), { depth = 1, root = "array" })
    assert.same({ '/0={"a":1}', "/1=2" }, got)
    assert.is_nil(final.json_error)
    -- without a root, a prose { that is not JSON gives way too (8 starts by default)
    got = paths(copy(arr), { depth = 1 })
    assert.same({ '/0={"a":1}', "/1=2" }, got)
  end)

  it("ends quietly when the stream ends without a final event", function()
    local out = through({ { type = "text", text = '{"a": [1' } }, { depth = 1 })
    assert.equal(1, #out)
  end)
end)
