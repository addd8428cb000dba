-- mirza.pipeline: composition, coroutine stages, insertion/replacement by name.
local pipeline = require "mirza.pipeline"

local function ev(t, text) return { type = t, text = text } end

local function texts(list)
  local out = {}
  for _, e in ipairs(list) do out[#out + 1] = e.text or e.type end
  return out
end

-- A stage that upper-cases text events.
local upper = pipeline.map(function(e)
  if e.text then return { type = e.type, text = e.text:upper() } end
  return e
end)

-- A coroutine stage that appends opts.suffix to every text and emits a
-- marker before the terminal event.
local suffix = pipeline.stage(function(up, emit, opts)
  for e in up do
    if e.type == "done" then emit(ev("mark", "<" .. opts.suffix .. ">")) end
    if e.text then e = ev(e.type, e.text .. opts.suffix) end
    emit(e)
  end
end)

describe("mirza.pipeline", function()
  after_each(function() collectgarbage("collect") end)

  it("from_list/collect round-trip a list and end with nil for good", function()
    local src = pipeline.from_list({ ev("text", "a"), ev("text", "b") })
    assert.same({ "a", "b" }, texts(pipeline.collect(src)))
    assert.is_nil(src())
  end)

  it("compose with no stages returns the source's events", function()
    local list = { ev("think", "x"), ev("text", "y"), { type = "done" } }
    assert.same(list, pipeline.collect(pipeline.compose(pipeline.from_list(list), {})))
  end)

  it("applies stages in order, first stage first", function()
    local src = pipeline.from_list({ ev("text", "ab"), { type = "done" } })
    local stages = {
      { name = "upper", fn = upper },
      { name = "suffix", fn = suffix, opts = { suffix = "!" } },
    }
    assert.same({ "AB!", "<!>", "done" }, texts(pipeline.collect(pipeline.compose(src, stages))))
    -- reversed order: the suffix is upper-cased too
    src = pipeline.from_list({ ev("text", "ab"), { type = "done" } })
    stages = {
      { name = "suffix", fn = suffix, opts = { suffix = "x" } },
      { name = "upper", fn = upper },
    }
    assert.same({ "ABX", "<X>", "done" }, texts(pipeline.collect(pipeline.compose(src, stages))))
  end)

  it("accepts bare stage functions and skips disabled specs", function()
    local src = pipeline.from_list({ ev("text", "q") })
    local out = pipeline.collect(pipeline.compose(src, {
      upper, { name = "off", fn = suffix, opts = { suffix = "?" }, enabled = false },
    }))
    assert.same({ "Q" }, texts(out))
  end)

  it("a coroutine stage can drop, add and stop early", function()
    local first_two = pipeline.stage(function(up, emit)
      local n = 0
      for e in up do
        if e.type == "text" then
          n = n + 1
          emit(e)
          emit(ev("echo", e.text))
          if n == 2 then return end
        end
      end
    end)
    local pulled = 0
    local src = function()
      pulled = pulled + 1
      return ev("text", tostring(pulled))
    end
    local iter = pipeline.compose(src, { first_two })
    assert.same({ "1", "1", "2", "2" }, texts(pipeline.collect(iter)))
    assert.equal(2, pulled)           -- the infinite source was not drained
    assert.is_nil(iter())             -- and the iterator stays finished
  end)

  it("is lazy: one pull upstream per event downstream", function()
    local pulled = 0
    local list = { ev("text", "a"), ev("text", "b"), ev("text", "c") }
    local src = function()
      pulled = pulled + 1
      return list[pulled]
    end
    local iter = pipeline.compose(src, { { name = "s", fn = suffix, opts = { suffix = "" } }, upper })
    assert.equal("A", iter().text)
    assert.equal(1, pulled)
    assert.equal("B", iter().text)
    assert.equal(2, pulled)
  end)

  it("propagates errors raised inside a stage", function()
    local boom = pipeline.stage(function(up)
      up()
      error("stage exploded")
    end)
    local iter = pipeline.compose(pipeline.from_list({ ev("text", "a") }), { boom })
    assert.has_error(function() iter() end, "stage exploded")
    assert.is_nil(iter()) -- a stage that raised is over, not "cannot resume dead coroutine"
  end)

  it("passes foreign yields through to an outer scheduler", function()
    -- the source yields to a scheduler (as a loop would while waiting on I/O)
    local src = function()
      local v = coroutine.yield("wait")
      if v == "stop" then return nil end
      return ev("text", v)
    end
    local iter = pipeline.compose(src, { { name = "s", fn = suffix, opts = { suffix = "." } } })
    local got = {}
    local task = coroutine.create(function()
      for e in iter do got[#got + 1] = e.text end
      return "finished"
    end)
    local inputs = { "a", "b", "stop" }
    local ok, what = coroutine.resume(task)
    for _, v in ipairs(inputs) do
      assert.is_true(ok)
      assert.equal("wait", what)
      ok, what = coroutine.resume(task, v)
    end
    assert.is_true(ok)
    assert.equal("finished", what)
    assert.same({ "a.", "b." }, got)
  end)

  it("closes suspended stages when a for loop breaks", function()
    local closed = false
    local guarded = pipeline.stage(function(up, emit)
      local _ <close> = setmetatable({}, { __close = function() closed = true end })
      for e in up do emit(e) end
    end)
    local src = pipeline.from_list({ ev("text", "a"), ev("text", "b") })
    local seen = {}
    for e in pipeline.compose(src, { guarded }) do
      seen[#seen + 1] = e.text
      if #seen == 1 then break end
    end
    assert.same({ "a" }, seen)
    assert.is_true(closed)
  end)

  describe("stage lists", function()
    local function names(stages)
      local out = {}
      for _, s in ipairs(stages) do out[#out + 1] = s.name end
      return out
    end
    local function base()
      return { { name = "a", fn = upper }, { name = "b", fn = upper }, { name = "c", fn = upper } }
    end

    it("find returns index and spec", function()
      local st = base()
      local i, s = pipeline.find(st, "b")
      assert.equal(2, i)
      assert.equal(st[2], s)
      assert.is_nil(pipeline.find(st, "zz"))
    end)

    it("insert before, after, and at the end", function()
      local st = base()
      pipeline.insert(st, { name = "x", fn = upper }, { before = "a" })
      pipeline.insert(st, { name = "y", fn = upper }, { after = "b" })
      pipeline.insert(st, { name = "z", fn = upper })
      assert.same({ "x", "a", "b", "y", "c", "z" }, names(st))
    end)

    it("insert refuses unknown anchors and duplicate names", function()
      local st = base()
      assert.has_error(function() pipeline.insert(st, { name = "x", fn = upper }, { before = "nope" }) end,
        'pipeline: no stage named "nope"')
      assert.has_error(function() pipeline.insert(st, { name = "a", fn = upper }) end,
        'pipeline.insert: a stage named "a" exists (use replace)')
      assert.has_error(function() pipeline.insert(st, { fn = upper }) end, "pipeline.insert: spec needs a name")
      assert.same({ "a", "b", "c" }, names(st))
    end)

    it("replace by spec or by function keeping name and opts", function()
      local st = base()
      st[2].opts = { suffix = "!" }
      pipeline.replace(st, "b", suffix)
      assert.equal(suffix, st[2].fn)
      assert.same({ suffix = "!" }, st[2].opts)
      pipeline.replace(st, "c", { name = "c2", fn = upper })
      assert.same({ "a", "b", "c2" }, names(st))
      assert.has_error(function() pipeline.replace(st, "nope", upper) end, 'pipeline: no stage named "nope"')
    end)

    it("remove and copy", function()
      local st = base()
      local cp = pipeline.copy(st)
      assert.equal("b", pipeline.remove(st, "b").name)
      assert.is_nil(pipeline.remove(st, "b"))
      assert.same({ "a", "c" }, names(st))
      assert.same({ "a", "b", "c" }, names(cp))
      cp[1].opts = { changed = true }
      assert.is_nil(st[1].opts)
    end)

    it("a script's inserted stage runs in the composed pipeline", function()
      local st = { { name = "upper", fn = upper } }
      local censor = pipeline.map(function(e)
        if e.text == "SECRET" then return nil end
        return e
      end)
      pipeline.insert(st, { name = "censor", fn = censor }, { after = "upper" })
      local src = pipeline.from_list({ ev("text", "secret"), ev("text", "ok") })
      assert.same({ "OK" }, texts(pipeline.collect(pipeline.compose(src, st))))
    end)
  end)

  it("tap sees every event without changing it", function()
    local seen = {}
    local t = pipeline.tap(function(e) seen[#seen + 1] = e.type end)
    local list = { ev("think", "a"), ev("text", "b"), { type = "done" } }
    assert.same(list, pipeline.collect(pipeline.compose(pipeline.from_list(list), { t })))
    assert.same({ "think", "text", "done" }, seen)
  end)
end)
