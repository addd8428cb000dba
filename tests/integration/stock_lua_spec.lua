-- mirza.so under the stock lua5.4 interpreter (issue 17, item 13): every
-- mirza.* module can be the first thing a fresh `lua5.4` requires (the
-- README's engine snippet starts with require "mirza.engine", the jobs with
-- require "mirza.batch" or "mirza.engine"), from the build tree's
-- build/lua/?.so alone, each in a process of its own; and in dev mode
-- (MIRZA_LUA_DIR) the first require reads the module from disk.
local H = require "tests.helper"

local q = H.q

local lua = H.stock_lua() -- under a sanitizer build, with the ASan runtime first

-- Run Lua code in a fresh stock lua5.4 whose only C path is build/lua/,
-- with the default Lua path (no source tree on it), from an empty
-- directory. Returns stdout, stderr, exit code.
-- `script` runs a file instead of code.
local function stock(code, env, script)
  local dir = H.tmpname(".cwd")
  os.execute("mkdir -p " .. q(dir))
  local src, err = script or H.tmpname(".lua"), H.tmpname(".err")
  if not script then
    local f = assert(io.open(src, "w"))
    f:write(code)
    f:close()
  end
  local p = assert(io.popen(("cd %s && LUA_CPATH=%s LUA_PATH=';;' MIRZA_LUA_DIR= %s %s %s </dev/null 2>%s")
    :format(q(dir), q(H.build .. "/lua/?.so"), env or "", lua, q(src), q(err))))
  local out = p:read("a")
  local _, _, rc = p:close()
  local e = H.read_file(err)
  if not script then os.remove(src) end
  os.remove(err)
  os.execute("rm -rf " .. q(dir))
  return out, e, rc
end

