-- The fault matrix: every fault mirza-sim can inject, run through a real
-- stream over loopback HTTP, with the event a script sees at the end
-- (type, code, message) and the bytes of text kept before it. Each row
-- asserts its exact expected outcome; the whole table is printed at the
-- end so a change of behaviour shows up side by side with the others.
local mirza = require "mirza"
local H = require "tests.helper"

local TEXT = "a b c d e f" -- six tokens: "a ", "b ", ... "f"
local URL -- set in setup: messages name it

-- An HTTP error's message: the url requested first.
local function at(msg)
  return function() return URL .. ": " .. msg end
end

-- One row: the fault spec, request options, and what must come out.
-- message is an exact string, or a Lua pattern when pattern = true;
-- check(last, r) asserts the rest.
local rows = {
  { "(none)", want = { "done", nil, nil, 11 } },
  { "http=503", want = { "error", "http", at("HTTP 503 Service Unavailable: Service Unavailable"), 0 } },
  { "http=400:bad input", want = { "error", "http", at("HTTP 400 Bad Request: bad input"), 0 },
    check = function(ev) assert.equal("bad input", ev.error.message) end },
  { "http-text=502", want = { "error", "http", at("HTTP 502 Bad Gateway: Bad Gateway"), 0 } },
  { "http-html=503", want = { "error", "http", at("HTTP 503 Service Unavailable: 503 Service Unavailable"), 0 },
    check = function(ev) assert.equal(1, ev.retry_after) end },
  { "http-plain=500:model crashed",
    want = { "error", "http", at("HTTP 500 Internal Server Error: model crashed"), 0 } },
  { "http=429,retry-after=7", want = { "error", "http", at("HTTP 429 Too Many Requests: Too Many Requests"), 0 },
    check = function(ev) assert.equal(7, ev.retry_after) end },
  { "redirect=307", want = { "error", "http", function() return URL .. ": HTTP 307 Temporary Redirect to " .. URL ..
    "/moved (redirects are not followed: use that url)" end, 0 } },
  { "redirect=308:/v2/chat", want = { "error", "http", function() return URL .. ": HTTP 308 Permanent Redirect to " ..
    URL:match("^(http://[^/]+)") .. "/v2/chat (redirects are not followed: use that url)" end, 0 } },
  { "error-after=3", want = { "error", "server", "server error: simulated failure after 3 tokens", 6 } },
  { "cut-after=3", want = { "error", "closed", "^connection closed mid%-stream %(.+%)$", 6, pattern = true } },
  -- the simulator's gathered writes (--coalesce-writes) go out before the cut
  { "cut-after=3", ctl = { coalesce_writes = true, frames_per_chunk = 1 },
    want = { "error", "closed", "^connection closed mid%-stream %(.+%)$", 6, pattern = true } },
  { "stall-after=2", opts = { stall_timeout = 0.5 },
    want = { "error", "timeout", "^no data from .+ for 0%.%d s %(stall timeout: .*`stall_timeout`.*%)$", 4,
      pattern = true } },
  { "malformed-after=2", want = { "error", "protocol", "^malformed frame %(malformed JSON in SSE data at byte %d+%)",
    4, pattern = true } },
  { "malformed-after=2", opts = { on_bad_frame = "skip" }, want = { "done", nil, nil, 11 },
    check = function(ev) assert.equal(1, ev.skipped_frames) end },
  { "oversized=300000", opts = { max_event_bytes = 65536 },
    want = { "error", "protocol", "^.+ %(limit 65536 bytes%)$", 0, pattern = true } },
  { "utf8-split", text = "été à Noël", want = { "done", nil, nil, 14 },
    check = function(_, r) assert.equal("été à Noël", r.text) end },
  { "loop", text = false, body = { max_tokens = 30 }, want = { "done" },
    check = function(ev, r)
      assert.equal("length", ev.finish_reason)
      assert.equal(30, ev.usage.completion_tokens)
      assert.truthy(r.text:find("Wait, let me reconsider", 1, true))
    end },
  { "replay=" .. H.traces .. "/mtplx.reconstructed.midstream_error.sse",
    want = { "error", "server", "^server error: model owner made no progress", 8, pattern = true } },
  { "no-done", want = { "done", nil, nil, 11 },
    check = function(ev) assert.is_true(ev.no_done_marker) end },
  { "bad-utf8-after=2", want = { "done", nil, nil, 25 },
    check = function(ev, r)
      assert.equal(2, ev.invalid_utf8)
      assert.equal("a b A\u{FFFD}B\u{FFFD}C\u{1F600}Dc d e f", r.text)
    end },
  { "nul-after=2", want = { "done", nil, nil, 14 },
    check = function(_, r) assert.equal("a b a\0bc d e f", r.text) end },
  { "slow-head=100", opts = { stall_timeout = 0.4 }, want = { "done", nil, nil, 11 } },
  { "head-delay=1000", opts = { stall_timeout = 0.4 }, want = { "done", nil, nil, 11 } },
  { "head-delay=5000", opts = { header_timeout = 0.3 },
    want = { "error", "timeout", "^no response head from .+ after 0%.%d s %(header timeout: .*`header_timeout`.*%)$",
      0, pattern = true } },
  { "gzip", want = { "done", nil, nil, 11 } },
  { "gzip,http=400:bad", want = { "error", "http", at("HTTP 400 Bad Request: bad"), 0 } },
  { "crash-after=2", sim = "crash", want = { "error", "closed", "^connection closed mid%-stream %(.+%)$", 4,
    pattern = true } },
  { "crash-after=2", sim = "crash", ctl = { coalesce_writes = true, frames_per_chunk = 1 },
    want = { "error", "closed", "^connection closed mid%-stream %(.+%)$", 4, pattern = true } },
  { "error-after=2", sim = "llama", want = { "error", "server", "server error: simulated failure after 2 tokens", 4 } },
  { "no-done", sim = "llama", body = { stream_options = { include_usage = true } }, want = { "done", nil, nil, 11 },
    check = function(ev) assert.is_true(ev.no_done_marker) assert.equal(6, ev.usage.completion_tokens) end },
  { "(no server)", sim = "none", want = { "error", "refused", "^http://127%.0%.0%.1:%d+/.*: .+", 0, pattern = true } },
}

