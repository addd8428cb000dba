-- The core's clocks and what its messages show: the default timeouts of
-- mirza.open/collect/request (and the engine's and batch's), every byte of
-- a slow response head counting as progress, and URLs with credentials
-- redacted in every message the C core makes.
local mirza = require "mirza"
local H = require "tests.helper"

describe("URL redaction (mirza.redact_url)", function()
  it("hides userinfo and credential-like query parameters, keeps the rest", function()
    assert.equal("http://[redacted]@h:1/x?api_key=[redacted]&a=1&Token=[redacted]#f",
      mirza.redact_url("http://u:p@h:1/x?api_key=S&a=1&Token=T#f"))
    assert.equal("https://[redacted]@c/v1?x&key=[redacted]&q=auth",
      mirza.redact_url("https://a@b@c/v1?x&key=k&q=auth"))
    assert.equal("[redacted]@host/p", mirza.redact_url("user:pw@host/p"))
    assert.equal("http://127.0.0.1:8080/v1/chat/completions?stream=1",
      mirza.redact_url("http://127.0.0.1:8080/v1/chat/completions?stream=1"))
    assert.equal("http://h/a@b", mirza.redact_url("http://h/a@b")) -- an @ in the path is no userinfo
    assert.equal(require("mirza.core").redact_url, mirza.redact_url)
  end)

  it("shows a refused URL redacted in the error message", function()
    local port = H.free_port()
    local url = ("http://alice:s3cr3t@127.0.0.1:%d/v1/chat/completions?api_key=K3Y&x=1"):format(port)
    local body, msg, code = mirza.request { url = url, timeout = 2 }
    assert.is_nil(body)
    assert.equal("refused", code)
    assert.matches(("http://[redacted]@127.0.0.1:%d/v1/chat/completions?api_key=[redacted]&x=1"):format(port),
      msg, 1, true)
    assert.is_nil(msg:find("s3cr3t", 1, true))
    assert.is_nil(msg:find("K3Y", 1, true))
  end)

  it("shows a redirect target redacted in the error message", function()
    local sim = H.start_sim { "--tok-rate", "0", "--ttft-ms", "0" }
    local ok, err = pcall(function()
      local res, msg, code = mirza.collect { url = sim.url, body = H.chat_body("r", { mirza_sim = {
        fault = "redirect=307:http://bob:hunter2@127.0.0.1:9/v1?token=T0K&x=1" } }) }
      assert.is_nil(res)
      assert.equal("http", code)
      assert.equal(sim.url .. ": HTTP 307 Temporary Redirect to "
        .. "http://[redacted]@127.0.0.1:9/v1?token=[redacted]&x=1 " ..
        "(redirects are not followed: use that url)", msg)
    end)
    sim.stop()
    assert(ok, err)
  end)
end)

describe("the stall clock against a slow head", function()
  local sim
  setup(function() sim = H.start_sim { "--tok-rate", "0", "--ttft-ms", "0" } end)
  teardown(function() sim.stop() end)

  local function ask(fault, opts)
    local req = { url = sim.url, body = H.chat_body("slow", { mirza_sim = { fault = fault, text = "Bien." } }) }
    for k, v in pairs(opts) do req[k] = v end
    local t0 = mirza.now()
    local s <close> = mirza.open(req)
    local r = H.drain(s, 30)
    return r, mirza.now() - t0
  end

  it("counts every byte of a head trickling in as progress (not only whole lines)", function()
    -- ~140 head bytes, one every 15 ms (~2 s); a line takes up to 0.5 s, the stall timeout is 0.25 s
    local r, took = ask("slow-head-bytes=15", { stall_timeout = 0.25 })
    assert.equal("done", r.last.type, r.last.message)
    assert.equal("Bien.", r.text)
    assert.is_true(took > 1.5, "the head came too fast to test anything: " .. took)
  end)

  it("times the whole head with header_timeout, however steadily it trickles", function()
    local r = ask("slow-head-bytes=15", { stall_timeout = 0.25, header_timeout = 1 })
    assert.equal("error", r.last.type)
    assert.equal("timeout", r.last.code)
    assert.matches("header timeout", r.last.message, 1, true)
  end)
end)

