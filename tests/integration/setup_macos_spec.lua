-- setup_macos_spec.lua - scripts/setup.sh takes macOS's path where uname
-- says Darwin (MIRZA_UNAME=Darwin stands for it here): Homebrew formulae
-- and LuaRocks rocks for the keg-only lua@5.4, never apt. brew, luarocks,
-- cmake, apt-get, dpkg-query and sudo are stand-ins first on PATH that log
-- their arguments, so nothing is installed or built (issue 40).
local H = require "tests.helper"

local q = H.q
local STUBS = { "brew", "luarocks", "cmake", "apt-get", "dpkg-query", "sudo" }

-- A fresh directory: bin/ with the stand-ins, brew's prefixes, the log.
local function stubs()
  local dir = H.tmpname(".setup")
  local s = { dir = dir, log = dir .. "/log", lua54 = dir .. "/opt/lua@5.4", prefix = dir .. "/brew" }
  assert(os.execute(("mkdir -p %s/bin %s/lib/pkgconfig %s/bin && : >%s"):format(q(dir), q(s.lua54), q(s.prefix),
    q(s.log))))
  -- brew: the prefixes asked for; nothing installed yet (an empty `brew list`)
  local brew = ([[
case "$1 ${2:-}" in
"--prefix lua@5.4") echo %s ;;
"--prefix readline") echo %s/opt/readline ;;
"--prefix ") echo %s ;;
esac]]):format(q(s.lua54), q(s.prefix), q(s.prefix))
  -- luarocks: no rock installed; `path` prints a path for busted's runner
  local luarocks = [[
case " $* " in
*" show "*) exit 1 ;;
*" path "*) echo "/rocks/?.lua" ;;
esac]]
  local extra = { brew = brew, luarocks = luarocks }
  for _, name in ipairs(STUBS) do
    local path = dir .. "/bin/" .. name
    H.write_file(path, ("#!/bin/sh\necho %s \"$*\" >>%s\n%s\n"):format(name, q(s.log), extra[name] or ""))
    assert(os.execute("chmod +x " .. q(path)))
  end
  -- scripts/setup.sh, as on a Mac; its exit code and stderr
  function s.run(args)
    local err = dir .. "/err"
    local cmd = ("cd %s && PATH=%s:\"$PATH\" MIRZA_UNAME=Darwin MIRZA_EXTRA_PACKAGES= PKG_CONFIG_PATH= %s sh "
      .. "scripts/setup.sh %s >/dev/null 2>%s"):format(q(H.source), q(dir .. "/bin"), H.timeout_prefix(60), args,
      q(err))
    local _, _, rc = os.execute(cmd)
    return rc, H.read_file(err) or ""
  end
  -- The logged calls of one stand-in, each its arguments as one string.
  function s.calls(name)
    local out = {}
    for line in (H.read_file(s.log) or ""):gmatch("[^\n]+") do
      local who, args = line:match("^(%S+) ?(.*)$")
      if who == name then out[#out + 1] = args end
    end
    return out
  end
  -- The words of the one `brew install` call, as a set.
  function s.installed()
    local set, n = {}, 0
    for _, args in ipairs(s.calls("brew")) do
      if args:match("^install ") then
        n = n + 1
        for w in args:gmatch("%S+") do set[w] = true end
      end
    end
    assert.equal(1, n, H.read_file(s.log))
    return set
  end
  return s
end

describe("scripts/setup.sh on macOS (MIRZA_UNAME=Darwin, stand-in brew)", function()
  local s
  before_each(function() s = stubs() end)
  after_each(function() os.execute("rm -rf " .. q(s.dir)) end)

  it("--packages: brew installs the formulae, LuaRocks the rocks for lua@5.4; no apt", function()
    local rc, err = s.run("--packages build-essential cmake pkg-config liblua5.4-dev lua5.4 "
      .. "libcurl4-openssl-dev libcjson-dev libcmocka-dev lua-busted procps lsof curl jq python3 valgrind "
      .. "openssl libreadline-dev")
    assert.equal(0, rc, err)
    local got = s.installed()
    for _, f in ipairs { "cmake", "pkgconf", "lua@5.4", "cjson", "cmocka", "luarocks", "jq", "readline" } do
      assert.is_true(got[f], "brew was not asked for " .. f .. ": " .. H.read_file(s.log))
    end
    -- what macOS or its Command Line Tools have, under Debian's names or their own
    for _, f in ipairs { "lsof", "procps", "curl", "libcurl4-openssl-dev", "python3", "valgrind", "openssl",
      "build-essential", "lua", "pkg-config", "lua5.4", "liblua5.4-dev" } do
      assert.is_nil(got[f], "brew was asked for " .. f .. ": " .. H.read_file(s.log))
    end
    assert.same({ "--lua-dir=" .. s.lua54 .. " show busted", "--lua-dir=" .. s.lua54 .. " install busted" },
      s.calls("luarocks"))
    assert.same({}, s.calls("apt-get"))
    assert.same({}, s.calls("dpkg-query"))
    assert.same({}, s.calls("sudo"))
    assert.same({}, s.calls("cmake")) -- --packages builds nothing
  end)

  it("the default run: its own package list, then CMake given the keg-only Lua, readline and busted's runner",
    function()
    local build = s.dir .. "/build"
    local rc, err = s.run(q(build) .. " -DX=1")
    assert.equal(0, rc, err)
    local got = s.installed()
    for _, f in ipairs { "cmake", "pkgconf", "lua@5.4", "cjson", "cmocka", "luarocks", "readline", "jq" } do
      assert.is_true(got[f], "brew was not asked for " .. f .. ": " .. H.read_file(s.log))
    end
    assert.is_nil(got.lsof)
    assert.same({}, s.calls("apt-get"))
    assert.same({}, s.calls("dpkg-query"))
    local cm = s.calls("cmake")
    assert.equal(2, #cm, H.read_file(s.log))
    local configure = ("-S . -B %s -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_PREFIX_PATH=%s;%s/opt/readline "
      .. "-DBUSTED=%s/busted-runner.lua -DX=1"):format(build, s.lua54, s.prefix, build)
    assert.equal(configure, cm[1])
    assert.matches("^%-%-build " .. build:gsub("%p", "%%%0") .. " %-j%d+$", cm[2])
    local runner = H.read_file(build .. "/busted-runner.lua") or ""
    assert.truthy(runner:find("package.path = [==[/rocks/?.lua]==]", 1, true), runner)
    assert.truthy(runner:find("require('busted.runner')", 1, true), runner)
  end)
end)
