-- The `mirza` host as a user runs it: options, `arg`, stdin, exit codes,
-- errors on stderr; dev mode (--lua-dir, MIRZA_LUA_DIR); and mirza.so
-- loaded by the stock lua5.4 interpreter.
local mirza = require "mirza"
local H = require "tests.helper"

local q = H.q

-- Run a shell command line; returns stdout, stderr, exit code.
local function sh(cmd, stdin)
  local err, input = H.tmpname(".err"), nil
  if stdin then
    input = H.tmpname(".in")
    local f = assert(io.open(input, "w"))
    f:write(stdin)
    f:close()
    cmd = cmd .. " <" .. q(input)
  else
    cmd = cmd .. " </dev/null"
  end
  local p = assert(io.popen(cmd .. " 2>" .. q(err)))
  local out = p:read("a")
  local _, _, rc = p:close()
  local e = H.read_file(err)
  os.remove(err)
  if input then os.remove(input) end
  return out, e, rc
end

-- Run build/mirza with arguments (each quoted).
local function run(args, stdin, env)
  local argv = { env or "", q(H.mirza_bin) }
  for _, a in ipairs(args) do argv[#argv + 1] = q(a) end
  return sh(table.concat(argv, " "), stdin)
end

local write = H.write_file

describe("mirza command line", function()
  local dir
  before_each(function()
    dir = H.tmpname(".d")
    os.execute("mkdir -p " .. q(dir))
  end)
  after_each(function() os.execute("rm -rf " .. q(dir)) end)

  it("-v and --version print the version and exit 0", function()
    for _, opt in ipairs { "-v", "--version" } do
      local out, err, rc = run { opt }
      assert.equal(0, rc)
      assert.matches("^mirza 0%.1%.0 %(Lua 5%.4%.%d+, libcurl [%d.]+, cJSON [%d.]+%)\n$", out)
      assert.equal("0.1.0", mirza.version)
      assert.equal("", err)
    end
  end)

  it("-h prints the usage on stdout and exits 0", function()
    local out, _, rc = run { "-h" }
    assert.equal(0, rc)
    assert.matches("^usage: mirza %[options%] %[script|job %[args%]%]\n", out)
    assert.truthy(out:find("--lua-dir DIR", 1, true))
  end)

  it("-e runs code, in order, before the script", function()
    local script = dir .. "/s.lua"
    write(script, "print('script', X)")
    local out, err, rc = run { "-e", "X = 1", "-e", "X = X + 41 print('e', X)", script }
    assert.equal(0, rc, err)
    assert.equal("e\t42\nscript\t42\n", out)
  end)

  it("builds arg like lua: script at 0, its arguments at 1.., the interpreter below", function()
    local script = dir .. "/args.lua"
    write(script, "print(#arg, arg[0], arg[1], arg[2], select('#', ...), ...) print(arg[-1], arg[-2], arg[-3])")
    local out, err, rc = run { "-e", "", script, "a b", "c" }
    assert.equal(0, rc, err)
    assert.equal(("2\t%s\ta b\tc\t2\ta b\tc\n\t-e\t%s\n"):format(script, H.mirza_bin), out)
  end)

  it("'-' runs standard input with the arguments after it", function()
    local out, err, rc = run({ "-", "x", "y" }, "print(arg[0], ...)")
    assert.equal(0, rc, err)
    assert.equal("-\tx\ty\n", out)
  end)

  it("with no script and stdin not a terminal, runs stdin", function()
    local out, err, rc = run({}, "io.write(6 * 7)")
    assert.equal(0, rc, err)
    assert.equal("42", out)
  end)

  it("'--' stops option handling: a script named like an option runs", function()
    local script = dir .. "/-v"
    write(script, "print('not the version')")
    local out, err, rc = sh(("cd %s && %s -- -v"):format(q(dir), q(H.mirza_bin)))
    assert.equal(0, rc, err)
    assert.equal("not the version\n", out)
  end)

  it("-l NAME requires a library into the global NAME", function()
    write(dir .. "/mylib.lua", "return { answer = 42 }")
    local out, err, rc = sh(("cd %s && %s -l mylib -e 'print(mylib.answer)'"):format(q(dir), q(H.mirza_bin)))
    assert.equal(0, rc, err)
    assert.equal("42\n", out)
  end)

  it("finds modules next to the script, whatever the current directory", function()
    write(dir .. "/helper_mod.lua", "return 'found next to the script'")
    write(dir .. "/main.lua", "print((require 'helper_mod'))")
    local out, err, rc = sh(("cd / && %s %s"):format(q(H.mirza_bin), q(dir .. "/main.lua")))
    assert.equal(0, rc, err)
    assert.equal("found next to the script\n", out)
  end)

  it("an uncaught error exits 1 with the message and a traceback on stderr", function()
    local script = dir .. "/boom.lua"
    write(script, "local function f() error('boom') end\nf()\n")
    local out, err, rc = run { script }
    assert.equal(1, rc)
    assert.equal("", out)
    assert.equal(("mirza: %s:1: boom\n"):format(script), err:match("^[^\n]*\n"))
    assert.truthy(err:find("stack traceback:", 1, true), err)
    assert.truthy(err:find(script .. ":2: in main chunk", 1, true), err)
  end)

  it("an error object that is not a string is named", function()
    local _, err, rc = run { "-e", "error({})" }
    assert.equal(1, rc)
    assert.equal("mirza: (error object is a table value)\nstack traceback:\n", err:match("^[^\n]*\n[^\n]*\n"))
  end)

  it("an error in -e exits 1 and does not run the script", function()
    local script = dir .. "/never.lua"
    write(script, "print('ran')")
    local out, err, rc = run { "-e", "error('in e', 0)", script }
    assert.equal(1, rc)
    assert.equal("", out)
    assert.equal("mirza: in e\n", err:match("^[^\n]*\n"))
  end)

  it("a missing script exits 1 naming the file", function()
    local out, err, rc = run { dir .. "/nope.lua" }
    assert.equal(1, rc)
    assert.equal("", out)
    assert.equal(("mirza: cannot open %s/nope.lua: No such file or directory\n"):format(dir), err)
  end)

  it("a syntax error exits 1 with file and line", function()
    local script = dir .. "/bad.lua"
    write(script, "local x = \nprint(\n")
    local _, err, rc = run { script }
    assert.equal(1, rc)
    assert.matches("^mirza: " .. script:gsub("%p", "%%%0") .. ":3: unexpected symbol near <eof>\n", err)
  end)

  it("a script's os.exit code is the exit code", function()
    local _, _, rc = run { "-e", "os.exit(7)" }
    assert.equal(7, rc)
  end)

  it("usage errors exit 1 with the usage on stderr", function()
    local out, err, rc = run { "-e" }
    assert.equal(1, rc)
    assert.equal("", out)
    assert.matches("^mirza: '%-e' needs an argument\nusage: mirza", err)
    out, err, rc = run { "--bogus" }
    assert.equal(1, rc)
    assert.equal("", out)
    assert.matches("^mirza: unrecognized option '%-%-bogus'\nusage: mirza", err)
    out, err, rc = run { "--lua-dir" }
    assert.equal(1, rc)
    assert.equal("", out)
    assert.matches("^mirza: '%-%-lua%-dir' needs an argument\n", err)
  end)
end)

describe("dev mode: the library from disk", function()
  local dir
  -- A copy of lua/ whose mirza.thinking carries a marker.
  before_each(function()
    dir = H.tmpname(".lua.d")
    os.execute(("mkdir -p %s && cp -r %s/lua/mirza %s/"):format(q(dir), q(H.source), q(dir)))
    local path = dir .. "/mirza/thinking.lua"
    local src = H.read_file(path)
    write(path, (src:gsub("\nreturn M%s*$", "\nM.DEV_MARK = 'from disk'\nreturn M\n")))
  end)
  after_each(function() os.execute("rm -rf " .. q(dir)) end)

  local probe = "print(require('mirza.thinking').DEV_MARK, package.preload['mirza.thinking'] ~= nil, " ..
    "require('mirza').version)"

  it("embedded by default: no marker, the modules are preloaded", function()
    local out, err, rc = run({ "-e", probe }, nil, "MIRZA_LUA_DIR=")
    assert.equal(0, rc, err)
    assert.equal("nil\ttrue\t0.1.0\n", out)
  end)

  it("--lua-dir DIR loads mirza.* from DIR", function()
    local out, err, rc = run { "--lua-dir", dir, "-e", probe }
    assert.equal(0, rc, err)
    assert.equal("from disk\tfalse\t0.1.0\n", out)
  end)

  it("MIRZA_LUA_DIR=DIR does the same", function()
    local out, err, rc = run({ "-e", probe }, nil, "MIRZA_LUA_DIR=" .. q(dir))
    assert.equal(0, rc, err)
    assert.equal("from disk\tfalse\t0.1.0\n", out)
  end)

  it("a broken module on disk is an error naming its file and line", function()
    write(dir .. "/mirza/thinking.lua", "local M = {}\nreturn M +\n")
    local _, err, rc = run { "--lua-dir", dir, "-e", "require 'mirza.thinking'" }
    assert.equal(1, rc)
    assert.truthy(err:find(dir .. "/mirza/thinking.lua:3:", 1, true), err)
  end)
end)

describe("mirza.so from the stock lua5.4 interpreter", function()
  local cpath = H.build .. "/lua/?.so"
  local lua = H.stock_lua() -- under a sanitizer build, with the ASan runtime first

  it("require 'mirza' works and carries the embedded library", function()
    local out, err, rc = sh(("LUA_CPATH=%s MIRZA_LUA_DIR= %s -e %s"):format(q(cpath), lua,
      q("local m = require 'mirza' print(m.version, m.json.encode({1, 2}), " ..
        "type(require('mirza.engine').new), package.preload['mirza.route'] ~= nil)")))
    assert.equal(0, rc, err)
    assert.equal("0.1.0\t[1,2]\tfunction\ttrue\n", out)
  end)

  it("streams from mirza-sim", function()
    local sim = H.start_sim { "--tok-rate", "0", "--ttft-ms", "0" }
    finally(sim.stop)
    local code = ([[
local m = require "mirza"
local r = assert(m.collect { url = %q, body = { stream = true, messages = { { role = "user", content = "x" } },
  mirza_sim = { text = "from stock lua" } } })
io.write(r.text, "|", r.finish_reason)]]):format(sim.url)
    local out, err, rc = sh(("LUA_CPATH=%s %s -"):format(q(cpath), lua), code)
    assert.equal(0, rc, err)
    assert.equal("from stock lua|stop", out)
  end)

  it("honours MIRZA_LUA_DIR too", function()
    local dir = H.tmpname(".lua.d")
    os.execute(("mkdir -p %s && cp -r %s/lua/mirza %s/"):format(q(dir), q(H.source), q(dir)))
    finally(function() os.execute("rm -rf " .. q(dir)) end)
    write(dir .. "/mirza/init.lua", H.read_file(dir .. "/mirza/init.lua"):gsub("\nreturn M%s*$",
      "\nM.DEV_MARK = 'disk'\nreturn M\n"))
    local out, err, rc = sh(("LUA_CPATH=%s MIRZA_LUA_DIR=%s %s -e %s"):format(q(cpath), q(dir), lua,
      q("print(require('mirza').DEV_MARK)")))
    assert.equal(0, rc, err)
    assert.equal("disk\n", out)
  end)
end)
