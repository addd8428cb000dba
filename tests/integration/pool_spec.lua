-- Endpoint pools (mirza.pool) against several mirza-sim processes: the
-- least-loaded endpoint within each one's limit, a dead endpoint rested and
-- probed (not hammered), and an endpoint killed mid-batch whose requests
-- are retried on the others.
local mirza = require "mirza"
local loop = require "mirza.loop"
local pool = require "mirza.pool"
local batch = require "mirza.batch"
local json = mirza.json
local H = require "tests.helper"
local FAST = { "--tok-rate", "0", "--ttft-ms", "0" }

local function input_of(n, ctl)
  local path, lines = H.tmpname(".jsonl"), {}
  for i = 1, n do
    lines[i] = json.encode { custom_id = "q" .. i,
      body = { messages = { { role = "user", content = "question " .. i } }, mirza_sim = ctl } }
  end
  local f = assert(io.open(path, "wb"))
  f:write(table.concat(lines, "\n"), "\n")
  f:close()
  return path
end

local function records(path)
  local by, n = {}, 0
  for line in io.lines(path) do
    local r = assert(json.decode(line))
    assert(not by[r.custom_id], "duplicate " .. r.custom_id)
    by[r.custom_id], n = r, n + 1
  end
  return by, n
end

describe("mirza.pool", function()
  after_each(function() collectgarbage("collect") end)

  it("normalizes base URLs and adds up capacity", function()
    local p = pool.new({ "http://127.0.0.1:1", { url = "http://127.0.0.1:2/v1/", limit = 7 } }, { limit = 3 })
    assert.equal("http://127.0.0.1:1/v1", p.endpoints[1].base)
    assert.equal("http://127.0.0.1:2/v1", p.endpoints[2].base)
    assert.equal(10, p:capacity())
    assert.has_error(function() pool.new({}) end, "mirza.pool: at least one endpoint")
  end)

  -- A pool on a fake clock (no request is sent: the rules alone).
  local function fake(urls, opts)
    local clock = { t = 100 }
    opts = opts or {}
    opts.clock = function() return clock.t end
    return pool.new(urls, opts), clock
  end
  local R500 = { code = "http", status = 500, message = "HTTP 500: bad field" }

  it("rests an endpoint for its own failures, not for one request's HTTP 500 retried", function()
    local p = fake({ "http://127.0.0.1:1" }, { suspect_items = 3, rest = 1 })
    local e = p.endpoints[1]
    for _ = 1, 10 do -- one bad item, again and again: the others are not starved
      assert.equal(e, p:acquire(0))
      p:report(e, R500, "bad")
    end
    assert.same({ 0, 0, 0 }, { e.fails, e.failed, e.rest_until })
    p:report(p:acquire(0), R500, "bad2") -- a second item: still one request's fault, perhaps
    assert.equal(0, e.fails)
    p:report(p:acquire(0), R500, "bad3") -- a third different one in a row: the endpoint's
    assert.equal(1, e.fails)
    assert.is_true(e.rest_until >= 100.75 and e.rest_until <= 101.25, e.rest_until)
    assert.is_nil(p:acquire(0)) -- resting
  end)

  it("forgets an endpoint's HTTP 500s once a request succeeds there", function()
    local p = fake({ "http://127.0.0.1:1" }, { suspect_items = 2 })
    local e = p.endpoints[1]
    p:report(p:acquire(0), R500, "a")
    p:report(p:acquire(0), { ok = true }, "good")
    p:report(p:acquire(0), R500, "b") -- a and b are not in a row: a success came between
    assert.equal(0, e.fails)
    p:report(p:acquire(0), R500, "c")
    assert.equal(1, e.fails)
  end)

  it("rests at once for refused, cut, timeout and 502/503/504; never for a 4xx", function()
    for _, r in ipairs { { code = "refused" }, { code = "closed" }, { code = "timeout" }, { code = "exited" },
      { code = "http", status = 502 }, { code = "http", status = 503 }, { code = "http", status = 504 } } do
      local p = fake { "http://127.0.0.1:1" }
      p:report(p:acquire(0), r, "x")
      assert.equal(1, p.endpoints[1].fails, r.code .. tostring(r.status))
    end
    local p = fake { "http://127.0.0.1:1" }
    p:report(p:acquire(0), { code = "http", status = 400 }, "x")
    p:report(p:acquire(0), { code = "http", status = 404 }, "y")
    assert.equal(0, p.endpoints[1].fails)
    local retry = require "mirza.retry"
    assert.same({ "endpoint", "request", nil }, { retry.blame("http", 503), retry.blame("http", 500),
      retry.blame("http", 429) })
    assert.is_not_nil(retry.blame("http", 500)) -- an engine's turn still fails over on it
  end)

  it("sends a retry to another endpoint while one is healthy, waiting for its slot", function()
    local p, clock = fake({ "http://127.0.0.1:1", "http://127.0.0.1:2" }, { limit = 1, rest = 1 })
    local a, b = p.endpoints[1], p.endpoints[2]
    p:report(p:acquire(0), { code = "refused" }, "x") -- a: it took the first request
    clock.t = clock.t + 2 -- a's rest is over: it may be probed
    assert.equal(b, p:acquire(0, nil, { [a] = true })) -- the retry goes to b, not a's probe
    assert.is_nil(p:acquire(0, nil, { [a] = true })) -- b is full: the retry waits for it
    assert.equal(a, p:acquire(0)) -- a first attempt may probe a
    p:release(a, false, true) -- the probe failed
    p:report(b, { code = "refused" }, "y") -- now b is failing too
    clock.t = clock.t + 10
    assert.equal(a, p:acquire(0, nil, { [b] = true })) -- nothing healthy: a probe will do
    local one, c2 = fake({ "http://127.0.0.1:1" }, { rest = 1 })
    local e = one.endpoints[1]
    one:report(one:acquire(0), { code = "refused" }, "x")
    c2.t = c2.t + 2
    assert.equal(e, one:acquire(0, nil, { [e] = true })) -- no other: the one it failed on
  end)

  it("says when no endpoint ever answered and all refuse, and how long all have been down", function()
    local p, clock = fake({ "http://127.0.0.1:1", "http://127.0.0.1:2" }, { unreachable_after = 1 })
    local a, b = p.endpoints[1], p.endpoints[2]
    local refused = { code = "refused", message = "connection refused" }
    p:report(p:acquire(0), refused, "x")
    assert.is_nil(p:unreachable()) -- b untried
    assert.is_nil(p:down_for())
    assert.equal(b, p:acquire(0)) -- a rests
    p:report(b, refused, "y")
    assert.is_nil(p:unreachable()) -- not for long enough: a daemon may just be binding
    assert.equal(0, p:down_for())
    clock.t = clock.t + 1.5
    assert.equal("http://127.0.0.1:1/v1: connection refused; http://127.0.0.1:2/v1: connection refused",
      p:unreachable())
    assert.equal(1.5, (p:down_for()))
    assert.equal(a, p:acquire(0)) -- rests over: a probe
    p:report(a, { code = "http", status = 500, message = "boom" }, "z") -- it answered once: reachable
    assert.is_nil(p:unreachable())
    assert.is_nil(p:down_for()) -- and answering, so not down (one 500 may be the request's)
  end)

  it("spreads requests over the least loaded endpoints within their limits", function()
    local a = H.start_sim { "--parallel", "8", "--tok-rate", "100", "--ttft-ms", "20" }
    local b = H.start_sim { "--parallel", "8", "--tok-rate", "100", "--ttft-ms", "20" }
    local p = pool.new { { url = a.base, limit = 2 }, { url = b.base, limit = 3 } }
    local input, output = input_of(20, { answer_tokens = 10 }), H.tmpname(".jsonl")
    local st = assert(batch.run { input = input, output = output, pool = p, quiet = true, progress = false })
    assert.equal(0, st.errors)
    local _, n = records(output)
    assert.equal(20, n)
    assert.equal(2, p.endpoints[1].peak)
    assert.equal(3, p.endpoints[2].peak)
    assert.equal(20, p.endpoints[1].served + p.endpoints[2].served)
    assert.is_true(p.endpoints[1].served >= 4 and p.endpoints[2].served >= 6, p:describe())
    a.stop()
    b.stop()
    os.remove(input)
    os.remove(output)
  end)

  it("rests a dead endpoint with backoff and probes it instead of hammering it", function()
    local live = H.start_sim { "--parallel", "4", "--tok-rate", "0", "--ttft-ms", "30" }
    local dead = ("http://127.0.0.1:%d"):format(H.free_port())
    local p = pool.new({ dead, live.base }, { limit = 4, rest = 0.2 })
    local input, output = input_of(24, {}), H.tmpname(".jsonl")
    local st = assert(batch.run { input = input, output = output, pool = p, quiet = true, progress = false,
      retry_base = 0.01 })
    assert.equal(0, st.errors)
    assert.equal(24, select(2, records(output)))
    local d = p.endpoints[1]
    assert.equal(0, d.served)
    assert.is_true(d.failed >= 1 and d.failed <= 12, "dead endpoint tried " .. d.failed .. " times")
    assert.is_true(d.fails >= 1) -- still resting or probing
    live.stop()
    os.remove(input)
    os.remove(output)
  end)

  it("retries the requests of an endpoint killed mid-batch on the others", function()
    local a = H.start_sim { "--parallel", "4", "--tok-rate", "40", "--ttft-ms", "20" }
    local b = H.start_sim { "--parallel", "4", "--tok-rate", "40", "--ttft-ms", "20" }
    local p = pool.new({ a.base, b.base }, { limit = 4 })
    local input, output = input_of(24, { answer_tokens = 20 }), H.tmpname(".jsonl")
    local st, killed_inflight
    loop.run(function()
      local job = loop.spawn(function()
        st = assert(batch.run { input = input, output = output, pool = p, quiet = true, progress = false,
          retry_base = 0.05 })
      end)
      local ea = p.endpoints[1]
      local t_end = mirza.now() + 30
      while not (ea.served >= 1 and ea.inflight >= 2) and mirza.now() < t_end do mirza.sleep(0.01) end
      assert(ea.served >= 1 and ea.inflight >= 2, "endpoint a never got busy")
      killed_inflight = ea.inflight
      a.stop() -- SIGTERM: the simulator exits at once, its connections drop
      assert(job:join())
    end)
    assert.equal(0, st.errors)
    local by, n = records(output)
    assert.equal(24, n)
    local moved = 0
    for _, r in pairs(by) do
      assert.equal(json.null, r.error)
      if r.mirza.attempts > 1 then
        moved = moved + 1
        assert.equal(b.base .. "/v1", r.mirza.endpoint)
      end
    end
    assert.is_true(moved >= 1, ("%d retried, %d were in flight"):format(moved,
      killed_inflight))
    print(("\n  endpoint killed with %d in flight: %d items retried on the other, all 24 ok"):format(killed_inflight,
      moved))
    b.stop()
    os.remove(input)
    os.remove(output)
  end)

  -- an engine over a pool: which simulator answered, from its own counters
  local function served(p) return { p.endpoints[1].served, p.endpoints[2].served } end
  -- stop a simulator and wait until its port refuses (the kill is not waited for)
  local function kill(sim)
    sim.stop()
    assert(H.wait_for(function()
      local _, _, code = mirza.request { url = sim.base .. "/health", timeout = 1, deadline = 2 }
      return code == "refused"
    end, 10), "the simulator did not go away")
  end

  it("gives an engine several endpoints: it stays on one, fails over when it dies", function()
    local engine = require "mirza.engine"
    local a, b = H.start_sim(FAST), H.start_sim(FAST)
    finally(function() a.stop() b.stop() end)
    local e = engine.new { endpoints = { a.base, b.base }, config_file = false, log = function() end,
      model = "mirza-sim", body_extra = { mirza_sim = { text = "Un deux." } } }
    assert.is_nil(e.daemon) -- pooled endpoints are used as they are
    for _ = 1, 2 do
      local st, res = e:say("hello", { answer = function() end })
      assert(st, res)
      assert.equal("Un deux.", res.answer)
    end
    assert.same({ 2, 0 }, served(e.pool)) -- the second turn stayed where its session is
    kill(a)
    local st, res = e:say("again", { answer = function() end })
    assert(st, res)
    assert.equal("Un deux.", res.answer) -- no error: the request went to b
    assert.same({ 2, 1 }, served(e.pool))
    assert.equal(1, e.pool.endpoints[1].failed)
    assert.is_true(e.pool.endpoints[1].rest_until > mirza.now()) -- a rests
    assert.equal(b.base .. "/v1/chat/completions", e.chat_url)
    assert.equal(6, #e.history.messages) -- all three turns kept
    assert.same({ 0, 0 }, { e.pool.endpoints[1].inflight, e.pool.endpoints[2].inflight })
  end)

  it("an engine's turn rests an endpoint for its own failure (refused), not for one HTTP 500", function()
    local engine = require "mirza.engine"
    local bad, good = H.start_sim { "--tok-rate", "0", "--ttft-ms", "0", "--fault", "http=500:boom" }, H.start_sim(FAST)
    finally(function() bad.stop() good.stop() end)
    local PASS = "pw-not-for-logs"
    local function userinfo(base) return (base:gsub("^http://", "http://alice:" .. PASS .. "@")) end
    local logged = {}
    local function new_engine(endpoints)
      return engine.new { endpoints = endpoints, config_file = false, model = "mirza-sim", connect_timeout = 2,
        log = function(_, msg) logged[#logged + 1] = msg end, body_extra = { mirza_sim = { text = "Un deux." } } }
    end
    -- a 500 on the first endpoint: the turn goes on to the other, the first is not rested
    local e = new_engine { userinfo(bad.base), userinfo(good.base) }
    local st, res = e:say("hello", { answer = function() end })
    assert(st, res)
    assert.equal("Un deux.", res.answer)
    local a = e.pool.endpoints[1]
    assert.same({ 0, 1, 0 }, { a.failed, e.pool.endpoints[2].served, a.inflight })
    assert.is_false(a.rest_until > mirza.now(), "an endpoint rested for one turn's HTTP 500")
    assert.truthy(#logged > 0)
    for _, m in ipairs(logged) do
      assert.is_nil(m:find(PASS, 1, true), m)
      assert.truthy(m:find("http://[redacted]@127.0.0.1:", 1, true), m)
    end
    -- alone in its pool, the 500 ends the turn: still not rested
    local lone = new_engine { bad.base }
    local ok, msg, code = lone:say("hello", { answer = function() end })
    assert.is_nil(ok)
    assert.equal("http", code, msg)
    assert.same({ 0, 0 }, { lone.pool.endpoints[1].failed, lone.pool.endpoints[1].inflight })
    assert.is_false(lone.pool.endpoints[1].rest_until > mirza.now(), "rested for one HTTP 500")
    -- refused: the endpoint's own failure rests it
    local gone = new_engine { ("http://127.0.0.1:%d"):format(H.free_port()) }
    ok, msg, code = gone:say("hello", { answer = function() end })
    assert.is_nil(ok)
    assert.equal("refused", code, msg)
    assert.equal(1, gone.pool.endpoints[1].failed)
    assert.is_true(gone.pool.endpoints[1].rest_until > mirza.now(), "a refused endpoint not rested")
  end)

  it("sends engines sharing a pool and a long system prompt where that prompt went last", function()
    local engine = require "mirza.engine"
    local a, b = H.start_sim(FAST), H.start_sim(FAST)
    finally(function() a.stop() b.stop() end)
    local p = pool.new({ a.base, b.base }, { limit = 2 })
    local system = ("You extract invoices. Answer with the fields asked for, nothing else. "):rep(30)
    local function new_engine(prompt)
      local e = engine.new { pool = p, config_file = false, log = function() end, model = "mirza-sim",
        body_extra = { mirza_sim = { text = "Un deux." } } }
      require("mirza.prompt").set_system(e.history, prompt) -- as e:load(prompt) does, without its prefill
      return e
    end
    -- one after the other, each endpoint always has room: without affinity
    -- the least loaded (ties: the one that served fewer) alternates a, b, a, b
    for i = 1, 4 do
      local st, res = new_engine(system):say("question " .. i, { answer = function() end })
      assert(st, res)
    end
    assert.same({ 4, 0 }, served(p))
    -- another prompt has no home yet: it goes to the least loaded, and stays
    for i = 1, 2 do
      assert(new_engine(("Another system prompt, about receipts. "):rep(30)):say("q" .. i, { answer = function() end }))
    end
    assert.same({ 4, 2 }, served(p))
  end)

  it("spreads engines sharing a pool over its endpoints and reports when all are down", function()
    local engine = require "mirza.engine"
    local a, b = H.start_sim(FAST), H.start_sim(FAST)
    local p = pool.new({ a.base, b.base }, { limit = 1 })
    local function new_engine()
      return engine.new { pool = p, config_file = false, log = function() end, model = "mirza-sim",
        body_extra = { mirza_sim = { text = "Trois quatre cinq six sept.", tok_rate = 50 } } }
    end
    local e1, e2 = new_engine(), new_engine()
    assert.are_not.equal(e1.cfg.session_id, e2.cfg.session_id)
    local answers = {}
    loop.run(function()
      local t1 = loop.spawn(function() return select(2, assert(e1:say("x", { answer = function() end }))).answer end)
      local t2 = loop.spawn(function() return select(2, assert(e2:say("y", { answer = function() end }))).answer end)
      local ok1, a1 = t1:join()
      local ok2, a2 = t2:join()
      answers = { ok1 and a1, ok2 and a2 }
    end)
    assert.same({ "Trois quatre cinq six sept.", "Trois quatre cinq six sept." }, answers)
    assert.same({ 1, 1 }, served(p)) -- one each: both endpoints had one slot
    assert.same({ 1, 1 }, { p.endpoints[1].peak, p.endpoints[2].peak })
    kill(a)
    kill(b)
    local st, msg, code = e1:say("z", { answer = function() end })
    assert.is_nil(st)
    -- refused, or closed when an idle kept-alive connection to it was reused
    assert.is_true(code == "refused" or code == "closed", code .. ": " .. msg)
    assert.same({ 1, 1 }, { p.endpoints[1].failed, p.endpoints[2].failed }) -- each tried once
  end)
end)
