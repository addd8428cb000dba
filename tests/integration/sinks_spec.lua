-- sinks_spec.lua - e:say's sinks in the forms users write them (README):
-- a C function such as io.write or print gets the text only, a file handle
-- is written with :write (the error sink a line per error), a Lua function
-- gets (text, ev). Against mirza-sim started by the supervisor.
local engine = require "mirza.engine"
local H = require "tests.helper"

local function new_engine()
  return engine.new {
    preset = "mirza-sim", port = H.free_port(), config_file = false, session_id = "sinks-" .. math.random(1e9),
    daemon = { args = { "--tok-rate", "0", "--ttft-ms", "0", "--quiet" }, deadline = 30 },
    max_tokens = 64, log = function() end,
  }
end

-- What a temporary file holds once fn(f) wrote to it.
local written = H.written

describe("e:say sinks", function()
  local e
  lazy_setup(function()
    e = new_engine()
    assert(e:load())
  end)
  lazy_teardown(function() if e then e:close() end end)

  it("answer = io.write (a C function) writes the answer, think = a file handle the reasoning", function()
    e:set_thinking(true)
    local stats, res
    local think = written(function(tf)
      local answer = written(function(af)
        local old = io.output()
        io.output(af)
        local ok, err = pcall(function()
          stats, res = assert(e:say("Bonjour", { mode = "token", answer = io.write, think = tf }))
        end)
        io.output(old)
        assert(ok, err)
      end)
      assert.is_true(#answer > 0)
      assert.equal(res.answer, answer)
    end)
    assert.is_true(#think > 0)
    assert.equal(res.think, think)
    assert.is_true(stats.tokens > 0)
  end)

  it("answer = a file handle in sentence mode, error = a file handle: one line per error", function()
    e:set_thinking(false)
    local ok, msg, code, res, errors
    local answer = written(function(af)
      errors = written(function(ef)
        local fault = { mirza_sim = { fault = "error-after=5" } }
        ok, msg, code, res = e:say("Bonjour", { answer = af, error = ef, body_extra = fault })
      end)
    end)
    assert.is_nil(ok)
    assert.equal("server", code)
    assert.equal(msg .. "\n", errors) -- the message, on a line of its own
    assert.equal(res.answer:gsub("%s+", ""), answer:gsub("%s+", "")) -- the sentences, without the spaces between
  end)

  it("a Lua function gets the text and its event", function()
    local got = {}
    assert(e:say("Bonjour", { mode = "token", answer = function(text, ev) got[#got + 1] = { text, ev.type } end }))
    assert.is_true(#got > 0)
    for _, g in ipairs(got) do
      assert.equal("string", type(g[1]))
      assert.equal("text", g[2])
    end
  end)
end)