local FAST = { "--tok-rate", "0", "--ttft-ms", "0" }
local table_lines = {}

local function one_line(s, max)
  s = tostring(s or "-"):gsub("%c", " ")
  max = max or 72
  return #s > max and s:sub(1, max - 3) .. "..." or s
end

describe("fault matrix", function()
  local sims = {}
  setup(function()
    sims.mtplx = H.start_sim(FAST)
    sims.llama = H.start_sim { "--dialect", "llama", "--tok-rate", "0", "--ttft-ms", "0" }
    URL = sims.mtplx.url
  end)
  teardown(function()
    for _, s in pairs(sims) do s.stop() end
    print(("\n%-40s %-6s %-9s %6s  %s"):format("fault", "event", "code", "bytes", "message"))
    for _, l in ipairs(table_lines) do print(l) end
  end)
  after_each(function() collectgarbage("collect") end)

  -- A row's stream: which simulator, the body, the options.
  local function open_row(row)
    local sim = sims.mtplx
    if row.sim == "llama" then sim = sims.llama end
    if row.sim == "crash" then
      sims.crash = H.start_sim(FAST) -- crash-after ends that process
      sim = sims.crash
    end
    local body = H.chat_body("x", row.body)
    body.mirza_sim = { text = TEXT }
    if row.text ~= nil then body.mirza_sim.text = row.text or nil end
    if not row[1]:find("^%(") then body.mirza_sim.fault = row[1] end
    for k, v in pairs(row.ctl or {}) do body.mirza_sim[k] = v end
    if row.sim == "llama" then body.chat_template_kwargs = { enable_thinking = false } end
    local url = row.sim == "none" and ("http://127.0.0.1:%d/v1/chat/completions"):format(H.free_port()) or sim.url
    local req = { url = url, body = body, stall_timeout = 10 }
    for k, v in pairs(row.opts or {}) do req[k] = v end
    return mirza.open(req)
  end

  for i, row in ipairs(rows) do
    local label = row[1] .. (row.sim and row.sim ~= "none" and (" [" .. row.sim .. "]") or "")
      .. (row.opts and row.opts.on_bad_frame and " [skip]" or "")
    it(("%2d %s"):format(i, label), function()
      local s <close> = open_row(row)
      local r = H.drain(s, 30)
      local ev, w = r.last, row.want
      local short_label = one_line(label:gsub("^replay=.*/", "replay="), 40)
      table_lines[#table_lines + 1] = ("%-40s %-6s %-9s %6d  %s"):format(short_label, ev.type, ev.code or "-",
        #r.text + #r.think, one_line(ev.message))
      assert.equal(w[1], ev.type, ev.message)
      assert.equal(w[2], ev.code)
      local msg = type(w[3]) == "function" and w[3]() or w[3]
      if w.pattern then
        assert.matches(msg, ev.message)
      else
        assert.equal(msg, ev.message)
      end
      if w[4] then assert.equal(w[4], #r.text + #r.think) end
      if row.check then row.check(ev, r) end
    end)
  end
end)
