--- batch.lua - run a JSONL (or plain text) file of prompts against one or
--- more OpenAI-compatible daemons, writing OpenAI batch output records.
---
---   mirza batch INPUT OUTPUT [options]     (or: mirza scripts/batch.lua ...)
---
--- Options:
---   --endpoint URL       the server, as pasted from a curl command: a base URL
---                        with or without /v1 (http://127.0.0.1:8080), or a
---                        route's URL (.../v1/chat/completions); a query string
---                        (?api-version=...) stays on every request. Repeat for
---                        a pool; URL@N fixes that endpoint's limit (requests
---                        in flight). Default: $MIRZA_BASE_URL or
---                        http://127.0.0.1:8766/v1
---   --api-key KEY        the server's key (sent as Authorization: Bearer KEY);
---                        default $MIRZA_API_KEY, else $OPENAI_API_KEY. Never
---                        printed
---   --errors FILE        where failed items are recorded (default: beside
---                        OUTPUT, out.jsonl -> out.errors.jsonl)
---   --limit N            requests in flight per endpoint, fixed (default: found
---                        as the run goes, per endpoint: at most the slots its
---                        server announces, and one queued there, where its
---                        token rate is best; the progress line and the
---                        summary say where it is)
---   --model ID           model for lines without one (default $MIRZA_MODEL, else the
---                        first model each endpoint lists in /v1/models)
---   --max-tokens N       max_tokens for lines without one
---   --max-retries N      retries of a retryable failure (default 5)
---   --retry-base S       first backoff in seconds (default 0.5)
---   --deadline S         per-request limit in seconds
---   --batch-deadline S   stop after S seconds (unfinished items stay for a rerun)
---   --give-up-after S    stop once every endpoint has been down for S seconds
---                        (default 300; unfinished items stay for a rerun)
---   --stall-timeout S    seconds without a byte before an attempt fails (default 120)
---   --header-timeout S   seconds an attempt waits for the response head (a queued
---                        request, a long prefill) before it fails (default 600; 0: none)
---   --no-repetition      no repetition guard
---   --schema FILE        a JSON Schema (.json) for the answer of every chat and
---                        completions line without its own: sent as response_format,
---                        the answer decoded and validated (record: body.mirza.value,
---                        or error code "schema" with the JSON pointer)
---   --attempts N         answers a chat item with a schema may give (default 1): a
---                        violation is told to the model, which answers again
---   --no-affinity        send each item to the least loaded endpoint (default: items
---                        sharing a long prefix go where it went last, while it has
---                        room, so the daemon's prompt cache serves it)
---   --progress-every S   seconds between progress lines when not a terminal (default 10)
---   --hold S             hand an item's text to its task every S seconds
---                        (default 1; 0: each read): the end comes at once
---   --quiet              no progress and no summary
---
--- Answers go to OUTPUT, failed items to the error file (OpenAI's Batch API:
--- the same record shape). Running it again with the same OUTPUT resumes:
--- answered custom_ids are skipped and the failed ones are sent again (only
--- they). An existing OUTPUT must be the output of an earlier run (never
--- INPUT, never a file of prompts: refused, untouched). OUTPUT `-` (or a
--- pipe, /dev/stdout) streams the records, failures among them unless
--- --errors names a file, without resume. INPUT is read as a stream (a
--- million lines: a few tens of MB). A route the server does not have
--- (404/405/501: a llama-server without --embeddings) fails its lines at
--- once; a 5xx is retried while the server answers the rest. The summary
--- says how many items failed, the first message of each kind (an HTTP 401:
--- give the server's key), whether running the same command again may redo
--- them (not for a bad input line, a key, a route the server lacks), and
--- how many prompt tokens the daemons served from their prompt cache,
--- when they report it. Progress lines (one every --progress-every s
--- when stderr is not a terminal) start with the time and name an
--- endpoint that is down. Ctrl-C stops
--- the run and says how many records were saved and how to resume. Exit
--- status: 0 all items ok, 1 some items failed or the batch deadline
--- stopped the run, 2 bad usage, unreadable or empty input, a refused
--- OUTPUT, or more requests at once (the @N added up) than the open-files
--- limit allows; 130 interrupted.
local batch = require "mirza.batch"

-- --help: this file's header, without the comment marks, on stdout.
local function help()
  local f = io.open(debug.getinfo(1, "S").source:match("^@(.*)") or "", "r")
  for line in f and f:lines() or function() end do
    if line:sub(1, 3) ~= "---" then break end
    io.write(line:sub(5), "\n")
  end
  if f then f:close() end
  os.exit(0)
end

local function shell_word(s)
  return s:match("^[%w@%%+=:,./_-]+$") and s or "'" .. s:gsub("'", "'\\''") .. "'"
end

-- The command line that started us, as typed (to show how to resume):
-- the host and its options (arg[-n..-1]), the job or script, its
-- arguments; the value of --api-key shown as KEY (never printed).
local function command_line()
  local words, lo = {}, 0
  while arg[lo - 1] do lo = lo - 1 end
  for i = lo, #arg do
    local w = arg[i] and tostring(arg[i])
    if w and i > 1 and arg[i - 1] == "--api-key" then w = "KEY" end
    words[#words + 1] = w and shell_word(w)
  end
  return table.concat(words, " ")
end

local function usage(msg)
  io.stderr:write("batch: ", msg, "\nusage: mirza scripts/batch.lua INPUT OUTPUT [--endpoint URL[@N]]... ",
    "[--api-key KEY] [--errors FILE] [--limit N] [--model ID] [--max-tokens N] [--max-retries N] [--retry-base S] ",
    "[--deadline S] [--batch-deadline S] [--give-up-after S] [--stall-timeout S] [--header-timeout S] ",
    "[--no-repetition] [--schema FILE] [--attempts N] [--no-affinity] [--progress-every S] [--hold S] ",
    "[--quiet]\n")
  os.exit(2)
end

local NUM = { ["--limit"] = "limit", ["--max-tokens"] = "max_tokens", ["--max-retries"] = "max_retries",
  ["--attempts"] = "attempts",
  ["--retry-base"] = "retry_base", ["--deadline"] = "deadline", ["--batch-deadline"] = "batch_deadline",
  ["--give-up-after"] = "give_up_after",
  ["--stall-timeout"] = "stall_timeout", ["--header-timeout"] = "header_timeout",
  ["--progress-every"] = "progress_every", ["--hold"] = "hold" }

-- "URL" or "URL@N" -> {url=, limit=}
local function endpoint(s)
  local url, n = s:match("^(.-)@(%d+)$")
  return { url = url or s, limit = tonumber(n) }
end

local function parse(argv)
  local opts, pos, eps, i = { body = {} }, {}, {}, 1
  while i <= #argv do
    local a = argv[i]
    if NUM[a] then
      local v = tonumber(argv[i + 1])
      if not v then usage(a .. " needs a number") end
      opts[NUM[a]] = v
      i = i + 1
    elseif a == "--endpoint" or a == "--model" or a == "--schema" or a == "--api-key" or a == "--errors" then
      local v = argv[i + 1] or usage(a .. " needs a value")
      if a == "--endpoint" then eps[#eps + 1] = endpoint(v) elseif a == "--model" then opts.model = v
      elseif a == "--api-key" then opts.api_key = v
      elseif a == "--errors" then opts.errors = v
      else opts.schema = v end
      i = i + 1
    elseif a == "--tick" then -- earlier versions' read clock: its value taken, nothing to tune now
      io.stderr:write("batch: --tick is ignored: each stream is read by one rule (docs/performance.md)\n")
      i = i + 1
    elseif a == "--no-repetition" then opts.repetition = false
    elseif a == "--no-affinity" then opts.affinity = false
    elseif a == "--quiet" then opts.quiet, opts.progress = true, false
    elseif a == "--help" or a == "-h" then help()
    elseif a:sub(1, 2) == "--" then usage("unknown option " .. a)
    else pos[#pos + 1] = a end
    i = i + 1
  end
  if #pos ~= 2 then usage("INPUT and OUTPUT are required") end
  if opts.attempts and (math.type(opts.attempts) ~= "integer" or opts.attempts < 1) then
    usage("--attempts needs a whole number >= 1")
  end
  if opts.limit and (math.type(opts.limit) ~= "integer" or opts.limit < 1) then
    usage("--limit needs a whole number >= 1 (or leave it out: each endpoint's is found as the run goes)")
  end
  for _, e in ipairs(eps) do
    if e.limit and e.limit < 1 then usage(("%s@%d: N must be 1 or more (or leave @N out)"):format(e.url, e.limit)) end
  end
  opts.input, opts.output = pos[1], pos[2]
  if #eps == 0 then eps[1] = { url = os.getenv("MIRZA_BASE_URL") or "http://127.0.0.1:8766/v1" } end
  opts.endpoints = eps
  opts.model = opts.model or os.getenv("MIRZA_MODEL")
  -- the key: --api-key, else MIRZA_API_KEY, else OPENAI_API_KEY (an empty one is none), as the engine takes it
  opts.api_key = require("mirza.config").api_key(opts.api_key)
  if opts.max_tokens then opts.body.max_tokens, opts.max_tokens = opts.max_tokens, nil end
  opts.resume_command = command_line()
  return opts
end

local stats, msg, code = batch.run(parse(arg))
if not stats then
  io.stderr:write("batch: ", msg, "\n")
  os.exit((code == "input" or code == "io" or code == "output" or code == "limit") and 2 or 1)
end
os.exit((stats.errors > 0 or stats.deadline) and 1 or 0)
