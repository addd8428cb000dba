-- What a batch stopped before its end gives back (issue 19 item 8): a
-- batch cancelled from Lua, one past its batch_deadline and one
-- interrupted (SIGINT in a script calling mirza.batch.run) keep every
-- record they wrote whole, give their pool's slots back, say what they
-- left (join's outcome, the stats' `left`, the error raised), and a rerun
-- on the same OUTPUT does exactly the items left: none twice, none lost,
-- the records already there untouched.
local mirza = require "mirza"
local loop = require "mirza.loop"
local pool = require "mirza.pool"
local batch = require "mirza.batch"
local batch_input = require "mirza.batch_input"
local json = mirza.json
local H = require "tests.helper"

local N = 12

local function write_input(n)
  local path, lines = H.tmpname(".jsonl"), {}
  for i = 1, n do
    lines[i] = json.encode { custom_id = "c" .. i, body = { messages = { { role = "user", content = "q" .. i } } } }
  end
  local f = assert(io.open(path, "wb"))
  f:write(table.concat(lines, "\n"), "\n")
  f:close()
  return path
end

-- The records of an output file: a list of custom_ids in file order, and
-- the text. Every line must be a whole record, the last one ending in \n.
local function records(path)
  local f = io.open(path, "rb")
  if not f then return {}, "" end
  local text = f:read("a")
  f:close()
  assert(text == "" or text:sub(-1) == "\n", "the last record has no newline")
  local ids, seen = {}, {}
  for line in text:gmatch("([^\n]*)\n") do
    local r = assert(json.decode(line), "not a whole record: " .. line)
    assert(not seen[r.custom_id], "duplicate " .. tostring(r.custom_id))
    assert.equal(json.null, r.error, line)
    seen[r.custom_id] = true
    ids[#ids + 1] = r.custom_id
  end
  return ids, text
end

local function n_records(path)
  local f = io.open(path, "rb")
  local n = f and select(2, f:read("a"):gsub("\n", "")) or 0
  if f then f:close() end
  return n
end

-- Whether this process has `path` open (a descriptor in /proc/PID/fd, or
-- lsof's list where there is no /proc).
local function open_here(path)
  return assert(H.open_paths(H.self_pid()))[path] == true
end

-- The rerun: it skips exactly what is there and does exactly the rest.
local function rerun_completes(input, output, sim, before)
  local ids0, text0 = records(output)
  assert.equal(before, #ids0)
  local st = assert(batch.run { input = input, output = output, endpoints = { sim.base }, model = "m", quiet = true,
    progress = false })
  assert.same({ before, N - before, 0 }, { st.skipped, st.done_now, st.errors })
  local ids, text = records(output)
  assert.equal(N, #ids)
  assert.equal(text0, text:sub(1, #text0)) -- the records already there are untouched
  local all = {}
  for _, id in ipairs(ids) do all[id] = true end
  for i = 1, N do assert.is_true(all["c" .. i], "c" .. i .. " lost") end
end

describe("a batch stopped before its end", function()
  local sim
  setup(function()
    sim = H.start_sim { "--parallel", "4", "--tok-rate", "40", "--ttft-ms", "0", "--answer-tokens", "6" }
  end)
  teardown(function() sim.stop() end)
  after_each(function() collectgarbage("collect") end)

  it("cancelled from Lua: join says cancelled, records whole, the pool's slots back, a rerun does the rest", function()
    local input, output = write_input(N), H.tmpname(".jsonl")
    local p = pool.new({ sim.base }, { limit = 2 })
    local outcome, written, inflight, still_open
    collectgarbage("stop") -- a collection would close a file left open
    loop.run(function()
      local job = loop.spawn(batch.run, { input = input, output = output, pool = p, model = "m", quiet = true,
        progress = false })
      assert(H.wait_for(function() return n_records(output) >= 2 end, 30, 0.005), "no record came")
      assert.equal(2, p.endpoints[1].inflight) -- both workers in an attempt
      job:cancel()
      still_open = open_here(output)
      outcome = { job:join() }
      inflight, written = p.endpoints[1].inflight, H.read_file(output)
      mirza.sleep(0.3) -- another item would finish meanwhile, were one still running
    end)
    collectgarbage("restart")
    assert.same({ nil, "cancelled", "cancelled" }, outcome)
    assert.is_false(still_open, "OUTPUT left open by the cancelled batch")
    assert.equal(0, inflight) -- the attempts cut short gave their slots back
    assert.equal(0, mirza.streams())
    assert.equal(written, H.read_file(output))
    local n = #records(output)
    assert.is_true(n >= 2 and n < N, n)
    -- the same pool again: all its slots are there
    local st = assert(batch.run { input = input, output = output, pool = p, model = "m", quiet = true,
      progress = false, batch_deadline = 30 })
    assert.same({ n, N - n, 2 }, { st.skipped, st.done_now, p.endpoints[1].peak })
    assert.equal(N, #records(output))
    os.remove(input)
    os.remove(output)
  end)

  it("past its batch_deadline: the stats count what is left, after what an earlier run saved", function()
    local input, output = write_input(N), H.tmpname(".jsonl")
    -- a first run saves a few (cancelled), a second stops at its deadline
    loop.run(function()
      local job = loop.spawn(batch.run, { input = input, output = output, endpoints = { sim.base }, limit = 2,
        model = "m", quiet = true, progress = false })
      assert(H.wait_for(function() return n_records(output) >= 2 end, 30, 0.005), "no record came")
      job:cancel()
    end)
    local first = #records(output)
    local st = assert(batch.run { input = input, output = output, endpoints = { sim.base }, limit = 1, model = "m",
      quiet = true, progress = false, batch_deadline = 0.4,
      body = { mirza_sim = { tok_rate = 20 } } }) -- ~0.3 s an item: one or two fit
    local second = #records(output)
    assert.is_true(st.deadline)
    assert.same({ N, first, second - first, N - second }, { st.total, st.skipped, st.done_now, st.left })
    assert.is_true(st.left > 0, "the deadline left nothing")
    assert.truthy(batch.summary(st):find((", deadline reached: %d left"):format(N - second), 1, true),
      batch.summary(st))
    rerun_completes(input, output, sim, second)
    os.remove(input)
    os.remove(output)
  end)

  it("interrupted (SIGINT) in a script calling mirza.batch.run: it raises 'interrupted', says how many are saved",
    function()
      local input, output = write_input(N), H.tmpname(".jsonl")
      local items = assert(batch_input.read_input(input))
      assert(batch.run { items = { items[1], items[2] }, output = output, endpoints = { sim.base }, model = "m",
        quiet = true, progress = false }) -- an earlier run saved two: the interrupted one skips them
      local runner = H.spawn_mirza(([[
        local batch = require "mirza.batch"
        local ok, err = pcall(batch.run, { input = %q, output = %q, endpoints = { %q }, limit = 2, model = "m",
          progress = false, resume_command = "again" })
        print("returned", ok, err)
      ]]):format(input, output, sim.base))
      assert(H.wait_for(function() return n_records(output) >= 4 end, 30, 0.005), "no record: " .. runner.output())
      runner.signal("INT")
      assert.equal(130, runner.wait(30), runner.output()) -- the host still exits as interrupted
      local text = runner.output()
      local saved, left = text:match("batch: interrupted: (%d+) of 12 items saved in [^\n]*, (%d+) left; to resume,"
        .. " run: again\n")
      assert.truthy(saved, text)
      saved = tonumber(saved)
      assert.equal(N, saved + tonumber(left))
      assert.truthy(text:find("returned\tfalse\t[^\n]*interrupted", 1), text)
      rerun_completes(input, output, sim, saved)
      assert.is_true(saved >= 4 and saved < N, saved)
      os.remove(input)
      os.remove(output)
    end)
end)
