-- A batch's input lines as they come (issue 38 item 4), through whole
-- runs against mirza-sim: numeric custom_ids past 2^53 recorded as the
-- digits written (two that one double holds are two items) and found
-- done by a rerun, a number that would be rounded refused and the rest
-- run; files joined by `cat` with a UTF-8 BOM on line 1, line 5 and a
-- BOM-only line read as their JSON. The units: lua/batch_io_spec.
local mirza = require "mirza"
local batch = require "mirza.batch"
local batch_output = require "mirza.batch_output"
local json = mirza.json
local H = require "tests.helper"

local BIG, TWIN = "1234567890123456789", "1234567890123456788" -- one double: 1234567890123456768
local BOM = "\239\187\191"

-- OUTPUT's lines but those recorded under custom_id `id`, written back.
local function drop_record(path, id)
  local keep = {}
  for line in H.read_file(path):gmatch("[^\n]+") do
    if json.decode(line).custom_id ~= id then keep[#keep + 1] = line .. "\n" end
  end
  H.write_file(path, table.concat(keep))
end

describe("batch input lines as they come", function()
  local sim
  setup(function() sim = H.start_sim { "--parallel", "8", "--tok-rate", "0", "--ttft-ms", "0" } end)
  teardown(function() sim.stop() end)
  after_each(function() collectgarbage("collect") end)

  it("records ids past 2^53 as the digits written, two items, and a rerun finds each done", function()
    local input, out = H.tmpname(".jsonl"), H.tmpname(".jsonl")
    finally(function()
      for _, p in ipairs { input, out, batch_output.errors_path(out) } do os.remove(p) end
    end)
    H.write_file(input, table.concat({
      '{"custom_id":' .. BIG .. ',"prompt":"one"}',
      '{"custom_id":' .. TWIN .. ',"prompt":"two"}',
      '{"prompt":"three","custom_id":-' .. BIG .. '}',
      '{"custom_id":42,"prompt":"four"}',
      '{"custom_id":0.30000000000000004,"prompt":"five"}',
    }, "\n") .. "\n")
    local opts = { input = input, output = out, endpoints = { sim.base }, model = "m", quiet = true, progress = false }
    local st = assert(batch.run(opts))
    assert.same({ 5, 0, 5, 1 }, { st.total, st.skipped, st.done_now, st.errors })
    local by, answers, failures = H.batch_records(out)
    assert.same({ 4, 1 }, { answers, failures })
    for _, id in ipairs { BIG, TWIN, "-" .. BIG, "42" } do
      assert.is_table(by[id], id)
      assert.equal(json.null, by[id].error, id)
    end
    -- a string in the record, as OpenAI's custom_id is: every reader gets the digits
    assert.truthy(H.read_file(out):find('"custom_id":"' .. BIG .. '"', 1, true))
    assert.equal("input", by["line-5"].error.code)
    assert.equal("custom_id 0.30000000000000004 would be rounded (to 0.3): write it in quotes",
      by["line-5"].error.message)
    -- a rerun: the four answers are found done (the refused line, in the error file, is sent again)
    st = assert(batch.run(opts))
    assert.same({ 5, 4, 1 }, { st.total, st.skipped, st.done_now })
    -- without BIG's record, BIG alone is sent again: its twin's record does not stand for it
    drop_record(out, BIG)
    st = assert(batch.run(opts))
    assert.same({ 5, 3, 2 }, { st.total, st.skipped, st.done_now })
    by, answers = H.batch_records(out)
    assert.equal(4, answers)
    assert.equal(json.null, by[BIG].error)
    assert.equal(json.null, by[TWIN].error)
  end)

  it("reads files joined by cat: a BOM on line 1, on line 5, alone on a line", function()
    local input, out = H.tmpname(".jsonl"), H.tmpname(".jsonl")
    finally(function()
      for _, p in ipairs { input, out, batch_output.errors_path(out) } do os.remove(p) end
    end)
    local function export(first, n) -- a Windows tool's export: a BOM, CRLF lines
      local t = {}
      for i = first, first + n - 1 do t[#t + 1] = ('{"custom_id":"q%d","prompt":"p%d"}\r\n'):format(i, i) end
      return BOM .. table.concat(t)
    end
    -- lines 1-4, then line 5 starts the second file; an empty export (its BOM alone) at the end
    H.write_file(input, export(1, 4) .. export(5, 2) .. BOM .. "\n")
    local rc = os.execute(("%s %s %s %s --endpoint %s --model m 2>/dev/null"):format(H.q(H.mirza_bin),
      H.q(H.source .. "/scripts/batch.lua"), H.q(input), H.q(out), H.q(sim.base)))
    assert.is_true(rc)
    local by, answers, failures = H.batch_records(out)
    assert.same({ 6, 0 }, { answers, failures })
    for i = 1, 6 do assert.equal(json.null, by["q" .. i].error, "q" .. i) end
  end)
end)
