-- Which failures move a batch item to another endpoint of its pool
-- (issue 19 item 8), end to end: the first endpoint fails the item in one
-- way (a mirza-sim with that fault), the second is healthy. Refused, cut
-- mid-stream, a daemon killed mid-stream, a stall or a late head past its
-- timeout, HTTP 502/503/504: the endpoint's own failure, it rests and the
-- retry goes to the other. HTTP 500 and a server error frame: retried on
-- the other too (another endpoint may answer), but the first is not
-- rested (the request may be at fault). HTTP 400 and a malformed
-- frame: the request's own, recorded as they are, never moved. HTTP 404
-- (issue 31): a route that endpoint lacks ("unsupported"), tried on the
-- other, which may have it, and never held against the first. A failure's
-- record is in the error file beside OUTPUT, an answer in OUTPUT.
local mirza = require "mirza"
local pool = require "mirza.pool"
local batch = require "mirza.batch"
local batch_output = require "mirza.batch_output"
local json = mirza.json
local H = require "tests.helper"

local FAST = { "--tok-rate", "0", "--ttft-ms", "0", "--retry-after", "0", "--answer-tokens", "6" }

-- One item through a pool of `first` (a base URL) then the healthy sim:
-- its record, and the first endpoint.
local function run_one(first, good, opts)
  local p = pool.new({ first, good.base }, { limit = 1 })
  local output = H.tmpname(".jsonl")
  local o = { items = { { custom_id = "it", line = 1, body = { messages = { { role = "user", content = "q" } } } } },
    output = output, pool = p, model = "m", max_retries = 2, retry_base = 0.01, quiet = true, progress = false }
  for k, v in pairs(opts or {}) do o[k] = v end
  assert(batch.run(o))
  local by, n, nbad = H.batch_records(output)
  os.remove(output)
  os.remove(batch_output.errors_path(output))
  assert.equal(1, n + nbad)
  return by.it, p.endpoints[1]
end

describe("a batch item failing on one endpoint of two", function()
  local good
  setup(function() good = H.start_sim(FAST) end)
  teardown(function() good.stop() end)
  after_each(function() collectgarbage("collect") end)

  -- A sim failing with `args`; the item through it then `good`.
  local function through(args, opts)
    local argv = { table.unpack(FAST) }
    for _, a in ipairs(args) do argv[#argv + 1] = a end
    local bad = H.start_sim(argv)
    finally(function() bad.stop() end)
    local rec, e = run_one(bad.base, good, opts)
    return rec, e, bad
  end

  local function moved(rec, why)
    assert.equal(json.null, rec.error, why)
    assert.same({ 2, good.base .. "/v1", 200 }, { rec.mirza.attempts, rec.mirza.endpoint,
      rec.response.status_code }, why)
  end

  it("moves it when the endpoint refuses, and rests that endpoint", function()
    local rec, e = run_one(("http://127.0.0.1:%d"):format(H.free_port()), good)
    moved(rec, "refused")
    assert.equal(1, e.fails)
  end)

  it("moves it when the stream is cut, the daemon killed mid-stream, a stall or a late head times out", function()
    for _, c in ipairs {
      { "cut", { "--fault", "cut-after=2" } },
      { "killed", { "--crash-after", "1" } },
      { "stall", { "--fault", "stall-after=1:3000" }, { stall_timeout = 0.3 } },
      { "head", { "--fault", "head-delay=3000" }, { header_timeout = 0.3 } },
    } do
      local rec, e = through(c[2], c[3])
      moved(rec, c[1])
      assert.equal(1, e.fails, c[1] .. ": the endpoint is not rested")
      assert.equal(0, e.served, c[1])
    end
  end)

  it("moves it on HTTP 502, 503 and 504, and rests that endpoint", function()
    for _, status in ipairs { 502, 503, 504 } do
      local rec, e = through { "--fault", ("http=%d:unavailable"):format(status) }
      moved(rec, status)
      assert.equal(1, e.fails, status .. ": the endpoint is not rested")
    end
  end)

  it("moves it on HTTP 500 and a server error frame, without resting that endpoint", function()
    for _, c in ipairs { { "500", { "--fault", "http=500:bad field" } },
      { "frame", { "--fault", "error-after=2" } } } do
      local rec, e = through(c[2])
      moved(rec, c[1])
      assert.same({ 0, 0 }, { e.fails, e.failed }, c[1] .. ": rested for one request's failure")
    end
  end)

  it("never moves it on HTTP 400 or a malformed frame: the request's own failure, recorded", function()
    local rec, e, bad = through { "--fault", "http=400:no such thing" }
    assert.same({ "http", 400, 1, bad.base .. "/v1" }, { rec.error.code, rec.response.status_code,
      rec.mirza.attempts, rec.mirza.endpoint })
    assert.same({ 0, 0 }, { e.fails, e.failed })
    rec, e, bad = through { "--fault", "malformed-after=2" }
    assert.same({ "protocol", 1, bad.base .. "/v1" }, { rec.error.code, rec.mirza.attempts, rec.mirza.endpoint })
    assert.same({ 0, 0 }, { e.fails, e.failed })
  end)

  it("moves it on HTTP 404 (a route that endpoint lacks), never holding it against that endpoint", function()
    local rec, e = through { "--fault", "http=404:no such thing" }
    moved(rec, 404)
    assert.same({ 0, 0 }, { e.fails, e.failed }, "404: rested for a route it does not have")
  end)
end)