-- Every module of the library: lua/mirza/*.lua (not the LuaCATS files)
-- and the C core.
local function modules()
  local list = { "mirza.core" }
  local p = assert(io.popen("ls " .. q(H.source .. "/lua/mirza")))
  for file in p:lines() do
    local name = file:match("^([%w_]+)%.lua$")
    if name and not name:find("^_meta") then
      list[#list + 1] = name == "init" and "mirza" or "mirza." .. name
    end
  end
  p:close()
  table.sort(list)
  return list
end

describe("stock lua5.4, build tree", function()
  it("lists the library's modules", function()
    local list = modules()
    assert.is_true(#list > 10)
    assert.truthy(table.concat(list, " "):find("mirza.engine", 1, true))
  end)

  for _, name in ipairs(modules()) do
    it(("require %q first, in a fresh process"):format(name), function()
      local out, err, rc = stock(([[
local m = require %q
io.write(type(m), " ", package.loaded[%q] == m and "loaded" or "not loaded")]]):format(name, name))
      assert.equal(0, rc, err)
      assert.truthy(out:match("^%a+ loaded$"), out)
    end)
  end

  it("the README's require lines work as the first statements", function()
    local readme = H.read_file(H.source .. "/README.md")
    local names, seen = {}, {}
    for block in readme:gmatch("```lua\n(.-)```") do
      for name in block:gmatch("require%s*%(?%s*[\"']([%w%.]+)[\"']") do
        if not seen[name] then names[#names + 1], seen[name] = name, true end
      end
    end
    assert.truthy(seen["mirza.engine"], "the README's engine snippet requires mirza.engine")
    for _, name in ipairs(names) do
      local out, err, rc = stock(("io.write(type(require %q))"):format(name))
      assert.equal(0, rc, name .. ": " .. err)
      assert.equal("table", out, name)
    end
  end)

  it("an engine made by require('mirza.engine') first says a turn from the simulator", function()
    local sim = H.start_sim { "--tok-rate", "0", "--ttft-ms", "0" }
    finally(sim.stop)
    local out, err, rc = stock(([[
local e = require("mirza.engine").new { base_url = %q, daemon = false, config_file = false }
local parts = {}
local stats = assert(e:say("hello", { mode = "whole", answer = function(t) parts[#parts + 1] = t end }))
e:close()
io.write(table.concat(parts), "|", stats.tokens > 0 and "tokens" or "none")]]):format(sim.base .. "/v1"))
    assert.equal(0, rc, err)
    assert.truthy(out:find("|tokens$"), out)
  end)

  it("the batch job runs under lua5.4 (its first line requires mirza.batch)", function()
    local out, err, rc = stock(nil, nil, H.source .. "/scripts/batch.lua")
    assert.is_not.equal(0, rc)
    assert.equal("", out)
    assert.truthy(err:find("usage: mirza scripts/batch.lua", 1, true), err)
    assert.falsy(err:find("not found", 1, true), err)
  end)

  it("MIRZA_LUA_DIR: require 'mirza.engine' first reads the engine from that directory", function()
    local dir = H.tmpname(".lua.d")
    os.execute(("mkdir -p %s && cp -r %s/lua/mirza %s/"):format(q(dir), q(H.source), q(dir)))
    finally(function() os.execute("rm -rf " .. q(dir)) end)
    local path = dir .. "/mirza/engine.lua"
    local text = H.read_file(path)
    local f = assert(io.open(path, "w"))
    f:write("_G.MIRZA_DEV_MARK = 'disk'\n", text)
    f:close()
    local out, err, rc = stock("require 'mirza.engine' io.write(tostring(_G.MIRZA_DEV_MARK))",
      "MIRZA_LUA_DIR=" .. q(dir))
    assert.equal(0, rc, err)
    assert.equal("disk", out)
  end)
end)

-- `cmake --install` of this build into a throw-away prefix (a copy of
-- files: quick): the Lua sources a user copies for --lua-dir, and the docs
-- laid out as in the tree so the README's links resolve.
describe("cmake --install", function()
  local prefix
  setup(function()
    prefix = H.tmpname(".prefix")
    local p = assert(io.popen(("cmake --install %s --prefix %s 2>&1"):format(q(H.build), q(prefix))))
    local out = p:read("a")
    assert(p:close(), out)
  end)
  teardown(function() os.execute("rm -rf " .. q(prefix)) end)

  it("puts the Lua sources in share/mirza/lua/mirza/, the same files as lua/mirza/", function()
    local p = assert(io.popen("ls " .. q(H.source .. "/lua/mirza")))
    local n = 0
    for file in p:lines() do
      local installed = io.open(prefix .. "/share/mirza/lua/mirza/" .. file)
      assert.is_not_nil(installed, "share/mirza/lua/mirza/" .. file .. " is not installed")
      local text = installed:read("a")
      installed:close()
      assert.is_true(text == H.read_file(H.source .. "/lua/mirza/" .. file), file .. " differs")
      n = n + 1
    end
    p:close()
    assert.is_true(n > 10)
  end)

  it("a copy of share/mirza/lua runs with the installed mirza --lua-dir", function()
    local copy = H.tmpname(".lua.d")
    os.execute(("cp -r %s %s"):format(q(prefix .. "/share/mirza/lua"), q(copy)))
    finally(function() os.execute("rm -rf " .. q(copy)) end)
    local path = copy .. "/mirza/engine.lua"
    local text = H.read_file(path)
    local f = assert(io.open(path, "w"))
    f:write("_G.MIRZA_DEV_MARK = 'copy'\n", text)
    f:close()
    local p = assert(io.popen(("MIRZA_LUA_DIR= %s --lua-dir %s -e %s 2>&1"):format(q(prefix .. "/bin/mirza"), q(copy),
      q("require 'mirza.engine' io.write(tostring(_G.MIRZA_DEV_MARK))"))))
    local out = p:read("a")
    p:close()
    assert.equal("copy", out)
  end)

  it("the installed README and docs link only to installed files", function()
    local docdir = prefix .. "/share/doc/mirza"
    local p = assert(io.popen("cd " .. q(docdir) .. " && find . -name '*.md'"))
    local checked = 0
    for md in p:lines() do
      local dir = md:match("^(.*)/[^/]*$")
      for target in H.read_file(docdir .. "/" .. md):gmatch("%]%(([^)#]+)[^)]*%)") do
        if not target:find("^%a+:") then
          local f = io.open(docdir .. "/" .. dir .. "/" .. target)
          assert.is_not_nil(f, md .. " links " .. target .. ", which is not installed")
          f:close()
          checked = checked + 1
        end
      end
    end
    p:close()
    assert.is_true(checked > 3, "links checked: " .. checked)
  end)
end)
