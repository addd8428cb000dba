-- A batch over a pool gives up on what is dead, not on what is alive
-- (issue 17): a dead endpoint stops the run within seconds, every
-- endpoint down mid-run is said on the progress line and stops the run
-- after --give-up-after, one item's HTTP 500s never rest the endpoint the
-- good items need, a retry goes to the healthy endpoint (no item lost to
-- a dead pool member), and the model is asked from /v1/models.
local mirza = require "mirza"
local loop = require "mirza.loop"
local pool = require "mirza.pool"
local batch = require "mirza.batch"
local batch_output = require "mirza.batch_output"
local json = mirza.json
local H = require "tests.helper"

local function write_items(ids, ctl_of)
  local path, lines = H.tmpname(".jsonl"), {}
  for i, id in ipairs(ids) do
    lines[i] = json.encode { custom_id = id,
      body = { messages = { { role = "user", content = "question " .. id } }, mirza_sim = ctl_of(id) } }
  end
  local f = assert(io.open(path, "wb"))
  f:write(table.concat(lines, "\n"), "\n")
  f:close()
  return path
end

local function ids(prefix, n)
  local t = {}
  for i = 1, n do t[i] = prefix .. i end
  return t
end

-- Records of an output file by custom_id (raises on a duplicate); none when it does not exist.
local function records(path)
  local by, n = {}, 0
  local f = io.open(path)
  if not f then return by, 0 end
  for line in f:lines() do
    local r = assert(json.decode(line))
    assert(not by[r.custom_id], "duplicate " .. r.custom_id)
    by[r.custom_id], n = r, n + 1
  end
  f:close()
  return by, n
end

-- The records of a run by custom_id and how many in all (both files: H.batch_records).
local function all_records(output)
  local by, n, nbad = H.batch_records(output)
  return by, n + nbad
end

-- Run scripts/batch.lua in its own process; its exit code, output and wall time.
local function cli(args, timeout)
  local quoted = {}
  for i, a in ipairs(args) do quoted[i] = ("%q"):format(a) end
  local t0 = mirza.now()
  local script = H.source .. "/scripts/batch.lua"
  local run = H.spawn_mirza(("arg = { [0] = %q, %s }\ndofile(%q)\n"):format(script, table.concat(quoted, ", "),
    script))
  local rc = run.wait(timeout or 60)
  if not rc then run.signal("KILL") end
  return rc, run.output(), mirza.now() - t0
end

local FAST = { tok_rate = 0, ttft_ms = 0, answer_tokens = 4 }

