-- A batch's input and output as their own units, without a server
-- (issue 31 items 2 and 9): lines read as a stream (ids, duplicates, the
-- count in an id set; the bodies only of the lines still to do), a BOM,
-- JSON lines that are not objects; OUTPUT read back a line at a time, a
-- torn last line, the error file beside it.
local core = require "mirza.core"
local input = require "mirza.batch_input"
local output = require "mirza.batch_output"
local H = require "tests.helper"

local BOM = "\239\187\191"

local function file_of(text)
  local path = H.tmpname(".jsonl")
  H.write_file(path, text)
  return path
end

describe("batch input", function()
  it("reads a line's custom_id without decoding it, as parse_line does", function()
    local cases = {
      { '{"custom_id":"a","prompt":"p"}', 1, "a" },
      { '{"custom_id": "b", "prompt":"p"}\r', 2, "b" },
      { '{"prompt":"p","custom_id":"c"}', 3, "c" }, -- not the first key
      { '{"prompt":"p","custom_id":42}', 4, "42" }, -- a number: its string
      { BOM .. '{"custom_id":"d","prompt":"p"}', 1, "d" }, -- a BOM on line 1
      { "a plain prompt", 6, "line-6" },
      { "[1,2]", 7, "line-7" },
      { '{"custom_id":true,"prompt":"p"}', 8, "line-8" },
      { "{broken", 9, "line-9" },
    }
    for _, c in ipairs(cases) do
      assert.equal(c[3], input.line_id(c[1], c[2]), c[1])
      local item, _, rid = input.parse_line(c[1], c[2])
      assert.equal(c[3], item and item.custom_id or rid or ("line-" .. c[2]), c[1])
    end
    assert.is_false(input.line_id("  \r", 3))
    assert.is_false(input.parse_line(BOM, 1))
  end)

  it("skips a BOM on line 1 and refuses a JSON line that is not an object, naming it", function()
    local it = assert(input.parse_line(BOM .. '{"custom_id":"x","prompt":"hi"}', 1))
    assert.equal("x", it.custom_id)
    assert.equal("hi", it.body.messages[1].content)
    for n, c in ipairs { { "[1,2]", "an array" }, { '"text"', "a string" }, { "null", "null" },
      { "42", "a number" }, { " true ", "a boolean" } } do
      local item, msg = input.parse_line(c[1], n + 1)
      assert.is_nil(item)
      assert.truthy(msg:find(("line %d is JSON but %s, not an object"):format(n + 1, c[2]), 1, true), msg)
    end
    -- text that only starts like JSON is a prompt
    assert.equal('"Hello," she said.', input.parse_line('"Hello," she said.', 9).body.messages[1].content)
  end)

  it("scans ids into a set: the count, those already done, a duplicate named with both lines", function()
    local path = file_of('{"custom_id":"a","prompt":"1"}\n\n{"custom_id":"b","prompt":"2"}\nplain\n')
    local set <close> = core.idset()
    set:put("b", input.DONE) -- in OUTPUT already
    local n, done = input.scan(path, set)
    assert.equal(3, n)
    assert.equal(1, done)
    assert.equal(1, set:get("a"))
    assert.equal(input.DONE | 3, set:get("b"))
    assert.equal(4, set:get("line-4"))
    H.write_file(path, '{"custom_id":"a","prompt":"1"}\n{"custom_id":"b","prompt":"2"}\n'
      .. '{"custom_id":"a","prompt":"3"}\n')
    local set2 <close> = core.idset()
    local ok, msg, code = input.scan(path, set2)
    assert.is_nil(ok)
    assert.equal("input", code)
    assert.truthy(msg:find(':3: duplicate custom_id "a" (first on line 1)', 1, true), msg)
    H.write_file(path, "\n  \n")
    ok, msg, code = input.scan(path, set2)
    assert.is_nil(ok)
    assert.equal("input", code)
    assert.truthy(msg:find("holds no prompt", 1, true), msg)
    os.remove(path)
  end)

  it("gives the items still to do, parsed only as they are asked for", function()
    local path = file_of('{"custom_id":"a","prompt":"1"}\n{"custom_id":"b","prompt":"2"}\n[1]\n'
      .. '{"custom_id":"c","messages":[{"role":"user","content":"3"}]}\n')
    local set <close> = core.idset()
    set:put("b", input.DONE)
    assert(input.scan(path, set))
    local src = assert(input.source({ input = path }, set, input.compiler()))
    local got = {}
    for it in src.next do got[#got + 1] = it end
    assert.equal(3, #got)
    assert.equal("a", got[1].custom_id)
    assert.equal("1", got[1].body.messages[1].content) -- parsed when asked for
    assert.equal("chat", got[1].kind)
    assert.equal("line-3", got[2].custom_id)
    assert.truthy(got[2].invalid:find("not an object", 1, true))
    assert.equal("c", got[3].custom_id)
    os.remove(path)
  end)

  it("keeps the ids of a large input in C, not its lines in Lua", function()
    local path = H.tmpname(".jsonl")
    local f = assert(io.open(path, "wb"))
    local body = ('{"model":"m","messages":[{"role":"user","content":"%s"}]}'):format(("x"):rep(200))
    for i = 1, 100000 do f:write(('{"custom_id":"item-%06d","body":%s}\n'):format(i, body)) end
    f:close()
    local set <close> = core.idset()
    collectgarbage()
    local before = collectgarbage("count")
    assert.equal(100000, (input.scan(path, set)))
    collectgarbage()
    -- 24 MB of lines; what stays in Lua after the scan is next to nothing
    local grown = collectgarbage("count") - before
    assert.is_true(grown < 512, ("%.0f KB kept in Lua"):format(grown))
    assert.equal(100000, #set)
    os.remove(path)
  end)
end)

-- Numeric custom_ids past 2^53 and BOMs on any line (issue 38 item 4).
describe("batch input ids as written", function()
  local json = require("mirza").json
  local BIG, TWIN = "1234567890123456789", "1234567890123456788" -- one double: 1234567890123456768

  -- The id a line is scanned under and the one parse_line gives it (or
  -- its rejection's message).
  local function ids(line, n)
    local item, msg, rid = input.parse_line(line, n or 3)
    return input.line_id(line, n or 3), item and item.custom_id or rid, msg
  end

  it("peeks a number past 2^53 with its text as written, the member asked for", function()
    local kind, v, text = json.peek('{"custom_id":' .. BIG .. ',"p":1}', "custom_id")
    assert.equal("object", kind)
    assert.equal("float", math.type(v))
    assert.equal(BIG, text)
    -- not another member's, nor a nested one of the same name
    assert.equal(TWIN, select(3, json.peek('{"n":' .. BIG .. ',"b":{"custom_id":1},"custom_id":' .. TWIN .. '}',
      "custom_id")))
    assert.equal("-9007199254740993", select(3, json.peek('{"a/b~":-9007199254740993}', "a/b~")))
    assert.equal(3, select("#", json.peek('{"id":9007199254740992}', "id"))) -- 2^53 itself: may be rounded
    assert.equal(2, select("#", json.peek('{"id":9007199254740991}', "id"))) -- below: exact, an integer
    assert.equal(9007199254740991, select(2, json.peek('{"id":9007199254740991}', "id")))
    assert.equal(2, select("#", json.peek('{"id":01234567890123456789}', "id"))) -- only cJSON takes it: no text
  end)

  it("keeps an integer past 2^53 as its digits: two that one double holds stay two", function()
    for _, c in ipairs {
      { BIG, BIG }, { TWIN, TWIN }, { "-" .. BIG, "-" .. BIG },
      { "9007199254740993", "9007199254740993" }, -- 2^53 + 1: decodes as 2^53
      { "9007199254740992", "9007199254740992" },
      { "123456789012345678901234567890", "123456789012345678901234567890" }, -- past 2^64 too
      -- within 2^53, as before
      { "42", "42" }, { "42.0", "42" }, { "-7", "-7" }, { "1.5", "1.5" }, { "1e20", "1e+20" },
    } do
      local line = '{"custom_id":' .. c[1] .. ',"prompt":"p"}'
      local scanned, parsed, msg = ids(line)
      assert.equal(c[2], scanned, line)
      assert.equal(c[2], parsed, line)
      assert.is_nil(msg, line)
      scanned, parsed = ids('{"prompt":"p", "custom_id" : ' .. c[1] .. ' }') -- not first, spaced
      assert.equal(c[2], scanned, line)
      assert.equal(c[2], parsed, line)
    end
  end)

  it("refuses a number it would round, saying to write it in quotes, never rounding it", function()
    for _, c in ipairs { { "12345678901234567890.0", "1.2345678901235e+19" }, { "0.30000000000000004", "0.3" },
      { "1.2345678901234567e18", "1.2345678901235e+18" } } do
      local line = '{"custom_id":' .. c[1] .. ',"prompt":"p"}'
      local scanned, parsed, msg = ids(line, 4)
      assert.equal("line-4", scanned, line)
      assert.is_nil(parsed, line)
      assert.equal(("custom_id %s would be rounded (to %s): write it in quotes"):format(c[1], c[2]), msg)
    end
  end)

  it("scans ids that differ past 2^53 as two items, and finds them done as OUTPUT records them", function()
    local path = file_of('{"custom_id":' .. BIG .. ',"prompt":"1"}\n{"custom_id":' .. TWIN .. ',"prompt":"2"}\n'
      .. '{"custom_id":"' .. BIG .. '","prompt":"3"}\n')
    local set <close> = core.idset()
    local ok, msg = input.scan(path, set)
    assert.is_nil(ok) -- the quoted id is the same id: a duplicate, named as written
    assert.truthy(msg:find((':3: duplicate custom_id "%s" (first on line 1)'):format(BIG), 1, true), msg)
    H.write_file(path, '{"custom_id":' .. BIG .. ',"prompt":"1"}\n{"custom_id":' .. TWIN .. ',"prompt":"2"}\n')
    local set2 <close> = core.idset()
    set2:put(output.record_id(output.encode_record(output.record({ custom_id = BIG, line = 1 },
      { ok = true, text = "t", think = "" }), {})), input.DONE) -- OUTPUT's record of the first
    local n, done = input.scan(path, set2)
    assert.equal(2, n)
    assert.equal(1, done)
    local src = assert(input.source({ input = path }, set2, input.compiler()))
    local it = assert(src.next())
    assert.equal(TWIN, it.custom_id)
    assert.equal("2", it.body.messages[1].content)
    assert.is_nil(src.next())
    os.remove(path)
  end)

  it("takes a script's numeric ids exactly too, and refuses one it would round", function()
    local items = { { custom_id = math.maxinteger }, { custom_id = math.maxinteger - 1 }, { custom_id = 1.5 } }
    local set <close> = core.idset()
    assert.equal(3, (input.scan_items(items, set)))
    assert.same({ "9223372036854775807", "9223372036854775806", "1.5" },
      { items[1].custom_id, items[2].custom_id, items[3].custom_id })
    local ok, err = pcall(input.scan_items, { { custom_id = "a" }, { custom_id = 0.1 + 0.2 } }, core.idset())
    assert.is_false(ok)
    assert.truthy(err:find("items[2]: custom_id 0.30000000000000004 would be rounded (to 0.3): write it in quotes", 1,
      true), err)
  end)

  it("skips a BOM at the start of any line, a BOM-only line as blank; one inside a string stays", function()
    local lines = {
      BOM .. '{"custom_id":"a","prompt":"1"}', -- line 1: a Windows export
      '{"custom_id":"b","prompt":"' .. BOM .. 'x"}', -- inside a value: kept
      BOM, -- a BOM-only line (an empty export): blank
      BOM .. "\r",
      BOM .. '{"prompt":"5","custom_id":' .. BIG .. '}\r', -- line 5: a second file joined by cat
      BOM .. "plain prompt",
    }
    local path = file_of(table.concat(lines, "\n") .. "\n")
    local set <close> = core.idset()
    assert.equal(4, (input.scan(path, set)))
    local src = assert(input.source({ input = path }, set, input.compiler()))
    local got = {}
    for it in src.next do got[#got + 1] = it end
    assert.equal(4, #got)
    assert.same({ "a", "b", BIG, "line-6" }, { got[1].custom_id, got[2].custom_id, got[3].custom_id,
      got[4].custom_id })
    for _, it in ipairs(got) do assert.is_nil(it.invalid, it.invalid) end
    assert.equal("1", got[1].body.messages[1].content)
    assert.equal(BOM .. "x", got[2].body.messages[1].content)
    assert.equal("5", got[3].body.messages[1].content)
    assert.equal("plain prompt", got[4].body.messages[1].content)
    os.remove(path)
  end)
end)

describe("batch output", function()
  local rec = output.encode_record(output.record({ custom_id = "a", line = 1 }, { ok = true, text = "t", think = "" }),
    {})

  it("reads a record's custom_id without decoding ours, and any other record by decoding it", function()
    assert.equal("a", output.record_id(rec))
    assert.equal("a", output.record_id(rec .. "\n"))
    -- OpenAI's order of keys
    assert.equal("z", output.record_id('{"id":"b","custom_id":"z","response":null,"error":{"code":"x"}}'))
    assert.is_nil(output.record_id('{"custom_id":"p","prompt":"not a record"}'))
    assert.is_nil(output.record_id("plain"))
  end)

  it("cuts a torn last line, gives a whole one its newline, and refuses a file of prompts untouched", function()
    local path = file_of(rec .. "\n" .. rec:sub(1, 20))
    local ids = {}
    local n, newline = output.scan(path, function(id) ids[#ids + 1] = id end)
    assert.equal(1, n)
    assert.is_false(newline)
    assert.equal(rec .. "\n", H.read_file(path))
    H.write_file(path, rec .. "\n" .. rec)
    n, newline = output.scan(path, function() end)
    assert.equal(2, n)
    assert.is_true(newline)
    local prompts = '{"custom_id":"a","prompt":"p"}\n'
    H.write_file(path, prompts)
    local ok, msg, code = output.scan(path, function() end)
    assert.is_nil(ok)
    assert.equal("output", code)
    assert.truthy(msg:find(":1 is not a batch output record", 1, true), msg)
    assert.equal(prompts, H.read_file(path))
    os.remove(path)
  end)

  it("puts the error file beside OUTPUT, reads its count, and starts it anew", function()
    assert.equal("out.errors.jsonl", output.errors_path("out.jsonl"))
    assert.equal("/d/x.errors.jsonl", output.errors_path("/d/x"))
    assert.is_nil(output.errors_path("-"))
    local out = H.tmpname(".jsonl")
    local errs = output.errors_path(out)
    H.write_file(out, rec .. "\n")
    H.write_file(errs, rec:gsub('"a"', '"e1"', 1) .. "\n" .. rec:gsub('"a"', '"e2"', 1) .. "\n")
    local done = {}
    local sink = assert(output.open({ output = out }, function(id) done[#done + 1] = id end, function() end))
    assert.same({ "a" }, done)
    assert.equal(2, sink.redo)
    assert.equal(errs, sink.errors_name)
    -- its items are done again: their records start anew, in a file made
    -- at the first failure
    assert.is_nil(io.open(errs))
    local f = assert(output.errors_file(sink))
    assert.equal(f, output.errors_file(sink))
    f:write("x\n")
    output.close(sink)
    assert.equal("x\n", H.read_file(errs))
    -- refused before anything is touched: OUTPUT as the error file
    local ok, msg = output.open({ output = out, errors = out }, function() end, function() end)
    assert.is_nil(ok)
    assert.truthy(msg:find("same file", 1, true))
    os.remove(out)
    os.remove(errs)
  end)
end)
