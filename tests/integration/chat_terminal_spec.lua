-- What a user of `mirza chat` sees (issue 36 items 2 and 10), against
-- mirza-sim: the thinking set apart from the answer ("thinking: ", ended
-- by its own line end; dim on a terminal), an error on its own line,
-- /budget confirming (or refusing what is not a number), and Ctrl-C
-- while an answer streams through a behaviour's stage: the answer stops,
-- the chat ends with status 130 and the part heard is saved.
local mirza = require "mirza"
local H = require "tests.helper"

local write = H.write_file
local function slurp(path) return io.open(path) and H.read_file(path) or "" end

-- `mirza chat ARGS` with these input lines against the simulator at base
-- (used as is), with XDG_STATE_HOME=state: {rc, out, err}.
local function chat(base, lines, args, state)
  local input, out, err = H.tmpname(".in"), H.tmpname(".out"), H.tmpname(".err")
  write(input, table.concat(lines, "\n") .. "\n")
  local cmd = ("MIRZA_BASE_URL=%s XDG_STATE_HOME=%s MIRZA_CONFIG=/dev/null %s %s %s/scripts/chat.lua %s"
    .. " --fifo %s >%s 2>%s"):format(H.q(base .. "/v1"), H.q(state or "/nonexistent"), H.timeout_prefix(30),
      H.q(H.mirza_bin), H.q(H.source), args or "", H.q(input), H.q(out), H.q(err))
  local _, _, rc = os.execute(cmd)
  local r = { rc = rc, out = H.read_file(out), err = H.read_file(err) }
  os.remove(input) os.remove(out) os.remove(err)
  return r
end

describe("mirza chat's output", function()
  after_each(function() collectgarbage("collect") end)

  it("sets the thinking apart, puts an error on its own line, and /budget confirms", function()
    local sim = H.start_sim { "--tok-rate", "0", "--ttft-ms", "0", "--fault", "error-after=8" }
    finally(sim.stop)
    local r = chat(sim.base, { "/think on", "Bonjour", "/budget 64", "/budget lots", "/budget 0", "/quit" },
      "--no-save")
    assert.equal(0, r.rc, r.err)
    assert.is_nil(r.err:find("\27", 1, true), r.err) -- not a terminal: no escapes
    -- the reasoning came first: one block, then the error at the start of a line
    local block, errline = r.err:match("\n(thinking: [^\n]*)\n(error: [^\n]*)\n")
    assert.truthy(block, r.err)
    assert.truthy(errline:find("error", 8, true), errline)
    assert.truthy(r.err:find("\nreasoning budget 64 tokens (thinking on)\n", 1, true), r.err)
    assert.truthy(r.err:find("\nerror: /budget takes a number of tokens (0: thinking off), not 'lots'\n", 1, true),
      r.err)
    assert.truthy(r.err:find("\nreasoning budget 0 (thinking off)\n", 1, true), r.err)
  end)

  it("on a terminal the thinking is dim and prefixed, the answer on a line of its own", function()
    local input, out = H.tmpname(".in"), H.tmpname(".out")
    local term, why = H.in_terminal(("%s %s/scripts/chat.lua --no-save <%s"):format(H.q(H.mirza_bin),
      H.q(H.source), H.q(input)))
    if not term then
      pending(why)
      return
    end
    local sim = H.start_sim { "--tok-rate", "0", "--ttft-ms", "0" }
    finally(sim.stop)
    finally(function() os.remove(input) os.remove(out) end)
    write(input, "/think on\nBonjour\n/quit\n")
    local cmd = ("MIRZA_BASE_URL=%s MIRZA_CONFIG=/dev/null NO_COLOR= %s %s >%s"):format(H.q(sim.base .. "/v1"),
      H.timeout_prefix(30), term, H.q(out))
    assert.is_true(os.execute(cmd))
    local text = H.read_file(out):gsub("\r", "")
    assert.truthy(text:find("\27[2mthinking: ", 1, true), text)
    -- the last piece of the reasoning is ended (undimmed, a line end) before the answer's first sentence
    local after = text:match("\27%[0m\n(%u[^\n]*)\n")
    assert.truthy(after and not after:find("\27", 1, true), text)
  end)
end)

