-- Batch jobs (mirza.batch, scripts/batch.lua) against mirza-sim: input
-- formats, OpenAI batch output records, per-item errors, retries (and
-- Retry-After), the repetition cut, a speed-up over several simulators, and
-- a run SIGKILLed halfway then resumed = the same records, none lost or
-- duplicated.
local mirza = require "mirza"
local batch = require "mirza.batch"
local batch_input = require "mirza.batch_input"
local batch_output = require "mirza.batch_output"
local batch_policy = require "mirza.batch_policy"
local retry = require "mirza.retry"
local json = mirza.json
local H = require "tests.helper"

local function write(path, lines)
  local f = assert(io.open(path, "wb"))
  f:write(table.concat(lines, "\n"), "\n")
  f:close()
end

-- Records of an output file, by custom_id (raises on a duplicate).
local function records(path)
  local by, n = {}, 0
  for line in io.lines(path) do
    local r = assert(json.decode(line))
    assert(not by[r.custom_id], "duplicate record " .. tostring(r.custom_id))
    by[r.custom_id] = r
    n = n + 1
  end
  return by, n
end

-- Remove a run's OUTPUT and its error file.
local function remove_output(output)
  os.remove(output)
  os.remove(batch_output.errors_path(output))
end

local function content(rec)
  return rec.response.body.choices[1].message.content
end

local function item(id, ctl, extra)
  local body = { messages = { { role = "user", content = "prompt " .. id } }, mirza_sim = ctl }
  for k, v in pairs(extra or {}) do body[k] = v end
  return json.encode { custom_id = id, method = "POST", url = "/v1/chat/completions", body = body }
end

local function run(opts)
  opts.quiet = true
  if opts.progress == nil then opts.progress = false end
  return assert(batch.run(opts))
end

