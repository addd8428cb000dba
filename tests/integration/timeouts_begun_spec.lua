-- Each clock once the response has begun (issue 19; timeouts_spec has the
-- messages of clocks that fire before anything came): the stall timeout
-- after some tokens and the deadline in the middle of the stream each give
-- their own message and code "timeout", and the text already received is
-- kept, in mirza.collect's partial result and (the stall timeout: an
-- engine has no deadline option) in an engine turn's result; the head's
-- clock stops with the head (a long pause in the body is no header
-- timeout). The simulator holds the rest of the stream back
-- (stall-after) for far longer than any clock here, so nothing races.
local mirza = require "mirza"
local engine = require "mirza.engine"
local H = require "tests.helper"

local TEXT = "Un deux trois quatre cinq six sept huit neuf dix onze douze."
local STALL = "(stall timeout: raise the `stall_timeout` option, or false for none)"
local DEADLINE = "(deadline: the whole request took longer than the `deadline` option; raise it, or false for none)"

describe("a clock that fires once the response has begun", function()
  local sim
  setup(function() sim = H.start_sim { "--tok-rate", "0", "--ttft-ms", "0" } end)
  teardown(function() sim.stop() end)
  after_each(function() collectgarbage("collect") end)

  local function body(fault)
    return H.chat_body("t", { mirza_sim = { fault = fault, text = TEXT, reasoning_tokens = 0 } })
  end

  -- The text of the first `n` text events of the whole answer (the prefix
  -- a stream cut after them has).
  local function prefix_events(fault)
    local s <close> = mirza.open { url = sim.url, body = body(fault), stall_timeout = 0.3, deadline = 20 }
    local r = H.drain(s, 30)
    return r.text, r.last
  end

  it("the stall timeout after some tokens: its message, code timeout, the text so far kept", function()
    local full = assert(mirza.collect { url = sim.url, body = body(nil) })
    assert.equal(TEXT, full.text)
    local res, msg, code, partial = mirza.collect { url = sim.url, body = body("stall-after=4"), stall_timeout = 0.3 }
    assert.is_nil(res)
    assert.equal("timeout", code)
    assert.truthy(msg:find(STALL, 1, true), msg)
    assert.is_nil(msg:find("deadline", 1, true), msg)
    assert.truthy(#partial.text > 0 and #partial.text < #TEXT, partial.text)
    assert.equal(TEXT:sub(1, #partial.text), partial.text)
    -- the same prefix as the events a reader saw before the error
    local seen, last = prefix_events("stall-after=4")
    assert.equal(seen, partial.text)
    assert.same({ "error", "timeout" }, { last.type, last.code })
  end)

  it("the deadline in the middle of the stream: its message, code timeout, the text so far kept", function()
    local res, msg, code, partial = mirza.collect { url = sim.url, body = body("stall-after=4"), deadline = 0.5,
      stall_timeout = false }
    assert.is_nil(res)
    assert.equal("timeout", code)
    assert.truthy(msg:find(DEADLINE, 1, true), msg)
    assert.is_nil(msg:find("stall", 1, true), msg)
    assert.truthy(#partial.text > 0 and #partial.text < #TEXT, partial.text)
    assert.equal(TEXT:sub(1, #partial.text), partial.text)
  end)

  it("the head's clock stops with the head: a pause in the body is no header timeout", function()
    -- 1 s for the head (it comes at once); then 2 s of silence after four tokens
    local res, msg = mirza.collect { url = sim.url, body = body("stall-after=4:2000"), header_timeout = 1,
      stall_timeout = 20 }
    assert.truthy(res, msg)
    assert.equal(TEXT, res.text)
  end)

  describe("in an engine turn", function()
    local function turn(fault, opts)
      local cfg = { base_url = sim.base .. "/v1", model = "mirza-sim", daemon = false, config_file = false,
        log = function() end }
      for k, v in pairs(opts) do cfg[k] = v end
      local e = engine.new(cfg)
      local heard = {}
      local st, msg, code, result = e:say("t", { answer = function(t) heard[#heard + 1] = t end, mode = "token",
        error = function() end, body_extra = { mirza_sim = { fault = fault, text = TEXT, reasoning_tokens = 0 } } })
      local last = e.last
      e:close()
      return st, msg, code, result, table.concat(heard), last
    end

    it("the stall timeout: nil, its message, code timeout, and the answer so far in the result", function()
      local st, msg, code, result, heard, last = turn("stall-after=4", { stall_timeout = 0.3 })
      assert.is_nil(st)
      assert.equal("timeout", code)
      assert.truthy(msg:find(STALL, 1, true), msg)
      assert.truthy(#result.answer > 0 and #result.answer < #TEXT, result.answer)
      assert.equal(TEXT:sub(1, #result.answer), result.answer)
      assert.equal(result.answer, heard) -- what the answer sink was given
      assert.equal("timeout", last.error) -- the engine's stats name the clock's code
    end)

    it("the head's clock stops with the head: a pause in the body is no header timeout", function()
      local st, result = turn("stall-after=4:2000", { header_timeout = 1, stall_timeout = 20 })
      assert.truthy(st, result)
      assert.equal(TEXT, result.answer)
    end)
  end)
end)
