-- docs_spec.lua - every code block of README.md, docs/*.md and the man
-- pages' EXAMPLES runs, against mirza-sim, so a doc cannot drift from the
-- code. How a block is treated depends on its info string:
--
--   ```lua    run as a script under the mirza under test (after it compiles)
--   ```sh     run with `bash -e` (set -e: every command must succeed)
--   ```json   parsed (one JSON value)
--   ```text   shown only (output, layouts, formats): not run
--   anything else, or no info string: an error (say which it is)
--
-- A block that cannot run says why, on the line before its fence, in an
-- HTML comment that renders invisibly (in a man page: a roff comment):
--
--   <!-- doc-test: skip (needs a real MTPLX daemon) -->
--   <!-- doc-test: sim --model-id qwen -->     its own simulators, with these options;
--                                               MIRZA_HOST/MIRZA_PORT name the first (an
--                                               engine without an address finds it there,
--                                               as it would a daemon on the default port;
--                                               without `sim`, MIRZA_PORT is a free port)
--   <!-- doc-test: timeout 30 -->               seconds (default 20)
--
-- (several directives: separated by ";"). A skipped Lua block must still
-- compile (as a chunk, or as an expression for a table shape). The blocks
-- of one file run in order in one temporary directory (a notebook: a file
-- written by one block is there for the next), where `build` is the build
-- under test and `scripts`, `lua`, `tests`, `docs`, `man` the source tree's
-- (so `build/mirza scripts/batch.lua ...` runs as written); `mirza` and
-- `mirza-sim` on PATH are the build's, and stock lua5.4 finds its mirza.so;
-- HOME is that directory (no user config), no MIRZA_* setting is inherited,
-- MIRZA_DEMO_PORT is a free port and so is MIRZA_PORT (see `sim` below).
--
-- Endpoints are mapped, not edited in the docs (users copy the blocks with
-- their own addresses): each distinct `http://HOST:PORT` of a block (every
-- loopback address of one port counting as one, and `port = N`,
-- `--port N`, `MIRZA_PORT=N` as that port) becomes one of three
-- simulators in order of appearance, started with --tok-rate 0 --ttft-ms 0
-- (the whole file takes seconds). The test prints how many blocks ran and
-- which were skipped, and why; MIRZA_DOCS_VERBOSE=1 prints each block's output.
local H = require "tests.helper"

local DEFAULT_TIMEOUT = 20
local SIM_ARGS = { "--tok-rate", "0", "--ttft-ms", "0", "--quiet" }

-- The MIRZA_* variables of this environment (the test's own among them):
-- none reaches a block.
local function mirza_vars()
  local names, p = {}, assert(io.popen("env"))
  for line in p:lines() do names[#names + 1] = line:match("^(MIRZA_[%w_]*)=") end
  p:close()
  return names
end
local LINKED = { "scripts", "lua", "tests", "docs", "man" }

-- ---- extraction -----------------------------------------------------------

-- Directives of a marker line ("skip (why)", "sim ARGS", "timeout N"), or
-- nil when the line is not a marker.
local function directives(line)
  local body = line:match("^%s*<!%-%-%s*doc%-test:%s*(.-)%s*%-%->%s*$") or line:match("^%.\\\"%s*doc%-test:%s*(.-)%s*$")
  if not body then return nil end
  local d, items, depth, from = {}, {}, 0, 1
  for i = 1, #body + 1 do -- split at the ";" outside parentheses
    local c = body:sub(i, i)
    depth = depth + (c == "(" and 1 or c == ")" and -1 or 0)
    if c == "" or (c == ";" and depth == 0) then
      items[#items + 1], from = body:sub(from, i - 1):match("^%s*(.-)%s*$"), i + 1
    end
  end
  for _, item in ipairs(items) do
    local word, rest = item:match("^(%S+)%s*(.*)$")
    if word == "skip" then
      d.skip = rest:match("^%((.+)%)$") or error("doc-test: skip needs a reason in parentheses: " .. line)
    elseif word == "sim" then
      d.sim = {}
      for a in rest:gmatch("%S+") do d.sim[#d.sim + 1] = a end
    elseif word == "timeout" then
      d.timeout = tonumber(rest) or error("doc-test: timeout needs seconds: " .. line)
    elseif word then
      error("doc-test: unknown directive '" .. word .. "' (skip, sim, timeout): " .. line)
    end
  end
  return d
end

-- The fenced blocks of a markdown file: {file, line, lang, code, d}.
local function markdown_blocks(rel)
  local blocks, open, prev = {}, nil, ""
  local n = 0
  for line in (H.read_file(H.source .. "/" .. rel) .. "\n"):gmatch("([^\n]*)\n") do
    n = n + 1
    if open then
      local ticks = line:match("^%s*(```+)%s*$")
      if ticks and #ticks >= #open.ticks then
        open.code = table.concat(open.lines, "\n") .. "\n"
        blocks[#blocks + 1], open = open, nil
      else
        open.lines[#open.lines + 1] = line:sub(#open.indent + 1)
      end
    else
      local indent, ticks, info = line:match("^( *)(```+)%s*([^`]-)%s*$") -- CommonMark: no ` in the info
      if indent then
        open = { file = rel, line = n, lang = info:match("^%S*"), indent = indent, ticks = ticks, lines = {},
          d = directives(prev) or {} }
      end
      if line:match("%S") then prev = line end
    end
  end
  assert(not open, rel .. ":" .. (open and open.line or 0) .. ": a fence is never closed")
  return blocks
end

-- The EXAMPLES of a man page: one sh block per command (continued lines
-- joined), with the roff escapes undone; a roff comment before a line
-- marks it.
local function man_blocks(rel)
  local blocks, inside, d, n, cont = {}, false, {}, 0, nil
  for line in H.read_file(H.source .. "/" .. rel):gmatch("([^\n]*)\n") do
    n = n + 1
    if line:match("^%.SH EXAMPLES") then inside = true
    elseif inside and line:match("^%.SH") then inside = false
    elseif inside and directives(line) then d = directives(line)
    elseif inside and not line:match("^%.") then
      local text = line:gsub("\\%-", "-"):gsub("\\e", "\\"):gsub("\\%(dq", '"')
      if cont then
        cont.code = cont.code .. text .. "\n"
      else
        cont = { file = rel, line = n, lang = "sh", code = text .. "\n", d = d }
        blocks[#blocks + 1], d = cont, {}
      end
      if not text:match("\\$") then cont = nil end
    end
  end
  return blocks
end

local function doc_files()
  local files = { "README.md" }
  local p = assert(io.popen("cd " .. H.q(H.source) .. " && ls docs/*.md"))
  for f in p:lines() do files[#files + 1] = f end
  p:close()
  files[#files + 1] = "man/mirza.1"
  files[#files + 1] = "man/mirza-sim.1"
  return files
end

-- ---- endpoint mapping -----------------------------------------------------

local function is_loopback(host) return host == "localhost" or host:match("^127%.") ~= nil end

-- The endpoints a block mentions, as keys in text order: a loopback
-- address counts by its port, `port = N` and the like as that port.
local PORT_FORMS = { "()port%s*=%s*(%d+)", "()%-%-port%s+(%d+)", "()MIRZA_PORT=(%d+)" }

local function endpoint_keys(code)
  local found = {}
  for pos, host, port in code:gmatch("()https?://([%w%.%-]+):(%d+)") do
    found[#found + 1] = { pos, is_loopback(host) and port or host .. ":" .. port }
  end
  for _, form in ipairs(PORT_FORMS) do
    for pos, port in code:gmatch(form) do
      if port ~= "0" then found[#found + 1] = { pos, port } end -- port 0: any free port, left alone
    end
  end
  table.sort(found, function(a, b) return a[1] < b[1] end)
  return found
end

-- Replace the block's endpoints by simulator ports (`ports[i]` for the
-- i-th distinct endpoint, wrapping around).
local function map_endpoints(code, ports)
  local map, n = {}, 0
  for _, f in ipairs(endpoint_keys(code)) do
    if not map[f[2]] then
      n = n + 1
      map[f[2]] = ports[(n - 1) % #ports + 1]
    end
  end
  code = code:gsub("https?://([%w%.%-]+):(%d+)", function(host, port)
    return "http://127.0.0.1:" .. map[is_loopback(host) and port or host .. ":" .. port]
  end)
  local function port(a, p) return a .. (map[p] or p) end
  code = code:gsub("(port%s*=%s*)(%d+)", port):gsub("(%-%-port%s+)(%d+)", port)
  return (code:gsub("(MIRZA_PORT=)(%d+)", port))
end

-- ---- running --------------------------------------------------------------

local function sh(cmd)
  local ok, how, code = os.execute(cmd)
  return ok and 0 or (how == "exit" and code or 128 + code)
end

-- A work directory with the tree's parts linked in.
local function workdir()
  local dir = H.tmpname(".docs")
  local cmd = { "mkdir " .. H.q(dir), "ln -s " .. H.q(H.build) .. " " .. H.q(dir .. "/build") }
  for _, name in ipairs(LINKED) do
    cmd[#cmd + 1] = "ln -s " .. H.q(H.source .. "/" .. name) .. " " .. H.q(dir .. "/" .. name)
  end
  assert(sh(table.concat(cmd, " && ")) == 0, "cannot make " .. dir)
  if H.stock_lua() ~= "lua5.4" then -- a sanitizer build: lua5.4 in a block loads the ASan runtime first
    local p = assert(io.popen("command -v lua5.4"))
    local real = p:read("l")
    p:close()
    assert(sh("mkdir " .. H.q(dir .. "/.bin")) == 0)
    local f = assert(io.open(dir .. "/.bin/lua5.4", "w"))
    f:write("#!/bin/sh\nexec env ", H.stock_lua():gsub("lua5%.4$", H.q(real)), ' "$@"\n')
    f:close()
    assert(sh("chmod +x " .. H.q(dir .. "/.bin/lua5.4")) == 0)
  end
  return dir
end

local function compiles(code, name)
  local f, err = load(code, "=" .. name)
  if f then return true end
  if load("return " .. code, "=" .. name) then return true end
  return false, err
end

-- Run one block in dir; returns exit status and output.
local function run_block(b, dir, ports)
  local ext = b.lang == "lua" and ".lua" or ".sh"
  local script = dir .. "/.block-" .. b.line .. ext
  local f = assert(io.open(script, "w"))
  f:write(map_endpoints(b.code, ports))
  f:close()
  local env = { "env" }
  for _, v in ipairs(mirza_vars()) do env[#env + 1] = "-u " .. v end
  env[#env + 1] = "HOME=" .. H.q(dir)
  env[#env + 1] = "PATH=" .. H.q(dir .. "/.bin:" .. H.build .. ":" .. os.getenv("PATH"))
  env[#env + 1] = "MIRZA_SIM=" .. H.q(H.sim_bin)
  -- an engine without an address finds the block's own first sim, or
  -- nothing (never a daemon that happens to be on the default port)
  env[#env + 1] = "MIRZA_HOST=127.0.0.1 MIRZA_PORT=" .. (b.d.sim and ports[1] or H.free_port())
  env[#env + 1] = "MIRZA_DEMO_PORT=" .. H.free_port()
  env[#env + 1] = "LUA_CPATH=" .. H.q(H.build .. "/lua/?.so;;") -- stock lua5.4 finds the build's mirza.so
  local interp = b.lang == "lua" and H.q(H.mirza_bin) or "bash -e"
  local out = dir .. "/.out-" .. b.line
  local cmd = ("cd %s && %s %s %s %s </dev/null >%s 2>&1"):format(H.q(dir), table.concat(env, " "),
    H.timeout_prefix(b.d.timeout or DEFAULT_TIMEOUT), interp, H.q(script), H.q(out))
  local rc = sh(cmd)
  local output = H.read_file(out)
  os.remove(out)
  os.remove(script)
  return rc, output
end

local function start_sims(args)
  local sims = {}
  for i = 1, 3 do
    local a = {}
    for _, x in ipairs(SIM_ARGS) do a[#a + 1] = x end
    for _, x in ipairs(args or {}) do a[#a + 1] = x end
    sims[i] = H.start_sim(a)
  end
  return sims
end

local function ports_of(sims)
  local ports = {}
  for i, s in ipairs(sims) do ports[i] = tostring(s.port) end
  return ports
end

-- ---- the specs ------------------------------------------------------------

local counts = { ran = 0, checked = 0, text = 0, skipped = {} }

describe("docs", function()
  local sims
  lazy_setup(function() sims = start_sims() end)
  lazy_teardown(function()
    for _, s in ipairs(sims or {}) do s.stop() end
  end)

  for _, file in ipairs(doc_files()) do
    describe(file, function()
      local blocks = file:match("%.md$") and markdown_blocks(file) or man_blocks(file)
      local dir
      lazy_setup(function() dir = workdir() end)
      lazy_teardown(function() if dir then sh("rm -rf " .. H.q(dir)) end end)

      for _, b in ipairs(blocks) do
        local where = b.file .. ":" .. b.line
        it(where .. " (" .. (b.lang ~= "" and b.lang or "no language") .. ")", function()
          if b.lang == "lua" then
            local ok, err = compiles(b.code, where)
            assert(ok, where .. ": the block does not compile: " .. tostring(err))
          end
          if b.d.skip then
            counts.skipped[#counts.skipped + 1] = where .. ": " .. b.d.skip
            return
          end
          if b.lang == "text" then
            counts.text = counts.text + 1
          elseif b.lang == "json" then
            local v, err = require("mirza").json.decode(b.code)
            assert(v ~= nil, where .. ": not JSON: " .. tostring(err))
            counts.checked = counts.checked + 1
          elseif b.lang == "lua" or b.lang == "sh" then
            local own = b.d.sim and start_sims(b.d.sim)
            local ok, rc, output = pcall(run_block, b, dir, ports_of(own or sims))
            for _, s in ipairs(own or {}) do s.stop() end
            assert(ok, rc)
            assert(rc == 0, ("%s: the %s block failed (exit %d):\n%s"):format(where, b.lang, rc, output))
            if os.getenv("MIRZA_DOCS_VERBOSE") then io.stdout:write(("\n== %s\n%s"):format(where, output)) end
            counts.ran = counts.ran + 1
          else
            error(("%s: a block of language '%s': make it lua or sh (run), json (parsed) or text (shown), "
              .. "or mark it <!-- doc-test: skip (why) -->"):format(where, b.lang))
          end
        end)
      end
    end)
  end

  it("counts what ran", function()
    io.stdout:write(("\ndocs: %d blocks ran, %d JSON blocks parsed, %d text blocks shown, %d skipped:\n"):format(
      counts.ran, counts.checked, counts.text, #counts.skipped))
    for _, s in ipairs(counts.skipped) do io.stdout:write("  skipped " .. s .. "\n") end
    assert.is_true(counts.ran >= 10, "only " .. counts.ran .. " blocks ran")
  end)
end)

-- ---- links ------------------------------------------------------------------

-- GitHub's anchor of a heading: lower case, punctuation dropped (but - and
-- _), spaces as dashes.
local function slug(heading)
  return (heading:lower():gsub("`", ""):gsub("[^%w%s%-_\128-\255]", ""):gsub("%s", "-"))
end

local function anchors(rel)
  local set = {}
  for h in ("\n" .. H.read_file(H.source .. "/" .. rel)):gmatch("\n#+%s+([^\n]+)") do set[slug(h)] = true end
  return set
end

describe("docs links", function()
  for _, file in ipairs(doc_files()) do
    if file:match("%.md$") then
      it(file .. ": every relative link names a file and a heading that exist", function()
        local dir = file:match("^(.*)/") or ""
        local text = H.read_file(H.source .. "/" .. file)
        for target in text:gmatch("%]%(([^)%s]+)%)") do
          if not target:match("^%a+:") then
            local path, anchor = target:match("^([^#]*)#?(.*)$")
            local rel = path == "" and file or ((dir ~= "" and dir .. "/" or "") .. path):gsub("[^/]+/%.%./", "")
            local f = io.open(H.source .. "/" .. rel)
            assert(f, ("%s: the link (%s) names a file that does not exist"):format(file, target))
            f:close()
            if anchor ~= "" then
              assert(anchors(rel)[anchor], ("%s: the link (%s): no heading of %s has that anchor"):format(file,
                target, rel))
            end
          end
        end
      end)
    end
  end
end)

-- ---- the man pages match --help -------------------------------------------

-- The set of --options a man page documents in its OPTIONS section.
local function man_options(rel)
  local page = H.read_file(H.source .. "/" .. rel)
  local section = page:match("\n%.SH OPTIONS\n(.-)\n%.SH ") or ""
  local set = {}
  for opt in section:gmatch("\n%.[BI][RI]? [^\n]-\\%-\\%-([%w\\%-]+)") do set[(opt:gsub("\\%-", "-"))] = true end
  return set
end

local function help_of(bin)
  local p = assert(io.popen(H.q(bin) .. " --help 2>&1"))
  local out = p:read("a")
  p:close()
  return out
end

local function missing(from, set)
  local m = {}
  for k in pairs(from) do if not set[k] then m[#m + 1] = k end end
  table.sort(m)
  return table.concat(m, ", ")
end

describe("man/mirza-sim.1", function()
  local help = help_of(H.sim_bin)

  it("documents every option of mirza-sim --help, and no other", function()
    local opts = {}
    for opt in help:gmatch("\n  %-%-([%w%-]+)") do opts[opt] = true end
    local man = man_options("man/mirza-sim.1")
    assert.is_true(next(opts) ~= nil)
    assert.equal("", missing(opts, man), "options of --help missing from man/mirza-sim.1")
    assert.equal("", missing(man, opts), "options of man/mirza-sim.1 that --help does not list")
  end)

  it("documents every fault kind of mirza-sim --help, and no other", function()
    -- items are the words without spaces between runs of two spaces, on
    -- the lines indented by two (the others continue a description)
    local faults = {}
    local section = help:match("\nFault SPEC:[^\n]*\n[^\n]*\n(.-)\nPer%-request") or ""
    for line in section:gmatch("[^\n]+") do
      if line:match("^  %S") then
        local first = line:match("^  ([%l][%l%d%-]*)") -- the first word, however it is spaced
        if first then faults[first] = true end
        for item in (line .. "  "):gmatch("(.-)%s%s+") do
          local name = item:match("^([%l][%l%d%-]*)[=%[|]?%S*$")
          if name then faults[name] = true end
        end
      end
    end
    local page = H.read_file(H.source .. "/man/mirza-sim.1")
    local man = {}
    local fsec = page:match("\n%.SH FAULTS\n(.-)\n%.SH ") or ""
    for line in fsec:gmatch("%.TP\n([^\n]+)") do
      local name = line:gsub("\\%-", "-"):match("^%.[BI][RI]?%s+\"?([%l][%l%d%-]*)")
      if name then man[name] = true end
    end
    assert.is_true(faults["cut-after"] and faults.gzip and true or false, "cannot read the faults of --help")
    assert.equal("", missing(faults, man), "fault kinds of --help missing from man/mirza-sim.1")
    assert.equal("", missing(man, faults), "fault kinds of man/mirza-sim.1 that --help does not list")
  end)
end)

describe("man/mirza.1", function()
  local help = help_of(H.mirza_bin)

  it("documents every option of mirza --help, and no other", function()
    local opts = {}
    local section = help:match("\nOptions:\n(.-)\nExit status") or ""
    for line in section:gmatch("[^\n]+") do
      for opt in (line:match("^  (%-[^%s]*,? ?%-*[%w%-]*)") or ""):gmatch("%-[%w%-]*") do opts[opt] = true end
    end
    local page = H.read_file(H.source .. "/man/mirza.1")
    local man = {}
    for line in ((page:match("\n%.SH OPTIONS\n(.-)\n%.SH ") or "")):gmatch("%.TP\n([^\n]+)") do
      for opt in line:gsub("\\%-", "-"):gmatch("%f[%S\"]%-[%w%-]*") do man[opt] = true end
    end
    assert.is_true(opts["--lua-dir"] and opts["-e"] and opts["-"] and true or false,
      "cannot read the options of --help")
    assert.equal("", missing(opts, man), "options of --help missing from man/mirza.1")
    assert.equal("", missing(man, opts), "options of man/mirza.1 that --help does not list")
  end)

  it("documents every option of mirza chat --help, and no other", function()
    local p = assert(io.popen(H.q(H.mirza_bin) .. " chat --help 2>&1"))
    local chat = p:read("a")
    p:close()
    local opts = {}
    for line in chat:gmatch("[^\n]+") do -- the option column: "  --sim", "  -v, --verbose", "  --name NAME"
      for opt in (line:match("^  (%-%S*,? ?%S*)") or ""):gmatch("%-%-[%w%-]+") do opts[opt] = true end
    end
    local page = H.read_file(H.source .. "/man/mirza.1")
    local man = {}
    for opt in ((page:match("\n%.B chat\n(.-)\n%.TP\n") or ""):gsub("\\%-", "-")):gmatch("%-%-[%w%-]+") do
      man[opt] = true
    end
    assert.is_true(opts["--continue"] and opts["--help"] and true or false, "cannot read the options of chat --help")
    assert.equal("", missing(opts, man), "options of mirza chat --help missing from man/mirza.1's chat")
    assert.equal("", missing(man, opts), "options in man/mirza.1's chat that mirza chat --help does not list")
  end)

  it("documents every job that mirza --help lists", function()
    local page = H.read_file(H.source .. "/man/mirza.1")
    local jobs = "\n" .. (page:match("\n%.SH JOBS\n(.-)\n%.SH ") or "")
    local listed = help:match("\nJobs[^\n]*\n(.-)\nEnvironment") or ""
    local n = 0
    for name in ("\n" .. listed):gmatch("\n  (%w+) ") do
      n = n + 1
      assert.truthy(jobs:find("\n%.TP\n%.B " .. name .. "\n"), "job " .. name .. " missing from man/mirza.1 JOBS")
    end
    assert.is_true(n >= 4, "found only " .. n .. " jobs in --help")
  end)

  it("mirza --help gives every job's whole summary, no line cut", function()
    local p = assert(io.popen("cd " .. H.q(H.source .. "/scripts") .. " && ls *.lua"))
    for file in p:lines() do
      local text = H.read_file(H.source .. "/scripts/" .. file)
      local para = text:match("^%-%-%- [^\n]- %- (.-)\n%-%-%-%s*\n") or text:match("^%-%-%- [^\n]- %- ([^\n]*)")
      local words = {}
      for w in para:gsub("\n%-%-%-", " "):gmatch("%S+") do words[#words + 1] = w:gsub("%p", "%%%0") end
      local name = file:gsub("%.lua$", "")
      assert.truthy(help:find("\n  " .. name .. " +" .. table.concat(words, "%s+")), name .. "'s summary is cut")
    end
    p:close()
    for line in help:gmatch("[^\n]+") do assert.is_true(#line <= 80, "a line over 80 columns: " .. line) end
  end)
end)

-- ---- the extraction script --------------------------------------------------

describe("the extraction script (issue 18)", function()
  it("is in docs/structured.md, in at most 15 lines of Lua (the README links it: issue 36 item 13)", function()
    local doc
    for _, b in ipairs(markdown_blocks("docs/structured.md")) do
      if b.lang == "lua" and b.code:find("invoices.jsonl", 1, true) then doc = b.code end
    end
    assert.truthy(doc, "docs/structured.md: no Lua block writes invoices.jsonl")
    local lines = select(2, doc:gsub("\n", ""))
    assert.is_true(lines <= 15, "the extraction script has " .. lines .. " lines")
  end)
end)