describe("mirza chat on a terminal with readline built in", function()
  after_each(function() collectgarbage("collect") end)

  it("edits the line (Ctrl-A: to its start, the turn is 'Bonjour', not 'jour^ABon'); Ctrl-C at the prompt ends it",
    function()
    if not pcall(require, "mirza.readline") then
      pending("this mirza has no readline")
      return
    end
    local dir = H.tmpname(".d")
    local beh, keys, out, rcf = dir .. "/beh.lua", dir .. "/keys", dir .. "/out", dir .. "/rc"
    local term, why = H.in_terminal(("%s %s/scripts/chat.lua %s --no-save"):format(H.q(H.mirza_bin), H.q(H.source),
      H.q(beh)))
    if not term then
      pending(why)
      return
    end
    local sim = H.start_sim { "--tok-rate", "0", "--ttft-ms", "0" }
    finally(sim.stop)
    os.execute("mkdir -p " .. H.q(dir))
    finally(function() os.execute("rm -rf " .. H.q(dir)) end)
    write(beh, 'return { on_turn = function(t) io.stderr:write("TURN=[", t, "]\\n") return t end }')
    assert(os.execute("mkfifo " .. H.q(keys)))
    local cmd = ("MIRZA_BASE_URL=%s MIRZA_CONFIG=/dev/null %s %s <%s >%s 2>&1 & echo $!; wait $!; echo $? >%s")
      :format(H.q(sim.base .. "/v1"), H.timeout_prefix(30), term, H.q(keys), H.q(out), H.q(rcf))
    local sh = assert(io.popen(cmd))
    local pid = tonumber(sh:read("l"))
    H.track(pid, "script")
    local k = assert(io.open(keys, "w")) -- script(1) holds the other end: the chat's terminal
    local rc
    finally(function()
      k:close()
      if not rc then os.execute("kill -KILL " .. pid .. " 2>/dev/null") end
      sh:close()
      H.untrack(pid)
    end)
    assert(H.wait_for(function() return slurp(out):find("> ", 1, true) end, 30), "no prompt: " .. slurp(out))
    k:write("jour\1Bon\r")
    k:flush()
    assert(H.wait_for(function() return slurp(out):find("TURN=[", 1, true) end, 30), "no turn: " .. slurp(out))
    assert(H.wait_for(function() return select(2, slurp(out):gsub("> ", "")) >= 2 end, 30), "no prompt: " .. slurp(out))
    k:write("half a li\3") -- Ctrl-C while readline waits for a key
    k:flush()
    rc = H.wait_for(function() return tonumber(slurp(rcf)) end, 10)
    local text = slurp(out)
    assert.truthy(text:find("TURN=[Bonjour]", 1, true), text)
    assert.equal(130, rc, text)
    assert.truthy(text:find("\ninterrupted\r?\n"), text)
    assert.is_nil(text:find("TURN=[half", 1, true), text)
  end)
end)

describe("Ctrl-C in mirza chat while an answer streams through the behaviour's stage", function()
  after_each(function() collectgarbage("collect") end)

  it("stops the answer: status 130, the part heard saved, marked interrupted", function()
    local sim = H.start_sim { "--tok-rate", "40", "--ttft-ms", "0", "--answer-tokens", "5000" }
    finally(sim.stop)
    local dir = H.tmpname(".d")
    os.execute("mkdir -p " .. H.q(dir))
    finally(function() os.execute("rm -rf " .. H.q(dir)) end)
    local beh, input, out, err, rcf = dir .. "/beh.lua", dir .. "/in", dir .. "/out", dir .. "/err", dir .. "/rc"
    write(beh, [[return { stage = function(up) return function() local ev = up()
      if ev and ev.type == "text" then ev.text = ev.text:upper() end return ev end end }]])
    write(input, "Bonjour\n/quit\n")
    local cmd = ("MIRZA_BASE_URL=%s XDG_STATE_HOME=%s MIRZA_CONFIG=/dev/null %s %s/scripts/chat.lua %s --name barge "
      .. "--fifo %s >%s 2>%s & echo $!; wait $!; echo $? >%s"):format(H.q(sim.base .. "/v1"), H.q(dir),
      H.q(H.mirza_bin), H.q(H.source), H.q(beh), H.q(input), H.q(out), H.q(err), H.q(rcf))
    local sh = assert(io.popen(cmd))
    local pid = tonumber(sh:read("l"))
    H.track(pid, H.mirza_bin)
    local rc
    finally(function()
      if not rc then os.execute("kill -KILL " .. pid .. " 2>/dev/null") end
      sh:close()
      H.untrack(pid)
    end)
    -- two sentences heard (upper-cased by the stage), then Ctrl-C
    assert(H.wait_for(function() return select(2, slurp(out):gsub("\n", "")) >= 2 end, 30), "no answer: " .. slurp(err))
    os.execute("kill -INT " .. pid)
    rc = H.wait_for(function() return tonumber(slurp(rcf)) end, 20) -- the whole answer: 125 s
    local said = H.read_file(err)
    assert.equal(130, rc, said)
    assert.truthy(said:find("\ninterrupted\n", 1, true), said)
    assert.is_nil(said:find("behaviour error", 1, true), said)
    assert.is_nil(said:find("[ttft", 1, true), said) -- the turn did not run to its end
    local heard = H.read_file(out)
    assert.equal(heard:upper(), heard)
    local saved = mirza.json.decode(H.read_file(dir .. "/mirza/conversations/barge.json"))
    local msgs = saved.messages or saved.history or {}
    local last = msgs[#msgs]
    assert.is_table(last, H.read_file(dir .. "/mirza/conversations/barge.json"))
    assert.equal("assistant", last.role)
    assert.is_true(last.interrupted)
  end)
end)
