-- Batch jobs never destroy or lose a file (issue 17): INPUT given as
-- OUTPUT, a prompt file or any non-batch file as OUTPUT, a directory, an
-- empty input are refused with exit 2 and left untouched; `-`, /dev/stdout
-- and a FIFO take the records as they come; Ctrl-C says what was saved and
-- how to resume. And the records, closer to OpenAI's batch output:
-- custom_ids of rejected lines kept, request_id, the server's completion
-- id and HTTP error body, response null without a response, duration_s
-- over every attempt.
local mirza = require "mirza"
local batch = require "mirza.batch"
local batch_output = require "mirza.batch_output"
local json = mirza.json
local H = require "tests.helper"

local SCRIPT = H.source .. "/scripts/batch.lua"

local write = H.write_file

local function lines_of(text)
  local t = {}
  for l in text:gmatch("[^\n]+") do t[#t + 1] = l end
  return t
end

-- Records by custom_id from JSONL text.
local function by_id(text)
  local by = {}
  for _, l in ipairs(lines_of(text)) do
    local r = assert(json.decode(l))
    by[r.custom_id] = r
  end
  return by
end

-- `mirza scripts/batch.lua ARGS...` run in directory dir (nil: here) to
-- its end: exit code, stdout, stderr.
local function cli_in(dir, ...)
  local words = { H.q(H.mirza_bin), H.q(SCRIPT) }
  for _, a in ipairs { ... } do words[#words + 1] = H.q(a) end
  local err = H.tmpname(".err")
  local cd = dir and ("cd " .. H.q(dir) .. " && ") or ""
  local p = assert(io.popen(cd .. table.concat(words, " ") .. " 2>" .. H.q(err)))
  local out = p:read("a")
  local _, _, rc = p:close()
  local e = H.read_file(err)
  os.remove(err)
  return rc, out, e
end

local function cli(...)
  return cli_in(nil, ...)
end

local function item(id, ctl)
  return json.encode { custom_id = id, method = "POST", url = "/v1/chat/completions",
    body = { model = "m", messages = { { role = "user", content = "prompt " .. id } }, mirza_sim = ctl } }
end

describe("batch output files", function()
  local sim
  setup(function() sim = H.start_sim { "--parallel", "8", "--tok-rate", "0", "--ttft-ms", "0" } end)
  teardown(function() sim.stop() end)
  after_each(function() collectgarbage("collect") end)

  it("refuses INPUT as OUTPUT, by name or through a hard link, and leaves it as it was", function()
    local p, link = H.tmpname(".txt"), H.tmpname(".jsonl")
    write(p, "hello\nworld\n")
    local rc, _, err = cli(p, p, "--endpoint", sim.base, "--model", "m")
    assert.equal(2, rc)
    assert.truthy(err:find("INPUT and OUTPUT are the same file", 1, true), err)
    assert.equal("hello\nworld\n", H.read_file(p))
    assert(os.execute("ln " .. H.q(p) .. " " .. H.q(link)))
    rc, _, err = cli(p, link, "--endpoint", sim.base, "--model", "m")
    assert.equal(2, rc)
    assert.truthy(err:find("same file", 1, true), err)
    assert.equal("hello\nworld\n", H.read_file(p))
    assert.is_nil(io.open(batch_output.errors_path(link)), "an error file was written") -- nothing written at all
    os.remove(p)
    os.remove(link)
  end)

  it("refuses an OUTPUT whose lines are not batch records (a prompt file, batch input), untouched", function()
    local input, prompts, jsonl = H.tmpname(".txt"), H.tmpname(".txt"), H.tmpname(".jsonl")
    write(input, "one prompt\n")
    local cases = {
      [prompts] = "a prompt\nanother prompt\n",
      [jsonl] = item("a", {}) .. "\n" .. item("b", {}) .. "\n",
    }
    for path, text in pairs(cases) do
      write(path, text)
      local rc, _, err = cli(input, path, "--endpoint", sim.base, "--model", "m")
      assert.equal(2, rc)
      assert.truthy(err:find(path .. ":1 is not a batch output record", 1, true), err)
      assert.truthy(err:find("nothing was changed", 1, true), err)
      assert.equal(text, H.read_file(path))
      -- the library says the same
      local st, msg, code = batch.run { input = input, output = path, endpoints = { sim.base }, quiet = true }
      assert.is_nil(st, msg)
      assert.equal("output", code)
      assert.equal(text, H.read_file(path))
      assert.is_nil(io.open(batch_output.errors_path(path)), "an error file was written") -- nothing written at all
      os.remove(path)
    end
    -- a single line without its newline that is not ours: not cut
    write(prompts, "a prompt without newline")
    assert.equal("output", select(3, batch.run { input = input, output = prompts, endpoints = { sim.base },
      quiet = true }))
    assert.equal("a prompt without newline", H.read_file(prompts))
    os.remove(prompts)
    os.remove(input)
  end)

  it("still cuts a record torn by a kill, and gives a whole last record its newline back", function()
    local input, out = H.tmpname(".txt"), H.tmpname(".jsonl")
    write(input, "first\nsecond\n")
    assert(batch.run { input = input, output = out, endpoints = { sim.base }, model = "m", quiet = true,
      progress = false })
    local whole = H.read_file(out)
    local first = lines_of(whole)[1]
    -- torn: only the first record, then half of one; a file of the user's
    -- named like the temporary file the cut goes through stays as it was
    write(out, first .. "\n" .. first:sub(1, 30))
    write(out .. ".tmp", "mine\n")
    local st = assert(batch.run { input = input, output = out, endpoints = { sim.base }, model = "m", quiet = true,
      progress = false })
    assert.equal(1, st.skipped)
    assert.equal("mine\n", H.read_file(out .. ".tmp"))
    os.remove(out .. ".tmp")
    local by = by_id(H.read_file(out)) -- every line a whole record
    assert.is_table(by["line-1"])
    assert.is_table(by["line-2"])
    assert.equal(2, #lines_of(H.read_file(out)))
    -- whole but without its newline
    write(out, first)
    st = assert(batch.run { input = input, output = out, endpoints = { sim.base }, model = "m", quiet = true,
      progress = false })
    assert.equal(1, st.skipped)
    local got = H.read_file(out)
    assert.equal(first .. "\n", got:sub(1, #first + 1))
    assert.equal(2, #lines_of(got))
    os.remove(input)
    os.remove(out)
    os.remove(batch_output.errors_path(out))
  end)

  it("says a directory is not an OUTPUT, and an empty INPUT is nothing to do (exit 2, no traceback)", function()
    local input, dir = H.tmpname(".txt"), H.tmpname(".d")
    write(input, "hi\n")
    assert(os.execute("mkdir " .. H.q(dir)))
    local rc, _, err = cli(input, dir, "--endpoint", sim.base, "--model", "m")
    assert.equal(2, rc)
    assert.truthy(err:find(dir .. " is a directory: give OUTPUT as a file, e.g. " .. dir .. "/out.jsonl", 1, true),
      err)
    assert.falsy(err:find("traceback", 1, true), err)
    write(input, "\n  \n")
    local out = H.tmpname(".jsonl")
    rc, _, err = cli(input, out, "--endpoint", sim.base, "--model", "m")
    assert.equal(2, rc)
    assert.truthy(err:find("nothing to do", 1, true), err)
    assert.is_nil(io.open(out))
    assert.is_nil(io.open(batch_output.errors_path(out)))
    os.remove(dir)
    os.remove(input)
  end)

  it("streams records to stdout with -, /dev/stdout, and into a FIFO (no resume, no file named -)", function()
    local input, dir = H.tmpname(".txt"), H.tmpname(".d")
    write(input, "alpha\nbeta\n")
    assert(os.execute("mkdir " .. H.q(dir)))
    for _, target in ipairs { "-", "/dev/stdout" } do
      local rc, out, err = cli_in(dir, input, target, "--endpoint", sim.base, "--model", "m", "--quiet")
      assert.equal(0, rc, err)
      local by = by_id(out)
      assert.is_table(by["line-1"], out)
      assert.is_table(by["line-2"], out)
    end
    local dash = io.open(dir .. "/-")
    if dash then dash:close() end
    os.execute("rm -rf " .. H.q(dir))
    assert.is_nil(dash, "a file named - was written")
    local fifo, got = H.tmpname(".fifo"), H.tmpname(".out")
    assert(os.execute("mkfifo " .. H.q(fifo)))
    local reader = assert(io.popen("cat " .. H.q(fifo) .. " >" .. H.q(got) .. " & echo $!"))
    local cat_pid = tonumber(reader:read("l"))
    reader:close()
    local st = assert(batch.run { input = input, output = fifo, endpoints = { sim.base }, model = "m", quiet = true,
      progress = false })
    assert.equal(2, st.done_now)
    assert.truthy(H.wait_for(function() return not H.ps(cat_pid) or H.ps(cat_pid).stat:find("Z") end, 10))
    assert.equal(2, #lines_of(H.read_file(got)))
    os.remove(fifo)
    os.remove(got)
    os.remove(input)
  end)

  it("stops when a record cannot be written, saying why (a full disk: /dev/full)", function()
    local input = H.tmpname(".txt")
    write(input, "alpha\nbeta\n")
    local st, msg, code = batch.run { input = input, output = "/dev/full", endpoints = { sim.base }, model = "m",
      quiet = true, progress = false }
    assert.is_nil(st)
    assert.equal("write", code)
    assert.truthy(msg:find("cannot write /dev/full: ", 1, true), msg)
    os.remove(input)
  end)

  it("prints the usage on --help and exits 0", function()
    local rc, out = cli("--help")
    assert.equal(0, rc)
    assert.truthy(out:find("mirza batch INPUT OUTPUT", 1, true), out)
    assert.truthy(out:find("--endpoint URL", 1, true), out)
  end)
end)

describe("batch records", function()
  local sim
  setup(function() sim = H.start_sim { "--parallel", "8", "--tok-rate", "0", "--ttft-ms", "0" } end)
  teardown(function() sim.stop() end)
  after_each(function() collectgarbage("collect") end)

  local function run(lines, extra)
    local input, output = H.tmpname(".jsonl"), H.tmpname(".jsonl")
    write(input, table.concat(lines, "\n") .. "\n")
    local opts = { input = input, output = output, endpoints = { sim.base }, model = "m", quiet = true,
      progress = false }
    for k, v in pairs(extra or {}) do opts[k] = v end
    local st = assert(batch.run(opts))
    local by = H.batch_records(output)
    os.remove(input)
    os.remove(output)
    os.remove(batch_output.errors_path(output))
    return by, st
  end

  it("keeps the custom_id of a rejected line; a numeric custom_id is its string", function()
    local by = run {
      '{"custom_id":"wrong-url","method":"POST","url":"/v1/audio/speech","body":{}}',
      '{"custom_id":"get","method":"GET","url":"/v1/chat/completions","body":{}}',
      '{"custom_id":"no-body","method":"POST","url":"/v1/chat/completions"}',
      '{"custom_id":42,"prompt":"hi"}',
      '{"custom_id":{"x":1},"prompt":"hi"}',
    }
    for _, id in ipairs { "wrong-url", "get", "no-body" } do
      assert.is_table(by[id], id)
      assert.equal("input", by[id].error.code)
      assert.equal(json.null, by[id].response)
    end
    assert.truthy(by["wrong-url"].error.message:find("unsupported url", 1, true))
    assert.truthy(by.get.error.message:find("method must be POST", 1, true))
    assert.equal(json.null, by["42"].error)
    assert.equal(200, by["42"].response.status_code)
    assert.equal("input", by["line-5"].error.code) -- unreadable: the line number
  end)

  it("has request_id, the server's completion id, and the HTTP error body as the server sent it", function()
    local by = run({
      item("ok", { text = "Fine." }),
      item("bad", { fault = "http=400:nope" }),
      item("cut", { fault = "cut-after=2", answer_tokens = 10 }),
    }, { max_retries = 0, headers = { ["X-MTPLX-Request-Id"] = "fixed" } })
    local ok = by.ok
    assert.equal("chatcmpl-fixed", ok.response.body.id)
    assert.truthy(ok.response.request_id:match("^req_%x+$"), ok.response.request_id)
    local bad = by.bad
    assert.equal(400, bad.response.status_code)
    assert.is_string(bad.response.request_id)
    assert.equal("nope", bad.response.body.error.message)
    assert.equal("http", bad.error.code)
    assert.equal(json.null, by.cut.response) -- failed without a response
    assert.equal("closed", by.cut.error.code)
  end)

  it("takes the server's x-request-id (a recorded answer replayed)", function()
    local dir = H.tmpname(".rec")
    assert(os.execute("mkdir " .. H.q(dir)))
    local body = '{"id":"chatcmpl-rec","object":"chat.completion.chunk","choices":[{"index":0,"delta":'
      .. '{"content":"Hi."},"finish_reason":"stop"}]}'
    write(dir .. "/000001.request", "POST /v1/chat/completions\n\n{}")
    write(dir .. "/000001.response", "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
      .. "X-Request-Id: req_from_server\r\n\r\ndata: " .. body .. "\n\ndata: [DONE]\n\n")
    local rsim = H.start_sim { "--replay-dir", dir }
    local input, output = H.tmpname(".txt"), H.tmpname(".jsonl")
    write(input, "hello\n")
    assert(batch.run { input = input, output = output, endpoints = { rsim.base }, model = "m", quiet = true,
      progress = false })
    local r = by_id(H.read_file(output))["line-1"]
    assert.equal("req_from_server", r.response.request_id)
    assert.equal("chatcmpl-rec", r.response.body.id)
    assert.equal("Hi.", r.response.body.choices[1].message.content)
    rsim.stop()
    os.execute("rm -rf " .. H.q(dir))
    os.remove(input)
    os.remove(output)
    os.remove(batch_output.errors_path(output))
  end)

  it("--header-timeout S: an attempt with no response head in S seconds fails with the header timeout", function()
    local input, output = H.tmpname(".jsonl"), H.tmpname(".jsonl")
    finally(function()
      os.remove(input)
      os.remove(output)
      os.remove(batch_output.errors_path(output))
    end)
    write(input, item("queued", { fault = "head-delay=5000" }) .. "\n" .. item("quick") .. "\n")
    local t0 = mirza.now()
    local rc, _, err = cli(input, output, "--endpoint", sim.base, "--header-timeout", "0.5", "--max-retries", "0",
      "--quiet")
    assert.equal(1, rc, err)
    assert.is_true(mirza.now() - t0 < 4.5, "waited for the head past --header-timeout")
    local by = H.batch_records(output) -- the timeout in the error file, the answer in OUTPUT
    assert.equal("timeout", by.queued.error.code)
    assert.truthy(by.queued.error.message:find("no response head from .* after 0%.%d s %(header timeout"),
      by.queued.error.message)
    assert.equal(json.null, by.quick.error)
    rc, _, err = cli(input, output .. ".x", "--header-timeout", "soon")
    assert.equal(2, rc)
    assert.truthy(err:find("--header-timeout needs a number", 1, true), err)
    assert.truthy(err:find("[--header-timeout S]", 1, true), err) -- the usage line
    local _, help = cli("--help")
    assert.truthy(help:find("--header-timeout S", 1, true), help)
  end)

  it("counts every attempt and the waits between them in mirza.duration_s", function()
    local fsim = H.start_sim { "--fail-first", "2", "--retry-after", "1", "--tok-rate", "0", "--ttft-ms", "0" }
    local input, output = H.tmpname(".jsonl"), H.tmpname(".jsonl")
    write(input, item("r", { text = "done" }) .. "\n")
    assert(batch.run { input = input, output = output, endpoints = { fsim.base }, quiet = true, progress = false })
    local r = by_id(H.read_file(output)).r
    assert.equal(3, r.mirza.attempts)
    -- two 429s with Retry-After: 1, then the answer: at least 2 s in all
    assert.is_true(r.mirza.duration_s >= 2, ("duration_s %g"):format(r.mirza.duration_s))
    fsim.stop()
    os.remove(input)
    os.remove(output)
    os.remove(batch_output.errors_path(output))
  end)
end)

describe("batch interrupted", function()
  it("Ctrl-C: exit 130, the records so far kept whole, and how to resume", function()
    local sim = H.start_sim { "--parallel", "2", "--tok-rate", "40", "--ttft-ms", "0" }
    local input, out = H.tmpname(".txt"), H.tmpname(".jsonl")
    local prompts = {}
    for i = 1, 12 do prompts[i] = "prompt " .. i end
    write(input, table.concat(prompts, "\n") .. "\n")
    local runner = H.spawn_mirza(([[
      arg = { [-1] = "mirza", [0] = "batch", %q, %q, "--endpoint", %q, "--limit", "2", "--model", "m" }
      dofile(%q)
    ]]):format(input, out, sim.base, SCRIPT))
    assert.truthy(H.wait_for(function()
      local f = io.open(out)
      local n = f and select(2, f:read("a"):gsub("\n", "")) or 0
      if f then f:close() end
      return n >= 1
    end, 60, 0.02), "no record: " .. runner.output())
    runner.signal("INT")
    assert.equal(130, runner.wait(30))
    local text = runner.output()
    local saved, total = text:match("batch: interrupted: (%d+) of (%d+) items saved in ")
    assert.truthy(saved, text)
    assert.equal("12", total)
    local got = H.read_file(out)
    assert.equal("\n", got:sub(-1))
    assert.equal(tonumber(saved), #lines_of(got))
    assert.truthy(text:find("to resume, run: mirza batch " .. input .. " " .. out, 1, true), text)
    assert.truthy(text:find("\ninterrupted\n", 1, true), text)
    local st = assert(batch.run { input = input, output = out, endpoints = { sim.base }, model = "m", quiet = true,
      progress = false })
    assert.equal(tonumber(saved), st.skipped)
    assert.equal(12, #lines_of(H.read_file(out)))
    sim.stop()
    os.remove(input)
    os.remove(out)
    os.remove(batch_output.errors_path(out))
  end)
end)