describe("default timeouts", function()
  local sim
  setup(function() sim = H.start_sim { "--tok-rate", "0", "--ttft-ms", "0" } end)
  teardown(function() sim.stop() end)

  local function req(fault, extra)
    local r = { url = sim.url, body = H.chat_body("d", { mirza_sim = { fault = fault, text = "Oui." } }) }
    for k, v in pairs(extra or {}) do r[k] = v end
    return r
  end

  -- Run fn with mirza.defaults[k] = v, restored whatever happens.
  local function with_default(k, v, fn)
    local old = mirza.defaults[k]
    mirza.defaults[k] = v
    local ok, err = pcall(fn)
    mirza.defaults[k] = old
    assert(ok, err)
  end

  it("are documented values: connect 10 s, response head 600 s, stall 120 s, no deadline", function()
    assert.same({ timeout = 10, header_timeout = 600, stall_timeout = 120 }, mirza.defaults)
    assert.equal(require("mirza.core").defaults, mirza.defaults)
    assert.equal(600, require("mirza.engine").defaults.header_timeout)
    assert.equal(120, require("mirza.engine").defaults.stall_timeout)
    assert.equal(600, require("mirza.batch").defaults.header_timeout)
    assert.equal(120, require("mirza.batch").defaults.stall_timeout)
  end)

  it("apply to open, collect and request without a clock option: a daemon that never answers is cut", function()
    with_default("header_timeout", 0.3, function()
      local t0 = mirza.now()
      local res, msg, code = mirza.collect(req("head-delay=5000"))
      assert.is_nil(res)
      assert.equal("timeout", code)
      assert.matches("(header timeout: the daemon may be busy or queueing; raise the `header_timeout` option, " ..
        "or false for none)", msg, 1, true)
      local body, msg2, code2 = mirza.request(req("head-delay=5000"))
      assert.is_nil(body)
      assert.equal("timeout", code2)
      assert.matches("header timeout", msg2, 1, true)
      assert.is_true(mirza.now() - t0 < 3, "the default clock did not run")
    end)
    with_default("stall_timeout", 0.3, function()
      local res, msg, code = mirza.collect(req("stall-after=2"))
      assert.is_nil(res)
      assert.equal("timeout", code)
      assert.matches("(stall timeout: raise the `stall_timeout` option, or false for none)", msg, 1, true)
    end)
  end)

  it("are turned off per request with false (and an explicit value wins)", function()
    with_default("header_timeout", 0.3, function()
      local res, msg = mirza.collect(req("head-delay=800", { header_timeout = false }))
      assert.truthy(res, msg)
      assert.equal("Oui.", res.text)
      res, msg = mirza.collect(req("head-delay=800", { header_timeout = 5 }))
      assert.truthy(res, msg)
    end)
    with_default("stall_timeout", 0.2, function()
      local res, msg = mirza.collect(req("stall-after=2:600", { stall_timeout = false }))
      assert.truthy(res, msg)
    end)
    local ok, err = pcall(mirza.open, req(nil, { stall_timeout = true }))
    assert.is_false(ok)
    assert.matches("mirza.open: 'stall_timeout' must be a non-negative number of seconds, or false for none", err, 1,
      true)
  end)

  it("name the clock that fired: the deadline", function()
    local res, msg, code = mirza.collect(req("stall-after=2:3000", { deadline = 0.3 }))
    assert.is_nil(res)
    assert.equal("timeout", code)
    assert.matches("(deadline: the whole request took longer than the `deadline` option; raise it, or false for none)",
      msg, 1, true)
  end)

  it("reach the engine's turns: header_timeout, false-able", function()
    local engine = require "mirza.engine"
    local e = engine.new { base_url = sim.base .. "/v1", daemon = false, config_file = false, header_timeout = 0.3 }
    local stats, msg, code = e:say("bonjour", { body_extra = { mirza_sim = { fault = "head-delay=5000" } } })
    assert.is_nil(stats)
    assert.equal("timeout", code)
    assert.matches("header timeout", msg, 1, true)
    e:close()
    e = engine.new { base_url = sim.base .. "/v1", daemon = false, config_file = false, header_timeout = false,
      stall_timeout = false }
    stats, msg = e:say("bonjour", { body_extra = { mirza_sim = { fault = "head-delay=500", text = "Oui." } } })
    assert.truthy(stats, msg)
    e:close()
  end)

  it("reach batch attempts: header_timeout", function()
    local input, output = H.tmpname(".jsonl"), H.tmpname(".jsonl")
    local f = assert(io.open(input, "wb"))
    f:write(mirza.json.encode { custom_id = "q", method = "POST", url = "/v1/chat/completions",
      body = { messages = { { role = "user", content = "q" } }, mirza_sim = { fault = "head-delay=5000" } } }, "\n")
    f:close()
    local t0 = mirza.now()
    local st = assert(require("mirza.batch").run { input = input, output = output, endpoints = { sim.base },
      header_timeout = 0.3, max_retries = 0, quiet = true, progress = false })
    assert.equal(1, st.errors)
    local errors = require("mirza.batch_output").errors_path(output)
    assert.matches("header timeout", H.read_file(errors), 1, true) -- a failure
    assert.is_true(mirza.now() - t0 < 4)
    os.remove(input)
    os.remove(output)
    os.remove(errors)
  end)
end)