describe("batch over a dead endpoint", function()
  after_each(function() collectgarbage("collect") end)

  it("stops within seconds with exit 1 and 'no endpoint reachable' when none ever answered", function()
    local dead = ("http://127.0.0.1:%d/v1"):format(H.free_port())
    local input, output = write_items(ids("d", 2), function() return FAST end), H.tmpname(".jsonl")
    local rc, out, dt = cli({ input, output, "--endpoint", dead }, 20)
    print(("\n  dead endpoint: exit %s after %.2f s"):format(rc, dt))
    assert.equal(1, rc, out)
    assert.truthy(out:find("batch: no endpoint reachable: " .. dead, 1, true), out)
    assert.truthy(out:find("start the daemon or correct the endpoint URL", 1, true), out)
    assert.is_true(dt < 10, ("took %.1f s"):format(dt))
    assert.equal(0, select(2, all_records(output))) -- nothing recorded: a rerun does them all
    os.remove(input)
    os.remove(output)
    os.remove(batch_output.errors_path(output))
  end)

  it("says so for a pool whose endpoints all refuse, naming each", function()
    local a, b = ("http://127.0.0.1:%d/v1"):format(H.free_port()), ("http://127.0.0.1:%d/v1"):format(H.free_port())
    local input, output = write_items(ids("d", 8), function() return FAST end), H.tmpname(".jsonl")
    local t0 = mirza.now()
    local st, msg, code = batch.run { input = input, output = output, endpoints = { a, b }, model = "m", quiet = true,
      progress = false, batch_deadline = 20 } -- bounded, were it never to give up
    local dt = mirza.now() - t0
    assert.is_nil(st)
    assert.equal("unreachable", code)
    assert.truthy(msg:find("no endpoint reachable: ", 1, true), msg)
    assert.truthy(msg:find(a, 1, true) and msg:find(b, 1, true), msg)
    assert.is_true(dt < 10, ("took %.1f s"):format(dt))
    assert.equal(0, select(2, all_records(output)))
    os.remove(input)
    os.remove(output)
    os.remove(batch_output.errors_path(output))
  end)

  it("says on the progress line that every endpoint is down and gives up after give_up_after", function()
    local sim = H.start_sim { "--parallel", "4" }
    finally(function() sim.stop() end)
    local n = 30
    local ctl = { tok_rate = 50, ttft_ms = 0, answer_tokens = 5 }
    local input, output = write_items(ids("m", n), function() return ctl end), H.tmpname(".jsonl")
    local lines, st, msg, code, t_down = {}, nil, nil, nil, nil
    loop.run(function()
      local job = loop.spawn(function()
        st, msg, code = batch.run { input = input, output = output, endpoints = { sim.base }, limit = 2,
          give_up_after = 1.5, retry_base = 0.05, batch_deadline = 30, quiet = true, progress = true, log = function(l)
            if l ~= "" then lines[#lines + 1] = l end
          end }
      end)
      assert(H.wait_for(function() return select(2, records(output)) >= 2 end, 30, 0.01), "no record came")
      sim.stop()
      t_down = mirza.now()
      assert(job:join())
    end)
    local dt = mirza.now() - t_down
    assert.is_nil(st)
    assert.equal("down", code)
    local _, done = all_records(output) -- left: recorded in neither file
    assert.is_true(done >= 2 and done < n)
    assert.truthy(msg:find("^every endpoint down for %d+s %(" .. sim.base:gsub("%p", "%%%0") .. "/v1"), msg)
    assert.truthy(msg:find(("%d of %d items left for a rerun: run the same command again once a daemon answers")
      :format(n - done, n), 1, true), msg)
    assert.is_true(dt < 15, ("gave up %.1f s after the endpoint went down"):format(dt))
    local said
    for _, l in ipairs(lines) do said = said or l:match("; every endpoint down for %d+s, giving up in %d+s$") end
    assert.truthy(said, "no progress line said so:\n" .. table.concat(lines, "\n"))
    os.remove(input)
    os.remove(output)
    os.remove(batch_output.errors_path(output))
  end)
end)

describe("batch with a few items that always fail", function()
  after_each(function() collectgarbage("collect") end)

  it("does not rest the endpoint for one item's HTTP 500s: the good items keep their speed", function()
    local sim = H.start_sim { "--parallel", "4" }
    finally(function() sim.stop() end)
    local good_ctl = function() return { tok_rate = 100, ttft_ms = 0, answer_tokens = 20 } end
    local good = write_items(ids("g", 20), good_ctl)
    local all_ids = ids("g", 20)
    for i = 1, 3 do table.insert(all_ids, 1, "bad" .. i) end -- first: they take 3 of the 4 workers
    local mixed = write_items(all_ids, function(id)
      if id:find("^bad") then return { fault = "http=500:bad field" } end
      return good_ctl()
    end)
    -- time until the 20 good records are written
    local function time_good(input, p)
      local output, t_good = H.tmpname(".jsonl"), nil
      loop.run(function()
        local t0 = mirza.now()
        local job = loop.spawn(function()
          return assert(batch.run { input = input, output = output, pool = p, model = "m", max_retries = 4,
            quiet = true, progress = false }) -- the default backoff: 0.5 s, doubling

        end)
        local function goods()
          local n = 0
          for id in pairs((records(output))) do if id:find("^g") then n = n + 1 end end
          return n == 20
        end
        assert(H.wait_for(goods, 60, 0.005), "the good items did not finish")
        t_good = mirza.now() - t0
        assert(job:join())
      end)
      local by = all_records(output) -- the good in OUTPUT, the failing ones in the error file
      os.remove(output)
      os.remove(batch_output.errors_path(output))
      return t_good, by
    end
    local t_alone = time_good(good, pool.new({ sim.base }, { limit = 4 }))
    local p = pool.new({ sim.base }, { limit = 4 })
    local t_mixed, by = time_good(mixed, p)
    local ratio = t_mixed / t_alone
    print(("\n  20 good items: alone %.2f s, with 3 always failing %.2f s: x%.2f"):format(t_alone, t_mixed, ratio))
    local e = p.endpoints[1]
    assert.equal(0, e.failed, p:describe()) -- never rested
    assert.equal(0, e.fails)
    for i = 1, 20 do
      assert.equal(json.null, by["g" .. i].error)
      assert.equal(1, by["g" .. i].mirza.attempts)
    end
    for i = 1, 3 do
      local r = by["bad" .. i]
      assert.equal(500, r.response.status_code)
      assert.equal("http", r.error.code)
      assert.equal(5, r.mirza.attempts) -- a 5xx is retried: max_retries 4, then recorded
    end
    -- the promise is 1.5x; the slack is for a loaded machine
    assert.is_true(ratio < 2, ("the good items took x%.2f their time alone"):format(ratio))
    os.remove(good)
    os.remove(mixed)
  end)
end)

describe("batch over a pool with a dead member", function()
  after_each(function() collectgarbage("collect") end)

  it("loses no item over 200 with max_retries 2: a retry goes to the healthy endpoint", function()
    local live = H.start_sim { "--parallel", "8" }
    finally(function() live.stop() end)
    local dead = ("http://127.0.0.1:%d"):format(H.free_port())
    -- short rests, and retries that come after them: the failed item would get the next probe
    local p = pool.new({ dead, live.base }, { limit = 4, rest = 0.02, rest_max = 0.05 })
    local ctl = { tok_rate = 0, ttft_ms = 10, answer_tokens = 4 }
    local input, output = write_items(ids("p", 200), function() return ctl end), H.tmpname(".jsonl")
    local st = assert(batch.run { input = input, output = output, pool = p, model = "m", max_retries = 2,
      retry_base = 0.1, quiet = true, progress = false })
    local by, n = all_records(output)
    assert.equal(200, n)
    local retried = 0
    for id, r in pairs(by) do
      assert.equal(json.null, r.error, id)
      assert.equal(live.base .. "/v1", r.mirza.endpoint)
      assert.is_true(r.mirza.attempts <= 2, id .. " took " .. r.mirza.attempts .. " attempts")
      if r.mirza.attempts > 1 then retried = retried + 1 end
    end
    print(("\n  200 items, one of two endpoints dead: %d probed it and were retried, none lost"):format(retried))
    assert.equal(0, st.errors)
    assert.is_true(p.endpoints[1].failed >= 1) -- it was probed, not forgotten
    os.remove(input)
    os.remove(output)
    os.remove(batch_output.errors_path(output))
  end)
end)

describe("batch model", function()
  after_each(function() collectgarbage("collect") end)

  it("asks /v1/models when no model is given; a line's own model and an explicit one win", function()
    local sim = H.start_sim { "--model-id", "served-model-7", "--parallel", "4", "--verbose" }
    finally(function() sim.stop() end)
    local input = H.tmpname(".jsonl")
    local f = assert(io.open(input, "wb"))
    local plain = { messages = { { role = "user", content = "x" } }, mirza_sim = FAST }
    local own = { model = "own", messages = { { role = "user", content = "y" } }, mirza_sim = FAST }
    f:write(json.encode { custom_id = "b", body = own }, "\n")
    for _, id in ipairs { "a", "c", "d", "e", "f" } do f:write(json.encode { custom_id = id, body = plain }, "\n") end
    f:close()
    local output = H.tmpname(".jsonl")
    -- four workers from the start (a limit found as the run goes starts at one)
    assert(batch.run { input = input, output = output, endpoints = { sim.base }, limit = 4, quiet = true,
      progress = false })
    local by = records(output)
    -- the record says the model that answered; mirza.model the one asked for, when another
    assert.same({ "served-model-7" }, { by.a.response.body.model, by.a.mirza.model })
    assert.same({ "served-model-7" }, { by.f.response.body.model, by.f.mirza.model })
    assert.same({ "served-model-7", "own" }, { by.b.response.body.model, by.b.mirza.model })
    -- asked once, though four workers started together
    assert.equal(1, select(2, H.read_file(sim.log):gsub("GET /v1/models", "")), H.read_file(sim.log))
    os.remove(output)
    assert(batch.run { input = input, output = output, endpoints = { sim.base }, model = "given", quiet = true,
      progress = false })
    by = records(output)
    assert.equal("given", by.a.mirza.model)
    assert.equal("own", by.b.mirza.model)
    os.remove(input)
    os.remove(output)
    os.remove(batch_output.errors_path(output))
  end)

  it("stops with a clear error when the endpoint answers but lists no model", function()
    local sim = H.start_sim {}
    finally(function() sim.stop() end)
    local input, output = write_items(ids("n", 3), function() return FAST end), H.tmpname(".jsonl")
    local base = sim.base .. "/v9" -- the simulator serves no /v9/models
    local rc, out = cli { input, output, "--endpoint", base }
    assert.equal(1, rc, out)
    assert.truthy(out:find("batch: cannot learn the model from " .. base .. "/models (", 1, true), out)
    assert.truthy(out:find("pass --model ID", 1, true), out)
    assert.equal(0, select(2, all_records(output)))
    os.remove(input)
    os.remove(output)
    os.remove(batch_output.errors_path(output))
  end)
end)
