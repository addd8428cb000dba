-- cli_spec.lua - the `mirza` command line around the Lua run: -v names the
-- libraries in use, --help and mirza(1) list every job and every MIRZA_*
-- variable the code reads, and a job runs by name from anywhere.
local H = require "tests.helper"

-- Run a shell command; its output (stdout and stderr) and exit status.
local function run(cmd)
  local p = assert(io.popen(cmd .. " 2>&1; echo \"rc=$?\""))
  local out = p:read("a")
  p:close()
  local body, rc = out:match("^(.-)rc=(%d+)\n$")
  return body, tonumber(rc)
end

local function pkg_version(name)
  local out, rc = run("pkg-config --modversion " .. name)
  assert.equal(0, rc)
  return (out:gsub("%s+$", ""))
end

local function lines_of(cmd)
  local p = assert(io.popen(cmd))
  local t = {}
  for l in p:lines() do t[#t + 1] = l end
  p:close()
  return t
end

-- Every MIRZA_* environment variable read by the Lua library, the jobs
-- and the C sources (getenv), as a set.
local function env_vars_in_code()
  local vars = {}
  for _, f in ipairs(lines_of("ls " .. H.q(H.source) .. "/lua/mirza/*.lua " .. H.q(H.source) .. "/scripts/*.lua")) do
    for v in H.read_file(f):gmatch("MIRZA_[A-Z_]+") do vars[v] = true end
  end
  for _, f in ipairs(lines_of("ls " .. H.q(H.source) .. "/src/*.c " .. H.q(H.source) .. "/src/sim/*.c")) do
    for v in H.read_file(f):gmatch('getenv%("(MIRZA_[A-Z_]+)"%)') do vars[v] = true end
  end
  return vars
end

describe("mirza -v", function()
  it("prints its version and the Lua, libcurl and cJSON versions it runs with", function()
    local out, rc = run(H.q(H.mirza_bin) .. " -v")
    assert.equal(0, rc)
    assert.equal(("mirza %s (Lua %s, libcurl %s, cJSON %s)\n"):format(require("mirza").version,
      pkg_version("lua5.4"), pkg_version("libcurl"), pkg_version("libcjson")), out)
  end)
end)

describe("mirza --help", function()
  local help
  setup(function()
    local rc
    help, rc = run(H.q(H.mirza_bin) .. " --help")
    assert.equal(0, rc)
  end)

  it("lists every job of scripts/ with its summary line", function()
    local jobs = lines_of("cd " .. H.q(H.source .. "/scripts") .. " && ls *.lua")
    assert.is_true(#jobs >= 3)
    for _, file in ipairs(jobs) do
      local summary = H.read_file(H.source .. "/scripts/" .. file):match("^%-%-%- [^\n]- %- ([^\n]*)")
      local name = file:gsub("%.lua$", "")
      local words = {} -- the summary may wrap onto more lines
      for w in summary:gmatch("%S+") do words[#words + 1] = (w:gsub("%p", "%%%0")) end
      assert.truthy(help:find("\n  " .. name .. " +" .. table.concat(words, "%s+") .. "%s"), name .. " not listed")
    end
  end)

  it("names every MIRZA_* variable the code reads, as does mirza(1)", function()
    local page = H.read_file(H.source .. "/man/mirza.1")
    local n = 0
    for v in pairs(env_vars_in_code()) do
      n = n + 1
      assert.truthy(help:find(v .. "[^%w_]"), v .. " missing from --help")
      assert.truthy(page:find(v .. "[^%w_]"), v .. " missing from man/mirza.1")
    end
    assert.is_true(n >= 15, "found only " .. n .. " variables")
  end)
end)

describe("mirza JOB", function()
  it("runs a job by name from any directory", function()
    local out, rc = run("cd / && " .. H.q(H.mirza_bin) .. " bench 2000")
    assert.equal(0, rc, out)
    assert.truthy(("\n" .. out):find("\ntokens%s+2000 %("), out)
  end)

  it("reports a name that is neither a file nor a job", function()
    local out, rc = run("cd / && " .. H.q(H.mirza_bin) .. " no-such-job")
    assert.equal(1, rc)
    assert.equal("mirza: cannot open no-such-job: No such file or directory\n", out)
  end)
end)
