-- mirza.retry: the one classification of error codes (retry? whose
-- failure? the daemon gone?) and the one backoff, with the parameters of
-- each user (a batch retry, a pool's rest, a daemon restart, a turn's 409).
local retry = require "mirza.retry"

-- Run fn with math.random returning r.
local function with_random(r, fn)
  local real = math.random
  math.random = function() return r end -- luacheck: ignore 122
  local ok, err = pcall(fn)
  math.random = real -- luacheck: ignore 122
  if not ok then error(err, 0) end
end

describe("mirza.retry.classify", function()
  it("answers retry, blame and gone for every code", function()
    local cases = { -- code, status, retry, blame, gone
      { "refused", nil, true, "endpoint", true },
      { "closed", nil, true, "endpoint", true },
      { "timeout", nil, true, "endpoint", true },
      { "exited", nil, true, "endpoint", false },
      { "server", nil, true, nil, false },
      { "io", nil, false, nil, true },
      { "protocol", nil, false, nil, false },
      { "cancelled", nil, false, nil, false },
      { nil, nil, false, nil, false },
      { "http", 408, true, nil, false },
      { "http", 409, true, nil, false },
      { "http", 429, true, nil, false },
      { "http", 500, true, "request", false },
      { "http", 501, true, "request", false },
      { "http", 502, true, "endpoint", false },
      { "http", 503, true, "endpoint", false },
      { "http", 504, true, "endpoint", false },
      { "http", 400, false, nil, false },
      { "http", 401, false, nil, false },
      { "http", 404, false, nil, false },
      { "http", 413, false, nil, false },
      { "http", nil, false, nil, false },
    }
    for _, c in ipairs(cases) do
      local what = tostring(c[1]) .. " " .. tostring(c[2])
      local k = retry.classify(c[1], c[2])
      assert.same({ c[3], c[4], c[5] }, { k.retry, k.blame, k.gone }, what)
      assert.equal(c[3], retry.retryable(c[1], c[2]), what)
      assert.equal(c[4], retry.blame(c[1], c[2]), what)
      if c[1] ~= "http" then assert.equal(c[5], retry.gone(c[1]), what) end
    end
  end)

  it("is the rule of batch, pool and the daemon (one table, not copies)", function()
    assert.equal(retry.retryable, require("mirza.batch").retryable)
    local pool = require "mirza.pool"
    assert.equal(retry.blame, pool.blame)
    assert.is_true(pool.endpoint_failure("http", 500))
    assert.is_false(pool.endpoint_failure("http", 429))
  end)
end)

describe("mirza.retry.backoff", function()
  it("doubles from base, capped at max", function()
    with_random(0.5, function()
      assert.same({ 0.5, 1, 2, 4, 8, 16, 30, 30 }, { retry.backoff(1, 0.5, 30), retry.backoff(2, 0.5, 30),
        retry.backoff(3, 0.5, 30), retry.backoff(4, 0.5, 30), retry.backoff(5, 0.5, 30), retry.backoff(6, 0.5, 30),
        retry.backoff(7, 0.5, 30), retry.backoff(40, 0.5, 30) })
      assert.equal(2 ^ 9, retry.backoff(10, 1)) -- no cap (a daemon restart: its count is bounded instead)
    end)
  end)

  it("draws the jitter in [lo, hi] with one random number", function()
    with_random(0, function() assert.equal(4 * 0.75, retry.backoff(4, 0.5, 30, 0.75, 1.25)) end)
    with_random(1, function() assert.equal(4 * 1.25, retry.backoff(4, 0.5, 30, 0.75, 1.25)) end)
    with_random(0.5, function() assert.equal(30 * 0.75, retry.backoff(9, 0.5, 30, 0.5, 1)) end)
    with_random(1, function() assert.equal(30, retry.backoff(9, 0.5, 30, 0.5, 1)) end) -- capped, then jittered
  end)

  it("keeps each user's formula: batch retry, pool rest, turn 409 wait", function()
    local batch = require "mirza.batch"
    with_random(1, function()
      assert.equal(1, batch.backoff(2, { retry_base = 0.5, retry_max = 30 }))
      assert.equal(7.05, batch.backoff(2, { retry_base = 0.5, retry_max = 30 }, 7)) -- Retry-After wins
      assert.same({ 0.05, 0.1, 0.8, 0.8 }, { retry.backoff(1, 0.05, 0.8), retry.backoff(2, 0.05, 0.8),
        retry.backoff(5, 0.05, 0.8), retry.backoff(9, 0.05, 0.8) })
    end)
  end)
end)
