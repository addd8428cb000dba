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
  it("answers class, retry, blame, fault and gone for every code", function()
    local cases = { -- code, status, class, retry, blame, fault, gone
      { "refused", nil, "endpoint", true, "endpoint", false, true },
      { "closed", nil, "endpoint", true, "endpoint", false, true },
      { "timeout", nil, "endpoint", true, "endpoint", false, true },
      { "exited", nil, "endpoint", true, "endpoint", false, false },
      { "server", nil, "retry", true, nil, true, false },
      { "io", nil, "item", false, nil, false, true },
      { "protocol", nil, "item", false, nil, false, false },
      { "cancelled", nil, "item", false, nil, false, false },
      { nil, nil, "item", false, nil, false, false },
      { "http", 408, "retry", true, nil, false, false },
      { "http", 409, "retry", true, nil, false, false },
      { "http", 429, "retry", true, nil, false, false },
      { "http", 500, "retry", true, "request", true, false },
      { "http", 505, "retry", true, "request", true, false },
      { "http", 507, "retry", true, "request", true, false },
      { "http", 501, "unsupported", false, nil, false, false },
      { "http", 404, "unsupported", false, nil, false, false },
      { "http", 405, "unsupported", false, nil, false, false },
      { "http", 502, "endpoint", true, "endpoint", false, false },
      { "http", 503, "endpoint", true, "endpoint", false, false },
      { "http", 504, "endpoint", true, "endpoint", false, false },
      { "http", 400, "item", false, nil, false, false },
      { "http", 401, "item", false, nil, false, false },
      { "http", 403, "item", false, nil, false, false },
      { "http", 413, "item", false, nil, false, false },
      { "http", 422, "item", false, nil, false, false },
      { "http", nil, "item", false, nil, false, false },
    }
    for _, c in ipairs(cases) do
      local what = tostring(c[1]) .. " " .. tostring(c[2])
      local k = retry.classify(c[1], c[2])
      assert.same({ c[3], c[4], c[5], c[6], c[7] }, { k.class, k.retry, k.blame, k.fault, k.gone }, what)
      assert.equal(c[3], retry.class(c[1], c[2]), what)
      assert.equal(c[4], retry.retryable(c[1], c[2]), what)
      assert.equal(c[5], retry.blame(c[1], c[2]), what)
      if c[1] ~= "http" then assert.equal(c[7], retry.gone(c[1]), what) end
    end
  end)

  it("retries exactly the retry and endpoint classes; blames only endpoint and 5xx", function()
    for status = 400, 599 do
      local k = retry.classify("http", status)
      assert.equal(k.class == "retry" or k.class == "endpoint", k.retry, status)
      assert.equal(k.class == "endpoint", k.blame == "endpoint", status)
      assert.equal(k.fault, k.blame == "request", status) -- an HTTP fault is a 5xx the engine may move
    end
  end)

  it("fails an engine's turn over on a 500, not on a 429 or a 501 (the rule batch, pool and engine call)", function()
    assert.is_not_nil(retry.blame("http", 500))
    assert.is_nil(retry.blame("http", 429))
    assert.is_nil(retry.blame("http", 501)) -- no such route: another daemon of the pool is no better
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
    local batch_policy = require "mirza.batch_policy"
    with_random(1, function()
      assert.equal(1, batch_policy.backoff(2, { retry_base = 0.5, retry_max = 30 }))
      assert.equal(7.05, batch_policy.backoff(2, { retry_base = 0.5, retry_max = 30 }, 7)) -- Retry-After wins
      assert.same({ 0.05, 0.1, 0.8, 0.8 }, { retry.backoff(1, 0.05, 0.8), retry.backoff(2, 0.05, 0.8),
        retry.backoff(5, 0.05, 0.8), retry.backoff(9, 0.05, 0.8) })
    end)
  end)
end)

describe("mirza.retry.delay", function()
  it("is the server's Retry-After with up to 50 ms of jitter, else the jittered backoff", function()
    with_random(1, function()
      assert.equal(3.05, retry.delay(1, 3, 0.5, 8))
      assert.equal(0.05, retry.delay(4, 0, 0.5, 8))
      assert.same({ 0.5, 1, 8 },
        { retry.delay(1, nil, 0.5, 8), retry.delay(2, nil, 0.5, 8), retry.delay(9, nil, 0.5, 8) })
      assert.equal(1, retry.delay(2, -1, 0.5, 8)) -- a negative Retry-After is none
    end)
    with_random(0, function() assert.equal(0.25, retry.delay(1, nil, 0.5, 8)) end)
  end)

  it("is the one wait of a batch retry and mirza.collect's (the OpenAI SDKs' defaults)", function()
    with_random(0.5, function()
      local batch_policy = require "mirza.batch_policy"
      assert.equal(retry.delay(3, nil, 0.5, 30), batch_policy.backoff(3, { retry_base = 0.5, retry_max = 30 }))
    end)
    assert.same({ retries = 2, base = 0.5, max = 8, wait_max = 60 }, retry.REQUEST)
  end)
end)
