-- mirza.thinktags: <think>…</think> inside content split into think events,
-- fed whole, at every split offset, and byte by byte.
local thinktags = require "mirza.thinktags"
local pipeline = require "mirza.pipeline"

-- Events for a list of text chunks (then a done event) through the stage.
local function run(chunks, opts)
  local evs = {}
  for i, c in ipairs(chunks) do evs[i] = { type = "text", text = c } end
  evs[#evs + 1] = { type = "done", finish_reason = "stop" }
  return pipeline.collect(thinktags.stage(pipeline.from_list(evs), opts))
end

-- {think = "...", text = "...", order = "think text done"} of an event list.
local function join(evs)
  local think, text, order = {}, {}, {}
  for _, ev in ipairs(evs) do
    if ev.type == "think" then think[#think + 1] = ev.text end
    if ev.type == "text" then text[#text + 1] = ev.text end
    if order[#order] ~= ev.type then order[#order + 1] = ev.type end
  end
  return { think = table.concat(think), text = table.concat(text), order = table.concat(order, " ") }
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

local function check_all(s, opts, want)
  for _, chunks in ipairs(splits(s)) do
    local got = join(run(chunks, opts))
    assert.same(want, got, table.concat(chunks, "|"))
  end
end

describe("mirza.thinktags", function()
  after_each(function() collectgarbage("collect") end)

  it("splits <think>…</think> in content across any chunk boundary", function()
    check_all("<think>Let me see.</think>\n\nBonjour !", { mode = true },
      { think = "Let me see.", text = "Bonjour !", order = "think text done" })
    check_all("<think>Let me see.</think>\n\nBonjour !", nil,
      { think = "Let me see.", text = "Bonjour !", order = "think text done" })
  end)

  it("starts inside an open think in 'open' mode", function()
    check_all("The user greets.</think>Salut.", { mode = "open" },
      { think = "The user greets.", text = "Salut.", order = "think text done" })
  end)

  it("auto on a thinking turn: text before a first </think> was reasoning", function()
    check_all("Hmm, a greeting.</think>\nHello there.", { mode = "auto", hold = true },
      { think = "Hmm, a greeting.", text = "Hello there.", order = "think text done" })
    check_all("\n<think>plan</think>Answer.", { mode = "auto", hold = true },
      { think = "plan", text = "\nAnswer.", order = "text think text done" })
  end)

  it("auto on a thinking turn without any tag delivers the answer at the end", function()
    check_all("Just an answer.", { mode = "auto", hold = true },
      { think = "", text = "Just an answer.", order = "text done" })
  end)

  it("ends the hold when the server sends reasoning itself", function()
    local it = thinktags.stage(pipeline.from_list {
      { type = "think", text = "r1" }, { type = "text", text = "answer" }, { type = "done" },
    }, { mode = "auto", hold = true })
    local a, b, c = it(), it(), it()
    assert.same({ "think", "r1" }, { a.type, a.text })
    assert.same({ "text", "answer" }, { b.type, b.text })
    assert.equal("done", c.type)
    assert.is_nil(it())
  end)

  it("leaves text that only looks like a tag alone, even cut at the end", function()
    check_all("a < b, <thinking aloud> and <th", { mode = true },
      { think = "", text = "a < b, <thinking aloud> and <th", order = "text done" })
  end)

  it("drops a stray </think> when not holding (its text is already out)", function()
    check_all("abc</think> def", { mode = true }, { think = "", text = "abcdef", order = "text done" })
  end)

  it("keeps an unterminated think as reasoning (a turn cut while thinking)", function()
    check_all("<think>still going", { mode = true }, { think = "still going", text = "", order = "think done" })
  end)

  it("passes plain deltas through as the same tables (no churn)", function()
    local evs = { { type = "text", text = "hello" }, { type = "progress" }, { type = "text", text = " world" } }
    local out = pipeline.collect(thinktags.stage(pipeline.from_list(evs), { mode = "auto" }))
    assert.equal(3, #out)
    for i = 1, 3 do assert.equal(evs[i], out[i]) end
    local inside = { type = "text", text = "deep thought" }
    local it = thinktags.stage(pipeline.from_list { inside }, { mode = "open" })
    local ev = it()
    assert.equal(inside, ev)
    assert.equal("think", ev.type)
  end)

  it("flushes held text before a terminal error, in order", function()
    local out = pipeline.collect(thinktags.stage(pipeline.from_list {
      { type = "text", text = "partial <thi" }, { type = "error", code = "closed", message = "cut" },
    }, { mode = true }))
    assert.equal(3, #out)
    assert.same({ "text", "partial " }, { out[1].type, out[1].text })
    assert.same({ "text", "<thi" }, { out[2].type, out[2].text })
    assert.equal("error", out[3].type)
  end)

  it("is off with mode false and rejects unknown modes", function()
    local up = pipeline.from_list {}
    assert.equal(up, thinktags.stage(up, { mode = false }))
    assert.has_error(function() thinktags.stage(up, { mode = "yes" }) end,
      'thinktags: unknown mode "yes" (true, false, "auto", "open")')
  end)

  it("splits a whole string", function()
    assert.same({ { type = "think", text = "a" }, { type = "text", text = "b" } }, thinktags.split("<think>a</think>b"))
  end)
end)