describe("a credential over plain http to another machine", function()
  it("is decided from the URL: http (or no scheme) and a host that is not loopback", function()
    local remote = { "http://10.0.0.5:8080/v1", "HTTP://Example.com/v1", "gpu-box:8766/v1/chat/completions",
      "http://u:p@192.168.1.2/v1", "http://[2001:db8::1]:80/", "http://localhost.example.com/", "http://128.0.0.1/" }
    local here = { "https://example.com/v1", "http://127.0.0.1:8766/v1", "http://127.9.8.7/", "http://localhost:1/",
      "http://LOCALHOST./", "http://a.localhost:9/", "http://[::1]:8080/v1", "http://[::ffff:127.0.0.1]/",
      "http://u:p@127.0.0.1/", "localhost:8080/v1", "http://127.1/" }
    for _, u in ipairs(remote) do assert.is_true(mirza.plain_remote(u), u) end
    for _, u in ipairs(here) do assert.is_false(mirza.plain_remote(u), u) end
  end)

  it("warns once per state, through mirza.on_warning (no traffic: each stream is closed before any wait)", function()
    local said = {}
    local old = mirza.on_warning(function(m) said[#said + 1] = m end)
    local ok, err = pcall(function()
      local function try(opts) mirza.open(opts):close() end
      try { url = "http://127.0.0.1:9/v1/chat/completions", api_key = "sk-1" }
      try { url = "https://gpu.example:9/v1/chat/completions", api_key = "sk-1" }
      try { url = "http://gpu.example:9/v1/chat/completions" } -- no credential
      assert.same({}, said)
      try { url = "http://alice:pw@gpu.example:9/v1/chat/completions", headers = { Authorization = "Bearer sk-2" } }
      try { url = "http://gpu.example:9/v1/chat/completions", api_key = "sk-1" }
      assert.equal(1, #said)
      assert.matches("goes in clear over plain http to http://[redacted]@gpu.example:9/v1/chat/completions, " ..
        "which is not this machine: use an https:// URL", said[1], 1, true)
      assert.is_nil(said[1]:find("pw", 1, true))
    end)
    mirza.on_warning(old)
    assert(ok, err)
  end)

  it("goes to an engine's log (level warning) when it has one and no handler is set", function()
    local run = H.spawn_mirza [[
local mirza = require "mirza"
local engine = require "mirza.engine"
local logged = {}
local e = engine.new { base_url = "http://alice:pw@gpu.example:9/v1", api_key = "sk-1", model = "m",
  config_file = false, log = function(level, msg) logged[#logged + 1] = level .. ": " .. msg end }
local _, _, _, t = e:turn("hi")
t:close() -- before any wait: no traffic
mirza.open { url = "http://gpu.example:9/v1/chat/completions", api_key = "sk-1" }:close() -- said once
for _, l in ipairs(logged) do print("logged " .. l) end
print("handler " .. tostring(mirza.on_warning()))
]]
    assert.equal(0, run.wait(30), run.output())
    local out = run.output()
    local _, n = ("\n" .. out):gsub("\nlogged warning: a credential %(api_key or an Authorization%-like header%) "
      .. "goes in clear over plain http to http://%[redacted%]@gpu%.example:9/[%w/]+, which is not this " -- the probe's
      .. "machine", "")
    assert.equal(1, n, out)
    assert.is_nil(out:find("mirza: warning:", 1, true), out)
    assert.is_nil(out:find("pw", 1, true), out)
    assert.truthy(out:find("handler nil", 1, true), out) -- the engine's handler is not left behind
  end)

  it("goes to stderr by default, once", function()
    local run = H.spawn_mirza [[
local mirza = require "mirza"
for _ = 1, 2 do mirza.open { url = "http://gpu.example:9/v1/chat/completions", api_key = "sk-1" }:close() end
print("opened")
]]
    assert.equal(0, run.wait(30))
    local out = run.output()
    assert.matches("opened", out, 1, true)
    local _, n = out:gsub("mirza: warning: a credential %(api_key or an Authorization%-like header%) goes in clear", "")
    assert.equal(1, n, out)
  end)
end)
