-- What a batch run tells its user when items fail (issue 36 item 8): the
-- summary names the cause, the first message of each kind of failure
-- ("http 401 ... give the server's key", or "the key given was refused"
-- when one was sent), and advises running the same command again only
-- for the kinds a rerun may get (not a key the server wants, not a bad
-- input line); the progress line says which endpoint is down while
-- another serves; the lines written to a log carry their time.
local mirza = require "mirza"
local json = mirza.json
local batch = require "mirza.batch"
local batch_output = require "mirza.batch_output"
local loop = require "mirza.loop"
local H = require "tests.helper"

local SCRIPT = H.source .. "/scripts/batch.lua"

-- Run scripts/batch.lua (no key from the environment): exit status, stderr.
local function cli(...)
  local words = { "env -u MIRZA_API_KEY -u OPENAI_API_KEY", H.q(H.mirza_bin), H.q(SCRIPT) }
  for _, a in ipairs { ... } do words[#words + 1] = H.q(a) end
  local err = H.tmpname(".err")
  local p = assert(io.popen(table.concat(words, " ") .. " 2>" .. H.q(err)))
  p:read("a")
  local _, _, rc = p:close()
  local e = H.read_file(err)
  os.remove(err)
  return rc, e
end

local function input_of(lines)
  local path = H.tmpname(".jsonl")
  H.write_file(path, table.concat(lines, "\n") .. "\n")
  finally(function() os.remove(path) end)
  return path
end

local function output_path()
  local out = H.tmpname(".jsonl")
  finally(function()
    os.remove(out)
    os.remove(batch_output.errors_path(out))
  end)
  return out
end

local function chat(id, sim_ctl)
  return json.encode { custom_id = id, body = { model = "m", max_tokens = 4,
    messages = { { role = "user", content = "prompt " .. id } }, mirza_sim = sim_ctl } }
end

describe("the summary of a failed batch", function()
  it("names a wrong key's 401 (and a missing one's) and does not advise the same command again", function()
    local sim = H.start_sim { "--api-key", "RIGHT", "--tok-rate", "0", "--ttft-ms", "0" }
    finally(sim.stop)
    local lines = {}
    for i = 1, 15 do lines[i] = "question " .. i end
    local out = output_path()
    local rc, err = cli(input_of(lines), out, "--endpoint", sim.base, "--api-key", "WRONG", "--model", "m",
      "--quiet")
    assert.equal(1, rc, err)
    assert.equal("", err) -- --quiet: no summary
    rc, err = cli(input_of(lines), out, "--endpoint", sim.base, "--api-key", "WRONG", "--model", "m")
    assert.equal(1, rc, err)
    assert.truthy(err:find("batch: 15 failed, recorded in " .. batch_output.errors_path(out), 1, true), err)
    assert.truthy(err:find("15 http 401 (first: line-1): " .. sim.base .. "/v1/chat/completions answered HTTP 401 "
      .. "(the key given was refused): check --api-key KEY / MIRZA_API_KEY / OPENAI_API_KEY", 1, true), err)
    assert.is_nil(err:find("give the server's key", 1, true), err) -- one was given
    assert.truthy(err:find("running the same command again fails them the same way: fix the cause above first",
      1, true), err)
    assert.is_nil(err:find("run the same command again to redo", 1, true), err)
    -- no key given: the message says how to give one
    rc, err = cli(input_of(lines), output_path(), "--endpoint", sim.base, "--model", "m")
    assert.equal(1, rc, err)
    assert.truthy(err:find("15 http 401 (first: line-1): " .. sim.base .. "/v1/chat/completions answered HTTP 401 "
      .. "(no key, or a wrong one): give the server's key: --api-key KEY or MIRZA_API_KEY (OPENAI_API_KEY is read "
      .. "too); nothing is sent without it", 1, true), err)
    assert.is_nil(err:find("the key given was refused", 1, true), err)
  end)

  it("gives the first message of each kind, and advises a rerun for those a rerun may get", function()
    local sim = H.start_sim { "--tok-rate", "0", "--ttft-ms", "0" }
    finally(sim.stop)
    local out = output_path()
    local input = input_of { chat("ok"), '{"custom_id": "broken", "body": 5}',
      chat("busy1", { fault = "http=503" }), chat("busy2", { fault = "http=503" }),
      chat("bad", { fault = "http=400" }) }
    local rc, err = cli(input, out, "--endpoint", sim.base, "--max-retries", "0")
    assert.equal(1, rc, err)
    assert.truthy(err:find("batch: 4 failed, recorded in ", 1, true), err)
    assert.truthy(err:find("\nbatch:   1 input (first: broken): body must be an object", 1, true), err)
    assert.truthy(err:find("(fix the line in INPUT)\n", 1, true), err)
    assert.truthy(err:find("\nbatch:   2 http 503 (first: busy", 1, true), err)
    assert.truthy(err:find("HTTP 503 Service Unavailable", 1, true), err)
    assert.truthy(err:find("\nbatch:   1 http 400 (first: bad): ", 1, true), err)
    assert.truthy(err:find("run the same command again to redo the 2 that a rerun may get (only the failed items "
      .. "are sent); the 2 others fail the same way until their cause above is fixed", 1, true), err)
    -- all of them transient: the plain advice
    local st = { total = 2, skipped = 0, done_now = 2, errors = 2, cut = 0, retries = 3, tokens = 0, elapsed = 1,
      errors_file = "e.jsonl", kinds = { { kind = "timeout", n = 2, message = "x: timed out", code = "timeout",
        rerun = true, custom_id = "a" } } }
    assert.truthy(batch.summary(st, "o.jsonl"):find("\nbatch:   2 timeout (first: a): x: timed out\n"
      .. "batch: run the same command again to redo them (only they are sent)", 1, true))
  end)
end)

describe("a batch's progress", function()
  it("says which endpoint is down while another serves", function()
    local sim = H.start_sim { "--parallel", "4", "--tok-rate", "40", "--ttft-ms", "0" }
    finally(sim.stop)
    local dead = ("http://127.0.0.1:%d"):format(H.free_port())
    local lines = {}
    for i = 1, 24 do lines[i] = chat("p" .. i, { answer_tokens = 8 }) end
    local input, out = input_of(lines), output_path()
    local said, st, msg
    loop.run(function()
      local job = loop.spawn(function()
        st, msg = batch.run { input = input, output = out, endpoints = { sim.base, dead }, limit = 2, quiet = true,
          progress = true, retry_base = 0.05, log = function(l)
            said = said or l:match("; " .. dead:gsub("%p", "%%%0") .. "/v1 down for %d+s %([^)]*%)")
          end }
      end)
      assert(H.wait_for(function() return said ~= nil or job:done() end, 60, 0.01))
      assert(job:join())
    end)
    assert(st, msg)
    assert.equal(0, st.errors)
    assert.truthy(said, "no progress line said the dead endpoint is down")
  end)

  it("writes log lines with their time", function()
    local sim = H.start_sim { "--tok-rate", "10", "--ttft-ms", "0" }
    finally(sim.stop)
    local out = output_path()
    local rc, err = cli(input_of { chat("slow", { answer_tokens = 10 }) }, out, "--endpoint", sim.base,
      "--progress-every", "0.05")
    assert.equal(0, rc, err)
    assert.truthy(err:find("^%d%d%d%d%-%d%d%-%d%d %d%d:%d%d:%d%d batch: %d/1 done"), err)
  end)
end)
