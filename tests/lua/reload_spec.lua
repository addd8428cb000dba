-- mirza.reload: validate-then-swap of modules on disk, broken edits kept out.
local reload = require "mirza.reload"
local core = require "mirza.core"
local H = require "tests.helper"

local write = H.write_file

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
    assert.equal(path .. ":1: unexpected symbol near ','", failed[name])
    assert.equal(old, package.loaded[name])
    assert.same({ { name, failed[name] } }, errors)
    -- the broken version is not retried until the file changes again
    assert.same({}, (reload.check(w)))
    assert.equal(1, #errors)
  end)

  it("keeps the old version when the new file raises while loading", function()
    local w = reload.new()
    reload.watch(w, name, path)
    write(path, "local x = nil\nreturn { v = x.field }")
    local _, failed = reload.check(w)
    -- one line naming file:line, no traceback
    assert.equal(path .. ":2: attempt to index a nil value (local 'x')", failed[name])
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
    assert.is_true(ok, err)
    write(path, "local x = 1")
    local code
    ok, err, code = reload.reload(w, name)
    assert.is_nil(ok)
    assert.equal(path .. ": module returned nothing", err)
    assert.equal("reload", code)
    assert.equal(1, package.loaded[name].version) -- the old version stays
  end)

  it("watch loads the file at once: used before its first change", function()
    write(path, "return { version = 5 }")
    local w = reload.new()
    assert.equal(1, package.loaded[name].version)
    assert.is_true(reload.watch(w, name, path))
    assert.equal(5, package.loaded[name].version)
    assert.same({}, (reload.check(w))) -- nothing changed since
  end)

  it("a file broken at watch time is reported, the current version stays, a fix is picked up", function()
    local errors = {}
    local w = reload.new { on_error = function(n, msg) errors[#errors + 1] = { n, msg } end }
    write(path, "return {,}")
    local ok, err, code = reload.watch(w, name, path)
    assert.is_nil(ok)
    assert.equal(path .. ":1: unexpected symbol near ','", err)
    assert.equal("reload", code)
    assert.same({ { name, err } }, errors)
    assert.equal(1, package.loaded[name].version)
    write(path, "return { version = 7 }")
    assert.same({ name }, (reload.check(w)))
    assert.equal(7, package.loaded[name].version)
  end)

  it("versions: the installed one, the last that worked, the original; those that raised left out", function()
    local w = reload.new()
    local v1 = package.loaded[name]
    assert.same({ v1 }, (reload.versions(w, name))) -- not watched: just the installed one
    write(path, "return { version = 2 }")
    reload.watch(w, name, path)
    local v2 = package.loaded[name]
    local vs, base = reload.versions(w, name)
    assert.equal(v1, base)
    assert.same({ v2, v1 }, vs)
    reload.worked(w, name, v2)
    write(path, "return { version = 33 }")
    reload.check(w)
    local v3 = package.loaded[name]
    assert.same({ v3, v2, v1 }, (reload.versions(w, name)))
    assert.is_true(reload.failed(w, v3, "boom"))
    assert.is_false(reload.failed(w, v3, "boom")) -- reported once
    assert.same({ v2, v1 }, (reload.versions(w, name)))
    -- the next edit is a new version, in use again
    write(path, "return { version = 444 }")
    reload.check(w)
    assert.same({ package.loaded[name], v2, v1 }, (reload.versions(w, name)))
  end)

  it("load = false: a module not loaded yet has as original the version require loads first", function()
    package.loaded[name] = nil
    local w = reload.new()
    assert.is_true(reload.watch(w, name, path, { load = false }))
    assert.is_nil(package.loaded[name]) -- not loaded by watch
    package.path = dir .. "/?.lua;" .. package.path
    finally(function() package.path = package.path:sub(#dir + 8) end)
    local v = require(name)
    local vs, base = reload.versions(w, name)
    assert.equal(v, base)
    assert.same({ v }, vs)
  end)

  it("reports a missing file", function()
    local ok, err, code = reload.watch(reload.new(), "no.such.module.anywhere")
    assert.is_nil(ok)
    assert.equal("io", code)
    assert.matches("no file '[^']*no/such/module/anywhere%.lua'", err)
  end)

  it("notices an edit that keeps the mtime but changes the size", function()
    local w = reload.new()
    reload.watch(w, name, path)
    local mtime = core.stat(path)
    write(path, "return { version = 22 }") -- one byte longer
    -- put the old mtime back (as a coarse-mtime filesystem or a fast editor would leave it)
    assert.is_true(H.set_mtime(path, mtime))
    assert.equal(mtime, (core.stat(path)))
    assert.same({ name }, (reload.check(w)))
    assert.equal(22, package.loaded[name].version)
  end)

  it("mirza.core.stat gives the mtime and the exact size, or nil, message, 'io'", function()
    write(path, "return 123456789\n")
    assert.is_true(H.set_mtime(path, 1700000000.25))
    local mtime, size = core.stat(path)
    assert.equal(1700000000.25, mtime)
    assert.equal(17, size)
    local m, msg, code = core.stat(dir .. "/missing.lua")
    assert.is_nil(m)
    assert.equal(dir .. "/missing.lua: No such file or directory", msg)
    assert.equal("io", code)
  end)
end)
