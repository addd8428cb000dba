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

  describe("guard", function()
    local function list(...)
      local out = {}
      for i, t in ipairs { ... } do out[i] = ev("text", t) end
      out[#out + 1] = { type = "done" }
      return out
    end
    -- A coroutine stage that buffers two events and emits them joined,
    -- raising on the pull of `bad`.
    local function pairs_stage(bad)
      return pipeline.stage(function(up, emit)
        local held = {}
        for e in up do
          if e.text == bad then error("pairs broke on " .. bad) end
          if e.type ~= "text" then
            for _, h in ipairs(held) do emit(h) end
            emit(e)
            held = {}
          else
            held[#held + 1] = e
            if #held == 2 then
              emit(ev("text", held[1].text .. held[2].text))
              held = {}
            end
          end
        end
      end)
    end
    local tag = function(name)
      return pipeline.map(function(e)
        if e.text then return ev("text", e.text .. "/" .. name) end
        return e
      end)
    end

    it("hands the events the broken version pulled and did not pass on to the next, in order", function()
      local errors, ended = {}, {}
      local g = pipeline.guard({ pairs_stage("d"), tag("v1") }, function(i, msg) errors[#errors + 1] = { i, msg } end,
        function(i) ended[#ended + 1] = i end)
      local out = pipeline.collect(pipeline.compose(pipeline.from_list(list("a", "b", "c", "d", "e")), { g }))
      -- "ab" passed on; "c" and "d" were pulled by the broken one: the next version gets them first
      assert.same({ "ab", "c/v1", "d/v1", "e/v1", "done" }, texts(out))
      assert.equal(1, #errors)
      assert.equal(1, errors[1][1])
      assert.matches("pipeline_spec%.lua:%d+: pairs broke on d$", errors[1][2])
      assert.same({ 2 }, ended)
    end)

    it("past the last version the events pass through unchanged; a version that does not build is skipped", function()
      local errors = {}
      local g = pipeline.guard({ function() error("no build") end, function() return 42 end, pairs_stage("b") },
        function(i, msg) errors[#errors + 1] = i .. ":" .. msg:gsub("^.-:%d+: ", "") end)
      local out = pipeline.collect(pipeline.compose(pipeline.from_list(list("a", "b", "c")), { g }))
      assert.same({ "a", "b", "c", "done" }, texts(out))
      assert.same({ "1:no build", "2:the stage returned no iterator", "3:pairs broke on b" }, errors)
    end)

    it("a non-string error is no stage error: it propagates", function()
      local marker = setmetatable({}, { __name = "marker" })
      local g = pipeline.guard({ function(up) return function() up() error(marker) end end, tag("v1") },
        function() error("on_error must not be called") end)
      local it = pipeline.compose(pipeline.from_list(list("a")), { g })
      local ok, err = pcall(it)
      assert.is_false(ok)
      assert.equal(marker, err)
    end)

    it("an interrupt (Ctrl-C) in a stage is no stage error: it propagates, as under stock lua5.4", function()
      for _, msg in ipairs { "interrupted", "interrupted!", "stage.lua:3: interrupted!",
        "interrupted\nstack traceback:\n\t[C]: in ?" } do
        local g = pipeline.guard({ function(up) return function() up() error(msg, 0) end end, tag("v1") },
          function() error("on_error must not be called") end)
        local it = pipeline.compose(pipeline.from_list(list("a")), { g })
        local ok, err = pcall(it)
        assert.is_false(ok)
        assert.equal(msg, err)
      end
      assert.is_false(pipeline.passes("stage.lua:3: not interrupted here"))
      assert.is_false(pipeline.passes("interrupted by the model"))
    end)

    it("an error raised upstream while a stage pulls is not the stage's: it propagates, no version blamed",
      function()
      -- a turn cancelled from another task: its stream raises under the stage's pull
      local function up() error("turn.lua:224: attempt to use a closed stream", 0) end
      for _, v1 in ipairs { function(u) return function() return u() end end,
        pipeline.stage(function(u, emit) for e in u do emit(e) end end) } do
        local g = pipeline.guard({ v1, tag("v2") }, function() error("on_error must not be called") end)
        local it = pipeline.compose(up, { g })
        local ok, err = pcall(it)
        assert.is_false(ok)
        assert.equal("turn.lua:224: attempt to use a closed stream", err)
      end
    end)

    it("closing the pipeline closes the coroutines of the versions it started", function()
      local closed = 0
      local function closing(bad)
        return pipeline.stage(function(up, emit)
          local _ <close> = setmetatable({}, { __close = function() closed = closed + 1 end })
          for e in up do
            if e.text == bad then error("broke") end
            emit(e)
          end
        end)
      end
      local g = pipeline.guard({ closing("b"), closing("none") }, function() end)
      do
        local it, _, _, _ <close> = pipeline.compose(pipeline.from_list(list("a", "b", "c")), { g })
        assert.equal("a", it().text)
        assert.equal("b", it().text) -- the second version took over
        assert.equal(1, closed)      -- the first one's <close> ran when it raised
      end
      assert.equal(2, closed)
    end)

    it("a spec with module and no fn uses that module's stage", function()
      package.loaded.spec_guard_mod = { stage = tag("m") }
      finally(function() package.loaded.spec_guard_mod = nil end)
      local out = pipeline.collect(pipeline.compose(pipeline.from_list(list("a")),
        { { name = "m", module = "spec_guard_mod" } }))
      assert.same({ "a/m", "done" }, texts(out))
    end)
  end)
end)
