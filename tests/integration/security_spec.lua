-- Security properties, each checked against the real thing: daemons are
-- spawned without a shell (the argv a child receives, read back from
-- /proc/<pid>/cmdline); an API key never shows in error messages, tracebacks,
-- logs or a daemon's log tail; https verifies certificates (a real TLS peer,
-- `openssl s_server` with a self-signed certificate on 127.0.0.1) and there
-- is no option to turn that off; mirza-sim and the daemon presets bind
-- loopback unless told otherwise (read back from /proc/net/tcp).
local mirza = require "mirza"
local H = require "tests.helper"

local FAST = { "--tok-rate", "0", "--ttft-ms", "0" }

-- A key nobody could mistake for anything else.
local KEY = ("sk-mirza-secret-%d-%d"):format(H.self_pid(), os.time())

local function hides_key(text, what)
  assert.is_string(text, what)
  assert.is_nil(text:find(KEY, 1, true), what .. " shows the API key: " .. text)
  assert.is_nil(text:find(KEY:sub(1, 20), 1, true), what .. " shows part of the API key: " .. text)
end

-- The argv of a live process, from /proc/<pid>/cmdline; nil where there is
-- no /proc (macOS: ps joins the arguments), said on stderr: the daemon's
-- answer (the model id it serves) still shows what arrived.
local function cmdline(pid)
  local argv, why = H.argv(pid)
  if not argv then io.stderr:write("security_spec: the argv of a daemon is not checked: ", why, "\n") end
  return argv
end

local function value_after(argv, flag)
  for i, a in ipairs(argv) do
    if a == flag then return argv[i + 1], i + 1 end
  end
end

local function mkdir_tmp()
  local dir = H.tmpname(".d")
  assert(os.execute("mkdir " .. H.q(dir)))
  return dir
end

local function ls(dir)
  local names = H.listing(dir)
  table.sort(names)
  return names
end

-- Shell syntax that would create a file in the daemon's cwd if any shell
-- ever saw it; no '/' so it can be a file's base name.
local EVIL = [[my model 'single' "double"; touch pwned-semi; $(touch pwned-subst) `touch pwned-tick` ]]
  .. [[| touch pwned-pipe && touch pwned-and %1 {port} * ~]]

