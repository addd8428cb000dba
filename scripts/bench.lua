--- bench.lua - what a streamed token costs mirza, next to curl on the same source.
---
---   mirza bench [options]                  the whole table (docs/performance.md)
---   mirza bench TOKENS [SIM-BINARY]        the core loop alone (the classic figure)
---
--- Options: --tokens N (default 200000), --runs R (median of R, default 3;
--- the runs go in rounds over the rows, so a drift weighs on all alike),
--- --url BASE (an OpenAI-compatible /v1 base URL instead of starting mirza-sim),
--- --sim PATH, --json PATH (also write the results there), --only a,b (case
--- names, or prefixes), --million-lines N (the million row's input, default
--- 1000000), --case NAME (internal: one run, printed as JSON).
---
--- It starts mirza-sim in its fastest mode (--tok-rate 0 --ttft-ms 0
--- --progress-every 0 --heartbeat-ms 0) and runs every case in a fresh
--- `mirza` child process, so each figure carries its own RSS: CPU per token
--- is the child's os.clock() over the run divided by the deltas it got
--- (the simulator excluded). curl is run on the very same requests
--- (`curl -sN`, CPU from the shell's `times`), and each figure is also given
--- as a ratio to curl on the same source (frames per chunk, pacing).
--- The concurrency rows (`--only concurrent`) run 1, 16, 64 and 256 engine
--- turns (and raw core loops) at once in one process as mirza.loop tasks,
--- sharing the same total of tokens, and add a second table: aggregate
--- throughput over the one-stream row, RSS per extra stream, the fewest
--- tokens any stream had at half time, and the simulator's CPU per token.
--- The prefix-cache rows (`--only affinity`) run a batch of 4 preambles of
--- 2,000 tokens x 50 questions over two mirza-sims of 2 slots each, with
--- mirza.pool's prefix affinity on and off, and give the share of prompt
--- tokens the daemons served from their cache.
--- Issue 31: `--only short` runs 5,000 items of 4 tokens through one batch
--- @64 and the official openai Node SDK on the same items (items/s, CPU
--- per item, RSS; skipped without node and npm), then issue 38's 400 paced
--- 4-token answers at max_tokens 16, 32, 33, 256 and 4096 (and the SDK);
--- `--only million` (never in the whole table: minutes) runs `mirza batch`
--- on 1,000,000 short lines (--million-lines N) and again on its finished
--- output (wall, lines/s, peak RSS); `--only collect` runs 1,024
--- mirza.collect calls at once, 100 tokens each at 50 tokens/s.
--- Issue 41: `--only fill` (never in the whole table) runs `mirza batch` as
--- a user does, `--endpoint URL` (the default limit) and `URL@N` swept,
--- against sims: llama-server -np 1, 4 and 64, 64 slots saturating, a
--- vLLM-like 256 sequences, 256 slots peaking near 16 (h100), an
--- Ollama-like 4 in parallel, a pool of a 16-slot and a 4-slot server, and
--- a 64-slot server another client holds 48 slots of; items/s, wall, when
--- each endpoint finished its share and the limit it settled on, and per
--- server the default beside the best fixed limit and @4.
local mirza = require "mirza"
local json = mirza.json

local MIRZA = arg[-1] or "mirza"
local SCRIPT = arg[0]

-- ------------------------------------------------------------ options

local function parse(a)
  local o = { tokens = 200000, runs = 3 }
  local i = 1
  while a[i] do
    local k, v = a[i], a[i + 1]
    if k == "--tokens" then o.tokens = assert(tonumber(v), "--tokens N")
    elseif k == "--runs" then o.runs = assert(tonumber(v), "--runs N")
    elseif k == "--url" then o.url = v
    elseif k == "--sim" then o.sim = v
    elseif k == "--json" then o.json = v
    elseif k == "--only" then o.only = v
    elseif k == "--million-lines" then o.million_lines = assert(math.tointeger(tonumber(v)), "--million-lines N")
    elseif k == "--case" then o.case = v
    elseif k == "--params" then o.params = json.decode(v)
    elseif k == "--help" or k == "-h" then
      io.write("usage: mirza bench [--tokens N] [--runs R] [--url BASE] [--sim PATH] [--json PATH]",
        " [--only a,b] [--million-lines N]\n       mirza bench TOKENS [SIM]   (the core loop alone)\n")
      os.exit(0)
    else error("bench: unknown option " .. tostring(k), 0) end
    i = i + 2
  end
  return o
end

-- ------------------------------------------------------------ the source

local function sh_quote(s)
  return "'" .. tostring(s):gsub("'", [['\'']]) .. "'"
end

-- Start mirza-sim on a free port (extra: more arguments, a shell-quoted
-- string); returns its base URL and pid.
local function start_sim(bin, extra)
  bin = bin or require("mirza.daemon").find_sim() -- $MIRZA_SIM, next to mirza, build/, PATH
  local port_file = os.tmpname()
  os.remove(port_file)
  local p = assert(io.popen(("%s --port 0 --port-file %s --tok-rate 0 --ttft-ms 0 --progress-every 0"
    .. " --heartbeat-ms 0 --parallel 1024 --context-window 100000000 --quiet %s >/dev/null 2>&1 & echo $!")
    :format(sh_quote(bin), sh_quote(port_file), extra or "")))
  local pid = p:read("l")
  p:close()
  local port
  for _ = 1, 1000 do
    local f = io.open(port_file)
    port = f and tonumber(f:read("a"))
    if f then f:close() end
    if port then break end
    mirza.sleep(0.01)
  end
  os.remove(port_file)
  assert(port, "mirza-sim did not start")
  return ("http://127.0.0.1:%d/v1"):format(port), pid
end

-- The request body of a run: p.tokens deltas, p.reasoning of them
-- reasoning, p.fpc frames per chunk, p.rate tokens/s (0: flat out).
local function body(p)
  local think = math.floor(p.tokens * (p.reasoning or 0) + 0.5)
  return {
    model = "bench", stream = true, max_tokens = p.tokens + 10,
    messages = { { role = "user", content = "bench" } },
    enable_thinking = think > 0,
    mirza_sim = { answer_tokens = p.tokens - think, reasoning_tokens = think, tok_rate = p.rate or 0,
      ttft_ms = p.ttft_ms or 0, frames_per_chunk = p.fpc or 1, coalesce_writes = p.coalesce or nil },
  }
end

-- A number of this process from a /proc/self file (the first capture of
-- pattern); nil when unknown (no /proc).
local function proc_self(file, pattern)
  local f = io.open("/proc/self/" .. file)
  if not f then return nil end
  local n = tonumber(f:read("a"):match(pattern))
  f:close()
  return n
end

-- Peak resident set of this process, in KiB.
local function rss_kb() return proc_self("status", "VmHWM:%s*(%d+)") end

-- ------------------------------------------------------------ runners (child side)
-- Each takes the run's parameters and returns {tokens=, cpu=, wall=}.

local runners = {}

-- The core loop: `for ev in s:events()` over a raw stream.
function runners.core(p)
  local s <close> = mirza.open { url = p.url .. "/chat/completions", body = body(p), hold = p.hold,
    merge = p.hold and true or nil }
  local count = 0
  local c0, t0 = os.clock(), mirza.now()
  for ev in s:events() do
    local ty = ev.type
    if ty == "text" or ty == "think" then count = count + (ev.deltas or 1) -- merged (p.hold): several
    elseif ty == "error" then error(ev.message) end
  end
  return { tokens = count, cpu = os.clock() - c0, wall = mirza.now() - t0 }
end

-- The lighter loop: `for kind, text in s:chunks()` (no table per delta).
function runners.chunks(p)
  local s <close> = mirza.open { url = p.url .. "/chat/completions", body = body(p) }
  local count = 0
  local c0, t0 = os.clock(), mirza.now()
  for kind, x in s:chunks() do
    if kind == "text" or kind == "think" then count = count + 1
    elseif kind == "error" then error(x.message) end
  end
  return { tokens = count, cpu = os.clock() - c0, wall = mirza.now() - t0 }
end

-- The core loop over batches: `s:next_batch()` (events that arrived together).
function runners.batch(p)
  local s <close> = mirza.open { url = p.url .. "/chat/completions", body = body(p) }
  local count = 0
  local c0, t0 = os.clock(), mirza.now()
  while true do
    local b = s:next_batch()
    if not b then break end
    for i = 1, #b do
      local ty = b[i].type
      if ty == "text" or ty == "think" then count = count + 1
      elseif ty == "error" then error(b[i].message) end
    end
  end
  return { tokens = count, cpu = os.clock() - c0, wall = mirza.now() - t0 }
end

-- Prefix affinity (issue 18 item 6): p.preambles distinct preambles of
-- p.preamble_tokens tokens (4 bytes each, as mirza-sim counts them), each
-- asked p.questions questions, shuffled in a fixed order (in turn, A B C D
-- A B ..., 4 slots answering in order would keep each preamble on its
-- slot by chance, with or without affinity), as one batch
-- over two mirza-sims (llama dialect, --parallel p.parallel: a prompt
-- cache per slot), p.affinity on or off; the share of prompt tokens the
-- daemons said they served from cache.
function runners.affinity(p)
  local batch = require "mirza.batch"
  local bases, pids = {}, {}
  for i = 1, 2 do
    bases[i], pids[i] = start_sim(p.sim, "--dialect llama --parallel " .. p.parallel .. (p.sim_args or ""))
  end
  local pre = {}
  for k = 1, p.preambles do
    local words, n = { ("Document %d."):format(k) }, 0
    while n < p.preamble_tokens * 4 do
      words[#words + 1] = ("w%d-%d"):format(k, #words)
      n = n + #words[#words] + 1
    end
    pre[k] = table.concat(words, " ")
  end
  local items = {}
  for q = 1, p.questions do
    for k = 1, p.preambles do
      items[#items + 1] = { custom_id = ("d%d-q%d"):format(k, q), kind = "chat", line = #items + 1, body = {
        messages = { { role = "system", content = pre[k] }, { role = "user", content = ("Question %d?"):format(q) } },
        max_tokens = 8, mirza_sim = { answer_tokens = 8, tok_rate = 0, ttft_ms = 0 } } }
    end
  end
  local x = 12345
  for i = #items, 2, -1 do -- Fisher-Yates on a fixed linear congruential sequence
    x = (x * 1103515245 + 12345) % 2147483648
    local j = x % i + 1
    items[i], items[j] = items[j], items[i]
  end
  local out = os.tmpname()
  os.remove(out)
  local c0, t0 = os.clock(), mirza.now()
  local ok, st = pcall(batch.run, { items = items, output = out, endpoints = bases, limit = p.parallel,
    model = "bench", quiet = true, progress = false, affinity = p.affinity })
  local cpu, wall = os.clock() - c0, mirza.now() - t0
  os.remove(out)
  for _, pid in ipairs(pids) do os.execute("kill " .. pid) end
  assert(ok and st, tostring(st))
  return { cpu = cpu, wall = wall, items = st.done_now, errors = st.errors, share = batch.cached_share(st),
    cached = st.cached_tokens, prompt = st.cache_prompt_tokens }
end

local function new_engine(p)
  return require("mirza.engine").new { base_url = p.url, daemon = false, config_file = false,
    model_id = "bench", dialect = "mtplx", auto_reload = false, log = function() end, hold = p.hold }
end

-- An engine turn: e:say with sinks in p.route mode ("token", "sentence").
function runners.engine(p)
  local e = new_engine(p)
  assert(e:load())
  local count = 0
  local function sink() end
  local req = body(p)
  local c0, t0 = os.clock(), mirza.now()
  local st, res = e:say("bench", { mode = p.route, think_mode = p.route, answer = sink, think = sink, merge = p.merge,
    max_tokens = req.max_tokens, body_extra = { enable_thinking = req.enable_thinking, mirza_sim = req.mirza_sim } })
  local cpu, wall = os.clock() - c0, mirza.now() - t0
  assert(st, res)
  count = (e.last and e.last.tokens) or count
  assert(not res.cut, "the turn was cut")
  e:close()
  return { tokens = count, cpu = cpu, wall = wall }
end

-- N concurrent streams in one process, each a mirza.loop task: p.streams
-- of them share p.tokens (the same total work whatever N), each an engine
-- turn (e:say, its own engine and session id, sinks in p.route mode) or,
-- with p.core, a raw `for ev in s:events()`. Besides the aggregate
-- {tokens, cpu, wall}: the fewest tokens any stream had when half of the
-- total had arrived (`min_mid`, the fair share being `mid / streams`), the
-- fewest at the end (`min_end`, of `per_stream`) and the tasks that failed.
local function concurrent_task(p, i, seen)
  if p.core then
    return function()
      local s <close> = mirza.open { url = p.url .. "/chat/completions", body = body(p) }
      for ev in s:events() do
        local ty = ev.type
        if ty == "text" or ty == "think" then seen(i, 1)
        elseif ty == "error" then error(ev.message) end
      end
    end
  end
  local e = new_engine(p)
  assert(e:load())
  local req = body(p)
  local function sink(_, ev) seen(i, ev.deltas or 1) end
  local opts = { mode = p.route, think_mode = p.route, answer = sink, think = sink, max_tokens = req.max_tokens,
    body_extra = { enable_thinking = req.enable_thinking, mirza_sim = req.mirza_sim } }
  return function()
    local st, res = e:say("bench", opts)
    assert(st, res)
    assert(not res.cut, "the turn was cut")
    e:close()
  end
end

function runners.concurrent(p)
  local loop = require "mirza.loop"
  local n = p.streams
  local per = { tokens = p.tokens // n }
  for k, v in pairs(p) do if per[k] == nil then per[k] = v end end
  -- Fairness is judged once every stream flows (flat out, a saturated
  -- simulator answers the last requests late: that is its queue, not the
  -- client's scheduler): from the first delta of the last stream to start,
  -- the fewest new tokens a stream still running had when half of the
  -- tokens still to come had arrived, next to the fair share. The window
  -- lasts at least 5 of a stream's token intervals: when the last stream
  -- starts late, half of what is left can come within a few ms, less than
  -- one token of a paced stream, and a stream one token from its end
  -- looked starved that was not.
  local counts, total, grand = {}, 0, per.tokens * n
  local started, base, base_total, t_first, t_all, min_mid, fair_mid = 0, nil, 0, nil, nil, nil, nil
  local window = p.rate > 0 and 5 / p.rate or 0
  local function judge()
    local m, live = math.huge, 0
    for k = 1, n do
      if base[k] < per.tokens then live, m = live + 1, math.min(m, counts[k] - base[k]) end
    end
    min_mid, fair_mid = m, live > 0 and (total - base_total) // live or 0
  end
  local function seen(i, deltas) -- deltas: a merged event of e:say joins several
    local c = counts[i]
    if c == 0 then
      started = started + 1
      if started == 1 then t_first = mirza.now() end
      if started == n then
        t_all, base, base_total = mirza.now(), table.move(counts, 1, n, 1, {}), total
      end
    end
    counts[i], total = c + deltas, total + deltas
    if base and not min_mid and 2 * (total - base_total) >= grand - base_total and mirza.now() - t_all >= window then
      judge()
    end
  end
  local l = loop.new()
  local fns = {}
  for i = 1, n do counts[i], fns[i] = 0, concurrent_task(per, i, seen) end
  local c0, t0 = os.clock(), mirza.now()
  local _, errs, nerr = loop.gather(fns, { loop = l })
  local cpu, wall = os.clock() - c0, mirza.now() - t0
  assert(nerr == 0, select(2, next(errs)))
  if base and not min_mid then judge() end -- all ended within the window
  return { tokens = total, cpu = cpu, wall = wall, streams = n, per_stream = per.tokens,
    min_mid = min_mid or 0, fair_mid = fair_mid or 0, spread_ms = t_all and (t_all - t_first) * 1000,
    min_end = math.min(table.unpack(counts, 1, n)) }
end

-- Write syscalls of this process so far.
local function write_calls() return proc_self("io", "syscw:%s*(%d+)") end

-- A batch job (issue 20 item 4): p.streams items, each p.tokens //
-- p.streams tokens paced at p.rate, through mirza.batch with one endpoint
-- @p.streams (all in flight at once),
-- p.progress (a live progress line every 0.25 s, to stderr). Besides
-- {tokens, cpu, wall}: write calls per record (OUTPUT is a file).
function runners.batchjob(p)
  local batch = require "mirza.batch"
  local items = p.items or p.streams
  local per = p.tokens // items
  local input, output = os.tmpname(), os.tmpname()
  local f = assert(io.open(input, "w"))
  local b = body { tokens = per, reasoning = p.reasoning, rate = p.rate, fpc = 1 }
  b.max_tokens = p.max_tokens or b.max_tokens
  for i = 1, items do
    b.messages[1].content = "bench " .. i
    f:write(json.encode { custom_id = "item-" .. i, body = b }, "\n")
  end
  f:close()
  os.remove(output)
  -- with p.progress, the CPU of the progress line itself: making the line
  -- and writing it (to stderr, as on a terminal: redraw in place)
  local policy = require "mirza.batch_policy"
  local spent, lines, line_of = 0, 0, policy.progress_line
  local log = p.progress and function(line, live)
    local c = os.clock()
    io.stderr:write(live and ("\r\27[K" .. line) or (line .. "\n"))
    spent, lines = spent + os.clock() - c, lines + 1
  end
  if p.progress then
    policy.progress_line = function(...)
      local c = os.clock()
      local l = line_of(...)
      spent = spent + os.clock() - c
      return l
    end
  end
  local w0, c0, t0 = write_calls(), os.clock(), mirza.now()
  local st, err = batch.run { input = input, output = output, endpoints = { { url = p.url, limit = p.streams } },
    model = "bench", quiet = not p.progress, progress = p.progress or false, hold = p.hold,
    repetition = p.repetition, log = log }
  local cpu, wall, w1 = os.clock() - c0, mirza.now() - t0, write_calls()
  policy.progress_line = line_of
  os.remove(input)
  os.remove(output)
  assert(st, err)
  assert(st.errors == 0 and st.done_now == items, "batch: items failed")
  return { tokens = st.tokens, cpu = cpu, wall = wall, records = st.done_now,
    writes_per_record = w0 and w1 and (w1 - w0) / st.done_now,
    progress_share = p.progress and spent / wall, progress_lines = p.progress and lines }
end

-- 1,024 mirza.collect calls at once (issue 31 item 3): p.streams
-- mirza.loop tasks, each collecting an answer of p.tokens tokens paced at
-- p.rate tokens/s (mirza_sim.tok_rate); tokens are the answers' usage
-- (completion_tokens).
function runners.collect(p)
  local loop = require "mirza.loop"
  local req = body(p)
  local req_opts = { url = p.url .. "/chat/completions", body = req }
  local fns = {}
  for i = 1, p.streams do
    fns[i] = function()
      local r, err = mirza.collect(req_opts)
      assert(r, err)
      return r.usage and r.usage.completion_tokens or 0
    end
  end
  local c0, t0 = os.clock(), mirza.now()
  local got, errs, nerr = loop.gather(fns, { loop = loop.new() })
  local cpu, wall = os.clock() - c0, mirza.now() - t0
  assert(nerr == 0, select(2, next(errs)))
  local tokens = 0
  for i = 1, p.streams do tokens = tokens + got[i] end
  assert(tokens == p.streams * p.tokens, ("collect: %d tokens, expected %d"):format(tokens, p.streams * p.tokens))
  return { tokens = tokens, cpu = cpu, wall = wall, records = p.streams }
end

-- A structured answer (issue 18 item 3): about p.tokens tokens of JSON
-- records as mirza-sim's text override, read by the core loop, through
-- mirza.jsonstage at depth 2 (each record decoded as it completes) when
-- p.stage: the stage's cost per token is the difference of the two rows.
function runners.json(p)
  local recs, n = {}, 0
  while n < p.tokens * 4 do
    recs[#recs + 1] = ('{"id": %d, "name": "Record %d", "score": %d.5, "tags": ["a", "b"], "ok": true}')
      :format(#recs, #recs, #recs % 100)
    n = n + #recs[#recs] + 2
  end
  local b = body(p)
  b.mirza_sim.text, b.max_tokens = '{"records": [' .. table.concat(recs, ", ") .. "]}", p.tokens * 4
  local s <close> = mirza.open { url = p.url .. "/chat/completions", body = b }
  local it, _, _, closer = require("mirza.pipeline").compose(s:events(),
    p.stage and { { name = "json", fn = require("mirza.jsonstage").stage, opts = { depth = 2 } } } or {})
  local _ <close> = closer
  local count, values = 0, 0
  local c0, t0 = os.clock(), mirza.now()
  for ev in it do
    local ty = ev.type
    if ty == "text" then count = count + 1
    elseif ty == "json" then values = values + 1
    elseif ty == "error" then error(ev.message) end
  end
  assert(not p.stage or values == #recs, "json stage: records missing")
  return { tokens = count, cpu = os.clock() - c0, wall = mirza.now() - t0 }
end

-- Cancel latency: a paced turn cancelled after 20 deltas; the time from
-- e:cancel() to the end of the turn (connection closed, cut delivered).
function runners.cancel(p)
  local e = new_engine(p)
  assert(e:load())
  local n, t_cancel, cut = 0, nil, nil
  local req = body { tokens = 100000, rate = 1000, fpc = 1 }
  for ev in e:turn("bench", { body_extra = { mirza_sim = req.mirza_sim }, max_tokens = req.max_tokens }) do
    if ev.type == "text" then
      n = n + 1
      if n == 20 then t_cancel = mirza.now(); e:cancel() end
    elseif ev.type == "cut" then cut = ev.reason end
  end
  local wall = mirza.now() - t_cancel
  assert(cut == "cancelled", "no cut event")
  e:close()
  return { tokens = 0, cpu = 0, wall = wall }
end

-- ------------------------------------------------------------ the cases (parent side)

local function case_list(n, o)
  local paced = math.min(n, 20000)
  local L = {}
  local function add(name, kind, p) p.kind = kind; p.name = name; L[#L + 1] = p end
  for _, src in ipairs { { "", 1, 0, n }, { " 16/chunk", 16, 0, n }, { " pre-rendered", 1, 0, n, true },
    { " paced 10k/s", 1, 10000, paced } } do
    local tag, fpc, rate, tokens, co = src[1], src[2], src[3], src[4], src[5]
    local function p(t)
      t.fpc, t.rate, t.tokens, t.coalesce = fpc, rate, tokens, co
      t.reasoning = t.reasoning or 0.25
      return t
    end
    add("curl -sN" .. tag, "curl", p {})
    add("core loop" .. tag, "core", p {})
    if fpc == 16 then add("core next_batch" .. tag, "batch", p {}) end
    if co then
      add("core chunks" .. tag, "chunks", p {})
    end
    add("engine token 25%" .. tag, "engine", p { route = "token" })
    if rate > 0 then -- paced: the engine's hold (5 ms) off, and the core loop with it
      add("engine token 25% hold off" .. tag, "engine", p { route = "token", hold = false })
      add("core loop hold 5 ms" .. tag, "core", p { hold = 0.005 })
    end
    if rate == 0 then
      add("engine sentence 25%" .. tag, "engine", p { route = "sentence" })
      -- the same turn one event per delta (merge = false): what a script stage sees
      add("engine token 25% per delta" .. tag, "engine", p { route = "token", merge = false })
    end
    if fpc == 1 and rate == 0 and not co then
      add("engine token 0%", "engine", p { route = "token", reasoning = 0 })
      add("engine sentence 0%", "engine", p { route = "sentence", reasoning = 0 })
    end
  end
  for _, k in ipairs { 1, 16, 64, 256 } do
    add(("engine x%d streams"):format(k), "concurrent", { streams = k, tokens = n, fpc = 1, rate = 0,
      reasoning = 0.25, route = "token" })
  end
  for _, k in ipairs { 1, 16, 64, 256 } do
    add(("core loop x%d streams"):format(k), "concurrent", { streams = k, tokens = n, fpc = 1, rate = 0,
      reasoning = 0.25, core = true })
  end
  -- paced, so the simulator is not the bottleneck and the client's scheduler
  -- shows: 16 fast streams (5,000 tokens/s each), 256 as from real daemons
  -- (100 tokens/s each), 2 s
  add("engine x16 streams paced 5k/s", "concurrent", { streams = 16, tokens = 16 * 10000, fpc = 1, rate = 5000,
    reasoning = 0.25, route = "token" })
  add("engine x256 streams paced 100/s", "concurrent", { streams = 256, tokens = 256 * 200, fpc = 1, rate = 100,
    reasoning = 0.25, route = "token" })
  add("core loop x256 streams paced 100/s", "concurrent", { streams = 256, tokens = 256 * 200, fpc = 1, rate = 100,
    reasoning = 0.25, core = true })
  -- Scale (issue 20): one stream paced at 50 tokens/s (the per-token
  -- figure the 1,024 are held to), then 1,024 of them at once (51,200
  -- tokens/s), raw, as engine turns and as one batch @1024; then a batch
  -- job at a daemon's pace (256 streams at 40 tokens/s: 10,240 tokens/s),
  -- and with a live progress line.
  add("core loop x1 paced 50/s", "concurrent", { streams = 1, tokens = 300, fpc = 1, rate = 50, reasoning = 0.25,
    core = true })
  add("core loop x1024 paced 50/s", "concurrent", { streams = 1024, tokens = 1024 * 100, fpc = 1, rate = 50,
    reasoning = 0.25, core = true })
  add("engine x1024 paced 50/s", "concurrent", { streams = 1024, tokens = 1024 * 100, fpc = 1, rate = 50,
    reasoning = 0.25, route = "token" })
  add("batch x1024 paced 50/s", "batchjob", { streams = 1024, tokens = 1024 * 100, rate = 50, reasoning = 0.25 })
  add("batch x256 paced 40/s", "batchjob", { streams = 256, tokens = 256 * 80, rate = 40, reasoning = 0.25 })
  add("batch x256 paced 40/s 400-token items", "batchjob", { streams = 256, tokens = 256 * 400, rate = 40,
    reasoning = 0.25 })
  -- a longer batch, as a real one is: 1,024 items through the 256 slots,
  -- each slot's connection kept for its next item
  add("batch x256 paced 40/s 1024 items", "batchjob", { streams = 256, items = 1024, tokens = 1024 * 80, rate = 40,
    reasoning = 0.25 })
  -- libcurl alone on the same three batches: the floor under them
  add("batch x256 paced 40/s, libcurl alone", "floor", { streams = 256, tokens = 256 * 80, rate = 40,
    reasoning = 0.25 })
  add("batch x256 400-token items, libcurl alone", "floor", { streams = 256, tokens = 256 * 400, rate = 40,
    reasoning = 0.25 })
  add("batch x256 1024 items, libcurl alone", "floor", { streams = 256, items = 1024, tokens = 1024 * 80, rate = 40,
    reasoning = 0.25 })
  add("batch x256 paced 40/s progress", "batchjob", { streams = 256, tokens = 256 * 80, rate = 40,
    reasoning = 0.25, progress = true })
  for _, on in ipairs { true, false } do -- 4 preambles of 2,000 tokens x 50 questions, two daemons
    add(("prefix affinity %s"):format(on and "on" or "off"), "affinity", { affinity = on, preambles = 4,
      preamble_tokens = 2000, questions = 50, parallel = 2 })
  end
  -- issue 32's shape, as measured on two real llama-servers of 2 slots: 4
  -- preambles of ~1,000 tokens x 8 questions, shuffled, the sims' cache a
  -- prompt per slot cached once its prefill is done (at 5,000 prompt
  -- tokens/s: a cold preamble takes 0.2 s); the ideal is 87.5 %
  for _, on in ipairs { true, false } do
    add(("prefix affinity %s, 4x1000x8 per-slot cache"):format(on and "on" or "off"), "affinity",
      { affinity = on, preambles = 4, preamble_tokens = 1000, questions = 8, parallel = 2,
        sim_args = " --prompt-cache slots --prefill-rate 5000" })
  end
  for _, st in ipairs { false, true } do
    add(st and "core loop + json stage" or "core loop JSON answer", "json",
      { tokens = n, fpc = 1, rate = 0, stage = st })
  end
  -- Issue 31. Short items: 5,000 chat items of 4 tokens (max_tokens 4)
  -- through one batch @64 against a flat-out mirza-sim of 64 slots of its
  -- own, where an item's fixed cost is everything: with the batch's
  -- defaults, and the peer: the official openai Node SDK, 64 workers each
  -- awaiting a streamed create() read to the end, on the same items and
  -- the same sim. Their own table: items/s, CPU per item, RSS.
  local function short(t)
    for k, v in pairs { streams = 64, items = 5000, tokens = 5000 * 4, max_tokens = 4, rate = 0, fpc = 1, reasoning = 0,
      group = "short", sim_args = "--parallel 64" } do t[k] = v end
    return t
  end
  add("short items @64", "batchjob", short {})
  add("short items @64 openai SDK (node)", "node", short {})
  -- Issue 38: the common classification batch, 400 items whose answers
  -- are 4 tokens (20 ms to the first token, then 100 tokens/s) @64, at
  -- max_tokens 16, 32, 33, 256 and 4096: when a stream is read may not
  -- depend on max_tokens (a rule keyed on it made 33 and up 4.5x slower).
  -- Answers of 1 and 16 tokens too, and beside each length the same
  -- items read as they come (`hold = 0`: every stream eager, the best a
  -- reader can do).
  -- The same with 5,000 items (only with --only short: minutes).
  local function classify(t)
    local items = t.items or 400
    for k, v in pairs { streams = 64, items = items, tokens = items * (t.answer or 4), rate = 100, ttft_ms = 20,
      fpc = 1, reasoning = 0, group = "short", sim_args = "--parallel 64", explicit = items > 400 } do t[k] = v end
    return t
  end
  for _, items in ipairs { 400, 5000 } do
    for _, len in ipairs { 1, 4, 16 } do
      local tag = (items == 400 and "" or (" %d items"):format(items)) .. (len == 4 and "" or (" %d-token"):format(len))
      for _, mt in ipairs { 16, 32, 33, 256, 4096 } do
        add(("short paced%s max_tokens %d"):format(tag, mt), "batchjob",
          classify { items = items, answer = len, max_tokens = mt })
      end
      add(("short paced%s max_tokens 256 hold 0"):format(tag), "batchjob",
        classify { items = items, answer = len, max_tokens = 256, hold = 0 })
    end
  end
  add("short paced openai SDK (node)", "node", classify { max_tokens = 256 })
  add("short paced 5000 items openai SDK (node)", "node", classify { items = 5000, max_tokens = 256 })
  -- A 1,000,000-line input (--million-lines N) through `mirza batch` @64
  -- on the same sim, then again on its finished output (a rerun with
  -- nothing left to do), and first a small input of 1,024 lines: what the
  -- items in flight hold. One run each (minutes); only when asked for
  -- (`--only million`).
  add("million lines @64", "million", { lines = o.million_lines or 1000000, small = 1024, streams = 64,
    max_tokens = 4, group = "million", sim_args = "--parallel 64", explicit = true })
  -- 1,024 mirza.collect calls at once in mirza.loop tasks, 100 tokens
  -- each paced at 50 tokens/s (as from real daemons): CPU per token and RSS.
  add("collect x1024 paced 50/s", "collect", { streams = 1024, tokens = 100, rate = 50, fpc = 1, reasoning = 0 })
  add("start-up (mirza -e '')", "startup", {})
  add("cancel latency", "cancel", {})
  -- Issue 41: how full `mirza batch` keeps a server by default, next to
  -- fixed limits (URL@N) swept over 1 … 256 as far as the server serves
  -- more (from @4 on servers of 16 slots or more: @1 and @2 take 4 and 2
  -- times @4's wall there), each run against sims of its own (fresh,
  -- idle): llama-server -np 1, 4 and 64 at 50 tokens/s a slot (100 ms to
  -- the first token, as issue 41's); a 64-slot server whose rate saturates
  -- (1,778 tokens/s at 64 in flight, 190 at 4); a vLLM-like one (256
  -- sequences, no /props, vLLM's /metrics; saturating toward 4,000
  -- tokens/s); the H100 curve (256 slots announced, best near 16: 256
  -- tokens/s at 1, ~1,590 at 16, 1,460 at 64, 1,030 at 256); an Ollama-like
  -- one (4 in parallel, announcing nothing, a goroutine per connection); a
  -- pool of a 16-slot and a 4-slot server; and a 64-slot server 48 of whose
  -- slots another client's `mirza batch` holds throughout. @4 (the default
  -- limit until issue 41) is the floor the default must beat. Explicit:
  -- `--only fill`.
  local function fill(server, servers, items, tokens, sweep, load)
    for _, k in ipairs { false, table.unpack(sweep) } do
      local at = k and (type(k) == "table" and k or { k })
      add(("fill %s, %s"):format(server, at and "@" .. table.concat(at, " + @") or "default"), "fill",
        { group = "fill", explicit = true, servers = servers, at = at, items = items, tokens = tokens, load = load })
    end
  end
  local llama = "--dialect llama --metrics --ttft-ms 0 --reasoning-tokens 0 "
  local np = "--dialect llama --ttft-ms 100 --reasoning-tokens 0 --tok-rate 50 --answer-tokens 20 --parallel "
  local wide = { 4, 8, 16, 32, 64, 128, 256 }
  fill("llama -np 1", { np .. 1 }, 16, 20, { 1, 2, 4 })
  fill("llama -np 4", { np .. 4 }, 32, 20, { 1, 2, 4, 8, 16 })
  fill("llama -np 64", { np .. 64 }, 128, 20, { 4, 8, 16, 32, 64, 128 })
  fill("64-slot saturating", { llama .. "--parallel 64 --step-growth vllm --tok-rate 50 --answer-tokens 20" }, 64, 20,
    { 4, 8, 16, 32, 64, 128 })
  fill("vLLM-like 256 seqs", { "--dialect llama --no-route /props --vllm-metrics --ttft-ms 0 --reasoning-tokens 0"
    .. " --parallel 256 --step-growth vllm --tok-rate 256 --answer-tokens 20" }, 512, 20, wide)
  fill("H100-shaped", { llama .. "--parallel 256 --step-growth h100 --tok-rate 256 --answer-tokens 32" }, 256, 32, wide)
  fill("Ollama-like 4 parallel", { np .. "4 --threads-http 0 --no-route /props --no-route /health"
    .. [[ --route '/api/version={"version":"0.12.6"}']] }, 32, 20, { 1, 2, 4, 8, 16 })
  fill("pool 16 + 4 slots", { llama .. "--parallel 16 --tok-rate 50 --answer-tokens 20",
    llama .. "--parallel 4 --tok-rate 50 --answer-tokens 20" }, 100, 20, { { 4, 4 }, { 8, 4 }, { 16, 4 }, { 32, 4 } })
  fill("shared 64 (48 held)", { np .. "64 --metrics" }, 64, 20, { 4, 8, 16, 32, 64 }, 48)
  return L
end

local function source_key(c)
  return ("%s/%s%s"):format(c.fpc, c.rate, c.coalesce and "/c" or "")
end

local function median(xs)
  table.sort(xs)
  local n = #xs
  if n == 0 then return nil end
  return n % 2 == 1 and xs[(n + 1) // 2] or (xs[n // 2] + xs[n // 2 + 1]) / 2
end

-- The shell words that bound a command to n seconds: scripts/timeout
-- beside this script (GNU timeout, gtimeout or perl's alarm: macOS has no
-- timeout); installed, without it: GNU timeout, else gtimeout, else perl.
local timeout_tool
local function timeout_prefix(n)
  if not timeout_tool then
    local beside = (SCRIPT:match("^(.*)/[^/]*$") or ".") .. "/timeout"
    if beside:sub(1, 1) ~= "/" then -- absolute: the commands it bounds may cd first
      local pwd = io.popen("pwd")
      beside = (pwd and pwd:read("l") or ".") .. "/" .. beside
      if pwd then pwd:close() end
    end
    local f = io.open(beside)
    if f then
      f:close()
      timeout_tool = sh_quote(beside)
    else
      local p = io.popen("command -v timeout || command -v gtimeout")
      local found = p and p:read("l")
      if p then p:close() end
      timeout_tool = found and sh_quote(found) .. " -k 2" or "perl -e 'alarm shift; exec @ARGV'"
    end
  end
  return ("%s %d"):format(timeout_tool, n)
end

local function run_cmd(cmd)
  local f = assert(io.popen(cmd))
  local out = f:read("a")
  local ok, _, code = f:close()
  return out, ok, code
end

-- One run of a case in a fresh mirza process.
local function run_child(c)
  local params = json.encode(c)
  local out, ok = run_cmd(("%s %s --case %s --params %s 2>&1"):format(sh_quote(MIRZA), sh_quote(SCRIPT),
    sh_quote(c.kind), sh_quote(params)))
  local line = out:match("BENCH (%b{})")
  if not ok or not line then return nil, out end
  return json.decode(line)
end

-- A request body as JSON in a temporary file (for curl and curl_floor):
-- its path, for the caller to remove.
local function body_file(b)
  local f = os.tmpname()
  local h = assert(io.open(f, "w"))
  h:write(json.encode(b))
  h:close()
  return f
end

-- curl on the same request: CPU from the shell's `times` (children's
-- user and system time), RSS from /usr/bin/time when there is one.
local function run_curl(c)
  local f = body_file(body(c))
  local time = io.open("/usr/bin/time") and "/usr/bin/time -f 'RSS %M' " or ""
  local cmd = ("bash -c %s 2>&1"):format(sh_quote(("%scurl -sN -H 'Content-Type: application/json' --data-binary @%s"
    .. " %s/chat/completions > /dev/null; times"):format(time, sh_quote(f), c.url)))
  local t0 = mirza.now()
  local out = run_cmd(cmd)
  local wall = mirza.now() - t0
  os.remove(f)
  local lines = {}
  for l in out:gmatch("[^\n]+") do lines[#lines + 1] = l end
  local u_m, u_s, s_m, s_s = (lines[#lines] or ""):match("(%d+)m([%d.]+)s%s+(%d+)m([%d.]+)s")
  if not u_m then return nil, out end
  return { tokens = c.tokens, cpu = u_m * 60 + u_s + s_m * 60 + s_s, wall = wall,
    rss_kb = tonumber(out:match("RSS (%d+)")) }
end

-- libcurl alone on a batch row's traffic (tests/c/curl_floor, built
-- beside mirza in a build tree): the same items, as many at a time, read
-- every 0.25 s (the cheapest a reader can be: what earlier versions' batch
-- tick did) and thrown away. Its CPU is the floor under the
-- batch's: what the kernel and libcurl cost before mirza does anything.
local function run_floor(c)
  local bin = (MIRZA:match("^(.*)/[^/]*$") or ".") .. "/curl_floor"
  local exists = io.open(bin)
  if not exists then return nil, "skipped (" .. bin .. " not found: built with the tests, cmake's build tree)" end
  exists:close()
  local items = c.items or c.streams
  local b = body { tokens = c.tokens // items, reasoning = c.reasoning, rate = c.rate, fpc = 1 }
  b.stream_options = { include_usage = true } -- as mirza.batch asks
  local f = body_file(b)
  local tick = 0.25
  local out = run_cmd(("%s %s %s %d %d %d 2>&1"):format(sh_quote(bin), sh_quote(c.url .. "/chat/completions"),
    sh_quote(f), items, c.streams, math.floor(tick * 1000 + 0.5)))
  os.remove(f)
  local r = json.decode(out:match("(%b{})") or "null")
  if type(r) ~= "table" or r.ok ~= items then return nil, "curl_floor failed: " .. out end
  return { tokens = c.tokens // items * items, cpu = r.cpu, wall = r.wall }
end

-- The peer of the short rows: the official openai Node SDK (npm `openai`,
-- the version tests/sdk/run.sh pins, installed as it does into
-- BUILD/npm and found there), 64 workers each awaiting a streamed
-- create() read to the end. CPU: the node process's own
-- (process.cpuUsage) over the run; RSS: its maxRSS.
local SDK_VERSION = "6.49.0" -- tests/sdk/run.sh's OPENAI_VERSION, read from it when the source tree is there

local NODE_PEER = [[
const [dir, url, items, workers, body] = process.argv.slice(1);
const path = require('node:path');
const OpenAI = require('node:module').createRequire(path.resolve(dir, 'package.json'))('openai').default;
const req = JSON.parse(body), n = Number(items);
const client = new OpenAI({ baseURL: url, apiKey: 'bench', maxRetries: 0 });
let next = 0, done = 0, tokens = 0;
async function worker() {
  while (next < n) {
    const i = ++next;
    const messages = [{ role: 'user', content: 'bench ' + i }];
    const stream = await client.chat.completions.create({ ...req, messages });
    for await (const chunk of stream) {
      const d = chunk.choices && chunk.choices[0] && chunk.choices[0].delta;
      if (d && d.content) tokens++;
    }
    done++;
  }
}
(async () => {
  const c0 = process.cpuUsage(), t0 = process.hrtime.bigint();
  await Promise.all(Array.from({ length: Number(workers) }, worker));
  const c = process.cpuUsage(c0), wall = Number(process.hrtime.bigint() - t0) / 1e9;
  console.log('BENCH ' + JSON.stringify({ records: done, tokens, cpu: (c.user + c.system) / 1e6, wall,
    rss_kb: process.resourceUsage().maxRSS }));
})().catch((e) => { console.error((e && e.stack) || String(e)); process.exit(1); });
]]

-- The SDK's directory (installed there when it is not yet), or nil and why.
local function sdk_dir()
  if os.getenv("MIRZA_SDK_TEST") == "skip" then return nil, "skipped (MIRZA_SDK_TEST=skip is set)" end
  if not (os.execute("command -v node >/dev/null 2>&1") and os.execute("command -v npm >/dev/null 2>&1")) then
    return nil, "skipped (node and npm are needed: Debian packages nodejs and npm; scripts/setup.sh installs them)"
  end
  local build = MIRZA:match("^(.*)/[^/]*$")
  local cache = build and io.open(build .. "/CMakeCache.txt")
  if not cache then
    return nil, "skipped (needs mirza from a cmake build tree: the SDK is kept in BUILD/npm, as tests/sdk/run.sh does)"
  end
  cache:close()
  local src = SCRIPT:match("^(.*)/scripts/[^/]*$")
  local pin = src and io.open(src .. "/tests/sdk/run.sh")
  local version = pin and pin:read("a"):match("\nOPENAI_VERSION=([%w.-]+)") or SDK_VERSION
  if pin then pin:close() end
  local dir = build .. "/npm"
  local function installed()
    local f = io.open(dir .. "/node_modules/openai/package.json")
    if not f then return false end
    local ok, meta = pcall(json.decode, f:read("a"))
    f:close()
    return ok and type(meta) == "table" and meta.version == version
  end
  if not installed() then
    os.execute("mkdir -p " .. sh_quote(dir))
    if not io.open(dir .. "/package.json") then
      local f = io.open(dir .. "/package.json", "w")
      if f then f:write('{"private": true, "description": "mirza: the SDK conformance test"}\n'); f:close() end
    end
    io.stderr:write(("bench: installing openai@%s into %s\n"):format(version, dir))
    local out = run_cmd(("cd %s && %s npm install --no-audit --no-fund --ignore-scripts --save-exact"
      .. " --fetch-retries=2 --fetch-timeout=60000 %s 2>&1"):format(sh_quote(dir), timeout_prefix(300),
      sh_quote("openai@" .. version)))
    if not installed() then
      return nil, ("skipped (cannot install openai@%s into %s: %s)"):format(version, dir,
        (out:match("([^\n]+)\n*$") or "npm failed"))
    end
  end
  return dir
end

local function run_node(c)
  local dir, why = sdk_dir()
  if not dir then return nil, why end
  local b = body { tokens = c.tokens // c.items, reasoning = c.reasoning, rate = c.rate, fpc = 1 }
  b.max_tokens = c.max_tokens or b.max_tokens
  b.stream_options = { include_usage = true } -- as mirza.batch asks
  local out = run_cmd(("%s node -e %s %s %s %d %d %s 2>&1"):format(timeout_prefix(600), sh_quote(NODE_PEER),
    sh_quote(dir), sh_quote(c.url), c.items, c.streams, sh_quote(json.encode(b))))
  local line = out:match("BENCH (%b{})")
  local r = line and json.decode(line)
  if not r or r.records ~= c.items then return nil, "node failed: " .. out end
  return r
end

-- `mirza batch` as a user runs it, in a child; its peak RSS (VmHWM) and
-- CPU (os.clock) written by os.exit (wrapped by -e) to a file, the wall
-- time the parent's, the records it left in OUTPUT counted by wc -l.
local EXIT_HOOK = [[local file, exit = os.getenv("MIRZA_BENCH_EXIT"), os.exit
os.exit = function(...)
  local h = io.open("/proc/self/status")
  local s = h and h:read("a") or ""
  if h then h:close() end
  local o = io.open(file, "w")
  if o then o:write(s:match("VmHWM:%s*(%d+)") or "-", " ", os.clock(), "\n"); o:close() end
  return exit(...)
end]]

local function run_batch_cli(c, input, output)
  local hook = os.tmpname()
  local t0 = mirza.now()
  local out, ok = run_cmd(("MIRZA_BENCH_EXIT=%s %s -e %s batch %s %s --endpoint %s --model bench --quiet 2>&1")
    :format(sh_quote(hook), sh_quote(MIRZA), sh_quote(EXIT_HOOK), sh_quote(input), sh_quote(output),
      sh_quote(("%s@%d"):format(c.url, c.streams))))
  local wall = mirza.now() - t0
  local h = io.open(hook)
  local rss, cpu = (h and h:read("l") or ""):match("^(%S+) (%S+)")
  if h then h:close() end
  os.remove(hook)
  if not ok then return nil, "mirza batch failed: " .. out end
  local records = tonumber((run_cmd("wc -l < " .. sh_quote(output))))
  return { wall = wall, cpu = tonumber(cpu), rss_kb = tonumber(rss), records = records }
end

-- n short chat lines with a custom_id, written 10,000 at a time.
local function write_lines(path, n, max_tokens)
  local f = assert(io.open(path, "w"))
  local buf = {}
  for i = 1, n do
    buf[#buf + 1] = ('{"custom_id": "m-%d", "messages": [{"role": "user", "content": "Question %d?"}], '
      .. '"max_tokens": %d}\n'):format(i, i, max_tokens)
    if #buf == 10000 then f:write(table.concat(buf)); buf = {} end
  end
  f:write(table.concat(buf))
  f:close()
end

-- The million rows (one run each): c.small lines (what the process and
-- the items in flight hold), then c.lines, then the same again on its
-- finished output (a rerun that finds nothing left to do).
local function measure_million(c)
  local row = { name = c.name, kind = c.kind, group = c.group, lines = c.lines, small_lines = c.small }
  local input, output = os.tmpname(), os.tmpname()
  local function step(key, lines, fresh)
    if fresh then
      write_lines(input, lines, c.max_tokens)
      os.remove(output)
    end
    local r, err = run_batch_cli(c, input, output)
    if r and r.records ~= lines then
      r, err = nil, ("%d records in the output, %d expected"):format(r.records or 0, lines)
    end
    if not r then return nil, ("%s (%d lines): %s"):format(key, lines, err) end
    row[key] = r
    return true
  end
  local ok, err = step("small", c.small, true)
  if ok then ok, err = step("run", c.lines, true) end
  if ok then ok, err = step("rerun", c.lines, false) end
  os.remove(input)
  os.remove(output)
  if not ok then row.skipped = err end
  return row
end

local function run_startup()
  local t0 = mirza.now()
  local ok = os.execute(("%s -e ''"):format(sh_quote(MIRZA)))
  return ok and { tokens = 0, cpu = 0, wall = mirza.now() - t0 } or nil, "mirza -e '' failed"
end

local clk_tck
-- CPU seconds process `pid` (the simulator) has used so far, from `ps -o
-- time=` where there is no /proc (macOS: [[dd-]hh:]mm:ss.cc); nil when
-- unknown (--url).
local function ps_cpu(pid)
  local p = io.popen("ps -o time= -p " .. math.tointeger(pid) .. " 2>/dev/null")
  local t = p and p:read("l") or ""
  if p then p:close() end
  local days, clock = t:match("^%s*(%d+)%-(%S+)")
  clock = clock or t:match("^%s*(%S+)")
  if not clock then return nil end
  local secs = 0
  for part in clock:gmatch("[^:]+") do secs = secs * 60 + (tonumber(part) or 0) end
  return secs + (tonumber(days) or 0) * 86400
end

local function proc_cpu(pid)
  local f = pid and io.open("/proc/" .. pid .. "/stat")
  if not f then return pid and ps_cpu(pid) end
  local rest = f:read("a"):match("%) (.*)")
  f:close()
  local fields = {}
  for w in (rest or ""):gmatch("%S+") do fields[#fields + 1] = w end
  if not fields[13] then return nil end
  if not clk_tck then
    local g = io.popen("getconf CLK_TCK")
    clk_tck = g and tonumber(g:read("a")) or 100
    if g then g:close() end
  end
  return (fields[12] + fields[13]) / clk_tck -- utime, stime (fields 14, 15)
end

local function run_once(c)
  if c.kind == "curl" then return run_curl(c) end
  if c.kind == "floor" then return run_floor(c) end
  if c.kind == "startup" then return run_startup() end
  if c.kind == "node" then return run_node(c) end
  if not runners[c.kind] then return nil, "skipped (needs mirza.loop: runners." .. c.kind .. ")" end
  return run_child(c)
end

-- The affinity rows: the run of median share of o.runs runs (each its own
-- sims), its counts with it (they are that run's, not another's).
local function measure_affinity(c, o)
  local runs = {}
  c.sim = o.sim
  for _ = 1, o.runs do
    local r, err = run_child(c)
    if not r then return { name = c.name, kind = c.kind, skipped = err } end
    r.share = r.share or 0
    runs[#runs + 1] = r
  end
  table.sort(runs, function(a, b) return a.share < b.share end)
  local m = runs[(#runs + 1) // 2]
  return { name = c.name, kind = c.kind, share = m.share, wall_s = m.wall, items = m.items, errors = m.errors,
    cached = m.cached, prompt = m.prompt }
end

-- ---- the fill rows (issue 41)

-- An input of n items of `tokens` tokens at most (extra: more of each).
local function fill_input(n, tokens, tag, extra)
  local input = os.tmpname()
  local f = assert(io.open(input, "w"))
  for i = 1, n do
    local item = { custom_id = tag .. i, max_tokens = tokens,
      messages = { { role = "user", content = ("Question %d?"):format(i) } } }
    for k, v in pairs(extra or {}) do item[k] = v end
    f:write(json.encode(item), "\n")
  end
  f:close()
  return input
end

-- Another client's load on the llama sim at url: a `mirza batch` @n of n
-- answers of 1,500 tokens (30 s at 50 tokens/s: longer than a run, and
-- its bound), returned once the sim's /metrics counts n processing.
local function start_load(url, n)
  local input, output = fill_input(n, 2000, "load-", { mirza_sim = { answer_tokens = 1500 } }), os.tmpname()
  os.remove(output)
  local p = assert(io.popen(("%s batch %s %s --endpoint %s --model bench --quiet >/dev/null 2>&1 & echo $!"):format(
    sh_quote(MIRZA), sh_quote(input), sh_quote(output), sh_quote(("%s@%d"):format(url, n)))))
  local pid = p:read("l")
  p:close()
  for _ = 1, 1000 do
    local text = mirza.request { url = url:gsub("/v1$", "") .. "/metrics", method = "GET", timeout = 1 }
    if tonumber(text and text:match("\nllamacpp:requests_processing (%S+)") or 0) >= n then break end
    mirza.sleep(0.01)
  end
  return { pid = pid, input = input, output = output }
end

-- One `mirza batch` run of a fill row, as a user runs it, against sims of
-- its own (c.servers: their arguments; c.load: requests another client
-- keeps in flight on the first), each endpoint URL or URL@N (c.at): its
-- wall, and each endpoint's items, when it finished its last one (OUTPUT
-- followed as its records are written: every 5 ms) and the limit it
-- settled on (the batch's summary).
local function fill_run(c, o)
  local urls, pids, eps = {}, {}, {}
  for i, args in ipairs(c.servers) do
    urls[i], pids[i] = start_sim(o.sim, args)
    eps[i] = "--endpoint " .. sh_quote(c.at and ("%s@%d"):format(urls[i], c.at[i]) or urls[i])
  end
  local load = c.load and start_load(urls[1], c.load)
  local input, output, rc, log = fill_input(c.items, c.tokens, "fill-"), os.tmpname(), os.tmpname(), os.tmpname()
  os.remove(output)
  os.remove(rc)
  local t0 = mirza.now()
  os.execute(("(%s %s batch %s %s %s --model bench >/dev/null 2>%s; echo $? > %s) &"):format(timeout_prefix(600),
    sh_quote(MIRZA), sh_quote(input), sh_quote(output), table.concat(eps, " "), sh_quote(log), sh_quote(rc)))
  local by_port, pos, status = {}, 0
  repeat
    mirza.sleep(0.005)
    local h = io.open(rc)
    status = h and tonumber(h:read("a"))
    if h then h:close() end
    local out = io.open(output)
    if out then
      out:seek("set", pos)
      local text = out:read("a") or ""
      out:close()
      local whole = text:match("^(.*\n)") or ""
      pos = pos + #whole
      for line in whole:gmatch("[^\n]+") do
        local port = (json.decode(line).mirza or {}).endpoint
        port = port and port:match(":(%d+)") or "?"
        local e = by_port[port] or { items = 0 }
        e.items, e.finish = e.items + 1, mirza.now() - t0
        by_port[port] = e
      end
    end
  until status
  local wall = mirza.now() - t0
  if load then os.execute("kill " .. load.pid) end
  for _, pid in ipairs(pids) do os.execute("kill " .. pid) end
  local h = io.open(log)
  local summary = h and h:read("a") or ""
  if h then h:close() end
  for _, name in ipairs { input, output, rc, log, load and load.input, load and load.output } do os.remove(name) end
  local r, done = { wall = wall, endpoints = {} }, 0
  for i, url in ipairs(urls) do
    local port = url:match(":(%d+)")
    local e = by_port[port] or { items = 0 }
    r.endpoints[i] = { items = e.items, finish_s = e.finish,
      settled = tonumber(summary:match(":" .. port .. "/v1: settled on limit (%d+)")) }
    done = done + e.items
  end
  if status ~= 0 or done ~= c.items then
    return nil, ("mirza batch exited %s with %d of %d records"):format(status, done, c.items)
  end
  return r
end

-- A fill row: the run of median wall of o.runs runs.
local function measure_fill(c, o)
  local runs = {}
  for _ = 1, o.runs do
    local r, err = fill_run(c, o)
    if not r then return { name = c.name, kind = c.kind, group = c.group, skipped = err } end
    runs[#runs + 1] = r
  end
  table.sort(runs, function(a, b) return a.wall < b.wall end)
  local m, walls = runs[(#runs + 1) // 2], {}
  for i, r in ipairs(runs) do walls[i] = r.wall end
  return { name = c.name, kind = c.kind, group = c.group, wall_s = m.wall, walls_s = walls, items = c.items,
    items_s = c.items / m.wall, tok_s = c.items * c.tokens / m.wall, endpoints = m.endpoints }
end

-- The fill rows: items/s, wall, tokens/s, each endpoint's share.
local function print_fill(rows)
  local head = false
  for _, r in ipairs(rows) do
    if r.group == "fill" then
      if not head then
        print(("\n%-36s %6s %8s %8s %8s  %s"):format("fill (issue 41, mirza batch)", "items", "items/s", "wall s",
          "tok/s", "each endpoint: items, finished at s"))
        head = true
      end
      if r.skipped then
        print(("%-36s %s"):format(r.name, r.skipped:match("[^\n]*")))
      else
        local eps = {}
        for i, e in ipairs(r.endpoints) do
          eps[i] = ("%d @ %s%s"):format(e.items, e.finish_s and ("%.2f"):format(e.finish_s) or "—",
            e.settled and (", settled on %d"):format(e.settled) or "")
        end
        print(("%-36s %6d %8.1f %8.2f %8.0f  %s"):format(r.name, r.items, r.items_s, r.wall_s, r.tok_s,
          table.concat(eps, ", ")))
      end
    end
  end
  -- each server: the default's wall over the best fixed limit's and @4's
  local order, by = {}, {}
  for _, r in ipairs(rows) do
    local server, limit = r.name:match("^fill (.-), (.*)$")
    if r.group == "fill" and server and not r.skipped then
      if not by[server] then order[#order + 1], by[server] = server, {} end
      local b = by[server]
      if limit == "default" then b.default = r
      elseif limit:match("^@4$") or limit:match("^@4 %+ @4$") then b.at4 = r end
      if limit ~= "default" and (not b.best or r.wall_s < b.best.wall_s) then b.best = r end
    end
  end
  for _, server in ipairs(order) do
    local b = by[server]
    if b.default and b.best then
      print(("%-36s default %.2f s = %.2fx the best fixed (%s, %.2f s)%s"):format(server, b.default.wall_s,
        b.default.wall_s / b.best.wall_s, b.best.name:match(", (.*)$"), b.best.wall_s,
        b.at4 and (", %.2fx @4's"):format(b.default.wall_s / b.at4.wall_s) or ""))
    end
  end
end

-- How many runs a row's median is of: o.runs (start-up: 10).
local function runs_of(c, o) return c.kind == "startup" and 10 or o.runs end

-- The kinds measured whole, all their runs together (the others run by
-- run: measure_all).
local WHOLE = { affinity = measure_affinity, fill = measure_fill, million = measure_million }

-- One run of c, added to its runs so far (acc); false, message when it
-- could not run (the row is skipped).
local function run_into(c, o, acc)
  local s0 = proc_cpu(c.sim_pid or o.sim_pid)
  local r, err = run_once(c)
  if not r then return false, err end
  local s1 = proc_cpu(c.sim_pid or o.sim_pid)
  if s0 and s1 then acc.sim[#acc.sim + 1] = s1 - s0 end
  acc.cpu[#acc.cpu + 1], acc.wall[#acc.wall + 1] = r.cpu, r.wall
  if r.rss_kb then acc.rss[#acc.rss + 1] = r.rss_kb end
  acc.tokens, acc.records = r.tokens, r.records
  if r.writes_per_record then acc.wpr = math.max(acc.wpr or 0, r.writes_per_record) end
  if r.progress_share then acc.pshare = math.max(acc.pshare or 0, r.progress_share) end
  if r.streams then -- concurrency: the worst run's progress
    local worst = acc.worst
    local ratio = r.fair_mid > 0 and r.min_mid / r.fair_mid or 0
    local min_end = math.min(r.min_end, worst and worst.min_end or r.min_end)
    if not worst or ratio < worst.ratio then
      worst = { streams = r.streams, per_stream = r.per_stream, min_mid = r.min_mid, fair_mid = r.fair_mid,
        ratio = ratio, spread_ms = r.spread_ms }
      acc.worst = worst
    end
    worst.min_end = min_end
  end
  return true
end

-- A row from its runs: the medians.
local function summarize(c, acc)
  local tokens = acc.tokens
  local m = { name = c.name, kind = c.kind, source = source_key(c), tokens = tokens,
    cpu_s = median(acc.cpu), wall_s = median(acc.wall), rss_kb = median(acc.rss), fpc = c.fpc, rate = c.rate }
  for k, v in pairs(acc.worst or {}) do m[k] = v end
  m.sim_cpu_s = median(acc.sim)
  m.writes_per_record, m.progress_share, m.records = acc.wpr, acc.pshare, acc.records
  m.group = c.group
  if tokens and tokens > 0 then
    m.us_per_token = m.cpu_s / tokens * 1e6
    m.tok_s = tokens / m.wall_s
  end
  return m
end

-- The rows of cases, each the median of its runs. The runs go in rounds
-- (every row's first, then every row's second, ...), so that a machine
-- that drifts while the bench runs (a busy neighbour, a sim that warms
-- up) weighs on the rows alike instead of on the last ones.
local function measure_all(cases, o)
  local rows, accs, most = {}, {}, 0
  for i, c in ipairs(cases) do
    local whole = WHOLE[c.kind]
    if whole then
      rows[i] = whole(c, o)
    else
      accs[i] = { cpu = {}, wall = {}, rss = {}, sim = {} }
      most = math.max(most, runs_of(c, o))
    end
  end
  for run = 1, most do
    for i, c in ipairs(cases) do
      local acc = accs[i]
      if acc and not rows[i] and run <= runs_of(c, o) then
        local ok, err = run_into(c, o, acc)
        if not ok then rows[i] = { name = c.name, group = c.group, skipped = err } end
      end
    end
  end
  for i, c in ipairs(cases) do rows[i] = rows[i] or summarize(c, accs[i]) end
  return rows
end

local function selected(c, only)
  if not only then return not c.explicit end
  for w in only:gmatch("[^,]+") do
    if c.name:sub(1, #w) == w or c.kind == w then return true end
  end
  return false
end

local function fmt(x, f)
  return x and f:format(x) or "—"
end

-- The concurrency rows, next to the one-stream row of their family:
-- aggregate throughput over it, RSS per extra stream, progress.
local function print_concurrency(rows)
  local one = {}
  for _, r in ipairs(rows) do
    if r.streams == 1 then one[r.name:gsub(" x1 streams$", "")] = r end
  end
  local head = false
  for _, r in ipairs(rows) do
    local base = r.streams and r.streams > 1 and one[r.name:gsub(" x%d+ streams$", "")]
    if base then
      r.x_one = r.tok_s / base.tok_s
      if r.rss_kb and base.rss_kb then r.kb_per_extra = (r.rss_kb - base.rss_kb) / (r.streams - 1) end
    end
    if r.streams then
      r.progressing = r.min_mid > 0 and r.min_end == r.per_stream
      if not head then
        print(("\n%-30s %7s %7s %10s %9s %16s %9s %4s %10s"):format("concurrency (worst run)", "streams",
          "tok/str", "× 1 stream", "KB/extra", "min at half/fair", "spread ms", "all", "sim µs/tok"))
        head = true
      end
      print(("%-30s %7d %7d %10s %9s %16s %9s %4s %10s"):format(r.name, r.streams, r.per_stream,
        fmt(r.x_one, "%.2f"), fmt(r.kb_per_extra, "%.1f"), ("%d/%d"):format(r.min_mid, r.fair_mid),
        fmt(r.spread_ms, "%.0f"), r.min_end == r.per_stream and "yes" or "no",
        fmt(r.sim_cpu_s and r.sim_cpu_s / r.tokens * 1e6, "%.2f")))
    end
  end
end

-- The affinity rows: the share of prompt tokens served from cache.
local function print_affinity(rows)
  local head = false
  for _, r in ipairs(rows) do
    if r.kind == "affinity" and not r.skipped then
      if not head then
        print(("\n%-30s %7s %7s %22s %9s"):format("prompt cache (2 daemons x 2 slots)", "items", "errors",
          "cached / prompt tokens", "wall ms"))
        head = true
      end
      print(("%-30s %7d %7d %22s %9.0f"):format(r.name, r.items, r.errors,
        ("%d / %d = %.0f%%"):format(r.cached, r.prompt, r.share * 100), r.wall_s * 1000))
    end
  end
end

-- The short rows (issue 31 item 1): items/s, CPU per item, RSS, next to
-- the openai SDK's on the same items.
local function print_short(rows)
  local sdk
  for _, r in ipairs(rows) do if r.group == "short" and r.kind == "node" and not r.skipped then sdk = r end end
  local head = false
  for _, r in ipairs(rows) do
    if r.group == "short" then
      if not head then
        print(("\n%-36s %7s %9s %9s %12s %8s %8s"):format("short items (4 tokens, @64)", "items", "items/s",
          "wall ms", "CPU µs/item", "× SDK", "RSS MB"))
        head = true
      end
      if r.skipped then
        print(("%-36s %s"):format(r.name, r.skipped:match("[^\n]*")))
      else
        r.us_per_item = r.cpu_s / r.records * 1e6
        r.items_s = r.records / r.wall_s
        r.x_sdk = sdk and r.us_per_item / (sdk.cpu_s / sdk.records * 1e6) or nil
        print(("%-36s %7d %9.0f %9.0f %12.1f %8s %8s"):format(r.name, r.records, r.items_s, r.wall_s * 1000,
          r.us_per_item, fmt(r.x_sdk, "%.2f"), fmt(r.rss_kb and r.rss_kb / 1024, "%.1f")))
      end
    end
  end
end

-- The million rows (issue 31 item 2): each step's wall, lines/s, CPU, RSS.
local function print_million(rows)
  for _, r in ipairs(rows) do
    if r.group == "million" then
      print(("\n%-36s %9s %9s %9s %9s %8s"):format(("mirza batch @64, %d lines"):format(r.lines), "lines",
        "lines/s", "wall s", "CPU s", "RSS MB"))
      for _, k in ipairs { { "small", "a small input (in flight)", r.small_lines }, { "run", "the input", r.lines },
        { "rerun", "rerun on its output (no work)", r.lines } } do
        local x = r[k[1]]
        if x then
          print(("%-36s %9d %9.0f %9.2f %9s %8s"):format(k[2], k[3], k[3] / x.wall, x.wall, fmt(x.cpu, "%.2f"),
            fmt(x.rss_kb and x.rss_kb / 1024, "%.1f")))
        end
      end
      if r.skipped then print("failed: " .. r.skipped:match("[^\n]*")) end
    end
  end
end

local function print_table(rows)
  local curl = {}
  local own = function(r) return (r.kind == "affinity" and not r.skipped) or r.group end -- their own tables
  local head = false
  for _, r in ipairs(rows) do
    if r.kind == "curl" then curl[r.source] = r end
    head = head or not own(r)
  end
  if head then
    print(("%-28s %10s %8s %12s %9s %10s"):format("case", "µs/token", "× curl", "tokens/s", "RSS MB", "wall ms"))
  end
  for _, r in ipairs(rows) do
    if own(r) then -- luacheck: ignore 542
    elseif r.skipped then
      print(("%-28s %s"):format(r.name, r.skipped:match("[^\n]*")))
    else
      local c = curl[r.source]
      r.x_curl = c and r.us_per_token and c.us_per_token and r.us_per_token / c.us_per_token or nil
      print(("%-28s %10s %8s %12s %9s %10s"):format(r.name, fmt(r.us_per_token, "%.3f"), fmt(r.x_curl, "%.2f"),
        fmt(r.tok_s, "%.0f"), fmt(r.rss_kb and r.rss_kb / 1024, "%.1f"), fmt(r.wall_s * 1000, "%.1f")))
    end
  end
end

-- The rows by name, the goal lines so far and goal(what, value, shown,
-- target, ok), which adds one when its row ran (value not nil).
local function goal_table(rows)
  local by, out = {}, {}
  for _, r in ipairs(rows) do by[r.name] = r end
  local function goal(what, value, shown, target, ok)
    if value then
      out[#out + 1] = ("%-52s %9s %9s  %s"):format(what, shown, target,
        target == "—" and "" or ok and "met" or "NOT MET")
    end
  end
  return by, out, goal
end

-- Issue 20's goals, each figure next to its target (the rows it needs
-- must have run: `--only` may leave some out).
local function print_goals(rows)
  local by, out, goal = goal_table(rows)
  local function us(name) return by[name] and by[name].us_per_token end
  local function over(a, b) return us(a) and us(b) and us(a) / us(b) end
  local x = by["core loop pre-rendered"] and by["core loop pre-rendered"].x_curl
  goal("1. core loop, pre-rendered source: × curl -sN", x, ("%.2f"):format(x or 0), "≤ 1.5", x and x <= 1.5)
  x = by["engine token 25% pre-rendered"] and by["engine token 25% pre-rendered"].x_curl
  goal("1. engine turn, pre-rendered source: × curl -sN", x, ("%.2f"):format(x or 0), "≤ 2.0", x and x <= 2.0)
  x = over("engine token 25% paced 10k/s", "core loop paced 10k/s")
  goal("2. engine turn paced 10k/s: × core loop", x, ("%.2f"):format(x or 0), "≤ 1.2", x and x <= 1.2)
  x = over("engine token 25% hold off paced 10k/s", "core loop paced 10k/s")
  goal("2.   (the same, the engine's hold off)", x, ("%.2f"):format(x or 0), "—", true)
  x = over("engine token 25% paced 10k/s", "core loop hold 5 ms paced 10k/s")
  goal("2.   (engine turn × the core loop with the same hold)", x, ("%.2f"):format(x or 0), "—", true)
  for _, name in ipairs { "core loop x1024 paced 50/s", "engine x1024 paced 50/s", "batch x1024 paced 50/s" } do
    local r = by[name]
    x = over(name, "core loop x1 paced 50/s")
    goal(("3. %s: µs/token × 1 stream"):format(name), x, ("%.2f"):format(x or 0), "≤ 1.3", x and x <= 1.3)
    x = r and r.rss_kb and r.rss_kb / 1024
    goal(("3. %s: RSS MB"):format(name), x, ("%.1f"):format(x or 0), "≤ 64", x and x <= 64)
    if r and r.streams then
      goal(("3. %s: every stream progresses"):format(name), true, ("%d/%d"):format(r.min_mid, r.fair_mid),
        "min > 0", r.min_mid > 0 and r.min_end == r.per_stream)
    end
  end
  -- % of a core per 10k tokens/s is µs of CPU per token
  local function pct(r) return r and r.cpu_s and r.tokens and r.tokens > 0 and r.cpu_s / r.tokens * 1e6 end
  -- under a batch row: libcurl alone on its items, and what is mirza's
  local function floor_of(name, y)
    local f = pct(by[name])
    goal("4.     libcurl alone on the same items (the floor)", f, ("%.2f"):format(f or 0), "—", true)
    goal("4.     mirza's own part (the row − libcurl alone)", f and y, ("%.2f"):format(f and y - f or 0), "—", true)
  end
  local b = by["batch x256 paced 40/s"]
  if b and b.cpu_s then
    x = pct(b)
    goal("4. batch at a daemon's pace: % of a core per 10k tok/s", x, ("%.2f"):format(x), "≤ 2", x <= 2)
    floor_of("batch x256 paced 40/s, libcurl alone", x)
    -- An item costs a fixed part (its request, connection, stream set-up,
    -- record) and a part per token: the two item lengths separate them,
    -- and give the shortest item that stays within the target.
    local long = by["batch x256 paced 40/s 400-token items"]
    if long and long.cpu_s then
      local y = pct(long)
      goal("4.   (the same, 400-token items)", y, ("%.2f"):format(y), "≤ 2", y <= 2)
      floor_of("batch x256 400-token items, libcurl alone", y)
      local many = by["batch x256 paced 40/s 1024 items"]
      if many and many.cpu_s then
        local z = pct(many)
        goal("4.   (80-token items, 1,024 through the 256 slots)", z, ("%.2f"):format(z), "≤ 2", z <= 2)
        floor_of("batch x256 1024 items, libcurl alone", z)
      end
      local per_tok = (long.cpu_s - b.cpu_s) / (long.tokens - b.tokens)
      local per_item = (b.cpu_s - per_tok * b.tokens) / b.records
      goal("4.   an item's fixed CPU, µs", per_item, ("%.0f"):format(per_item * 1e6), "—", true)
      goal("4.   CPU per token beyond it, µs (= % per 10k tok/s)", per_tok, ("%.2f"):format(per_tok * 1e6), "< 2",
        per_tok * 1e6 < 2)
      local shortest = per_tok * 1e6 < 2 and math.ceil(per_item * 1e6 / (2 - per_tok * 1e6))
      goal("4.   items of at least this many tokens meet 2%", shortest or 0, shortest and tostring(shortest) or "none",
        "—", true)
    end
    x = b.writes_per_record
    goal("4. batch: write calls per record", x, ("%.2f"):format(x or 0), "1", x and x <= 1)
    local pr = by["batch x256 paced 40/s progress"]
    x = pr and pr.progress_share and pr.progress_share * 100
    goal("4. batch: a live progress line (4/s), % of a core", x, ("%.4f"):format(x or 0), "≈ 0", x and x < 0.1)
    x = pr and pr.us_per_token and (pr.us_per_token - b.us_per_token) / b.us_per_token * 100
    goal("4.   (the whole run's CPU with it, %; ±15% run to run)", x, ("%+.1f"):format(x or 0), "—", true)
  end
  if #out > 0 then
    print(("\n%-52s %9s %9s"):format("goals (issue 20)", "figure", "target"))
    print(table.concat(out, "\n"))
  end
end

-- Issue 31's goals, each figure next to its target, and issue 32's.
local function print_goals_31(rows)
  local by, out, goal = goal_table(rows)
  local a = by["short items @64"]
  local sdk = by["short items @64 openai SDK (node)"]
  local x = a and a.cpu_s and sdk and sdk.cpu_s and (a.cpu_s / a.records) / (sdk.cpu_s / sdk.records)
  goal("1. short items: CPU per item × the openai SDK's", x, ("%.2f"):format(x or 0), "—", true)
  x = a and a.wall_s and sdk and sdk.wall_s and a.wall_s / sdk.wall_s
  goal("1.   (wall × the openai SDK's)", x, ("%.2f"):format(x or 0), "—", true)
  -- issue 38: each max_tokens within 10 % of the best row of its answer length (hold 0 among them)
  for _, items in ipairs { 400, 5000 } do
    local itag = items == 400 and "" or (" %d items"):format(items)
    for _, len in ipairs { 1, 4, 16 } do
      local tag = itag .. (len == 4 and "" or (" %d-token"):format(len))
      local best, worst
      for _, mt in ipairs { 16, 32, 33, 256, 4096, "256 hold 0" } do
        local r = by[("short paced%s max_tokens %s"):format(tag, mt)]
        if r and r.wall_s then
          best, worst = math.min(best or math.huge, r.wall_s), math.max(worst or 0, r.wall_s)
        end
      end
      x = best and worst / best
      if x then
        goal(("38. short paced %d × %d-token: slowest row × the fastest's wall"):format(items, len), x,
          ("%.2f"):format(x), "≤ 1.1", x <= 1.1)
      end
    end
    local psdk = by[("short paced%s openai SDK (node)"):format(itag)]
    local p256 = by[("short paced%s max_tokens 256"):format(itag)]
    x = psdk and p256 and psdk.wall_s and p256.wall_s and psdk.wall_s / p256.wall_s
    if x then
      goal(("38.   (%d items: the SDK's wall × mirza's at max_tokens 256)"):format(items), x, ("%.2f"):format(x), "≥ 3",
        x >= 3)
    end
  end
  for _, r in ipairs(rows) do
    if r.group == "million" and r.run and r.small then
      x = r.run.rss_kb and r.small.rss_kb and (r.run.rss_kb - r.small.rss_kb) / 1024
      goal(("2. %d lines: RSS MB over the %d-line run's"):format(r.lines, r.small_lines), x, ("%.1f"):format(x or 0),
        "≤ 64", x and x <= 64)
    end
    if r.group == "million" and r.rerun then
      x = r.rerun.wall
      goal(("2. rerun on %d finished lines: wall s"):format(r.lines), x, ("%.2f"):format(x), "≤ 5", x <= 5)
      x = r.rerun.rss_kb and r.rerun.rss_kb / 1024
      goal(("2. rerun on %d finished lines: RSS MB"):format(r.lines), x, ("%.1f"):format(x or 0), "≤ 64",
        x and x <= 64)
    end
  end
  local c = by["collect x1024 paced 50/s"]
  x = c and c.us_per_token
  goal("10. 1,024 collects paced 50/s: µs per token", x, ("%.2f"):format(x or 0), "≤ 6", x and x <= 6)
  x = c and c.rss_kb and c.rss_kb / 1024
  goal("10. 1,024 collects paced 50/s: RSS MB", x, ("%.1f"):format(x or 0), "≤ 48", x and x <= 48)
  if #out > 0 then
    print(("\n%-52s %9s %9s"):format("goals (issue 31)", "figure", "target"))
    print(table.concat(out, "\n"))
  end
  local _, out32, goal32 = goal_table(rows)
  local on, off = by["prefix affinity on, 4x1000x8 per-slot cache"], by["prefix affinity off, 4x1000x8 per-slot cache"]
  x = on and on.share and on.share * 100
  goal32("2. 4x1000x8 on per-slot caches: % from cache", x, ("%.0f"):format(x or 0), "≥ 85", x and x >= 85)
  x = off and off.share and off.share * 100
  goal32("2.   (the same, least loaded)", x, ("%.0f"):format(x or 0), "—", true)
  if #out32 > 0 then
    print(("\n%-52s %9s %9s"):format("goals (issue 32)", "figure", "target"))
    print(table.concat(out32, "\n"))
  end
end

-- The incremental JSON parser against cJSON on the whole answer, per
-- byte (issue 18): tests/c/bench_json, built beside mirza in a build tree.
local function print_json_parser(o)
  if o.only and not selected({ name = "json parser", kind = "json" }, o.only) then return end
  local dir = MIRZA:match("^(.*)/[^/]*$") or "."
  local bin = dir .. "/bench_json"
  local exists = io.open(bin)
  if exists then exists:close() else
    print("\nincremental JSON parser: " .. bin .. " not found (built with the tests: cmake's build tree)")
    return
  end
  local out = run_cmd(sh_quote(bin))
  print("\nincremental JSON parser (mirza.json.stream) against cJSON on the whole answer (tests/c/bench_json.c):")
  io.write((out:gsub("%(checksum[^)]*%)%s*$", "")))
end

local function suite(o)
  local url, pid = o.url, nil
  if not url then url, pid = start_sim(o.sim) end
  o.sim_pid = pid
  local rows, sims = {}, {} -- sims: the sims of their own (c.sim_args), by their arguments
  local ok, err = pcall(function()
    local cases = {}
    for _, c in ipairs(case_list(o.tokens, o)) do
      if selected(c, o.only) then
        c.url = url
        if c.sim_args and not o.url then
          local s = sims[c.sim_args]
          if not s then
            s = {}
            s.url, s.pid = start_sim(o.sim, c.sim_args)
            sims[c.sim_args] = s
          end
          c.url, c.sim_pid = s.url, s.pid
        end
        cases[#cases + 1] = c
      end
    end
    rows = measure_all(cases, o)
  end)
  if pid then os.execute("kill " .. pid) end
  for _, s in pairs(sims) do os.execute("kill " .. s.pid) end
  assert(ok, err)
  print(("mirza bench: %d tokens per run, median of %d runs, source %s"):format(o.tokens, o.runs,
    o.url or "mirza-sim (flat out)"))
  print_table(rows)
  print_concurrency(rows)
  print_affinity(rows)
  print_short(rows)
  print_million(rows)
  print_fill(rows)
  print_json_parser(o)
  print_goals(rows)
  print_goals_31(rows)
  local doc = json.encode { tokens = o.tokens, runs = o.runs, results = rows }
  print("JSON " .. doc)
  if o.json then
    local f = assert(io.open(o.json, "w"))
    f:write(doc, "\n")
    f:close()
  end
end

-- The classic figure: the core loop, best of 3, against a sim of its own.
local function classic(n, sim)
  local url, pid = start_sim(sim)
  local p = { url = url, tokens = 2000, fpc = 0, rate = 0 }
  runners.core(p) -- warm up
  p.tokens = n
  local best
  for _ = 1, 3 do
    local r = runners.core(p)
    assert(r.tokens == n, ("expected %d tokens, got %d"):format(n, r.tokens))
    if not best or r.cpu < best.cpu then best = r end
  end
  os.execute("kill " .. pid)
  print(("tokens        %d"):format(best.tokens) .. " (flat out, 32 KiB chunks)")
  print(("cpu           %.3f s (mirza process: curl + SSE + JSON + Lua loop)"):format(best.cpu))
  print(("wall          %.3f s"):format(best.wall))
  print(("cpu per token %.3f us   (target <= 0.65 us)"):format(best.cpu / best.tokens * 1e6))
  print(("tokens/s      %.0f"):format(best.tokens / best.wall))
end

if tonumber(arg[1]) then
  classic(tonumber(arg[1]), arg[2])
else
  local o = parse(arg)
  if o.case then
    local r = assert(runners[o.case], "bench: no runner " .. o.case)(o.params)
    r.rss_kb = rss_kb()
    print("BENCH " .. json.encode(r))
  else
    suite(o)
  end
end
