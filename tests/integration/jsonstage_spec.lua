-- mirza.jsonstage over a real stream: mirza-sim streams a JSON answer in
-- small deltas (its per-request text override), the stage hands out each
-- record while the rest of the answer is still to come, and a cut answer
-- ends with json_error on the final event.
local mirza = require "mirza"
local H = require "tests.helper"
local jsonstage = require "mirza.jsonstage"
local pipeline = require "mirza.pipeline"

local function records(n)
  local out = {}
  for i = 1, n do out[i] = ('{"id": %d, "name": "r\\u00e9cord %d", "tags": ["a/%d", null]}'):format(i, i, i) end
  return "Here is the list:\n" .. '{"records": [' .. table.concat(out, ", ") .. '], "count": ' .. n .. "}"
end

local function stream(sim, text, depth)
  local body = H.chat_body("x")
  body.mirza_sim = { text = text }
  local s = mirza.open { url = sim.url, body = body, stall_timeout = 20 }
  local it, _, _, closer = pipeline.compose(s:events(), { { name = "json", fn = jsonstage.stage,
    opts = { depth = depth } } })
  return s, it, closer
end

describe("mirza.jsonstage over mirza-sim", function()
  local sim
  setup(function() sim = H.start_sim { "--tok-rate", "0", "--ttft-ms", "0" } end)
  teardown(function() sim.stop() end)

  it("hands out each record as it completes, before the answer is over", function()
    local _ <close>, it, closer = stream(sim, records(20), 2)
    local _ <close> = closer
    local got, texts_after_first, seen, final = {}, 0, {}, nil
    for ev in it do
      if ev.type == "json" then got[#got + 1] = ev
      elseif ev.type == "text" then
        seen[#seen + 1] = ev.text
        if #got > 0 then texts_after_first = texts_after_first + 1 end
      elseif ev.type == "done" or ev.type == "error" then final = ev end
    end
    assert.equal("done", final.type)
    assert.is_nil(final.json_error)
    assert.equal(records(20), table.concat(seen))
    assert.equal(20, #got) -- /count is at depth 1
    for i = 1, 20 do
      assert.equal("/records/" .. (i - 1), got[i].path)
      assert.same({ id = i, name = "récord " .. i, tags = { "a/" .. i, mirza.json.null } }, got[i].value)
    end
    assert.is_true(texts_after_first > 20, "the first record came with the rest still streaming")
  end)

  it("ends a cut answer with the records completed so far and json_error on done", function()
    local text = records(5)
    text = text:sub(1, text:find('{"id": 4', 1, true) + 3)
    local _ <close>, it, closer = stream(sim, text, 2)
    local _ <close> = closer
    local got, final = {}, nil
    for ev in it do
      if ev.type == "json" then got[#got + 1] = ev.path end
      if ev.type == "done" or ev.type == "error" then final = ev end
    end
    assert.same({ "/records/0", "/records/1", "/records/2" }, got)
    assert.equal("done", final.type)
    assert.equal(("JSON cut at byte %d: the text ended inside the value"):format(#text), final.json_error)
  end)
end)
