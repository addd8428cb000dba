-- Recordings made by several processes into one directory (issue 19):
-- child mirza processes recording at once (MIRZA_RECORD, an engine's
-- turns and raw requests) get distinct request numbers, never one
-- another's files, numbers past an older recording's files, runs.jsonl
-- lines whole (one write each, O_APPEND), and no credential in any file;
-- the C core and mirza.record agree on which names are credentials.
local mirza = require "mirza"
local record = require "mirza.record"
local H = require "tests.helper"

local json = mirza.json
local SECRET = "sk-procs-secret-9191"

local function files(dir)
  local p = assert(io.popen("ls " .. H.q(dir)))
  local out = {}
  for l in p:lines() do out[#out + 1] = l end
  p:close()
  return out
end

-- A mirza script run as a child with env (a shell prefix, e.g.
-- "MIRZA_RECORD=/x"), tracked like H.spawn_mirza's.
local function spawn(env, code)
  local script, out, rcf = H.tmpname(".lua"), H.tmpname(".out"), H.tmpname(".rc")
  local f = assert(io.open(script, "w"))
  f:write(code)
  f:close()
  local sh = assert(io.popen(("%s %s %s >%s 2>&1 & echo $!; wait $!; echo $? >%s"):format(env, H.q(H.mirza_bin),
    H.q(script), H.q(out), H.q(rcf))))
  local run = { pid = tonumber(sh:read("l")) }
  H.track(run.pid, H.mirza_bin)
  function run.output() return io.open(out) and H.read_file(out) or "" end
  function run.wait(timeout)
    local rc = H.wait_for(function()
      local rf = io.open(rcf)
      local v = rf and tonumber(rf:read("a"))
      if rf then rf:close() end
      return v
    end, timeout or 30)
    if rc and sh then
      H.untrack(run.pid)
      sh:close()
      sh = nil
      os.remove(script)
      os.remove(rcf)
    end
    return rc
  end
  function run.expect(pattern) return H.wait_for(function() return run.output():match(pattern) end, 30) end
  return run
end

-- The child: one request, "first" printed, then (once `go` exists) the
-- rest: engine turns (runs.jsonl lines, each answer a long text unique to
-- the child and turn) and raw requests carrying credentials in headers
-- and the URL. Every child's first request is made before any child's
-- second: a number picked by looking for a free name collides for sure.
local CHILD = [[
local mirza = require "mirza"
local engine = require "mirza.engine"
local K, URL, BASE, SECRET, GO = %d, %q, %q, %q, %q
local function long(tag) return (tag .. " "):rep(math.ceil(6000 / (#tag + 1))) end
local function raw(i)
  local tag = ("raw-%%d-%%d"):format(K, i)
  assert(mirza.collect { url = URL .. "?api_key=" .. SECRET .. "&k=" .. K, api_key = SECRET,
    headers = { Cookie = "sid=" .. SECRET, ["Proxy-Authorization"] = "Basic " .. SECRET, ["X-Api-Key"] = SECRET,
      ["api-key"] = SECRET, "X-Auth-Token: " .. SECRET, ["X-Kept"] = tag },
    body = { stream = true, messages = { { role = "user", content = tag } }, mirza_sim = { text = tag } } })
end
raw(1)
print("first")
io.stdout:flush()
local t0 = mirza.now()
while not io.open(GO) do
  assert(mirza.now() - t0 < 30, "no go")
  mirza.sleep(0.005)
end
local e = engine.new { base_url = BASE .. "/v1", model = "mirza-sim", config_file = false, daemon = false,
  api_key = SECRET, session_id = "procs-" .. K, log = function() end }
for i = 1, 3 do
  local tag = ("turn-%%d-%%d"):format(K, i)
  assert(e:say(tag, { answer = function() end, body_extra = { mirza_sim = { text = long(tag) } } }))
  raw(i + 1)
end
e:close()
print("done")
]]

describe("several processes recording into one directory", function()
  local sim, dir
  setup(function()
    sim = H.start_sim { "--tok-rate", "0", "--ttft-ms", "0", "--api-key", SECRET, "--parallel", "4" }
    dir = H.tmpname(".rec")
  end)
  teardown(function()
    sim.stop()
    os.execute("rm -rf " .. H.q(dir))
  end)

  it("gives each request its own number and file, runs.jsonl whole lines, and no secret in any file", function()
    local N = 3
    assert(os.execute("mkdir -p " .. H.q(dir)))
    -- an older recording (no .ids), with a hole: its numbers stay its own
    local OLD = { ["000001"] = true, ["000002"] = true, ["000009"] = true }
    for n in pairs(OLD) do
      local f = assert(io.open(dir .. "/" .. n .. ".request", "wb"))
      f:write("POST /v1/chat/completions\n\nold-" .. n)
      f:close()
      f = assert(io.open(dir .. "/" .. n .. ".response", "wb"))
      f:write("HTTP/1.1 200 OK\r\n\r\nold-" .. n)
      f:close()
    end
    local go = dir .. ".go"
    finally(function() os.remove(go) end)
    local runs = {}
    for k = 1, N do
      runs[k] = spawn("MIRZA_RECORD=" .. H.q(dir), CHILD:format(k, sim.url, sim.base, SECRET, go))
    end
    for k = 1, N do assert.truthy(runs[k].expect("first\n"), runs[k].output()) end
    assert(io.open(go, "w")):close()
    for k = 1, N do assert.equal(0, runs[k].wait(60), runs[k].output()) end

    -- every request its own pair of files: 4 raw and 3 turns per child
    local want = {}
    for k = 1, N do
      for i = 1, 4 do want[("raw-%d-%d"):format(k, i)] = true end
      for i = 1, 3 do want[("turn-%d-%d"):format(k, i)] = true end
    end
    local seen, n_requests = {}, 0
    for _, name in ipairs(files(dir)) do
      local id = name:match("^(%d+)%.request$")
      if id then
        n_requests = n_requests + 1
        local req = H.read_file(dir .. "/" .. name)
        local resp = H.read_file(dir .. "/" .. id .. ".response")
        if OLD[id] then
          assert.equal("POST /v1/chat/completions\n\nold-" .. id, req)
          assert.equal("HTTP/1.1 200 OK\r\n\r\nold-" .. id, resp)
        else
          local head, body = req:match("^(.-)\n\n(.*)$")
          local msgs = json.decode(body).messages
          local tag = msgs[#msgs].content
          assert.truthy(want[tag], "unexpected request " .. id .. ": " .. tostring(tag))
          assert.is_nil(seen[tag], tag .. " recorded twice")
          seen[tag] = id
          -- the response is this request's, whole
          assert.truthy(resp:find("^HTTP/1.1 200 OK\r\n"), id .. ": " .. resp:sub(1, 80))
          assert.equal("data: [DONE]\n\n", resp:sub(-14), id)
          assert.truthy(resp:find(tag, 1, true), id .. "'s response is not " .. tag .. "'s")
          for other in pairs(want) do
            if other ~= tag then assert.is_nil(resp:find(other .. " ", 1, true), id .. " holds " .. other) end
          end
          if tag:find("^raw") then
            local lines = {}
            for l in head:gmatch("[^\n]+") do lines[#lines + 1] = l end
            assert.equal(("POST %s?api_key=[redacted]&k=%s"):format(sim.url, tag:match("^raw%-(%d+)")), lines[1])
            table.remove(lines, 1)
            assert.same({ "Cookie: [redacted]", "Proxy-Authorization: [redacted]", "X-Api-Key: [redacted]",
              "X-Auth-Token: [redacted]", "X-Kept: " .. tag, "api-key: [redacted]", "Authorization: [redacted]" },
              lines)
          end
        end
      end
    end
    assert.equal(3 + N * 7, n_requests)
    for tag in pairs(want) do assert.truthy(seen[tag], tag .. " was not recorded") end

    -- runs.jsonl: one whole line per turn, naming its own request
    local lines = 0
    for l in io.lines(dir .. "/runs.jsonl") do
      lines = lines + 1
      local ok, line = pcall(json.decode, l)
      assert(ok, "a broken runs.jsonl line: " .. l:sub(1, 120) .. " ... " .. l:sub(-120))
      assert.truthy(want[line.prompt], line.prompt)
      assert.equal(seen[line.prompt], line.request)
      assert.equal(("%s "):format(line.prompt):rep(math.ceil(6000 / (#line.prompt + 1))), line.answer)
    end
    assert.equal(N * 3, lines)

    -- no credential in any file written, the claims file included
    for _, name in ipairs(H.listing(dir)) do
      local text = H.read_file(dir .. "/" .. name)
      assert.is_nil(text:find(SECRET, 1, true), name .. " shows the secret")
    end
  end)
end)

describe("a runs.jsonl line", function()
  -- /proc/self/io counts this process's write system calls
  local function writes() return H.proc_count("io", "syscw") end

  it("goes out in one write, however long (lines of several processes cannot interleave)", function()
    if not writes() then
      pending("no /proc/self/io here")
      return
    end
    local dir = H.tmpname(".rec")
    assert(os.execute("mkdir -p " .. H.q(dir)))
    finally(function() os.execute("rm -rf " .. H.q(dir)) end)
    local warned = {}
    local e = { cfg = { record = dir, session_id = "s" }, chat_url = "http://127.0.0.1:1/v1/chat/completions",
      model = function() return "m" end, last = {}, log = function(_, lvl, msg) warned[#warned + 1] = lvl .. msg end }
    local answer = ("é"):rep(20000) -- 40 KB: many stdio buffers
    local out = { acc = { final = { type = "done", finish_reason = "stop" }, think_bytes = 0 }, answer = answer }
    local before = writes()
    record.log_turn(e, out, { { role = "user", content = "long" } })
    local after = writes()
    assert.same({}, warned)
    assert.equal(1, after - before)
    local text = H.read_file(dir .. "/runs.jsonl")
    assert.equal("\n", text:sub(-1))
    assert.equal(answer, json.decode(text:sub(1, -2)).answer)
  end)
end)

describe("what counts as a credential", function()
  local core = require "mirza.core"
  -- Names the C core's URL rule (redact_url: response heads in
  -- recordings, URL query parameters, the plain-http warning) and
  -- mirza.core.is_secret (mirza.record's request headers) must judge
  -- alike: one list, in C.
  local NAMES = { "Authorization", "Proxy-Authorization", "authorization", "AUTHORIZATION", "WWW-Authenticate",
    "X-Api-Key", "api-key", "api_key", "apikey", "key", "Cookie", "Set-Cookie", "set-cookie", "X-Auth-Token",
    "token", "access_token", "refresh_token", "X-Session-Token", "client_secret", "X-Client-Secret", "password",
    "X-Password", "passwd", "db_passwd", "PassWd", "Monkey", "Content-Type", "Accept", "Host", "X-Request-Id",
    "X-MTPLX-Session-Id", "session", "User-Agent", "Retry-After", "x", "pass", "secre", "tok", "ke", "auth",
    "author", "cookies", "cooki" }

  local function c_says(name)
    local url = "http://h/p?" .. name .. "=v"
    local shown = mirza.redact_url(url)
    assert.truthy(shown == url or shown == "http://h/p?" .. name .. "=[redacted]", shown)
    return shown ~= url
  end

  it("is the same for the C core's URLs and mirza.record's headers, name by name", function()
    local differ = {}
    for _, name in ipairs(NAMES) do
      if c_says(name) ~= core.is_secret(name) then
        differ[#differ + 1] = ("%s (C %s, Lua %s)"):format(name, c_says(name), core.is_secret(name))
      end
    end
    assert.same({}, differ)
    -- and the list is not trivially agreed: both kinds are in it
    local yes, no = 0, 0
    for _, name in ipairs(NAMES) do
      if core.is_secret(name) then yes = yes + 1 else no = no + 1 end
    end
    assert.is_true(yes >= 20 and no >= 10, yes .. " secret, " .. no .. " not")
    for _, name in ipairs { "Authorization", "Proxy-Authorization", "X-Api-Key", "api-key", "Cookie", "Set-Cookie",
      "passwd" } do
      assert.is_true(core.is_secret(name), name)
    end
    for _, name in ipairs { "Content-Type", "X-Request-Id", "X-MTPLX-Session-Id", "session" } do
      assert.is_false(core.is_secret(name), name)
    end
  end)
end)
