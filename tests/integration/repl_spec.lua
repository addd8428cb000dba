-- repl_spec.lua - `mirza` with no script on a real pseudo-terminal
-- (script(1) allocates it, util-linux's or BSD's through H.in_terminal:
-- each case is pending where there is neither; keys are written to its
-- stdin through a FIFO, one step at a time, and its output file is awaited): lua-like
-- evaluation, a stream printed as it arrives, Ctrl-C cancelling the
-- stream but not the session, Ctrl-C at the prompt dropping the line,
-- Ctrl-D ending the session with status 0.
local mirza = require "mirza"
local H = require "tests.helper"

local CTRL_C, CTRL_D = "\3", "\4"

-- Start `mirza` on a pty; returns {send, await, output, finish}, or nil and
-- why when no script(1) can give it a terminal.
local function session()
  local term, why = H.in_terminal(H.q(H.mirza_bin))
  if not term then return nil, why end
  local dir = H.tmpname(".repl")
  assert(os.execute("mkdir " .. H.q(dir) .. " && mkfifo " .. H.q(dir .. "/in")))
  local r = { dir = dir, out = dir .. "/out" }
  local inner = ("TERM=dumb %s <%s >%s 2>&1; echo $? >%s"):format(term, H.q(dir .. "/in"), H.q(r.out),
    H.q(dir .. "/rc"))
  assert(os.execute("(" .. inner .. ") >/dev/null 2>&1 &"))
  r.w = assert(io.open(dir .. "/in", "w")) -- blocks until script reads it
  function r.send(keys)
    r.w:write(keys)
    r.w:flush()
  end
  function r.output()
    local f = io.open(r.out, "rb")
    local s = f and f:read("a") or ""
    if f then f:close() end
    return s
  end
  -- Wait for plain text to appear after position `from`; its end position.
  function r.await(text, from)
    local pos = H.wait_for(function()
      local _, e = r.output():find(text, from or 1, true)
      return e
    end, 60)
    assert(pos, ("%q never came; output so far:\n%s"):format(text, r.output()))
    return pos + 1
  end
  function r.finish()
    r.send(CTRL_D)
    r.w:close()
    local rc = H.wait_for(function()
      local f = io.open(dir .. "/rc")
      local v = f and tonumber(f:read("a"))
      if f then f:close() end
      return v
    end, 60)
    os.execute("rm -rf " .. H.q(dir))
    return rc
  end
  return r
end

-- A Lua expression opening a stream from the simulator; `text` is Lua
-- code, so the words streamed need not appear in the echoed input.
local function open_expr(sim, text, tok_rate)
  return ("mirza.open{url=%q, body={model='m', stream=true, messages={{role='user', content='hi'}}, "
    .. "mirza_sim={text=%s, tok_rate=%d, ttft_ms=0}}}"):format(sim.url, text, tok_rate)
end

-- REPL input defining words(p, n) -> "p01 p02 ... pn " (40 words: 5 s at 8/s).
local WORDS = "function words(p, n) local t = {} for i = 1, n do t[i] = p .. ('%02d '):format(i) end "
  .. "return table.concat(t) end\n"

describe("the interactive prompt", function()
  local sim
  setup(function() sim = H.start_sim { "--tok-rate", "0", "--ttft-ms", "0", "--progress-every", "0" } end)
  teardown(function() sim.stop() end)
  after_each(function() collectgarbage("collect") end)

  it("evaluates expressions, statements and continued lines like lua", function()
    local r, why = session()
    if not r then
      pending(why)
      return
    end
    local at = r.await("> ")
    r.send("print(40 + 2)\n")
    at = r.await("\n42", at)
    r.send("x = 1 +\n")
    at = r.await(">> ", at)
    r.send("2\n")
    r.send("x * 10, mirza.version\n")
    at = r.await("30\t" .. mirza.version, at)
    r.send("error('boom')\n")
    r.await("stdin:1: boom", at)
    assert.equal(0, r.finish())
  end)

  it("prints a stream as it arrives, and Ctrl-C cancels it, not the session", function()
    local r, why = session()
    if not r then
      pending(why)
      return
    end
    local at = r.await("> ")
    r.send(WORDS)
    r.send(open_expr(sim, "words('w', 40)", 8) .. "\n")
    at = r.await("w02", at) -- text shows before the stream ends
    assert.is_nil(r.output():find("w40", 1, true))
    r.send(CTRL_C)
    at = r.await("interrupted", at)
    r.send("print('open streams', mirza.streams())\n")
    at = r.await("open streams\t0", at)
    assert.is_nil(r.output():find("w40", 1, true))
    -- the session goes on: a whole stream, then its finish reason
    r.send(open_expr(sim, "'Il fait ' .. 'beau.'", 0) .. "\n")
    r.await("Il fait beau.\r\n[stop, ", at)
    assert.equal(0, r.finish())
  end)

  it("cancels a stream read by a loop in the user's own code", function()
    local r, why = session()
    if not r then
      pending(why)
      return
    end
    local at = r.await("> ")
    r.send(WORDS)
    r.send("s = " .. open_expr(sim, "words('v', 40)", 8) .. "\n")
    r.send("for ev in s:events() do io.write(ev.text or '') end\n")
    at = r.await("v02", at)
    r.send(CTRL_C)
    at = r.await("interrupted", at)
    r.send("print('closed', s:closed())\n")
    r.await("closed\ttrue", at)
    assert.equal(0, r.finish())
  end)

  it("drops a half-typed line on Ctrl-C at the prompt", function()
    local r, why = session()
    if not r then
      pending(why)
      return
    end
    local at = r.await("> ")
    r.send("nonsense(")
    at = r.await("nonsense(", at)
    r.send(CTRL_C)
    r.await("\r\n> ", at) -- a fresh prompt
    r.send("print('fresh' .. 'line')\n")
    r.await("freshline", at)
    assert.is_nil(r.output():find("syntax error", 1, true))
    assert.equal(0, r.finish())
  end)
end)
