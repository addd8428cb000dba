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
