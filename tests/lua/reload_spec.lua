-- mirza.reload: validate-then-swap of modules on disk, broken edits kept out.
local reload = require "mirza.reload"
local H = require "tests.helper"

local function write(path, text)
  local f = assert(io.open(path, "w"))
  f:write(text)
  f:close()
end

describe("mirza.reload", function()
  local dir, path, name
  before_each(function()
    dir = H.tmpname(".d")
    os.execute("mkdir -p " .. H.q(dir))
    name = "reload_probe_" .. tostring(math.random(1e9))
    path = dir .. "/" .. name .. ".lua"
    write(path, "return { version = 1 }")
    package.loaded[name] = dofile(path)
  end)
  after_each(function()
    os.execute("rm -rf " .. H.q(dir))
    package.loaded[name] = nil
  end)

  it("swaps in a changed file on check()", function()
    local w = reload.new()
    assert.is_true(reload.watch(w, name, path))
    assert.same({}, (reload.check(w)))
    write(path, "return { version = 2, extra = true }")
    local reloaded, failed = reload.check(w)
    assert.same({ name }, reloaded)
    assert.same({}, failed)
    assert.equal(2, package.loaded[name].version)
  end)

  it("keeps the old version when the new file has a syntax error", function()
    local errors = {}
    local w = reload.new { on_error = function(n, msg) errors[#errors + 1] = { n, msg } end }
    reload.watch(w, name, path)
    local old = package.loaded[name]
    write(path, "return { version = 2,,, }")
    local reloaded, failed = reload.check(w)
    assert.same({}, reloaded)
    assert.matches(name .. "%.lua:1:", failed[name])
    assert.equal(old, package.loaded[name])
    assert.equal(1, #errors)
  end)

  it("keeps the old version when the new file raises while loading", function()
    local w = reload.new()
    reload.watch(w, name, path)
    write(path, "local x = nil\nreturn { v = x.field }")
    local _, failed = reload.check(w)
    assert.matches(name .. "%.lua:2:", failed[name])
    assert.equal(1, package.loaded[name].version)
    -- fixing the file later picks it up
    write(path, "return { version = 3 }")
    assert.same({ name }, (reload.check(w)))
    assert.equal(3, package.loaded[name].version)
  end)

  it("refuses a module that returns nothing", function()
    local w = reload.new()
    reload.watch(w, name, path)
    local ok, err = reload.reload(w, name)
    assert.is_true(ok)
    write(path, "local x = 1")
    ok, err = reload.reload(w, name)
    assert.is_nil(ok)
    assert.matches("returned nothing", err)
  end)

  it("reports a missing file", function()
    local ok, err, code = reload.watch(reload.new(), "no.such.module.anywhere")
    assert.is_nil(ok)
    assert.equal("io", code)
    assert.matches("no file", err, 1, true)
  end)
end)
