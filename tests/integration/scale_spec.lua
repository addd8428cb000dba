-- A thousand streams in one process (issue 20): 1,024 concurrent streams
-- under the usual soft limit of 1,024 open files, each answered in full
-- (every byte, in order); the same through `mirza batch` with one
-- `--endpoint URL@1024`; and what a user is told when even the hard limit
-- is too low — for a stream (an `io` error naming both limits, not a
-- "refused" that reads as a dead daemon) and for a batch (exit 2 before
-- anything is written). Each run is a child `mirza` started under `ulimit`.
-- Nothing here is timed: the figures are the benchmark's (`mirza bench
-- --only scale`).
local mirza = require "mirza"
local json = mirza.json
local H = require "tests.helper"

local N = 1024

local function sh_quote(s)
  return "'" .. tostring(s):gsub("'", [['\'']]) .. "'"
end

-- Run `mirza ARGS...` under `ulimit LIMITS` (a shell fragment such as
-- "-Sn 1024"); returns its output (stdout and stderr) and exit status.
local function run_limited(limits, args)
  local q = {}
  for i, a in ipairs(args) do q[i] = sh_quote(a) end
  local p = assert(io.popen(("sh -c %s 2>&1; echo \"rc=$?\""):format(sh_quote(("ulimit %s && exec %s %s")
    :format(limits, sh_quote(H.mirza_bin), table.concat(q, " "))))))
  local out = p:read("a")
  p:close()
  local rc = tonumber(out:match("rc=(%d+)%s*$"))
  return out:gsub("rc=%d+%s*$", ""), rc
end

local function script(code)
  local path = H.tmpname(".lua")
  local f = assert(io.open(path, "w"))
  f:write(code)
  f:close()
  finally(function() os.remove(path) end)
  return path
end

-- The text stream i is answered with: its number, then words (the
-- simulator sends one per frame), non-ASCII included.
local function text_of(i)
  return ("stream %d: l'été à Zürich, %d fois, puis la fin."):format(i, i * 7)
end

-- The hard limit of this machine (the test needs 1,024 sockets and a few
-- files beside them).
local function hard_limit()
  local p = io.popen("sh -c 'ulimit -Hn'")
  local v = p and p:read("l")
  if p then p:close() end
  return v == "unlimited" and math.huge or tonumber(v) or 0
end

describe("1,024 streams in one process", function()
  local sim
  setup(function()
    sim = H.start_sim { "--parallel", tostring(N), "--ttft-ms", "0", "--tok-rate", "200", "--quiet" }
  end)
  teardown(function() if sim then sim.stop() end end)

  it("all complete with every byte under a soft limit of 1,024 open files (raised to the hard one)", function()
    if hard_limit() < N + 64 then
      pending(("the hard limit on open files here (%s) is below %d"):format(hard_limit(), N + 64))
      return
    end
    local path = script(([[
      local mirza = require "mirza"
      local loop = require "mirza.loop"
      local soft, hard, before = mirza.fd_limit()
      local texts, done, fns = {}, {}, {}
      for i = 1, %d do
        fns[i] = function()
          local s <close> = mirza.open { url = %q, body = { model = "m", stream = true,
            messages = { { role = "user", content = "q" .. i } },
            mirza_sim = { text = (%q):format(i, i * 7) } } }
          local parts = {}
          for ev in s:events() do
            if ev.type == "text" then parts[#parts + 1] = ev.text
            elseif ev.type == "done" then done[i] = ev.finish_reason
            elseif ev.type == "error" then error(ev.code .. ": " .. ev.message) end
          end
          texts[i] = table.concat(parts)
        end
      end
      local peak = 0
      fns[#fns + 1] = function() -- how many were open at once
        while true do
          peak = math.max(peak, mirza.streams())
          if peak >= %d or #texts >= %d then return end
          mirza.sleep(0.005)
        end
      end
      local _, errs, nerr = loop.gather(fns)
      print("RESULT " .. mirza.json.encode { soft = soft, hard = hard, before = before, texts = texts,
        done = done, nerr = nerr, err = nerr > 0 and select(2, next(errs)) or nil, peak = peak })
    ]]):format(N, sim.url, "stream %d: l'été à Zürich, %d fois, puis la fin.", N, N))
    local out, rc = run_limited("-Sn 1024", { path })
    assert.are.equal(0, rc, out)
    local r = json.decode(assert(out:match("RESULT (%b{})"), out))
    assert.are.equal(1024, r.before, "the child started with a soft limit of 1,024")
    assert.is_true(r.soft > N, "the soft limit was raised: " .. tostring(r.soft))
    assert.are.equal(r.hard, r.soft)
    assert.are.equal(0, r.nerr, tostring(r.err))
    assert.are.equal(N, r.peak, "all the streams were open at once")
    local wrong = {}
    for i = 1, N do
      if r.texts[i] ~= text_of(i) or r.done[i] ~= "stop" then wrong[#wrong + 1] = i end
    end
    assert.are.same({}, wrong)
  end)

  it("gives a daemon it starts the limit it started with, not the raised one", function()
    if hard_limit() <= 1024 then
      pending(("the hard limit on open files here (%s) leaves nothing to raise"):format(hard_limit()))
      return
    end
    local path = script([[
      local core = require "mirza.core"
      local mirza = require "mirza"
      local out = os.tmpname()
      local p = core.spawn { argv = { "sh", "-c", "ulimit -Sn > " .. out } }
      while p:poll() do mirza.sleep(0.01) end
      p:close()
      local f = assert(io.open(out))
      print("RESULT " .. mirza.json.encode { child = tonumber(f:read("a")), parent = mirza.fd_limit() })
      f:close()
      os.remove(out)
    ]])
    local out, rc = run_limited("-Sn 1024", { path })
    assert.are.equal(0, rc, out)
    local r = json.decode(assert(out:match("RESULT (%b{})"), out))
    assert.is_true(r.parent > 1024, "raised in mirza")
    assert.are.equal(1024, r.child)
  end)

  it("says 'too many open files' with both limits when even the hard limit is too low (io, not refused)",
    function()
      local path = script(([[
        local mirza = require "mirza"
        local ss, errs = {}, {}
        for i = 1, 100 do
          ss[i] = mirza.open { url = %q, body = { model = "m", stream = true,
            messages = { { role = "user", content = "q" } }, mirza_sim = { answer_tokens = 3 } } }
        end
        for i = 1, 100 do
          for ev in ss[i]:events() do
            if ev.type == "error" then errs[#errs + 1] = { code = ev.code, message = ev.message } end
          end
          ss[i]:close()
        end
        print("RESULT " .. mirza.json.encode { errs = errs, n = #errs })
      ]]):format(sim.url))
      local out, rc = run_limited("-n 64", { path }) -- soft and hard
      assert.are.equal(0, rc, out)
      local r = json.decode(assert(out:match("RESULT (%b{})"), out))
      assert.is_true(r.n > 0, "some streams found no descriptor left")
      assert.is_true(r.n < 100, "the first ones got theirs")
      for _, e in ipairs(r.errs) do
        assert.are.equal("io", e.code)
        assert.matches("too many open files", e.message, 1, true)
        assert.matches("this process may open 64 files, the hard limit is 64", e.message, 1, true)
        assert.matches("run fewer requests at once", e.message, 1, true)
      end
    end)
end)

describe("mirza batch with --endpoint URL@1024", function()
  local sim
  setup(function()
    sim = H.start_sim { "--parallel", tostring(N), "--ttft-ms", "0", "--tok-rate", "200", "--quiet" }
  end)
  teardown(function() if sim then sim.stop() end end)

  local function input_file(n)
    local path = H.tmpname(".jsonl")
    local f = assert(io.open(path, "w"))
    for i = 1, n do
      f:write(json.encode { custom_id = "item-" .. i, body = { messages = { { role = "user", content = "q" .. i } },
        mirza_sim = { text = text_of(i) } } }, "\n")
    end
    f:close()
    finally(function() os.remove(path) end)
    return path
  end

  it("answers 1,024 items at once under a soft limit of 1,024, one whole record each", function()
    if hard_limit() < N + 64 then
      pending(("the hard limit on open files here (%s) is below %d"):format(hard_limit(), N + 64))
      return
    end
    local input, output = input_file(N), H.tmpname(".jsonl")
    finally(function() os.remove(output) end)
    local out, rc = run_limited("-Sn 1024", { "batch", input, output, "--endpoint", sim.base .. "/v1@" .. N,
      "--model", "m", "--quiet" })
    assert.are.equal(0, rc, out)
    local seen, n = {}, 0
    for line in io.lines(output) do
      local rec = json.decode(line)
      n = n + 1
      local i = tonumber(rec.custom_id:match("^item%-(%d+)$"))
      assert.are.equal(json.null, rec.error, line)
      assert.are.equal(text_of(i), rec.response.body.choices[1].message.content)
      seen[i] = true
    end
    assert.are.equal(N, n)
    for i = 1, N do assert.is_true(seen[i], "item-" .. i) end
  end)

  it("stops before writing anything (exit 2) when @N cannot fit in the hard limit, and says what to do", function()
    local input, output = input_file(8), H.tmpname(".jsonl")
    finally(function() os.remove(output) end)
    -- 8 items never hold more than 8 sockets, whatever @N says: they run
    local out, rc = run_limited("-n 512", { "batch", input, output, "--endpoint", sim.base .. "/v1@" .. N,
      "--model", "m", "--quiet" })
    assert.are.equal(0, rc, out)
    local n = 0
    for _ in io.lines(output) do n = n + 1 end
    assert.are.equal(8, n)
    os.remove(output)
    local input2 = input_file(N)
    out, rc = run_limited("-n 512", { "batch", input2, output, "--endpoint", sim.base .. "/v1@" .. N,
      "--model", "m", "--quiet" })
    assert.are.equal(2, rc, out)
    assert.matches("batch: 1024 requests at once need about 1056 open files, and this process may open 512"
      .. " (the hard limit): lower the endpoints' @N so that they add up to at most 480", out, 1, true)
    assert.is_nil(io.open(output), "nothing was written")
    -- a resumed run counts what is left: 1,016 of the 1,024 done, 8 to go
    local f = assert(io.open(output, "w"))
    for i = 1, N - 8 do
      f:write(json.encode { custom_id = "item-" .. i, response = { status_code = 200, body = {} },
        error = json.null }, "\n")
    end
    f:close()
    out, rc = run_limited("-n 512", { "batch", input2, output, "--endpoint", sim.base .. "/v1@" .. N,
      "--model", "m", "--quiet" })
    assert.are.equal(0, rc, out)
    local n2 = 0
    for _ in io.lines(output) do n2 = n2 + 1 end
    assert.are.equal(N, n2)
  end)
end)