describe("daemon argv never goes through a shell", function()
  after_each(function() collectgarbage("collect") end)

  it("passes a model path with spaces, quotes and ; as one argument, verbatim", function()
    local dir = mkdir_tmp()
    local model = dir .. "/" .. EVIL .. ".gguf"
    local d <close> = mirza.daemon { preset = "mirza-sim", port = H.free_port(), model = model, cwd = dir,
      args = FAST, deadline = 60, grace = 2, progress = false }
    assert.equal(EVIL, d.model_id)
    assert.is_true(d:start())
    local argv = cmdline(d.pid)
    if argv then
      assert.equal(EVIL, (value_after(argv, "--model-id")))
      assert.same(d.argv, argv)
    end
    -- the daemon serves the id as given: it arrived whole
    local body = assert(mirza.request { url = d.base_url .. "/models", timeout = 5, deadline = 10 })
    assert.equal(EVIL, mirza.json.decode(body).data[1].id)
    d:stop()
    assert.same({}, ls(dir)) -- nothing was executed in the daemon's cwd
    os.remove(dir)
  end)

  it("substitutes {model} into a custom argv as one element, not re-expanded", function()
    local dir = mkdir_tmp()
    local model = dir .. "/sub dir; ls/" .. EVIL
    local d <close> = mirza.daemon { preset = "custom", port = H.free_port(), model = model, model_id = model,
      cwd = dir, deadline = 60, grace = 2, progress = false,
      argv = { H.sim_bin, "--host", "{host}", "--port", "{port}", "--model-id", "{model}", "--tok-rate", "0" } }
    assert.is_true(d:start())
    local argv = cmdline(d.pid)
    if argv then
      assert.equal(9, #argv)
      local id, at = value_after(argv, "--model-id")
      assert.equal(model, id)
      assert.equal(7, at)
      assert.equal(tostring(d.port), (value_after(argv, "--port")))
    else -- the id it serves: what arrived as --model-id
      local body = assert(mirza.request { url = d.base_url .. "/models", timeout = 5, deadline = 10 })
      assert.equal(model, mirza.json.decode(body).data[1].id)
    end
    d:stop()
    assert.same({}, ls(dir))
    os.remove(dir)
  end)
end)

describe("API keys never leak", function()
  local sim
  setup(function()
    sim = H.start_sim { "--tok-rate", "0", "--ttft-ms", "0", "--api-key", "the-right-key" }
  end)
  teardown(function() sim.stop() end)
  after_each(function() collectgarbage("collect") end)

  it("is sent (the server takes the right key) and absent from a 401 message", function()
    local body, msg = mirza.request { url = sim.base .. "/v1/models", api_key = "the-right-key", timeout = 5 }
    assert.is_string(body, msg)
    local s <close> = mirza.open { url = sim.url, body = H.chat_body("x"), api_key = KEY, stall_timeout = 10 }
    local r = H.drain(s)
    assert.equal("error", r.last.type)
    assert.equal("http", r.last.code)
    assert.equal(401, r.last.status)
    hides_key(r.last.message, "the 401 error event")
    local code
    body, msg, code = mirza.request { url = sim.base .. "/v1/models", api_key = KEY, timeout = 5 }
    assert.is_nil(body)
    assert.equal("http", code)
    hides_key(msg, "mirza.request's 401 message")
  end)

  it("is absent from transport errors", function()
    local port = H.free_port()
    local body, msg, code = mirza.request { url = ("http://127.0.0.1:%d/v1/models"):format(port), api_key = KEY,
      timeout = 2 }
    assert.is_nil(body)
    assert.equal("refused", code)
    hides_key(msg, "a refused request")
    local s <close> = mirza.open { url = ("http://127.0.0.1:%d/v1/chat/completions"):format(port),
      body = H.chat_body("x"), api_key = KEY, timeout = 2 }
    local r = H.drain(s)
    assert.equal("refused", r.last.code)
    hides_key(r.last.message, "a refused stream")
  end)

  it("with a line break (a key file's newline) is refused without showing it", function()
    local ok, err = pcall(mirza.open, { url = sim.url, api_key = KEY .. "\r\nX-Injected: 1" })
    assert.is_false(ok)
    assert.equal("mirza.open: 'api_key' contains a line break", err)
    ok, err = pcall(mirza.open, { url = sim.url, headers = { Authorization = "Bearer " .. KEY .. "\n" } })
    assert.is_false(ok)
    assert.equal("mirza.open: header 'Authorization' contains a line break", err)
    ok, err = pcall(mirza.open, { url = sim.url, headers = { "Authorization: Bearer " .. KEY .. "\n" } })
    assert.is_false(ok)
    assert.equal("mirza.open: header 'Authorization' contains a line break", err)
  end)

  it("is absent from a script's traceback and output (the mirza host)", function()
    local run = H.spawn_mirza(([[
      local mirza = require "mirza"
      local key = %q
      local s = mirza.open { url = %q, body = { stream = true }, api_key = key, stall_timeout = 10 }
      for ev in s:events() do
        if ev.type == "error" then print("event:", ev.message, ev.code) end
      end
      local ok, err = pcall(mirza.open, { url = %q, api_key = key, stall_timeout = "soon" })
      print("raised:", err)
      mirza.open { url = %q, api_key = key .. "\n" } -- raises: a traceback on stderr
    ]]):format(KEY, sim.url, sim.url, sim.url))
    assert.equal(1, run.wait(60))
    local out = run.output()
    assert.truthy(out:find("event:", 1, true), out)
    assert.truthy(out:find("raised:", 1, true), out)
    assert.truthy(out:find("stack traceback", 1, true), out)
    hides_key(out, "the script's output")
    os.remove(run.out)
  end)

  it("is absent from a daemon's failure message and log tail", function()
    -- the daemon wants another key: every health probe is a 401 until the deadline
    local d <close> = mirza.daemon { preset = "mirza-sim", port = H.free_port(), api_key = KEY,
      args = { "--api-key", "the-right-key" }, env = { OPENAI_API_KEY = KEY }, deadline = 1.5,
      poll_interval = 0.1, grace = 2, progress = false }
    local ok, msg, code = d:start()
    assert.is_nil(ok)
    assert.equal("timeout", code)
    assert.truthy(msg:find("HTTP 401", 1, true), msg)
    assert.truthy(msg:find("mirza-sim listening on", 1, true), msg) -- the log tail is in it
    hides_key(msg, "the daemon's failure message")
    hides_key(d:log_tail(100), "the daemon's log tail")
    hides_key(H.read_file(d.log_path), "the daemon's log file")
    d:stop()
  end)

  it("is absent from a daemon that cannot be spawned", function()
    local d <close> = mirza.daemon { preset = "mtplx", bin = "/nonexistent/mtplx", model = "/m", port = H.free_port(),
      api_key = KEY, env = { OPENAI_API_KEY = KEY }, deadline = 5, progress = false }
    local ok, msg = d:start()
    assert.is_nil(ok)
    hides_key(msg, "the spawn failure")
  end)
end)

describe("TLS verification", function()
  local dir, server, port

  setup(function()
    dir = mkdir_tmp()
    local cert, key = dir .. "/cert.pem", dir .. "/key.pem"
    assert(os.execute(("openssl req -x509 -newkey rsa:2048 -nodes -keyout %s -out %s -subj /CN=127.0.0.1 -days 2 "
      .. "-addext subjectAltName=IP:127.0.0.1 >/dev/null 2>&1"):format(H.q(key), H.q(cert))))
    server = assert(require("mirza.core").spawn { argv = { "openssl", "s_server", "-accept", "127.0.0.1:0",
      "-cert", cert, "-key", key, "-www" }, log = dir .. "/s_server.log", grace = 1 })
    port = H.wait_for(function()
      local f = io.open(dir .. "/s_server.log")
      local text = f and f:read("a") or ""
      if f then f:close() end
      return tonumber(text:match("ACCEPT 127%.0%.0%.1:(%d+)"))
    end, 20)
    assert(port, "openssl s_server did not start: " .. server:log_tail())
  end)
  teardown(function()
    server:close()
    os.execute("rm -rf " .. H.q(dir))
  end)
  after_each(function() collectgarbage("collect") end)

  it("refuses a self-signed certificate with a clear error", function()
    local body, msg, code = mirza.request { url = ("https://127.0.0.1:%d/"):format(port), timeout = 10, deadline = 20 }
    assert.is_nil(body)
    assert.is_string(code)
    assert.truthy(msg:lower():find("certificate", 1, true), msg)
    local s <close> = mirza.open { url = ("https://127.0.0.1:%d/v1/chat/completions"):format(port),
      body = H.chat_body("x"), api_key = KEY, timeout = 10, stall_timeout = 20 }
    local r = H.drain(s)
    assert.equal("error", r.last.type)
    assert.truthy(r.last.message:lower():find("certificate", 1, true), r.last.message)
    hides_key(r.last.message, "the TLS error")
  end)

  it("reaches the TLS peer at all (the refusal is about the certificate)", function()
    -- the same server answers a client that trusts the certificate
    local p = assert(io.popen(("printf 'GET / HTTP/1.0\\r\\n\\r\\n' | openssl s_client -quiet -verify_return_error "
      .. "-CAfile %s -connect 127.0.0.1:%d 2>&1"):format(H.q(dir .. "/cert.pem"), port)))
    local out = p:read("a")
    p:close()
    assert.truthy(out:find("HTTP/1.0 200 ok", 1, true), out)
  end)

  it("has no option to turn verification off", function()
    for _, k in ipairs { "insecure", "verify", "ssl_verify", "verify_peer", "tls_verify", "ca_file" } do
      local ok, err = pcall(mirza.open, { url = ("https://127.0.0.1:%d/"):format(port), [k] = false })
      assert.is_false(ok)
      assert.equal(("mirza.open: unknown option '%s'"):format(k), err)
    end
  end)
end)

describe("binding loopback", function()
  after_each(function() collectgarbage("collect") end)

  -- Local addresses (hex, as in /proc/net/tcp) listening on port: /proc/net,
  -- or lsof where there is no /proc.
  local function listening(port) return assert(H.listen_addrs(port)) end

  it("mirza-sim listens on 127.0.0.1 only by default", function()
    local sim = H.start_sim(FAST)
    assert.same({ "0100007F" }, listening(sim.port))
    sim.stop()
  end)

  it("mirza-sim binds the address it is told (127.0.0.2)", function()
    local sim = H.start_sim { "--host", "127.0.0.2", "--tok-rate", "0" }
    assert.same({ "0200007F" }, listening(sim.port))
    sim.stop()
  end)

  it("the daemon presets bind and probe 127.0.0.1 by default", function()
    local d <close> = mirza.daemon { preset = "mirza-sim", port = H.free_port(), args = FAST, deadline = 60,
      grace = 2, progress = false }
    assert.equal("127.0.0.1", d.host)
    assert.equal("http://127.0.0.1:" .. d.port, d.url)
    assert.is_true(d:start())
    local argv = cmdline(d.pid)
    if argv then assert.equal("127.0.0.1", (value_after(argv, "--host"))) end
    assert.same({ "0100007F" }, listening(d.port))
    d:stop()
  end)
end)

-- Issue 17: a URL's userinfo (http://user:pass@host) is a credential too:
-- every place the Lua side writes a URL shows it as [redacted]@ (batch
-- records, progress and summary lines, pool descriptions, engine errors
-- and log lines; recordings are record_spec's).
describe("credentials in a URL never leak", function()
  local PASS = "pw-" .. KEY
  local sim
  setup(function() sim = H.start_sim(FAST) end)
  teardown(function() sim.stop() end)
  after_each(function() collectgarbage("collect") end)

  local function userinfo_url(port) return ("http://alice:%s@127.0.0.1:%d/v1"):format(PASS, port) end

  -- Run the batch job on lines against one endpoint: stdout+stderr, the
  -- text of the output file and of the error file beside it, the exit code.
  local function batch(lines, endpoint, retries)
    local input, output = H.tmpname(".jsonl"), H.tmpname(".out.jsonl")
    local f = assert(io.open(input, "w"))
    for _, l in ipairs(lines) do f:write(mirza.json.encode(l), "\n") end
    f:close()
    local p = assert(io.popen(("MIRZA_CONFIG=/dev/null MIRZA_LUA_DIR= %s %s %s %s --endpoint %s --model m "
      .. "--max-retries %d --retry-base 0.05 --progress-every 0.05 2>&1 </dev/null"):format(H.q(H.mirza_bin),
      H.q(H.source .. "/scripts/batch.lua"), H.q(input), H.q(output), H.q(endpoint), retries or 0)))
    local out = p:read("a")
    local _, _, rc = p:close()
    local errors = require("mirza.batch_output").errors_path(output)
    local text = (io.open(output) and H.read_file(output) or "") .. (io.open(errors) and H.read_file(errors) or "")
    os.remove(input)
    os.remove(output)
    os.remove(errors)
    return out, text, rc
  end

  local function item(id, extra)
    local body = { messages = { { role = "user", content = "hi " .. id } }, mirza_sim = extra }
    return { custom_id = id, method = "POST", url = "/v1/chat/completions", body = body }
  end

  it("batch: the records' endpoint and errors, the progress and summary lines", function()
    local out, text, rc = batch({ item("good"), item("bad", { fault = "http=400:no such thing" }) },
      userinfo_url(sim.port))
    assert.equal(1, rc, out)
    hides_key(out, "the batch job's output")
    hides_key(text, "the batch records")
    local recs = {}
    for l in text:gmatch("[^\n]+") do
      local r = mirza.json.decode(l)
      recs[r.custom_id] = r
    end
    assert.equal(("http://[redacted]@127.0.0.1:%d/v1"):format(sim.port), recs.good.mirza.endpoint)
    assert.equal(("http://[redacted]@127.0.0.1:%d/v1"):format(sim.port), recs.bad.mirza.endpoint)
    assert.equal(400, recs.bad.response.status_code)
  end)

  it("batch: an unreachable endpoint's message", function()
    local out, text, rc = batch({ item("a") }, userinfo_url(H.free_port()), 100) -- retried until unreachable
    assert.is_not.equal(0, rc)
    hides_key(out, "the batch job's output")
    hides_key(text, "the batch records")
    assert.truthy(out:find("http://[redacted]@127.0.0.1:", 1, true), out)
  end)

  it("pool: describe and the why of unreachable()", function()
    local pool = require("mirza.pool").new({ userinfo_url(H.free_port()) }, { unreachable_after = 0 })
    local e = assert(pool:acquire(1))
    pool:report(e, { ok = false, code = "refused", message = "refused" })
    hides_key(pool:describe(), "pool:describe()")
    assert.truthy(pool:describe():find("[redacted]@", 1, true), pool:describe())
    local why = pool:unreachable()
    hides_key(why, "pool:unreachable()")
  end)

  it("chat: the greeting names the base URL redacted", function()
    local err = H.tmpname(".err")
    local p = assert(io.popen(("printf '/quit\\n' | MIRZA_CONFIG=/dev/null MIRZA_LUA_DIR= MIRZA_BASE_URL=%s "
      .. "MIRZA_MODEL=mirza-sim %s %s >/dev/null 2>%s"):format(H.q(userinfo_url(sim.port)), H.q(H.mirza_bin),
      H.q(H.source .. "/scripts/chat.lua"), H.q(err))))
    p:read("a")
    p:close()
    local text = H.read_file(err)
    os.remove(err)
    hides_key(text, "chat's stderr")
    assert.truthy(text:find(("chat: [^\n]* http://%%[redacted%%]@127%%.0%%.0%%.1:%d/v1 "):format(sim.port)), text)
  end)

  it("detect: nothing answers, no answer in time, still loading: the URL redacted", function()
    local detect = require "mirza.detect"
    local function redacted(msg, what)
      hides_key(msg, what)
      assert.truthy(msg:find("http://[redacted]@127.0.0.1:", 1, true), msg)
    end
    local found, msg, code = detect.detect(userinfo_url(H.free_port()))
    assert.same({ "refused" }, { code, found })
    redacted(msg, "detect's refused message")
    -- a stopped process: the kernel takes the connection, nobody answers
    local mute = H.start_sim(FAST)
    finally(function()
      os.execute("kill -CONT " .. mute.pid)
      mute.stop()
    end)
    assert(os.execute("kill -STOP " .. mute.pid))
    found, msg, code = detect.detect(userinfo_url(mute.port), { deadline = 0.3 })
    assert.is_nil(found)
    assert.equal("timeout", code, msg)
    redacted(msg, "detect's no-answer message")
    assert.truthy(msg:find("does not answer", 1, true), msg)
    local loading = H.start_sim { "--health-delay-ms", "60000" }
    finally(loading.stop)
    local lines = {}
    found, msg, code = detect.detect(userinfo_url(loading.port), { wait = 0.3, poll_interval = 0.05,
      progress = function(_, w) lines[#lines + 1] = w.url end })
    assert.is_nil(found)
    assert.equal("timeout", code, msg)
    redacted(msg, "detect's still-loading message")
    assert.truthy(#lines > 0)
    for _, l in ipairs(lines) do redacted(l, "the waiting line's URL") end
  end)

  it("engine: a failed turn's message and log lines, a bad base_url's error", function()
    local logged = {}
    local e = require("mirza.engine").new { base_url = userinfo_url(H.free_port()), model = "m", daemon = false,
      config_file = false, connect_timeout = 2, log = function(_, msg) logged[#logged + 1] = msg end }
    local st, msg = e:say("hi", { answer = function() end })
    e:close()
    assert.is_nil(st)
    hides_key(msg, "the failed turn's message")
    for _, m in ipairs(logged) do hides_key(m, "a log line") end
    local ok, err = pcall(require("mirza.engine").new, { base_url = "ftp://alice:" .. PASS .. "@example.invalid/v1",
      config_file = false })
    assert.is_false(ok)
    hides_key(err, "the base_url error")
    assert.truthy(err:find("[redacted]@", 1, true), err)
  end)
end)
