-- The numbers of an options table (mirza.open, mirza.core.spawn) are
-- checked by one helper (mz_l_check_option): a wrong value raises a message
-- that names the option, says what was expected and shows what was given
-- (never "bad argument #-1"), and a value with no meaning (a negative or
-- zero event cap that would wrap to "no cap") is refused. Nothing here
-- reaches the network or starts a process: the checks come first.
local mirza = require "mirza"
local core = require "mirza.core"

local URL = "http://127.0.0.1:9/v1/chat/completions"

local function open_err(opts)
  opts.url = opts.url or URL
  local ok, err = pcall(mirza.open, opts)
  assert.is_false(ok, "mirza.open accepted " .. tostring(next(opts)))
  return err
end

local function spawn_err(opts)
  opts.argv = opts.argv or { "true" }
  local ok, err = pcall(core.spawn, opts)
  assert.is_false(ok, "spawn accepted the options")
  return err
end

describe("mirza.open's number options", function()
  it("refuses max_event_bytes that is not a positive integer, naming it", function()
    local want = "mirza.open: 'max_event_bytes' must be a positive integer (bytes) (got %s)"
    assert.equal(want:format("-1"), open_err { max_event_bytes = -1 })
    assert.equal(want:format("0"), open_err { max_event_bytes = 0 })
    assert.equal(want:format("2.5"), open_err { max_event_bytes = 2.5 })
    assert.equal(want:format('"x"'), open_err { max_event_bytes = "x" })
    assert.equal(want:format("true"), open_err { max_event_bytes = true })
  end)

  it("takes a positive max_event_bytes (an integral float too)", function()
    for _, v in ipairs { 1, 65536, 65536.0 } do
      local s <close> = mirza.open { url = URL, max_event_bytes = v }
      assert.is_false(s:closed())
    end
  end)

  it("names the clock option that is not a non-negative number", function()
    local want = "mirza.open: '%s' must be a non-negative number of seconds, or false for none (got %s)"
    assert.equal(want:format("stall_timeout", '"x"'), open_err { stall_timeout = "x" })
    assert.equal(want:format("timeout", "-1"), open_err { timeout = -1 })
    assert.equal(want:format("deadline", "true"), open_err { deadline = true })
    assert.equal(want:format("header_timeout", "-0.5"), open_err { header_timeout = -0.5 })
  end)

  it("refuses an unknown option", function()
    assert.equal("mirza.open: unknown option 'max_event_byte'", open_err { max_event_byte = 1 })
  end)
end)

describe("mirza.core.spawn's options", function()
  it("names grace and pidfile when they are wrong", function()
    assert.equal([[mirza.spawn: 'grace' must be a number of seconds 0..1e6 (got "x")]], spawn_err { grace = "x" })
    assert.equal("mirza.spawn: 'grace' must be a number of seconds 0..1e6 (got -1)", spawn_err { grace = -1 })
    assert.equal("mirza.spawn: 'pidfile' must be a port 1..65535 (got 0)", spawn_err { pidfile = 0 })
    assert.equal("mirza.spawn: 'pidfile' must be a port 1..65535 (got 70000)", spawn_err { pidfile = 70000 })
    assert.equal("mirza.spawn: 'pidfile' must be a port 1..65535 (got 80.5)", spawn_err { pidfile = 80.5 })
  end)

  it("refuses an unknown option", function()
    assert.equal("mirza.spawn: unknown option 'graze'", spawn_err { graze = 1 })
  end)
end)

describe("timeout arguments", function()
  it("are checked the same way by s:next, mirza.wait and mirza.sleep", function()
    local s <close> = mirza.open { url = URL }
    assert.has_error(function() s:next(-1) end, "bad argument #1 to 'next' (negative timeout)")
    assert.has_error(function() mirza.wait(-1) end, "bad argument #1 to 'wait' (negative timeout)")
    assert.has_error(function() mirza.sleep(-1) end, "bad argument #1 to 'sleep' (negative timeout)")
  end)
end)
