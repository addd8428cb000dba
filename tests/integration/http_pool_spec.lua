-- llama-server's HTTP pool and mirza's connections to it (issue 41 items
-- 3 and 5). The sim's llama dialect serves connections with a fixed pool
-- of threads (--threads-http, default max(parallel + 4, cores - 1)), each
-- held by its connection for the connection's whole life, keep-alive
-- waits included (--keepalive-ms); /props says total_slots and /metrics
-- (--metrics) requests_processing and requests_deferred. The client never
-- keeps more connections to a server than requests in flight to it: a
-- finished request's connection carries the next one or, while a request
-- to that server that was already waiting for its head still waits (20 ms
-- later), is closed. Without that, 64
-- items @64 on -np 4 (8 threads) waited for the idle connections' keep-
-- alive timeouts, 8 at a time (35 s on a real llama-server after 7 s idle).
-- The bounds below are one keep-alive period: a request that waited for an
-- idle connection to time out takes at least that.
local mirza = require "mirza"
local json = mirza.json
local H = require "tests.helper"

local sims = {}
teardown(function() for _, s in pairs(sims) do s.stop() end end)

local function sim(args)
  local argv = { "--dialect", "llama", "--tok-rate", "0", "--ttft-ms", "0", "--answer-tokens", "8",
    "--reasoning-tokens", "0", "--quiet" }
  for _, a in ipairs(args) do argv[#argv + 1] = a end
  local s = H.start_sim(argv)
  sims[#sims + 1] = s
  return s
end

local function open(s, q) return mirza.open { url = s.url, body = H.chat_body(q), stall_timeout = 20 } end

local function get(s, path)
  local st <close> = mirza.open { url = s.base .. path, plain = true, timeout = 10 }
  local ev = st:next(10)
  assert(ev.type == "response", ev.message)
  return ev.body, ev.status, ev.headers
end

-- A gauge of the sim's /metrics.
local function gauge(s, name)
  local body = get(s, "/metrics")
  return tonumber(body:match("\nllamacpp:" .. name .. " (%S+)\n"))
end

-- Another process holds `n` connections to s idle (kept alive after a
-- request each) until it is stopped. Its streams are not closed at their
-- done event: one closed before libcurl read the end of its body closes
-- its connection.
local function holder(s, n)
  local run = H.spawn_mirza(([[
    local mirza = require "mirza"
    local t = {}
    for i = 1, %d do
      t[i] = mirza.open { url = %q, body = { model = "m", stream = true,
        messages = { { role = "user", content = "hold " .. i } } } }
    end
    for i = 1, #t do
      repeat local ev = t[i]:next(20); assert(ev and ev.type ~= "error") until ev.type == "done"
    end
    mirza.sleep(0.3) -- the streams stay open: libcurl reads their ends and keeps their connections
    print("held")
    io.stdout:flush()
    mirza.sleep(60)
  ]]):format(n, s.url))
  local stop, stopped = run.signal, false
  function run.stop()
    if stopped then return end
    stopped = true
    stop("TERM")
    run.wait(10)
  end
  finally(run.stop) -- a failing case does not leave it waiting out its sleep
  assert(run.expect("held", 20), run.output())
  return run
end

describe("mirza-sim's llama HTTP pool", function()
  it("serves a connection beyond --threads-http once one of the pool's connections closes", function()
    local s = sim { "--threads-http", "1", "--keepalive-ms", "60000" }
    local run = holder(s, 1)
    local st <close> = open(s, "waits for a thread")
    local t0 = mirza.now()
    local ev = st:next(0.5) -- the pool's one thread waits for the holder's next request
    assert.is_nil(ev, ev and (ev.type .. " " .. tostring(ev.message or ev.text) .. " " .. run.output()))
    assert.is_true(mirza.now() - t0 >= 0.45)
    run.stop()
    local r = H.drain(st, 10)
    assert.equal("done", r.last.type)
  end)

  it("closes a kept-alive connection after --keepalive-ms, freeing its thread", function()
    local s = sim { "--threads-http", "1", "--keepalive-ms", "300" }
    local run = holder(s, 1)
    local st <close> = open(s, "served after the holder's keep-alive")
    local r = H.drain(st, 10)
    assert.equal("done", r.last.type)
    run.stop()
  end)

  it("defaults to max(parallel + 4, cores - 1) threads: more connections wait, even for /health", function()
    local s = sim { "--parallel", "2", "--tok-rate", "5", "--answer-tokens", "1000" }
    local t = {}
    for i = 1, 6 do t[i] = open(s, "holds a thread " .. i) end -- 2 streaming, 4 waiting for a slot
    local p = assert(io.popen(H.source .. "/scripts/ncpu"))
    local cores = assert(tonumber(p:read("l")))
    p:close()
    local health <close> = mirza.open { url = s.base .. "/health", plain = true, timeout = 10 }
    local ev = health:next(0.5)
    if cores - 1 <= 6 then assert.is_nil(ev) end -- the pool is 6 threads: none for the seventh connection
    t[1]:close()
    ev = ev or health:next(10)
    assert.equal("response", ev.type)
    for i = 2, 6 do t[i]:close() end
  end)

  it("answers /props total_slots and /metrics requests_processing and requests_deferred", function()
    local s = sim { "--parallel", "2", "--metrics", "--tok-rate", "20", "--answer-tokens", "200" }
    local props = json.decode((get(s, "/props")))
    assert.equal(2, props.total_slots)
    assert.is_true(props.endpoint_metrics)
    local body, status, headers = get(s, "/metrics")
    assert.equal(200, status)
    assert.truthy(headers["content-type"]:match("^text/plain; version=0.0.4"))
    assert.truthy(body:match("# HELP llamacpp:requests_processing Number of requests processing.\n" ..
      "# TYPE llamacpp:requests_processing gauge\nllamacpp:requests_processing 0\n"))
    local t = {}
    for i = 1, 3 do t[i] = open(s, "busy " .. i) end
    assert.truthy(H.wait_for(function() return gauge(s, "requests_processing") == 2 end, 10))
    assert.truthy(H.wait_for(function() return gauge(s, "requests_deferred") == 1 end, 10))
    for i = 1, 3 do t[i]:close() end
    assert.truthy(H.wait_for(function() return gauge(s, "requests_processing") == 0 end, 10))
    local plain <close> = mirza.open { url = sim({}).base .. "/metrics", plain = true, timeout = 10 }
    local ev = plain:next(10) -- without --metrics, as llama-server
    assert.equal(501, ev.status)
  end)
end)

describe("connections to a server", function()
  it("carry the next request: a finished request's connection is reused", function()
    local s = sim { "--threads-http", "1", "--keepalive-ms", "5000" }
    local t0 = mirza.now()
    for i = 1, 3 do
      local st <close> = open(s, "in turn " .. i)
      assert.equal("done", H.drain(st, 10).last.type)
    end
    assert.is_true(mirza.now() - t0 < 4, "a request waited for a kept-alive connection of ours")
  end)

  it("are closed when idle while another request to the server waits", function()
    -- 2 threads, 1 slot: a is served, b holds the second thread waiting
    -- for the slot, c waits for a thread: a's connection must close
    local s = sim { "--threads-http", "2", "--parallel", "1", "--keepalive-ms", "4000" }
    local t0 = mirza.now()
    local t = {}
    for i = 1, 3 do t[i] = open(s, "queued " .. i) end
    for i = 1, 3 do assert.equal("done", H.drain(t[i], 20).last.type) end
    for i = 1, 3 do t[i]:close() end
    assert.is_true(mirza.now() - t0 < 3.5, "a request waited for an idle connection's keep-alive timeout")
  end)

  it("do not stall a batch of 64 items @64 on llama -np 4 with 8 threads", function()
    local s = sim { "--parallel", "4", "--threads-http", "8", "--keepalive-ms", "2500", "--tok-rate", "500",
      "--ttft-ms", "5" }
    local input, output = H.tmpname(".jsonl"), H.tmpname(".jsonl")
    local lines = {}
    for i = 1, 64 do
      lines[i] = json.encode { custom_id = "i" .. i, body = { max_tokens = 8,
        messages = { { role = "user", content = "item " .. i } } } }
    end
    H.write_file(input, table.concat(lines, "\n") .. "\n")
    local script = H.source .. "/scripts/batch.lua"
    local t0 = mirza.now()
    local run = H.spawn_mirza(("arg = { [0] = %q, %q, %q, '--endpoint', %q, '--model', 'm' }\ndofile(%q)\n")
      :format(script, input, output, s.base .. "@64", script))
    assert.equal(0, run.wait(60), run.output())
    local wall = mirza.now() - t0
    local by, n = H.batch_records(output)
    assert.equal(64, n)
    assert.truthy(by.i64)
    assert.is_true(wall < 2.5, ("64 items took %.1f s: requests waited for idle connections"):format(wall))
  end)
end)
