---@meta
--- LuaCATS of the public API written in Lua: the functions `require "mirza"`
--- adds to the C core (lua/mirza/init.lua), and the option and result tables
--- of the modules a script uses that their own files leave as `table`. Not
--- loaded at run time. The C core: _meta.lua; processes: _meta_proc.lua;
--- line editing (mirza.readline): _meta_readline.lua.
---
--- Where the rest is described (each module's LuaCATS is beside its code):
---
---   mirza.loop      loop.lua: `loop.run`, `spawn`, `gather`, `as_completed`,
---                   `condition`, `new{on_error=}`; mirza.Loop,
---                   mirza.Task, mirza.Condition
---   mirza.engine    engine.lua: `engine.new` (mirza.EngineOptions, below),
---                   mirza.Engine and its methods; turn.lua: `e:turn`
---                   (mirza.TurnOptions, mirza.Turn); `e:say` (mirza.SayOptions,
---                   mirza.TurnStats, mirza.SayResult, below); the route's
---                   sinks: route.lua (mirza.RouteOptions)
---   mirza.daemon    daemon.lua: mirza.DaemonOptions, mirza.Daemon
---   mirza.reload    reload.lua: mirza.Watcher (`mirza.watch`, `mirza.reload`)
---   mirza.pool      pool.lua: `pool.new(endpoints, opts)`, mirza.Pool
---   mirza.limit     limit.lua: `limit.new(opts)`, mirza.Limit (an endpoint's
---                   limit found as its requests go); capacity.lua:
---                   `capacity.probe`, `capacity.waiting` (mirza.Capacity)
---   mirza.batch     batch.lua: `batch.run` (mirza.BatchOptions, below)
---   mirza.tools     tools.lua: `tools.run` (mirza.ToolsRunOptions, mirza.Tool)
---   mirza.pipeline  pipeline.lua: stages (mirza.StageSpec, mirza.StageFn)
---   results         result.lua (mirza.Result), structured.lua
---                   (mirza.StructuredOptions), schema.lua (mirza.Schema)

---@class mirza
local mirza = {}

-- ---------------------------------------------------------------- requests

---A plain (non-streamed) request, waited for: `mirza.open` with `plain =
---true`. Inside a `mirza.loop` task the wait yields to the scheduler. Bad
---options raise, as for `mirza.open`; a failure is returned.
---@param opts mirza.RequestOptions the keys of `mirza.open` (`plain` is implied)
---@return string|nil body the response body (a 2xx status: a redirect or an error status is code "http")
---@return integer|string status_or_message the HTTP status, or the error message
---@return string? code "http" (the status in the 4th value), "refused", "timeout", ...
---@return integer? status the HTTP status of an "http" error
function mirza.request(opts) end

---@class mirza.CollectOptions: mirza.RequestOptions, mirza.StructuredOptions
---@field retries? integer tries after the first when a request fails before anything arrived with a failure worth retrying (mirza.retry.stream: a 429 or 503 waited out for its Retry-After, up to 60 s; another 5xx, 408, 409, an error frame, a refused connection, a stream cut before its first token, after a backoff of 0.5 s doubling to 8 s); never a timeout, a 4xx or a failure once text came. Default 2 (the OpenAI SDKs'); 0: none

---@class mirza.CollectFailure
---@field text string the answer received before the failure
---@field think string the reasoning received before it
---@field tool_calls? table[] the tool calls received before it
---@field status? integer the HTTP status of the last failure (code "http")
---@field retry_after? number the last failure's Retry-After, in seconds, when the server sent one
---@field retries integer the tries made after the first

---Run a streaming request to its end and collect the answer. Network and
---HTTP failures are returned, never raised: `nil, message, code, partial`,
---where `partial` (`{text, think, tool_calls}`, with the last failure's
---HTTP `status` and `retry_after` and the `retries` made) is what came
---before the failure. A failure worth retrying before anything arrived
---(a 429, a 5xx, a refused connection, a stream cut before its first
---token; not a timeout) sends the request again, `retries` times (default
---2, as the OpenAI SDKs), after the server's Retry-After or a backoff.
---
---Inside a `mirza.loop` task, without `hold` or `on_json` of the caller's
---own, the stream holds what comes until its end (`hold = math.huge`,
---`merge = true`): the task wakes once, for the whole answer. The end, an
---error or a timeout come at once.
---
---A structured answer (docs/structured.md): `schema = S` sends S as
---`response_format`, checks the answer here and gives the decoded value in
---`result.value`; `attempts = N` asks again with the violation; `json` /
---`on_json` hand out each JSON value as it completes. An answer that never
---fits: `nil, message, "schema", raw` (the JSON pointer of the violation
---first in the message, the last answer's text in `raw`).
---@param opts mirza.CollectOptions
---@return mirza.Result|nil result with a schema also `value` and `attempts` (the requests made)
---@return string? message
---@return string? code the stream's error code ("http", "refused", "timeout", ...), or "schema"
---@return mirza.CollectFailure|string|nil partial what was received before the failure; the raw answer for "schema"
function mirza.collect(opts) end

-- ---------------------------------------------------------------- hot reload

---Watch a module for hot reload and load its file now (validate, then
---swap): from then on `require(name)` gives the new version, and
---`mirza.reload()` (an engine: before each turn) swaps in each change. A
---file that does not load is reported on stderr with its file and line,
---and the current version stays; the file stays watched, so a fix is
---picked up when it changes. The shared watcher is `mirza.watcher()`.
---@param name string a module name ("behaviour", "mirza.route")
---@param path? string its file (default: found on package.path)
---@return boolean|nil ok true: watched and loaded
---@return string? message
---@return string? code "io" (no such file) | "reload" (it does not load)
function mirza.watch(name, path) end

---Reload every watched module whose file changed (its mtime or size) since
---the last look: validate, then swap. A broken file keeps the old version
---and is reported (stderr, with file and line).
---@return string[] reloaded the names swapped in
---@return table<string, string> failed name -> error message (the old version kept)
function mirza.reload() end

---The shared watcher of `mirza.watch`, `mirza.reload` and every engine
---(mirza.reload: `files`, `on_error`, `on_reload`).
---@return mirza.Watcher
function mirza.watcher() end

-- ---------------------------------------------------------------- daemons and tasks

---A supervisor for one local daemon (mirza.daemon, docs/daemons.md):
---nothing starts until `d:start()` (adopt a healthy daemon on the port, or
---start one and wait for its health) or `d:ensure()`. A started daemon is
---stopped by `d:stop()`, `d:close()` or at the end of the script, unless
---`keep_alive`; an adopted one is left running. Bad options raise.
---@param opts mirza.DaemonOptions
---@return mirza.Daemon
function mirza.daemon(opts) end

---Run `fn(...)` as a task of the default scheduler (`mirza.loop.spawn`).
---The task starts when the scheduler runs: `t:join()`, `loop.run()`, or
---from inside another task. Given a table instead, start a program:
---`mirza.spawn{argv = {"sleep", "5"}}` is `mirza.core.spawn` (_meta_proc.lua:
---a `mirza.Process`, or nil, message, "spawn"); a daemon to supervise is
---`mirza.daemon`'s.
---@param fn function|mirza.SpawnOptions
---@param ... any fn's arguments
---@return mirza.Task|mirza.Process|nil
---@return string? message when a program cannot be started
---@return string? code "spawn"
---@overload fun(opts: mirza.SpawnOptions): mirza.Process|nil, string?, string?
function mirza.spawn(fn, ...) end

-- ---------------------------------------------------------------- the engine

---The table given to `require("mirza.engine").new` (all optional). Lowest
---to highest precedence: these defaults, the config file
---(`$MIRZA_CONFIG`, else `~/.config/mirza/config.lua`), this table, the
---environment (`MIRZA_*`: docs/engine.md). An unknown key raises.
---@class mirza.EngineOptions
---@field base_url? string  the endpoint, e.g. "http://127.0.0.1:8080/v1"; what answers there is detected and used as is; taken as written (mirza.url: a bare host gets /v1, a path is kept, a route's URL is that route, a query string goes on every request). Default: the preset's daemon on `host`:`port`
---@field preset? "mtplx"|"llama-server"|"ollama"|"vllm"|"mirza-sim"|"custom"  the daemon mirza may start and supervise (mirza.daemon). Not given: what answers is detected, and only with no `base_url` is "mtplx" started when nothing answers
---@field host? string  default "127.0.0.1"
---@field port? integer  default 8766
---@field model? string  the preset's model (directory, repo or .gguf); sent as `model` when nothing better is known. Default for a supervised mtplx: "pooyakn73/Qwen3.8-9B-Distill-MTPLX-Q6G64"
---@field model_id? string  the `model` sent, whatever the daemon reports
---@field api_key? string  sent as `Authorization: Bearer` (also `MIRZA_API_KEY`)
---@field daemon? mirza.DaemonOptions|boolean  false: use the endpoint as it is (nothing started or stopped; the default for an https:// or non-loopback `base_url`, and for a pool); a table: the supervisor's options, over those the engine derives
---@field dialect? "mtplx"|"llama"|"openai"  the request fields sent; default: the preset's (llama for llama-server and vLLM, else mtplx), and for an endpoint used as is what answers there (MTPLX: mtplx; llama-server, vLLM: llama; anything else: openai)
---@field autostart? boolean  start the daemon when nothing answers (default true)
---@field keep_alive? boolean  leave a daemon the engine started running when it closes (default false)
---@field restart? {max?: integer, backoff?: number}  restart a supervised daemon that died, before a turn (default: none)
---@field context_window? integer  tokens of the daemon's context; the history is trimmed to fit (default 16384)
---@field kv_bits? integer  a started daemon's KV cache quantization (mirza.daemon)
---@field depth? integer  MTPLX's MTP draft depth (default 3)
---@field session_id? string  the daemon's session (mtplx dialect); default: a new "mirza-..." id per engine
---@field system_prompt? string  the system prompt, as `e:load(prompt)` sets it
---@field max_tokens? integer  a turn's completion budget without thinking (default 1024)
---@field max_tokens_thinking? integer  with thinking on (default 4096)
---@field temperature? number  default 0.7
---@field top_p? number  default 0.95
---@field presence_penalty? number  default 0.0
---@field repetition_penalty? number  sent as `repeat_penalty` in the llama dialect (default 1.0)
---@field reasoning_budget? integer  thinking tokens per turn; 0: thinking off (default 0; `e:set_thinking`)
---@field body_extra? table  fields merged into every request body, in every dialect
---@field think_tags? boolean|"auto"|"open"  reasoning sent as `<think>…</think>` in the content split out (default "auto": mirza.thinktags)
---@field repetition? table|boolean  the repetition guard's thresholds over its DEFAULTS (mirza.repetition); false: no guard
---@field merge? boolean  deltas that arrived together as one event: nil (default) in `say` without script stages, true every turn, false never
---@field hold? number|false  seconds a merging turn holds what comes fast before handing it over (default 0.005; false or 0: each read as it comes)
---@field stall_timeout? number|false  seconds without a byte once the response began (default 120)
---@field header_timeout? number|false  seconds until the whole response head (default 600); also the deadline of waiting out a 429
---@field connect_timeout? number|false  seconds to connect (default 10)
---@field busy_wait? number  seconds a 409 "session busy" before anything arrived is asked again (default 5; 0: fail at once)
---@field prefill_tokens? integer  max_tokens of the prefill request (default 16)
---@field auto_reload? boolean  reload changed watched modules before each turn (default true)
---@field tools? table<string, mirza.Tool>|string  every turn's tools, or a module returning them (hot-reloaded)
---@field tool_choice? string|table  sent as is
---@field parallel_tool_calls? boolean  sent as is
---@field max_rounds? integer  the most requests one `say` may take with tools (default 8)
---@field run_calls? fun(fns: (fun(): string)[]): string[]  runs one round's calls: fns[i]() gives the i-th result and never raises
---@field schema? table|string  every turn's JSON Schema (a table or a .json path): docs/structured.md
---@field attempts? integer  answers a `say` with a schema may give (a violation is told to the model)
---@field endpoints? (string|{url: string, limit?: integer})[]  several endpoints used as they are (mirza.pool): turns stay where the last one went while it has room, and fail over
---@field pool? mirza.Pool  a pool shared with other engines, instead of `endpoints`
---@field record? string  record every request and a runs.jsonl line per turn into this directory (mirza.record)
---@field log? fun(level: "debug"|"info"|"notice"|"warning"|"error", message: string)  the engine's log (default: stderr, notice and up)
---@field verbose? boolean  `load()` says on stderr in one line what it found (`e:describe()`)
---@field config_file? string|false  the config file to read; false: none
---@field history? string  a conversation saved by `e:save(path)` to continue (a bad file: `new` returns nil, message, "io"|"history")

---`e:say`'s options: the turn's (mirza.TurnOptions), the route's sinks
---(mirza.RouteOptions, also under `sinks = {...}`) and the tool loop's. An
---unknown key raises.
---@class mirza.SayOptions: mirza.TurnOptions, mirza.RouteOptions
---@field sinks? mirza.RouteOptions  the route's options, as a table of their own
---@field max_rounds? integer  the most requests with tools (default: the engine's, else 8); past it: code "rounds"
---@field run_calls? fun(fns: (fun(): string)[]): string[]  runs one round's calls (default: the engine's; in a task, concurrently)
---@field on_tool_result? fun(call: table, content: string)  each call's result, as sent back
---@field attempts? integer  with a schema: answers it may give (default: the engine's, else 1)

---The figures of a turn (mirza.stats): what `e:say` returns and `e.last`
---holds. The server's own figures are preferred where they mean the same.
---@class mirza.TurnStats
---@field ttft_ms number  request sent -> first think or text delta (queueing and prefill included)
---@field server_ttft_ms? number  the server's own prompt time (MTPLX ttft_s, llama prompt_ms)
---@field tok_s number  decode speed: the server's, else tokens over the decode time
---@field live_tok_s? number  the last speed MTPLX reported while the turn ran
---@field tokens integer  completion tokens (usage, else llama predicted_n, else the deltas counted)
---@field prompt_tokens? integer
---@field kv_tokens integer  prompt and completion tokens
---@field cached_tokens? integer  prompt tokens the server had cached
---@field session_cache_hit? boolean  MTPLX
---@field cache_miss_reason? string  MTPLX ("policy_mismatch", ...)
---@field mtp_acceptance? number  MTPLX: accepted / drafted over the MTP depths
---@field duration_s number
---@field finish_reason? string
---@field error? string  the error's code when the turn failed
---@field interrupted? true  the turn was cancelled
---@field value? any  with a schema: the decoded answer
---@field schema_error? {message: string, pointer?: string, raw?: string}  with a schema: why the answer did not fit

---What `e:say` returns second (or fourth, when it failed): the route's
---result and the tool loop's.
---@class mirza.SayResult: mirza.RouteResult
---@field rounds integer  the requests made (tool rounds)
---@field tool_calls? table[]  the last round's calls (mirza.tools)
---@field attempts? integer  with a schema: the answers asked for
---@field value? any  with a schema: the decoded answer
---@field raw? string  with a schema that no answer fitted: the last answer
---@field schema_error? {message: string, pointer?: string, raw?: string}
---@field json_error? table  the json stage saw the JSON cut or invalid

-- ---------------------------------------------------------------- tools

---One tool, as the model sees it and as mirza runs it (mirza.tools).
---@class mirza.Tool
---@field description? string
---@field parameters? table  a JSON Schema of the arguments
---@field fn fun(args: table, call: table): any  a string is sent as is, any other value as JSON; raise or `nil, err` and the model sees `{"error": err}`

---`require("mirza.tools").run{...}`: the tool loop over plain requests.
---The keys of `mirza.open` (`body` a table with `messages`) and these.
---@class mirza.ToolsRunOptions: mirza.RequestOptions
---@field tools table<string, mirza.Tool>|string  the tools, or a module returning them
---@field max_rounds? integer  default 8; past it: nil, message, "rounds", partial
---@field run_calls? fun(fns: (fun(): string)[]): string[]
---@field tool_choice? string|table
---@field parallel_tool_calls? boolean
---@field on_event? fun(ev: table)  every event of every round
---@field on_result? fun(call: table, content: string)
---@field schema? table|string  the final answer's JSON Schema (docs/structured.md)
---@field attempts? integer
---@field json? {depth?: integer}
---@field on_json? fun(ev: table)

-- ---------------------------------------------------------------- batch jobs

---`require("mirza.batch").run{...}` (docs/batch.md). Its summary: total,
---skipped, done_now, errors, redo, retries, cut, tokens, elapsed, left,
---deadline, by_code, errors_file; or nil, message, code.
---@class mirza.BatchOptions
---@field input? string  the JSONL (or text) file; or `items`
---@field items? table[]  the items, parsed
---@field output string  the output file ("-": stdout, no resume); an existing one is resumed
---@field errors? string|false  the error file (default beside OUTPUT: `out.errors.jsonl`); false: failures go to OUTPUT
---@field endpoints? (string|{url: string, limit?: integer})[]  as a user pastes them (a base with or without /v1, a route's URL; a query string kept)
---@field base_url? string  one endpoint (default "http://127.0.0.1:8766/v1")
---@field pool? mirza.Pool  instead of `endpoints`
---@field limit? integer  requests in flight per endpoint, fixed (default: each endpoint's found as the run goes, mirza.limit)
---@field model? string  for lines without one (default: what each endpoint lists first)
---@field body? table  fields merged into every request
---@field headers? table<string, string>
---@field api_key? string
---@field max_retries? integer  default 5
---@field retry_base? number  first backoff, seconds, doubling with jitter (default 0.5)
---@field retry_max? number  longest backoff (default 30)
---@field connect_timeout? number|false
---@field stall_timeout? number|false  default 120
---@field header_timeout? number|false  default 600
---@field deadline? number  per request, seconds (default none)
---@field batch_deadline? number  the whole run: unfinished items stay for a rerun (default none)
---@field give_up_after? number  seconds every endpoint may be down before the run stops (default 300)
---@field repetition? table|false  the repetition guard's options; false: none
---@field think_tags? boolean|"open"  with a schema: `<think>` split out first (default true)
---@field schema? table|string  the answer of every chat line without its own
---@field attempts? integer  answers an item with a schema may give (default 1)
---@field affinity? boolean  items sharing a prefix go where it went last (default true)
---@field lookahead? integer  with affinity: how many next items a free slot may choose from (default 64)
---@field hold? number|false  an item's text goes to its task at most this often (default 1)
---@field progress? boolean|"auto"  the progress line (default "auto": live on a terminal)
---@field progress_every? number  seconds between progress lines off a terminal (default 10)
---@field quiet? boolean  no summary on stderr
---@field log? fun(line: string, live: boolean)  where progress lines go
---@field resume_command? string  shown when Ctrl-C stops the run
