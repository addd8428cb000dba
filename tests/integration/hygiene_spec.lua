-- The suite cleans up after itself (issue 19): every `finally` a test
-- registers runs, a process a test forgot is stopped when its spec file
-- ends, and tests/leftovers.sh (the last ctest, hygiene.leftovers) names
-- and stops any process of the run still alive.
local H = require "tests.helper"

local alive = H.alive -- /proc/PID/stat, or ps -o stat=

describe("finally", function()
  local ran = {}

  it("registers several cleanups in one test", function()
    finally(function() ran[#ran + 1] = "first" end)
    finally(function() ran[#ran + 1] = "second" end)
    finally(function() ran[#ran + 1] = "third" end)
    assert.same({}, ran)
  end)

  it("ran every cleanup of the test before, the last registered first", function()
    assert.same({ "third", "second", "first" }, ran)
  end)

  it("H.run_cleanups runs them all even when some raise, then raises the first error", function()
    local order = {}
    local ok, err = pcall(H.run_cleanups, {
      function() order[#order + 1] = 1 end,
      function() error("cleanup two broke", 0) end,
      function() order[#order + 1] = 3 end,
      function() error("cleanup four broke", 0) end,
    })
    assert.is_false(ok)
    assert.equal("cleanup four broke", err)
    assert.same({ 3, 1 }, order)
  end)
end)

describe("processes the helpers start", function()
  it("are recorded, and H.kill_tracked stops one a test left running, naming it", function()
    local s = H.start_sim { "--model-id", "left-behind" }
    assert.is_true(alive(s.pid))
    local left = H.kill_tracked()
    assert.equal(1, #left, table.concat(left, "\n"))
    assert.truthy(left[1]:find(("pid %d (mirza-sim)"):format(s.pid), 1, true), left[1])
    assert.truthy(left[1]:find("left-behind", 1, true), left[1])
    assert.truthy(left[1]:find("H.kill_tracked stops one", 1, true), left[1])
    assert.is_false(alive(s.pid))
    s.pid = nil
    os.remove(s.log)
  end)

  it("a stopped sim is forgotten: nothing for H.kill_tracked", function()
    local s = H.start_sim {}
    s.stop()
    assert.same({}, H.kill_tracked())
  end)
end)

describe("tests/leftovers.sh", function()
  local script = H.source .. "/tests/leftovers.sh"
  local dir

  local function leftovers(mode)
    local out = H.tmpname(".out")
    local ok, _, rc = os.execute(("bash %s %s %s >%s 2>&1"):format(H.q(script), mode, H.q(dir), H.q(out)))
    local text = H.read_file(out)
    os.remove(out)
    return ok and 0 or rc, text
  end

  -- A process marked as started by a run in `dir` (the environment every test gets).
  local function marked(marker, name)
    local sh = assert(io.popen(("MIRZA_BUILD_DIR=%s MIRZA_TEST_NAME=%s sleep 120 >/dev/null 2>&1 & echo $!")
      :format(H.q(marker), H.q(name))))
    local pid = tonumber(sh:read("l"))
    sh:close()
    H.track(pid, "sleep")
    return pid
  end

  before_each(function()
    dir = H.tmpname(".build")
    assert(os.execute("mkdir -p " .. H.q(dir)))
  end)
  after_each(function()
    H.kill_tracked()
    os.execute("rm -rf " .. H.q(dir))
  end)

  it("passes when no process of the run is left", function()
    assert.equal(0, (leftovers("start")))
    local rc, out = leftovers("check")
    assert.equal(0, rc, out)
    assert.truthy(out:find("no process of this run is left", 1, true), out)
  end)

  it("fails naming a process of the run still alive and its test, and stops it; others are not its business",
    function()
      local before = marked(dir, "before.the_run") -- an earlier run's leftover
      assert.equal(0, (leftovers("start")))
      local pid = marked(dir, "integration.forgetful_spec")
      local other = marked(dir .. "-elsewhere", "integration.other_tree")
      local rc, out = leftovers("check")
      assert.equal(1, rc, out)
      assert.truthy(out:find(("pid %d, started by integration.forgetful_spec: sleep 120"):format(pid), 1, true), out)
      assert.falsy(out:find("before.the_run", 1, true), out)
      assert.falsy(out:find("other_tree", 1, true), out)
      assert.truthy(H.wait_for(function() return not alive(pid) end, 10), "the leftover was not stopped")
      assert.is_true(alive(before))
      assert.is_true(alive(other))
      rc, out = leftovers("check")
      assert.equal(0, rc, out)
    end)

  it("says how to run it when the run's start was not noted", function()
    local rc, out = leftovers("check")
    assert.equal(1, rc)
    assert.truthy(out:find("run the suite through ctest (hygiene.start runs first)", 1, true), out)
  end)
end)
