-- An engine over a pool reads what its servers announce, as a batch does
-- (issue 41: "an engine over a pool does not read the servers'
-- capacity"): before the first request through an endpoint without a
-- fixed limit, its /props total_slots becomes its limiter's ceiling and
-- MTPLX's /health its serial start (mirza.pool's `read_capacity`), once
-- per endpoint. A probe that finds nothing, is refused or raises changes
-- nothing and never fails the turn. Against mirza-sim: --dialect llama
-- --parallel 3, the MTPLX dialect, --no-route /props.
local mirza = require "mirza"
local capacity = require "mirza.capacity"
local engine = require "mirza.engine"
local loop = require "mirza.loop"
local pool = require "mirza.pool"
local H = require "tests.helper"

local function sim(extra)
  local args = { "--quiet" }
  for _, a in ipairs(extra or {}) do args[#args + 1] = a end
  return H.fast_sim(args)
end

-- An engine over the pool of `urls`, loaded.
local function over(urls)
  local e = engine.new { endpoints = urls, model_id = "m", config_file = false, max_tokens = 8, log = function() end }
  assert.is_true(e:load())
  return e
end

-- One turn, which must work: what came (the answer, else the reasoning of
-- a model thinking in the plain OpenAI dialect).
local function turn(e)
  local got = {}
  local function sink(t) got[#got + 1] = t end
  local st, res = e:say("Bonjour", { mode = "token", answer = sink, think = sink })
  assert.is_table(st, tostring(res))
  assert.truthy(#got > 0)
  return table.concat(got)
end

-- Replace capacity.probe with `fn` (nil: the real one, counted) while the
-- case runs: the URLs it was asked for and what it answered.
local function spy(fn)
  local asked, real = {}, capacity.probe
  capacity.probe = function(url, opts)
    local c = (fn or real)(url, opts)
    asked[#asked + 1] = { url = url, c = c }
    return c
  end
  finally(function() capacity.probe = real end)
  return asked
end

describe("an engine over a pool", function()
  after_each(function() collectgarbage("collect") end)

  it("takes a llama-server's /props total_slots as its endpoint's ceiling, asked once", function()
    local s = sim { "--dialect", "llama", "--parallel", "3" }
    finally(s.stop)
    local asked = spy()
    local e = over { s.base }
    local ep = e.pool.endpoints[1]
    turn(e)
    assert.equal(3, ep.limiter.ceiling)
    assert.equal("/props total_slots", ep.limiter.source)
    assert.is_true(ep.limit <= 3, "limit " .. ep.limit)
    turn(e) -- the second turn asks nothing
    assert.equal(1, #asked)
    assert.equal(s.base, asked[1].url)
    assert.equal(3, ep.capacity.ceiling)
  end)

  it("starts an MTPLX endpoint at 1 (serial by default)", function()
    local s = sim()
    finally(s.stop)
    local e = over { s.base }
    local ep = e.pool.endpoints[1]
    turn(e)
    assert.equal(1, ep.limiter.first_limit)
    assert.truthy(ep.limiter.start_source and ep.limiter.start_source:find("MTPLX", 1, true), ep.limiter.start_source)
    assert.is_nil(ep.limiter.ceiling)
    assert.equal("mtplx", ep.capacity.kind)
  end)

  it("asks once for engines sharing a pool, each turn in a task waiting for the probe under way", function()
    local s = sim { "--tok-rate", "200" }
    finally(s.stop)
    local p = pool.new { s.base }
    -- the probe answers once both engines are at their turn's start: the second finds it under way
    local entered, gate, probed, real = 0, loop.condition(), false, capacity.probe
    local read = p.read_capacity
    p.read_capacity = function(self, ...)
      entered = entered + 1
      gate:broadcast()
      return read(self, ...)
    end
    local asked = spy(function(url, opts)
      while entered < 2 and gate:wait(10) do end
      local c = real(url, opts)
      probed = true
      return c
    end)
    local sent, open = {}, mirza.open
    mirza.open = function(o) -- luacheck: ignore
      sent[#sent + 1] = probed
      return open(o)
    end
    finally(function() mirza.open = open end) -- luacheck: ignore
    local function one()
      local e = engine.new { pool = p, model_id = "m", config_file = false, max_tokens = 8, log = function() end }
      return turn(e)
    end
    local _, errors, nerr = loop.gather { one, one }
    assert.equal(0, nerr, errors[1] or errors[2])
    local ep = p.endpoints[1]
    assert.equal(1, #asked)
    assert.same({ true, true }, sent) -- no request before the answer
    assert.equal(1, ep.limiter.first_limit)
    assert.equal(1, ep.peak) -- MTPLX serial: the second turn waited for the first
  end)

  it("leaves no ceiling when /props is missing, and the turn works", function()
    local s = sim { "--dialect", "llama", "--parallel", "3", "--no-route", "/props" }
    finally(s.stop)
    local asked = spy()
    local e = over { s.base }
    local ep = e.pool.endpoints[1]
    turn(e)
    assert.equal(1, #asked) -- asked, and nothing told
    assert.is_nil(asked[1].c)
    assert.is_false(ep.capacity)
    assert.is_nil(ep.limiter.ceiling)
    assert.is_nil(ep.limiter.start_source)
    assert.equal(256, ep.limiter.max)
  end)

  it("fails over past a refused endpoint whose probe was refused too, its limiter untouched", function()
    local s = sim { "--dialect", "llama", "--parallel", "3" }
    finally(s.stop)
    local dead = ("http://127.0.0.1:%d"):format(H.free_port())
    local asked = spy()
    local e = over { dead, s.base }
    turn(e)
    assert.equal(2, #asked) -- both at once, before the first request
    local d = e.pool.endpoints[1]
    assert.is_false(d.capacity)
    assert.is_nil(d.limiter.ceiling)
    assert.equal(3, e.pool.endpoints[2].limiter.ceiling)
  end)

  it("never fails a turn on a probe that raises", function()
    local s = sim { "--dialect", "llama", "--parallel", "3" }
    finally(s.stop)
    local raised = 0
    spy(function()
      raised = raised + 1
      error("probe broken")
    end)
    local e = over { s.base }
    local ep = e.pool.endpoints[1]
    turn(e)
    turn(e) -- asked once all the same
    assert.equal(1, raised)
    assert.is_nil(ep.limiter.ceiling)
  end)
end)