describe("mirza.batch", function()
  local sim
  setup(function()
    sim = H.start_sim { "--parallel", "8", "--tok-rate", "0", "--ttft-ms", "0", "--verbose" }
  end)
  teardown(function() sim.stop() end)
  after_each(function() collectgarbage("collect") end)

  it("reads the three input formats and writes OpenAI batch output records", function()
    local input, output = H.tmpname(".jsonl"), H.tmpname(".jsonl")
    write(input, {
      item("a", { text = "Alpha answer.", reasoning = "Thinking about alpha." }, { model = "m1" }),
      json.encode { custom_id = "p", prompt = "hello", system = "be brief", mirza_sim = { text = "Prompt answer." } },
      "a plain text prompt",
      "",
      "{not json",
      item("bad400", { fault = "http=400:nope" }),
    })
    local st = run { input = input, output = output, endpoints = { sim.base }, model = "dflt" }
    local by, n, nbad = H.batch_records(output)
    assert.same({ 3, 2 }, { n, nbad }) -- the answers in OUTPUT, the input and HTTP errors in the error file
    assert.equal(5, st.total)
    assert.equal(2, st.errors)
    assert.same({ input = 1, http = 1 }, st.by_code)
    assert.equal(batch_output.errors_path(output), st.errors_file)
    local a = by.a
    assert.equal("batch_req_000001", a.id)
    assert.equal(json.null, a.error)
    assert.equal(200, a.response.status_code)
    local body = a.response.body
    assert.equal("chat.completion", body.object)
    assert.same({ "mirza-sim", "m1" }, { body.model, a.mirza.model }) -- the model that answered, the one asked
    assert.equal("Alpha answer.", content(a))
    assert.equal("Thinking about alpha.", body.choices[1].message.reasoning_content)
    assert.equal("stop", body.choices[1].finish_reason)
    assert.equal(5, body.usage.completion_tokens) -- 2 answer + 3 reasoning tokens
    assert.equal(1, a.mirza.attempts)
    assert.equal(sim.base .. "/v1", a.mirza.endpoint)
    assert.equal("Prompt answer.", content(by.p))
    assert.same({ "mirza-sim", "dflt" }, { by.p.response.body.model, by.p.mirza.model })
    -- a plain line is the user message as it is: the simulator's text for it
    local plain = assert(mirza.collect { url = sim.base .. "/v1/chat/completions",
      body = H.chat_body("a plain text prompt") })
    assert.equal(plain.text, content(by["line-3"]))
    assert.equal("input", by["line-5"].error.code)
    assert.truthy(by["line-5"].error.message:find("invalid JSON", 1, true))
    local bad = by.bad400
    assert.equal("http", bad.error.code)
    assert.equal(400, bad.response.status_code)
    assert.equal(1, bad.mirza.attempts) -- a 4xx is never retried
    os.remove(input)
    remove_output(output)
  end)

  it("refuses duplicate custom_ids before sending anything", function()
    local input = H.tmpname(".jsonl")
    write(input, { item("x", {}), item("x", {}) })
    local output = H.tmpname()
    local st, msg, code = batch.run { input = input, output = output, endpoints = { sim.base }, quiet = true }
    assert.is_nil(st)
    assert.equal("input", code)
    assert.truthy(msg:find("duplicate custom_id \"x\"", 1, true))
    assert.is_nil(io.open(output), "OUTPUT was written")
    assert.is_nil(io.open(batch_output.errors_path(output)), "the error file was written")
    os.remove(input)
  end)

  it("cuts a looping item early, closes its request and says so in the record", function()
    local input, output = H.tmpname(".jsonl"), H.tmpname(".jsonl")
    write(input, { item("loop", { fault = "loop", tok_rate = 400 }, { max_tokens = 4000 }) })
    local before = select(2, H.read_file(sim.log):gsub(" 499 ", ""))
    run { input = input, output = output, endpoints = { sim.base } }
    local r = records(output).loop
    assert.equal(json.null, r.error)
    assert.equal("repetition", r.response.body.choices[1].finish_reason)
    assert.equal("repetition", r.mirza.cut.reason)
    assert.is_string(r.mirza.cut.line)
    assert.is_true(r.mirza.tokens < 1000, "not cut early: " .. r.mirza.tokens)
    assert.truthy(H.wait_for(function() return select(2, H.read_file(sim.log):gsub(" 499 ", "")) > before end, 20),
      "the simulator did not see the request closed")
    os.remove(input)
    remove_output(output)
  end)

  it("prints progress lines and a summary", function()
    local input, output = H.tmpname(".jsonl"), H.tmpname(".jsonl")
    write(input, { item("s1", { text = "one two three four", tok_rate = 8 }), item("s2", { text = "x" }) })
    local lines = {}
    local st = run { input = input, output = output, endpoints = { sim.base }, progress = "auto", progress_every = 0.1,
      log = function(line) lines[#lines + 1] = line end }
    assert.is_true(#lines >= 1)
    local pattern = "^batch: %d/2 done, 0 errors, 0 retries, 0 cut, %d+ tok/s, ETA %S+; limit %d+ %(auto, .*%)$"
    assert.truthy(lines[#lines]:match(pattern), lines[#lines])
    assert.truthy(batch.summary(st, output):match("^batch: 2 items %(0 already done, 2 now: 2 ok, 0 errors, 0 cut%)"))
    os.remove(input)
    remove_output(output)
  end)
end)

describe("mirza.batch cancelled", function()
  it("stops at once when the task running it is cancelled: streams closed, no more records", function()
    local loop = require "mirza.loop"
    local sim = H.start_sim { "--parallel", "4", "--tok-rate", "20", "--ttft-ms", "0" }
    local lines = {}
    for i = 1, 12 do lines[i] = item("c" .. i, { answer_tokens = 10 }) end
    local input, output = H.tmpname(".jsonl"), H.tmpname(".jsonl")
    write(input, lines)
    local written
    loop.run(function()
      local job = loop.spawn(batch.run, { input = input, output = output, endpoints = { sim.base }, quiet = true,
        progress = false })
      local t_end = mirza.now() + 30
      local function n_lines()
        local f = io.open(output)
        local n = f and select(2, f:read("a"):gsub("\n", "")) or 0
        if f then f:close() end
        return n
      end
      while n_lines() < 1 and mirza.now() < t_end do mirza.sleep(0.01) end
      assert.is_true(mirza.streams() > 0)
      job:cancel()
      assert.equal(0, mirza.streams())
      written = H.read_file(output)
      mirza.sleep(0.6) -- long enough for another item to finish, were any still running
    end)
    assert.equal(written, H.read_file(output))
    local _, n = records(output)
    assert.is_true(n >= 1 and n < 12)
    sim.stop()
    os.remove(input)
    remove_output(output)
  end)
end)

describe("mirza.batch retries", function()
  it("retries a 429 with backoff until it succeeds, and never a 400", function()
    local sim = H.start_sim { "--fail-first", "2", "--tok-rate", "0", "--ttft-ms", "0" }
    local input, output = H.tmpname(".jsonl"), H.tmpname(".jsonl")
    write(input, { item("r", { text = "finally" }) })
    local st = run { input = input, output = output, endpoints = { sim.base }, retry_base = 0.05, max_retries = 3 }
    local r = records(output).r
    assert.equal("finally", content(r))
    assert.equal(3, r.mirza.attempts)
    assert.equal(2, st.retries)
    sim.stop()
    os.remove(input)
    remove_output(output)
  end)

  it("gives up after max_retries with the last error recorded", function()
    local sim = H.start_sim { "--fail-first", "100", "--retry-after", "0" }
    local input, output = H.tmpname(".jsonl"), H.tmpname(".jsonl")
    write(input, { item("r", {}) })
    local st = run { input = input, output = output, endpoints = { sim.base }, retry_base = 0.01, max_retries = 2 }
    local by, n = H.batch_records(output)
    assert.equal(0, n) -- the failure is in the error file
    local r = by.r
    assert.equal("http", r.error.code)
    assert.equal(429, r.response.status_code)
    assert.equal(3, r.mirza.attempts)
    assert.equal(1, st.errors)
    sim.stop()
    os.remove(input)
    remove_output(output)
  end)

  it("honours Retry-After", function()
    -- The first two chat requests answer 429 with Retry-After: 2 — the
    -- probe below, then the batch's first attempt.
    local sim = H.start_sim { "--fail-first", "2", "--retry-after", "2", "--tok-rate", "0", "--ttft-ms", "0" }
    local s <close> = mirza.open { url = sim.url, body = H.chat_body("probe") }
    local probe = s:next()
    assert.same({ "error", 429, 2 }, { probe.type, probe.status, probe.retry_after })
    local input, output = H.tmpname(".jsonl"), H.tmpname(".jsonl")
    write(input, { item("r", { text = "later" }) })
    local t0 = mirza.now()
    run { input = input, output = output, endpoints = { sim.base }, retry_base = 0.01 }
    local dt = mirza.now() - t0
    assert.equal("later", content(records(output).r))
    assert.is_true(dt >= 2, ("retried after %.2f s, before Retry-After"):format(dt))
    sim.stop()
    os.remove(input)
    remove_output(output)
  end)
end)

describe("mirza.batch at scale", function()
  it("is faster over several --parallel simulators than sequentially", function()
    local sims = {}
    for i = 1, 3 do sims[i] = H.start_sim { "--parallel", "4", "--tok-rate", "50", "--ttft-ms", "50" } end
    local lines = {}
    for i = 1, 12 do lines[i] = item("i" .. i, { answer_tokens = 16 }) end
    local input = H.tmpname(".jsonl")
    write(input, lines)
    local seq_out, par_out = H.tmpname(".jsonl"), H.tmpname(".jsonl")
    local t0 = mirza.now()
    run { input = input, output = seq_out, endpoints = { { url = sims[1].base, limit = 1 } } }
    local t_seq = mirza.now() - t0
    t0 = mirza.now()
    run { input = input, output = par_out, endpoints = { sims[1].base, sims[2].base, sims[3].base }, limit = 4 }
    local t_par = mirza.now() - t0
    local a, na = records(seq_out)
    local b, nb = records(par_out)
    assert.equal(12, na)
    assert.equal(12, nb)
    for id, r in pairs(a) do assert.equal(content(r), content(b[id])) end
    print(("\n  batch of 12: sequential %.2f s, 3 sims x 4 slots %.2f s: speed-up x%.1f"):format(t_seq, t_par,
      t_seq / t_par))
    assert.is_true(t_seq / t_par >= 3, ("speed-up only x%.2f"):format(t_seq / t_par))
    for _, s in ipairs(sims) do s.stop() end
    os.remove(input)
    remove_output(seq_out)
    remove_output(par_out)
  end)

  it("resumes a run SIGKILLed halfway: same records, none lost or duplicated", function()
    local sim = H.start_sim { "--parallel", "2", "--tok-rate", "40", "--ttft-ms", "20" }
    local lines = {}
    for i = 1, 16 do lines[i] = item("k" .. i, { answer_tokens = 12 }) end
    local input = H.tmpname(".jsonl")
    write(input, lines)
    local ref_out, out = H.tmpname(".jsonl"), H.tmpname(".jsonl")
    local runner = H.spawn_mirza(([[
      arg = { %q, %q, "--endpoint", %q, "--limit", "2", "--quiet" }
      dofile(%q)
    ]]):format(input, out, sim.base, H.source .. "/scripts/batch.lua"))
    local function count()
      local f = io.open(out)
      if not f then return 0 end
      local n = select(2, f:read("a"):gsub("\n", ""))
      f:close()
      return n
    end
    assert.truthy(H.wait_for(function() return count() >= 4 end, 60, 0.02), "no progress: " .. runner.output())
    runner.signal("KILL")
    runner.wait(30)
    local killed_at = count()
    assert.is_true(killed_at < 16, "the run finished before the kill")
    local f = assert(io.open(out, "ab")) -- a record torn by the kill
    f:write('{"id":"batch_req_000099","custom_id":"k1')
    f:close()
    local st = run { input = input, output = out, endpoints = { sim.base }, limit = 2 }
    assert.equal(killed_at, st.skipped)
    assert.equal(16 - killed_at, st.done_now)
    run { input = input, output = ref_out, endpoints = { sim.base }, limit = 2 }
    local got, n = records(out)
    local ref, nref = records(ref_out)
    assert.equal(16, n)
    assert.equal(16, nref)
    for id, r in pairs(ref) do
      assert.is_table(got[id], id)
      assert.equal(content(r), content(got[id]))
      assert.equal(r.id, got[id].id)
    end
    print(("\n  killed after %d of 16 records, resumed %d"):format(killed_at, st.done_now))
    sim.stop()
    os.remove(input)
    remove_output(out)
    remove_output(ref_out)
  end)
end)

describe("mirza.batch pieces", function()
  it("parses the input shapes and rejects bad ones with a reason", function()
    local line = '{"custom_id":"c","method":"POST","url":"/v1/chat/completions","body":{"model":"m"}}'
    local it = batch_input.parse_line(line, 1)
    assert.same({ custom_id = "c", body = { model = "m" }, line = 1, kind = "chat", url = "/v1/chat/completions" }, it)
    it = batch_input.parse_line('{"prompt":"hi","system":"sys","max_tokens":5}', 2)
    assert.equal("line-2", it.custom_id)
    assert.same({ { role = "system", content = "sys" }, { role = "user", content = "hi" } }, it.body.messages)
    assert.equal(5, it.body.max_tokens)
    assert.is_nil(it.body.prompt)
    it = batch_input.parse_line("just text\r", 3)
    assert.same({ { role = "user", content = "just text" } }, it.body.messages)
    assert.is_false(batch_input.parse_line("   ", 4))
    local bad, msg = batch_input.parse_line('{"custom_id":"x","url":"/v1/audio/speech","body":{}}', 5)
    assert.is_nil(bad)
    assert.truthy(msg:find("unsupported url", 1, true))
    assert.equal("1", batch_input.parse_line('{"custom_id":1,"prompt":"p"}', 6).custom_id) -- a number: its string
    local _, not_string = batch_input.parse_line('{"custom_id":true,"prompt":"p"}', 6)
    assert.truthy(not_string:find("custom_id must be a string"))
    assert.truthy(select(2, batch_input.parse_line('{"foo":1}', 7)):find("needs", 1, true))
  end)

  it("retries only retryable failures, backs off exponentially and honours retry_after", function()
    for _, c in ipairs { { "refused" }, { "closed" }, { "timeout" }, { "server" }, { "http", 408 }, { "http", 409 },
      { "http", 429 }, { "http", 500 }, { "http", 503 } } do
      assert.is_true(retry.retryable(c[1], c[2]), c[1] .. tostring(c[2]))
    end
    for _, c in ipairs { { "http", 400 }, { "http", 401 }, { "http", 404 }, { "http", 422 }, { "protocol" },
      { "input" } } do
      assert.is_false(retry.retryable(c[1], c[2]), c[1] .. tostring(c[2]))
    end
    local o = { retry_base = 1, retry_max = 5 }
    for n, hi in ipairs { 1, 2, 4, 5, 5 } do
      local d = batch_policy.backoff(n, o)
      assert.is_true(d >= hi / 2 and d <= hi, ("retry %d waited %g"):format(n, d))
    end
    local d = batch_policy.backoff(1, o, 7)
    assert.is_true(d >= 7 and d < 7.1)
  end)

  it("resume keeps complete records (a duplicate counted once) and drops a torn last line", function()
    local path = H.tmpname(".jsonl")
    local f = assert(io.open(path, "wb"))
    local a, b = '{"custom_id":"a","error":null,"response":null}', '{"custom_id":"b","error":null,"response":null}'
    f:write(a, "\n", b, "\n", a, "\n", '{"custom_id":"c"')
    f:close()
    local done, n = batch_output.resume(path)
    assert.equal(2, n)
    assert.same({ a = true, b = true }, done)
    assert.equal(a .. "\n" .. b .. "\n" .. a .. "\n", H.read_file(path))
    os.remove(path)
    local none, zero = batch_output.resume(path) -- no file yet
    assert.same({}, none)
    assert.equal(0, zero)
  end)
end)
